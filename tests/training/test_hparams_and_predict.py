"""Issue 16: the DP settings reach every logger once per run; ``trainer.predict`` after private training."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger, Logger

from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

from .conftest import FakeDataModule, H, make_module, trainer

DELTA = 1e-6
SIGMA, CLIP = 2.5, 0.7
SEED = 918273645  # a distinctive value that must appear in no artifact


class RecordingLogger(Logger):
    """A minimal logger that records every ``log_hyperparams`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.hparams_calls: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        self.hparams_calls.append(dict(params))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass


def _fit(loggers: list[Logger], steps: int = 3, save_hyperparameters: bool = False):
    module = make_module("dlinear")
    if save_hyperparameters:  # what dpts fit does: the module calls save_hyperparameters() (lightning_dpts.app.export)
        from lightning_dpts.app.export import make_checkpoint_loadable

        make_checkpoint_loadable(module)
    dm = FakeDataModule(module, num_series=64, batch_size=8)
    budget = StructuredSubsamplingAccountant(dm.sampling_spec, SIGMA).epsilon(steps, DELTA)
    accountant = AccountantCallback(budget, DELTA)
    t = trainer(max_epochs=5, logger=loggers, callbacks=[DPForecastStrategy(SIGMA, CLIP, seed=SEED), accountant])
    t.fit(module, datamodule=dm)
    return dm, accountant, budget


def _expected(dm: FakeDataModule, budget: float) -> dict[str, Any]:
    """What the logged settings must say, from the run's inputs (not from the code under test)."""
    spec = dm.sampling_spec
    return {
        "noise_multiplier": SIGMA, "max_grad_norm": CLIP, "noise_std": pytest.approx(SIGMA * CLIP),
        "delta": DELTA, "epsilon_budget": budget, "bound": "upper",
        "theorem": "Theorem 4.4",  # without replacement / with replacement, lambda = 1 (docs/privacy.md, theorem table)
        "composition_unit": "step", "max_steps": 3,
        "num_series": 64, "min_length": 40, "context_length": spec.context_length, "prediction_length": H,
        "batch_size": 8, "instances_per_series": 1, "top_sample_size": 8,
        "top_level": "without_replacement", "bottom_level": "with_replacement",
        "top_level_rate": pytest.approx(8 / 64),
        "bottom_level_rate": pytest.approx((spec.context_length + H) / (40 - H + 1)),
        "relation_level": "event", "relation_size": 1, "relation_value_bound": None, "context_noise": 0.0,
        "forecast_noise": 0.0,
    }


def test_dp_settings_are_logged_once_to_every_logger(tmp_path):
    recording = RecordingLogger()
    csv = CSVLogger(tmp_path, name="csv")
    loggers: list[Logger] = [csv, recording]
    if importlib.util.find_spec("tensorboard") or importlib.util.find_spec("tensorboardX"):
        from lightning.pytorch.loggers import TensorBoardLogger

        loggers.append(TensorBoardLogger(tmp_path, name="tb"))
    dm, accountant, budget = _fit(loggers)
    expected = _expected(dm, budget)

    dp_calls = [call for call in recording.hparams_calls if "dp" in call]
    assert len(dp_calls) == 1  # once per run
    logged = dp_calls[0]["dp"]
    for key, value in expected.items():
        assert logged[key] == value, key
    assert logged == accountant.hyperparameters

    on_disk = yaml.safe_load((Path(csv.log_dir) / "hparams.yaml").read_text())["dp"]
    for key, value in expected.items():
        assert on_disk[key] == value, key
    if len(loggers) == 3:
        tb_yaml = yaml.safe_load((Path(loggers[2].log_dir) / "hparams.yaml").read_text())
        assert tb_yaml["dp"]["noise_multiplier"] == SIGMA and tb_yaml["dp"]["theorem"] == "Theorem 4.4"


def test_logged_settings_never_contain_the_seed(tmp_path):
    """The attacker reads every file the run wrote: the noise seed must not be among them (trap 7)."""
    recording = RecordingLogger()
    _fit([CSVLogger(tmp_path, name="csv"), recording])
    text = "".join(p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())
    assert "dp:" in text and str(SEED) not in text
    assert str(SEED) not in repr(recording.hparams_calls)
    logged = [call.get("dp", {}) for call in recording.hparams_calls]
    assert not any(key == "seed" or value == SEED for dp in logged for key, value in dp.items())
    assert all(dp.get("seeded") is True for dp in logged)  # a seeded run says so, without the seed


def _tensorboard_sessions(log_dir: str) -> list[dict[str, Any]]:
    """Every HParams session in the run's event files, as TensorBoard's plugin data records it (read back with
    TensorBoard's own event-file loader and protobufs, not with the code under test)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    sessions = []
    for path in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag != metadata.SESSION_START_INFO_TAG:
                    continue
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                sessions.append({name: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
                                 for name, v in data.session_start_info.hparams.items()})
    return sessions


def test_tensorboard_hparams_dashboard_shows_dp_settings_next_to_the_modules(tmp_path):
    """Issue 32: with ``save_hyperparameters()`` the DP settings were a second session, which the HParams
    dashboard ignores (its accumulator keeps a tag's first metadata). Now one session holds both."""
    pytest.importorskip("tensorboard")
    from lightning.pytorch.loggers import TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    tb = TensorBoardLogger(tmp_path, name="tb")
    dm, accountant, budget = _fit([tb], save_hyperparameters=True)
    sessions = _tensorboard_sessions(tb.log_dir)
    assert len(sessions) == 1, sessions  # one session: the dashboard shows what it holds
    session = sessions[0]
    assert session["model_kwargs/prediction_length"] == H  # the module's own save_hyperparameters()
    expected = _expected(dm, budget)
    for key in ("noise_multiplier", "max_grad_norm", "delta", "epsilon_budget", "batch_size", "top_level",
                "bottom_level", "theorem", "max_steps"):
        assert session[f"dp/{key}"] == expected[key], key

    # what the dashboard itself reads: the accumulator's first session_start_info of the run
    acc = EventAccumulator(tb.log_dir)
    acc.Reload()
    content = acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    shown = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert shown["dp/noise_multiplier"].number_value == SIGMA
    assert shown["dp/theorem"].string_value == "Theorem 4.4"
    assert any(not name.startswith("dp/") for name in shown)
    # hparams.yaml keeps both as well
    on_disk = yaml.safe_load((Path(tb.log_dir) / "hparams.yaml").read_text())
    assert on_disk["dp"]["noise_multiplier"] == SIGMA and accountant.hyperparameters["noise_multiplier"] == SIGMA
    assert on_disk["model_kwargs"]["prediction_length"] == H


def test_mlflow_gets_the_dp_settings(tmp_path):
    """MLflow flattens the ``dp`` dict into ``dp/...`` parameters next to the module's (skipped without mlflow)."""
    pytest.importorskip("mlflow")
    from lightning.pytorch.loggers import MLFlowLogger

    logger = MLFlowLogger(experiment_name="dpts", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                          artifact_location=(tmp_path / "artifacts").as_uri())
    _fit([logger], save_hyperparameters=True)
    run = logger.experiment.get_run(logger.run_id)
    assert float(run.data.params["dp/noise_multiplier"]) == SIGMA
    assert run.data.params["dp/theorem"] == "Theorem 4.4"
    assert any(not name.startswith("dp/") for name in run.data.params)


# ---------------------------------------------------------------------------------------------------------
# trainer.predict
# ---------------------------------------------------------------------------------------------------------
data = pytest.importorskip("lightning_dpts.data")


@pytest.mark.parametrize("name", ["dlinear", "deepar"])
def test_trainer_predict_after_private_training(name):
    from lightning_dpts.app.export import attach_quantile_predict_step
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    module = make_module(name)
    dm = data.StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1, test_windows=2)
    budget = StructuredSubsamplingAccountant(dm.sampling_spec, 3.0).epsilon(2, DELTA)
    accountant = AccountantCallback(budget, DELTA)
    t = trainer(max_epochs=3, callbacks=[DPForecastStrategy(3.0, 0.5, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert accountant.steps == 2

    # the predict loader is the test loader, batch for batch, in evaluation_windows order
    for got, want in zip(dm.predict_dataloader(), dm.test_dataloader(), strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)

    attach_quantile_predict_step(module)
    torch.manual_seed(0)
    outputs = t.predict(module, datamodule=dm)
    quantiles = torch.cat(outputs)
    assert quantiles.shape == (len(dm.evaluation_windows("test")), H, len(DEFAULT_QUANTILES))
    assert torch.isfinite(quantiles).all() and (quantiles.diff(dim=-1) >= 0).all()
    assert accountant.steps == 2  # prediction takes no private step


def test_predict_split_val_uses_the_validation_windows():
    module = make_module("dlinear")
    dm = data.StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1, val_windows=1)
    dm.predict_split = "val"
    for got, want in zip(dm.predict_dataloader(), dm.val_dataloader(), strict=True):
        assert all(torch.equal(got[k], want[k]) for k in got)


def test_trainer_predict_without_a_predict_step_names_the_helper():
    """Issue 32: Lightning's default step fails inside GluonTS; the datamodule refuses first, naming the helper."""
    from lightning_dpts.errors import ConfigurationError

    module = make_module("dlinear")
    dm = data.StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1, test_windows=1)
    with pytest.raises(ConfigurationError, match="attach_quantile_predict_step"):
        trainer().predict(module, datamodule=dm)

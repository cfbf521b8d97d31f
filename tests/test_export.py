"""Issue 16: loadable checkpoints, the exported predictor, ``dpts predict``, planning from the shell, report.json.

One ``dpts fit`` run on a tiny slice of the bundled data (module fixture) is checked from every side.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from lightning_dpts.app.cli import main
from lightning_dpts.app.export import forecast_table, load_predictor, make_checkpoint_loadable
from lightning_dpts.app.jobs.predict import predict_to_csv
from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.metrics import DEFAULT_QUANTILES
from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant

warnings.filterwarnings("ignore")

H = 6


@pytest.fixture(scope="module")
def run_dir(tiny_csv, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fit") / "run"
    code = main(["fit", "--data", str(tiny_csv), "--prediction-length", str(H), "--model", "simple_feedforward",
                 "--epsilon", "2.0", "--delta", "1e-6", "--epochs", "2", "--batch-size", "8", "--seed", "1",
                 "--no-non-dp", "--no-private-plots", "--output-dir", str(out)])
    assert code == 0
    return out


def _save_untrained(module, path: Path) -> None:
    import lightning as L

    t = L.Trainer(max_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
    t.strategy.connect(module)
    t.save_checkpoint(str(path))


# ---------------------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["simple_feedforward", "dlinear", "deepar", "patchtst"])
def test_gluonts_checkpoints_load_only_with_recorded_hyperparameters(name, tmp_path):
    from tests.training.conftest import make_module

    module = make_module(name)
    _save_untrained(module, tmp_path / "plain.ckpt")
    with pytest.raises(Exception, match="model_kwargs"):  # the GluonTS quirk: no hyperparameters recorded
        type(module).load_from_checkpoint(tmp_path / "plain.ckpt")
    make_checkpoint_loadable(module)
    _save_untrained(module, tmp_path / "fixed.ckpt")
    loaded = type(module).load_from_checkpoint(tmp_path / "fixed.ckpt")  # torch's default weights_only unpickler
    assert type(loaded.model) is type(module.model)
    for key, value in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert loaded.model.prediction_length == module.model.prediction_length
    assert loaded.model.context_length == module.model.context_length


def test_fit_checkpoint_loads_and_matches_the_exported_predictor(run_dir):
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    description = json.loads((run_dir / "model.json").read_text())
    assert description["lightning_module"].endswith("SimpleFeedForwardLightningModule")
    assert description["prediction_length"] == H and description["freq"] == "M"
    assert description["constructor_arguments"]["model_kwargs"]["hidden_dimensions"] == [64, 64]
    loaded = SimpleFeedForwardLightningModule.load_from_checkpoint(run_dir / description["checkpoint"])
    predictor = load_predictor(run_dir)
    net = predictor.prediction_net.state_dict()
    assert set(net) == set(loaded.state_dict())
    for key, value in loaded.state_dict().items():
        assert torch.equal(net[key], value), key
    # the privacy ledger travels with the weights into the predictor (its state-dict metadata) and back
    from lightning_dpts.training import ledger_of, read_ledger

    steps = read_ledger(run_dir / description["checkpoint"]).steps
    assert steps > 0 and ledger_of(loaded).steps == ledger_of(predictor.prediction_net).steps == steps


# ---------------------------------------------------------------------------------------------------------
# predictor round trip and dpts predict
# ---------------------------------------------------------------------------------------------------------
def _entries(csv: Path, cut: int = 0) -> list[dict]:
    frame = pd.read_csv(csv, parse_dates=["timestamp"])
    out = []
    for item, group in frame.groupby("item_id", sort=False):
        y = group["target"].to_numpy(np.float32)
        out.append({"target": y[: len(y) - cut], "start": pd.Period(group["timestamp"].iloc[0], "M"),
                    "item_id": str(item)})
    return out


def test_predictor_round_trip_gives_the_same_forecasts(run_dir, tiny_csv, tmp_path):
    from gluonts.core import serde
    from gluonts.model.predictor import Predictor
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    entries = _entries(tiny_csv, cut=H)
    deserialized = Predictor.deserialize(run_dir / "predictor")  # the one line a user writes
    estimator = serde.decode(json.loads((run_dir / "model.json").read_text())["estimator"])
    module = SimpleFeedForwardLightningModule.load_from_checkpoint(run_dir / "dp-model.ckpt")
    rebuilt = estimator.create_predictor(estimator.create_transformation(), module)
    tables = []
    for predictor in (deserialized, rebuilt):
        torch.manual_seed(3)
        tables.append(forecast_table(list(predictor.predict(entries)), DEFAULT_QUANTILES))
    pd.testing.assert_frame_equal(tables[0], tables[1])
    assert len(tables[0]) == 24 * H and np.isfinite(tables[0][[f"{q:g}" for q in DEFAULT_QUANTILES]]).all().all()
    # serialize again: still the same forecasts
    again = tmp_path / "again"
    again.mkdir()
    deserialized.serialize(again)
    torch.manual_seed(3)
    pd.testing.assert_frame_equal(tables[0], forecast_table(list(load_predictor(again).predict(entries)),
                                                            DEFAULT_QUANTILES))


def test_dpts_predict_writes_quantiles_after_the_last_time_stamp(run_dir, tiny_csv, tmp_path, capsys):
    out = tmp_path / "fc.csv"
    assert main(["predict", "--model", str(run_dir), "--data", str(tiny_csv), "--output", str(out),
                 "--seed", "5"]) == 0
    assert "24 series" in capsys.readouterr().out
    table = pd.read_csv(out)
    levels = [f"{q:g}" for q in DEFAULT_QUANTILES]
    assert list(table.columns) == ["item_id", "timestamp", "horizon", "mean", *levels]
    assert len(table) == 24 * H and table["horizon"].tolist() == list(range(1, H + 1)) * 24
    data = pd.read_csv(tiny_csv, parse_dates=["timestamp"])
    for item, group in table.groupby("item_id"):
        last = pd.Period(data.loc[data["item_id"] == item, "timestamp"].max(), "M")
        # written as the input writes its month stamps (2019-07-01), not as periods (2019-07)
        assert group["timestamp"].tolist() == [(last + k).start_time.strftime("%Y-%m-%d") for k in range(1, H + 1)]
    values = table[levels].to_numpy()
    assert np.all(np.diff(values, axis=1) >= -1e-6 * np.abs(values).max())  # quantiles ordered
    torch.manual_seed(5)
    expected = forecast_table(list(load_predictor(run_dir / "predictor").predict(_entries(tiny_csv))),
                              DEFAULT_QUANTILES)
    np.testing.assert_allclose(values, expected[levels].to_numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    "extra,option",
    [(["--quantiles", "0.5", "1.0"], "--quantiles"), (["--freq", "D"], "--freq"), (["--seed", "-1"], "--seed")],
)
def test_dpts_predict_bad_input_exits_2(run_dir, tiny_csv, tmp_path, capsys, extra, option):
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--model", str(run_dir), "--data", str(tiny_csv), "--output", str(tmp_path / "x.csv"),
              *extra])
    assert exit_.value.code == 2 and option in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_dpts_predict_unknown_model_dir_exits_2(tiny_csv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--model", str(tmp_path), "--data", str(tiny_csv)])
    assert exit_.value.code == 2 and "--model" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# report.json and logs
# ---------------------------------------------------------------------------------------------------------
def test_report_and_logs_carry_the_dp_settings(run_dir):
    report = json.loads((run_dir / "report.json").read_text())
    hp = report["dp_hyperparameters"]
    spec = report["privacy_configuration"]["sampling_spec"]
    assert hp["noise_multiplier"] == report["noise_multiplier"] and hp["max_grad_norm"] == report["max_grad_norm"]
    assert hp["delta"] == 1e-6 and hp["epsilon_budget"] == 2.0 and hp["theorem"] == report["bound"]["theorem"]
    for key in ("num_series", "min_length", "context_length", "prediction_length", "batch_size", "top_level",
                "bottom_level", "instances_per_series"):
        assert hp[key] == spec[key], key
    assert hp["relation_level"] == "event" and hp["relation_size"] == 1
    logged = yaml.safe_load(next(run_dir.glob("private/logs/version_*/hparams.yaml")).read_text())
    assert logged["dp"] == hp
    assert "model_kwargs" in logged  # the architecture is in the logs too
    # forecasts.png shows private data: skipped on request, and the manifest lists only what was written
    assert not (run_dir / "private" / "forecasts.png").exists() and (run_dir / "epsilon.png").stat().st_size > 0
    assert "private/forecasts.png" not in report["files"] and report["files"]["epsilon.png"].startswith("public")


# ---------------------------------------------------------------------------------------------------------
# planning from the shell
# ---------------------------------------------------------------------------------------------------------
def _privacy(capsys, *args: str) -> dict:
    assert main(["privacy", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_planning_from_the_data_reproduces_the_fit_run(run_dir, tiny_csv, capsys):
    """`dpts privacy noise --data ... --epochs 2` gives the sigma `dpts fit` calibrated for the same options."""
    report = json.loads((run_dir / "report.json").read_text())
    out = _privacy(capsys, "noise", "--data", str(tiny_csv), "--prediction-length", str(H), "--model",
                   "simple_feedforward", "--batch-size", "8", "--epochs", "2", "--epsilon", "2.0", "--delta", "1e-6")
    assert out["noise_multiplier"] == pytest.approx(report["noise_multiplier"], rel=1e-12)


@pytest.mark.parametrize("model,lags", [("dlinear", 0), ("deepar", None)])
def test_planning_spec_equals_the_datamodule_spec(tiny_csv, capsys, model, lags):
    from gluonts.time_feature import get_lags_for_frequency

    from lightning_dpts.app.cli import _spec_from_args, build_parser
    from lightning_dpts.app.planning import resolve_planning

    args = build_parser().parse_args(
        ["privacy", "epsilon", "--data", str(tiny_csv), "--prediction-length", str(H), "--context-length", "9",
         "--model", model, "--batch-size", "8", "--noise-multiplier", "2", "--delta", "1e-6", "--epochs", "1", "3"])
    spec = resolve_planning(args, _spec_from_args)
    # independent of the code under test: 24 series of 60 months; DeepAR reads lags get_lags_for_frequency("M")
    # (1-based; its model shifts them by -1) before the context window. dpts fit holds out the most rolling test
    # windows k <= 4 (>= H training steps left) with r_k = min(P + H, T_k)/T_k <= 1.25 r_1, T_k = 60 - (k + 1) H + 1
    max_lag = max(get_lags_for_frequency("M")) - 1 if lags is None else lags
    past = 9 + max_lag

    def rate(k: int) -> float:
        t = 60 - (k + 1) * H + 1
        return min(past + H, t) / t

    windows = max(k for k in range(1, 5) if 60 - k * H >= H and rate(k) <= 1.25 * rate(1))
    assert windows == (2 if lags == 0 else 4)  # dlinear: r 15/49 -> 15/43 (1.14x), 15/37 (1.32x); deepar: r = 1
    # every series has exactly this length: the exact mix (lengths=(L,)), not "at least L" (lengths=None)
    assert spec == SamplingSpec(num_series=24, min_length=60 - windows * H, lengths=(60 - windows * H,),
                                context_length=past, prediction_length=H, batch_size=8)
    assert args.steps == [3, 9]  # floor(24 / 8) = 3 steps per epoch
    # and what the datamodule builds for the same model
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.forecasters import make_estimator as _estimator
    from lightning_dpts.data.loading import load_long_table

    config = FitConfig(data=str(tiny_csv), prediction_length=H, context_length=9, model=model, batch_size=8)
    table, freq = load_long_table(tiny_csv)
    dm = StructuredSubsamplingDataModule(table, batch_size=8, model=_estimator(config, freq).create_lightning_module(),
                                         freq=freq, id_column="item_id", timestamp_column="timestamp",
                                         value_column="target", test_windows=windows)
    assert dm.sampling_spec == spec


def test_epochs_equal_steps_times_steps_per_epoch(capsys):
    common = ["--num-series", "320", "--min-length", "400", "--context-length", "24", "--prediction-length", "12",
              "--batch-size", "32", "--delta", "1e-6"]
    by_epochs = _privacy(capsys, "epsilon", *common, "--noise-multiplier", "1.1", "--epochs", "2", "5")
    by_steps = _privacy(capsys, "epsilon", *common, "--noise-multiplier", "1.1", "--steps", "20", "50")
    assert list(by_epochs["epsilon"]) == ["20", "50"] and by_epochs == by_steps  # 320 // 32 = 10 steps per epoch
    spec = SamplingSpec(num_series=320, min_length=400, context_length=24, prediction_length=12, batch_size=32)
    sigma = _privacy(capsys, "noise", *common, "--epsilon", "1.0", "--epochs", "3")["noise_multiplier"]
    assert StructuredSubsamplingAccountant(spec, sigma).epsilon(30, 1e-6) == pytest.approx(1.0, abs=2e-3)


@pytest.mark.parametrize(
    "args,option",
    [
        (["--data", "X", "--num-series", "10"], "--num-series"),
        (["--num-series", "10", "--context-length", "4", "--prediction-length", "2", "--batch-size", "2"],
         "--min-length"),
        (["--num-series", "10", "--min-length", "20", "--context-length", "4", "--prediction-length", "2",
          "--batch-size", "2", "--model", "deepar"], "--model"),
        (["--num-series", "10", "--min-length", "20", "--context-length", "4", "--prediction-length", "2",
          "--batch-size", "2", "--steps", "3", "--epochs", "1"], "--epochs"),
        (["--num-series", "10", "--min-length", "20", "--context-length", "4", "--prediction-length", "2",
          "--batch-size", "2", "--epochs", "0"], "--epochs"),
        (["--num-series", "10", "--min-length", "20", "--context-length", "4", "--prediction-length", "2",
          "--batch-size", "2"], "--steps"),
        (["--data", "missing.csv"], "--data"),
    ],
)
def test_planning_bad_input_exits_2(capsys, args, option):
    with pytest.raises(SystemExit) as exit_:
        main(["privacy", "noise", *args, "--epsilon", "1", "--delta", "1e-6"])
    assert exit_.value.code == 2 and option in capsys.readouterr().err


def test_dpts_predict_rejects_data_at_a_finer_frequency(run_dir, tmp_path, capsys):
    daily = pd.DataFrame({"id": ["a"] * 40, "timestamp": pd.date_range("2020-01-01", periods=40, freq="D"),
                          "value": np.arange(40.0)})
    daily.to_csv(tmp_path / "daily.csv", index=False)
    with pytest.raises(SystemExit) as exit_:
        main(["predict", "--model", str(run_dir), "--data", str(tmp_path / "daily.csv"),
              "--output", str(tmp_path / "x.csv")])
    assert exit_.value.code == 2 and "--freq" in capsys.readouterr().err


def test_dpts_predict_keeps_gaps_as_missing_values(run_dir, tmp_path):
    months = pd.period_range("2015-01", periods=40, freq="M").to_timestamp()
    frame = pd.DataFrame({"id": "a", "timestamp": months, "value": np.linspace(100.0, 140.0, 40)})
    frame.drop(index=[30, 31]).to_csv(tmp_path / "gappy.csv", index=False)  # two months missing
    table = predict_to_csv(run_dir, tmp_path / "gappy.csv", tmp_path / "fc.csv", seed=0)
    # written like the input's month stamps (2018-05-01), under the input's own column names (old defaults here)
    assert table["timestamp"].tolist() == [(pd.Period("2018-04", "M") + k).start_time.strftime("%Y-%m-%d")
                                           for k in range(1, H + 1)]
    assert list(table.columns[:2]) == ["id", "timestamp"]

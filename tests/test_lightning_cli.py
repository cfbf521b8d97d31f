"""examples/lightning_cli.py + examples/lightning_cli.yaml: a LightningCLI fit with the datamodule and both
callbacks configured in YAML (the typed signatures of StructuredSubsamplingDataModule let jsonargparse parse them)."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
import yaml

from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

pytest.importorskip("jsonargparse", reason="LightningCLI needs lightning's optional jsonargparse[signatures]")
ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("lightning_cli_example", ROOT / "examples" / "lightning_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(tmp_path: Path, epochs: int, data: str) -> Path:
    config = yaml.safe_load((ROOT / "examples" / "lightning_cli.yaml").read_text())
    config["trainer"].update(max_epochs=epochs, default_root_dir=str(tmp_path), enable_progress_bar=False)
    config["trainer"]["callbacks"][0]["init_args"]["epochs"] = epochs
    config["data"]["data"] = data
    path = tmp_path / "config.in.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_yaml_fits_with_both_callbacks_on_a_csv_file(tmp_path):
    table = load_dataset("us_employment")
    table["timestamp"] = table["timestamp"].astype(str)
    csv = tmp_path / "employment.csv"
    table[["item_id", "timestamp", "target"]].to_csv(csv, index=False)
    path = _config(tmp_path, epochs=3, data=str(csv))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = _example().PrivateCLI(datamodule_class=StructuredSubsamplingDataModule, args=["fit", "--config",
                                                                                              str(path)])
    dm = cli.datamodule
    assert isinstance(dm, StructuredSubsamplingDataModule) and dm.past_length == 24  # linked from the model
    assert dm.batch_size == 128 and dm.test_windows == 1
    strategy = next(c for c in cli.trainer.callbacks if isinstance(c, DPForecastStrategy))
    accountant = next(c for c in cli.trainer.callbacks if isinstance(c, AccountantCallback))
    assert strategy.max_grad_norm == 0.1 and strategy.epochs == 3 and strategy.noise_multiplier > 1
    assert cli.trainer.global_step == strategy.steps == accountant.report.steps == 3 * dm.steps_per_epoch
    assert 0 < accountant.report.epsilon <= 1.0 and accountant.report.delta == 1e-7
    assert (tmp_path / "config.yaml").is_file()  # LightningCLI saved the resolved configuration


def test_the_shipped_yaml_parses_unchanged():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = _example().PrivateCLI(datamodule_class=StructuredSubsamplingDataModule, run=False,
                                    args=["--config", str(ROOT / "examples" / "lightning_cli.yaml")])
    assert cli.datamodule.num_series == 148 and cli.trainer.max_epochs == 200
    strategy = next(c for c in cli.trainer.callbacks if isinstance(c, DPForecastStrategy))
    assert strategy.epochs == cli.trainer.max_epochs and strategy.target_epsilon == 1.0


def test_a_data_string_is_a_bundled_name_or_a_file():
    with pytest.raises(ConfigurationError, match="data.*neither a bundled dataset name"):
        StructuredSubsamplingDataModule("no/such/file.csv", batch_size=8, context_length=4, prediction_length=2)


def test_scheme_names_and_the_relation_parse_from_the_command_line():
    args = ["--config", str(ROOT / "examples" / "lightning_cli.yaml"), "--data.top_level", "poisson",
            "--data.relation", '{"level": "user", "size": 2}']
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli = _example().PrivateCLI(datamodule_class=StructuredSubsamplingDataModule, run=False, args=args)
    spec = cli.datamodule.sampling_spec
    assert spec.top_level == "poisson" and (spec.relation.level, spec.relation.size) == ("user", 2)

"""Issue 32: one set of column names (``item_id``, ``timestamp``, ``target``; parameters ``id_column``,
``timestamp_column``, ``value_column``) across ``dpts``, YAML and Python; the old names accepted with a
``DeprecationWarning``; ``dpts predict`` reads the run's own names and keeps the input's names and time stamp
format."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.app.config import FitConfig
from lightning_dpts.app.jobs.predict import predict_to_csv
from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.data.loading import format_stamps, load_long_table, timestamp_style

FAST = ["--prediction-length", "6", "--model", "simple_feedforward", "--epsilon", "2.0", "--delta", "1e-6",
        "--epochs", "1", "--batch-size", "8", "--no-non-dp", "--no-private-plots", "--test-windows", "1"]


def _monthly(ids: int = 12, length: int = 48, end: bool = False, fmt: str = "%Y-%m-%d") -> pd.DataFrame:
    months = pd.period_range("2016-01", periods=length, freq="M")
    stamps = (months.end_time.normalize() if end else months.start_time).strftime(fmt)
    rng = np.random.default_rng(0)
    return pd.DataFrame({"item_id": np.repeat([f"s{i}" for i in range(ids)], length),
                         "timestamp": np.tile(stamps, ids), "target": 100 + rng.normal(size=ids * length)})


def _deprecations(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, DeprecationWarning)
            and str(w.message).startswith("lightning-dpts: ")]


def test_the_defaults_are_one_set_everywhere():
    import inspect

    from lightning_dpts.app.synth_pipeline import SynthConfig
    from lightning_dpts.data import to_collection

    expected = {"id_column": "item_id", "timestamp_column": "timestamp", "value_column": "target"}
    config, synth = FitConfig(), SynthConfig()
    for name, default in expected.items():
        assert getattr(config, name) == getattr(synth, name) == default
        for function in (StructuredSubsamplingDataModule.__init__, to_collection, load_long_table):
            assert inspect.signature(function).parameters[name].default == default, (function, name)
        assert inspect.signature(predict_to_csv).parameters[name].default is None  # the run's own, else default


def test_a_csv_that_dpts_fit_reads_works_in_python_with_the_defaults(tmp_path):
    path = tmp_path / "data.csv"
    _monthly().to_csv(path, index=False)
    table, freq = load_long_table(path)  # what dpts fit reads, defaults only
    assert freq == "M" and table["item_id"].nunique() == 12
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # nothing deprecated on the default path
        dm = StructuredSubsamplingDataModule(pd.read_csv(path), batch_size=4, context_length=6, prediction_length=6)
    assert dm.sampling_spec.num_series == 12


def test_the_old_default_columns_are_read_with_a_deprecation_warning_everywhere(tmp_path):
    old = _monthly().rename(columns={"item_id": "id", "target": "value"})
    path = tmp_path / "old.csv"
    old.to_csv(path, index=False)
    with pytest.warns(DeprecationWarning, match="--id-column id --value-column value") as record:
        table, _ = load_long_table(path)
    assert len(_deprecations(record)) == 1 and table.attrs["source_columns"] == ("id", "timestamp", "value")
    with pytest.warns(DeprecationWarning, match="id_column='id', value_column='value'"):
        dm = StructuredSubsamplingDataModule(old, batch_size=4, context_length=6, prediction_length=6)
    assert dm.sampling_spec.num_series == 12
    # neither the new nor the old id column: refused, naming the new default
    with pytest.raises(Exception, match="item_id"):
        StructuredSubsamplingDataModule(old.rename(columns={"value": "target"}).drop(columns="id"), batch_size=4,
                                        context_length=6, prediction_length=6)


def test_the_old_parameter_name_time_column_is_accepted_with_a_deprecation_warning(tmp_path):
    frame = _monthly().rename(columns={"timestamp": "month"})
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    with pytest.warns(DeprecationWarning, match="time_column"):
        assert FitConfig(time_column="month").timestamp_column == "month"
    with pytest.warns(DeprecationWarning, match="time_column"):
        assert FitConfig.from_mapping({"time_column": "month"}).timestamp_column == "month"
    with pytest.warns(DeprecationWarning, match="time_column"):
        table, _ = load_long_table(path, time_column="month")
    assert table.attrs["source_columns"] == ("item_id", "month", "target")


def test_dpts_time_column_flag_still_works_and_says_so_once(tmp_path, capsys):
    """The deprecated flag sets --timestamp-column (here: refused for another reason after parsing, so fast)."""
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--time-column", "month", "--epsilon", "0", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--epsilon" in err
    assert err.count("--time-column is deprecated; use --timestamp-column") == 1
    from lightning_dpts.app.cli import build_parser

    args = build_parser().parse_args(["predict", "--model", "m", "--data", "d", "--time-column", "week"])
    assert args.timestamp_column == "week"
    capsys.readouterr()


@pytest.fixture(scope="module")
def custom_run(tmp_path_factory):
    """A dpts fit run on a file with its own column names and month-end stamps (store, month, units)."""
    root = tmp_path_factory.mktemp("custom")
    frame = _monthly(ids=24, length=60, end=True).rename(
        columns={"item_id": "store", "timestamp": "month", "target": "units"})
    frame.to_csv(root / "sales.csv", index=False)
    out = root / "run"
    assert main(["fit", "--data", str(root / "sales.csv"), "--id-column", "store", "--timestamp-column", "month",
                 "--value-column", "units", *FAST, "--output-dir", str(out)]) == 0
    return root, out, frame


def test_predict_reads_the_runs_own_column_names_and_keeps_the_inputs_names_and_stamps(custom_run):
    root, out, frame = custom_run
    model = json.loads((out / "model.json").read_text())
    assert model["columns"] == {"id_column": "store", "timestamp_column": "month", "value_column": "units"}
    table = predict_to_csv(out, root / "sales.csv", root / "fc.csv", seed=0)  # no column options
    written = pd.read_csv(root / "fc.csv")
    assert list(written.columns[:4]) == ["store", "month", "horizon", "mean"] == list(table.columns[:4])
    assert set(written["store"]) == set(frame["store"])
    # month-end stamps in, month-end stamps out (2020-12-31 is followed by 2021-01-31, not 2021-01)
    assert frame["month"].max() == "2020-12-31"
    assert written.loc[written["horizon"] == 1, "month"].unique().tolist() == ["2021-01-31"]
    assert written.loc[written["horizon"] == 6, "month"].unique().tolist() == ["2021-06-30"]


def test_predict_writes_the_inputs_own_stamp_format(custom_run, capsys):
    root, out, frame = custom_run
    slashed = frame.assign(month=pd.to_datetime(frame["month"]).dt.to_period("M").dt.start_time.dt.strftime(
        "%Y/%m/%d"))
    slashed.to_csv(root / "slashed.csv", index=False)
    assert main(["predict", "--model", str(out), "--data", str(root / "slashed.csv"), "--output",
                 str(root / "fc2.csv"), "--seed", "0"]) == 0
    assert "24 series" in capsys.readouterr().out
    written = pd.read_csv(root / "fc2.csv")
    assert written.loc[written["horizon"] == 1, "month"].unique().tolist() == ["2021/01/01"]


def test_stamp_styles():
    months = pd.period_range("2024-01", periods=3, freq="M")
    assert timestamp_style(pd.Series(["2024-01-01", "2024-02-01"]), "M") == {"format": "%Y-%m-%d", "anchor": "start"}
    assert timestamp_style(pd.Series(["2024-01-31", "2024-02-29"]), "M")["anchor"] == "end"
    assert format_stamps(months, {"format": "%Y-%m-%d", "anchor": "end"}) == ["2024-01-31", "2024-02-29",
                                                                             "2024-03-31"]
    assert format_stamps(months, None) == ["2024-01-01", "2024-02-01", "2024-03-01"]
    hours = pd.period_range("2024-01-01 05:00", periods=2, freq="h")
    assert format_stamps(hours, timestamp_style(pd.Series(["2024-01-01 03:00:00"]), "h")) == [
        "2024-01-01 05:00:00", "2024-01-01 06:00:00"]


def test_an_old_run_without_recorded_columns_uses_its_reports(custom_run, tmp_path):
    """Runs written before model.json recorded the columns: report.json's configuration (its time_column key)."""
    import shutil

    root, out, frame = custom_run
    old = tmp_path / "old"
    shutil.copytree(out, old)
    model = json.loads((old / "model.json").read_text())
    del model["columns"]
    (old / "model.json").write_text(json.dumps(model))
    report = json.loads((old / "report.json").read_text())
    report["config"]["time_column"] = report["config"].pop("timestamp_column")
    (old / "report.json").write_text(json.dumps(report))
    table = predict_to_csv(old, root / "sales.csv", tmp_path / "fc.csv", seed=0)
    assert list(table.columns[:2]) == ["store", "month"]


def test_the_run_records_the_columns_it_read(tmp_path):
    """Data with the old default names: the run records id/value, so dpts predict reads the same file alike."""
    path = tmp_path / "old.csv"
    _monthly(ids=24, length=60).rename(columns={"item_id": "id", "target": "value"}).to_csv(path, index=False)
    out = tmp_path / "run"
    with pytest.warns(DeprecationWarning, match="old dpts") as record:
        assert main(["fit", "--data", str(path), *FAST, "--output-dir", str(out)]) == 0
    assert len(_deprecations(record)) == 1  # once
    report = json.loads((out / "report.json").read_text())
    assert (report["config"]["id_column"], report["config"]["value_column"]) == ("id", "value")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # the run's names: nothing to fall back on
        table = predict_to_csv(out, path, tmp_path / "fc.csv", seed=0)
    assert list(table.columns[:2]) == ["id", "timestamp"]


def test_synth_config_accepts_the_old_time_column_keyword():
    from lightning_dpts.app.synth_pipeline import SynthConfig

    with pytest.warns(DeprecationWarning, match="time_column"):
        config = SynthConfig(time_column="month")
    assert config.timestamp_column == "month" and config.id_column == "item_id"

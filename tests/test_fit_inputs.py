"""issue 10, ``dpts fit``: bad data, a budget that allows no step, YAML text values, --drop-short-series and
--max-lag. Every refusal exits 2 naming the option, prints no traceback and writes nothing; all of them happen
before training, so these tests are fast."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.budget import check_one_step as _check_one_step
from lightning_dpts.app.cli import main
from lightning_dpts.app.config import FitConfig
from lightning_dpts.app.forecasters import deepar_lags as _lags
from lightning_dpts.app.jobs.fit import run_fit
from lightning_dpts.errors import ConfigurationError

NO_STEP = ["--noise-multiplier", "0.5", "--epsilon", "0.3"]  # one step spends epsilon ~ 20 on this data


def _csv(path: Path, ids, stamps, values) -> Path:
    pd.DataFrame({"id": ids, "timestamp": stamps, "value": values}).to_csv(path, index=False)
    return path


def _monthly(path: Path, num: int = 12, length: int = 48, short: int | None = None) -> Path:
    ids, stamps, values = [], [], []
    for n in range(num):
        size = short if (short is not None and n == 0) else length
        ids += [f"s{n}"] * size
        stamps += list(pd.date_range("2016-01-01", periods=size, freq="MS").strftime("%Y-%m-%d"))
        values += list(100.0 + n + np.sin(np.arange(size)))
    return _csv(path, ids, stamps, values)


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def _bad(kind: str, path: Path) -> tuple[Path, list[str], str, str]:
    """(csv, extra options, option the error must name, text it must contain)."""
    days = pd.date_range("2020-01-01", periods=40, freq="D").strftime("%Y-%m-%d").tolist()
    if kind == "integer_stamps":
        return _csv(path, ["a"] * 40, list(range(40)), np.arange(40.0)), [], "--timestamp-column", "--freq"
    if kind == "day_first":
        stamps = [f"{d:02d}/01/2020" for d in range(1, 31)]
        return _csv(path, ["a"] * 30, stamps, np.arange(30.0)), [], "--timestamp-column", "line 14"
    if kind == "wrong_freq":
        return _csv(path, ["a"] * 40, days, np.arange(40.0)), ["--freq", "h"], "--timestamp-column", "24 periods"
    if kind == "weekly_among_daily":
        weeks = pd.date_range("2020-01-05", periods=12, freq="W").strftime("%Y-%m-%d").tolist()
        return (_csv(path, ["d"] * 40 + ["w"] * 12, days + weeks, np.arange(52.0)), [], "--timestamp-column",
                "series 'w'")
    if kind == "missing_stamp":
        return _csv(path, ["a"] * 40, days[:9] + [""] + days[10:], np.arange(40.0)), [], "--timestamp-column", "line 11"
    if kind == "missing_id":
        return _csv(path, ["a"] * 5 + [""] + ["a"] * 34, days, np.arange(40.0)), [], "--id-column", "line 7"
    if kind == "complex":
        values = [str(v) for v in np.arange(40.0)]
        values[3] = "1+2j"
        return _csv(path, ["a"] * 40, days, values), [], "--value-column", "complex"
    if kind == "beyond_float32":
        values = np.arange(40.0)
        values[20] = 1e39
        return _csv(path, ["a"] * 40, days, values), [], "--value-column", "float32"
    if kind == "bad_freq":
        return _csv(path, ["a"] * 40, days, np.arange(40.0)), ["--freq", "fortnightly"], "--freq", "frequency"
    raise KeyError(kind)


@pytest.mark.parametrize("kind", ["integer_stamps", "day_first", "wrong_freq", "weekly_among_daily",
                                  "missing_stamp", "missing_id", "complex", "beyond_float32", "bad_freq"])
def test_bad_data_exits_2_names_option_and_row_and_writes_nothing(kind, tmp_path, capsys):
    data, extra, option, text = _bad(kind, tmp_path / "in.csv")
    out = tmp_path / "run"
    code, _, err = _run(["fit", "--data", str(data), *extra, "--output-dir", str(out)], capsys)
    assert code == 2, err
    assert err.startswith(f"dpts: error: {option}:") and text in err and "Traceback" not in err
    assert not out.exists()


def test_a_budget_allowing_no_step_is_refused_before_training_with_the_knobs(tmp_path, capsys):
    data = _monthly(tmp_path / "m.csv")
    out = tmp_path / "run"
    code, printed, err = _run(["fit", "--data", str(data), "--prediction-length", "6", "--batch-size", "8",
                               *NO_STEP, "--delta", "1e-6", "--output-dir", str(out)], capsys)
    assert code == 2 and err.startswith("dpts: error: --noise-multiplier:") and "Traceback" not in err
    assert "training with DP-SGD" not in printed and not out.exists()
    eps_needed = float(re.search(r"raise --epsilon to >= ([0-9.e+]+)", err).group(1))
    sigma_needed = float(re.search(r"raise --noise-multiplier to >= ([0-9.e+]+)", err).group(1))
    # the advice is sufficient: the suggested epsilon (or sigma) allows a step, the given one does not
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.data.loading import load_long_table

    table, freq = load_long_table(data, "id", "timestamp", "value")
    spec = StructuredSubsamplingDataModule(table, context_length=6, prediction_length=6, batch_size=8,
                                           freq=freq).sampling_spec
    _check_one_step(spec, 0.5, eps_needed, 1e-6)
    _check_one_step(spec, sigma_needed, 0.3, 1e-6)
    assert sigma_needed > 0.5 and eps_needed > 0.3
    # the Python API raises the same instead of returning an untrained model
    config = FitConfig(data=str(data), prediction_length=6, batch_size=8, noise_multiplier=0.5, epsilon=0.3,
                       delta=1e-6, output_dir=str(out))
    with pytest.raises(ConfigurationError) as info:
        run_fit(config, progress=lambda _: None)
    assert info.value.parameter == "noise_multiplier" and not out.exists()


def test_yaml_text_numbers_are_parsed_and_bad_keys_named(tmp_path, capsys):
    data = _monthly(tmp_path / "m.csv")
    out = tmp_path / "run"
    config = tmp_path / "c.yaml"
    # PyYAML reads 1e-6 and 3e0 (no dot) as strings; they must mean numbers
    config.write_text(f"data: {data}\ndelta: 1e-6\nepsilon: 3e-1\nnoise_multiplier: '0.5'\nprediction_length: 6\n"
                      f"batch_size: 8.0\nepochs: 1e1\nnon_dp: 'no'\noutput_dir: {out}\n")
    code, _, err = _run(["fit", "--config", str(config)], capsys)
    assert code == 2 and err.startswith("dpts: error: --noise-multiplier:")  # reached the budget check
    assert "delta=1e-06" in err and not out.exists()
    config.write_text(f"data: {data}\nepochs: lots\noutput_dir: {out}\n")
    code, _, err = _run(["fit", "--config", str(config)], capsys)
    assert code == 2 and err.startswith("dpts: error: --config:") and "'epochs'" in err and "Traceback" not in err
    config.write_text(f"data: {data}\nepochs: 2.5\n")
    code, _, err = _run(["fit", "--config", str(config)], capsys)
    assert code == 2 and "'epochs'" in err and "whole number" in err
    cfg = FitConfig.from_mapping({"delta": "1e-7", "epochs": "1e2", "autoets": "false", "id_column": 7})
    assert (cfg.delta, cfg.epochs, cfg.autoets, cfg.id_column) == (1e-7, 100, False, "7")


def test_drop_short_series_from_the_cli_and_yaml(tmp_path, capsys):
    data = _monthly(tmp_path / "m.csv", short=8)  # series s0: 8 steps < 6 test + 6 training steps
    out = tmp_path / "run"
    base = ["fit", "--data", str(data), "--prediction-length", "6", "--batch-size", "8", "--output-dir", str(out)]
    code, _, err = _run(base + NO_STEP, capsys)
    assert code == 2 and err.startswith("dpts: error: --data:") and "--drop-short-series" in err
    with pytest.warns(UserWarning, match="dropped 1 of 12 series"):
        code, printed, err = _run(base + NO_STEP + ["--drop-short-series"], capsys)
    assert code == 2 and "\ndpts: error: --noise-multiplier:" in "\n" + err  # past the data: dropped
    assert "dropped 1 series" in printed and not out.exists()
    config = tmp_path / "c.yaml"
    config.write_text("drop_short_series: true\n")
    with pytest.warns(UserWarning, match="dropped 1 of 12 series"):
        code, _, err = _run(["fit", "--config", str(config), *base[1:], *NO_STEP], capsys)
    assert code == 2 and "\ndpts: error: --noise-multiplier:" in "\n" + err  # warnings may come first (-p no:warnings)


def test_default_deepar_lags_warn_with_their_cost_and_max_lag_caps_them(tmp_path):
    days = pd.date_range("2020-01-01", periods=120, freq="D").strftime("%Y-%m-%d").tolist()
    data = _csv(tmp_path / "d.csv", sum([[f"s{n}"] * 120 for n in range(16)], []), days * 16,
                np.tile(np.sin(np.arange(120.0)), 16) + 5.0)
    from gluonts.time_feature import get_lags_for_frequency

    assert max(get_lags_for_frequency("D")) > 120 and _lags("D", None) is None  # defaults reach past the data
    assert _lags("D", 7) == [1, 2, 3, 4, 5, 6, 7]
    config = dict(data=str(data), model="deepar", prediction_length=7, batch_size=8, epochs=1,
                  noise_multiplier=2.0, epsilon=1e-3, delta=1e-6, output_dir=str(tmp_path / "run"))
    with pytest.warns(UserWarning, match="--max-lag") as record:
        with pytest.raises(ConfigurationError):  # the budget check after the warning keeps this fast
            run_fit(FitConfig(**config), progress=lambda _: None)
    text = next(str(w.message) for w in record if "--max-lag" in str(w.message))
    with_lags, without = map(float, re.search(r": ([0-9.e+]+) with, ([0-9.e+]+) without", text).groups())
    assert with_lags > without  # the cost, from the accountant, in epsilon
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConfigurationError):
            run_fit(FitConfig(**config, max_lag=7), progress=lambda _: None)
    assert not [w for w in caught if "--max-lag" in str(w.message)]
    with pytest.raises(ConfigurationError) as info:
        FitConfig(max_lag=7).validate()  # dlinear reads no lags: refused, not ignored
    assert info.value.parameter == "max_lag"


def test_integer_options_accept_whole_numbers_written_as_floats():
    from lightning_dpts.app.cli import _fit_config, build_parser

    args = build_parser().parse_args(["fit", "--epochs", "1e1", "--batch-size", "32.0", "--max-lag", "7"])
    config = _fit_config(args)
    assert (config.epochs, config.batch_size, config.max_lag) == (10, 32, 7)
    assert type(config.epochs) is int

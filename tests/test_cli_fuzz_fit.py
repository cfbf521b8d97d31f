"""Fuzz ``dpts fit``'s numeric options: boundary, invalid, huge and non-numeric values.

Every case must exit 2 naming the option, print no traceback, write nothing, and refuse before any work (the
refusal comes from argparse or FitConfig.validate: no table read, no Trainer fit, no privacy-loss composition, counted
by tests/work.py rather than timed) with bounded memory.
"""

from __future__ import annotations

import resource
import sys

import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.app.config import FIT_RANGES

from .work import count_data_and_training

NON_NUMERIC = ["abc", "", "1,5", "0x10", "one", "--", "1e", "[1]"]
NOT_FINITE = ["nan", "inf", "-inf", "1e400", "-1e400"]
HUGE = ["1e20", "1e308", "-1e308", str(10**30), str(-(10**30))]

# option -> values outside its accepted range (the boundaries of FitConfig's FIT_RANGES and beyond)
BOUNDARY = {
    "--prediction-length": ["0", "-1", "100001"],
    "--context-length": ["0", "-1", "100001"],
    "--epochs": ["0", "-1", "100001"],
    "--batch-size": ["0", "-1", "10000001"],
    "--instances-per-series": ["0", "-1", "1000001"],
    "--size": ["0", "-1", "1000001"],
    "--max-lag": ["0", "-1", "100001", "5"],  # 5 is in range but the default model (combination) reads no lags
    "--min-series-length": ["0", "-1", "1000000001"],
    "--epsilon": ["0", "-0", "-1", "100.001"],
    "--delta": ["0", "1", "0.2", "1e-16", "-1e-7"],
    "--noise-multiplier": ["0", "0.0999", "100.01", "-1"],
    "--max-grad-norm": ["0", "-1", "1000001"],
    "--learning-rate": ["0", "-0.001", "10.01"],
    "--value-bound": ["0", "-1", "1e31"],
    "--context-noise": ["-1e-9", "1000001"],
    "--forecast-noise": ["-1e-9", "1000001"],
    "--seed": ["-1", "1.5"],
    "--test-windows": ["0", "-1", "10001"],
    "--season-length": ["0", "-1", "100001"],
    "--clip-low": ["1e31", "-1e31"],
    "--clip-high": ["1e31", "-1e31"],
    "--clip-count-epsilon": ["-1", "100.01", "0.1"],  # 0.1 is in range but needs --clip-low/--clip-high
    "--dp-metrics-epsilon": ["0", "-1", "100.01", "1"],  # 1 is in range but leaves nothing of the default budget
    "--bands": ["0", "-1", "1025"],
    "--monte-carlo-samples": ["0", "999", "100000001"],
    "--baseline-windows": ["-1", "1000000001"],
}
INTEGER = {"--prediction-length", "--context-length", "--epochs", "--batch-size", "--instances-per-series",
           "--size", "--max-lag", "--seed", "--test-windows",
           "--season-length", "--min-series-length", "--bands", "--monte-carlo-samples", "--baseline-windows"}
CASES = [(opt, v) for opt, values in BOUNDARY.items() for v in values]
CASES += [(opt, v) for opt in BOUNDARY for v in NON_NUMERIC + NOT_FINITE + HUGE]
CASES += [(opt, "12.5") for opt in sorted(INTEGER)]  # a fraction where an integer is required (12.0 and 1.2e1 mean 12)


@pytest.mark.parametrize("value", ["0", "-1", "1e31", "nan", "inf", "1e308"])
def test_value_bound_range_with_augmentation_noise(value, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--context-noise", "1", f"--value-bound={value}", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--value-bound" in err and "Traceback" not in err


def test_every_numeric_option_is_fuzzed():
    numeric = {"--" + name.replace("_", "-") for name in FIT_RANGES}
    assert numeric <= set(BOUNDARY)


def _peak_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


@pytest.fixture(scope="module", autouse=True)
def _imports_loaded(tmp_path_factory):
    """One refusal before the measured ones: the modules a refusal imports (once per process, e.g. a fresh xdist
    worker) are not the bounded work the peak-memory check is about."""
    import lightning  # noqa: F401 - what a refusal after the model's checks has imported
    import torch  # noqa: F401

    import lightning_dpts.app.jobs.fit  # noqa: F401

    with pytest.raises(SystemExit):
        main(["fit", "--epochs=0", "--output-dir", str(tmp_path_factory.mktemp("warm") / "run")])


@pytest.mark.parametrize(("option", "value"), CASES)
def test_fit_refuses_with_exit_2_naming_the_option(option, value, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    before = _peak_mib()
    work = count_data_and_training(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", f"{option}={value}", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert option in err and "Traceback" not in err
    assert work.total_calls == 0, dict(work.calls)  # refused before any table, fit or composition
    assert _peak_mib() - before < 256
    assert not out.exists()


# ---------------------------------------------------------------------------------------------------------
# issue 24 item 9: inputs that are not numbers, refused with exit 2 naming the option before any work
# ---------------------------------------------------------------------------------------------------------
def _refused(argv: list[str], option: str, capsys) -> str:
    with pytest.MonkeyPatch.context() as patch:
        work = count_data_and_training(patch)
        with pytest.raises(SystemExit) as exit_:
            main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert option in err and "Traceback" not in err, err
    assert work.calls["fit"] == 0 and work.calls["rfft"] == 0, dict(work.calls)  # refused before training
    return err


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\x89PNG\r\n\x1a\n\x00\x00", b"\xff\xfe\x00"],
                         ids=["all-bytes", "png-header", "utf16-bom"])
def test_fit_binary_config_exits_2(content, tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_bytes(content)
    _refused(["fit", "--config", str(config), "--output-dir", str(tmp_path / "run")], "--config", capsys)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("make", [lambda p: p.write_text("a file"),
                                  lambda p: (p.mkdir(), (p / "old.png").write_bytes(b"x"))],
                         ids=["a-file", "a-non-empty-directory"])
def test_fit_output_dir_that_cannot_take_a_run_exits_2_up_front(make, tmp_path, capsys):
    out = tmp_path / "out"
    make(out)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    _refused(["fit", "--output-dir", str(out)], "--output-dir", capsys)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.fixture(scope="module")
def fitted(tiny_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz_predict") / "run"
    assert main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--model", "simple_feedforward",
                 "--epsilon", "2.0", "--delta", "1e-6", "--epochs", "1", "--batch-size", "8", "--no-non-dp",
                 "--no-private-outputs", "--output-dir", str(out)]) == 0
    return out


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated", bytes(range(256))], ids=["empty", "truncated",
                                                                                               "garbage"])
def test_predict_with_a_corrupt_predictor_exits_2(fitted, tiny_csv, damage, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(fitted, model)
    (model / "predictor" / "prediction-net-state.pt").write_bytes(damage)
    _refused(["predict", "--model", str(model), "--data", str(tiny_csv), "--output", str(tmp_path / "f.csv")],
             "--model", capsys)
    assert not (tmp_path / "f.csv").exists()


@pytest.mark.parametrize("output", ["/proc/x.csv", "/proc/self/none/x.csv", "{tmp}", "{tmp}/file.csv/x.csv"])
def test_predict_to_an_unwritable_output_exits_2(fitted, tiny_csv, output, tmp_path, capsys):
    (tmp_path / "file.csv").write_text("not a directory")
    _refused(["predict", "--model", str(fitted), "--data", str(tiny_csv), "--output",
              output.format(tmp=tmp_path)], "--output", capsys)


# ---------------------------------------------------------------------------------------------------------
# issue 38: tracebacks that became clear errors, and the exit code of a refusal after training began
# ---------------------------------------------------------------------------------------------------------
def _refused_without_traceback(argv: list[str], option: str, capsys, status: int = 2) -> str:
    """``main(argv)`` exits ``status`` naming ``option``, without a traceback (no timing: the work is bounded by
    what the refusal skips)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == status, err
    assert option in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("freq", ["XYZ", "1.5M", "M-FOO", " "])
def test_predict_with_a_frequency_pandas_does_not_know_exits_2(fitted, tiny_csv, freq, tmp_path, capsys):
    """Before issue 38: pandas' ValueError traceback from ``to_offset``."""
    _refused_without_traceback(["predict", "--model", str(fitted), "--data", str(tiny_csv), "--freq", freq,
                                "--output", str(tmp_path / "f.csv")], "--freq", capsys)
    assert not (tmp_path / "f.csv").exists()


@pytest.mark.parametrize("damage", ["truncated", "empty", "binary", "a list", "bad freq"])
def test_predict_with_a_damaged_model_json_exits_2(fitted, tiny_csv, damage, tmp_path, capsys):
    """Before issue 38: a ``JSONDecodeError`` traceback for a truncated ``model.json``."""
    import json
    import shutil

    model = tmp_path / "model"
    shutil.copytree(fitted, model)
    path = model / "model.json"
    text = path.read_text()
    if damage == "truncated":
        path.write_text(text[: len(text) // 2])
    elif damage == "empty":
        path.write_text("")
    elif damage == "binary":
        path.write_bytes(bytes(range(256)))
    elif damage == "a list":
        path.write_text("[1, 2]")
    else:
        path.write_text(json.dumps({**json.loads(text), "freq": "XYZ"}))
    err = _refused_without_traceback(["predict", "--model", str(model), "--data", str(tiny_csv), "--output",
                                      str(tmp_path / "f.csv")], "--model", capsys)
    assert "model.json" in err
    assert not (tmp_path / "f.csv").exists()


def test_fit_refused_after_training_began_exits_3_and_keeps_nothing(tiny_csv, tmp_path, capsys, monkeypatch):
    """A check that refuses a step once training has begun (here the spot check, made to find a mix at the second
    step) exits 3, not 2 (which docs/cli.md keeps for input refused before any work): before issue 38 it exited 2."""
    from lightning_dpts.errors import ConfigurationError
    from lightning_dpts.training import DPForecastStrategy
    from lightning_dpts.training.independence import SpotCheck

    def refuse_second(self, pl_module):
        if self.context.fit_steps >= 1:
            raise ConfigurationError("model", type(pl_module).__name__, "forward mixes the windows (test)")

    monkeypatch.setattr(SpotCheck, "check", refuse_second)
    monkeypatch.setattr(DPForecastStrategy, "__init__", _with_spot_check(DPForecastStrategy.__init__))
    out = tmp_path / "run"
    err = _refused_without_traceback(
        ["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--model", "simple_feedforward", "--epsilon",
         "2.0", "--delta", "1e-6", "--epochs", "2", "--batch-size", "8", "--no-non-dp", "--output-dir", str(out)],
        "--model", capsys, status=3)
    assert "training refused after 1 noisy steps" in err and "forward mixes the windows (test)" in err
    assert not out.exists() or not any(p.is_file() and p.name != ".lock" for p in out.rglob("*"))


def _with_spot_check(init):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "spot_check": 1.0})
    return wrapped

"""Issue 32: the smaller usability items (each test fails on the code before the fix)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]


def test_strategy_argument_points_to_callbacks():
    import lightning as L

    from lightning_dpts.training import DPForecastStrategy

    with pytest.raises(ValueError, match=r"callbacks=\[DPForecastStrategy"):
        L.Trainer(strategy=DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0))


@pytest.mark.parametrize("epsilon", [0, 0.0])
def test_accountant_refuses_zero_epsilon(epsilon):
    from lightning_dpts.training import AccountantCallback

    with pytest.raises(ConfigurationError, match="> 0"):
        AccountantCallback(epsilon=epsilon, delta=1e-5)


def test_privacy_epsilon_header_has_no_repeated_column(capsys):
    argv = ["privacy", "epsilon", "--num-series", "100", "--min-length", "100", "--context-length", "10",
            "--prediction-length", "5", "--batch-size", "10", "--noise-multiplier", "1", "--delta", "1e-5",
            "--steps", "10", "100"]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[1].split()
    assert len(header) == len(set(header)), header
    assert header == ["steps", "epsilon", "TPR@0.001", "TPR@0.01", "mu-GDP"]  # read-outs next to epsilon (issue 43)


@pytest.mark.parametrize("cell", ["n/a", "NA", "null", "#N/A"])
def test_text_in_value_column_is_refused(tmp_path, cell):
    from lightning_dpts.data.loading import load_long_table

    path = tmp_path / "d.csv"
    rows = [("a", f"2020-0{m}", str(m)) for m in range(1, 8)]
    rows[3] = ("a", "2020-04", cell)
    pd.DataFrame(rows, columns=["id", "timestamp", "value"]).to_csv(path, index=False)
    with pytest.raises(ConfigurationError, match="not a number"):
        load_long_table(path, "id", "timestamp", "value")


@pytest.mark.parametrize("cell", ["", "NaN", "nan", "None"])
def test_documented_missing_cells_are_missing(tmp_path, cell):
    from lightning_dpts.data.loading import load_long_table

    path = tmp_path / "d.csv"
    path.write_text("id,timestamp,value\n" + "".join(
        f"a,2020-0{m},{cell if m == 4 else m}\n" for m in range(1, 8)))
    table, _ = load_long_table(path, "id", "timestamp", "value")
    assert table["target"].isna().sum() == 1


@pytest.mark.parametrize("argv", [
    ["fit", "--data", "/nonexistent/d.csv", "--output-dir", "/nonexistent/out"],
    ["predict", "--model", "/nonexistent/run", "--data", "/nonexistent/d.csv"],
    ["synth", "--data", "/nonexistent/d.csv", "--output-dir", "/nonexistent/out"],
])
def test_missing_data_file_reported_before_heavy_imports(argv):
    code = ("import sys; from lightning_dpts.app.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
            "heavy = [m for m in ('torch', 'lightning', 'gluonts') if m in sys.modules]\n"
            "print('HEAVY', heavy); sys.exit(code)")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=600)  # a hang guard only
    assert out.returncode == 2, out.stderr
    assert "--data: no such file" in out.stderr
    assert "HEAVY []" in out.stdout  # the work not done is counted: no torch, lightning or gluonts import


def test_fit_config_refuses_missing_data_file():
    from lightning_dpts.app.config import FitConfig

    with pytest.raises(ConfigurationError, match="no such file"):
        FitConfig(data="/nonexistent/d.csv").validate()

"""End-to-end ``dpts synth`` on tiny data, CLI errors, and the attacker's view of the vote noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.app.jobs.synth import run_synth
from lightning_dpts.data.loading import load_long_table
from tests.synthetic.conftest import tiny_config as _tiny_config

TINY = ["--length", "12", "--num-samples", "8", "--iterations", "2", "--prediction-length", "4",
        "--pretrain-epochs", "1,1", "--num-public", "64", "--tstr-steps", "3", "--lookahead", "1", "--no-progress"]


def test_dpts_synth_end_to_end(tiny_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "run"
    assert main(["synth", "--data", str(tiny_csv), *TINY, "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["epsilon"] <= 1.0 and report["delta"] == 1e-5
    assert report["epsilon"] == pytest.approx(report["epsilon_theorem_2"], abs=2e-3)
    private = json.loads((out / "private" / "evaluation.json").read_text())  # computed from the private data
    assert np.isfinite(private["c_fid"]) and np.isfinite(private["c_fid_initial"])
    assert {"tstr_dlinear", "seasonal_naive", "tstr_dlinear_initial"} <= set(private["tstr"])
    assert "NOT covered" in private["evaluation_note"]
    assert "seeded_notice" not in report and report["config"]["seeded"] is False
    assert (out / "private" / "real_vs_synthetic.png").stat().st_size > 0
    table, freq = load_long_table(out / "synthetic.csv.gz", "id", "timestamp", "value")
    assert freq == "M" and table["item_id"].nunique() == 8 and len(table) == 8 * 12
    assert report["public_models"]["reused"] is False
    # second run reuses the cached public weights
    assert main(["synth", "--data", str(tiny_csv), *TINY, "--no-tstr", "--overwrite", "--output-dir", str(out)]) == 0
    assert json.loads((out / "report.json").read_text())["public_models"]["reused"] is True


def test_conditional_generation_by_class(tiny_csv: Path, tmp_path: Path) -> None:
    report = run_synth(_tiny_config(tiny_csv, tmp_path, class_column="kind", classes=["a", "b"]), log=lambda _m: None)
    table = pd.read_csv(tmp_path / "synthetic.csv.gz")
    assert table.groupby("kind")["id"].nunique().to_dict() == {"a": 4, "b": 4}
    assert len(report["_result"].noisy_histograms[0]) == 8


@pytest.mark.parametrize("args, option", [
    (["--epsilon", "-1"], "--epsilon"),
    (["--delta", "2"], "--delta"),
    (["--class-column", "kind"], "--classes"),
    (["--num-samples", "7", "--class-column", "kind", "--classes", "a,b"], "--num-samples"),
    (["--variation-schedule", "50,200"], "--variation-schedule"),
    (["--prediction-length", "12"], "--prediction-length"),
    (["--seed", "-3"], "--seed"),
])
def test_cli_errors_name_the_option(tiny_csv: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                    args: list[str], option: str) -> None:
    argv = ["synth", "--data", str(tiny_csv), *TINY, "--output-dir", str(tmp_path / "x"), *args]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert option in capsys.readouterr().err


def test_compare_dp_sgd_runs_the_fit_job_the_command_line_passes(tiny_csv: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import lightning_dpts.app.jobs.fit as fit_job

    seen = []

    def fake_run_fit(config, progress):  # the dpts fit job, as synth's command line composes it
        seen.append(config)
        return {"epsilon": 0.9, "private": {"metrics": {"dp": {"mase": 1.5}}}}

    monkeypatch.setattr(fit_job, "run_fit", fake_run_fit)
    out = tmp_path / "run"
    assert main(["synth", "--data", str(tiny_csv), *TINY, "--compare-dp-sgd", "--output-dir", str(out)]) == 0
    assert [(c.model, c.epsilon, c.output_dir) for c in seen] == [("dlinear", 1.0, str(out / "private" / "dp_sgd"))]
    dp_sgd = json.loads((out / "private" / "evaluation.json").read_text())["tstr"]["dp_sgd_dlinear"]
    assert dp_sgd["mase"] == 1.5 and dp_sgd["epsilon"] == 0.9


def test_compare_dp_sgd_in_python_needs_the_fit_job(tiny_csv: Path, tmp_path: Path) -> None:
    from lightning_dpts.errors import ConfigurationError

    config = _tiny_config(tiny_csv, tmp_path / "run", compare_dp_sgd=True, tstr=True, tstr_steps=3)
    with pytest.raises(ConfigurationError, match="compare"):
        run_synth(config, log=lambda _m: None)
    assert not (tmp_path / "run").exists()  # refused before anything is written

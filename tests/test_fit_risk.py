"""Issue 43: ``dpts fit`` reports the membership-attack read-outs next to epsilon: in report.json and in the CSV and
TensorBoard logs of the run, read back from the files."""

from __future__ import annotations

import csv
import json
import math

import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.privacy.risk import metric_names

FAST = ["--prediction-length", "6", "--model", "simple_feedforward", "--epsilon", "2.0", "--delta", "1e-6",
        "--epochs", "1", "--batch-size", "8", "--no-non-dp", "--no-private-plots", "--test-windows", "1"]


def _risk(report: dict) -> dict:
    risk = report["risk"]
    assert set(risk["tpr_at_fpr"]) == {"0.001", "0.01"} and risk["mu_gdp_delta"] == report["delta"]
    for fpr, tpr in risk["tpr_at_fpr"].items():
        assert float(fpr) <= tpr <= 1.0
    assert risk["mu_gdp"] > 0 and "unit of privacy" in risk["meaning"]
    return risk


def test_report_and_csv_log_hold_the_read_outs(tiny_csv, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), *FAST, "--output-dir", str(out)]) == 0  # the default logger: csv
    assert "membership-attack TPR" in capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    risk = _risk(report)
    assert risk["covers"] == "training"
    logs = list((out / "private" / "logs").rglob("metrics.csv"))
    rows = [r for r in csv.DictReader(open(logs[0])) if r.get("epsilon")]
    assert len(rows) == report["steps"]
    for name in metric_names():
        values = [float(r[name]) for r in rows]
        assert values == sorted(values)  # non-decreasing with the steps
    last = rows[-1]
    # the last step's logged values bound the report's (computed exactly at the last count), within the table's 1%
    for fpr, tpr in risk["tpr_at_fpr"].items():
        assert tpr <= float(last[f"tpr_at_fpr_{fpr}"]) <= 1.01 * tpr
    assert risk["mu_gdp"] * (1 - 1e-3) <= float(last["mu_gdp"]) <= 1.01 * risk["mu_gdp"]


def test_tensorboard_log_holds_the_read_outs(tiny_csv, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), *FAST, "--logger", "tensorboard", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    events = list((out / "private" / "logs").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    assert set(metric_names()) <= set(acc.Tags()["scalars"])
    last = acc.Scalars("tpr_at_fpr_0.001")[-1].value
    assert last == pytest.approx(report["risk"]["tpr_at_fpr"]["0.001"], rel=0.01)
    assert len(acc.Scalars("mu_gdp")) == report["steps"]


def test_pure_dp_releases_are_composed_into_the_read_outs(tiny_csv, tmp_path):
    """--dp-metrics-epsilon releases a Laplace count: the read-outs cover it too (randomized response) and exceed
    the training's."""
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), *FAST, "--dp-metrics-epsilon", "0.2", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    risk = _risk(report)
    assert "0.2" in risk["covers"]
    rows = [r for r in csv.DictReader(open(next((out / "private" / "logs").rglob("metrics.csv")))) if r.get("epsilon")]
    assert risk["tpr_at_fpr"]["0.001"] > float(rows[-1]["tpr_at_fpr_0.001"])  # training alone, logged by the callback


_SMALL = ["--num-series", "100", "--min-length", "200", "--context-length", "12", "--prediction-length", "6",
            "--batch-size", "32", "--delta", "1e-7"]


@pytest.mark.parametrize("action", ["steps", pytest.param("noise", marks=pytest.mark.slow)])  # noise: a calibration
def test_privacy_steps_and_noise_print_the_read_outs_of_the_run_they_plan(action, capsys):
    """`dpts privacy steps|noise` answer with a run (a step count, a noise multiplier); the read-outs are those of
    that run, from the accountant's own PLD: the same as `dpts privacy epsilon` gives for it."""
    steps_args = ["--noise-multiplier", "4", "--epsilon", "1"]
    extra = steps_args if action == "steps" else ["--epsilon", "1", "--steps", "1000"]
    assert main(["privacy", action, *_SMALL, *extra, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    sigma = 4.0 if action == "steps" else out["noise_multiplier"]
    steps = out["steps"] if action == "steps" else 1000
    assert main(["privacy", "epsilon", *_SMALL, "--noise-multiplier", repr(sigma), "--steps", str(steps),
                 "--json"]) == 0
    same = json.loads(capsys.readouterr().out)["risk"][str(steps)]
    mine, theirs = out["risk"], same
    assert mine["tpr_at_fpr"] == pytest.approx(theirs["tpr_at_fpr"], rel=1e-9)
    assert mine["mu_gdp"] == pytest.approx(theirs["mu_gdp"], rel=1e-9) and mine["mu_gdp_delta"] == 1e-7
    assert 0.001 < out["risk"]["tpr_at_fpr"]["0.001"] <= 0.001 * math.e + 1e-7  # epsilon <= 1: e * alpha + delta
    assert main(["privacy", action, *_SMALL, *extra]) == 0
    assert "membership risk for the unit of privacy after those steps: TPR@0.001 <=" in capsys.readouterr().out
    assert main(["privacy", action, *_SMALL, *extra, "--bound", "lower", "--json"]) == 0
    assert "risk" not in json.loads(capsys.readouterr().out)  # no read-out of the optimistic bound

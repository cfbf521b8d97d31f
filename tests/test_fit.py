"""``dpts fit``: the main job end to end on a tiny slice of the bundled data, and its bad-input paths."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.cli import main


def test_fit_end_to_end_on_a_tiny_slice(tiny_csv, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--model", "simple_feedforward",
                 "--epsilon", "2.0", "--delta", "1e-6", "--epochs", "3", "--batch-size", "8", "--seed", "1",
                 "--output-dir", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "seasonal naive" in printed and "privacy spent" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["epsilon"] <= 2.0 and report["delta"] == 1e-6
    assert report["bound"]["theorem"] == "Theorem 4.4"
    evaluation = json.loads((out / "private" / "evaluation.json").read_text())
    for name in ("dp", "non_dp", "seasonal_naive"):
        assert np.isfinite(evaluation["metrics"][name]["crps"]) and np.isfinite(evaluation["metrics"][name]["mae"])
    spec = report["privacy_configuration"]["sampling_spec"]
    assert spec["num_series"] == 24 and spec["prediction_length"] == 6 and spec["batch_size"] == 8
    for name in ("epsilon.png", "private/forecasts.png", "dp-model.ckpt"):
        assert (out / name).stat().st_size > 0
    metrics = pd.read_csv(next((out / "private" / "logs").glob("version_*/metrics.csv")))
    eps = metrics["epsilon"].dropna()
    assert len(eps) == report["steps"] and eps.max() <= 2.0
    # an explicit seed: the run says its guarantee does not hold against anyone who knows it, and stores no seed
    assert report["seeded"] is True and "does NOT hold" in report["seeded_notice"] and "WARNING" in printed
    assert report["config"]["seed"] == "explicit (not recorded)"
    assert report["privacy_ledger"]["steps"] == report["steps"] and report["privacy_ledger"]["seeded"] is True


def test_two_default_fits_release_different_models_and_write_nothing_that_reproduces_them(tiny_csv, tmp_path):
    """Issue 9 item 1: `dpts fit` without --seed uses secret OS entropy for sampling, noise and initialisation."""
    import torch

    from lightning_dpts.app.config import FitConfig

    assert FitConfig().seed is None and FitConfig().secure_mode is False
    weights = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--model", "simple_feedforward",
                     "--epsilon", "2.0", "--delta", "1e-6", "--epochs", "1", "--batch-size", "8", "--no-non-dp",
                     "--output-dir", str(out)]) == 0
        report = json.loads((out / "report.json").read_text())
        assert report["seeded"] is False and "seeded_notice" not in report and report["config"]["seed"] is None
        checkpoint = torch.load(out / "dp-model.ckpt", weights_only=False)
        state = checkpoint["callbacks"]["DPForecastStrategy"]
        assert "generator_state" not in state and "seed" not in state and state["seeded"] is False
        assert checkpoint["dpts_privacy_ledger"]["steps"] == report["steps"] > 0
        weights.append(checkpoint["state_dict"])
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_fit_reads_a_yaml_config(tiny_csv, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(f"data: {tiny_csv}\nprediction_length: 6\nepochs: 2\nbatch_size: 8\nnon_dp: false\n"
                      f"output_dir: {tmp_path / 'run'}\nepsilon: 3.0\ndelta: 1.0e-6\n")
    assert main(["fit", "--config", str(config), "--model", "dlinear"]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    evaluation = json.loads((tmp_path / "run" / "private" / "evaluation.json").read_text())
    assert report["model"] == "dlinear" and "non_dp" not in evaluation["metrics"]


@pytest.mark.parametrize(
    "make,args,option",
    [
        (lambda p: None, ["--data", "missing.csv"], "--data"),
        (lambda p: pd.DataFrame({"series": ["a"], "timestamp": ["2020-01-01"], "value": [1.0]}).to_csv(p, index=False),
         [], "--id-column"),
        (lambda p: pd.DataFrame({"id": ["a", "a"], "timestamp": ["2020-01-01", "2020-02-01"],
                                 "value": [1.0, "lots"]}).to_csv(p, index=False), [], "--value-column"),
        (lambda p: pd.DataFrame({"id": ["a"] * 3, "timestamp": ["2020-01-01", "2020-02-01", "2020-03-01"],
                                 "value": [1.0, 2.0, 3.0]}).to_csv(p, index=False), [], "--data"),
    ],
)
def test_bad_input_exits_non_zero_and_writes_nothing(tmp_path, capsys, make, args, option):
    data = tmp_path / "in.csv"
    make(data)
    out = tmp_path / "run"
    argv = ["fit", "--data", str(data), *args, "--output-dir", str(out)]
    if args and args[0] == "--data":
        argv = ["fit", *args, "--output-dir", str(out)]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert option in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("argv, option", [(["--secure-mode", "--seed", "1"], "--secure-mode"),
                                          (["--seed", "-1"], "--seed")])
def test_seed_and_secure_mode_errors_name_the_option(tmp_path, capsys, argv, option):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *argv, "--output-dir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and option in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_autoets_without_statsforecast_is_an_error_before_anything_is_written(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "statsforecast" else real(name, *a))
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--autoets", "--output-dir", str(tmp_path / "run")])
    assert exit_.value.code == 2 and "--autoets" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_default_job(tmp_path):
    """The documented default: bundled data, epsilon <= 1 at delta = 1e-7, private CRPS below seasonal naive."""
    out = tmp_path / "default"
    assert main(["fit", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["epsilon"] <= 1.0 and report["delta"] == 1e-7
    metrics = json.loads((out / "private" / "evaluation.json").read_text())["metrics"]
    assert metrics["dp"]["crps"] < metrics["seasonal_naive"]["crps"]
    # issue 43: the membership-attack read-outs next to epsilon, in report.json and in every step's CSV row
    assert set(report["risk"]["tpr_at_fpr"]) == {"0.001", "0.01"} and report["risk"]["mu_gdp"] > 0
    import csv

    rows = [r for r in csv.DictReader(open(next((out / "private" / "logs").rglob("metrics.csv")))) if r.get("epsilon")]
    assert len(rows) == report["steps"] and all(r["tpr_at_fpr_0.001"] and r["mu_gdp"] for r in rows)


@pytest.mark.slow  # a whole fit with AutoETS; tests/test_baselines.py checks the statsforecast quantiles directly
@pytest.mark.skipif(importlib.util.find_spec("statsforecast") is None, reason="optional statsforecast not installed")
def test_autoets_baseline(tiny_csv, tmp_path):
    out = tmp_path / "ets"
    assert main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--epochs", "2", "--batch-size", "8",
                 "--autoets", "--no-non-dp", "--output-dir", str(out)]) == 0
    metrics = json.loads((out / "private" / "evaluation.json").read_text())["metrics"]
    assert set(metrics) == {"dp", "seasonal_naive", "autoets", "autotheta"}
    assert np.isfinite(metrics["autoets"]["crps"]) and np.isfinite(metrics["autotheta"]["mase"])


def test_missing_statsforecast_skips_the_baselines_and_says_how_to_install(tiny_csv, tmp_path, capsys, monkeypatch):
    """Issue 37: without the optional package the evaluation still runs with seasonal naive, and says so."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "statsforecast" else real(name, *a))
    out = tmp_path / "run"
    assert main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--epochs", "1", "--batch-size", "8",
                 "--no-non-dp", "--no-private-plots", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    private = json.loads((out / "private" / "evaluation.json").read_text())
    assert set(private["metrics"]) == {"dp", "seasonal_naive"}
    assert "pip install 'lightning-dpts[baselines]'" in private["baselines"]["skipped"]
    assert "AutoETS and AutoTheta were skipped: the optional package statsforecast is not installed" in printed

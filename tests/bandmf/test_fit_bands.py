"""``dpts fit --bands B``: BandMF noise with cyclic Poisson sampling and the PLD accountant (default), or with
``--top-level b_min_sep`` b-min-sep sampling and the Monte Carlo accountant, from the command line.

Tiny data (24 series, 60 months), few steps and 20,000 Monte Carlo samples per direction keep every run a few
seconds. The refusals are checked to happen before anything is written (the output directory does not exist).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpts.app.cli import main
from lightning_dpts.app.console import DeltaWarning

_BASE = ["--prediction-length", "6", "--model", "simple_feedforward", "--batch-size", "8", "--epochs", "3",
         "--epsilon", "8", "--delta", "0.05", "--monte-carlo-samples", "20000", "--no-non-dp",
         "--no-private-plots", "--top-level", "b_min_sep"]
_CYCLIC = ["--prediction-length", "6", "--model", "simple_feedforward", "--batch-size", "8", "--epochs", "3",
           "--epsilon", "8", "--delta", "1e-7", "--no-non-dp", "--no-private-plots"]


def test_fit_with_bands_trains_bandmf_with_a_verified_monte_carlo_budget(tiny_csv, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", str(tiny_csv), *_BASE, "--bands", "2", "--noise-multiplier", "2.0",
                 "--seed", "3", "--output-dir", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Monte Carlo accounting of the planned 9 steps" in printed and "verified: epsilon <=" in printed
    report = json.loads((out / "report.json").read_text())
    assert report["bound"]["kind"] == "monte_carlo" and report["steps"] == 9
    assert 0 < report["epsilon"] <= 8 and report["delta"] == 0.05
    mc = report["monte_carlo"]
    assert mc["bands"] == 2 and mc["iterations"] == 9 and mc["samples_per_direction"] == 20_000
    assert mc["leak_probability"] == 1.0 and mc["relation"].startswith("series-level")
    assert len(mc["coefficients"]) == 2 and mc["coefficients"][1] > 0  # correlated noise, not DP-SGD
    assert report["privacy_configuration"]["sampling_spec"]["top_level"] == "b_min_sep"
    assert report["privacy_configuration"]["sampling_spec"]["bands"] == 2
    assert np.isfinite(json.loads((out / "private" / "evaluation.json").read_text())["metrics"]["dp"]["crps"])
    assert report["epsilon_curve"] == {"steps": [9], "epsilon": [report["epsilon"]]}  # one whole-run bound
    metrics = pd.read_csv(next((out / "private" / "logs").glob("version_*/metrics.csv")))
    logged = metrics["epsilon_monte_carlo_upper"].dropna()
    assert len(logged) == 9 and "epsilon" not in metrics  # never logged under the PLD accountant's name
    # the checkpoint records the noise kind and bands, never the noise band (whose rows would reproduce the noise)
    state = torch.load(out / "dp-model.ckpt", weights_only=False)
    ledger = state["dpts_privacy_ledger"]
    assert ledger["noise"] == "bandmf" and ledger["bands"] == 2 and ledger["steps"] == 9
    strategy_state = state["callbacks"]["DPForecastStrategy"]
    assert "seed" not in strategy_state and "generator_state" not in strategy_state
    assert not any(isinstance(v, (torch.Tensor, np.ndarray)) for v in strategy_state.values())


def test_fit_with_bands_reads_them_from_yaml(tiny_csv, tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text(f"data: {tiny_csv}\nbands: 1\nmonte_carlo_samples: 2.0e4\nnoise_multiplier: 2.0\n"
                      f"output_dir: {tmp_path / 'run'}\n")
    assert main(["fit", "--config", str(config), *_BASE[:-6], "--no-non-dp", "--no-private-plots", "--top-level",
                 "b_min_sep"]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["monte_carlo"]["bands"] == 1 and report["monte_carlo"]["coefficients"] == [1.0]
    assert report["bound"]["kind"] == "monte_carlo"


@pytest.mark.parametrize("extra,option,words", [
    ([], "--noise-multiplier", "is required with --bands"),
    # the protection this file checks: a run that the Monte Carlo accountant cannot verify is never trained
    (["--noise-multiplier", "0.3"], "--noise-multiplier", "spends epsilon="),
    (["--noise-multiplier", "2", "--epochs", "60"], "--noise-multiplier", "spends epsilon="),
    (["--noise-multiplier", "2", "--delta", "1e-4"], "--delta", "cannot be verified"),
    (["--noise-multiplier", "2", "--bottom-level", "poisson"], "--bottom-level", "with_replacement"),
    (["--noise-multiplier", "2", "--batch-size", "16"], "--batch-size", "N'/N <= 1/b"),
    (["--noise-multiplier", "2", "--bands", "0"], "--bands", "integer in [1, 1024]"),
])
def test_fit_with_bands_refuses_before_writing_anything(tiny_csv, tmp_path, capsys, extra, option, words):
    out = tmp_path / "run"
    argv = ["fit", "--data", str(tiny_csv), *_BASE, "--bands", "2", "--output-dir", str(out), *extra]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"dpts: error: {option}:" in err and words in err, err
    assert not out.exists()


def test_fit_with_bands_defaults_to_cyclic_poisson_accounted_exactly(tiny_csv, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["fit", "--data", str(tiny_csv), *_CYCLIC, "--bands", "2", "--seed", "3", "--output-dir", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "cyclic Poisson in 2 groups" in printed and "noise multiplier" in printed  # calibrated, no sigma given
    assert "delta=1e-07 is >= 1/N" not in printed
    report = json.loads((out / "report.json").read_text())
    assert report["composition_unit"] == "opportunity" and report["delta"] == 1e-7
    assert 0 < report["epsilon"] <= 8 and report["compositions"] == -(-report["steps"] // 2)
    spec = report["privacy_configuration"]["sampling_spec"]
    assert spec["top_level"] == "cyclic_poisson" and spec["bands"] == 2
    state = torch.load(out / "dp-model.ckpt", weights_only=False)
    assert state["dpts_privacy_ledger"]["noise"] == "bandmf" and state["dpts_privacy_ledger"]["bands"] == 2


@pytest.mark.parametrize("extra,option,words", [
    (["--batch-size", "16"], "--batch-size", "num_series/groups"),  # 16 x 2 > 24 series
    (["--top-level", "poisson"], "--top-level", "cyclic_poisson"),
    (["--context-noise", "0.5", "--value-bound", "1"], "--context-noise", "not proven for cyclic Poisson"),
])
def test_cyclic_bands_refuses_before_writing_anything(tiny_csv, tmp_path, capsys, extra, option, words):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data", str(tiny_csv), *_CYCLIC, "--bands", "2", "--output-dir", str(out), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"dpts: error: {option}:" in err and words in err, err
    assert not out.exists()


@pytest.mark.slow  # a whole fit; tests/test_console.py checks the warn-once in-process
def test_fit_warns_once_when_delta_is_at_least_one_over_n(tiny_csv, tmp_path):
    argv = ["fit", "--data", str(tiny_csv), *_CYCLIC, "--delta", "0.05", "--noise-multiplier", "3", "--epochs", "1",
            "--output-dir", str(tmp_path / "run")]
    with pytest.warns(DeltaWarning) as record:
        assert main(argv) == 0
    texts = [str(w.message) for w in record if issubclass(w.category, DeltaWarning)]
    assert len(texts) == 1 and "delta=0.05 is >= 1/N = 1/24" in texts[0], texts


def test_b_min_sep_without_bands_is_refused(tiny_csv, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--data", str(tiny_csv), *_BASE, "--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2 and "--top-level" in capsys.readouterr().err

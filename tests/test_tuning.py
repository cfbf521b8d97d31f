"""dpts tune / lightning_dpts.tuning (issue 40): the search's epsilon is the model's, and nothing beyond the theorem's
output is published."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.tuning import Candidate, DPScore, plan, tune


def _series(n: int = 12, length: int = 80) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    t = np.arange(length)
    return [(10 + 3 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 0.5, length)).astype(np.float32)
            for _ in range(n)]


CANDIDATES = [Candidate("combination", 36, 8, 1, 0.1, 0.01), Candidate("combination", 36, 8, 1, 1.0, 0.03),
              Candidate("seasonal_linear", 24, 8, 2, 0.1, 0.01)]


def test_plan_charges_the_search_not_one_run() -> None:
    """The attacker reads the report: its epsilon must cover the search. A report of one run's epsilon (what
    "train K, keep the best" would publish) fails the first assertion; publishing every candidate's composition is
    what the fixed-K procedure costs."""
    p = plan(_series(), freq="M", prediction_length=6, epsilon=2.0, delta=1e-6, candidates=CANDIDATES, mean_runs=4)
    d = p.describe()
    assert d["single_run_epsilon"] < d["epsilon"] <= 2.0
    assert d["epsilon"] >= 0.99 * 2.0  # calibrated to the budget
    assert d["fixed_runs_epsilon"] > d["single_run_epsilon"]
    assert d["K"] == 3 and len(d["candidates"]) == 3 and "runs" not in d
    assert "Papernot & Steinke" in d["procedure"]


def test_tune_end_to_end_ledger_and_private_run_count(tmp_path) -> None:
    import logging

    cands = [dataclasses.replace(c, epochs=1) for c in CANDIDATES]
    level = logging.getLogger("lightning.pytorch").level
    result = tune(_series(), freq="M", prediction_length=6, epsilon=2.0, delta=1e-6, candidates=cands,
                  mean_runs=1.5, seed=0, print_fn=None)
    from lightning_dpts.training.ledger import ledger_of

    assert logging.getLogger("lightning.pytorch").level == level  # silenced per run (it counts runs), restored
    ledger = ledger_of(result.module)
    assert ledger is not None and ledger.steps > 0
    assert ledger.budget == (2.0, 1e-6)
    assert ledger.selection["K"] == 3 and ledger.selection["epsilon"] <= 2.0
    result.write(tmp_path)
    public = json.loads((tmp_path / "tuning.json").read_text())
    assert not {"runs", "history"} & set(public)  # the number of runs and the other scores stay private
    assert public["selected"]["index"] == result.index
    assert public["prediction_length"] == 6  # the horizon the selected setting was trained and scored for
    private = json.loads((tmp_path / "private" / "tuning.json").read_text())
    assert private["runs"] >= 1 and len(private["history"]) == private["runs"]
    # the attacker continues training the released model under the same budget: one run's accountant would count
    # only this run's steps and drop the search, so the continuation is refused before any step
    import lightning as L

    from lightning_dpts.training import AccountantCallback, DPForecastStrategy
    from lightning_dpts.tuning import _datamodule

    strategy = DPForecastStrategy(noise_multiplier=ledger.noise_multiplier,
                                  max_grad_norm=result.candidate.max_grad_norm)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[strategy, AccountantCallback(epsilon=2.0, delta=1e-6)])
    steps = ledger.steps
    with pytest.raises(ConfigurationError, match="search"):
        trainer.fit(result.module, datamodule=_datamodule(_series(), result.candidate, "M", 6, 0))
    assert ledger_of(result.module).steps == steps


def test_dp_score_sensitivity() -> None:
    """One series moves the exact score by at most 2b/N (the clip), whatever its loss."""
    ref = [1.0] * 10
    s = DPScore(ref, clip=0.2, noise_multiplier=3.0)
    base = [1.0] * 10
    for extreme in (0.0, 1e-9, 1e9):
        moved = [extreme] + base[1:]
        assert abs(s.exact(moved) - s.exact(base)) <= s.sensitivity / 2 + 1e-12  # from ratio 0: b/N; -b to b: 2b/N
    assert s.release(base, noise=1.0) == pytest.approx(s.exact(base) + 3.0 * s.sensitivity)


def test_bad_input() -> None:
    with pytest.raises(ConfigurationError, match="candidates.model"):
        Candidate("deepar", 10, 8, 1, 0.1, 0.01)
    with pytest.raises(ConfigurationError, match="mean_runs"):
        plan(_series(), freq="M", prediction_length=6, epsilon=1.0, delta=1e-6, candidates=CANDIDATES, mean_runs=1)


@pytest.mark.parametrize("argv, option", [(["--mean-runs", "1"], "--mean-runs"), (["--eta", "-2"], "--eta"),
                                          (["--candidates", "/nonexistent.json"], "--candidates"),
                                          (["--score-share", "1.5"], "--score-share")])
def test_cli_refuses_before_work(argv, option, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["tune", *argv])
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


def test_cli_default_horizon_is_dpts_fits(capsys) -> None:
    """Without --prediction-length, dpts tune plans at dpts fit's default horizon (12), not at two seasons (24 for
    the bundled monthly data): the tuned setting is then the one a default dpts fit trains."""
    assert main(["tune", "--plan-only", "--epsilon", "4"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["prediction_length"] == 12
    assert main(["tune", "--plan-only", "--epsilon", "4", "--prediction-length", "6"]) == 0
    assert json.loads(capsys.readouterr().out)["prediction_length"] == 6


def test_cli_hides_known_third_party_notices(monkeypatch, capsys) -> None:
    """dpts tune runs inside the command's console settings like dpts fit: GluonTS' json notice (printed on every
    ``dpts tune`` before) is hidden, stdout stays one JSON object with --plan-only."""
    import warnings

    import lightning_dpts.tuning as tuning

    original = tuning.plan

    def noisy_plan(*args, **kwargs):
        warnings.warn("Using `json`-module for json-handling. Consider installing one of `orjson`, `ujson`",
                      UserWarning, stacklevel=1)
        return original(*args, **kwargs)

    monkeypatch.setattr(tuning, "plan", noisy_plan)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["tune", "--plan-only", "--epsilon", "4"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["prediction_length"] == 12
    assert "json" not in captured.err

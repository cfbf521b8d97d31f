"""AccountantCallback: epsilon in the loggers, exact stopping at the budget, per-epoch accounting, resume."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

from .conftest import MODEL_NAMES, FakeDataModule, make_module, trainer

DELTA = 1e-5
SIGMA = 2.0


def _epsilons(log_dir: str) -> list[tuple[int, float]]:
    rows = list(csv.DictReader(open(Path(log_dir) / "metrics.csv")))
    return [(int(r["step"]), float(r["epsilon"])) for r in rows if r.get("epsilon")]


def _budget_for(dm, steps: int) -> tuple[float, StructuredSubsamplingAccountant]:
    acc = StructuredSubsamplingAccountant(dm.sampling_spec, SIGMA)
    return acc.epsilon(steps, DELTA), acc


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_gluonts_model_trains_with_both_callbacks_and_stops_at_the_budget(name, tmp_path):
    module = make_module(name)
    dm = FakeDataModule(module, num_series=48, batch_size=8, with_val=(name == "patchtst"))
    budget, acc = _budget_for(dm, 7)
    assert acc.epsilon(8, DELTA) > budget
    accountant = AccountantCallback(budget, DELTA, max_overhead=0.05 if name == "deepar" else None)
    logger = CSVLogger(tmp_path, name="run")
    before = [p.detach().clone() for p in module.parameters()]
    t = trainer(max_epochs=100, logger=logger, callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant],
                limit_val_batches=1, val_check_interval=3)
    t.fit(module, datamodule=dm)
    assert t.global_step == accountant.max_steps == accountant.steps == 7  # the largest count the budget allows
    eps = _epsilons(logger.log_dir)
    assert [s for s, _ in eps] == list(range(7))  # one value per optimizer step
    values = [e for _, e in eps]
    assert all(0 < e <= budget for e in values)
    assert values == sorted(values)
    exact = [acc.epsilon(step + 1, DELTA) for step in range(7)]  # epsilon spent after each step
    assert all(e >= x * (1 - 1e-9) for e, x in zip(values, exact, strict=True))  # sound: never below the spent one
    if accountant.max_overhead is None:  # every step waited for its table value: within grid_rtol of the spent one
        assert all(e <= x * (1 + accountant.grid_rtol) for e, x in zip(values, exact, strict=True))
    assert values[-1] == pytest.approx(budget)
    assert accountant.last_logged["epsilon"] == pytest.approx(values[-1])
    assert set(accountant.last_logged) == {"epsilon", "tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "mu_gdp"}  # issue 43
    assert "epsilon" not in t.progress_bar_metrics  # no progress bar: self.log (0.5-2 ms) is skipped
    report = accountant.report
    assert report.steps == 7 and report.epsilon == pytest.approx(budget) and report.delta == DELTA
    assert report.theorem == acc.theorem and report.kind == acc.kind
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))
    if name == "patchtst":
        assert "val_loss" in t.callback_metrics  # validation ran inside fit


def test_a_late_table_value_logs_the_budget_and_the_curve_never_falls(tmp_path, monkeypatch):
    """With ``max_overhead``, a step whose table value is not computed yet logs the budget's epsilon (a sound upper
    bound); the later steps, whose table values are smaller, keep logging it (a fresh-clone run on a loaded machine
    logged 1.85 and then 1.41 before this was kept)."""
    from lightning_dpts.training.accountant_callback import EpsilonTable

    lookup, late = EpsilonTable.lookup_point, {"calls": 0}

    def first_two_late(self, count, wait=False):  # the table's thread behind the first two steps, never waited for
        late["calls"] += 1
        return None if late["calls"] <= 2 else lookup(self, count, wait=wait)

    monkeypatch.setattr(EpsilonTable, "lookup_point", first_two_late)
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    budget, acc = _budget_for(dm, 7)
    accountant = AccountantCallback(budget, DELTA, max_overhead=1e-12)
    logger = CSVLogger(tmp_path, name="run")
    t = trainer(max_epochs=100, logger=logger, callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    values = [e for _, e in _epsilons(logger.log_dir)]
    assert len(values) == 7 and values[0] == pytest.approx(budget)  # the late first step: the budget's epsilon
    assert acc.epsilon(3, DELTA) < budget * 0.99  # a later exact value would have been smaller
    assert values == [pytest.approx(budget)] * 7  # kept: sound, and never falling
    assert accountant.report.epsilon == pytest.approx(budget)


def test_logged_epsilon_is_an_upper_bound_within_grid_rtol_at_every_step(tmp_path):
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    budget, acc = _budget_for(dm, 40)
    accountant = AccountantCallback(budget, DELTA, max_overhead=None, grid_rtol=0.2)
    logger = CSVLogger(tmp_path, name="run")
    t = trainer(max_steps=30, logger=logger, callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert t.global_step == 30  # the user's max_steps is kept when it is below the budget's
    points = dict(accountant.grid_points)
    assert list(points)[:2] == [1, 2] and max(points) == 30  # the table ends at the Trainer's plan
    counts = sorted(points)
    # consecutive table values differ by <= 20% unless one step apart
    for a, b in zip(counts, counts[1:], strict=False):
        assert b == a + 1 or points[b] <= 1.2 * points[a]
    logged = _epsilons(logger.log_dir)
    assert [s for s, _ in logged] == list(range(30))
    for step, value in logged:
        exact = acc.epsilon(step + 1, DELTA)
        assert exact - 1e-12 <= value <= 1.2 * exact  # a sound upper bound within grid_rtol
        point = min(c for c in points if c >= step + 1)
        # the table's own grid may overstate epsilon at its counts by up to grid_rtol / 4 (privacy/curve.py)
        assert value == min(points[point], acc.epsilon(30, DELTA))  # the plan's last count is read exactly
        assert exact - 1e-12 <= acc.epsilon(point, DELTA) <= points[point] <= 1.05 * acc.epsilon(point, DELTA)
    assert accountant.report.epsilon == pytest.approx(acc.epsilon(30, DELTA))


def test_the_progress_bar_shows_the_last_epsilon(tmp_path):
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    budget, _ = _budget_for(dm, 40)
    accountant = AccountantCallback(budget, DELTA)
    t = trainer(max_steps=12, enable_progress_bar=True, callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert t.progress_bar_metrics["epsilon"] == pytest.approx(accountant.last_logged["epsilon"])  # the last step's
    assert float(t.callback_metrics["epsilon"]) == pytest.approx(accountant.epsilon_upper_bound(12))


def test_shuffling_is_accounted_per_epoch(tmp_path):
    module = make_module("dlinear")
    dm = FakeDataModule(module, num_series=32, batch_size=8, top_level="shuffling")  # 4 steps per epoch
    assert dm.sampling_spec.steps_per_epoch == 4
    acc = StructuredSubsamplingAccountant(dm.sampling_spec, SIGMA)
    budget = acc.epsilon(12, DELTA)  # 3 epochs
    assert acc.unit == "epoch" and acc.epsilon(13, DELTA) > budget
    accountant = AccountantCallback(budget, DELTA, max_overhead=None)
    logger = CSVLogger(tmp_path, name="run")
    t = trainer(max_epochs=50, logger=logger, callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert t.global_step == 12 and accountant.report.compositions == 3 and accountant.report.unit == "epoch"
    for step, value in _epsilons(logger.log_dir):
        exact = acc.epsilon(4 * (step // 4 + 1), DELTA)  # a started epoch counts whole
        assert exact * (1 - 1e-12) <= value <= 1.01 * exact  # within grid_rtol (the last epoch: exactly)
        assert step < 8 or value == pytest.approx(exact, rel=1e-12)


def test_per_epoch_accounting_rejects_truncated_epochs():
    module = make_module("dlinear")
    dm = FakeDataModule(module, num_series=32, batch_size=8, top_level="shuffling")
    t = trainer(max_epochs=2, limit_train_batches=2,
                callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), AccountantCallback(50.0, DELTA)])
    with pytest.raises(ConfigurationError, match="limit_train_batches"):
        t.fit(module, datamodule=dm)


def _resume_run(tmp_path, ckpt=None):
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    budget, _ = _budget_for(dm, 11)
    strategy = DPForecastStrategy(SIGMA, 1.0, seed=0)
    accountant = AccountantCallback(budget, DELTA, max_overhead=None)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1,
                                  filename="{step}")
    t = trainer(max_epochs=100, enable_checkpointing=True, callbacks=[strategy, accountant, checkpoints])
    t.fit(module, datamodule=dm, ckpt_path=ckpt)
    return t, strategy, accountant


def test_resume_from_mid_run_checkpoint_continues_the_count(tmp_path):
    full, full_strategy, full_acc = _resume_run(tmp_path)
    assert full.global_step == full_acc.steps == 11
    mid = tmp_path / "ckpt" / "step=4.ckpt"
    assert mid.exists()
    state = torch.load(mid, weights_only=False)
    assert state["callbacks"]["AccountantCallback"]["steps"] == 4
    resumed, strategy, acc = _resume_run(tmp_path / "second", ckpt=str(mid))
    assert resumed.global_step == acc.steps == 11  # ends at the same total, not at 4 + 11
    assert strategy.steps == full_strategy.steps == 11
    # the ledger travels in the checkpoint; nothing that reproduces the noise does
    assert state["dpts_privacy_ledger"]["steps"] == 4
    assert "generator_state" not in state["callbacks"]["DPForecastStrategy"]
    # resuming from the final checkpoint takes no further step
    final = tmp_path / "ckpt" / "step=8.ckpt"
    again, _, acc2 = _resume_run(tmp_path / "third", ckpt=str(final))
    assert again.global_step == 11 and acc2.steps == 11


def test_resume_with_a_different_noise_multiplier_is_an_error(tmp_path):
    _resume_run(tmp_path)
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    t = trainer(max_epochs=100, callbacks=[DPForecastStrategy(SIGMA * 2, 1.0, seed=0), AccountantCallback(50.0, DELTA)])
    with pytest.raises(ConfigurationError, match="noise_multiplier"):
        t.fit(module, datamodule=dm, ckpt_path=str(tmp_path / "ckpt" / "step=4.ckpt"))


def test_budget_too_small_for_one_step_takes_no_step():
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    accountant = AccountantCallback(1e-6, DELTA, max_overhead=None)
    t = trainer(max_steps=5, callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant])
    with pytest.warns(UserWarning, match="no step is taken"):
        t.fit(module, datamodule=dm)
    assert t.global_step == 0 and accountant.max_steps == 0 and accountant.report.epsilon == 0.0


def test_accountant_needs_exactly_one_strategy_and_a_sampling_spec():
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    with pytest.raises(ConfigurationError, match="DPForecastStrategy"):
        trainer(max_steps=1, callbacks=[AccountantCallback(1.0, DELTA)]).fit(module, datamodule=dm)
    two = [DPForecastStrategy(SIGMA, 1.0, seed=0), DPForecastStrategy(SIGMA, 1.0, seed=1),
           AccountantCallback(1.0, DELTA)]
    with pytest.raises((ConfigurationError, RuntimeError), match="DPForecastStrategy"):
        trainer(max_steps=1, callbacks=two).fit(make_module("simple_feedforward"), datamodule=dm)
    with pytest.raises(ConfigurationError):
        AccountantCallback(1.0, 0.0)
    with pytest.raises(ConfigurationError):
        AccountantCallback(-1.0, DELTA)


def test_noise_multiplier_from_target_epsilon():
    from lightning_dpts.privacy import calibrate_noise_multiplier

    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)  # 6 steps per epoch
    strategy = DPForecastStrategy(max_grad_norm=1.0, target_epsilon=8.0, target_delta=DELTA, epochs=2, seed=0)
    accountant = AccountantCallback(8.0, DELTA, max_overhead=None)
    t = trainer(max_epochs=10, callbacks=[strategy, accountant])
    t.fit(module, datamodule=dm)
    sigma = calibrate_noise_multiplier(dm.sampling_spec, 8.0, DELTA, epochs=2)
    assert strategy.noise_multiplier == sigma
    assert accountant.accountant.noise_multiplier == sigma  # read from the strategy, not typed twice
    assert accountant.max_steps >= 12 and t.global_step == accountant.max_steps
    assert accountant.report.epsilon <= 8.0
    assert math.isfinite(strategy.noise_std)


def test_a_strategy_without_an_accountant_is_refused_before_the_first_step():
    """Before issue 38 it trained silently with no epsilon at all."""
    import lightning as L

    module = make_module("simple_feedforward")
    before = [p.detach().clone() for p in module.parameters()]
    strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    t = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, callbacks=[strategy])
    with pytest.raises(ConfigurationError, match="needs an AccountantCallback.*require_accountant=False"):
        t.fit(module, datamodule=FakeDataModule(module))
    assert strategy.steps == 0 and t.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_the_explicit_opt_out_trains_and_the_ledger_still_counts():
    import lightning as L

    from lightning_dpts.training.ledger import ledger_of

    module = make_module("simple_feedforward")
    strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0, seed=0, require_accountant=False)
    L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
              enable_model_summary=False, callbacks=[strategy]).fit(module, datamodule=FakeDataModule(module))
    assert strategy.steps == 3 and ledger_of(module).steps == 3
    # a continuation of that ledger still needs an accountant (the opt-out does not lift it)
    again = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0, seed=0, require_accountant=False)
    with pytest.raises(ConfigurationError, match="already holds 3 noisy steps"):
        L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[again]).fit(
            module, datamodule=FakeDataModule(module))
    with pytest.raises(ConfigurationError, match="require_accountant"):
        DPForecastStrategy(noise_multiplier=1.0, require_accountant="no")

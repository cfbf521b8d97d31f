"""Issue 24, items 3-5, played as the attacker: buffers, checkpoint forms and a reused AccountantCallback.

* A layer that keeps ``max(|x|)`` of the training inputs as a buffer (used only in eval) would release a
  noise-free statistic of the private data in every checkpoint: it is refused before any checkpoint exists.
* Weights-only checkpoints (``ModelCheckpoint(save_weights_only=True)``, ``trainer.save_checkpoint(path,
  weights_only=True)``) and ``torch.save(module.state_dict())`` carry the privacy ledger: a continuation from
  them counts every noisy step (on the code before this issue, epsilon restarted at 0).
* An ``AccountantCallback`` reused in a second Trainer accounts the second fit correctly (it died with
  ``ZeroDivisionError`` after one step).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy, ledger_of, read_ledger

from .conftest import LinearModule, SpecDataModule, trainer
from .test_guarantee import BUDGET_8, DELTA, DIM, LAMBDA, SIGMA, SPEC

ACCOUNTANT = StructuredSubsamplingAccountant(SPEC, SIGMA)


def _batches(value: float = 1.0) -> list[dict[str, torch.Tensor]]:
    return [{"x": torch.full((LAMBDA, DIM), value)} for _ in range(SPEC.steps_per_epoch)]


def _fit(module: L.LightningModule, *, checkpoint: ModelCheckpoint | None = None, max_steps: int = -1,
         accountant: AccountantCallback | None = None, value: float = 1.0) -> tuple[L.Trainer, DPForecastStrategy,
                                                                                    AccountantCallback]:
    """One DP fit of ``module`` with a new Trainer and a new strategy (and a new accountant unless given)."""
    strategy = DPForecastStrategy(SIGMA, 1.0)
    acc = accountant or AccountantCallback(BUDGET_8, DELTA, max_overhead=None)
    callbacks: list[Callback] = [strategy, acc] + ([checkpoint] if checkpoint is not None else [])
    t = trainer(max_epochs=100, max_steps=max_steps, enable_checkpointing=checkpoint is not None,
                callbacks=callbacks)
    t.fit(module, datamodule=SpecDataModule(SPEC, _batches(value)))
    return t, strategy, acc


# ------------------------------------------------------------------------------------------------------------
# Item 3: buffers that change during a DP fit
# ------------------------------------------------------------------------------------------------------------
class _MaxAbs(torch.nn.Module):
    """Keeps max(|x|) of the training inputs in a buffer; eval divides by it (the attack of issue 24, item 3)."""

    def __init__(self, write: str) -> None:
        super().__init__()
        self.write = write
        self.register_buffer("max_abs", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            seen = torch.maximum(self.max_abs, x.detach().abs().max())
            if self.write == "assign":
                self.max_abs = seen
            elif self.write == "in_place":
                self.max_abs.copy_(seen)
            else:  # through .data: no version-counter bump
                self.max_abs.data.copy_(seen)
            return x
        return x / self.max_abs.clamp_min(1.0)


class _Leaky(LinearModule):
    def __init__(self, write: str = "assign") -> None:
        super().__init__(DIM, lr=1.0)
        self.scale = _MaxAbs(write)

    def training_step(self, batch, batch_idx):
        return self.lin(self.scale(batch["x"])).mean()


@pytest.mark.parametrize("write", ["assign", "in_place", "data"])
def test_a_buffer_computed_from_the_training_windows_is_refused_before_any_checkpoint(tmp_path, write):
    module = _Leaky(write)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    with pytest.raises(ConfigurationError) as info:
        _fit(module, checkpoint=checkpoint, max_steps=4, value=1001.0)
    assert info.value.parameter == "model"
    assert "'scale.max_abs' (_MaxAbs)" in str(info.value) and "released raw" in str(info.value)
    assert not list(tmp_path.glob("*.ckpt"))  # nothing was written, not even the first step's checkpoint
    # the module keeps the raw value in memory, so it stays refused: no state_dict, no checkpoint, no new fit
    assert float(module.scale.max_abs) == 1001.0
    with pytest.raises(ConfigurationError, match="scale.max_abs"):
        module.state_dict()
    with pytest.raises(ConfigurationError, match="scale.max_abs"):
        torch.save(module.state_dict(), tmp_path / "weights.pt")
    assert not (tmp_path / "weights.pt").exists()
    with pytest.raises(ConfigurationError, match="scale.max_abs"):
        _fit(module, max_steps=1)


def test_a_buffer_changed_at_epoch_end_is_refused_before_modelcheckpoint_saves(tmp_path):
    class _EpochStat(LinearModule):
        """Stores the last batch's mean in a buffer at the end of every epoch (after the last step's check)."""

        def __init__(self) -> None:
            super().__init__(DIM, lr=1.0)
            self.register_buffer("last_mean", torch.zeros(()))

        def training_step(self, batch, batch_idx):
            # a Python float: the state guard sees tensors only (a tensor attribute is refused at the next step)
            self._last = float(batch["x"].mean())
            return self.lin(batch["x"]).mean()

        def on_train_epoch_end(self) -> None:
            self.last_mean.fill_(self._last)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_on_train_epoch_end=True, filename="{epoch}")
    with pytest.raises(ConfigurationError, match="'last_mean'"):
        _fit(_EpochStat(), checkpoint=checkpoint, value=3.0)
    assert not list(tmp_path.glob("*.ckpt"))


def test_a_buffer_changed_by_validation_on_private_windows_is_refused_before_modelcheckpoint_saves(tmp_path):
    class _ValStat(LinearModule):
        """Records max |x| of the validation windows (eval mode) in a buffer."""

        def __init__(self) -> None:
            super().__init__(DIM, lr=1.0)
            self.register_buffer("val_max", torch.zeros(()))

        def validation_step(self, batch, batch_idx):
            self.val_max.copy_(torch.maximum(self.val_max, batch["x"].abs().max()))

    class _WithVal(SpecDataModule):
        def val_dataloader(self):
            return torch.utils.data.DataLoader([{"x": torch.full((LAMBDA, DIM), 7.0)}], batch_size=None)

    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="{step}")  # saves at on_validation_end
    t = trainer(max_epochs=100, val_check_interval=2, enable_checkpointing=True,
                callbacks=[DPForecastStrategy(SIGMA, 1.0), AccountantCallback(BUDGET_8, DELTA), checkpoint])
    with pytest.raises(ConfigurationError, match="'val_max'"):
        t.fit(_ValStat(), datamodule=_WithVal(SPEC, _batches()))
    assert t.global_step == 2 and not list(tmp_path.glob("*.ckpt"))


class _Constant(LinearModule):
    """Buffers that do not change during the fit: a constant, and one rewritten in place with the same value."""

    def __init__(self) -> None:
        super().__init__(DIM, lr=1.0)
        self.register_buffer("offset", torch.full((DIM,), 0.5))
        self.register_buffer("scale", torch.ones(()))
        self.register_buffer("missing", torch.tensor([float("nan"), 1.0]))

    def training_step(self, batch, batch_idx):
        self.scale.fill_(1.0)  # an in-place write (version bump) of the same value
        return self.lin((batch["x"] - self.offset) * self.scale).mean()


def test_buffers_that_stay_constant_are_allowed(tmp_path):
    module = _Constant()
    module.offset.fill_(0.25)  # set before the fit: allowed
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    t, strategy, _ = _fit(module, checkpoint=checkpoint, max_steps=3)
    assert t.global_step == 3 and len(list(tmp_path.glob("*.ckpt"))) == 3
    module.offset.fill_(0.0)  # after the fit the buffers are the user's again
    assert "offset" in module.state_dict()


# ------------------------------------------------------------------------------------------------------------
# Item 4: the ledger travels with the weights in every checkpoint form
# ------------------------------------------------------------------------------------------------------------
def _continued(first: L.Trainer, second: L.Trainer, strategy: DPForecastStrategy, acc: AccountantCallback,
               module: L.LightningModule) -> None:
    """Every noisy step of both fits is counted and the reported epsilon is that of the total."""
    total = first.global_step + second.global_step
    assert second.global_step > 0 and total == 8  # the budget allows 8 steps in all, not 8 more
    assert strategy.ledger.steps == total and ledger_of(module).steps == total and acc.report.steps == total
    assert acc.report.epsilon == pytest.approx(ACCOUNTANT.epsilon(total, DELTA), rel=1e-9)


def test_modelcheckpoint_save_weights_only_carries_the_ledger(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}",
                                 save_weights_only=True)
    first, *_ = _fit(LinearModule(DIM, lr=1.0), checkpoint=checkpoint, max_steps=5)
    path = tmp_path / "step=5.ckpt"
    assert "callbacks" not in torch.load(path, weights_only=False)  # Lightning's weights-only form
    assert read_ledger(path).steps == 5
    loaded = LinearModule.load_from_checkpoint(path, dim=DIM, lr=1.0)
    second, strategy, acc = _fit(loaded)  # new Trainer, new callbacks
    _continued(first, second, strategy, acc, loaded)


def test_trainer_save_checkpoint_weights_only_carries_the_ledger(tmp_path):
    module = LinearModule(DIM, lr=1.0)
    first, *_ = _fit(module, max_steps=5)
    first.save_checkpoint(tmp_path / "w.ckpt", weights_only=True)
    loaded = LinearModule.load_from_checkpoint(tmp_path / "w.ckpt", dim=DIM, lr=1.0)
    assert ledger_of(loaded).steps == 5
    second, strategy, acc = _fit(loaded)
    _continued(first, second, strategy, acc, loaded)


def test_a_saved_state_dict_carries_the_ledger_and_still_loads_strictly_without_lightning_dpts(tmp_path):
    module = LinearModule(DIM, lr=1.0)
    first, *_ = _fit(module, max_steps=5)
    torch.save(module.state_dict(), tmp_path / "weights.pt")
    state = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert set(state) == {"lin.weight"}  # metadata, not a key: torch's own strict loading accepts it
    torch.nn.Module.load_state_dict(LinearModule(DIM), state, strict=True)
    fresh = LinearModule(DIM, lr=1.0)
    fresh.load_state_dict(state)
    second, strategy, acc = _fit(fresh)
    _continued(first, second, strategy, acc, fresh)


class _RestoreEarlier(Callback):
    """Keeps the weights after step 2 and loads them back after step 5 (a 'restore earlier weights' callback)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            self.saved = pl_module.state_dict()
        if trainer.global_step == 5:
            pl_module.load_state_dict(self.saved)


def test_weights_loaded_back_during_a_fit_do_not_lower_the_count(tmp_path):
    module = LinearModule(DIM, lr=1.0)
    strategy = DPForecastStrategy(SIGMA, 1.0)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    t = trainer(max_steps=7, enable_checkpointing=True,
                callbacks=[strategy, _RestoreEarlier(), AccountantCallback(BUDGET_8, DELTA), checkpoint])
    t.fit(module, datamodule=SpecDataModule(SPEC, _batches()))
    assert t.global_step == 7 and strategy.ledger.steps == 7 and ledger_of(module) is strategy.ledger
    assert read_ledger(tmp_path / "step=7.ckpt").steps == 7
    assert read_ledger(tmp_path / "step=6.ckpt").steps == 6  # the step after the restore: not 3
    # outside a fit, loaded weights bring their own ledger
    module.load_state_dict(torch.load(tmp_path / "step=3.ckpt", weights_only=False)["state_dict"])
    assert ledger_of(module).steps == 3


# ------------------------------------------------------------------------------------------------------------
# Item 5: an AccountantCallback reused in a second Trainer
# ------------------------------------------------------------------------------------------------------------
def test_an_accountant_reused_in_a_second_trainer_accounts_the_continuation():
    module = LinearModule(DIM, lr=1.0)
    acc = AccountantCallback(BUDGET_8, DELTA)  # default max_overhead: the grid spacing uses timings of the fit
    first, *_ = _fit(module, max_steps=3, accountant=acc)
    assert acc.report.steps == 3
    second, strategy, _ = _fit(module, accountant=acc)  # the same callback object, a new Trainer and strategy
    _continued(first, second, strategy, acc, module)
    # and reused for another model: its own ledger, from zero
    other = LinearModule(DIM, lr=1.0)
    third, strategy, _ = _fit(other, accountant=acc)
    assert third.global_step == 8 and strategy.ledger.steps == 8 and acc.report.steps == 8
    assert acc.report.epsilon == pytest.approx(BUDGET_8)


def test_a_strategy_reused_in_a_second_trainer_forgets_the_previous_budget_cap():
    strategy, acc = DPForecastStrategy(SIGMA, 1.0), AccountantCallback(BUDGET_8, DELTA)
    module = LinearModule(DIM, lr=1.0)
    for max_steps in (3, -1):  # the same strategy and accountant objects in two Trainers: 3 + 5 steps
        t = trainer(max_epochs=100, max_steps=max_steps, callbacks=[strategy, acc])
        t.fit(module, datamodule=SpecDataModule(SPEC, _batches()))
    assert t.global_step == 5 and strategy.ledger.steps == acc.report.steps == 8
    # then without an accountant on a fresh model: no cap left over from the accounted fit (it raised
    # PrivacyBudgetExhausted at step 9)
    t = trainer(max_steps=12, callbacks=[strategy])
    t.fit(LinearModule(DIM, lr=1.0), datamodule=SpecDataModule(SPEC, _batches()))
    assert t.global_step == 12 and strategy.ledger.steps == 12

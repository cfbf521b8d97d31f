"""The guarantee holds in practice (issue 9, items 1-6): tests that play the attacker.

The attacker knows the code, the configuration and every file a run writes. The model here is
:class:`LinearModule` on all-zero inputs with SGD at learning rate 1: every per-window gradient is 0, so each
optimizer step moves the weights by exactly ``-noise / Lambda`` and the noise of every step can be read off the
weights. Each test would pass on a strategy that stores its generator state or seed, replays noise on resume,
counts steps per callback instead of per model, or lets accumulation, non-finite gradients, window-mixing
models or empty batches through.
"""

from __future__ import annotations

import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, GradientAccumulationScheduler, ModelCheckpoint

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.randomness import SEEDED_NOTICE
from lightning_dpts.training import (
    AccountantCallback,
    DPForecastStrategy,
    NonFiniteGradientError,
    PrivacyLedger,
    read_ledger,
)

from .conftest import LinearModule, SpecDataModule, trainer

DIM, LAMBDA, SIGMA, DELTA = 16, 8, 1.0, 1e-5
SPEC = SamplingSpec(num_series=64, min_length=40, context_length=4, prediction_length=4, batch_size=LAMBDA)
BUDGET_8 = StructuredSubsamplingAccountant(SPEC, SIGMA).epsilon(8, DELTA)  # allows exactly 8 steps
BUDGET_4 = StructuredSubsamplingAccountant(SPEC, SIGMA).epsilon(4, DELTA)


def _zeros(n: int = LAMBDA) -> dict[str, torch.Tensor]:
    return {"x": torch.zeros(n, DIM)}


class _Weights(Callback):
    """Records the weight vector after every training batch (a function of the noisy weights only)."""

    dp_post_processing = True

    def __init__(self) -> None:
        self.after: list[torch.Tensor] = []

    def on_train_start(self, trainer, pl_module):
        self.after = [pl_module.lin.weight.detach().clone().flatten()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.after.append(pl_module.lin.weight.detach().clone().flatten())

    def noises(self) -> list[torch.Tensor]:
        """The noise of each step: delta = -lr * noise / Lambda with lr = 1."""
        return [(a - b) * LAMBDA for a, b in zip(self.after[:-1], self.after[1:], strict=True)]


def _run(directory=None, *, ckpt=None, module=None, budget=BUDGET_8, accountant=True, max_steps=-1,
         batches=None, strategy=None, extra=()):
    module = module if module is not None else LinearModule(DIM, lr=1.0)
    dm = SpecDataModule(SPEC, batches or [_zeros() for _ in range(SPEC.steps_per_epoch)])
    weights = _Weights()
    strategy = strategy or DPForecastStrategy(SIGMA, 1.0)
    callbacks: list[Callback] = [strategy, weights, *extra]
    acc = AccountantCallback(budget, DELTA, max_overhead=None) if accountant else None
    if acc is not None:
        callbacks.append(acc)
    if directory is not None:
        callbacks.append(ModelCheckpoint(dirpath=directory, every_n_train_steps=1, save_top_k=-1, filename="{step}"))
    t = trainer(max_epochs=100, max_steps=max_steps, enable_checkpointing=directory is not None,
                callbacks=callbacks)
    t.fit(module, datamodule=dm, ckpt_path=ckpt)
    return t, module, strategy, acc, weights


def _byte_tensors(obj, found=None):
    found = [] if found is None else found
    if isinstance(obj, torch.Tensor) and obj.dtype == torch.uint8:
        found.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _byte_tensors(v, found)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _byte_tensors(v, found)
    return found


def test_no_checkpoint_reproduces_the_noise(tmp_path):
    """Attacker: regenerate any step's noise from a checkpoint's contents or from small seeds."""
    _, _, _, _, weights = _run(tmp_path / "a", max_steps=4)
    noises = weights.noises()
    assert len(noises) == 4 and all(n.abs().sum() > 0 for n in noises)
    checkpoint = torch.load(tmp_path / "a" / "step=1.ckpt", weights_only=False)
    state = checkpoint["callbacks"]["DPForecastStrategy"]
    assert set(state) == {"noise_multiplier", "max_grad_norm", "ledger", "seeded"}
    assert state["seeded"] is False and checkpoint["dpts_privacy_ledger"]["steps"] == 1
    candidates = [torch.Generator().manual_seed(s) for s in range(64)]
    for blob in _byte_tensors(checkpoint):  # a stored generator state, or a seed in its first bytes
        candidates.append(torch.Generator().set_state(blob.clone()))
        candidates.append(torch.Generator().manual_seed(int.from_bytes(bytes(blob[:8].tolist()), "little")))
    for generator in candidates:
        for _ in range(4):  # the first four draws of each candidate stream
            guess = torch.empty(DIM).normal_(0.0, SIGMA, generator=generator)
            for noise in noises:
                assert not torch.allclose(guess, noise, atol=1e-4), "noise regenerated from the checkpoint"


def test_two_default_runs_release_different_weights():
    a = _run(max_steps=2)[1].lin.weight
    b = _run(max_steps=2)[1].lin.weight
    assert not torch.allclose(a, b)


def test_resume_from_an_older_checkpoint_or_twice_does_not_replay_noise(tmp_path):
    _, _, _, _, original = _run(tmp_path / "a", max_steps=4)
    older = str(tmp_path / "a" / "step=2.ckpt")
    runs = [_run(tmp_path / name, ckpt=older, max_steps=4)[4] for name in ("b", "c")]
    for run in runs:
        (resumed_step_3, *_) = run.noises()
        # the noise used after the checkpoint is new: not the original run's step 3 (or any of its steps)
        for used in original.noises():
            assert not torch.allclose(resumed_step_3, used, atol=1e-4)
    assert not torch.allclose(runs[0].noises()[0], runs[1].noises()[0], atol=1e-4)
    # and the ledger of each resumed run continues the checkpoint's count
    assert read_ledger(tmp_path / "b" / "step=4.ckpt").steps == 4


def test_a_gradient_accumulation_scheduler_is_refused_at_run_time():
    with pytest.raises(ConfigurationError) as info:
        _run(accountant=False, extra=[GradientAccumulationScheduler({0: 2})], max_steps=4)
    assert info.value.parameter == "accumulate_grad_batches"


def test_resuming_without_an_accountant_is_refused(tmp_path):
    _run(tmp_path / "a", max_steps=3)
    with pytest.raises(ConfigurationError) as info:
        _run(ckpt=str(tmp_path / "a" / "step=3.ckpt"), accountant=False, max_steps=6)
    assert info.value.parameter == "callbacks" and "3 noisy steps" in str(info.value)


def test_load_from_checkpoint_with_a_new_trainer_and_new_callbacks_continues_the_ledger(tmp_path):
    _run(tmp_path / "a", max_steps=5)
    path = tmp_path / "a" / "step=5.ckpt"
    loaded = LinearModule.load_from_checkpoint(path, dim=DIM, lr=1.0)
    t, module, strategy, acc, _ = _run(module=loaded)  # fresh Trainer, strategy and accountant; budget 8 steps
    assert t.global_step == 3 and acc.report.steps == 8  # 5 earlier steps + 3: epsilon did not restart at 0
    assert strategy.ledger.steps == 8 and module.dpts_privacy_ledger.steps == 8
    assert acc.report.epsilon == pytest.approx(BUDGET_8)
    # a budget already spent by the loaded weights: no step is taken
    spent = LinearModule.load_from_checkpoint(path, dim=DIM, lr=1.0)
    t, _, strategy, acc, _ = _run(module=spent, budget=BUDGET_4)
    assert t.global_step == 0 and strategy.ledger.steps == 5 and acc.report.steps == 5


def test_a_second_trainer_on_the_same_model_continues_the_ledger():
    module = LinearModule(DIM, lr=1.0)
    _run(module=module, max_steps=3)
    t, _, strategy, acc, _ = _run(module=module)  # new Trainer, new callbacks, same weights
    assert t.global_step == 5 and strategy.ledger.steps == 8 and acc.report.steps == 8
    # a model without an accountant in its second fit is refused (its ledger is not empty)
    with pytest.raises(ConfigurationError):
        _run(module=module, accountant=False)


def test_an_empty_batch_takes_the_noise_only_step():
    batches = [_zeros(), _zeros(0), _zeros(0), _zeros()]
    t, module, strategy, acc, weights = _run(batches=batches + [_zeros()] * (SPEC.steps_per_epoch - 4), max_steps=4)
    assert t.global_step == 4 and strategy.ledger.steps == 4 and acc.report.steps == 4
    for noise in weights.noises():  # the weights moved by noise at every step, the empty ones included
        assert noise.abs().min() > 0


def test_an_empty_structured_poisson_batch_steps_with_a_gluonts_model():
    from lightning_dpts.data import StructuredSubsamplingDataModule

    from .conftest import make_module

    module = make_module("simple_feedforward")
    series = [torch.arange(60.0).numpy() + 100 * n for n in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(series, batch_size=1, bottom_level="poisson", model=module,
                                             test_windows=0, seed=5)
    # one series per step, each of its start positions with rate 1/T: P(empty) ~ 1/e per step
    sizes = [dm.train_batch(0, s)["past_target"].shape[0] for s in range(dm.steps_per_epoch)]
    assert 0 in sizes
    strategy = DPForecastStrategy(SIGMA, 1.0)
    t = trainer(max_epochs=1, callbacks=[strategy])
    t.fit(module, datamodule=dm)
    assert t.global_step == dm.steps_per_epoch == strategy.ledger.steps


def test_a_non_finite_window_gradient_names_its_series():
    from lightning_dpts.data import StructuredSubsamplingDataModule

    class Plain(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 4)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.lin(batch["past_target"]), batch["future_target"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    import numpy as np

    series = [np.arange(40.0) + n for n in range(4)]
    series[2][:] = 1e20
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(series, context_length=8, prediction_length=4, batch_size=4,
                                             top_level="iteration", test_windows=0, seed=0)
    bad = dm.item_ids[2]
    assert np.isfinite(np.float32(1e20))  # inside the float32 range: accepted at load, but its gradient overflows
    with pytest.raises(NonFiniteGradientError, match=f"series '{bad}'"):
        trainer(max_steps=1, callbacks=[DPForecastStrategy(SIGMA, 1.0, check_independence=False)]).fit(
            Plain(), datamodule=dm
        )


class _Mixing(LinearModule):
    """Subtracts the batch mean in forward: one window moves every other window's gradient (trap 8)."""

    def training_step(self, batch, batch_idx):
        x = batch["x"]
        return self.lin(x - x.mean(0)).mean()


def test_a_forward_that_mixes_windows_is_refused_at_the_first_step():
    with pytest.raises(ConfigurationError, match="mixes the windows") as info:
        _run(module=_Mixing(DIM), accountant=False, max_steps=2,
             strategy=DPForecastStrategy(SIGMA, 1.0, per_window="fast"))
    assert info.value.parameter == "model"
    # by default (per_window="auto") the probe's finding switches the fit to isolated per-window gradients
    strategy = DPForecastStrategy(SIGMA, 1.0)
    with pytest.warns(UserWarning, match="mixes the windows"):
        t, *_ = _run(module=_Mixing(DIM), accountant=False, max_steps=2, strategy=strategy)
    assert t.global_step == 2 and strategy.isolated
    # the check can be turned off for a model verified otherwise
    t, *_ = _run(module=_Mixing(DIM), accountant=False, max_steps=2,
                 strategy=DPForecastStrategy(SIGMA, 1.0, check_independence=False))
    assert t.global_step == 2


def test_a_seeded_run_says_so_and_stores_no_seed(tmp_path):
    strategy = DPForecastStrategy(SIGMA, 1.0, seed=12345)
    with pytest.warns(UserWarning, match="explicit seed"):
        _run(tmp_path / "a", strategy=strategy, max_steps=1)
    checkpoint = torch.load(tmp_path / "a" / "step=1.ckpt", weights_only=False)
    state = checkpoint["callbacks"]["DPForecastStrategy"]
    assert state["seeded"] is True and state["seeded_notice"] == SEEDED_NOTICE
    assert checkpoint["dpts_privacy_ledger"]["seeded"] is True
    assert "12345" not in repr(checkpoint)


def test_a_seeded_run_is_reproducible_and_secure_mode_is_not():
    a = _run(max_steps=2, strategy=DPForecastStrategy(SIGMA, 1.0, seed=3))[1].lin.weight
    b = _run(max_steps=2, strategy=DPForecastStrategy(SIGMA, 1.0, seed=3))[1].lin.weight
    torch.testing.assert_close(a, b)
    s1 = _run(max_steps=2, strategy=DPForecastStrategy(SIGMA, 1.0, secure_mode=True))[1].lin.weight
    s2 = _run(max_steps=2, strategy=DPForecastStrategy(SIGMA, 1.0, secure_mode=True))[1].lin.weight
    assert not torch.allclose(s1, s2)
    with pytest.raises(ConfigurationError) as info:
        DPForecastStrategy(SIGMA, 1.0, seed=1, secure_mode=True)
    assert info.value.parameter == "secure_mode"


def test_the_ledger_round_trips_through_plain_types():
    ledger = PrivacyLedger(steps=3, epochs=1, noise_multiplier=1.5, max_grad_norm=1.0, sampling_spec=repr(SPEC),
                           budget=(1.0, 1e-5), seeded=True)
    assert PrivacyLedger.from_dict(ledger.to_dict()) == ledger
    assert ledger.accounted_steps(SPEC) == 3


def test_checkpoints_of_older_versions_keep_their_step_count_and_lose_their_generator_state():
    old = {"noise_multiplier": SIGMA, "max_grad_norm": 1.0, "steps": 4,
           "generator_state": torch.Generator().manual_seed(0).get_state()}
    strategy = DPForecastStrategy(SIGMA, 1.0)
    strategy.load_state_dict(old)
    module = LinearModule(DIM, lr=1.0)
    t = trainer(max_epochs=100, callbacks=[strategy, AccountantCallback(BUDGET_8, DELTA, max_overhead=None)])
    t.fit(module, datamodule=SpecDataModule(SPEC, [_zeros() for _ in range(SPEC.steps_per_epoch)]))
    assert t.global_step == 4 and strategy.ledger.steps == 8  # the 4 old steps count; only 4 more fit the budget
    assert read_ledger({"callbacks": {"DPForecastStrategy": old}}).steps == 4


def test_weights_copied_by_hand_carry_their_ledger_and_attach_ledger_restores_a_dropped_one(tmp_path):
    from lightning_dpts.training import attach_ledger, ledger_of

    _run(tmp_path / "a", max_steps=6)
    path = tmp_path / "a" / "step=6.ckpt"
    module = LinearModule(DIM, lr=1.0)
    module.load_state_dict(torch.load(path, weights_only=False)["state_dict"])  # by hand: the ledger comes along
    assert ledger_of(module).steps == 6
    t, _, strategy, _, _ = _run(module=module)
    assert t.global_step == 2 and strategy.ledger.steps == 8
    # a state dict rebuilt key by key drops the ledger (it is metadata): nothing attached ...
    rebuilt = LinearModule(DIM, lr=1.0)
    rebuilt.load_state_dict(dict(torch.load(path, weights_only=False)["state_dict"].items()))
    assert ledger_of(rebuilt) is None
    attach_ledger(rebuilt, path)  # ... until the ledger is attached
    t, _, strategy, _, _ = _run(module=rebuilt)
    assert t.global_step == 2 and strategy.ledger.steps == 8


class _TwoLayers(L.LightningModule):
    """``b`` is frozen at the fit's start; a callback may unfreeze it (or freeze ``a.bias``) mid-fit."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))
        self.b.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        return ((self.b(torch.tanh(self.a(batch["x"]))).squeeze(-1) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)  # every parameter, frozen ones included


class _Toggle(Callback):
    """At the second step, after DPForecastStrategy's own batch-start hook: unfreeze ``b`` or freeze ``a.bias``."""

    def __init__(self, action: str) -> None:
        self.action = action

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if batch_idx == 1:
            (pl_module.b if self.action == "unfreeze" else pl_module.a.bias).requires_grad_(self.action == "unfreeze")


@pytest.mark.parametrize("action", ["unfreeze", "freeze"])
def test_a_parameter_unfrozen_or_frozen_mid_fit_is_refused_before_any_update(action):
    """Attacker: a layer unfrozen mid-fit (a fine-tuning callback) would get its plain gradient - no per-window
    bound, no noise - and SGD over all parameters would apply it, so its released weights would move by the
    raw gradient of one batch. The step must be refused before the optimizer touches it; the frozen layer's
    weights stay bit for bit those of the start. Freezing a hooked layer mid-fit is refused too (it would keep
    receiving noisy updates)."""
    g = torch.Generator().manual_seed(0)
    batches = [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, generator=g)} for _ in range(3)]
    spec = SamplingSpec(num_series=8, min_length=20, context_length=3, prediction_length=1, batch_size=4)
    module = _TwoLayers()
    frozen = [p.detach().clone() for p in module.b.parameters()]
    strategy = DPForecastStrategy(1.0, 1.0, seed=0, check_independence=False)
    with pytest.raises(ConfigurationError, match="requires_grad") as info:
        trainer(max_steps=3, callbacks=[strategy, _Toggle(action)]).fit(
            module, datamodule=SpecDataModule(spec, batches)
        )
    assert ("became trainable" in str(info.value)) == (action == "unfreeze")
    assert strategy.ledger.steps == 1  # the second step was refused before its update
    for before, p in zip(frozen, module.b.parameters(), strict=True):
        assert torch.equal(before, p.detach())


def test_lightning_base_finetuning_unfreezing_is_refused():
    from lightning.pytorch.callbacks import BaseFinetuning

    class _Unfreeze(BaseFinetuning):
        def freeze_before_training(self, pl_module):
            self.freeze(pl_module.b)

        def finetune_function(self, pl_module, current_epoch, optimizer):
            if current_epoch == 1:
                self.unfreeze_and_add_param_group(pl_module.b, optimizer)

    class _Module(_TwoLayers):
        def configure_optimizers(self):
            return torch.optim.SGD(self.a.parameters(), lr=0.5)

    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, generator=g)} for _ in range(2)]
    spec = SamplingSpec(num_series=8, min_length=20, context_length=3, prediction_length=1, batch_size=4)
    module = _Module()
    frozen = [p.detach().clone() for p in module.b.parameters()]
    with pytest.raises(ConfigurationError, match="became trainable"):
        trainer(max_epochs=3, callbacks=[DPForecastStrategy(1.0, 1.0, seed=0, check_independence=False),
                                         _Unfreeze()]).fit(module, datamodule=SpecDataModule(spec, batches))
    for before, p in zip(frozen, module.b.parameters(), strict=True):
        assert torch.equal(before, p.detach())

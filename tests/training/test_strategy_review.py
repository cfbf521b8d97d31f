"""Adversarial review of DPForecastStrategy's trainability check and background noise draw (issue 15 follow-up).

The attacker knows the code, the configuration and every file a run writes; the careful Lightning user uses
Lightning's own tools (the tuner, ``setup`` hooks, ``BaseFinetuning``, ``on_train_batch_start`` returning -1,
several fits). Each test names what it would catch.
"""

from __future__ import annotations

import threading

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import BaseFinetuning, BatchSizeFinder, Callback

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec
from lightning_dpts.randomness import GaussianNoise
from lightning_dpts.training import AccountantCallback, DPForecastStrategy, attach_ledger
from lightning_dpts.training import noisy_step as strategy_module

from .conftest import SpecDataModule, trainer

SPEC = SamplingSpec(num_series=8, min_length=20, context_length=3, prediction_length=1, batch_size=4)
A_NUMEL = 3 * 4 + 4  # parameters of layer ``a``
B_NUMEL = 4 + 4 + 4 + 1  # LayerNorm(4) and Linear(4, 1) of ``b``


def _batches(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(4, 3, generator=g), "y": torch.randn(4, generator=g)} for _ in range(n)]


class _TwoLayers(L.LightningModule):
    def __init__(self, freeze_b: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(3, 4)
        self.b = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))
        self.lr = 0.5
        if freeze_b:
            self.b.requires_grad_(False)

    def training_step(self, batch, batch_idx):
        return ((self.b(torch.tanh(self.a(batch["x"]))).squeeze(-1) - batch["y"]) ** 2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)  # every parameter, frozen ones included


@pytest.fixture
def draws(monkeypatch):
    """Sizes of the noise vectors handed out (one per noisy step)."""
    sizes: list[int] = []
    sample = GaussianNoise.sample
    monkeypatch.setattr(GaussianNoise, "sample", lambda self, n, *a: sizes.append(n) or sample(self, n, *a))
    return sizes


def _strategy(**kwargs) -> DPForecastStrategy:
    return DPForecastStrategy(1.0, 1.0, seed=0, check_independence=False, **kwargs)


# --------------------------------------------------------------------------------------------------------------
# Finding 1 (Security): Lightning's tuner trains on the private data with every other callback removed
# --------------------------------------------------------------------------------------------------------------
def test_the_lr_finder_is_refused_before_it_trains_on_private_data(draws):
    """``Tuner.lr_find`` replaces ``trainer.callbacks`` by its own ``_LRCallback`` for its trial steps: the strategy's
    hooks do not run, so those steps take plain (unclipped, un-noised, unaccounted) gradients of the private
    batches, the suggested learning rate is chosen from their noiseless losses, and its checkpoint restore then
    rewinds the ledger. Without the refusal this test sees lr_find complete, weights trained with no noise draw."""
    from lightning.pytorch.tuner import Tuner

    module = _TwoLayers()
    before = [p.detach().clone() for p in module.parameters()]
    moved: list[bool] = []

    class _Spy(Callback):  # would see the trial steps if the tuner kept the callbacks
        def on_train_batch_end(self, trainer, pl_module, *args):
            moved.append(True)

    t = trainer(max_steps=3, callbacks=[_strategy(), _Spy()])
    with pytest.raises(ConfigurationError, match="LearningRateFinder") as info:
        Tuner(t).lr_find(module, datamodule=SpecDataModule(SPEC, _batches(30)), num_training=8,
                         early_stop_threshold=None)
    assert info.value.parameter == "callbacks"
    assert draws == [] and moved == []
    for b, p in zip(before, module.parameters(), strict=True):
        assert torch.equal(b, p.detach())


def test_the_batch_size_finder_is_refused():
    """``BatchSizeFinder`` also runs its trial steps with ``trainer.callbacks = []`` (no clipping, no noise)."""
    dm = SpecDataModule(SPEC, _batches(2))
    dm.batch_size = 4  # the attribute the finder scales
    t = trainer(max_steps=2, callbacks=[_strategy(), BatchSizeFinder(max_trials=1)])
    with pytest.raises(ConfigurationError, match="BatchSizeFinder"):
        t.fit(_TwoLayers(), datamodule=dm)


# --------------------------------------------------------------------------------------------------------------
# Finding 2 (false positive): layers frozen by the module's own setup hook or by a later callback's setup
# --------------------------------------------------------------------------------------------------------------
class _FreezeInSetup(_TwoLayers):
    def setup(self, stage):  # runs after every callback's setup (the strategy took the trainable set there)
        self.b.requires_grad_(False)


class _UnfreezeInSetup(_TwoLayers):
    def __init__(self) -> None:
        super().__init__(freeze_b=True)

    def setup(self, stage):
        self.b.requires_grad_(True)


class _FreezeB(BaseFinetuning):
    def freeze_before_training(self, pl_module):
        self.freeze(pl_module.b)

    def finetune_function(self, pl_module, current_epoch, optimizer):
        pass  # never unfreezes


@pytest.mark.parametrize("case", ["module_setup", "base_finetuning_after_the_strategy"])
def test_a_layer_frozen_before_the_first_step_trains_privately_and_stays_frozen(case, draws):
    """Freezing in ``LightningModule.setup`` (or with a ``BaseFinetuning`` listed after the strategy) happens after
    the strategy's own ``setup``; it used to be refused at the first step as 'frozen during DP training'. The set is
    now taken again at ``on_fit_start``: the fit runs, the noise covers exactly the trainable layer ``a``, and the
    frozen layer's weights stay bit for bit."""
    module = _FreezeInSetup() if case == "module_setup" else _TwoLayers()
    callbacks = [_strategy()] + ([] if case == "module_setup" else [_FreezeB()])
    frozen = [p.detach().clone() for p in module.b.parameters()]
    trained = [p.detach().clone() for p in module.a.parameters()]
    t = trainer(max_steps=2, callbacks=callbacks)
    t.fit(module, datamodule=SpecDataModule(SPEC, _batches(2)))
    assert draws == [A_NUMEL, A_NUMEL]
    for b, p in zip(frozen, module.b.parameters(), strict=True):
        assert torch.equal(b, p.detach())
    assert all(not torch.equal(b, p.detach()) for b, p in zip(trained, module.a.parameters(), strict=True))


def test_a_layer_unfrozen_by_the_module_setup_gets_noise_and_clipping(draws):
    """The other direction: unfrozen in ``setup`` (before any step), the layer is hooked and noised (it would have
    been refused, or - without the check - trained with its plain gradient)."""
    trainer(max_steps=2, callbacks=[_strategy()]).fit(_UnfreezeInSetup(), datamodule=SpecDataModule(SPEC, _batches(2)))
    assert draws == [A_NUMEL + B_NUMEL] * 2


def test_unfreezing_after_on_fit_start_is_still_refused():
    """The refresh is only before the first step: a callback's ``on_train_start`` unfreezing ``b`` is refused."""

    class _Late(Callback):
        def on_train_start(self, trainer, pl_module):
            pl_module.b.requires_grad_(True)

    module = _TwoLayers(freeze_b=True)
    frozen = [p.detach().clone() for p in module.b.parameters()]
    with pytest.raises(ConfigurationError, match="became trainable"):
        trainer(max_steps=2, callbacks=[_strategy(), _Late()]).fit(module, datamodule=SpecDataModule(SPEC, _batches(2)))
    for b, p in zip(frozen, module.b.parameters(), strict=True):
        assert torch.equal(b, p.detach())


# --------------------------------------------------------------------------------------------------------------
# Finding 3 (false positive): on_train_batch_start returning -1 (Lightning's "skip the rest of the epoch")
# --------------------------------------------------------------------------------------------------------------
class _SkipRest(_TwoLayers):
    def on_train_batch_start(self, batch, batch_idx):
        return -1 if batch_idx == 1 else None


def test_skipping_the_rest_of_an_epoch_is_not_taken_for_accumulation(draws):
    """The skipped batch never reaches ``training_step``; the next epoch's first batch used to be refused as
    gradient accumulation. Exactly one noise draw per step taken, each step accounted once."""
    strategy = _strategy()
    t = trainer(max_epochs=3, callbacks=[strategy])
    t.fit(_SkipRest(), datamodule=SpecDataModule(SPEC, _batches(3)))
    assert t.global_step == 3 and strategy.ledger.steps == 3 and strategy.ledger.epochs == 3
    assert draws == [A_NUMEL + B_NUMEL] * 3


def test_accumulation_across_the_skip_detection_is_still_refused():
    """A second batch whose predecessor did run ``training_step`` without a step is still accumulation."""
    from lightning.pytorch.callbacks import GradientAccumulationScheduler

    with pytest.raises(ConfigurationError, match="accumulate_grad_batches"):
        trainer(max_steps=2, callbacks=[_strategy(), GradientAccumulationScheduler({0: 2})]).fit(
            _TwoLayers(), datamodule=SpecDataModule(SPEC, _batches(4))
        )


# --------------------------------------------------------------------------------------------------------------
# Legitimate setups the check must not refuse
# --------------------------------------------------------------------------------------------------------------
def test_freezing_between_two_fits_is_accepted_and_the_frozen_layer_stays(draws):
    """The error message's own advice: change requires_grad between fits. The first fit leaves noisy ``.grad`` on
    ``b``; Lightning's ``zero_grad`` at the start of the second fit clears it, so the check does not misread it."""
    module = _TwoLayers()
    dm = SpecDataModule(SPEC, _batches(2))
    trainer(max_steps=2, callbacks=[_strategy()]).fit(module, datamodule=dm)
    module.b.requires_grad_(False)
    frozen = [p.detach().clone() for p in module.b.parameters()]
    strategy = _strategy()
    trainer(max_steps=2, callbacks=[strategy, AccountantCallback(epsilon=12.0, delta=1e-5)]).fit(module, datamodule=dm)
    assert strategy.ledger.steps == 4
    assert draws == [A_NUMEL + B_NUMEL] * 2 + [A_NUMEL] * 2
    for b, p in zip(frozen, module.b.parameters(), strict=True):
        assert torch.equal(b, p.detach())


# --------------------------------------------------------------------------------------------------------------
# Noise drawn in the background: the same mechanism, draw for draw
# --------------------------------------------------------------------------------------------------------------
class _Recorder(Callback):
    dp_post_processing = True  # the noisy gradients: functions of the released iterates

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append(torch.cat([p.grad.reshape(-1) for p in pl_module.parameters()]).clone())


def _run_with(spare_core: bool, monkeypatch) -> tuple[list[torch.Tensor], list[tuple]]:
    monkeypatch.setattr(strategy_module, "_spare_core", lambda: spare_core)
    monkeypatch.setattr(strategy_module, "BACKGROUND_MIN_NUMEL", 0)  # this small model's draw too
    prepared: list[tuple] = []
    prepare = GaussianNoise.prepare
    monkeypatch.setattr(GaussianNoise, "prepare", lambda self, *a: prepared.append(a) or prepare(self, *a))
    batches = _batches(4)
    batches[1] = {"x": torch.zeros(0, 3), "y": torch.zeros(0)}  # a Poisson batch without windows: noise only
    rec = _Recorder()
    module = _TwoLayers()
    t = trainer(max_steps=4, callbacks=[_strategy(), rec], limit_val_batches=1, val_check_interval=2)

    class _Val(SpecDataModule):
        def val_dataloader(self):
            return self.train_dataloader()

    module.validation_step = lambda batch, batch_idx: None  # a validation loop between the steps
    t.fit(module, datamodule=_Val(SPEC, batches))
    return rec.grads, list(prepared)  # a copy: a later run wraps this run's patched prepare again


def test_background_noise_is_the_inline_noise_draw_for_draw(monkeypatch):
    """Background draws (spare core) and draws at the optimizer step give bit-identical noisy gradients over steps
    with windows, a noise-only empty batch and a validation loop in between: each prepared draw is handed out
    exactly once, to its own step (a draw handed out twice, skipped, or re-drawn would shift the sequence). Also no
    two steps share a noise value (float32 normals collide by chance with probability ~1e-5 here)."""
    inline, none_prepared = _run_with(False, monkeypatch)
    background, prepared = _run_with(True, monkeypatch)
    assert none_prepared == [] and len(prepared) == 4
    assert all(n == A_NUMEL + B_NUMEL and std == 1.0 / 4 for n, std, _ in prepared)  # noise_std / Lambda
    assert len(inline) == len(background) == 4
    for a, b in zip(inline, background, strict=True):
        assert torch.equal(a, b)
    empty_step_noise = background[1]  # the noise-only step: its gradient is the draw / Lambda itself
    for i in (0, 2, 3):
        assert not bool(torch.isin(empty_step_noise, background[i]).any())


def test_a_small_noise_vector_is_drawn_in_place_even_with_a_spare_core(monkeypatch):
    """Work, counted (issue 44): below ``BACKGROUND_MIN_NUMEL`` coordinates the draw is made at the optimizer step, in
    the training thread (no thread hand-off per step), still once per step."""
    monkeypatch.setattr(strategy_module, "_spare_core", lambda: True)
    assert A_NUMEL + B_NUMEL < strategy_module.BACKGROUND_MIN_NUMEL
    draws = []
    draw = GaussianNoise._draw
    monkeypatch.setattr(GaussianNoise, "_draw",
                        lambda self, *a: draws.append(threading.current_thread()) or draw(self, *a))
    rec = _Recorder()
    t = trainer(max_steps=4, callbacks=[_strategy(), rec])
    t.fit(_TwoLayers(), datamodule=SpecDataModule(SPEC, _batches(4)))
    assert draws == [threading.main_thread()] * 4  # one draw per step, each in the training thread
    assert len(rec.grads) == 4  # (bit-identical to background draws: test_background_noise_is_the_inline_...)


# --------------------------------------------------------------------------------------------------------------
# Finding 4 (Security, pre-existing): layers created after the strategy's setup escaped the model checks
# --------------------------------------------------------------------------------------------------------------
class _LateBatchNorm(_TwoLayers):
    """Builds a BatchNorm without parameters in ``configure_model`` (Lightning's hook for deferred layers), after the
    strategy's setup refused BatchNorm: its running statistics are updated from the private windows, without noise,
    and written into every checkpoint."""

    def configure_model(self):
        if not hasattr(self, "bn"):
            self.bn = torch.nn.BatchNorm1d(4, affine=False)

    def training_step(self, batch, batch_idx):
        return ((self.b(self.bn(torch.tanh(self.a(batch["x"])))).squeeze(-1) - batch["y"]) ** 2).mean()


def test_a_layer_created_after_setup_is_refused_before_any_step(draws):
    module = _LateBatchNorm()
    with pytest.raises(ConfigurationError, match="bn .BatchNorm1d.") as info:
        trainer(max_steps=2, callbacks=[_strategy()]).fit(module, datamodule=SpecDataModule(SPEC, _batches(2)))
    assert info.value.parameter == "model" and draws == []
    assert torch.equal(module.bn.running_mean, torch.zeros(4))  # no private statistic was recorded


# --------------------------------------------------------------------------------------------------------------
# Hooks that run around the strategy's checks (passing: the checks hold)
# --------------------------------------------------------------------------------------------------------------
class _GradOnFrozen(_TwoLayers):
    """``on_after_backward`` writes a data-dependent gradient into the frozen layer (e.g. a hand-made update)."""

    def __init__(self) -> None:
        super().__init__(freeze_b=True)

    def on_after_backward(self):
        self.b[1].weight.grad = self.a.weight.detach()[:, 0].reshape(1, 4) * 100.0


class _UnfreezeAfterTheCheck(Callback):
    """Listed after the strategy: unfreezes ``b`` in ``on_before_optimizer_step`` of the first step, after the
    strategy's last check of that step."""

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == 0:
            pl_module.b.requires_grad_(True)


@pytest.mark.parametrize("case", ["grad_written_on_frozen", "unfrozen_after_the_check"])
def test_no_update_reaches_a_frozen_layer_through_hooks_around_the_checks(case):
    """A frozen layer's gradient written in ``on_after_backward`` is refused before the noisy step; a layer unfrozen
    after the last check has no ``.grad`` that step (so SGD skips it) and is refused at the next step's start. Either
    way its weights stay bit for bit (removing both checks lets SGD apply the written gradient, or the plain one)."""
    module = _GradOnFrozen() if case == "grad_written_on_frozen" else _TwoLayers(freeze_b=True)
    callbacks = [_strategy()] + ([_UnfreezeAfterTheCheck()] if case == "unfrozen_after_the_check" else [])
    frozen = [p.detach().clone() for p in module.b.parameters()]
    strategy = callbacks[0]
    with pytest.raises(ConfigurationError, match="requires_grad"):
        trainer(max_steps=3, callbacks=callbacks).fit(module, datamodule=SpecDataModule(SPEC, _batches(3)))
    assert strategy.ledger.steps == (0 if case == "grad_written_on_frozen" else 1)
    for b, p in zip(frozen, module.b.parameters(), strict=True):
        assert torch.equal(b, p.detach())


def test_bandmf_background_noise_is_the_inline_noise_draw_for_draw(monkeypatch):
    """BandMF (``noise="bandmf"``): its ``prepare`` starts the next z of its Gaussian at unit std; the band arithmetic
    stays in ``sample``. Seeded runs with and without the background draw give bit-identical noisy gradients, so
    no z is handed out twice, skipped, or drawn at another scale (the band would then carry it into later rows)."""
    from lightning_dpts.data import StructuredSubsamplingDataModule

    from .conftest import make_module

    def run(spare_core: bool) -> list[torch.Tensor]:
        monkeypatch.setattr(strategy_module, "_spare_core", lambda: spare_core)
        monkeypatch.setattr(strategy_module, "BACKGROUND_MIN_NUMEL", 0)
        module = make_module("dlinear")
        dm = StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1,
                                             top_level="b_min_sep", bands=2)
        rec = _Recorder()
        trainer(max_steps=4, callbacks=[DPForecastStrategy(2.0, 0.5, seed=0, noise="bandmf", bands=2), rec]).fit(
            module, datamodule=dm
        )
        return rec.grads

    inline, background = run(False), run(True)
    assert len(inline) == len(background) == 4
    for a, b in zip(inline, background, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name, frozen_part", [("deepar", "rnn"), ("deepar", "embedder"), ("patchtst", "encoder")])
def test_gluonts_models_with_frozen_parts_fit_twice_with_a_summary_and_from_a_checkpoint(name, frozen_part, tmp_path):
    """No false positive on legitimate setups: a GluonTS model whose LSTM (swapped for DPFastLSTM), embedding or
    attention encoder (swapped attention) is frozen before the fit, with Lightning's ModelSummary, fitted, then
    its checkpoint loaded into a new module and fitted again (the ledger continues). The frozen part stays
    bit for bit."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from .conftest import FakeDataModule, make_module

    module = make_module(name)
    getattr(module.model, frozen_part).requires_grad_(False)
    frozen = {k: v.detach().clone() for k, v in getattr(module.model, frozen_part).state_dict().items()}
    dm = FakeDataModule(module)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer(max_steps=2, enable_model_summary=True, enable_checkpointing=True, callbacks=[_strategy(), ckpt]).fit(
        module, datamodule=dm
    )
    again = make_module(name, seed=1)  # GluonTS modules keep no hyperparameters for load_from_checkpoint
    again.load_state_dict(torch.load(ckpt.last_model_path, weights_only=False)["state_dict"])
    attach_ledger(again, ckpt.last_model_path)  # what load_from_checkpoint does (test_guarantee covers that path)
    getattr(again.model, frozen_part).requires_grad_(False)
    strategy = _strategy()
    trainer(max_steps=2, callbacks=[strategy, AccountantCallback(epsilon=12.0, delta=1e-5)]).fit(again, datamodule=dm)
    assert strategy.ledger.steps == 4
    for k, v in getattr(again.model, frozen_part).state_dict().items():
        assert torch.equal(frozen[k], v), k


def test_a_metric_built_in_setup_is_not_refused(draws):
    """torchmetrics metrics (modules without parameters or buffers) are often built in ``setup``: not a layer."""
    import torchmetrics

    class _WithMetric(_TwoLayers):
        def setup(self, stage):
            self.train_mae = torchmetrics.MeanAbsoluteError()
            self.act = torch.nn.Tanh()

    trainer(max_steps=2, callbacks=[_strategy()]).fit(_WithMetric(), datamodule=SpecDataModule(SPEC, _batches(2)))
    assert draws == [A_NUMEL + B_NUMEL] * 2


class _FreezeAllInSetup(_TwoLayers):
    def setup(self, stage):  # runs after the strategy's setup, which took a trainable set
        self.requires_grad_(False)


@pytest.mark.parametrize("module", [_TwoLayers, _FreezeAllInSetup], ids=["frozen-before-fit", "frozen-in-setup"])
def test_a_model_with_nothing_trainable_is_refused_before_any_step(module, draws):
    """Nothing trainable, whether frozen before the fit (the strategy's setup) or only by the module's own setup
    hook (taken again at on_fit_start): a ConfigurationError naming the model, no step, no noise drawn."""
    model = module()
    if module is _TwoLayers:
        model.requires_grad_(False)
    t = trainer(max_steps=2, callbacks=[_strategy()])
    with pytest.raises(ConfigurationError, match="has no trainable parameters") as info:
        t.fit(model, datamodule=SpecDataModule(SPEC, _batches(2)))
    assert info.value.parameter == "model"
    assert draws == [] and t.global_step == 0

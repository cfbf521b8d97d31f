"""DPForecastStrategy: a Lightning callback that turns ordinary training into DP-SGD (Algorithm 2).

Algorithm 2 (*Noisy Training Step*) of *Privacy Amplification by Structured Subsampling for Deep
Differentially Private Time Series Forecasting* (Schuchardt et al., ICML 2025): for every window y_i of the
batch, g_i = grad L(f(y_C,i), y_F,i); the update direction is

    g~ = ( sum_i g_i / max(1, ||g_i||_2 / C)  +  N(0, sigma^2 C^2 I) ) / Lambda

with Lambda the *expected* batch size (also for Poisson sampling). The callback obtains per-window norms and
the clipped sum from :class:`~lightning_dpts.training.engine.PerWindowClipper` (ghost norms for linear layers,
Opacus ``GradSampleModule`` hooks for every other layer), adds the noise once per optimizer step and writes
g~ into ``p.grad`` in ``on_before_optimizer_step``; the user's optimizer (from their ``configure_optimizers``)
then takes its step as usual. The clipping factor min(1, C / (||g_i|| + 1e-6)) is Opacus'.

Run-time guarantees (docs/privacy.md, rules 7 and 8), checked at every optimizer step, not only at setup:

* the noise is drawn through one :class:`~lightning_dpts.randomness.GaussianNoise` built from fresh
  operating-system entropy at the start of every fit (:meth:`DPForecastStrategy._make_noise`); nothing that
  reproduces it is stored, so a resume from any checkpoint draws new noise;
* exactly one sampled batch reaches each optimizer step (any gradient accumulation is an error);
* every per-window gradient is finite, else :class:`NonFiniteGradientError` names the window's series;
* window i's gradient depends on window i alone: by construction with ``per_window="isolated"``
  (:mod:`~lightning_dpts.training.isolated`); on the fast path, evidence from a probe on synthetic batches shaped
  like the real one (at the first step and at random later steps) and a per-step spot check of one window
  recomputed alone, both before the step's update (``per_window="auto"`` switches to isolated when the first
  probe finds a mix);
* a batch without windows (Poisson sampling) takes the noise-only step;
* every noisy step is counted once in the model's :class:`~lightning_dpts.training.ledger.PrivacyLedger`.
* no state of the model or of a callback changes during the fit (:class:`~lightning_dpts.training.state_guard.
  StateGuard`: buffers, metric states, callback state, tensor attributes; at every step, in every ``state_dict()``
  of any submodule and every checkpoint, so before anything is written, and at the end of training); callbacks that
  ``monitor`` a metric computed without noise (EarlyStopping on ``train_loss``) are refused before the first step.

On several processes (Lightning ``strategy="ddp"``, docs/distributed.md) the step is the same mechanism on one
global structured sample: every rank clips its share of the windows, the clipped sums are added over the ranks
by one ``all_reduce`` to which rank 0 alone adds the one Gaussian draw
(:func:`~lightning_dpts.distributed.all_reduce_noisy_sum`), every rank divides by the global Lambda and applies
the identical update (checked every step); DDP's own gradient averaging is switched off.

The class owns single-purpose parts, each an object with its own state (docs/architecture.md): a
:class:`~lightning_dpts.training.fit_context.FitContext` (the facts they share: parameters, hooks, Lambda, C,
ranks), :class:`~lightning_dpts.training.noisy_step.NoisyStep` (the per-step clip-and-noise and its noise draw),
:class:`~lightning_dpts.training.independence.WindowProbe` and :class:`~lightning_dpts.training.independence.
SpotCheck` (the fast path's evidence), :class:`~lightning_dpts.training.ledger_wiring.FitLedger` (the fit's privacy
ledger and the checkpoint state), :class:`~lightning_dpts.training.attachment.ModelAttachment` (the layer swaps,
hooks and wrapped ``training_step``, undone after the fit) and :class:`~lightning_dpts.training.attachment.
StepCounter` (one batch per step); :mod:`~lightning_dpts.training.guards` holds the run-time refusals. This module
holds the constructor and the Lightning hooks that call the parts in order.

Settings that would break the guarantee raise :class:`~lightning_dpts.errors.ConfigurationError`: Trainer
``gradient_clip_val``, gradient accumulation in any form (``accumulate_grad_batches != 1``, a
``GradientAccumulationScheduler``: checked at every step, exactly one sampled batch per optimizer step), more than
one optimizer, manual optimisation, several processes on anything but Lightning's DDP (and, on DDP, BandMF noise,
b-min-sep sampling, SyncBatchNorm, DDP comm hooks, static graphs), mixed precision, BatchNorm, trainable parameters
in the optimizer that the hooks do not cover, a parameter (un)frozen during the fit (checked before every noisy step;
changes before the first step, e.g. in the module's ``setup``, are taken at ``on_fit_start``), layers created after
the strategy's ``setup`` (``configure_model``), Lightning's ``LearningRateFinder`` and ``BatchSizeFinder`` (their
trial steps run without the strategy), a ``forward`` that mixes windows on the fast path (found by the probe or the
spot check after the fit's first step, or with ``per_window="fast"``), and continuing a model whose ledger is not
empty without an :class:`~lightning_dpts.training.AccountantCallback`.

``DPForecastStrategy.audit_observer`` is a test-facing seam for :mod:`lightning_dpts.audit` (not a constructor
option, and nothing a fit needs): a callable ``observer(module, strategy, step, noisy)`` called at every noisy step
after the noisy averaged gradient ``noisy`` (one tensor per trainable parameter, copies) is computed and before the
optimizer applies it, with the parameters still at their pre-step values. It sees what the DP analysis already
assumes public (every intermediate noisy gradient, docs/privacy.md "Hidden-state assumptions"), cannot change the
update, and draws nothing from the fit's randomness.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lightning_dpts.distributed import rank_and_world_size
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import NoiseSpec, noise_from_name
from lightning_dpts.randomness import Entropy
from lightning_dpts.training.attachment import ModelAttachment, StepCounter
from lightning_dpts.training.engine import NoiseSource, NonFiniteGradientError
from lightning_dpts.training.fit_context import FitContext
from lightning_dpts.training.guards import (
    check_accountant,
    check_distributed,
    check_monitors,
    check_noise_spec,
    check_optimizer,
    check_optimizer_params,
    check_schedulers,
    check_trainable,
    check_trainer,
    detach_ddp_averaging,
    say_where_logs_go,
    spec_or_none,
)
from lightning_dpts.training.independence import SpotCheck, WindowProbe
from lightning_dpts.training.ledger import LEDGER_KEY, PrivacyLedger
from lightning_dpts.training.ledger_wiring import FitLedger, PrivacyBudgetExhausted
from lightning_dpts.training.noisy_step import NoisyStep, clip_and_noise
from lightning_dpts.training.options import (
    calibrated_noise_multiplier,
    check_independence_options,
    check_noise,
    check_sigma_or_target,
    check_step_options,
    lambda_from_spec,
    positive,
)
from lightning_dpts.training.state_guard import StateGuard

__all__ = ["DPForecastStrategy", "NonFiniteGradientError", "PrivacyBudgetExhausted", "clip_and_noise"]


class DPForecastStrategy(Callback):
    """Differentially private training of an unchanged LightningModule (DP-SGD, Algorithm 2).

    Add it to ``Trainer(callbacks=[...])`` together with a datamodule that has a ``sampling_spec`` (e.g.
    :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`) and an
    :class:`~lightning_dpts.training.AccountantCallback` (required unless ``require_accountant=False``).

    At ``setup("fit")`` it swaps layers Opacus cannot handle (``nn.LSTM``/``GRU``/``RNN``,
    ``nn.MultiheadAttention``) for DP-compatible equivalents with the weights copied
    (:func:`~lightning_dpts.training.surgery.make_private_compatible`) and attaches per-window gradient hooks
    (:class:`~lightning_dpts.training.engine.PerWindowClipper`); at the end of fitting the original layers come
    back with the trained weights, so validation and prediction afterwards carry no DP overhead and checkpoints
    load into the unmodified model.

    Exactly one of ``noise_multiplier`` or the target triple (``target_epsilon``, ``target_delta``,
    ``epochs``) must be given. With the target, sigma is calibrated at setup with
    :func:`~lightning_dpts.privacy.calibrate_noise_multiplier` on ``trainer.datamodule.sampling_spec``.

    Settings that would break the guarantee raise :class:`~lightning_dpts.errors.ConfigurationError` (the list:
    :mod:`this module's <lightning_dpts.training.strategy>` documentation).

    Privacy ledger: every noisy step is counted in ``self.ledger`` (a
    :class:`~lightning_dpts.training.ledger.PrivacyLedger`), which is attached to the LightningModule
    (``module.dpts_privacy_ledger``) and written into every checkpoint; a fit continues the ledger of the
    checkpoint it resumes from, or the one attached to the module (a second Trainer, or weights loaded with
    ``load_from_checkpoint``). See :mod:`lightning_dpts.training.ledger`.

    Args:
        noise_multiplier: sigma > 0; the noise std on the summed clipped gradient is ``sigma * C``.
        max_grad_norm: C > 0, the l2 clipping bound of one window's gradient (all parameters jointly), in
            units of the loss gradient.
        target_epsilon: epsilon > 0 to calibrate sigma for (instead of ``noise_multiplier``).
        target_delta: delta in (0, 1) to calibrate sigma for.
        epochs: number of epochs (each ``spec.steps_per_epoch`` optimizer steps) to calibrate sigma for.
        seed: ``None`` (default): the noise comes from fresh, secret operating-system entropy drawn at the
            start of every fit (docs/privacy.md, rule 7). An integer >= 0 makes the noise a public function of it,
            for experiments and tests only: **anyone who knows the seed can subtract the noise**; the run then
            warns with :data:`~lightning_dpts.randomness.SEEDED_NOTICE` and the checkpoint metadata says
            ``"seeded": True`` (the seed itself is never written).
        secure_mode: draw the noise from a cryptographically secure generator that the OS seeds (OpenSSL's
            CTR-DRBG, else ``os.urandom``), in float64 rounded once: a floating-point mitigation equivalent to Opacus'
            (:func:`~lightning_dpts.randomness.secure_standard_normal`; about 3x the default draw, 1.0-1.2x the
            default DP fit: ``benchmarks/randomness.py``, ``benchmarks/dp_training.py``). Needs ``seed=None``.
        per_window: how each window's gradient g_i is computed (docs/privacy.md, rule 8; docs/training.md).
            ``"isolated"``: from the module's own ``training_step`` on a batch of that window alone
            (:mod:`~lightning_dpts.training.isolated`; vmapped, or one pass per window), so no ``forward`` can mix
            windows: sound by construction, slower. ``"fast"``: from one pass over the whole batch
            (:class:`~lightning_dpts.training.engine.PerWindowClipper`), which is window i's own gradient only if
            ``training_step`` keeps windows apart; checked by the probe and the spot check (evidence, not proof),
            and a detected mix is a :class:`~lightning_dpts.errors.ConfigurationError` before the step's update.
            ``"auto"`` (default): ``"fast"``, but a mix that the probe finds before the fit's first noisy step, or
            a probe that cannot run on the synthetic batch, switches the fit to ``"isolated"`` (a warning says so);
            a mix found later is an error as with ``"fast"``.
        check_independence: on the fast path, run the probe: on a synthetic batch shaped like the real one (its
            keys, missing values and observed masks, integer features that repeat between windows), change window 0
            and require every other window's per-window gradient to stay within c * eps * sqrt(#params) * (largest
            per-window gradient norm) of its value: on min(Lambda, 16) windows in float64 where the module runs in
            it, and at the first probe also on the real batch's size in the module's precision. It runs at the
            fit's first step and at one random step in each of [2, 4), [4, 8), [8, 16), ... (two forward/backward
            passes of at most 16 windows each time, at most 1 + log2 T times in T steps; docs/training.md).
            ``False`` skips it (only for a model you have verified yourself).
        spot_check: on the fast path, the probability (in [0, 1]; 0.1 by default, about 5% of a non-DP step
            measured, docs/training.md) that a step checks one window drawn at random (a non-private draw): its
            clipped gradient computed with that window alone must equal, within the float tolerance, the one the
            batched pass attributes to it; a larger gap is re-examined in float64 and the step refused before its
            update only if the mix is there too, else computed from each window alone (a warning; counted in
            ``spot_check_recomputed``; :meth:`~lightning_dpts.training.independence.SpotCheck._reexamine`).
            1.0 checks every step
            (0.4-0.7 of a non-DP step at Lambda = 64-256 for the GluonTS feed-forward models). Skipped, with a
            message, for a ``training_step`` whose result is random (dropout): two calls on one window then differ
            already. 0 switches it off.
        expected_batch_size: Lambda, only for datamodules without a ``sampling_spec``; otherwise Lambda is read
            from ``sampling_spec.batch_size`` and giving a different value is an error.
        loss_reduction: ``"mean"`` (default; GluonTS modules average their loss over the windows of a batch)
            or ``"sum"``: how the module's training loss combines the per-window losses. Per-window gradients
            are those of each window's own loss either way.
        scaler_default_scale: fixed scale for GluonTS ``MeanScaler(default_scale=None)`` on windows without
            observed values (see :mod:`~lightning_dpts.training.surgery`). > 0.
        data_dependent_schedulers: what to do with learning-rate schedulers that ``monitor`` a logged metric
            (e.g. GluonTS DeepAR's ``ReduceLROnPlateau`` on ``train_loss``): such a metric is computed on private
            data without noise, so adapting the learning rate to it leaks information the DP guarantee does not
            cover. ``"disable"`` (default) removes them for the run with a warning (the learning rate stays at
            the optimizer's value); ``"error"`` raises :class:`~lightning_dpts.errors.ConfigurationError`.
            Schedulers without ``monitor`` (fixed schedules) are data-independent and kept.
        noise: ``"gaussian"`` (default, DP-SGD: independent noise every step) or ``"bandmf"`` (BandMF, Dong &
            Ganesh 2026 Section 2.3: step i gets row i of C^{-1}Z for a b-banded Toeplitz C, one flat vector for
            all parameters). BandMF needs a datamodule with ``top_level="b_min_sep"`` and the same ``bands``, an
            explicit ``noise_multiplier``, and is accounted by AccountantCallback's Monte Carlo accountant; it
            keeps (b - 1) x (number of parameters) noise values in memory and cannot be resumed or continued.
        bands: b >= 1 for ``noise="bandmf"`` (default coefficients: the column-normalised banded square root,
            :func:`~lightning_dpts.training.correlated_noise.banded_sqrt_coefficients`).
        coefficients: (c_0, ..., c_{b-1}), the non-zero entries of C's first column (non-negative, c_0 > 0;
            e.g. from :func:`~lightning_dpts.training.correlated_noise.optimize_coefficients`); overrides the
            default for ``bands``.
        require_accountant: ``True`` (default): a fit without an
            :class:`~lightning_dpts.training.AccountantCallback` in the Trainer is refused at setup, before any step
            (a :class:`~lightning_dpts.errors.ConfigurationError` naming the fix). ``False``: for those who account
            the steps themselves from :attr:`ledger` (which counts every noisy step, travels with the weights and
            still refuses a continuation without an accountant); nothing then computes or enforces epsilon.
    """

    def __repr__(self) -> str:
        # Lightning's "invalid strategy" error for Trainer(strategy=DPForecastStrategy(...)) quotes this repr, the
        # only part of its message the class controls (it is a Callback, not a lightning Strategy): say where it goes
        return (f"DPForecastStrategy(noise_multiplier={self._noise_multiplier}, max_grad_norm={self.max_grad_norm}) "
                "[a Callback, not a Lightning strategy: pass it as Trainer(callbacks=[DPForecastStrategy(...), "
                "AccountantCallback(...)]), not strategy=]")

    def __init__(
        self,
        noise_multiplier: float | None = None,
        max_grad_norm: float = 1.0,
        *,
        target_epsilon: float | None = None,
        target_delta: float | None = None,
        epochs: int | None = None,
        seed: int | None = None,
        secure_mode: bool = False,
        check_independence: bool = True,
        per_window: str = "auto",
        spot_check: float = 0.1,
        expected_batch_size: int | None = None,
        loss_reduction: str = "mean",
        scaler_default_scale: float = 1.0,
        data_dependent_schedulers: str = "disable",
        noise: str = "gaussian",
        bands: int | None = None,
        coefficients: Sequence[float] | None = None,
        require_accountant: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(require_accountant, bool):
            raise ConfigurationError("require_accountant", require_accountant, "must be True or False")
        self.require_accountant = require_accountant
        self.coefficients: tuple[float, ...] | None = check_noise(noise, bands, coefficients)
        self.bands = 1 if self.coefficients is None else len(self.coefficients)
        #: the noise object (:mod:`lightning_dpts.privacy.mechanisms`): dispatch on its capabilities, not its name
        self.noise_spec: NoiseSpec = noise_from_name(noise, bands=self.bands)
        self.max_grad_norm = positive("max_grad_norm", max_grad_norm)
        self._noise_multiplier: float | None = check_sigma_or_target(noise_multiplier, target_epsilon, target_delta,
                                                                     epochs)
        self.target_epsilon, self.target_delta, self.epochs = target_epsilon, target_delta, epochs
        spot = check_independence_options(seed, secure_mode, check_independence, per_window, spot_check)
        self.scaler_default_scale = check_step_options(expected_batch_size, loss_reduction, scaler_default_scale,
                                                       data_dependent_schedulers)
        self._seed, self.secure_mode, self.check_independence = seed, secure_mode, check_independence
        self.per_window, self._given_batch_size, self.loss_reduction = per_window, expected_batch_size, loss_reduction
        self.data_dependent_schedulers = data_dependent_schedulers
        # the owned parts (docs/architecture.md): the facts they share, the step, the two checks, the ledger, the
        # changes to the module, the batch count
        self.context = FitContext(self.max_grad_norm, loss_reduction, per_window)
        self.noisy_step = NoisyStep(self.context, self.noise_spec, self.coefficients, secure_mode)
        self.probe = WindowProbe(self.context, self.noisy_step)
        self.spot = SpotCheck(self.context, self.noisy_step, spot)
        self.fit_ledger = FitLedger()
        self.attachment = ModelAttachment(self.context, self.noisy_step, self.scaler_default_scale)
        self.counter = StepCounter()
        self._begun = False
        self._ddp: Any = None  # the DistributedDataParallel wrapper on several processes
        self._buffer_guard: StateGuard | None = None  # the fit's state guard (state that changes is refused)
        #: the audit's seam (the module's documentation, "audit_observer"); ``None``: no observer
        self.audit_observer: Callable[[L.LightningModule, DPForecastStrategy, int, list[torch.Tensor]], None] | None
        self.audit_observer = None

    # ------------------------------------------------------------------------------------------------
    # what the parts hold, read through the strategy
    # ------------------------------------------------------------------------------------------------
    state_key = property(lambda self: "DPForecastStrategy")
    #: the layer swaps of this fit (``None`` outside a fit)
    surgery = property(lambda self: self.attachment.surgery)
    #: the model's privacy ledger (:class:`~lightning_dpts.training.ledger.PrivacyLedger`), every noisy step counted
    ledger = property(lambda self: self.fit_ledger.ledger)
    #: whether this fit computes each window's gradient alone (``per_window="isolated"``, or ``"auto"`` after the
    #: probe found a mix before the first step)
    isolated = property(lambda self: self.context.isolated)
    #: Lambda, read from the datamodule's sampling spec at setup
    expected_batch_size = property(lambda self: self.context.expected_batch_size)
    #: the fit's noise source (on rank 0), and whether its draws run in a background thread
    noise = property(lambda self: self.noisy_step.noise)
    background_noise = property(lambda self: self.noisy_step.background_noise)
    #: whether the isolated per-window gradients were computed by ``vmap`` (``None``: not computed yet)
    vectorised = property(lambda self: self.noisy_step.vectorised)
    #: probes run in this fit, and the wall time they took (seconds)
    probes = property(lambda self: self.probe.probes)
    probe_seconds = property(lambda self: self.probe.seconds)
    #: steps of this fit whose spot-check gap was round-off, recomputed with each window alone
    spot_check_recomputed = property(lambda self: self.spot.recomputed)
    #: the probability that a step is spot-checked
    spot_check = property(lambda self: self.spot.probability, lambda self, p: setattr(self.spot, "probability", p))

    #: the accounted-step cap an :class:`~lightning_dpts.training.AccountantCallback` sets for this fit
    step_cap = property(lambda self: self.fit_ledger.step_cap,
                        lambda self, cap: setattr(self.fit_ledger, "step_cap", cap))
    #: the noise's name, ``"gaussian"`` or ``"bandmf"`` (as given; ``noise_spec`` is the object)
    noise_kind = property(lambda self: self.noise_spec.name)
    #: ``True`` if the noise comes from an explicit seed (see :data:`~lightning_dpts.randomness.SEEDED_NOTICE`)
    seeded = property(lambda self: self._seed is not None)
    #: noisy optimizer steps taken by the model, over every fit (``self.ledger.steps``)
    steps = property(lambda self: self.ledger.steps)

    @property
    def noise_multiplier(self) -> float:
        """sigma, given or calibrated (available after ``setup`` when calibrated from a target)."""
        if self._noise_multiplier is None:
            raise RuntimeError("noise_multiplier is calibrated at Trainer setup; call trainer.fit first")
        return self._noise_multiplier

    @property
    def noise_std(self) -> float:
        """sigma * C, the std of the noise added to the summed clipped gradient."""
        return self.noise_multiplier * self.max_grad_norm

    def resolve(self, trainer: L.Trainer) -> float:
        """Read Lambda from the datamodule and calibrate sigma if needed (idempotent); returns sigma."""
        spec = spec_or_none(trainer)
        self.context.expected_batch_size = lambda_from_spec(spec, self._given_batch_size)
        check_noise_spec(spec, self.noise_spec)
        if self._noise_multiplier is None:
            self._noise_multiplier = calibrated_noise_multiplier(spec, self.target_epsilon, self.target_delta,
                                                                 self.epochs, self.noise_spec, self.coefficients)
        return self._noise_multiplier

    def begin(self, trainer: L.Trainer, pl_module: L.LightningModule) -> PrivacyLedger:
        """Start this fit's ledger and noise (idempotent per fit; AccountantCallback calls it too).

        The ledger continues the one of the checkpoint this fit resumed from, else the one attached to the
        module, else starts empty (:meth:`FitLedger.begin`); a fresh :class:`~lightning_dpts.randomness.Entropy` is
        drawn (no replay), and the step and the checks start anew.
        """
        if self._begun:
            return self.ledger
        sigma = self.resolve(trainer)
        ctx = self.context
        ledger, entropy = self.fit_ledger.begin(
            trainer, pl_module, sigma=sigma, max_grad_norm=self.max_grad_norm, noise_spec=self.noise_spec,
            bands=self.bands, seed=self._seed, rank=ctx.rank, world_size=ctx.world_size)
        # one noise source, on rank 0 only: the one Gaussian draw of every step (other ranks add none)
        self.noisy_step.noise = self._make_noise(entropy) if ctx.rank == 0 else None
        self.noisy_step.isolated_sums = None
        ctx.noise_std = self.noise_std
        ctx.isolated = self.per_window == "isolated"
        ctx.fit_steps, ctx.earlier_steps = 0, ledger.steps
        self.probe.begin(self.check_independence and not ctx.isolated)
        self.spot.begin()
        self.counter.begin()
        self._begun = True
        return ledger

    def _make_noise(self, entropy: Entropy) -> NoiseSource:
        """The fit's one noise source (:meth:`NoisyStep.make_noise`; the audit wraps this method)."""
        return self.noisy_step.make_noise(entropy, self.ledger.steps)

    def counts_after_next_step(self) -> tuple[int, int]:
        """(steps, epochs) the ledger counts once the next noisy step is taken: what a write-ahead copy of the
        ledger must cover before that step touches the data (``dpts fit``'s ``ledger.json``)."""
        return self.ledger.steps + 1, self.ledger.epochs + int(self.counter.new_epoch)

    def charge_restored(self, steps: int, epochs: int) -> None:
        """Count at least ``steps`` steps and ``epochs`` epochs in the restored checkpoint's ledger
        (:meth:`FitLedger.charge_restored`; ``dpts fit --resume``)."""
        self.fit_ledger.charge_restored(steps, epochs, self._begun)

    def state_dict(self) -> dict[str, Any]:
        """Sigma, C and the privacy ledger - never anything that reproduces noise (:meth:`FitLedger.state_dict`)."""
        return self.fit_ledger.state_dict(self._noise_multiplier, self.max_grad_norm, self.seeded)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the checkpoint's ledger; the noise of the resumed fit comes from fresh entropy (no replay)."""
        self.fit_ledger.load_state_dict(state_dict, self._noise_multiplier, self.max_grad_norm)
        self._begun = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
                           ) -> None:
        """Refuse a checkpoint holding state that changed during the fit (the state guard, exactly: callbacks' state
        too, which no state-dict hook sees), then write the ledger at the top level of the checkpoint (read by
        ``load_from_checkpoint``). Lightning builds the whole checkpoint dict before it writes the file."""
        if self._buffer_guard is not None:
            self._buffer_guard.check()
        checkpoint[LEDGER_KEY] = self.ledger.to_dict()

    # ------------------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_trainer(trainer)
        check_accountant(trainer, self.require_accountant)
        self.resolve(trainer)
        ctx = self.context
        ctx.rank, ctx.world_size = rank_and_world_size(trainer)
        say_where_logs_go(trainer)
        if ctx.world_size > 1:
            check_distributed(trainer, self.noise_spec, ctx.world_size)
        if self.attachment.surgery is not None:  # setup twice without teardown
            return
        self.fit_ledger.remember(pl_module)  # before the swaps: a swapped layer's replacement holds no ledger
        self.noisy_step.background_noise = None
        self.attachment.attach(pl_module)
        self._begun = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.spot.recomputed = 0
        check_optimizer(trainer, pl_module)
        self.attachment.refresh(pl_module)
        check_optimizer_params(trainer, self.context.hooked_ids)
        check_schedulers(trainer, self.data_dependent_schedulers)
        if self.context.world_size > 1:
            self._ddp = detach_ddp_averaging(trainer)
        released = check_monitors(trainer)  # stopping or checkpoint rules on noise-free metrics: refused here
        # after any restored checkpoint, before sanity validation
        self._buffer_guard = StateGuard.start(pl_module, trainer.callbacks, exempt=released)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.begin(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.counter.new_epoch = True  # the first noisy step of this epoch counts a new epoch (also a resumed one)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._begun:
            self.begin(trainer, pl_module)
        ctx, step = self.context, self.noisy_step
        if ctx.world_size > 1:  # keep DDP's own gradient averaging off (Lightning's no_sync restores the flag)
            self._ddp.require_backward_grad_sync = False
            self._ddp.require_forward_param_sync = False
        self.counter.batch_started(step.batch_used)
        step.batch_used, step.isolated_sums = False, None
        ctx.start_batch(batch)
        self.probe.due(pl_module, batch)
        self.spot.draw(batch)
        step.prepare_noise()
        ctx.hooks_for_mode()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        ctx = self.context
        assert ctx.expected_batch_size is not None and ctx.clipper is not None
        assert self.noise is not None or ctx.rank != 0
        self.counter.check_step()
        refused: ConfigurationError | None = None
        try:
            check_trainable(trainer, pl_module, ctx.hooked_ids)
            self.spot.due(pl_module)
            if self._buffer_guard is not None:
                self._buffer_guard.check_step()  # state changed since the last step: refused before this update
        except ConfigurationError as err:
            if ctx.world_size == 1:
                raise
            refused = err  # raised after the step's all-reduce, so that no other rank is left waiting in it
        after = self.fit_ledger.next_step(*self.counts_after_next_step(), spec_or_none(trainer))
        noisy = self.noisy_step.noisy_gradients(trainer, after.steps, refused)
        if self.audit_observer is not None:  # the audit's white-box view (copies: it cannot change the update)
            self.audit_observer(pl_module, self, after.steps, [g.detach().clone() for g in noisy])
        for p, g in zip(ctx.params, noisy, strict=True):
            p.grad = g
        ctx.clear()
        self.fit_ledger.count(after)
        ctx.fit_steps += 1
        self.counter.stepped()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._buffer_guard is not None:  # exact, also for writes that bypass version counters (buf.data) and
            self._buffer_guard.check()  # state written by the last step's on_train_batch_end

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.context.clipper is not None:
            self.context.clipper.disable()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.context.clipper is not None and trainer.training:
            self.context.clipper.enable()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._undo(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._undo(pl_module)

    def _undo(self, pl_module: L.LightningModule) -> None:
        """Remove the Opacus hooks and per-sample state, put the original layers back, and end the noise's background
        thread (idempotent; at train end and on an exception, so no thread of the fit outlives it)."""
        begun, ctx = self._begun, self.context
        ctx.clear()
        self.noisy_step.close()
        if self._buffer_guard is not None:  # stays attached (the module refuses state_dict) if a buffer changed
            self._buffer_guard.release(pl_module)
            self._buffer_guard = None
        self._begun = False
        ctx.batch = None
        self.attachment.detach(pl_module)
        if begun:  # the original layers hold the fit's ledger again
            self.fit_ledger.end(pl_module)
        self.noisy_step.forget_isolated()
        self.noisy_step.background_noise = None

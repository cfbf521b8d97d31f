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

The class composes single-purpose parts: :mod:`~lightning_dpts.training.guards` (the run-time refusals),
:mod:`~lightning_dpts.training.independence` with :mod:`~lightning_dpts.training.probe_batches` (the probe and the
spot check), :mod:`~lightning_dpts.training.noisy_step` (the per-step clip-and-noise and its noise draw) and
:mod:`~lightning_dpts.training.ledger_wiring` (the fit's privacy ledger and the checkpoint state); this module holds
the constructor, the Lightning hooks that call them in order, and the layer swaps' set-up and undo.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_dpts.distributed import rank_and_world_size
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import calibrate_noise_multiplier
from lightning_dpts.privacy.mechanisms import NoiseSpec, noise_from_name
from lightning_dpts.training.engine import NoiseSource, NonFiniteGradientError, PerWindowClipper
from lightning_dpts.training.guards import (
    check_distributed,
    check_layers_after_setup,
    check_monitors,
    check_noise_spec,
    check_optimizer,
    check_optimizer_params,
    check_schedulers,
    check_trainable,
    check_trainer,
    detach_ddp_averaging,
    has_accountant,
    say_where_logs_go,
    spec_or_none,
)
from lightning_dpts.training.independence import IndependenceChecks
from lightning_dpts.training.isolated import IsolatedGradients
from lightning_dpts.training.ledger import PrivacyLedger
from lightning_dpts.training.ledger_wiring import LedgerWiring
from lightning_dpts.training.noisy_step import NoisyStep, clip_and_noise
from lightning_dpts.training.options import (
    check_independence_options,
    check_noise,
    check_sigma_or_target,
    check_step_options,
    positive,
)
from lightning_dpts.training.probe_batches import copy_batch
from lightning_dpts.training.state_guard import StateGuard
from lightning_dpts.training.surgery import Surgery, make_private_compatible

__all__ = ["DPForecastStrategy", "NonFiniteGradientError", "PrivacyBudgetExhausted", "clip_and_noise"]


class PrivacyBudgetExhausted(RuntimeError):
    """Raised instead of taking an optimizer step the privacy budget does not cover (a safety net)."""


class DPForecastStrategy(LedgerWiring, NoisyStep, IndependenceChecks, Callback):
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

    Settings that would break the guarantee raise :class:`~lightning_dpts.errors.ConfigurationError`:
    Trainer ``gradient_clip_val``, gradient accumulation in any form (``accumulate_grad_batches != 1``, a
    ``GradientAccumulationScheduler``: checked at every step, exactly one sampled batch per optimizer step),
    more than one optimizer, manual optimisation, several processes on anything but Lightning's DDP (and, on
    DDP, BandMF noise, b-min-sep sampling, SyncBatchNorm, DDP comm hooks, static graphs), mixed precision, BatchNorm,
    trainable parameters in the optimizer that the hooks do not cover, a parameter (un)frozen during the fit
    (checked before every noisy step; changes before the first step, e.g. in the module's ``setup``, are taken at
    ``on_fit_start``), layers created after this callback's ``setup`` (``configure_model``), Lightning's
    ``LearningRateFinder`` and ``BatchSizeFinder`` (their trial steps run without this callback), a ``forward``
    that mixes windows on the fast path (found by the probe or the spot check after the fit's first step, or with
    ``per_window="fast"``), and continuing a model whose ledger is not empty without an
    :class:`~lightning_dpts.training.AccountantCallback`.

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
            ``spot_check_recomputed``; :meth:`~lightning_dpts.training.independence.IndependenceChecks._reexamine`).
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
        self.target_epsilon = target_epsilon
        self.target_delta = target_delta
        self.epochs = epochs
        self.spot_check = check_independence_options(seed, secure_mode, check_independence, per_window, spot_check)
        self.scaler_default_scale = check_step_options(expected_batch_size, loss_reduction, scaler_default_scale,
                                                       data_dependent_schedulers)
        self._seed = seed
        self.secure_mode = secure_mode
        self.check_independence = check_independence
        self.per_window = per_window
        #: whether this fit computes per-window gradients in isolation (``per_window="isolated"``, or ``"auto"``
        #: after the probe found a mix before the first step)
        self.isolated = per_window == "isolated"
        self._isolated: IsolatedGradients | None = None
        #: whether the isolated per-window gradients were computed by ``vmap`` (``False``: one pass per window;
        #: ``None``: not computed yet)
        self.vectorised: bool | None = None
        self._isolated_sums: list[torch.Tensor] | None = None
        self._fit_steps = 0  # noisy steps taken in this fit
        self._next_probe: int | None = None  # the fit's step (1-based) at which the probe runs next
        self.probes = 0  #: probes run in this fit (see check_independence)
        self.probe_seconds = 0.0  #: wall time the probes of this fit took, in seconds
        self._probe_variant: tuple[bool, bool] | None = None  # the probe variant that ran in this fit
        self._stochastic: bool | None = None  # whether training_step's result on one window is random (spot check)
        self._spot_batch: Any = None  # a copy of this step's batch when the step is spot-checked
        self._warned_reduction = False  # the spot check found the fast path's gradients scaled by the batch size
        #: steps of the current fit whose spot check found a gap that float64 showed to be round-off (each was
        #: recomputed with every window alone; docs/training.md)
        self.spot_check_recomputed = 0
        self._choices = random.Random()  # which steps and windows the spot check takes: not a privacy draw
        self._schedule = random.Random()  # the probe's steps (not a privacy draw either)
        self._given_batch_size = expected_batch_size
        self.loss_reduction = loss_reduction
        self.data_dependent_schedulers = data_dependent_schedulers
        self.noise: NoiseSource | None = None
        #: whether each step's noise is drawn in a background thread (decided at the first step, see
        #: :meth:`_prepare_noise`); ``None`` until then
        self.background_noise: bool | None = None
        self.ledger = PrivacyLedger()
        self.step_cap: int | None = None  # accounted-step cap set by AccountantCallback
        self._restored: PrivacyLedger | None = None
        self._before_swaps: PrivacyLedger | None = None  # the module's ledger at setup, before the layer swaps
        self._begun = False
        self._new_epoch = True
        self._batches_since_step = 0
        self._batch_used = False  # whether the current batch reached the (wrapped) training_step
        self._batch: Any = None
        self._original_training_step: Callable[..., Any] | None = None
        self.expected_batch_size: int | None = None
        self.surgery: Surgery | None = None
        self._clipper: PerWindowClipper | None = None
        self._params: list[nn.Parameter] = []  # set with _use_params, with what follows from it:
        self._hooked_ids: set[int] = set()  # their ids
        self._noise_numel = 0  # their number of coordinates (the size of the step's noise vector)
        self._setup_param_ids: list[int] = []  # every parameter of the module at setup, trainable or not
        self._setup_module_ids: list[int] = []  # every submodule at setup (after the layer swaps)
        self._rank, self._world_size = 0, 1
        self._ddp: Any = None  # the DistributedDataParallel wrapper on several processes
        self._buffer_guard: StateGuard | None = None  # the fit's state guard (state that changes is refused)
        #: Test-facing seam for :mod:`lightning_dpts.audit` (not a constructor option, and nothing a fit needs): a
        #: callable ``observer(module, strategy, step, noisy)`` called at every noisy step after the noisy averaged
        #: gradient ``noisy`` (one tensor per trainable parameter, copies) is computed and before the optimizer
        #: applies it, with the parameters still at their pre-step values. It sees what the DP analysis already
        #: assumes public (every intermediate noisy gradient, docs/privacy.md "Hidden-state assumptions"), cannot
        #: change the update, and draws nothing from the fit's randomness. ``None``: no observer.
        self.audit_observer: Callable[[L.LightningModule, DPForecastStrategy, int, list[torch.Tensor]], None] | None
        self.audit_observer = None

    # ------------------------------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        return "DPForecastStrategy"

    @property
    def noise_kind(self) -> str:
        """The noise's name, ``"gaussian"`` or ``"bandmf"`` (as given; ``noise_spec`` is the object)."""
        return self.noise_spec.name

    @property
    def seeded(self) -> bool:
        """``True`` if the noise comes from an explicit seed (see :data:`~lightning_dpts.randomness.SEEDED_NOTICE`)."""
        return self._seed is not None

    @property
    def steps(self) -> int:
        """Noisy optimizer steps taken by the model, over every fit (``self.ledger.steps``)."""
        return self.ledger.steps

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
        if spec is not None:
            if self._given_batch_size is not None and self._given_batch_size != spec.batch_size:
                raise ConfigurationError(
                    "expected_batch_size", self._given_batch_size,
                    f"must equal the datamodule's sampling_spec.batch_size={spec.batch_size} (or be omitted)",
                )
            self.expected_batch_size = spec.batch_size
        elif self._given_batch_size is not None:
            self.expected_batch_size = self._given_batch_size
        else:
            raise ConfigurationError(
                "expected_batch_size", None,
                "the datamodule has no sampling_spec; use a StructuredSubsamplingDataModule or give Lambda",
            )
        check_noise_spec(spec, self.noise_spec)
        if self._noise_multiplier is None:
            if spec is not None and spec.top_level_scheme.needs_monte_carlo:
                raise ConfigurationError(
                    "target_epsilon", self.target_epsilon,
                    "calibrating sigma for b_min_sep sampling needs the Monte Carlo accountant: compute sigma with "
                    "lightning_dpts.privacy.montecarlo.calibrate_noise_multiplier_monte_carlo (Algorithm 5) and "
                    "pass it as noise_multiplier",
                )
            if spec is None:
                raise ConfigurationError(
                    "target_epsilon", self.target_epsilon,
                    "calibrating sigma needs a datamodule with a sampling_spec; give noise_multiplier instead",
                )
            self._noise_multiplier = calibrate_noise_multiplier(
                spec, float(self.target_epsilon), float(self.target_delta), epochs=self.epochs,  # type: ignore[arg-type]
                coefficients=self.coefficients if self.noise_spec.correlated else None,
            )
            rank_zero_info(
                f"DPForecastStrategy: noise_multiplier={self._noise_multiplier:.4g} reaches "
                f"epsilon={self.target_epsilon} at delta={self.target_delta} after {self.epochs} epochs"
            )
        return self._noise_multiplier

    # ------------------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        check_trainer(trainer)
        if self.require_accountant and not has_accountant(trainer):
            raise ConfigurationError(
                "callbacks", "DPForecastStrategy without an AccountantCallback",
                "DP training needs an AccountantCallback(epsilon=..., delta=...) in the same Trainer(callbacks=[...]): "
                "without it no epsilon is computed, logged or enforced and training does not stop at a budget. Add "
                "one with your budget; if you account the steps yourself from strategy.ledger (which counts every "
                "noisy step either way), pass DPForecastStrategy(..., require_accountant=False)",
            )
        self.resolve(trainer)
        self._rank, self._world_size = rank_and_world_size(trainer)
        say_where_logs_go(trainer)
        if self._world_size > 1:
            self._check_distributed(trainer)
        if self.surgery is not None:  # setup twice without teardown
            return
        self.remember_ledger(pl_module)  # before the swaps: a swapped layer's replacement holds no ledger
        self.surgery = make_private_compatible(pl_module, scaler_default_scale=self.scaler_default_scale)
        if self.surgery.swaps:
            rank_zero_info(f"DPForecastStrategy: swapped {', '.join(self.surgery.swapped)} (weights copied)")
        self._setup_param_ids = [id(p) for p in pl_module.parameters()]
        self._setup_module_ids = [id(m) for m in pl_module.modules()]
        self.background_noise = None
        self._hook_trainable(pl_module)
        self._wrap_training_step(pl_module)
        self._begun = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.spot_check_recomputed = 0
        check_optimizer(trainer, pl_module)
        self._refresh_trainable(pl_module)
        check_optimizer_params(trainer, self._hooked_ids)
        check_schedulers(trainer, self.data_dependent_schedulers)
        if self._world_size > 1:
            self._ddp = detach_ddp_averaging(trainer)
        released = check_monitors(trainer)  # stopping or checkpoint rules on noise-free metrics: refused here
        # after any restored checkpoint, before sanity validation
        self._buffer_guard = StateGuard.start(pl_module, trainer.callbacks, exempt=released)

    def _refresh_trainable(self, pl_module: L.LightningModule) -> None:
        """Take the trainable parameters again at ``on_fit_start``, before any step, if they changed since this
        callback's ``setup``: the LightningModule's own ``setup`` hook, ``configure_model`` and callbacks listed after
        this one run later and may freeze or unfreeze layers (e.g. ``BaseFinetuning.freeze_before_training``).
        The per-window hooks are attached again for the new set; from here on the set is fixed for the fit
        (:func:`~lightning_dpts.training.guards.check_trainable`). Only ``requires_grad`` may have changed:
        parameters created after ``setup`` (e.g. layers built in ``configure_model``) missed the layer swaps and
        the model checks: a new module with parameters or buffers is refused (one without, e.g. a torchmetrics
        metric built in ``setup``, is not; :func:`~lightning_dpts.training.guards.check_layers_after_setup`).
        """
        assert self._clipper is not None
        check_layers_after_setup(pl_module, self._setup_module_ids, self._setup_param_ids)
        if [id(p) for p in pl_module.parameters() if p.requires_grad] == [id(p) for p in self._params]:
            return
        self._clipper.remove()
        self._clipper = None
        self._hook_trainable(pl_module)

    def _hook_trainable(self, pl_module: L.LightningModule) -> None:
        """Take the module's trainable parameters as those DP training updates, and attach the per-window hooks
        (:class:`PerWindowClipper`) for them."""
        self._use_params([p for p in pl_module.parameters() if p.requires_grad])
        if not self._params:
            raise ConfigurationError("model", type(pl_module).__name__, "has no trainable parameters")
        self._clipper = PerWindowClipper(pl_module, loss_reduction=self.loss_reduction)

    def _check_distributed(self, trainer: L.Trainer) -> None:
        """Settings that DP training on several processes refuses (at ``setup``, before any step)."""
        check_distributed(trainer, self.noise_spec, self._world_size)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.begin(trainer, pl_module)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._new_epoch = True  # the first noisy step of this epoch counts a new epoch (also a resumed one)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not self._begun:
            self.begin(trainer, pl_module)
        if self._world_size > 1:  # keep DDP's own gradient averaging off (Lightning's no_sync restores the flag)
            self._ddp.require_backward_grad_sync = False
            self._ddp.require_forward_param_sync = False
        if self._batches_since_step >= 1 and not self._batch_used:
            # the previous batch never reached training_step (the module's on_train_batch_start returned -1 to
            # skip the rest of the epoch, or its optimizer_step did not run the closure): nothing of it reached a
            # gradient (this hook clears them below) and no step was taken or accounted for it
            self._batches_since_step = 0
        if self._batches_since_step >= 1:
            raise ConfigurationError(
                "accumulate_grad_batches", self._batches_since_step + 1,
                "a second batch started before the optimizer step of the previous one (gradient accumulation, "
                "e.g. a GradientAccumulationScheduler): DP training needs exactly one sampled batch per "
                "optimizer step; raise the datamodule's batch_size instead",
            )
        self._batches_since_step += 1
        self._batch_used = False
        self._batch = batch
        self._clear()
        self._isolated_sums = None
        for p in self._params:  # every hooked parameter's .grad is written by this step alone (a parameter outside
            p.grad = None  # the optimizer keeps its last noisy .grad through zero_grad; the check would misread it)
        if not self.isolated and self._next_probe is not None and self._fit_steps + 1 >= self._next_probe:
            self._next_probe = self._probe_after(self._fit_steps + 1)  # (after the last step's gradients are gone:
            self._check_window_independence(pl_module, batch)  # the probe's peak memory does not hold them)
        # the spot check's draw: a copy of the batch as it arrived (training_step may write into its input)
        self._spot_batch = None
        if not self.isolated and self.spot_check > 0 and self._choices.random() < self.spot_check:
            self._spot_batch = copy_batch(batch)
        self._prepare_noise()
        if self._clipper is not None and not self.isolated:
            self._clipper.enable()
        elif self._clipper is not None:
            self._clipper.disable()

    def _use_params(self, params: list[nn.Parameter]) -> None:
        """The parameters DP training updates (trainable when the per-window hooks were attached)."""
        self._params = params
        self._hooked_ids = {id(p) for p in params}
        self._noise_numel = sum(p.numel() for p in params)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        assert self.expected_batch_size is not None and self._clipper is not None
        assert self.noise is not None or self._rank != 0
        if self._batches_since_step != 1:
            raise ConfigurationError(
                "accumulate_grad_batches", self._batches_since_step,
                "DP training needs exactly one sampled batch per optimizer step",
            )
        refused: ConfigurationError | None = None
        try:
            check_trainable(trainer, pl_module, self._hooked_ids)
            if self._spot_batch is not None and not self.isolated:
                self._spot_check(pl_module)
            if self._buffer_guard is not None:
                self._buffer_guard.check_step()  # state changed since the last step: refused before this update
        except ConfigurationError as err:
            if self._world_size == 1:
                raise
            refused = err  # raised after the step's all-reduce, so that no other rank is left waiting in it
        after = PrivacyLedger(steps=self.ledger.steps + 1, epochs=self.ledger.epochs + int(self._new_epoch))
        spec = spec_or_none(trainer)
        if self.step_cap is not None and spec is not None and after.accounted_steps(spec) > self.step_cap:
            raise PrivacyBudgetExhausted(
                f"noisy step {after.steps} would bring the accounted steps to {after.accounted_steps(spec)}, beyond "
                f"the {self.step_cap} the privacy budget allows"
            )
        noisy = self._noisy_gradients(trainer, after.steps, refused)
        if self.audit_observer is not None:  # the audit's white-box view (copies: it cannot change the update)
            self.audit_observer(pl_module, self, after.steps, [g.detach().clone() for g in noisy])
        for p, g in zip(self._params, noisy, strict=True):
            p.grad = g
        self._clear()
        self.ledger.steps = after.steps
        self.ledger.epochs = after.epochs
        self._fit_steps += 1
        self._new_epoch = False
        self._batches_since_step = 0

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._buffer_guard is not None:  # exact, also for writes that bypass version counters (buf.data) and
            self._buffer_guard.check()  # state written by the last step's on_train_batch_end

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._clipper is not None:
            self._clipper.disable()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._clipper is not None and trainer.training:
            self._clipper.enable()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._undo(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._undo(pl_module)

    def _undo(self, pl_module: L.LightningModule) -> None:
        """Remove the Opacus hooks and per-sample state, put the original layers back, and end the noise's background
        thread (idempotent; at train end and on an exception, so no thread of the fit outlives it)."""
        begun = self._begun
        self._clear()
        close = getattr(self.noise, "close", None)
        if close is not None:
            close()
        if self._buffer_guard is not None:  # stays attached (the module refuses state_dict) if a buffer changed
            self._buffer_guard.release(pl_module)
            self._buffer_guard = None
        if self._original_training_step is not None:
            if "training_step" in vars(pl_module):
                del pl_module.training_step
            self._original_training_step = None
        self._begun = False
        self._batch = None
        if self._clipper is not None:
            self._clipper.remove()
            self._clipper = None
        if self.surgery is not None:
            self.surgery.restore()
            self.surgery = None
        if begun:  # the original layers hold the fit's ledger again
            self.end_ledger(pl_module)
        self._use_params([])
        self._isolated = None
        self._isolated_sums = None
        self.background_noise = None

    def _clear(self) -> None:
        """Drop per-window state left from a previous step (also after a forward pass without backward)."""
        if self._clipper is not None:
            self._clipper.clear(self._params)


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

Run-time guarantees (PRIVACY-NOTES traps 7 and 8), checked at every optimizer step, not only at setup:

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
* no buffer of the model changes during the fit (:class:`~lightning_dpts.training.buffers.BufferGuard`: at every
  step, in every ``state_dict()`` of the module, so before any checkpoint, and at the end of training).

On several processes (Lightning ``strategy="ddp"``, docs/distributed.md) the step is the same mechanism on one
global structured sample: every rank clips its share of the windows, the clipped sums are added over the ranks
by one ``all_reduce`` to which rank 0 alone adds the one Gaussian draw
(:func:`~lightning_dpts.distributed.all_reduce_noisy_sum`), every rank divides by the global Lambda and applies
the identical update (checked every step); DDP's own gradient averaging is switched off.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_dpts.distributed import all_reduce_noisy_sum, check_identical, rank_and_world_size
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import calibrate_noise_multiplier
from lightning_dpts.privacy.spec import SamplingSpec
from lightning_dpts.randomness import SEEDED_NOTICE, Entropy, GaussianNoise, resolve_entropy
from lightning_dpts.training.buffers import BufferGuard
from lightning_dpts.training.correlated_noise import (
    NOISE_KINDS,
    banded_sqrt_coefficients,
    check_coefficients,
    make_noise,
)
from lightning_dpts.training.engine import (
    NoiseSource,
    NonFiniteGradientError,
    PerWindowClipper,
    _row_sq,
    add_noise_and_average,
    clip_factors,
)
from lightning_dpts.training.isolated import IsolatedGradients, silenced, training_loss
from lightning_dpts.training.ledger import LEDGER_KEY, PrivacyLedger, attach_ledger, ledger_of
from lightning_dpts.training.roles import StepAccountant
from lightning_dpts.training.surgery import Surgery, make_private_compatible

__all__ = ["DPForecastStrategy", "NonFiniteGradientError", "PrivacyBudgetExhausted", "clip_and_noise"]

#: ``per_window`` values: how each window's gradient is computed (see :class:`DPForecastStrategy`)
PER_WINDOW_MODES = ("auto", "fast", "isolated")
#: at most this many windows of the probe batch have their gradients compared (window 0 and the next ones)
_PROBE_COMPARED = 33
#: c in the tolerance c * eps * sqrt(#params) * (gradient norm scale) of the probe and the spot check
_TOLERANCE_FACTOR = 16.0


class PrivacyBudgetExhausted(RuntimeError):
    """Raised instead of taking an optimizer step the privacy budget does not cover (a safety net)."""


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(name, value, "must be a finite number > 0")
    return float(value)


def clip_and_noise(
    grad_samples: list[torch.Tensor | None],
    params: list[torch.Tensor],
    max_grad_norm: float,
    noise_std: float,
    expected_batch_size: int,
    noise: NoiseSource,
) -> list[torch.Tensor]:
    """Algorithm 2's aggregation: (sum_i clip_C(g_i) + N(0, noise_std^2 I)) / Lambda, per parameter.

    Args:
        grad_samples: per-window gradients, one ``[B, *p.shape]`` tensor per parameter (``None`` if the
            parameter received no gradient; it then gets noise only).
        params: the parameters, in the same order (for shapes, dtype and device).
        max_grad_norm: C, the l2 bound of each window's gradient over *all* parameters jointly.
        noise_std: sigma * C, the std of the Gaussian noise added to the summed clipped gradient.
        expected_batch_size: Lambda, the divisor (the expected, not the realised, batch size).
        noise: what draws the noise: a :class:`~lightning_dpts.randomness.GaussianNoise` (or any object with
            its ``sample`` method, e.g. :class:`~lightning_dpts.training.BandMFNoise`).

    Returns:
        The noisy averaged gradient for each parameter.
    """
    present = [g for g in grad_samples if g is not None]
    sums: list[torch.Tensor | None] = [None] * len(grad_samples)
    if present:
        b = present[0].shape[0]
        sq = sum(g.reshape(b, -1).pow(2).sum(dim=1) for g in present)
        factor = clip_factors(sq, max_grad_norm)
        sums = [None if g is None else torch.einsum("i,i...->...", factor.to(g.dtype), g) for g in grad_samples]
    return add_noise_and_average(sums, params, noise_std, expected_batch_size, noise)


class DPForecastStrategy(Callback):
    """Differentially private training of an unchanged LightningModule (DP-SGD, Algorithm 2).

    Add it to ``Trainer(callbacks=[...])`` together with a datamodule that has a ``sampling_spec`` (e.g.
    :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`) and, usually, an
    :class:`~lightning_dpts.training.AccountantCallback`.

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
            start of every fit (PRIVACY-NOTES trap 7). An integer >= 0 makes the noise a public function of it,
            for experiments and tests only: **anyone who knows the seed can subtract the noise**; the run then
            warns with :data:`~lightning_dpts.randomness.SEEDED_NOTICE` and the checkpoint metadata says
            ``"seeded": True`` (the seed itself is never written).
        secure_mode: draw the noise from the operating system's CSPRNG with Opacus' floating-point mitigation
            (:class:`~lightning_dpts.randomness.GaussianNoise` ``secure=True``; cost measured by
            ``benchmarks/randomness.py``). Needs ``seed=None``.
        per_window: how each window's gradient g_i is computed (PRIVACY-NOTES trap 8; docs/training.md).
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
            keys, its number of windows, missing values and observed masks, integer features that repeat between
            windows), in float64 where the module runs in it, change window 0 and require every other window's
            per-window gradient to stay within c * eps * sqrt(#params) * (largest per-window gradient norm) of
            its value. It runs at the fit's first step and at one random step in each of [2, 4), [4, 8), [8, 16),
            ... (two extra forward/backward passes of the batch each time). ``False`` skips it (only for a model
            you have verified yourself).
        spot_check: on the fast path, the probability (in [0, 1]; 0.1 by default, about 5% of a non-DP step
            measured, docs/training.md) that a step checks one window drawn at random (a non-private draw): its
            clipped gradient computed with that window alone must equal, within the float tolerance, the one the
            batched pass attributes to it; else the step is refused before its update. 1.0 checks every step
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
    """

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
    ) -> None:
        super().__init__()
        if noise not in NOISE_KINDS:
            raise ConfigurationError("noise", noise, f"must be one of {', '.join(repr(k) for k in NOISE_KINDS)}")
        self.noise_kind = noise
        self.coefficients: tuple[float, ...] | None = None
        if noise == "bandmf":
            if coefficients is None:
                if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
                    raise ConfigurationError("bands", bands, "noise='bandmf' needs bands: an integer >= 1")
                c = banded_sqrt_coefficients(bands)
            else:
                c = check_coefficients(coefficients, bands)
            self.coefficients = tuple(float(v) for v in c)
        elif bands not in (None, 1) or coefficients is not None:
            raise ConfigurationError("bands", bands, "bands/coefficients are only for noise='bandmf'")
        self.bands = 1 if self.coefficients is None else len(self.coefficients)
        self.max_grad_norm = _positive("max_grad_norm", max_grad_norm)
        target = (target_epsilon, target_delta, epochs)
        if noise_multiplier is not None:
            if any(t is not None for t in target):
                raise ConfigurationError(
                    "noise_multiplier", noise_multiplier,
                    "give either noise_multiplier or (target_epsilon, target_delta, epochs), not both",
                )
            noise_multiplier = _positive("noise_multiplier", noise_multiplier)
        elif any(t is None for t in target):
            raise ConfigurationError(
                "noise_multiplier", None,
                "give noise_multiplier, or all of target_epsilon, target_delta and epochs to calibrate it",
            )
        else:
            _positive("target_epsilon", target_epsilon)
            if not (isinstance(target_delta, float) and 0 < target_delta < 1):
                raise ConfigurationError("target_delta", target_delta, "must lie strictly between 0 and 1")
            if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
                raise ConfigurationError("epochs", epochs, "must be an integer >= 1")
        self._noise_multiplier: float | None = noise_multiplier
        self.target_epsilon = target_epsilon
        self.target_delta = target_delta
        self.epochs = epochs
        if seed is not None:
            resolve_entropy(seed, "seed")  # validates; the entropy itself is drawn at every fit start
        if not isinstance(secure_mode, bool):
            raise ConfigurationError("secure_mode", secure_mode, "must be True or False")
        if secure_mode and seed is not None:
            raise ConfigurationError(
                "secure_mode", True, "draws from the operating system's CSPRNG and cannot be seeded; use seed=None"
            )
        if not isinstance(check_independence, bool):
            raise ConfigurationError("check_independence", check_independence, "must be True or False")
        if per_window not in PER_WINDOW_MODES:
            raise ConfigurationError(
                "per_window", per_window, f"must be one of {', '.join(repr(m) for m in PER_WINDOW_MODES)}"
            )
        if (isinstance(spot_check, bool) or not isinstance(spot_check, (int, float))
                or not 0.0 <= float(spot_check) <= 1.0):
            raise ConfigurationError("spot_check", spot_check, "must be a probability in [0, 1]")
        self._seed = seed
        self.secure_mode = secure_mode
        self.check_independence = check_independence
        self.per_window = per_window
        self.spot_check = float(spot_check)
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
        self._stochastic: bool | None = None  # whether training_step's result on one window is random (spot check)
        self._spot_batch: Any = None  # a copy of this step's batch when the step is spot-checked
        self._warned_reduction = False  # the spot check found the fast path's gradients scaled by the batch size
        self._choices = random.Random()  # which steps and windows the spot check takes: not a privacy draw
        self._schedule = random.Random()  # the probe's steps (not a privacy draw either)
        if expected_batch_size is not None and (
            isinstance(expected_batch_size, bool) or not isinstance(expected_batch_size, int) or expected_batch_size < 1
        ):
            raise ConfigurationError("expected_batch_size", expected_batch_size, "must be an integer >= 1")
        self._given_batch_size = expected_batch_size
        if loss_reduction not in ("mean", "sum"):
            raise ConfigurationError("loss_reduction", loss_reduction, "must be 'mean' or 'sum'")
        self.loss_reduction = loss_reduction
        self.scaler_default_scale = _positive("scaler_default_scale", scaler_default_scale)
        if data_dependent_schedulers not in ("disable", "error"):
            raise ConfigurationError("data_dependent_schedulers", data_dependent_schedulers,
                                     "must be 'disable' or 'error'")
        self.data_dependent_schedulers = data_dependent_schedulers
        self.noise: NoiseSource | None = None
        #: whether each step's noise is drawn in a background thread (decided at the first step, see
        #: :meth:`_prepare_noise`); ``None`` until then
        self.background_noise: bool | None = None
        self.ledger = PrivacyLedger()
        self.step_cap: int | None = None  # accounted-step cap set by AccountantCallback
        self._restored: PrivacyLedger | None = None
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
        self._buffer_guard: BufferGuard | None = None  # the module's buffers at the fit's start (refused if changed)

    # ------------------------------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        return "DPForecastStrategy"

    @property
    def seeded(self) -> bool:
        """``True`` if the noise comes from an explicit seed (see :data:`~lightning_dpts.randomness.SEEDED_NOTICE`)."""
        return self._seed is not None

    @property
    def steps(self) -> int:
        """Noisy optimizer steps taken by the model, over every fit (``self.ledger.steps``)."""
        return self.ledger.steps

    def _make_noise(self, entropy: Entropy) -> NoiseSource:
        """The one object that draws this fit's DP noise (``sample(numel, std, dtype)``, one flat vector for all
        parameters per optimizer step).

        ``noise="gaussian"``: i.i.d. Gaussian noise (DP-SGD). The stream key includes the ledger's step count, so
        that even a seeded run continued from its latest checkpoint does not reuse noise (a seeded run resumed from
        an *older* checkpoint does: seeds are for experiments only). Unseeded, ``entropy`` is fresh at every fit,
        so nothing is ever replayed. Each step's vector is drawn in a background thread while the step's
        forward/backward runs (:meth:`_prepare_noise`: the same sequence of draws, each handed out once).
        ``noise="bandmf"``: row i of C^{-1}Z at step i
        (:class:`~lightning_dpts.training.correlated_noise.BandMFNoise` via ``make_noise``, Section 2.3 of
        Dong & Ganesh 2026); its band state is secret, never stored, and a BandMF run is never continued.
        """
        if self.noise_kind == "bandmf":
            return make_noise("bandmf", entropy, secure=self.secure_mode, coefficients=self.coefficients)
        return GaussianNoise(entropy, secure=self.secure_mode, stream=(7, self.ledger.steps))

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
        spec = _spec_or_none(trainer)
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
        self._check_noise_spec(spec)
        if self._noise_multiplier is None:
            if spec is not None and spec.top_level == "b_min_sep":
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
                spec, float(self.target_epsilon), float(self.target_delta), epochs=self.epochs  # type: ignore[arg-type]
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
        _check_trainer(trainer)
        self.resolve(trainer)
        self._rank, self._world_size = rank_and_world_size(trainer)
        if self._world_size > 1:
            self._check_distributed(trainer)
        if self.surgery is not None:  # setup twice without teardown
            return
        self.surgery = make_private_compatible(pl_module, scaler_default_scale=self.scaler_default_scale)
        if self.surgery.swaps:
            rank_zero_info(f"DPForecastStrategy: swapped {', '.join(self.surgery.swapped)} (weights copied)")
        self._setup_param_ids = [id(p) for p in pl_module.parameters()]
        self._setup_module_ids = [id(m) for m in pl_module.modules()]
        self.background_noise = None
        self._hook_trainable(pl_module)
        self._wrap_training_step(pl_module)
        self._begun = False

    def _wrap_training_step(self, pl_module: L.LightningModule) -> None:
        """A batch without windows (Poisson sampling) skips the model: ``None`` loss, then the noise-only step."""
        from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

        original = pl_module.training_step
        self._original_training_step = original
        self._probe_args = (0,) if is_param_in_hook_signature(original, "batch_idx", min_args=2) else ()

        @functools.wraps(original)
        def training_step(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self._batch_used = True
            if _num_windows(batch) == 0:
                if self._world_size > 1:  # Lightning refuses a skipped step under DDP; a zero loss touches no
                    return self._params[0].new_zeros(()).requires_grad_()  # parameter: this rank adds zero
                return None
            if self.isolated:
                return self._isolated_step(pl_module, original, batch, *args, **kwargs)
            return original(batch, *args, **kwargs)

        pl_module.training_step = training_step  # type: ignore[method-assign]

    def _isolated_gradients(self, pl_module: L.LightningModule) -> IsolatedGradients:
        """The isolated per-window gradients of this module and its trainable parameters (built on first use)."""
        assert self._original_training_step is not None
        iso = self._isolated
        if iso is None or iso.params is not self._params or iso.module is not pl_module:
            iso = IsolatedGradients(pl_module, self._original_training_step, self._probe_args, self._params,
                                    self._clipper)
            self._isolated = iso
        return iso

    def _isolated_step(
        self, module: L.LightningModule, original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """``per_window="isolated"``: the clipped sum of the windows' gradients, each from ``training_step`` on
        that window alone (kept for the optimizer step); then ``training_step`` once on the whole batch without
        gradient, for its logging and return value, whose loss is handed to Lightning as a leaf (its backward
        touches no parameter)."""
        iso = self._isolated_gradients(module)
        iso.step_args = args  # the step's own batch_idx (positional, as Lightning passes it)
        try:
            self._isolated_sums = iso.clipped_sums(batch, self.max_grad_norm)
            self.vectorised = iso.vectorised
        except NonFiniteGradientError as err:
            raise NonFiniteGradientError(self._describe_windows(module.trainer, err.windows), err.windows) from err
        with torch.no_grad(), (self._clipper.bypassed() if self._clipper is not None else contextlib.nullcontext()):
            out = original(batch, *args, **kwargs)
        loss = training_loss(out)
        if loss is None:
            return out
        leaf = loss.detach().clone().requires_grad_()
        return {**out, "loss": leaf} if isinstance(out, dict) else leaf

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not pl_module.automatic_optimization:
            raise ConfigurationError(
                "automatic_optimization", False,
                "DPForecastStrategy needs automatic optimisation (one backward and one step per batch)",
            )
        if len(trainer.optimizers) != 1:
            raise ConfigurationError(
                "configure_optimizers", f"{len(trainer.optimizers)} optimizers",
                "DP training supports exactly one optimizer (each step releases one noisy gradient)",
            )
        self._refresh_trainable(pl_module)
        for group in trainer.optimizers[0].param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in self._hooked_ids:
                    raise ConfigurationError(
                        "configure_optimizers", f"parameter of shape {tuple(p.shape)}",
                        "every trainable parameter the optimizer updates must belong to the LightningModule "
                        "(create the optimizer from self.parameters() or submodules)",
                    )
        self._check_schedulers(trainer)
        if self._world_size > 1:
            self._detach_ddp_averaging(trainer)
        self._buffer_guard = BufferGuard.start(pl_module)  # after any restored checkpoint, before sanity validation

    def _refresh_trainable(self, pl_module: L.LightningModule) -> None:
        """Take the trainable parameters again at ``on_fit_start``, before any step, if they changed since this
        callback's ``setup``: the LightningModule's own ``setup`` hook, ``configure_model`` and callbacks listed after
        this one run later and may freeze or unfreeze layers (e.g. ``BaseFinetuning.freeze_before_training``).
        The per-window hooks are attached again for the new set; from here on the set is fixed for the fit
        (:meth:`_check_trainable`). Only ``requires_grad`` may have changed: parameters created after ``setup`` (e.g.
        layers built in ``configure_model``) missed the layer swaps and the model checks: a new module with
        parameters or buffers is refused (one without, e.g. a torchmetrics metric built in ``setup``, is not).
        """
        assert self._clipper is not None
        known = set(self._setup_module_ids)
        added = [  # modules without parameters or buffers (activations, torchmetrics metrics) are harmless
            f"{name or type(pl_module).__name__} ({type(m).__name__})" for name, m in pl_module.named_modules()
            if id(m) not in known and (any(True for _ in m.parameters(recurse=False))
                                       or any(True for _ in m.buffers(recurse=False)))
        ]
        if added or [id(p) for p in pl_module.parameters()] != self._setup_param_ids:
            raise ConfigurationError(
                "model", ", ".join(added) or "parameters replaced after setup",
                "were created after DPForecastStrategy's setup (in the LightningModule's setup or configure_model "
                "hook, or by a callback listed after it): they missed the layer swaps, the BatchNorm refusal and the "
                "per-window hooks. Build every layer in __init__ (or before trainer.fit)",
            )
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
        from lightning.pytorch.strategies import DDPStrategy

        strategy = trainer.strategy
        where = "(DP training on several processes; see docs/distributed.md)"
        if not isinstance(strategy, DDPStrategy):
            raise ConfigurationError(
                "strategy", type(strategy).__name__,
                f"must be Lightning's DDP (strategy='ddp', launched by Lightning, torchrun or SLURM) {where}",
            )
        if getattr(strategy, "_ddp_comm_hook", None) is not None:
            raise ConfigurationError(
                "ddp_comm_hook", strategy._ddp_comm_hook,
                f"must be None: DDP's gradient communication is switched off, the DP step all-reduces the clipped "
                f"sums itself {where}",
            )
        if getattr(strategy, "_ddp_kwargs", {}).get("static_graph"):
            raise ConfigurationError("static_graph", True, f"must be False {where}")
        if getattr(trainer._accelerator_connector, "sync_batchnorm", False):
            raise ConfigurationError(
                "sync_batchnorm", True,
                f"must be False: SyncBatchNorm normalises with statistics of every rank's windows, so one window "
                f"changes every other window's gradient (PRIVACY-NOTES trap 8) {where}",
            )
        if self.noise_kind == "bandmf":
            raise ConfigurationError(
                "noise", "bandmf",
                f"BandMF is not supported on {self._world_size} processes yet (its noise band and the b-min-sep "
                f"chain would have to live on rank 0 alone); train it on one process {where}",
            )
        from lightning_dpts.data.datamodule import StructuredSubsamplingDataModule

        dm = getattr(trainer, "datamodule", None)
        if not isinstance(dm, StructuredSubsamplingDataModule):
            raise ConfigurationError(
                "datamodule", type(dm).__name__,
                f"must be a StructuredSubsamplingDataModule: it makes the {self._world_size} processes' batches "
                f"one global structured sample (other loaders give every rank its own sample or the same one, "
                f"which the accountant does not cover) {where}",
            )
        spec = _spec_or_none(trainer)
        if spec is not None and spec.top_level == "b_min_sep":
            raise ConfigurationError(
                "datamodule.sampling_spec", "top_level='b_min_sep'",
                f"is not supported on {self._world_size} processes yet (its Monte Carlo accountant samples on every "
                f"rank); train it on one process {where}",
            )

    def _check_global_sample(self, trainer: L.Trainer) -> None:
        """The datamodule's sampler must yield this rank's share of the global batch (its train_dataloader ran)."""
        sampler = trainer.datamodule.sampler
        if (sampler.rank, sampler.world_size) != (self._rank, self._world_size):
            raise ConfigurationError(
                "datamodule", f"sampler share {sampler.rank}/{sampler.world_size}",
                f"must be this rank's share {self._rank}/{self._world_size} of the global batch: use the "
                "datamodule's own train_dataloader (it broadcasts rank 0's sampling entropy and shards the batch; "
                "docs/distributed.md)",
            )

    def _detach_ddp_averaging(self, trainer: L.Trainer) -> None:
        """Switch off DDP's gradient all-reduce and per-forward buffer broadcast (the DP step communicates).

        DDP would average the *unclipped* local gradients (then overwritten: wasted traffic), and its reducer
        and buffer broadcast are collectives inside forward/backward, which a rank with an empty local batch
        skips. Buffers are broadcast once, when DDP wraps the module; a buffer that changes in training would
        differ between ranks (BatchNorm running statistics are refused anyway).
        """
        from torch.nn.parallel import DistributedDataParallel

        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise ConfigurationError(
                "strategy", type(model).__name__, "Lightning's DDP strategy must wrap the module in "
                "DistributedDataParallel (DP training on several processes; docs/distributed.md)",
            )
        for name, sub in model.named_modules():
            if isinstance(sub, nn.modules.batchnorm._BatchNorm):
                raise ConfigurationError(
                    "model", f"{type(sub).__name__} at '{name}'",
                    "batch normalisation (SyncBatchNorm included) mixes windows across the batch and the ranks "
                    "(PRIVACY-NOTES trap 8); use LayerNorm/GroupNorm",
                )
        model.require_backward_grad_sync = False
        model.require_forward_param_sync = False
        self._ddp = model

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.begin(trainer, pl_module)

    def begin(self, trainer: L.Trainer, pl_module: L.LightningModule) -> PrivacyLedger:
        """Start this fit's ledger and noise (idempotent per fit; AccountantCallback calls it too).

        The ledger continues the one of the checkpoint this fit resumed from, else the one attached to the
        module, else starts empty; a fresh :class:`~lightning_dpts.randomness.Entropy` is drawn (no replay).
        """
        if self._begun:
            return self.ledger
        sigma = self.resolve(trainer)
        spec = _spec_or_none(trainer)
        if self._restored is not None:
            ledger = self._restored
        else:
            attached = ledger_of(pl_module)
            ledger = PrivacyLedger(**vars(attached)) if attached is not None else PrivacyLedger()
        self._restored = None
        self.step_cap = None  # a reused strategy forgets its previous fit's cap (AccountantCallback sets this fit's)
        if self._world_size > 1:  # before any check that could then fail on some ranks only
            _check_same_on_all_ranks(trainer, ledger.to_dict())
            self._check_global_sample(trainer)
        if ledger.epochs < 0:  # an older checkpoint without an epoch count: every started epoch, at least
            spe = spec.steps_per_epoch if spec is not None else 1
            ledger.epochs = -(-ledger.steps // spe)
        if not ledger.empty and (self.noise_kind == "bandmf" or ledger.noise == "bandmf"):
            raise ConfigurationError(
                "noise", self.noise_kind,
                f"the model's privacy ledger already holds {ledger.steps} noisy steps and a BandMF run cannot be "
                "resumed or continued: its noise band (the last b - 1 noise vectors) and the b-min-sep sampler's "
                "history are secret and never stored, so a continuation would restart both, a mechanism the Monte "
                "Carlo accounting of the planned run does not cover. Plan the whole run in one fit "
                "(Trainer max_steps), or start from freshly initialised weights",
            )
        ledger.check_continuation(sigma, self.max_grad_norm, spec)
        if not ledger.empty and not _has_accountant(trainer):
            raise ConfigurationError(
                "callbacks", "no AccountantCallback",
                f"the model's privacy ledger already holds {ledger.steps} noisy steps"
                + (f" (budget epsilon={ledger.budget[0]:g}, delta={ledger.budget[1]:g})" if ledger.budget else "")
                + "; add an AccountantCallback with your total budget to continue training it, so that the "
                "continuation is accounted and stopped within the budget",
            )
        ledger.noise_multiplier = sigma
        ledger.max_grad_norm = self.max_grad_norm
        ledger.noise = self.noise_kind
        ledger.bands = self.bands
        if spec is not None:
            ledger.sampling_spec = repr(spec)
        self.ledger = ledger
        attach_ledger(pl_module, ledger)
        entropy = resolve_entropy(self._seed, "seed")
        if entropy.seeded:
            ledger.seeded = True
            rank_zero_warn(f"DPForecastStrategy: {SEEDED_NOTICE}")
        if getattr(getattr(trainer, "datamodule", None), "seeded", False) is True:
            ledger.seeded = True  # seeded batch sampling: the checkpoint metadata must say so too
        # one noise source, on rank 0 only: the one Gaussian draw of every step (other ranks add none)
        self.noise = self._make_noise(entropy) if self._rank == 0 else None
        self._new_epoch = True
        self._batches_since_step = 0
        self.isolated = self.per_window == "isolated"
        self._isolated_sums = None
        self._fit_steps = 0
        self._next_probe = 1 if self.check_independence and not self.isolated else None
        self._stochastic = None
        if self._world_size > 1:  # the same probe steps on every rank (which steps are checked is not private)
            self._schedule = random.Random(25)
        self._begun = True
        return ledger

    def _check_noise_spec(self, spec: SamplingSpec | None) -> None:
        """BandMF noise is accounted only with b-min-sep sampling of the same b (Theorem 5.1's setting)."""
        if self.noise_kind != "bandmf":
            return
        if spec is None or spec.top_level != "b_min_sep" or spec.bands != self.bands:
            got = None if spec is None else f"top_level={spec.top_level!r}, bands={spec.bands}"
            raise ConfigurationError(
                "datamodule.sampling_spec", got,
                f"noise='bandmf' with bands={self.bands} needs b-min-sep sampling with the same separation: "
                f"StructuredSubsamplingDataModule(top_level='b_min_sep', bands={self.bands}, ...) (Dong & Ganesh "
                "2026, Theorem 5.1 assumes it; other samplings are not accounted)",
            )

    def _check_schedulers(self, trainer: L.Trainer) -> None:
        """Schedulers that adapt to a monitored (private, noiseless) metric are outside the guarantee."""
        monitored = [c for c in trainer.lr_scheduler_configs if c.monitor is not None]
        if not monitored:
            return
        names = ", ".join(f"{type(c.scheduler).__name__} monitoring {c.monitor!r}" for c in monitored)
        if self.data_dependent_schedulers == "error":
            raise ConfigurationError(
                "data_dependent_schedulers", "error",
                f"configure_optimizers returns {names}; the monitored metric is computed on private data without "
                "noise, which the DP guarantee does not cover. Use a fixed schedule or "
                "data_dependent_schedulers='disable'",
            )
        trainer.strategy.lr_scheduler_configs = [c for c in trainer.lr_scheduler_configs if c.monitor is None]
        rank_zero_warn(
            f"DPForecastStrategy disabled {names}: it adapts the learning rate to a metric computed on private "
            "data without noise, which the DP guarantee does not cover. The learning rate stays at the "
            "optimizer's value (pass data_dependent_schedulers='error' to fail instead)."
        )

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
        if not self.isolated and self._next_probe is not None and self._fit_steps + 1 >= self._next_probe:
            self._next_probe = self._probe_after(self._fit_steps + 1)
            self._check_window_independence(pl_module, batch)
        for p in self._params:  # every hooked parameter's .grad is written by this step alone (a parameter outside
            p.grad = None  # the optimizer keeps its last noisy .grad through zero_grad; the check would misread it)
        # the spot check's draw: a copy of the batch as it arrived (training_step may write into its input)
        self._spot_batch = None
        if not self.isolated and self.spot_check > 0 and self._choices.random() < self.spot_check:
            self._spot_batch = _copy(batch)
        self._prepare_noise()
        if self._clipper is not None and not self.isolated:
            self._clipper.enable()
        elif self._clipper is not None:
            self._clipper.disable()

    def _probe_after(self, step: int) -> int:
        """The fit's next probe step after ``step``: uniform in the next interval [2^k, 2^(k+1)) beyond it."""
        k = step.bit_length()
        return self._schedule.randrange(1 << k, 1 << (k + 1))

    def _use_params(self, params: list[nn.Parameter]) -> None:
        """The parameters DP training updates (trainable when the per-window hooks were attached)."""
        self._params = params
        self._hooked_ids = {id(p) for p in params}
        self._noise_numel = sum(p.numel() for p in params)

    def _check_trainable(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The trainable parameters must stay those of the fit's start (the ones with per-window hooks).

        A parameter unfrozen during the fit (e.g. by a fine-tuning callback) would get its plain autograd gradient,
        with no per-window bound and no noise, and the optimizer would apply it: a release the guarantee does not
        cover. A hooked parameter frozen during the fit would keep receiving noisy updates. Both are refused just
        before the noisy step, after every hook that could change them and before any update; a gradient on a
        parameter without hooks is refused too.
        """
        hooked = self._hooked_ids
        params = [*pl_module.parameters(), *(q for g in trainer.optimizers[0].param_groups for q in g["params"])]
        for p in params:
            if p.requires_grad == (id(p) in hooked) and (p.grad is None or p.requires_grad):
                continue
            name = next((n for n, q in pl_module.named_parameters() if q is p), f"of shape {tuple(p.shape)}")
            if p.requires_grad or id(p) not in hooked:
                raise ConfigurationError(
                    "requires_grad", f"parameter {name!r}",
                    "is not one of the parameters DP training started with but became trainable or got a gradient "
                    "during the fit (e.g. a fine-tuning callback unfroze it): its gradient would have no per-window "
                    "bound and no noise. Unfreeze it before the fit starts, or start a new fit after unfreezing "
                    "(the privacy ledger continues)",
                )
            raise ConfigurationError(
                "requires_grad", f"parameter {name!r}",
                "was frozen during DP training: it would keep receiving noisy updates. Freeze it before the fit "
                "starts, or start a new fit after freezing (the privacy ledger continues)",
            )

    def _prepare_noise(self) -> None:
        """Start this step's noise draw in the background (:meth:`GaussianNoise.prepare`) now that the previous
        step's noisy gradients are released: the draw overlaps the forward and backward pass, and only one noise
        vector (the size of the gradients) is alive at a time. The vector is the one the step's
        ``noise.sample`` call would draw anyway (same stream, same order, handed out once).

        Only when the background thread has a core to itself (:attr:`background_noise`, decided at the first
        step): the model trains on an accelerator, or the process may use more CPUs than torch's intra-op
        threads. Otherwise the draw is made at the optimizer step: a background draw would pre-empt one of the
        intra-op threads, and every parallel operation waits for its slowest thread (measured with two threads
        on two cores: SimpleFeedForward at Lambda = 1024, 1.22x the non-DP step against 1.03x drawing in place).
        """
        prepare = getattr(self.noise, "prepare", None)
        if prepare is None or self.expected_batch_size is None or not self._params:
            return
        if self.background_noise is None:
            self.background_noise = self._params[0].device.type != "cpu" or _spare_core()
        if not self.background_noise:
            return
        std = self.noise_std if self._world_size > 1 else self.noise_std / self.expected_batch_size
        prepare(self._noise_numel, std, self._params[0].dtype)

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
            self._check_trainable(trainer, pl_module)
            if self._spot_batch is not None and not self.isolated:
                self._spot_check(pl_module)
            if self._buffer_guard is not None:
                self._buffer_guard.check_step()  # a buffer changed by a forward of this step: refused before any save
        except ConfigurationError as err:
            if self._world_size == 1:
                raise
            refused = err  # raised after the step's all-reduce, so that no other rank is left waiting in it
        after = PrivacyLedger(steps=self.ledger.steps + 1, epochs=self.ledger.epochs + int(self._new_epoch))
        spec = _spec_or_none(trainer)
        if self.step_cap is not None and spec is not None and after.accounted_steps(spec) > self.step_cap:
            raise PrivacyBudgetExhausted(
                f"noisy step {after.steps} would bring the accounted steps to {after.accounted_steps(spec)}, beyond "
                f"the {self.step_cap} the privacy budget allows"
            )
        if self._world_size > 1:
            noisy = self._distributed_step(trainer, after.steps, refused)
        else:
            assert self.noise is not None
            try:
                if self.isolated:
                    noisy = add_noise_and_average(self._take_isolated_sums(), self._params, self.noise_std,
                                                  self.expected_batch_size, self.noise)
                else:
                    noisy = self._clipper.noisy_gradients(
                        self._params, self.max_grad_norm, self.noise_std, self.expected_batch_size, self.noise
                    )
            except NonFiniteGradientError as err:
                raise NonFiniteGradientError(self._describe_windows(trainer, err.windows), err.windows) from err
        for p, g in zip(self._params, noisy, strict=True):
            p.grad = g
        self._clear()
        self.ledger.steps = after.steps
        self.ledger.epochs = after.epochs
        self._fit_steps += 1
        self._new_epoch = False
        self._batches_since_step = 0

    def _take_isolated_sums(self) -> list[torch.Tensor | None]:
        """This step's clipped sums from the isolated per-window gradients (zeros: the batch had no windows)."""
        sums, self._isolated_sums = self._isolated_sums, None
        if sums is None:
            return [None] * len(self._params)
        return list(sums)

    def _distributed_step(
        self, trainer: L.Trainer, step: int, refused: Exception | None = None
    ) -> list[torch.Tensor]:
        """Algorithm 2 on the global batch: local clipped sums, one all-reduce with rank 0's one noise draw.

        A rank that cannot clip (a non-finite per-window gradient, a parameter without per-window gradients) or
        whose step was ``refused`` before clipping (its trainable parameters changed during the fit:
        :meth:`_check_trainable`) contributes a failure flag to the same all-reduce, so every rank raises at this
        step (that rank its own error, the others a ``RuntimeError`` pointing to it) instead of failing inside the
        collective with a transport error that names nothing. No noisy gradient is applied on any rank.
        """
        assert self._clipper is not None and self.expected_batch_size is not None
        failed: Exception | None = refused
        sums: list[torch.Tensor | None] = [None] * len(self._params)
        if failed is None:
            try:
                sums = (self._take_isolated_sums() if self.isolated
                        else list(self._clipper.clipped_sums(self._params, self.max_grad_norm)))
            except Exception as err:  # re-raised after the all-reduce, so that no rank is left waiting in it
                failed = err
        noisy, failures = all_reduce_noisy_sum(
            sums, self._params, self.noise_std, self.expected_batch_size, self.noise, failed=failed is not None
        )
        if isinstance(failed, NonFiniteGradientError):
            raise NonFiniteGradientError(
                f"rank {self._rank}: {self._describe_windows(trainer, failed.windows)}", failed.windows
            ) from failed
        if failed is not None:
            raise failed
        if failures:
            raise RuntimeError(
                f"noisy step {step}: {failures} other rank(s) could not clip their windows' gradients or refused the "
                "step (see their error, e.g. NonFiniteGradientError, or a ConfigurationError on requires_grad); no "
                "step is taken"
            )
        check_identical(noisy, step)
        return noisy

    def _describe_windows(self, trainer: L.Trainer, windows: list[int]) -> str:
        """Error message naming the series of the windows (from the batch's ``series_index``)."""
        index = self._batch.get("series_index") if isinstance(self._batch, dict) else None
        names: list[str] = []
        if isinstance(index, torch.Tensor) and index.numel() > max(windows):
            ids = getattr(getattr(trainer, "datamodule", None), "item_ids", None)
            for w in windows:
                n = int(index[w])
                names.append(repr(ids[n]) if ids is not None and n < len(ids) else f"#{n}")
        where = f"series {', '.join(dict.fromkeys(names))}" if names else "(the batch has no 'series_index')"
        return (
            f"the per-window gradient of window(s) {windows} of the batch, {where}, is not finite (or its squared "
            "norm overflows): clipping cannot bound its contribution, so no step is taken. Check those series' "
            "values and the model's numerical stability (e.g. the loss on unscaled data)"
        )

    # ------------------------------------------------------------------------------------------------
    # Window independence (PRIVACY-NOTES trap 8)
    # ------------------------------------------------------------------------------------------------
    def _check_window_independence(self, pl_module: L.LightningModule, batch: Any) -> None:
        """The probe: change window 0 of a synthetic batch shaped like ``batch``; no other window's per-window
        gradient (as the fast path attributes it) may move by more than the float tolerance.

        The probe batch (:func:`_synthetic_probe`) has ``batch``'s keys, trailing shapes and dtypes and its number
        of windows (at least Lambda), but synthetic values only: scales that differ between windows, observed masks
        with missing values (the masked values set to 0), integer features that repeat between pairs of windows.
        Its outcome depends on the model and the batch's structure, never on private values. It runs in float64
        where the module runs in it (tolerance ~1e-13 relative: a cross-window term of 1e-7 is found), else in the
        module's precision; with the repeating integers where the module accepts them (an embedding of
        cardinality 1 does not), else with zeros.

        A mix found before this fit's first noisy step switches ``per_window="auto"`` to the isolated mode (the
        probe's data are synthetic, so the switch does not depend on private data); otherwise it is a
        :class:`ConfigurationError` naming the window, the parameter and the size of the change.
        """
        assert self._clipper is not None and self._original_training_step is not None
        size = _num_windows(batch)
        if size is None:
            return
        # several processes: every rank probes Lambda windows at the same steps (begin seeds the choices alike), so
        # that all reach the same verdict at the same step and none is left waiting in the step's all-reduce
        # one process: the batch's own number of windows, at least Lambda (a Poisson batch may be smaller)
        size = max(size, int(self.expected_batch_size or 0), 2) if self._world_size == 1 else \
            max(int(self.expected_batch_size or 2), 2)
        found: tuple[float, float, int, str, str] | None = None
        last: Exception | None = None
        saved_grads = [p.grad for p in self._params]
        for p in self._params:
            p.grad = None
        for wide, varied in ((True, True), (True, False), (False, True), (False, False)):
            probe = _synthetic_probe(batch, size, varied=varied)
            try:
                with _float64(pl_module, probe, enabled=wide) as (probe, dtype):
                    compared = list(range(min(size, _PROBE_COMPARED)))
                    moved_batch = _perturb_first_window(_copy(probe), size)  # each pass its own copy: a
                    base = self._probe_gradients(pl_module, _copy(probe), compared)  # training_step may write
                    moved = self._probe_gradients(pl_module, moved_batch, compared)  # into its input
            except Exception as err:  # noqa: BLE001 - the next, more conservative variant
                last = err
                continue
            finally:
                for p, g in zip(self._params, saved_grads, strict=True):
                    p.grad = g
            if base is None or moved is None:
                return
            found = _largest_change(base, moved, dtype, self._param_names())
            how = f"{'float64' if dtype == torch.float64 else str(dtype).removeprefix('torch.')}, " + (
                "repeating integer features" if varied else "integer features 0")
            break
        else:
            assert last is not None
            if self.per_window == "auto" and self._fit_steps == 0:  # no evidence for the fast path: isolate
                self._isolate(pl_module, f"the probe could not run on a synthetic batch ({type(last).__name__}: "
                                         f"{last}), so independence is not established")
                return
            raise last
        if found is None:
            return
        change, tolerance, window, param, _ = found
        evidence = (
            f"on a synthetic probe batch of {size} windows ({how}), changing window 0 moved the per-window "
            f"gradient of window {window} by {change:.3g} in l2 norm (tolerance {tolerance:.3g}; most in parameter "
            f"{param!r})"
        )
        if self.per_window == "auto" and self._fit_steps == 0:
            earlier = (f" The model's privacy ledger already holds {self.ledger.steps} noisy steps of earlier fits: if "
                       "they used the fast path with this forward, the 2C bound did not hold for them and their "
                       "epsilon is not a guarantee." if self.ledger.steps else "")
            self._isolate(pl_module, f"{type(pl_module).__name__}'s forward mixes the windows of a batch: {evidence}."
                          + earlier)
            return
        raise ConfigurationError(
            "model", type(pl_module).__name__,
            f"forward mixes the windows of a batch: {evidence}. One window then changes the update by more than 2C "
            "and the privacy analysis does not apply (PRIVACY-NOTES trap 8); no update was made from this step. "
            f"{self._refusal_advice()}",
        )

    def _isolate(self, pl_module: L.LightningModule, reason: str) -> None:
        """``per_window="auto"`` before the fit's first noisy step: compute each window's gradient alone from now on."""
        assert self._clipper is not None
        self.isolated = True
        self._clipper.disable()
        rank_zero_warn(f"DPForecastStrategy: {reason} Each window's gradient is computed with that window alone for "
                       "this fit (per_window='isolated').")

    def _refusal_advice(self) -> str:
        done = (f" The {self._fit_steps} noisy step(s) this fit already took used the fast path: their privacy "
                "holds only if the forward kept windows apart on those batches." if self._fit_steps else "")
        return ("Remove batch statistics, batch-level scaling or cross-window operations from forward, or train with "
                "DPForecastStrategy(per_window='isolated'), which computes each window's gradient with that window "
                "alone." + done)

    def _param_names(self) -> list[str]:
        """The module's names of the trainable parameters, in gradient order."""
        assert self._clipper is not None
        return [self._clipper._names.get(id(p), f"#{k}") for k, p in enumerate(self._params)]

    def _probe_gradients(
        self, pl_module: L.LightningModule, batch: Any, windows: list[int]
    ) -> list[torch.Tensor] | None:
        """Per-window gradients ``[len(windows), *p.shape]`` (one per trainable parameter, zeros where none) of the
        module's training loss on ``batch``, as the fast path attributes them (no logging, no step)."""
        assert self._clipper is not None and self._original_training_step is not None
        devices = sorted({p.device.index or 0 for p in self._params if p.device.type == "cuda"})
        enabled = self._clipper.enabled
        try:
            with torch.random.fork_rng(devices=devices), torch.enable_grad(), warnings.catch_warnings(), \
                    silenced(pl_module):
                warnings.simplefilter("ignore")
                torch.manual_seed(0)  # the same dropout masks in both probe passes (synthetic data, no privacy draw)
                self._clear()
                self._clipper.enable()
                for p in self._params:
                    p.grad = None
                loss = training_loss(self._original_training_step(batch, *self._probe_args))
                if loss is None or not loss.requires_grad:
                    return None
                loss.backward()
                grads = self._clipper.per_window_gradients(self._params, windows)
                return [torch.zeros(len(windows), *p.shape, dtype=p.dtype, device=p.device) if g is None
                        else g.detach() for p, g in zip(self._params, grads, strict=True)]
        finally:
            self._clear()
            if not enabled:
                self._clipper.disable()
            for p in self._params:
                p.grad = None

    def _spot_check(self, pl_module: L.LightningModule) -> None:
        """One window, drawn at random, recomputed alone: its clipped gradient must equal the batched one.

        Runs before the step's noisy gradient is formed, so a refusal leaves no update from this step. Skipped for
        a ``training_step`` whose result on one window is random (checked once per fit: two calls differ).
        """
        assert self._clipper is not None
        batch, self._spot_batch = self._spot_batch, None
        size = _num_windows(batch)
        if not size or self._stochastic is True:
            return
        iso = self._isolated_gradients(pl_module)
        j = self._choices.randrange(size)
        devices = sorted({p.device.index or 0 for p in self._params if p.device.type == "cuda"})
        with torch.random.fork_rng(devices=devices):  # torch's random stream (dropout) is as without the check
            alone = iso.gradient(batch, j)
        if self._stochastic is None:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(self._choices.randrange(1 << 62))
                again = iso.gradient(batch, j)
            self._stochastic = any(not torch.equal(a, b) for a, b in zip(alone, again, strict=True))
            if self._stochastic:
                rank_zero_info(
                    f"DPForecastStrategy: {type(pl_module).__name__}'s training_step is random on one window (e.g. "
                    "dropout): the per-step spot check cannot compare windows and is off for this fit; the probe "
                    "(fixed random draws) still runs"
                )
                return
        recorded = self._clipper.per_window_gradients(self._params, [j])
        missing = [k for k, g in enumerate(recorded) if g is None]
        if missing and bool(torch.stack([alone[k].abs().sum() for k in missing]).ne(0).any()):
            return  # a parameter used outside the hooked layers: the clipping refuses it, naming the parameter
        flat_alone = torch.cat([g.reshape(-1) for g in alone])
        flat_batched = torch.cat([torch.zeros_like(a).reshape(-1) if g is None else g.reshape(-1)
                                  for a, g in zip(alone, recorded, strict=True)])
        both = torch.stack([flat_alone, flat_batched])
        factors = clip_factors(_row_sq(both).double(), self.max_grad_norm).to(both.dtype)
        if not bool(torch.isfinite(factors).all()) or not bool(torch.isfinite(both).all()):
            return  # the clipping refuses the step (NonFiniteGradientError, naming the window's series)
        clipped = both * factors[:, None]
        scale = float(torch.linalg.vector_norm(clipped, dim=1).max())
        if float(torch.linalg.vector_norm(clipped[0] - clipped[1])) <= _tolerance(both.dtype, both.shape[1], scale):
            return
        for k in (float(size), 1.0 / size):  # the batched one is k times the window's own: a loss_reduction slip
            scaled = both[0] * k
            tolerance = _tolerance(both.dtype, both.shape[1], float(torch.linalg.vector_norm(scaled)))
            if size > 1 and float(torch.linalg.vector_norm(both[1] - scaled)) <= tolerance:
                if not self._warned_reduction:
                    self._warned_reduction = True
                    rank_zero_warn(
                        f"DPForecastStrategy: the per-window gradients of {type(pl_module).__name__} on the fast path "
                        f"are {k:g} times the gradient of training_step on one window alone: loss_reduction="
                        f"{self.loss_reduction!r} does not seem to match how training_step reduces its loss over the "
                        "windows. Each window is still clipped on its own (no window mixes into another), but to a "
                        "scaled gradient; pass the loss_reduction that matches"
                    )
                return
        c_alone, c_batched = float(factors[0]), float(factors[1])
        found = _largest_change([(g * c_batched).unsqueeze(0) if g is not None else torch.zeros_like(a).unsqueeze(0)
                                 for a, g in zip(alone, recorded, strict=True)],
                                [(a * c_alone).unsqueeze(0) for a in alone], both.dtype, self._param_names())
        if found is None:
            return
        change, tolerance, _, param, _ = found
        raise ConfigurationError(
            "model", type(pl_module).__name__,
            f"forward mixes the windows of a batch: spot check at noisy step {self.ledger.steps + 1} (this fit's step "
            f"{self._fit_steps + 1}): window {j}'s clipped gradient computed with the whole batch of {size} windows "
            f"differs from the one computed with window {j} alone by {change:.3g} in l2 norm (C = "
            f"{self.max_grad_norm:g}, tolerance {tolerance:.3g}; most in parameter {param!r}). The step is refused "
            f"before its update (PRIVACY-NOTES trap 8). {self._refusal_advice()}",
        )

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._buffer_guard is not None:  # exact, also for writes that bypass version counters (buf.data)
            self._buffer_guard.check()

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
        """Remove the Opacus hooks and per-sample state, and put the original layers back (idempotent)."""
        self._clear()
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
        self._use_params([])
        self._isolated = None
        self._isolated_sums = None
        self.background_noise = None

    def _clear(self) -> None:
        """Drop per-window state left from a previous step (also after a forward pass without backward)."""
        if self._clipper is not None:
            self._clipper.clear(self._params)

    # ------------------------------------------------------------------------------------------------
    # Checkpointing
    # ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Sigma, C and the privacy ledger (with the noise kind and bands) - never a seed, a generator state or a
        BandMF band (nothing that reproduces noise).

        A seeded run adds ``"seeded": True`` and :data:`~lightning_dpts.randomness.SEEDED_NOTICE`.
        """
        state: dict[str, Any] = {
            "noise_multiplier": self._noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "ledger": self.ledger.to_dict(),
            "seeded": self.ledger.seeded or self.seeded,
        }
        if state["seeded"]:
            state["seeded_notice"] = SEEDED_NOTICE
        return state

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Also write the ledger at the top level of the checkpoint (read by ``load_from_checkpoint``)."""
        checkpoint[LEDGER_KEY] = self.ledger.to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the checkpoint's ledger; the noise of the resumed fit comes from fresh entropy (no replay).

        Checkpoints of older versions (``steps`` and ``generator_state``) are accepted: their step count is
        kept, their generator state is ignored.
        """
        for key, mine in (("noise_multiplier", self._noise_multiplier), ("max_grad_norm", self.max_grad_norm)):
            saved = state_dict.get(key)
            if saved is not None and mine is not None and not math.isclose(saved, mine, rel_tol=1e-9):
                raise ConfigurationError(
                    key, mine, f"the checkpoint was trained with {key}={saved}; resume with the same value"
                )
        if isinstance(state_dict.get("ledger"), dict):
            self._restored = PrivacyLedger.from_dict(state_dict["ledger"])
        else:  # before the ledger: steps only; epochs derived when the fit starts
            self._restored = PrivacyLedger(
                steps=int(state_dict.get("steps", 0)), epochs=-1,
                noise_multiplier=state_dict.get("noise_multiplier"), max_grad_norm=state_dict.get("max_grad_norm"),
            )
        self._begun = False


def _spare_core() -> bool:
    """Whether this process may use more CPUs than torch's intra-op threads (a core for the noise thread)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return usable > torch.get_num_threads()


def _has_accountant(trainer: L.Trainer) -> bool:
    return any(isinstance(cb, StepAccountant) for cb in trainer.callbacks)


def _leading_sizes(batch: Any) -> list[int]:
    from lightning.fabric.utilities.apply_func import apply_to_collection

    sizes: list[int] = []
    apply_to_collection(batch, torch.Tensor, lambda t: sizes.append(int(t.shape[0])) if t.dim() else None)
    return sizes


def _num_windows(batch: Any) -> int | None:
    """Windows in a batch (the leading dimension of its tensors), ``None`` when it has no tensor."""
    sizes = _leading_sizes(batch)
    return max(sizes) if sizes else None


def _synthetic_probe(batch: Any, size: int, *, varied: bool = True) -> Any:
    """A batch of ``size`` synthetic windows with the structure of ``batch`` (keys, trailing shapes, dtypes).

    No private value enters it. Real values: uniform in [1, 2) times a scale that differs between windows (1, 2,
    0.5, ...). Observed masks (keys with ``observed`` or ``mask``): 1, except that every third window (1, 4, ...)
    misses the second half of its time axis and the windows 2, 5, ... every third step; the values of the key the
    mask belongs to (``past_target`` for ``past_observed_values``) are 0 where missing, as in the datamodule's
    batches. Integers (categorical and static features, ``series_index``): ``(i // 2) % 2`` for window i with
    ``varied`` (windows 0 and 1 share a value, 2 and 3 another, ...), else 0.
    """
    batch_size = _num_windows(batch)
    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([(1.0, 2.0, 0.5)[i % 3] for i in range(size)], dtype=torch.float64)

    def missing(shape: tuple[int, ...]) -> torch.Tensor:
        """Observed mask (float64): 1, with the missing pattern above along axis 1."""
        mask = torch.ones(shape, dtype=torch.float64)
        if len(shape) >= 2 and shape[1] > 1:
            for i in range(1, size, 3):
                mask[i, shape[1] // 2 :] = 0
            for i in range(2, size, 3):
                mask[i, ::3] = 0
        return mask

    def make(t: torch.Tensor, key: str = "") -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != batch_size:
            return t
        shape = (size, *t.shape[1:])
        if not t.is_floating_point():
            if not varied or t.dtype == torch.bool:
                return torch.zeros(shape, dtype=t.dtype, device=t.device)
            values = (torch.arange(size) // 2) % 2
            return values.reshape(size, *[1] * (len(shape) - 1)).expand(shape).to(t.dtype).to(t.device).clone()
        if _is_mask(key):
            return missing(shape).to(t.dtype).to(t.device)
        values = (1.0 + torch.rand(shape, generator=generator, dtype=torch.float64))
        values = values * scales.reshape(size, *[1] * (len(shape) - 1))
        return values.to(t.dtype).to(t.device)

    if not isinstance(batch, dict):
        from lightning.fabric.utilities.apply_func import apply_to_collection

        return apply_to_collection(batch, torch.Tensor, make)
    probe = {k: make(v, k) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    for key, mask in list(probe.items()):  # missing values are 0 in the values the mask belongs to
        target = _masked_key(key, probe)
        if target is not None and isinstance(mask, torch.Tensor) and mask.shape == probe[target].shape:
            probe[target] = probe[target] * (mask != 0).to(probe[target].dtype)
    return probe


def _is_mask(key: str) -> bool:
    return "observed" in key or "mask" in key


def _masked_key(key: str, batch: dict[str, Any]) -> str | None:
    """The key of the values an observed mask belongs to (``past_observed_values`` -> ``past_target``)."""
    if not _is_mask(key):
        return None
    for candidate in (key.replace("observed_values", "target"), key.replace("_observed", ""),
                      key.replace("_mask", ""), key.replace("mask", "target")):
        if candidate != key and candidate in batch and isinstance(batch[candidate], torch.Tensor) \
                and batch[candidate].is_floating_point():
            return candidate
    return None


def _copy(batch: Any) -> Any:
    """``batch`` with every tensor cloned (other values shared)."""
    from lightning.fabric.utilities.apply_func import apply_to_collection

    return apply_to_collection(batch, torch.Tensor, lambda t: t.clone())


def _perturb_first_window(batch: Any, size: int) -> Any:
    """A copy of a probe batch with window 0's real values changed (masks and integers kept)."""

    def change(t: torch.Tensor, key: str = "") -> torch.Tensor:
        if t.dim() == 0 or t.shape[0] != size or not t.is_floating_point() or _is_mask(key):
            return t
        out = t.clone()
        out[0] = out[0] * 3.0 + 0.5
        return out

    if isinstance(batch, dict):
        return {k: change(v, k) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    from lightning.fabric.utilities.apply_func import apply_to_collection

    return apply_to_collection(batch, torch.Tensor, change)


@contextlib.contextmanager
def _float64(module: nn.Module, batch: Any, *, enabled: bool) -> Iterator[tuple[Any, torch.dtype]]:
    """Run ``module`` in float64 inside (``enabled``): its floating parameters and buffers, the floating tensors
    of ``batch`` and torch's default dtype; yields (the batch, the dtype). Every tensor gets its own storage back
    afterwards (nothing is rounded). Not thread-safe: the default dtype is process-wide."""
    params = [p for p in module.parameters() if p.is_floating_point()]
    dtype = params[0].dtype if params else torch.float32
    if not enabled or dtype == torch.float64:
        yield batch, dtype
        return
    from lightning.fabric.utilities.apply_func import apply_to_collection

    saved = [(t, t.data) for t in [*params, *module.buffers()] if t.is_floating_point()]
    default = torch.get_default_dtype()
    try:
        for t, data in saved:
            t.data = data.double()
        torch.set_default_dtype(torch.float64)
        yield apply_to_collection(batch, torch.Tensor, lambda t: t.double() if t.is_floating_point() else t), \
            torch.float64
    finally:
        torch.set_default_dtype(default)
        for t, data in saved:
            t.data = data


def _tolerance(dtype: torch.dtype, numel: int, scale: float) -> float:
    """c * eps(dtype) * sqrt(#params) * (gradient norm scale), c = :data:`_TOLERANCE_FACTOR`: the rounding error
    that one per-window gradient's computation may carry (a reduction's error grows with eps times the size of its
    terms), never reached by a change that is a fixed fraction of the gradient."""
    return _TOLERANCE_FACTOR * torch.finfo(dtype).eps * math.sqrt(max(numel, 1)) * max(scale, 1e-300)


def _largest_change(
    base: list[torch.Tensor], moved: list[torch.Tensor], dtype: torch.dtype, names: list[str]
) -> tuple[float, float, int, str, str] | None:
    """The largest change of a per-window gradient beyond the float tolerance, or ``None``.

    ``base`` and ``moved``: one ``[W, *p.shape]`` tensor per parameter, window 0 first (the probe's changed
    window, not compared when W > 1), tolerance :func:`_tolerance` with the largest per-window gradient norm of
    either. Returns (change, tolerance, window, parameter with the largest change, dtype).
    """
    w = base[0].shape[0]
    diff = torch.zeros(w, dtype=torch.float64)
    norms = torch.zeros(2, w, dtype=torch.float64)
    per_param = []
    for a, b in zip(base, moved, strict=True):
        a64, b64 = a.reshape(w, -1).double().cpu(), b.reshape(w, -1).double().cpu()
        per_param.append((a64 - b64).square().sum(1))
        diff += per_param[-1]
        norms[0] += a64.square().sum(1)
        norms[1] += b64.square().sum(1)
    tolerance = _tolerance(dtype, sum(a[0].numel() for a in base), float(norms.max().sqrt()))
    compared = diff[1:] if w > 1 else diff
    offset = 1 if w > 1 else 0
    if compared.numel() == 0 or float(compared.max().sqrt()) <= tolerance:
        return None
    window = int(compared.argmax()) + offset
    param = int(torch.stack([d[window] for d in per_param]).argmax())
    return float(diff[window].sqrt()), tolerance, window, names[param], str(dtype)


def _spec_or_none(trainer: L.Trainer) -> SamplingSpec | None:
    dm = getattr(trainer, "datamodule", None)
    spec = getattr(dm, "sampling_spec", None) if dm is not None else None
    if spec is not None and not isinstance(spec, SamplingSpec):
        raise ConfigurationError("datamodule.sampling_spec", type(spec).__name__, "must be a SamplingSpec")
    return spec


def _check_trainer(trainer: L.Trainer) -> None:
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

    for cb in trainer.callbacks:
        if isinstance(cb, (LearningRateFinder, BatchSizeFinder)):
            raise ConfigurationError(
                "callbacks", type(cb).__name__,
                "must not be used with DPForecastStrategy (Tuner.lr_find / Tuner.scale_batch_size add it): its "
                "trial steps run with every other callback removed, so they train on the private data without "
                "per-window clipping or noise and are not accounted, and it then restores a checkpoint that "
                "rewinds the privacy ledger; the learning rate it suggests is chosen from those noiseless "
                "training losses (PRIVACY-NOTES trap 5). Tune on public or synthetic data without "
                "DPForecastStrategy, then pass the values to the DP fit",
            )
    if trainer.gradient_clip_val not in (None, 0, 0.0):
        raise ConfigurationError(
            "gradient_clip_val", trainer.gradient_clip_val,
            "must be None: DPForecastStrategy clips each window's gradient to max_grad_norm; clipping the "
            "noisy average again is not what Algorithm 2 does",
        )
    if trainer.accumulate_grad_batches != 1:
        raise ConfigurationError(
            "accumulate_grad_batches", trainer.accumulate_grad_batches,
            "must be 1: raise the datamodule's batch_size instead (noise is added once per optimizer step and "
            "the accountant counts optimizer steps of one sampled batch)",
        )
    if str(trainer.precision) not in ("32-true", "64-true", "32", "64"):
        raise ConfigurationError(
            "precision", trainer.precision, "must be '32-true' or '64-true' (loss scaling interferes with clipping)"
        )


def _check_same_on_all_ranks(trainer: L.Trainer, ledger: dict[str, Any]) -> None:
    """Refuse a fit whose ranks start from different privacy ledgers (every rank reaches the same verdict)."""
    reference = trainer.strategy.broadcast(ledger, src=0)
    if not trainer.strategy.reduce_boolean_decision(reference == ledger, all=True):
        raise ConfigurationError(
            "ledger", ledger,
            f"the ranks start from different privacy ledgers (rank 0: {reference}); every rank must continue the "
            "same model (the same checkpoint, or the same weights with the same attached ledger)",
        )

"""The per-step clip-and-noise of :class:`~lightning_dpts.training.DPForecastStrategy` (Algorithm 2's aggregation).

    g~ = ( sum_i g_i / max(1, ||g_i||_2 / C)  +  N(0, sigma^2 C^2 I) ) / Lambda

* :func:`clip_and_noise`: the aggregation on given per-window gradients;
* :class:`NoisyStep` (an object the strategy owns): which per-window gradients a step uses (the fast path's clipped sums
  from :class:`~lightning_dpts.training.engine.PerWindowClipper`, or the isolated ones of
  :mod:`~lightning_dpts.training.isolated` taken in the wrapped ``training_step``), the step's one noise source
  (:meth:`NoisyStep.make_noise`: the one :class:`~lightning_dpts.randomness.GaussianNoise` or BandMF source of the
  fit, from fresh entropy; :mod:`lightning_dpts.randomness` owns every secret draw), when its draw is made
  (:meth:`NoisyStep.prepare_noise`: in a background thread when a core is spare, else at the optimizer step), and
  on several processes the one all-reduce to which rank 0 alone adds the noise (:meth:`NoisyStep._distributed_step`).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

from lightning_dpts.distributed import all_reduce_noisy_sum, check_identical
from lightning_dpts.privacy.mechanisms import NoiseSpec
from lightning_dpts.randomness import Entropy, GaussianNoise
from lightning_dpts.training.correlated_noise import make_noise
from lightning_dpts.training.engine import (
    NoiseSource,
    NonFiniteGradientError,
    add_noise_and_average,
    clip_factors,
)
from lightning_dpts.training.fit_context import FitContext
from lightning_dpts.training.isolated import IsolatedGradients, training_loss
from lightning_dpts.training.probe_batches import num_windows

__all__ = ["NoisyStep", "clip_and_noise"]


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



#: the smallest noise vector (coordinates) drawn in the background thread on CPU: a smaller draw (about 0.1 ms) gains
#: less than the thread hand-off's GIL switches cost the training thread (issue 44; DeepAR, 23,324 coordinates, draws
#: in place). Larger ones gain: SimpleFeedForward (106,243) at Lambda = 64 / 256, load 0.9, 1.52 / 1.30x the plain
#: fit drawn in the background against 1.64 / 1.34x in place; DLinear (298,179) at 256, load 0.3-0.8, 1.19 / 1.25x
BACKGROUND_MIN_NUMEL = 1 << 16


def _spare_core() -> bool:
    """Whether this process may use more CPUs than torch's intra-op threads (a core for the noise thread)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return usable > torch.get_num_threads()



class NoisyStep:
    """The per-step clip-and-noise, owned by :class:`~lightning_dpts.training.DPForecastStrategy`.

    Its own state: the fit's one noise source (:attr:`noise`) and whether its draws run in a background thread
    (:attr:`background_noise`), the wrapped ``training_step`` (:meth:`wrap_training_step`; :attr:`batch_used` says
    whether the current batch reached it), the isolated per-window gradients (:meth:`isolated_gradients`) and this
    step's clipped sums from them. The shared facts (parameters, hooks, Lambda, C, ranks) come from the
    :class:`~lightning_dpts.training.fit_context.FitContext`.
    """

    def __init__(self, context: FitContext, noise_spec: NoiseSpec, coefficients: tuple[float, ...] | None,
                 secure_mode: bool) -> None:
        self.context = context
        self.noise_spec = noise_spec
        self.coefficients = coefficients
        self.secure_mode = secure_mode
        self.noise: NoiseSource | None = None
        #: whether each step's noise is drawn in a background thread (decided at the first step, see
        #: :meth:`prepare_noise`); ``None`` until then
        self.background_noise: bool | None = None
        #: whether the isolated per-window gradients were computed by ``vmap`` (``False``: one pass per window;
        #: ``None``: not computed yet)
        self.vectorised: bool | None = None
        self.isolated_sums: list[torch.Tensor] | None = None  # this step's clipped sums from each window alone
        self.batch_used = False  # whether the current batch reached the (wrapped) training_step
        self.original_training_step: Callable[..., Any] | None = None
        self.probe_args: tuple[int, ...] = ()  # the arguments after the batch a probe pass gives training_step
        self._isolated: IsolatedGradients | None = None

    def make_noise(self, entropy: Entropy, steps: int) -> NoiseSource:
        """The one object that draws this fit's DP noise (``sample(numel, std, dtype)``, one flat vector for all
        parameters per optimizer step).

        ``noise="gaussian"``: i.i.d. Gaussian noise (DP-SGD). The stream key includes the ledger's step count
        ``steps``, so that even a seeded run continued from its latest checkpoint does not reuse noise (a seeded run
        resumed from an *older* checkpoint does: seeds are for experiments only). Unseeded, ``entropy`` is fresh at
        every fit, so nothing is ever replayed. Each step's vector is drawn in a background thread while the step's
        forward/backward runs (:meth:`prepare_noise`: the same sequence of draws, each handed out once).
        ``noise="bandmf"``: row i of C^{-1}Z at step i
        (:class:`~lightning_dpts.training.correlated_noise.BandMFNoise` via ``make_noise``, Section 2.3 of
        Dong & Ganesh 2026); its band state is secret, never stored, and a BandMF run is never continued.
        """
        if self.noise_spec.correlated:
            return make_noise(self.noise_spec, entropy, secure=self.secure_mode, coefficients=self.coefficients)
        return GaussianNoise(entropy, secure=self.secure_mode, stream=(7, steps))

    def wrap_training_step(self, pl_module: L.LightningModule) -> None:
        """A batch without windows (Poisson sampling) skips the model: ``None`` loss, then the noise-only step."""
        from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

        original = pl_module.training_step
        self.original_training_step = original
        self.probe_args = (0,) if is_param_in_hook_signature(original, "batch_idx", min_args=2) else ()
        ctx = self.context

        @functools.wraps(original)
        def training_step(batch: Any, *args: Any, **kwargs: Any) -> Any:
            self.batch_used = True
            if num_windows(batch) == 0:
                if ctx.world_size > 1:  # Lightning refuses a skipped step under DDP; a zero loss touches no
                    return ctx.params[0].new_zeros(()).requires_grad_()  # parameter: this rank adds zero
                return None
            if ctx.isolated:
                return self._isolated_step(pl_module, original, batch, *args, **kwargs)
            return original(batch, *args, **kwargs)

        pl_module.training_step = training_step  # type: ignore[method-assign]

    def unwrap_training_step(self, pl_module: L.LightningModule) -> None:
        """Put the module's own ``training_step`` back (idempotent)."""
        if self.original_training_step is not None:
            if "training_step" in vars(pl_module):
                del pl_module.training_step
            self.original_training_step = None

    def close(self) -> None:
        """End the noise's background thread, if any (idempotent)."""
        close = getattr(self.noise, "close", None)
        if close is not None:
            close()

    def isolated_gradients(self, pl_module: L.LightningModule) -> IsolatedGradients:
        """The isolated per-window gradients of this module and its trainable parameters (built on first use)."""
        assert self.original_training_step is not None
        ctx, iso = self.context, self._isolated
        if iso is None or iso.params is not ctx.params or iso.module is not pl_module:
            iso = IsolatedGradients(pl_module, self.original_training_step, self.probe_args, ctx.params, ctx.clipper)
            self._isolated = iso
        return iso

    def forget_isolated(self) -> None:
        """Drop the isolated-gradient machinery and any clipped sums (at the end of a fit)."""
        self._isolated = None
        self.isolated_sums = None

    def recompute(self, trainer: L.Trainer, iso: IsolatedGradients, batch: Any) -> None:
        """This step's clipped sums from each window alone (the batch as it arrived), used for its update."""
        try:
            self.isolated_sums = iso.clipped_sums(batch, self.context.max_grad_norm)
        except NonFiniteGradientError as err:
            raise NonFiniteGradientError(self.context.describe_windows(trainer, err.windows), err.windows) from err

    def _isolated_step(
        self, module: L.LightningModule, original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """``per_window="isolated"``: the clipped sum of the windows' gradients, each from ``training_step`` on
        that window alone (kept for the optimizer step); then ``training_step`` once on the whole batch without
        gradient, for its logging and return value, whose loss is handed to Lightning as a leaf (its backward
        touches no parameter)."""
        iso = self.isolated_gradients(module)
        iso.step_args = args  # the step's own batch_idx (positional, as Lightning passes it)
        self.recompute(module.trainer, iso, batch)
        self.vectorised = iso.vectorised
        clipper = self.context.clipper
        with torch.no_grad(), (clipper.bypassed() if clipper is not None else contextlib.nullcontext()):
            out = original(batch, *args, **kwargs)
        loss = training_loss(out)
        if loss is None:
            return out
        leaf = loss.detach().clone().requires_grad_()
        return {**out, "loss": leaf} if isinstance(out, dict) else leaf

    def prepare_noise(self) -> None:
        """Start this step's noise draw in the background (:meth:`GaussianNoise.prepare`) now that the previous
        step's noisy gradients are released: the draw overlaps the forward and backward pass, and only one noise
        vector (the size of the gradients) is alive at a time. The vector is the one the step's
        ``noise.sample`` call would draw anyway (same stream, same order, handed out once).

        Only when the background thread has a core to itself (:attr:`background_noise`, decided at the first
        step): the model trains on an accelerator, or the process may use more CPUs than torch's intra-op
        threads and the vector has at least :data:`BACKGROUND_MIN_NUMEL` coordinates. Otherwise the draw is made at
        the optimizer step: a background draw would pre-empt one of the
        intra-op threads, and every parallel operation waits for its slowest thread (measured with two threads
        on two cores: SimpleFeedForward at Lambda = 1024, 1.22x the non-DP step against 1.03x drawing in place).
        """
        ctx = self.context
        prepare = getattr(self.noise, "prepare", None)
        if prepare is None or ctx.expected_batch_size is None or not ctx.params:
            return
        if self.background_noise is None:
            self.background_noise = ctx.params[0].device.type != "cpu" or (
                ctx.noise_numel >= BACKGROUND_MIN_NUMEL and _spare_core())
        if not self.background_noise:
            return
        std = ctx.noise_std if ctx.world_size > 1 else ctx.noise_std / ctx.expected_batch_size
        prepare(ctx.noise_numel, std, ctx.params[0].dtype)

    def noisy_gradients(self, trainer: L.Trainer, step: int, refused: Exception | None) -> list[torch.Tensor]:
        """Algorithm 2's noisy averaged gradient of this step, one per trainable parameter: from the isolated
        per-window gradients or the fast path's clipped sums, with this process's noise draw, or on several
        processes by :meth:`_distributed_step` (``refused``: this rank's refusal, raised after the all-reduce)."""
        ctx = self.context
        assert ctx.expected_batch_size is not None and ctx.clipper is not None
        if ctx.world_size > 1:
            return self._distributed_step(trainer, step, refused)
        assert self.noise is not None
        try:
            if ctx.isolated or self.isolated_sums is not None:  # (a spot check recomputed this step alone)
                return add_noise_and_average(self._take_isolated_sums(), ctx.params, ctx.noise_std,
                                             ctx.expected_batch_size, self.noise)
            return ctx.clipper.noisy_gradients(
                ctx.params, ctx.max_grad_norm, ctx.noise_std, ctx.expected_batch_size, self.noise
            )
        except NonFiniteGradientError as err:
            raise NonFiniteGradientError(ctx.describe_windows(trainer, err.windows), err.windows) from err

    def _take_isolated_sums(self) -> list[torch.Tensor | None]:
        """This step's clipped sums from the isolated per-window gradients (zeros: the batch had no windows)."""
        sums, self.isolated_sums = self.isolated_sums, None
        if sums is None:
            return [None] * len(self.context.params)
        return list(sums)

    def _distributed_step(
        self, trainer: L.Trainer, step: int, refused: Exception | None = None
    ) -> list[torch.Tensor]:
        """Algorithm 2 on the global batch: local clipped sums, one all-reduce with rank 0's one noise draw.

        A rank that cannot clip (a non-finite per-window gradient, a parameter without per-window gradients) or
        whose step was ``refused`` before clipping (its trainable parameters changed during the fit:
        :func:`~lightning_dpts.training.guards.check_trainable`) contributes a failure flag to the same all-reduce,
        so every rank raises at this step (that rank its own error, the others a ``RuntimeError`` pointing to it)
        instead of failing inside the collective with a transport error that names nothing. No noisy gradient is
        applied on any rank.
        """
        ctx = self.context
        assert ctx.clipper is not None and ctx.expected_batch_size is not None
        failed: Exception | None = refused
        sums: list[torch.Tensor | None] = [None] * len(ctx.params)
        if failed is None:
            try:
                sums = (self._take_isolated_sums() if ctx.isolated or self.isolated_sums is not None
                        else list(ctx.clipper.clipped_sums(ctx.params, ctx.max_grad_norm)))
            except Exception as err:  # re-raised after the all-reduce, so that no rank is left waiting in it
                failed = err
        noisy, failures = all_reduce_noisy_sum(
            sums, ctx.params, ctx.noise_std, ctx.expected_batch_size, self.noise, failed=failed is not None
        )
        if isinstance(failed, NonFiniteGradientError):
            raise NonFiniteGradientError(
                f"rank {ctx.rank}: {ctx.describe_windows(trainer, failed.windows)}", failed.windows
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

"""The independence checks of the fast path (docs/privacy.md, rule 8): the probe and the per-step spot check.

On ``per_window="fast"``/``"auto"`` a window's gradient comes from one pass over the whole batch, which is that
window's own gradient only if ``training_step`` keeps windows apart. Two objects that
:class:`~lightning_dpts.training.DPForecastStrategy` owns gather the evidence before the step's update:

* the probe (:meth:`WindowProbe.check`): on a synthetic batch shaped like the real one
  (:mod:`~lightning_dpts.training.probe_batches`; at most 16 windows, in float64 where the module runs in it, and
  at the fit's first probe also the real batch's size), change window 0 and require every other window's gradient
  to stay within the float tolerance, compared as the two passes recorded them; at the fit's first step and at one
  random step in each of [2, 4), [4, 8), ... (:meth:`WindowProbe.probe_after`);
* the spot check (:meth:`SpotCheck.check`): one window drawn at random, recomputed alone
  (:mod:`~lightning_dpts.training.isolated`), must have the clipped gradient the batched pass attributes to it; a
  gap beyond the float tolerance is re-examined in float64 (:meth:`SpotCheck._reexamine`) and refused only
  if it is a mix there too, else the step is computed from each window alone.

A mix found before the fit's first noisy step with ``per_window="auto"`` switches the fit to isolated per-window
gradients (:meth:`WindowProbe._isolate`); otherwise it is a :class:`~lightning_dpts.errors.ConfigurationError`.
The draws of which steps and windows are checked (``WindowProbe.schedule``, ``SpotCheck.choices``) are not privacy
draws.
"""

from __future__ import annotations

import functools
import random
import time
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training.engine import PassRecords, _row_sq, clip_factors
from lightning_dpts.training.fit_context import FitContext
from lightning_dpts.training.isolated import IsolatedGradients, silenced, training_loss
from lightning_dpts.training.noisy_step import NoisyStep
from lightning_dpts.training.probe_batches import (
    PROBE_WINDOWS,
    copy_batch,
    in_float64,
    largest_change,
    largest_window_change,
    num_windows,
    perturb_first_window,
    synthetic_probe,
    window_tolerance,
)

__all__ = ["SpotCheck", "WindowProbe"]


#: What :meth:`WindowProbe._compare` returns when ``training_step`` gives no loss to differentiate.
_NO_LOSS = object()
#: Reruns of one window under fresh seeds that decide whether ``training_step`` is random on one window.
STOCHASTIC_RERUNS = 4
#: Slack between the float64 round-off that a window's measured float32 round-off predicts (times eps64 / eps32 =
#: 2^-29) and the float64 gap the spot check's re-examination accepts as round-off (:meth:`SpotCheck.
#: _reexamine`): rounding errors of one computation in two precisions are not exactly proportional.
ROUND_OFF_MARGIN = 1024.0


def _distance(first: list[torch.Tensor], second: list[torch.Tensor], a: float, b: float) -> float:
    """||a * first - b * second|| over all parameters, one parameter's temporary at a time (l2, as a float)."""
    parts = [torch.linalg.vector_norm(torch.sub(x * a, y, alpha=b)) for x, y in zip(first, second, strict=True)]
    return float(torch.linalg.vector_norm(torch.stack(parts).double()))


def _seed_forked(devices: list, seed: int) -> None:
    """Seed the generators that ``torch.random.fork_rng(devices=devices)`` forked: the CPU generator alone when the
    module is on no accelerator. ``torch.manual_seed`` would also seed every accelerator type it lazily seeds,
    outside the fork, and format a stack trace per call for each (about 2 ms)."""
    if devices:
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


class WindowProbe:
    """The probe, owned by :class:`~lightning_dpts.training.DPForecastStrategy`: its schedule (:meth:`probe_after`,
    from :attr:`schedule`, not a privacy draw), its record in this fit (:attr:`probes`, :attr:`seconds`,
    :attr:`variant`) and :meth:`check`. Reads the fit's facts from the
    :class:`~lightning_dpts.training.fit_context.FitContext` and runs passes of the module's own ``training_step``
    through the strategy's :class:`~lightning_dpts.training.noisy_step.NoisyStep`."""

    def __init__(self, context: FitContext, step: NoisyStep) -> None:
        self.context = context
        self.step = step
        self.schedule = random.Random()  # the probe's steps (not a privacy draw)
        self.next: int | None = None  # the fit's step (1-based) at which the probe runs next
        self.probes = 0  # probes run in this fit
        self.seconds = 0.0  # wall time the probes of this fit took (s)
        self.variant: tuple[bool, bool] | None = None  # (float64, repeating integers): the variant that ran

    def begin(self, enabled: bool) -> None:
        """A new fit: the first probe at its first step (``enabled``), nothing run yet. On several processes the
        same probe steps on every rank (which steps are checked is not private)."""
        self.next = 1 if enabled else None
        self.probes, self.seconds, self.variant = 0, 0.0, None
        if self.context.world_size > 1:
            self.schedule = random.Random(25)

    def due(self, pl_module: L.LightningModule, batch: Any) -> None:
        """Before a step's forward pass: run the probe if this step is scheduled for one."""
        ctx = self.context
        if not ctx.isolated and self.next is not None and ctx.fit_steps + 1 >= self.next:
            self.next = self.probe_after(ctx.fit_steps + 1)  # (after the last step's gradients are gone: the
            self.check(pl_module, batch)  # probe's peak memory does not hold them)

    def probe_after(self, step: int) -> int:
        """The fit's next probe step after ``step``: uniform in the next interval [2^k, 2^(k+1)) beyond it. A fit of
        T steps probes at most 1 + floor(log2 T) times (exactly for T = 2^k - 1; 8 times in 255 steps, 10 in
        1,023)."""
        k = step.bit_length()
        return self.schedule.randrange(1 << k, 1 << (k + 1))

    def check(self, pl_module: L.LightningModule, batch: Any) -> None:
        """The probe: change window 0 of a synthetic batch shaped like ``batch``; no other window's per-window
        gradient (as the fast path attributes it) may move by more than the float tolerance.

        The probe batch (:func:`synthetic_probe`) has ``batch``'s keys, trailing shapes and dtypes, but synthetic
        values only: scales that differ between windows, observed masks with missing values (the masked values set
        to 0), integer features that repeat between pairs of windows. Its outcome depends on the model and the
        batch's structure, never on private values. Two passes (window 0 as drawn, then changed) are compared by
        :func:`largest_window_change`, record by record and window by window (no per-window gradient is
        materialised for all windows, nothing is copied to float64 that the pass did not compute in it):

        * every probe: a batch of ``min(n, PROBE_WINDOWS)`` windows (n: the real batch's windows, at least
          Lambda) in float64 where the module runs in it (tolerance ~1e-13 relative: a cross-window term of 1e-7
          is found), else in the module's precision; with the repeating integers where the module accepts them
          (an embedding of cardinality 1 does not), else with zeros;
        * the fit's first probe, when n > ``PROBE_WINDOWS``, also a batch of n windows in the module's precision
          (windows 0 to ``PROBE_WINDOWS - 1`` compared): a forward that mixes windows only in larger batches is
          found before the first noisy step too. Only the compared windows' records of its first pass are kept
          while the second runs, so its peak memory is that of one forward/backward pass of the real batch.

        Cost (measured, docs/benchmarks.md): two forward/backward passes of at most ``PROBE_WINDOWS`` windows, plus
        two of the real batch's size at the first probe; at 1 + floor(log2 T) steps of a T-step fit.

        A mix found before this fit's first noisy step switches ``per_window="auto"`` to the isolated mode (the
        probe's data are synthetic, so the switch does not depend on private data); otherwise it is a
        :class:`ConfigurationError` naming the window, the parameter and the size of the change.
        """
        ctx = self.context
        assert ctx.clipper is not None and self.step.original_training_step is not None
        size = num_windows(batch)
        if size is None:
            return
        start = time.perf_counter()
        saved_grads = [p.grad for p in ctx.params]  # set aside (restored outside the float64 context)
        try:
            for p in ctx.params:
                p.grad = None
            self._probe(pl_module, batch, size)
        finally:
            for p, g in zip(ctx.params, saved_grads, strict=True):
                p.grad = g
            self.probes += 1
            self.seconds += time.perf_counter() - start

    def _probe(self, pl_module: L.LightningModule, batch: Any, size: int) -> None:
        """:meth:`check` after its bookkeeping (``size``: the real batch's windows)."""
        ctx = self.context
        # several processes: every rank probes Lambda windows at the same steps (begin seeds the choices alike), so
        # that all reach the same verdict at the same step and none is left waiting in the step's all-reduce
        # one process: the batch's own number of windows, at least Lambda (a Poisson batch may be smaller)
        size = max(size, int(ctx.expected_batch_size or 0), 2) if ctx.world_size == 1 else \
            max(int(ctx.expected_batch_size or 2), 2)
        capped = min(size, PROBE_WINDOWS)
        found: Any = None
        tried, how = capped, ""
        last: Exception | None = None
        variants = [(True, True), (True, False), (False, True), (False, False)]
        if self.variant is not None:  # the first that ran in this fit (a failed try costs a pass)
            variants.remove(self.variant)
            variants.insert(0, self.variant)
        for wide, varied in variants:
            try:
                with in_float64(pl_module, synthetic_probe(batch, capped, varied=varied), enabled=wide) as \
                        (probe, dtype):
                    outcome = self._compare(pl_module, probe, capped, capped, dtype)
            except Exception as err:  # noqa: BLE001 - the next, more conservative variant
                last = err
                continue
            self.variant = (wide, varied)
            if outcome is _NO_LOSS:
                return
            found = outcome
            how = f"{'float64' if dtype == torch.float64 else str(dtype).removeprefix('torch.')}, " + (
                "repeating integer features" if varied else "integer features 0")
            break
        else:
            assert last is not None
            self._could_not_run(pl_module, last)
            return
        if found is None and size > capped and self.probes == 0:  # the fit's first probe: the real batch's size too
            try:
                probe = synthetic_probe(batch, size, varied=varied)
                dtype = next((p.dtype for p in pl_module.parameters() if p.is_floating_point()), torch.float32)
                outcome = self._compare(pl_module, probe, size, capped, dtype)
            except Exception as err:  # noqa: BLE001 - as for a probe that cannot run at all
                self._could_not_run(pl_module, err)
                return
            if outcome is _NO_LOSS:
                return
            found, tried = outcome, size
            how = f"{str(dtype).removeprefix('torch.')}, " + (
                "repeating integer features" if varied else "integer features 0")
        if found is None:
            return
        change, tolerance, window, param, _ = found
        evidence = (
            f"on a synthetic probe batch of {tried} windows ({how}), changing window 0 moved the per-window "
            f"gradient of window {window} by {change:.3g} in l2 norm (tolerance {tolerance:.3g}; most in parameter "
            f"{param!r})"
        )
        if ctx.per_window == "auto" and ctx.fit_steps == 0:
            earlier = (f" The model's privacy ledger already holds {ctx.earlier_steps} noisy steps of earlier fits: if "
                       "they used the fast path with this forward, the 2C bound did not hold for them and their "
                       "epsilon is not a guarantee." if ctx.earlier_steps else "")
            self._isolate(pl_module, f"{type(pl_module).__name__}'s forward mixes the windows of a batch: {evidence}."
                          + earlier)
            return
        raise ConfigurationError(
            "model", type(pl_module).__name__,
            f"forward mixes the windows of a batch: {evidence}. One window then changes the update by more than 2C "
            "and the privacy analysis does not apply (docs/privacy.md, rule 8); no update was made from this step. "
            f"{ctx.refusal_advice()}",
        )

    def _could_not_run(self, pl_module: L.LightningModule, err: Exception) -> None:
        """The probe raised on the synthetic batch: no evidence for the fast path. Isolate (``per_window="auto"``
        before the first noisy step) or raise the probe's error."""
        ctx = self.context
        if ctx.per_window == "auto" and ctx.fit_steps == 0:
            self._isolate(pl_module, f"the probe could not run on a synthetic batch ({type(err).__name__}: {err}), "
                                     "so independence is not established")
            return
        raise err

    def _compare(self, pl_module: L.LightningModule, probe: Any, size: int, compared: int, dtype: torch.dtype
                 ) -> tuple[float, float, int, str, str] | None | object:
        """Two passes over the synthetic ``probe`` of ``size`` windows, window 0 changed in the second; the largest
        change of windows 1 to ``compared - 1`` (:func:`largest_window_change`), ``None``, or ``_NO_LOSS`` when
        ``training_step`` gives no loss to differentiate. Each pass gets its own copy of the batch (a
        ``training_step`` may write into its input)."""
        ctx = self.context
        base = self._probe_pass(pl_module, copy_batch(probe), compared, copy=compared < size)
        if base is None:
            return _NO_LOSS
        moved = self._probe_pass(pl_module, perturb_first_window(probe, size), compared, copy=compared < size)
        if moved is None:
            return _NO_LOSS
        return largest_window_change(base, moved, ctx.params, ctx.param_names(), dtype)

    def _isolate(self, pl_module: L.LightningModule, reason: str) -> None:
        """``per_window="auto"`` before the fit's first noisy step: compute each window's gradient alone from now on."""
        self.context.isolate()
        rank_zero_warn(f"DPForecastStrategy: {reason} Each window's gradient is computed with that window alone for "
                       "this fit (per_window='isolated').")

    def _probe_pass(self, pl_module: L.LightningModule, batch: Any, windows: int, *, copy: bool
                    ) -> PassRecords | None:
        """One forward/backward pass of the module's training loss on ``batch`` (no logging, no step): what the
        fast path recorded for its first ``windows`` windows (:meth:`PerWindowClipper.pass_records`), ``None``
        when there is no loss to differentiate."""
        ctx = self.context
        assert ctx.clipper is not None and self.step.original_training_step is not None
        devices = ctx.devices()
        enabled = ctx.clipper.enabled
        try:
            with torch.random.fork_rng(devices=devices), torch.enable_grad(), warnings.catch_warnings(), \
                    silenced(pl_module):
                warnings.simplefilter("ignore")
                # the same dropout masks in both probe passes (synthetic data, no privacy draw)
                _seed_forked(devices, 0)
                ctx.clear()
                ctx.clipper.enable()
                for p in ctx.params:
                    p.grad = None
                loss = training_loss(self.step.original_training_step(batch, *self.step.probe_args))
                if loss is None or not loss.requires_grad:
                    return None
                loss.backward()
                del loss
                return ctx.clipper.pass_records(ctx.params, windows, copy=copy)
        finally:
            ctx.clear()
            if not enabled:
                ctx.clipper.disable()
            for p in ctx.params:
                p.grad = None


class SpotCheck:
    """The per-step spot check, owned by :class:`~lightning_dpts.training.DPForecastStrategy`: which steps and
    windows it takes (:attr:`choices`, not a privacy draw), the copy of the step's batch it checks (:attr:`batch`),
    whether ``training_step`` is random on one window (:attr:`stochastic`), and how many steps of this fit it
    recomputed with each window alone (:attr:`recomputed`)."""

    def __init__(self, context: FitContext, step: NoisyStep, probability: float) -> None:
        self.context = context
        self.step = step
        self.probability = probability
        self.choices = random.Random()  # which steps and windows the spot check takes: not a privacy draw
        self.batch: Any = None  # a copy of this step's batch when the step is spot-checked
        self.stochastic: bool | None = None  # whether training_step's result on one window is random
        self.warned_reduction = False  # the spot check found the fast path's gradients scaled by the batch size
        #: steps of the current fit whose spot check found a gap that float64 showed to be round-off (each was
        #: recomputed with every window alone; docs/training.md)
        self.recomputed = 0

    def begin(self) -> None:
        """A new fit: whether ``training_step`` is random is found again."""
        self.stochastic = None

    def draw(self, batch: Any) -> None:
        """Before a step's forward pass: whether this step is checked; if so, a copy of the batch as it arrived
        (``training_step`` may write into its input)."""
        self.batch = None
        if not self.context.isolated and self.probability > 0 and self.choices.random() < self.probability:
            self.batch = copy_batch(batch)

    def due(self, pl_module: L.LightningModule) -> None:
        """Before the step's update: the check, if this step drew one."""
        if self.batch is not None and not self.context.isolated:
            self.check(pl_module)

    def check(self, pl_module: L.LightningModule) -> None:
        """One window, drawn at random, recomputed alone: its clipped gradient must equal the batched one.

        Runs before the step's noisy gradient is formed, so a refusal leaves no update from this step. Skipped for
        a ``training_step`` whose result on one window is random (checked once per fit: a rerun under a fresh seed
        differs, of up to ``STOCHASTIC_RERUNS``). A gap beyond the float tolerance (:func:`window_tolerance`) is
        not refused on that evidence: :meth:`_reexamine` decides between a mix and round-off.
        """
        ctx = self.context
        assert ctx.clipper is not None
        batch, self.batch = self.batch, None
        size = num_windows(batch)
        if not size or self.stochastic is True:
            return
        iso = self.step.isolated_gradients(pl_module)
        j = self.choices.randrange(size)
        devices = ctx.devices()
        with torch.random.fork_rng(devices=devices):  # torch's random stream (dropout) is as without the check
            alone = iso.gradient(batch, j)
        if self.stochastic is None:
            # Several reruns under fresh seeds: a random training_step can repeat one window's result by chance
            # (two dropout masks of 8 units coincide with probability 0.58^8 = 1.3%), which a single rerun mistook
            # for a deterministic one and then refused as a mix. A deterministic one repeats it every time.
            self.stochastic = False
            for _ in range(STOCHASTIC_RERUNS):
                with torch.random.fork_rng(devices=devices):
                    _seed_forked(devices, self.choices.randrange(1 << 62))
                    again = iso.gradient(batch, j)
                if any(not torch.equal(a, b) for a, b in zip(alone, again, strict=True)):
                    self.stochastic = True
                    break
            if self.stochastic:
                rank_zero_info(
                    f"DPForecastStrategy: {type(pl_module).__name__}'s training_step is random on one window (e.g. "
                    "dropout): the per-step spot check cannot compare windows and is off for this fit; the probe "
                    "(fixed random draws) still runs"
                )
                return
        recorded = ctx.clipper.per_window_gradients(ctx.params, [j])
        missing = [k for k, g in enumerate(recorded) if g is None]
        if missing and bool(torch.stack([alone[k].abs().sum() for k in missing]).ne(0).any()):
            return  # a parameter used outside the hooked layers: the clipping refuses it, naming the parameter
        batched = [torch.zeros_like(a) if g is None else g.reshape(a.shape) for a, g in zip(alone, recorded,
                                                                                          strict=True)]
        # parameter by parameter (no flat copy of the whole gradient): squared norms, then the clipped gap
        norms = torch.stack([torch.stack([torch.linalg.vector_norm(a), torch.linalg.vector_norm(g)])
                             for a, g in zip(alone, batched, strict=True)]).double()
        if not bool(torch.isfinite(norms).all()):
            return  # the clipping refuses the step (NonFiniteGradientError, naming the window's series)
        sq = norms.square().sum(0)
        factors = clip_factors(sq, ctx.max_grad_norm)
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in (*alone, *batched)])  # as a flat stack's
        numel = sum(a.numel() for a in alone)
        f_alone, f_batched = (float(f) for f in factors)
        scale = max(f_alone * float(sq[0].sqrt()), f_batched * float(sq[1].sqrt()))  # the larger clipped norm
        gap = _distance(alone, batched, f_alone, f_batched)
        tolerance = window_tolerance(dtype, numel, scale)
        if gap <= tolerance:
            return
        for k in (float(size), 1.0 / size):  # the batched one is k times the window's own: a loss_reduction slip
            slip = window_tolerance(dtype, numel, k * float(sq[0].sqrt()))
            if size > 1 and _distance(alone, batched, k, 1.0) <= slip:
                if not self.warned_reduction:
                    self.warned_reduction = True
                    rank_zero_warn(
                        f"DPForecastStrategy: the per-window gradients of {type(pl_module).__name__} on the fast path "
                        f"are {k:g} times the gradient of training_step on one window alone: loss_reduction="
                        f"{ctx.loss_reduction!r} does not seem to match how training_step reduces its loss over the "
                        "windows. Each window is still clipped on its own (no window mixes into another), but to a "
                        "scaled gradient; pass the loss_reduction that matches"
                    )
                return
        # a gap: both clipped gradients flat, [2, #params], for the re-examination (rare)
        clipped = torch.stack([torch.cat([g.reshape(-1) for g in alone]) * f_alone,
                               torch.cat([g.reshape(-1) for g in batched]) * f_batched])
        self._reexamine(pl_module, batch, j, iso, clipped, gap, tolerance)

    def _reexamine(self, pl_module: L.LightningModule, batch: Any, j: int, iso: IsolatedGradients,
                   clipped: torch.Tensor, gap: float, tolerance: float) -> None:
        """A spot-check gap beyond the float tolerance: a window mix, or round-off? Refuses only a confirmed mix.

        ``clipped``: window ``j``'s clipped gradient ``[2, #params]`` (computed alone, then as the batched pass
        attributes it) in the module's precision, ``gap`` the distance between the two. Both are computed again in
        float64 (:meth:`_wide_gradients`). A mix is a change in exact arithmetic: it is the same in every precision.
        Round-off shrinks with the precision's eps, also where a window's computation is ill-conditioned (terms
        that cancel: the float32 error is then far above eps times the gradient, and the batched and the
        single-window kernels round differently, e.g. vectorised against scalar code), because the conditioning
        is a property of the computation, the same in both precisions. So the float64 gap is compared with

            window_tolerance(float64) + ROUND_OFF_MARGIN * (eps64 / eps) * max(e_alone, e_batched),

        e_* the measured error of each float32 computation against its float64 twin (clipped): the float64 round-off
        that this window's own conditioning predicts, with ``ROUND_OFF_MARGIN`` of slack. A mix passes it only if it
        is below 2^-19 of the float32 round-off. Beyond it: :class:`ConfigurationError`. Within it: round-off; this
        step's update is computed from each window alone (:meth:`IsolatedGradients.clipped_sums`, sound whatever
        the forward does) and a warning says so (:attr:`spot_check_recomputed` counts these steps in the fit).

        Where no float64 run is possible (the module runs in float64 already, or fails in it), a mix cannot be told
        from round-off: this step and the rest of the fit compute each window's gradient alone, with a warning.
        """
        ctx = self.context
        assert ctx.clipper is not None
        step = f"spot check at noisy step {ctx.earlier_steps + ctx.fit_steps + 1} (this fit's step {ctx.fit_steps + 1})"
        seen = (f"window {j}'s clipped gradient computed with the whole batch of {num_windows(batch)} windows "
                f"differs from the one computed with window {j} alone by {gap:.3g} in l2 norm (C = "
                f"{ctx.max_grad_norm:g}, tolerance {tolerance:.3g} in {str(clipped.dtype).removeprefix('torch.')})")
        wide = self._wide_gradients(pl_module, batch, j, iso)
        # from here on the clipper holds no records of this step: its update comes from each window alone, or none
        if wide is None:
            ctx.isolate()
            self.step.recompute(pl_module.trainer, iso, batch)
            rank_zero_warn(
                f"DPForecastStrategy: {step}: {seen}, and {type(pl_module).__name__} cannot run in a wider precision "
                "to tell a mix from round-off. This step and the rest of this fit compute each window's gradient with "
                "that window alone (per_window='isolated')."
            )
            return
        batched64, alone64 = wide
        flat = torch.stack([torch.cat([g.reshape(-1) for g in alone64]),
                            torch.cat([g.reshape(-1) for g in batched64])]).cpu()
        factors = clip_factors(_row_sq(flat), ctx.max_grad_norm)
        exact = flat * factors[:, None]
        gap64 = float(torch.linalg.vector_norm(exact[0] - exact[1]))
        error = float((clipped.double().cpu() - exact).norm(dim=1).max())  # the float32 round-off, measured
        scale = float(torch.linalg.vector_norm(exact, dim=1).max())
        ratio = torch.finfo(torch.float64).eps / torch.finfo(clipped.dtype).eps
        allowed = window_tolerance(torch.float64, flat.shape[1], scale) + ROUND_OFF_MARGIN * ratio * error
        if gap64 > allowed:
            found = largest_change([(g * factors[1]).unsqueeze(0) for g in batched64],
                                   [(a * factors[0]).unsqueeze(0) for a in alone64], torch.float64,
                                   ctx.param_names())
            param = found[3] if found is not None else "?"
            raise ConfigurationError(
                "model", type(pl_module).__name__,
                f"forward mixes the windows of a batch: {step}: {seen}; recomputed in float64 the gap is {gap64:.3g}, "
                f"beyond the {allowed:.3g} that round-off reaches there (the float32 computations' own error is "
                f"{error:.3g}; most in parameter {param!r}). The step is refused before its update (docs/privacy.md, "
                f"rule 8). {ctx.refusal_advice()}",
            )
        self.step.recompute(pl_module.trainer, iso, batch)
        self.recomputed += 1
        rank_zero_warn(
            f"DPForecastStrategy: {step}: {seen}; recomputed in float64 the gap is {gap64:.3g}, within the "
            f"{allowed:.3g} that round-off reaches (the float32 computations' own error is {error:.3g}): round-off of "
            "an ill-conditioned window, not a mix. This step's update was computed with each window alone "
            "(per_window='isolated'); the fit continues on the fast path."
        )

    def _wide_gradients(self, pl_module: L.LightningModule, batch: Any, j: int, iso: IsolatedGradients
                        ) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
        """Window ``j``'s gradient in float64: (as one batched pass over ``batch`` attributes it, computed with window
        ``j`` alone), one tensor per parameter; ``None`` where the module runs in float64 already or cannot run in it.

        The batched pass records into the clipper like the step's own pass did, so the step's records are gone
        afterwards (the caller then computes the step from each window alone, or refuses it). The parameters'
        gradients are set aside, torch's random stream is forked (the spot check runs only on a deterministic
        ``training_step``), and every tensor gets its own storage back (:func:`in_float64`)."""
        ctx = self.context
        assert ctx.clipper is not None
        if not ctx.params or ctx.params[0].dtype == torch.float64:
            return None
        saved = [p.grad for p in ctx.params]
        devices = ctx.devices()
        enabled = ctx.clipper.enabled
        try:
            for p in ctx.params:
                p.grad = None
            with torch.random.fork_rng(devices=devices), torch.enable_grad(), warnings.catch_warnings(), \
                    silenced(pl_module), in_float64(pl_module, copy_batch(batch), enabled=True) as (wide, dtype):
                warnings.simplefilter("ignore")
                if dtype != torch.float64:
                    return None
                ctx.clear()
                ctx.clipper.enable()
                loss = training_loss(iso.step(copy_batch(wide), *iso.step_args))
                if loss is None or not loss.requires_grad:
                    return None
                loss.backward()
                batched = ctx.clipper.per_window_gradients(ctx.params, [j])
                ctx.clear()
                alone = iso.gradient(wide, j)
        except Exception:  # noqa: BLE001 - no float64 run: the caller cannot tell a mix from round-off
            return None
        finally:
            ctx.clear()
            if not enabled:
                ctx.clipper.disable()
            for p, g in zip(ctx.params, saved, strict=True):
                p.grad = g
        return ([torch.zeros_like(a) if g is None else g[0].detach() for a, g in zip(alone, batched, strict=True)],
                alone)

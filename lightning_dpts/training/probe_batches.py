"""Synthetic probe batches and the comparisons of the window-independence checks (docs/privacy.md, rule 8).

Pure functions on batches and recorded passes, used by :mod:`~lightning_dpts.training.independence`: the probe's
batch (:func:`synthetic_probe`: the structure of a real batch, synthetic values only), its perturbed copy, the
float64 context, the tolerance within which a per-window gradient counts as unchanged (:func:`window_tolerance`),
and the two comparisons: :func:`largest_window_change` (the probe: two recorded passes, streamed record by record
and window by window, never every per-window gradient at once) and :func:`largest_change` (the spot check: given
per-window gradients).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from lightning_dpts.training.engine import PassRecords, _squared_norms

__all__ = ["PROBE_WINDOWS", "copy_batch", "in_float64", "largest_change", "largest_window_change", "num_windows",
           "perturb_first_window", "synthetic_probe", "window_tolerance"]

#: The probe's cap: its float64 pass runs on at most this many synthetic windows, and of a larger (full-size) pass
#: the gradients of this many windows (window 0 and the next ones) are compared. The synthetic batch's structure
#: (scales and missing-value patterns of period 3, integer features of period 4) repeats every 12 windows.
PROBE_WINDOWS = 16
#: c in the tolerance c * eps * sqrt(#params) * (gradient norm scale) of the probe and the spot check
TOLERANCE_FACTOR = 16.0


def _leading_sizes(batch: Any) -> list[int]:
    from lightning.fabric.utilities.apply_func import apply_to_collection

    sizes: list[int] = []
    apply_to_collection(batch, torch.Tensor, lambda t: sizes.append(int(t.shape[0])) if t.dim() else None)
    return sizes


def num_windows(batch: Any) -> int | None:
    """Windows in a batch (the leading dimension of its tensors), ``None`` when it has no tensor."""
    sizes = _leading_sizes(batch)
    return max(sizes) if sizes else None


def synthetic_probe(batch: Any, size: int, *, varied: bool = True) -> Any:
    """A batch of ``size`` synthetic windows with the structure of ``batch`` (keys, trailing shapes, dtypes).

    No private value enters it. Real values: uniform in [1, 2) times a scale that differs between windows (1, 2,
    0.5, ...). Observed masks (keys with ``observed`` or ``mask``): 1, except that every third window (1, 4, ...)
    misses the second half of its time axis and the windows 2, 5, ... every third step; the values of the key the
    mask belongs to (``past_target`` for ``past_observed_values``) are 0 where missing, as in the datamodule's
    batches. Integers (categorical and static features, ``series_index``): ``(i // 2) % 2`` for window i with
    ``varied`` (windows 0 and 1 share a value, 2 and 3 another, ...), else 0.
    """
    batch_size = num_windows(batch)
    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64).repeat((size + 2) // 3)[:size]

    def missing(shape: tuple[int, ...]) -> torch.Tensor:
        """Observed mask (float64): 1, with the missing pattern above along axis 1."""
        mask = torch.ones(shape, dtype=torch.float64)
        if len(shape) >= 2 and shape[1] > 1:
            mask[1::3, shape[1] // 2 :] = 0
            mask[2::3, ::3] = 0
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


def copy_batch(batch: Any) -> Any:
    """``batch`` with every tensor cloned (other values shared)."""
    from lightning.fabric.utilities.apply_func import apply_to_collection

    return apply_to_collection(batch, torch.Tensor, lambda t: t.clone())


def perturb_first_window(batch: Any, size: int) -> Any:
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
def in_float64(module: nn.Module, batch: Any, *, enabled: bool) -> Iterator[tuple[Any, torch.dtype]]:
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


def window_tolerance(dtype: torch.dtype, numel: int, scale: float) -> float:
    """c * eps(dtype) * sqrt(#params) * (gradient norm scale), c = :data:`TOLERANCE_FACTOR`: the rounding error
    that one per-window gradient's computation may carry (a reduction's error grows with eps times the size of its
    terms), never reached by a change that is a fixed fraction of the gradient."""
    return TOLERANCE_FACTOR * torch.finfo(dtype).eps * math.sqrt(max(numel, 1)) * max(scale, 1e-300)


def largest_change(
    base: list[torch.Tensor], moved: list[torch.Tensor], dtype: torch.dtype, names: list[str]
) -> tuple[float, float, int, str, str] | None:
    """The largest change of a per-window gradient beyond the float tolerance, or ``None``.

    ``base`` and ``moved``: one ``[W, *p.shape]`` tensor per parameter, window 0 first (the probe's changed
    window, not compared when W > 1), tolerance :func:`window_tolerance` with the largest per-window gradient norm of
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
    tolerance = window_tolerance(dtype, sum(a[0].numel() for a in base), float(norms.max().sqrt()))
    compared = diff[1:] if w > 1 else diff
    offset = 1 if w > 1 else 0
    if compared.numel() == 0 or float(compared.max().sqrt()) <= tolerance:
        return None
    window = int(compared.argmax()) + offset
    param = int(torch.stack([d[window] for d in per_param]).argmax())
    return float(diff[window].sqrt()), tolerance, window, names[param], str(dtype)



def _batch_first(t: torch.Tensor, w: int) -> torch.Tensor:
    """A recorded tensor ``[w, ..., d]`` as ``[w, T, d]`` (T = 1 for ``[w, d]``)."""
    return t.reshape(w, -1, t.shape[-1])


def _joined(calls: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]], w: int
            ) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A record's calls as input blocks ``[w, T, d_k]`` and output gradients ``[w, T, p]``, calls joined along T."""
    blocks = [torch.cat([_batch_first(b[k], w) for b, _ in calls], dim=1) if len(calls) > 1
              else _batch_first(calls[0][0][k], w) for k in range(len(calls[0][0]))]
    g = torch.cat([_batch_first(g, w) for _, g in calls], dim=1) if len(calls) > 1 else _batch_first(calls[0][1], w)
    return blocks, g


def _same_shapes(a: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]],
                 b: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]) -> bool:
    return len(a) == len(b) and all(
        len(xa) == len(xb) and ga.shape == gb.shape and ga.dtype == gb.dtype
        and all(s.shape == t.shape and s.dtype == t.dtype for s, t in zip(xa, xb, strict=True))
        for (xa, ga), (xb, gb) in zip(a, b, strict=True))


def _rows_differ(x: torch.Tensor, y: torch.Tensor, w: int) -> torch.Tensor:
    """Per window (row), whether ``x`` and ``y`` differ anywhere (a NaN at the same place in both is no difference)."""
    ne = x.ne(y)
    if x.is_floating_point():
        ne &= ~(x.isnan() & y.isnan())
    return ne.reshape(w, -1).any(1).cpu()


def _window_norms(passed: PassRecords, w: int) -> torch.Tensor:
    """Squared l2 norm of every window's whole gradient (all parameters) in one pass ``[w]`` (float64), from the
    exact per-record forms the clipper uses (:func:`~lightning_dpts.training.engine._squared_norms`)."""
    out = torch.zeros(w, dtype=torch.float64)
    for record, calls in passed.records:
        blocks, g = _joined(calls, w)
        norms, _, _ = _squared_norms(record, [a.transpose(0, 1) for a in blocks], g.transpose(0, 1))
        out += norms.double().cpu() * passed.scale ** 2
    for gs in passed.samples.values():
        out += gs.reshape(w, -1).double().square().sum(1).cpu()
    return out


def largest_window_change(
    before: PassRecords, after: PassRecords, params: list[nn.Parameter], names: list[str], dtype: torch.dtype
) -> tuple[float, float, int, str, str] | None:
    """The probe's comparison of two recorded passes (window 0 changed between them): the largest change of another
    window's gradient, as the fast path attributes it, beyond the float tolerance, or ``None``.

    Streaming and in the passes' own dtype, so that it costs no more memory than the records themselves:

    1. windows whose recorded rows (every layer's inputs and output gradients, Opacus' per-window gradients) are
       bitwise equal in both passes have equal gradients (the attribution is a function of those rows alone): no
       change, nothing computed;
    2. for each other window, the exact change ``g_j - g'_j`` one window and one parameter at a time: for a linear
       map ``U^T A + G'^T V`` with ``U = G - G'`` and ``V = A - A'`` (two products of the window's own rows; zero
       where its rows did not change, so round-off enters only through what changed), else the difference of the
       Opacus per-window gradients; the tolerance is :func:`window_tolerance` with the largest per-window gradient
       norm of either pass (all windows compared, window 0 included).

    The guarantee is that of the old comparison of materialised float64 per-window gradients: any window whose
    gradient moves by more than the tolerance is reported, with the parameter that moved most. Returns (change,
    tolerance, window, parameter, dtype); window 0 is not compared when there are several windows.
    """
    w = before.windows
    differs = torch.zeros(w, dtype=torch.bool)
    mine = {id(r): (r, c) for r, c in before.records}
    theirs = {id(r): (r, c) for r, c in after.records}
    pairs = []
    for key in dict.fromkeys([*mine, *theirs]):
        record, a = mine.get(key, (theirs.get(key, (None, []))[0], []))
        _, b = theirs.get(key, (record, []))
        same = _same_shapes(a, b)
        if same:
            for (xa, ga), (xb, gb) in zip(a, b, strict=True):
                for s, t in zip((*xa, ga), (*xb, gb), strict=True):
                    differs |= _rows_differ(s, t, w)
        else:  # another number or shape of calls in the other pass: compare the gradients themselves
            differs[:] = True
        pairs.append((record, a, b, same))
    samples = dict.fromkeys([*before.samples, *after.samples])
    for key in samples:
        s, t = before.samples.get(key), after.samples.get(key)
        if s is None or t is None or s.shape != t.shape:
            differs[:] = True
        else:
            differs |= _rows_differ(s, t, w)
    offset = 1 if w > 1 else 0
    changed = [j for j in range(offset, w) if bool(differs[j])]
    if not changed:
        return None
    index = {id(p): k for k, p in enumerate(params)}
    sq = torch.zeros(w, len(params), dtype=torch.float64)
    scale = before.scale

    def add(j: int, p: torch.Tensor, delta: torch.Tensor) -> None:
        k = index.get(id(p))
        if k is not None:
            sq[j, k] += float(delta.double().square().sum()) * scale ** 2

    for record, a, b, same in pairs:
        if same:
            (blocks_a, g_a), (blocks_b, g_b) = _joined(a, w), _joined(b, w)
            for j in changed:
                u = g_a[j] - g_b[j]  # [T, p]
                for p, k in record.weights:
                    add(j, p, u.T @ blocks_a[k][j] + g_b[j].T @ (blocks_a[k][j] - blocks_b[k][j]))
                for bias in record.biases:
                    add(j, bias, u.sum(0))
        else:
            joined = [_joined(c, w) if c else None for c in (a, b)]
            for j in changed:
                for p, k in record.weights:
                    ga, gb = (torch.zeros_like(p) if x is None else x[1][j].T @ x[0][k][j] for x in joined)
                    add(j, p, ga - gb)
                for bias in record.biases:
                    ga, gb = (torch.zeros_like(bias) if x is None else x[1][j].sum(0) for x in joined)
                    add(j, bias, ga - gb)
    for key in samples:
        s, t = before.samples.get(key), after.samples.get(key)
        k = index.get(key)
        if k is None:
            continue
        for j in changed:
            x = torch.zeros_like(params[k]) if s is None else s[j]
            y = torch.zeros_like(params[k]) if t is None else t[j]
            sq[j, k] += float((x.double() - y.double()).square().sum())
    change = sq.sum(1)
    largest = max(float(_window_norms(before, w).max()), float(_window_norms(after, w).max()))
    tolerance = window_tolerance(dtype, sum(p.numel() for p in params), math.sqrt(largest))
    window = max(changed, key=lambda j: float(change[j]))
    if math.sqrt(float(change[window])) <= tolerance:
        return None
    return math.sqrt(float(change[window])), tolerance, window, names[int(sq[window].argmax())], str(dtype)

"""Synthetic probe batches and the float tolerance of the window-independence checks (docs/privacy.md, rule 8).

Pure functions on batches, used by :mod:`~lightning_dpts.training.independence`: the probe's batch
(:func:`synthetic_probe`: the structure of a real batch, synthetic values only), its perturbed copy, the float64
context, and the tolerance within which a per-window gradient counts as unchanged (:func:`largest_change`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["PROBE_COMPARED", "copy_batch", "in_float64", "largest_change", "num_windows", "perturb_first_window",
           "synthetic_probe", "window_tolerance"]

#: at most this many windows of the probe batch have their gradients compared (window 0 and the next ones)
PROBE_COMPARED = 33
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


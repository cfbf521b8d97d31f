"""Per-window gradients computed with each window alone (``DPForecastStrategy(per_window="isolated")``).

Algorithm 2's sensitivity argument needs window i's clipped gradient to be a function of window i alone
(docs/privacy.md, rule 8). The fast path (:class:`~lightning_dpts.training.engine.PerWindowClipper`) attributes
the gradient of one pass over the whole batch to its windows, which is window i's own gradient only if the
module's ``training_step`` keeps windows apart. Here, instead, window i's gradient is the gradient of the
module's own ``training_step`` on a **batch of one window**: the batch is split into batch-of-one batches (every
tensor whose leading size is the batch's number of windows is sliced; other values are passed unchanged), so
no code in ``forward`` or ``training_step`` sees two windows at once, whatever it does with its batch.

Two ways to compute the same thing:

* **vectorised**: ``torch.func.vmap(torch.func.grad(...))`` over the windows of a
  ``torch.func.functional_call`` of ``training_step`` (each vmapped call sees a batch of one window, its leading
  axis added with ``unsqueeze(0)``; dropout draws differ between windows), in chunks that bound the
  ``[windows, parameters]`` gradients kept at once;
* **loop**: one forward and backward pass per window, for a ``training_step`` that ``vmap`` cannot run
  (data-dependent control flow, ``.item()``, in-place writes into a batch-of-one input, layers without a
  batching rule). The first chunk of a fit tries ``vmap``; on any error, or where the loop was faster per window
  on that chunk, the fit uses the loop from then on.

Each window's gradient is clipped to C with Opacus' factor and summed; the strategy then adds the same noise and
divides by the same Lambda as on the fast path (:func:`~lightning_dpts.training.engine.add_noise_and_average`).
State that ``training_step`` keeps between calls outside its arguments (a tensor attribute or a buffer written by one
window's call, which the next one's could read) is refused after the call that wrote it, before the next window's
call (the fit's :class:`~lightning_dpts.training.state_guard.StateGuard`); state outside tensors (a Python number,
a global) is not seen. Running statistics of batch normalisation are refused at setup
(:mod:`~lightning_dpts.training.surgery`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training.engine import NonFiniteGradientError, PerWindowClipper, _addmv, _row_sq, clip_factors
from lightning_dpts.training.ledger import GUARD_ATTRIBUTE

__all__ = ["IsolatedGradients", "training_loss"]

#: at most this many gradient coordinates (windows x parameters) are materialised at once by the vectorised path
_CHUNK_ELEMENTS = 1 << 24


def training_loss(out: Any) -> torch.Tensor | None:
    """The loss tensor of a ``training_step`` output (a tensor, or a dict with ``"loss"``); ``None`` otherwise."""
    loss = out.get("loss") if isinstance(out, dict) else out
    return loss if isinstance(loss, torch.Tensor) else None


def _no_log(*args: Any, **kwargs: Any) -> None:
    """Stands in for ``LightningModule.log`` during per-window calls (a batch of one window is not the batch)."""


@contextlib.contextmanager
def silenced(module: nn.Module) -> Iterator[None]:
    """``module.log`` and ``module.log_dict`` do nothing inside (per-window and probe calls of ``training_step``)."""
    module.log = _no_log  # type: ignore[method-assign]
    module.log_dict = _no_log  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.log
        del module.log_dict


class _Step(nn.Module):
    """``training_step`` as a module ``forward``, for ``torch.func.functional_call`` (parameters of ``module``
    are reached as ``module.<name>``)."""

    def __init__(self, module: nn.Module, step: Callable[..., Any], args: tuple) -> None:
        super().__init__()
        self.module = module
        object.__setattr__(self, "_step", step)
        object.__setattr__(self, "_args", args)

    def forward(self, batch: Any) -> torch.Tensor:
        loss = training_loss(self._step(batch, *self._args))
        if loss is None:
            raise RuntimeError("training_step returned no loss tensor")
        return loss


class IsolatedGradients:
    """Clipped sums of per-window gradients, each from the module's ``training_step`` on that window alone.

    Args:
        module: the LightningModule (its parameters are those of ``params``).
        step: the module's own, unwrapped ``training_step``.
        step_args: extra positional arguments for ``step`` after the batch (e.g. ``(batch_idx,)``).
        params: the trainable parameters, in the order of the strategy's gradients.
        clipper: the fast-path clipper attached to ``module``, bypassed during the per-window passes (``None``:
            none attached).
    """

    def __init__(
        self,
        module: nn.Module,
        step: Callable[..., Any],
        step_args: tuple,
        params: list[nn.Parameter],
        clipper: PerWindowClipper | None,
    ) -> None:
        self.module = module
        self.step = step
        self.step_args = step_args
        self.params = params
        self.clipper = clipper
        ids = {id(p): k for k, p in enumerate(params)}
        self._names: list[str] = [""] * len(params)
        for name, p in module.named_parameters():
            if id(p) in ids:
                self._names[ids[id(p)]] = name
        #: ``None`` until the first call; then whether ``vmap`` runs this module (else: one pass per window)
        self.vectorised: bool | None = None

    # -- batches of one window ----------------------------------------------------------------------------
    @staticmethod
    def split(batch: Any) -> tuple[list[Any], Any, list[int], int]:
        """(leaves, tree spec, positions of the per-window leaves, number of windows) of ``batch``."""
        leaves, spec = tree_flatten(batch)
        sizes = [t.shape[0] for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0]
        b = max(sizes) if sizes else 0
        per_window = [
            k for k, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == b
        ]
        return leaves, spec, per_window, b

    @staticmethod
    def window(batch: Any, i: int) -> Any:
        """Window ``i`` of ``batch`` as a batch of one window (a copy: in-place writes stay in it)."""
        leaves, spec, per_window, _ = IsolatedGradients.split(batch)
        leaves = list(leaves)
        for k in per_window:
            leaves[k] = leaves[k][i : i + 1].clone()
        return tree_unflatten(leaves, spec)

    def _context(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.clipper is not None:
            stack.enter_context(self.clipper.bypassed())
        stack.enter_context(silenced(self.module))
        stack.enter_context(torch.enable_grad())
        return stack

    # -- gradients ----------------------------------------------------------------------------------------
    def gradient(self, batch: Any, i: int) -> list[torch.Tensor]:
        """Window ``i``'s gradient (one tensor per parameter), from ``training_step`` on that window alone."""
        with self._context():
            return self._loop_gradient(self.window(batch, i))

    def _check_state(self) -> None:
        """The fit's state guard after a call of ``training_step``: a tensor it kept (a buffer, an attribute) is
        refused before the next window's call could read it."""
        guard = self.module.__dict__.get(GUARD_ATTRIBUTE)
        if guard is not None:
            guard.check_step()

    def _loop_gradient(self, one: Any) -> list[torch.Tensor]:
        loss = training_loss(self.step(one, *self.step_args))
        self._check_state()
        if loss is None or not loss.requires_grad:
            return [torch.zeros_like(p) for p in self.params]
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g.detach() for p, g in zip(self.params, grads, strict=True)]

    def _vmapped(self, leaves: list[Any], spec: Any, per_window: list[int], lo: int, hi: int) -> list[torch.Tensor]:
        """Gradients ``[hi - lo, *p.shape]`` of windows ``lo..hi-1`` by ``vmap(grad(...))``."""
        from torch.func import functional_call, grad, vmap

        wrapper = _Step(self.module, self.step, self.step_args)
        names = [f"module.{n}" for n in self._names]

        def loss(values: list[torch.Tensor], windows: list[torch.Tensor]) -> torch.Tensor:
            full = list(leaves)
            for k, t in zip(per_window, windows, strict=True):
                full[k] = t.unsqueeze(0)
            return functional_call(wrapper, dict(zip(names, values, strict=True)), (tree_unflatten(full, spec),),
                                   strict=False)

        values = [p.detach() for p in self.params]
        windows = [leaves[k][lo:hi].clone() for k in per_window]
        out = vmap(grad(loss), in_dims=(None, 0), randomness="different")(values, windows)
        self._check_state()
        return [g.detach() for g in out]

    def clipped_sums(self, batch: Any, max_grad_norm: float) -> list[torch.Tensor]:
        """sum_i clip_C(g_i) per parameter, g_i the gradient of ``training_step`` on window i alone.

        Raises:
            NonFiniteGradientError: a window's gradient is not finite (or its squared norm overflows).
        """
        leaves, spec, per_window, b = self.split(batch)
        sums = [torch.zeros_like(p) for p in self.params]
        if b == 0:
            return sums
        numel = max(1, sum(p.numel() for p in self.params))
        chunk = max(1, min(b, _CHUNK_ELEMENTS // numel))
        with self._context():
            lo = 0
            while lo < b:
                hi = min(b, lo + chunk)
                grads = [g.reshape(hi - lo, -1) for g in self._chunk(leaves, spec, per_window, lo, hi)]
                sq = torch.zeros(hi - lo, dtype=torch.float64, device=grads[0].device)
                for g in grads:  # one fused reduction per parameter; the sum in float64
                    sq += _row_sq(g)
                if not bool(torch.isfinite(sq).all()):
                    windows = [lo + int(w) for w in (~torch.isfinite(sq)).nonzero().flatten()]
                    raise NonFiniteGradientError(
                        f"the gradient of window(s) {windows} of the batch is not finite (or its squared l2 norm "
                        "overflows); clipping cannot bound its contribution", windows,
                    )
                factor = clip_factors(sq, max_grad_norm)
                for total, g in zip(sums, grads, strict=True):  # sum_i c_i g_i: one matrix-vector product
                    _addmv(total.view(-1), g.T, factor.to(g.dtype), 1.0)
                lo = hi
        return sums

    def _chunk(self, leaves: list[Any], spec: Any, per_window: list[int], lo: int, hi: int) -> list[torch.Tensor]:
        """Per-window gradients ``[hi - lo, *p.shape]``, vectorised or by a loop (the same gradients).

        The first call decides for the fit: the loop where ``vmap`` cannot run the module; otherwise whichever
        took less time per window on this call (the chunk by ``vmap``, then up to 4 of its windows by the loop;
        e.g. an LSTM, which ``vmap`` runs window by window internally, is faster in the loop)."""
        if self.vectorised is None:
            start = time.perf_counter()
            try:
                out = self._vmapped(leaves, spec, per_window, lo, hi)
            except ConfigurationError:  # state kept between calls (the state guard): refused, not retried
                raise
            except Exception:  # noqa: BLE001 - any vmap failure: the loop computes the same gradients
                self.vectorised = False
            else:
                per_vmap = (time.perf_counter() - start) / (hi - lo)
                start = time.perf_counter()
                self._looped(leaves, spec, lo, min(hi, lo + 4))
                self.vectorised = per_vmap <= (time.perf_counter() - start) / (min(hi, lo + 4) - lo)
                return out
        if self.vectorised:
            return self._vmapped(leaves, spec, per_window, lo, hi)
        return self._looped(leaves, spec, lo, hi)

    def _looped(self, leaves: list[Any], spec: Any, lo: int, hi: int) -> list[torch.Tensor]:
        """Per-window gradients ``[hi - lo, *p.shape]``, one forward and backward pass per window."""
        batch = tree_unflatten(leaves, spec)
        per = [self._loop_gradient(self.window(batch, i)) for i in range(lo, hi)]
        return [torch.stack(gs) for gs in zip(*per, strict=True)]

    def name(self, k: int) -> str:
        """The module's name of parameter ``k``."""
        return self._names[k] or f"#{k}"

"""Per-window clipping without materialising every per-window gradient (Algorithm 2's inner loop).

Algorithm 2 needs, per window i, the norm ||g_i|| and then sum_i min(1, C/||g_i||) g_i. Materialising all g_i
costs B x (number of parameters) memory and time, which dominates the step of a feed-forward forecaster. For
linear layers (``nn.Linear`` and subclasses that keep its forward, and
:class:`~lightning_dpts.training.surgery.DPFastLSTM`, whose parameters act as one linear map of ``[x_t, h_t-1]``)
the gradient of window i is ``G_i^T A_i`` with A_i the
layer inputs and G_i the gradients of its outputs (time steps stacked along the second axis), so

* ``||G_i^T A_i||_F^2 = ||a_i||^2 ||g_i||^2`` for one time step, else the cheaper in multiply-adds of
  ``sum_ts (A_i A_i^T)_ts (G_i G_i^T)_ts`` ("ghost norm", Li et al. 2022; ``T^2 (d + p)`` per window) and the
  per-window matrices ``G_i^T A_i`` of that layer (``T p d``; then kept and reused for the clipped sum);
* ``sum_i c_i G_i^T A_i`` is one matrix product of the c-weighted G with A ("book-keeping", Bu et al. 2023).

:meth:`PerWindowClipper.noisy_gradients` accumulates these products straight into the parameter's slice of
the step's one noise draw (``addmm_`` with alpha 1/Lambda: no separate sum tensor, no second pass). Linear layers
called once on the same input tensor (e.g. the projections of a distribution head) are handled as one layer
with their outputs side by side: its per-window gradient stacks theirs, so its squared norm is the sum of theirs
and one norm and one product replace one per layer.

Plain ``nn.Linear`` layers (exactly that class) are switched, for the clipper's lifetime, to a subclass whose
training forward is one autograd function: its backward returns the input gradient and records the output
gradient, but computes *no* weight gradient, which the clipped sum replaces anyway (DPFastLSTM does the same
for its weights). The backward pass then costs what the non-DP one costs minus the weight-gradient products,
and the book-keeping product takes their place. A trainable parameter of such a layer that still receives an
autograd gradient was used outside its layer's training forward: a :class:`ConfigurationError`.

Every other layer with trainable parameters (embeddings, layer norms, Opacus RNN layers, ``nn.Linear``
subclasses with their own forward, ...) gets per-window gradients from Opacus' ``GradSampleModule`` hooks,
restricted to those layers. The clipping factor is Opacus': ``min(1, C / (||g_i|| + 1e-6))``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from opacus import GradSampleModule
from opacus.layers.dp_rnn import DPRNNBase
from torch import nn
from torch.autograd.function import once_differentiable

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training.surgery import DPFastLSTM

__all__ = ["NoiseSource", "NonFiniteGradientError", "PerWindowClipper", "add_noise_and_average", "clip_factors"]


class NoiseSource(Protocol):
    """What draws the DP noise (the interface of :class:`lightning_dpts.randomness.GaussianNoise`)."""

    def sample(self, numel: int, std: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A flat CPU tensor of ``numel`` N(0, std^2) draws."""
        ...


class NonFiniteGradientError(RuntimeError):
    """A window's gradient is not finite (or its squared norm overflows): its sensitivity is not bounded.

    Attributes:
        windows: positions in the batch of the offending windows.
    """

    def __init__(self, message: str, windows: list[int]) -> None:
        super().__init__(message)
        self.windows = windows

#: Opacus' clipping factor min(1, C / (||g_i|| + 1e-6)) (``opacus.optimizers.optimizer``).
_CLIP_EPS = 1e-6


def clip_factors(squared_norms: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """Per-window clipping factors min(1, C / (||g_i|| + 1e-6)) from squared gradient norms ``[B]``."""
    return (max_grad_norm / (squared_norms.sqrt() + _CLIP_EPS)).clamp(max=1.0)


def add_noise_and_average(
    sums: list[torch.Tensor | None],
    params: list[torch.Tensor],
    noise_std: float,
    expected_batch_size: int,
    noise: NoiseSource,
) -> list[torch.Tensor]:
    """Algorithm 2's last line, (sum_i clip_C(g_i) + N(0, noise_std^2 I)) / Lambda, for every parameter.

    ``sums[k]`` is the summed clipped gradient of ``params[k]`` (``None``: noise only). The noise is one draw
    for all coordinates from ``noise`` (a :class:`NoiseSource` such as
    :class:`~lightning_dpts.randomness.GaussianNoise`), split in parameter order.
    """
    # N(0, noise_std^2) / Lambda drawn as N(0, (noise_std / Lambda)^2): one pass over the noise less
    out = _noise_views(params, noise, noise_std / expected_batch_size)
    for total, g in zip(out, sums, strict=True):
        if g is not None:
            total.add_(g.reshape(total.shape), alpha=1.0 / expected_batch_size)
    return out


class _TapLinearFunction(torch.autograd.Function):
    """``F.linear`` whose backward records the output gradient and returns only the input gradient.

    The weight and bias are inputs (so the output requires grad even if ``x`` does not), but their gradient is
    ``None``: the clipper computes the clipped per-window sum from the recorded (input, output gradient) pair.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, call: list) -> torch.Tensor:
        # x is saved (the record holds it anyway) only for autograd's version check: an in-place change of the input
        # after the call (e.g. ``x += layer(x)``) raises in the backward pass, as for nn.Linear, instead of
        # silently giving the clipper the changed input
        ctx.save_for_backward(weight, x if weight.requires_grad else None)
        ctx.call = call
        return F.linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        weight, _ = ctx.saved_tensors  # unpacking checks that x was not modified in place since the forward
        call, ctx.call = ctx.call, None  # the graph outlives the step (Lightning keeps the loss): let go of the record
        if call is None:  # a retained graph run backward again: this layer's G would be only one of the passes'
            raise RuntimeError("several backward passes per optimizer step; DP training needs exactly one")
        call[1] = grad
        return (grad @ weight if ctx.needs_input_grad[0] else None), None, None, None


class _TappedLinear(nn.Linear):
    """``nn.Linear`` while a :class:`PerWindowClipper` is attached (the class is swapped back by ``remove``)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        tap = self.__dict__.get("_dpts_tap")
        if tap is None or not (self.training and torch.is_grad_enabled()):
            return F.linear(input, self.weight, self.bias)
        return tap(self, input)


class _OpacusSubset(GradSampleModule):
    """Opacus per-sample gradient hooks on every trainable layer except those in ``skip``."""

    def __init__(self, m: nn.Module, skip: set[int], **kwargs: Any) -> None:
        object.__setattr__(self, "_skip_ids", skip)
        super().__init__(m, **kwargs)

    def iterate_submodules(self, module: nn.Module):  # type: ignore[override]
        for sub in super().iterate_submodules(module):
            if id(sub) not in self._skip_ids:
                yield sub


class _Record:
    """Inputs and output gradients of one linear map over one batch (one entry per call).

    A call is ``[inputs, G]``: ``inputs`` a tuple of input blocks (the map's input is their concatenation along
    the last axis; weight ``k`` acts on block ``k``) and G the output gradient (``None`` until the backward pass
    reaches the layer), all ``[B, ..., d]`` (batch first).
    """

    __slots__ = ("weights", "biases", "calls")

    def __init__(self, weights: list[tuple[torch.Tensor, int]], biases: list[torch.Tensor]) -> None:
        self.weights = weights  # (parameter, input block)
        self.biases = biases
        self.calls: list[list[Any]] = []


def _across_windows(layer: str, seen: int, windows: int) -> ConfigurationError:
    """A layer that saw ``seen`` rows along its first dimension where the batch has ``windows`` windows (issue 38:
    ``nn.MultiheadAttention`` given the windows as its sequence axis raised an ``IndexError`` here)."""
    return ConfigurationError(
        "model", f"the layer of parameter {layer}",
        f"saw {seen} row(s) along its first (batch) dimension where the batch has {windows} windows: it runs across "
        "the windows of the batch (e.g. nn.MultiheadAttention or a reshape given the windows as the sequence axis), "
        "so the windows mix and no per-window gradient exists on the fast path. Keep the windows on the first "
        "dimension of every layer, or train with DPForecastStrategy(per_window='isolated'), which computes each "
        "window's gradient with that window alone",
    )


def _own_trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters(recurse=False))


def _linear_map(module: nn.Module) -> bool:
    """Whether ``module``'s forward is ``nn.Linear``'s, ``F.linear(input, weight, bias)``: only then is its
    per-window weight gradient G_i^T A_i of its input and output gradient. A subclass with its own forward (an
    activation, a scaled input or a reparametrised weight inside it) is left to Opacus' per-sample gradients."""
    return isinstance(module, nn.Linear) and type(module).forward in (nn.Linear.forward, _TappedLinear.forward)


_BARE_FIX = (
    "wrap it in a small nn.Module whose forward uses only that parameter (e.g. class Scale(nn.Module) with "
    "forward(x) = x * self.weight), use a supported layer (nn.Linear, nn.Embedding, nn.LayerNorm, ...), or "
    "freeze it with requires_grad_(False)"
)


def _check_bare_parameters(module: nn.Module, others: list[nn.Module], names: dict[int, str]) -> None:
    """Refuse a bare ``nn.Parameter`` owned by a custom module that also has trainable sub-layers.

    Opacus computes the per-window gradient of such a parameter by re-running its owner's ``forward`` on a
    functional copy; that copy's sub-layers are not the ones this clipper hooks (the run fails with a
    ``KeyError`` deep inside), and their per-window gradients would be counted twice.
    """
    for sub in others:
        if type(sub) in GradSampleModule.GRAD_SAMPLERS or sub is module:
            continue
        children = [p for child in sub.children() for p in child.parameters() if p.requires_grad]
        if not children:
            continue
        own = next(p for p in sub.parameters(recurse=False) if p.requires_grad)
        raise ConfigurationError(
            "model", f"parameter {names.get(id(own), '?')!r} of shape {tuple(own.shape)}",
            f"is a bare nn.Parameter of {type(sub).__name__}, which also has trainable sub-layers; per-window "
            "gradients are computed layer by layer, so " + _BARE_FIX,
        )


def _flat(t: torch.Tensor, time_major: bool, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``[T, B, d]`` -> ``[T * B, d]`` rows in time-major or window-major order, optionally scaled per window."""
    if time_major:
        return (t if weights is None else t * weights[None, :, None]).reshape(-1, t.shape[-1])
    t = t.transpose(0, 1)
    return (t if weights is None else t * weights[:, None, None]).reshape(-1, t.shape[-1])


def _step_sum(g: torch.Tensor) -> torch.Tensor:
    """``g.sum(0)`` of output gradients ``[T, B, p]``; for contiguous ones as one matrix-vector product (2-3x
    faster than ``sum`` over the leading axis on CPU, measured for DeepAR's LSTM records)."""
    if g.shape[0] == 1:
        return g[0]
    if not g.is_contiguous():
        return g.sum(0)
    return (g.new_ones(1, g.shape[0]) @ g.view(g.shape[0], -1)).view(g.shape[1:])


def _add_window_sum(out: torch.Tensor, weights: torch.Tensor, full: torch.Tensor, alpha: float) -> None:
    """``out += alpha * sum_i weights_i full_i`` for per-window products ``full`` ``[B, p, d]`` and a contiguous
    ``out`` ``[p, d]``, as one matrix-vector product without copying ``full``. ``full`` may be the transposed view
    of ``[B, d, p]`` products (the wider axis inner, see :func:`_squared_norms`): its memory order is read from
    its strides, never guessed from its shape (``p == d`` looks the same either way)."""
    b = full.shape[0]
    rows = full.transpose(1, 2)
    if rows.stride(2) == 1 and rows.stride(1) == rows.shape[2]:  # [B, d, p] rows contiguous per window
        out.add_((weights @ rows.reshape(b, -1)).view(rows.shape[1:]).t(), alpha=alpha)
    else:
        _addmv(out.view(-1), full.reshape(b, -1).T, weights, alpha)


def _squared_norms(
    record: _Record, blocks: list[torch.Tensor], g: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor] | None, torch.Tensor | None]:
    """||g_i||^2 over the record's weights and biases, per window ``[B]``, from G ``[T, B, p]`` (unscaled) and
    the input blocks ``[T, B, d_k]``; also the per-window weight gradients ``[B, p, d_k]`` (one per weight, in
    ``record.weights`` order; transposed views of one ``[B, d, p]`` product) when they were formed, else ``None``;
    and, when the record has biases, G summed over the steps ``[B, p]`` (the per-window bias gradient, which the
    clipped sum reuses), else ``None``.

    One time step: ``||a_i||^2 ||g_i||^2``. Otherwise the cheaper of the two exact forms (multiply-adds per
    window): the ghost norm ``sum_ts (A A^T)_ts (G G^T)_ts`` (``T^2 (d + p)``, memory ``B T^2``) or the
    per-window weight gradients ``G_i^T A_i`` (``T p d``, memory ``B p d``), with d the input width over the
    trainable blocks. The per-window products are kept: the clipped sum is then their weighted sum over the
    windows (``B p d``) instead of a second product over all rows (``B T p d``).
    """
    t, b, p_out = g.shape
    per_window = None
    n_bias = len(record.biases)

    if t == 1:  # (sum_k ||a_i,k||^2 + number of biases) ||g_i||^2, with ||g_i||^2 computed once
        g_sum = g[0] if n_bias else None
        g_sq = _row_sq(g[0])
        if not record.weights:
            return g_sq.mul_(n_bias), None, g_sum
        a_sq = sum(_row_sq(blocks[k][0]) for _, k in record.weights)
        return (a_sq.add_(n_bias) if n_bias else a_sq).mul_(g_sq), None, g_sum
    out = torch.zeros(b, dtype=g.dtype, device=g.device)
    if record.weights:
        used = [blocks[k] for _, k in record.weights]
        d = sum(a.shape[-1] for a in used)
        if t * (d + p_out) < p_out * d:  # ghost norm
            gram = torch.bmm(used[0].transpose(0, 1), used[0].permute(1, 2, 0))
            for a in used[1:]:
                gram.baddbmm_(a.transpose(0, 1), a.permute(1, 2, 0))
            out += (gram * torch.bmm(g.transpose(0, 1), g.permute(1, 2, 0))).sum((1, 2))
        else:
            # one product for all blocks, with the wider of p and d as the inner (contiguous) axis of the result:
            # for DeepAR's LSTM layers (p = 4H > d) A_i^T G_i [B, d, p] is about twice as fast on CPU as G_i^T A_i
            # per block (measured); the per-weight results [B, p, d_k] are views of it
            a_all = used[0] if len(used) == 1 else torch.cat(used, dim=-1)
            bounds = [0]
            for a in used:
                bounds.append(bounds[-1] + a.shape[-1])
            spans = list(zip(bounds[:-1], bounds[1:], strict=True))
            if p_out >= d:
                full_t = torch.bmm(a_all.permute(1, 2, 0), g.transpose(0, 1))
                per_window = [full_t[:, lo:hi].transpose(1, 2) for lo, hi in spans]
            else:
                full_t = torch.bmm(g.permute(1, 2, 0), a_all.transpose(0, 1))
                per_window = [full_t[:, :, lo:hi] for lo, hi in spans]
            out += _row_sq(full_t.view(b, -1))
    g_sum = None
    if n_bias:
        g_sum = _step_sum(g)
        out += _row_sq(g_sum) * n_bias
    return out, per_window, g_sum


#: ``torch._C._nn.unflatten_dense_tensors`` (views of a flat tensor in the shapes of a list of tensors, one call
#: instead of a ``view`` per parameter); ``None`` if a torch build lacks it (then split and view)
_unflatten = getattr(torch._C._nn, "unflatten_dense_tensors", None)


def _noise_views(params: list[nn.Parameter], noise: NoiseSource, std: float) -> list[torch.Tensor]:
    """One draw of N(0, std^2) for all coordinates of ``params``, split in parameter order into tensors of their
    shapes, on their devices and in their dtypes (one transfer when they all share device and dtype)."""
    dtype = params[0].dtype if params else torch.float32
    flat = noise.sample(sum(p.numel() for p in params), std, dtype)
    if params and all(p.device == params[0].device and p.dtype == dtype for p in params):
        flat = flat.to(params[0].device)
        if _unflatten is not None:  # views of ``flat`` in one call (torch's DDP bucket helper)
            return list(_unflatten(flat, params))
        return [t.view(p.shape) for t, p in zip(flat.split([p.numel() for p in params]), params, strict=True)]
    out, offset = [], 0
    for p in params:
        out.append(flat[offset : offset + p.numel()].view(p.shape).to(device=p.device, dtype=p.dtype))
        offset += p.numel()
    return out


def _addmm(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, alpha: float) -> None:
    """``out += alpha * a @ b`` for ``out`` of shape ``[a.shape[0], b.shape[1]]`` (one fused product)."""
    if out.dtype == a.dtype == b.dtype:
        out.addmm_(a, b, alpha=alpha)
    else:  # e.g. bf16 activations under autocast, float32 parameters: no fused product
        out.add_(a @ b, alpha=alpha)


def _addmv(out: torch.Tensor, a: torch.Tensor, v: torch.Tensor, alpha: float) -> None:
    """``out += alpha * a @ v`` for a 1-D ``out`` (one fused product)."""
    if out.dtype == a.dtype == v.dtype:
        out.addmv_(a, v, alpha=alpha)
    else:
        out.add_(a @ v, alpha=alpha)


def _row_sq(x: torch.Tensor) -> torch.Tensor:
    """Squared l2 norm of each row of a 2-D tensor: one fused reduction, no temporary of ``x``'s size (unlike
    ``linalg.vecdot(x, x)``, which multiplies first)."""
    return torch.linalg.vector_norm(x, dim=1).square_()


class _Group:
    """Linear layers recorded once each, on one input block: one layer, or several called on the *same* input
    tensor (e.g. the per-parameter projections of a distribution head) handled as one layer whose output is
    theirs side by side (its per-window gradient stacks theirs: its squared norm is the sum of theirs, exactly,
    and one norm and one product replace one per layer).

    ``a`` is the input ``[B, d]`` or ``[B, T, d]`` and ``g`` the output gradient ``[B, p]`` or ``[B, T, p]``
    (unscaled; several members: concatenated along the last axis, in ``members`` order), batch first. Members
    are linear layers (tapped or hooked ``nn.Linear``): one weight, at most one bias each.
    """

    __slots__ = ("members", "a", "g", "per_window", "g_sum")

    def __init__(self, members: list[_Record], a: torch.Tensor, g: torch.Tensor) -> None:
        self.members = members
        self.a, self.g = a, g
        self.per_window: torch.Tensor | None = None  # G_i^T A_i [B, p, d] when formed for the norm
        self.g_sum: torch.Tensor | None = None  # output gradient summed over the steps [B, p] (3-D, with a bias)

    @property
    def has_weight(self) -> bool:
        return bool(self.members[0].weights)

    @property
    def n_bias(self) -> int:
        return len(self.members[0].biases)

    def squared_norms(self) -> torch.Tensor:
        """||g_i||^2 over the group's weights and biases, per window ``[B]`` (unscaled G).

        One step (2-D): ``(||a_i||^2 + number of biases) ||g_i||^2``. Several steps: the cheaper (multiply-adds per
        window) of the ghost norm ``sum_ts (A_i A_i^T)_ts (G_i G_i^T)_ts`` (``T^2 (d + p)``) and the per-window
        weight gradients ``G_i^T A_i`` (``T p d``; kept for the clipped sum), plus the bias part from the
        step-summed G.
        """
        a, g, n_bias = self.a, self.g, self.n_bias
        if a.dim() == 2:
            g_sq = _row_sq(g)
            if not self.has_weight:
                return g_sq.mul_(n_bias)
            a_sq = _row_sq(a)
            return (a_sq.add_(n_bias) if n_bias else a_sq).mul_(g_sq)
        b, t, d = a.shape
        p = g.shape[-1]
        out = None
        if self.has_weight:
            if t * (d + p) < p * d:  # ghost norm
                gram_a = torch.bmm(a, a.transpose(1, 2))
                gram_g = torch.bmm(g, g.transpose(1, 2))
                out = torch.linalg.vecdot(gram_a.view(b, -1), gram_g.view(b, -1))
            else:  # per-window products G_i^T A_i [B, p, d], the wider of p and d as the inner (contiguous) axis
                full = torch.bmm(a.transpose(1, 2), g) if p >= d else torch.bmm(g.transpose(1, 2), a)
                self.per_window = full.transpose(1, 2) if p >= d else full
                out = _row_sq(full.view(b, -1))
        if n_bias:
            self.g_sum = g.sum(1)
            bias_sq = _row_sq(self.g_sum)
            out = bias_sq.mul_(n_bias) if out is None else out.add_(bias_sq, alpha=n_bias)
        assert out is not None
        return out

    def add_clipped_sum(self, grads: dict[int, torch.Tensor], factor: torch.Tensor, alpha: float) -> None:
        """Add ``alpha * sum_i factor_i g_i`` into ``grads`` (the members' parameters), after
        :meth:`squared_norms`: one product for the weight (weighting the narrower of A and G, or the per-window
        products when they were formed) and one matrix-vector product for the biases."""
        a, g = self.a, self.g
        members = self.members
        merged = len(members) > 1
        p, d = g.shape[-1], a.shape[-1]
        if self.has_weight:
            if merged:
                w_out = torch.zeros(p, d, dtype=grads[id(members[0].weights[0][0])].dtype, device=g.device)
            else:
                w_out = grads[id(members[0].weights[0][0])]
            w_alpha = 1.0 if merged else alpha
            if self.per_window is not None:
                _add_window_sum(w_out, factor, self.per_window, w_alpha)
            elif a.dim() == 2:
                if d <= p:
                    _addmm(w_out, g.T, a * factor[:, None], w_alpha)
                else:
                    _addmm(w_out, (g * factor[:, None]).T, a, w_alpha)
            else:  # the (window, step) rows, batch first
                if d <= p:
                    _addmm(w_out, g.reshape(-1, p).T, (a * factor[:, None, None]).reshape(-1, d), w_alpha)
                else:
                    _addmm(w_out, (g * factor[:, None, None]).reshape(-1, p).T, a.reshape(-1, d), w_alpha)
            if merged:
                rows = [r.weights[0][0].shape[0] for r in members]
                torch._foreach_add_([grads[id(r.weights[0][0])] for r in members], w_out.split(rows), alpha=alpha)
        if self.n_bias:
            g_sum = g if a.dim() == 2 else self.g_sum
            assert g_sum is not None
            if merged:
                b_sum = g_sum.T @ factor
                rows = [r.biases[0].shape[0] for r in members]
                torch._foreach_add_([grads[id(r.biases[0])] for r in members], b_sum.split(rows), alpha=alpha)
            else:
                _addmv(grads[id(members[0].biases[0])], g_sum.T, factor, alpha)


def _groups(simple: list[tuple[_Record, torch.Tensor, torch.Tensor]]) -> list[_Group]:
    """:class:`_Group` s of single-call, single-block linear records ``(record, input, output gradient)``: layers
    with one trainable weight called on the same input tensor (same storage, shape and strides) and alike in
    dtypes and bias are merged; 3-D and higher inputs are flattened to ``[B, T, d]``, and one step to 2-D."""
    by_input: dict[tuple, list[tuple[_Record, torch.Tensor, torch.Tensor]]] = {}
    out: list[_Group] = []
    for record, a, g in simple:
        if a.dim() > 2:
            if a.dim() > 3:
                b = a.shape[0]
                a, g = a.reshape(b, -1, a.shape[-1]), g.reshape(b, -1, g.shape[-1])
            if a.shape[1] == 1:
                a, g = a[:, 0], g[:, 0]
        if len(record.weights) == 1 and len(record.biases) <= 1:
            key = (a.data_ptr(), a.shape, a.stride(), a.dtype, a.device, g.dtype, bool(record.biases))
            by_input.setdefault(key, []).append((record, a, g))
        else:
            out.append(_Group([record], a, g))
    for members in by_input.values():
        if len(members) == 1:
            out.append(_Group([members[0][0]], members[0][1], members[0][2]))
        else:
            g = torch.cat([g for _, _, g in members], dim=-1)
            out.append(_Group([r for r, _, _ in members], members[0][1], g))
    return out


class PassRecords:
    """What one forward/backward pass recorded for the first ``windows`` windows of its batch
    (:meth:`PerWindowClipper.pass_records`): per linear map (a :class:`_Record`: its weights with their input blocks,
    its biases) the calls' batch-first input blocks and output gradients, and the per-window gradients Opacus formed
    for the other layers (``samples``, by parameter id). ``scale``: the factor from the recorded output gradients to
    per-window loss gradients. Window ``i``'s gradient as the fast path attributes it is a function of row ``i`` of
    these tensors alone."""

    __slots__ = ("records", "samples", "windows", "scale")

    def __init__(self, records: list[tuple[_Record, list[tuple[tuple[torch.Tensor, ...], torch.Tensor]]]],
                 samples: dict[int, torch.Tensor], windows: int, scale: float) -> None:
        self.records = records
        self.samples = samples
        self.windows = windows
        self.scale = scale


class PerWindowClipper:
    """Collects what is needed for per-window norms and clipped sums of one LightningModule.

    Args:
        module: the network (hooks are attached to its layers; remove them with :meth:`remove`).
        loss_reduction: ``"mean"`` if the training loss averages the per-window losses, ``"sum"`` if it sums.
    """

    def __init__(self, module: nn.Module, *, loss_reduction: str = "mean") -> None:
        self.loss_reduction = loss_reduction
        self.enabled = True
        self._records: dict[int, _Record] = {}
        self._handles: list[Any] = []
        self._tapped: list[nn.Linear] = []
        skip: set[int] = set()
        names = {id(sub): name for name, sub in module.named_modules()}
        for sub in module.modules():
            computed = torch.nn.utils.parametrize.is_parametrized(sub) or (
                isinstance(sub, nn.Linear) and not isinstance(sub.weight, nn.Parameter)
            )
            if computed and any(p.requires_grad for p in sub.parameters()):
                raise ConfigurationError(
                    "model", f"layer {names.get(id(sub), '?')!r} ({type(sub).__name__})",
                    "computes its weight from other parameters (a torch.nn.utils.parametrize parametrization such "
                    "as weight_norm, spectral_norm or orthogonal, or the older torch.nn.utils.weight_norm hook): its "
                    "per-window gradients are not supported. Remove the parametrization before DP training "
                    "(torch.nn.utils.parametrize.remove_parametrizations, torch.nn.utils.remove_weight_norm) or "
                    "freeze the layer",
                )
            if _linear_map(sub) and _own_trainable(sub):
                skip.add(id(sub))
                weights = [(sub.weight, 0)] if sub.weight.requires_grad else []
                biases = [sub.bias] if sub.bias is not None and sub.bias.requires_grad else []
                self._records[id(sub)] = _Record(weights, biases)
                if type(sub) is nn.Linear:
                    self._tapped.append(sub)  # switched to _TappedLinear at the end, once every check passed
                else:  # a subclass with its own forward: hooks (autograd also computes its weight gradient)
                    self._handles.append(sub.register_forward_hook(self._linear_hook))
            elif isinstance(sub, DPFastLSTM):
                skip.add(id(sub))
                sub.recorder = self._lstm_record
        owned = [id(p) for r in self._records.values() for p in [w for w, _ in r.weights] + r.biases]
        if len(owned) != len(set(owned)):
            raise ConfigurationError(
                "model", "a parameter shared by several linear layers",
                "tied weights are not supported for DP training (their per-window norms would be wrong)",
            )
        self.native = set(owned)
        self._lstm_records: dict[tuple[int, int], _Record] = {}
        self._lstm_modules = [sub for sub in module.modules() if isinstance(sub, DPFastLSTM)]
        for sub in self._lstm_modules:
            self.native.update(id(p) for p in sub.parameters() if p.requires_grad)
        #: parameters whose autograd gradient must stay None (their layers' backward does not compute it)
        self.gradient_free = {id(p) for sub in [*self._tapped, *self._lstm_modules] for p in sub.parameters()}
        others = [
            sub for sub in module.modules()
            if id(sub) not in skip and _own_trainable(sub) and not _linear_map(sub)
            and not isinstance(sub, (DPFastLSTM, DPRNNBase))
        ]  # Opacus DPGRU/DPRNN re-register their RNNLinear children's parameters under nn.GRU names
        for sub in others:
            if any(id(p) in self.native for p in sub.parameters(recurse=False)):
                raise ConfigurationError(
                    "model", f"a parameter shared by a linear layer and {type(sub).__name__}",
                    "tied weights are not supported for DP training (their per-window norms would be wrong)",
                )
        self._names = {id(p): n for n, p in module.named_parameters()}
        _check_bare_parameters(module, others, self._names)
        self.gsm: GradSampleModule | None = None
        if others:
            self.gsm = _OpacusSubset(module, skip, batch_first=True, loss_reduction=loss_reduction, strict=False)
        for sub in self._tapped:
            sub.__class__ = _TappedLinear
            sub._dpts_tap = self._tap_linear

    # -- recording --------------------------------------------------------------------------------------
    def _active(self, module: nn.Module) -> bool:
        return self.enabled and module.training and torch.is_grad_enabled()

    def _linear_hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if not self._active(module) or not isinstance(output, torch.Tensor) or not output.requires_grad:
            return
        call: list[Any] = [(inputs[0].detach(),), None]
        self._records[id(module)].calls.append(call)
        output.register_hook(lambda g, call=call: call.__setitem__(1, g.detach()))

    def _tap_linear(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return F.linear(x, module.weight, module.bias)
        call: list[Any] = [(x.detach(),), None]
        self._records[id(module)].calls.append(call)
        return _TapLinearFunction.apply(x, module.weight, module.bias, call)

    def _lstm_record(
        self, module: DPFastLSTM, x: torch.Tensor, h_prev: torch.Tensor, delta: torch.Tensor, weights: tuple
    ) -> None:
        """One layer and direction of a DPFastLSTM, called from its backward: inputs ``x_t`` ``[B, T, d]``,
        ``h_t-1`` ``[B, T, H]`` and gate gradients delta_t ``[B, T, 4H]``."""
        if not self.enabled:
            return
        w_ih, w_hh = weights[0], weights[1]
        key = (id(module), id(w_ih))
        record = self._lstm_records.get(key)
        if record is None:
            if w_ih.requires_grad != w_hh.requires_grad:
                raise RuntimeError("DP training needs weight_ih and weight_hh of an LSTM layer both (un)frozen")
            ws = [(w_ih, 0), (w_hh, 1)] if w_ih.requires_grad else []
            record = _Record(ws, [b for b in weights[2:] if b.requires_grad])
            self._lstm_records[key] = record
        record.calls.append([(x, h_prev), delta])

    @contextlib.contextmanager
    def bypassed(self) -> Iterator[None]:
        """Run the module as without the clipper: nothing is recorded, no Opacus hook is attached, and every layer
        (``DPFastLSTM`` included) computes ordinary autograd gradients for its parameters (the isolated per-window
        gradients of :mod:`~lightning_dpts.training.isolated` and the spot check use it). Records made before are
        kept."""
        enabled = self.enabled
        recorders = [(sub, sub.recorder) for sub in self._lstm_modules]
        self.disable()
        for sub, _ in recorders:
            sub.recorder = None
        # Opacus' hooks leave the module while bypassed: a full backward hook wraps the layer's output in an
        # autograd.Function that functorch transforms (vmap) refuse, even with the hooks disabled
        stashed: list[tuple[dict, int, Any]] = []
        for handle in getattr(self.gsm, "autograd_grad_sample_hooks", None) or ():
            hooks = handle.hooks_dict_ref()
            if hooks is not None and handle.id in hooks:
                stashed.append((hooks, handle.id, hooks.pop(handle.id)))
        try:
            yield
        finally:
            for hooks, key, hook in stashed:
                hooks[key] = hook
            for sub, recorder in recorders:
                sub.recorder = recorder
            if enabled:
                self.enable()

    def enable(self) -> None:
        self.enabled = True
        if self.gsm is not None:
            self.gsm.enable_hooks()

    def disable(self) -> None:
        self.enabled = False
        if self.gsm is not None:
            self.gsm.disable_hooks()

    def clear(self, params: list[nn.Parameter]) -> None:
        """Forget everything recorded (also after a forward pass without backward)."""
        for record in [*self._records.values(), *self._lstm_records.values()]:
            for call in record.calls:  # in place: a graph still alive (e.g. a forward without backward) holds it
                call[0], call[1] = (), None
            record.calls.clear()
        if self.gsm is None:  # no Opacus hooks: nothing else was recorded
            return
        for p in params:
            p.grad_sample = None
            if hasattr(p, "_current_grad_sample"):
                del p._current_grad_sample
            if getattr(p, "_forward_counter", 0):
                p._forward_counter = 0
        for module in self.gsm._module.modules():
            for attr in ("activations", "max_batch_len"):
                if hasattr(module, attr):
                    delattr(module, attr)

    def remove(self) -> None:
        """Detach every hook (the module is then as before, apart from the surgery)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for sub in self._tapped:
            sub.__class__ = nn.Linear
            del sub._dpts_tap
        self._tapped.clear()
        for sub in self._lstm_modules:
            sub.recorder = None
        if self.gsm is not None:
            self.gsm.remove_hooks()
            for p in self.gsm._module.parameters():
                for attr in ("grad_sample", "_forward_counter", "_current_grad_sample"):
                    if hasattr(p, attr):
                        delattr(p, attr)
            self.gsm = None

    # -- Algorithm 2 -------------------------------------------------------------------------------------
    def _stacked(self, record: _Record) -> tuple[list[torch.Tensor], torch.Tensor] | None:
        """(A blocks, G), time-major: input blocks ``[T, B, d_k]`` and output gradients ``[T, B, p]`` of all
        calls (G *unscaled*); several calls are concatenated along T. For one call these are transposed views of
        the batch-first records (nothing is copied)."""
        calls = [(a, g) for a, g in record.calls if g is not None]
        if not calls:
            return None

        def tm(t: torch.Tensor) -> torch.Tensor:
            return (t.unsqueeze(1) if t.dim() == 2 else t.reshape(t.shape[0], -1, t.shape[-1])).transpose(0, 1)

        calls = [([tm(a) for a in blocks], tm(g)) for blocks, g in calls]
        sizes = {g.shape[1] for _, g in calls}
        if len(sizes) != 1:
            raise RuntimeError(f"a layer was called with different batch sizes {sorted(sizes)} in one step")
        if len(calls) == 1:
            return calls[0]
        blocks = [torch.cat([a[k] for a, _ in calls], dim=0) for k in range(len(calls[0][0]))]
        return blocks, torch.cat([g for _, g in calls], dim=0)

    def _scale(self, batch_size: int) -> float:
        """Factor from the recorded output gradients to per-window loss gradients (Opacus semantics)."""
        return float(batch_size) if self.loss_reduction == "mean" else 1.0

    def _record_name(self, record: _Record) -> str:
        """The layer of a record, named by its first parameter (e.g. ``'att.in_proj.weight'``)."""
        first = record.weights[0][0] if record.weights else (record.biases[0] if record.biases else None)
        return repr(self._names.get(id(first), "?")) if first is not None else "?"

    def pass_records(self, params: list[nn.Parameter], windows: int, *, copy: bool) -> PassRecords:
        """What this pass recorded for its first ``windows`` windows, kept apart from the clipper (whose records the
        next pass overwrites): the independence probe compares two passes with it
        (:func:`~lightning_dpts.training.probe_batches.largest_window_change`). ``copy``: clone those windows'
        slices so that the pass's full records can be freed (a probe pass on a batch larger than ``windows``)."""

        def keep(t: torch.Tensor) -> torch.Tensor:
            return t[:windows].clone() if copy else t[:windows]

        records = []
        for record in (*self._records.values(), *self._lstm_records.values()):
            calls = [(tuple(keep(a) for a in blocks), keep(g)) for blocks, g in record.calls if g is not None]
            if calls:
                records.append((record, calls))
        samples = {}
        if self.gsm is not None:
            for p in params:
                gs = getattr(p, "grad_sample", None)
                if isinstance(gs, torch.Tensor) and id(p) not in self.native:
                    samples[id(p)] = keep(gs)
        return PassRecords(records, samples, windows, self._scale(self._recorded_batch_size()))

    def _recorded_batch_size(self) -> int:
        """The batch size of the records of this pass (their leading dimension; 0 when nothing was recorded)."""
        for record in (*self._records.values(), *self._lstm_records.values()):
            for _, g in record.calls:
                if g is not None:
                    return int(g.shape[0])
        return 0

    def per_window_gradients(
        self, params: list[nn.Parameter], windows: list[int] | None = None
    ) -> list[torch.Tensor | None]:
        """Materialised per-window gradients ``[B, *p.shape]`` as the batched pass attributes them to each window
        (the probe, the spot check of :class:`~lightning_dpts.training.DPForecastStrategy`, tests; slow for big
        models). ``windows``: only those windows' gradients (``[len(windows), *p.shape]``; cheap for one window).
        """
        found: dict[int, torch.Tensor] = {}
        for record in [*self._records.values(), *self._lstm_records.values()]:
            pair = self._stacked(record)
            if pair is None:
                continue
            blocks, g = pair
            scale = self._scale(g.shape[1])
            if windows is not None:
                if windows and max(windows) >= g.shape[1]:
                    raise _across_windows(self._record_name(record), g.shape[1], max(windows) + 1)
                blocks, g = [a[:, windows] for a in blocks], g[:, windows]
            g = g * scale
            for w, k in record.weights:
                found[id(w)] = torch.einsum("tbp,tbd->bpd", g, blocks[k])
            for bias in record.biases:
                found[id(bias)] = g.sum(0)
        out: list[torch.Tensor | None] = []
        for p in params:
            gs = found.get(id(p), getattr(p, "grad_sample", None) if id(p) not in self.native else None)
            if gs is not None and windows is not None and id(p) not in found:
                if windows and max(windows) >= gs.shape[0]:
                    raise _across_windows(repr(self._names.get(id(p), "?")), gs.shape[0], max(windows) + 1)
                gs = gs[windows]
            out.append(None if gs is None else gs.reshape(gs.shape[0], *p.shape))
        return out

    def noisy_gradients(
        self,
        params: list[nn.Parameter],
        max_grad_norm: float,
        noise_std: float,
        expected_batch_size: int,
        noise: NoiseSource,
    ) -> list[torch.Tensor]:
        """(sum_i clip_C(g_i) + N(0, noise_std^2 I)) / Lambda for every parameter in ``params``.

        The same result as :meth:`clipped_sums` followed by :func:`add_noise_and_average` (the same one noise
        draw of N(0, (noise_std / Lambda)^2) for all coordinates, split in parameter order), but the clipped sums
        are accumulated straight into the noise vector: each book-keeping product is one ``addmm_`` into the
        parameter's slice of the noise, scaled by 1/Lambda (no separate sum tensors, no extra pass).
        The noise is drawn after the per-window norms are checked (a non-finite norm draws none).

        Raises:
            NonFiniteGradientError: a window's gradient norm is not finite (NaN, inf, or a squared norm
                beyond the float range): Algorithm 2's per-window bound C would not hold for it.
        """

        def draw() -> list[torch.Tensor]:
            return _noise_views(params, noise, noise_std / expected_batch_size)

        out = self._clip(params, max_grad_norm, draw, 1.0 / expected_batch_size)
        return [g for g in out if g is not None]

    def clipped_sums(self, params: list[nn.Parameter], max_grad_norm: float) -> list[torch.Tensor | None]:
        """sum_i clip_C(g_i) over the recorded windows, per parameter (``None``: no window touched it).

        The hook point of DP training on several processes: each rank's sums are added over the ranks before
        the one noise draw (:func:`lightning_dpts.distributed.all_reduce_noisy_sum`).

        Raises:
            NonFiniteGradientError: as :meth:`noisy_gradients`.
        """
        return self._clip(params, max_grad_norm, None, 1.0)

    def _check_sources(self, params: list[nn.Parameter], touched: dict[int, torch.Tensor]) -> None:
        """Refuse an autograd gradient that no per-window bound covers (``touched``: the parameters that get a
        clipped sum)."""
        for p in params:
            if id(p) in self.gradient_free and p.grad is not None and bool(p.grad.ne(0).any()):
                raise ConfigurationError(
                    "model", f"parameter {self._names.get(id(p), '?')!r} of shape {tuple(p.shape)}",
                    "gets a gradient from outside its layer's training forward (e.g. used directly in the "
                    "LightningModule's training_step or by another layer, or its layer ran in eval mode during "
                    "training); that contribution has no per-window bound. Use it only through its layer, or "
                    + _BARE_FIX.split(", or ")[-1],
                )
            if id(p) not in touched and p.grad is not None and bool(p.grad.ne(0).any()):
                raise ConfigurationError(
                    "model", f"parameter {self._names.get(id(p), '?')!r} of shape {tuple(p.shape)}",
                    "gets a gradient but no per-window gradient: it is used outside the forward of a layer the "
                    "per-window hooks see (e.g. a bare nn.Parameter used in the LightningModule's training_step); "
                    + _BARE_FIX,
                )

    def _clip(
        self, params: list[nn.Parameter], max_grad_norm: float, draw: Any, alpha: float
    ) -> list[torch.Tensor | None]:
        """``alpha * sum_i clip_C(g_i)`` per parameter, added into ``draw()``'s tensors (one per parameter, drawn
        once the norms are known to be finite) or, with ``draw=None``, into zeros (``None``: untouched)."""
        simple: list[tuple[_Record, torch.Tensor, torch.Tensor]] = []  # one call, one input block: _Group
        stacked = []  # several calls or input blocks (LSTM layers, layers called twice): time-major
        for record in (*self._records.values(), *self._lstm_records.values()):
            calls = record.calls
            if len(calls) == 1:
                blocks, g = calls[0]
                if g is None:
                    continue
                if len(blocks) == 1 and g.dim() == blocks[0].dim() >= 2:
                    simple.append((record, blocks[0], g))
                    continue
            pair = self._stacked(record)
            if pair is not None:
                stacked.append((record, *pair))
        samples: dict[int, torch.Tensor] = {}
        touched: dict[int, torch.Tensor] = {}  # the parameters that get a clipped sum
        for p in params if self.gsm is not None else ():  # Opacus' per-window gradients (other layers)
            gs = getattr(p, "grad_sample", None)
            if isinstance(gs, list):
                raise RuntimeError("several backward passes per optimizer step; DP training needs exactly one")
            if gs is not None and id(p) not in self.native:
                samples[id(p)] = gs
                touched[id(p)] = p
        sizes = {g.shape[0] for _, _, g in simple} | {g.shape[1] for _, _, g in stacked}
        sizes |= {g.shape[0] for g in samples.values()}
        if len(sizes) > 1:
            seen = {self._record_name(r): g.shape[0] for r, _, g in simple}
            seen.update({self._record_name(r): g.shape[1] for r, _, g in stacked})
            seen.update({repr(self._names.get(key, "?")): g.shape[0] for key, g in samples.items()})
            most = max(sizes)
            odd = next((name for name, size in seen.items() if size != most), "?")
            raise _across_windows(odd, min(sizes), most)
        for record, _, _ in (*simple, *stacked):
            for w, _ in record.weights:
                touched[id(w)] = w
            for bias in record.biases:
                touched[id(bias)] = bias
        if not sizes or sizes == {0}:  # no window reached a parameter (no record, or a batch of 0 windows)
            self._check_sources(params, touched)
            grads = {} if draw is None else {id(p): t for p, t in zip(params, draw(), strict=True)}
            return [grads.get(id(p)) for p in params]
        (b,) = sizes
        return _clipped_sums(params, b, simple, stacked, samples, touched, self._scale(b), max_grad_norm, draw,
                             alpha, self._check_sources)


def _clipped_sums(params: list[nn.Parameter], b: int, simple: list[Any], stacked: list[Any],
                  samples: dict[int, torch.Tensor], touched: dict[int, torch.Tensor], scale: float,
                  max_grad_norm: float, draw: Any, alpha: float, check_sources: Any) -> list[torch.Tensor | None]:
    """:meth:`PerWindowClipper._clip`'s arithmetic on the gathered records of a batch of ``b`` windows (``simple``:
    one call and input block, ``stacked``: several, ``samples``: Opacus' per-window gradients; ``touched``: the
    parameters that get a sum; ``scale``: recorded output gradients are ``scale`` times the per-window ones, e.g.
    1/B for a mean loss): the squared per-window norms, their clipping factors, and ``alpha * sum_i clip_C(g_i)``
    added into ``draw()``'s tensors or into zeros."""
    groups = _groups(simple)
    sq: torch.Tensor | None = None
    for group in groups:
        norms = group.squared_norms()
        sq = norms if sq is None else sq.add_(norms)
    formed: list[tuple[list[torch.Tensor] | None, torch.Tensor | None]] = []  # (per-window products, step sum)
    for record, blocks, g in stacked:
        norms, per_window, g_sum = _squared_norms(record, blocks, g)
        sq = norms if sq is None else sq.add_(norms)
        formed.append((per_window, g_sum))
    if sq is None:
        ref = next(iter(samples.values()))
        sq = torch.zeros(b, dtype=ref.dtype, device=ref.device)
    elif scale != 1.0:
        sq.mul_(scale * scale)
    for gs in samples.values():
        sq += torch.linalg.vector_norm(gs.reshape(b, -1), dim=1).square()
    if not bool(torch.isfinite(sq).all()):
        windows = (~torch.isfinite(sq)).nonzero().flatten().tolist()
        raise NonFiniteGradientError(
            f"the gradient of window(s) {windows} of the batch is not finite (or its squared l2 norm "
            "overflows); clipping cannot bound its contribution", windows,
        )
    factor = clip_factors(sq, max_grad_norm)
    check_sources(params, touched)
    grads = {} if draw is None else {id(p): t for p, t in zip(params, draw(), strict=True)}
    for key, p in touched.items():  # zeros for the sums of draw=None, and of parameters not in params
        if key not in grads:
            grads[key] = torch.zeros_like(p)
    native_factor = factor * scale
    for group in groups:
        group.add_clipped_sum(grads, native_factor.to(group.g.dtype), alpha)
    for (record, blocks, g), (per_window, g_sum) in zip(stacked, formed, strict=True):
        weights = native_factor.to(g.dtype)
        if per_window is not None:  # sum_i c_i (G_i^T A_i) from the per-window products
            for (w, _), full in zip(record.weights, per_window, strict=True):
                _add_window_sum(grads[id(w)], weights, full, alpha)
        elif record.weights:
            # sum_i c_i G_i^T A_i: weight whichever of A, G is smaller, then one matrix product per block,
            # over the (window, step) rows in the order in which G is stored
            time_major = g.is_contiguous()
            d_all = sum(blocks[k].shape[-1] for _, k in record.weights)
            if d_all <= g.shape[-1]:
                g_flat = _flat(g, time_major).T
                for w, k in record.weights:
                    _addmm(grads[id(w)].view(g_flat.shape[0], -1), g_flat,
                           _flat(blocks[k], time_major, weights), alpha)
            else:
                g_flat = _flat(g, time_major, weights).T
                for w, k in record.weights:
                    _addmm(grads[id(w)].view(g_flat.shape[0], -1), g_flat, _flat(blocks[k], time_major), alpha)
        if g_sum is not None:  # the record has biases: G summed over the steps, from the norms
            if len(record.biases) == 1:
                _addmv(grads[id(record.biases[0])].view(-1), g_sum.T, weights, alpha)
            else:
                bias_sum = g_sum.T @ weights
                for bias in record.biases:
                    grads[id(bias)].add_(bias_sum, alpha=alpha)
    for key, gs in samples.items():
        grads[key].add_(torch.einsum("i,i...->...", factor.to(gs.dtype), gs), alpha=alpha)
    return [grads.get(id(p)) for p in params]

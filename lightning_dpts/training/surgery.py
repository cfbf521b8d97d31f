"""Model surgery for DP training: swap layers Opacus cannot differentiate per sample for equivalents.

Opacus computes per-sample gradients from forward/backward hooks on *leaf* layers. Fused recurrent layers
(``nn.LSTM``, ``nn.GRU``, ``nn.RNN``) and ``nn.MultiheadAttention`` (whose packed ``in_proj_weight`` is used
through ``F.multi_head_attention_forward``) cannot be hooked that way, so :func:`make_private_compatible`
replaces them, in place and with their weights copied, by layers built from ``nn.Linear`` pieces:

* ``nn.LSTM`` -> :class:`DPFastLSTM` (this module): same parameter names, per-window gradients from one
  recorded projection per layer instead of per-timestep hooks.
* ``nn.GRU`` / ``nn.RNN`` -> :class:`opacus.layers.DPGRU` / ``DPRNN``. Their ``state_dict`` keys are made
  equal to the originals' (Opacus renames the parameters), so checkpoints stay loadable into the unmodified
  model.
* ``nn.MultiheadAttention`` -> :class:`DPCompatibleMultiheadAttention` (this module), whose ``in_proj`` is an
  ``nn.Linear`` holding exactly ``in_proj_weight``/``in_proj_bias``; its ``state_dict`` uses the original
  keys (``in_proj_weight``, ``in_proj_bias``, ``out_proj.*``).

It also makes GluonTS's ``MeanScaler(default_scale=None)`` per-window: that scaler replaces the scale of a
window without observed values by a *batch* statistic, so one window's loss would depend on the other
windows of the batch and the per-window sensitivity C of Algorithm 2 would not hold. The surgery sets a fixed
``default_scale`` (default 1.0) instead.

Every change is recorded in a :class:`Surgery`; :meth:`Surgery.restore` puts the original layers (with the
trained weights) and scaler settings back, so that prediction after training runs the unmodified model.

Layers that mix the windows of a batch and have no per-window equivalent (BatchNorm, InstanceNorm with
running statistics) raise :class:`~lightning_dpts.errors.ConfigurationError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from opacus.layers import DPGRU, DPRNN
from torch import nn
from torch.autograd.function import once_differentiable

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "DPCompatibleMultiheadAttention",
    "DPFastLSTM",
    "Surgery",
    "check_per_window_layers",
    "make_private_compatible",
]


class DPCompatibleMultiheadAttention(nn.Module):
    """``nn.MultiheadAttention`` rebuilt from ``nn.Linear`` layers so Opacus can hook it.

    Supports what transformer encoders/decoders use: ``embed_dim == kdim == vdim``, ``batch_first`` both ways,
    boolean or additive ``attn_mask`` / ``key_padding_mask``, ``is_causal``, attention dropout and
    ``need_weights``. ``add_bias_kv`` and ``add_zero_attn`` are not supported.

    The fused fast paths of ``nn.TransformerEncoderLayer`` are disabled for it (``_qkv_same_embed_dim`` is
    ``False``), so every call goes through :meth:`forward`.
    """

    def __init__(self, source: nn.MultiheadAttention) -> None:
        super().__init__()
        if not source._qkv_same_embed_dim:
            raise ConfigurationError("nn.MultiheadAttention.kdim/vdim", (source.kdim, source.vdim),
                                     "DP surgery supports attention with kdim == vdim == embed_dim only")
        if source.bias_k is not None or source.add_zero_attn:
            raise ConfigurationError("nn.MultiheadAttention.add_bias_kv/add_zero_attn", True,
                                     "DP surgery does not support add_bias_kv or add_zero_attn")
        e = source.embed_dim
        ref = source.in_proj_weight
        has_bias = source.in_proj_bias is not None
        self.embed_dim = e
        self.num_heads = source.num_heads
        self.head_dim = source.head_dim
        self.dropout = float(source.dropout)
        self.batch_first = source.batch_first
        self._qkv_same_embed_dim = False  # keeps nn.Transformer* off their fused fast paths
        self.in_proj_bias = None if not has_bias else torch.empty(0)  # only read by fast-path checks
        self.in_proj = nn.Linear(e, 3 * e, bias=has_bias, device=ref.device, dtype=ref.dtype)
        self.out_proj = nn.Linear(e, e, bias=source.out_proj.bias is not None, device=ref.device, dtype=ref.dtype)
        with torch.no_grad():
            self.in_proj.weight.copy_(source.in_proj_weight)
            self.out_proj.weight.copy_(source.out_proj.weight)
            if has_bias:
                self.in_proj.bias.copy_(source.in_proj_bias)
            if source.out_proj.bias is not None:
                self.out_proj.bias.copy_(source.out_proj.bias)
        self.in_proj.weight.requires_grad_(source.in_proj_weight.requires_grad)
        self.register_state_dict_post_hook(_mha_state_dict_hook)
        self.register_load_state_dict_pre_hook(_mha_load_pre_hook)

    def copy_to(self, target: nn.MultiheadAttention) -> None:
        """Write this module's weights into an ``nn.MultiheadAttention`` of the same shape."""
        with torch.no_grad():
            target.in_proj_weight.copy_(self.in_proj.weight)
            target.out_proj.weight.copy_(self.out_proj.weight)
            if self.in_proj.bias is not None:
                target.in_proj_bias.copy_(self.in_proj.bias)
            if self.out_proj.bias is not None:
                target.out_proj.bias.copy_(self.out_proj.bias)

    def _project(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor):
        e = self.embed_dim
        if query is key and key is value:
            return self.in_proj(query).chunk(3, dim=-1)
        # Distinct inputs: one hooked call per input (Opacus sums the per-sample contributions).
        q = self.in_proj(query)[..., :e]
        k = self.in_proj(key)[..., e : 2 * e]
        v = self.in_proj(value)[..., 2 * e :]
        return q, k, v

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Same contract as ``nn.MultiheadAttention.forward`` for batched (3-D) inputs."""
        if query.dim() != 3:
            raise ValueError("DPCompatibleMultiheadAttention expects batched 3-D inputs")
        if not self.batch_first:
            same_kv = key is value
            same_qk = query is key
            query = query.transpose(0, 1)
            key = query if same_qk else key.transpose(0, 1)
            value = key if same_kv else value.transpose(0, 1)
        b, lq, _ = query.shape
        ls = key.shape[1]
        q, k, v = self._project(query, key, value)
        h, d = self.num_heads, self.head_dim
        q = q.reshape(b, lq, h, d).transpose(1, 2)
        k = k.reshape(b, ls, h, d).transpose(1, 2)
        v = v.reshape(b, ls, h, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (b, h, lq, ls)
        if attn_mask is None and is_causal:
            attn_mask = torch.ones(lq, ls, dtype=torch.bool, device=q.device).triu(1)
        if attn_mask is not None:
            mask = attn_mask
            if mask.dim() == 3:  # (b * h, lq, ls)
                mask = mask.reshape(b, h, lq, ls)
            scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        if key_padding_mask is not None:
            kpm = key_padding_mask[:, None, None, :]
            scores = scores.masked_fill(kpm, float("-inf")) if kpm.dtype == torch.bool else scores + kpm
        weights = torch.softmax(scores, dim=-1)
        dropped = F.dropout(weights, p=self.dropout, training=self.training) if self.dropout > 0 else weights
        out = (dropped @ v).transpose(1, 2).reshape(b, lq, self.embed_dim)
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, (weights.mean(dim=1) if average_attn_weights else weights)


_MHA_RENAMES = (("in_proj.weight", "in_proj_weight"), ("in_proj.bias", "in_proj_bias"))


def _mha_state_dict_hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    for new, old in _MHA_RENAMES:
        if prefix + new in state_dict:
            state_dict[prefix + old] = state_dict.pop(prefix + new)


def _mha_load_pre_hook(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    for new, old in _MHA_RENAMES:
        if prefix + old in state_dict:
            state_dict[prefix + new] = state_dict.pop(prefix + old)



class _InputProjection(torch.autograd.Function):
    """``x W_ih^T + b_ih + b_hh`` whose backward returns only the input gradient (the clipper sums the weights')."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_ih: torch.Tensor, *biases: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(w_ih)
        out = F.linear(x, w_ih)
        for b in biases:
            out = out.add_(b)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (w_ih,) = ctx.saved_tensors
        nb = len(ctx.needs_input_grad) - 2
        return (grad @ w_ih if ctx.needs_input_grad[0] else None), None, *([None] * nb)


class _Recurrence(torch.autograd.Function):
    """The LSTM recurrence of one layer and direction, with a hand-written backward (one autograd node).

    Forward: the fused kernel of ``nn.LSTM`` (``torch._VF.lstm``, one layer, weights detached) gives the hidden
    states, so the output is the one the non-DP model computes; the gate pre-activations
    ``z_t = p_t + h_{t-1} W_hh^T`` are then recomputed for all steps in one product, the activations in bulk
    (gate order i, f, g, o), and the cell states by the elementwise recursion ``c_t = f * c_{t-1} + i * g``.
    Backward runs the recursion for the gate gradients delta_t = dL/dz_t (five operations per step) and returns
    the gradient of the projection ``p_t`` (which *is* delta_t), of ``h_0`` and ``c_0``, and *no* gradient for
    the weights: the clipper computes the clipped per-window sums itself from ``delta`` and the inputs, which
    this function hands to ``record`` as batch-first ``[B, T, .]`` buffers.
    """

    @staticmethod
    def forward(
        ctx: Any, proj: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, seq: torch.Tensor,
        weights: tuple[torch.Tensor, ...], record: Any,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t_len, four_h = proj.shape
        hidden = four_h // 4
        w_hh = weights[1]
        out, h_n, c_n = torch._VF.lstm(  # type: ignore[attr-defined]
            seq, (h0.unsqueeze(0), c0.unsqueeze(0)), list(weights), len(weights) == 4, 1, 0.0, False, False, True
        )
        h_prev = torch.cat([h0.unsqueeze(1), out[:, :-1]], dim=1)
        z = torch.addmm(proj.reshape(-1, four_h), h_prev.reshape(-1, hidden), w_hh.t()).view(b, t_len, four_h)
        acts = torch.sigmoid(z)
        g_ = slice(2 * hidden, 3 * hidden)
        torch.tanh(z[:, :, g_], out=acts[:, :, g_])
        del z
        ig = acts[:, :, :hidden] * acts[:, :, g_]
        f = acts[:, :, hidden : 2 * hidden]
        cs = proj.new_empty(b, t_len + 1, hidden)  # c_0 .. c_T
        cs[:, 0] = c0
        c_steps, ig_steps, f_steps = cs.unbind(1), ig.unbind(1), f.unbind(1)  # per-step views made in one call
        for t in range(t_len):
            torch.addcmul(ig_steps[t], f_steps[t], c_steps[t], out=c_steps[t + 1])
        ctx.save_for_backward(w_hh, h_prev, cs, acts)
        ctx.record = record
        return out, h_n[0], c_n[0]

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_out: torch.Tensor | None, grad_h: torch.Tensor | None, grad_c: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        w_hh, h_prev, cs, acts = ctx.saved_tensors
        b, t_len, four_h = acts.shape
        hidden = four_h // 4
        i, f, g, o = acts.split(hidden, dim=2)
        tc = torch.tanh(cs[:, 1:])
        # per-step factors, all steps at once: delta = [dc * g i(1-i), dc * c_prev f(1-f), dc * i (1-g^2),
        # dh * tanh(c) o(1-o)], and dL/dc_t gets dh * o (1 - tanh(c)^2)
        three = torch.cat([g * i * (1 - i), cs[:, :-1] * f * (1 - f), i * (1 - g * g)], dim=2).view(b, t_len, 3, hidden)
        out_gate = tc * o * (1 - o)
        k = o * (1 - tc * tc)
        del tc
        delta = acts.new_empty(b, t_len, four_h)
        d3 = delta.view(b, t_len, 4, hidden)
        dh = grad_h.clone() if grad_h is not None else acts.new_zeros(b, hidden)
        if grad_out is not None:
            dh.add_(grad_out[:, t_len - 1])
        dc = grad_c.clone() if grad_c is not None else acts.new_zeros(b, hidden)
        k_s, three_s, og_s, f_s = k.unbind(1), three.unbind(1), out_gate.unbind(1), f.unbind(1)
        d3_s, delta_s = d3.unbind(1), delta.unbind(1)
        gout_s = grad_out.unbind(1) if grad_out is not None else None
        for t in range(t_len - 1, -1, -1):
            dc.addcmul_(dh, k_s[t])
            torch.mul(dc.unsqueeze(1), three_s[t], out=d3_s[t][:, :3])
            torch.mul(dh, og_s[t], out=d3_s[t][:, 3])
            dc.mul_(f_s[t])  # dL/dc_{t-1} through c_t = f c_{t-1} + i g
            if t > 0 and gout_s is not None:
                dh = torch.addmm(gout_s[t - 1], delta_s[t], w_hh)
            else:
                dh = delta_s[t] @ w_hh
        if ctx.record is not None:
            ctx.record(h_prev, delta)
        return (delta, (dh if ctx.needs_input_grad[1] else None), (dc if ctx.needs_input_grad[2] else None),
                None, None, None)


class DPFastLSTM(nn.Module):
    """``nn.LSTM`` (without ``proj_size``) unrolled in Python so per-window gradients are cheap to obtain.

    Parameters have ``nn.LSTM``'s names and shapes (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...), so the
    ``state_dict`` is interchangeable with the original. Each layer projects the whole input sequence at once
    (``x W_ih^T + b_ih + b_hh``) and runs only the recurrence step by step. The gradient of the loss with respect
    to that projection is exactly the gate gradient delta_t, so for window i the gradients are
    ``sum_t delta_it [x_it, h_i,t-1]^T`` for ``[W_ih | W_hh]`` and ``sum_t delta_it`` for both biases. When a
    ``recorder`` is attached (by :class:`~lightning_dpts.training.engine.PerWindowClipper`) and the module
    trains with gradients enabled, each layer runs :class:`_InputProjection` and :class:`_Recurrence` (the fused
    kernel forward and a hand-written backward, no autograd gradient for the weights), and the backward pass
    hands the recorder ``x_t``, ``h_t-1`` and delta_t; the clipper treats them like one linear layer with two
    input blocks. Otherwise (no recorder, evaluation) the recurrence is unrolled with ordinary autograd. No
    per-timestep hooks are needed, unlike ``opacus.layers.DPLSTM``.
    """

    def __init__(self, source: nn.LSTM) -> None:
        super().__init__()
        if source.proj_size:
            raise ConfigurationError("nn.LSTM.proj_size", source.proj_size, "DP surgery supports proj_size=0 only")
        self.input_size = source.input_size
        self.hidden_size = source.hidden_size
        self.num_layers = source.num_layers
        self.bias = source.bias
        self.batch_first = source.batch_first
        self.dropout = float(source.dropout)
        self.bidirectional = source.bidirectional
        self.recorder: Any = None
        for name, p in source.named_parameters():
            setattr(self, name, nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad))
        self.train(source.training)

    def _weights(self, layer: int, direction: int) -> tuple[torch.Tensor, ...]:
        sfx = f"_l{layer}" + ("_reverse" if direction else "")
        w_ih, w_hh = getattr(self, "weight_ih" + sfx), getattr(self, "weight_hh" + sfx)
        if self.bias:
            return w_ih, w_hh, getattr(self, "bias_ih" + sfx), getattr(self, "bias_hh" + sfx)
        return w_ih, w_hh

    def _unrolled(
        self, seq: torch.Tensor, weights: tuple[torch.Tensor, ...], h: torch.Tensor, c: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Plain autograd recurrence (no recorder attached: ordinary gradients for every weight)."""
        proj = F.linear(seq, weights[0])
        if self.bias:
            proj = proj + (weights[2] + weights[3])
        hs = []
        w_hh_t = weights[1].t()
        hidden = self.hidden_size
        for step_proj in proj.unbind(1):  # one backward node for all steps (slicing would not be)
            gates = torch.addmm(step_proj, h, w_hh_t)
            act = torch.sigmoid(gates)  # i, f, o (the g quarter is recomputed with tanh below)
            g = torch.tanh(gates[:, 2 * hidden : 3 * hidden])
            c = act[:, hidden : 2 * hidden] * c + act[:, :hidden] * g
            h = act[:, 3 * hidden :] * torch.tanh(c)
            hs.append(h)
        return torch.stack(hs, dim=1), h, c

    def _recorded(
        self, seq: torch.Tensor, weights: tuple[torch.Tensor, ...], h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The recurrence under a recorder: no autograd gradient for the weights; the recorder gets the inputs
        ``x_t`` and ``h_t-1`` and the gate gradients delta_t ``[B, T, .]`` at backward time (one call per layer
        and direction).
        """
        biases = weights[2:] if self.bias else ()
        proj = _InputProjection.apply(seq, weights[0], *biases)
        x = seq.detach()

        def record(h_prev: torch.Tensor, delta: torch.Tensor) -> None:
            self.recorder(self, x, h_prev, delta, weights)

        detached = tuple(w.detach() for w in weights)
        out, h, c = _Recurrence.apply(proj, h0, c0, x, detached, record)
        return out, h, c

    def forward(
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Same contract as ``nn.LSTM.forward`` for (un)batched-first 3-D tensors (no PackedSequence)."""
        if input.dim() != 3:
            raise ValueError("DPFastLSTM expects a 3-D input (PackedSequence and unbatched input are unsupported)")
        x = input if self.batch_first else input.transpose(0, 1)
        b = x.shape[0]
        dirs = 2 if self.bidirectional else 1
        if hx is None:
            zeros = x.new_zeros(self.num_layers * dirs, b, self.hidden_size)
            h0, c0 = zeros, zeros
        else:
            h0, c0 = hx
        record = self.recorder is not None and self.training and torch.is_grad_enabled()
        layer_input = x
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(dirs):
                idx = layer * dirs + direction
                weights = self._weights(layer, direction)
                seq = layer_input.flip(1) if direction else layer_input
                if record and any(w.requires_grad for w in weights):
                    out, h, c = self._recorded(seq, weights, h0[idx], c0[idx])
                else:
                    out, h, c = self._unrolled(seq, weights, h0[idx], c0[idx])
                outputs.append(out.flip(1) if direction else out)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if dirs == 1 else torch.cat(outputs, dim=-1)
            if self.dropout > 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, p=self.dropout, training=True)
        output = layer_input if self.batch_first else layer_input.transpose(0, 1)
        return output, (torch.stack(h_n), torch.stack(c_n))


_RNN_SWAPS: dict[type, type] = {nn.LSTM: DPFastLSTM, nn.GRU: DPGRU, nn.RNN: DPRNN}


def _rnn_state_dict_hook(module: nn.Module, state_dict: dict, prefix: str, local_metadata: Any) -> None:
    # Opacus registers every parameter twice (``l0.ih.weight`` and ``weight_ih_l0``) and filters the internal
    # names only for an unprefixed state_dict; drop them here so a parent's state_dict has nn.LSTM's keys.
    for old in module.old_to_new:  # type: ignore[union-attr]
        state_dict.pop(prefix + old, None)


def _rnn_load_pre_hook(module: nn.Module, state_dict: dict, prefix: str, *args: Any) -> None:
    for old, new in module.old_to_new.items():  # type: ignore[union-attr]
        if prefix + new in state_dict and prefix + old not in state_dict:
            state_dict[prefix + old] = state_dict[prefix + new]  # same tensor: both names share one Parameter


def _dp_rnn(source: nn.RNNBase) -> nn.Module:
    if type(source) is nn.LSTM:
        return DPFastLSTM(source)
    if getattr(source, "proj_size", 0):
        raise ConfigurationError("nn.LSTM.proj_size", source.proj_size, "DP surgery supports proj_size=0 only")
    kwargs: dict[str, Any] = dict(
        num_layers=source.num_layers,
        bias=source.bias,
        batch_first=source.batch_first,
        dropout=source.dropout,
        bidirectional=source.bidirectional,
    )
    if isinstance(source, nn.RNN) and type(source) is nn.RNN:
        kwargs["nonlinearity"] = source.nonlinearity
    dp = _RNN_SWAPS[type(source)](source.input_size, source.hidden_size, **kwargs)
    ref = next(source.parameters())
    dp = dp.to(device=ref.device, dtype=ref.dtype)
    dp.load_state_dict(source.state_dict())  # Opacus renames DP RNN parameters to nn.RNNBase names
    for name, p in dp.named_parameters():
        p.requires_grad_(getattr(source, name).requires_grad)
    dp.train(source.training)
    # Opacus' own filter returns a *copy* of the state_dict, which a parent module ignores; replace it.
    dp._state_dict_hooks.clear()
    dp.register_state_dict_post_hook(_rnn_state_dict_hook)
    dp.register_load_state_dict_pre_hook(_rnn_load_pre_hook)
    return dp


@dataclass
class Surgery:
    """Record of the in-place changes made by :func:`make_private_compatible` (undo with :meth:`restore`)."""

    swaps: list[tuple[nn.Module, str, nn.Module, nn.Module]] = field(default_factory=list)
    scalers: list[tuple[Any, Any]] = field(default_factory=list)

    @property
    def swapped(self) -> list[str]:
        """Human-readable list of what was replaced, e.g. ``['model.rnn: LSTM -> DPLSTM']``."""
        return [f"{type(orig).__name__} -> {type(new).__name__}" for _, _, orig, new in self.swaps]

    def restore(self) -> None:
        """Put the original layers back with the (trained) weights of their replacements; undo scaler fixes."""
        for parent, name, original, replacement in reversed(self.swaps):
            if isinstance(replacement, DPCompatibleMultiheadAttention):
                replacement.copy_to(original)
            else:
                original.load_state_dict(replacement.state_dict())
            original.train(replacement.training)
            setattr(parent, name, original)
        for scaler, value in self.scalers:
            scaler.default_scale = value
        self.swaps.clear()
        self.scalers.clear()


def check_per_window_layers(module: nn.Module) -> None:
    """Raise if ``module`` has layers that mix the windows of a batch (the per-window bound C would fail)."""
    for name, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            raise ConfigurationError(
                "model",
                f"{type(sub).__name__} at '{name}'",
                "BatchNorm normalises with batch statistics, so one window changes every other window's gradient "
                "and the running statistics it stores; use LayerNorm/GroupNorm or switch it off "
                "(GluonTS SimpleFeedForward: batch_norm=False)",
            )
        if isinstance(sub, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)) and not sub.self_attn.batch_first:
            raise ConfigurationError(
                "model",
                f"{type(sub).__name__}(batch_first=False) at '{name}'",
                "per-window gradients need the windows along the first dimension of every layer's input; "
                "build the transformer with batch_first=True",
            )
        if isinstance(sub, nn.modules.instancenorm._InstanceNorm) and sub.track_running_stats:
            raise ConfigurationError(
                "model",
                f"{type(sub).__name__}(track_running_stats=True) at '{name}'",
                "running statistics are computed from private data and released with the model; "
                "set track_running_stats=False",
            )


def _batch_dependent_scalers(module: nn.Module) -> list[Any]:
    try:
        from gluonts.torch.scaler import MeanScaler
    except ImportError:  # pragma: no cover - gluonts is a dependency, but keep the surgery usable without it
        return []
    found = []
    seen: set[int] = set()
    for sub in module.modules():
        for value in vars(sub).values():
            if isinstance(value, MeanScaler) and value.default_scale is None and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
    return found


def make_private_compatible(module: nn.Module, *, scaler_default_scale: float = 1.0) -> Surgery:
    """Swap, in place, every layer Opacus cannot handle for a DP-compatible equivalent (weights copied).

    Args:
        module: the network to train privately (e.g. a GluonTS LightningModule).
        scaler_default_scale: the fixed scale given to GluonTS ``MeanScaler(default_scale=None)`` for windows
            with no observed values (instead of a statistic of the whole batch). Must be > 0.

    Returns:
        A :class:`Surgery`; call :meth:`Surgery.restore` to undo.

    Raises:
        ConfigurationError: for BatchNorm / InstanceNorm with running stats, LSTM projections, or attention
            variants without a DP-compatible equivalent.
    """
    if not (isinstance(scaler_default_scale, (int, float)) and math.isfinite(scaler_default_scale)
            and scaler_default_scale > 0):
        raise ConfigurationError("scaler_default_scale", scaler_default_scale, "must be a finite number > 0")
    check_per_window_layers(module)
    surgery = Surgery()
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in _RNN_SWAPS:
                replacement: nn.Module = _dp_rnn(child)  # type: ignore[arg-type]
            elif type(child) is nn.MultiheadAttention:
                replacement = DPCompatibleMultiheadAttention(child)
                replacement.train(child.training)
            else:
                continue
            setattr(parent, name, replacement)
            surgery.swaps.append((parent, name, child, replacement))
    for scaler in _batch_dependent_scalers(module):
        surgery.scalers.append((scaler, scaler.default_scale))
        scaler.default_scale = float(scaler_default_scale)
    return surgery

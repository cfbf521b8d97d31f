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
        self.in_proj.weight.requires_grad_(source.in_proj_weight.requires_grad)  # frozen stays frozen, each one
        self.out_proj.weight.requires_grad_(source.out_proj.weight.requires_grad)
        if has_bias:
            self.in_proj.bias.requires_grad_(source.in_proj_bias.requires_grad)
        if source.out_proj.bias is not None:
            self.out_proj.bias.requires_grad_(source.out_proj.bias.requires_grad)
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



class _Recurrence(torch.autograd.Function):
    """One LSTM layer and direction with a hand-written backward (one autograd node).

    Everything is time-major (``[T, B, .]``), so that the slice of one time step is a contiguous ``[B, .]``
    block: the small per-step operations then run on dense memory, which halved the backward loop on CPU
    against batch-first buffers (issue 15).

    Forward: the input projection ``p_t = x_t W_ih^T + b_ih + b_hh`` for all steps in one product, written
    into the buffer that then holds the activations (gate order i, f, g, o); then ``z_t = p_t + h_{t-1}
    W_hh^T``, ``g_t = tanh(z_t^g)`` (as ``2 sigmoid(2 z_t^g) - 1``), the sigmoid of the other gates, ``c_t = f
    c_{t-1} + i g`` and ``h_t = o tanh(c_t)`` step by step into preallocated buffers (seven small operations
    per step), keeping the activations, cell states and ``tanh(c_t)`` that the backward needs (no
    recomputation). Against ``nn.LSTM``'s fused CPU kernel with autograd (one thread, project machine, torch 2.13,
    T = 119, H = 40, 24 inputs): 1.65x its forward and 1.33x its forward and backward at Lambda = 64 windows (the
    per-step Python calls; this backward leaves the weight gradients to the clipper), 0.70x and 0.75x at 256; the
    outputs equal the fused kernel's to float32 rounding.

    Backward runs the recursion for the gate gradients delta_t = dL/dz_t = dL/dp_t (five operations per step,
    the per-step factors formed for all steps at once) and returns the gradients of ``x`` (``delta W_ih``),
    ``h_0`` and ``c_0``, and *no* gradient for the weights and biases (they are inputs only so that the output
    needs a gradient even when ``x`` does not): the clipper computes the clipped per-window sums itself from
    ``delta`` and the inputs, which this function hands to ``record`` as ``(h_prev, delta)``, time-major
    ``[T, B, H]`` and ``[T, B, 4H]``.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, w_ih: torch.Tensor, w_hh: torch.Tensor,
        record: Any, *biases: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t_len, b, d = x.shape
        four_h = w_ih.shape[0]
        hidden = four_h // 4
        # tanh(z) = 2 sigmoid(2z) - 1: one sigmoid over all four gates per step, then one cheap affine map for
        # g, instead of a separate tanh (3-10x the cost of sigmoid per element in torch's CPU kernels, measured
        # on the project machine). The g rows of the pre-activations are doubled up front: doubling is exact in
        # binary floating point, so sigmoid sees exactly 2 z_g; the affine map adds at most ~1 ulp of 1 (absolute).
        scale = x.new_ones(four_h)
        scale[2 * hidden : 3 * hidden] = 2.0
        # the input projection x W_ih^T + b_ih + b_hh for all steps at once, written where the activations go
        acts = x.new_empty(t_len, b, four_h)
        x_rows = x.reshape(t_len * b, d)
        w_in = (w_ih.detach() * scale[:, None]).t()
        if biases:
            bias = biases[0].detach() if len(biases) == 1 else biases[0].detach() + biases[1].detach()
            torch.addmm(bias * scale, x_rows, w_in, out=acts.view(t_len * b, four_h))
        else:
            torch.mm(x_rows, w_in, out=acts.view(t_len * b, four_h))
        w_t = (w_hh * scale[:, None]).t()
        g_act = x.new_empty(t_len, b, hidden)  # tanh of the g gate
        cs = x.new_empty(t_len + 1, b, hidden)  # c_0 .. c_T
        hs = x.new_empty(t_len + 1, b, hidden)  # h_0 .. h_T
        tcs = x.new_empty(t_len, b, hidden)  # tanh(c_1) .. tanh(c_T)
        cs[0] = c0
        hs[0] = h0
        minus_one = x.new_full((), -1.0).expand(b, hidden)
        # per-step views, each made once (slicing inside the loop costs as much as the small operations)
        a_s, g_s, c_s, h_s, tc_s = (v.unbind(0) for v in (acts, g_act, cs, hs, tcs))
        i_s, f_s, gz_s, o_s = (acts[:, :, k * hidden : (k + 1) * hidden].unbind(0) for k in range(4))
        for t in range(t_len):
            a_s[t].addmm_(h_s[t], w_t).sigmoid_()
            torch.add(minus_one, gz_s[t], alpha=2, out=g_s[t])  # tanh(z_g) = 2 sigmoid(2 z_g) - 1
            torch.mul(f_s[t], c_s[t], out=c_s[t + 1]).addcmul_(i_s[t], g_s[t])
            torch.mul(o_s[t], torch.tanh(c_s[t + 1], out=tc_s[t]), out=h_s[t + 1])
        ctx.save_for_backward(w_ih, w_hh, hs, cs, acts, g_act, tcs)
        ctx.record = record
        return hs[1:], hs[t_len].clone(), cs[t_len].clone()

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_out: torch.Tensor | None, grad_h: torch.Tensor | None, grad_c: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        w_ih, w_hh, hs, cs, acts, g, tc = ctx.saved_tensors
        t_len, b, four_h = acts.shape
        hidden = four_h // 4
        i, f, _, o = acts.split(hidden, dim=2)
        # per-step factors, all steps at once: delta = [dc * g i(1-i), dc * c_prev f(1-f), dc * i (1-g^2),
        # dh * tanh(c) o(1-o)], and dL/dc_t gets dh * o (1 - tanh(c)^2)
        ds = torch.addcmul(acts, acts, acts, value=-1).view(t_len, b, 4, hidden)  # s(1-s) of every gate
        three = acts.new_empty(t_len, b, 3, hidden)
        torch.mul(ds[:, :, 0], g, out=three[:, :, 0])
        torch.mul(ds[:, :, 1], cs[:-1], out=three[:, :, 1])
        torch.addcmul(i, i, g * g, value=-1, out=three[:, :, 2])
        out_gate = tc * ds[:, :, 3]
        del ds
        k = torch.addcmul(o, o, tc * tc, value=-1)
        delta = acts.new_empty(t_len, b, four_h)
        d3 = delta.view(t_len, b, 4, hidden)
        gout = grad_out.contiguous() if grad_out is not None else None
        dh = grad_h.clone() if grad_h is not None else acts.new_zeros(b, hidden)
        if gout is not None:
            dh.add_(gout[t_len - 1])
        dc_buf = acts.new_zeros(b, 1, hidden)  # dL/dc, with a unit axis to broadcast over three gates
        dc = dc_buf[:, 0]
        if grad_c is not None:
            dc.copy_(grad_c)
        k_s, three_s, og_s, f_s, delta_s = (v.unbind(0) for v in (k, three, out_gate, f, delta))
        d3a_s, d3o_s = d3[:, :, :3].unbind(0), d3[:, :, 3].unbind(0)
        gout_s = gout.unbind(0) if gout is not None else None
        for t in range(t_len - 1, -1, -1):
            dc.addcmul_(dh, k_s[t])
            torch.mul(dc_buf, three_s[t], out=d3a_s[t])
            torch.mul(dh, og_s[t], out=d3o_s[t])
            dc.mul_(f_s[t])  # dL/dc_{t-1} through c_t = f c_{t-1} + i g
            if t > 0 and gout_s is not None:
                dh = torch.addmm(gout_s[t - 1], delta_s[t], w_hh)
            else:
                dh = delta_s[t] @ w_hh
        if ctx.record is not None:
            ctx.record(hs[:-1], delta)
        grad_x = (delta.view(t_len * b, four_h) @ w_ih.detach()).view(t_len, b, -1) if ctx.needs_input_grad[0] else None
        nb = len(ctx.needs_input_grad) - 6
        return (grad_x, (dh if ctx.needs_input_grad[1] else None), (dc if ctx.needs_input_grad[2] else None),
                None, None, None, *([None] * nb))


class DPFastLSTM(nn.Module):
    """``nn.LSTM`` (without ``proj_size``) whose per-window gradients are cheap to obtain.

    Parameters have ``nn.LSTM``'s names and shapes (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...), so the
    ``state_dict`` is interchangeable with the original. When a ``recorder`` is attached (by
    :class:`~lightning_dpts.training.engine.PerWindowClipper`) and the module trains with gradients enabled,
    each layer runs in :class:`_Recurrence` (the input projection ``x W_ih^T + b_ih + b_hh`` of the whole
    sequence at once, its own step loop forward and a hand-written backward, no autograd gradient for the
    weights). The gradient of the loss with respect to the projection
    is exactly the gate gradient delta_t, so for window i the gradients are ``sum_t delta_it [x_it,
    h_i,t-1]^T`` for ``[W_ih | W_hh]`` and ``sum_t delta_it`` for both biases: the backward pass hands the
    recorder ``x_t``, ``h_t-1`` and delta_t (batch-first ``[B, T, .]`` views of time-major buffers), and the
    clipper treats them like one linear layer with two input blocks. No per-timestep hooks are needed, unlike
    ``opacus.layers.DPLSTM``. Otherwise (no recorder, evaluation, no gradient) it runs ``nn.LSTM``'s fused
    kernel with ordinary autograd.
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

    def _recorded(
        self, seq: torch.Tensor, weights: tuple[torch.Tensor, ...], h0: torch.Tensor, c0: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer and direction under a recorder, time-major ``seq`` ``[T, B, d]``: no autograd gradient for
        the weights; the recorder gets the inputs ``x_t`` and ``h_t-1`` and the gate gradients delta_t at
        backward time (one call per layer and direction).
        """
        biases = weights[2:] if self.bias else ()
        x = seq.detach()

        def record(h_prev: torch.Tensor, delta: torch.Tensor) -> None:
            self.recorder(self, x.transpose(0, 1), h_prev.transpose(0, 1), delta.transpose(0, 1), weights)

        # every weight and bias is an input (so the output needs a gradient whenever any of them trains, even
        # when seq does not, e.g. only W_hh trainable in the first layer), but gets none from the backward
        return _Recurrence.apply(seq, h0, c0, weights[0], weights[1], record, *biases)

    def forward(
        self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Same contract as ``nn.LSTM.forward`` for (un)batched-first 3-D tensors (no PackedSequence)."""
        if input.dim() != 3:
            raise ValueError("DPFastLSTM expects a 3-D input (PackedSequence and unbatched input are unsupported)")
        dirs = 2 if self.bidirectional else 1
        b = input.shape[0] if self.batch_first else input.shape[1]
        if hx is None:
            zeros = input.new_zeros(self.num_layers * dirs, b, self.hidden_size)
            hx = (zeros, zeros)
        if not (self.recorder is not None and self.training and torch.is_grad_enabled()):
            flat = [w for layer in range(self.num_layers) for d in range(dirs) for w in self._weights(layer, d)]
            out, h_n, c_n = torch._VF.lstm(  # type: ignore[attr-defined]  # nn.LSTM's fused kernel
                input, hx, flat, self.bias, self.num_layers, self.dropout, self.training, self.bidirectional,
                self.batch_first,
            )
            return out, (h_n, c_n)
        h0, c0 = hx
        layer_input = input.transpose(0, 1) if self.batch_first else input  # time-major [T, B, d]
        h_n, c_n = [], []
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(dirs):
                idx = layer * dirs + direction
                weights = self._weights(layer, direction)
                seq = layer_input.flip(0) if direction else layer_input
                if any(w.requires_grad for w in weights):
                    out, h, c = self._recorded(seq, weights, h0[idx], c0[idx])
                else:  # frozen layer: the fused kernel (autograd still reaches the layers below)
                    out, hn1, cn1 = torch._VF.lstm(  # type: ignore[attr-defined]
                        seq, (h0[idx : idx + 1], c0[idx : idx + 1]), list(weights), self.bias, 1, 0.0, True, False,
                        False,
                    )
                    h, c = hn1[0], cn1[0]
                outputs.append(out.flip(0) if direction else out)
                h_n.append(h)
                c_n.append(c)
            layer_input = outputs[0] if dirs == 1 else torch.cat(outputs, dim=-1)
            if self.dropout > 0 and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, p=self.dropout, training=True)
        output = layer_input.transpose(0, 1) if self.batch_first else layer_input
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

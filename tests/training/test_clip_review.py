"""Adversarial review of the batch-first clipping path (issue 15): ``PerWindowClipper`` against explicit autograd.

Every case builds a small float64 network, computes Algorithm 2's clipped sum sum_i min(1, C / (||g_i|| + 1e-6)) g_i
independently (one autograd pass per window, the concatenated gradient's norm) and compares it with
``clipped_sums`` and ``noisy_gradients`` (noise std 0, so the noise is exactly zero) for a clipping bound that clips
every window and one that clips none. The cases target what the batch-first path decides from shapes and
storage alone:

* the orientation of the per-window products ``[B, p, d]`` / ``[B, d, p]`` when the layer is square (p == d):
  a square ``nn.Linear`` over several steps, the ``out_proj`` of DP attention, a StudentT head of three
  one-output projections on a 3-wide input (merged p == d == 3), and a DPFastLSTM whose record is square;
* merging of layers "called on the same input": views that share ``data_ptr`` but differ in shape, strides
  (transposed, every other column, stride-0 ``expand``), rank (``[B, 1, d]`` squeezed, 4-D flattened), frozen
  weights or biases, a member also called a second time, ``out_features = 1`` / ``in_features = 1``;
* an in-place change of a layer's input after the layer ran (``h += layer(h)``, or centring the batch in place):
  ``nn.Linear`` refuses it in the backward pass, and so must the tapped layer, whose record would otherwise
  hold the changed input (a per-window "gradient" that depends on the other windows: no sensitivity bound);
* parameters passed in another order, as a subset, or one of them twice;
* ``nn.Linear`` subclasses whose forward is not ``F.linear(input, weight, bias)`` (an activation inside, a
  scaled input, a reparametrised weight): G_i^T A_i of the module's input and output gradient is not their
  gradient, so they must get Opacus' per-sample gradients instead;
* gradient checkpointing, reentrant or not (the checkpointed layers run a second time in the backward pass),
  and a second backward pass through a retained graph (refused).

Deterministic: fixed seeds, float64, compared with rtol 1e-10 (no statistical test, no false failures).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.training.engine import PerWindowClipper
from lightning_dpts.training.surgery import DPCompatibleMultiheadAttention, DPFastLSTM

B = 4
BOUNDS = [1e-2, 1e3]  # every window clipped / none clipped


class _SubLinear(nn.Linear):
    """A linear subclass (recorded through forward hooks, with autograd's own weight gradient)."""


def _steps(x: torch.Tensor, t: int) -> torch.Tensor:
    """``[B, d]`` -> ``[B, t, d]``: the window's features at t scales (different per step, contiguous)."""
    return x[:, None, :] * torch.linspace(0.5, 1.5, t, dtype=x.dtype)[None, :, None]


class _Net(nn.Module):
    """Linear layers ``layers`` and a forward ``f(net, x) -> per-window loss [B]``."""

    def __init__(self, layers: list[tuple[int, int, bool]], f: Callable[[_Net, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ls = nn.ModuleList([nn.Linear(i, o, bias=bias) for i, o, bias in layers])
        self.f = f
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self, x)


def _explicit(net: nn.Module, x: torch.Tensor, params: list[nn.Parameter], c: float) -> list[torch.Tensor]:
    """sum_i clip_C(g_i), one autograd pass per window (Algorithm 2 with Opacus' factor)."""
    rows = []
    for i in range(x.shape[0]):
        g = torch.autograd.grad(net(x[i : i + 1]).sum(), params, allow_unused=True)
        g = [torch.zeros_like(p) if t is None else t for t, p in zip(g, params, strict=True)]
        rows.append(torch.cat([t.reshape(-1) for t in g]))
    per_window = torch.stack(rows)
    factor = (c / (per_window.norm(dim=1) + 1e-6)).clamp(max=1.0)
    sums = (factor @ per_window).split([p.numel() for p in params])
    return [t.view(p.shape) for t, p in zip(sums, params, strict=True)]


def _assert_matches(net: nn.Module, x: torch.Tensor, c: float, reduction: str = "sum") -> None:
    params = [p for p in net.parameters() if p.requires_grad]
    want = _explicit(net, x, params, c)
    clipper = PerWindowClipper(net, loss_reduction=reduction)
    try:
        loss = net(x)
        (loss.sum() if reduction == "sum" else loss.mean()).backward()
        for got, w in zip(clipper.clipped_sums(params, c), want, strict=True):
            torch.testing.assert_close(got, w, rtol=1e-10, atol=1e-12)
        noisy = clipper.noisy_gradients(params, c, 0.0, 2, GaussianNoise(resolve_entropy(3)))
        for got, w in zip(noisy, want, strict=True):
            torch.testing.assert_close(got, w / 2, rtol=1e-10, atol=1e-12)
    finally:
        clipper.remove()


def _x(d: int = 6, b: int = B) -> torch.Tensor:
    return torch.randn(b, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


# ---------------------------------------------------------------------------------------------------------
# Square layers: per-window products [B, d, p] with p == d
# ---------------------------------------------------------------------------------------------------------
class _StudentTHead(nn.Module):
    """DeepAR-style: a 3-wide feature per step and one projection per StudentT parameter (merged: p = 3 = d)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(2, 3)
        self.loc, self.scale, self.df = nn.Linear(3, 1), nn.Linear(3, 1), nn.Linear(3, 1)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, 2] -> negative log-likelihood per window
        h = torch.tanh(self.inp(x))
        scale = F.softplus(self.scale(h))[..., 0] + 1e-3
        df = 2.0 + F.softplus(self.df(h))[..., 0]
        return -torch.distributions.StudentT(df, self.loc(h)[..., 0], scale).log_prob(x[..., 0]).sum(1)


class _Attention(nn.Module):
    """A DP attention block (square ``out_proj`` over the steps) after an input projection."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(2, 4)
        self.attn = DPCompatibleMultiheadAttention(nn.MultiheadAttention(4, 2, batch_first=True))
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        return self.attn(h, h, h, need_weights=False)[0].sin().sum((1, 2))


class _Recurrent(nn.Module):
    """DPFastLSTM with d = 6 + 2 = 8 = 4 H (its two-block record is square) and a square head over the steps."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lstm = DPFastLSTM(nn.LSTM(6, 2, batch_first=True).double())
        self.head = nn.Linear(2, 2).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(x)[0]).sin().sum((1, 2))


def _square(t: int) -> _Net:  # Linear(4, 4) once over t steps: per-window products when t (4 + 4) >= 16
    return _Net([(4, 4, True)], lambda n, x: n.ls[0](_steps(x[:, :4], t)).sin().sum((1, 2)))


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("c", BOUNDS)
@pytest.mark.parametrize(
    "case", ["square_5_steps", "square_2_steps", "square_ghost", "studentt_head", "attention", "lstm"]
)
def test_square_layers_over_steps_equal_explicit(case, c, reduction):
    seq = torch.randn(B, 5, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    net, x = {
        "square_5_steps": (_square(5), _x()),
        "square_2_steps": (_square(2), _x()),
        "square_ghost": (_Net([(6, 6, False)], lambda n, x: n.ls[0](_steps(x, 2)).cos().sum((1, 2))), _x()),
        "studentt_head": (_StudentTHead(), seq),
        "attention": (_Attention(), seq),
        "lstm": (_Recurrent(), torch.randn(B, 5, 6, generator=torch.Generator().manual_seed(2), dtype=torch.float64)),
    }[case]
    _assert_matches(net, x, c, reduction)


def test_attention_surgery_keeps_frozen_projections_frozen():
    """A frozen (e.g. pretrained) attention block stays frozen after the DP surgery: no parameter of it becomes
    trainable (it would get a clipped, noisy update and be copied back into the original at the end of fitting)."""
    source = nn.MultiheadAttention(4, 2, batch_first=True).double()
    source.out_proj.bias.requires_grad_(False)
    source.in_proj_bias.requires_grad_(False)
    for frozen_weights in (False, True):
        source.in_proj_weight.requires_grad_(not frozen_weights)
        source.out_proj.weight.requires_grad_(not frozen_weights)
        swapped = DPCompatibleMultiheadAttention(source)
        assert {n: p.requires_grad for n, p in swapped.named_parameters()} == {
            "in_proj.weight": not frozen_weights, "in_proj.bias": False,
            "out_proj.weight": not frozen_weights, "out_proj.bias": False,
        }


# ---------------------------------------------------------------------------------------------------------
# Merging: inputs that share storage but are not the same tensor
# ---------------------------------------------------------------------------------------------------------
def _two(f: Callable, g: Callable, base: Callable = lambda x: x) -> Callable[[_Net, torch.Tensor], torch.Tensor]:
    """Layer 0 on f(s), layer 1 on g(s) for one tensor s = base(x); each output reduced to a per-window loss."""

    def forward(n: _Net, x: torch.Tensor) -> torch.Tensor:
        s = base(x)
        a, b = n.ls[0](f(s)), n.ls[1](g(s))
        return a.sin().flatten(1).sum(1) + b.cos().flatten(1).sum(1)

    return forward


def _same(s: torch.Tensor) -> torch.Tensor:
    return s


def _cube(x: torch.Tensor) -> torch.Tensor:  # [B, 3, 3], contiguous: shares data_ptr and shape with its transpose
    return _steps(x[:, :3], 3)


def _four(x: torch.Tensor) -> torch.Tensor:
    return _steps(x, 4)


_MERGE_CASES: dict[str, tuple[list[tuple[int, int, bool]], Callable]] = {
    "prefix_columns": ([(6, 3, True), (4, 3, True)], _two(_same, lambda s: s[:, :4])),
    "every_other_column": ([(3, 2, True), (3, 2, True)], _two(lambda s: s[:, :3], lambda s: s[:, ::2])),
    "transpose_same_shape": ([(3, 2, True), (3, 2, True)], _two(_same, lambda s: s.transpose(1, 2), _cube)),
    "expand_stride_0": ([(6, 5, True), (6, 2, True)], _two(lambda s: s[:, None].expand(-1, 3, -1), _same)),
    "expand_vs_steps": ([(6, 5, True), (6, 5, True)],
                        _two(lambda s: s[:, :1].expand(-1, 4, -1), _same, _four)),
    "one_step_and_2d": ([(6, 3, True), (6, 3, True)], _two(lambda s: s[:, None], _same)),
    "4d_and_3d": ([(6, 3, True), (6, 3, True)], _two(lambda s: s.view(-1, 2, 2, 6), _same, _four)),
    "4d_transposed": ([(6, 4, True), (6, 4, True)],
                      _two(lambda s: s.view(-1, 2, 2, 6).transpose(1, 2), _same, _four)),
    "time_major_permuted": ([(6, 5, True), (6, 5, True)],
                            _two(lambda s: s.transpose(0, 1).contiguous().transpose(0, 1), _same, _four)),
    "two_inputs_same_shape": ([(6, 3, True), (6, 3, True)], _two(_same, lambda s: s.flip(1))),
    "no_bias_pair": ([(6, 3, False), (6, 3, False)], _two(_same, _same)),
    "bias_and_no_bias": ([(6, 3, True), (6, 3, False)], _two(_same, _same)),
    "out_1_pair": ([(6, 1, True), (6, 1, True)], _two(_same, _same)),
    "in_1_out_1": ([(1, 1, True), (1, 3, True)], _two(lambda s: s[:, 2:3], lambda s: s[:, 2:3])),
}


@pytest.mark.parametrize("c", BOUNDS)
@pytest.mark.parametrize("case", sorted(_MERGE_CASES))
def test_layers_on_shared_storage_equal_explicit(case, c):
    layers, f = _MERGE_CASES[case]
    _assert_matches(_Net(layers, f), _x(), c)


def test_frozen_parts_and_a_second_call_among_merged_layers_equal_explicit():
    """Three layers on one input (weight frozen / bias frozen / both trainable), the last also called again on
    another input (two calls: the stacked path), and a hooked subclass on the same input."""

    def forward(n: _Net, x: torch.Tensor) -> torch.Tensor:
        out = sum(layer(x).sin().sum(1) for layer in n.ls[:3]) + n.ls[3](x).cos().sum(1)
        return out + n.ls[2](x.flip(1)).square().sum(1)

    for c in BOUNDS:
        net = _Net([(6, 2, True)] * 3, forward)
        net.ls.append(_SubLinear(6, 2).double())
        net.ls[0].weight.requires_grad_(False)
        net.ls[1].bias.requires_grad_(False)
        _assert_matches(net, _x(), c)


@pytest.mark.parametrize("b", [1, 2])
def test_single_window_and_one_step_batches_equal_explicit(b):
    seq = torch.randn(b, 1, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    _assert_matches(_StudentTHead(), seq, 1e-2)
    _assert_matches(_StudentTHead(), torch.cat([seq] * 5, dim=1), 1e-2, "mean")


def test_a_linear_output_summed_directly_stride_0_output_gradient():
    """``layer(x).sum()``: the recorded output gradient is an expanded scalar (all strides 0)."""
    net = _Net([(6, 3, True), (6, 6, True)],
               lambda n, x: n.ls[0](_steps(x, 3)).sum((1, 2)) + n.ls[1](_steps(x, 3)).sum((1, 2)))
    for c in BOUNDS:
        _assert_matches(net, _x(), c)


# ---------------------------------------------------------------------------------------------------------
# In-place changes of a recorded input
# ---------------------------------------------------------------------------------------------------------
class _Residual(nn.Module):
    def __init__(self, cls: type[nn.Linear], centre: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = cls(6, 6), nn.Linear(6, 3)
        self.centre = centre
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x)
        if self.centre:  # a's input centred over the batch afterwards: its record would mix the windows
            y = self.a(h)
            h -= h.mean(0, keepdim=True)
            h = h + y
        else:
            h += self.a(h)
        return self.b(h).sin().sum(1)


def _assert_backward_refused(net: nn.Module, match: str) -> None:
    """The backward pass of ``net`` under a clipper raises a ``RuntimeError`` matching ``match``."""
    clipper = PerWindowClipper(net, loss_reduction="sum")
    try:
        with pytest.raises(RuntimeError, match=match):
            net(_x()).sum().backward()
    finally:
        clipper.remove()


@pytest.mark.parametrize("centre", [False, True])
@pytest.mark.parametrize("cls", [nn.Linear, _SubLinear])
def test_an_input_changed_in_place_after_its_layer_ran_is_refused(cls, centre):
    """As for plain autograd: the backward pass raises, and nothing is clipped from the changed input."""
    net = _Residual(cls, centre)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        net(_x()).sum().backward()  # plain nn.Linear (no clipper)
    _assert_backward_refused(net, "modified by an inplace operation")


def test_merged_layers_with_an_in_place_change_between_their_calls_are_refused():
    def forward(n: _Net, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x)
        y = n.ls[0](h)
        h.mul_(2.0)  # the second layer sees the doubled input, the first did not
        return (y + n.ls[1](h)).sin().sum(1)

    net = _Net([(6, 3, True), (6, 3, True)], forward)
    _assert_backward_refused(net, "modified by an inplace operation")


def test_a_second_backward_pass_through_a_retained_graph_is_refused():
    """Algorithm 2 takes one backward pass per step; a tapped layer must not keep (or silently replace) the output
    gradient of one of several passes."""
    net = _Net([(6, 3, True), (3, 2, True)], lambda n, x: n.ls[1](torch.tanh(n.ls[0](x))).sin().sum(1))
    clipper = PerWindowClipper(net, loss_reduction="sum")
    try:
        loss = net(_x()).sum()
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="several backward passes"):
            loss.backward()
    finally:
        clipper.remove()


# ---------------------------------------------------------------------------------------------------------
# The parameter list
# ---------------------------------------------------------------------------------------------------------
def test_params_in_another_order_a_subset_or_repeated_get_their_own_sums():
    net = _StudentTHead()
    x = torch.randn(B, 5, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    params = list(net.parameters())
    want = {id(p): w for p, w in zip(params, _explicit(net, x, params, 1e-2), strict=True)}
    clipper = PerWindowClipper(net, loss_reduction="sum")
    try:
        net(x).sum().backward()
        for chosen in (params[::-1], [params[5], params[0]], [*params, params[2]]):
            for got, p in zip(clipper.clipped_sums(chosen, 1e-2), chosen, strict=True):
                torch.testing.assert_close(got, want[id(p)], rtol=1e-10, atol=1e-12)
        chosen = params[::-1]  # the noise is split in the order of the list given
        sigma, lam = 0.5, 3
        noisy = clipper.noisy_gradients(chosen, 1e-2, sigma, lam, GaussianNoise(resolve_entropy(9)))
        draw = GaussianNoise(resolve_entropy(9)).sample(sum(p.numel() for p in chosen), sigma / lam, torch.float64)
        offset = 0
        for got, p in zip(noisy, chosen, strict=True):
            noise = draw[offset : offset + p.numel()].view(p.shape)
            offset += p.numel()
            torch.testing.assert_close(got, noise + want[id(p)] / lam, rtol=1e-10, atol=1e-12)
    finally:
        clipper.remove()


# ---------------------------------------------------------------------------------------------------------
# Linear subclasses whose forward is not F.linear(input, weight, bias)
# ---------------------------------------------------------------------------------------------------------
class _Activated(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(super().forward(x))


class _ScaledInput(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(3.0 * x, self.weight, self.bias)


class _AbsWeight(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.abs(), self.bias)


class _WithSubclass(nn.Module):
    def __init__(self, cls: type[nn.Linear]) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = cls(6, 3), nn.Linear(6, 2), _SubLinear(3, 2)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.a(x)).sin().sum(1) + self.b(x).cos().sum(1)


_CUSTOM = [_Activated, _ScaledInput, _AbsWeight]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("c", BOUNDS)
@pytest.mark.parametrize("cls", _CUSTOM, ids=lambda cls: cls.__name__)
def test_linear_subclasses_with_their_own_forward_equal_explicit(cls, c, reduction):
    _assert_matches(_WithSubclass(cls), _x(), c, reduction)


# ---------------------------------------------------------------------------------------------------------
# Gradient checkpointing (the layers run again in the backward pass)
# ---------------------------------------------------------------------------------------------------------
class _Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.reentrant = reentrant
        self.a, self.b, self.c = nn.Linear(6, 5), nn.Linear(5, 5), nn.Linear(5, 2)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = checkpoint(lambda t: self.b(torch.tanh(self.a(t))), _steps(x, 4), use_reentrant=self.reentrant)
        return self.c(h).sin().sum((1, 2))


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_equal_explicit(reentrant):
    """The reference takes each window's gradient with ``backward`` (reentrant checkpointing does not support
    ``torch.autograd.grad``; its input must require grad for the parameters inside to get gradients)."""
    x = _x().requires_grad_(True)
    c = 1e-2
    net = _Checkpointed(reentrant)
    params = list(net.parameters())
    rows = []
    for i in range(B):
        for p in params:
            p.grad = None
        net(x[i : i + 1]).sum().backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in params]))
        for p in params:
            p.grad = None
    per_window = torch.stack(rows)
    factor = (c / (per_window.norm(dim=1) + 1e-6)).clamp(max=1.0)
    want = (factor @ per_window).split([p.numel() for p in params])
    clipper = PerWindowClipper(net, loss_reduction="sum")
    try:
        net(x).sum().backward()
        for got, w, p in zip(clipper.clipped_sums(params, c), want, params, strict=True):
            torch.testing.assert_close(got, w.view(p.shape), rtol=1e-10, atol=1e-12)
    finally:
        clipper.remove()



@pytest.mark.parametrize("shape", [(0, 4), (0, 1, 4), (0, 5, 4), (0, 2, 3, 4)], ids=["2d", "one-step", "3d", "4d"])
def test_a_batch_of_no_windows_gives_the_noise_alone(shape: tuple[int, ...]) -> None:
    """A recorded forward of 0 windows (2-D, one-step, 3-D, 4-D inputs; a squared layer and a merged pair on the same
    input): no window contributes, so ``clipped_sums`` is ``None`` (nothing to add) and ``noisy_gradients`` is the
    step's noise draw alone, exactly the draw a second generator with the same seed makes. (It used to raise
    "cannot reshape tensor of 0 elements" from the 3-D and 4-D paths.)"""
    torch.manual_seed(0)
    first, square = nn.Linear(4, 3).double(), nn.Linear(3, 3).double()
    heads = nn.ModuleList([nn.Linear(3, 1).double() for _ in range(2)])
    model = nn.ModuleList([first, square, heads])
    params = list(model.parameters())
    clipper = PerWindowClipper(model)
    clipper.enable()
    h = torch.relu(first(torch.randn(*shape, dtype=torch.float64)))
    h = square(h)
    loss = sum(head(h).sum() for head in heads)
    assert isinstance(loss, torch.Tensor)
    loss.backward()
    assert clipper.clipped_sums(params, 1.0) == [None] * len(params)
    noisy = clipper.noisy_gradients(params, 1.0, 0.7, 8, GaussianNoise(resolve_entropy(3)))
    reference = GaussianNoise(resolve_entropy(3)).sample(sum(p.numel() for p in params), 0.7 / 8, torch.float64)
    assert [g.shape for g in noisy] == [p.shape for p in params]
    assert torch.equal(torch.cat([g.reshape(-1) for g in noisy]), reference)
    clipper.remove()

"""The clipper's summation paths (issue 15) against explicit per-window autograd gradients (Algorithm 2).

``PerWindowClipper.noisy_gradients`` adds the clipped sums straight into the noise vector, takes a batch-first
path for linear layers called once (2-D, one-step, 3-D and 4-D inputs, both norm forms) and merges linear layers
called on the same input (distribution heads, 2-D and 3-D). Each path is checked against the independent
computation: per-window gradients from one autograd pass per window, clipped with Opacus' factor
min(1, C / (||g_i|| + 1e-6)), summed, plus the same seeded noise draw, over Lambda.
float64 throughout; fixed seeds, so every outcome is deterministic.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.training.engine import NonFiniteGradientError, PerWindowClipper, add_noise_and_average

B, T = 6, 5


class _SubLinear(nn.Linear):
    """A linear subclass: per-window records through forward hooks, not the tapped forward."""


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.l1 = nn.Linear(5, 9)  # 2-D, input narrower than output
        self.l2 = nn.Linear(9, 3, bias=False)  # 2-D, input wider than output
        self.l3 = nn.Linear(3, 4)
        self.l3.weight.requires_grad_(False)  # bias only
        self.heads = nn.ModuleList([nn.Linear(4, 1) for _ in range(3)])  # same input: merged
        self.no_bias = nn.Linear(4, 2, bias=False)  # same input, no bias: its own group
        self.sub = _SubLinear(4, 2)
        self.norm = nn.LayerNorm(4)  # Opacus per-sample hooks
        self.twice = nn.Linear(4, 4)  # called twice: stacked along time
        self.pair = nn.ModuleList([nn.Linear(9, 2) for _ in range(2)])  # same 2-D input: merged
        self.wide = nn.Linear(4, 16)  # 2 steps, strided input: ghost norm (T (d + p) < p d)
        self.deep = nn.Linear(4, 3)  # 4-D input: flattened to [B, T, d]
        self.single = nn.Linear(4, 2)  # [B, 1, d]: the one-step form
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, 5] -> per-window loss [B]
        u = torch.tanh(self.l1(x))
        h = self.l3(self.l2(u))
        steps = torch.linspace(0.5, 1.5, T, dtype=x.dtype)
        z = self.norm(h[:, None, :] * steps[None, :, None])  # [B, T, 4]
        z = self.twice(torch.tanh(self.twice(z)))
        out = sum(head(z).square().sum((1, 2)) for head in self.heads)
        out = out + sum(layer(u).tanh().sum(1) for layer in self.pair)
        out = out + self.wide(z[:, 1:3]).sin().sum((1, 2)) + self.deep(z.view(-1, T, 1, 4)).cos().sum((1, 2, 3))
        out = out + self.single(z[:, 2:3]).square().sum((1, 2))
        return out + self.no_bias(z).sin().sum((1, 2)) + self.sub(z).cos().sum((1, 2))


def _explicit(net: _Net, x: torch.Tensor, params: list[nn.Parameter], c: float) -> list[torch.Tensor]:
    """sum_i clip_C(g_i) from one autograd pass per window."""
    grads = []
    for i in range(x.shape[0]):
        g = torch.autograd.grad(net(x[i : i + 1]).sum(), params)
        grads.append(torch.cat([t.reshape(-1) for t in g]))
    per_window = torch.stack(grads)
    factor = (c / (per_window.norm(dim=1) + 1e-6)).clamp(max=1.0)
    flat = factor @ per_window
    return list(flat.split([p.numel() for p in params]))


@pytest.mark.parametrize("c", [1e-3, 1e3])  # every window clipped / none clipped
def test_noisy_gradients_equal_explicit_algorithm_2(c):
    net = _Net()
    params = [p for p in net.parameters() if p.requires_grad]
    x = torch.randn(B, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want_sums = _explicit(net, x, params, c)
    clipper = PerWindowClipper(net, loss_reduction="sum")
    try:
        net(x).sum().backward()
        sums = clipper.clipped_sums(params, c)
        for got, want, p in zip(sums, want_sums, params, strict=True):
            torch.testing.assert_close(got, want.view(p.shape), rtol=1e-10, atol=1e-12)
        some = params[2:]  # without l1's: its recorded layer still counts in every norm, its sum is not returned
        for got, want, p in zip(clipper.clipped_sums(some, c), want_sums[2:], some, strict=True):
            torch.testing.assert_close(got, want.view(p.shape), rtol=1e-10, atol=1e-12)
        lam, sigma = 4, 0.7
        noisy = clipper.noisy_gradients(params, c, sigma, lam, GaussianNoise(resolve_entropy(5)))
        draw = GaussianNoise(resolve_entropy(5)).sample(sum(p.numel() for p in params), sigma / lam, torch.float64)
        reference = add_noise_and_average(sums, params, sigma, lam, GaussianNoise(resolve_entropy(5)))
        offset = 0
        for got, want, ref, p in zip(noisy, want_sums, reference, params, strict=True):
            noise = draw[offset : offset + p.numel()].view(p.shape)
            offset += p.numel()
            torch.testing.assert_close(got, noise + want.view(p.shape) / lam, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    finally:
        clipper.remove()


class _Counting:
    """A noise source that counts its draws."""

    def __init__(self) -> None:
        self.calls = 0

    def sample(self, numel: int, std: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        self.calls += 1
        return torch.zeros(numel, dtype=dtype)


def test_a_non_finite_window_raises_before_any_noise_is_drawn():
    net = _Net()
    params = [p for p in net.parameters() if p.requires_grad]
    x = torch.randn(B, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x[3, 0] = float("nan")
    clipper = PerWindowClipper(net, loss_reduction="sum")
    noise = _Counting()
    try:
        net(x).sum().backward()
        with pytest.raises(NonFiniteGradientError) as err:
            clipper.noisy_gradients(params, 1.0, 1.0, B, noise)
        assert err.value.windows == [3]
        assert noise.calls == 0
        clipper.clear(params)
        net(x[:3]).sum().backward()
        clipper.noisy_gradients(params, 1.0, 1.0, B, noise)
        assert noise.calls == 1  # one draw per step
    finally:
        clipper.remove()

"""Algorithm 2 end to end: the noise on the averaged gradient has std sigma*C/Lambda and one window moves the
noiseless update by at most C/Lambda.

False-failure rate of the statistical test: for a uniformly random seed each of its three checks has a
two-sided rejection probability of at most 1e-6, 5e-7 and 1e-7 (chi-square, normal, normal), so at most
1.6e-6 in total; with the fixed seed below the outcome is deterministic.
"""

from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from scipy import stats

from lightning_dpts.privacy import SamplingSpec
from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.training import DPForecastStrategy, clip_and_noise

from .conftest import LinearModule, SpecDataModule, make_batch, make_module, past_length, trainer

SIGMA, C, LAMBDA = 1.3, 0.7, 8


def _noise(seed: int) -> GaussianNoise:
    """Seeded noise for a reproducible test (never for released models)."""
    return GaussianNoise(resolve_entropy(seed))


class _GradSpy(Callback):
    """Records ``p.grad`` after the strategy has written the noisy gradient (place it after the strategy)."""

    dp_post_processing = True  # the noisy gradients: functions of the released iterates

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append(torch.cat([p.grad.detach().reshape(-1).clone() for p in pl_module.parameters()]))


def _spec(num_series: int = 64, batch_size: int = LAMBDA) -> SamplingSpec:
    return SamplingSpec(num_series=num_series, min_length=30, context_length=5, prediction_length=3,
                        batch_size=batch_size)


def test_noise_on_averaged_gradient_has_std_sigma_c_over_lambda():
    dim, steps = 500, 160
    g = torch.Generator().manual_seed(123)
    # per-window gradients with norms from 0.05 to ~6, so some are clipped and some are not
    xs = [torch.randn(LAMBDA, dim, generator=g) * torch.linspace(0.002, 0.25, LAMBDA)[:, None] for _ in range(8)]
    dm = SpecDataModule(_spec(), [{"x": x} for x in xs])
    spy = _GradSpy()
    t = trainer(max_steps=steps, callbacks=[DPForecastStrategy(SIGMA, C, seed=7), spy])
    t.fit(LinearModule(dim), datamodule=dm)
    assert len(spy.grads) == steps
    residuals = []
    for step, grad in enumerate(spy.grads):
        x = xs[step % len(xs)]
        factor = torch.clamp(C / (x.norm(dim=1) + 1e-6), max=1.0)
        clipped_mean = (factor[:, None] * x).sum(0) / LAMBDA  # the noiseless update of Algorithm 2
        residuals.append(grad - clipped_mean)
    noise = torch.stack(residuals).double()  # (steps, dim)
    n = noise.numel()
    target = SIGMA * C / LAMBDA
    # 1) variance: n * s^2 / target^2 ~ chi2(n) (mean known to be 0)
    statistic = float((noise**2).sum()) / target**2
    lo, hi = stats.chi2.ppf(5e-7, n), stats.chi2.ppf(1 - 5e-7, n)
    assert lo <= statistic <= hi, (statistic / n, "relative variance")
    # 2) mean zero
    z = float(noise.mean()) / (target / math.sqrt(n))
    assert abs(z) <= stats.norm.ppf(1 - 2.5e-7)
    # 3) fresh noise every step: lag-1 correlation between consecutive steps
    a, b = noise[1:].reshape(-1), noise[:-1].reshape(-1)
    r = float((a * b).sum() / (a.norm() * b.norm()))
    assert abs(r) * math.sqrt(a.numel()) <= stats.norm.ppf(1 - 5e-8)


def _single_step_grad(module, batch, seed: int = 3) -> torch.Tensor:
    spy = _GradSpy()
    dm = SpecDataModule(_spec(), [batch])
    t = trainer(max_steps=1, callbacks=[DPForecastStrategy(SIGMA, C, seed=seed), spy])
    t.fit(module, datamodule=dm)
    return spy.grads[0]


def test_single_window_influence_is_bounded_by_c_over_lambda_linear():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(LAMBDA, 20, generator=g)
    x[2] *= 1e6  # a window with a huge gradient
    with_window = _single_step_grad(LinearModule(20), {"x": x})
    without = _single_step_grad(LinearModule(20), {"x": torch.cat([x[:2], x[3:]])})  # same seed: same noise
    influence = float((with_window - without).norm())
    assert influence <= C / LAMBDA * (1 + 1e-5)
    assert influence >= C / LAMBDA * (1 - 1e-4)  # and the bound is attained by the huge window


@pytest.mark.parametrize("name", ["simple_feedforward", "deepar"])
def test_single_window_influence_is_bounded_for_gluonts_models(name):
    g = torch.Generator().manual_seed(0)
    module = make_module(name)
    batch = make_batch(module, LAMBDA, g)
    batch["future_target"][2] = 1e6  # an outlier window
    spec = SamplingSpec(num_series=64, min_length=40, context_length=past_length(module), prediction_length=4,
                        batch_size=LAMBDA)

    def run(b):
        spy = _GradSpy()
        t = trainer(max_steps=1, callbacks=[DPForecastStrategy(SIGMA, C, seed=3), spy])
        t.fit(make_module(name), datamodule=SpecDataModule(spec, [b]))
        return spy.grads[0]

    influence = float((run(batch) - run({k: torch.cat([v[:2], v[3:]]) for k, v in batch.items()})).norm())
    assert influence <= C / LAMBDA * (1 + 1e-4)


def test_clip_and_noise_matches_algorithm_2_without_noise_and_divides_by_expected_batch_size():
    g = torch.Generator().manual_seed(1)
    params = [torch.zeros(3, 2), torch.zeros(4)]
    samples = [torch.randn(5, 3, 2, generator=g) * 3, torch.randn(5, 4, generator=g) * 3]
    out = clip_and_noise(samples, params, 1.5, 0.0, 16, _noise(0))
    flat = torch.cat([s.reshape(5, -1) for s in samples], dim=1)
    factor = torch.clamp(1.5 / (flat.norm(dim=1) + 1e-6), max=1.0)
    want = (factor[:, None] * flat).sum(0) / 16  # divided by Lambda=16, not by the 5 windows present
    torch.testing.assert_close(torch.cat([o.reshape(-1) for o in out]), want)
    # a parameter without per-window gradients gets noise only
    out = clip_and_noise([None], [torch.zeros(10000)], 1.0, 2.0, 4, _noise(0))
    assert abs(float(out[0].std()) - 0.5) < 0.02

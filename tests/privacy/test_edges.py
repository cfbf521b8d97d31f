"""Edges of the accountant (issue 9, item 9): small delta, lambda = T, delta in [0, 1], bounded read-outs.

References are closed forms of the Gaussian mechanism (tests/privacy/reference.py), independent of the package.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy.special import log_ndtr, ndtr

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import NeighbouringRelation, SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.privacy.pld import MAX_COMPOSED_POINTS, epsilon_for_delta
from lightning_dpts.privacy.profiles import PrivacyProfile

from ..work import count_kernel_work
from . import reference as R

# rho = 1 (every series every step), T = 5 <= k = 7, so r = 1: each step is a Gaussian mechanism with
# distance 2C (Theorem 4.4 with q = 1), i.e. mu = 2 / sigma per step and 2 sqrt(n) / sigma after n steps.
FULL = dict(num_series=10, min_length=6, context_length=5, prediction_length=2, batch_size=10)


def _gaussian_spec_epsilon(steps: int, delta: float, sigma: float) -> float:
    return R.gaussian_epsilon(delta, 2.0 * math.sqrt(steps) / sigma)


@pytest.mark.parametrize("steps,delta", [(1, 1e-15), (1, 1e-12), (10_000, 1e-12), (200, 1e-9), (2, 1e-13)])
def test_small_delta_is_finite_and_tight(steps, delta):
    sigma = 50.0 if steps > 100 else 2.0
    eps = StructuredSubsamplingAccountant(SamplingSpec(**FULL), sigma).epsilon(steps, delta)
    want = _gaussian_spec_epsilon(steps, delta, sigma)
    assert math.isfinite(eps)
    assert want * (1 - 1e-6) <= eps <= want * 1.01, (eps, want)


AUGMENTED = SamplingSpec(num_series=400, min_length=29, context_length=20, prediction_length=5, batch_size=32,
                         relation=NeighbouringRelation(value_bound=1.0), context_noise=0.0, forecast_noise=10.0)


@pytest.mark.parametrize("spec,sigma,steps", [(SamplingSpec(**FULL), 3.0, 50), (AUGMENTED, 1.0, 400)])
def test_epsilon_is_monotone_in_delta_and_steps(spec, sigma, steps):
    acc = StructuredSubsamplingAccountant(spec, sigma)
    deltas = [1e-4, 1e-5, 2e-6, 1e-6, 9.9e-7, 1e-7, 1e-9, 1e-12]
    values = [acc.epsilon(steps, d) for d in deltas]
    assert all(math.isfinite(v) for v in values)
    assert all(a <= b for a, b in zip(values, values[1:], strict=False)), values
    by_steps = [acc.epsilon(n, 1e-7) for n in (1, 2, 3, 10, 11, steps)]
    assert all(a <= b for a, b in zip(by_steps, by_steps[1:], strict=False)), by_steps


def test_delta_lies_in_the_unit_interval():
    acc = StructuredSubsamplingAccountant(SamplingSpec(num_series=100, min_length=10, context_length=5,
                                                       prediction_length=2, batch_size=10), 1.0)
    for steps in (1, 2, 100):
        for eps in (0.0, 1.0, 50.0, 1e4):
            value = acc.delta(steps, eps)
            assert 0.0 <= value <= 1.0, (steps, eps, value)
    assert acc.delta(1, 50.0) < 1e-100
    # delta is the inverse of epsilon
    eps = acc.epsilon(100, 1e-8)
    assert acc.delta(100, eps) <= 1e-8 * (1 + 1e-9)


@pytest.mark.parametrize("sigma", [1.0, 2.0])
def test_lambda_equal_to_t(sigma):
    # T = 9 start positions, lambda = 9: every window of a sampled series is used (r = 1), k = 7.
    spec = SamplingSpec(num_series=100, min_length=10, context_length=5, prediction_length=2, batch_size=45,
                        instances_per_series=9, bottom_level="poisson")
    acc = StructuredSubsamplingAccountant(spec, sigma)
    rho, mu = 5 / 100, 2 * 7 / sigma  # Theorem F.2: (1 - rho) identity + rho Gaussian at distance 2k C

    def one_step_delta(e: float) -> float:
        return rho * R.gaussian_delta(e, mu)

    want = optimize.brentq(lambda e: one_step_delta(e) - 1e-5, 0.0, 700.0, xtol=1e-10)
    got = acc.epsilon(1, 1e-5)
    assert math.isfinite(got) and want * (1 - 1e-6) <= got <= want * (1 + 1e-6)
    two = acc.epsilon(2, 1e-5)
    assert got <= two < 2 * got + 1  # finite, and no more than basic composition allows


@pytest.mark.slow  # the same budgets run through `dpts privacy steps` in tests/test_cli_fuzz.py (REPORTED)
def test_huge_budgets_are_bounded_in_work(monkeypatch):
    """Work is counted, not timed: the FFT and convolution points of every composition the searches run (measured,
    Nov 2026: 53 M points in 1,303 kernel calls for the three budgets and the refusal); at most 32 compositions of
    the largest size the accountant allows. A search composing one step at a time would make 10^9 calls."""
    acc = StructuredSubsamplingAccountant(SamplingSpec(num_series=100, min_length=10, context_length=5,
                                                       prediction_length=2, batch_size=10), 1.0)
    work = count_kernel_work(monkeypatch)
    for budget in (1000.0, 1e6, 1e20):
        try:  # either the exact answer, or a refusal that names the option and what is known to fit
            steps = acc.max_steps(budget, 1e-5)
            assert acc.epsilon(steps, 1e-5) <= budget < acc.epsilon(steps + 1, 1e-5)
        except ConfigurationError as err:
            # beyond the memory bound (before issue 26) or beyond the search limit (now: huge counts compose by
            # squaring in bounded memory)
            assert err.parameter == "epsilon" and ("at least" in err.requirement or "limit=" in err.requirement)
    with pytest.raises(ConfigurationError) as err:
        acc.epsilon(10**20, 1e-5)
    assert err.value.parameter == "steps"
    assert work.total_points <= 32 * MAX_COMPOSED_POINTS and work.total_calls <= 5000, dict(work.calls)


@pytest.mark.parametrize("delta", [0.0, 1e-19, 1.0, float("nan")])
def test_delta_range_is_enforced(delta):
    acc = StructuredSubsamplingAccountant(SamplingSpec(**FULL), 2.0)
    with pytest.raises(ConfigurationError) as err:
        acc.epsilon(10, delta)
    assert err.value.parameter == "delta" and "1e-18" in err.value.requirement


def test_refined_grid_falls_back_to_the_coarse_one_for_long_runs():
    # The paper's traffic configuration refines the loss grid; many steps must still be accounted.
    spec = SamplingSpec(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256)
    acc = StructuredSubsamplingAccountant(spec, 4.0)
    values = [acc.epsilon(n, 1e-7) for n in (10_000, 1_000_000)]
    assert np.all(np.isfinite(values)) and values[0] < values[1]


def test_dropped_mixture_components_do_not_block_small_delta():
    # Theorem F.2 with k = 48 binomial components: the negligible ones are dropped and accounted as perfectly
    # distinguishable; that floor must not make the fine (delta < 1e-6) truncation unreachable.
    spec = SamplingSpec(num_series=148, min_length=213, context_length=36, prediction_length=12, batch_size=32,
                        bottom_level="poisson")
    acc = StructuredSubsamplingAccountant(spec, 4.0)
    values = [acc.epsilon(n, 1e-7) for n in (1, 4, 100)]
    assert all(math.isfinite(v) for v in values) and values == sorted(values)
    assert acc.epsilon(100, 1e-7) >= acc.epsilon(100, 1e-6)


@pytest.mark.parametrize("mu", [0.02, 0.7, 3.0, 12.0])
def test_one_unit_epsilon_is_just_above_the_closed_form_root(mu):
    """epsilon_for_delta on the Gaussian mechanism's closed-form profile (Dong, Roth & Su 2022, Corollary 2.13),
    against scipy's root of the same closed form: never below the root, within rtol above it; and its work is
    bounded by counting the profile's calls (a bisection to 1e-10 makes about 35)."""
    calls = []

    def closed_form(e: float) -> float:  # R.gaussian_delta, with e^eps Phi(.) formed in logs (no overflow)
        return float(ndtr(-e / mu + mu / 2) - math.exp(e + log_ndtr(-e / mu - mu / 2)))

    def upper_half(log_alpha: np.ndarray) -> np.ndarray:
        calls.append(log_alpha.size)
        return np.array([max(closed_form(float(e)), 0.0) for e in log_alpha])

    profile = PrivacyProfile("Gaussian", "tight", "N(mu, 1) vs N(0, 1)", upper_half)
    for delta in (1e-3, 1e-7, 1e-15, 1e-27):
        for rtol in (1e-6, 1e-10):
            calls.clear()
            got = epsilon_for_delta(profile, delta, rtol=rtol)
            root = optimize.brentq(lambda e, d=delta: closed_form(e) - d, 0.0, 1e4, xtol=1e-15, rtol=1e-15)
            assert root * (1 - 1e-13) <= got <= root * (1 + rtol) + 1e-15, (delta, rtol, got, root)
            assert len(calls) <= 16, (delta, rtol, len(calls))


def test_one_unit_epsilon_is_checked_alone_when_a_batched_evaluation_disagrees():
    """A profile whose batched evaluations read low (as round-off in a batched threshold search could): the value
    returned must still pass the check of one point alone, never below the root of the single-point profile."""
    from scipy.special import log_ndtr, ndtr

    mu = 1.5

    def closed_form(e: float) -> float:
        return max(float(ndtr(-e / mu + mu / 2) - math.exp(e + log_ndtr(-e / mu - mu / 2))), 0.0)

    def upper_half(log_alpha: np.ndarray) -> np.ndarray:
        shift = 0.05 if log_alpha.size > 1 else 0.0  # batches see the profile 0.05 further right: too optimistic
        return np.array([closed_form(max(float(e) + shift, 0.0)) for e in log_alpha])

    profile = PrivacyProfile("Gaussian", "tight", "N(mu, 1) vs N(0, 1)", upper_half)
    root = optimize.brentq(lambda e: closed_form(e) - 1e-6, 0.0, 100.0, xtol=1e-14)
    got = epsilon_for_delta(profile, 1e-6, rtol=1e-9)
    assert closed_form(got) <= 1e-6 and got >= root * (1 - 1e-12)

"""Huge step counts (issue 26, item 2) against the closed-form composition of the Gaussian mechanism.

rho = 1 and T = 5 <= k = 7 (r = 1): each step is a Gaussian mechanism with distance 2C (Theorem 4.4 with q = 1);
T steps at noise multiplier sigma are mu-GDP with mu = 2 sqrt(T) / sigma, and delta(eps) has the exact form of
tests/privacy/reference.py. sigma is scaled with T so that the composed epsilon stays the same.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.privacy.pld import split_to_grid

from . import reference as R

FULL = SamplingSpec(num_series=10, min_length=6, context_length=5, prediction_length=2, batch_size=10)

# Measured relative excess (docs/privacy.md): <= 0.006% up to 10^8 steps, <= 0.03% at 10^9 (composition by
# squaring beyond 10^6 compositions); the test allows 0.1%, ten times the target of the issue (1%) tighter.
BOUND = 1.001


@pytest.mark.parametrize("steps", [10**e for e in range(10)])
@pytest.mark.parametrize("mu,delta", [(1.0, 1e-6), (0.3, 1e-7)])
def test_gaussian_composition_from_one_to_a_billion_steps(steps, mu, delta):
    sigma = 2.0 * math.sqrt(steps) / mu
    got = StructuredSubsamplingAccountant(FULL, sigma).epsilon(steps, delta)
    want = R.gaussian_epsilon(delta, mu)
    assert got >= want * (1 - 1e-9), (got, want)  # sound
    assert got <= want * BOUND, (got, want)


@pytest.mark.slow
@pytest.mark.parametrize("steps", [3 * 10**6, 123_456_789, 999_999_937, 12_345_678_901])
@pytest.mark.parametrize("mu,delta", [(3.0, 1e-7), (1.0, 1e-12), (0.1, 1e-6)])
def test_gaussian_composition_at_odd_huge_counts(steps, mu, delta):
    """Counts that are not powers of ten (the binary expansion of the squaring), more sigmas and deltas; 1.2e10
    steps within 0.5%."""
    sigma = 2.0 * math.sqrt(steps) / mu
    got = StructuredSubsamplingAccountant(FULL, sigma).epsilon(steps, delta)
    want = R.gaussian_epsilon(delta, mu)
    assert want * (1 - 1e-9) <= got <= want * (1.005 if steps > 10**9 else BOUND), (got, want)


def test_beyond_the_accurate_range_the_overstatement_is_stated():
    """10^11 steps: epsilon stays an upper bound, about 3.6% high; the accountant says so (a RuntimeWarning and
    excess_estimate), within a factor 1.5 of the true excess measured against the closed form."""
    steps, mu, delta = 10**11, 1.0, 1e-6
    acc = StructuredSubsamplingAccountant(FULL, 2.0 * math.sqrt(steps) / mu)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = acc.epsilon(steps, delta)
    want = R.gaussian_epsilon(delta, mu)
    assert got >= want
    stated = acc.excess_estimate(acc.compositions(steps), delta)
    true_excess = got / want - 1
    assert true_excess / 1.5 <= stated <= true_excess * 1.5, (stated, true_excess)
    assert any(issubclass(w.category, RuntimeWarning) and "overstated" in str(w.message) for w in caught)


def _delta(losses: np.ndarray, probs: np.ndarray, eps: float) -> float:
    """delta(eps) = sum p (1 - e^{eps - l})_+ of a finite PLD (independent of the package's read-outs)."""
    return float(np.sum(probs * np.maximum(0.0, -np.expm1(eps - losses))))


def test_split_to_grid_keeps_both_masses_and_raises_delta():
    """The re-gridding of the squaring: every atom split onto the coarser grid keeps its P-mass and its Q-mass
    (so the new pair post-processes into the old one) and delta(eps) never falls, on a random pmf."""
    rng = np.random.default_rng(26)
    h, lower = 1e-3, -700
    probs = rng.random(1500)
    probs /= probs.sum()
    losses = (lower + np.arange(probs.size)) * h
    coarse, first, out = split_to_grid(h, lower, probs, 16)
    new_losses = (first + np.arange(out.size)) * coarse
    assert coarse == pytest.approx(16e-3) and np.all(out >= 0)
    assert out.sum() == pytest.approx(probs.sum(), rel=1e-13)
    assert out @ np.exp(-new_losses) == pytest.approx(probs @ np.exp(-losses), rel=1e-13)
    for eps in np.linspace(0.0, 0.9, 37):
        assert _delta(new_losses, out, eps) >= _delta(losses, probs, eps) * (1 - 1e-12)

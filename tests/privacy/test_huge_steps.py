"""Huge step counts (issue 26, item 2) against the closed-form composition of the Gaussian mechanism.

rho = 1 and T = 5 <= k = 7 (r = 1): each step is a Gaussian mechanism with distance 2C (Theorem 4.4 with q = 1);
T steps at noise multiplier sigma are mu-GDP with mu = 2 sqrt(T) / sigma, and delta(eps) has the exact form of
tests/privacy/reference.py. sigma is scaled with T so that the composed epsilon stays the same.
"""

from __future__ import annotations

import math

import pytest

from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant

from . import reference as R

FULL = SamplingSpec(num_series=10, min_length=6, context_length=5, prediction_length=2, batch_size=10)

# Measured relative excess (docs/privacy.md): <= 0.7% up to 10^7 steps, about 1% at 10^8, 4-11% at 10^9 (the
# grid that fits 2^21 points is then too coarse for 10^9 compositions, and the unit's round-off adds up).
BOUND = {10**8: 1.02, 10**9: 1.12}


@pytest.mark.parametrize("steps", [10**e for e in range(10)])
@pytest.mark.parametrize("mu,delta", [(1.0, 1e-6), (0.3, 1e-7)])
def test_gaussian_composition_from_one_to_a_billion_steps(steps, mu, delta):
    sigma = 2.0 * math.sqrt(steps) / mu
    got = StructuredSubsamplingAccountant(FULL, sigma).epsilon(steps, delta)
    want = R.gaussian_epsilon(delta, mu)
    assert got >= want * (1 - 1e-9), (got, want)  # sound
    assert got <= want * BOUND.get(steps, 1.01), (got, want)

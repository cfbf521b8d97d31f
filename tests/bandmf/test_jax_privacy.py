"""Against jax_privacy 2.0's Monte Carlo accounting of BandMF with b-min-sep sampling (slow; skipped if absent)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lightning_dpts.privacy.montecarlo import BandMFMechanism, hockey_stick_estimate

pytestmark = pytest.mark.slow

sample_generation = pytest.importorskip("jax_privacy.experimental.monte_carlo.sample_generation")
batch_selection = pytest.importorskip("jax_privacy.batch_selection")


def _terms(losses: np.ndarray, eps: float) -> np.ndarray:
    return -np.expm1(np.minimum(eps - losses, 0.0))


@pytest.mark.parametrize("n,c,p,sigma,positive", [
    (200, (0.8, 0.5, 0.3), 0.05, 0.9, True),
    (300, (1.0,), 0.02, 0.7, True),
    (400, (0.6, 0.5, 0.4, 0.3, 0.2, 0.2, 0.15, 0.1), 0.03, 1.2, True),
    (200, (0.8, 0.5, 0.3), 0.05, 0.9, False),
])
def test_delta_agrees_with_jax_privacy(n, c, p, sigma, positive):
    """Two independent Monte Carlo estimates agree within 5 combined standard errors (false-failure < 1e-6 each)."""
    m = 40_000
    mech = BandMFMechanism(n, c, p, sigma)
    ours = mech.privacy_loss_samples(np.random.default_rng(1), m, "remove" if positive else "add")
    strategy = batch_selection.BMinSepSampling(sampling_prob=p, iterations=n, min_sep=len(c), warm_start=True)
    theirs, _ = sample_generation.get_privacy_loss_sample(strategy, sigma, np.asarray(c), seed=2,
                                                          positive_sample=positive, num_samples=m)
    theirs = np.asarray(theirs, dtype=np.float64)
    for eps in (0.5, 1.0, 2.0):
        a, b = _terms(ours, eps), _terms(theirs, eps)
        se = math.sqrt(a.var() / m + b.var() / m)
        assert abs(a.mean() - b.mean()) < 5 * se + 1e-6, (eps, a.mean(), b.mean(), se)
        assert hockey_stick_estimate(ours, eps) == pytest.approx(a.mean())

"""Monte Carlo check of the exact release profile against the actual mechanism.

We run :class:`TimeDomainSubsampling` on two neighbouring windows and estimate the hockey-stick divergence
H_{e^eps}(M(x) || M(x')) = E_{o ~ M(x)}[(1 - e^{eps - L(o)})_+] from the privacy loss L(o) of the released
(J, z_J) (the imputed output determines z_J: imputation keeps the sampled values). Each estimate is a mean of
N i.i.d. values in [0, 1]; we accept |estimate - formula| <= 5 standard errors (+1e-4 for the tiny-variance
regime). By the CLT the false-failure rate is P(|Z| > 5) ~ 6e-7 per comparison, < 1e-5 for the whole file.
Seeds are fixed, so the outcome is deterministic on a given numpy version.
"""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dpts.privacy.spec import NeighbouringRelation
from lightning_dpts.release import ReleaseSpec, TimeDomainSubsampling, exact_release_delta

N = 100_000
T = 12
Z = 5.0


def _losses(x: np.ndarray, x_prime: np.ndarray, mech: TimeDomainSubsampling, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out, mask = mech.privatize(np.broadcast_to(x, (N, T)), rng, return_mask=True)
    z = np.where(mask, out, 0.0)
    s2 = mech.noise_std**2
    per_step = ((z - x_prime) ** 2 - (z - x) ** 2) / (2 * s2)
    return np.where(mask, per_step, 0.0).sum(axis=1)


def _estimate(losses: np.ndarray, eps: float) -> tuple[float, float]:
    vals = np.maximum(0.0, -np.expm1(eps - losses))
    return float(vals.mean()), float(vals.std(ddof=1) / np.sqrt(vals.size))


@pytest.mark.parametrize(("p", "w", "v", "s", "imputation"), [(0.5, 4, 0.5, 0.5, "linear"),
                                                              (0.75, 6, 0.1, 0.12, "mean"),
                                                              (1.0, 3, 1.0, 1.5, "linear")])
def test_monte_carlo_matches_exact_formula(p: float, w: int, v: float, s: float, imputation: str) -> None:
    mech = TimeDomainSubsampling(rate=p, noise_std=s, imputation=imputation)
    spec = ReleaseSpec(rate=p, relation=NeighbouringRelation("event", size=w, value_bound=v))
    x = np.linspace(-1.0, 2.0, T)
    x_prime = x.copy()
    x_prime[3:3 + w] += v  # a w-event change of size exactly v at each step: the worst case
    for direction, (a, b) in enumerate(((x, x_prime), (x_prime, x))):  # the profile is symmetric
        losses = _losses(a, b, mech, seed=1000 + direction)
        for eps in (0.0, 0.5, 1.0, 2.0):
            est, se = _estimate(losses, eps)
            formula = float(exact_release_delta(spec, s, eps)[0])
            assert abs(est - formula) <= Z * se + 1e-4, (direction, eps, est, formula, se)


def test_smaller_or_scattered_changes_stay_below_the_bound() -> None:
    """A user-level change at scattered steps with |change| < v is dominated by the formula."""
    p, w, v, s = 0.5, 4, 0.5, 0.5
    mech = TimeDomainSubsampling(rate=p, noise_std=s)
    spec = ReleaseSpec(rate=p, relation=NeighbouringRelation("user", size=w, value_bound=v))
    x = np.zeros(T)
    x_prime = x.copy()
    x_prime[[0, 5, 9]] += [0.5, -0.3, 0.4]
    losses = _losses(x, x_prime, mech, seed=7)
    for eps in (0.0, 0.5, 1.0):
        est, se = _estimate(losses, eps)
        assert est <= float(exact_release_delta(spec, s, eps)[0]) + Z * se + 1e-4

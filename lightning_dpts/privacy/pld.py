"""Privacy-loss distributions from privacy profiles (Lemma D.16, "connect-the-dots").

Connect-the-dots (Doroshenko et al., 2022) builds the best pessimistic discrete PLD supported on a grid of
privacy losses from the values H(e^eps) of a profile at the grid points alone. We evaluate the single
(switching or opposed-mixture) profile of one composition unit on eps = j * d for |eps| <= eps_max, where
eps_max is the smallest grid point with H(e^eps_max) <= tail_mass_truncation; that remaining mass goes to
+infinity (pessimistic). Composition and the (eps, delta) read-outs are dp_accounting's FFT-based routines
on a *symmetric* PrivacyLossDistribution (one pmf), per trap 1 of the privacy notes.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from lightning_dpts.privacy.profiles import PrivacyProfile

__all__ = [
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_MIN_GRID_POINTS",
    "DEFAULT_TAIL_MASS",
    "epsilon_for_delta",
    "grid_spacing",
    "pld_from_profile",
    "profile_support_bound",
]

#: Value discretisation of privacy losses (Appendix B.4.3 uses 1e-3).
DEFAULT_DISCRETIZATION = 1e-3
#: Tail mass truncation (Appendix B.4.3 uses 1e-15).
DEFAULT_TAIL_MASS = 1e-15
#: Refine the grid below ``discretization`` until the loss range holds at least this many points.
DEFAULT_MIN_GRID_POINTS = 4096
#: Refuse PLDs larger than this many grid points (a sign of a degenerate configuration, e.g. tiny sigma).
MAX_GRID_POINTS = 20_000_000


def epsilon_for_delta(profile: PrivacyProfile, delta: float, rtol: float = 1e-6) -> float:
    """The smallest eps >= 0 with H(e^eps) <= ``delta`` for a single composition unit, by bisection.

    Returns an eps within ``rtol`` (relative) *above* the smallest one, so the result is always on the safe
    side; ``math.inf`` if no eps up to 1e7 reaches ``delta``.
    """
    def value(eps: float) -> float:
        return float(profile.hockey_stick_at_log_alpha(np.array([eps]))[0])

    if value(0.0) <= delta:
        return 0.0
    hi = 1.0
    while value(hi) > delta:
        hi *= 2.0
        if hi > 1e7:
            return math.inf
    lo = hi / 2.0 if hi > 1.0 else 0.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if value(mid) > delta:
            lo = mid
        else:
            hi = mid
        if hi - lo <= rtol * max(hi, 1e-12):
            break
    return hi


def profile_support_bound(profile: PrivacyProfile, tail_mass: float) -> float:
    """An eps >= 0 (within 1e-6 relative above the smallest one) with H(e^eps) <= ``tail_mass``."""
    eps = epsilon_for_delta(profile, tail_mass)
    if math.isinf(eps):
        raise ValueError("privacy loss does not reach the tail-mass truncation; is sigma far too small?")
    return eps


def grid_spacing(eps_max: float, discretization: float, min_grid_points: int) -> float:
    """The privacy-loss grid spacing: ``discretization``, refined so [-eps_max, eps_max] holds
    ``min_grid_points`` points. Never coarser than ``discretization``."""
    if min_grid_points <= 1 or eps_max <= 0:
        return discretization
    return min(discretization, 2.0 * eps_max / (min_grid_points - 1))


def pld_from_profile(
    profile: PrivacyProfile,
    discretization: float = DEFAULT_DISCRETIZATION,
    tail_mass_truncation: float = DEFAULT_TAIL_MASS,
    min_grid_points: int = DEFAULT_MIN_GRID_POINTS,
) -> PrivacyLossDistribution:
    """Pessimistic connect-the-dots PLD of one composition unit, from its (symmetric) privacy profile.

    Args:
        profile: the single privacy profile of one step or epoch (see :mod:`~lightning_dpts.privacy.profiles`).
        discretization: the coarsest spacing d of the privacy-loss grid (> 0); 1e-3 as in Appendix B.4.3.
        tail_mass_truncation: mass allowed beyond the largest grid loss; it is put at +infinity, so the result
            stays an upper bound.
        min_grid_points: refine the spacing below ``discretization`` until the loss range
            [-eps_max, eps_max] holds this many points. Mechanisms whose per-step losses are tiny (strong
            subsampling: the paper's traffic configuration spans only |loss| <= 0.08) are otherwise
            overstated by the coarse grid after many compositions (0.760 instead of 0.740 there); refining is
            cheap exactly because the range is small. 0 disables it.

    Returns:
        A symmetric ``dp_accounting`` PrivacyLossDistribution whose delta(eps) upper-bounds the profile.
    """
    if not (discretization > 0 and math.isfinite(discretization)):
        raise ValueError(f"discretization must be > 0, got {discretization}")
    if not 0 < tail_mass_truncation < 1:
        raise ValueError(f"tail_mass_truncation must lie in (0, 1), got {tail_mass_truncation}")
    eps_max = profile_support_bound(profile, tail_mass_truncation)
    discretization = grid_spacing(eps_max, discretization, min_grid_points)
    n_hi = max(1, math.ceil(eps_max / discretization))
    if 2 * n_hi + 1 > MAX_GRID_POINTS:
        raise ValueError(
            f"the privacy loss spans [-{eps_max:.4g}, {eps_max:.4g}], needing {2 * n_hi + 1} grid points at "
            f"discretization {discretization}; increase the noise multiplier or the discretization"
        )
    upper = profile.hockey_stick_at_log_alpha(np.arange(n_hi + 1) * discretization)
    alpha_neg = np.exp(-np.arange(n_hi, 0, -1) * discretization)  # alpha < 1, ascending eps
    lower = 1.0 - alpha_neg + alpha_neg * upper[n_hi:0:-1]  # H(alpha) = 1 - alpha + alpha H(1/alpha)
    deltas = np.clip(np.concatenate([lower, upper]), 0.0, 1.0)
    # A profile is non-increasing; remove rounding-level wiggles pessimistically (raise, never lower).
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    pmf = pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(discretization, -n_hi, n_hi, deltas)
    return PrivacyLossDistribution(pmf)

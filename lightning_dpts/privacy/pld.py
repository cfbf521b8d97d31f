"""Privacy-loss distributions from privacy profiles (Lemma D.16, "connect-the-dots").

Connect-the-dots (Doroshenko et al., 2022) builds the best pessimistic discrete PLD supported on a grid of
privacy losses from the values H(e^eps) of a profile at the grid points alone. We evaluate the single
(switching or opposed-mixture) profile of one composition unit on eps = j * d for |eps| <= eps_max, where
eps_max is the smallest grid point with H(e^eps_max) <= tail_mass_truncation; that remaining mass goes to
+infinity (pessimistic); :func:`_connect_the_dots` repairs the round-off of the resulting probabilities
soundly. Composition (:class:`Composition`: tilted FFT, Chernoff range, explicit round-off bound) and the
(eps, delta) read-outs (:func:`epsilon_from_pld`, :func:`delta_from_pld`) are ours, on a *symmetric*
dp_accounting PrivacyLossDistribution (one pmf), per trap 1 of the privacy notes; what they need of dp_accounting's
internals (the dense pmf, building a pmf) is in the adapter :mod:`lightning_dpts.privacy._dp_accounting`.
"""

from __future__ import annotations

import math

import numpy as np

from lightning_dpts.privacy._dp_accounting import (
    PrivacyLossDistribution,
    connect_dots_pld,
    dense_pmf,
    self_convolve_bounds,
    symmetric_pld,
)
from lightning_dpts.privacy.profiles import PrivacyProfile

__all__ = [
    "Composition",
    "MAX_COMPOSED_POINTS",
    "SquaredComposition",
    "compose",
    "compose_by_squaring",
    "split_to_grid",
    "regrid_atoms",
    "composed_size",
    "saddlepoint_tilt",
    "unit_moments",
    "delta_from_pld",
    "epsilon_from_pld",
    "epsilon_from_pmf",
    "epsilons_from_pmfs",
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
MAX_GRID_POINTS = 2_000_001
#: Refuse compositions whose privacy-loss pmf would exceed this many points (16 MiB per array): every
#: read-out stays bounded in memory and time.
MAX_COMPOSED_POINTS = 1 << 21


#: Epsilons evaluated per call of the profile in :func:`epsilon_for_delta` (a call of a vectorised profile costs
#: about the same for 1 or 32 points: its threshold table and Newton steps dominate).
SEARCH_POINTS = 32


def epsilon_for_delta(profile: PrivacyProfile, delta: float, rtol: float = 1e-6) -> float:
    """The smallest eps >= 0 with H(e^eps) <= ``delta`` for a single composition unit.

    Returns an eps within ``rtol`` (relative) *above* the smallest one, so the result is always on the safe
    side; ``math.inf`` if no eps up to 2^23 reaches ``delta``. A profile is non-increasing in eps, so a bracket
    [lo, hi] with H(e^lo) > delta >= H(e^hi) holds the answer. hi is found in steps of 16x from 1 (2x beyond 256,
    so that e^eps overflows only where the answer lies near 709), the octave of the answer by one call of the
    profile at hi 2^-1 .. hi 2^-32, then each call at :data:`SEARCH_POINTS` evenly spaced points narrows the
    bracket 33-fold: about 8 calls for rtol = 1e-9, where a bisection makes 30-40. The value returned is checked
    on its own (one point per call, as a bisection checks it).
    """
    def values(eps: np.ndarray) -> np.ndarray:
        return np.asarray(profile.hockey_stick_at_log_alpha(np.asarray(eps, dtype=np.float64)), dtype=np.float64)

    def value(eps: float) -> float:
        return float(values(np.array([eps]))[0])

    if value(0.0) <= delta:
        return 0.0
    lo, hi, top = 0.0, 1.0, float(2**23)
    while value(hi) > delta:
        if hi >= top:
            return math.inf
        lo, hi = hi, min(hi * (16.0 if hi < 256.0 else 2.0), top)
    steps = np.arange(1, SEARCH_POINTS + 1, dtype=np.float64)
    for _ in range(200):
        if hi - lo <= rtol * max(hi, 1e-12):
            break
        if hi > 2.0 * lo:  # geometric, descending: the octave of the answer
            points = hi * np.exp2(-steps)
            points = points[points > lo]
            passed = values(points) <= delta
            failing = np.nonzero(~passed)[0]
            if failing.size == 0:  # every point passes: the answer lies below the smallest
                hi = float(points[-1])
                continue
            first = int(failing[0])  # points before it (larger eps) all passed
            lo, hi = float(points[first]), (float(points[first - 1]) if first > 0 else hi)
        else:  # evenly spaced, ascending
            points = lo + (hi - lo) * steps / (SEARCH_POINTS + 1)
            passing = np.nonzero(values(points) <= delta)[0]
            first = int(passing[0]) if passing.size else SEARCH_POINTS  # points before it all failed
            lo = float(points[first - 1]) if first > 0 else lo
            hi = float(points[first]) if first < SEARCH_POINTS else hi
    step = max(hi - lo, rtol * hi)
    while value(hi) > delta:  # a batched evaluation that passed where a single one does not (round-off): step up,
        hi, step = hi + step, 2.0 * step  # doubling (the doubling phase's hi passed alone)
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
    eps_max = epsilon_for_delta(profile, tail_mass_truncation)
    while math.isinf(eps_max) and tail_mass_truncation < 1e-9:
        # a profile with a floor above the truncation (mass accounted as perfectly distinguishable): put a
        # larger tail at +infinity instead; still pessimistic, only less tight
        tail_mass_truncation *= 100.0
        eps_max = epsilon_for_delta(profile, tail_mass_truncation)
    if math.isinf(eps_max):
        raise ValueError("privacy loss does not reach the tail-mass truncation; is sigma far too small?")
    discretization = grid_spacing(eps_max, discretization, min_grid_points)
    n_hi = max(1, math.ceil(eps_max / discretization))
    if 2 * n_hi + 1 > MAX_GRID_POINTS:
        raise ValueError(
            f"the privacy loss spans [-{eps_max:.4g}, {eps_max:.4g}], needing {2 * n_hi + 1} grid points at "
            f"discretization {discretization}; increase the noise multiplier or the discretization"
        )
    with np.errstate(over="ignore", invalid="ignore"):  # checked right below
        upper = profile.hockey_stick_at_log_alpha(np.arange(n_hi + 1) * discretization)
    if not np.isfinite(upper).all():  # exp(eps) overflows float64 near eps = 709.8: sigma is far too small
        raise ValueError(f"the privacy loss spans [-{eps_max:.4g}, {eps_max:.4g}], beyond what float64 can "
                         "evaluate (its hockey-stick divergence is not finite); increase the noise multiplier")
    alpha_neg = np.exp(-np.arange(n_hi, 0, -1) * discretization)  # alpha < 1, ascending eps
    lower = 1.0 - alpha_neg + alpha_neg * upper[n_hi:0:-1]  # H(alpha) = 1 - alpha + alpha H(1/alpha)
    deltas = np.clip(np.concatenate([lower, upper]), 0.0, 1.0)
    # A profile is non-increasing; remove rounding-level wiggles pessimistically (raise, never lower).
    deltas = np.maximum.accumulate(deltas[::-1])[::-1]
    return _connect_the_dots(discretization, -n_hi, n_hi, deltas)


def _connect_the_dots(spacing: float, lower: int, upper: int, deltas: np.ndarray) -> PrivacyLossDistribution:
    """The pessimistic connect-the-dots pmf (Doroshenko et al. 2022; Lemma D.16) of non-increasing ``deltas`` =
    H(e^eps) at eps = j * ``spacing``, j = ``lower`` .. ``upper``, with a sound repair of round-off.

    Its probabilities are second differences of the deltas divided by e^spacing - 1, so the round-off of the
    profile values (about 1e-16) becomes about 1e-16 / spacing per grid point, of either sign. dp_accounting
    clips the negative ones to 0, which adds their mass (1e-9 per unit at spacing 1e-7, and that excess
    compounds: (1 + 1e-9)^(10^9)). Here the suffix sums S_i = sum_{j >= i} p_j are replaced by
    S'_i = max(0, max_{k >= i} S_k) instead: p'_i = S'_i - S'_{i+1} >= 0, and since
    delta(eps) = sum_i S_i (g(l_i) - g(l_{i-1})) with g(l) = (1 - e^{eps - l})_+ nondecreasing in l (summation by
    parts), S' >= S raises delta(eps) at every eps (pessimistic) while S' <= the clipped pmf's suffix sums: the
    excess mass falls about 100-fold. The suffix sums are also capped at the total finite mass 1 - H(e^{eps_max}) of
    the exact pmf (issue 26): the exact suffix sums never exceed it, so the capped ones still dominate them, and the
    round-off excess that remained (1e-12 to 1e-8 of mass per unit, compounding over 10^9 compositions to a 10x
    overstatement at fine grids) is gone.
    """
    if upper == lower:
        return connect_dots_pld(spacing, lower, upper, deltas)
    deltas = np.minimum.accumulate(np.asarray(deltas, dtype=np.float64))
    diffs = np.diff(deltas)
    probs = np.empty_like(deltas)
    probs[0] = 1.0 - deltas[0] + diffs[0] / math.expm1(spacing)
    probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(spacing)) / math.expm1(spacing)
    probs[-1] = diffs[-1] / math.expm1(-spacing)
    suffix = np.cumsum(probs[::-1])[::-1]
    repaired = np.clip(np.maximum.accumulate(suffix[::-1])[::-1], 0.0, 1.0 - float(deltas[-1]))
    probs = repaired - np.concatenate([repaired[1:], [0.0]])
    return symmetric_pld(spacing, lower, probs, float(deltas[-1]))


#: (grid spacing, lowest loss index, probabilities, mass at +infinity) of a symmetric PLD (the adapter's reader).
_dense_pmf = dense_pmf


def composed_size(pld: PrivacyLossDistribution, num_times: int, tail_mass_truncation: float) -> int:
    """Number of points of ``pld.self_compose(num_times, tail_mass_truncation)``, without composing.

    Uses dp_accounting's own Chernoff truncation bounds, so the estimate is the size it will allocate.
    """
    _, _, probs, _ = _dense_pmf(pld)
    if num_times <= 1:
        return probs.size
    lower, upper = self_convolve_bounds(probs, num_times, tail_mass_truncation)
    return max(upper - lower + 1, probs.size)


def delta_from_pld(pld: PrivacyLossDistribution, epsilon: float) -> float:
    """delta(eps) = P(L = inf) + sum_{l > eps} P(L = l) (1 - e^{eps - l}) of a PLD, in [0, 1].

    Evaluated with ``expm1`` (no overflow for huge losses); negative rounding noise of the FFT composition is
    dropped, which only raises delta (pessimistic).
    """
    h, lower, probs, inf_mass = _dense_pmf(pld)
    losses = (lower + np.arange(probs.size)) * h
    sel = losses > epsilon
    value = inf_mass + float(np.sum(np.maximum(probs[sel], 0.0) * -np.expm1(epsilon - losses[sel])))
    return min(1.0, max(0.0, value))


def epsilon_from_pld(pld: PrivacyLossDistribution, delta: float) -> float:
    """The smallest eps >= 0 with delta(eps) <= ``delta`` of a PLD (``math.inf`` if the mass at +infinity
    already exceeds ``delta``).

    On each interval between grid losses delta(eps) = A - e^eps B, with A and B suffix sums of the pmf; both
    are formed from the top of the loss range (B in log space), so huge losses neither overflow nor cancel.
    """
    return epsilon_from_pmf(*_dense_pmf(pld), delta)


def epsilon_from_pmf(h: float, lower: int, probs: np.ndarray, inf_mass: float, delta: float) -> float:
    """:func:`epsilon_from_pld` of the pmf ``probs`` on the losses (``lower`` + i) ``h`` with ``inf_mass`` at
    +infinity (no PLD object)."""
    return float(epsilons_from_pmfs(h, lower, np.asarray(probs)[None, :], np.array([inf_mass]), delta)[0])


def epsilons_from_pmfs(h: float, lower: int, rows: np.ndarray, inf_masses: np.ndarray, delta: float) -> np.ndarray:
    """:func:`epsilon_from_pld` of several pmfs at once: row r of ``rows`` holds P-masses on the losses
    (``lower`` + i) ``h``, with ``inf_masses[r]`` at +infinity (the epsilon curve reads hundreds of compositions
    this way; :func:`epsilon_from_pmf` is the one-row case, so there is one read-out).

    On each interval between grid losses delta(eps) = A - e^eps B, with A and B suffix sums of the pmf; both are
    formed from the top of the loss range (B in log space beyond a range of 600 nats), so huge losses neither
    overflow nor cancel. Only losses >= 0 enter (eps >= 0 and the sums run upwards from eps).
    """
    inf_masses = np.asarray(inf_masses, dtype=float)
    out = np.zeros(rows.shape[0])
    first = max(0, -lower)
    if first >= rows.shape[1]:  # every finite loss is negative: delta(0) = inf_mass
        return np.where(inf_masses >= delta, math.inf, 0.0)
    lower, probs = lower + first, np.maximum(rows[:, first:], 0.0)
    losses = (lower + np.arange(probs.shape[1])) * h
    # suffix sums over i > j: A_j = inf + sum p_i, log B_j = logsumexp(log p_i - l_i)
    suffix_mass = np.cumsum(probs[:, ::-1], axis=1)[:, ::-1]
    tail_mass = np.concatenate([suffix_mass[:, 1:], np.zeros((probs.shape[0], 1))], axis=1) + inf_masses[:, None]
    top = float(losses[-1])
    if float(losses[-1] - losses[0]) < 600.0:
        # e^{l_max - l_i} <= e^600: the suffix sums in the linear domain (positive terms, summed from the top)
        with np.errstate(divide="ignore"):
            suffix = np.cumsum((probs * np.exp(top - losses))[:, ::-1], axis=1)[:, ::-1]
            log_b = np.log(suffix[:, 1:]) - top
    else:
        with np.errstate(divide="ignore"):
            log_terms = np.log(probs) - losses
        log_b = np.logaddexp.accumulate(log_terms[:, ::-1], axis=1)[:, ::-1][:, 1:]
    log_b = np.concatenate([log_b, np.full((probs.shape[0], 1), -np.inf)], axis=1)
    with np.errstate(over="ignore"):
        at_grid = tail_mass - np.exp(np.minimum(losses + log_b, 700.0))  # delta(l_j)
    rows_index = np.arange(probs.shape[0])
    # delta(0) = inf + sum_{l > 0} p (1 - e^{-l}): the suffix sums at the last loss <= 0 give it exactly
    zero = int(np.searchsorted(losses, 0.0, side="right")) - 1  # last index with loss <= 0 (-1: none)
    if zero >= 0:
        at_zero = tail_mass[:, zero] - np.exp(np.minimum(log_b[:, zero], 700.0))
    else:  # every kept loss is > 0 (and any mass below was at losses < 0, where it adds nothing)
        at_zero = inf_masses + np.sum(probs * -np.expm1(-losses), axis=1)
    ok = at_grid <= delta
    has = ok.any(axis=1)
    j = np.argmax(ok, axis=1)
    for r in rows_index:  # one scalar formula per row (the interval [l_{j-1}, l_j) holding eps)
        if inf_masses[r] >= delta:
            out[r] = math.inf
        elif at_zero[r] <= delta:
            out[r] = 0.0
        elif not has[r]:  # pragma: no cover - the last grid point has delta = inf_mass < delta
            out[r] = math.inf
        elif j[r] == 0:
            out[r] = max(0.0, float(losses[0]))
        else:
            k = int(j[r])
            a, log_bb = float(tail_mass[r, k - 1]), float(log_b[r, k - 1])
            left = max(0.0, float(losses[k - 1]))
            if a - delta <= 0 or not math.isfinite(log_bb):
                out[r] = float(losses[k])
            else:
                eps = math.log(a - delta) - log_bb
                out[r] = min(max(eps, left), float(losses[k]))
    return out


def unit_moments(pld: PrivacyLossDistribution) -> tuple[float, float]:
    """Mean and variance of the finite privacy losses of a PLD (used to aim the tilt of :func:`compose`)."""
    h, lower, probs, _ = _dense_pmf(pld)
    probs = np.maximum(probs, 0.0)
    losses = (lower + np.arange(probs.size)) * h
    total = float(probs.sum())
    mean = float(probs @ losses) / total
    return mean, float(probs @ (losses - mean) ** 2) / total


_UNIT_ROUNDOFF = 1.12e-16
_WINDOW_CACHE = 4096
_NEGLIGIBLE_LOG = -100.0
_MGF_BLOCK = 1 << 22


def _log_mgf(log_q: np.ndarray, losses: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """log sum_i exp(log_q_i + t losses_i) for every t in ``ts`` (a vectorised logsumexp, blocks of ts so that
    at most :data:`_MGF_BLOCK` terms are held at once)."""
    out = np.empty(ts.size)
    block = max(1, _MGF_BLOCK // max(losses.size, 1))
    for start in range(0, ts.size, block):
        t = ts[start:start + block, None]
        terms = log_q[None, :] + t * losses[None, :]
        top = np.max(terms, axis=1, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        out[start:start + block] = top[:, 0] + np.log(np.sum(np.exp(terms - top), axis=1))
    return out


class Composition:
    """Self-compositions of one symmetric PLD by an exponentially tilted FFT, pessimistically (one code path for
    every composition in the package: :func:`compose`, the accountant's read-outs and its epsilon curve).

    dp_accounting's ``self_compose`` raises the FFT of the pmf to the n-th power; its round-off (about n * 1e-16
    of the largest probability per grid point) is of the order of delta itself for delta <= 1e-12 and
    thousands of compositions, in either direction (we measured epsilon 0.2% *below* the Gaussian closed form).
    Here the pmf is tilted by e^{tilt * loss} before the FFT (composition commutes with tilting), so the losses
    near e^{...} of interest are computed with a small relative error, and an explicit bound on the round-off,
    8 u (n + 2 log2 M) mean_k |W_k|^n per tilted point, is *added* to every probability after un-tilting.
    The range kept is fixed by Chernoff bounds with the exact log-MGF (at every t = 2^(j/4) / sqrt(n var) in
    [1e-2, 1e3] / sqrt(n var), the log-MGF cached across n); the mass outside it (<= tail/2) and the mass the
    circular FFT folds into it (<= tail/2) are put at +infinity. Every step raises delta(eps).

    One object composes the same unit for many counts n; :meth:`power` with a shared FFT ``size`` reuses one
    spectrum, so a whole epsilon curve costs one inverse FFT per count.

    Args:
        pld: the unit PLD (symmetric, as built by :func:`pld_from_profile`).
        tail_mass_truncation: mass put at +infinity per composition (see above).
        tilt: theta >= 0 of the exponential tilt (0: plain FFT).
    """

    def __init__(self, pld: PrivacyLossDistribution, tail_mass_truncation: float, tilt: float = 0.0) -> None:
        from scipy.special import logsumexp

        self.pld = pld
        self.h, self.lower, probs, self.inf_mass = _dense_pmf(pld)
        self.probs = np.maximum(probs, 0.0)
        self.losses = (self.lower + np.arange(self.probs.size)) * self.h
        with np.errstate(divide="ignore"):
            self.log_p = np.log(self.probs)
        self.mean, self.var = unit_moments(pld)
        self.tail = float(tail_mass_truncation)
        self.tilt = float(tilt)
        self.log_w = self.log_p + self.tilt * self.losses
        self.log_z = float(logsumexp(self.log_w))
        self._mgf: dict[tuple[bool, bool], tuple[int, np.ndarray]] = {}
        self._spectra: dict[int, tuple[np.ndarray, ...]] = {}
        self._windows: dict[int, tuple[int, int]] = {}

    def _log_mgf_at(self, tilted: bool, upper: bool, js: np.ndarray) -> np.ndarray:
        """log-MGF of the (tilted) unit at t_j = 2^(j/4) / sqrt(var) (sign + for the upper tail), for the
        consecutive integers ``js``; cached as one array per (tilted, upper) over the union of the j seen."""
        first, last = int(js[0]), int(js[-1])
        start, values = self._mgf.get((tilted, upper), (first, np.zeros(0)))
        if first < start or last >= start + values.size:
            lo, hi = min(first, start), max(last, start + values.size - 1)
            known = np.arange(start, start + values.size)
            missing = np.setdiff1d(np.arange(lo, hi + 1), known)
            ts = 2.0 ** (missing.astype(float) / 4.0) / math.sqrt(max(self.var, 1e-300))
            log_q = self.log_w - self.log_z if tilted else self.log_p
            merged = np.empty(hi - lo + 1)
            merged[missing - lo] = _log_mgf(log_q, self.losses if upper else -self.losses, ts)
            merged[known - lo] = values
            start, values = lo, merged
            self._mgf[(tilted, upper)] = (start, values)
        return values[first - start:last - start + 1]

    def _bounds(self, ns: np.ndarray, tilted: bool) -> tuple[np.ndarray, np.ndarray]:
        """Chernoff, for each count n of ``ns``: the n-fold sum of the (sub-)pmf exceeds hi, or falls below lo,
        w.p. <= tail/4 each (the best of t_j = 2^(j/4) / sqrt(var) with t_j sqrt(n var) in [1e-2, 1e3])."""
        log_tail = math.log(self.tail / 4.0)
        base = 2.0 * np.log2(ns.astype(float))  # t_j sqrt(n var) = 2^((j + base) / 4) in [1e-2, 1e3]
        first = np.ceil(4.0 * math.log2(1e-2) - base).astype(np.int64)
        last = np.floor(4.0 * math.log2(1e3) - base).astype(np.int64)
        js = np.arange(int(first.min()), int(last.max()) + 1)
        ts = 2.0 ** (js / 4.0) / math.sqrt(max(self.var, 1e-300))
        own = (js[None, :] >= first[:, None]) & (js[None, :] <= last[:, None])  # each count's own t_j
        n_col = ns[:, None]
        hi = np.min(np.where(own, (n_col * self._log_mgf_at(tilted, True, js) - log_tail) / ts, np.inf), axis=1)
        lo = np.max(np.where(own, -(n_col * self._log_mgf_at(tilted, False, js) - log_tail) / ts, -np.inf), axis=1)
        return lo, hi

    def window(self, num_times: int) -> tuple[int, int]:
        """(lowest, highest) grid index of the loss range kept for ``num_times`` compositions."""
        return self.windows([int(num_times)])[0]

    def windows(self, counts: list[int]) -> list[tuple[int, int]]:
        """:meth:`window` of several counts at once (cached: the epsilon curve asks for the windows of its
        counts, then composes them)."""
        missing = np.array(sorted({int(n) for n in counts if int(n) not in self._windows}), dtype=np.int64)
        if missing.size:
            if len(self._windows) + missing.size > _WINDOW_CACHE:
                self._windows.clear()
            lo_p, hi_p = self._bounds(missing, False)  # the true composition: mass outside goes to +infinity
            lo_w, hi_w = self._bounds(missing, True) if self.tilt else (lo_p, hi_p)  # keeps the wrap negligible
            nf = missing.astype(float)
            upper = np.minimum(np.maximum(hi_p, hi_w), nf * float(self.losses[-1]))
            lower_loss = np.maximum(np.minimum(lo_p, lo_w), nf * float(self.losses[0]))
            lows, highs = np.floor(lower_loss / self.h), np.ceil(upper / self.h)
            self._windows.update({int(n): (int(a), int(b)) for n, a, b in zip(missing, lows, highs, strict=True)})
        return [self._windows[int(n)] for n in counts]

    def fft_size(self, num_times: int) -> int:
        """The FFT length :meth:`power` uses for ``num_times`` compositions by default."""
        from scipy import fft as sfft

        lo_index, hi_index = self.window(num_times)
        return int(sfft.next_fast_len(max(hi_index - lo_index + 1, self.probs.size), real=True))

    def power(self, num_times: int, max_points: int = MAX_COMPOSED_POINTS,
              size: int | None = None) -> PrivacyLossDistribution:
        """The ``num_times``-fold composition (pessimistic; see the class docstring).

        Args:
            num_times: n >= 1.
            max_points: refuse a kept range of more grid points.
            size: FFT length (>= the kept range; default :meth:`fft_size`); one length for many n reuses the
                spectrum of the unit.

        Raises:
            OverflowError: the kept range would exceed ``max_points`` grid points (or ``size``).
        """
        if int(num_times) == 1:
            return self.pld
        lo_index, out, composed_inf = self.power_pmf(num_times, max_points, size)
        return symmetric_pld(self.h, lo_index, out, composed_inf)

    def power_pmf(self, num_times: int, max_points: int = MAX_COMPOSED_POINTS,
                  size: int | None = None) -> tuple[int, np.ndarray, float]:
        """:meth:`power` as (lowest loss index, pmf on the grid ``h``, mass at +infinity), without building a
        PLD object (the one-count case of :meth:`power_rows`)."""
        n = int(num_times)
        if n == 1:
            return self.lower, self.probs, self.inf_mass
        lower, rows, inf_masses = self.power_rows(np.array([n]), max_points, size)
        return lower, rows[0], float(inf_masses[0])

    def power_rows(self, counts: np.ndarray, max_points: int = MAX_COMPOSED_POINTS,
                   size: int | None = None) -> tuple[int, np.ndarray, np.ndarray]:
        """The compositions for several counts n >= 2 at once, one FFT length: (lowest loss index, rows,
        masses at +infinity), row r the pmf of ``counts[r]`` compositions on the common losses (lowest + i) h
        (zero outside its own kept range). One spectrum, one batched inverse FFT (the epsilon curve's counts).

        Raises:
            OverflowError: a kept range would exceed ``max_points`` grid points (or ``size``).
        """
        from scipy import fft as sfft

        ns = np.asarray(counts, dtype=np.int64)
        windows = np.array(self.windows([int(n) for n in ns]), dtype=np.int64).reshape(-1, 2)
        widths = windows[:, 1] - windows[:, 0] + 1
        if int(widths.max()) > max_points:
            raise OverflowError(f"{int(widths.max())} grid points")
        need = max(int(widths.max()), self.probs.size)
        if size is None:
            size = int(sfft.next_fast_len(need, real=True))
        if size < need:
            raise OverflowError(f"{int(widths.max())} grid points exceed the FFT length {size}")
        if size not in self._spectra:  # one length at a time (the epsilon curve batches counts by length)
            spectrum = sfft.rfft(np.exp(self.log_w - self.log_z), size)
            with np.errstate(divide="ignore"):
                log_magnitude = np.log(np.abs(spectrum))
            weights = np.ones(spectrum.size)
            weights[1:] = 2.0  # rfft holds half of the spectrum: every bin but the first stands for two
            # the |log|W|| weights of the round-off bound (a bin with |W| = 0 contributes 0 at every power)
            log_weights = np.where(np.isfinite(log_magnitude), -log_magnitude, 0.0) * weights
            self._spectra = {size: (log_magnitude, np.angle(spectrum), weights, log_weights)}
        log_magnitude, angle, weights, log_weights = self._spectra[size]
        n_col = ns[:, None].astype(float)
        # W^n in polar form (faster than complex **): the phase n angle is off by at most pi n u and the
        # magnitude exp(n log|W|) by n u (1 + |log|W||) relative; the first two are within the bound's 8 n u,
        # the |log|W|| part is added explicitly (it is what exp(n log W), numpy's ** for n >= 100, also incurs)
        # Bins with n log|W| < -100 for every count of the batch (|W|^n < 4e-44) are left out of the inverse FFT
        # (the composed spectrum decays fast: for n in the hundreds most bins are far below round-off); each
        # moves any output point by at most 2 |W|^n / size, which is added to the bound below (it also covers
        # their share of the round-off terms, u n |log|W|| |W|^n being far smaller; about 1e-21 of the round-off
        # bound itself, so the result is unchanged in practice and stays an upper bound).
        live_mask = log_magnitude >= _NEGLIGIBLE_LOG / float(ns.min())
        live = np.nonzero(live_mask)[0]
        dropped = log_magnitude[~live_mask]
        dropped_top = float(dropped.max()) if dropped.size else -np.inf
        magnitude = np.exp(n_col * log_magnitude[live])
        phase = n_col * angle[live]
        spectrum_n = np.zeros((ns.size, log_magnitude.size), dtype=complex)  # magnitude e^{i phase}
        spectrum_n[:, live] = magnitude * np.cos(phase) + 1j * (magnitude * np.sin(phase))
        tilted = sfft.irfft(spectrum_n, size, axis=1)
        mean_power = (magnitude @ weights[live]) / size
        nf = ns.astype(float)
        error = _UNIT_ROUNDOFF * (8.0 * (nf + 2.0 * math.log2(size)) * mean_power
                                  + 2.0 * nf * (magnitude @ log_weights[live]) / size)
        if dropped.size:
            error = error + 2.0 * dropped.size * np.exp(nf * dropped_top) / size
        lowest, highest = int(windows[:, 0].min()), int(windows[:, 1].max())
        width = highest - lowest + 1
        # the kept range, read circularly from the FFT's output (zero outside each count's own range): row r
        # from position (lowest - n_r lower) mod size of its output, wrapped around
        starts = (lowest - ns * self.lower) % size
        doubled = np.concatenate([tilted, tilted[:, :width]], axis=1) if width > 0 else tilted
        values = np.lib.stride_tricks.sliding_window_view(doubled, width, axis=1)[np.arange(ns.size), starts]
        if self.tilt == 0.0:
            factor = np.exp(np.minimum(nf * self.log_z, 700.0))[:, None]
        else:
            index = np.arange(lowest, highest + 1)
            factor = np.exp(np.minimum(nf[:, None] * self.log_z - self.tilt * index[None, :] * self.h, 700.0))
        rows = np.maximum(values, 0.0)
        rows += error[:, None]
        rows *= factor
        np.minimum(rows, 1.0, out=rows)
        for r, (lo_r, hi_r) in enumerate(windows - lowest):  # zero outside each count's own range
            rows[r, :lo_r] = 0.0
            rows[r, hi_r + 1:] = 0.0
        composed_inf = np.minimum(1.0, -np.expm1(nf * math.log1p(-self.inf_mass)) + self.tail)
        return lowest, rows, composed_inf


def compose(pld: PrivacyLossDistribution, num_times: int, tail_mass_truncation: float, tilt: float = 0.0,
            max_points: int = MAX_COMPOSED_POINTS) -> PrivacyLossDistribution:
    """``num_times``-fold composition of a symmetric PLD by an exponentially tilted FFT, pessimistically
    (:class:`Composition`).

    Raises:
        OverflowError: the kept range would exceed ``max_points`` grid points.
    """
    return Composition(pld, tail_mass_truncation, tilt).power(num_times, max_points)


def split_to_grid(spacing: float, lower: int, probs: np.ndarray, factor: int) -> tuple[float, int, np.ndarray]:
    """Connect-the-dots of a discrete PLD onto the coarser grid of spacing H = ``factor`` * ``spacing``.

    Each atom at loss l, between the grid losses a = jH <= l < b = a + H, is split into the two with P-masses
    p (e^{b-l} - 1) / (e^H - 1) at a and p e^{b-l} (1 - e^{-(l-a)}) / (e^H - 1) at b: they keep its P-mass and
    its Q-mass p e^{-l}, so merging them back gives the atom (a post-processing), and the new pair dominates the
    old one for every alpha (Doroshenko et al. 2022; Lemma D.16 applied to one atom). Both weights are
    computed from positive terms (``expm1``), so the result carries a relative round-off of a few units in
    the last place per point, never a cancellation.

    Args:
        spacing: grid spacing h of ``probs``.
        lower: loss index of ``probs[0]`` (losses (lower + i) h).
        probs: P-masses (>= 0).
        factor: integer m >= 1; the new grid is the losses j m h (aligned with the old one).

    Returns:
        (H, lowest new index, new P-masses); no mass is lost.
    """
    if factor == 1:
        return spacing, lower, probs
    coarse = spacing * factor
    index = lower + np.arange(probs.size)
    j = np.floor_divide(index, factor)
    offset = (index - j * factor) * spacing  # l - a, in [0, H)
    scale = 1.0 / math.expm1(coarse)
    low_part = probs * (np.expm1(coarse - offset) * scale)
    high_part = probs * (np.exp(coarse - offset) * np.expm1(offset) * scale)
    first = int(j[0])
    size = int(j[-1]) - first + 2
    out = np.bincount(j - first, weights=low_part, minlength=size)
    out += np.bincount(j + 1 - first, weights=high_part, minlength=size)
    return coarse, first, out


def regrid_atoms(losses: np.ndarray, probs: np.ndarray, spacing: float) -> tuple[int, np.ndarray]:
    """Connect-the-dots of atoms at arbitrary finite ``losses`` onto the grid j * ``spacing`` (any spacing, finer or
    coarser, aligned or not): :func:`split_to_grid`'s split of every atom between its two neighbouring grid losses,
    which keeps its P-mass and its Q-mass, so the new pair dominates the old one (Lemma D.16 for one atom).

    Used to move a composed PLD onto the grid of a dp_accounting accountant (:mod:`lightning_dpts.privacy.events`) and
    to compose a PLD with randomized response (:func:`lightning_dpts.privacy.risk.compose_randomized_response`).

    Returns:
        (index of the lowest grid loss, P-masses on the grid losses from it); no mass is lost.
    """
    losses = np.asarray(losses, dtype=np.float64)
    probs = np.maximum(np.asarray(probs, dtype=np.float64), 0.0)
    if losses.shape != probs.shape or losses.ndim != 1 or not losses.size:
        raise ValueError("losses and probs must be non-empty 1-d arrays of one length")
    j = np.floor(losses / spacing).astype(np.int64)
    offset = np.clip(losses - j * spacing, 0.0, spacing)  # l - a in [0, H] despite round-off
    scale = 1.0 / math.expm1(spacing)
    low_part = probs * (np.expm1(spacing - offset) * scale)
    high_part = probs * (np.exp(spacing - offset) * np.expm1(offset) * scale)
    first = int(j.min())
    size = int(j.max()) - first + 2
    out = np.bincount(j - first, weights=low_part, minlength=size)
    out += np.bincount(j + 1 - first, weights=high_part, minlength=size)
    return first, out


#: Points per standard deviation of the composed privacy loss that :func:`compose_by_squaring` keeps.
SQUARING_POINTS_PER_SD = 200.0
#: Largest pmf :func:`compose_by_squaring` convolves (two of them cost about 10 ms by direct convolution).
SQUARING_MAX_POINTS = 8192


class SquaredComposition:
    """The result of :func:`compose_by_squaring`: the composed PLD and what its accuracy depends on.

    Attributes:
        pld: the composed PLD (pessimistic).
        round_off: the relative round-off bound r of the computed probabilities; the PLD's probabilities are the
            computed ones divided by 1 - 2r (so that they bound the exact ones from above).
        variance_excess: relative excess of the composed loss variance over ``num_times`` times the unit's
            (what the re-gridding added: the main part of the discretisation error of this composition).
        coarsest: the largest grid spacing used, in standard deviations of the pmf it re-gridded
            (1 / :data:`SQUARING_POINTS_PER_SD` unless a pmf was too wide for :data:`SQUARING_MAX_POINTS`).
    """

    def __init__(self, pld: PrivacyLossDistribution, round_off: float, variance_excess: float,
                 coarsest: float) -> None:
        self.pld = pld
        self.round_off = round_off
        self.variance_excess = variance_excess
        self.coarsest = coarsest


def _moments(spacing: float, lower: int, probs: np.ndarray) -> tuple[float, float]:
    losses = (lower + np.arange(probs.size)) * spacing
    total = float(probs.sum())
    mean = float(probs @ losses) / total
    return mean, float(probs @ (losses - mean) ** 2) / total


def compose_by_squaring(pld: PrivacyLossDistribution, num_times: int, tail_mass_truncation: float, *,
                        points_per_sd: float = SQUARING_POINTS_PER_SD,
                        max_points: int = SQUARING_MAX_POINTS) -> SquaredComposition:
    """``num_times``-fold composition of a symmetric PLD by repeated squaring with exact convolutions,
    pessimistically; for huge counts (10^6 to 10^10 compositions), in bounded time and memory.

    The FFT composition (:class:`Composition`) keeps the unit's grid for all n compositions: its range then needs
    a grid point count proportional to sqrt(n) times the unit's, and its round-off bound grows with n. Here the
    binary expansion of n is composed from the unit, its square, its fourth power, ...; after every convolution
    the pmf is moved to a grid (a power-of-two multiple of the unit's spacing) with about ``points_per_sd``
    points per standard deviation of its loss (:func:`split_to_grid`, connect-the-dots of each atom: the new pair
    dominates), so every pmf holds a few thousand points whatever n. Every step is pessimistic:

    * convolutions are direct (``numpy.convolve``) sums of nonnegative products, so each computed probability
      is within a relative (M + 2) u of the exact one (M the length, u the unit round-off); the relative bounds
      add up along the chain (doubling with every squaring: about n M u in all) and the final probabilities
      are divided by 1 - 2r, r that bound, so they bound the exact chain from above pointwise;
    * after every convolution the mass of the top tail (at most tail / (2 n + 64)) goes to +infinity and that
      of the bottom tail moves up to the lowest kept loss (first-order stochastic dominance), so the mass at
      +infinity of the result is at most ``tail_mass_truncation`` plus the unit's own, composed.

    Args:
        pld: the unit PLD (symmetric, as built by :func:`pld_from_profile`).
        num_times: n >= 1.
        tail_mass_truncation: the total mass the truncations may put at +infinity.
        points_per_sd: grid points per standard deviation kept at every re-gridding.
        max_points: coarser grids where a pmf would otherwise exceed this many points (see
            :attr:`SquaredComposition.coarsest`).
    """
    n = int(num_times)
    h, lower, probs, inf_mass = _dense_pmf(pld)
    probs = np.maximum(probs, 0.0)
    unit_var = _moments(h, lower, probs)[1]
    tau = float(tail_mass_truncation) / (2.0 * n + 64.0)
    coarsest = 0.0

    def regrid(state: tuple[float, int, np.ndarray, float, float]) -> tuple[float, int, np.ndarray, float, float]:
        nonlocal coarsest
        spacing, low, p, inf, rel = state
        sd = math.sqrt(_moments(spacing, low, p)[1])
        factor = 1
        while spacing * factor * 2.0 <= sd / points_per_sd:
            factor *= 2
        while p.size > factor * max_points:
            factor *= 2
        coarsest = max(coarsest, spacing * factor / sd)
        if factor == 1:
            return state
        spacing, low, p = split_to_grid(spacing, low, p, factor)
        return spacing, low, p, inf, rel + (2 * factor + 8) * _UNIT_ROUNDOFF

    def align(a: tuple, b: tuple) -> tuple[tuple, tuple]:
        if a[0] > b[0]:
            b, a = align(b, a)
            return a, b
        if a[0] < b[0]:
            factor = int(round(b[0] / a[0]))
            spacing, low, p = split_to_grid(a[0], a[1], a[2], factor)
            a = (spacing, low, p, a[3], a[4] + (2 * factor + 8) * _UNIT_ROUNDOFF)
        return a, b

    def convolve(a: tuple, b: tuple) -> tuple[float, int, np.ndarray, float, float]:
        a, b = align(a, b)
        p = np.convolve(a[2], b[2])
        rel = a[4] + b[4] + (min(a[2].size, b[2].size) + 2) * _UNIT_ROUNDOFF
        inf = -math.expm1(math.log1p(-min(a[3], 1.0 - 1e-16)) + math.log1p(-min(b[3], 1.0 - 1e-16)))
        suffix = np.cumsum(p[::-1])[::-1]
        prefix = np.cumsum(p)
        above = np.nonzero(suffix > tau / 2.0)[0]
        below = np.nonzero(prefix > tau / 2.0)[0]
        top = int(above[-1]) if above.size else p.size - 1
        bottom = int(below[0]) if below.size else 0
        bottom = min(bottom, top)
        if top + 1 < p.size:
            inf += float(suffix[top + 1]) * (1.0 + rel + p.size * _UNIT_ROUNDOFF)
        kept = p[bottom:top + 1].copy()
        if bottom > 0:
            kept[0] += float(prefix[bottom - 1])
        return regrid((a[0], a[1] + b[1] + bottom, kept, min(1.0, inf), rel + 2 * p.size * _UNIT_ROUNDOFF))

    base = regrid((h, lower, probs, inf_mass, 0.0))
    result = None
    k = n
    while True:
        if k & 1:
            result = base if result is None else convolve(result, base)
        k >>= 1
        if not k:
            break
        base = convolve(base, base)
    assert result is not None
    spacing, low, p, inf, rel = result
    if not 2.0 * rel < 1.0:
        raise OverflowError(f"round-off bound {rel:.3g} of {n} compositions by squaring")
    var = _moments(spacing, low, p)[1]
    out = symmetric_pld(spacing, low, p / (1.0 - 2.0 * rel), min(1.0, inf))
    return SquaredComposition(out, rel, var / (n * unit_var) - 1.0, coarsest)


def saddlepoint_tilt(pld: PrivacyLossDistribution, num_times: int, target: float, max_tilt: float = 50.0) -> float:
    """The tilt theta >= 0 whose tilted n-fold composition has mean ``target`` (n K'(theta) = target).

    Aims :func:`compose` at the losses near ``target`` (an epsilon), where its relative error is smallest.
    """
    from scipy.special import logsumexp

    h, lower, probs, _ = _dense_pmf(pld)
    losses = (lower + np.arange(probs.size)) * h
    with np.errstate(divide="ignore"):
        log_p = np.log(np.maximum(probs, 0.0))

    def tilted_mean(theta: float) -> float:
        log_w = log_p + theta * losses
        return float(np.exp(log_w - logsumexp(log_w)) @ losses) * num_times

    if not math.isfinite(target) or tilted_mean(0.0) >= target:
        return 0.0
    if tilted_mean(max_tilt) <= target:
        return max_tilt
    lo, hi = 0.0, max_tilt
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if tilted_mean(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)

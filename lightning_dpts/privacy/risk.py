"""What an epsilon means for one person: membership-attack read-outs from a privacy-loss distribution.

Next to (epsilon, delta) the package reports, for the unit of privacy (e.g. one time step of one series):

* **TPR at FPR** alpha in :data:`FPRS` = (1e-3, 1e-2): the largest true-positive rate of *any* test that tells the
  two neighbouring datasets apart (is the protected event's value x or x'?) while wrongly accusing at most a
  fraction alpha. It is 1 - f(alpha), f the trade-off function of the mechanism (Dong, Roth & Su 2022,
  Definition 2.1); by the duality of f-DP and privacy profiles (their Proposition 2.12),
  TPR(alpha) = min over eps in R of delta(eps) + e^eps alpha. On a discrete PLD the minimum is attained at the
  Neyman-Pearson threshold: the losses are taken from the top until their Q-mass (P-mass times e^-loss) reaches
  alpha (:func:`tpr_from_pmfs`).
* **mu-GDP equivalent**: the smallest mu such that the Gaussian mechanism of that mu (mu-GDP, Dong, Roth & Su
  Corollary 2.13: delta_mu(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)) bounds the mechanism's
  delta(eps) at every eps where that matters at the run's delta: delta_mu(eps) >= delta(eps) for every eps with
  delta(eps) > ``delta``. Every (eps', delta') statement of mu-GDP with delta' >= ``delta`` then holds for the
  mechanism (:func:`gdp_mu_from_pmfs`). A subsampled mechanism is not exactly Gaussian; mu is the envelope.

**Direction of the error: the read-outs never understate the risk.** They are computed from the accountant's
pessimistic PLD (its delta(eps) is >= the mechanism's at every eps, Lemma D.16 and the composition's round-off
bound), and TPR = min_eps [delta(eps) + e^eps alpha] and mu only grow with delta(eps). The TPR is exact for that
PLD; mu is the upper end of a bisection whose check on every interval of a grid of eps is sound (both deltas are
convex in e^eps: the PLD's lies below its chord, mu-GDP's above its tangent), so it is >= the smallest mu of the
PLD. The AccountantCallback reads them, like epsilon, at the next count of its epsilon table
(both grow with the number of compositions).

No torch: this module is part of the privacy layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr, ndtr, ndtri

from lightning_dpts.privacy._dp_accounting import PrivacyLossDistribution, direction_pmfs
from lightning_dpts.privacy.pld import regrid_atoms

__all__ = ["FPRS", "RiskReadout", "compose_randomized_response", "gaussian_delta", "gaussian_tpr",
           "gdp_mu_from_pmfs", "metric_names", "no_risk", "risk_from_plds", "tpr_from_pmfs"]

#: The false-positive rates the read-outs report.
FPRS: tuple[float, ...] = (1e-3, 1e-2)
#: Grid points of eps in [0, eps(delta)] of the mu check and its relative precision: the callback's table (mu within
#: about 0.2% above the limit), single read-outs (report.json, ``dpts privacy``; within 0.002%).
TABLE_MU_POINTS, TABLE_MU_RTOL = 128, 1e-4
SINGLE_MU_POINTS = 2048
#: Relative precision of mu (the upper end of the final bracket is returned).
MU_RTOL = 1e-5
_MAX_MU = 1e4


def _fpr_label(fpr: float) -> str:
    return format(fpr, "g")


def metric_names(fprs: Sequence[float] = FPRS) -> tuple[str, ...]:
    """The logger metric names of the read-outs: ``tpr_at_fpr_0.001``, ``tpr_at_fpr_0.01``, ``mu_gdp``."""
    return (*(f"tpr_at_fpr_{_fpr_label(a)}" for a in fprs), "mu_gdp")


@dataclass(frozen=True)
class RiskReadout:
    """Membership-attack read-outs for the unit of privacy, next to an epsilon (see the module docstring).

    Attributes:
        fprs: the false-positive rates alpha.
        tprs: the largest true-positive rate at each alpha (an upper bound for the mechanism, in [alpha, 1]).
        mu: the mu-GDP equivalent (>= 0; ``inf`` where the PLD's mass at +infinity exceeds ``delta``).
        delta: mu-GDP's (eps', delta') statements hold for the mechanism for every delta' >= this delta.
    """

    fprs: tuple[float, ...]
    tprs: tuple[float, ...]
    mu: float
    delta: float

    def tpr(self, fpr: float) -> float:
        """The TPR at ``fpr`` (one of :attr:`fprs`)."""
        return self.tprs[self.fprs.index(fpr)]

    def metrics(self) -> dict[str, float]:
        """{metric name: value} for loggers (:func:`metric_names`)."""
        return dict(zip(metric_names(self.fprs), (*self.tprs, self.mu), strict=True))

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly: ``{"tpr_at_fpr": {"0.001": ..., "0.01": ...}, "mu_gdp": ..., "mu_gdp_delta": ...}``."""
        return {"tpr_at_fpr": {_fpr_label(a): t for a, t in zip(self.fprs, self.tprs, strict=True)},
                "mu_gdp": self.mu if math.isfinite(self.mu) else None, "mu_gdp_delta": self.delta}

    def __str__(self) -> str:
        tprs = ", ".join(f"TPR {t:.3g} at FPR {a:g}" for a, t in zip(self.fprs, self.tprs, strict=True))
        return f"{tprs}; {self.mu:.3g}-GDP (for delta >= {self.delta:g})"


def no_risk(delta: float, fprs: Sequence[float] = FPRS) -> RiskReadout:
    """The read-outs of no noisy step at all: TPR = FPR (a coin that ignores the data), mu = 0."""
    return RiskReadout(tuple(fprs), tuple(float(a) for a in fprs), 0.0, float(delta))


# ---------------------------------------------------------------------------------------------------------
# closed forms of the Gaussian mechanism (mu-GDP)
# ---------------------------------------------------------------------------------------------------------
def gaussian_tpr(mu: float | np.ndarray, fpr: float | np.ndarray) -> np.ndarray:
    """TPR at FPR alpha of mu-GDP: Phi(Phi^-1(alpha) + mu) (Dong, Roth & Su 2022, Eq. (2.2))."""
    return ndtr(ndtri(np.asarray(fpr, dtype=float)) + np.asarray(mu, dtype=float))


def gaussian_delta(mu: float | np.ndarray, epsilon: float | np.ndarray) -> np.ndarray:
    """delta(eps) of mu-GDP, Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth & Su 2022, Corollary
    2.13); mu > 0. Where the difference cancels (below 1e-6 of its first term) it is evaluated as
    Phi(a) (1 - exp(eps + log Phi(b) - log Phi(a))), so small deltas keep their digits."""
    mu = np.asarray(mu, dtype=float)
    eps = np.asarray(epsilon, dtype=float)
    a = -eps / mu + mu / 2.0
    b = a - mu
    with np.errstate(over="ignore", invalid="ignore"):
        first = ndtr(a)
        value = first - np.exp(eps) * ndtr(b)
        hard = ~(value >= 1e-6 * first) | (first < 1e-250)
        if np.any(hard):
            a_h, b_h, e_h = np.broadcast_to(a, value.shape)[hard], np.broadcast_to(b, value.shape)[hard], \
                np.broadcast_to(eps, value.shape)[hard]
            log_a = log_ndtr(a_h)
            value = np.array(value, copy=True)
            value[hard] = np.exp(log_a) * -np.expm1(np.minimum(e_h + log_ndtr(b_h) - log_a, 0.0))
    return np.maximum(value, 0.0)


# ---------------------------------------------------------------------------------------------------------
# read-outs of discrete PLDs (rows of P-masses on the losses (lower + i) h, mass inf_masses at +infinity)
# ---------------------------------------------------------------------------------------------------------
def tpr_from_pmfs(h: float, lower: int, rows: np.ndarray, inf_masses: np.ndarray,
                  fprs: Sequence[float] = FPRS) -> np.ndarray:
    """The Neyman-Pearson TPR at each FPR of each row: (rows, len(fprs)).

    The test accuses on the largest privacy losses first: the mass at +infinity (Q-mass 0), then the atoms from the
    top loss down, each costing its Q-mass p e^-l of FPR, the atom at the threshold in part. Equals
    min_eps delta(eps) + e^eps alpha of the row's PLD (module docstring).
    """
    rows = np.maximum(np.atleast_2d(np.asarray(rows, dtype=float)), 0.0)
    inf_masses = np.asarray(inf_masses, dtype=float).reshape(-1)
    losses = (lower + np.arange(rows.shape[1])) * h
    top_down = rows[:, ::-1]
    q = top_down * np.exp(np.minimum(-losses[::-1], 700.0))  # capped: a smaller Q-mass only raises the TPR
    q_tail = np.cumsum(q, axis=1)  # Q-mass of the atoms at or above each loss, from the top
    p_tail = np.cumsum(top_down, axis=1)
    out = np.empty((rows.shape[0], len(fprs)))
    index = np.arange(rows.shape[0])
    for col, alpha in enumerate(fprs):
        reached = q_tail >= alpha
        has = reached.any(axis=1)
        k = np.argmax(reached, axis=1)  # the threshold atom (its Q-mass completes alpha)
        q_above = q_tail[index, k] - q[index, k]
        p_above = p_tail[index, k] - top_down[index, k]
        partial = (alpha - q_above) * np.exp(np.minimum(losses[::-1][k], 700.0))  # its P-mass per Q-mass: e^l
        value = np.where(has, p_above + np.minimum(partial, top_down[index, k]), p_tail[:, -1])
        out[:, col] = np.clip(inf_masses + value, alpha, 1.0)
    return out


def _delta_at_grid(h: float, lower: int, rows: np.ndarray, inf_masses: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(losses >= 0, delta at each, delta at eps = 0) of each row: delta(l_j) = inf + sum_{l > l_j} p (1 - e^{l_j - l}),
    from suffix sums formed from the top (as :func:`~lightning_dpts.privacy.pld.epsilons_from_pmfs`)."""
    first = max(0, -lower)
    probs = np.maximum(rows[:, first:], 0.0)
    losses = (lower + first + np.arange(probs.shape[1])) * h
    if probs.shape[1] == 0:
        return losses, np.zeros((rows.shape[0], 0)), inf_masses.copy()
    zeros = np.zeros((probs.shape[0], 1))
    above_mass = np.concatenate([np.cumsum(probs[:, ::-1], axis=1)[:, ::-1][:, 1:], zeros], axis=1)  # sum_{i > j}
    top = float(losses[-1])
    with np.errstate(divide="ignore", over="ignore"):
        if top - float(losses[0]) < 600.0:  # e^{top - l} <= e^600: the Q-sums in the linear domain, from the top
            weighted = np.cumsum((probs * np.exp(top - losses))[:, ::-1], axis=1)[:, ::-1]
            log_above = np.log(np.concatenate([weighted[:, 1:], zeros], axis=1)) - top  # log sum_{i > j} p e^{-l}
        else:
            log_terms = np.log(probs) - losses
            log_q = np.logaddexp.accumulate(log_terms[:, ::-1], axis=1)[:, ::-1]
            log_above = np.concatenate([log_q[:, 1:], np.full((probs.shape[0], 1), -np.inf)], axis=1)
        at_grid = inf_masses[:, None] + above_mass - np.exp(np.minimum(losses + log_above, 700.0))
    at_zero = inf_masses + np.sum(probs * -np.expm1(-losses), axis=1)
    return losses, np.clip(at_grid, 0.0, 1.0), np.clip(at_zero, 0.0, 1.0)


def gdp_mu_from_pmfs(h: float, lower: int, rows: np.ndarray, inf_masses: np.ndarray, delta: float,
                     points: int = SINGLE_MU_POINTS, rtol: float = MU_RTOL) -> np.ndarray:
    """The mu-GDP equivalent of each row down to ``delta`` (module docstring): (rows,), an upper bound on the smallest
    mu with gaussian_delta(mu, eps) >= delta(eps) wherever delta(eps) > ``delta``.

    The eps grid: 0 and up to ``points`` grid losses up to the first one, e_K, with delta(e_K) <= ``delta``. A
    hockey-stick divergence is convex in alpha = e^eps (a supremum of affine functions), so on [e_i, e_{i+1}] the
    PLD's delta lies below the chord through its values at the two ends, and mu-GDP's delta above its tangent at
    e_{i+1}, whose slope in alpha is -Phi(-eps/mu - mu/2); mu passes on the interval when the tangent is above the
    chord at both ends. A second-order check: on the Gaussian mechanism mu is within 0.15% of the closed form with 128
    points, 0.04% with 256, 0.001% with 2048 (tests/privacy/test_risk.py). ``rtol``: the bisection's relative width
    (its upper end is returned).
    """
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    inf_masses = np.asarray(inf_masses, dtype=float).reshape(-1)
    losses, at_grid, at_zero = _delta_at_grid(h, lower, rows, inf_masses)
    n = rows.shape[0]
    out = np.zeros(n)
    # per interval: left eps and delta, right eps and delta; intervals with left_delta = 0 impose nothing
    left_eps, left_delta = np.zeros((n, points + 1)), np.zeros((n, points + 1))
    right_eps, right_delta = np.zeros((n, points + 1)), np.zeros((n, points + 1))
    for r in range(n):
        if inf_masses[r] > delta:
            out[r] = math.inf
            continue
        if at_zero[r] <= delta:
            continue  # delta(eps) <= delta for every eps >= 0: no constraint, mu = 0
        below = np.nonzero(at_grid[r] <= delta)[0]
        if not below.size:  # the kept range ends before delta is reached (mass beyond it is at +infinity)
            out[r] = math.inf
            continue
        last = int(below[0])
        grid = np.unique(np.linspace(0, last, min(points, last + 1)).round().astype(np.int64))
        eps = np.concatenate([[0.0], losses[grid]])
        deltas = np.concatenate([[at_zero[r]], at_grid[r, grid]])
        keep = eps[1:] > eps[:-1]
        m = int(keep.sum())
        left_eps[r, :m], left_delta[r, :m] = eps[:-1][keep], deltas[:-1][keep]
        right_eps[r, :m], right_delta[r, :m] = eps[1:][keep], deltas[1:][keep]
        out[r] = np.nan  # to solve
    todo = np.nonzero(np.isnan(out))[0]
    if todo.size:
        out[todo] = _smallest_mu(left_eps[todo], left_delta[todo], right_eps[todo], right_delta[todo], rtol)
    return out


def _smallest_mu(le: np.ndarray, ld: np.ndarray, re: np.ndarray, rd: np.ndarray, rtol: float) -> np.ndarray:
    """Per row, the upper end of a bisection in log(mu) for the smallest mu that passes every interval's check (see
    :func:`gdp_mu_from_pmfs`); ``inf`` beyond :data:`_MAX_MU`. Only the intervals that failed at the bracket's lower
    end are checked while bisecting (the binding ones); the result is checked on every interval, and where that fails
    the row is bisected again on all of them. Every value returned passed the full check: an upper bound."""
    active = ld > 0
    with np.errstate(over="ignore"):
        width = np.exp(np.minimum(re, 700.0)) - np.exp(np.minimum(le, 700.0))  # e^{e_{i+1}} - e^{e_i}

    def passes(mu: np.ndarray, r: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Whether interval k of row r passes the check at mu[r] (flat index arrays)."""
        m, e = mu[r], re[r, k]
        value = gaussian_delta(m, e)
        slope = ndtr(-e / m - m / 2.0)  # -(d delta_mu / d alpha) at e_{i+1}
        with np.errstate(invalid="ignore", over="ignore"):
            return (value >= rd[r, k]) & (value + slope * width[r, k] >= ld[r, k])

    def failing(mu: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The intervals of ``mask`` whose check fails at each row's ``mu``."""
        r, k = np.nonzero(mask)
        ok = passes(mu, r, k)
        out = np.zeros(mask.shape, dtype=bool)
        out[r[~ok], k[~ok]] = True
        return out

    def bisect(lo: np.ndarray, hi: np.ndarray, rows: np.ndarray, pruned: np.ndarray | None) -> np.ndarray:
        """Bisect ``rows`` between lo (fails) and hi (passes), on the intervals of ``pruned`` (None: all)."""
        lo, hi = lo.copy(), hi.copy()
        r, k = np.nonzero((active if pruned is None else pruned) & rows[:, None])
        live = rows & (hi / lo > 1.0 + rtol)
        while live.any():
            mid = np.where(live, np.sqrt(lo * hi), hi)
            sel = np.nonzero(live[r])[0]
            ok = passes(mid, r[sel], k[sel])
            bad = np.zeros(len(live), dtype=bool)
            bad[r[sel][~ok]] = True
            lo = np.where(bad, mid, lo)
            hi = np.where(live & ~bad, mid, hi)
            if pruned is not None:  # a row that failed keeps only the intervals failing at its new lo
                drop = sel[ok & bad[r[sel]]]
                keep = np.ones(r.size, dtype=bool)
                keep[drop] = False
                r, k = r[keep], k[keep]
            live &= hi / lo > 1.0 + rtol
        return hi

    n = re.shape[0]
    result = np.full(n, math.inf)
    hi = np.ones(n)
    bad = failing(hi, active).any(axis=1)
    while bad.any():  # grow hi until it passes (rows beyond _MAX_MU stay infinite)
        grow = bad & (hi <= _MAX_MU)
        if not grow.any():
            break
        hi = np.where(grow, 4.0 * hi, hi)
        bad = grow & failing(hi, active & grow[:, None]).any(axis=1) | (bad & ~grow)
    solvable = ~bad
    lo = hi / 4.0
    at_lo = failing(lo, active & solvable[:, None])
    shrink = solvable & ~at_lo.any(axis=1)
    while shrink.any():  # shrink the bracket until lo fails (or mu is negligible)
        hi = np.where(shrink, lo, hi)
        lo = np.where(shrink, lo / 4.0, lo)
        tiny = shrink & (hi < 1e-12)
        result[tiny] = hi[tiny]
        solvable &= ~tiny
        shrink &= ~tiny
        at_lo = np.where(shrink[:, None], failing(lo, active & shrink[:, None]), at_lo)
        shrink &= ~at_lo.any(axis=1)
    verified = hi.copy()  # passed the full check
    found = bisect(lo, hi, solvable, at_lo)
    wrong = solvable & failing(found, active & solvable[:, None]).any(axis=1)
    if wrong.any():  # the pruned intervals missed one: bisect those rows on every interval
        found = np.where(wrong, bisect(found, verified, wrong, None), found)
    result[solvable] = found[solvable]
    return result


# ---------------------------------------------------------------------------------------------------------
# read-outs of PLD objects
# ---------------------------------------------------------------------------------------------------------
def risk_from_plds(plds: Iterable[PrivacyLossDistribution], delta: float, fprs: Sequence[float] = FPRS,
                   points: int = SINGLE_MU_POINTS) -> RiskReadout:
    """The read-outs of a mechanism of which every PLD in ``plds`` is a pessimistic (upper-bounding) PLD: the best of
    them (each bounds the risk from above); of a PLD with two directions (dp_accounting's add/remove), the worse."""
    tprs = np.full(len(fprs), np.inf)
    mu = math.inf
    for pld in plds:
        worst_tpr = np.zeros(len(fprs))
        worst_mu = 0.0
        for h, lower, probs, inf_mass in direction_pmfs(pld):
            worst_tpr = np.maximum(worst_tpr, tpr_from_pmfs(h, lower, probs[None, :], np.array([inf_mass]), fprs)[0])
            worst_mu = max(worst_mu, float(gdp_mu_from_pmfs(h, lower, probs[None, :], np.array([inf_mass]), delta,
                                                            points)[0]))
        tprs = np.minimum(tprs, worst_tpr)
        mu = min(mu, worst_mu)
    if not np.isfinite(tprs).all():
        raise ValueError("risk_from_plds needs at least one PLD")
    return RiskReadout(tuple(float(a) for a in fprs), tuple(float(t) for t in tprs), float(mu), float(delta))


def compose_randomized_response(pld: PrivacyLossDistribution, epsilon: float) -> PrivacyLossDistribution:
    """``pld`` composed with the pair that dominates every (epsilon, 0)-DP mechanism (randomized response: loss
    +epsilon with P-mass e^eps / (1 + e^eps), -epsilon with the rest; Kairouz, Oh & Viswanath 2015), pessimistically:
    the shifted atoms are split onto the grid (:func:`~lightning_dpts.privacy.pld.regrid_atoms`). For the read-outs of
    a run that also released pure-DP statistics (``dpts fit``'s Laplace counts). Symmetric PLDs only.
    """
    from lightning_dpts.privacy._dp_accounting import dense_pmf, symmetric_pld

    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon}")
    if epsilon == 0:
        return pld
    h, lower, probs, inf_mass = dense_pmf(pld)
    losses = (lower + np.arange(probs.size)) * h
    w = 1.0 / (1.0 + math.exp(-epsilon))
    first, out = regrid_atoms(np.concatenate([losses + epsilon, losses - epsilon]),
                              np.concatenate([w * probs, (1.0 - w) * probs]), h)
    return symmetric_pld(h, first, out, inf_mass)

"""One-run ε lower bound from the order statistics of the auditor's confidence (numpy/scipy only; no torch).

After Xiang, Wang, Xiao, Tian & Wang, "Tight privacy audit in one run" (arXiv 2509.08704, 2025),
Theorem 2. The game is Steinke et al.'s: m canaries, each included by its own fair coin. The auditor guesses every
canary ("in" above a threshold score, "out" below), ranks the guesses by confidence (distance from the threshold)
and *releases* the r most confident; T counts the mistakes among them. The estimator rejects "the mechanism is
μ-GDP per canary" when so few mistakes are improbable, and reports the largest rejected μ as ε at δ of μ-GDP.

**The law of T (Theorem 2).** Let every canary's observation be an independent draw from the pair P = N(0, 1) (out),
Q = N(μ, 1) (in) and let the auditor use the optimal (MAP) guess, ranked by its likelihood ratio. In confidence
quantile coordinates the m observations are i.i.d. uniform; the cut W (the quantile of the most confident guess *not*
released) is the (m - r)-th order statistic, W ~ Beta(m - r, r + 1), and given W = w the r released guesses are
i.i.d. with error probability γ̄(w), the mean of the pointwise MAP error above quantile w. Hence

    P[T <= u] = E_W[ P[Binomial(r, γ̄(W)) <= u] ],   and for r = m (nothing withheld): P[Binomial(m, Φ(-μ/2)) <= u].

For the Gaussian pair γ̄ has a closed form: with z = x - μ/2 and the cut at |z| = a (here derived, not quoted),
P[|z| > a] = Φ(μ/2 - a) + Φ(-a - μ/2) and the error mass above the cut is Φ(-a - μ/2), so
γ̄ = Φ(-a - μ/2) / (Φ(μ/2 - a) + Φ(-a - μ/2)), which is Φ(-μ/2) at a = 0.

**Why any auditor's guesses are covered** (our argument; the paper states the law above). Given all observations,
independent canaries' coins are independent with posteriors from their own observations, so any released set of r
guesses (any function of the observations, e.g. signs and distances from the median score) errs independently with
probabilities at least the r smallest posterior errors, which is what the MAP ranking gets: T is stochastically
larger than under the MAP rule, whose law is the one above. A μ'-GDP channel with μ' <= μ is a post-processing
of the μ-Gaussian pair (Blackwell's theorem, as Dong, Roth & Su 2022 use it for tradeoff curves), so the same
holds for every μ'-GDP channel and P_μ[T <= u] is nondecreasing in μ: rejecting μ when P_μ[T <= u] <= α is a
level-α test of "μ-GDP or better", and its largest rejected μ is a lower confidence limit.

**Assumption:** the canaries' observations are independent given the coins, each through a channel whose tradeoff
curve is Gaussian (the same hypothesis family as ``one_run_gdp``; the Gaussian shape of the *scores* is not assumed,
unlike :func:`~lightning_dpts.audit.estimators.gaussian_scores_lower_bound`). Exact for the audit model's white-box
scores without sampling (orthogonal canaries, every window in every batch); an assumption elsewhere. The ε is an
(ε, δ) statement only if the mechanism's curve is Gaussian.

Units: ε in nats, δ and confidence probabilities, μ the GDP parameter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.special import expit, log_ndtr, ndtr
from scipy.stats import beta as beta_dist
from scipy.stats import binom

from lightning_dpts.audit.estimators import (
    MU_CAP,
    AuditBound,
    _check_confidence,
    _check_delta,
    _check_scores,
    _largest_rejected,
    gaussian_dp_epsilon,
)
from lightning_dpts.errors import ConfigurationError

__all__ = ["default_releases", "order_statistics_error_tail", "order_statistics_lower_bound"]

#: fractions of the canaries released when ``releases=None`` (fixed in advance; each paid for by Bonferroni)
RELEASE_FRACTIONS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)
#: bins of the cut's probability scale in the quadrature of Theorem 2 (equal steps in logit(P[W <= w]))
QUADRATURE_BINS = 2000
#: the quadrature covers P[W <= w] in [expit(-LOGIT_SPAN), expit(LOGIT_SPAN)]; the rest (4e-18) is counted as 1
LOGIT_SPAN = 40.0


def default_releases(canaries: int) -> list[int]:
    """The released-guess counts r searched when ``releases=None``: ⌈f·m⌉ for f in :data:`RELEASE_FRACTIONS`
    (deduplicated; at least 1). A function of m only, as the Bonferroni correction requires."""
    return sorted({max(1, math.ceil(f * canaries)) for f in RELEASE_FRACTIONS})


@functools.lru_cache(maxsize=64)
def _cut_grid(canaries: int, released: int) -> tuple[np.ndarray, np.ndarray]:
    """For W ~ Beta(m - r, r + 1): the bins' probability masses and log(1 - w) at each bin's upper end.

    Breakpoints p_k = expit(t_k), t_k equally spaced in [-LOGIT_SPAN, LOGIT_SPAN]; 1 - w at p is the (1 - p)-quantile
    of 1 - W ~ Beta(r + 1, m - r), computed from expit(-t) directly so the top of the range keeps its precision.
    The last bin [p_K, 1] has upper end w = 1 (log 0): the caller counts it with integrand 1.
    """
    t = np.linspace(-LOGIT_SPAN, LOGIT_SPAN, QUADRATURE_BINS)
    edges = np.concatenate(([0.0], expit(t), [1.0]))
    mass = np.diff(edges)
    with np.errstate(divide="ignore"):
        log_tail = np.log(beta_dist.ppf(expit(-t), released + 1, canaries - released))
    return mass, np.concatenate((log_tail, [-np.inf]))


def _log_tail_beyond(a: np.ndarray, mu: float) -> np.ndarray:
    """log P[|z| > a] for z = x - μ/2, x from the mixture (N(0,1) + N(μ,1))/2: log(Φ(μ/2 - a) + Φ(-a - μ/2))."""
    return np.logaddexp(log_ndtr(0.5 * mu - a), log_ndtr(-a - 0.5 * mu))


def _cut_distance(log_tail: np.ndarray, mu: float, iterations: int = 16) -> np.ndarray:
    """The a >= 0 with log P[|z| > a] = ``log_tail`` (the left side decreases in a).

    Bracketed on a grid of 4097 points over [0, μ/2 + 40] (spacing < 0.01 for μ < 40), then bisected ``iterations``
    times inside the bracket (to < 2e-7).
    """
    grid = np.linspace(0.0, 0.5 * mu + 40.0, 4097)
    values = _log_tail_beyond(grid, mu)  # decreasing: searchsorted on its negation
    j = np.clip(np.searchsorted(-values, -log_tail, side="right"), 1, grid.size - 1)
    lo, hi = grid[j - 1], grid[j]
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        above = _log_tail_beyond(mid, mu) > log_tail
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    # the larger end: a slightly more confident cut, a smaller error rate, a larger tail (conservative); beyond the
    # grid, an infinitely confident cut (error rate 0)
    return np.where(log_tail < values[-1], np.inf, hi)


def order_statistics_error_tail(mu: float, canaries: int, released: int, errors: int) -> float:
    """P[T <= errors] for a μ-GDP Gaussian pair per canary (Xiang et al. 2025, Theorem 2; module docstring).

    T is the number of mistakes among the ``released`` most confident of ``canaries`` MAP guesses. For r < m the
    expectation over the cut W ~ Beta(m - r, r + 1) is an *upper* Riemann sum: the integrand increases in w (a
    higher cut releases more confident guesses), so each bin of the cut's probability scale is charged its value at
    the bin's upper end, and the bins beyond the quadrature range are charged 1. The result is never below the exact
    value (up to floating point), so tests built on it stay valid. For r = m: P[Binomial(m, Φ(-μ/2)) <= errors].

    Args:
        mu: the hypothesized GDP parameter, >= 0.
        canaries: m >= 1.
        released: r in [1, m].
        errors: u in [0, r].
    """
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and mu >= 0.0):
        raise ConfigurationError("mu", mu, "a finite float >= 0")
    m, r, u = int(canaries), int(released), int(errors)
    if not (m >= 1 and 1 <= r <= m and 0 <= u <= r):
        raise ConfigurationError("errors", (m, r, u), "canaries >= 1, 1 <= released <= canaries, "
                                 "0 <= errors <= released")
    if u >= r:
        return 1.0
    if r == m:
        return float(binom.cdf(u, m, ndtr(-0.5 * mu)))
    mass, log_tail = _cut_grid(m, r)
    a = _cut_distance(log_tail[:-1], float(mu))
    finite = np.isfinite(a)
    a = np.where(finite, a, 0.0)
    log_error = log_ndtr(-a - 0.5 * mu) - _log_tail_beyond(a, float(mu))
    integrand = np.where(finite, binom.cdf(u, r, np.minimum(np.exp(log_error), 0.5)), 1.0)
    return float(min(1.0, np.dot(mass[:-1], integrand) + mass[-1]))


def _released_mistakes(scores: np.ndarray, included: np.ndarray, threshold: float, r: int) -> tuple[int, int, int]:
    """(mistakes, "in" guesses, "out" guesses) among the r guesses farthest from ``threshold``.

    Ties in distance are broken by canary index (a stable sort), which does not depend on the coins.
    """
    distance = np.abs(scores - threshold)
    order = np.argsort(-distance, kind="stable")[:r]
    guess_in = scores[order] > threshold
    mistakes = int(np.sum(guess_in != included[order]))
    return mistakes, int(guess_in.sum()), int(r - guess_in.sum())


def order_statistics_lower_bound(
    scores: Any,
    included: Any,
    *,
    delta: float,
    confidence: float = 0.95,
    releases: Sequence[int] | None = None,
    threshold: float | None = None,
    tolerance: float = 1e-4,
    runs: int = 1,
) -> AuditBound:
    """One-run lower bound on the Gaussian-DP μ from the r most confident guesses (Xiang et al. 2025, Theorem 2),
    reported as ε at δ of μ-GDP.

    Every canary is guessed "in" if its score exceeds ``threshold`` and "out" otherwise, with confidence its distance
    from the threshold. For each r in ``releases`` the r most confident guesses are released and their mistakes u
    counted; μ is rejected when :func:`order_statistics_error_tail` (μ, m, r, u) <= (1 - confidence) / len(releases)
    (Bonferroni over the r's, fixed in advance), and the largest μ rejected at any r is reported. Valid under the
    assumption in the module docstring (independent canaries, Gaussian tradeoff curves): with probability at least
    ``confidence`` the mechanism is not μ'-GDP per canary for any μ' < ``mu``.

    Args:
        scores, included: as in :func:`~lightning_dpts.audit.estimators.one_run_epsilon_lower_bound` (higher score =
            more likely included; never a function of the coins).
        delta: the δ of the reported ε, in (0, 1).
        confidence: probability in (0, 1).
        releases: released-guess counts r, each in [1, m]; None: :func:`default_releases` (r = m/10, m/4, m/2, m).
        threshold: the score separating "in" from "out" guesses; None: the median score (a function of all scores,
            not of the coins, so the guarantee holds). For a white-box log-likelihood ratio, 0 is the MAP threshold.
        tolerance: bisection tolerance on μ.
        runs: independent runs pooled into ``scores`` (:func:`~lightning_dpts.audit.estimators.pool_runs`);
            recorded only.

    Returns:
        An :class:`~lightning_dpts.audit.estimators.AuditBound` with ``method="order_statistics"``, ``mu``,
        ``guesses`` = r and ``correct`` = r - u at the r that gave the bound, ``k_plus`` / ``k_minus`` its "in" /
        "out" guesses, ``grid_size`` = len(releases).
    """
    confidence = _check_confidence(confidence)
    delta = _check_delta(delta, positive=True)
    s, inc = _check_scores(scores, included)
    m = s.size
    if not isinstance(runs, (int, np.integer)) or isinstance(runs, bool) or runs < 1:
        raise ConfigurationError("runs", runs, "an integer >= 1")
    if releases is None:
        grid = default_releases(m)
    else:
        try:
            grid = [int(r) for r in releases if not isinstance(r, bool) and int(r) == r]
        except (TypeError, ValueError) as err:
            raise ConfigurationError("releases", releases, f"integers in [1, {m}] (the canaries)") from err
        if len(grid) != len(list(releases)) or not grid or not all(1 <= r <= m for r in grid):
            raise ConfigurationError("releases", releases, f"a non-empty sequence of integers in [1, {m}]")
    if threshold is None:
        threshold = float(np.median(s))
    elif not (isinstance(threshold, (int, float)) and math.isfinite(threshold)):
        raise ConfigurationError("threshold", threshold, "a finite float, or None for the median score")
    if not (isinstance(tolerance, (int, float)) and 0.0 < tolerance < 1.0):
        raise ConfigurationError("tolerance", tolerance, "a float in (0, 1)")
    alpha = (1.0 - confidence) / len(grid)
    best: tuple[float, int, tuple[int, int, int]] | None = None
    for r in grid:
        counts = _released_mistakes(s, inc, float(threshold), r)
        u = counts[0]

        def rejects(mu: float, r: int = r, u: int = u) -> bool:
            return order_statistics_error_tail(mu, m, r, u) <= alpha

        if best is not None and best[0] > 0.0 and not rejects(best[0]):
            continue  # this r cannot beat the best so far
        value = _largest_rejected(rejects, MU_CAP, tolerance)
        if best is None or value > best[0]:
            best = (value, r, counts)
    assert best is not None
    mu, r, (u, k_in, k_out) = best
    eps = gaussian_dp_epsilon(mu, delta) if mu > 0.0 else 0.0
    return AuditBound(epsilon=float(eps), confidence=confidence, delta=delta, method="order_statistics",
                      guesses=int(r), correct=int(r - u), canaries=int(m), k_plus=k_in, k_minus=k_out,
                      grid_size=len(grid), mu=float(mu), runs=int(runs))

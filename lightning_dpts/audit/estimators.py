"""Empirical lower bounds on ε from canary guesses (numpy/scipy only; no torch).

The estimators turn what an auditor observed into a statement "the mechanism is *not* (ε, δ)-DP for this ε,
except with probability at most 1 - confidence". Each returns an :class:`AuditBound`; ``epsilon`` is 0.0 when
nothing is shown. What each proves, and what it cannot, is in docs/audit.md.

* :func:`one_run_epsilon_lower_bound`: one training run with ``m`` canaries, each included independently with
  probability 1/2 (Steinke, Nasr & Jagielski, "Privacy auditing with one (1) training run", NeurIPS 2023,
  Theorem 3 with its δ term). The auditor guesses "in" for the ``k_plus`` highest scores, "out" for the
  ``k_minus`` lowest and abstains on the rest; the bound is the largest over a grid of ``(k_plus, k_minus)``,
  each tested at level ``(1 - confidence) / len(grid)`` (Bonferroni), so the maximum stays valid.
* :func:`one_run_fdp_lower_bound`: the same game analysed with f-DP (Mahloujifar, Melis & Chaudhuri, "Auditing
  f-differential privacy in one run", ICML 2025): the largest ε whose (ε, δ)-DP tradeoff curve is rejected (no
  assumption; tighter than Steinke et al.'s analysis), or, with ``curve="gaussian"``, the largest rejected
  Gaussian-DP μ reported as ε at δ (Balle & Wang 2018; Dong, Roth & Su 2022), which assumes the mechanism's
  tradeoff curve is Gaussian.
* :func:`one_run_tradeoff_test`: the same analysis against one claimed curve, e.g. the accountant's own
  (:func:`inverse_power_from_privacy_profile`): a rejection refutes the claim.
* :func:`gaussian_scores_lower_bound`: the scores themselves, not guesses, read as Gaussian with a common spread
  (after Agrawal et al., "Let's ask Gauss", 2026): a noncentral-t lower confidence limit on the standardized shift
  μ, reported as ε at δ of μ-GDP. Exact for white-box scores of unsampled DP-SGD; an assumption elsewhere.
  :func:`pool_runs` joins independent runs into one game for any of these, and for
  :func:`lightning_dpts.audit.order_statistics.order_statistics_lower_bound` (the r most confident guesses read
  through their order statistics, Xiang et al. 2025).
* :func:`clopper_pearson_epsilon_lower_bound`: many independent runs, each with or without one canary
  (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021): Clopper-Pearson upper bounds on the attack's false
  positive and false negative rates and the (ε, δ)-DP hypothesis-testing inequalities.

Units: ε in nats (natural log), δ and confidence are probabilities, μ is the GDP parameter (a mean shift in
units of the noise's standard deviation).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit, log_ndtr, logit, ndtr, ndtri
from scipy.stats import beta as beta_dist
from scipy.stats import binom

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "AuditBound",
    "clopper_pearson_epsilon_lower_bound",
    "default_guess_grid",
    "gaussian_dp_delta",
    "gaussian_dp_epsilon",
    "gaussian_scores_lower_bound",
    "pool_runs",
    "inverse_power_from_privacy_profile",
    "one_run_epsilon_lower_bound",
    "one_run_fdp_lower_bound",
    "one_run_tradeoff_test",
    "TradeoffTest",
]

#: the largest ε (nats) the one-run searches consider; q = expit(50) differs from 1 by 2e-22
EPSILON_CAP = 50.0
#: the largest GDP μ the f-DP search considers (ε at δ = 1e-5 of μ = 40 is about 980)
MU_CAP = 40.0
#: smallest number of guesses in the default grid: fewer cannot show anything at the Bonferroni level
MIN_GUESSES = 10


@dataclass(frozen=True)
class AuditBound:
    """An empirical lower bound on ε with what it rests on.

    Attributes:
        epsilon: the lower bound in nats; 0.0 if the observations show nothing. With probability at least
            ``confidence`` (over the canaries' coin flips and the mechanism's noise) the audited mechanism is not
            (ε', ``delta``)-DP for any ε' < ``epsilon`` (for ``"one_run_gdp"`` and ``"one_run_gdp_profile"``: only
            under the Gaussian-curve assumption stated in :func:`one_run_fdp_lower_bound`).
        confidence: the probability the statement holds (the grid search is already paid for).
        delta: the δ of the (ε, δ) statement.
        method: ``"one_run"`` (Steinke et al.), ``"one_run_fdp"`` (Mahloujifar et al., (ε, δ) curves),
            ``"one_run_gdp"`` / ``"one_run_gdp_profile"`` (Gaussian curves), ``"gaussian_scores"``,
            ``"order_statistics"`` (:mod:`lightning_dpts.audit.order_statistics`) or ``"clopper_pearson"``.
        guesses: non-abstaining guesses of the chosen grid point (one-run), or trials (multi-run).
        correct: correct guesses among them.
        canaries: canaries in the run (one-run), or ``None``.
        k_plus: "in" guesses at the chosen grid point (the highest scores), or ``None``.
        k_minus: "out" guesses at the chosen grid point (the lowest scores), or ``None``.
        grid_size: grid points searched; each was tested at level ``(1 - confidence) / grid_size``.
        mu: the largest rejected GDP μ (the Gaussian-curve methods and ``"order_statistics"``), or the
            noncentral-t limit (``"gaussian_scores"``).
        false_positive_rate_upper: Clopper-Pearson upper bound on FPR (``"clopper_pearson"`` only).
        false_negative_rate_upper: Clopper-Pearson upper bound on FNR (``"clopper_pearson"`` only).
        normality_pvalue: ``"gaussian_scores"`` only: D'Agostino-Pearson p-value of the pooled, centred scores (a
            diagnostic of the estimator's assumption; small values say the scores are not Gaussian).
        runs: independent training runs whose canaries were pooled (1: one run).
    """

    epsilon: float
    confidence: float
    delta: float
    method: str
    guesses: int
    correct: int
    canaries: int | None = None
    k_plus: int | None = None
    k_minus: int | None = None
    grid_size: int = 1
    mu: float | None = None
    false_positive_rate_upper: float | None = None
    false_negative_rate_upper: float | None = None
    normality_pvalue: float | None = None
    runs: int = 1

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict (plain floats, ints and ``None``)."""
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------------------------- validation


def _check_confidence(confidence: float) -> float:
    if not isinstance(confidence, (int, float)) or not 0.0 < float(confidence) < 1.0:
        raise ConfigurationError("confidence", confidence, "a probability in (0, 1), e.g. 0.95")
    return float(confidence)


def _check_delta(delta: float, *, positive: bool = False) -> float:
    ok = isinstance(delta, (int, float)) and math.isfinite(float(delta))
    if positive:
        if not (ok and 0.0 < float(delta) < 1.0):
            raise ConfigurationError(
                "delta", delta, "a probability in (0, 1): a μ-GDP mechanism with μ > 0 has ε = ∞ at δ = 0"
            )
    elif not (ok and 0.0 <= float(delta) < 1.0):
        raise ConfigurationError("delta", delta, "a probability in [0, 1)")
    return float(delta)


def _check_scores(scores: Any, included: Any) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(scores, dtype=float)
    if s.ndim != 1 or s.size < 1:
        raise ConfigurationError("scores", np.shape(scores), "a non-empty 1-D array, one score per canary")
    if not np.all(np.isfinite(s)):
        raise ConfigurationError("scores", "non-finite values", "finite floats (no NaN or inf)")
    inc = np.asarray(included)
    if inc.shape != s.shape:
        raise ConfigurationError(
            "included", np.shape(included), f"a 1-D boolean array of the same length as scores ({s.size})"
        )
    if inc.dtype != bool:
        if not np.all(np.isin(inc, (0, 1))):
            raise ConfigurationError("included", "values other than 0/1", "booleans (True = canary was included)")
        inc = inc.astype(bool)
    return s, inc


def default_guess_grid(canaries: int) -> list[tuple[int, int]]:
    """The ``(k_plus, k_minus)`` pairs searched when ``guesses=None``.

    For every k in the 1-2-5 sequence from :data:`MIN_GUESSES` up to ``canaries`` (and ``canaries`` itself): only
    "in" guesses ``(k, 0)``, only "out" guesses ``(0, k)`` and both ``(k, k)`` when ``2k <= canaries``. For m canaries
    that is about 3·3·log10(m / 10) points (33 at m = 10^5). Fixed before the data are seen, as the Bonferroni
    correction requires.
    """
    ks: list[int] = []
    decade = MIN_GUESSES
    while decade <= canaries:
        ks += [k for k in (decade, 2 * decade, 5 * decade) if k <= canaries]
        decade *= 10
    if canaries >= MIN_GUESSES and canaries not in ks:
        ks.append(canaries)
    if not ks:  # fewer canaries than MIN_GUESSES: guess on all of them
        ks = [canaries]
    grid: list[tuple[int, int]] = []
    for k in ks:
        grid += [(k, 0), (0, k)]
        if 2 * k <= canaries:
            grid.append((k, k))
    return grid


def _check_grid(guesses: Sequence[tuple[int, int]] | None, canaries: int) -> list[tuple[int, int]]:
    if guesses is None:
        return default_guess_grid(canaries)
    grid: list[tuple[int, int]] = []
    try:
        pairs = [tuple(g) for g in guesses]
    except TypeError as err:
        raise ConfigurationError("guesses", guesses, "a sequence of (k_plus, k_minus) integer pairs") from err
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in pair):
            raise ConfigurationError("guesses", pair, "(k_plus, k_minus) pairs of integers")
        kp, km = int(pair[0]), int(pair[1])
        if kp < 0 or km < 0 or not 1 <= kp + km <= canaries:
            raise ConfigurationError(
                "guesses", pair, f"k_plus >= 0, k_minus >= 0 and 1 <= k_plus + k_minus <= {canaries} (the canaries)"
            )
        grid.append((kp, km))
    if not grid:
        raise ConfigurationError("guesses", guesses, "at least one (k_plus, k_minus) pair, or None for the default")
    return grid


def _guess_counts(scores: np.ndarray, included: np.ndarray, grid: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``(r, v)`` per grid point: guesses made and correct guesses for top-``k_plus`` "in", bottom-``k_minus`` "out".

    Ties are broken by canary index (a stable sort), which does not depend on which canaries were included.
    """
    order = np.argsort(-scores, kind="stable")
    inc_sorted = included[order].astype(np.int64)
    cum_in = np.concatenate(([0], np.cumsum(inc_sorted)))  # cum_in[k] = included among the top k
    m = scores.size
    total_in = int(cum_in[-1])
    out: list[tuple[int, int]] = []
    for kp, km in grid:
        correct_in = int(cum_in[kp])
        included_in_bottom = total_in - int(cum_in[m - km])
        correct_out = km - included_in_bottom
        out.append((kp + km, correct_in + correct_out))
    return out


# ------------------------------------------------------------------------------------------ Steinke et al., Thm 3


def _pure_epsilon(r: int, v: int, alpha: float) -> float:
    """Largest ε with P[Binomial(r, expit(ε)) >= v] <= alpha (0.0 if none), capped at :data:`EPSILON_CAP`.

    P[Binomial(r, q) >= v] is the regularized incomplete beta I_q(v, r - v + 1), increasing in q, so the answer is
    logit of its alpha-quantile (the one-sided Clopper-Pearson lower limit on q).
    """
    if v <= 0:
        return 0.0
    q_lo = float(beta_dist.ppf(alpha, v, r - v + 1))
    if not q_lo > 0.5:
        return 0.0
    return float(min(logit(q_lo), EPSILON_CAP)) if q_lo < 1.0 else EPSILON_CAP


def _delta_coefficient(r: int, v: int, q: float, window: int = 4096) -> float:
    """An upper bound on Steinke et al.'s max_{i in 1..v} P[v > Binomial(r, q) >= v - i] / i.

    The partial sums are evaluated exactly for i = 1 .. w, w = min(v, ``window``, v - (12 standard deviations below
    the mean)); every ratio with i > w is at most P[Binomial < v] / (w + 1), which is added as a candidate, so the
    result is never below the exact maximum.
    """
    if v <= 0:
        return 0.0
    mean, sd = r * q, math.sqrt(max(r * q * (1.0 - q), 1e-300))
    w = min(v, window, max(1, v - int(math.floor(mean - 12.0 * sd))))
    j = np.arange(v - 1, v - w - 1, -1)
    partial = np.cumsum(binom.pmf(j, r, q))
    best = float(np.max(partial / np.arange(1, w + 1)))
    if w < v:
        best = max(best, float(binom.cdf(v - 1, r, q)) / (w + 1))
    return best


def _steinke_tail(m: int, r: int, v: int, epsilon: float, delta: float, stop_above: float = math.inf) -> float:
    """Steinke, Nasr & Jagielski (2023), Theorem 3: an upper bound on P[W >= v] for an (ε, δ)-DP mechanism.

    W is the number of correct guesses among r non-abstaining guesses on m canaries included independently with
    probability 1/2: P[W >= v] <= P[Bin(r, q) >= v] + 2 m δ max_i P[v > Bin(r, q) >= v - i] / i, q = e^ε/(1+e^ε).
    If the binomial term alone is >= ``stop_above``, that term is returned (a value known to be >= ``stop_above``).
    """
    q = float(expit(epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta > 0.0 and tail < stop_above:  # the δ term only adds: skip it once the answer is known to exceed
        tail += 2.0 * m * delta * _delta_coefficient(r, v, q)
    return min(tail, 1.0)


def _largest_rejected(test: Any, hi: float, tol: float) -> float:
    """Bisection for the largest x in [0, hi] with ``test(x)`` true, starting from ``test(0)``.

    Returns a point where ``test`` holds (0.0 if it fails at 0). That is enough for validity even if ``test`` were
    not monotone: a mechanism with true parameter x0 also satisfies every weaker hypothesis x > x0, each of which
    bounds P[W >= v] by alpha at every v it rejects; so the set of v rejected at *some* x > x0 starts at a v* with
    P[W >= v*] <= alpha, and reporting any x > x0 needs W >= v*. (Monotonicity, checked in tests/audit, only makes
    the bisection find the largest such x.)
    """
    if not test(0.0):
        return 0.0
    if test(hi):
        return hi
    lo = 0.0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if test(mid):
            lo = mid
        else:
            hi = mid
    return lo


def one_run_epsilon_lower_bound(
    scores: Any,
    included: Any,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[tuple[int, int]] | None = None,
    tolerance: float = 1e-4,
) -> AuditBound:
    """One-run ε lower bound of Steinke, Nasr & Jagielski (NeurIPS 2023, Theorem 3, with δ).

    Game: m canaries, each included in the training data independently with probability 1/2 (``included``, drawn
    before training, from randomness independent of everything else). After one run the auditor scores each canary
    (``scores``: higher = more likely included; any function of the run's output and the public canaries, but not
    of ``included``). For each grid point ``(k_plus, k_minus)`` it guesses "in" for the ``k_plus`` highest scores,
    "out" for the ``k_minus`` lowest and abstains on the rest, giving r = k_plus + k_minus guesses of which v are
    correct. If the mechanism is (ε, δ)-DP with respect to each canary, P[W >= v] <= P[Bin(r, q) >= v] + 2mδ ·
    max_i P[v > Bin(r, q) >= v - i] / i with q = e^ε / (1 + e^ε). The reported ε is the largest (to ``tolerance``)
    for which that bound is <= (1 - confidence) / len(grid) at some grid point; over the grid the failure
    probability adds up to at most 1 - confidence (Bonferroni).

    Args:
        scores: one float per canary.
        included: one bool per canary (the truth).
        delta: the δ of the tested (ε, δ) hypothesis, in [0, 1). Note the 2mδ factor: with δ = 1e-5 and 10^5
            canaries it is 2, which caps what can be shown; :func:`one_run_fdp_lower_bound` avoids this.
        confidence: probability in (0, 1) that the statement holds.
        guesses: the ``(k_plus, k_minus)`` grid, fixed before looking at the scores; ``None`` uses
            :func:`default_guess_grid`.
        tolerance: bisection tolerance on ε (nats); the result is rounded down.

    Returns:
        An :class:`AuditBound` with ``method="one_run"`` and the grid point that gave the bound.
    """
    confidence = _check_confidence(confidence)
    delta = _check_delta(delta)
    s, inc = _check_scores(scores, included)
    m = s.size
    grid = _check_grid(guesses, m)
    alpha = (1.0 - confidence) / len(grid)
    best = (0.0, grid[0], *_guess_counts(s, inc, grid[:1])[0])
    for (kp, km), (r, v) in zip(grid, _guess_counts(s, inc, grid), strict=True):
        hi = _pure_epsilon(r, v, alpha)  # the δ term only adds, so ε cannot exceed the pure-DP answer
        if hi <= best[0]:
            continue
        eps = _largest_rejected(
            lambda e, r=r, v=v: _steinke_tail(m, r, v, e, delta, stop_above=alpha) <= alpha, hi, tolerance
        )
        if eps > best[0]:
            best = (eps, (kp, km), r, v)
    eps, (kp, km), r, v = best
    return AuditBound(
        epsilon=float(eps), confidence=confidence, delta=delta, method="one_run", guesses=int(r), correct=int(v),
        canaries=m, k_plus=kp, k_minus=km, grid_size=len(grid),
    )


# ------------------------------------------------------------------------------------------ Gaussian DP (one run)


def gaussian_dp_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of μ-GDP: Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2) (Dong, Roth & Su 2022, Corollary 2.13; Balle & Wang 2018).

    This is also the exact privacy profile of the Gaussian mechanism with sensitivity/σ = μ. ``mu = 0`` gives 0.
    """
    if mu <= 0.0:
        return 0.0
    a = log_ndtr(mu / 2.0 - epsilon / mu)
    b = epsilon + log_ndtr(-mu / 2.0 - epsilon / mu)
    return float(max(math.exp(a) * -math.expm1(min(b - a, 0.0)), 0.0))


def gaussian_dp_epsilon(mu: float, delta: float) -> float:
    """The smallest ε >= 0 with :func:`gaussian_dp_delta` (mu, ε) <= delta (nats), for δ in (0, 1)."""
    if mu <= 0.0 or gaussian_dp_delta(mu, 0.0) <= delta:
        return 0.0
    hi = 1.0
    while gaussian_dp_delta(mu, hi) > delta:
        hi *= 2.0
    return float(brentq(lambda e: gaussian_dp_delta(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12))


def _fdp_consistent(inverse_power: Callable[[float], float], m: int, r: int, v: int, alpha: float) -> bool:
    """Mahloujifar, Melis & Chaudhuri (ICML 2025): can an f-DP mechanism give v correct guesses out of r?

    Returns False when "the mechanism is f-DP with respect to each canary" is rejected at level ``alpha`` by v
    correct guesses out of r on m canaries (membership: a binary alphabet). Their theorem: under f-DP,
    P[W >= v] >= alpha is only possible if the guessing mass the adversary needs, computed backwards from the
    all-correct end, fits in the r/m it has. Start with h_v = alpha·(r - v)/m (mass of wrong guesses) and
    s_v = alpha·v/m (mass of right guesses); for i = v - 1, ..., 0: h_i = max(h_{i+1}, f̄⁻¹(s_{i+1})) and
    s_i = s_{i+1} + i/(r - i)·(h_i - h_{i+1}), where f̄⁻¹(x) = ``inverse_power(x)`` is the smallest type-I error at
    which a test between neighbours reaches power x (for G_μ: Φ(Φ⁻¹(x) - μ)). Consistent iff s_0 + h_0 <= r/m.
    Once h stops growing the state is fixed, and once s + h exceeds r/m it stays above (both only grow), so the
    loop stops at either.
    """
    h = alpha * (r - v) / m
    s = alpha * v / m
    for i in range(v - 1, -1, -1):
        h_next = max(h, float(inverse_power(s)))
        if h_next == h:
            break
        s += i / (r - i) * (h_next - h)
        h = h_next
        if s + h > r / m:  # s and h only grow: already inconsistent
            return False
    return s + h <= r / m


def _gdp_inverse_power(mu: float) -> Callable[[float], float]:
    """f̄⁻¹ of the Gaussian tradeoff curve G_μ: the smallest type-I error with power x is Φ(Φ⁻¹(x) - μ)."""
    return lambda x: float(ndtr(ndtri(x) - mu))


def _gdp_profile_rejects(mu: float, eps_ok: np.ndarray, tails_ok: np.ndarray, coef: np.ndarray, alpha: float) -> bool:
    """The ``curve="gaussian_profile"`` test: min over ε of Steinke's tail bound at (ε, δ_μ(ε)) is <= alpha."""
    if mu <= 0.0:
        deltas = np.zeros_like(eps_ok)
    else:  # gaussian_dp_delta on an array of ε
        a = log_ndtr(mu / 2.0 - eps_ok / mu)
        b = eps_ok + log_ndtr(-mu / 2.0 - eps_ok / mu)
        deltas = np.maximum(np.exp(a) * -np.expm1(np.minimum(b - a, 0.0)), 0.0)
    return bool(np.min(tails_ok + coef * deltas) <= alpha)


def _epsilon_delta_inverse_power(epsilon: float, delta: float) -> Callable[[float], float]:
    """f̄⁻¹ of the (ε, δ)-DP tradeoff curve: power p needs type-I error max(0, (p - δ)e^-ε, 1 - δ - e^ε(1 - p))."""
    down, up = math.exp(-epsilon), math.exp(epsilon)
    return lambda p: max(0.0, (p - delta) * down, 1.0 - delta - up * (1.0 - p))


#: the curve families :func:`one_run_fdp_lower_bound` can search, and the ``method`` each reports
FDP_CURVES = {"epsilon_delta": "one_run_fdp", "gaussian": "one_run_gdp", "gaussian_profile": "one_run_gdp_profile"}


def one_run_fdp_lower_bound(
    scores: Any,
    included: Any,
    *,
    delta: float,
    confidence: float = 0.95,
    guesses: Sequence[tuple[int, int]] | None = None,
    tolerance: float = 1e-4,
    curve: str = "epsilon_delta",
    epsilon_points: int = 48,
) -> AuditBound:
    """One-run lower bound by the f-DP analysis of Mahloujifar, Melis & Chaudhuri (ICML 2025).

    Same game and grid as :func:`one_run_epsilon_lower_bound`: r guesses (top ``k_plus`` "in", bottom ``k_minus``
    "out"), v correct. For each grid point, the hypothesis "the mechanism is f-DP with respect to each canary" is
    tested at level α = (1 - confidence) / len(grid) for the curves f of a one-parameter family, ordered so that
    every test gets easier as the parameter shrinks; the rejection set is an interval found by bisection and the
    largest rejected parameter over the grid is reported. If the mechanism's curve is in the family, a larger one
    is reported only if some grid point rejected the truth: probability at most 1 - confidence (Bonferroni).

    ``curve`` picks the family:

    * ``"epsilon_delta"`` (default, **no assumption**): f = f_{ε,δ}, the curve of (ε, δ)-DP at the given ``delta``
      (Dong, Roth & Su 2022, Prop. 2.5). Every (ε', δ)-DP mechanism is in this family, so the reported ``epsilon``
      is a lower bound on the mechanism's ε at ``delta`` with probability >= ``confidence``, whatever the
      mechanism. Same statement as :func:`one_run_epsilon_lower_bound`, from a tighter analysis (on a Gaussian
      mechanism with 10^5 canaries it reaches about 0.55 of ε at ε = 4 and 8, Steinke et al.'s about 0.3).
    * ``"gaussian"``: f = G_μ (Dong et al.), the Gaussian curves; reports ``mu`` and ``epsilon`` = ε_μ(δ)
      (:func:`gaussian_dp_epsilon`). **Assumes** the mechanism's curve is Gaussian: true for the Gaussian
      mechanism and approximately (central limit theorem, Dong et al. Theorem 3.5) for DP-SGD with many steps,
      but not in general: randomized response with ε = 1 gets a "gaussian" bound of 1.04-1.07 from 10^3-10^4
      canaries (tests/audit/test_estimators.py). What holds without the assumption: "not μ-GDP".
    * ``"gaussian_profile"``: the Gaussian family with a weaker test whose proof is short (no recursion): a
      μ-GDP mechanism is (ε, δ_μ(ε))-DP for every ε (Dong et al., Corollary 2.13), so Steinke et al.'s Theorem 3
      gives P[W >= v] <= F_μ(v) := inf_ε T(ε, δ_μ(ε); v); μ is rejected if T <= α at one of ``epsilon_points``
      values of ε chosen from (r, v), which implies F_μ(v) <= α, and P[F_μ(W) <= α] <= α for any tail bound F_μ
      of W. Same assumption as ``"gaussian"``.

    The recursion (:func:`_fdp_consistent`) is written from the paper's method as its authors' reference
    implementation (facebookresearch/PrivacyGuard, ``FDPAnalysisNode``) computes it; its validity rests on their
    theorem, and the tests check it empirically (rejection rates over seeds on mechanisms with known curves).

    Args:
        scores, included, confidence, guesses: as in :func:`one_run_epsilon_lower_bound`.
        delta: the δ of the reported ε, in (0, 1).
        tolerance: bisection tolerance on ε (``"epsilon_delta"``) or μ; the result is rounded down.
        curve: ``"epsilon_delta"``, ``"gaussian"`` or ``"gaussian_profile"`` (above).
        epsilon_points: ``"gaussian_profile"`` only: how many ε values the infimum is evaluated at.

    Returns:
        An :class:`AuditBound` with ``method`` ``"one_run_fdp"``, ``"one_run_gdp"`` or ``"one_run_gdp_profile"``;
        ``mu`` is the largest rejected μ for the Gaussian families and ``None`` otherwise.
    """
    confidence = _check_confidence(confidence)
    delta = _check_delta(delta, positive=True)
    s, inc = _check_scores(scores, included)
    if curve not in FDP_CURVES:
        raise ConfigurationError("curve", curve, f"one of {sorted(FDP_CURVES)}")
    if not isinstance(epsilon_points, int) or epsilon_points < 2:
        raise ConfigurationError("epsilon_points", epsilon_points, "an integer >= 2")
    m = s.size
    grid = _check_grid(guesses, m)
    alpha = (1.0 - confidence) / len(grid)
    best = (0.0, grid[0], *_guess_counts(s, inc, grid[:1])[0])
    shrink = np.concatenate((np.geomspace(1e-4, 0.9, epsilon_points - 1), [1.0]))
    for (kp, km), (r, v) in zip(grid, _guess_counts(s, inc, grid), strict=True):
        if curve == "epsilon_delta":
            def rejects(e: float, r: int = r, v: int = v) -> bool:
                return not _fdp_consistent(_epsilon_delta_inverse_power(e, delta), m, r, v, alpha)
            cap = EPSILON_CAP
        elif curve == "gaussian_profile":
            eps_grid = _pure_epsilon(r, v, alpha) * (1.0 - shrink)
            q = expit(eps_grid)
            tails = binom.sf(v - 1, r, q)
            ok = tails < alpha  # ε where the binomial part leaves room for the δ term
            if not np.any(ok):
                continue
            coef = 2.0 * m * np.array([_delta_coefficient(r, v, float(qq)) for qq in q[ok]])

            def rejects(mu: float, e: np.ndarray = eps_grid[ok], t: np.ndarray = tails[ok],
                        c: np.ndarray = coef) -> bool:
                return _gdp_profile_rejects(mu, e, t, c, alpha)
            cap = MU_CAP
        else:  # the Gaussian curves G_μ under the recursion
            def rejects(mu: float, r: int = r, v: int = v) -> bool:
                return not _fdp_consistent(_gdp_inverse_power(mu), m, r, v, alpha)
            cap = MU_CAP

        if best[0] > 0.0 and not rejects(best[0]):
            continue  # this grid point cannot beat the best so far
        value = _largest_rejected(rejects, cap, tolerance)
        if value > best[0]:
            best = (value, (kp, km), r, v)
    value, (kp, km), r, v = best
    if curve == "epsilon_delta":
        eps, mu = value, None
    else:
        eps, mu = gaussian_dp_epsilon(value, delta), float(value)
    return AuditBound(
        epsilon=float(eps), confidence=confidence, delta=delta, method=FDP_CURVES[curve], guesses=int(r),
        correct=int(v), canaries=m, k_plus=kp, k_minus=km, grid_size=len(grid), mu=mu,
    )


def inverse_power_from_privacy_profile(epsilons: Any, deltas: Any) -> Callable[[float], float]:
    """f̄⁻¹ of the tradeoff curve implied by a table of (ε, δ(ε)) guarantees (Dong, Roth & Su 2022, Prop. 2.12).

    A mechanism that is (ε_j, δ_j)-DP for every row j has, between neighbours in either order, power at most
    min_j min(e^ε_j·x + δ_j, 1 - e^-ε_j·(1 - δ_j - x)) at type-I error x; so reaching power p needs type-I error at
    least max(0, max_j max((p - δ_j)·e^-ε_j, 1 - δ_j - e^ε_j·(1 - p))). The returned function computes that. A
    finite table gives a curve below the mechanism's true one, so rejecting it rejects the table's claim. The table
    must hold for both orders of the neighbouring pair (as an accountant's ε(δ) does when it reports the worse one).

    Args:
        epsilons: ε_j in nats (>= 0), e.g. an accountant's ε at several δ.
        deltas: δ_j in [0, 1], same length.
    """
    eps = np.asarray(epsilons, dtype=float)
    dls = np.asarray(deltas, dtype=float)
    if eps.ndim != 1 or eps.size < 1 or eps.shape != dls.shape:
        raise ConfigurationError("epsilons", np.shape(epsilons), "a non-empty 1-D array with one δ per ε (deltas)")
    if not (np.all(np.isfinite(eps)) and np.all(eps >= 0.0)):
        raise ConfigurationError("epsilons", epsilons, "finite values >= 0 (nats)")
    if not (np.all(np.isfinite(dls)) and np.all((dls >= 0.0) & (dls <= 1.0))):
        raise ConfigurationError("deltas", deltas, "probabilities in [0, 1]")
    scale_down, scale_up = np.exp(-eps), np.exp(eps)

    def inverse_power(p: float) -> float:
        return float(max(0.0, np.max((p - dls) * scale_down), np.max(1.0 - dls - scale_up * (1.0 - p))))

    return inverse_power


@dataclass(frozen=True)
class TradeoffTest:
    """The outcome of :func:`one_run_tradeoff_test`.

    Attributes:
        rejected: True if the observations refute "the mechanism is f-DP" at ``confidence``: for an f-DP mechanism
            this happens with probability at most 1 - confidence.
        confidence: as passed.
        guesses, correct, k_plus, k_minus: the grid point with the strongest evidence (the first that rejected,
            else the one with the most correct guesses in excess of half its guesses).
        canaries: canaries in the run.
        grid_size: grid points tested, each at level (1 - confidence) / grid_size.
    """

    rejected: bool
    confidence: float
    guesses: int
    correct: int
    canaries: int
    k_plus: int
    k_minus: int
    grid_size: int
    method: str = "one_run_fdp"

    def as_dict(self) -> dict[str, Any]:
        """The fields as a JSON-ready dict."""
        return dataclasses.asdict(self)


def one_run_tradeoff_test(
    scores: Any,
    included: Any,
    *,
    inverse_power: Callable[[float], float],
    confidence: float = 0.95,
    guesses: Sequence[tuple[int, int]] | None = None,
) -> TradeoffTest:
    """Test one claimed tradeoff curve f in one run (Mahloujifar, Melis & Chaudhuri, ICML 2025).

    The hypothesis is "the mechanism is f-DP with respect to each canary", e.g. the accountant's own guarantee
    (build ``inverse_power`` with :func:`inverse_power_from_privacy_profile` from its ε at several δ). It is
    rejected if some grid point's guesses (as in :func:`one_run_epsilon_lower_bound`) fail the paper's test at
    level (1 - confidence) / len(grid). Unlike :func:`one_run_fdp_lower_bound`, no family of curves is assumed:
    a rejection says the claimed guarantee is false, with the stated confidence.

    Args:
        scores, included, confidence, guesses: as in :func:`one_run_epsilon_lower_bound`.
        inverse_power: p -> the smallest type-I error at which a test between neighbours reaches power p, under
            the claimed curve (nondecreasing, values in [0, 1]).
    """
    confidence = _check_confidence(confidence)
    s, inc = _check_scores(scores, included)
    if not callable(inverse_power):
        raise ConfigurationError("inverse_power", inverse_power, "a function from power to type-I error")
    m = s.size
    grid = _check_grid(guesses, m)
    alpha = (1.0 - confidence) / len(grid)
    counts = _guess_counts(s, inc, grid)
    chosen = max(range(len(grid)), key=lambda j: counts[j][1] - counts[j][0] / 2)
    rejected = False
    for j, (r, v) in enumerate(counts):
        if not _fdp_consistent(inverse_power, m, r, v, alpha):
            chosen, rejected = j, True
            break
    (kp, km), (r, v) = grid[chosen], counts[chosen]
    return TradeoffTest(rejected=rejected, confidence=confidence, guesses=int(r), correct=int(v), canaries=m,
                        k_plus=kp, k_minus=km, grid_size=len(grid))


# ------------------------------------------------------------------------- one run, Gaussian canary-aligned scores


def _noncentral_t_sf(t: float, df: int, nc: float) -> float:
    """P[T >= t] for T noncentral t (df, nc); scipy's series warns (harmlessly) far in the tails."""
    import warnings

    from scipy.stats import nct

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(nct.sf(t, df, nc))


def gaussian_scores_lower_bound(
    scores: Any,
    included: Any,
    *,
    delta: float,
    confidence: float = 0.95,
    runs: int = 1,
) -> AuditBound:
    """Lower bound on the Gaussian-DP μ from the canaries' scores themselves, not from guesses (after Agrawal et al.,
    "Let's ask Gauss: improved one-run privacy auditing", 2026, and Nasr et al., USENIX Security 2023).

    **Model (an assumption):** the scores of included canaries are independent draws of N(a + μ s, s²) and those of
    excluded ones of N(a, s²), for unknown a, s. That is exact for white-box scores of canaries with orthogonal
    gradients (the audit model's, docs/audit.md) under a full-batch Gaussian mechanism: each score is a sum of
    per-step likelihood ratios of Gaussians. Then a threshold on the score separates the two worlds with the
    tradeoff curve G_μ (Dong, Roth & Su 2022), so a mechanism that is μ'-GDP per canary has μ <= μ'.

    The statistic is Student's two-sample t = (mean_in - mean_out) / (s_pooled sqrt(1/n_in + 1/n_out)), which under
    the model follows the noncentral t law with n - 2 degrees of freedom and noncentrality μ / sqrt(1/n_in +
    1/n_out). The reported ``mu`` is the one-sided lower confidence limit: the μ at which P[T >= t_observed] equals
    1 - ``confidence`` (0.0 if the scores show nothing), and ``epsilon`` is ε_μ(δ) (:func:`gaussian_dp_epsilon`).
    Under the model, ``mu`` exceeds the truth with probability at most 1 - confidence; so for a mechanism whose
    accountant is exact (the audit model's full-batch training), a correct run reports ε above the accountant's
    with probability at most 1 - confidence, and a run with half the noise (twice μ) is caught with high power
    (docs/audit.md). Scores that are not Gaussian (subsampled training, non-orthogonal canaries) break the model:
    ``normality_pvalue`` is a diagnostic, not a guarantee; use :func:`one_run_fdp_lower_bound` there.

    Args:
        scores, included: as in :func:`one_run_epsilon_lower_bound` (with fewer than 2 canaries in a world the
            bound is 0.0).
        delta: the δ of the reported ε, in (0, 1).
        confidence: probability in (0, 1).
        runs: independent runs pooled into ``scores`` (:func:`pool_runs`); recorded only.
    """
    confidence = _check_confidence(confidence)
    delta = _check_delta(delta, positive=True)
    s, inc = _check_scores(scores, included)
    if not isinstance(runs, (int, np.integer)) or isinstance(runs, bool) or runs < 1:
        raise ConfigurationError("runs", runs, "an integer >= 1")
    x1, x0 = s[inc], s[~inc]
    n1, n0 = x1.size, x0.size
    if n1 < 2 or n0 < 2:  # no spread to estimate in one world: nothing shown
        return AuditBound(epsilon=0.0, confidence=confidence, delta=delta, method="gaussian_scores",
                          guesses=int(s.size), correct=0, canaries=int(s.size), mu=0.0, runs=int(runs))
    df = n1 + n0 - 2
    pooled = math.sqrt((float(np.sum((x1 - x1.mean()) ** 2)) + float(np.sum((x0 - x0.mean()) ** 2))) / df)
    scale = math.sqrt(1.0 / n1 + 1.0 / n0)
    diff = float(x1.mean() - x0.mean())
    alpha = 1.0 - confidence
    if pooled == 0.0:
        mu = MU_CAP if diff > 0 else 0.0
    else:
        t_obs = diff / (pooled * scale)

        def excess(mu: float) -> float:  # increasing in mu
            return _noncentral_t_sf(t_obs, df, mu / scale) - alpha

        if excess(0.0) >= 0.0:
            mu = 0.0
        elif excess(MU_CAP) <= 0.0:
            mu = MU_CAP
        else:
            mu = float(brentq(excess, 0.0, MU_CAP, xtol=1e-6))
    from scipy.stats import normaltest

    centred = np.concatenate((x1 - x1.mean(), x0 - x0.mean()))
    normality = float(normaltest(centred).pvalue) if centred.size >= 20 else None
    eps = gaussian_dp_epsilon(mu, delta) if mu > 0.0 else 0.0
    return AuditBound(epsilon=float(eps), confidence=confidence, delta=delta, method="gaussian_scores",
                      guesses=int(s.size), correct=0, canaries=int(s.size), mu=float(mu),
                      normality_pvalue=normality, runs=int(runs))


def pool_runs(scores: Sequence[Any], included: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The canaries of R independent runs as one game: scores and coins concatenated.

    Valid for every one-run estimator here: each canary is in exactly one run and its coin is independent of
    everything else, so the R runs together are one mechanism that is f-DP with respect to each canary whenever
    each run is (the runs' noise is independent). R runs of m canaries prove what one run of R·m canaries would,
    without the interference of R·m canaries in one model.
    """
    if len(scores) != len(included) or len(scores) < 1:
        raise ConfigurationError("scores", len(scores), f"one score array per run, as many as coin arrays "
                                 f"({len(included)}), at least one")
    pairs = [_check_scores(s, c) for s, c in zip(scores, included, strict=True)]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


# ------------------------------------------------------------------------------------------ multi-run (Clopper-Pearson)


def _check_count(name: str, value: Any, upper: int | None = None) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(name, value, "a nonnegative integer")
    if upper is not None and value > upper:
        raise ConfigurationError(name, value, f"an integer in [0, {upper}]")
    return int(value)


def _clopper_pearson_upper(errors: int, trials: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper limit on a rate: P[Bin(trials, p) <= errors] = alpha (1.0 if all erred)."""
    if errors >= trials:
        return 1.0
    return float(beta_dist.ppf(1.0 - alpha, errors + 1, trials - errors))


def clopper_pearson_epsilon_lower_bound(
    false_positives: int,
    negatives: int,
    false_negatives: int,
    positives: int,
    *,
    delta: float,
    confidence: float = 0.95,
) -> AuditBound:
    """Multi-run ε lower bound from a membership test's error counts (Jagielski et al. 2020; Nasr et al. 2021).

    Setting: ``positives`` independent runs with the canary and ``negatives`` runs without it; a decision rule fixed
    before the runs says "in" or "out" for each. An (ε, δ)-DP mechanism forces TPR <= e^ε FPR + δ and
    TNR <= e^ε FNR + δ (Kairouz et al. 2015), hence ε >= log((1 - δ - FNR)/FPR) and ε >= log((1 - δ - FPR)/FNR).
    Replacing FPR and FNR by one-sided Clopper-Pearson upper limits at level (1 - confidence)/2 each makes both
    bounds hold together with probability >= confidence; the larger is reported (0.0 if neither is positive).

    Args:
        false_positives: runs without the canary that the rule called "in" (0..negatives).
        negatives: runs without the canary (>= 1).
        false_negatives: runs with the canary called "out" (0..positives).
        positives: runs with the canary (>= 1).
        delta: δ in [0, 1).
        confidence: probability in (0, 1).

    Returns:
        An :class:`AuditBound` with ``method="clopper_pearson"``, ``guesses`` = all runs, ``correct`` = the rule's
        correct calls and the two upper limits.
    """
    confidence = _check_confidence(confidence)
    delta = _check_delta(delta)
    for name, value in (("negatives", negatives), ("positives", positives)):
        if _check_count(name, value) < 1:
            raise ConfigurationError(name, value, "an integer >= 1 (at least one run)")
    fp = _check_count("false_positives", false_positives, int(negatives))
    fn = _check_count("false_negatives", false_negatives, int(positives))
    n_neg, n_pos = int(negatives), int(positives)
    alpha = (1.0 - confidence) / 2.0
    fpr_hi = _clopper_pearson_upper(fp, n_neg, alpha)
    fnr_hi = _clopper_pearson_upper(fn, n_pos, alpha)
    eps = 0.0
    for num, den in ((1.0 - delta - fnr_hi, fpr_hi), (1.0 - delta - fpr_hi, fnr_hi)):
        if num > 0.0 and den > 0.0:
            eps = max(eps, math.log(num / den))
    return AuditBound(
        epsilon=float(eps), confidence=confidence, delta=delta, method="clopper_pearson", guesses=n_neg + n_pos,
        correct=(n_neg - fp) + (n_pos - fn), false_positive_rate_upper=fpr_hi, false_negative_rate_upper=fnr_hi,
    )

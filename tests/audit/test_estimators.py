"""The audit's estimators against independent computations (issue 28).

Mechanisms with a known guarantee are simulated here and audited; the truth comes from numerical integration,
exact binomial tails or closed forms computed in this file, never from :mod:`lightning_dpts.audit`.

Every statistical assertion uses fixed seeds; its false-failure rate (the probability that a correct implementation
fails it, over the seeds' draw) is stated next to it.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.optimize import brentq
from scipy.special import expit, logit
from scipy.stats import binom, norm

from lightning_dpts.audit import (
    AuditBound,
    clopper_pearson_epsilon_lower_bound,
    default_guess_grid,
    gaussian_dp_delta,
    gaussian_dp_epsilon,
    gaussian_scores_lower_bound,
    inverse_power_from_privacy_profile,
    one_run_epsilon_lower_bound,
    one_run_fdp_lower_bound,
    one_run_tradeoff_test,
    pool_runs,
)
from lightning_dpts.errors import ConfigurationError

# ---------------------------------------------------------------------------------------------------- the truth


def gaussian_delta_by_integration(mu: float, epsilon: float) -> float:
    """δ(ε) of the Gaussian mechanism N(μ, 1) vs N(0, 1): the hockey-stick divergence ∫ (p - e^ε q)_+ dx."""
    # p > e^ε q  iff  μx - μ²/2 > ε  iff  x > ε/μ + μ/2
    x0 = epsilon / mu + mu / 2
    value, _ = quad(lambda x: norm.pdf(x, loc=mu) - math.exp(epsilon) * norm.pdf(x), x0, x0 + 40, epsabs=1e-15)
    return value


def gaussian_epsilon_by_integration(mu: float, delta: float) -> float:
    return brentq(lambda e: gaussian_delta_by_integration(mu, e) - delta, 1e-9, 500.0, xtol=1e-10)


@functools.cache
def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The Gaussian mechanism's sensitivity/σ whose exact (ε, δ) curve passes through (epsilon, delta)."""
    return brentq(lambda mu: gaussian_delta_by_integration(mu, epsilon) - delta, 0.05, 10.0, xtol=1e-10)


def gaussian_canaries(rng: np.random.Generator, mu: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """m canaries, each included with probability 1/2; score N(μ, 1) if included, N(0, 1) if not."""
    included = rng.random(m) < 0.5
    return rng.normal(size=m) + mu * included, included


def randomized_response_canaries(rng: np.random.Generator, epsilon: float, m: int) -> tuple[np.ndarray, np.ndarray]:
    """ε-DP randomized response per canary: the observed bit equals the truth with probability e^ε/(1+e^ε).

    The score is the bit plus a uniform [0, 0.5) tie-breaker drawn independently of everything else.
    """
    included = rng.random(m) < 0.5
    bit = np.where(rng.random(m) < expit(epsilon), included, ~included)
    return bit + 0.5 * rng.random(m), included


def binomial_epsilon(r: int, v: int, alpha: float) -> float:
    """Largest ε with P[Bin(r, e^ε/(1+e^ε)) >= v] <= alpha, by root finding on the binomial tail."""
    tail = lambda q: binom.sf(v - 1, r, q) - alpha  # noqa: E731
    if tail(0.5) > 0:
        return 0.0
    return float(logit(brentq(tail, 0.5, 1 - 1e-15, xtol=1e-14)))


# ------------------------------------------------------------------------------------------- Gaussian DP closed form


@pytest.mark.parametrize("mu, epsilon", [(0.5, 0.0), (0.5, 1.0), (1.0, 2.0), (2.0, 5.0), (4.0, 12.0)])
def test_gaussian_dp_delta_matches_integration(mu, epsilon):
    assert gaussian_dp_delta(mu, epsilon) == pytest.approx(gaussian_delta_by_integration(mu, epsilon), rel=1e-7,
                                                          abs=1e-14)


@pytest.mark.parametrize("mu, delta", [(0.3, 1e-5), (1.0, 1e-5), (2.0, 1e-6), (1.0, 0.1)])
def test_gaussian_dp_epsilon_matches_integration(mu, delta):
    assert gaussian_dp_epsilon(mu, delta) == pytest.approx(gaussian_epsilon_by_integration(mu, delta), rel=1e-6)


# -------------------------------------------------------------------------------------- one run (Steinke et al.)


def test_one_run_pure_dp_matches_the_exact_binomial_tail():
    """δ = 0, one grid point: the bound is the largest ε whose binomial tail at v is <= 1 - confidence."""
    rng = np.random.default_rng(11)
    scores, included = randomized_response_canaries(rng, 2.0, 1000)
    bound = one_run_epsilon_lower_bound(scores, included, delta=0.0, confidence=0.9, guesses=[(200, 200)])
    order = np.argsort(-scores)
    v = int(included[order[:200]].sum() + (~included[order[-200:]]).sum())
    assert (bound.guesses, bound.correct, bound.grid_size) == (400, v, 1)
    assert bound.epsilon == pytest.approx(binomial_epsilon(400, v, 0.1), abs=2e-4)
    assert bound.epsilon <= binomial_epsilon(400, v, 0.1) + 1e-12  # rounded down, never up


def steinke_tail_literal(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Steinke, Nasr & Jagielski (2023) Theorem 3's tail bound, term by term as printed."""
    q = expit(epsilon)
    best, partial = 0.0, 0.0
    for i in range(1, v + 1):
        partial += binom.pmf(v - i, r, q)
        best = max(best, partial / i)
    return binom.sf(v - 1, r, q) + 2 * m * delta * best


def test_one_run_with_delta_sits_on_the_theorem_boundary():
    """With δ > 0 the reported ε is rejected by Theorem 3's bound, and ε + 3·tolerance is not."""
    rng = np.random.default_rng(12)
    scores, included = gaussian_canaries(rng, 2.0, 2000)
    bound = one_run_epsilon_lower_bound(scores, included, delta=1e-4, confidence=0.95, guesses=[(100, 100)])
    assert bound.epsilon > 0.5
    r, v = bound.guesses, bound.correct
    assert steinke_tail_literal(2000, r, v, bound.epsilon, 1e-4) <= 0.05
    assert steinke_tail_literal(2000, r, v, bound.epsilon + 3e-4, 1e-4) > 0.05
    # the δ term costs something: the pure-DP answer is larger
    assert binomial_epsilon(r, v, 0.05) > bound.epsilon + 0.01


def test_randomized_response_exceedance_rate_is_the_binomial_one():
    """The one-run bound is exact for randomized response with one grid point: over 400 seeds the bound exceeds
    the true ε = 1 in the fraction p = P[Bin(400, q) >= v*] predicted by the binomial tail (v* the smallest count
    that is rejected at ε = 1), within 4.5 standard deviations (false-failure rate < 2e-5, normal approximation).

    The 200 highest scores all carry bit 1 and the 200 lowest bit 0 (about 500 of each), so each guess is right
    independently with probability q = e/(1+e) and the number right is exactly Bin(400, q).
    """
    epsilon, alpha = 1.0, 0.2
    q = expit(epsilon)
    v_star = next(v for v in range(401) if binom.sf(v - 1, 400, q) <= alpha)
    p = binom.sf(v_star - 1, 400, q)
    rng = np.random.default_rng(2028)
    seeds = 400
    exceed = sum(
        one_run_epsilon_lower_bound(*randomized_response_canaries(rng, epsilon, 1000), delta=0.0,
                                    confidence=1 - alpha, guesses=[(200, 200)]).epsilon > epsilon
        for _ in range(seeds)
    )
    assert p <= alpha
    assert abs(exceed - seeds * p) <= 4.5 * math.sqrt(seeds * p * (1 - p)), (exceed, seeds * p)


def test_fdp_bound_on_randomized_response_is_sound_and_the_gaussian_one_is_not():
    """Randomized response with ε = 1 (any δ: ε = 1) is not Gaussian. Over 100 seeds of 2000 canaries at
    confidence 0.9 the assumption-free f-DP bound exceeds ε = 1 in at most 20 (each with probability <= 0.1:
    false-failure rate P[Bin(100, 0.1) > 20] = 8e-4); the Gaussian-family bound exceeds it in most seeds, which is
    why its docstring states the assumption (measured: 3 and 100 of 100)."""
    rng = np.random.default_rng(31)
    fdp_exceed = gaussian_exceed = 0
    for _ in range(100):
        scores, included = randomized_response_canaries(rng, 1.0, 2000)
        fdp_exceed += one_run_fdp_lower_bound(scores, included, delta=1e-5, confidence=0.9).epsilon > 1.0
        gaussian_exceed += one_run_fdp_lower_bound(scores, included, delta=1e-5, confidence=0.9,
                                                   curve="gaussian").epsilon > 1.0
    assert binom.sf(20, 100, 0.1) < 1e-3
    assert fdp_exceed <= 20
    assert gaussian_exceed >= 50, gaussian_exceed


def test_grid_search_is_paid_for():
    """The attacker who tries every grid point at the full level would exceed ε on randomized response far more
    often than 1 - confidence; the estimator, which splits the level across the grid, must not.

    200 seeds, confidence 0.9: the count of bounds above the true ε is Binomial(200, p) with p <= 0.1, and the test
    allows 37 (P[Bin(200, 0.1) > 37] < 1e-4: the false-failure rate). Unpaid (each grid point at the full
    level), these seeds give 75.
    """
    rng = np.random.default_rng(28)
    exceed = sum(
        one_run_epsilon_lower_bound(*randomized_response_canaries(rng, 1.0, 1000), delta=0.0,
                                    confidence=0.9).epsilon > 1.0
        for _ in range(200)
    )
    assert binom.sf(37, 200, 0.1) < 1e-4
    assert exceed <= 37, exceed


@pytest.mark.parametrize("estimator, true_epsilon", [
    ("one_run", 1.0), pytest.param("one_run", 4.0, marks=pytest.mark.slow), ("one_run_fdp", 1.0),
    pytest.param("one_run_fdp", 4.0, marks=pytest.mark.slow), ("one_run_gdp", 1.0),
    pytest.param("one_run_gdp", 4.0, marks=pytest.mark.slow), ("one_run_gdp_profile", 4.0),
])
def test_gaussian_mechanism_soundness_over_seeds(estimator, true_epsilon):
    """A Gaussian mechanism with exact (ε, δ = 1e-5) (its μ from numerical integration), 20 fixed seeds of 2000
    canaries: the bound may exceed ε in at most 4 (each seed exceeds with probability <= 0.05, so a correct
    estimator fails this with probability P[Bin(20, 0.05) >= 5] = 0.0026)."""
    delta = 1e-5
    mu = mu_for_epsilon(true_epsilon, delta)
    rng = np.random.default_rng(int(100 * true_epsilon))
    exceed = 0
    for _ in range(20):
        scores, included = gaussian_canaries(rng, mu, 2000)
        if estimator == "one_run":
            bound = one_run_epsilon_lower_bound(scores, included, delta=delta)
        else:
            curve = {"one_run_fdp": "epsilon_delta", "one_run_gdp": "gaussian", "one_run_gdp_profile":
                     "gaussian_profile"}[estimator]
            bound = one_run_fdp_lower_bound(scores, included, delta=delta, curve=curve)
            assert bound.method == estimator
        exceed += bound.epsilon > true_epsilon
    assert exceed <= 4


@pytest.mark.parametrize("curve", ["gaussian", pytest.param("gaussian_profile", marks=pytest.mark.slow)])
def test_gdp_rejection_rate_at_the_true_mu(curve):
    """At confidence 0.5 and one grid point, the GDP estimators reject the true μ = 1 (report a larger μ) in at most
    half the seeds. 300 seeds of 1000 canaries; the count is Bin(300, p <= 0.5), allowed up to 177
    (P[Bin(300, 0.5) > 177] < 1e-3: the false-failure rate)."""
    rng = np.random.default_rng(7)
    exceed = sum(
        one_run_fdp_lower_bound(*gaussian_canaries(rng, 1.0, 1000), delta=1e-5, confidence=0.5,
                                guesses=[(100, 100)], curve=curve).mu > 1.0
        for _ in range(300)
    )
    assert binom.sf(177, 300, 0.5) < 1e-3
    assert exceed <= 177


def test_power_with_many_canaries():
    """10^5 canaries of a Gaussian mechanism with ε = 4 at δ = 1e-5 (seed fixed, so deterministic): the Gaussian
    f-DP bound reaches at least half of ε, the assumption-free f-DP bound at least 0.45 and Steinke et al.'s at
    least a quarter (measured 0.70, 0.54 and 0.32 of ε)."""
    delta = 1e-5
    mu = mu_for_epsilon(4.0, delta)
    scores, included = gaussian_canaries(np.random.default_rng(4), mu, 100_000)
    gdp = one_run_fdp_lower_bound(scores, included, delta=delta, curve="gaussian")
    assert gdp.mu <= mu and 0.5 * 4.0 <= gdp.epsilon <= 4.0
    fdp = one_run_fdp_lower_bound(scores, included, delta=delta)
    assert 0.45 * 4.0 <= fdp.epsilon <= 4.0
    steinke = one_run_epsilon_lower_bound(scores, included, delta=delta)
    assert 0.25 * 4.0 <= steinke.epsilon <= 4.0
    assert fdp.epsilon > steinke.epsilon


def test_a_leaky_mechanism_is_caught():
    """The attacker's view: a run whose noise is a quarter of what an accountant assumed for ε = 2 (μ four times
    larger; its true ε is 10) gives one-run lower bounds above ε = 2 with 5000 canaries (seed fixed; measured 3.0
    for Steinke et al.'s bound, 4.1 for the f-DP bound)."""
    delta = 1e-5
    mu = 4 * mu_for_epsilon(2.0, delta)
    scores, included = gaussian_canaries(np.random.default_rng(5), mu, 5000)
    assert one_run_epsilon_lower_bound(scores, included, delta=delta).epsilon > 2.0
    assert one_run_fdp_lower_bound(scores, included, delta=delta).epsilon > 2.0


def test_fdp_exceedance_on_randomized_response_with_one_grid_point():
    """Randomized response (ε = 1) with the exact-binomial design of the test above: 400 seeds at confidence 0.8,
    the f-DP bound exceeds ε = 1 in at most 0.2·400 + 4.5·sd = 116 (false-failure rate < 2e-5; measured 43)."""
    rng = np.random.default_rng(2028)
    exceed = sum(
        one_run_fdp_lower_bound(*randomized_response_canaries(rng, 1.0, 1000), delta=1e-5, confidence=0.8,
                                guesses=[(200, 200)]).epsilon > 1.0
        for _ in range(400)
    )
    assert exceed <= 80 + 4.5 * math.sqrt(400 * 0.2 * 0.8)


def test_abstaining_on_everything_but_noise_shows_nothing():
    """Scores independent of inclusion: at most 1 - confidence of such runs show ε > 0; with this seed none."""
    rng = np.random.default_rng(3)
    included = rng.random(5000) < 0.5
    scores = rng.normal(size=5000)
    assert one_run_epsilon_lower_bound(scores, included, delta=1e-5).epsilon == 0.0
    assert one_run_fdp_lower_bound(scores, included, delta=1e-5).epsilon == 0.0


def test_default_grid_is_fixed_and_in_range():
    grid = default_guess_grid(1000)
    assert (10, 0) in grid and (0, 10) in grid and (500, 500) in grid and (1000, 0) in grid
    assert all(kp + km <= 1000 and kp >= 0 and km >= 0 for kp, km in grid)
    assert default_guess_grid(5) == [(5, 0), (0, 5)]


def test_bound_as_dict_is_json():
    rng = np.random.default_rng(1)
    bound = one_run_fdp_lower_bound(*gaussian_canaries(rng, 2.0, 500), delta=1e-5)
    data = json.loads(json.dumps(bound.as_dict()))
    assert data["method"] == "one_run_fdp" and data["canaries"] == 500 and data["mu"] is None
    assert data["confidence"] == 0.95
    assert isinstance(bound, AuditBound)
    with pytest.raises(AttributeError):
        bound.epsilon = 1.0  # frozen


# ------------------------------------------------------------------------------------ testing a claimed curve


def test_inverse_power_from_a_dense_gaussian_profile_approaches_the_gaussian_curve():
    """From the Gaussian mechanism's (ε, δ(ε)) at 4000 values of ε, the implied smallest type-I error at power p is
    at most, and within 2e-3 of, the Gaussian curve's Φ(Φ⁻¹(p) - μ) (Dong et al. 2022, Prop. 2.12 is tight there)."""
    mu = 1.5
    epsilons = np.linspace(0.0, 15.0, 4000)
    deltas = [gaussian_dp_delta(mu, e) for e in epsilons]
    inverse = inverse_power_from_privacy_profile(epsilons, deltas)
    for p in (0.05, 0.3, 0.5, 0.8, 0.95, 0.999):
        exact = norm.cdf(norm.ppf(p) - mu)
        assert exact - 2e-3 <= inverse(p) <= exact + 1e-12


def test_inverse_power_of_one_point():
    """(ε, δ)-DP alone: power p needs type-I error max(0, (p - δ)e^-ε, 1 - δ - e^ε(1 - p))."""
    inverse = inverse_power_from_privacy_profile([1.0], [0.01])
    assert inverse(0.005) == 0.0
    assert inverse(0.5) == pytest.approx((0.5 - 0.01) / math.e)
    assert inverse(0.99) == pytest.approx(1 - 0.01 - math.e * 0.01)


def test_tradeoff_test_rejects_a_false_claim_and_keeps_a_true_one():
    """The accountant's claim as a curve: the Gaussian mechanism's (ε, δ) table for μ = 0.5 (ε = 2 at δ = 1e-5).
    A run with a quarter of the noise (μ = 2) is refuted with 5000 canaries (seed fixed); runs that meet the claim
    are refuted in at most 3 of 20 seeds (each with probability <= 0.05: false-failure rate
    P[Bin(20, 0.05) >= 4] = 0.016)."""
    epsilons = np.linspace(0.0, 12.0, 600)
    claim = inverse_power_from_privacy_profile(epsilons, [gaussian_dp_delta(0.5, e) for e in epsilons])
    leaky = one_run_tradeoff_test(*gaussian_canaries(np.random.default_rng(6), 2.0, 5000), inverse_power=claim)
    assert leaky.rejected and leaky.correct > leaky.guesses / 2
    rng = np.random.default_rng(60)
    refuted = sum(one_run_tradeoff_test(*gaussian_canaries(rng, 0.5, 2000), inverse_power=claim).rejected
                  for _ in range(20))
    assert refuted <= 3
    with pytest.raises(ConfigurationError, match="inverse_power"):
        one_run_tradeoff_test([1.0, 2.0], [True, False], inverse_power=0.5)
    with pytest.raises(ConfigurationError, match="deltas"):
        inverse_power_from_privacy_profile([1.0], [1.5])


# ------------------------------------------------------------------------------------ multi-run (Clopper-Pearson)


def test_clopper_pearson_zero_errors_closed_form():
    """No errors in n runs each way: the one-sided upper limit at level α/2 is 1 - (α/2)^(1/n)."""
    n, alpha, delta = 1000, 0.05, 1e-5
    bound = clopper_pearson_epsilon_lower_bound(0, n, 0, n, delta=delta, confidence=1 - alpha)
    upper = 1 - (alpha / 2) ** (1 / n)
    assert bound.false_positive_rate_upper == pytest.approx(upper, rel=1e-9)
    assert bound.epsilon == pytest.approx(math.log((1 - delta - upper) / upper), rel=1e-9)
    assert (bound.guesses, bound.correct) == (2 * n, 2 * n)


def test_clopper_pearson_with_errors_matches_binomial_root():
    """The upper limit solves P[Bin(n, p) <= k] = α/2 (computed here by root finding on the binomial cdf)."""
    fp, neg, fn, pos, delta = 7, 500, 40, 400, 1e-3
    bound = clopper_pearson_epsilon_lower_bound(fp, neg, fn, pos, delta=delta, confidence=0.9)
    fpr = brentq(lambda p: binom.cdf(fp, neg, p) - 0.05, 1e-12, 1 - 1e-12, xtol=1e-15)
    fnr = brentq(lambda p: binom.cdf(fn, pos, p) - 0.05, 1e-12, 1 - 1e-12, xtol=1e-15)
    assert bound.false_positive_rate_upper == pytest.approx(fpr, rel=1e-8)
    assert bound.false_negative_rate_upper == pytest.approx(fnr, rel=1e-8)
    expected = max(math.log((1 - delta - fnr) / fpr), math.log((1 - delta - fpr) / fnr), 0.0)
    assert bound.epsilon == pytest.approx(expected, rel=1e-8)


def test_clopper_pearson_symmetric_form_is_used():
    """Few false negatives, many false positives: only the second inequality shows something."""
    bound = clopper_pearson_epsilon_lower_bound(400, 1000, 0, 1000, delta=0.0)
    fnr = 1 - 0.025 ** (1 / 1000)
    fpr = brentq(lambda p: binom.cdf(400, 1000, p) - 0.025, 1e-12, 1 - 1e-12, xtol=1e-15)
    assert bound.epsilon == pytest.approx(math.log((1 - fpr) / fnr), rel=1e-8)


def test_clopper_pearson_soundness_over_seeds():
    """Multi-run audit of a Gaussian mechanism with ε = 2 at δ = 1e-5 by a threshold test at its optimal threshold
    (where TPR - e^ε FPR = δ exactly): error counts drawn for 1000 seeds of 2000 runs each way. The bound may exceed
    ε with probability <= 0.05 per seed; allowed 70 (P[Bin(1000, 0.05) > 70] < 3e-3: the false-failure rate)."""
    epsilon, delta = 2.0, 1e-5
    mu = mu_for_epsilon(epsilon, delta)
    threshold = epsilon / mu + mu / 2  # the likelihood-ratio test at e^ε
    fpr, fnr = norm.sf(threshold), norm.cdf(threshold - mu)
    rng = np.random.default_rng(99)
    fps = rng.binomial(2000, fpr, size=1000)
    fns = rng.binomial(2000, fnr, size=1000)
    exceed = sum(
        clopper_pearson_epsilon_lower_bound(int(a), 2000, int(b), 2000, delta=delta).epsilon > epsilon
        for a, b in zip(fps, fns, strict=True)
    )
    assert binom.sf(70, 1000, 0.05) < 3e-3
    assert exceed <= 70


# ---------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("kwargs, parameter", [
    ({"confidence": 0.0}, "confidence"),
    ({"confidence": 1.0}, "confidence"),
    ({"confidence": float("nan")}, "confidence"),
    ({"delta": -0.1}, "delta"),
    ({"delta": 1.0}, "delta"),
    ({"guesses": [(0, 0)]}, "guesses"),
    ({"guesses": [(8, 5)]}, "guesses"),
    ({"guesses": [(-1, 3)]}, "guesses"),
    ({"guesses": [(1.5, 2)]}, "guesses"),
    ({"guesses": []}, "guesses"),
])
def test_one_run_refusals(kwargs, parameter):
    scores, included = np.arange(10.0), np.arange(10) % 2 == 0
    for estimator in (one_run_epsilon_lower_bound, one_run_fdp_lower_bound):
        args = {"delta": 1e-5, **kwargs}
        with pytest.raises(ConfigurationError) as info:
            estimator(scores, included, **args)
        assert info.value.parameter == parameter


def test_one_run_input_refusals():
    with pytest.raises(ConfigurationError, match="included"):
        one_run_epsilon_lower_bound([1.0, 2.0], [True], delta=0.0)
    with pytest.raises(ConfigurationError, match="scores"):
        one_run_epsilon_lower_bound([1.0, float("nan")], [True, False], delta=0.0)
    with pytest.raises(ConfigurationError, match="scores"):
        one_run_epsilon_lower_bound([], [], delta=0.0)
    with pytest.raises(ConfigurationError, match="included"):
        one_run_epsilon_lower_bound([1.0, 2.0], [2, 0], delta=0.0)
    with pytest.raises(ConfigurationError, match="delta"):
        one_run_fdp_lower_bound([1.0, 2.0], [True, False], delta=0.0)  # GDP has ε = ∞ at δ = 0
    with pytest.raises(ConfigurationError, match="curve"):
        one_run_fdp_lower_bound([1.0, 2.0], [True, False], delta=1e-5, curve="laplace")


@pytest.mark.parametrize("args, parameter", [
    ((-1, 10, 0, 10), "false_positives"),
    ((11, 10, 0, 10), "false_positives"),
    ((0, 10, 11, 10), "false_negatives"),
    ((0, 0, 0, 10), "negatives"),
    ((0, 10, 0, 0), "positives"),
    ((0.5, 10, 0, 10), "false_positives"),
])
def test_clopper_pearson_refusals(args, parameter):
    with pytest.raises(ConfigurationError) as info:
        clopper_pearson_epsilon_lower_bound(*args, delta=1e-5)
    assert info.value.parameter == parameter
    with pytest.raises(ConfigurationError, match="confidence"):
        clopper_pearson_epsilon_lower_bound(0, 10, 0, 10, delta=1e-5, confidence=1.5)


def test_estimators_import_no_torch():
    """The estimators stay numpy/scipy only (usable on scores from any framework): every import in the module is
    from the standard library, numpy, scipy or lightning_dpts.errors."""
    import ast
    from pathlib import Path

    import lightning_dpts.audit.estimators as module

    tree = ast.parse(Path(module.__file__).read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    allowed = {"__future__", "dataclasses", "math", "collections", "typing", "warnings", "numpy", "scipy"}
    bad = [n for n in names if n.split(".")[0] not in allowed and n != "lightning_dpts.errors"]
    assert names and not bad, bad


def test_fdp_rejection_sets_are_intervals():
    """For 100 random (m, r, v, level, δ), the recursion rejects the (ε, δ) and Gaussian curves for all parameters
    below some point and none above (what lets bisection find the largest rejected one)."""
    from lightning_dpts.audit.estimators import _epsilon_delta_inverse_power, _fdp_consistent, _gdp_inverse_power

    rng = np.random.default_rng(17)
    for _ in range(100):
        m = int(rng.choice([100, 1000, 100_000]))
        r = int(rng.integers(10, m + 1))
        v = int(rng.integers(r // 2, r + 1))
        level, delta = float(10 ** rng.uniform(-5, -0.5)), float(10 ** rng.uniform(-8, -1))
        for family, top in ((lambda x, d=delta: _epsilon_delta_inverse_power(x, d), 12.0), (_gdp_inverse_power, 6.0)):
            rejected = [not _fdp_consistent(family(x), m, r, v, level) for x in np.linspace(0.0, top, 60)]
            assert rejected == sorted(rejected, reverse=True), (m, r, v, level, delta)


# ------------------------------------------------------------------------- Gaussian scores (Agrawal et al. 2026)


def noncentral_t_sf_by_integration(t: float, df: int, nc: float) -> float:
    """P[(Z + nc) / sqrt(V / df) >= t], Z ~ N(0, 1), V ~ chi2(df): integrated over V (independent of scipy's nct)."""
    from scipy.stats import chi2

    lo, hi = chi2.ppf(1e-12, df), chi2.ppf(1 - 1e-12, df)
    value, _ = quad(lambda v: norm.sf(t * math.sqrt(v / df) - nc) * chi2.pdf(v, df), lo, hi, limit=200,
                    epsabs=1e-13)
    return value


@pytest.mark.parametrize("mu, m, confidence", [(0.9, 200, 0.95), (1.7, 120, 0.9), (0.6, 400, 0.99)])
def test_gaussian_scores_limit_is_the_noncentral_t_quantile(mu, m, confidence):
    """At the reported μ the observed t statistic sits exactly at the 1 - confidence tail (integrated here)."""
    rng = np.random.default_rng(11)
    scores, included = gaussian_canaries(rng, mu, m)
    scores = 3.0 * scores - 1.0  # location and scale are unknown to the estimator
    bound = gaussian_scores_lower_bound(scores, included, delta=1e-5, confidence=confidence)
    x1, x0 = scores[included], scores[~included]
    n1, n0 = x1.size, x0.size
    pooled = math.sqrt((((x1 - x1.mean()) ** 2).sum() + ((x0 - x0.mean()) ** 2).sum()) / (n1 + n0 - 2))
    k = math.sqrt(1 / n1 + 1 / n0)
    t = (x1.mean() - x0.mean()) / (pooled * k)
    assert bound.mu > 0
    assert noncentral_t_sf_by_integration(t, n1 + n0 - 2, bound.mu / k) == pytest.approx(1 - confidence, abs=2e-5)
    assert bound.epsilon == pytest.approx(gaussian_epsilon_by_integration(bound.mu, 1e-5), rel=1e-5)
    assert bound.method == "gaussian_scores" and bound.canaries == m


@pytest.mark.parametrize("epsilon", [4.0, 8.0])
def test_gaussian_scores_exceed_the_truth_at_the_stated_rate(epsilon):
    """Exact level on the Gaussian mechanism: over 400 seeds (m = 512) the 95% bound exceeds the true ε in about
    5% of them. Counts outside [8, 35] have probability 6e-4 + 6e-4 under Bin(400, 0.05): false-failure rate
    1.2e-3 per ε. The lower end checks the bound is tight, not merely sound."""
    mu = mu_for_epsilon(epsilon, 1e-5)
    above = 0
    for seed in range(400):
        scores, included = gaussian_canaries(np.random.default_rng(seed), mu, 512)
        above += gaussian_scores_lower_bound(scores, included, delta=1e-5).epsilon > epsilon
    assert 8 <= above <= 35


def test_gaussian_scores_catch_half_the_noise():
    """Half the noise doubles μ: with 1024 canaries the 99.9% bound exceeds the claimed ε = 8 in every one of 200
    seeds (the t statistic's lower limit is about 2μ - 0.25 > μ; a miss has probability below 1e-9 per seed)."""
    mu = mu_for_epsilon(8.0, 1e-5)
    for seed in range(200):
        scores, included = gaussian_canaries(np.random.default_rng(seed), 2 * mu, 1024)
        assert gaussian_scores_lower_bound(scores, included, delta=1e-5, confidence=0.999).epsilon > 8.0


def test_gaussian_scores_reach_most_of_epsilon():
    """The tightness the issue asks for: with 8192 ideal canaries, 0.9 of ε at ε = 4 and 8 (seeded; the limit
    lies about 3 standard errors below μ at the 5th percentile of draws)."""
    for epsilon in (4.0, 8.0):
        scores, included = gaussian_canaries(np.random.default_rng(1), mu_for_epsilon(epsilon, 1e-5), 8192)
        assert gaussian_scores_lower_bound(scores, included, delta=1e-5).epsilon > 0.9 * epsilon


def test_gaussian_scores_show_nothing_without_signal():
    rng = np.random.default_rng(5)
    scores, included = gaussian_canaries(rng, 0.0, 1000)
    bound = gaussian_scores_lower_bound(-np.abs(scores) * included, included, delta=1e-5)
    assert bound.epsilon == 0.0 and bound.mu == 0.0


def test_gaussian_scores_assumption_fails_on_randomized_response():
    """The estimator assumes Gaussian scores: randomized response (ε = 1, two-valued scores) gets a bound above its
    true ε, and the normality diagnostic says so (p far below 1e-6)."""
    rng = np.random.default_rng(0)
    included = rng.random(20000) < 0.5
    truthful = rng.random(20000) < expit(1.0)
    scores = np.where(truthful, included, ~included).astype(float)
    bound = gaussian_scores_lower_bound(scores, included, delta=1e-5)
    assert bound.epsilon > 1.0 and bound.normality_pvalue < 1e-6


def test_pool_runs_concatenates_and_tightens():
    mu = mu_for_epsilon(8.0, 1e-5)
    runs = [gaussian_canaries(np.random.default_rng(seed), mu, 1024) for seed in range(4)]
    scores, included = pool_runs([r[0] for r in runs], [r[1] for r in runs])
    assert scores.shape == (4096,) and included.dtype == bool
    np.testing.assert_array_equal(scores[1024:2048], runs[1][0])
    pooled = gaussian_scores_lower_bound(scores, included, delta=1e-5, runs=4)
    single = gaussian_scores_lower_bound(*runs[0], delta=1e-5)
    assert pooled.runs == 4 and pooled.epsilon > single.epsilon > 0
    with pytest.raises(ConfigurationError):
        pool_runs([runs[0][0]], [])
    with pytest.raises(ConfigurationError):
        gaussian_scores_lower_bound(scores, included, delta=1e-5, runs=0)
    assert gaussian_scores_lower_bound([5.0, 2.0, 3.0], [True, False, False], delta=1e-5).epsilon == 0.0

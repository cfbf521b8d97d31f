"""Private hyperparameter selection accounting (issue 40) against independent computations.

* the RDP of the structured-subsampling pairs: the Gaussian mechanism's closed form, an independent integration of
  the privacy *profile* (a different formula: the hockey-stick curve, not the mixture densities), and Mironov et
  al.'s binomial closed form for the add direction of the subsampled Gaussian (which the switching pair dominates);
* the truncated negative binomial: closed forms (geometric, logarithmic, E[K]) and a Monte Carlo of the sampler;
* Theorem 2 against the *exact* Renyi divergence of random stopping on a binary mechanism (closed form through the
  probability generating function), and a Monte Carlo simulation of the procedure itself;
* the attacker: plain "train K, keep the best" without the theorem leaks K times a run's epsilon, and is charged.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.special import gammaln
from scipy.stats import norm

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.profiles import theorem_4_4, theorem_f_1
from lightning_dpts.privacy.selection import (
    ORDERS,
    RandomStoppingAccountant,
    TruncatedNegativeBinomial,
    best_of_k_rdp,
    gaussian_rdp,
    pair_rdp,
    profile_rdp,
    random_stopping_rdp,
    rdp_to_epsilon,
)


def test_gaussian_pair_matches_closed_form() -> None:
    for m in (0.1, 1.0, 3.0):
        got = pair_rdp([m], [1.0], opposed=False)
        np.testing.assert_allclose(got, ORDERS * m * m / 2.0, rtol=1e-8)
    # opposed Gaussians N(-m) vs N(m): shift 2m
    np.testing.assert_allclose(pair_rdp([0.5], [1.0], opposed=True), ORDERS * 1.0 / 2.0, rtol=1e-8)


@pytest.mark.parametrize("profile", [theorem_4_4(1.0, 0.05, 1.5), theorem_f_1(0.3, 3, 0.1, 2.0)],
                         ids=["4.4", "F.1"])
def test_profile_rdp_matches_integral_of_the_hockey_stick_curve(profile) -> None:
    """E = 1 + lam (lam - 1) int_0^inf (e^((lam-1) eps) + e^(-lam eps)) delta(eps) d eps, from profile.delta."""
    orders = np.array([1.5, 2.0, 3.0, 4.0])
    got = profile_rdp(profile, orders)
    for lam, value in zip(orders, got, strict=True):
        def integrand(e: float, lam: float = lam) -> float:
            return (math.exp((lam - 1) * e) + math.exp(-lam * e)) * float(profile.delta(e)[0])

        integral = quad(integrand, 0, 40, limit=500, epsabs=0, epsrel=1e-11)[0]
        expected = math.log1p(lam * (lam - 1) * integral) / (lam - 1)
        assert value >= expected * (1 - 1e-7)
        assert value == pytest.approx(expected, rel=1e-6)


def test_switching_pair_dominates_mironovs_add_direction() -> None:
    """Mironov, Talwar & Zhang 2019: D_lam(MoG([0, 2], [1-q, q]) || N(0, s)) at integer orders, binomial sum."""
    q, s = 0.05, 1.5
    got = profile_rdp(theorem_4_4(1.0, q, s))
    for lam, value in zip(ORDERS, got, strict=True):
        if lam != int(lam) or lam > 64:
            continue
        lam = int(lam)
        k = np.arange(lam + 1)
        terms = (gammaln(lam + 1) - gammaln(k + 1) - gammaln(lam - k + 1) + (lam - k) * math.log1p(-q)
                 + k * math.log(q) + (k * k - k) * (2 / s) ** 2 / 2)
        mironov = float(np.logaddexp.reduce(terms)) / (lam - 1)
        assert value >= mironov * (1 - 1e-9)
        if lam >= 6:  # the two agree where the add direction dominates
            assert value == pytest.approx(mironov, rel=1e-6)


def test_refusals() -> None:
    from lightning_dpts.privacy.mixtures import MonotoneMixturePair
    from lightning_dpts.privacy.profiles import PrivacyProfile

    no_pair = PrivacyProfile("max", "upper", "", lambda a: np.zeros_like(a))
    with pytest.raises(ConfigurationError, match="sampling_spec"):
        profile_rdp(no_pair)
    dropped = MonotoneMixturePair(np.array([0.0, 2.0, 40.0]), np.array([0.9, 0.1 - 1e-20, 1e-20]), False, 1e-17)
    with pytest.raises(ConfigurationError, match="dropped"):
        profile_rdp(PrivacyProfile("x", "upper", "", dropped.hockey_stick, dropped))
    with pytest.raises(ConfigurationError, match="eta"):
        TruncatedNegativeBinomial(-1.0, 0.5)
    with pytest.raises(ConfigurationError, match="gamma"):
        TruncatedNegativeBinomial(1.0, 1.0)


def test_rdp_conversion_is_sound_for_the_gaussian() -> None:
    """The exact (epsilon, delta) of the Gaussian mechanism (Balle & Wang 2018) is below the RDP conversion."""
    for z in (0.7, 2.0, 8.0):
        eps, _ = rdp_to_epsilon(gaussian_rdp(z), 1e-6)
        exact_delta = norm.cdf(0.5 / z - eps * z) - math.exp(eps) * norm.cdf(-0.5 / z - eps * z)
        assert exact_delta <= 1e-6


# ------------------------------------------------------------------------------------------------------------------
# the number of runs
# ------------------------------------------------------------------------------------------------------------------
def test_truncated_negative_binomial_closed_forms() -> None:
    k = np.arange(1, 4001)
    geometric = TruncatedNegativeBinomial(1.0, 0.2)
    np.testing.assert_allclose(geometric.pmf(k[:50]), 0.2 * 0.8 ** (k[:50] - 1), rtol=1e-12)
    assert geometric.mean == pytest.approx(5.0)
    logarithmic = TruncatedNegativeBinomial(0.0, 0.1)
    np.testing.assert_allclose(logarithmic.pmf(k[:50]), 0.9 ** k[:50] / (k[:50] * math.log(10)), rtol=1e-12)
    for eta in (-0.5, 0.0, 0.5, 1.0, 3.0):
        d = TruncatedNegativeBinomial(eta, 0.05)
        p = d.pmf(k)
        assert p.sum() == pytest.approx(1.0, abs=1e-9)
        assert float((k * p).sum()) == pytest.approx(d.mean, rel=1e-9)
        assert TruncatedNegativeBinomial.with_mean(8.0, eta).mean == pytest.approx(8.0, rel=1e-9)


def test_sampler_monte_carlo() -> None:
    """20,000 seeded draws: the mean within 5 standard errors (false-failure rate 6e-7 under the normal
    approximation) and P[K = 1] within 5 binomial standard errors."""
    d = TruncatedNegativeBinomial.with_mean(8.0, 0.0)
    rng = np.random.default_rng(12345)
    draws = np.array([d.sample(rng) for _ in range(20_000)])
    k = np.arange(1, 20_000)
    sd = math.sqrt(float((k * k * d.pmf(k)).sum()) - d.mean ** 2)
    assert abs(draws.mean() - d.mean) < 5 * sd / math.sqrt(draws.size)
    p1 = float(d.pmf(1)[0])
    assert abs((draws == 1).mean() - p1) < 5 * math.sqrt(p1 * (1 - p1) / draws.size)


# ------------------------------------------------------------------------------------------------------------------
# Theorem 2 against the exact procedure on a binary mechanism
# ------------------------------------------------------------------------------------------------------------------
def _bernoulli_rdp(p: float, p2: float, orders: np.ndarray) -> np.ndarray:
    def d(a: float, b: float) -> np.ndarray:
        one = orders * math.log(a) + (1 - orders) * math.log(b)
        zero = orders * math.log1p(-a) + (1 - orders) * math.log1p(-b)
        return np.logaddexp(one, zero) / (orders - 1)

    return np.maximum(d(p, p2), d(p2, p))


def _pgf(d: TruncatedNegativeBinomial, x: float) -> float:
    """E[x^K] = ((1 - (1 - gamma) x)^-eta - 1) / (gamma^-eta - 1), or log(1 - (1 - gamma) x) / log(gamma)."""
    g, e = d.gamma, d.eta
    if e == 0:
        return math.log(1 - (1 - g) * x) / math.log(g)
    return ((1 - (1 - g) * x) ** -e - 1) / (g ** -e - 1)


@pytest.mark.parametrize("eta", [0.0, 1.0])
def test_theorem_2_bounds_the_exact_procedure(eta: float) -> None:
    """Q: randomized response with P[1] = e^e0/(1+e^e0) on D and 1/(1+e^e0) on D'; A outputs 1 iff some run did.
    Then P_A[0] = pgf(P_Q[0]) exactly, and the exact RDP of A must lie below Theorem 2 at every order."""
    e0 = 0.5
    p, p2 = math.exp(e0) / (1 + math.exp(e0)), 1 / (1 + math.exp(e0))
    d = TruncatedNegativeBinomial.with_mean(8.0, eta)
    run = _bernoulli_rdp(p, p2, ORDERS)
    bound = random_stopping_rdp(run, d)
    a0, a0_prime = _pgf(d, 1 - p), _pgf(d, 1 - p2)
    exact = _bernoulli_rdp(1 - a0, 1 - a0_prime, ORDERS)
    assert np.all(exact <= bound)
    # and the procedure's output law: a Monte Carlo of the sampler + best-of-K (200,000 seeded runs; the
    # estimate within 5 binomial standard errors: false-failure rate 6e-7)
    rng = np.random.default_rng(7)
    n = 200_000
    ks = np.array([d.sample(rng) for _ in range(n)])
    zeros = rng.random(n) < (1 - p) ** ks  # P[all K runs output 0 | K]
    assert abs(zeros.mean() - a0) < 5 * math.sqrt(a0 * (1 - a0) / n)


def test_attacker_best_of_k_without_the_theorem_is_charged() -> None:
    """The attacker: 'train K, keep the best' with a fixed K and the single run's epsilon reported. On randomized
    response with epsilon e0 per run, the best of K = 8 outputs 0 with probability (1 - p)^K on D and (1 - p')^K on
    D': a likelihood ratio e^(K e0), so the reported e0 is false by a factor of K. The package charges the
    composition of all K runs (best_of_k_rdp), which covers the exact leak, and the accountant's fixed-run epsilon
    is above the single run's. If best_of_k_rdp returned one run's curve, the first assertion would fail."""
    e0, k = 0.5, 8
    p, p2 = math.exp(e0) / (1 + math.exp(e0)), 1 / (1 + math.exp(e0))
    ratio = math.log((1 - p2) ** k / (1 - p) ** k)
    assert ratio == pytest.approx(k * e0)
    run = _bernoulli_rdp(p, p2, ORDERS)
    exact_best_of_k = _bernoulli_rdp(1 - (1 - p) ** k, 1 - (1 - p2) ** k, ORDERS)
    charged = best_of_k_rdp([run] * k)
    assert np.all(exact_best_of_k <= charged * (1 + 1e-12))
    assert np.any(exact_best_of_k > run * 2)  # one run's curve would not cover it
    acc = RandomStoppingAccountant([run] * k, TruncatedNegativeBinomial.with_mean(8.0))
    assert acc.fixed_runs_epsilon(1e-6) > 3 * acc.single_run_epsilon(1e-6)
    # random stopping is covered by the theorem and is cheaper than the fixed-K charge here
    assert acc.epsilon(1e-6) < acc.fixed_runs_epsilon(1e-6)


def test_training_rdp_is_above_the_pld_accountant() -> None:
    """RDP is a looser route to (epsilon, delta) than the PLD of the same theorem: it must never come out tighter."""
    from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
    from lightning_dpts.privacy.selection import training_rdp

    spec = SamplingSpec(num_series=150, min_length=200, context_length=60, prediction_length=12, batch_size=64)
    for sigma, steps in ((3.0, 200), (10.0, 600)):
        via_rdp = rdp_to_epsilon(training_rdp(spec, sigma, steps), 1e-7)[0]
        via_pld = StructuredSubsamplingAccountant(spec, sigma).epsilon(steps, 1e-7)
        assert via_pld <= via_rdp <= 1.6 * via_pld

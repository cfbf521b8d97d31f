"""Monte Carlo accountant: b = 1 against the PLD accountant, EVR against simulation, Algorithm 5, refusals."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy import integrate
from scipy.stats import norm

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import pld, profiles
from lightning_dpts.privacy.montecarlo import (
    BandMFMechanism,
    MonteCarloAccountant,
    calibrate_noise_multiplier_monte_carlo,
    gaussian_mechanism_delta,
    hockey_stick_estimate,
    overall_delta,
    samples_for_target_delta,
    verification_failure_probability,
    verification_threshold,
)


def _pld_delta(n: int, p: float, sigma: float, eps: float) -> float:
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(p, dp_accounting.GaussianDpEvent(sigma)), n)
    return acc.get_delta(eps)


def _se(losses: np.ndarray, eps: float) -> float:
    terms = -np.expm1(np.minimum(eps - losses, 0.0))
    return float(terms.std() / math.sqrt(losses.size))


def test_b1_matches_poisson_pld_accountant():
    """b = 1, C = I is DP-SGD with Poisson sampling: MC estimate within 5 s.e. (+ PLD discretisation) of
    dp_accounting's add-or-remove PLD (false-failure rate < 1e-5 over the 6 comparisons)."""
    n, p, sigma = 60, 0.05, 0.8
    acc = MonteCarloAccountant(BandMFMechanism(n, (1.0,), p, sigma), samples=30_000, seed=3)
    for eps in (0.5, 1.0, 2.0):
        want = _pld_delta(n, p, sigma, eps)
        est = acc.estimates(eps)
        se = max(_se(acc.losses("remove"), eps), _se(acc.losses("add"), eps))
        assert abs(max(est.values()) - want) < 5 * se + 1e-3 * want, (eps, est, want)
        assert acc.delta_upper(eps) >= acc.delta_estimate(eps)


def test_structured_b1_is_the_fixed_direction_pair_and_below_the_sound_switching_bound():
    """r < 1 at b = 1: the recursion's pair is Poisson(p r) with shift s (matches dp_accounting), and that number is
    BELOW the package's sound Theorem 4.4 switching-profile bound (trap 1): which is why the accountant refuses r < 1
    for guarantees. If this ordering ever flipped, the refusal could be revisited."""
    n, p, r, s, sigma = 60, 0.05, 0.3, 2.0, 0.8
    with pytest.raises(ConfigurationError, match="leak_probability"):
        MonteCarloAccountant(BandMFMechanism(n, (1.0,), p, sigma, leak_probability=r, sensitivity=s))
    acc = MonteCarloAccountant(BandMFMechanism(n, (1.0,), p, sigma, leak_probability=r, sensitivity=s),
                               samples=30_000, seed=4, fixed_direction=True)
    sound = pld.pld_from_profile(profiles.theorem_4_4(p, r, sigma)).self_compose(n)
    for eps in (0.5, 1.0):
        want = _pld_delta(n, p * r, sigma / s, eps)
        se = max(_se(acc.losses("remove"), eps), _se(acc.losses("add"), eps))
        got = acc.delta_estimate(eps)
        assert abs(got - want) < 5 * se + 1e-3 * want
        assert sound.get_delta_for_epsilon(eps) > got * 1.1


def test_gaussian_mechanism_delta_matches_integration():
    for mu, eps in ((1.0, 0.5), (0.3, 0.1), (2.5, 3.0)):
        def f(y: float, mu: float = mu, eps: float = eps) -> float:
            return max(norm.pdf(y, mu, 1.0) - math.exp(eps) * norm.pdf(y, 0, 1.0), 0.0)

        want = integrate.quad(f, -20, 20, points=[mu / 2 + eps / mu], limit=200, epsabs=1e-13)[0]
        assert gaussian_mechanism_delta(mu, eps) == pytest.approx(want, rel=1e-7, abs=1e-13)


def test_evr_false_acceptance_rate_by_simulation():
    """A mechanism with true delta = d_true is accepted at threshold d' with frequency <= q(d_true, d', s).

    Gaussian mechanism: privacy losses ~ N(mu^2/2, mu^2) under P. 3000 independent verifications with s = 2000
    samples; the assertion allows 4 binomial s.d. above q (false-failure rate < 4e-5 if the bound holds)."""
    mu, eps = 1.0, 1.0
    d_true = gaussian_mechanism_delta(mu, eps)
    s, runs = 2000, 3000
    thr = d_true * 0.85
    q = verification_failure_probability(s, thr, d_true)
    assert 0.001 < q < 0.5  # non-vacuous configuration
    rng = np.random.default_rng(77)
    losses = rng.normal(mu**2 / 2, mu, size=(runs, s))
    estimates = (-np.expm1(np.minimum(eps - losses, 0.0))).mean(axis=1)
    accepted = float(np.mean(estimates <= thr))
    assert accepted <= q + 4 * math.sqrt(q * (1 - q) / runs), (accepted, q)
    assert accepted > 0  # the simulation can accept at all: the check above could fail
    # and a mechanism that does satisfy the threshold is accepted nearly always
    good = rng.normal(0.05**2 / 2, 0.05, size=(200, s))
    assert np.mean((-np.expm1(np.minimum(eps - good, 0.0))).mean(axis=1) <= thr) == 1.0


def test_evr_bookkeeping():
    t = 1e-3
    s = samples_for_target_delta(t)
    assert overall_delta(s, t / 2) <= t < overall_delta(s - 1, t / 2)
    thr = verification_threshold(s, t)
    assert t / 2 <= thr < t and overall_delta(s, thr) <= t
    with pytest.raises(ConfigurationError):
        verification_threshold(10, 1e-6)


def test_accountant_interface_and_refusals():
    mech = BandMFMechanism(50, (0.9, 0.43), 0.1, 1.2)
    acc = MonteCarloAccountant(mech, samples=5000, seed=0)
    assert acc.is_monte_carlo and acc.planned_steps == 50
    assert acc.delta(0, 1.0) == 0.0
    eps = acc.epsilon(50, 0.05)
    assert acc.delta(50, eps) <= 0.05 < acc.delta(50, eps * 0.98)
    assert acc.delta(10, 1.0) == acc.delta(50, 1.0)  # prefix = post-processing of the whole run
    with pytest.raises(ConfigurationError, match="steps"):
        acc.delta(51, 1.0)
    rep = acc.report([1.0])
    assert rep["is_monte_carlo"] and set(rep["delta"]["1.0"]) == {"estimate", "upper"}
    for bad in ((0.0, 0.5), (1.0, -0.1), ()):
        with pytest.raises(ConfigurationError, match="coefficients"):
            BandMFMechanism(10, bad, 0.1, 1.0)
    with pytest.raises(ConfigurationError, match="sampling_prob"):
        BandMFMechanism(10, (1.0,), 1.5, 1.0)


def test_calibration_algorithm_5():
    mech = BandMFMechanism(30, (0.9, 0.43), 0.2, 1.0)
    res = calibrate_noise_multiplier_monte_carlo(mech, 1.0, 0.05, seed=9, pilot_samples=4000)
    assert res.verified and res.noise_multiplier < res.candidates[-1]
    assert list(res.candidates) == sorted(res.candidates)
    # independent check with many fresh samples: the selected sigma's delta is within the target
    check = MonteCarloAccountant(mech.with_noise_multiplier(res.noise_multiplier), samples=60_000, seed=123)
    assert check.delta_estimate(1.0) <= 0.05
    # and the analytic top candidate satisfies the target by itself
    top = res.candidates[-1]
    assert gaussian_mechanism_delta(mech.unamplified_sensitivity() / top, 1.0) <= res.threshold
    with pytest.raises(ConfigurationError, match="leak_probability"):
        calibrate_noise_multiplier_monte_carlo(BandMFMechanism(30, (1.0,), 0.2, 1.0, leak_probability=0.5), 1.0, 0.05)


def test_hockey_stick_estimate_of_known_losses():
    losses = np.array([0.0, 1.0, 3.0])
    assert hockey_stick_estimate(losses, 1.0) == pytest.approx((1 - math.exp(-2)) / 3)


def test_substitution_epsilon_by_group_privacy():
    """Substitution = remove + add: the returned 2 eps satisfies (1 + e^eps) d(eps) <= delta, and exceeds twice the
    add/remove epsilon at delta (group privacy can only cost more)."""
    acc = MonteCarloAccountant(BandMFMechanism(60, (1.0,), 0.05, 0.8), samples=20_000, seed=1)
    e2 = acc.substitution_epsilon(60, 0.1)
    assert math.isfinite(e2)
    assert (1 + math.exp(e2 / 2)) * acc.delta_upper(e2 / 2) <= 0.1
    assert e2 >= 2 * acc.epsilon(60, 0.1)
    assert acc.substitution_epsilon(60, 1e-4) == math.inf  # 20,000 samples cannot verify that small a delta


def test_check_budget_before_training():
    acc = MonteCarloAccountant(BandMFMechanism(50, (0.9, 0.43), 0.1, 1.2), samples=5000, seed=0)
    eps = acc.check_budget(50.0, 0.05)
    assert eps == acc.epsilon(50, 0.05)
    with pytest.raises(ConfigurationError, match="epsilon"):
        acc.check_budget(eps * 0.5, 0.05)
    assert acc.log_name == "epsilon_monte_carlo_upper"


def test_estimates_from_sorted_losses_equal_the_plain_mean_of_the_terms():
    """The accountant's read-outs (sorted losses, summing only the non-zero terms) are the sample mean of
    max(0, 1 - e^{eps - L}) over all samples, computed here directly."""
    acc = MonteCarloAccountant(BandMFMechanism(40, (1.0, 0.5), 0.2, 0.9), samples=20_000, seed=5)
    for eps in (0.0, 0.1, 0.7, 2.0, 5.0, 50.0):
        got = acc.estimates(eps)
        for direction in ("remove", "add"):
            losses = acc.losses(direction)
            want = float(np.mean(np.maximum(0.0, 1.0 - np.exp(eps - losses))))
            assert got[direction] == pytest.approx(want, rel=1e-12, abs=1e-15)
            assert math.copysign(1.0, got[direction]) == 1.0

"""Single-step privacy profiles against direct numerical integration of the stated mixtures.

Every theorem function is evaluated on alphas on both sides of 1 and compared with
:func:`reference.hockey_stick_quadrature`, which integrates max(p - alpha q, 0) of the mixtures *as stated
in the paper* (independently of the threshold solver and of the alpha < 1 mirroring used by the package).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.special import ndtr

from lightning_dpts.privacy import profiles as P

from . import reference as R

ALPHAS = [0.05, 0.3, 0.8, 1.0, 1.3, 2.0, 5.0, 20.0]


def binom(n: int, p: float) -> np.ndarray:
    return stats.binom.pmf(np.arange(n + 1), n, p)


def assert_profile_matches(profile: P.PrivacyProfile, reference_fn) -> None:
    for alpha in ALPHAS:
        got = float(profile(alpha)[0])
        want = reference_fn(alpha)
        assert got == pytest.approx(want, rel=1e-6, abs=1e-11), (profile.theorem, alpha, got, want)


@pytest.mark.parametrize("rho,r,sigma", [(0.3, 0.2, 1.0), (1.0, 0.05, 0.7), (0.01, 0.5, 2.0)])
def test_theorem_4_4_switching_profile(rho, r, sigma):
    q = rho * r
    assert_profile_matches(
        P.theorem_4_4(rho, r, sigma),
        lambda a: R.switching_profile_quadrature([0, 2], [1 - q, q], sigma, a),
    )


def test_theorem_4_2_is_4_4_with_rho_one():
    assert_profile_matches(
        P.theorem_4_2(0.3, 0.8), lambda a: R.switching_profile_quadrature([0, 2], [0.7, 0.3], 0.8, a)
    )


@pytest.mark.parametrize("lam,r,sigma", [(2, 0.1, 1.0), (5, 0.02, 1.5)])
def test_theorem_e_1_double_mixture(lam, r, sigma):
    means = 2.0 * np.arange(lam + 1)
    assert_profile_matches(
        P.theorem_e_1(lam, r, sigma), lambda a: R.opposed_profile_quadrature(means, binom(lam, r), sigma, a)
    )


@pytest.mark.parametrize("rho,lam,r,sigma", [(0.2, 3, 0.1, 1.0), (0.05, 2, 0.3, 0.9)])
def test_theorem_f_1_joint_convexity_mixture(rho, lam, r, sigma):
    means = 2.0 * np.arange(lam + 1)
    assert_profile_matches(
        P.theorem_f_1(rho, lam, r, sigma),
        lambda a: (1 - rho) * max(0.0, 1 - a)
        + rho * R.opposed_profile_quadrature(means, binom(lam, r), sigma, a),
    )


@pytest.mark.parametrize("k,r,sigma", [(6, 0.1, 1.0), (30, 0.02, 2.0)])
def test_theorem_e_8_poisson(k, r, sigma):
    means = np.arange(k + 1, dtype=float)
    assert_profile_matches(
        P.theorem_e_8(k, r, sigma), lambda a: R.opposed_profile_quadrature(means, binom(k, r), sigma, a)
    )


def test_theorem_f_2_poisson_with_top_level():
    rho, k, r, sigma = 0.1, 12, 0.05, 1.2
    means = np.arange(k + 1, dtype=float)
    assert_profile_matches(
        P.theorem_f_2(rho, k, r, sigma),
        lambda a: (1 - rho) * max(0.0, 1 - a) + rho * R.opposed_profile_quadrature(means, binom(k, r), sigma, a),
    )


@pytest.mark.parametrize("rho,lam,r,sigma", [(0.2, 3, 0.1, 1.0), (1.0, 4, 0.05, 1.3)])
def test_theorem_f_7_and_4_3_lower_bounds(rho, lam, r, sigma):
    weights = rho * binom(lam, r)
    weights[0] += 1 - rho
    means = 2.0 * np.arange(lam + 1)
    fn = P.theorem_f_7 if rho < 1 else (lambda rho_, lam_, r_, s_: P.theorem_4_3(lam_, r_, s_))
    assert_profile_matches(fn(rho, lam, r, sigma),
                           lambda a: R.switching_profile_quadrature(means, weights, sigma, a))


def test_theorem_f_8_lower_bound_construction():
    rho, k, r, sigma = 0.3, 8, 0.1, 1.0
    weights = rho * binom(k, r)
    weights[0] += 1 - rho
    means = np.arange(k + 1, dtype=float)
    assert_profile_matches(P.theorem_f_8(rho, k, r, sigma),
                           lambda a: R.opposed_profile_quadrature(means, weights, sigma, a))


def test_theorem_g_1_mixture():
    p2 = 0.013
    assert_profile_matches(P.theorem_g_1(p2, 0.9),
                           lambda a: R.switching_profile_quadrature([0, 2], [1 - p2, p2], 0.9, a))


def test_propositions_c_1_and_c_2():
    total, batch, k, sigma = 5000, 64, 20, 1.0
    q = batch / total
    assert_profile_matches(P.proposition_c_1(total, batch, sigma),
                           lambda a: R.switching_profile_quadrature([0, 2], [1 - q, q], sigma, a))
    i = np.arange(k + 1)
    weights = stats.hypergeom.pmf(i, total, k, batch)
    assert_profile_matches(P.proposition_c_2(total, k, batch, sigma),
                           lambda a: R.switching_profile_quadrature(2.0 * i, weights, sigma, a))


def test_gaussian_tvd_closed_form():
    assert P.gaussian_tvd(1.0, 0.0) == 1.0
    assert P.gaussian_tvd(1.0, 2.0) == pytest.approx(2 * ndtr(0.25) - 1)
    # against a direct integral of |p - q| / 2
    xs = np.linspace(-30, 30, 600001)
    direct = 0.5 * np.trapezoid(np.abs(stats.norm.pdf(xs, 0, 1.5) - stats.norm.pdf(xs, 2.0, 1.5)), xs)
    assert P.gaussian_tvd(2.0, 1.5) == pytest.approx(direct, rel=1e-8)


def test_opposed_profile_monte_carlo():
    """H_2(MoG(-mu,p)||MoG(mu,p)) = E_P[(1 - 2 q/p)_+] estimated from 2e6 samples (seed 0).

    The tolerance is 6 standard errors of the Monte Carlo mean: false-failure rate < 2e-9.
    """
    rng = np.random.default_rng(0)
    lam, r, sigma, alpha = 3, 0.2, 1.0, 2.0
    means, weights = 2.0 * np.arange(lam + 1), binom(lam, r)
    comp = rng.choice(lam + 1, size=2_000_000, p=weights)
    x = rng.normal(-means[comp], sigma)
    ratio = R.mixture_pdf(x, means, weights, sigma) / R.mixture_pdf(x, -means, weights, sigma)
    samples = np.maximum(0.0, 1 - alpha * ratio)
    estimate, se = samples.mean(), samples.std() / np.sqrt(samples.size)
    got = float(P.theorem_e_1(lam, r, sigma)(alpha)[0])
    assert abs(got - estimate) < 6 * se


def test_profiles_are_valid_privacy_profiles():
    """Lemma D.11: convex, non-increasing, H(0) = 1, H(alpha) >= max(0, 1 - alpha)."""
    alphas = np.linspace(0, 6, 601)
    for profile in [P.theorem_4_4(0.2, 0.3, 1.0), P.theorem_f_1(0.3, 3, 0.1, 1.0), P.theorem_e_8(10, 0.05, 1.0),
                    P.theorem_f_8(0.3, 10, 0.05, 1.0), P.theorem_g_1(0.02, 0.8)]:
        h = profile(alphas)
        assert h[0] == pytest.approx(1.0)
        assert np.all(np.diff(h) <= 1e-12)
        assert np.all(np.diff(h, 2) >= -1e-9)
        assert np.all(h >= np.maximum(0, 1 - alphas) - 1e-12)


def test_component_truncation_is_pessimistic():
    """Dropping negligible binomial components adds their mass back, so values never decrease."""
    k, r, sigma = 400, 1e-3, 1.0
    profile = P.theorem_e_8(k, r, sigma)
    means = np.arange(k + 1, dtype=float)
    for alpha in [1.0, 1.5, 3.0]:
        exact = R.opposed_profile_quadrature(means[:12], binom(k, r)[:12] / binom(k, r)[:12].sum(), sigma, alpha)
        assert float(profile(alpha)[0]) >= exact * (1 - 1e-9)

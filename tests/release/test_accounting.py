"""Accounting for privatised releases: the exact bound, Koga et al.'s bounds, composition, calibration.

Independent references: the Gaussian-mechanism delta from scipy.stats.norm (and adaptive quadrature of the
hockey-stick integral from tests/privacy/reference.py), Binomial tails by direct summation, and the closed
form of K-fold composition (K releases = one release with K*w protected steps; see docs/release.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy.stats import binom, norm

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation
from lightning_dpts.release import (
    ReleaseAccountant,
    ReleaseSpec,
    calibrate_release_noise,
    exact_release_delta,
    gaussian_delta,
    gaussian_filter_kernel,
    koga_filter_delta,
    koga_filter_failure_probability,
    koga_identity_delta,
    koga_identity_failure_probability,
)
from tests.privacy.reference import hockey_stick_quadrature


def _spec(p: float, w: int, v: float, **kw) -> ReleaseSpec:
    return ReleaseSpec(rate=p, relation=NeighbouringRelation("event", size=w, value_bound=v), **kw)


def _gauss_delta_ref(eps: float, mu: float) -> float:
    return float(norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu))


def _exact_ref(eps: float, p: float, w: int, v: float, s: float) -> float:
    total = 0.0
    for m in range(1, w + 1):
        total += math.comb(w, m) * p**m * (1 - p) ** (w - m) * _gauss_delta_ref(eps, v * math.sqrt(m) / s)
    return total


def _eps_from_delta(delta_fn, delta: float) -> float:
    if delta_fn(0.0) <= delta:
        return 0.0
    return optimize.brentq(lambda e: delta_fn(e) - delta, 0.0, 200.0, xtol=1e-12)


@pytest.mark.parametrize(("eps", "mu"), [(0.0, 0.3), (0.5, 1.0), (2.0, 1.5), (6.0, 2.0), (1.0, 0.05)])
def test_gaussian_delta_matches_quadrature(eps: float, mu: float) -> None:
    ref = hockey_stick_quadrature([mu], [1.0], [0.0], [1.0], 1.0, math.exp(eps))
    assert float(gaussian_delta(eps, mu)) == pytest.approx(ref, rel=1e-7, abs=1e-14)
    assert float(gaussian_delta(eps, mu)) == pytest.approx(_gauss_delta_ref(eps, mu), rel=1e-9, abs=1e-15)


def test_gaussian_delta_tiny_values_are_positive_and_accurate() -> None:
    # deep tail: delta ~ 1e-40; the naive difference of two cdfs would round to 0 or go negative
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    for eps, mu in ((40.0, 3.0), (8.0, 0.5)):
        d = float(gaussian_delta(eps, mu))
        a, b = mu / 2 - eps / mu, -mu / 2 - eps / mu
        ref = float(mpmath.ncdf(a) - mpmath.exp(eps) * mpmath.ncdf(b))
        assert 0 < d < 1e-15
        assert d == pytest.approx(ref, rel=1e-8)


@pytest.mark.parametrize(("p", "w", "v", "s"), [(0.5, 4, 0.1, 0.3), (0.75, 12, 1.0, 2.0), (0.1, 30, 0.5, 1.0)])
def test_exact_delta_matches_direct_sum(p: float, w: int, v: float, s: float) -> None:
    spec = _spec(p, w, v)
    for eps in (0.0, 0.3, 1.0, 3.0):
        assert exact_release_delta(spec, s, eps)[0] == pytest.approx(_exact_ref(eps, p, w, v, s), rel=1e-9,
                                                                     abs=1e-15)


@pytest.mark.parametrize(("w", "v", "s", "delta"), [(1, 1.0, 1.0, 1e-5), (12, 0.1, 0.4, 1e-4), (50, 0.2, 3.0, 1e-7)])
def test_rate_one_is_the_gaussian_mechanism(w: int, v: float, s: float, delta: float) -> None:
    spec = _spec(1.0, w, v)
    mu = v * math.sqrt(w) / s
    for eps in (0.0, 0.5, 2.0):
        assert exact_release_delta(spec, s, eps)[0] == pytest.approx(_gauss_delta_ref(eps, mu), rel=1e-10,
                                                                     abs=1e-15)
    ref = _eps_from_delta(lambda e: _gauss_delta_ref(e, mu), delta)
    assert ReleaseAccountant(spec, s).epsilon(delta) == pytest.approx(ref, rel=1e-7, abs=1e-9)
    # Koga's bound with I' = w is the Gaussian mechanism too (delta' = 0)
    assert ReleaseAccountant(spec, s, bound="koga").epsilon(delta) == pytest.approx(ref, rel=1e-6, abs=1e-8)


def test_context_window_caps_the_size() -> None:
    short = _spec(0.5, 24, 0.1, context_length=6)
    assert short.size == 6
    a = ReleaseAccountant(short, 0.2).epsilon(1e-4)
    b = ReleaseAccountant(_spec(0.5, 6, 0.1), 0.2).epsilon(1e-4)
    assert a == b


def test_user_level_equals_event_level() -> None:
    ev = ReleaseSpec(0.5, NeighbouringRelation("event", 5, 0.1))
    us = ReleaseSpec(0.5, NeighbouringRelation("user", 5, 0.1))
    assert ReleaseAccountant(ev, 0.3).epsilon(1e-5) == ReleaseAccountant(us, 0.3).epsilon(1e-5)


def test_koga_theorem_2_failure_probability() -> None:
    for kept in range(0, 9):
        ref = sum(binom.pmf(t, 8, 0.3) for t in range(kept + 1, 9))
        assert koga_identity_failure_probability(8, 0.3, kept) == pytest.approx(ref, abs=1e-15)


GRID = [(p, w, v, s) for p in (0.1, 0.5, 0.75, 1.0) for w in (1, 4, 24) for v in (0.1, 1.0) for s in (0.3, 3.0)]


@pytest.mark.parametrize(("p", "w", "v", "s"), GRID)
def test_exact_never_above_koga(p: float, w: int, v: float, s: float) -> None:
    """On the whole grid, pointwise in eps and for the eps read out at several deltas."""
    spec = _spec(p, w, v)
    eps = np.concatenate([[0.0], np.geomspace(1e-3, 30.0, 200)])
    exact = exact_release_delta(spec, s, eps)
    for gaussian in ("analytic", "classical"):
        koga = koga_identity_delta(spec, s, eps, gaussian=gaussian)
        assert np.all(exact <= koga * (1 + 1e-9) + 1e-15), gaussian  # classical: inf outside eps < 1
    for delta in (1e-3, 1e-5, 1e-8):
        e_exact = ReleaseAccountant(spec, s).epsilon(delta)
        e_koga = ReleaseAccountant(spec, s, bound="koga").epsilon(delta)
        assert e_exact <= e_koga * (1 + 1e-7) + 1e-9


def test_exact_is_strictly_better_with_subsampling() -> None:
    spec = _spec(0.5, 24, 0.1)
    assert ReleaseAccountant(spec, 0.3).epsilon(1e-4) < 0.9 * ReleaseAccountant(spec, 0.3, bound="koga").epsilon(1e-4)


def test_classical_gaussian_step_is_unsound_beyond_eps_one() -> None:
    """Why the classical variant refuses eps >= 1: Theorem 1's calibration understates delta there."""
    mu = 4.0 / 1.0
    eps = 8.0
    classical = 1.25 * math.exp(-0.5 * (eps / mu) ** 2)
    assert _gauss_delta_ref(eps, mu) > classical
    spec = _spec(1.0, 16, 1.0)
    assert koga_identity_delta(spec, 1.0, [eps], gaussian="classical")[0] == math.inf


def test_theorem_4_failure_probability_corrected() -> None:
    h = gaussian_filter_kernel(200, 2.0)
    alphas = np.linspace(math.sqrt(0.3), 1.0, 50)
    fp = koga_filter_failure_probability(h, 0.3, alphas)
    assert fp[-1] == 0.0
    assert np.all(np.diff(fp) <= 1e-15) and np.all((fp >= 0) & (fp <= 1))
    # corrected formula at one alpha, by hand (intrinsic-dimension branch when alpha^2 >= p + L)
    lmax = float(np.sum(h * h))
    srnk = 200 * lmax
    a = 0.8**2
    r = a / 0.3
    assert a >= 0.3 + lmax
    g = (math.exp(r - 1) / r**r) ** (0.3 / lmax)
    assert koga_filter_failure_probability(h, 0.3, 0.8)[0] == pytest.approx(min(1.0, 2 * srnk * g, 200 * g))


def test_filter_bound_reduces_to_gaussian_without_subsampling_gain() -> None:
    """With a filter only alpha = 1 may be certain; Koga's Corollary 2 is never below the exact identity
    bound at p = 1 (both are the plain Gaussian mechanism then)."""
    h = gaussian_filter_kernel(24, 3.0)
    spec = _spec(1.0, 24, 0.1, context_length=24, filter_kernel=h)
    eps = np.linspace(0, 5, 11)
    ref = np.array([_gauss_delta_ref(e, 0.1 * math.sqrt(24) / 0.5) for e in eps])
    assert np.allclose(koga_filter_delta(spec, 0.5, eps), ref, rtol=1e-9, atol=1e-15)


def test_k_releases_pld_matches_closed_form() -> None:
    """K releases from the same series compose to the exact profile with K*w protected steps (the sampled
    index sets are visible, so given them the composition is one Gaussian mechanism with v*sqrt(sum m_i))."""
    spec = _spec(0.5, 6, 0.1)
    s, k, delta = 0.25, 8, 1e-5
    pld_eps = ReleaseAccountant(spec, s).epsilon(delta, releases=k)
    closed = ReleaseAccountant(_spec(0.5, 6 * k, 0.1), s).epsilon(delta)
    assert closed <= pld_eps <= closed * 1.01 + 1e-3  # the PLD is pessimistic, within its discretisation


def test_koga_composition_is_sound_and_monotone() -> None:
    spec = _spec(0.5, 6, 0.1)
    acc = ReleaseAccountant(spec, 0.25, bound="koga")
    e1, e4 = acc.epsilon(1e-5), acc.epsilon(1e-5, releases=4)
    assert e1 < e4 <= 4 * acc.epsilon(1e-5 / 4) + 1e-12
    assert ReleaseAccountant(spec, 0.25).epsilon(1e-5, releases=4) <= e4


@pytest.mark.parametrize("bound", ["exact", "koga"])
@pytest.mark.parametrize("releases", [1, 5])
def test_calibration_is_certified_and_minimal(bound: str, releases: int) -> None:
    spec = _spec(0.75, 12, 0.1)
    s = calibrate_release_noise(spec, 1.0, 1e-4, releases, bound=bound, rel_tol=1e-4)
    assert ReleaseAccountant(spec, s, bound=bound).epsilon(1e-4, releases) <= 1.0
    assert ReleaseAccountant(spec, s * (1 - 2e-4), bound=bound).epsilon(1e-4, releases) > 1.0


def test_calibration_with_filter() -> None:
    h = gaussian_filter_kernel(24, 2.0)
    spec = _spec(0.5, 24, 0.1, context_length=24, filter_kernel=h)
    s = calibrate_release_noise(spec, 2.0, 1e-4, bound="koga", rel_tol=1e-2)
    assert ReleaseAccountant(spec, s, bound="koga").epsilon(1e-4) <= 2.0


@pytest.mark.parametrize(
    ("call", "parameter"),
    [
        (lambda: _spec(0.0, 4, 0.1), "rate"),
        (lambda: _spec(1.5, 4, 0.1), "rate"),
        (lambda: _spec(float("nan"), 4, 0.1), "rate"),
        (lambda: ReleaseSpec(0.5, NeighbouringRelation("event", 4, None)), "value_bound"),
        (lambda: _spec(0.5, 4, 0.1, context_length=0), "context_length"),
        (lambda: _spec(0.5, 4, 0.1, filter_kernel=np.ones(4) / 4), "filter_kernel"),
        (lambda: _spec(0.5, 4, 0.1, context_length=4, filter_kernel=np.array([1.0, -0.5, 0.5, 0.0])), "filter_kernel"),
        (lambda: ReleaseAccountant(_spec(0.5, 4, 0.1), 0.0), "noise_std"),
        (lambda: ReleaseAccountant(_spec(0.5, 4, 0.1), 1.0, bound="tight"), "bound"),
        (lambda: ReleaseAccountant(_spec(0.5, 4, 0.1), 1.0).epsilon(0.0), "delta"),
        (lambda: ReleaseAccountant(_spec(0.5, 4, 0.1), 1.0).epsilon(1e-5, releases=0), "releases"),
        (lambda: ReleaseAccountant(_spec(0.5, 4, 0.1), 1.0, bound="koga").delta(1.0, releases=2), "releases"),
        (lambda: ReleaseAccountant(_spec(0.5, 4, 0.1, context_length=4, filter_kernel=np.ones(4) / 4), 1.0),
         "bound"),
        (lambda: calibrate_release_noise(_spec(0.5, 4, 0.1), 0.0, 1e-5), "epsilon"),
    ],
)
def test_configuration_errors_name_the_parameter(call, parameter: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        call()
    assert info.value.parameter == parameter

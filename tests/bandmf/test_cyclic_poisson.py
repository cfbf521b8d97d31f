"""Amplified BandMF: cyclic Poisson sampling accounted by the PLD accountant (docs/bandmf.md, Theorem B.2).

Independent computations:

* the *dense* mechanism y = C v + sigma Z (an n x n banded Toeplitz C built as a matrix, one-dimensional gradients)
  for two participation opportunities of the protected series, its delta(eps) by numerical integration on a 2-D grid
  over the span of the component means (the orthogonal complement has the same law under both datasets), for fixed
  and for adaptive gradient choices;
* against it: the product of the two per-opportunity 1-D mixtures with noise sigma / ||c|| (the decomposition the
  theorem claims), which must agree when k >= b and must not when k < b (the attacker's gain from overlapping rows);
* the accountant's delta at the same configuration must lie above every attack;
* b = 1 (k = 1) equals the Poisson-top-level structured accountant; the opportunity count is checked by enumerating
  the eligible steps of every group.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy.stats import binomtest, norm

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import (
    BandMFNoiseSpec,
    CyclicPoisson,
    ProfileAccountant,
    SamplingSpec,
    StructuredSubsamplingAccountant,
    calibrate_noise_multiplier,
    profiles,
    top_level_from_name,
)
from lightning_dpts.training.correlated_noise import banded_sqrt_coefficients

SIGMA = 0.9


def _toeplitz(c: np.ndarray, n: int) -> np.ndarray:
    mat = np.zeros((n, n))
    for j, v in enumerate(c):
        mat += v * np.eye(n, k=-j)
    return mat


def _grid(extent: float, points: int = 801) -> tuple[np.ndarray, np.ndarray, float]:
    axis = np.linspace(-extent, extent, points)
    xx, yy = np.meshgrid(axis, axis, indexing="ij")
    return xx, yy, float(axis[1] - axis[0])


def _opportunity(p: float, r: float, w: float, a: float) -> list[tuple[float, float]]:
    """The protected series' contribution at one opportunity: (value, probability) - not sampled 0, sampled and not
    leaking w, sampled and leaking a."""
    return [(0.0, 1 - p), (w, p * (1 - r)), (a, p * r)]


def _hockey(dp: np.ndarray, dq: np.ndarray, h: float, eps: float | list[float]) -> float | list[float]:
    """max of both directions' hockey-stick divergence on the grid, at one eps or a list of them."""
    out = [float(max(np.maximum(dp - math.exp(e) * dq, 0).sum(), np.maximum(dq - math.exp(e) * dp, 0).sum()) * h * h)
           for e in np.atleast_1d(eps)]
    return out if isinstance(eps, list) else out[0]


def _dense_delta(c: np.ndarray, k: int, first: list, second: list, first2: list, second2: list,
                 eps: float | list[float]) -> float | list[float]:
    """delta(eps) = max of both directions for the dense mechanism with opportunities at steps 0 and k."""
    b = c.size
    n = k + b
    mat = _toeplitz(c, n)
    basis, _ = np.linalg.qr(np.stack([mat[:, 0], mat[:, k]], axis=1))  # orthonormal basis of the means' span
    cols = basis.T @ np.stack([mat[:, 0], mat[:, k]], axis=1)  # 2 x 2: the two columns in that basis
    extent = 2.5 * float(np.abs(cols).sum()) + 11 * SIGMA
    xx, yy, h = _grid(extent)

    def density(one: list, two: list) -> np.ndarray:
        out = np.zeros_like(xx)
        for v1, w1 in one:
            for v2, w2 in two:
                m = cols[:, 0] * v1 + cols[:, 1] * v2
                out += w1 * w2 * norm.pdf(xx, m[0], SIGMA) * norm.pdf(yy, m[1], SIGMA)
        return out

    return _hockey(density(first, second), density(first2, second2), h, eps)


def _product_delta(norm_c: float, first: list, second: list, first2: list, second2: list,
                   eps: float | list[float]) -> float | list[float]:
    """The decomposition: two independent 1-D mixtures with means v ||c|| (noise sigma), composed."""
    extent = 2.5 * 2 * norm_c + 11 * SIGMA
    xx, yy, h = _grid(extent)

    def mix(parts: list, x: np.ndarray) -> np.ndarray:
        return sum(w * norm.pdf(x, v * norm_c, SIGMA) for v, w in parts)

    return _hockey(mix(first, xx) * mix(second, yy), mix(first2, xx) * mix(second2, yy), h, eps)


# --------------------------------------------------------------------------------------------------------------
# the decomposition: disjoint rows make the opportunities independent; overlapping rows do not
# --------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,k", [(2, 2), (3, 4), (4, 4)])
def test_dense_mechanism_is_the_composition_of_opportunities_when_k_at_least_b(b: int, k: int) -> None:
    c = banded_sqrt_coefficients(b)
    p, r = 0.3, 0.4
    d = _opportunity(p, r, -1.0, 1.0)  # the attack of tests/bandmf/test_structured_attacks.py
    d2 = _opportunity(p, r, -1.0, -1.0)
    for eps in (0.2, 1.0):
        dense = _dense_delta(c, k, d, d, d2, d2, eps)
        product = _product_delta(float(np.linalg.norm(c)), d, d, d2, d2, eps)
        assert dense == pytest.approx(product, rel=1e-6, abs=1e-10)


def test_with_k_below_b_the_rows_overlap_and_the_decomposition_understates_delta() -> None:
    # b = 4, k = 2: the columns at steps 0 and 2 share rows 2 and 3, with non-negative c the attacker's two
    # participations add up (||c_0 + c_2|| > sqrt(2) ||c||). The accountant must refuse this configuration.
    c = banded_sqrt_coefficients(4)
    for p, r in ((1.0, 1.0), (0.3, 0.4)):
        d, d2 = _opportunity(p, r, 0.0, 1.0), _opportunity(p, r, 0.0, -1.0)
        dense = _dense_delta(c, 2, d, d, d2, d2, 3.0)
        product = _product_delta(float(np.linalg.norm(c)), d, d, d2, d2, 3.0)
        assert dense > 1.2 * product, (p, r, dense, product)  # measured: 0.763 vs 0.615; 5.2e-5 vs 6.5e-6
    spec = SamplingSpec(num_series=100, min_length=31, context_length=4, prediction_length=2, batch_size=10,
                        top_level="cyclic_poisson", bands=2)
    with pytest.raises(ConfigurationError, match="coefficients"):
        StructuredSubsamplingAccountant(spec, 1.0, coefficients=c)
    assert not BandMFNoiseSpec(bands=4).compatible_top_level(spec.top_level_scheme)
    assert BandMFNoiseSpec(bands=2).compatible_top_level(spec.top_level_scheme)


# --------------------------------------------------------------------------------------------------------------
# soundness: the accountant lies above fixed and adaptive attacks on the dense mechanism
# --------------------------------------------------------------------------------------------------------------
def _spec(k: int) -> SamplingSpec:
    # N = 100, N' = 10 -> p = N' k / N; window 4 + 2 = 6 of T = 30 start positions -> r = 0.2 (w = 1 event)
    return SamplingSpec(num_series=100, min_length=31, context_length=4, prediction_length=2, batch_size=10,
                        top_level="cyclic_poisson", bands=k)


def _adaptive_delta(c: np.ndarray, p: float, r: float, eps: list[float]) -> list[float]:
    """Two opportunities (k >= b, so the blocks' projections s1, s2 along c are the only informative coordinates);
    the attacker picks the second leaking gradient's sign from s1 (the model after the first block)."""
    nc = float(np.linalg.norm(c))
    xx, yy, h = _grid(4 * nc + 11 * SIGMA)

    def mix(parts: list, x: np.ndarray) -> np.ndarray:
        return sum(w * norm.pdf(x, v * nc, SIGMA) for v, w in parts)

    sign = np.where(xx > 0.3, 1.0, -1.0)
    dp = mix(_opportunity(p, r, -1.0, 1.0), xx) * sum(
        w * norm.pdf(yy, v * nc, SIGMA) for v, w in ((0.0, 1 - p), (-sign, p * (1 - r)), (sign, p * r)))
    dq = mix(_opportunity(p, r, -1.0, -1.0), xx) * sum(
        w * norm.pdf(yy, v * nc, SIGMA) for v, w in ((0.0, 1 - p), (-sign, p * (1 - r)), (-sign, p * r)))
    return _hockey(dp, dq, h, eps)


@pytest.mark.parametrize("b,k", [(1, 1), (2, 2), (2, 3)])
def test_accountant_bounds_fixed_and_adaptive_attacks(b: int, k: int) -> None:
    spec = _spec(k)
    p, r = spec.top_level_scheme.sampling_prob(spec), spec.bottom_level_rate
    assert (p, r) == pytest.approx((0.1 * k, 0.2))
    c = banded_sqrt_coefficients(b) * 1.3  # a non-normalised C: sensitivity 1.3 per participation
    acc = StructuredSubsamplingAccountant(spec, SIGMA * 1.3, coefficients=c)  # the same sigma / ||c||
    steps = k + 1  # group 0 is eligible at steps 0 and k: two opportunities
    assert acc.compositions(steps) == 2
    attacks = [
        (_opportunity(p, r, -1.0, 1.0), _opportunity(p, r, -1.0, -1.0)),
        (_opportunity(p, r, 0.0, 1.0), _opportunity(p, r, 0.0, -1.0)),
        (_opportunity(p, r, 0.0, 1.0), _opportunity(p, r, 0.0, 0.0)),
        (_opportunity(p, r, 1.0, 1.0), _opportunity(p, r, 1.0, -1.0)),
    ]
    cc = c / 1.3
    epsilons = [0.1, 0.5, 1.0]
    found = [_dense_delta(cc, k, d, d, d2, d2, epsilons) if k > 1 else _product_delta(1.0, d, d, d2, d2, epsilons)
             for d, d2 in attacks] + [_adaptive_delta(cc, p, r, epsilons)]
    for i, eps in enumerate(epsilons):
        bound = acc.delta(steps, eps)
        worst = max(f[i] for f in found)
        assert 0 < worst < bound, (eps, worst, bound)


# --------------------------------------------------------------------------------------------------------------
# b = 1 and the opportunity count
# --------------------------------------------------------------------------------------------------------------
def test_one_group_is_the_poisson_top_level_accountant() -> None:
    base = dict(num_series=145, min_length=120, context_length=24, prediction_length=12, batch_size=16)
    cyclic = StructuredSubsamplingAccountant(SamplingSpec(**base, top_level="cyclic_poisson"), 1.1)
    poisson = StructuredSubsamplingAccountant(SamplingSpec(**base, top_level="poisson"), 1.1)
    for steps in (1, 37, 400):
        assert cyclic.compositions(steps) == poisson.compositions(steps) == steps
        assert cyclic.epsilon(steps, 1e-7) == pytest.approx(poisson.epsilon(steps, 1e-7), rel=1e-12)
    # and with k groups at rate N' k / N: the Poisson accountant at that rate, composed ceil(steps / k) times
    k = 4
    grouped = StructuredSubsamplingAccountant(SamplingSpec(**base, top_level="cyclic_poisson", bands=k), 1.1)
    faster = StructuredSubsamplingAccountant(SamplingSpec(**{**base, "batch_size": 16 * k}, top_level="poisson"), 1.1)
    assert grouped.epsilon(401, 1e-7) == pytest.approx(faster.epsilon(101, 1e-7), rel=1e-12)


@pytest.mark.parametrize("n_series,k,steps", [(10, 3, 7), (10, 3, 9), (145, 4, 401), (7, 7, 1)])
def test_opportunities_are_counted_for_the_worst_series(n_series: int, k: int, steps: int) -> None:
    top = CyclicPoisson(groups=k)
    counts = np.zeros(n_series, dtype=int)
    for t in range(steps):
        counts[top.eligible(n_series, t)] += 1
    spec = SamplingSpec(num_series=n_series, min_length=40, context_length=4, prediction_length=2, batch_size=1,
                        top_level=top)
    assert spec.compositions(steps) == counts.max() == math.ceil(steps / k)
    # every series is in exactly one group; two eligible steps of a series are exactly k apart
    assert sorted(np.concatenate([top.eligible(n_series, t) for t in range(k)])) == list(range(n_series))
    assert spec.max_steps_for_compositions(spec.compositions(steps)) >= steps


def test_configuration_errors_name_the_parameter() -> None:
    with pytest.raises(ConfigurationError, match="batch_size"):
        SamplingSpec(num_series=100, min_length=31, context_length=4, prediction_length=2, batch_size=30,
                     top_level="cyclic_poisson", bands=4)  # N' k = 120 > N
    with pytest.raises(ConfigurationError, match="groups"):
        CyclicPoisson(groups=0)
    with pytest.raises(ConfigurationError, match="bound"):
        StructuredSubsamplingAccountant(_spec(2), 1.0, bound="lower")
    assert top_level_from_name("cyclic_poisson", bands=3) == CyclicPoisson(groups=3)
    with pytest.raises(ConfigurationError, match="bands"):
        top_level_from_name("poisson", bands=3)


def test_calibration_with_coefficients_scales_with_the_column_norm() -> None:
    spec = _spec(2)
    c = banded_sqrt_coefficients(2)
    sigma = calibrate_noise_multiplier(spec, 2.0, 1e-7, steps=200, coefficients=c)
    doubled = calibrate_noise_multiplier(spec, 2.0, 1e-7, steps=200, coefficients=2 * c)
    assert doubled == pytest.approx(2 * sigma, rel=2e-3)
    assert StructuredSubsamplingAccountant(spec, sigma, coefficients=c).epsilon(200, 1e-7) <= 2.0
    assert ProfileAccountant(profiles.theorem_4_4(0.2, 0.2, sigma)).epsilon_after(100, 1e-7) == pytest.approx(
        StructuredSubsamplingAccountant(spec, sigma, coefficients=c).epsilon(200, 1e-7), rel=1e-9)


# --------------------------------------------------------------------------------------------------------------
# the sampler
# --------------------------------------------------------------------------------------------------------------
class _FakeSampler:
    def __init__(self, spec: SamplingSpec) -> None:
        self.spec, self.num_series = spec, spec.num_series


def test_draws_only_the_eligible_group_at_rate_p() -> None:
    # Binomial test of the inclusion count at p = 0.4 (fixed seed; false-failure rate 1e-4 under a correct sampler).
    spec = _spec(4)
    top, sampler = spec.top_level_scheme, _FakeSampler(spec)
    rng = np.random.default_rng(20261125)
    taken, offered = 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in range(400):
            got = top.draw_series(sampler, t // spec.steps_per_epoch, t % spec.steps_per_epoch, rng)
            assert np.all(got % 4 == t % 4)
            taken += got.size
            offered += 25
    assert binomtest(taken, offered, 0.4).pvalue > 1e-4

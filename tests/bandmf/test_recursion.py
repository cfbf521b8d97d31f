"""Theorem 5.1's dynamic program against brute-force enumeration of every participation pattern, and the Monte
Carlo delta against an independent numerical integration for small n."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from lightning_dpts.privacy.montecarlo import BandMFMechanism, hockey_stick_estimate, log_likelihood_ratio


def _pattern_probability(x: tuple[int, ...], b: int, p: float, warm_start: bool) -> float:
    """Probability of participation pattern x under Algorithm 1/2, from the algorithm's definition."""
    # initial "last participation" offsets: cold start = available; warm start = virtual history
    starts = [(1.0, 0)]  # (weight, steps still excluded at step 1)
    if warm_start and b > 1:
        z = 1.0 + (b - 1) * p
        starts = [(1.0 / z, 0)] + [(p / z, k) for k in range(1, b)]
    total = 0.0
    for weight, excluded in starts:
        prob, blocked = weight, excluded
        for xt in x:
            if blocked > 0:
                if xt:
                    prob = 0.0
                    break
                blocked -= 1
            else:
                prob *= p if xt else 1 - p
                blocked = b - 1 if xt else 0
        total += prob
    return total


def _brute_force_ratio(y: np.ndarray, c: np.ndarray, p: float, sigma: float, warm: bool, r: float, s: float):
    n, b = y.size, c.size
    dense = np.zeros((n, n))
    for j in range(b):
        dense += np.diag(np.full(n - j, c[j]), -j) if j < n else 0
    ratio = 0.0
    for x in itertools.product((0, 1), repeat=n):
        px = _pattern_probability(x, b, p, warm)
        if px == 0:
            continue
        ones = [i for i in range(n) if x[i]]
        for leak in itertools.product((0, 1), repeat=len(ones)):
            pl = math.prod(r if v else 1 - r for v in leak)
            if pl == 0:
                continue
            xl = np.zeros(n)
            for i, v in zip(ones, leak, strict=True):
                xl[i] = v
            mean = s * dense @ xl
            ratio += px * pl * math.exp((mean @ y - 0.5 * mean @ mean) / sigma**2)
    return math.log(ratio)


@pytest.mark.parametrize("b,warm,r,s", [(1, True, 1.0, 1.0), (2, False, 1.0, 1.0), (2, True, 1.0, 1.0),
                                         (3, True, 1.0, 1.0), (3, False, 0.4, 2.0), (3, True, 0.3, 2.0)])
def test_recursion_matches_enumeration(b, warm, r, s):
    rng = np.random.default_rng(11)
    n, p, sigma = 7, 0.35, 0.9
    c = np.array([1.0, 0.6, 0.25])[:b]
    y = rng.normal(0.5, 1.3, size=(5, n))
    got = log_likelihood_ratio(y, c, p, sigma, warm_start=warm, leak_probability=r, sensitivity=s)
    want = [_brute_force_ratio(row, c, p, sigma, warm, r, s) for row in y]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def test_pattern_sampler_matches_enumeration():
    """Empirical pattern frequencies of the Monte Carlo sampler vs the enumerated law (chi-square, alpha = 1e-4)."""
    from scipy.stats import chisquare

    n, b, p = 5, 3, 0.4
    mech = BandMFMechanism(n, (1.0, 0.5, 0.2), p, 1.0)
    x = mech.sample_participation(np.random.default_rng(5), 200_000)
    codes = x.astype(int) @ (1 << np.arange(n))
    observed = np.bincount(codes, minlength=2**n)
    expected = np.array([_pattern_probability(tuple((k >> i) & 1 for i in range(n)), b, p, True)
                         for k in range(2**n)])
    assert abs(expected.sum() - 1) < 1e-12
    support = expected > 0
    assert observed[~support].sum() == 0  # b-min-sep never violated
    assert chisquare(observed[support], expected[support] * x.shape[0]).pvalue > 1e-4


def _exact_hockey_stick_2d(mech: BandMFMechanism, epsilon: float):
    """H(P||Q), H(Q||P) for n = 2 by integrating the enumerated mixture density on a fine grid."""
    c, p, sigma = np.asarray(mech.coefficients), mech.sampling_prob, mech.noise_multiplier
    grid = np.linspace(-8 * sigma, 8 * sigma + 3, 1201)
    h = grid[1] - grid[0]
    y1, y2 = np.meshgrid(grid, grid, indexing="ij")
    q = norm.pdf(y1, scale=sigma) * norm.pdf(y2, scale=sigma)
    dense = np.array([[c[0], 0.0], [c[1] if c.size > 1 else 0.0, c[0]]])
    pdens = np.zeros_like(q)
    for x in itertools.product((0, 1), repeat=2):
        px = _pattern_probability(x, c.size, p, mech.warm_start)
        mean = dense @ np.array(x, dtype=float)
        pdens += px * norm.pdf(y1, mean[0], sigma) * norm.pdf(y2, mean[1], sigma)
    a = math.exp(epsilon)
    return (np.maximum(pdens - a * q, 0).sum() * h * h, np.maximum(q - a * pdens, 0).sum() * h * h)


@pytest.mark.parametrize("b", [1, 2])
def test_monte_carlo_delta_matches_numerical_integration(b):
    """MC estimate within 5 standard errors of the integrated value (false-failure rate < 1e-6 per comparison)."""
    mech = BandMFMechanism(2, (1.0, 0.7)[:b], 0.3, 0.6)
    m = 100_000
    rng = np.random.default_rng(2024)
    remove = mech.privacy_loss_samples(rng, m, "remove")
    add = mech.privacy_loss_samples(rng, m, "add")
    for eps in (0.2, 1.0):
        want_remove, want_add = _exact_hockey_stick_2d(mech, eps)
        for losses, want in ((remove, want_remove), (add, want_add)):
            got = hockey_stick_estimate(losses, eps)
            terms = -np.expm1(np.minimum(eps - losses, 0.0))
            se = terms.std() / math.sqrt(m)
            assert abs(got - want) < 5 * se + 1e-5, (eps, got, want, se)
        assert max(want_remove, want_add) > 0.01  # the comparison is not vacuous


@pytest.mark.parametrize("sigma,b,p,warm", [(1.0, 4, 0.05, True), (0.25, 3, 0.3, True), (0.03, 2, 1.0, False),
                                            (0.6, 20, 0.1, True)])
def test_linear_recursion_with_rescaling_matches_log_space(sigma, b, p, warm):
    """The fast linear-space recursion (renormalised, with log-space fallback) equals the log-space recursion (which
    the enumeration tests pin) on long runs, including extreme losses (small sigma) that force the fallback."""
    from lightning_dpts.privacy.montecarlo import _column_terms, _linear_recursion, _log_space_recursion

    n, m = 400, 300
    c = np.linspace(1.0, 0.2, b)
    mech = BandMFMechanism(n, tuple(c), p, sigma, warm_start=warm)
    yt = np.ascontiguousarray(mech.sample_outputs(np.random.default_rng(3), m, "P").T)
    log_g = _column_terms(yt, c, sigma, 1.0)
    fast, bad = _linear_recursion(log_g, p, b, warm)
    slow = _log_space_recursion(log_g, p, b, warm)
    np.testing.assert_allclose(fast[~bad], slow[~bad], rtol=1e-9, atol=1e-9)
    full = mech.log_likelihood_ratio(yt.T)
    np.testing.assert_allclose(full, slow, rtol=1e-9, atol=1e-9)
    if sigma < 0.05:
        assert bad.any()  # the fallback path is exercised


@pytest.mark.parametrize("n,b,p,sigma,warm,r,s", [
    (7, 1, 0.3, 0.9, True, 1.0, 1.0), (70, 3, 0.3, 0.9, True, 1.0, 1.0), (100, 4, 0.05, 0.6, False, 1.0, 1.0),
    (333, 16, 0.02, 1.2, True, 1.0, 1.0), (50, 3, 0.4, 0.9, True, 0.3, 2.0), (40, 2, 0.3, 0.05, True, 1.0, 1.0),
    (200, 64, 0.01, 0.2, True, 1.0, 1.0), (90, 5, 0.2, 0.04, False, 0.5, 1.0), (5, 8, 0.1, 1.0, True, 1.0, 1.0)])
def test_blocked_pipeline_matches_reference_recursion(n, b, p, sigma, warm, r, s):
    """The time-blocked recursion used for sampling (h-form, matrix-product exponents, per-block log-space columns)
    equals the reference recursion of Theorem 5.1 (pinned by the enumeration tests) on the same outputs, including
    small sigma where columns leave linear space, several blocks, n < b, and leaks."""
    from lightning_dpts.privacy.montecarlo import _blocked_log_likelihood_ratio

    c = np.linspace(1.0, 0.2, b) / math.sqrt(b)
    mech = BandMFMechanism(n, tuple(c), p, sigma, warm_start=warm, leak_probability=r, sensitivity=s)
    m = 257
    y = np.random.default_rng(n + b).normal(0.3, 1.5 * sigma, size=(m, n))
    y[:5] += 3.0 * sigma  # some large losses
    yt = y.T.copy()

    def fill(out, t0, t1):
        out[...] = yt[t0:t1] / sigma

    got = _blocked_log_likelihood_ratio(mech, m, fill)
    want = log_likelihood_ratio(y, c, p, sigma, warm_start=warm, leak_probability=r, sensitivity=s)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)


class _NoNoise:
    """An rng whose Gaussian draws are 0: what the sampling pipeline adds to them is then the shift alone."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)

    def standard_normal(self, out):
        out[...] = 0.0

    def __getattr__(self, name):
        return getattr(self._rng, name)


@pytest.mark.parametrize("n,b,r", [(100, 4, 1.0), (75, 16, 1.0), (64, 3, 0.5)])
def test_blocked_sampling_places_the_shift_of_every_participation(n, b, r):
    """Under P, the rows the blocked sampler generates (across block boundaries) are (s/sigma) C x for the
    participation pattern x that the chain of Figure 1 draws from the same random stream."""
    from lightning_dpts.privacy.montecarlo import _blocked_log_likelihood_ratio

    c = np.linspace(1.0, 0.3, b)
    mech = BandMFMechanism(n, tuple(c), 0.2, 0.8, leak_probability=r, sensitivity=2.0)
    m = 300
    rows = np.full((n, m), np.nan)
    fill = mech._sampling_fill(_NoNoise(7), m, "P")

    def recording_fill(out, t0, t1):
        fill(out, t0, t1)
        rows[t0:t1] = out

    _blocked_log_likelihood_ratio(mech, m, recording_fill)
    x = mech.sample_participation(np.random.default_rng(7), m).astype(float)  # same stream, same draws
    dense = sum(np.diag(np.full(n - j, c[j]), -j) for j in range(b))
    np.testing.assert_allclose(rows, (2.0 / 0.8) * dense @ x.T, atol=1e-12)
    assert x.sum() > m  # participations exist, many cross block boundaries


def test_blocked_pipeline_log_space_columns_at_the_longest_rescaling_period():
    """At moderate sigma the pipeline rescales h only every K = 32 steps (per-step exponent bound 600/32 - ln 2);
    outputs with runs of huge values push some columns past that bound, so those blocks run in log space. The result
    still equals the reference recursion; at small sigma K falls back to max(8, b)."""
    from lightning_dpts.privacy.montecarlo import _blocked_log_likelihood_ratio, _column_terms, _rescale_period

    n, b, p, sigma = 300, 4, 0.05, 1.0
    c = np.linspace(1.0, 0.4, b)
    c /= np.linalg.norm(c)
    mech = BandMFMechanism(n, tuple(c), p, sigma)
    assert _rescale_period(mech) == 32
    assert _rescale_period(mech.with_noise_multiplier(0.1)) == 8
    assert _rescale_period(BandMFMechanism(n, tuple(np.full(40, 0.1)), p, 0.1)) == 40
    m = 200
    y = np.random.default_rng(8).normal(0.0, sigma, size=(m, n))
    y[:4, 40:44] += 40.0 * sigma  # one block with exponents ~ 40
    y[4:8, 60:290] += 50.0 * sigma  # many blocks in a row: ~ e^(8 x 90) per 32 steps, overflow without the fallback
    yt = y.T.copy()
    log_g = _column_terms(yt, c, sigma, 1.0) + math.log(p) - b * math.log1p(-p)
    assert np.all(log_g.max(axis=0)[:8] > 600 / 32 - math.log(2))  # the fallback is exercised
    assert np.all(log_g.max(axis=0)[8:] < 600 / 32 - math.log(2))  # ... and the linear path for the rest

    def fill(out, t0, t1):
        out[...] = yt[t0:t1] / sigma

    got = _blocked_log_likelihood_ratio(mech, m, fill)
    want = log_likelihood_ratio(y, c, p, sigma)
    assert np.all(np.isfinite(got)) and got[:4].min() > 50 and got[4:8].min() > 709
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)

"""BandMF streaming noise, strategy coefficients and the b-min-sep sampler."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from scipy.linalg import solve_triangular, sqrtm
from scipy.special import comb

from lightning_dpts.data.bminsep import BMinSepSampler, inclusion_rate, sampling_prob_for_rate
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.training.correlated_noise import (
    BandMFNoise,
    _objective_and_gradient,
    banded_sqrt_coefficients,
    inverse_coefficients,
    optimize_coefficients,
    prefix_sum_error,
)


def _dense(c: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros((n, n))
    for j, v in enumerate(c[:n]):
        out += np.diag(np.full(n - j, v), -j)
    return out


def test_streaming_noise_is_rows_of_c_inverse_z():
    c = np.array([0.8, 0.45, 0.3, 0.1])
    n, d = 25, 7
    noise = BandMFNoise(resolve_entropy(5), c)
    rows = torch.stack([noise.sample(d, 2.0, torch.float64) for _ in range(n)]).numpy()
    z = GaussianNoise(resolve_entropy(5), stream=(8,))
    zs = np.stack([z.sample(d, 1.0, torch.float64).numpy() for _ in range(n)])
    np.testing.assert_allclose(rows, 2.0 * solve_triangular(_dense(c, n), zs, lower=True), rtol=1e-10, atol=1e-12)
    assert noise.memory_bytes() == (c.size - 1) * d * 8
    with pytest.raises(ConfigurationError, match="numel"):
        noise.sample(d + 1, 1.0)


def test_noise_secrecy():
    """Attacker view: the noise is not a function of anything written; no state, no pickling, fresh each run."""
    c = banded_sqrt_coefficients(4)
    a, b = BandMFNoise(resolve_entropy(None), c), BandMFNoise(resolve_entropy(None), c)
    assert not torch.equal(a.sample(64, 1.0), b.sample(64, 1.0))
    assert not hasattr(a, "state_dict")
    with pytest.raises(TypeError):
        pickle.dumps(a)
    with pytest.raises(ConfigurationError):
        BandMFNoise(resolve_entropy(1), c, secure=True)  # a seeded secure run is refused
    s = BandMFNoise(resolve_entropy(None), c, secure=True)
    assert s.sample(16, 1.0).shape == (16,)


def test_banded_sqrt_coefficients():
    c = banded_sqrt_coefficients(6)
    raw = np.array([comb(2 * k, k) / 4**k for k in range(6)])
    np.testing.assert_allclose(c, raw / np.linalg.norm(raw))
    # with b = n the (unnormalised) strategy is exactly the square root of the prefix-sum matrix A
    n = 6
    root = _dense(raw, n)
    np.testing.assert_allclose(root @ root, np.tril(np.ones((n, n))), atol=1e-12)
    np.testing.assert_allclose(sqrtm(np.tril(np.ones((n, n)))).real, root, atol=1e-8)
    assert banded_sqrt_coefficients(1).tolist() == [1.0]


def test_prefix_sum_error_against_dense_matrices_and_gradient():
    c = np.array([0.7, 0.5, 0.3])
    n = 40
    a = np.tril(np.ones((n, n)))
    cinv = np.linalg.inv(_dense(c, n))
    np.testing.assert_allclose(inverse_coefficients(c, n), cinv[:, 0], atol=1e-12)
    want = np.dot(c, c) * np.linalg.norm(a @ cinv, "fro") ** 2 / n
    assert prefix_sum_error(c, n) == pytest.approx(want, rel=1e-10)
    assert prefix_sum_error([1.0], n) == pytest.approx((n + 1) / 2)
    _, grad = _objective_and_gradient(c, n)
    h = 1e-6
    fd = [(_objective_and_gradient(c + h * e, n)[0] - _objective_and_gradient(c - h * e, n)[0]) / (2 * h)
          for e in np.eye(3)]
    np.testing.assert_allclose(grad, fd, rtol=1e-5)


def test_optimiser_improves_on_default_and_dpsgd():
    n = 500
    res = optimize_coefficients(8, n)
    assert res.error < res.initial_error < prefix_sum_error([1.0], n)
    assert res.error == pytest.approx(prefix_sum_error(res.coefficients, n), rel=1e-9)
    assert np.all(res.coefficients >= 0) and np.linalg.norm(res.coefficients) == pytest.approx(1.0)
    assert 0 < res.iterations < 500  # converged before L-BFGS-B's iteration cap (work counted, not timed)
    assert optimize_coefficients(8, n, participations=3).error == pytest.approx(3 * res.error, rel=1e-6)


def test_sampler_min_separation_and_warm_start_rate():
    """Every step's inclusion rate is p0 = p/(1+(b-1)p) under warm start (5 s.d., false-failure < 1e-5)."""
    n_series, b, p0 = 20_000, 4, 0.1
    p = sampling_prob_for_rate(p0, b)
    assert inclusion_rate(p, b) == pytest.approx(p0)
    sampler = BMinSepSampler(n_series, b, p, resolve_entropy(3))
    last = np.full(n_series, -10**9)
    sd = math.sqrt(p0 * (1 - p0) / n_series)
    for t in range(30):
        idx = sampler.step(t)
        assert np.all(t - last[idx] >= b)  # b-min-sep property
        last[idx] = t
        assert abs(idx.size / n_series - p0) < 5 * sd, (t, idx.size)
    cold = BMinSepSampler(n_series, b, p, resolve_entropy(3), warm_start=False)
    first = cold.step(0).size / n_series
    assert abs(first - p) < 5 * math.sqrt(p * (1 - p) / n_series)  # Algorithm 1 starts at rate p, not p0


def test_sampler_refusals_and_secrecy():
    with pytest.raises(ConfigurationError, match="rate"):
        sampling_prob_for_rate(0.3, 4)  # p0 > 1/b
    s = BMinSepSampler(100, 2, 0.3, resolve_entropy(None))
    with pytest.raises(ConfigurationError, match="index"):
        s.step(1)
    with pytest.raises(TypeError):
        pickle.dumps(s)
    assert not hasattr(s, "state_dict")
    a = BMinSepSampler(1000, 2, 0.3, resolve_entropy(None))
    b = BMinSepSampler(1000, 2, 0.3, resolve_entropy(None))
    assert not np.array_equal(a.step(0), b.step(0))  # fresh entropy: different batches
    c = BMinSepSampler(1000, 2, 0.3, resolve_entropy(8))
    d = BMinSepSampler(1000, 2, 0.3, resolve_entropy(8))
    assert np.array_equal(c.step(0), d.step(0)) and c.seeded


def test_make_noise_seam():
    from lightning_dpts.training.correlated_noise import make_noise

    e = resolve_entropy(None)
    assert isinstance(make_noise("gaussian", e), GaussianNoise)
    band = make_noise("bandmf", e, bands=4)
    assert isinstance(band, BandMFNoise) and band.bands == 4
    np.testing.assert_allclose(band.coefficients, banded_sqrt_coefficients(4))
    with pytest.raises(ConfigurationError, match="noise"):
        make_noise("laplace", e)
    with pytest.raises(ConfigurationError, match="bands"):
        make_noise("gaussian", e, bands=3)
    with pytest.raises(ConfigurationError, match="coefficients"):
        make_noise("bandmf", e, bands=3, coefficients=[1.0, 0.5])


def test_sampler_replay_gives_the_same_batches():
    """A worker that skips steps (indices_at) sees exactly the batches of the sequential sampler."""
    seq = BMinSepSampler(500, 3, 0.2, resolve_entropy(4))
    batches = [seq.step(t) for t in range(12)]
    worker = BMinSepSampler(500, 3, 0.2, resolve_entropy(4))
    for t in (2, 5, 11):
        np.testing.assert_array_equal(worker.indices_at(t), batches[t])
    with pytest.raises(ConfigurationError, match="step"):
        worker.indices_at(3)

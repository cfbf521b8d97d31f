"""``secure_mode`` noise (issue 44): from a CSPRNG the OS seeds, computed in float64 and rounded once.

False-failure rates: the draws come from OpenSSL's CSPRNG (or ``os.urandom``) and cannot be seeded, so the
statistical checks below fail by chance with the probabilities stated at each (their total is below 1e-5). The
check of the arithmetic replaces the OS bytes by known ones and compares with an independent element-by-element
computation (``math``).
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

import lightning_dpts.randomness as randomness
from lightning_dpts.randomness import GaussianNoise, resolve_entropy, secure_standard_normal
from lightning_dpts.training import DPForecastStrategy

from .test_guarantee import SIGMA, _run


def test_secure_draws_are_standard_normal_at_the_requested_std():
    """Kolmogorov-Smirnov on 10^6 draws (false failure 1e-6); std of 10^6 float32 draws at std 0.3 within the
    chi-square 1e-6 two-sided interval (false failure 1e-6)."""
    z = secure_standard_normal(1_000_001)
    assert z.dtype == np.float64 and z.shape == (1_000_001,)
    assert stats.kstest(z, "norm").pvalue > 1e-6
    x = GaussianNoise(resolve_entropy(None), secure=True).sample(1_000_000, 0.3)
    assert x.dtype == torch.float32
    statistic = float((x.double() / 0.3).square().sum())
    assert stats.chi2.ppf(5e-7, x.numel()) <= statistic <= stats.chi2.ppf(1 - 5e-7, x.numel())
    assert secure_standard_normal(0).shape == (0,) and secure_standard_normal(1).shape == (1,)


def _reference(words: np.ndarray, n: int) -> np.ndarray:
    """Box-Muller on the 53-bit uniforms of ``words``, element by element with Python's float64 ``math``."""
    pairs = len(words) // 2
    u = [((int(w) & ((1 << 53) - 1)) + 0.5) * 2.0**-53 for w in words]
    out = [0.0] * (2 * pairs)
    for i in range(pairs):
        r = math.sqrt(-2.0 * math.log(u[i]))
        out[i] = r * math.cos(2.0 * math.pi * u[pairs + i])
        out[pairs + i] = r * math.sin(2.0 * math.pi * u[pairs + i])
    return np.array(out[:n])


def test_the_secure_draw_is_float64_box_muller_rounded_once(monkeypatch):
    """Known bytes in place of the OS's: float64 values as the independent computation gives them (to a few float64
    units: vectorised libm), and float32 noise that is their one rounding (the floating-point mitigation)."""
    rng = np.random.default_rng(0)
    calls: list[int] = []

    def fake_urandom(k: int) -> bytes:
        calls.append(k)
        return rng.integers(0, 2**63, size=k // 8, dtype=np.int64).tobytes()

    monkeypatch.setattr(randomness, "_csprng_bytes", fake_urandom)
    n = 1001
    before = rng.bit_generator.state
    z = secure_standard_normal(n)
    rng.bit_generator.state = before
    words = np.frombuffer(fake_urandom(16 * 501), dtype=np.uint64)
    np.testing.assert_allclose(z, _reference(words, n), rtol=1e-13, atol=1e-15)
    assert calls[0] == 16 * 501  # 8 bytes per value
    rng.bit_generator.state = before
    x = GaussianNoise(resolve_entropy(None), secure=True).sample(n, 0.7, torch.float32)
    once = torch.from_numpy(_reference(words, n) * 0.7).to(torch.float32)  # the exact value, rounded once
    ulps = (x.view(torch.int32).long() - once.view(torch.int32).long()).abs()
    assert int(ulps.max()) <= 1 and int((ulps > 0).sum()) <= 5  # a float64-unit libm difference may flip a rounding
    # float64 noise (no rounding follows): Opacus' sum of 4, i.e. 4 draws of 8 bytes per value
    calls.clear()
    y = GaussianNoise(resolve_entropy(None), secure=True).sample(n, 0.7, torch.float64)
    assert y.dtype == torch.float64 and calls == [16 * 501] * 4


def test_two_secure_fits_share_no_noise_and_nothing_can_replay_it():
    """Attacker: replay a secure fit exactly (weights, batches, configuration, torch's global seed) and compare the
    noise. With zero gradients the update is the noise (SGD, learning rate 1): the two fits' noise vectors are
    independent (correlation within the 1e-7 two-sided normal band: false failure 1e-7) and each has std sigma C
    (chi-square 1e-7 band each). The noise source holds no key, no generator and refuses to be pickled."""
    noises = []
    for _ in range(2):
        torch.manual_seed(0)
        strategy = DPForecastStrategy(SIGMA, 1.0, secure_mode=True)
        _, _, strategy, _, weights = _run(max_steps=3, strategy=strategy)
        noises.append(torch.cat(weights.noises()).double())
        assert strategy.noise.secure and strategy.noise._generator is None
        with pytest.raises(TypeError, match="must not be pickled"):
            pickle.dumps(strategy.noise)
        assert set(strategy.state_dict()) == {"noise_multiplier", "max_grad_norm", "ledger", "seeded"}
    a, b = noises
    n = a.numel()
    r = float((a * b).sum() / (a.norm() * b.norm()))
    assert abs(r) * math.sqrt(n) <= stats.norm.ppf(1 - 5e-8)
    for noise in noises:
        statistic = float((noise / SIGMA).square().sum())
        assert stats.chi2.ppf(5e-8, n) <= statistic <= stats.chi2.ppf(1 - 5e-8, n)


def test_the_secure_bytes_come_from_a_cryptographic_generator_the_os_seeds(monkeypatch):
    """OpenSSL's RAND_bytes where the ssl module exists, else os.urandom; two calls never repeat (a repeat of 16
    random bytes has probability 2^-128)."""
    import ssl

    assert randomness._RAND_bytes is ssl.RAND_bytes
    a, b = randomness._csprng_bytes(16), randomness._csprng_bytes(16)
    assert len(a) == 16 and a != b
    monkeypatch.setattr(randomness, "_RAND_bytes", None)
    urandom: list[int] = []
    monkeypatch.setattr(randomness.os, "urandom", lambda k: urandom.append(k) or bytes(k))
    assert randomness._csprng_bytes(24) == bytes(24) and urandom == [24]

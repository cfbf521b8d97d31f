"""Structured substitution at b = 1 (Poisson top level, leak probability r): attacks the adversary can realise.

docs/bandmf.md ("Beyond the paper") explains why the Monte Carlo accountant refuses ``leak_probability < 1``: the
fixed-direction pair of Theorem B.1 there is not proven to dominate structured training. These tests pin the
numbers that page quotes, computed independently of the package's accountants:

* an adversary who knows the code chooses, at every step, the clipped gradients (one dimension, norm <= 1) of the
  protected series' non-leaking window (w) and of its leaking window under the two datasets (a, a'); a series that
  is not sampled contributes exactly 0 (Poisson top level). Its delta is computed by numerical integration of the
  one-step privacy loss on a fine grid, rounded *down* onto the loss grid (so it is a lower bound of the attack's
  delta) and composed by convolution, including sequences that switch direction half-way;
* the package's sound Poisson-top-level bound (Theorem 4.4 through Lemma F.3, composed as one switching profile)
  must lie above every such attack: if the bound were too small (wrong rate, wrong shift) an attack would exceed it;
* the fixed-direction pair (Poisson rate p r, shift 2, max of both directions; dp_accounting) lies between them.
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy.stats import norm

from lightning_dpts.privacy import pld, profiles

N, P_TOP, R_LEAK, SIGMA = 60, 0.05, 0.3, 0.8
LOSS_GRID = 1e-3


def _loss_pmf(p_mix: list[tuple[float, float]], q_mix: list[tuple[float, float]]) -> tuple[int, np.ndarray]:
    """Privacy loss ln P/Q under y ~ P for 1-D Gaussian mixtures (mean, weight), rounded down onto LOSS_GRID."""
    y = np.linspace(-14 * SIGMA - 3, 14 * SIGMA + 3, 40_001)
    dens_p = sum(w * norm.pdf(y, m, SIGMA) for m, w in p_mix)
    dens_q = sum(w * norm.pdf(y, m, SIGMA) for m, w in q_mix)
    mass = dens_p / dens_p.sum()  # the tails beyond 14 sigma carry < 1e-40
    idx = np.floor((np.log(dens_p) - np.log(dens_q)) / LOSS_GRID).astype(np.int64)
    keep = mass > 1e-18  # dropping mass only lowers the attack's delta: still a lower bound
    idx, mass = idx[keep], mass[keep]
    return int(idx.min()), np.bincount(idx - idx.min(), weights=mass)


def _composed_delta(parts: list[tuple[tuple[int, np.ndarray], int]], eps: float) -> float:
    """delta(eps) of the composition of each one-step loss pmf with itself ``times`` times (one FFT per part)."""
    size = sum(times * (step.size - 1) for (_, step), times in parts) + 1
    length = 1 << int(np.ceil(np.log2(size)))
    spectrum = np.ones(length // 2 + 1, dtype=complex)
    for (_, step), times in parts:
        spectrum *= np.fft.rfft(step, length) ** times
    pmf = np.clip(np.fft.irfft(spectrum, length)[:size], 0.0, None)
    lo = sum(times * off for (off, _), times in parts)
    losses = (lo + np.arange(pmf.size)) * LOSS_GRID
    return float(np.sum(pmf * -np.expm1(np.minimum(eps - losses, 0.0))))


def _attacks() -> dict[str, tuple[int, np.ndarray]]:
    p, q = P_TOP, P_TOP * R_LEAK
    configs = {  # (P under D, P under D'): not sampled -> 0, non-leaking window -> w, leaking -> a / a'
        "w=-1,a=+1,a'=-1": ([(0.0, 1 - p), (-1.0, p * (1 - R_LEAK)), (1.0, q)], [(0.0, 1 - p), (-1.0, p)]),
        "w=0,a=+1,a'=-1": ([(0.0, 1 - q), (1.0, q)], [(0.0, 1 - q), (-1.0, q)]),
        "w=0,a=+1,a'=0": ([(0.0, 1 - q), (1.0, q)], [(0.0, 1.0)]),
    }
    out = {}
    for name, (d, d2) in configs.items():
        out[name] = _loss_pmf(d, d2)
        out[name + " reversed"] = _loss_pmf(d2, d)
    return out


@pytest.fixture(scope="module")
def attacks() -> dict[str, tuple[int, np.ndarray]]:
    return _attacks()


@pytest.mark.parametrize("eps", [0.5, 1.0])
def test_realisable_attacks_stay_below_the_sound_poisson_bound(attacks, eps: float) -> None:
    sound = pld.pld_from_profile(profiles.theorem_4_4(P_TOP, R_LEAK, SIGMA)).self_compose(N)
    bound = sound.get_delta_for_epsilon(eps)
    names = list(attacks)
    best = 0.0
    for i, first in enumerate(names):
        for second in names[i:]:  # constant strategies and one switch of strategy half-way
            best = max(best, _composed_delta([(attacks[first], N // 2), (attacks[second], N - N // 2)], eps))
    assert 0.0 < best < bound, (best, bound)
    # the gap docs/bandmf.md quotes (a proof for the structured case could win it back; none exists yet)
    assert best < 0.1 * bound


def test_fixed_direction_pair_lies_between_attacks_and_sound_bound(attacks) -> None:
    eps = 0.5
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(dp_accounting.PoissonSampledDpEvent(P_TOP * R_LEAK, dp_accounting.GaussianDpEvent(SIGMA / 2)), N)
    fixed = acc.get_delta(eps)
    sound = pld.pld_from_profile(profiles.theorem_4_4(P_TOP, R_LEAK, SIGMA)).self_compose(N).get_delta_for_epsilon(eps)
    best = max(_composed_delta([(step, N)], eps) for step in attacks.values())
    assert best < fixed < sound, (best, fixed, sound)
    assert fixed == pytest.approx(0.186, abs=0.002) and sound == pytest.approx(0.230, abs=0.002)

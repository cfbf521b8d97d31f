"""Series of different lengths (issue 9, item 8): the bound is the maximum over the lengths present.

The references share no code with lightning_dpts: window counts come from enumerating every window start of
a padded series, hockey-stick divergences from quadrature, composed epsilons from the x-space PLD of
tests/privacy/reference.py or from the Gaussian mechanism's closed form.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import ndtr

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import NeighbouringRelation, SamplingSpec, StructuredSubsamplingAccountant

from ..work import count_kernel_work
from . import reference as R

ISSUE_8A = dict(num_series=400, context_length=20, prediction_length=5, batch_size=80, instances_per_series=2,
                top_level="iteration", bottom_level="poisson")


def test_8a_poisson_bottom_level_is_not_decided_by_the_shortest_series():
    # A series of length 6 has T = 2 start positions; lambda = 2 samples both every epoch, so the protected
    # step (in both windows) moves the epoch's noisy sum by 2C in each direction: a Gaussian mechanism with
    # mean distance 4C and std 8C per epoch, composed over 100 steps / 10 steps per epoch = 10 epochs.
    spec = SamplingSpec(min_length=5, lengths=(5, 6, 5, 6), **ISSUE_8A)
    eps = StructuredSubsamplingAccountant(spec, 8.0).epsilon(100, 1e-5)
    want = R.gaussian_epsilon(1e-5, 4.0 / 8.0 * math.sqrt(10))
    assert want > 7.4
    assert want * (1 - 1e-6) <= eps <= want * 1.005, (eps, want)


def _opposed_hockey(k: int, r: float, sigma: float, alpha: float) -> float:
    return R.opposed_profile_quadrature(np.arange(k + 1), stats.binom.pmf(np.arange(k + 1), k, r), sigma, alpha)


def test_poisson_profile_is_the_pointwise_maximum_over_lengths():
    # Lengths 5, 9, 29: T = 1, 5, 25 -> (k, r) = (1, 1), (5, 2/5), (25, 2/25); none dominates the others.
    spec = SamplingSpec(min_length=5, lengths=(29, 9, 5), **ISSUE_8A)
    profile = StructuredSubsamplingAccountant(spec, 2.0).profile
    members = [(1, 1.0), (5, 0.4), (25, 0.08)]
    for alpha in (0.5, 2.0, 20.0):
        want = max(_opposed_hockey(k, r, 2.0, alpha) for k, r in members)
        got = float(profile(alpha)[0])
        assert abs(got - want) <= 1e-7 + 1e-5 * want, (alpha, got, want)
    # and the composed epsilon is at least that of the (1, 1) member: a Gaussian with distance 2C, std 2C
    eps = StructuredSubsamplingAccountant(spec, 2.0).epsilon(30, 1e-5)  # 3 epochs
    assert eps >= R.gaussian_epsilon(1e-5, 1.0 * math.sqrt(3)) * (1 - 1e-6)


def _leak_probability_by_enumeration(length: int, lc: int, lf: int, sc: float, sf: float, rho: float) -> float:
    """max over the changed step's position of rho * E[TVD] over a uniform window start (padded series)."""
    tau_c = 1.0 if sc == 0 else 2 * ndtr(1 / (2 * sc)) - 1
    tau_f = 1.0 if sf == 0 else 2 * ndtr(1 / (2 * sf)) - 1
    starts = length - lf + 1
    worst = 0.0
    for t in range(lc, lc + length):  # 0-based padded index of the changed step
        total = 0.0
        for s in range(starts):
            if s <= t < s + lc:
                total += tau_c
            elif s + lc <= t < s + lc + lf:
                total += tau_f
        worst = max(worst, total)
    return rho * worst / starts


def test_8b_augmentation_with_larger_forecast_noise_takes_the_worst_length():
    rel = NeighbouringRelation(value_bound=1.0)
    lengths = (5, 12, 29, 31, 60, 400)
    spec = SamplingSpec(num_series=400, min_length=5, lengths=lengths, context_length=20, prediction_length=5,
                        batch_size=32, relation=rel, context_noise=0.0, forecast_noise=10.0)
    p2 = max(_leak_probability_by_enumeration(L, 20, 5, 0.0, 10.0, 32 / 400) for L in lengths)
    shortest = _leak_probability_by_enumeration(5, 20, 5, 0.0, 10.0, 32 / 400)
    assert p2 > 10 * shortest  # the shortest series is far from the worst one here
    eps = StructuredSubsamplingAccountant(spec, 1.0).epsilon(300, 1e-5)
    want = R.switching_pld([0, 2], [1 - p2, p2], 1.0, h=1e-3, n_x=200_001).compose(300).epsilon(1e-5)
    assert want > 40
    assert abs(eps - want) <= 0.01 * want and eps >= want * (1 - 1e-4), (eps, want)


def test_with_replacement_shortest_series_decides():
    base = dict(num_series=200, context_length=10, prediction_length=4, batch_size=20, instances_per_series=2,
                top_level="without_replacement")
    mixed = SamplingSpec(min_length=8, lengths=(8, 9, 30, 500), **base)
    short = SamplingSpec(min_length=8, **base)
    a, b = StructuredSubsamplingAccountant(mixed, 1.5), StructuredSubsamplingAccountant(short, 1.5)
    alphas = np.array([0.2, 1.0, 3.0, 30.0])
    assert np.allclose(a.profile(alphas), b.profile(alphas), rtol=0, atol=0)
    for length in (9, 30, 500):  # each longer series alone is below, as the monotonicity proof says
        other = StructuredSubsamplingAccountant(SamplingSpec(min_length=length, **base), 1.5)
        assert np.all(other.profile(alphas) <= b.profile(alphas) + 1e-15)


@pytest.mark.slow  # 6-8 s; the fast suite checks the pointwise maximum over lengths above
def test_many_distinct_lengths_stay_cheap_and_dominate_every_member(monkeypatch):
    """2995 distinct lengths: the monotonicity reduction builds the profile of a few lengths, not of each (work
    counted, not timed: per-length specs and FFT calls; measured, Nov 2026: 1 and 1)."""
    lengths = tuple(range(5, 3000))
    geometry = {**ISSUE_8A, "context_length": 100}
    spec = SamplingSpec(min_length=5, lengths=lengths, **geometry)
    work = count_kernel_work(monkeypatch)
    work.wrap(monkeypatch, SamplingSpec, "at_length")
    acc = StructuredSubsamplingAccountant(spec, 6.0)
    eps = acc.epsilon(100, 1e-5)
    assert work.calls["at_length"] <= 10 and work.calls["rfft"] <= 4, dict(work.calls)
    monkeypatch.undo()
    for length in (6, 50, 106, 2000):
        single = StructuredSubsamplingAccountant(SamplingSpec(min_length=length, **geometry), 6.0)
        assert eps >= single.epsilon(100, 1e-5) * (1 - 1e-9)


@pytest.mark.parametrize("lengths", [(), (4, 5), (6, 7), ("5",), (5.0,), 5])
def test_lengths_are_validated(lengths):
    with pytest.raises(ConfigurationError) as err:
        SamplingSpec(min_length=5, lengths=lengths, **ISSUE_8A)
    assert err.value.parameter == "lengths"


def test_lengths_are_deduplicated_and_sorted():
    spec = SamplingSpec(min_length=5, lengths=[9, 5, 9, np.int64(7)], **ISSUE_8A)
    assert spec.lengths == (5, 7, 9)
    # exactly one length stays a length (issue 26: lengths=None now means "at least min_length")
    assert SamplingSpec(min_length=5, lengths=(5, 5), **ISSUE_8A).lengths == (5,)

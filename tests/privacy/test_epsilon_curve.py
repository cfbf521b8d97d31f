"""The epsilon curve (issue 26, item 3): the per-step table AccountantCallback logs from and report.json publishes.

Against an independent computation: the closed-form composition of the Gaussian mechanism at every count
(soundness: no value below the true epsilon of any count it stands for). Against the accountant's own
``epsilon_after`` at sampled counts of configurations that take each of the curve's paths (coarse grid,
refined grid, the level boundary below FINE_DELTA, per-epoch units): every logged value within 1% above.
Deterministic (no randomness): no false failures.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import pytest

from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.privacy import curve as C
from lightning_dpts.privacy.accountant import FINE_DELTA
from lightning_dpts.privacy.pld import Composition, epsilon_from_pld, epsilons_from_pmfs

from . import reference as R

FULL = SamplingSpec(num_series=10, min_length=6, context_length=5, prediction_length=2, batch_size=10)
DEMO = SamplingSpec(num_series=145, min_length=309, context_length=24, prediction_length=12, batch_size=64,
                    lengths=(309, 369, 477, 525, 621, 693, 729, 777, 825, 921))
TRAFFIC = dict(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256)


def _read(curve: list[tuple[int, float]], count: int) -> float:
    """The value logged after ``count`` compositions: the first point at or beyond it."""
    counts = [c for c, _ in curve]
    return curve[bisect.bisect_left(counts, count)][1]


def _check_shape(curve: list[tuple[int, float]], start: int, last: int, rtol: float = 0.01) -> None:
    counts = [c for c, _ in curve]
    assert counts[0] == start and counts[-1] == last and counts == sorted(set(counts))
    for (a, ea), (b, eb) in zip(curve, curve[1:], strict=False):
        assert b == a + 1 or eb <= (1 + rtol) * ea, (a, ea, b, eb)


@pytest.mark.parametrize("mu,delta", [(1.0, 1e-6), (2.0, 1e-7), (0.5, 1e-12)])
def test_gaussian_curve_bounds_the_closed_form_at_every_count(mu, delta):
    """Every count 1..2000 of a Gaussian mechanism (mu-GDP after the last count): the logged value is never below
    the closed form (sound) and within 1% (plus the accountant's own 0.1%) above it."""
    last = 2000
    sigma = 2.0 * math.sqrt(last) / mu  # each step: a Gaussian mechanism with sensitivity 2 (rho = 1, q = 1)
    curve = list(StructuredSubsamplingAccountant(FULL, sigma).epsilon_curve(last, delta))
    _check_shape(curve, 1, last)
    for count in range(1, last + 1):
        want = R.gaussian_epsilon(delta, 2.0 * math.sqrt(count) / sigma)
        got = _read(curve, count)
        assert want * (1 - 1e-9) <= got <= want * 1.01 * 1.001, (count, got, want)


CASES = {
    # name: (spec, sigma, delta, last): which path of the curve it takes
    "demo, fine level (delta < FINE_DELTA)": (DEMO, 10.760956208429903, 1e-7, 400),
    "demo, coarse level (delta >= FINE_DELTA)": (DEMO, 10.760956208429903, 1e-5, 400),
    "demo, at the level boundary": (DEMO, 10.760956208429903, 0.99 * FINE_DELTA, 400),
    "demo, tiny delta": (DEMO, 6.0, 1e-12, 300),
    "iteration top level (per-epoch units)": (SamplingSpec(**{**TRAFFIC, "top_level": "iteration"}), 2.0, 1e-7, 12),
    "traffic, Poisson bottom level": (SamplingSpec(**TRAFFIC, bottom_level="poisson"), 5.0, 1e-7, 3000),
}


SLOW_CASES = {"demo, tiny delta", "traffic, Poisson bottom level"}  # the same paths as the demo cases, longer


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_CASES else n for n in CASES])
def test_curve_is_within_one_percent_above_the_accountant(name):
    spec, sigma, delta, last = CASES[name]
    curve = list(StructuredSubsamplingAccountant(spec, sigma).epsilon_curve(last, delta))
    _check_shape(curve, 1, last)
    exact = StructuredSubsamplingAccountant(spec, sigma)  # a fresh one: no cache shared with the curve
    counts = sorted({1, 2, 3, last, *np.unique(np.geomspace(1, last, 40).astype(int)).tolist(),
                     *[c + 1 for c, _ in curve[:-1]]})  # every point and the count just after it (the widest gap)
    for count in counts:
        want = exact.epsilon_after(count, delta)
        got = _read(curve, count)
        assert want * (1 - 1e-9) <= got <= 1.01 * want, (count, got, want)


def test_the_level_boundary_is_composed_where_it_decides(monkeypatch):
    """Just below FINE_DELTA the coarse level at FINE_DELTA can exceed the fine level at delta; the curve then
    composes both (and takes the larger), as the accountant does; far below it, the fine level alone."""
    acc = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    built: list[tuple[int, float, int | None]] = []
    original = C._Level.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append((self.level, self.delta, kwargs.get("grid")))

    monkeypatch.setattr(C._Level, "__init__", spy)
    list(acc.clone().epsilon_curve(200, 0.999 * FINE_DELTA))
    assert (0, FINE_DELTA, None) in built  # composed in full
    built.clear()
    list(acc.clone().epsilon_curve(200, 1e-7))
    assert (0, FINE_DELTA, None) not in built  # only probed
    assert any(level == 0 and grid is not None for level, _, grid in built)


def test_the_table_grid_is_coarser_than_the_accountants_and_its_excess_is_measured():
    acc = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    level = C._Level(acc, 1, 1e-7, 400, 0.0025)
    assert level.grid is not None and level.grid < 0  # at least 2x coarser than the unit's own grid
    assert 0 <= level.excess <= 0.0025
    coarse = level._on(level.grid, [400])[400]
    assert coarse == pytest.approx((1 + level.excess) * level.exact(400), rel=1e-12)


def test_rtol_below_one_percent_is_kept():
    acc = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    curve = list(acc.epsilon_curve(400, 1e-7, rtol=0.002))
    _check_shape(curve, 1, 400, rtol=0.002)
    exact = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    for count in (5, 50, 123, 399, 400):
        assert exact.epsilon_after(count, 1e-7) * (1 - 1e-9) <= _read(curve, count) <= 1.002 * exact.epsilon_after(
            count, 1e-7)


def test_a_resumed_run_starts_the_curve_at_its_first_count():
    acc = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    curve = list(acc.epsilon_curve(400, 1e-7, start=150))
    _check_shape(curve, 150, 400)
    full = dict(StructuredSubsamplingAccountant(DEMO, 10.760956208429903).epsilon_curve(400, 1e-7))
    assert curve[-1][1] == pytest.approx(full[400], rel=1e-12)


def test_batched_compositions_match_one_at_a_time():
    """Composition.power_rows (the curve's batches) against power_pmf one count at a time: the same pmf up to
    FFT round-off, zero outside each count's own range, the same epsilon."""
    acc = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    for tilt in (0.0, 2.0):
        comp = Composition(acc._unit(1, 0), 1e-22, tilt)
        counts = np.array([2, 3, 17, 90, 91, 400])
        size = comp.fft_size(400)
        lower, rows, inf_masses = comp.power_rows(counts, size=size)
        for row, n, inf_mass in zip(rows, counts, inf_masses, strict=True):
            lo, pmf, inf_one = comp.power_pmf(int(n), size=size)
            own = row[lo - lower: lo - lower + pmf.size]
            np.testing.assert_allclose(own, pmf, rtol=1e-12, atol=0)
            assert row.sum() == pytest.approx(own.sum(), rel=1e-15) and inf_mass == inf_one
            batch_eps = epsilons_from_pmfs(comp.h, lower, row[None, :], np.array([inf_mass]), 1e-7)[0]
            assert batch_eps == pytest.approx(epsilon_from_pld(comp.power(int(n), size=size), 1e-7), rel=1e-12)


def test_the_spectrum_bins_left_out_are_accounted():
    """power_rows leaves out bins with n log|W| < -100 and adds their largest effect to the bound: the pmf is never
    below the one computed over every bin (numpy's own complex power, summed in full)."""
    from scipy import fft as sfft

    acc = StructuredSubsamplingAccountant(DEMO, 10.760956208429903)
    comp = Composition(acc._unit(1, 0), 1e-22, 0.0)
    for n in (50, 400):
        size = comp.fft_size(n)
        lo, pmf, _ = comp.power_pmf(n, size=size)
        spectrum = sfft.rfft(comp.probs / comp.probs.sum(), size) ** n  # every bin, no cut
        full = sfft.irfft(spectrum, size) * math.exp(n * comp.log_z)
        index = (np.arange(lo, lo + pmf.size) - n * comp.lower) % size
        assert np.all(pmf >= np.maximum(full[index], 0.0) - 1e-15)


@pytest.mark.parametrize("sigma", [5.0, 20.0])
def test_ten_thousand_step_traffic_plans(sigma):
    """The benchmark's traffic plans (benchmarks/accountant.py --train-start), sampled counts."""
    spec = SamplingSpec(**TRAFFIC)
    last, delta = 10_000, 1e-7
    curve = list(StructuredSubsamplingAccountant(spec, sigma).epsilon_curve(last, delta))
    _check_shape(curve, 1, last)
    exact = StructuredSubsamplingAccountant(spec, sigma)
    for count in sorted({1, 2, 10, 99, 1000, 4321, 9999, last, *[c + 1 for c, _ in curve[-30:-1]]}):
        want = exact.epsilon_after(count, delta)
        assert want * (1 - 1e-9) <= _read(curve, count) <= 1.01 * want, count


def test_electricity_like_refined_grid():
    """N = 321, L = 21000, sigma = 2 (issue 26, item 1): the accountant refines its grid beyond the unit's at
    10^4 steps; the curve follows it there and stays within 1%."""
    spec = SamplingSpec(num_series=321, min_length=21000, context_length=24, prediction_length=24, batch_size=128)
    last, delta = 10_000, 1e-7
    acc = StructuredSubsamplingAccountant(spec, 2.0)
    curve = list(acc.epsilon_curve(last, delta))
    _check_shape(curve, 1, last)
    exact = StructuredSubsamplingAccountant(spec, 2.0)
    for count in (2, 100, 2500, 7000, last):
        want = exact.epsilon_after(count, delta)
        assert want * (1 - 1e-9) <= _read(curve, count) <= 1.01 * want, count

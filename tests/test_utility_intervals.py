"""benchmarks/utility_intervals.py: its per-forecast terms give the package's pooled metrics, and its series
bootstrap's point estimates and intervals behave as a percentile bootstrap over series must."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_dpts.evaluation import score_windows, seasonal_errors
from lightning_dpts.metrics import DEFAULT_QUANTILES

LEVELS = np.asarray(DEFAULT_QUANTILES)


@pytest.fixture
def intervals(benchmark_script):
    return benchmark_script("utility_intervals")


def _forecasts(rng, n: int, h: int, shift: float = 0.0):
    histories = [50 + rng.normal(0, 5, size=int(rng.integers(30, 60))).cumsum() for _ in range(n)]
    labels = [hist[-1] + rng.normal(0, 3, size=h) for hist in histories]
    spread = np.asarray([-1.28, -0.84, -0.52, -0.25, 0.0, 0.25, 0.52, 0.84, 1.28]) * 3
    quantiles = [np.full(h, hist[-1] + shift)[:, None] + spread[None, :] for hist in histories]
    return histories, labels, quantiles


def test_the_per_forecast_terms_pool_to_the_package_metrics(intervals):
    """CRPS = sum num / sum den and MASE = mean of the terms equal score_windows' (an independent implementation:
    GluonTS' weighted quantile loss in torch), with missing labels left out."""
    rng = np.random.default_rng(3)
    histories, labels, quantiles = _forecasts(rng, 40, 6)
    labels[3][2] = np.nan
    season = 1
    num, den, mase = intervals.per_forecast(quantiles, labels, np.asarray(seasonal_errors(histories, season)), LEVELS)
    pooled = score_windows(quantiles, labels, histories, [0] * 40, season)
    assert num.sum() / den.sum() == pytest.approx(pooled["crps"], rel=1e-9)
    assert np.nanmean(mase) == pytest.approx(pooled["mase"], rel=1e-9)


def test_the_series_bootstrap_point_is_the_pooled_ratio_and_its_interval_is_around_it(intervals):
    rng = np.random.default_rng(5)
    histories, labels, good = _forecasts(rng, 60, 6)
    _, _, bad = _forecasts(np.random.default_rng(5), 60, 6, shift=4.0)
    scales = np.asarray(seasonal_errors(histories, 1))
    terms = {"private0": intervals.per_forecast(good, labels, scales, LEVELS),
             "twin0": intervals.per_forecast(good, labels, scales, LEVELS),
             "naive": intervals.per_forecast(bad, labels, scales, LEVELS)}
    owner = np.repeat(np.arange(20), 3)  # three windows per series
    out = intervals.series_bootstrap(terms, owner, ["private0"], ["twin0"], ["naive"], resamples=500)
    num, den, mase = terms["private0"]
    bnum, bden, bmase = terms["naive"]
    assert out["CRPS private/best"][0] == pytest.approx((num.sum() / den.sum()) / (bnum.sum() / bden.sum()))
    assert out["MASE private/best"][0] == pytest.approx(np.nanmean(mase) / np.nanmean(bmase))
    for key, (point, low, high) in out.items():
        assert low <= point <= high, key
    # the same forecasts as the twin: every resample gives exactly 1
    assert out["CRPS private/twin"] == (1.0, 1.0, 1.0) and out["MASE private/twin"] == (1.0, 1.0, 1.0)
    # better forecasts than the baseline in every window: the whole interval below 1
    assert out["CRPS private/best"][2] < 1.0 and out["MASE private/best"][2] < 1.0


def test_the_bootstrap_resamples_whole_series(intervals):
    """All windows of a series move together: with one series that carries every error of the private model, a
    resample without it has ratio 0, so the interval reaches 0; resampling windows instead would keep it above."""
    n = 40
    num = np.zeros(n)
    num[:4] = 1.0  # series 0 (windows 0-3) holds all of the private model's loss
    terms = {"private0": (num, np.ones(n), num.copy()), "twin0": (np.ones(n), np.ones(n), np.ones(n)),
             "naive": (np.ones(n), np.ones(n), np.ones(n))}
    owner = np.repeat(np.arange(10), 4)
    out = intervals.series_bootstrap(terms, owner, ["private0"], ["twin0"], ["naive"], resamples=2000)
    point, low, _ = out["CRPS private/best"]
    assert point == pytest.approx(0.1)
    # P(series 0 left out of a resample of 10) = 0.9^10 = 0.35 > 0.05: the 5% quantile is exactly 0
    assert low == 0.0

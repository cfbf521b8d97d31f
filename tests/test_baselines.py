"""Issue 37: the yardstick's baselines (seasonal naive with calibrated intervals, AutoETS, AutoTheta), the protocols,
the season check and the memo of the statsforecast forecasts."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from scipy.stats import norm

from lightning_dpts import baselines as bl
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.evaluation import check_season, protocol_windows, score_windows

HAS_STATSFORECAST = importlib.util.find_spec("statsforecast") is not None
needs_statsforecast = pytest.mark.skipif(not HAS_STATSFORECAST, reason="optional statsforecast not installed")
LEVELS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def test_seasonal_naive_quantiles_by_hand():
    """m = 3, history 1..7 plus a spike: point = the last season repeated; sigma = RMS of y_t - y_{t-3}; the spread
    grows with sqrt(k + 1), k = whole seasons ahead (FPP3 table 5.2)."""
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 9.0, 7.0])
    q = bl.seasonal_naive_quantiles(y, 5, 3, LEVELS)
    diffs = np.array([4 - 1, 5 - 2, 9 - 3, 7 - 4], dtype=float)
    sigma = np.sqrt(np.mean(diffs ** 2))
    point = np.array([5.0, 9.0, 7.0, 5.0, 9.0])
    k = np.array([0, 0, 0, 1, 1])
    expected = point[:, None] + (sigma * np.sqrt(k + 1))[:, None] * norm.ppf(LEVELS)[None, :]
    np.testing.assert_allclose(q, expected, rtol=1e-12)
    np.testing.assert_allclose(q[:, 4], point)  # the median is GluonTS's seasonal naive point forecast


def test_seasonal_naive_quantiles_short_missing_and_empty_histories():
    # a history not longer than m: naive (m = 1) on the last value, spread from the one-step differences
    q = bl.seasonal_naive_quantiles([2.0, 4.0], 2, 12, LEVELS)
    np.testing.assert_allclose(q[:, 4], [4.0, 4.0])
    np.testing.assert_allclose(q[1, -1] - q[1, 4], 2.0 * np.sqrt(2) * norm.ppf(0.9))
    # a missing value: interpolated for the point forecast, left out of the residuals
    q = bl.seasonal_naive_quantiles([1.0, 1.0, np.nan, 1.0, 1.0, 1.0], 2, 2, LEVELS)
    np.testing.assert_allclose(q, np.ones((2, 9)))
    assert bl.seasonal_naive_quantiles([], 3, 2, LEVELS).shape == (3, 9)
    with pytest.raises(ConfigurationError, match="season_length"):
        bl.seasonal_naive_quantiles([1.0, 2.0], 2, 0)


def test_seasonal_naive_intervals_are_calibrated_on_a_seasonal_random_walk():
    """Where seasonal naive is the true model (y_t = y_{t-m} + e_t, e ~ N(0, s^2)), the 10-90% interval covers 80%
    at every horizon. 4,000 independent series, one scored step each (horizons cycling 1..2m): the coverage is a
    mean of 4,000 Bernoulli(0.8) (sd 0.0063; the sigma estimated from 240 differences moves it by < 0.005), so the
    bound of 0.03 fails with probability < 1e-5."""
    rng = np.random.default_rng(20240607)
    m, n, horizon, count = 12, 252, 24, 4000
    inside = 0
    for i in range(count):
        e = rng.normal(0.0, 3.0, size=n + horizon)
        y = np.empty(n + horizon)
        y[:m] = rng.normal(0.0, 10.0, size=m)
        for t in range(m, n + horizon):
            y[t] = y[t - m] + e[t]
        q = bl.seasonal_naive_quantiles(y[:n], horizon, m, LEVELS)
        h = i % horizon
        inside += q[h, 0] <= y[n + h] <= q[h, -1]
    assert abs(inside / count - 0.8) < 0.03


@needs_statsforecast
@pytest.mark.parametrize("method", ["autoets", "autotheta"])
def test_statsforecast_quantiles_read_the_models_own_intervals(method):
    """Quantile q is the end of statsforecast's central (100|2q - 1|)% interval, checked against a direct call."""
    from statsforecast.models import AutoETS, AutoTheta

    rng = np.random.default_rng(1)
    y = 50 + 5 * np.sin(np.arange(96) * 2 * np.pi / 12) + rng.normal(0, 1, 96)
    q = bl.statsforecast_quantiles(method, y, 6, 12, LEVELS)
    model = (AutoETS if method == "autoets" else AutoTheta)(season_length=12)
    direct = model.forecast(y=y, h=6, level=[60, 80])
    np.testing.assert_allclose(q[:, 0], direct["lo-80"], rtol=1e-6)
    np.testing.assert_allclose(q[:, 1], direct["lo-60"], rtol=1e-6)
    np.testing.assert_allclose(q[:, 4], direct["mean"], rtol=1e-6)
    np.testing.assert_allclose(q[:, 8], direct["hi-80"], rtol=1e-6)
    assert np.all(np.diff(q, axis=1) >= 0)


@needs_statsforecast
def test_baseline_quantiles_fall_back_to_seasonal_naive_and_memoise():
    rng = np.random.default_rng(2)
    long = 10 + np.cumsum(rng.normal(size=60))
    histories = [long, np.array([1.0, 2.0, 3.0])]  # statsforecast refuses 3 values ("tiny datasets")
    cache = bl.BaselineCache()
    out = bl.baseline_quantiles(histories, 4, 2, cache=cache)
    assert set(out.forecasts) == {"seasonal_naive", "autoets", "autotheta"} and out.skipped is None
    assert out.fallbacks == {"autoets": 1, "autotheta": 1}
    np.testing.assert_allclose(out.forecasts["autoets"][1], out.forecasts["seasonal_naive"][1])
    assert not np.allclose(out.forecasts["autoets"][0], out.forecasts["seasonal_naive"][0])
    assert len(cache) == 4 and cache.misses == 4 and cache.hits == 0
    again = bl.baseline_quantiles(histories, 4, 2, cache=cache)  # every fit from the memo, failures included
    assert cache.hits == 4 and again.fallbacks == out.fallbacks
    np.testing.assert_array_equal(again.forecasts["autotheta"][0], out.forecasts["autotheta"][0])
    other = bl.baseline_quantiles([long + 1e-9], 4, 2, cache=cache)  # a different history is a different key
    assert cache.misses == 6 and not np.array_equal(other.forecasts["autoets"][0], out.forecasts["autoets"][0])


def test_baseline_cache_round_trips_through_a_file(tmp_path):
    cache = bl.BaselineCache()
    key = bl.BaselineCache.key("autoets", np.arange(5.0), 3, 2, np.asarray(LEVELS))
    cache.put(key, np.ones((3, 9)))
    cache.save(tmp_path / "c.npz")
    loaded = bl.BaselineCache()
    assert loaded.load(tmp_path / "c.npz") == 1 and loaded.load(tmp_path / "missing.npz") == 0
    np.testing.assert_array_equal(loaded.get(key), np.ones((3, 9)))
    small = bl.BaselineCache(max_entries=2)
    for i in range(3):
        small.put(str(i), np.zeros(1))
    assert len(small) == 2 and "0" not in small


def test_statsforecast_baselines_skipped_with_the_reason(monkeypatch):
    out = bl.baseline_quantiles([np.arange(30.0)], 3, 7, statsforecast=False)
    assert set(out.forecasts) == {"seasonal_naive"} and "--no-baselines" in out.skipped
    monkeypatch.setattr(bl, "statsforecast_available", lambda: False)
    out = bl.baseline_quantiles([np.arange(30.0)], 3, 7)
    assert set(out.forecasts) == {"seasonal_naive"} and "pip install 'lightning-dpts[baselines]'" in out.skipped


def test_best_baseline_ignores_the_models_and_nan():
    metrics = {"dp": {"crps": 0.001}, "non_dp": {"crps": 0.0001}, "seasonal_naive": {"crps": 0.05},
               "autoets": {"crps": float("nan")}, "autotheta": {"crps": 0.04}}
    assert bl.best_baseline(metrics, "crps") == ("autotheta", 0.04)
    assert bl.best_baseline({"dp": {"crps": 1.0}}, "crps") is None


def test_score_windows_coverage_and_protocols():
    y = [np.array([1.0, 5.0, np.nan]), np.array([0.0, 2.0, 2.0])]
    q = [np.tile([0.0, 1.0, 2.0], (3, 1)), np.tile([1.0, 1.5, 2.0], (3, 1))]  # levels (0.1, 0.5, 0.9)
    out = score_windows(q, y, [np.arange(5.0)] * 2, [0, 1], season=1, levels=(0.1, 0.5, 0.9))
    assert out["coverage"] == pytest.approx(3 / 5)  # 1 in, 5 out, nan skipped; 0 out, 2 and 2 in (bounds count)
    assert protocol_windows([0, 1, 2, 0, 1, 2], "rolling") == [0, 1, 2, 3, 4, 5]
    assert protocol_windows([0, 1, 2, 0, 1, 2], "last") == [2, 5]
    with pytest.raises(ConfigurationError, match="evaluation"):
        protocol_windows([0], "first")


def test_check_season_names_the_option_and_the_reason():
    check_season(7, 8, context_length=8)
    with pytest.raises(ConfigurationError, match="season_length=8: must be shorter than the shortest series'"):
        check_season(8, 8)
    with pytest.raises(ConfigurationError, match="past window context_length=7"):
        check_season(7, 100, context_length=7)
    with pytest.raises(ConfigurationError, match="season_length"):
        check_season(0, 100)


def test_baseline_subset_is_a_fixed_function_of_the_counts():
    assert bl.baseline_subset(50, 120) is None and bl.baseline_subset(500, 0) is None
    assert bl.baseline_subset(500, None) is None
    a = bl.baseline_subset(580, 120)
    assert a == bl.baseline_subset(580, 120) and len(a) == 120 == len(set(a)) and a == sorted(a)
    assert 0 <= a[0] and a[-1] < 580
    # uniform: over many counts, early and late windows are picked alike (the last rolling windows are not favoured)
    picks = np.concatenate([bl.baseline_subset(n, n // 4) for n in range(400, 800, 7)])
    late = np.concatenate([np.asarray(bl.baseline_subset(n, n // 4)) >= n // 2 for n in range(400, 800, 7)])
    assert abs(late.mean() - 0.5) < 0.03 and len(picks) > 5000  # sd ~0.007: a 4-sd band
    with pytest.raises(ConfigurationError, match="baseline_windows"):
        bl.baseline_subset(10, -1)


def test_capped_baselines_fit_only_the_subsample(monkeypatch):
    calls = []

    def fake(method, history, horizon, season, levels=None):
        calls.append(method)
        return np.full((horizon, len(LEVELS)), float(len(history)))

    monkeypatch.setattr(bl, "statsforecast_available", lambda: True)
    monkeypatch.setattr(bl, "statsforecast_quantiles", fake)
    histories = [np.arange(20.0 + i) for i in range(10)]
    out = bl.baseline_quantiles(histories, 3, 2, cache=bl.BaselineCache(), max_windows=4)
    assert out.subset == bl.baseline_subset(10, 4) and len(calls) == 8
    assert len(out.forecasts["seasonal_naive"]) == 10 and len(out.forecasts["autoets"]) == 4
    for i, q in zip(out.subset, out.forecasts["autotheta"], strict=True):  # aligned with the subset, in order
        assert q[0, 0] == 20.0 + i


def test_score_paired_compares_every_model_on_the_baselines_windows():
    from gluonts.model.forecast import QuantileForecast

    from lightning_dpts.app.scoring import score_paired

    rng = np.random.default_rng(0)
    n, h = 12, 3
    keys = [str(q) for q in LEVELS]
    start = __import__("pandas").Period("2020-01", freq="M")

    def fc(value):
        return QuantileForecast(np.full((len(LEVELS), h), value), start_date=start, forecast_keys=keys)

    labels = [rng.normal(size=h) for _ in range(n)]
    inputs = [{"target": rng.normal(size=20), "start": start} for _ in range(n)]
    subset = [1, 4, 7]
    preds = {"dp": [fc(0.0) for _ in range(n)], "seasonal_naive": [fc(1.0) for _ in range(n)],
             "autoets": [fc(0.5) for _ in subset]}
    paired, every = score_paired(preds, labels, inputs, list(range(n)), 1, subset)
    assert paired["dp"]["forecasts"] == paired["autoets"]["forecasts"] == 3 and every["dp"]["forecasts"] == n
    assert "autoets" not in every
    mae = np.mean([np.abs(labels[i]).mean() for i in subset])
    assert paired["dp"]["mae"] == pytest.approx(mae)
    same, none = score_paired({"dp": preds["dp"]}, labels, inputs, list(range(n)), 1, None)
    assert none is None and same["dp"]["forecasts"] == n

"""WeightedQuantileLoss against a direct numpy computation and against GluonTS's Evaluator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.metrics import DEFAULT_QUANTILES, WeightedQuantileLoss, sample_quantiles


def numpy_mean_wql(forecasts: np.ndarray, target: np.ndarray, mask: np.ndarray, quantiles) -> float:
    losses = []
    for j, q in enumerate(quantiles):
        f = forecasts[..., j]
        ql = 2 * np.sum(np.abs((f - target) * ((target <= f) - q)) * mask)
        losses.append(ql / np.sum(np.abs(target) * mask))
    return float(np.mean(losses))


def random_forecasts(seed: int, items: int = 7, horizon: int = 12):
    rng = np.random.default_rng(seed)
    target = rng.gamma(2.0, 10.0, size=(items, horizon))
    centre = target + rng.normal(0, 5, size=target.shape)
    spread = np.abs(rng.normal(4, 1, size=target.shape))
    z = np.array([-1.28, -0.84, -0.52, -0.25, 0.0, 0.25, 0.52, 0.84, 1.28])
    forecasts = centre[..., None] + spread[..., None] * z
    return target, forecasts


def test_matches_direct_numpy_with_mask_and_nan():
    target, forecasts = random_forecasts(0)
    mask = np.ones_like(target)
    mask[1, :3] = 0
    target_nan = target.copy()
    target_nan[2, 5] = np.nan
    mask_all = mask.copy()
    mask_all[2, 5] = 0
    metric = WeightedQuantileLoss()
    metric.update(torch.tensor(forecasts), torch.tensor(target_nan), torch.tensor(mask))
    want = numpy_mean_wql(forecasts, np.nan_to_num(target_nan), mask_all, DEFAULT_QUANTILES)
    assert float(metric.compute()) == pytest.approx(want, rel=1e-12)


def test_matches_gluonts_evaluator():
    from gluonts.evaluation import Evaluator
    from gluonts.model.forecast import QuantileForecast

    target, forecasts = random_forecasts(1)
    start = pd.Period("2020-01", freq="M")
    history = 24
    series, fcsts = [], []
    for i in range(target.shape[0]):
        values = np.concatenate([np.full(history, 10.0), target[i]])
        series.append(pd.Series(values, index=pd.period_range(start, periods=values.size, freq="M")))
        fcsts.append(QuantileForecast(forecasts[i].T, start_date=start + history,
                                      forecast_keys=[str(q) for q in DEFAULT_QUANTILES], item_id=str(i)))
    agg, _ = Evaluator(quantiles=DEFAULT_QUANTILES, num_workers=None)(iter(series), iter(fcsts),
                                                                        num_series=len(series))
    metric = WeightedQuantileLoss()
    metric.update(torch.tensor(forecasts), torch.tensor(target))
    assert float(metric.compute()) == pytest.approx(agg["mean_wQuantileLoss"], rel=1e-9)
    for j, q in enumerate(DEFAULT_QUANTILES):
        assert float(metric.compute_per_quantile()[j]) == pytest.approx(agg[f"wQuantileLoss[{q}]"], rel=1e-9)


def test_batches_accumulate_merge_and_reset():
    target, forecasts = random_forecasts(2, items=10)
    whole = WeightedQuantileLoss()
    whole.update(torch.tensor(forecasts), torch.tensor(target))
    parts = [WeightedQuantileLoss(), WeightedQuantileLoss()]
    parts[0].update(torch.tensor(forecasts[:4]), torch.tensor(target[:4]))
    parts[1].update(torch.tensor(forecasts[4:]), torch.tensor(target[4:]))
    parts[0].merge_state(parts[1])  # what distributed "sum" reduction does
    assert float(parts[0].compute()) == pytest.approx(float(whole.compute()), rel=1e-12)
    whole.reset()
    assert float(whole.abs_target) == 0.0


def test_sample_quantiles_match_numpy():
    rng = np.random.default_rng(3)
    samples = rng.normal(size=(4, 200, 6))
    got = sample_quantiles(torch.tensor(samples), DEFAULT_QUANTILES, dim=1).numpy()
    want = np.moveaxis(np.quantile(samples, DEFAULT_QUANTILES, axis=1), 0, -1)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_bad_input():
    with pytest.raises(ConfigurationError, match="quantiles"):
        WeightedQuantileLoss(quantiles=[0.0, 0.5])
    metric = WeightedQuantileLoss()
    with pytest.raises(ConfigurationError, match="quantile_forecasts"):
        metric.update(torch.zeros(3, 4, 5), torch.zeros(3, 4))
    with pytest.raises(ConfigurationError, match="observed"):
        metric.update(torch.zeros(3, 4, 9), torch.zeros(3, 4), torch.ones(3))

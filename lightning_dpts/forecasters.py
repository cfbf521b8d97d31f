"""The model factory: the GluonTS estimator (whose LightningModule is trained and whose predictor forecasts) of a
:class:`~lightning_dpts.config.FitConfig`, GluonTS's seasonality and lags, and the AutoETS baseline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.config import LEGACY_DEFAULTS, FitConfig

__all__ = ["autoets_forecasts", "deepar_lags", "make_estimator", "season_length"]


def make_estimator(config: FitConfig, freq: str) -> Any:
    """The estimator whose LightningModule and predictor we use (GluonTS defaults as in the paper, B.2).

    Options still unset (``None``, e.g. a config not passed through
    :func:`~lightning_dpts.geometry.resolve_config`) take :data:`LEGACY_DEFAULTS`, or the recipe's constants for
    ``combination`` (the default) and ``seasonal_linear``.
    """
    h = config.prediction_length
    ctx = config.context_length or h
    lr = config.learning_rate if config.learning_rate is not None else LEGACY_DEFAULTS["learning_rate"]
    if config.model in (None, "combination"):  # None: the recipe's model
        from lightning_dpts.models import CombinationEstimator
        from lightning_dpts.recipe import LEARNING_RATE, RECIPE_MODEL

        lr = config.learning_rate if config.learning_rate is not None else LEARNING_RATE
        season = getattr(config, "season_length", None)
        if config.context_length is None:  # a config not resolved by the recipe: its wanted window, uncapped
            from lightning_dpts.data.seasonality import season_lengths
            from lightning_dpts.recipe import wanted_past_window

            ctx = wanted_past_window(RECIPE_MODEL, season_lengths(freq, season), h)
        return CombinationEstimator(prediction_length=h, context_length=ctx, freq=freq, season_length=season, lr=lr)
    if config.model == "seasonal_linear":
        from lightning_dpts.models import SeasonalLinearEstimator
        from lightning_dpts.recipe import LEARNING_RATE

        lr = config.learning_rate if config.learning_rate is not None else LEARNING_RATE
        if config.context_length is None:
            ctx = max(2 * h, season_length(freq) + 1)

        return SeasonalLinearEstimator(prediction_length=h, context_length=ctx, season_length=season_length(freq),
                                       lr=lr)
    if config.model == "simple_feedforward":
        from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

        return SimpleFeedForwardEstimator(prediction_length=h, context_length=ctx, hidden_dimensions=[64, 64], lr=lr)
    if config.model == "deepar":
        from gluonts.torch.model.deepar import DeepAREstimator

        return DeepAREstimator(freq=freq, prediction_length=h, context_length=ctx, num_layers=2, hidden_size=40,
                               dropout_rate=0.0, lr=lr, lags_seq=deepar_lags(freq, config.max_lag))
    if config.model == "dlinear":
        from gluonts.torch.model.d_linear import DLinearEstimator

        return DLinearEstimator(prediction_length=h, context_length=ctx, hidden_dimension=20, lr=lr)
    from gluonts.torch.model.patch_tst import PatchTSTEstimator

    return PatchTSTEstimator(prediction_length=h, context_length=ctx, patch_len=max(1, min(ctx, h) // 2),
                             stride=max(1, min(ctx, h) // 4), dropout=0.0, lr=lr)


def deepar_lags(freq: str, max_lag: int | None) -> list[int] | None:
    """GluonTS's default DeepAR lags for ``freq``, keeping only those <= ``max_lag`` (``None``: all of them)."""
    if max_lag is None:
        return None
    from gluonts.time_feature import get_lags_for_frequency

    return sorted({lag for lag in get_lags_for_frequency(freq) if lag <= max_lag} | {1})


def season_length(freq: str) -> int:
    from gluonts.time_feature import get_seasonality

    return int(get_seasonality(freq))


def autoets_forecasts(inputs: list[dict[str, Any]], horizon: int, season: int, freq: str) -> list[Any]:
    from gluonts.model.forecast import QuantileForecast
    from scipy.stats import norm
    from statsforecast.models import AutoETS

    from lightning_dpts.metrics import DEFAULT_QUANTILES

    out = []
    for entry in inputs:
        y = np.asarray(entry["target"], dtype=float)
        y = pd.Series(y).interpolate(limit_direction="both").to_numpy()
        fit = AutoETS(season_length=season).forecast(y=y, h=horizon, level=[80])
        mean = np.asarray(fit["mean"])
        sd = (np.asarray(fit["hi-80"]) - mean) / norm.ppf(0.9)
        arrays = np.stack([mean + norm.ppf(q) * sd for q in DEFAULT_QUANTILES])
        start = entry["start"] + len(y)
        out.append(QuantileForecast(arrays, start_date=start, forecast_keys=[str(q) for q in DEFAULT_QUANTILES]))
    return out

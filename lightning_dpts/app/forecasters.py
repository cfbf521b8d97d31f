"""The model factory: the GluonTS estimator (whose LightningModule is trained and whose predictor forecasts) of a
:class:`~lightning_dpts.app.config.FitConfig`, the seasons it reads (:func:`model_seasons`) and DeepAR's lags. The
baselines (seasonal naive with intervals, AutoETS, AutoTheta) live in :mod:`lightning_dpts.baselines`."""

from __future__ import annotations

from typing import Any

from lightning_dpts.app.config import LEGACY_DEFAULTS, FitConfig

__all__ = ["deepar_lags", "make_estimator", "model_seasons", "season_length"]


def make_estimator(config: FitConfig, freq: str) -> Any:
    """The estimator whose LightningModule and predictor we use (GluonTS defaults as in the paper, B.2).

    Options still unset (``None``, e.g. a config not passed through
    :func:`~lightning_dpts.app.geometry.resolve_config`) take :data:`LEGACY_DEFAULTS`, or the recipe's constants for
    ``combination`` (the default) and ``seasonal_linear``.
    """
    h = config.prediction_length
    ctx = config.context_length or h
    lr = config.learning_rate if config.learning_rate is not None else LEGACY_DEFAULTS["learning_rate"]
    if config.model in (None, "combination"):  # None: the recipe's model
        from lightning_dpts.models import CombinationEstimator
        from lightning_dpts.recipe import LEARNING_RATE, RECIPE_MODEL

        lr = config.learning_rate if config.learning_rate is not None else LEARNING_RATE
        season = config.season_length
        if config.context_length is None:  # a config not resolved by the recipe: its wanted window, uncapped
            from lightning_dpts.data.seasonality import season_lengths
            from lightning_dpts.recipe import wanted_past_window

            ctx = wanted_past_window(RECIPE_MODEL, season_lengths(freq, season), h)
        return CombinationEstimator(prediction_length=h, context_length=ctx, freq=freq, season_length=season, lr=lr)
    if config.model == "seasonal_linear":
        from lightning_dpts.models import SeasonalLinearEstimator
        from lightning_dpts.recipe import LEARNING_RATE

        lr = config.learning_rate if config.learning_rate is not None else LEARNING_RATE
        season = model_seasons(config, freq)[0]
        if config.context_length is None:
            ctx = max(2 * h, season + 1)

        return SeasonalLinearEstimator(prediction_length=h, context_length=ctx, season_length=season, lr=lr)
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


def model_seasons(config: FitConfig, freq: str) -> tuple[int, ...]:
    """The seasons (primary first) the model, seasonal naive and MASE use: ``config.season_length`` (``dpts fit
    --season-length``) or the frequency's (:func:`~lightning_dpts.data.seasonality.season_lengths`). The one place
    ``dpts fit`` reads the option: every seasonal model takes its season from here. Public metadata only."""
    from lightning_dpts.data.seasonality import season_lengths

    return season_lengths(freq, config.season_length)


def season_length(freq: str) -> int:
    """The primary season of data at frequency ``freq`` (:func:`~lightning_dpts.data.seasonality.season_lengths`)."""
    from lightning_dpts.data.seasonality import season_lengths

    return season_lengths(freq)[0]

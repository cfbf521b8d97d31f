"""Compact forecasters suited to DP training (few parameters), used by the recipe of ``dpts fit``.

* :class:`SeasonalLinearEstimator` / :class:`SeasonalLinearLightningModule` (``dpts fit --model seasonal_linear``):
  seasonal naive plus a zero-initialised linear correction with a Gaussian spread tied to the series' scale,
  ten parameters (:mod:`lightning_dpts.models.seasonal_linear`).
"""

from lightning_dpts.models.seasonal_linear import (
    SeasonalLinearEstimator,
    SeasonalLinearLightningModule,
    SeasonalLinearModel,
    gaussian_crps,
)

__all__ = ["SeasonalLinearEstimator", "SeasonalLinearLightningModule", "SeasonalLinearModel", "gaussian_crps"]

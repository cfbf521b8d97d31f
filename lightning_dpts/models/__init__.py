"""Compact forecasters suited to DP training (few parameters), used by the recipe of ``dpts fit``.

* :class:`CombinationEstimator` / :class:`CombinationLightningModule` (``dpts fit --model combination``, the
  default): a learned combination of classical forecasts (naive, drift, exponential smoothing, Holt, damped Holt,
  Theta, seasonal naive and seasonal means, each from the window alone) with a calibrated Gaussian spread, a few
  dozen parameters, initialised at a classical combination (:mod:`lightning_dpts.models.combination`).
* :class:`SeasonalLinearEstimator` / :class:`SeasonalLinearLightningModule` (``dpts fit --model seasonal_linear``):
  seasonal naive plus a zero-initialised linear correction with a Gaussian spread tied to the series' scale,
  ten parameters (:mod:`lightning_dpts.models.seasonal_linear`).
* :func:`seasonal_residual`: any plain torch network as seasonal naive plus its zero-initialised correction
  (:mod:`lightning_dpts.models.seasonal_residual`).
"""

from lightning_dpts.models.combination import (
    CombinationEstimator,
    CombinationLightningModule,
    CombinationModel,
)
from lightning_dpts.models.seasonal_linear import (
    SeasonalLinearEstimator,
    SeasonalLinearLightningModule,
    SeasonalLinearModel,
    gaussian_crps,
)
from lightning_dpts.models.seasonal_residual import (
    SeasonalResidualLightningModule,
    SeasonalResidualModel,
    seasonal_residual,
)

__all__ = ["CombinationEstimator", "CombinationLightningModule", "CombinationModel", "SeasonalLinearEstimator",
           "SeasonalLinearLightningModule", "SeasonalLinearModel", "SeasonalResidualLightningModule",
           "SeasonalResidualModel", "gaussian_crps", "seasonal_residual"]

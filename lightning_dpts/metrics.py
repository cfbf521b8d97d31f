"""Forecast metrics as torchmetrics ``Metric`` objects.

:class:`WeightedQuantileLoss` is the *mean weighted quantile loss* GluonTS reports as ``mean_wQuantileLoss``
and the paper uses as its CRPS approximation (Appendix B.3): for each quantile level q,

    wQL_q = 2 * sum |(yhat_q - y) * (1{y <= yhat_q} - q)| / sum |y|,

summed over every series and forecast step of the evaluation set (not averaged per series), then averaged
over the quantile levels (0.1, ..., 0.9 by default). torchmetrics ships a sample-based CRPS but not this one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchmetrics import Metric

from lightning_dpts.errors import ConfigurationError

__all__ = ["DEFAULT_QUANTILES", "WeightedQuantileLoss", "sample_quantiles"]

DEFAULT_QUANTILES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


def sample_quantiles(samples: torch.Tensor, quantiles: Sequence[float], dim: int = 1) -> torch.Tensor:
    """Quantiles of sample forecasts along ``dim`` (linear interpolation, as ``np.quantile``), moved last.

    ``samples`` of shape [batch, num_samples, horizon] with ``dim=1`` gives [batch, horizon, len(quantiles)].
    """
    q = torch.as_tensor(list(quantiles), dtype=samples.dtype, device=samples.device)
    out = torch.quantile(samples, q, dim=dim)  # [Q, ...]
    return out.movedim(0, -1)


class WeightedQuantileLoss(Metric):
    """Mean weighted quantile loss (GluonTS ``mean_wQuantileLoss``, the paper's CRPS approximation).

    Args:
        quantiles: quantile levels in (0, 1); default 0.1, ..., 0.9.

    ``update(quantile_forecasts, target, observed=None)`` takes forecasts of shape ``[*, Q]`` (quantile levels
    on the last axis, in the order of ``quantiles``), targets of shape ``[*]`` in the same units, and an
    optional 0/1 mask of observed target values; NaN targets count as unobserved. ``compute()`` returns the
    mean over quantile levels of (sum of quantile losses) / (sum of |target|) over everything seen since the
    last ``reset()``. States are sums, so distributed evaluation reduces them with ``sum``.
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    quantile_loss: torch.Tensor
    abs_target: torch.Tensor

    def __init__(self, quantiles: Sequence[float] = DEFAULT_QUANTILES, **kwargs) -> None:
        super().__init__(**kwargs)
        levels = [float(q) for q in quantiles]
        if not levels or any(not 0.0 < q < 1.0 for q in levels):
            raise ConfigurationError("quantiles", list(quantiles), "must be a non-empty sequence of levels in (0, 1)")
        self.quantiles = tuple(levels)
        self.register_buffer("_levels", torch.tensor(levels, dtype=torch.float64), persistent=False)
        self.add_state("quantile_loss", default=torch.zeros(len(levels), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("abs_target", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, quantile_forecasts: torch.Tensor, target: torch.Tensor,
               observed: torch.Tensor | None = None) -> None:
        """Accumulate quantile losses and |target| over observed entries."""
        if quantile_forecasts.shape[:-1] != target.shape or quantile_forecasts.shape[-1] != len(self.quantiles):
            raise ConfigurationError(
                "quantile_forecasts",
                tuple(quantile_forecasts.shape),
                f"must have shape target.shape + (Q,) = {tuple(target.shape) + (len(self.quantiles),)}",
            )
        forecast = quantile_forecasts.to(torch.float64)
        y = target.to(torch.float64)
        mask = ~torch.isnan(y)
        if observed is not None:
            if observed.shape != target.shape:
                raise ConfigurationError(
                    "observed", tuple(observed.shape), f"must have the target's shape {tuple(target.shape)}"
                )
            mask &= observed.to(torch.bool)
        y = torch.where(mask, y, torch.zeros_like(y))
        levels = self._levels.to(forecast.device)
        diff = forecast - y.unsqueeze(-1)
        indicator = (y.unsqueeze(-1) <= forecast).to(torch.float64)
        loss = 2.0 * torch.abs(diff * (indicator - levels)) * mask.unsqueeze(-1)
        self.quantile_loss += loss.reshape(-1, len(self.quantiles)).sum(dim=0)
        self.abs_target += torch.abs(y).sum()

    def compute_per_quantile(self) -> torch.Tensor:
        """wQL_q for every quantile level (same order as ``quantiles``)."""
        return self.quantile_loss / self.abs_target

    def compute(self) -> torch.Tensor:
        """Mean weighted quantile loss over the quantile levels."""
        return self.compute_per_quantile().mean()

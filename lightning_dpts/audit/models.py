"""The audit's default model: a per-series forecaster whose canaries have orthogonal gradients.

A one-run audit tells canaries apart by the directions their windows push the parameters in. Canaries whose
gradients share a direction cannot be told apart at all (only their number shows in the update), so the default
audit model gives every series its own forecast parameters, the analogue for time series of the "Dirac canaries"
of Steinke et al. (2023, Section 6): window i forecasts ``level[series_i] + W x_i`` (``x_i`` its past window,
missing values zero), trained on the mean squared error of its forecast window. A canary's gradient then lies
mostly in its own series' row of ``level``, orthogonal to every other canary's. This is a model for auditing the
mechanism (sampling, clipping, noise, accounting), not a forecaster to use.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

__all__ = ["AuditForecaster"]


class AuditForecaster(L.LightningModule):
    """``forecast_i = level[series_i] + W x_i``, mean squared error, plain SGD (module docstring).

    Args:
        num_series: number of series (rows of ``level``).
        context_length: P, the past window read, in time steps.
        prediction_length: L_F, the forecast window, in time steps.
        lr: SGD learning rate.
    """

    def __init__(self, num_series: int, context_length: int, prediction_length: int, lr: float = 0.1) -> None:
        super().__init__()
        self.level = nn.Embedding(num_series, prediction_length)
        nn.init.zeros_(self.level.weight)
        self.linear = nn.Linear(context_length, prediction_length, bias=False)  # the levels are the biases
        nn.init.zeros_(self.linear.weight)
        self.lr = float(lr)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        past = batch["past_target"] * batch["past_observed_values"]
        return self.level(batch["series_index"]) + self.linear(past)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int = 0) -> torch.Tensor:
        observed = batch["future_observed_values"]
        err = (self(batch) - batch["future_target"]) * observed
        return err.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class WindowMixingForecaster(AuditForecaster):
    """A *deliberately broken* :class:`AuditForecaster` for the audit's sharpness test (never for training).

    Window i's forecast adds a cross-series attention term: ``level[s_i] + W x_i + k * (y_i / 50) * sum_j w_j
    level[s_j]``, attention weights ``w = softmax(sum of each window's forecast-window values / 10)`` over the
    windows of the batch, ``k = sqrt(batch size)``, ``y_i`` the window's own forecast-window mean. Window i's gradient
    then reaches the level of every series with large values in the batch, with the same sign for every window, so
    one window's values move the clipped gradients of all the others and the update moves by far more than the 2C
    the accountant assumes (docs/privacy.md, rule 8). The probe and the spot check of
    :class:`~lightning_dpts.training.DPForecastStrategy` would refuse it; the audit runs it with them switched off
    and must show more leakage than the accountant's epsilon.
    """

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int = 0) -> torch.Tensor:
        index = batch["series_index"]
        target = batch["future_target"]
        n = index.shape[0]
        weights = torch.softmax(target.sum(1) / 10.0, dim=0)  # [B]
        borrowed = self.level(index[None, :].expand(n, n))  # [B, B, L_F]: window i reads every series' level
        gate = target.mean(1, keepdim=True) / 50.0  # [B, 1]
        mixed = self(batch) + (n ** 0.5) * gate * (weights[None, :, None] * borrowed).sum(1)
        err = (mixed - target) * batch["future_observed_values"]
        return err.pow(2).mean()


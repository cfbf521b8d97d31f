"""Seasonal residual wrapper: seasonal naive from the window's own context plus any network's correction.

DP-SGD adds noise to every coordinate of the update. A forecaster trained from a random initialisation starts far
from a good forecast, and the noise pushes it further; wrapped by :func:`seasonal_residual`, the same network
starts **exactly at seasonal naive** and the noise on its correction pulls toward seasonal naive instead of away
from it:

* every window is scaled by its own mean |x| (s), z = x / s (a missing value reads as the window's mean);
* location: seasonal naive's value b_h (one season back, the last value for m = 1, computed as in
  :class:`~lightning_dpts.models.SeasonalLinearModel`) plus ``net(z)``, the user's correction ``[batch, H]``;
  the **last** ``nn.Linear`` of ``net`` starts at zero weights and bias, so at initialisation the forecast *is*
  seasonal naive;
* spread: a Gaussian with std = the window's mean absolute m-step difference x sqrt(steps ahead) x a learned
  factor (1.25 at initialisation), as in ``seasonal_linear``;
* trained on the closed-form Gaussian CRPS in scaled units (bounded gradients in the location).

Every quantity is computed from one window alone (no batch statistics; the strategy's independence probe checks
it), and nothing before the past window P is read, so P is the whole L_C the accountant counts.

Supported: a **plain torch module** mapping the scaled past window ``[batch, P]`` to a correction
``[batch, H]`` (an MLP, a GRU with a linear head, ...), and the LightningModules of GluonTS' **SimpleFeedForward,
DLinear and DeepAR**, whose output distribution's location is shifted by seasonal naive
(:mod:`lightning_dpts.models.gluonts_residual`; other GluonTS models are refused).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gluonts.model import Input, InputSpec
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.models.seasonal_linear import _SPREAD_AT_INIT, CRPSSteps, SeasonalLinearModel, gaussian_crps

__all__ = ["SeasonalResidualLightningModule", "SeasonalResidualModel", "seasonal_residual"]


def _is_gluonts(net: Any) -> bool:
    inner = getattr(net, "model", net)
    return (type(net).__module__.split(".")[0] == "gluonts" or type(inner).__module__.split(".")[0] == "gluonts"
            or hasattr(inner, "describe_inputs"))


def _refuse_gluonts(net: Any) -> None:
    if _is_gluonts(net):
        raise ConfigurationError(
            "net", type(net).__name__,
            "is a GluonTS module; SeasonalResidualModel takes plain torch modules that map the scaled past window "
            "[batch, context_length] to a correction [batch, prediction_length]; pass GluonTS LightningModules "
            "(SimpleFeedForward, DLinear, DeepAR) to seasonal_residual() instead")
    if not isinstance(net, nn.Module):
        raise ConfigurationError("net", type(net).__name__, "must be a torch.nn.Module")


def _zero_last_linear(net: nn.Module) -> None:
    linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ConfigurationError("net", type(net).__name__, "must end in an nn.Linear (its last layer starts at zero "
                                 "so that the wrapped forecast starts at seasonal naive)")
    nn.init.zeros_(linears[-1].weight)
    if linears[-1].bias is not None:
        nn.init.zeros_(linears[-1].bias)


class _Spread(nn.Module):
    """The learned spread factor: ``unit * softplus(weight + s_0)``, 1.25 x unit at initialisation (its own module,
    so that per-window gradients are computed layer by layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))
        self.offset = math.log(math.expm1(_SPREAD_AT_INIT))

    def forward(self, unit: torch.Tensor) -> torch.Tensor:
        return unit * nn.functional.softplus(self.weight + self.offset)


class SeasonalResidualModel(nn.Module):
    """Seasonal naive plus ``net``'s correction, with a Gaussian spread (see the module docstring).

    Args:
        net: a plain torch module, scaled past window ``[B, P]`` -> correction ``[B, H]`` (its last
            ``nn.Linear`` is set to zero).
        prediction_length: H.
        context_length: P, the whole past window read (no lags beyond it), >= max(2, season_length + 1).
        season_length: m >= 1.
        residual: ``False`` drops the seasonal-naive location and keeps ``net``'s own initialisation (the mean is
            ``net``'s output alone): the same network and head without the wrapper, for comparisons.
    """

    def __init__(self, net: nn.Module, prediction_length: int, context_length: int, season_length: int = 1,
                 residual: bool = True) -> None:
        super().__init__()
        _refuse_gluonts(net)
        self.baseline = SeasonalLinearModel(prediction_length, context_length, season_length)  # features only
        del self.baseline.proj  # no parameters: it computes seasonal naive, the spread unit and the scale
        self.net = net
        self.residual = residual
        if residual:
            _zero_last_linear(net)
        self.prediction_length = prediction_length
        self.context_length = context_length
        self.season_length = season_length
        self.spread = _Spread()

    def describe_inputs(self, batch_size: int = 1) -> InputSpec:
        """GluonTS input description: ``past_target`` and ``past_observed_values``, ``[batch, P]``."""
        return InputSpec({
            "past_target": Input(shape=(batch_size, self.context_length), dtype=torch.float),
            "past_observed_values": Input(shape=(batch_size, self.context_length), dtype=torch.float),
        }, torch.zeros)

    def forward(self, past_target: torch.Tensor, past_observed_values: torch.Tensor
                ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``((mu, sigma), loc, scale)``: ``N(mu, sigma^2)`` on values divided by ``scale`` (``[B, H]``, ``[B, 1]``)."""
        _, naive, unit, scale = self.baseline._features(past_target, past_observed_values)
        obs = past_observed_values.to(past_target.dtype)
        z = past_target / scale
        level = (z * obs).sum(-1, keepdim=True) / obs.sum(-1, keepdim=True).clamp(min=1.0)
        z = torch.where(obs > 0, z, level.expand_as(z))
        correction = self.net(z)
        if correction.shape != naive.shape:
            raise ConfigurationError("net", type(self.net).__name__, f"must map [batch, {self.context_length}] to "
                                     f"[batch, {self.prediction_length}], got {tuple(correction.shape)}")
        mu = naive + correction if self.residual else correction
        sigma = self.spread(unit)
        return (mu, sigma), torch.zeros_like(scale), scale

    def loss(self, past_target: torch.Tensor, past_observed_values: torch.Tensor, future_target: torch.Tensor,
             future_observed_values: torch.Tensor) -> torch.Tensor:
        """Per-window Gaussian CRPS in scaled units, averaged over observed steps, ``[B]``."""
        (mu, sigma), _, scale = self(past_target, past_observed_values)
        obs = future_observed_values.to(mu.dtype)
        y = torch.where(obs > 0, future_target / scale, mu.detach())
        return (gaussian_crps(mu, sigma, y) * obs).sum(-1) / obs.sum(-1).clamp(min=1.0)


class SeasonalResidualLightningModule(CRPSSteps):
    """LightningModule of :class:`SeasonalResidualModel`: mean per-window CRPS (``loss_reduction="mean"``), Adam.

    :meth:`quantile_forecasts` forecasts from histories (what
    :class:`~lightning_dpts.training.HeldOutEvaluation` calls).
    """

    def __init__(self, net: nn.Module, prediction_length: int, context_length: int, season_length: int = 1,
                 lr: float = 1e-2, residual: bool = True) -> None:
        super().__init__()
        self.model = SeasonalResidualModel(net, prediction_length, context_length, season_length, residual)
        self.lr = lr

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.loss(batch["past_target"], batch["past_observed_values"], batch["future_target"],
                               batch["future_observed_values"]).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.model.parameters(), lr=self.lr)

    def past_windows(self, histories: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """The last P values of each history (left-padded as unobserved): ``(past_target, past_observed_values)``."""
        p = self.model.context_length
        target = np.zeros((len(histories), p), dtype=np.float32)
        observed = np.zeros((len(histories), p), dtype=np.float32)
        for i, h in enumerate(histories):
            tail = np.asarray(h, dtype=np.float32)[-p:]
            ok = np.isfinite(tail)
            target[i, p - len(tail):] = np.where(ok, tail, 0.0)
            observed[i, p - len(tail):] = ok
        return torch.from_numpy(target), torch.from_numpy(observed)

    @torch.no_grad()
    def quantile_forecasts(self, histories: Sequence[np.ndarray], levels: Sequence[float] | None = None
                           ) -> list[np.ndarray]:
        """One ``[H, Q]`` quantile matrix per history (levels default ``DEFAULT_QUANTILES``), in data units."""
        from lightning_dpts.metrics import DEFAULT_QUANTILES

        levels = tuple(DEFAULT_QUANTILES if levels is None else levels)
        past, observed = self.past_windows(histories)
        (mu, sigma), _, scale = self.model(past.to(self.device), observed.to(self.device))
        normal = torch.distributions.Normal(mu, sigma)
        q = torch.stack([normal.icdf(torch.full_like(mu, lv)) for lv in levels], dim=-1) * scale[..., None]
        return list(q.cpu().numpy().astype(float))


def seasonal_residual(net: Any, *, prediction_length: int | None = None, context_length: int | None = None,
                      freq: str | None = None, season_length: int | None = None, lr: float = 1e-2) -> Any:
    """Wrap ``net`` as seasonal naive plus its correction.

    * a plain torch module (scaled past window ``[B, P]`` -> correction ``[B, H]``; ``prediction_length`` and
      ``context_length`` required): returns a :class:`SeasonalResidualLightningModule`, which
      :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` reads its geometry from (``model=``);
    * a GluonTS LightningModule of SimpleFeedForward, DLinear or DeepAR: shifts its output distribution's location
      by seasonal naive **in place** and returns the same module (train it and build its predictor as before;
      :mod:`lightning_dpts.models.gluonts_residual`). ``prediction_length``/``context_length``, if given, must be
      the model's.

    The season length m comes from ``freq`` (GluonTS ``get_seasonality``) unless given. Other GluonTS models are
    refused (:class:`ConfigurationError`).
    """
    if season_length is None:
        if freq is None:
            raise ConfigurationError("freq", None, "give freq or season_length")
        from gluonts.time_feature import get_seasonality

        season_length = int(get_seasonality(freq))
    if _is_gluonts(net):
        from lightning_dpts.models.gluonts_residual import wrap_gluonts

        inner = getattr(net, "model", net)
        for name, value in (("prediction_length", prediction_length), ("context_length", context_length)):
            if value is not None and getattr(inner, name, value) != value:
                raise ConfigurationError(name, value, f"must be the GluonTS model's ({getattr(inner, name)})")
        return wrap_gluonts(net, season_length)
    if prediction_length is None or context_length is None:
        raise ConfigurationError("prediction_length" if prediction_length is None else "context_length", None,
                                 "give it for a plain torch module")
    return SeasonalResidualLightningModule(net, prediction_length, context_length, season_length, lr)

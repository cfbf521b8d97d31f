"""``combination``: a learned combination of classical forecasts with a calibrated spread, the recipe's model.

Why this model. DP-SGD adds noise of std sigma*C/Lambda to *every* coordinate of the averaged gradient
(Algorithm 2), so a private model should have few parameters and start where a good forecaster already is. Forecast
combinations won the M4 competition (Makridakis et al. 2020: the mean of SES, Holt and damped Holt on seasonally
adjusted data, "Comb", beat most entries; FFORMA learned the weights from series features); their weights are the
kind of small signal DP-SGD can learn. At initialisation this model *is* a classical combination, so with no
learning at all it forecasts like one, and DP-SGD only refines its few dozen weights.

The model, per window (everything is computed from that window alone, so windows stay independent; docs/privacy.md,
rule 8). ``P`` is the past window (``context_length``; nothing older is read, so ``P`` is the whole L_C the
accountant counts, trap 3), ``H`` the horizon, ``m_1, m_2, ...`` the seasons
(:func:`~lightning_dpts.data.seasonality.season_lengths`):

1. **scaling and missing values**: ``s = mean |x_t|`` over the observed past values (1 when none is observed),
   ``z = x / s``; a missing value reads as the last observed one before it (the first observed one at the start);
2. **candidates**: K classical forecasts ``F_k`` ``[H]`` and their one-step in-sample fits, each a fixed linear map
   of ``z`` (:mod:`lightning_dpts.models.classical`: naive, two drifts, SES at six constants, three Holt, three
   damped Holt, three Theta, and per season seasonal naive, the mean of the last seasons and two seasonal drifts),
   then SES and Theta with the smoothing constant of least in-sample one-step error on a grid (``FITTED``, per window).
   The non-seasonal methods run on the seasonally adjusted window (classical additive decomposition) when the
   window passes the M4 benchmarks' seasonality test at lag m_1 (90%, Makridakis et al. 2020), else on the window
   as it is;
3. **weights**: ``w_{h,k} = softmax_k(gate(x_{h,k}))`` with one ``nn.Linear(3K + 2, 1)`` over features of
   candidate k at step h: its one-hot (a per-candidate bias), one-hot times h/H, one-hot times the seasonality flag,
   the log ratio of its in-sample one-step mean squared error to the candidates' mean, and the same log ratio of its
   **hold-out** error: candidate k forecasts the window's last q = min(H, P // 3) values from the P - q values before
   them (another fixed linear map; all scale-free); the location is ``mu_h = sum_k w_{h,k} F_{k,h}``;
4. **spread**: ``sigma_h = u * exp(a . g [1, log h, log(d / u)])`` with ``u`` the root mean square of the combined
   one-step in-sample errors, ``d`` the mean absolute m_1-step difference of the window, ``a`` one
   ``nn.Linear(3, 1)``, ``g`` = :data:`SPREAD_FEATURE_SCALE` (exponent clamped to +-10);
5. **output**: a Gaussian ``N(mu_h, sigma_h^2)`` on the scaled values, rescaled by ``s`` (GluonTS ``NormalOutput``
   with ``loc = 0``, ``scale = s``), trained on its closed-form CRPS, the metric the evaluation reports.

Initialisation: every candidate has the same prior (:data:`INITIAL_WEIGHTS` ``None``: the per-candidate biases and
the step and flag terms are zero), and the two error features enter with weights :data:`INITIAL_SELECTION` = -1 and
:data:`INITIAL_HOLDOUT` = -1, so each window's weights are proportional to ``1 / (MSE_in-sample * MSE_hold-out)``
of the candidates (relative): a soft, per-window performance-weighted combination (M4's lesson: combining beats
selecting; the weights are public choices, made on validation windows before the benchmark's test windows of the
bundled data and M4 weekly, docs/utility.md). The spread starts at ``sigma_h = u h^0.4 (d / u)^0.15 e^-0.1``
(:data:`INITIAL_SPREAD`). Training: Adam with the gate's learning rate times :data:`GATE_LR_FACTOR` and the
spread's times :data:`SPREAD_LR_FACTOR`; the recipe clips at C = 0.001, near the typical window's gradient norm
(:data:`lightning_dpts.recipe.MAX_GRAD_NORMS`). Every trainable parameter
is in an ``nn.Linear``, so per-window gradient norms come from the linear-layer fast path of
:class:`~lightning_dpts.training.engine.PerWindowClipper`. The classes follow GluonTS's torch models (like
:mod:`lightning_dpts.models.seasonal_linear`), so ``dpts fit``, export, ``dpts predict`` and
:class:`~lightning_dpts.gluonts.PrivateEstimator` use it like the GluonTS models.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from gluonts.core.component import validated
from gluonts.itertools import select
from gluonts.model import Input, InputSpec
from gluonts.torch.distributions import NormalOutput
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.models import classical
from lightning_dpts.models.seasonal_linear import CRPSSteps, SeasonalLinearEstimator, gaussian_crps

__all__ = ["INITIAL_WEIGHTS", "CombinationEstimator", "CombinationLightningModule", "CombinationModel",
           "num_parameters", "usable_seasons"]

#: The combination's prior at initialisation: candidate name -> weight (``None``: every candidate equally; a
#: candidate not named gets :data:`_OFF_LOGIT`).
INITIAL_WEIGHTS: dict[str, float] | None = None
#: Weight of the in-sample one-step error feature at initialisation (with :data:`INITIAL_HOLDOUT`: weights
#: proportional to 1 / (MSE_in-sample * MSE_hold-out), a soft performance-weighted combination; on validation windows
#: a near-hard choice, -8, lost 2.7% MASE on M4 weekly and the hold-out term gained 8% on the bundled data).
INITIAL_SELECTION = -1.0
#: Weight of the hold-out error feature at initialisation (the log ratio of a candidate's squared error forecasting
#: the window's last q = min(H, P // 3) values from the values before them, to the candidates' mean).
INITIAL_HOLDOUT = -1.0
#: The spread's weights at initialisation on [1, log h, log(d / u)]: sigma_h = u h^0.4 (d / u)^0.15 e^-0.1.
INITIAL_SPREAD: tuple[float, float, float] = (-0.1, 0.4, 0.15)
#: The spread's features enter multiplied by this (and its weights start divided by it: the same initial model), so
#: a window's CRPS gradient on the spread is this much smaller. Unscaled, the spread took ~90% of the per-window
#: squared gradient norm at initialisation (bundled data and M4 weekly), so clipping spent C on it and the gate's
#: signal drowned in the noise; scaled, the gate gets most of C (validation windows, docs/utility.md).
SPREAD_FEATURE_SCALE = 0.1
#: Learning-rate multiples of the gate's and the spread's weights (Adam's step in weight space is about the learning
#: rate whatever the gradient's scale, so these set how far each group moves; chosen on validation windows).
GATE_LR_FACTOR = 10.0
SPREAD_LR_FACTOR = 1.0
_OFF_LOGIT = -6.0  # logit of a candidate left out at initialisation
_MIN_SCALE = 1e-10
_MIN_SPREAD = 1e-3  # smallest u and d, in scaled units
_MAX_EXPONENT = 10.0
_SEASONALITY_Z = 1.645  # the M4 benchmarks' 90% test
#: ``_Fitted`` takes the smallest alpha among those whose in-sample error is within this of the least (relative,
#: absolute in scaled units squared): errors equal in exact arithmetic (a window whose observed values are constant
#: but for the last, e.g. a padded past) differ only by round-off, which depends on the batch's matrix products, so
#: a plain argmin picked a different alpha alone than in a batch and the spot check refused a healthy fit
_TIE_RTOL, _TIE_ATOL = 1e-9, 1e-12


def usable_seasons(seasons: Sequence[int], context_length: int) -> tuple[int, ...]:
    """The seasons a window of ``context_length`` values can use (m < P; 1 and repeats dropped), primary first."""
    out: list[int] = []
    for m in seasons:
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1:
            raise ConfigurationError("season_length", m, "must be an integer >= 1")
        if 1 < int(m) < context_length and int(m) not in out:
            out.append(int(m))
    return tuple(out)


def num_parameters(candidates: int) -> int:
    """Trainable parameters of a :class:`CombinationModel` with ``candidates`` classical forecasts: the gate's
    3K + 2 weights and the spread's 3."""
    return 3 * candidates + 2 + 3


def _check(prediction_length: int, context_length: int) -> None:
    for name, value in (("prediction_length", prediction_length), ("context_length", context_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(name, value, "must be an integer >= 1")
    if context_length < 3:
        raise ConfigurationError("context_length", context_length, "the combination reads trends and in-sample "
                                 "errors from the past window: it must be >= 3")


class CombinationModel(nn.Module):
    """The network (see the module docstring).

    Args:
        prediction_length: H, forecast steps.
        context_length: P >= 3, the whole past window read (time steps; no lags beyond it).
        seasons: the season lengths, primary first (``()`` or ``(1,)``: none); those >= P are not used.
    """

    @validated()
    def __init__(self, prediction_length: int, context_length: int, seasons: list[int] | tuple[int, ...] = ()
                 ) -> None:
        super().__init__()
        _check(prediction_length, context_length)
        self.prediction_length = prediction_length
        self.context_length = context_length
        self.seasons = usable_seasons(seasons, context_length)
        self.distr_output = NormalOutput()
        p, h = context_length, prediction_length
        self.names = classical.candidate_names(self.seasons)
        k = len(self.names)
        self.linear = len(classical.method_names(self.seasons))  # the first candidates: fixed linear maps
        raw_f, raw_v = classical.method_maps(p, h, self.seasons)
        adj_f, adj_v = classical.adjusted_maps(p, h, self.seasons)
        # [P, K*H] and [P, K*P]: one product per window batch; constants, rebuilt from the arguments on load
        self.register_buffer("raw_forecast", _as_map(raw_f), persistent=False)
        self.register_buffer("adj_forecast", _as_map(adj_f), persistent=False)
        self.register_buffer("raw_fit", _as_map(raw_v), persistent=False)
        self.register_buffer("adj_fit", _as_map(adj_v), persistent=False)
        self.adjustable = bool(self.seasons) and p >= 2 * self.seasons[0]
        steps = torch.arange(1, h + 1, dtype=torch.float32)
        self.register_buffer("log_steps", steps.double().log(), persistent=False)
        self.register_buffer("step_share", steps / h, persistent=False)
        self.register_buffer("eye", torch.eye(k), persistent=False)
        self.burn_in = min(max(self.seasons[0] if self.seasons else 2, 2), p - 1)
        # hold-out: each candidate forecasts the window's last q values from the P - q before them
        self.holdout = min(h, p // 3)
        hold_f, _ = classical.method_maps(p - self.holdout, self.holdout, self.seasons)
        hold_adj, _ = classical.adjusted_maps(p - self.holdout, self.holdout, self.seasons)
        pad = ((0, 0), (0, 0), (0, self.holdout))
        self.register_buffer("raw_holdout", _as_map(np.pad(hold_f, pad)), persistent=False)
        self.register_buffer("adj_holdout", _as_map(np.pad(hold_adj, pad)), persistent=False)
        self.fitted = _Fitted(p, h, self.seasons)
        self.fitted_holdout = _Fitted(p - self.holdout, self.holdout, self.seasons)
        self.gate = nn.Linear(3 * k + 2, 1, bias=False)
        self.spread = nn.Linear(3, 1, bias=False)
        self.reset_weights()

    def reset_weights(self) -> None:
        """The initial combination (:data:`INITIAL_WEIGHTS`) and spread; every other weight zero."""
        k = len(self.names)
        with torch.no_grad():
            self.gate.weight.zero_()
            for i, name in enumerate(self.names):
                weight = 1.0 if INITIAL_WEIGHTS is None else INITIAL_WEIGHTS.get(name)
                self.gate.weight[0, i] = math.log(weight) if weight else _OFF_LOGIT
            self.gate.weight[0, -2] = INITIAL_SELECTION
            self.gate.weight[0, -1] = INITIAL_HOLDOUT
            self.spread.weight.copy_(torch.tensor([INITIAL_SPREAD], dtype=self.spread.weight.dtype)
                                     / SPREAD_FEATURE_SCALE)
        assert self.gate.weight.shape[1] == 3 * k + 2

    def describe_inputs(self, batch_size: int = 1) -> InputSpec:
        """GluonTS input description: ``past_target`` and ``past_observed_values``, ``[batch, P]``."""
        return InputSpec(
            {
                "past_target": Input(shape=(batch_size, self.context_length), dtype=torch.float),
                "past_observed_values": Input(shape=(batch_size, self.context_length), dtype=torch.float),
            },
            torch.zeros,
        )

    def _window(self, past_target: torch.Tensor, past_observed_values: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(scaled window with missing values filled ``[B, P]``, observed mask ``[B, P]``, scale ``[B, 1]``)."""
        obs = (past_observed_values > 0).to(past_target.dtype)
        x = torch.where(obs > 0, past_target, torch.zeros_like(past_target))
        count = obs.sum(-1, keepdim=True)
        mean_abs = x.abs().sum(-1, keepdim=True) / count.clamp(min=1.0)
        scale = torch.where(mean_abs > _MIN_SCALE, mean_abs, torch.ones_like(mean_abs))
        z = x / scale
        # last observation carried forward; before the first observed value, that value (0 if none)
        p = z.shape[-1]
        index = torch.arange(p, device=z.device).expand_as(z)
        last = torch.where(obs > 0, index, torch.full_like(index, -1)).cummax(-1).values
        first = torch.where(obs > 0, index, torch.full_like(index, p)).min(-1, keepdim=True).values.clamp(max=p - 1)
        z = z.gather(-1, torch.where(last >= 0, last, first.expand_as(last)))
        return z, obs, scale

    def _seasonal_flag(self, z: torch.Tensor) -> torch.Tensor:
        """1 where the window passes the M4 seasonality test at lag m_1 (|r_m| > 1.645 sqrt((1 + 2 sum_{k<m}
        r_k^2) / P), r the window's autocorrelation), else 0; ``[B, 1]``."""
        if not self.adjustable:
            return z.new_zeros(z.shape[0], 1)
        m, p = self.seasons[0], z.shape[-1]
        c = z - z.mean(-1, keepdim=True)
        spectrum = torch.fft.rfft(c, n=2 * p)
        acov = torch.fft.irfft(spectrum.real ** 2 + spectrum.imag ** 2, n=2 * p)[:, : m + 1]
        r = acov / acov[:, :1].clamp(min=1e-12)
        limit = _SEASONALITY_Z * torch.sqrt((1.0 + 2.0 * (r[:, 1:m] ** 2).sum(-1, keepdim=True)) / p)
        return (r[:, m: m + 1].abs() > limit).to(z.dtype)

    def candidates(self, past_target: torch.Tensor, past_observed_values: torch.Tensor) -> dict[str, torch.Tensor]:
        """Everything the learned part reads: forecasts ``F`` ``[B, H, K]``, in-sample one-step errors' log ratios
        ``[B, K]``, fit errors ``[B, K, P]``, the flag ``[B, 1]``, the mask, ``z`` and the scale (no parameters)."""
        # float64: a window's candidates and in-sample errors come out the same (to ~1e-16) whether it is computed
        # alone or in a batch (float32 matrix products round differently by batch size, and the selection weight
        # amplifies that), so the strategy's spot check compares like with like
        z, obs, scale = self._window(past_target.double(), past_observed_values)
        b, p = z.shape
        k, h = self.linear, self.prediction_length
        flag = self._seasonal_flag(z)
        forecast = z @ self.raw_forecast
        fit = z @ self.raw_fit
        if self.adjustable:
            forecast = torch.lerp(forecast, z @ self.adj_forecast, flag)
            fit = torch.lerp(fit, z @ self.adj_fit, flag)
        mask = obs.clone()
        mask[:, : self.burn_in] = 0.0
        both = mask * torch.cat([obs[:, :1], obs[:, :-1]], dim=-1)  # the value and the one before it observed
        fitted_forecast, fitted_fit = self.fitted(z, flag, both)
        forecast = torch.cat([forecast.view(b, k, h), fitted_forecast], 1).transpose(1, 2)
        errors = torch.cat([fit.view(b, k, p), fitted_fit], 1) - z[:, None, :]
        count = both.sum(-1, keepdim=True).clamp(min=1.0)
        mse = ((errors ** 2) * both[:, None, :]).sum(-1) / count
        log_mse = (mse + _MIN_SPREAD ** 2).log()
        relative = log_mse - log_mse.mean(-1, keepdim=True)
        q = self.holdout
        held = z @ self.raw_holdout
        if self.adjustable and p - q >= 2 * self.seasons[0]:
            held = torch.lerp(held, z @ self.adj_holdout, flag)
        seen = obs[:, p - q:]
        held = torch.cat([held.view(b, k, q), self.fitted_holdout(z[:, : p - q], flag, both[:, : p - q])[0]], 1)
        held_mse = (((held - z[:, None, p - q:]) ** 2) * seen[:, None, :]).sum(-1) \
            / seen.sum(-1, keepdim=True).clamp(min=1.0)
        log_held = (held_mse + _MIN_SPREAD ** 2).log()
        holdout = log_held - log_held.mean(-1, keepdim=True)
        return {"forecast": forecast, "relative": relative, "holdout": holdout, "errors": errors, "flag": flag,
                "both": both, "count": count, "z": z, "obs": obs, "scale": scale}

    def forward(self, past_target: torch.Tensor, past_observed_values: torch.Tensor
                ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``((mu, sigma), loc, scale)`` like GluonTS models: ``N(mu, sigma^2)`` on values divided by ``scale``.

        ``mu``, ``sigma``: ``[B, H]`` in scaled units; ``loc``: zeros ``[B, 1]``; ``scale``: ``[B, 1]``.
        """
        c = self.candidates(past_target, past_observed_values)
        forecast, flag = c["forecast"], c["flag"]  # float64
        dtype = self.gate.weight.dtype
        b, h, k = forecast.shape
        onehot = self.eye.to(dtype).expand(b, h, k, k)
        features = torch.cat([
            onehot,
            onehot * self.step_share.to(dtype)[None, :, None, None],
            onehot * flag.to(dtype)[:, :, None, None],
            c["relative"].to(dtype)[:, None, :, None].expand(b, h, k, 1),
            c["holdout"].to(dtype)[:, None, :, None].expand(b, h, k, 1),
        ], dim=-1)
        weights = torch.softmax(self.gate(features).squeeze(-1), dim=-1).double()  # [B, H, K]
        mu = (weights * forecast).sum(-1)
        # spread: the combined one-step in-sample errors (weights of step 1), d the m_1-step differences
        fit_error = (weights[:, 0, :, None] * c["errors"]).sum(1)
        u = (((fit_error ** 2) * c["both"]).sum(-1, keepdim=True) / c["count"] + _MIN_SPREAD ** 2).sqrt()
        d = _seasonal_difference(c["z"], c["obs"], self.seasons[0] if self.seasons else 1).clamp(min=_MIN_SPREAD)
        spread_features = torch.stack([
            torch.ones_like(mu), self.log_steps.to(mu.dtype).expand_as(mu), (d / u).log().expand_as(mu)], dim=-1)
        exponent = self.spread(spread_features.to(dtype) * SPREAD_FEATURE_SCALE).squeeze(-1)
        exponent = exponent.clamp(-_MAX_EXPONENT, _MAX_EXPONENT)
        sigma = u * exponent.double().exp()
        out = past_target.dtype
        return (mu.to(out), sigma.to(out)), torch.zeros_like(c["scale"], dtype=out), c["scale"].to(out)

    def loss(self, past_target: torch.Tensor, past_observed_values: torch.Tensor, future_target: torch.Tensor,
             future_observed_values: torch.Tensor) -> torch.Tensor:
        """Per-window training loss ``[B]``: the Gaussian CRPS in scaled units, averaged over observed steps."""
        (mu, sigma), _, scale = self(past_target=past_target, past_observed_values=past_observed_values)
        obs = future_observed_values.to(mu.dtype)
        y = torch.where(obs > 0, future_target / scale, mu.detach())
        crps = gaussian_crps(mu, sigma, y)
        return (crps * obs).sum(-1) / obs.sum(-1).clamp(min=1.0)


def _as_map(maps: np.ndarray) -> torch.Tensor:
    """``[K, R, P]`` coefficient maps as one ``[P, K*R]`` float64 matrix (``z @ map`` gives ``[B, K*R]``)."""
    k, r, p = maps.shape
    return torch.from_numpy(np.ascontiguousarray(maps.reshape(k * r, p).T)).to(torch.float64)


class _Fitted(nn.Module):
    """The :data:`~lightning_dpts.models.classical.FITTED` candidates of windows of ``p`` values, ``h`` steps ahead
    (no parameters): SES at every alpha of the grid as linear maps, then per window the alpha with the smallest
    in-sample one-step squared error (over ``mask``; near-ties, within round-off, go to the smallest alpha, so the
    choice is the same alone as in any batch); on the seasonally adjusted window where ``flag`` is 1."""

    def __init__(self, p: int, h: int, seasons: tuple[int, ...]) -> None:
        super().__init__()
        levels, fits = classical.ses_grid(p)
        comp_in, comp_out = classical.seasonal_component(p, h, seasons)
        self.adjustable = bool(seasons) and p >= 2 * seasons[0]
        as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64))  # noqa: E731
        self.register_buffer("level", as_tensor(levels.T), persistent=False)  # [P, G]
        self.register_buffer("fit", _as_map(fits), persistent=False)  # [P, G*P]
        self.register_buffer("drift", as_tensor(classical.theta_drift(p, h)), persistent=False)  # [G, H]
        self.register_buffer("slope", as_tensor(classical.slope(p)[:, None]), persistent=False)  # [P, 1]
        self.register_buffer("alphas", as_tensor(classical.FIT_ALPHAS), persistent=False)
        self.register_buffer("comp_in", as_tensor(comp_in.T), persistent=False)  # [P, P]
        self.register_buffer("comp_out", as_tensor(comp_out.T), persistent=False)  # [P, H]

    def forward(self, z: torch.Tensor, flag: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(forecasts ``[B, 2, H]``, one-step in-sample fits ``[B, 2, P]``) of ``z`` ``[B, P]`` (float64)."""
        b, p = z.shape
        g, h = self.alphas.numel(), self.drift.shape[1]
        seasonal_in, seasonal_out = z.new_zeros(b, p), z.new_zeros(b, h)
        if self.adjustable:
            seasonal_in, seasonal_out = flag * (z @ self.comp_in), flag * (z @ self.comp_out)
        y = z - seasonal_in
        fits = (y @ self.fit).view(b, g, p)
        sse = (((fits - y[:, None, :]) ** 2) * mask[:, None, :]).sum(-1)  # [B, G]
        least = sse.min(-1, keepdim=True).values
        best = (sse <= least * (1.0 + _TIE_RTOL) + _TIE_ATOL).to(sse.dtype).argmax(-1)  # first near-least: batch-proof
        level = (y @ self.level).gather(1, best[:, None])  # [B, 1]
        fit = fits.gather(1, best[:, None, None].expand(b, 1, p)).squeeze(1)
        trend = y @ self.slope  # [B, 1]
        later = torch.ones_like(fit)
        later[:, 0] = 0.0  # z_0 "predicts" itself
        theta_fit = fit + later * trend / (2.0 * self.alphas[best][:, None])
        forecasts = torch.stack([level.expand(b, h), level + self.drift[best] * trend], 1) + seasonal_out[:, None]
        return forecasts, torch.stack([fit, theta_fit], 1) + seasonal_in[:, None]


def _seasonal_difference(z: torch.Tensor, obs: torch.Tensor, m: int) -> torch.Tensor:
    """Mean absolute m-step difference of the observed values of each window ``[B, 1]`` (seasonal naive's in-sample
    error; m = 1 when the window is too short)."""
    m = m if z.shape[-1] > m else 1
    both = obs[:, m:] * obs[:, :-m]
    return ((z[:, m:] - z[:, :-m]).abs() * both).sum(-1, keepdim=True) / both.sum(-1, keepdim=True).clamp(min=1.0)


class CombinationLightningModule(CRPSSteps):
    """LightningModule of :class:`CombinationModel` (GluonTS-style: ``model_kwargs``, ``lr``, ``weight_decay``).

    ``training_step`` returns the mean per-window CRPS over the batch (``loss_reduction="mean"`` for
    :class:`~lightning_dpts.training.DPForecastStrategy`); Adam. ``lr_schedule`` (``"cosine"`` by default, or
    ``"linear"``, ``"constant"``): :func:`~lightning_dpts.training.averaging.step_schedule` over the Trainer's
    planned optimizer steps, with ``warmup`` (a share of them) - a function of the step number only, never of data,
    so the DP strategy keeps it.
    """

    @validated()
    def __init__(self, model_kwargs: dict, lr: float = 1e-2, weight_decay: float = 0.0, lr_schedule: str = "cosine",
                 warmup: float = 0.05) -> None:
        super().__init__()
        from lightning_dpts.training.averaging import SCHEDULES

        if lr_schedule not in SCHEDULES:
            raise ConfigurationError("lr_schedule", lr_schedule, f"must be one of {', '.join(SCHEDULES)}")
        self.model = CombinationModel(**model_kwargs)
        self.lr = lr
        self.weight_decay = weight_decay
        self.lr_schedule = lr_schedule
        self.warmup = warmup
        self.inputs = self.model.describe_inputs()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.forward(*args, **kwargs)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.loss(**select(self.inputs, batch), future_target=batch["future_target"],
                               future_observed_values=batch["future_observed_values"]).mean()

    def configure_optimizers(self) -> Any:
        from lightning_dpts.training.averaging import planned_steps, step_schedule

        groups = [{"params": [self.model.gate.weight], "lr": self.lr * GATE_LR_FACTOR},
                  {"params": [self.model.spread.weight], "lr": self.lr * SPREAD_LR_FACTOR}]
        optimizer = torch.optim.Adam(groups, lr=self.lr, weight_decay=self.weight_decay)
        trainer = getattr(self, "_trainer", None)
        total = None if trainer is None else planned_steps(trainer)
        if self.lr_schedule == "constant" or total is None:
            return optimizer
        schedule = step_schedule(optimizer, total, self.lr_schedule, warmup=self.warmup)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class CombinationEstimator(SeasonalLinearEstimator):
    """GluonTS estimator of :class:`CombinationLightningModule` (``dpts fit``, export, ``dpts predict``,
    :class:`~lightning_dpts.gluonts.PrivateEstimator`).

    Args:
        prediction_length: H, forecast steps.
        context_length: P >= 3, the past window (time steps); the recipe chooses it from public metadata.
        freq: the pandas frequency, for the seasons (:func:`~lightning_dpts.data.seasonality.season_lengths`).
        season_length: the primary season instead of the frequency's (``None``: the frequency's; 1: none).
        lr, weight_decay, lr_schedule, warmup: of :class:`CombinationLightningModule`.
        batch_size: windows per batch of GluonTS's own loaders and of the predictor.
        num_batches_per_epoch: batches per epoch of GluonTS's own training loader (``estimator.train``).
        trainer_kwargs: for ``estimator.train`` only.
    """

    @validated()
    def __init__(self, prediction_length: int, context_length: int, freq: str, season_length: int | None = None,
                 lr: float = 1e-2, weight_decay: float = 0.0, lr_schedule: str = "cosine", warmup: float = 0.05,
                 batch_size: int = 32, num_batches_per_epoch: int = 50,
                 trainer_kwargs: dict[str, Any] | None = None) -> None:
        from gluonts.torch.model.estimator import PyTorchLightningEstimator

        from lightning_dpts.data.seasonality import season_lengths

        PyTorchLightningEstimator.__init__(self, trainer_kwargs={"max_epochs": 100, **(trainer_kwargs or {})})
        _check(prediction_length, context_length)
        self.prediction_length = prediction_length
        self.context_length = context_length
        self.freq = freq
        self.seasons = season_lengths(freq, season_length)
        self.season_length = self.seasons[0]
        self.lr = lr
        self.weight_decay = weight_decay
        self.lr_schedule = lr_schedule
        self.warmup = warmup
        self.batch_size = batch_size
        self.num_batches_per_epoch = num_batches_per_epoch
        self.distr_output = NormalOutput()

    def create_lightning_module(self) -> pl.LightningModule:
        return CombinationLightningModule(
            lr=self.lr, weight_decay=self.weight_decay, lr_schedule=self.lr_schedule, warmup=self.warmup,
            model_kwargs={"prediction_length": self.prediction_length, "context_length": self.context_length,
                          "seasons": list(self.seasons)},
        )

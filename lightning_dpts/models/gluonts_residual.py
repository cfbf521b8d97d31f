"""Seasonal residual wrapper for GluonTS modules: the output distribution's location is shifted by seasonal naive.

:func:`~lightning_dpts.models.seasonal_residual` calls :func:`wrap_gluonts` for a GluonTS LightningModule. The
module stays the same object (its ``training_step``, optimiser and ``estimator.create_predictor(...)`` are
unchanged); its class becomes the matching ``Seasonal...LightningModule`` defined here (GluonTS' own arguments
plus ``season_length``, so that ``predictor.serialize``/``Predictor.deserialize`` give back the wrapped model), its
inner ``model`` changes class to a subclass that adds a location to the output distribution, and the projection of
the distribution's ``loc`` argument starts at zero weights and bias:

* **SimpleFeedForward, DLinear** (forecast the horizon at once from the past window): the distribution GluonTS
  builds is ``loc + scale * D(args)``; ``loc`` (zero before) becomes seasonal naive's forecast ``b_h`` from the
  window's own past window (one season back, the last value for m = 1; a missing value reads as the window's
  mean, as in :class:`~lightning_dpts.models.SeasonalLinearModel`), in data units. The network's ``loc`` argument
  is the correction in units of the window's mean |x|; at initialisation it is 0 and the forecast's median **is**
  seasonal naive.
* **DeepAR** (autoregressive): the distribution of the value at time t gets location ``y[t - m]``, the value one
  season back (teacher-forced in training, the sampled path at prediction), so with a zero correction DeepAR
  forecasts seasonal naive. This needs ``max(lags_seq) >= m - 1`` (the value is read from the past window DeepAR
  already reads: context plus lags, so L_C is unchanged); refused otherwise.

Every shift is computed from one window alone: the strategy's independence probe accepts the wrapped module, and
per-window gradients are those of the unchanged layers. Distributions without a location argument (``loc`` in
``distr_output.args_dim``: StudentT and Normal have one; NegativeBinomial, Poisson do not) are refused.
"""

from __future__ import annotations

from typing import Any

import torch
from gluonts.torch.model.d_linear.lightning_module import DLinearLightningModule
from gluonts.torch.model.d_linear.module import DLinearModel
from gluonts.torch.model.deepar.lightning_module import DeepARLightningModule
from gluonts.torch.model.deepar.module import DeepARModel
from gluonts.torch.model.simple_feedforward.lightning_module import SimpleFeedForwardLightningModule
from gluonts.torch.model.simple_feedforward.module import SimpleFeedForwardModel
from gluonts.torch.util import lagged_sequence_values, take_last
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.models.seasonal_linear import SeasonalLinearModel

__all__ = ["SUPPORTED_GLUONTS_MODELS", "wrap_gluonts"]


def _naive_forecast(naive: SeasonalLinearModel, past_target: torch.Tensor,
                    past_observed_values: torch.Tensor | None) -> torch.Tensor:
    """Seasonal naive's forecast ``[B, H]`` in data units from the last P values of each window."""
    p = naive.context_length
    past = past_target[..., -p:]
    observed = torch.ones_like(past) if past_observed_values is None else past_observed_values[..., -p:]
    _, baseline, _, scale = naive._features(past, observed)
    return baseline * scale


class _NaiveShift:
    """Mixin state: the features-only seasonal naive of the wrapped model (no parameters)."""

    seasonal_naive: SeasonalLinearModel
    season_length: int


class SeasonalSimpleFeedForwardModel(SimpleFeedForwardModel, _NaiveShift):
    """SimpleFeedForward whose distribution's location is seasonal naive's forecast (module docstring)."""

    def forward(self, past_target: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
        distr_args, loc, scale = super().forward(past_target)
        return distr_args, loc + _naive_forecast(self.seasonal_naive, past_target, None), scale


class SeasonalDLinearModel(DLinearModel, _NaiveShift):
    """DLinear whose distribution's location is seasonal naive's forecast (module docstring)."""

    def forward(self, past_target: torch.Tensor, past_observed_values: torch.Tensor
                ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
        distr_args, loc, scale = super().forward(past_target, past_observed_values)
        return distr_args, loc + _naive_forecast(self.seasonal_naive, past_target, past_observed_values), scale


class SeasonalDeepARModel(DeepARModel, _NaiveShift):
    """DeepAR whose distribution at time t has location ``y[t - m]`` (module docstring).

    ``loss`` and ``forward`` (sampling) are those of GluonTS' DeepAR with the location added to the output
    distribution; the network's layers and inputs are unchanged.
    """

    def loss(self, feat_static_cat: torch.Tensor, feat_static_real: torch.Tensor, past_time_feat: torch.Tensor,
             past_target: torch.Tensor, past_observed_values: torch.Tensor, future_time_feat: torch.Tensor,
             future_target: torch.Tensor, future_observed_values: torch.Tensor, future_only: bool = False,
             aggregate_by: Any = torch.mean) -> torch.Tensor:
        """Per-window negative log-likelihood ``[B]`` over the unrolled context and horizon (as GluonTS')."""
        if future_target.dim() != past_target.dim():
            raise ConfigurationError("future_target", tuple(future_target.shape), "must have the batch shape of "
                                     "past_target (the seasonal DeepAR wrapper does not take sample dimensions)")
        params, scale, _, _, _ = self.unroll_lagged_rnn(feat_static_cat, feat_static_real, past_time_feat,
                                                        past_target, past_observed_values, future_time_feat,
                                                        future_target)
        m, h = self.season_length, self.prediction_length
        series = torch.cat((past_target, future_target), dim=1)
        steps = params[0].shape[1]  # context_length - 1 + H predicted values
        end = series.shape[1]
        shift = series[:, end - steps - m: end - m]  # y[t - m] for every predicted t
        target = series[:, end - steps:]
        observed = torch.cat((take_last(past_observed_values, dim=-1, num=steps - h), future_observed_values), dim=1)
        if future_only:
            params = tuple(p[:, -h:] for p in params)
            shift, target, observed = shift[:, -h:], target[:, -h:], observed[:, -h:]
        values = self.distr_output.loss(target=target, distr_args=params, loc=shift, scale=scale) * observed
        return aggregate_by(values, dim=(1,))

    def forward(self, feat_static_cat: torch.Tensor, feat_static_real: torch.Tensor, past_time_feat: torch.Tensor,
                past_target: torch.Tensor, past_observed_values: torch.Tensor, future_time_feat: torch.Tensor,
                num_parallel_samples: int | None = None) -> torch.Tensor:
        """Sample paths ``[B, num_parallel_samples, H]``: DeepAR's ancestral sampling with the location y[t - m]."""
        n = num_parallel_samples or self.num_parallel_samples
        m = self.season_length
        params, scale, _, static_feat, state = self.unroll_lagged_rnn(
            feat_static_cat, feat_static_real, past_time_feat, past_target, past_observed_values,
            future_time_feat[:, :1])
        scale_n = scale.repeat_interleave(n, dim=0)
        static_n = static_feat.repeat_interleave(n, dim=0).unsqueeze(1)
        time_n = future_time_feat.repeat_interleave(n, dim=0)
        state_n = [s.repeat_interleave(n, dim=1) for s in state]
        series = past_target.repeat_interleave(n, dim=0)  # data units: the past, then the sampled path
        scaled_past = series / scale_n
        args = [p.repeat_interleave(n, dim=0)[:, -1:] for p in params]
        samples = []
        for k in range(self.prediction_length):
            if k > 0:
                scaled = samples[-1] / scale_n
                lags = lagged_sequence_values(self.lags_seq, scaled_past, scaled, dim=-1)
                features = torch.cat((static_n, time_n[:, k: k + 1]), dim=-1)
                output, state_n = self.rnn(torch.cat((lags, features), dim=-1), state_n)
                scaled_past = torch.cat((scaled_past, scaled), dim=1)
                args = self.param_proj(output)
            loc = series[:, series.shape[1] - m: series.shape[1] - m + 1]
            sample = self.distr_output.distribution(args, loc=loc, scale=scale_n).sample()
            samples.append(sample)
            series = torch.cat((series, sample), dim=1)
        paths = self.post_process_samples(torch.cat(samples, dim=1))
        return paths.reshape(-1, n, self.prediction_length)


class _SeasonalLightning:
    """Mixin of the wrapped LightningModules: built from the GluonTS module's own arguments plus ``season_length``,
    so that GluonTS serialisation (``predictor.serialize`` / ``Predictor.deserialize``, which rebuild the module
    from its ``__init_args__`` and then load the weights) gives back the wrapped model, not the plain one."""

    def __init__(self, *args: Any, season_length: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        _wrap_inner(self, season_length)


class SeasonalSimpleFeedForwardLightningModule(_SeasonalLightning, SimpleFeedForwardLightningModule):
    """SimpleFeedForward's LightningModule with :class:`SeasonalSimpleFeedForwardModel` inside."""


class SeasonalDLinearLightningModule(_SeasonalLightning, DLinearLightningModule):
    """DLinear's LightningModule with :class:`SeasonalDLinearModel` inside."""


class SeasonalDeepARLightningModule(_SeasonalLightning, DeepARLightningModule):
    """DeepAR's LightningModule with :class:`SeasonalDeepARModel` inside."""


#: GluonTS LightningModule -> (its wrapped LightningModule, the inner model's class, its wrapped subclass, the
#: projection holding the distribution's arguments).
SUPPORTED_GLUONTS_MODELS: dict[type, tuple[type, type, type, str]] = {
    SimpleFeedForwardLightningModule: (SeasonalSimpleFeedForwardLightningModule, SimpleFeedForwardModel,
                                       SeasonalSimpleFeedForwardModel, "args_proj"),
    DLinearLightningModule: (SeasonalDLinearLightningModule, DLinearModel, SeasonalDLinearModel, "args_proj"),
    DeepARLightningModule: (SeasonalDeepARLightningModule, DeepARModel, SeasonalDeepARModel, "param_proj"),
}


def wrap_gluonts(module: Any, season_length: int) -> Any:
    """Make ``module`` (a GluonTS LightningModule of SimpleFeedForward, DLinear or DeepAR) seasonal naive plus its
    correction, in place; returns ``module`` (its class becomes the matching ``Seasonal...LightningModule``).

    Raises:
        ConfigurationError: another GluonTS model, a distribution without a location, a past window too short for
            seasonal naive (P < max(2, m + 1) for SimpleFeedForward/DLinear; max lag < m - 1 for DeepAR), or a
            module that is already wrapped.
    """
    kind = type(module)
    if kind in {entry[0] for entry in SUPPORTED_GLUONTS_MODELS.values()}:
        raise ConfigurationError("net", kind.__name__, "is already wrapped by seasonal_residual")
    expected_inner = SUPPORTED_GLUONTS_MODELS[kind][1] if kind in SUPPORTED_GLUONTS_MODELS else None
    if expected_inner is None or type(getattr(module, "model", None)) is not expected_inner:
        names = ", ".join(k.__name__ for k in SUPPORTED_GLUONTS_MODELS)
        inner = type(getattr(module, "model", None)).__name__
        raise ConfigurationError("net", f"{kind.__name__} ({inner})",
                                 f"is a GluonTS module seasonal_residual does not support; supported: {names} "
                                 "(as created by their estimators), or a plain torch module mapping the scaled past "
                                 "window [batch, P] to a correction [batch, H]")
    _check(module.model, int(season_length))
    module.__class__ = SUPPORTED_GLUONTS_MODELS[kind][0]
    _wrap_inner(module, int(season_length))
    return module


def _check(inner: Any, m: int) -> None:
    if "loc" not in list(getattr(inner.distr_output, "args_dim", {})):
        raise ConfigurationError("distr_output", type(inner.distr_output).__name__,
                                 "has no location argument ('loc'); use StudentTOutput or NormalOutput with "
                                 "seasonal_residual")
    if m < 1:
        raise ConfigurationError("season_length", m, "must be an integer >= 1")
    if isinstance(inner, DeepARModel):
        if max(inner.lags_seq) < m - 1:
            raise ConfigurationError("lags_seq", [lag + 1 for lag in inner.lags_seq],
                                     f"must reach one season back (a lag >= {m}) for the location y[t - {m}]")
    elif int(inner.context_length) < max(2, m + 1):
        raise ConfigurationError("context_length", int(inner.context_length), f"must be >= {max(2, m + 1)} "
                                 f"(seasonal naive reads one season of {m} steps back)")


def _wrap_inner(module: Any, m: int) -> None:
    """Swap the inner model's class, add its seasonal naive, zero the ``loc`` projection, record ``season_length``
    in the module's ``__init_args__`` (GluonTS serialisation)."""
    inner = module.model
    _check(inner, m)
    _, plain, wrapped, proj_name = next(v for k, v in SUPPORTED_GLUONTS_MODELS.items() if isinstance(module, k))
    if not isinstance(inner, DeepARModel):
        naive = SeasonalLinearModel(inner.prediction_length, int(inner.context_length), m)
        del naive.proj  # features only: no parameters
        inner.seasonal_naive = naive
    inner.season_length = m
    inner.__class__ = wrapped
    proj = getattr(inner, proj_name).proj[list(inner.distr_output.args_dim).index("loc")]
    if not isinstance(proj, nn.Linear):
        raise ConfigurationError("distr_output", type(inner.distr_output).__name__, "must project its 'loc' "
                                 "argument with an nn.Linear")
    nn.init.zeros_(proj.weight)
    if proj.bias is not None:
        nn.init.zeros_(proj.bias)
    module.__init_args__ = {**getattr(module, "__init_args__", {}), "season_length": m}

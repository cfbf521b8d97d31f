"""``seasonal_linear``: a compact forecaster for DP training, a learned correction of seasonal naive.

Why a compact model. DP-SGD adds noise of std sigma*C/Lambda to *every* coordinate of the averaged gradient
(Algorithm 2), so the noise's share of an update grows with the number of parameters, while the signal does
not. A forecaster with a handful of weights, initialised at a strong baseline, turns a small privacy budget into
a usable model: at initialisation it *is* seasonal naive (with a probabilistic spread), and the noise on a few
weights that multiply small, centred features cannot move it far.

The model, per window (every quantity is computed from that window alone, so windows stay independent;
docs/privacy.md, rule 8). ``P`` is the past window (``context_length``; the model reads nothing older, so ``P`` is
the whole L_C the accountant counts, trap 3), ``m`` the season length, ``H`` the horizon, ``q = floor(P / 2)``:

1. mean scaling: ``s = mean |x_t|`` over the observed past values (1 when none is observed), ``z = x / s``;
2. baseline: seasonal naive, ``b_h = z[P - m + (h mod m)]`` (the context mean where that value is missing);
3. features of horizon step ``h`` (``k_h = m * (floor(h / m) + 1)`` steps from the baseline's value):
   ``drift * k_h`` with ``drift = (mean z[-q:] - mean z[-2q:-q]) / q``; ``mean z[-q:] - b_h`` (towards the
   recent level); ``z[-1] - b_h`` (towards the last value; zero when m = 1); ``log k_h``;
4. one ``nn.Linear(4, 2)`` shared by all horizon steps, weights and biases **zero at initialisation**:
   location ``mu_h = b_h + out_h[0]``; spread ``sigma_h = d * sqrt(k_h) * softplus(out_h[1] + s_0)``, with ``d``
   the window's mean absolute ``m``-step difference (the in-sample error of seasonal naive) and
   ``softplus(s_0) = 1.25`` (sqrt(pi/2): a Gaussian's std over its mean absolute deviation);
5. output: a Gaussian ``N(mu_h, sigma_h^2)`` on the scaled values, rescaled by ``s`` (GluonTS ``NormalOutput``
   with ``loc = 0``, ``scale = s``), trained on its closed-form CRPS (Gneiting & Raftery 2007, Eq. 21), the metric
   ``dpts fit`` reports; its gradients are bounded in the location (|dCRPS/dmu| <= 1 per step), so per-window
   clipping rarely biases them.

Ten trainable parameters; per-window gradient norms come from the linear-layer fast path of
:class:`~lightning_dpts.training.engine.PerWindowClipper`. The classes follow the interface of GluonTS's torch
models (``describe_inputs``, ``forward`` returning ``(distr_args, loc, scale)``, a ``@validated`` LightningModule
taking ``model_kwargs`` and a ``PyTorchLightningEstimator``), so ``dpts fit``, its export and ``dpts predict``
use it like the GluonTS models.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from gluonts.core.component import validated
from gluonts.dataset.common import Dataset
from gluonts.dataset.field_names import FieldName
from gluonts.dataset.loader import as_stacked_batches
from gluonts.itertools import Cyclic, select
from gluonts.model import Input, InputSpec
from gluonts.torch.distributions import NormalOutput
from gluonts.torch.model.estimator import PyTorchLightningEstimator
from gluonts.torch.model.predictor import PyTorchPredictor
from gluonts.transform import (
    AddObservedValuesIndicator,
    ExpectedNumInstanceSampler,
    InstanceSplitter,
    SelectFields,
    TestSplitSampler,
    Transformation,
    ValidationSplitSampler,
)
from torch import nn

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "NUM_FEATURES",
    "SeasonalLinearEstimator",
    "SeasonalLinearLightningModule",
    "SeasonalLinearModel",
    "gaussian_crps",
]

#: Features per horizon step (drift, recent level, last value, log steps ahead).
NUM_FEATURES = 4
#: softplus(s_0): the initial spread is 1.25 (~ sqrt(pi/2)) times the window's mean absolute m-step difference.
_SPREAD_AT_INIT = 1.25
_MIN_SCALE = 1e-10  # mean |x| below this counts as zero (no observed magnitude)
_MIN_SPREAD = 1e-3  # smallest d, in scaled units (a constant window still gets a proper distribution)
_PREDICTION_INPUT_NAMES = ["past_target", "past_observed_values"]
_TRAINING_INPUT_NAMES = _PREDICTION_INPUT_NAMES + ["future_target", "future_observed_values"]


def gaussian_crps(mu: torch.Tensor, sigma: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """CRPS of ``N(mu, sigma^2)`` at ``y``, elementwise (Gneiting & Raftery 2007, Eq. 21).

    ``sigma * [z (2 Phi(z) - 1) + 2 phi(z) - 1 / sqrt(pi)]`` with ``z = (y - mu) / sigma``; same units as ``y``.
    """
    z = (y - mu) / sigma
    normal = torch.distributions.Normal(torch.zeros((), dtype=z.dtype), torch.ones((), dtype=z.dtype))
    return sigma * (z * (2.0 * normal.cdf(z) - 1.0) + 2.0 * normal.log_prob(z).exp() - 1.0 / math.sqrt(math.pi))


def _check_lengths(prediction_length: int, context_length: int, season_length: int) -> None:
    for name, value in (("prediction_length", prediction_length), ("context_length", context_length),
                        ("season_length", season_length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigurationError(name, value, "must be an integer >= 1")
    if context_length < max(2, season_length + 1):
        raise ConfigurationError(
            "context_length", context_length,
            f"seasonal_linear reads seasonal naive's value and one m-step difference from the past window: it must "
            f"be >= max(2, season_length + 1) = {max(2, season_length + 1)}",
        )


class SeasonalLinearModel(nn.Module):
    """The network (see the module docstring): seasonal naive plus a zero-initialised linear correction.

    Args:
        prediction_length: H, forecast steps.
        context_length: P, the whole past window read (time steps; there are no lags beyond it).
        season_length: m >= 1 (1: the baseline is the last value, "naive").
    """

    @validated()
    def __init__(self, prediction_length: int, context_length: int, season_length: int = 1) -> None:
        super().__init__()
        _check_lengths(prediction_length, context_length, season_length)
        self.prediction_length = prediction_length
        self.context_length = context_length
        self.season_length = season_length
        self.distr_output = NormalOutput()
        h = torch.arange(prediction_length)
        steps_ahead = (season_length * (h // season_length + 1)).to(torch.float32)  # k_h
        self.register_buffer("steps_ahead", steps_ahead, persistent=False)
        self.register_buffer("baseline_index", context_length - season_length + h % season_length, persistent=False)
        self.proj = nn.Linear(NUM_FEATURES, 2)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)
        self.spread_offset = math.log(math.expm1(_SPREAD_AT_INIT))  # s_0, a constant

    def describe_inputs(self, batch_size: int = 1) -> InputSpec:
        """GluonTS input description: ``past_target`` and ``past_observed_values``, ``[batch, P]``."""
        return InputSpec(
            {
                "past_target": Input(shape=(batch_size, self.context_length), dtype=torch.float),
                "past_observed_values": Input(shape=(batch_size, self.context_length), dtype=torch.float),
            },
            torch.zeros,
        )

    def _features(self, past_target: torch.Tensor, past_observed_values: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features ``[B, H, 4]``, baseline ``[B, H]``, spread unit d * sqrt(k_h) ``[B, H]``, scale ``[B, 1]``)."""
        obs = past_observed_values.to(past_target.dtype)
        x = torch.where(obs > 0, past_target, torch.zeros_like(past_target))
        count = obs.sum(-1, keepdim=True)
        mean_abs = x.abs().sum(-1, keepdim=True) / count.clamp(min=1.0)
        scale = torch.where(mean_abs > _MIN_SCALE, mean_abs, torch.ones_like(mean_abs))
        z = x / scale
        level = (z * obs).sum(-1, keepdim=True) / count.clamp(min=1.0)  # context mean of observed values
        z = torch.where(obs > 0, z, level.expand_as(z))  # a missing value reads as the window's mean
        m, p = self.season_length, self.context_length
        baseline = z[:, self.baseline_index]
        q = p // 2
        recent = z[:, p - q:].mean(-1, keepdim=True)
        drift = (recent - z[:, p - 2 * q: p - q].mean(-1, keepdim=True)) / q
        both = obs[:, m:] * obs[:, :-m]
        d = ((z[:, m:] - z[:, :-m]).abs() * both).sum(-1, keepdim=True) / both.sum(-1, keepdim=True).clamp(min=1.0)
        d = d.clamp(min=_MIN_SPREAD)
        k = self.steps_ahead.to(z.dtype)
        features = torch.stack(
            [drift * k, recent - baseline, z[:, -1:] - baseline, k.log().expand_as(baseline)], dim=-1
        )
        return features, baseline, d * k.sqrt(), scale

    def forward(self, past_target: torch.Tensor, past_observed_values: torch.Tensor
                ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor]:
        """``((mu, sigma), loc, scale)`` like GluonTS models: ``N(mu, sigma^2)`` on values divided by ``scale``.

        ``mu``, ``sigma``: ``[B, H]`` in scaled units; ``loc``: zeros ``[B, 1]``; ``scale``: ``[B, 1]``.
        """
        features, baseline, unit, scale = self._features(past_target, past_observed_values)
        out = self.proj(features)
        mu = baseline + out[..., 0]
        sigma = unit * nn.functional.softplus(out[..., 1] + self.spread_offset)
        return (mu, sigma), torch.zeros_like(scale), scale

    def loss(self, past_target: torch.Tensor, past_observed_values: torch.Tensor, future_target: torch.Tensor,
             future_observed_values: torch.Tensor) -> torch.Tensor:
        """Per-window training loss ``[B]``: the Gaussian CRPS in scaled units, averaged over observed steps."""
        (mu, sigma), _, scale = self(past_target=past_target, past_observed_values=past_observed_values)
        obs = future_observed_values.to(mu.dtype)
        y = torch.where(obs > 0, future_target / scale, mu.detach())
        crps = gaussian_crps(mu, sigma, y)
        return (crps * obs).sum(-1) / obs.sum(-1).clamp(min=1.0)


class CRPSSteps(pl.LightningModule):
    """Training and validation steps of a module whose ``_loss(batch)`` is the mean per-window CRPS (logged as
    ``train_loss`` / ``val_loss``): shared by the seasonal models."""

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:  # type: ignore[override]
        loss = self._loss(batch)
        self.log("train_loss", loss, on_epoch=True, on_step=False, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:  # type: ignore[override]
        loss = self._loss(batch)
        self.log("val_loss", loss, on_epoch=True, on_step=False, prog_bar=True)
        return loss


class SeasonalLinearLightningModule(CRPSSteps):
    """LightningModule of :class:`SeasonalLinearModel` (GluonTS-style: ``model_kwargs``, ``lr``, ``weight_decay``).

    ``training_step`` returns the mean of the per-window CRPS over the batch (``loss_reduction="mean"`` for
    :class:`~lightning_dpts.training.DPForecastStrategy`); Adam optimiser. ``lr_schedule="constant"``
    (default) keeps ``lr``; ``"cosine"`` decays it to 0 along a half cosine over the Trainer's planned optimizer
    steps (``trainer.estimated_stepping_batches``). The schedule depends only on the step number, never on data
    (it has no ``monitor``), so the DP strategy keeps it. On validation windows the constant rate did better at
    the recipe's step counts (docs/recipe.md).
    """

    @validated()
    def __init__(self, model_kwargs: dict, lr: float = 1e-2, weight_decay: float = 0.0,
                 lr_schedule: str = "constant") -> None:
        super().__init__()
        if lr_schedule not in ("cosine", "constant"):
            raise ConfigurationError("lr_schedule", lr_schedule, "must be 'cosine' or 'constant'")
        self.model = SeasonalLinearModel(**model_kwargs)
        self.lr = lr
        self.weight_decay = weight_decay
        self.lr_schedule = lr_schedule
        self.inputs = self.model.describe_inputs()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.model.forward(*args, **kwargs)

    def _loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model.loss(**select(self.inputs, batch), future_target=batch["future_target"],
                               future_observed_values=batch["future_observed_values"]).mean()

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        total = self._planned_steps()
        if self.lr_schedule == "constant" or total is None:
            return optimizer
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total)))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def _planned_steps(self) -> int | None:
        """The Trainer's planned optimizer steps, or ``None`` when unknown (no Trainer, or unbounded)."""
        try:
            total = self.trainer.estimated_stepping_batches
        except (RuntimeError, AttributeError):
            return None
        if not isinstance(total, (int, float)) or not math.isfinite(total) or total < 1:
            return None
        return int(total)


class SeasonalLinearEstimator(PyTorchLightningEstimator):
    """GluonTS estimator of :class:`SeasonalLinearLightningModule` (for ``dpts fit``, export and ``dpts predict``).

    Args:
        prediction_length: H, forecast steps.
        context_length: P, the past window (time steps), >= max(2, season_length + 1).
        season_length: m, the season of the baseline (GluonTS ``get_seasonality(freq)`` in ``dpts fit``).
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        lr_schedule: ``"constant"`` (default) or ``"cosine"`` (decay to 0 over the planned steps).
        batch_size: windows per batch of GluonTS's own loaders and of the predictor.
        num_batches_per_epoch: batches per epoch of GluonTS's own training loader (``estimator.train``; not
            used by ``dpts fit``, which trains on the structured-subsampling datamodule).
        trainer_kwargs: for ``estimator.train`` only.
    """

    @validated()
    def __init__(self, prediction_length: int, context_length: int, season_length: int = 1, lr: float = 1e-2,
                 weight_decay: float = 0.0, lr_schedule: str = "constant", batch_size: int = 32,
                 num_batches_per_epoch: int = 50, trainer_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(trainer_kwargs={"max_epochs": 100, **(trainer_kwargs or {})})
        _check_lengths(prediction_length, context_length, season_length)
        self.prediction_length = prediction_length
        self.context_length = context_length
        self.season_length = season_length
        self.lr = lr
        self.weight_decay = weight_decay
        self.lr_schedule = lr_schedule
        self.batch_size = batch_size
        self.num_batches_per_epoch = num_batches_per_epoch
        self.distr_output = NormalOutput()

    def create_transformation(self) -> Transformation:
        return SelectFields([FieldName.ITEM_ID, FieldName.INFO, FieldName.START, FieldName.TARGET],
                            allow_missing=True) + AddObservedValuesIndicator(
            target_field=FieldName.TARGET, output_field=FieldName.OBSERVED_VALUES)

    def create_lightning_module(self) -> pl.LightningModule:
        return SeasonalLinearLightningModule(
            lr=self.lr, weight_decay=self.weight_decay, lr_schedule=self.lr_schedule,
            model_kwargs={"prediction_length": self.prediction_length, "context_length": self.context_length,
                          "season_length": self.season_length},
        )

    def _splitter(self, mode: str) -> InstanceSplitter:
        sampler = {
            "training": ExpectedNumInstanceSampler(num_instances=1.0, min_future=self.prediction_length),
            "validation": ValidationSplitSampler(min_future=self.prediction_length),
            "test": TestSplitSampler(),
        }[mode]
        return InstanceSplitter(
            target_field=FieldName.TARGET, is_pad_field=FieldName.IS_PAD, start_field=FieldName.START,
            forecast_start_field=FieldName.FORECAST_START, instance_sampler=sampler,
            past_length=self.context_length, future_length=self.prediction_length,
            time_series_fields=[FieldName.OBSERVED_VALUES], dummy_value=self.distr_output.value_in_support,
        )

    def create_training_data_loader(self, data: Dataset, module: pl.LightningModule,
                                    shuffle_buffer_length: int | None = None, **kwargs: Any) -> Iterable:
        instances = self._splitter("training").apply(Cyclic(data).stream(), is_train=True)
        return as_stacked_batches(instances, batch_size=self.batch_size, shuffle_buffer_length=shuffle_buffer_length,
                                  field_names=_TRAINING_INPUT_NAMES, output_type=torch.tensor,
                                  num_batches_per_epoch=self.num_batches_per_epoch)

    def create_validation_data_loader(self, data: Dataset, module: pl.LightningModule, **kwargs: Any) -> Iterable:
        instances = self._splitter("validation").apply(data, is_train=True)
        return as_stacked_batches(instances, batch_size=self.batch_size, field_names=_TRAINING_INPUT_NAMES,
                                  output_type=torch.tensor)

    def create_predictor(self, transformation: Transformation, module: pl.LightningModule) -> PyTorchPredictor:
        return PyTorchPredictor(
            input_transform=transformation + self._splitter("test"), input_names=_PREDICTION_INPUT_NAMES,
            prediction_net=module, forecast_generator=self.distr_output.forecast_generator,
            batch_size=self.batch_size, prediction_length=self.prediction_length, device="auto",
        )

"""No false refusal (issue 25): the probe and the per-step spot check let independent models through on the
datamodule's real batches, with and without missing values, and ``per_window="auto"`` keeps them on the fast
path; for these models the isolated mode releases the same update as the fast path."""

from __future__ import annotations

import warnings

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.training import DPForecastStrategy

from .conftest import MODEL_NAMES, make_module, trainer

H_SL, CTX_SL = 4, 12


def _series(missing: bool, n: int = 12, length: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    out = [(5 + np.sin(np.arange(length) / 3) + rng.normal(0, 0.3, length)).astype(np.float32) for _ in range(n)]
    if missing:
        for k, s in enumerate(out):
            s[rng.choice(length, size=length // 4, replace=False)] = np.nan
            if k % 3 == 0:
                s[-20:-10] = np.nan  # whole stretches missing
    return out


class LSTMForecaster(L.LightningModule):
    """A user module with an ``nn.LSTM`` (trained as ``DPFastLSTM``) on the datamodule's dict batches."""

    def __init__(self, context: int = 8, horizon: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.context_length, self.prediction_length = context, horizon
        self.lstm = nn.LSTM(2, 6, num_layers=2, batch_first=True)
        self.head = nn.Linear(6, horizon)

    def training_step(self, batch, batch_idx):
        x = torch.stack([batch["past_target"], batch["past_observed_values"]], dim=-1)
        out, _ = self.lstm(x)
        err = (self.head(out[:, -1]) - batch["future_target"]).square() * batch["future_observed_values"]
        return (err.sum(1) / batch["future_observed_values"].sum(1).clamp(min=1)).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _module(name: str) -> L.LightningModule:
    if name == "combination":
        from lightning_dpts.models import CombinationEstimator

        torch.manual_seed(0)
        return CombinationEstimator(prediction_length=H_SL, context_length=CTX_SL, freq="M", season_length=4,
                                    lr=0.05).create_lightning_module()
    if name == "seasonal_linear":
        from lightning_dpts.models import SeasonalLinearEstimator

        torch.manual_seed(0)
        return SeasonalLinearEstimator(prediction_length=H_SL, context_length=CTX_SL, season_length=4,
                                       lr=0.05).create_lightning_module()
    if name == "lstm":
        return LSTMForecaster()
    return make_module(name)


def _fit(name: str, missing: bool, **kwargs) -> tuple[L.LightningModule, DPForecastStrategy]:
    module = _module(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name == "lstm":
            dm = StructuredSubsamplingDataModule(_series(missing), context_length=8, prediction_length=4,
                                                 batch_size=8, seed=0, test_windows=0)
        else:
            dm = StructuredSubsamplingDataModule(_series(missing), batch_size=8, model=module, freq="M", seed=0,
                                                 test_windows=0)
        strategy = DPForecastStrategy(1.0, 1.0, seed=0, **kwargs)
        trainer(max_steps=4, callbacks=[strategy]).fit(module, datamodule=dm)
    return module, strategy


@pytest.mark.parametrize("missing", [False, True])
@pytest.mark.parametrize("name", [*MODEL_NAMES, "combination", "seasonal_linear", "lstm"])
def test_supported_models_are_not_refused_and_stay_on_the_fast_path(name, missing):
    module, strategy = _fit(name, missing, spot_check=1.0)  # auto: probe at step 1 and one of steps 2-3
    assert not strategy.isolated
    assert module.trainer.global_step == 4


@pytest.mark.parametrize("name", ["simple_feedforward", "deepar", "lstm", "combination"])
def test_the_isolated_mode_releases_the_fast_paths_update(name):
    thetas = []
    for mode in ("fast", "isolated"):
        module, _ = _fit(name, True, per_window=mode)
        thetas.append(torch.cat([p.detach().flatten() for p in module.parameters()]))
    torch.testing.assert_close(thetas[0], thetas[1], rtol=1e-4, atol=1e-5)


def test_a_random_training_step_skips_the_spot_check_and_is_not_refused():
    from gluonts.torch.model.deepar import DeepARLightningModule

    torch.manual_seed(0)
    module = DeepARLightningModule(model_kwargs=dict(freq="M", context_length=8, prediction_length=4,
                                                     num_feat_dynamic_real=2, hidden_size=6, num_layers=2,
                                                     dropout_rate=0.3, lags_seq=[1, 2]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(_series(True), batch_size=8, model=module, freq="M", seed=0,
                                             test_windows=0)
        strategy = DPForecastStrategy(1.0, 1.0, seed=0, per_window="fast", spot_check=1.0)
        trainer(max_steps=3, callbacks=[strategy]).fit(module, datamodule=dm)
    assert strategy.spot.stochastic is True and module.trainer.global_step == 3

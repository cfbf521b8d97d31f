"""seasonal_residual: seasonal naive plus a zero-initialised correction of any plain network."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.models import seasonal_residual

P, H = 24, 12


class GRUHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(1, 8, batch_first=True)
        self.head = nn.Linear(8, H)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(z[..., None])
        return self.head(out[:, -1])


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(P, 32), nn.ReLU(), nn.Linear(32, H))


def _table(n_series=40, length=120, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_series):
        t = np.arange(length)
        y = 100 + 10 * np.sin(2 * np.pi * t / 12) + rng.normal(0, 2, length) + i
        stamps = pd.period_range("2000-01", periods=length, freq="M").to_timestamp()
        rows.append(pd.DataFrame({"item_id": f"s{i}", "timestamp": stamps, "target": y}))
    return pd.concat(rows, ignore_index=True)


@pytest.mark.parametrize("make", [_mlp, GRUHead])
def test_at_initialisation_the_forecast_is_seasonal_naive(make):
    from gluonts.model.seasonal_naive import SeasonalNaivePredictor

    module = seasonal_residual(make(), prediction_length=H, context_length=P, freq="M")
    rng = np.random.default_rng(1)
    histories = [rng.gamma(2.0, 30.0, n) for n in (24, 50, 80)]
    quantiles = module.quantile_forecasts(histories)
    naive = SeasonalNaivePredictor(prediction_length=H, season_length=12).predict(
        [{"target": h.astype(np.float32), "start": pd.Period("2000-01", "M")} for h in histories])
    for q, f, h in zip(quantiles, naive, histories, strict=True):
        np.testing.assert_allclose(q[:, 4], f.quantile(0.5), rtol=1e-6)  # the median (level 0.5)
        np.testing.assert_allclose(q[:, 4], h[-12:], rtol=1e-6)


def test_unsupported_gluonts_modules_and_bad_nets_are_refused():
    from gluonts.torch.distributions import NegativeBinomialOutput
    from gluonts.torch.model.d_linear import DLinearEstimator
    from gluonts.torch.model.deepar import DeepAREstimator
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator
    from gluonts.torch.model.wavenet import WaveNetEstimator

    from lightning_dpts.models import SeasonalResidualModel

    wavenet = WaveNetEstimator(freq="M", prediction_length=H).create_lightning_module()
    supported = "supported: SimpleFeedForwardLightningModule, DLinearLightningModule, DeepARLightningModule"
    with pytest.raises(ConfigurationError, match=supported):
        seasonal_residual(wavenet, freq="M")
    sff = SimpleFeedForwardEstimator(prediction_length=H, context_length=P).create_lightning_module()
    with pytest.raises(ConfigurationError, match="plain torch modules"):
        SeasonalResidualModel(sff, H, P, 12)
    with pytest.raises(ConfigurationError, match="must be the GluonTS model's"):
        seasonal_residual(sff, prediction_length=H, context_length=P + 1, freq="M")
    seasonal_residual(sff, freq="M")
    with pytest.raises(ConfigurationError, match="already wrapped"):
        seasonal_residual(sff, freq="M")
    short = DLinearEstimator(prediction_length=H, context_length=H).create_lightning_module()
    with pytest.raises(ConfigurationError, match="context_length.*>= 13"):
        seasonal_residual(short, freq="M")
    no_loc = SimpleFeedForwardEstimator(prediction_length=H, context_length=P,
                                        distr_output=NegativeBinomialOutput()).create_lightning_module()
    with pytest.raises(ConfigurationError, match="no location"):
        seasonal_residual(no_loc, freq="M")
    few_lags = DeepAREstimator(freq="M", prediction_length=H, lags_seq=[1, 2, 3]).create_lightning_module()
    with pytest.raises(ConfigurationError, match="lag >= 12"):
        seasonal_residual(few_lags, freq="M")
    with pytest.raises(ConfigurationError, match="nn.Linear"):
        seasonal_residual(nn.Identity(), prediction_length=H, context_length=P, freq="M")
    with pytest.raises(ConfigurationError, match="context_length"):
        seasonal_residual(_mlp(), prediction_length=H, freq="M")


def _gluonts(name: str):
    from gluonts.torch.model.d_linear import DLinearEstimator
    from gluonts.torch.model.deepar import DeepAREstimator
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

    if name == "deepar":
        return DeepAREstimator(freq="M", prediction_length=H, context_length=H, num_layers=1, hidden_size=8)
    if name == "dlinear":
        return DLinearEstimator(prediction_length=H, context_length=P, hidden_dimension=8)
    return SimpleFeedForwardEstimator(prediction_length=H, context_length=P, hidden_dimensions=[8])


@pytest.mark.parametrize("name", ["sff", "dlinear", "deepar"])
def test_gluonts_module_at_initialisation_forecasts_seasonal_naive_through_its_predictor(name):
    """The GluonTS predictor path (estimator.create_predictor on the wrapped module): the median is seasonal
    naive's forecast. DeepAR samples; its spread is made negligible (the scale projection's bias at -30) so that
    every sample path is its location, y[t - 12], i.e. seasonal naive for a horizon of one season."""
    from gluonts.model.seasonal_naive import SeasonalNaivePredictor

    estimator = _gluonts(name)
    module = estimator.create_lightning_module()
    assert seasonal_residual(module, freq="M") is module
    if name == "deepar":
        scale_proj = module.model.param_proj.proj[list(module.model.distr_output.args_dim).index("scale")]
        with torch.no_grad():
            scale_proj.weight.zero_()
            scale_proj.bias.fill_(-30.0)
    rng = np.random.default_rng(1)
    entries = [{"target": rng.gamma(2.0, 30.0, n).astype(np.float32), "start": pd.Period("2000-01", "M")}
               for n in (60, 80, 100)]
    forecasts = list(estimator.create_predictor(estimator.create_transformation(), module).predict(entries))
    naive = SeasonalNaivePredictor(prediction_length=H, season_length=12).predict(entries)
    for f, n, e in zip(forecasts, naive, entries, strict=True):
        np.testing.assert_allclose(f.quantile(0.5), n.quantile(0.5), rtol=1e-5)
        np.testing.assert_allclose(f.quantile(0.5), e["target"][-12:], rtol=1e-5)


@pytest.mark.parametrize("name", ["sff", "dlinear", "deepar"])
def test_gluonts_wrapped_predictor_survives_serialisation(name, tmp_path):
    """predictor.serialize / Predictor.deserialize rebuild the module from its arguments and load the weights: the
    wrapper must come back (a plain module would silently forecast without seasonal naive)."""
    from gluonts.model.predictor import Predictor

    from lightning_dpts.models.gluonts_residual import SUPPORTED_GLUONTS_MODELS

    estimator = _gluonts(name)
    module = seasonal_residual(estimator.create_lightning_module(), freq="M")
    with torch.no_grad():  # a trained-looking correction, so that the weights matter too
        for p in module.parameters():
            p.add_(0.01 * torch.randn_like(p))
    predictor = estimator.create_predictor(estimator.create_transformation(), module)
    predictor.serialize(tmp_path)
    restored = Predictor.deserialize(tmp_path)
    assert type(restored.prediction_net) in {v[0] for v in SUPPORTED_GLUONTS_MODELS.values()}
    assert type(restored.prediction_net.model) is type(module.model)
    for a, b in zip(module.state_dict().values(), restored.prediction_net.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b)
    past = torch.rand(2, module.model.context_length) + 1.0
    if name != "deepar":
        args = {"past_target": past} if name == "sff" else {"past_target": past,
                                                              "past_observed_values": torch.ones_like(past)}
        module.eval()
        restored.prediction_net.eval()
        torch.testing.assert_close(module.model(**args)[1], restored.prediction_net.model(**args)[1])


def test_gluonts_deepar_loss_uses_the_value_one_season_back():
    """Independent check of the shifted likelihood: with the location projection at zero, DeepAR's per-step
    distribution is StudentT(df, 0, s) scaled by the window's scale and moved to y[t - 12]; the loss must equal
    -log p computed by hand from those pieces."""
    estimator = _gluonts("deepar")
    module = seasonal_residual(estimator.create_lightning_module(), freq="M")
    model = module.model
    batch_size, past = 3, model._past_length
    rng = np.random.default_rng(2)
    series = torch.tensor(rng.gamma(2.0, 30.0, (batch_size, past + H)), dtype=torch.float32)
    inputs = {"feat_static_cat": torch.zeros(batch_size, 1, dtype=torch.long),
              "feat_static_real": torch.zeros(batch_size, 1),
              "past_time_feat": torch.zeros(batch_size, past, model.num_feat_dynamic_real),
              "past_target": series[:, :past], "past_observed_values": torch.ones(batch_size, past),
              "future_time_feat": torch.zeros(batch_size, H, model.num_feat_dynamic_real)}
    loss = model.loss(**inputs, future_target=series[:, past:], future_observed_values=torch.ones(batch_size, H),
                      future_only=True, aggregate_by=torch.sum)
    params, scale, *_ = model.unroll_lagged_rnn(**inputs, future_target=series[:, past:])
    df, loc, s = (p[:, -H:] for p in params)
    assert torch.all(loc == 0)  # the zero-initialised correction
    y = series[:, past:]
    expected = -torch.distributions.StudentT(df, y.new_zeros(()), s * scale).log_prob(
        y - series[:, past - 12: past + H - 12]).sum(-1)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", ["sff", "dlinear", "deepar"])
def test_gluonts_module_private_training_windows_independent(name):
    """DPForecastStrategy trains the wrapped GluonTS module (per-window gradients, spot check on every step); the
    independence probe accepts it, and parameters move."""
    import warnings

    import lightning as L

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    module = seasonal_residual(_gluonts(name).create_lightning_module(), freq="M")
    before = [p.detach().clone() for p in module.parameters()]
    dm = StructuredSubsamplingDataModule(_table(length=150), batch_size=8, model=module)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1, spot_check=1.0),
                                   AccountantCallback(epsilon=100.0, delta=1e-5)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=dm)
    assert not [w for w in caught if "mixes the windows" in str(w.message)]
    assert trainer.global_step == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


@pytest.mark.parametrize("make", [_mlp, GRUHead])
def test_private_training_accepts_it_windows_independent(make):
    """The strategy's independence probe runs at the start of fit and would refuse a model mixing windows."""
    import lightning as L

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    module = seasonal_residual(make(), prediction_length=H, context_length=P, freq="M")
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module)
    strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1, spot_check=1.0)
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[strategy, AccountantCallback(epsilon=100.0, delta=1e-5)])
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, datamodule=dm)
    assert not [w for w in caught if "mixes the windows" in str(w.message)]  # the probe accepts it
    assert trainer.global_step == 3
    assert all(torch.isfinite(p).all() for p in module.parameters())


def test_mixing_windows_is_refused_by_the_probe():
    """A 'correction' that reads the batch mean is caught by the probe (it then isolates every window): the wrapper
    does not hide a cross-window net."""
    import lightning as L

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    class BatchMean(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(P, H)

        def forward(self, z: torch.Tensor) -> torch.Tensor:
            return self.lin(z - z.mean(0, keepdim=True)) + 0.1 * z.mean()

    module = seasonal_residual(BatchMean(), prediction_length=H, context_length=P, freq="M")
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1),
                                   AccountantCallback(epsilon=100.0, delta=1e-5)])
    with pytest.warns(UserWarning, match="mixes the windows"):
        trainer.fit(module, datamodule=dm)


@pytest.mark.slow  # AutoETS and AutoTheta on 40 windows; the fits of tests/test_evaluation.py score them too
def test_held_out_evaluation_scores_next_to_seasonal_naive(tmp_path):
    """At initialisation the wrapped model is seasonal naive: same CRPS; the report goes under private/."""
    import json

    import lightning as L

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, HeldOutEvaluation

    module = seasonal_residual(_mlp(), prediction_length=H, context_length=P, freq="M", lr=0.0)
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module, test_windows=2)
    lines: list[str] = []
    evaluation = HeldOutEvaluation(output_dir=tmp_path, print_fn=lines.append)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1),
                                   AccountantCallback(epsilon=100.0, delta=1e-5), evaluation])
    trainer.fit(module, datamodule=dm)
    metrics = evaluation.report["metrics"]
    assert evaluation.report["forecasts"] == 2 * 40
    # lr = 0: the median is still seasonal naive's point forecast, so MAE ties; the verdict says ties lose
    assert metrics["dp"]["mae"] == pytest.approx(metrics["seasonal_naive"]["mae"], rel=1e-6)
    assert any(line.startswith(("VERDICT", "verdict")) for line in lines)
    written = json.loads((tmp_path / "private" / "evaluation.json").read_text())
    assert written["metrics"]["seasonal_naive"]["crps"] == pytest.approx(metrics["seasonal_naive"]["crps"])
    assert "private" in written["notice"]


def test_held_out_evaluation_last_window_protocol_season_and_baselines(monkeypatch):
    """evaluation="last" scores only the last window of every series; season_length reaches seasonal naive and
    MASE; without statsforecast the baselines are skipped and the verdict says so (issue 37)."""
    import lightning as L

    from lightning_dpts import baselines as bl
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, HeldOutEvaluation

    monkeypatch.setattr(bl, "statsforecast_available", lambda: False)
    module = seasonal_residual(_mlp(), prediction_length=H, context_length=P, freq="M", lr=0.0)
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module, test_windows=3)
    lines: list[str] = []
    rolling = HeldOutEvaluation(print_fn=None, season_length=4)
    last = HeldOutEvaluation(print_fn=lines.append, evaluation="last", season_length=4)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1),
                                   AccountantCallback(epsilon=100.0, delta=1e-5), rolling, last])
    trainer.fit(module, datamodule=dm)
    assert rolling.report["forecasts"] == 3 * 40 and last.report["forecasts"] == 40
    assert last.report["protocol"] == "last" and last.report["season_length"] == 4
    assert set(last.report["metrics"]) == {"dp", "seasonal_naive"}
    # the last window's CRPS is the rolling evaluation's CRPS of its latest window
    assert last.report["metrics"]["seasonal_naive"]["crps"] == pytest.approx(
        rolling.report["metrics"]["seasonal_naive"]["crps_per_window"][-1])
    assert any("AutoETS and AutoTheta were skipped" in line for line in lines)
    # a season no held-out history can hold is refused when the fit starts, before any step
    too_long = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[HeldOutEvaluation(print_fn=None, season_length=10_000),
                                    DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1),
                                    AccountantCallback(epsilon=100.0, delta=1e-5)])
    with pytest.raises(ConfigurationError, match="season_length=10000: must be shorter than the shortest"):
        too_long.fit(module, datamodule=dm)
    assert too_long.global_step == 0
    with pytest.raises(ConfigurationError, match="evaluation"):
        HeldOutEvaluation(evaluation="first")
    with pytest.raises(ConfigurationError, match="season_length"):
        HeldOutEvaluation(season_length=0)


def test_held_out_evaluation_fits_the_statsforecast_baselines_to_at_most_baseline_windows(monkeypatch):
    """baseline_windows caps the AutoETS/AutoTheta fits (counted) at a fixed subsample, as dpts fit does; every
    model is compared on that subsample and the others are also scored on every window (issue 37's yardstick at
    a bounded cost)."""
    from lightning_dpts import baselines as bl
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.evaluation import score_windows
    from lightning_dpts.training import HeldOutEvaluation

    fits: list[str] = []

    def fake(name, history, horizon, season, q):  # seasonal naive plus one: a baseline that is easy to score
        fits.append(name)
        return bl.seasonal_naive_quantiles(history, horizon, season, q) + 1.0

    monkeypatch.setattr(bl, "statsforecast_available", lambda: True)
    monkeypatch.setattr(bl, "statsforecast_quantiles", fake)
    monkeypatch.setattr(bl, "_MEMO", bl.BaselineCache())  # nothing memoised by other tests
    module = seasonal_residual(_mlp(), prediction_length=H, context_length=P, freq="M", lr=0.0)
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module, test_windows=3)
    capped = HeldOutEvaluation(print_fn=None, baseline_windows=7).evaluate(module, dm)
    assert sorted(fits) == ["autoets"] * 7 + ["autotheta"] * 7  # 14 fits, not 2 x 120
    assert capped["baselines"]["windows"] == 7 and capped["forecasts"] == 3 * 40
    assert {m["forecasts"] for m in capped["metrics"].values()} == {7}  # paired: every model on the subsample
    assert {m["forecasts"] for m in capped["metrics_all_windows"].values()} == {120}
    assert set(capped["metrics_all_windows"]) == {"dp", "seasonal_naive"}
    # the paired scores are the scores of the subsample's windows
    windows = dm.evaluation_windows("test")
    chosen = [windows[i] for i in bl.baseline_subset(120, 7)]
    hist = [np.asarray(w.history, dtype=float) for w in chosen]
    naive = score_windows([bl.seasonal_naive_quantiles(h, H, 12, bl._levels(None)) for h in hist],
                          [np.asarray(w.target, dtype=float) for w in chosen], hist, [w.window for w in chosen], 12)
    assert capped["metrics"]["seasonal_naive"]["crps"] == pytest.approx(naive["crps"])
    fits.clear()
    every = HeldOutEvaluation(print_fn=None, baseline_windows=0).evaluate(module, dm)
    assert len(fits) == 2 * (120 - 7)  # the subsample's fits are memoised
    assert "metrics_all_windows" not in every and every["metrics"]["autoets"]["forecasts"] == 120
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigurationError, match="baseline_windows"):
            HeldOutEvaluation(baseline_windows=bad)


@pytest.mark.parametrize("name", ["mlp", "sff"])
def test_held_out_evaluation_non_dp_reference(name):
    """non_dp=True trains a copy of the initial module without DP for the same steps and scores it; the DP module
    trained too (it moved from its initial weights), and the two models score differently."""
    import lightning as L

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, HeldOutEvaluation

    predictor = None
    if name == "mlp":
        module = seasonal_residual(_mlp(), prediction_length=H, context_length=P, freq="M")
    else:
        estimator = _gluonts("sff")
        module = seasonal_residual(estimator.create_lightning_module(), freq="M")
        predictor = lambda m: estimator.create_predictor(estimator.create_transformation(), m)  # noqa: E731
    initial = [p.detach().clone() for p in module.parameters()]
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module, test_windows=1)
    lines: list[str] = []
    evaluation = HeldOutEvaluation(print_fn=lines.append, non_dp=True, predictor=predictor)
    trainer = L.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[evaluation, DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1),
                                   AccountantCallback(epsilon=100.0, delta=1e-5)])
    trainer.fit(module, datamodule=dm)
    report = evaluation.report
    assert {"dp", "seasonal_naive", "non_dp"} <= set(report["metrics"])
    assert report["non_dp_steps"] == 5
    assert report["metrics"]["non_dp"]["crps"] != report["metrics"]["dp"]["crps"]
    assert "non_dp CRPS" in lines[0]
    assert any(not torch.equal(a, b) for a, b in zip(initial, module.parameters(), strict=True))


def test_held_out_evaluation_non_dp_must_come_before_the_strategy():
    import lightning as L

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, HeldOutEvaluation

    module = seasonal_residual(_mlp(), prediction_length=H, context_length=P, freq="M")
    dm = StructuredSubsamplingDataModule(_table(), batch_size=8, model=module, test_windows=1)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1),
                                   AccountantCallback(epsilon=100.0, delta=1e-5),
                                   HeldOutEvaluation(print_fn=None, non_dp=True)])
    with pytest.raises(ConfigurationError, match="before the DPForecastStrategy"):
        trainer.fit(module, datamodule=dm)
    with pytest.raises(ConfigurationError, match="non_dp_trainer_kwargs"):
        HeldOutEvaluation(non_dp=True, non_dp_trainer_kwargs={"max_steps": 3})


def test_residual_false_is_the_same_network_without_the_seasonal_naive_location():
    """The comparison variant of the benchmark: the mean is the network's output alone, its initialisation kept."""
    from lightning_dpts.models import SeasonalResidualLightningModule

    torch.manual_seed(0)
    net = _mlp()
    weights = net[-1].weight.detach().clone()
    module = SeasonalResidualLightningModule(net, H, P, 12, residual=False)
    assert torch.equal(net[-1].weight, weights) and weights.abs().sum() > 0
    past = torch.rand(4, P) + 1.0
    (mu, _), _, scale = module.model(past, torch.ones_like(past))
    torch.testing.assert_close(mu, net(past / scale))

"""seasonal_linear: shapes, starts at seasonal naive, CRPS against numerical integration, DP training, export."""

from __future__ import annotations

import warnings

import lightning as L
import numpy as np
import pytest
import torch
from gluonts.model.seasonal_naive import SeasonalNaivePredictor

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.models import SeasonalLinearEstimator, SeasonalLinearModel, gaussian_crps


def _series(n: int = 12, length: int = 80, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    return [(50 + 10 * np.sin(2 * np.pi * t / 12) + 0.1 * t + rng.normal(0, 1, length)).astype(np.float32)
            for _ in range(n)]


def test_shapes_and_ten_parameters():
    model = SeasonalLinearModel(prediction_length=5, context_length=24, season_length=12)
    assert sum(p.numel() for p in model.parameters()) == 10
    past = torch.rand(3, 24) + 1
    (mu, sigma), loc, scale = model(past, torch.ones(3, 24))
    assert mu.shape == sigma.shape == (3, 5) and loc.shape == scale.shape == (3, 1)
    assert bool((sigma > 0).all())
    loss = model.loss(past, torch.ones(3, 24), torch.rand(3, 5), torch.ones(3, 5))
    assert loss.shape == (3,) and bool(torch.isfinite(loss).all())


def test_context_must_hold_one_season_difference():
    with pytest.raises(ConfigurationError, match="context_length"):
        SeasonalLinearModel(prediction_length=3, context_length=12, season_length=12)


def test_gaussian_crps_matches_numerical_integration():
    """CRPS(F, y) = integral (F(x) - 1{x >= y})^2 dx, integrated on a fine grid (independent of the closed form)."""
    from scipy.stats import norm

    for mu, sigma, y in [(0.0, 1.0, 0.3), (2.0, 0.5, -1.0), (-1.0, 3.0, 4.0)]:
        x = np.linspace(mu - 12 * sigma - abs(y), mu + 12 * sigma + abs(y), 400_001)
        integrand = (norm.cdf(x, mu, sigma) - (x >= y)) ** 2
        expected = np.trapezoid(integrand, x)
        got = float(gaussian_crps(torch.tensor(mu, dtype=torch.float64), torch.tensor(sigma, dtype=torch.float64),
                                  torch.tensor(y, dtype=torch.float64)))
        assert got == pytest.approx(expected, rel=1e-4)


def test_untrained_model_forecasts_exactly_seasonal_naive():
    series = _series()
    est = SeasonalLinearEstimator(prediction_length=6, context_length=24, season_length=12)
    module = est.create_lightning_module()
    start = __import__("pandas").Period("2000-01", freq="M")
    entries = [{"target": s, "start": start, "item_id": str(i)} for i, s in enumerate(series)]
    ours = list(est.create_predictor(est.create_transformation(), module).predict(entries))
    naive = list(SeasonalNaivePredictor(prediction_length=6, season_length=12).predict(entries))
    for a, b in zip(ours, naive, strict=True):
        np.testing.assert_allclose(a.quantile(0.5), b.quantile(0.5), rtol=1e-5)
        assert float(np.min(a.quantile(0.9) - a.quantile(0.1))) > 0  # a probabilistic spread around it


def test_windows_are_independent():
    """Trap 8: one window's output does not depend on the other windows of the batch."""
    model = SeasonalLinearModel(prediction_length=4, context_length=8, season_length=1)
    torch.nn.init.normal_(model.proj.weight)
    past = torch.rand(5, 8) + 1
    (mu, sigma), _, scale = model(past, torch.ones(5, 8))
    changed = past.clone()
    changed[0] *= 1000
    (mu2, sigma2), _, scale2 = model(changed, torch.ones(5, 8))
    assert torch.equal(mu[1:], mu2[1:]) and torch.equal(sigma[1:], sigma2[1:]) and torch.equal(scale[1:], scale2[1:])


def test_trains_under_the_dp_strategy_and_exports(tmp_path):
    from lightning_dpts.app.export import export_model, load_predictor, make_checkpoint_loadable
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    torch.manual_seed(0)
    est = SeasonalLinearEstimator(prediction_length=6, context_length=24, season_length=12, lr=0.05)
    module = est.create_lightning_module()
    make_checkpoint_loadable(module)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(_series(), batch_size=4, model=module, freq="M", seed=0)
        strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
        trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[strategy, AccountantCallback(epsilon=50.0, delta=1e-5)])
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 9
    assert float(module.model.proj.weight.detach().abs().sum()) > 0  # the weights moved
    export_model(est, module, tmp_path, freq="M")
    start = __import__("pandas").Period("2000-01", freq="M")
    entries = [{"target": s, "start": start, "item_id": str(i)} for i, s in enumerate(_series(n=2))]
    torch.manual_seed(0)
    before = [f.quantile(0.3) for f in est.create_predictor(est.create_transformation(), module).predict(entries)]
    after = [f.quantile(0.3) for f in load_predictor(tmp_path).predict(entries)]
    for a, b in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_cosine_schedule_is_data_independent_and_reaches_zero():
    from lightning_dpts.models import SeasonalLinearLightningModule

    kwargs = {"prediction_length": 3, "context_length": 4}
    assert isinstance(SeasonalLinearLightningModule(model_kwargs=kwargs).configure_optimizers(), torch.optim.Adam)
    module = SeasonalLinearLightningModule(model_kwargs=kwargs, lr_schedule="cosine")
    assert isinstance(module.configure_optimizers(), torch.optim.Adam)  # no Trainer: no planned steps
    module._planned_steps = lambda: 10  # type: ignore[method-assign]
    config = module.configure_optimizers()
    sched = config["lr_scheduler"]
    assert "monitor" not in sched and sched["interval"] == "step"
    lrs = []
    for _ in range(10):
        lrs.append(config["optimizer"].param_groups[0]["lr"])
        config["optimizer"].step()
        sched["scheduler"].step()
    assert lrs[0] == pytest.approx(1e-2) and all(a > b for a, b in zip(lrs, lrs[1:], strict=False))
    assert config["optimizer"].param_groups[0]["lr"] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ConfigurationError, match="lr_schedule"):
        SeasonalLinearLightningModule(model_kwargs={"prediction_length": 3, "context_length": 4}, lr_schedule="x")

"""combination: the classical candidates against direct recursions, window independence, missing values, the
initial combination, DP training on the fast path, the GluonTS estimator and export."""

from __future__ import annotations

import warnings

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.models import CombinationEstimator, CombinationModel, classical
from lightning_dpts.models.combination import num_parameters, usable_seasons


def _series(n: int = 12, length: int = 90, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    return [(50 + 10 * np.sin(2 * np.pi * t / 12) + 0.2 * t + rng.normal(0, 1, length)).astype(np.float32)
            for _ in range(n)]


def _ses(z: np.ndarray, alpha: float) -> float:
    level = z[0]
    for value in z[1:]:
        level = alpha * value + (1 - alpha) * level
    return level


def _holt(z: np.ndarray, alpha: float, beta: float, phi: float, h: int) -> np.ndarray:
    q = min(len(z) - 1, 12)
    level, trend = z[0], (z[q] - z[0]) / q
    for value in z[1:]:
        new = alpha * value + (1 - alpha) * (level + phi * trend)
        trend = beta * (new - level) + (1 - beta) * phi * trend
        level = new
    return np.array([level + sum(phi ** j for j in range(1, k + 1)) * trend for k in range(1, h + 1)])


def test_candidate_maps_match_the_methods_recursions():
    """Each linear map against the method computed step by step on numbers (an independent implementation)."""
    rng = np.random.default_rng(1)
    p, h, m = 40, 7, 12
    z = rng.normal(size=p).cumsum() + 5
    maps, fits = classical.method_maps(p, h, (m,))
    names = classical.method_names((m,))
    got = {name: maps[i] @ z for i, name in enumerate(names)}
    np.testing.assert_allclose(got["naive"], np.full(h, z[-1]))
    np.testing.assert_allclose(got["drift"], z[-1] + np.arange(1, h + 1) * (z[-1] - z[0]) / (p - 1))
    for a in classical.SES_ALPHAS:
        np.testing.assert_allclose(got[f"ses_{a:g}"], np.full(h, _ses(z, a)), rtol=1e-12)
    for a, b in classical.HOLT:
        np.testing.assert_allclose(got[f"holt_{a:g}_{b:g}"], _holt(z, a, b, 1.0, h), rtol=1e-10)
    for a, b, f in classical.DAMPED:
        np.testing.assert_allclose(got[f"damped_{a:g}_{b:g}_{f:g}"], _holt(z, a, b, f, h), rtol=1e-10)
    t = np.arange(p)
    slope = np.polyfit(t, z, 1)[0]
    for a in classical.THETA_ALPHAS:  # Hyndman & Billah (2003): SES + b/2 (h - 1 + 1/a - (1 - a)^n / a)
        expected = _ses(z, a) + slope / 2 * (np.arange(1, h + 1) - 1 + 1 / a - (1 - a) ** p / a)
        np.testing.assert_allclose(got[f"theta_{a:g}"], expected, rtol=1e-10)
    np.testing.assert_allclose(got["snaive_12"], z[p - m + np.arange(h) % m])
    np.testing.assert_allclose(got["smean_12"], [np.mean([z[p - m + k - j * m] for j in range(3)]) for k in range(h)])
    ahead = np.arange(h) // m + 1  # seasonal random walk with drift: (k + 1) mean m-step differences
    np.testing.assert_allclose(got["sdrift_12"], z[p - m + np.arange(h) % m] + ahead * np.mean(z[m:] - z[:-m]))
    np.testing.assert_allclose(got["sdrift1_12"], z[p - m + np.arange(h) % m] + ahead * np.mean(z[-m:] - z[-2 * m:-m]))
    q = p // 4
    np.testing.assert_allclose(got["drift_recent"], z[-1] + np.arange(1, h + 1) * (z[-1] - z[-1 - q]) / q)
    # one-step fits: row t predicts z_t from z_0..z_{t-1} only (no look-ahead) for the recursive methods; Holt's
    # initial trend reads the first 12 values, as ETS estimates its initial state from the data
    for i, name in enumerate(names):
        if name.startswith(("ses", "snaive", "naive", "drift", "sdrift")):
            assert np.allclose(np.triu(fits[i], k=0)[1:], 0.0), name
        if name.startswith(("holt", "damped")):
            assert np.allclose(np.triu(fits[i], k=0)[13:], 0.0), name


def test_decomposition_recovers_a_seasonal_pattern_and_reseasonalises_the_forecast():
    p, h, m = 48, 6, 12
    pattern = np.sin(2 * np.pi * np.arange(m) / m) * 3 + np.cos(4 * np.pi * np.arange(m) / m)
    t = np.arange(p + h)
    z = 10 + 0.05 * t + pattern[t % m]
    comp_in, comp_out = classical.seasonal_component(p, h, (m,))
    np.testing.assert_allclose(comp_in @ z[:p], pattern[t[:p] % m], atol=1e-10)
    np.testing.assert_allclose(comp_out @ z[:p], pattern[t[p:] % m], atol=1e-10)
    adj_maps, _ = classical.adjusted_maps(p, h, (m,))
    naive2 = adj_maps[classical.method_names((m,)).index("naive")] @ z[:p]  # M4's Naive2
    np.testing.assert_allclose(naive2, z[p - 1] - pattern[(p - 1) % m] + pattern[t[p:] % m], atol=1e-10)


def test_shapes_parameters_and_seasons():
    model = CombinationModel(prediction_length=5, context_length=36, seasons=[12, 1, 12, 400])
    assert model.seasons == (12,)  # 1, repeats and seasons >= P are not used
    k = len(model.names)
    assert sum(p.numel() for p in model.parameters()) == num_parameters(k) == 3 * k + 5
    assert all(isinstance(m, torch.nn.Linear) for m in model.modules() if list(m.parameters(recurse=False)))
    past = torch.rand(3, 36) + 1
    (mu, sigma), loc, scale = model(past, torch.ones(3, 36))
    assert mu.shape == sigma.shape == (3, 5) and loc.shape == scale.shape == (3, 1)
    assert bool((sigma > 0).all())
    hourly = CombinationModel(prediction_length=48, context_length=400, seasons=[24, 168])
    assert hourly.seasons == (24, 168) and "snaive_168" in hourly.names
    assert usable_seasons((24, 168), 100) == (24,)


@pytest.mark.parametrize("bad", [{"context_length": 2}, {"prediction_length": 0}, {"seasons": [0]}])
def test_refusals(bad):
    kwargs = {"prediction_length": 3, "context_length": 12, "seasons": [4], **bad}
    with pytest.raises(ConfigurationError):
        CombinationModel(**kwargs)


def test_untrained_model_is_the_initial_classical_combination():
    """At initialisation the location is the softmax of INITIAL_SELECTION x the candidates' relative log in-sample
    MSE plus INITIAL_HOLDOUT x their relative log hold-out MSE over the candidates' forecasts (every prior weight
    equal): no learned component."""
    from lightning_dpts.models import combination

    model = CombinationModel(prediction_length=6, context_length=48, seasons=[12])
    past = torch.tensor(np.stack(_series(n=4, length=48)))
    c = model.candidates(past, torch.ones_like(past))
    weights = torch.softmax(combination.INITIAL_SELECTION * c["relative"] + combination.INITIAL_HOLDOUT * c["holdout"],
                            dim=-1)
    expected = (weights[:, None, :] * c["forecast"]).sum(-1)
    (mu, _), _, _ = model(past, torch.ones_like(past))
    torch.testing.assert_close(mu, expected.float(), rtol=1e-5, atol=1e-6)


def test_windows_are_independent_and_the_scale_is_per_window():
    """Trap 8: one window's output does not depend on the other windows of the batch (with random weights)."""
    torch.manual_seed(0)
    model = CombinationModel(prediction_length=4, context_length=24, seasons=[12])
    for layer in (model.gate, model.spread):
        torch.nn.init.normal_(layer.weight, std=0.3)
    past = torch.tensor(np.stack(_series(n=5, length=24)))
    obs = torch.ones_like(past)
    (mu, sigma), _, scale = model(past, obs)
    changed = past.clone()
    changed[0] = changed[0] * 1000 - 7
    (mu2, sigma2), _, scale2 = model(changed, obs)
    assert torch.equal(mu[1:], mu2[1:]) and torch.equal(sigma[1:], sigma2[1:]) and torch.equal(scale[1:], scale2[1:])
    # a window alone gives bit for bit what it gives in a batch, also for large trending values (the candidates are
    # computed in float64: float32 products round differently by batch size, which the strategy's spot check of
    # per-window gradients refused once, at step 435 of a default dpts fit)
    big = (torch.rand(32, 24, generator=torch.Generator().manual_seed(1)) * 100 + 1000).cumsum(-1)
    ones = torch.ones_like(big)
    (mu_b, sigma_b), _, _ = model(big, ones)
    for j in (0, 5, 31):
        (mu_j, sigma_j), _, _ = model(big[j:j + 1], ones[j:j + 1])
        assert torch.equal(mu_j[0], mu_b[j]) and torch.equal(sigma_j[0], sigma_b[j])
    # scaling a window scales its forecast: the model is scale-equivariant (mean scaling per window)
    (mu3, _), _, scale3 = model(past * 10, obs)
    torch.testing.assert_close(mu3 * scale3, mu * scale * 10, rtol=1e-4, atol=1e-3)


def test_fitted_alpha_is_the_same_alone_as_in_a_batch_when_the_errors_tie():
    """A padded past whose observed values are constant but for the last: every alpha's in-sample error is the same
    in exact arithmetic and differs by round-off, which the batch's matrix products change. A plain argmin then chose
    another alpha alone than in the batch and the spot check refused healthy fits (1 in ~10 default fits on the
    bundled data). The window captured from such a refusal, in a batch of 64 bundled-like windows."""
    rng = np.random.default_rng(0)
    model = CombinationModel(prediction_length=12, context_length=60, seasons=[12])
    past = torch.tensor(np.stack([np.cumsum(rng.normal(size=60)) * 50 + 1500 for _ in range(64)]),
                        dtype=torch.float32)
    obs = torch.ones_like(past)
    for j, last in ((7, (1652.4, 1654.2)), (43, (17.3, 17.9)), (50, (0.001, 0.0013))):
        past[j] = 0.0
        obs[j] = 0.0
        past[j, -2:] = torch.tensor(last)
        obs[j, -2:] = 1.0
    batched = model.candidates(past, obs)
    for j in (7, 43, 50, 0):
        alone = model.candidates(past[j:j + 1], obs[j:j + 1])
        torch.testing.assert_close(alone["forecast"][0], batched["forecast"][j], rtol=0, atol=1e-9)
        torch.testing.assert_close(alone["relative"][0], batched["relative"][j], rtol=0, atol=1e-9)


def test_missing_values_give_finite_forecasts_and_gradients():
    model = CombinationModel(prediction_length=4, context_length=24, seasons=[12])
    past = torch.tensor(np.stack(_series(n=4, length=24)))
    obs = torch.ones_like(past)
    obs[0, :10] = 0  # leading padding (a window that starts before the series)
    obs[1, ::3] = 0  # scattered missing values
    obs[2] = 0  # nothing observed
    obs[3, :-1] = 0  # one value
    past = past * obs  # unobserved values arrive as 0
    loss = model.loss(past, obs, torch.rand(4, 4) * 50, torch.ones(4, 4))
    assert bool(torch.isfinite(loss).all())
    loss.sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    # a missing value reads as the last observed one: the padded window forecasts as if its first value repeated
    full = past[0].clone()
    full[:10] = past[0, 10]
    a = model(past[:1], obs[:1])[0][0]
    b = model(full[None], torch.ones(1, 24))[0][0]
    assert torch.isfinite(a).all() and torch.isfinite(b).all()


def _entries(series: list[np.ndarray]) -> list[dict]:
    start = pd.Period("2000-01", freq="M")
    return [{"target": s, "start": start, "item_id": str(i)} for i, s in enumerate(series)]


@pytest.mark.parametrize("per_window", ["auto", "isolated"])
def test_trains_under_the_dp_strategy_and_exports(tmp_path, per_window):
    from lightning_dpts.app.export import export_model, load_predictor, make_checkpoint_loadable
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, IterateAveraging

    torch.manual_seed(0)
    est = CombinationEstimator(prediction_length=6, context_length=36, freq="M", lr=0.05)
    module = est.create_lightning_module()
    make_checkpoint_loadable(module)
    before = torch.cat([p.detach().flatten().clone() for p in module.parameters()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(_series(), batch_size=4, model=module, freq="M", seed=0)
        strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=0.1, seed=0, per_window=per_window,
                                      spot_check=1.0)
        trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[strategy, AccountantCallback(epsilon=50.0, delta=1e-5), IterateAveraging()])
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 9
    assert strategy.isolated == (per_window == "isolated")  # the probe and spot checks keep "auto" on the fast path
    assert not torch.equal(before, torch.cat([p.detach().flatten() for p in module.parameters()]))
    export_model(est, module, tmp_path, freq="M")
    entries = _entries(_series(n=2))
    ours = [f.quantile(0.3) for f in est.create_predictor(est.create_transformation(), module).predict(entries)]
    loaded = [f.quantile(0.3) for f in load_predictor(tmp_path).predict(entries)]
    for a, b in zip(ours, loaded, strict=True):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_estimator_takes_its_seasons_from_the_frequency():
    assert CombinationEstimator(prediction_length=48, context_length=400, freq="h").seasons == (24, 168)
    assert CombinationEstimator(prediction_length=14, context_length=40, freq="D").seasons == (7,)
    assert CombinationEstimator(prediction_length=12, context_length=60, freq="M", season_length=1).seasons == (1,)
    module = CombinationEstimator(prediction_length=12, context_length=60, freq="M").create_lightning_module()
    assert module.model.seasons == (12,)
    with pytest.raises(ConfigurationError, match="lr_schedule"):
        CombinationEstimator(prediction_length=3, context_length=12, freq="M",
                             lr_schedule="plateau").create_lightning_module()


def _fitted_by_hand(z: np.ndarray, h: int, burn_in: int) -> tuple[np.ndarray, np.ndarray, float]:
    """SES and Theta with the grid's alpha of least in-sample one-step squared error (from t = burn_in), by direct
    recursion on numbers: (ses forecast, theta forecast, alpha)."""
    best = None
    for a in classical.FIT_ALPHAS:
        level, sse = z[0], 0.0
        for t in range(1, len(z)):
            if t >= burn_in:
                sse += (z[t] - level) ** 2
            level = a * z[t] + (1 - a) * level
        if best is None or sse < best[0]:
            best = (sse, level, a)
    _, level, a = best
    slope = np.polyfit(np.arange(len(z)), z, 1)[0]  # Hyndman & Billah (2003): SES + b/2 (h - 1 + 1/a - (1-a)^n/a)
    theta = level + slope / 2 * (np.arange(1, h + 1) - 1 + 1 / a - (1 - a) ** len(z) / a)
    return np.full(h, level), theta, a


def test_fitted_candidates_choose_alpha_per_window_by_in_sample_error():
    """ses_fit and theta_fit against a direct recursion over the grid, for a noisy level (small alpha wins) and a
    random walk (large alpha wins), each window alone; their hold-out forecasts likewise from the first P - q values."""
    model = CombinationModel(prediction_length=5, context_length=40, seasons=[])
    rng = np.random.default_rng(4)
    x = np.stack([10 + rng.normal(size=40), np.cumsum(rng.normal(size=40)) + 30.0])
    past = torch.tensor(x, dtype=torch.float32)
    c = model.candidates(past, torch.ones_like(past))
    z = c["z"].numpy()
    ses_i, theta_i = model.names.index("ses_fit"), model.names.index("theta_fit")
    alphas = []
    for j in range(2):
        ses, theta, a = _fitted_by_hand(z[j], 5, model.burn_in)
        alphas.append(a)
        np.testing.assert_allclose(c["forecast"][j, :, ses_i].numpy(), ses, rtol=1e-10)
        np.testing.assert_allclose(c["forecast"][j, :, theta_i].numpy(), theta, rtol=1e-10)
    assert alphas[0] <= 0.2 and alphas[1] >= 0.7
    q = model.holdout
    held = model.fitted_holdout(c["z"][:, : 40 - q], torch.zeros(2, 1), torch.ones(2, 40 - q).double())[0]
    for j in range(2):  # the mask counts every step here, so burn_in 1
        ses, theta, _ = _fitted_by_hand(z[j, : 40 - q], q, 1)
        np.testing.assert_allclose(held[j, 0].numpy(), ses, rtol=1e-10)
        np.testing.assert_allclose(held[j, 1].numpy(), theta, rtol=1e-10)


def test_holdout_errors_by_hand():
    """The hold-out feature: each candidate forecasts the window's last q = min(H, P // 3) values from the values
    before them; naive repeats z[P-q-1], drift adds the mean step of z[0..P-q-1] (no season: no adjustment)."""
    model = CombinationModel(prediction_length=6, context_length=30, seasons=[])
    q = model.holdout
    assert q == 6
    rng = np.random.default_rng(3)
    x = np.cumsum(rng.normal(size=(2, 30)), axis=1) + 20.0
    past = torch.tensor(x, dtype=torch.float32)
    c = model.candidates(past, torch.ones_like(past))
    z = c["z"].numpy()
    head, tail = z[:, : 30 - q], z[:, 30 - q:]
    naive = ((tail - head[:, -1:]) ** 2).mean(-1)
    slope = (head[:, -1] - head[:, 0]) / (head.shape[1] - 1)
    drift = ((tail - head[:, -1:] - slope[:, None] * np.arange(1, q + 1)) ** 2).mean(-1)
    log = np.log(np.stack([naive, drift], -1) + 1e-6)
    got = c["holdout"].numpy()
    np.testing.assert_allclose(got[:, 0] - got[:, 1], log[:, 0] - log[:, 1], rtol=1e-9, atol=1e-9)


def test_initial_spread_is_calibrated_to_a_random_walk_of_known_scale():
    """On Gaussian random walks with step sd s the initial one-step sigma (original units), computed from each window
    alone (u, the combined one-step in-sample error, and d, its mean absolute difference), is s within 15%
    (measured 0.98 s); it grows as h^0.4 and scales with the series (times 1000: sigma times 1000), and
    SPREAD_FEATURE_SCALE does not change it. Seeded: 64 walks of 200 steps, the mean ratio's sd is ~0.01, so the
    band fails with probability below 1e-9 while the calibration holds."""
    from lightning_dpts.models import combination

    rng = np.random.default_rng(7)
    s = 3.0
    walks = torch.tensor(1000.0 + np.cumsum(rng.normal(0.0, s, (64, 200)), axis=1))
    model = CombinationModel(prediction_length=8, context_length=200, seasons=[])
    with torch.no_grad():
        (_, sigma), _, scale = model(walks, torch.ones_like(walks))
    sigma = sigma.double() * scale.double()  # original units
    ratio = float((sigma[:, 0] / s).mean())
    assert 0.85 < ratio < 1.15, ratio
    torch.testing.assert_close(sigma[:, 7] / sigma[:, 0], torch.full_like(sigma[:, 0], 8.0 ** 0.4), rtol=1e-4,
                               atol=0)
    (_, big), _, big_scale = model(walks * 1000.0, torch.ones_like(walks))
    torch.testing.assert_close(big.double() * big_scale.double(), sigma * 1000.0, rtol=1e-4, atol=0)
    old = combination.SPREAD_FEATURE_SCALE
    try:
        combination.SPREAD_FEATURE_SCALE = 1.0
        unscaled = CombinationModel(prediction_length=8, context_length=200, seasons=[])
        (_, same), _, _ = unscaled(walks, torch.ones_like(walks))
    finally:
        combination.SPREAD_FEATURE_SCALE = old
    torch.testing.assert_close(same.double() * scale.double(), sigma, rtol=1e-4, atol=0)


def test_the_spread_leaves_most_of_the_clipping_norm_to_the_gate():
    """Per-window CRPS gradients at initialisation (the quantity DP-SGD clips): with the spread's features scaled by
    SPREAD_FEATURE_SCALE the gate holds most of each window's squared norm; with them unscaled (1.0) the spread
    took most of it, so clipping spent C on the spread. The optimizer gives the gate and the spread their learning
    rate multiples. Deterministic (fixed series and initialisation): shares measured 0.10 scaled, 0.91 unscaled."""
    from lightning_dpts.models import combination

    def spread_shares() -> np.ndarray:
        torch.manual_seed(0)
        module = CombinationEstimator(prediction_length=6, context_length=36, freq="M").create_lightning_module()
        model = module.model
        shares = []
        for x in _series(n=16, length=42, seed=3):
            past, future = torch.tensor(x[None, :36]), torch.tensor(x[None, 36:])
            model.zero_grad()
            model.loss(past, torch.ones_like(past), future, torch.ones_like(future)).sum().backward()
            g, s = model.gate.weight.grad.norm() ** 2, model.spread.weight.grad.norm() ** 2
            shares.append(float(s / (g + s)))
        return np.asarray(shares)

    scaled = spread_shares()
    old = combination.SPREAD_FEATURE_SCALE
    try:
        combination.SPREAD_FEATURE_SCALE = 1.0
        unscaled = spread_shares()
    finally:
        combination.SPREAD_FEATURE_SCALE = old
    assert np.median(scaled) < 0.2 and np.median(unscaled) > 0.8, (np.median(scaled), np.median(unscaled))
    module = CombinationEstimator(prediction_length=6, context_length=36, freq="M", lr=0.01).create_lightning_module()
    groups = module.configure_optimizers().param_groups
    assert [g["lr"] for g in groups] == [0.01 * combination.GATE_LR_FACTOR, 0.01 * combination.SPREAD_LR_FACTOR]
    assert groups[0]["params"] == [module.model.gate.weight] and groups[1]["params"] == [module.model.spread.weight]

"""BandMF wired into training: DPForecastStrategy(noise="bandmf"), the b_min_sep top level, Monte Carlo accounting.

Statistical tests use fixed seeds and state their false-failure rate (under the hypothesis that the code is right).
"""

from __future__ import annotations

import csv
import math
import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.data.bminsep import inclusion_rate, sampling_prob_for_rate
from lightning_dpts.data.sampler import StructuredSampler
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.privacy.montecarlo import MonteCarloAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy
from lightning_dpts.training.correlated_noise import BandMFNoise
from tests.training.conftest import make_module, trainer

UNUSED = 3000  # coordinates of a parameter that receives noise only


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _datamodule(module, bands=2, seed=1, **kwargs):
    # us_employment: 148 series; batch 16, lambda = 1 -> N' = 16, p0 = 16/148, 9 steps per epoch
    return StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=seed,
                                           top_level="b_min_sep", bands=bands, **kwargs)


def _module_with_unused_parameter():
    module = make_module("dlinear")
    module.unused = torch.nn.Parameter(torch.zeros(UNUSED))  # no gradient: its update is the noise alone
    return module


class _GradRecorder(Callback):
    """Records the unused parameter's (noise-only) gradient after the strategy wrote it."""

    dp_post_processing = True  # the noisy gradients: functions of the released iterates

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.grads.append(pl_module.unused.grad.detach().clone())

    # No clean-up: DLinear's optimizer does not hold `unused`, so zero_grad leaves its noisy .grad; the strategy
    # must not mistake it for a gradient outside the per-window hooks at the next step.


def _inverse_covariance_correlation(c: np.ndarray, n: int) -> np.ndarray:
    """Correlation matrix of the rows of C^{-1} Z for the n x n banded Toeplitz C (dense inverse, independent of
    the streaming recursion)."""
    mat = np.zeros((n, n))
    for j, v in enumerate(c):
        mat += v * np.eye(n, k=-j)
    inv = np.linalg.inv(mat)
    cov = inv @ inv.T
    d = np.sqrt(np.diag(cov))
    return cov / np.outer(d, d)


# --------------------------------------------------------------------------------------------------------------
# 1. the strategy
# --------------------------------------------------------------------------------------------------------------
def test_bandmf_noise_in_training_has_the_correlation_of_c_inverse_z():
    """Successive steps' noise on an unused parameter has the lag-1 correlation of C^{-1}Z.

    Coefficients (1, 0.9)/norm give corr(w_i, w_{i-1}) about -0.67 (DP-SGD: 0). Each sample correlation over 3,000
    coordinates has standard error <= 1/sqrt(3000) = 0.018; the tolerance 0.1 is > 5.4 standard errors, so a false
    failure among the 5 lags has probability < 5 * 1e-7.
    """
    coefficients = (1.0, 0.9)
    module = _module_with_unused_parameter()
    rec = _GradRecorder()
    strategy = DPForecastStrategy(2.0, 0.5, seed=0, noise="bandmf", coefficients=coefficients)
    t = trainer(max_steps=6, callbacks=[strategy, rec])
    t.fit(module, datamodule=_datamodule(module, bands=2))
    assert len(rec.grads) == 6
    w = torch.stack(rec.grads).double().numpy()
    expected = _inverse_covariance_correlation(np.asarray(coefficients) / np.linalg.norm(coefficients), 6)
    for i in range(1, 6):
        r = np.corrcoef(w[i], w[i - 1])[0, 1]
        assert abs(r - expected[i, i - 1]) < 0.1, (i, r, expected[i, i - 1])
    assert expected[5, 4] < -0.6
    # scale: the noise std on the summed gradient is sigma C = 1; the written gradient divides by Lambda = 16
    assert strategy.coefficients == coefficients  # used as given (the accountant uses the same C)
    assert w[0].std() * 16 == pytest.approx(1.0 / coefficients[0], rel=0.1)  # 3000 draws: s.e. ~1.3%; > 7 s.e.
    assert w[1].std() * 16 == pytest.approx(math.sqrt(1 + 0.81), rel=0.1)  # w_1 = z_1 - 0.9 z_0
    ledger = module.dpts_privacy_ledger
    assert (ledger.noise, ledger.bands, ledger.steps) == ("bandmf", 2, 6)


def test_bandmf_argument_checks():
    with pytest.raises(ConfigurationError, match="bands"):
        DPForecastStrategy(1.0, noise="bandmf")
    with pytest.raises(ConfigurationError, match="noise"):
        DPForecastStrategy(1.0, noise="pink")
    with pytest.raises(ConfigurationError, match="bands"):
        DPForecastStrategy(1.0, bands=4)  # gaussian takes no bands
    with pytest.raises(ConfigurationError):
        DPForecastStrategy(1.0, noise="bandmf", coefficients=(0.0, 1.0))


def test_bandmf_needs_b_min_sep_sampling_with_the_same_bands():
    module = make_module("dlinear")
    dm = StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1, top_level="poisson")
    with pytest.raises(ConfigurationError, match="b_min_sep"):
        trainer(max_steps=2, callbacks=[DPForecastStrategy(1.0, noise="bandmf", bands=2)]).fit(module, datamodule=dm)
    module = make_module("dlinear")
    with pytest.raises(ConfigurationError, match="bands=3"):
        trainer(max_steps=2, callbacks=[DPForecastStrategy(1.0, noise="bandmf", bands=3)]).fit(
            module, datamodule=_datamodule(module, bands=2))


def test_bandmf_run_is_not_resumable(tmp_path):
    module = make_module("dlinear")
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1, filename="{step}")
    t = trainer(max_steps=2, enable_checkpointing=True,
                callbacks=[DPForecastStrategy(1.0, 0.5, noise="bandmf", bands=2), ckpt])
    t.fit(module, datamodule=_datamodule(module))
    # continuing the same module (ledger attached) is refused, with the reason
    with pytest.raises(ConfigurationError, match="cannot be resumed") as err:
        trainer(max_steps=4, callbacks=[DPForecastStrategy(1.0, 0.5, noise="bandmf", bands=2),
                                        AccountantCallback(100.0, 1e-3, monte_carlo_samples=500)]).fit(
            module, datamodule=_datamodule(module))
    assert "secret" in str(err.value) and "freshly initialised" in str(err.value)
    # resuming from the checkpoint is refused too, also with DP-SGD noise on the BandMF ledger
    fresh = make_module("dlinear")
    with pytest.raises(ConfigurationError, match="cannot be resumed"):
        trainer(max_steps=4, callbacks=[DPForecastStrategy(1.0, 0.5),
                                        AccountantCallback(100.0, 1e-3, monte_carlo_samples=500)]).fit(
            fresh, datamodule=_datamodule(fresh), ckpt_path=str(tmp_path / "step=2.ckpt"))
    saved = torch.load(tmp_path / "step=2.ckpt", weights_only=False)
    assert saved["dpts_privacy_ledger"]["noise"] == "bandmf" and saved["dpts_privacy_ledger"]["bands"] == 2


def test_attacker_two_default_runs_differ_and_no_artifact_holds_noise_state(tmp_path):
    """The attacker knows the code, the config, the batches (seeded datamodule here) and every file written.

    With the default seed=None, two runs from the same initialisation end with different noise-only parameters (a
    replayable noise source would make them equal); the checkpoint holds no tensor but the module's weights and
    optimizer state, and the noise object refuses pickling.
    """
    finals, strategies = [], []
    for run in range(2):
        module = _module_with_unused_parameter()
        strategy = DPForecastStrategy(1.0, 0.5, noise="bandmf", bands=2)
        rec = _GradRecorder()
        ckpt = ModelCheckpoint(dirpath=tmp_path / str(run), every_n_train_steps=3, save_top_k=-1, filename="{step}")
        trainer(max_steps=3, enable_checkpointing=True, callbacks=[strategy, rec, ckpt]).fit(
            module, datamodule=_datamodule(module, seed=7))
        finals.append(torch.stack(rec.grads))
        strategies.append(strategy)
    assert finals[0].abs().min() > 0 and not torch.equal(finals[0], finals[1])
    assert (finals[0] - finals[1]).abs().mean() > 0.5 * finals[0].abs().mean()
    assert isinstance(strategies[0].noise, BandMFNoise)
    with pytest.raises(TypeError):
        pickle.dumps(strategies[0].noise)
    saved = torch.load(tmp_path / "0" / "step=3.ckpt", weights_only=False)
    state = saved["callbacks"]["DPForecastStrategy"]
    assert set(state) == {"noise_multiplier", "max_grad_norm", "ledger", "seeded", "seeded_notice"}  # seeded batches
    assert (state["ledger"]["noise"], state["ledger"]["bands"]) == ("bandmf", 2)

    def tensors(obj, path=""):
        if isinstance(obj, torch.Tensor):
            yield path, obj
        elif isinstance(obj, dict):
            for k, v in obj.items():
                yield from tensors(v, f"{path}/{k}")
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                yield from tensors(v, f"{path}/{i}")

    weights = set(saved["state_dict"])
    for path, t in tensors({k: v for k, v in saved.items() if k not in ("state_dict", "optimizer_states")}):
        if t.numel() > 1:  # ModelCheckpoint keeps scalar tensors (kth_value); the noise has UNUSED values
            raise AssertionError(f"unexpected tensor in the checkpoint at {path}")
    assert weights == set(make_module("dlinear").state_dict()) | {"unused"}
    # the last noise row (what the band would need to continue) is nowhere in the checkpoint
    last = strategies[0].noise._history[0]
    for _, t in tensors(saved["optimizer_states"]):
        assert t.numel() != last.numel() or not torch.allclose(t.flatten().double(), last.double())


# --------------------------------------------------------------------------------------------------------------
# 2. the b_min_sep top level
# --------------------------------------------------------------------------------------------------------------
def _step_series(dm, passes):
    loader_steps = []
    for _ in range(passes):
        for batch in dm.train_dataloader():
            loader_steps.append(np.unique(batch["series_index"].numpy()))
    return loader_steps


def test_b_min_sep_batches_respect_the_separation_and_the_rate():
    """Over 40 passes (360 steps) no series is sampled twice within b = 4 steps; the inclusion rate is p0 = N'/N.

    z-test on the per-series counts (independent across series, identically distributed): |z| < 4.5 fails falsely
    with probability about 7e-6 (normal approximation over 148 series).
    """
    module = make_module("dlinear")
    dm = _datamodule(module, bands=4)
    dm.setup("fit")
    steps = _step_series(dm, 40)
    n, num = len(steps), dm.sampling_spec.num_series
    assert n == 360
    last_seen = np.full(num, -10**9)
    counts = np.zeros(num)
    for i, series in enumerate(steps):
        assert np.all(i - last_seen[series] >= 4), i
        last_seen[series] = i
        counts[series] += 1
    p0 = dm.sampling_spec.top_level_rate
    assert inclusion_rate(sampling_prob_for_rate(p0, 4), 4) == pytest.approx(p0)
    z = (counts.mean() - n * p0) / (counts.std(ddof=1) / math.sqrt(num))
    assert abs(z) < 4.5, (counts.mean(), n * p0, z)


def test_b_min_sep_worker_replay_gives_the_single_process_batches():
    """A DataLoader worker holds a copy without the chain and replays it: same batches as the single process."""
    module = make_module("dlinear")
    dm = _datamodule(module, bands=3)
    dm.setup("fit")
    sampler: StructuredSampler = dm.train_dataloader().dataset
    sequential = [sampler.sample_indices(0, s)[0] for s in range(9)] + [sampler.sample_indices(1, s)[0]
                                                                        for s in range(9)]
    copy = StructuredSampler.__new__(StructuredSampler)
    copy.__dict__.update(sampler.__getstate__())  # what a worker process receives
    assert copy._bminsep is None
    for s in (4, 5, 13):
        assert np.array_equal(copy.sample_indices(s // 9, s % 9)[0], sequential[s])


def test_sampling_spec_b_min_sep_validation_and_the_pld_accountant_refuses_it():
    spec = SamplingSpec(num_series=100, min_length=20, context_length=4, prediction_length=2, batch_size=10,
                        top_level="b_min_sep", bands=4)
    with pytest.raises(ConfigurationError, match="Monte Carlo"):
        StructuredSubsamplingAccountant(spec, 1.0)
    with pytest.raises(ConfigurationError, match="bands"):
        SamplingSpec(num_series=100, min_length=20, context_length=4, prediction_length=2, batch_size=10,
                     top_level="poisson", bands=4)
    with pytest.raises(ConfigurationError, match="1/b"):
        SamplingSpec(num_series=100, min_length=20, context_length=4, prediction_length=2, batch_size=30,
                     top_level="b_min_sep", bands=4)


# --------------------------------------------------------------------------------------------------------------
# 3. AccountantCallback with the Monte Carlo accountant
# --------------------------------------------------------------------------------------------------------------
def test_accountant_callback_monte_carlo_logs_and_caps_the_run(tmp_path):
    module = make_module("dlinear")
    logger = CSVLogger(tmp_path, name="run")
    acc = AccountantCallback(60.0, 0.05, monte_carlo_samples=8000)
    strategy = DPForecastStrategy(1.0, 0.5, seed=0, noise="bandmf", bands=2)
    t = trainer(max_epochs=50, max_steps=7, logger=logger, callbacks=[strategy, acc])
    t.fit(module, datamodule=_datamodule(module))
    assert t.global_step == 7 and acc.max_steps == 7 and strategy.step_cap == 7
    assert isinstance(acc.monte_carlo, MonteCarloAccountant) and acc.monte_carlo.planned_steps == 7
    mech = acc.monte_carlo.mechanism
    assert mech.sensitivity == 1.0 and mech.leak_probability == 1.0 and mech.bands == 2
    assert mech.sampling_prob == pytest.approx(sampling_prob_for_rate(16 / 148, 2))
    eps = acc.monte_carlo_epsilon
    assert 0 < eps <= 60.0
    assert acc.report.kind == "monte_carlo" and acc.report.epsilon == eps and acc.report.steps == 7
    assert acc.monte_carlo_report["samples_per_direction"] == 8000
    rows = [r for r in csv.DictReader(open(Path(logger.log_dir) / "metrics.csv"))
            if r.get("epsilon_monte_carlo_upper")]
    assert len(rows) == 7 and all(float(r["epsilon_monte_carlo_upper"]) == pytest.approx(eps) for r in rows)
    assert acc.hyperparameters["bound_kind"] == "monte_carlo" and acc.hyperparameters["noise"] == "bandmf"


def test_accountant_callback_monte_carlo_refuses_a_plan_over_budget_before_any_step():
    module = make_module("dlinear")
    before = {k: v.clone() for k, v in module.state_dict().items()}
    acc = AccountantCallback(0.05, 0.05, monte_carlo_samples=2000)
    t = trainer(max_steps=20, callbacks=[DPForecastStrategy(1.0, 0.5, seed=0, noise="bandmf", bands=2), acc])
    with pytest.raises(ConfigurationError, match="noise_multiplier") as err:
        t.fit(module, datamodule=_datamodule(module))
    assert "Monte Carlo" in str(err.value) and "max_steps" in str(err.value)
    assert t.global_step == 0
    assert all(torch.equal(v, before[k]) for k, v in module.state_dict().items())


def test_monte_carlo_wiring_at_b1_matches_dp_accounting():
    """Gaussian noise with b_min_sep, b = 1 is Poisson DP-SGD: the callback's mechanism (p = N'/N, sensitivity
    lambda = 2, sigma) has the add/remove delta that dp_accounting computes independently (PLD, Poisson sampled
    Gaussian of std sigma/lambda). Monte Carlo estimate within 5 standard errors (false failure < 1e-6), the
    EVR-verified upper bound above the exact value."""
    dp_accounting = pytest.importorskip("dp_accounting")
    module = make_module("dlinear")
    dm = StructuredSubsamplingDataModule("us_employment", batch_size=32, instances_per_series=2, model=module,
                                         seed=1, top_level="b_min_sep", bands=1)
    acc = AccountantCallback(100.0, 0.05, monte_carlo_samples=40_000)
    strategy = DPForecastStrategy(3.0, 0.5, seed=0)
    t = trainer(max_steps=5, callbacks=[strategy, acc])
    t.fit(module, datamodule=dm)
    mc = acc.monte_carlo
    assert mc.mechanism.sensitivity == 2.0 and mc.mechanism.coefficients == (1.0,)
    q = 16 / 148
    assert mc.mechanism.sampling_prob == pytest.approx(q)
    pld = dp_accounting.pld.PLDAccountant()
    pld.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(3.0 / 2.0)), 5)
    for eps in (0.5, 1.0):
        exact = pld.get_delta(eps)
        est = mc.delta_estimate(eps)
        assert abs(est - exact) < 5 * math.sqrt(max(exact, 1e-4) / mc.samples) + 1e-4, (eps, est, exact)
        assert mc.delta_upper(eps) >= exact
    # the logged epsilon is the substitution conversion: (1 + e^{e/2}) delta_upper(e/2) <= delta
    e = acc.monte_carlo_epsilon
    assert (1 + math.exp(e / 2)) * mc.delta_upper(e / 2) <= 0.05


def test_monte_carlo_path_refuses_shortened_epochs():
    """limit_train_batches would skip chain steps between passes and break the separation between noisy steps."""
    module = make_module("dlinear")
    acc = AccountantCallback(60.0, 0.05, monte_carlo_samples=500)
    t = trainer(max_steps=6, limit_train_batches=2,
                callbacks=[DPForecastStrategy(1.0, 0.5, seed=0, noise="bandmf", bands=2), acc])
    with pytest.raises(ConfigurationError, match="limit_train_batches"):
        t.fit(module, datamodule=_datamodule(module))
    assert t.global_step == 0


def test_substitution_epsilon_finds_the_smallest_satisfying_value_of_a_non_monotone_condition():
    """(1 + e^eps) d(eps) <= delta is not monotone in eps (d stops at the EVR floor); brute force on a fine grid: the
    returned 2 eps satisfies it and no grid point below it does (deterministic given the seeded samples)."""
    from lightning_dpts.privacy.montecarlo import BandMFMechanism

    mc = MonteCarloAccountant(BandMFMechanism(60, (1.0, 0.0), sampling_prob_for_rate(0.1, 2), 2.0), samples=20_000,
                              seed=3)
    delta = 1e-2
    e = mc.substitution_epsilon(60, delta) / 2
    assert math.isfinite(e) and (1 + math.exp(e)) * mc.delta_upper(e) <= delta
    grid = np.linspace(0.0, e * (1 - 1e-3), 400)
    assert not any((1 + math.exp(g)) * mc.delta_upper(g) <= delta for g in grid)
    # a doubling search from eps = 1 would have looked at 1, 2, 4, ...: the satisfying interval can lie between them
    assert mc.substitution_epsilon(60, 1e-12) == math.inf


def test_b_min_sep_two_dataloader_workers_see_the_single_process_batches():
    """Two real DataLoader worker processes, two passes: the same series per step as num_workers=0."""
    module = make_module("dlinear")
    single = _datamodule(module, bands=3, seed=5)
    single.setup("fit")
    want = _step_series(single, 2)
    workers = _datamodule(module, bands=3, seed=5, num_workers=2)
    workers.setup("fit")
    got = _step_series(workers, 2)
    assert len(got) == len(want) == 18
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w)

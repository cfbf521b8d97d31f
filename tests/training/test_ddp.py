"""DP training on Lightning's DDP: 2 CPU processes with gloo (issue 13; docs/distributed.md).

One module-scoped run (about 40-70 s on the shared 2-core machine; in the fast suite, as issue 13 asks): a
1-process fit writes a checkpoint,
``python -m torch.distributed.run --nproc-per-node 2 tests/training/ddp_worker.py`` resumes it on 2 processes
until the budget stops it (then a Poisson fit and a sampler-only phase), and a 1-process fit resumes the
2-process checkpoint. The subprocess has a timeout and every collective a 60 s timeout, so a hang fails the
test instead of blocking CI. The in-process refusal tests below are fast.

Statistical tests and their false-failure rates (fixed seeds cannot be used: the point is that the DP
randomness is fresh OS entropy, so the rates are stated instead):

* noise variance: chi-square with n = 3800 degrees of freedom (known mean 0), two-sided at 2e-7 per test,
  2 tests;
* inclusion frequencies: 16 per-series z-tests at |z| < 5.5 (two-sided 3.8e-8 each);
* an artifact containing one of the 4 random 32-bit words of the entropy by chance: < 4 x 2^-32 per byte
  position, below 1e-4 for the < 20 KB written.
Total below 2e-4.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import types
import warnings
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from scipy import stats

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy, make_private_compatible, read_ledger
from lightning_dpts.training.guards import check_distributed
from tests.training import ddp_worker as worker

WORKER = Path(worker.__file__)
REPO = WORKER.parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_process_fit(max_steps: int, budget: tuple[float, float], ckpt_path: str | None = None,
                     save: Path | None = None) -> tuple[L.Trainer, DPForecastStrategy, AccountantCallback]:
    model, dm = worker.Tiny(), worker.datamodule()
    strategy = DPForecastStrategy(noise_multiplier=worker.SIGMA, max_grad_norm=worker.CLIP)
    accountant = AccountantCallback(*budget)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, callbacks=[strategy, accountant],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    if save is not None:
        trainer.save_checkpoint(str(save))
    return trainer, strategy, accountant


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp")
    _one_process_fit(5, worker.BUDGET, save=out / "one.ckpt")
    _launch(out)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {"out": out, "ranks": ranks}


def _launch(out: Path, *args: str) -> None:
    """``ddp_worker.py out *args`` on 2 processes (torchrun); both must exit 0 (errors are recorded, not raised)."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), str(WORKER), str(out), *args]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _chi2_accepts(values: np.ndarray, std: float, alpha: float = 1e-7) -> tuple[bool, float]:
    """Two-sided chi-square test that ``values`` are N(0, std^2) in variance (known mean 0)."""
    n = values.size
    statistic = float(np.sum(np.square(values)) / std**2)
    return bool(stats.chi2.ppf(alpha, n) < statistic < stats.chi2.ppf(1 - alpha, n)), statistic / n


def _spec():
    return worker.datamodule().sampling_spec


def test_noise_on_unused_parameter_has_the_single_process_std(run: dict) -> None:
    """sigma C / Lambda (one draw on the global sum), not sigma C / (Lambda sqrt 2) (per-rank noise averaged)."""
    spec = _spec()
    g0 = np.array(run["ranks"][0]["gaussian"]["unused_grads"])
    g1 = np.array(run["ranks"][1]["gaussian"]["unused_grads"])
    assert g0.shape == (19, math.prod(worker.UNUSED_SHAPE))
    np.testing.assert_array_equal(g0, g1)  # the identical update on both ranks
    std = worker.SIGMA * worker.CLIP / spec.batch_size
    ok, ratio = _chi2_accepts(g0, std)
    assert ok, f"variance ratio {ratio:.3f} (1 expected; 0.5 would be per-rank noise averaged)"
    assert not _chi2_accepts(g0, std / math.sqrt(2))[0]


def test_an_observer_of_rank_1_cannot_subtract_any_of_the_noise(run: dict) -> None:
    """Attacker who reads rank 1's process: what it put into the all-reduce, and what came back. The residual on
    a parameter no window touches is the whole noise N(0, sigma^2 C^2), not a half-draw of rank 0 (which is
    what is left if each rank added N(0, sigma^2 C^2 / 2) and the attacker subtracts rank 1's half)."""
    gaussian = run["ranks"][1]["gaussian"]
    sent, received = np.array(gaussian["allreduce_in"]), np.array(gaussian["allreduce_out"])
    assert sent.shape == (19, math.prod(worker.UNUSED_SHAPE))
    assert not sent.any()  # rank 1 draws no noise and has no gradient there
    ok, ratio = _chi2_accepts(received - sent, worker.SIGMA * worker.CLIP)
    assert ok, f"residual variance ratio {ratio:.3f}: the noise rank 1 does not know is not the full sigma C"


def test_both_ranks_hold_identical_weights_and_stop_at_the_accounted_step(run: dict) -> None:
    spec = _spec()
    expected = StructuredSubsamplingAccountant(spec, worker.SIGMA).max_steps(*worker.BUDGET)
    g = [r["gaussian"] for r in run["ranks"]]
    assert g[0]["weights"] == g[1]["weights"]
    assert expected == 24
    for rank in g:
        assert rank["global_step"] == rank["ledger_steps"] == rank["max_steps"] == rank["report_steps"] == expected
        assert rank["report_epsilon"] <= worker.BUDGET[0]
    assert g[0]["report_epsilon"] == g[1]["report_epsilon"]
    accountant = StructuredSubsamplingAccountant(spec, worker.SIGMA)
    assert g[0]["report_epsilon"] == pytest.approx(accountant.epsilon(expected, worker.BUDGET[1]), rel=1e-9)
    assert len(g[0]["shares"]) == len(g[1]["shares"]) == expected - 5  # every rank took every step


def test_epsilon_is_logged_once_per_step(run: dict) -> None:
    import csv

    (metrics,) = run["out"].glob("logs/**/metrics.csv")  # one logger directory: rank 0's
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("epsilon")]
    steps = [int(r["step"]) for r in rows]
    assert len(steps) == len(set(steps)) == 24 - 5  # the 2-process fit's noisy steps, each logged once
    assert all(float(r["epsilon"]) <= worker.BUDGET[0] for r in rows)


def test_every_step_is_one_global_structured_sample(run: dict) -> None:
    spec = _spec()
    g = [r["gaussian"] for r in run["ranks"]]
    assert g[0]["entropy_shared"] == g[1]["entropy_shared"]
    assert run["ranks"][0]["entropy_before"] != run["ranks"][1]["entropy_before"]  # fresh per rank, then rank 0's
    for a, b in zip(g[0]["shares"], g[1]["shares"], strict=True):
        union = a + b
        assert len(a) == len(b) == spec.batch_size // 2
        counts = np.bincount(union, minlength=spec.num_series)
        assert (counts > 0).sum() == spec.top_sample_size  # N' distinct series ...
        assert set(counts[counts > 0]) == {spec.instances_per_series}  # ... with lambda windows each


def test_global_sample_is_the_single_process_sample_with_its_inclusion_frequencies(run: dict) -> None:
    spec = _spec()
    s0, s1 = run["ranks"][0]["sampler"]["shares"], run["ranks"][1]["sampler"]["shares"]
    reference = run["ranks"][0]["sampler"]["reference"]
    steps = 0
    counts = np.zeros(spec.num_series)
    for p0, p1, ref in zip(s0, s1, reference, strict=True):
        for a, b, r in zip(p0, p1, ref, strict=True):
            assert a + b == r  # rank 0's share, then rank 1's, is the single-process batch of the shared entropy
            counts += np.bincount(np.unique(r), minlength=spec.num_series)
            steps += 1
    rho = spec.top_sample_size / spec.num_series
    z = (counts - steps * rho) / math.sqrt(steps * rho * (1 - rho))
    assert np.all(np.abs(z) < 5.5), z


def test_poisson_levels_with_empty_local_batches_run(run: dict) -> None:
    p = [r["poisson"] for r in run["ranks"]]
    assert p[0]["global_step"] == p[1]["global_step"] == p[0]["ledger_steps"] == p[1]["ledger_steps"] == 30
    assert p[0]["weights"] == p[1]["weights"]
    sizes = [(len(a), len(b)) for a, b in zip(p[0]["shares"], p[1]["shares"], strict=True)]
    assert any((x == 0) != (y == 0) for x, y in sizes)  # one rank empty, the other not
    assert (0, 0) in sizes  # the noise-only step on every rank


def test_a_forward_that_mixes_windows_is_isolated_on_every_rank(run: dict) -> None:
    p = [r["isolated"] for r in run["ranks"]]
    assert p[0]["isolated"] and p[1]["isolated"]
    assert p[0]["global_step"] == p[1]["global_step"] == p[0]["ledger_steps"] == p[1]["ledger_steps"] == 12
    assert p[0]["weights"] == p[1]["weights"]


def test_a_non_finite_gradient_on_one_rank_stops_every_rank_at_the_same_step(run: dict) -> None:
    nan = [r["nan"] for r in run["ranks"]]
    assert {n["error"] for n in nan} <= {"NonFiniteGradientError", "RuntimeError"}
    assert "NonFiniteGradientError" in {n["error"] for n in nan}
    assert any("'3'" in n["message"] or "#3" in n["message"] for n in nan if n["error"] == "NonFiniteGradientError")
    assert nan[0]["ledger_steps"] == nan[1]["ledger_steps"]


@pytest.mark.slow  # two more processes; the non-finite-gradient test above checks the failure flag on the shared run
def test_a_layer_frozen_on_one_rank_stops_every_rank_at_that_step_without_waiting(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Rank 1 alone freezes a trainable layer at step 3 (e.g. a callback that runs on one rank). Its refusal (the
    trainable set is fixed for the fit) used to be raised before the gradient all-reduce, which rank 0 had already
    entered: rank 0 then failed inside it with gloo's transport error ("Connection closed by peer"), which names
    neither the rank nor the cause. Now the refusal rides on the all-reduce's failure flag: both ranks raise at
    step 3 without waiting for the collective's 60 s timeout, rank 0 with the error that points to the other rank's
    refusal, and no weight moves at that step on either rank."""
    _the_refusal_on_rank_1_stops_both_ranks_at_step_3(tmp_path_factory, "freeze", "frozen during DP training")


@pytest.mark.slow  # two more processes for ~12 s
def test_a_buffer_written_on_one_rank_stops_every_rank_at_that_step_without_waiting(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Rank 1 alone writes a statistic of its share of the batch into a buffer at step 3: the buffer refusal rides
    on the all-reduce's failure flag like the trainable-set refusal, so both ranks stop at step 3."""
    _the_refusal_on_rank_1_stops_both_ranks_at_step_3(tmp_path_factory, "buffer", "buffer 'stat' (WithStat)")


def _the_refusal_on_rank_1_stops_both_ranks_at_step_3(tmp_path_factory: pytest.TempPathFactory, kind: str,
                                                      message: str) -> None:
    out = tmp_path_factory.mktemp(f"ddp_{kind}")
    _launch(out, kind)
    ranks = [json.loads((out / f"freeze{r}.json").read_text()) for r in range(2)]
    assert ranks[1]["error"] == "ConfigurationError" and message in ranks[1]["message"]
    assert ranks[0]["error"] == "RuntimeError" and "other rank(s)" in ranks[0]["message"]
    assert [r["ledger_steps"] for r in ranks] == [3, 3]  # steps 0-2 taken, step 3 refused on both ranks
    # the failure flag answered (rank 0's message names the other rank's refusal; the collective's 60 s timeout
    # would raise gloo's own error instead), and no time is measured
    for r in ranks:
        assert r["weights_after"] == r["weights_seen"][-1]  # the refused step changed no weight
    assert ranks[0]["weights_after"] == ranks[1]["weights_after"]


def test_sampling_entropy_never_reaches_an_artifact(run: dict) -> None:
    """Attacker with every file the run wrote (checkpoints, CSV logs): the shared sampling entropy (and each
    rank's own, pre-broadcast) appears in none of them, in any of the encodings the code handles it in."""
    out: Path = run["out"]
    files = [f for f in out.rglob("*") if f.is_file() and not f.name.startswith("rank")]
    assert any(f.suffix == ".ckpt" and f.parent.name == "ckpt" for f in files)
    assert any(f.suffix == ".csv" for f in files)
    secrets = {int(run["ranks"][0]["gaussian"]["entropy_shared"])}
    secrets |= {int(r["entropy_before"]) for r in run["ranks"]}
    needles: list[bytes] = []
    for value in secrets:
        needles += [str(value).encode(), f"{value:x}".encode(), value.to_bytes(16, "little"), value.to_bytes(16, "big")]
        for k in range(4):
            word = (value >> (32 * k)) & 0xFFFFFFFF
            needles += [word.to_bytes(8, "little"), word.to_bytes(4, "little"), str(word).encode()]
    for f in files:
        blob = f.read_bytes()
        for needle in needles:
            assert needle not in blob, f"{f.name} contains the sampling entropy"


def test_two_process_checkpoint_resumes_on_one_process(run: dict) -> None:
    """The ledger counts global steps, so a checkpoint moves between world sizes (1 -> 2 above, 2 -> 1 here)."""
    last = run["out"] / "ckpt" / "two.ckpt"
    assert read_ledger(last).steps == 24
    spec = _spec()
    budget = (5.0, worker.BUDGET[1])
    expected = StructuredSubsamplingAccountant(spec, worker.SIGMA).max_steps(*budget)
    assert expected > 24
    trainer, strategy, accountant = _one_process_fit(10_000, budget, ckpt_path=str(last))
    assert strategy.ledger.steps == accountant.report.steps == trainer.global_step == expected


# -- fast, in-process ----------------------------------------------------------------------------------------
def _fake_trainer(strategy=None, sync_batchnorm: bool = False, dm=None) -> types.SimpleNamespace:
    from lightning.pytorch.strategies import DDPStrategy

    return types.SimpleNamespace(
        strategy=DDPStrategy() if strategy is None else strategy, world_size=2, global_rank=0,
        _accelerator_connector=types.SimpleNamespace(sync_batchnorm=sync_batchnorm),
        datamodule=worker.datamodule() if dm is None else dm,
    )


def test_several_processes_refuse_what_is_not_supported() -> None:
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    dp = DPForecastStrategy(noise_multiplier=1.0)
    check_distributed(_fake_trainer(), dp.noise_spec, 2)  # the supported configuration
    with pytest.raises(ConfigurationError, match="strategy"):
        check_distributed(_fake_trainer(FSDPStrategy()), dp.noise_spec, 2)
    with pytest.raises(ConfigurationError, match="sync_batchnorm"):
        check_distributed(_fake_trainer(sync_batchnorm=True), dp.noise_spec, 2)
    with pytest.raises(ConfigurationError, match="ddp_comm_hook"):
        check_distributed(_fake_trainer(DDPStrategy(ddp_comm_hook=lambda *a: None)), dp.noise_spec, 2)
    with pytest.raises(ConfigurationError, match="static_graph"):
        check_distributed(_fake_trainer(DDPStrategy(static_graph=True)), dp.noise_spec, 2)
    bandmf = DPForecastStrategy(noise_multiplier=1.0, noise="bandmf", bands=2)
    with pytest.raises(ConfigurationError, match="bandmf"):
        check_distributed(_fake_trainer(), bandmf.noise_spec, 2)
    from lightning_dpts.data import StructuredSubsamplingDataModule

    bminsep = StructuredSubsamplingDataModule(worker.series(), context_length=8, prediction_length=4, batch_size=8,
                                              top_level="b_min_sep", bands=2, test_windows=0)
    with pytest.raises(ConfigurationError, match="b_min_sep"):
        check_distributed(_fake_trainer(dm=bminsep), dp.noise_spec, 2)
    with pytest.raises(ConfigurationError, match="StructuredSubsamplingDataModule"):
        check_distributed(_fake_trainer(dm=L.LightningDataModule()), dp.noise_spec, 2)


def test_a_bare_parameter_of_the_lightning_module_is_refused_on_several_processes() -> None:
    """Issue 32: Lightning's DDP calls the LightningModule with the batch dict, and Opacus' hook on a module that
    owns a parameter failed with "'dict' object has no attribute 'detach'": refused at setup, naming the fix."""
    dp = DPForecastStrategy(noise_multiplier=1.0)
    trainer = _fake_trainer()
    trainer.lightning_module = worker.BareParameter()
    with pytest.raises(ConfigurationError, match="bare nn.Parameter of the LightningModule.*'weight'|'weight'.*bare"):
        check_distributed(trainer, dp.noise_spec, 2)
    trainer.lightning_module = worker.Tiny()  # parameters inside layers: accepted
    check_distributed(trainer, dp.noise_spec, 2)


@pytest.mark.slow  # two processes for ~10 s
def test_a_bare_parameter_of_the_lightning_module_is_refused_under_ddp(tmp_path: Path) -> None:
    _launch(tmp_path, "bare")
    ranks = [json.loads((tmp_path / f"bare{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        assert r["error"] == "ConfigurationError" and "bare nn.Parameter" in r["message"], r
        assert "'dict' object" not in r["message"]


def test_secure_mode_sampling_is_refused_on_several_processes() -> None:
    from lightning_dpts.data import StructuredSubsamplingDataModule

    dm = StructuredSubsamplingDataModule(worker.series(), context_length=8, prediction_length=4, batch_size=8,
                                         secure_mode=True, test_windows=0)
    dm.trainer = types.SimpleNamespace(world_size=2, global_rank=1)
    with pytest.raises(ConfigurationError, match="secure_mode"):
        dm.train_dataloader()


def test_sync_batchnorm_in_the_model_is_refused() -> None:
    module = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.SyncBatchNorm(3))
    with pytest.raises(ConfigurationError, match="SyncBatchNorm"):
        make_private_compatible(module)


def test_shards_partition_the_single_process_batch_with_its_augmentation() -> None:
    """Shards of W ranks from the same entropy concatenate to the 1-process batch, augmentation noise included."""
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.privacy import NeighbouringRelation

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(
            worker.series(), context_length=8, prediction_length=4, batch_size=7, instances_per_series=1,
            top_level="poisson", bottom_level="with_replacement", test_windows=0, seed=3,
            relation=NeighbouringRelation(value_bound=1.0), context_noise=0.5, forecast_noise=0.5,
        )
    sampler = dm.sampler
    for step in range(6):
        sampler.shard(0, 1)
        whole = sampler.batch(0, step)
        for world in (2, 3):
            parts = []
            for rank in range(world):
                sampler.shard(rank, world)
                parts.append(sampler.batch(0, step))
            sizes = [len(p["series_index"]) for p in parts]
            assert max(sizes) - min(sizes) <= 1
            for key, value in whole.items():
                torch.testing.assert_close(torch.cat([p[key] for p in parts]), value, rtol=0, atol=0)
    with pytest.raises(ConfigurationError, match="rank"):
        sampler.shard(2, 2)


def test_spawning_launchers_are_told_to_use_ddp() -> None:
    """``ddp_spawn``/``ddp_notebook`` pickle the datamodule; the error names the strategy to use instead."""
    import pickle

    with pytest.raises(TypeError, match="strategy='ddp'"):
        pickle.dumps(worker.datamodule())

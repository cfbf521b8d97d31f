"""DP training on 2 CPU processes (gloo), launched by ``python -m torch.distributed.run --nproc-per-node 2``.

Used by ``tests/training/test_ddp.py`` (not collected by pytest itself): every rank runs this file and writes
what it observed to ``<out>/rank<r>.json``; the test reads both files. Phases:

1. ``gaussian``: a fit with an AccountantCallback that resumes the 1-process checkpoint ``<out>/one.ckpt`` and
   runs until the budget stops it, saving ``<out>/ckpt/two.ckpt`` (rank 0) and CSV logs. Recorded per noisy
   step: this rank's share of the batch (series indices), the final gradient of a parameter no window touches,
   and - playing an observer of this rank's process - what this rank put into the gradient all-reduce and
   what came back.
2. ``poisson``: Poisson top and bottom levels with an expected global batch of 2 windows (many empty local
   batches), 30 steps. ``isolated``: the same levels, 12 steps of a forward that mixes windows, which the default
   strategy isolates on every rank.
3. ``sampler``: the training loader alone over many passes from fresh per-rank entropy (the broadcast must make
   the shares one global sample), and rank 0's single-process reference batches from the shared entropy.
4. ``nan``: windows of series 3 have a NaN gradient; every rank must raise at the same step, none hang.

``ddp_worker.py <out> freeze`` runs one other fit instead (its own launch: an exception may tear the process group
down): rank 1 alone freezes a trainable layer at step 3; every rank must raise at that step (rank 1 its own
refusal, rank 0 the error that points to the other rank, not a transport error), and no weight changes at that
step. Written to ``<out>/freeze<r>.json``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import types
import warnings
from datetime import timedelta
from pathlib import Path

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.strategies import DDPStrategy
from torch import nn

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

NUM_SERIES, LENGTH, CONTEXT, HORIZON = 16, 40, 8, 4
SIGMA, CLIP = 8.0, 0.5
BUDGET = (4.0, 1e-5)
UNUSED_SHAPE = (4, 50)


def series() -> list[np.ndarray]:
    rng = np.random.default_rng(0)  # the *data* (not privacy randomness): fixed
    return [np.sin(np.arange(LENGTH) / 3.0 + n) + 0.1 * rng.standard_normal(LENGTH) for n in range(NUM_SERIES)]


def datamodule(kind: str = "gaussian") -> StructuredSubsamplingDataModule:
    if kind == "poisson":
        return StructuredSubsamplingDataModule(
            series(), context_length=CONTEXT, prediction_length=HORIZON, batch_size=2, instances_per_series=1,
            top_level="poisson", bottom_level="poisson", test_windows=0,
        )
    return StructuredSubsamplingDataModule(
        series(), context_length=CONTEXT, prediction_length=HORIZON, batch_size=8, instances_per_series=2,
        top_level="without_replacement", bottom_level="with_replacement", test_windows=0,
    )


class Tiny(L.LightningModule):
    """A linear forecaster plus a layer no window uses (its gradient is the noise alone)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(CONTEXT, HORIZON)
        self.unused = nn.Linear(UNUSED_SHAPE[1], UNUSED_SHAPE[0], bias=False)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return (self.net(batch["past_target"]) - batch["future_target"]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.5)


class MixingTiny(Tiny):
    """Subtracts the local batch mean (a forward that mixes windows): the default strategy must isolate it."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x = batch["past_target"]
        return (self.net(x - x.mean(0)) - batch["future_target"]).square().mean()


class NanOnSeries3(Tiny):
    """Windows of series 3 have a NaN gradient (the strategy must stop every rank at that step)."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        scale = torch.where(batch["series_index"] == 3, float("nan"), 1.0)[:, None]
        return (self.net(batch["past_target"]) * scale - batch["future_target"]).square().mean()


class WithStat(Tiny):
    """Tiny with a buffer (constant unless something writes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("stat", torch.zeros(()))


class FreezeOnRank1(Callback):
    """Rank 1 alone freezes the forecaster's weight when step ``at`` starts (``buffer=True``: writes max |x| of its
    share of the batch into the model's buffer instead, as a forward that records its inputs would); records the
    weights at every step."""

    def __init__(self, at: int, buffer: bool = False) -> None:
        self.at = at
        self.buffer = buffer
        self.weights: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.weights.append(weights(pl_module))
        if trainer.global_rank == 1 and trainer.global_step == self.at:
            if self.buffer:
                pl_module.stat.fill_(float(batch["past_target"].abs().max()))
            else:
                pl_module.net.weight.requires_grad_(False)


class Recorder(Callback):
    """Runs after DPForecastStrategy: what this rank saw at every noisy step."""

    def __init__(self) -> None:
        self.shares: list[list[int]] = []
        self.unused: list[list[float]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.shares.append(batch["series_index"].tolist())

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.unused.append(pl_module.unused.weight.grad.reshape(-1).tolist())


class ObservedAllReduce:
    """An observer of this rank's process: records the input and output of the gradient all-reduce."""

    def __init__(self, numel: int) -> None:
        self.numel = numel
        self.original = dist.all_reduce
        self.records: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __call__(self, tensor, *args, **kwargs):
        before = tensor.detach().clone() if tensor.numel() == self.numel else None
        out = self.original(tensor, *args, **kwargs)
        if before is not None:
            self.records.append((before, tensor.detach().clone()))
        return out


def trainer(out: Path, callbacks: list, **kwargs) -> L.Trainer:
    """Two DDP processes. A strategy without an AccountantCallback tests the strategy alone: it opts out of the
    accountant requirement (``require_accountant=False``; its ledger still counts)."""
    if not any(isinstance(c, AccountantCallback) for c in callbacks):
        for c in callbacks:
            if isinstance(c, DPForecastStrategy):
                c.require_accountant = False
    return L.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False, **kwargs,
    )


def weights(module: nn.Module) -> list[float]:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).tolist()


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    result: dict = {"rank": rank}

    # -- 1. Gaussian noise, accountant, resume of a 1-process checkpoint ----------------------------------
    model, dm = Tiny(), datamodule()
    result["entropy_before"] = str(dm.sampler.entropy._value)
    strategy = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP)
    accountant = AccountantCallback(*BUDGET)
    recorder = Recorder()
    numel = sum(p.numel() for p in model.parameters())
    observer = ObservedAllReduce(numel + 1)
    dist_all_reduce = dist.all_reduce
    dist.all_reduce = observer
    t = trainer(out, [strategy, accountant, recorder,
                      ModelCheckpoint(dirpath=out / "ckpt", save_last=True, every_n_train_steps=5)],
                max_steps=10_000, logger=CSVLogger(out / "logs"))
    t.fit(model, datamodule=dm, ckpt_path=str(out / "one.ckpt"))
    dist.all_reduce = dist_all_reduce
    t.save_checkpoint(out / "ckpt" / "two.ckpt")  # every rank calls it, rank 0 writes it
    offset = sum(p.numel() for p in model.parameters() if p is not model.unused.weight)
    # The unused weight is the last parameter: its segment of the flat all-reduce vector.
    assert list(model.parameters())[-1] is model.unused.weight
    size = model.unused.weight.numel()
    result["gaussian"] = {
        "shares": recorder.shares,
        "unused_grads": recorder.unused,
        "allreduce_in": [b[offset : offset + size].tolist() for b, _ in observer.records],
        "allreduce_out": [a[offset : offset + size].tolist() for _, a in observer.records],
        "global_step": t.global_step,
        "ledger_steps": strategy.ledger.steps,
        "max_steps": accountant.max_steps,
        "report_epsilon": accountant.report.epsilon,
        "report_steps": accountant.report.steps,
        "weights": weights(model),
        "entropy_shared": str(dm.sampler.entropy._value),
        "passes_started": dm.sampler.passes_started,
    }

    # -- 2. Poisson levels: many empty local batches ------------------------------------------------------
    model, dm = Tiny(), datamodule("poisson")
    strategy, recorder = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP), Recorder()
    t = trainer(out, [strategy, recorder], max_steps=30, logger=False, enable_checkpointing=False)
    t.fit(model, datamodule=dm)
    result["poisson"] = {"shares": recorder.shares, "global_step": t.global_step,
                         "ledger_steps": strategy.ledger.steps, "weights": weights(model)}

    # -- 2b. Isolated per-window gradients (issue 25): a forward that mixes the windows of the local batch, under
    # the default per_window="auto" (every rank's probe finds it at the first step and isolates), Poisson levels
    model, dm = MixingTiny(), datamodule("poisson")
    strategy = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP)
    t = trainer(out, [strategy], max_steps=12, logger=False, enable_checkpointing=False)
    t.fit(model, datamodule=dm)
    result["isolated"] = {"isolated": strategy.isolated, "global_step": t.global_step,
                          "ledger_steps": strategy.ledger.steps, "weights": weights(model)}

    # -- 3. The sampler alone: the shares of many passes, and rank 0's single-process reference -----------
    dm = datamodule()
    fake = types.SimpleNamespace(world_size=2, global_rank=rank, strategy=types.SimpleNamespace(
        root_device=torch.device("cpu")))
    dm.trainer = fake
    passes = 300
    loader = dm.train_dataloader()
    shares = [[b["series_index"].tolist() for b in loader] for _ in range(passes)]
    sampler = dm.sampler
    result["sampler"] = {"shares": shares}
    if rank == 0:
        sampler.shard(0, 1)
        reference = [[sampler.batch(p, s)["series_index"].tolist() for s in range(len(sampler))]
                     for p in range(passes)]
        result["sampler"]["reference"] = reference
    # -- 4. A non-finite per-window gradient on one rank: every rank raises at the same step (last: Lightning may
    # tear the process group down after an exception) ----------------------------------------------------------
    model, dm = NanOnSeries3(), datamodule()
    strategy = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP)
    t = trainer(out, [strategy], max_steps=200, logger=False, enable_checkpointing=False)
    try:
        t.fit(model, datamodule=dm)
        result["nan"] = {"error": None}
    except Exception as err:  # recorded for the test
        result["nan"] = {"error": type(err).__name__, "message": str(err)[:300], "ledger_steps": strategy.ledger.steps}
    (out / f"rank{rank}.json").write_text(json.dumps(result))


def freeze(out: Path, buffer: bool = False) -> None:
    rank = int(os.environ["RANK"])
    model, dm = (WithStat() if buffer else Tiny()), datamodule()
    strategy, watcher = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP), FreezeOnRank1(3, buffer)
    t = trainer(out, [strategy, watcher], max_steps=20, logger=False, enable_checkpointing=False)
    result: dict = {"rank": rank}
    start = time.monotonic()
    try:
        t.fit(model, datamodule=dm)
        result["error"] = None
    except Exception as err:  # recorded for the test
        result.update(error=type(err).__name__, message=str(err)[:400])
    result.update(seconds=time.monotonic() - start, ledger_steps=strategy.ledger.steps,
                  weights_seen=watcher.weights, weights_after=weights(model))
    (out / f"freeze{rank}.json").write_text(json.dumps(result))


class BareParameter(L.LightningModule):
    """A LightningModule owning a bare ``nn.Parameter`` used in its own ``forward`` (accepted on one process)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.weight = nn.Parameter(0.01 * torch.randn(CONTEXT, HORIZON))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return (self(batch["past_target"]) - batch["future_target"]).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def bare(out: Path) -> None:
    """Issue 32: a bare parameter of the LightningModule itself under DDP (Opacus' hook saw the batch dict)."""
    rank = int(os.environ["RANK"])
    model, dm = BareParameter(), datamodule()
    strategy = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP)
    t = trainer(out, [strategy], max_steps=3, logger=False, enable_checkpointing=False)
    result: dict = {"rank": rank}
    try:
        t.fit(model, datamodule=dm)
        result.update(error=None, ledger_steps=strategy.ledger.steps, weights_after=weights(model))
    except Exception as err:  # recorded for the test
        result.update(error=type(err).__name__, message=str(err)[:600])
    (out / f"bare{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    if sys.argv[2:] == ["bare"]:
        bare(Path(sys.argv[1]))
    elif sys.argv[2:] in (["freeze"], ["buffer"]):
        freeze(Path(sys.argv[1]), buffer=sys.argv[2] == "buffer")
    else:
        main(Path(sys.argv[1]))

"""Two DDP processes reading one memory-mapped series store (issue 41), launched by ``torch.distributed.run``.

Used by ``tests/training/test_ddp_store.py`` (not collected by pytest itself). Every rank builds the datamodule from
the same ``<out>/store.arrow`` path and writes to ``<out>/store<r>.json``: whether the store's values are a view of
the file mapping (listed in ``/proc/self/maps``, not owned by numpy), the series indices and past windows of its
share of every training batch of 20 passes (rank 0 also the single-process reference batches from the shared
entropy), and the weights after a 4-step DP fit (every rank must end with the same weights: one noisy update; the
fit runs first, it starts the process group).
"""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import torch

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.training import DPForecastStrategy
from tests.training.ddp_worker import CLIP, CONTEXT, HORIZON, SIGMA, Tiny, trainer, weights


def datamodule(out: Path) -> StructuredSubsamplingDataModule:
    return StructuredSubsamplingDataModule(str(out / "store.arrow"), context_length=CONTEXT, prediction_length=HORIZON,
                                           batch_size=8, instances_per_series=2, test_windows=1)


def main(out: Path) -> None:
    rank = int(os.environ["RANK"])
    dm = datamodule(out)
    store = dm.collection
    maps = Path("/proc/self/maps").read_text()
    result: dict = {"rank": rank, "mapped": str((out / "store.arrow").resolve()) in maps,
                    "owns_values": bool(store.values.flags.owndata), "writeable": bool(store.values.flags.writeable)}
    # the fit first: it starts the process group the sampler phase then broadcasts over
    model = Tiny()
    strategy = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP)
    t = trainer(out, [strategy], max_steps=4, logger=False, enable_checkpointing=False)
    t.fit(model, datamodule=dm)
    result.update(weights=weights(model), ledger_steps=strategy.ledger.steps, global_step=t.global_step)
    dm = datamodule(out)
    fake = types.SimpleNamespace(world_size=2, global_rank=rank,
                                 strategy=types.SimpleNamespace(root_device=torch.device("cpu")))
    dm.trainer = fake
    passes = 20
    loader = dm.train_dataloader()
    shares = [[{"rows": b["series_index"].tolist(), "past": b["past_target"].tolist()} for b in loader]
              for _ in range(passes)]
    result["shares"] = shares
    if rank == 0:
        dm.sampler.shard(0, 1)
        result["reference"] = [[{"rows": b["series_index"].tolist(), "past": b["past_target"].tolist()}
                                for b in (dm.sampler.batch(p, s) for s in range(len(dm.sampler)))]
                               for p in range(passes)]
    (out / f"store{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""DP training on 1 and 2 CPU processes (Lightning DDP, gloo): step time, windows/s, bytes communicated per step.

Usage::

    python benchmarks/ddp.py [--batch-size 256] [--steps 30] [--warmup 5] [--repeats 2] [--hidden 64]

Each configuration (1 process: the plain single-device Trainer; 2 processes: ``strategy="ddp"`` launched with
``python -m torch.distributed.run --nproc-per-node 2``) trains the same GluonTS SimpleFeedForward (context 96,
prediction 24) with :class:`~lightning_dpts.training.DPForecastStrategy` on the same synthetic series, the global
batch being ``--batch-size`` windows (each of 2 ranks computes half of it). The two configurations alternate,
``--repeats`` times, the order rotating between repeats (as in the other benchmarks). A callback times every
optimizer step on rank 0 (``on_train_batch_start`` -> ``on_train_batch_end``: forward, backward, per-window
clipping, the all-reduce with the noise, the optimizer step) and counts the payload of every ``torch.distributed``
collective inside that window.

Printed: median step time (ms) and global windows/s per configuration (median over repeats of the per-run
medians), the ratios 2-process / 1-process, and the bytes per step: the payload P of the one all-reduce (4 bytes
per parameter + 4 for the failure flag, float32) and of the 32-byte identical-update check. A ring all-reduce
sends and receives 2 (W - 1) / W x P bytes per rank, so on paper, for W GPUs,
``step(W) ~ compute(Lambda / W) + 2 (W - 1) / W x P / bandwidth + latency``. On these 2 shared CPU cores the
2 processes compete for the same cores, so the measured ratio shows the overhead, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

PREDICTION, CONTEXT = 24, 96


def _worker(args: argparse.Namespace) -> None:
    import lightning as L
    import numpy as np
    import torch
    import torch.distributed as dist
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training import DPForecastStrategy

    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    module = SimpleFeedForwardLightningModule(model_kwargs=dict(
        prediction_length=PREDICTION, context_length=CONTEXT, hidden_dimensions=[args.hidden, args.hidden]))
    rng = np.random.default_rng(0)  # the benchmark's data, not privacy randomness
    series = [np.sin(np.arange(600) / 7.0 + n) + 0.1 * rng.standard_normal(600) for n in range(400)]
    dm = StructuredSubsamplingDataModule(series, model=module, batch_size=args.batch_size, instances_per_series=1,
                                         test_windows=0)
    counted = {"on": False, "bytes": 0, "calls": 0}

    def counting(fn):
        def wrapper(tensor, *a, **k):
            if counted["on"]:
                counted["bytes"] += tensor.numel() * tensor.element_size()
                counted["calls"] += 1
            return fn(tensor, *a, **k)
        return wrapper

    dist.all_reduce, dist.broadcast = counting(dist.all_reduce), counting(dist.broadcast)

    class Timer(Callback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.windows: list[int] = []
            self._t = 0.0

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            counted["on"] = trainer.global_step >= args.warmup
            self._t = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if counted["on"]:
                self.times.append(time.perf_counter() - self._t)
            counted["on"] = False

    timer = Timer()
    strategy = DDPStrategy(process_group_backend="gloo") if world > 1 else "auto"
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=args.warmup + args.steps,
                        callbacks=[DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0,
                                                      require_accountant=False), timer],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    if rank == 0:
        params = sum(p.numel() for p in module.parameters() if p.requires_grad)
        Path(args.worker).write_text(json.dumps({
            "world": world, "median_s": statistics.median(timer.times), "params": params,
            "bytes_per_step": counted["bytes"] / len(timer.times),
            "calls_per_step": counted["calls"] / len(timer.times),
        }))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(world: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        flags = ["--batch-size", str(args.batch_size), "--steps", str(args.steps), "--warmup", str(args.warmup),
                 "--hidden", str(args.hidden), "--worker", str(out)]
        if world == 1:
            cmd = [sys.executable, __file__, *flags]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-addr",
                   "127.0.0.1", "--master-port", str(_free_port()), __file__, *flags]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr[-4000:])
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args)
        return
    results: dict[int, list[dict]] = {1: [], 2: []}
    for repeat in range(args.repeats):
        order = (1, 2) if repeat % 2 == 0 else (2, 1)
        for world in order:
            results[world].append(_launch(world, args))
            r = results[world][-1]
            print(f"repeat {repeat}: {world} process(es): {1e3 * r['median_s']:.1f} ms/step", flush=True)
    lam = args.batch_size
    summary = {}
    for world, runs in results.items():
        step = statistics.median(r["median_s"] for r in runs)
        summary[world] = (step, lam / step, statistics.median(r["bytes_per_step"] for r in runs), runs[0])
    params = summary[1][3]["params"]
    print(f"\nSimpleFeedForward hidden [{args.hidden}, {args.hidden}] ({params} parameters), Lambda = {lam}, "
          f"{args.steps} timed steps x {args.repeats} repeats, CPU, gloo")
    print(f"{'processes':>9} | {'ms/step':>8} | {'windows/s':>9} | {'collective payload B/step':>25} | calls/step")
    for world, (step, wps, nbytes, run) in summary.items():
        print(f"{world:>9} | {1e3 * step:8.1f} | {wps:9.0f} | {nbytes:25.0f} | {run['calls_per_step']:.0f}")
    ratio = summary[2][0] / summary[1][0]
    print(f"\nstep time 2 / 1 processes: {ratio:.2f}x; windows/s 2 / 1: {summary[2][1] / summary[1][1]:.2f}x")
    payload = summary[2][2]
    for w in (2, 4, 8, 64):
        print(f"ring all-reduce traffic per rank per step for W = {w:>2}: {2 * (w - 1) / w * payload / 1e6:.3f} MB "
              f"(payload {payload / 1e6:.3f} MB = 4 B x {params} parameters + flag + 32 B check)")


if __name__ == "__main__":
    main()

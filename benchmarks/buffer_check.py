"""What the state guard costs a DP step (``lightning_dpts.training.state_guard.StateGuard``, issue 38).

Usage::

    python benchmarks/buffer_check.py [--models sff,dlinear,deepar] [--batch-size 64] [--steps 30] [--warmup 5]
        [--repeats 4] [--calls 20000]

``DPForecastStrategy`` calls ``StateGuard.check_step`` at every optimizer step: the identity of every attribute of
every submodule and watched callback, the version counter of every tracked tensor (buffers, tensor attributes,
persistent metric states), the number of attributes and buffers of every object and the contents of list/dict
attributes. This script prints, per model, the cost of one such call measured alone with the callbacks of a default
Trainer (``check_step``) and with 100 extra constant 64-element buffers and 100 tensor attributes spread over the
submodules (``+200 tensors``), the exact check that every checkpoint runs (``exact``), and the median DP step with
the per-step check and with it switched off, measured alternately in one process with the harness of
``benchmarks/dp_training.py`` (same models, batches and per-step timer).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import lightning as L
import torch
from dp_training import build, fixed_data, time_steps

from lightning_dpts.training import DPForecastStrategy
from lightning_dpts.training.state_guard import StateGuard


def per_call(function: object, calls: int) -> float:
    """Microseconds per call of ``function()``."""
    start = time.perf_counter()
    for _ in range(calls):
        function()  # type: ignore[operator]
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="sff,dlinear,deepar")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; check costs in us per call, steps in ms "
          f"(median of {args.steps - args.warmup} steps x {args.repeats} repeats)")
    print(f"{'model':8s} {'modules':>7s} {'check_step':>10s} {'+200 tensors':>12s} {'exact':>7s} "
          f"{'step, checked':>13s} {'step, off':>9s} {'check / step':>12s}")
    original = StateGuard.check_step
    callbacks = L.Trainer(accelerator="cpu", logger=False).callbacks  # a default Trainer's progress bar, checkpoint
    for name in args.models.split(","):
        base = build(name)
        guard = StateGuard(base, callbacks)
        alone, exact = per_call(guard.check_step, args.calls), per_call(guard.check, args.calls // 10)
        padded = copy.deepcopy(base)
        modules = list(padded.modules())
        for i in range(100):
            modules[i % len(modules)].register_buffer(f"constant_{i}", torch.randn(64))
            setattr(modules[(i + 1) % len(modules)], f"attribute_{i}", torch.randn(64))
        more = per_call(StateGuard(padded, callbacks).check_step, args.calls)
        dm = fixed_data(base, args.batch_size, args.steps)
        times: dict[str, list[float]] = {"checked": [], "off": []}
        try:
            for repeat in range(args.repeats):
                for kind in (["checked", "off"] if repeat % 2 == 0 else ["off", "checked"]):
                    StateGuard.check_step = original if kind == "checked" else (lambda self: None)  # type: ignore
                    extra = [DPForecastStrategy(1.0, 1.0, seed=0)]
                    times[kind] += time_steps(copy.deepcopy(base), dm, args.steps, args.warmup, extra)[0]
        finally:
            StateGuard.check_step = original  # type: ignore[method-assign]
        checked, off = (statistics.median(times[k]) * 1e3 for k in ("checked", "off"))
        print(f"{name:8s} {sum(1 for _ in base.modules()):7d} {alone:10.1f} {more:12.1f} {exact:7.1f} "
              f"{checked:13.2f} {off:9.2f} {alone / 1e3 / off:12.1e}")


if __name__ == "__main__":
    main()

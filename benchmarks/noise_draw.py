"""Where the DP noise is drawn: in a background thread from the step's start, or at the optimizer step.

Usage::

    python benchmarks/noise_draw.py [--models sff,dlinear] [--batch-sizes 64,256,1024] [--threads 0]
        [--steps 30] [--warmup 5] [--repeats 5]

``DPForecastStrategy`` draws each step's noise in the background only when that thread has a core of its own
(``background_noise``: accelerator training, or more usable CPUs than torch's intra-op threads), else at the
optimizer step. This script times, in one process and alternating (order rotated between repeats), the non-DP
step, the DP step with the draw forced into the background and the DP step with the draw forced in place, with
the harness of ``benchmarks/dp_training.py`` (same models, batches and per-step timer), and prints the median
step time of each and the two DP / non-DP ratios. ``draw`` is the median time of one draw of the step's noise
vector alone (``GaussianNoise.sample`` for every trainable coordinate, OS entropy, on the calling thread; 20 draws
after each repeat's runs) and ``draw / no DP`` its share of the non-DP step: what a DP step costs at least when
the draw cannot overlap the step. ``--threads`` sets ``torch.set_num_threads`` (0: torch's
default, which uses every core, the case where the rule draws in place).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from dp_training import build, fixed_data, time_steps

from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.training import DPForecastStrategy
from lightning_dpts.training import noisy_step as strategy


def time_draws(numel: int, count: int) -> list[float]:
    """Seconds per draw of ``numel`` N(0, 1) values, ``count`` draws, from a fresh OS-entropy sampler."""
    noise = GaussianNoise(resolve_entropy(None))
    out = []
    for _ in range(count):
        start = time.perf_counter()
        noise.sample(numel, 1.0)
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="sff,dlinear")
    parser.add_argument("--batch-sizes", default="64,256,1024")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.steps - args.warmup} timed steps x "
          f"{args.repeats} repeats (median ms; ratio = DP / no DP)")
    print(f"{'model':8s} {'Lambda':>6s} {'no DP':>8s} {'background':>11s} {'ratio':>6s} {'in place':>9s} {'ratio':>6s} "
          f"{'draw':>6s} {'draw / no DP':>12s}")
    kinds = ["plain", "background", "in place"]
    spare = strategy._spare_core
    try:
        for name in args.models.split(","):
            for size in (int(b) for b in args.batch_sizes.split(",")):
                base = build(name)
                dm = fixed_data(base, size, args.steps)
                numel = sum(p.numel() for p in base.parameters() if p.requires_grad)
                times: dict[str, list[float]] = {k: [] for k in [*kinds, "draw"]}
                for repeat in range(args.repeats):
                    for kind in kinds[repeat % 3:] + kinds[: repeat % 3]:
                        # the rule's input, forced: on CPU the strategy draws in the background iff _spare_core()
                        strategy._spare_core = (lambda: True) if kind == "background" else (lambda: False)
                        extra = [] if kind == "plain" else [
                            DPForecastStrategy(1.0, 1.0, seed=0, require_accountant=False)]
                        times[kind] += time_steps(copy.deepcopy(base), dm, args.steps, args.warmup, extra)[0]
                    times["draw"] += time_draws(numel, 20)
                med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
                print(f"{name:8s} {size:6d} {med['plain']:8.2f} {med['background']:11.2f} "
                      f"{med['background'] / med['plain']:6.2f} {med['in place']:9.2f} "
                      f"{med['in place'] / med['plain']:6.2f} {med['draw']:6.2f} "
                      f"{med['draw'] / med['plain']:12.2f}", flush=True)
    finally:
        strategy._spare_core = spare


if __name__ == "__main__":
    main()

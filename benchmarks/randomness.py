"""Cost of secure mode: DP noise and batch sampling from the OS CSPRNG vs the default secret-keyed generators.

Noise: :class:`lightning_dpts.randomness.GaussianNoise` draws N(0, std^2) for ``numel`` coordinates, either from
a ``torch.Generator`` keyed by 128 bits of OS entropy (default) or, with ``secure=True``, from ``os.urandom`` with
Opacus' floating-point mitigation (4 Box-Muller normals per coordinate). ``numel`` ranges over typical model
sizes (the noise is drawn once per optimizer step for all parameters). Sampling: one training batch of
:class:`~lightning_dpts.data.StructuredSubsamplingDataModule` (bundled ``us_employment``, batch size 64) with
``secure_mode`` off and on.

The two variants of each measurement alternate within one process (A, B, A, B, ...) so that machine load
affects both alike; the median of ``--repeats`` rounds is reported with the ratio secure/default.

Run: ``python benchmarks/randomness.py [--repeats 7] [--sizes 10000 100000 1000000]``
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

warnings.filterwarnings("ignore")


def _time(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _interleaved(a, b, calls: int, repeats: int) -> tuple[float, float]:
    ta, tb = [], []
    a(), b()  # warm up
    for _ in range(repeats):
        ta.append(_time(a, calls))
        tb.append(_time(b, calls))
    return statistics.median(ta), statistics.median(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="alternating rounds per measurement")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                        help="noise coordinates per draw (number of trainable parameters)")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    import torch

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.randomness import GaussianNoise, resolve_entropy

    torch.set_num_threads(1)
    print(f"{'what':34} {'default':>12} {'secure':>12} {'ratio':>8}")
    default = GaussianNoise(resolve_entropy(None))
    secure = GaussianNoise(resolve_entropy(None), secure=True)
    for numel in args.sizes:
        calls = max(1, 2_000_000 // numel)
        fast, slow = _interleaved(lambda n=numel: default.sample(n, 1.0), lambda n=numel: secure.sample(n, 1.0),
                                  calls, args.repeats)
        print(f"{f'noise, {numel} coordinates':34} {fast * 1e3:>10.3f}ms {slow * 1e3:>10.3f}ms {slow / fast:>8.1f}")

    plain = StructuredSubsamplingDataModule("us_employment", batch_size=args.batch_size, context_length=24,
                                            prediction_length=12)
    hardened = StructuredSubsamplingDataModule("us_employment", batch_size=args.batch_size, context_length=24,
                                               prediction_length=12, secure_mode=True)
    steps = plain.steps_per_epoch
    fast, slow = _interleaved(lambda: [plain.train_batch(0, s) for s in range(steps)],
                              lambda: [hardened.train_batch(0, s) for s in range(steps)], 20, args.repeats)
    label = f"sampling, 1 batch of {args.batch_size}"
    print(f"{label:34} {fast / steps * 1e3:>10.3f}ms {slow / steps * 1e3:>10.3f}ms {slow / fast:>8.1f}")


if __name__ == "__main__":
    main()

"""The cost of logging epsilon after every step (issue 26, item 3): the epsilon table and the per-step hook.

Usage::

    python benchmarks/epsilon_logging.py [--repeats 3] [--fits 4] [--skip-fit] [--skip-tables]

1. **Tables, side by side.** For the default job (``dpts fit``: 400 steps, delta = 1e-7), 10^4-step traffic plans
   (sigma = 5, 10, 20, the paper's N = 862, L = 13916, Lambda = 256) and a Gaussian mechanism at delta = 1e-12
   (2,000 steps), the table the AccountantCallback logs from is computed by ``epsilon_curve`` (batched, on the
   coarsest grid within rtol/4 of the accountant's: :mod:`lightning_dpts.privacy.curve`) and by the previous
   implementation, kept here as the baseline (one untilted composition per count on the accountant's own grid,
   the step aimed by the local growth exponent). Both start from an accountant that has just searched the
   budget's step count (``max_steps(..., stop_at=plan)``, what the callback does first), in turns, ``--repeats``
   times; printed: the median seconds, the ratio baseline / new, the points, and the largest ratio of a logged
   value to ``accountant.epsilon_after`` over the points and the counts just after them (at most 1.01 is the
   target; never below 1).
2. **The default job's fit.** ``dpts fit``'s default job (FitConfig defaults) is run ``--fits`` times in each mode
   (``background_table=True``, the default, and ``False``), the modes in turns; for the DP
   fit: the sum of the optimizer steps' wall time (Lightning's training-epoch ``advance``: batch, forward,
   backward, DP step, callbacks), the table thread's wall and CPU seconds (:attr:`EpsilonTable.seconds`,
   ``cpu_seconds``; it runs while the budget's step count is searched), the time train start waited for it after
   that search (``wait``), the callback's per-step hook in total, and the share of step time that logging epsilon
   costs: (wait + hooks) / steps in wall time, and (table CPU + hooks) / steps in CPU time.
   The table's thread runs while the budget's step count is searched and, in the background mode, on into the
   first steps; its CPU time overlaps other work, so the wall share counts only the time train start or a step
   waited for it, and the ratio of the two modes' step seconds shows what the thread's contention costs the steps.

Absolute seconds depend on the machine and its load (printed); read the ratios.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Iterator

from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.privacy.accountant import FINE_DELTA, _TooLarge
from lightning_dpts.privacy.pld import epsilon_from_pld

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

DEMO = SamplingSpec(num_series=145, min_length=309, context_length=24, prediction_length=12, batch_size=64,
                    lengths=(309, 369, 477, 525, 621, 693, 729, 777, 825, 921))
TRAFFIC = SamplingSpec(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256)
FULL = SamplingSpec(num_series=10, min_length=6, context_length=5, prediction_length=2, batch_size=10)

#: name: (spec, sigma, delta, last count)
CASES = {
    "default job (400 steps)": (DEMO, 10.760956208429903, 1e-7, 400),
    "traffic sigma=5 (10^4)": (TRAFFIC, 5.0, 1e-7, 10_000),
    "traffic sigma=10 (10^4)": (TRAFFIC, 10.0, 1e-7, 10_000),
    "traffic sigma=20 (10^4)": (TRAFFIC, 20.0, 1e-7, 10_000),
    "Gaussian, delta=1e-12 (2000)": (FULL, 2.0 * math.sqrt(2000) / 0.5, 1e-12, 2000),
}


def baseline_curve(acc: StructuredSubsamplingAccountant, last: int, delta: float,
                   rtol: float = 0.01) -> Iterator[tuple[int, float]]:
    """The epsilon curve before this change: one untilted composition per count on the accountant's own grid."""
    def value(c: int) -> float:
        if c == 1:
            return acc._epsilon_units(1, delta)

        def plain(level: int, at: float) -> float:
            return min(epsilon_from_pld(p, at) for p in acc._plain(c, level)[1])

        if acc._fine_only(c):
            return plain(1, delta)
        if delta >= FINE_DELTA:
            return plain(0, delta)
        return max(plain(1, delta), plain(0, FINE_DELTA))

    c_prev, e_prev = 1, value(1)
    yield c_prev, e_prev
    exponent = 0.5
    while c_prev < last:
        c = min(last, c_prev + max(1, int(c_prev * ((1.0 + rtol) ** (1.0 / exponent) - 1.0))))
        while True:
            e = value(c)
            if e <= (1.0 + rtol) * e_prev or c == c_prev + 1:
                break
            c = c_prev + max(1, (c - c_prev) // 2)
        if e > e_prev > 0:
            exponent = min(1.0, max(0.1, math.log(e / e_prev) / math.log(c / c_prev)))
        yield c, e
        c_prev, e_prev = c, e


def worst_ratio(points: list[tuple[int, float]], exact: StructuredSubsamplingAccountant, delta: float) -> tuple[
        float, float]:
    """(largest, smallest) logged value / epsilon_after over each point's count and the count just after the
    previous point (the first count it stands for)."""
    ratios = []
    previous = 0
    for count, value in points:
        for c in {count, previous + 1}:
            try:
                ratios.append(value / exact.epsilon_after(c, delta))
            except _TooLarge:  # pragma: no cover - counts here are far below the memory bound
                continue
        previous = count
    return max(ratios), min(ratios)


def tables(repeats: int) -> None:
    print(f"1) epsilon tables, side by side (median of {repeats}; load {os.getloadavg()[0]:.1f})")
    print(f"{'configuration':32} {'points':>7} {'new s':>7} {'base pts':>8} {'base s':>7} {'base/new':>8} "
          f"{'new max/min vs eps':>19} {'base max/min vs eps':>20}")
    for name, (spec, sigma, delta, last) in CASES.items():
        times: dict[str, list[float]] = {"new": [], "base": []}
        results: dict[str, list[tuple[int, float]]] = {}
        for r in range(repeats):
            for kind in (("new", "base") if r % 2 == 0 else ("base", "new")):
                acc = StructuredSubsamplingAccountant(spec, sigma)
                acc.max_steps(1e6, delta, stop_at=last)  # what the callback does first (caches the last count)
                start = time.perf_counter()
                points = list(acc.epsilon_curve(last, delta) if kind == "new" else baseline_curve(acc, last, delta))
                times[kind].append(time.perf_counter() - start)
                results[kind] = points
        exact = StructuredSubsamplingAccountant(spec, sigma)
        new_hi, new_lo = worst_ratio(results["new"], exact, delta)
        base_hi, base_lo = worst_ratio(results["base"], exact, delta)
        t_new, t_base = statistics.median(times["new"]), statistics.median(times["base"])
        print(f"{name:32} {len(results['new']):7d} {t_new:7.3f} {len(results['base']):8d} {t_base:7.3f} "
              f"{t_base / t_new:8.1f} {new_hi:10.4f}/{new_lo:.4f} {base_hi:11.4f}/{base_lo:.4f}", flush=True)


def fits(count: int) -> None:
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    import lightning_dpts.training.accountant_callback as ac
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.jobs.fit import run_fit

    record: dict[str, list[float]] = {}
    state = {"dp": False}

    def timed(method, key: str, dp_only: bool = False):
        """``method`` with its wall time appended to ``record[key]`` (only during the DP fit with ``dp_only``)."""
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                if state["dp"] or not dp_only:
                    record[key].append(time.perf_counter() - start)
        return wrapper

    train_start, train_end = ac.AccountantCallback.on_train_start, ac.AccountantCallback.on_train_end
    timed_join, timed_advance = timed(ac.EpsilonTable.join, "wait"), timed(_TrainingEpochLoop.advance, "step", True)
    timed_hook = timed(ac.AccountantCallback.on_train_batch_end, "hook")

    def on_start(self, *args, **kwargs):
        start = time.perf_counter()
        train_start(self, *args, **kwargs)
        record["train_start"].append(time.perf_counter() - start)
        state["dp"] = True

    def on_end(self, *args, **kwargs):
        state["dp"] = False
        record["wait"].append(self._wait_time)  # steps that waited for a background table
        table = self.table
        record["table"].append(float(table.seconds) if table is not None and table.seconds else 0.0)
        record["table_cpu"].append(float(table.cpu_seconds) if table is not None and table.cpu_seconds else 0.0)
        record["points"].append(float(len(self.grid_points)))
        return train_end(self, *args, **kwargs)

    init = ac.AccountantCallback.__init__
    mode = {"foreground": False}

    def init_mode(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "background_table": not mode["foreground"]})

    callback = ac.AccountantCallback
    patches = [(callback, "__init__", init_mode), (ac.EpsilonTable, "join", timed_join),
               (_TrainingEpochLoop, "advance", timed_advance), (callback, "on_train_batch_end", timed_hook),
               (callback, "on_train_start", on_start), (callback, "on_train_end", on_end)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, method in patches:
        setattr(owner, name, method)
    print(f"\n2) dpts fit's default job, {count} fits per mode, the modes in turns (load {os.getloadavg()[0]:.1f}); "
          "background: background_table=True (default), foreground: False")
    print(f"{'mode':>10} {'steps':>6} {'step s':>7} {'ms/step':>7} {'table s':>7} {'cpu s':>6} {'points':>6} "
          f"{'wait s':>7} {'hooks s':>7} {'start s':>7} {'(wait+hooks)/steps':>18} {'(cpu+hooks)/steps':>17}")
    results: dict[str, list[tuple[float, float, float]]] = {"background": [], "foreground": []}
    try:
        for i in range(count):
            for name in (("background", "foreground") if i % 2 == 0 else ("foreground", "background")):
                mode["foreground"] = name == "foreground"
                for key in ("step", "hook", "train_start", "table", "table_cpu", "points", "wait"):
                    record[key] = []
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        run_fit(FitConfig(output_dir=tmp, overwrite=True), progress=lambda _: None)
                    except Exception as err:  # e.g. the strategy's spot check refusing a step: say so, go on
                        print(f"{name:>10} refused: {str(err)[:300]}", flush=True)
                        continue
                steps, hooks = sum(record["step"]), sum(record["hook"])
                wait = sum(record["wait"])
                share, cpu_share = (wait + hooks) / steps, (record["table_cpu"][0] + hooks) / steps
                results[name].append((steps, share, cpu_share))
                print(f"{name:>10} {len(record['step']):6d} {steps:7.3f} {1e3 * steps / len(record['step']):7.2f} "
                      f"{record['table'][0]:7.3f} {record['table_cpu'][0]:6.3f} {int(record['points'][0]):6d} "
                      f"{wait:7.3f} {hooks:7.4f} {record['train_start'][0]:7.3f} {share:18.2%} {cpu_share:17.2%}",
                      flush=True)
    finally:
        for owner, name, method in originals:
            setattr(owner, name, method)
    for name, rows in results.items():
        print(f"{name}: median share of step time {statistics.median(r[1] for r in rows):.2%} wall (waits for the "
              f"table and the hooks), {statistics.median(r[2] for r in rows):.2%} CPU (the table's thread and the "
              f"hooks); median step seconds {statistics.median(r[0] for r in rows):.3f}")
    ratio = statistics.median(r[0] for r in results["background"]) / statistics.median(
        r[0] for r in results["foreground"])
    print(f"step seconds background / foreground: {ratio:.3f} (the background thread's contention with the first "
          f"steps, within the run-to-run spread); load {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="turns per table configuration (default 3)")
    parser.add_argument("--fits", type=int, default=4, help="runs of the default job per mode (default 4)")
    parser.add_argument("--skip-tables", action="store_true")
    parser.add_argument("--skip-fit", action="store_true")
    args = parser.parse_args()
    if not args.skip_tables:
        tables(args.repeats)
    if not args.skip_fit:
        fits(args.fits)


if __name__ == "__main__":
    main()

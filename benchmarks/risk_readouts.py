"""What the membership-attack read-outs next to epsilon cost (issue 43): the table and the default job's fit.

Usage::

    python benchmarks/risk_readouts.py [--repeats 3] [--fits 3] [--skip-tables] [--skip-fit]

1. **Tables, side by side.** The AccountantCallback's table with read-outs (``risk_curve``: TPR at FPR 1e-3/1e-2 and
   mu-GDP from the same composed rows) against the table without (``epsilon_curve``), for the default job (400
   steps) and a 10^4-step traffic plan, each from an accountant that just searched the budget (what the callback
   does first), in turns, ``--repeats`` times; printed: median seconds and the ratio.
2. **The default job's fit** (``dpts fit``'s FitConfig defaults), ``--fits`` runs per mode (``risk_readouts=True``,
   the default, and ``False``), the modes in turns: the fit's wall seconds, the sum of the optimizer steps' wall time
   (Lightning's training-epoch ``advance``), train start, the table thread's CPU seconds, the time steps waited for
   the table, and the callback's per-step hooks in total.

Absolute seconds depend on the machine and its load (printed); read the ratios.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time
import warnings

from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

DEMO = SamplingSpec(num_series=145, min_length=309, context_length=24, prediction_length=12, batch_size=64,
                    lengths=(309, 369, 477, 525, 621, 693, 729, 777, 825, 921))
TRAFFIC = SamplingSpec(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256)
CASES = {"default job (400 steps)": (DEMO, 10.760956208429903, 1e-7, 400),
         "traffic sigma=5 (10^4 steps)": (TRAFFIC, 5.0, 1e-7, 10_000)}


def tables(repeats: int) -> None:
    print(f"1) tables with and without read-outs (median of {repeats}; load {os.getloadavg()[0]:.1f})")
    print(f"{'configuration':30} {'points':>7} {'epsilon s':>10} {'+risk s':>8} {'ratio':>6}")
    for name, (spec, sigma, delta, last) in CASES.items():
        times: dict[str, list[float]] = {"eps": [], "risk": []}
        points = 0
        for r in range(repeats):
            for kind in (("eps", "risk") if r % 2 == 0 else ("risk", "eps")):
                acc = StructuredSubsamplingAccountant(spec, sigma)
                acc.max_steps(1e6, delta, stop_at=last)
                start = time.perf_counter()
                curve = acc.epsilon_curve(last, delta) if kind == "eps" else acc.risk_curve(last, delta)
                points = len(list(curve))
                times[kind].append(time.perf_counter() - start)
        t_eps, t_risk = statistics.median(times["eps"]), statistics.median(times["risk"])
        print(f"{name:30} {points:7d} {t_eps:10.3f} {t_risk:8.3f} {t_risk / t_eps:6.2f}", flush=True)


def fits(count: int) -> None:
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    import lightning_dpts.training.accountant_callback as ac
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.jobs.fit import run_fit

    record: dict[str, list[float]] = {}
    state = {"dp": False, "risk": True}

    def timed(method, key: str, dp_only: bool = False):
        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                if state["dp"] or not dp_only:
                    record.setdefault(key, []).append(time.perf_counter() - start)
        return wrapper

    callback = ac.AccountantCallback
    init, train_start, train_end = callback.__init__, callback.on_train_start, callback.on_train_end

    def init_mode(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "risk_readouts": state["risk"]})

    def on_start(self, *args, **kwargs):
        start = time.perf_counter()
        train_start(self, *args, **kwargs)
        record["start"] = [time.perf_counter() - start]
        state["dp"] = True

    def on_end(self, *args, **kwargs):
        state["dp"] = False
        record["wait"] = [self._wait_time]
        table = self.table
        record["table_cpu"] = [float(table.cpu_seconds or 0.0) if table is not None else 0.0]
        return train_end(self, *args, **kwargs)

    patches = [(callback, "__init__", init_mode), (callback, "on_train_start", on_start),
               (callback, "on_train_end", on_end), (_TrainingEpochLoop, "advance",
                                                    timed(_TrainingEpochLoop.advance, "step", True)),
               (callback, "on_train_batch_end", timed(callback.on_train_batch_end, "hook"))]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, method in patches:
        setattr(owner, name, method)
    print(f"\n2) dpts fit's default job, {count} fits per mode, in turns (load {os.getloadavg()[0]:.1f})")
    print(f"{'read-outs':>9} {'fit s':>7} {'steps s':>8} {'start s':>8} {'table cpu':>9} {'wait s':>7} "
          f"{'hooks s':>8} {'ms/hook':>8}")
    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    try:
        for i in range(count):
            for risk in ((True, False) if i % 2 == 0 else (False, True)):
                state["risk"] = risk
                record.clear()
                with tempfile.TemporaryDirectory() as tmp:
                    began = time.perf_counter()
                    run_fit(FitConfig(output_dir=tmp, overwrite=True, non_dp=False), progress=lambda _: None)
                    wall = time.perf_counter() - began
                steps, hooks = sum(record["step"]), sum(record["hook"])
                results[risk].append((wall, steps, hooks))
                print(f"{str(risk):>9} {wall:7.2f} {steps:8.3f} {record['start'][0]:8.3f} "
                      f"{record['table_cpu'][0]:9.3f} {record['wait'][0]:7.3f} {hooks:8.4f} "
                      f"{1e3 * hooks / len(record['hook']):8.3f}", flush=True)
    finally:
        for owner, name, method in originals:
            setattr(owner, name, method)
    for k, label in ((0, "fit wall"), (1, "step"), (2, "hook")):
        on = statistics.median(r[k] for r in results[True])
        off = statistics.median(r[k] for r in results[False])
        print(f"median {label} seconds with / without read-outs: {on:.3f} / {off:.3f} = {on / off:.3f}")
    print(f"load {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fits", type=int, default=3)
    parser.add_argument("--skip-tables", action="store_true")
    parser.add_argument("--skip-fit", action="store_true")
    args = parser.parse_args()
    if not args.skip_tables:
        tables(args.repeats)
    if not args.skip_fit:
        fits(args.fits)


if __name__ == "__main__":
    main()

"""What a user waits for: total fit time and peak memory of a default DP fit against the same fit without DP.

Usage (the default of ``benchmarks/dp_training.py``; ``--per-step`` there runs the step-by-step harness)::

    OMP_NUM_THREADS=1 python benchmarks/dp_training.py [--configs sff:64,sff:256,sff:1024,dlinear:64,...]
        [--steps 300] [--deepar-steps 150] [--repeats 3] [--kinds plain,dp,dp_secure] [--memory-repeats 1]
        [--threads 1]

Per configuration (model, Lambda): one initial model (``dp_training.build``: context 96, horizon 24) on the
bundled ``us_employment`` data through :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` (Lambda
windows per step, lambda = ceil(Lambda / 128) per series, so at most 128 of the 148 series per step), trained for
``--steps`` optimizer steps by a quiet CPU Trainer, as

* ``plain``: no DP (the same datamodule);
* ``dp``: a default DP fit: ``DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=1)`` with every default
  (``per_window="auto"``, the probe, a spot check on 10% of the steps, background noise) and
  ``AccountantCallback(4, 1e-6)`` (budget search and epsilon table in the fit); sigma is calibrated beforehand,
  outside the timed fits, so that the budget covers the steps;
* ``dp_secure``: the same with ``secure_mode=True`` (noise from the OS CSPRNG, :mod:`lightning_dpts.randomness`);
* what each default costs in the whole fit, the default DP fit less one of them (``--kinds plain,dp,dp_bare,...``):
  ``dp_nospot`` (``spot_check=0``), ``dp_noprobe`` (``check_independence=False``), ``dp_bare`` (neither: the fast
  path alone), ``dp_noreadouts`` (``AccountantCallback(risk_readouts=False)``: no membership read-outs in the epsilon
  table), ``dp_noaccountant`` (no ``AccountantCallback``, ``require_accountant=False``: no budget search, no epsilon
  table, no per-step epsilon). Each is printed as its own DP/plain row, and a ``# default over`` line gives the paired
  ratio of the default DP fit's total to each variant's: the share of the fit that default costs.

Time: ``--repeats`` rounds in this process; in each round every kind trains a fresh copy of the initial model once,
one fit after the other (order rotated between rounds, so that a slow phase of a shared machine hits each kind
alike). ``total`` = wall time of ``trainer.fit`` (set-up, every step, probes, checks, accountant, tear-down);
``step`` = the median of the per-step times (from before every callback's ``on_train_batch_start`` to after every
``on_train_batch_end``, probes included) after ``--warmup`` steps. Ratios are paired: DP over plain within a round,
then the median over rounds (with the range). ``probe`` = the strategy's ``probe_seconds`` over the DP fit's total;
``secure/dp`` = the secure fit over the default DP fit (total and step median), i.e. the cost of secure noise
against the default noise. ``cpu DP/plain`` = the same paired ratio of the process's CPU time over ``trainer.fit``
(every thread: the noise and epsilon-table threads count), which moves far less than wall time when other jobs
share the machine; it is not what a user waits for (on an idle core a background thread's work is hidden).

Peak memory: a fresh subprocess per fit (plain and DP alternating, ``--memory-repeats`` times, ``--memory-steps``
steps, :func:`memory_child`) reads the kernel's peak resident set: of the whole process (``ru_maxrss``: imports and
data loading included) and of the fit alone (``VmHWM`` after the fit, its peak reset just before ``trainer.fit``,
less the resident set then), DP over plain. Why this measure: tracemalloc sees Python's allocator only, not torch's
CPU tensors; torch keeps no statistics of its CPU allocations; the profiler's memory events cover the profiled
thread and step. The resident set counts every page the process touched, in every thread (the noise thread, the
epsilon-table thread), over the whole fit, and a fresh process gives each fit the same start. It also counts pages
the allocator keeps after a free, alike for both kinds.

The load average is printed before and after each configuration: timings on a shared machine move with it.

Allocator (``--allocator``): by default the timing process pins glibc's malloc thresholds (:func:`pin_allocator`:
blocks up to 32 MiB from the heap, freed memory kept), so that no configuration's time depends on which ran before
it in the process. With glibc's defaults, a block above the dynamic mmap threshold is mapped fresh (page faults)
at every allocation until a larger block has been freed, which raises the threshold: measured 2026-11-29, plain
DeepAR at Lambda = 64 took 44 ms a step in a fresh process and 28.5-30 ms after a DLinear run at Lambda = 1024
or with the thresholds pinned, the DP fit 45-50 ms either way (DP/plain 1.19 against 1.70-1.76).
``--allocator default`` leaves glibc's defaults (what a fresh process of a user's gets). The memory children
always run with the defaults.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import math
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

DEFAULT_CONFIGS = "sff:64,sff:256,sff:1024,dlinear:64,dlinear:256,dlinear:1024,deepar:64"
EPSILON, DELTA = 4.0, 1e-6


def build(name: str) -> L.LightningModule:
    """The benchmark's models (``dp_training.build``; DeepAR for the monthly data: its default monthly lags up to
    37 and one time feature plus age, as the datamodule builds them)."""
    if name != "deepar":
        from dp_training import build as build_step

        return build_step(name)
    from gluonts.torch.model.deepar import DeepARLightningModule

    torch.manual_seed(0)
    return DeepARLightningModule(model_kwargs=dict(freq="M", prediction_length=24, context_length=96,
                                                   num_feat_dynamic_real=2))


def datamodule(module: L.LightningModule, size: int):
    from lightning_dpts.data import StructuredSubsamplingDataModule

    return StructuredSubsamplingDataModule("us_employment", batch_size=size, instances_per_series=math.ceil(size / 128),
                                           model=module, test_windows=0)


def sigma_for(module: L.LightningModule, size: int, steps: int) -> float:
    """sigma that keeps ``steps`` steps within the budget (calibrated once, outside the timed fits)."""
    from lightning_dpts.privacy import calibrate_noise_multiplier

    spec = datamodule(module, size).sampling_spec
    epochs = math.ceil(1.25 * steps / spec.steps_per_epoch)
    return float(calibrate_noise_multiplier(spec, EPSILON, DELTA, epochs=epochs))


#: each :class:`_StepTimer`'s step times, kept outside the callback: a list attribute that grows at every step would
#: make the DP fit's state guard re-examine the timer at every step (a cost of the benchmark, not of DP training)
_STEP_TIMES: dict[int, list[float]] = {}
_TIMER_KEYS = itertools.count()


class _StepTimer(Callback):
    """Wall time of every step, from before every other callback's ``on_train_batch_start`` (:meth:`first`, listed
    first) to after every other callback's ``on_train_batch_end`` (this one, listed last); :attr:`times` lives in
    ``_STEP_TIMES`` (only plain floats change on the callback itself during the fit)."""

    def __init__(self) -> None:
        self.key = next(_TIMER_KEYS)
        _STEP_TIMES[self.key] = []
        self._t = 0.0
        self.first_start = self.last_end = 0.0  # perf_counter at the first step's start and the last step's end

    @property
    def times(self) -> list[float]:
        return _STEP_TIMES[self.key]

    def first(self) -> Callback:
        timer = self

        class _Start(Callback):
            def on_train_batch_start(self, *args) -> None:
                timer._t = time.perf_counter()
                if not timer.times:
                    timer.first_start = timer._t

        return _Start()

    def on_train_batch_end(self, *args) -> None:
        self.last_end = time.perf_counter()
        self.times.append(self.last_end - self._t)


def dp_callbacks(kind: str, sigma: float) -> list[Callback]:
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    if kind == "plain":
        return []
    changed, accountant = VARIANTS[kind]
    strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=1.0, **changed)
    return [strategy] if accountant is None else [strategy, AccountantCallback(EPSILON, DELTA, **accountant)]


#: the DP kinds (module docstring): what each changes in the default DPForecastStrategy and AccountantCallback (None:
#: no AccountantCallback); everything else is the library's default
VARIANTS: dict[str, tuple[dict, dict | None]] = {
    "dp": ({}, {}),
    "dp_secure": ({"secure_mode": True}, {}),
    "dp_nospot": ({"spot_check": 0.0}, {}),
    "dp_noprobe": ({"check_independence": False}, {}),
    "dp_bare": ({"spot_check": 0.0, "check_independence": False}, {}),
    "dp_noreadouts": ({}, {"risk_readouts": False}),
    "dp_noaccountant": ({"require_accountant": False}, None),
}


def fit_once(module: L.LightningModule, size: int, steps: int, kind: str, sigma: float) -> dict:
    """One fit; its total wall time, step times and (DP) probe time."""
    dm = datamodule(module, size)
    extra = dp_callbacks(kind, sigma)
    timer = _StepTimer()
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[timer.first(), *extra, timer])
    cpu, start = time.process_time(), time.perf_counter()
    trainer.fit(module, datamodule=dm)
    end, cpu = time.perf_counter(), time.process_time() - cpu
    strategy = extra[0] if extra else None
    if trainer.global_step != steps:
        raise RuntimeError(f"{kind}: {trainer.global_step} of {steps} steps (budget too small?)")
    return {"total": end - start, "cpu": cpu, "steps": _STEP_TIMES.pop(timer.key), "start": timer.first_start - start,
            "end": end - timer.last_end, "probe": getattr(strategy, "probe_seconds", 0.0),
            "probes": getattr(strategy, "probes", 0), "isolated": getattr(strategy, "isolated", False)}


#: glibc's mallopt parameters and the values :func:`pin_allocator` sets (32 MiB is the largest mmap threshold
#: glibc accepts on 64-bit systems)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_PINNED_MMAP, _PINNED_TRIM = 32 << 20, 1 << 30


def pin_allocator() -> str:
    """Pin glibc malloc's mmap threshold (32 MiB) and trim threshold (1 GiB) in this process, so that allocation
    costs do not depend on what ran before (module docstring); what was done, for the header line."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        done = libc.mallopt(_M_MMAP_THRESHOLD, _PINNED_MMAP) == 1 and libc.mallopt(_M_TRIM_THRESHOLD, _PINNED_TRIM) == 1
    except (OSError, AttributeError):
        done = False
    return "glibc malloc pinned (mmap threshold 32 MiB, trim 1 GiB)" if done else "allocator defaults (not glibc)"


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def _ratio_line(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"


def time_config(name: str, size: int, args: argparse.Namespace) -> dict:
    base = build(name)
    steps = args.deepar_steps if name == "deepar" else args.steps
    sigma = sigma_for(base, size, steps)
    kinds = args.kinds.split(",")
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for repeat in range(args.repeats):
        order = kinds[repeat % len(kinds):] + kinds[: repeat % len(kinds)]
        for kind in order:
            runs[kind].append(fit_once(copy.deepcopy(base), size, steps, kind, sigma))
    out: dict = {"steps": steps, "sigma": sigma}
    med = {k: [statistics.median(r["steps"][args.warmup:]) for r in v] for k, v in runs.items()}
    for kind in kinds:
        if kind == "plain":
            continue
        out[kind] = {
            "total": [d["total"] / p["total"] for d, p in zip(runs[kind], runs["plain"], strict=True)],
            "cpu": [d["cpu"] / p["cpu"] for d, p in zip(runs[kind], runs["plain"], strict=True)],
            "step": [d / p for d, p in zip(med[kind], med["plain"], strict=True)],
            "probe_share": [r["probe"] / r["total"] for r in runs[kind]],
            "probes": runs[kind][0]["probes"], "isolated": runs[kind][0]["isolated"],
        }
    # what each default costs: the default DP fit's total over the variant's, paired within a round
    out["default_over"] = {k: [d["total"] / v["total"] for d, v in zip(runs["dp"], runs[k], strict=True)]
                           for k in kinds if k not in ("plain", "dp", "dp_secure")}
    if "dp" in runs and "dp_secure" in runs:
        out["secure_over_dp"] = {
            "total": [s["total"] / d["total"] for s, d in zip(runs["dp_secure"], runs["dp"], strict=True)],
            "step": [s / d for s, d in zip(med["dp_secure"], med["dp"], strict=True)]}
    out["seconds"] = {k: statistics.median(r["total"] for r in v) for k, v in runs.items()}
    out["step_ms"] = {k: 1e3 * statistics.median(v) for k, v in med.items()}
    # the mean step over the median step: what the median hides (probe steps, spot-checked steps, slow outliers)
    out["mean_over_median"] = {k: statistics.median(statistics.mean(r["steps"][args.warmup:]) / m
                                                    for r, m in zip(v, med[k], strict=True)) for k, v in runs.items()}
    out["start_end"] = {k: (statistics.median(r["start"] for r in v), statistics.median(r["end"] for r in v))
                        for k, v in runs.items()}
    return out


def _status_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (peak) of this process from /proc/self/status, in KiB."""
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def memory_child(name: str, size: int, steps: int, kind: str, sigma: float) -> dict:
    """In a fresh process: the peak resident set of the whole process, and its rise during one fit (KiB).

    Before the fit (model and data built) freed memory is handed back (``gc.collect``, glibc's ``malloc_trim``) and
    the kernel's peak is reset to the current resident set (``/proc/self/clear_refs`` 5, Linux >= 4.0), so that the
    peak read after the fit (``VmHWM``) is the fit's own."""
    import ctypes
    import gc

    module = build(name)
    dm = datamodule(module, size)
    whole = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    before = _status_kib("VmRSS")
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=dp_callbacks(kind, sigma))
    trainer.fit(module, datamodule=dm)
    peak = _status_kib("VmHWM")
    return {"before": before, "after": peak, "process": max(whole, peak)}


def memory_config(name: str, size: int, args: argparse.Namespace, sigma: float) -> dict:
    peaks: dict[str, list[dict]] = {"plain": [], "dp": []}
    for repeat in range(args.memory_repeats):
        for kind in (("plain", "dp") if repeat % 2 == 0 else ("dp", "plain")):
            cmd = [sys.executable, os.path.abspath(__file__), "--memory-child",
                   json.dumps([name, size, args.memory_steps, kind, sigma]), "--threads", str(args.threads)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                  cwd=os.path.dirname(os.path.abspath(__file__)))
            peaks[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
    out = {}
    for kind, values in peaks.items():
        out[kind] = {"peak": statistics.median(v["process"] for v in values) / 1024,
                     "during": statistics.median(v["after"] - v["before"] for v in values) / 1024}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="model:Lambda,... (models: sff, dlinear, deepar)")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per fit (feed-forward models)")
    parser.add_argument("--deepar-steps", type=int, default=150, help="optimizer steps per DeepAR fit")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the per-step median")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kinds", default="plain,dp,dp_secure", help="plain,dp and any variants (module docstring)")
    parser.add_argument("--memory-repeats", type=int, default=1, help="fresh-process fits per kind (0: no memory)")
    parser.add_argument("--memory-steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--allocator", choices=("pinned", "default"), default="pinned",
                        help="pinned (default): glibc malloc thresholds fixed in the timing process; default: glibc's "
                             "own (see the module docstring)")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k != "plain" and k not in VARIANTS]
    if unknown or "plain" not in kinds or "dp" not in kinds or len(set(kinds)) != len(kinds):
        parser.error(f"--kinds {args.kinds!r}: plain, dp and any of {', '.join(list(VARIANTS)[1:])}, each once")
    torch.set_num_threads(args.threads)
    if args.memory_child is not None:
        print(json.dumps(memory_child(*json.loads(args.memory_child))))
        return
    if args.allocator == "pinned":
        allocator = pin_allocator()
    else:  # glibc's own, or what the environment sets (MALLOC_*_ variables)
        from dp_training import allocator_settings

        allocator = f"allocator: {allocator_settings()}"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs; "
          f"{args.repeats} rounds of {args.kinds}; DP: AccountantCallback({EPSILON:g}, {DELTA:g}), defaults; "
          f"{allocator}")
    print(f"{'model':8s} {'Lambda':>6s} {'steps':>5s} {'plain s':>8s} {'DP s':>7s} {'total DP/plain':>20s} "
          f"{'cpu DP/plain':>20s} {'step DP/plain':>20s} {'probe':>7s} {'peak DP/plain':>22s} {'during fit':>24s} "
          f"{'secure/dp total':>20s} {'secure/dp step':>20s}")
    print("# peak: of the whole process (MiB, DP/plain and ratio); during fit: its rise during trainer.fit")
    for item in args.configs.split(","):
        name, size = item.split(":")[0], int(item.split(":")[1])
        load = _load()
        timing = time_config(name, size, args)
        memory = memory_config(name, size, args, timing["sigma"]) if args.memory_repeats else None
        dp = timing["dp"]
        peak = during = secure_total = secure_step = "-"
        if memory is not None:
            m_plain, m_dp = memory["plain"], memory["dp"]
            peak = f"{m_dp['peak']:.0f}/{m_plain['peak']:.0f}M {m_dp['peak'] / m_plain['peak']:.3f}"
            during = f"{m_dp['during']:.0f}/{m_plain['during']:.0f}M " + (
                f"{m_dp['during'] / m_plain['during']:.2f}" if m_plain["during"] > 0 else "-")
        if "secure_over_dp" in timing:
            secure_total = _ratio_line(timing["secure_over_dp"]["total"])
            secure_step = _ratio_line(timing["secure_over_dp"]["step"])
        print(f"{name:8s} {size:6d} {timing['steps']:5d} {timing['seconds']['plain']:8.2f} "
              f"{timing['seconds']['dp']:7.2f} {_ratio_line(dp['total']):>20s} {_ratio_line(dp['cpu']):>20s} "
              f"{_ratio_line(dp['step']):>20s} "
              f"{100 * statistics.median(dp['probe_share']):6.1f}% {peak:>22s} {during:>24s} {secure_total:>20s} "
              f"{secure_step:>20s}", flush=True)
        ends = ", ".join(f"{k} {a:.2f}/{b:.2f}" for k, (a, b) in timing["start_end"].items())
        print(f"#   step ms: {', '.join(f'{k} {v:.2f}' for k, v in timing['step_ms'].items())}; before the first "
              f"step / after the last, s: {ends}; mean step / median step: "
              f"{', '.join(f'{k} {v:.3f}' for k, v in timing['mean_over_median'].items())}; probes per DP fit "
              f"{dp['probes']}{' (isolated!)' if dp['isolated'] else ''}; sigma {timing['sigma']:.3g}; load "
              f"{load} -> {_load()}", flush=True)
        for kind in timing["default_over"]:  # the variants' own rows
            v = timing[kind]
            print(f"{'  ' + kind:30s} {timing['seconds'][kind]:7.2f} {_ratio_line(v['total']):>20s} "
                  f"{_ratio_line(v['cpu']):>20s} {_ratio_line(v['step']):>20s} "
                  f"{100 * statistics.median(v['probe_share']):6.1f}%", flush=True)
        if timing["default_over"]:
            print("#   default over: " + ", ".join(f"{k} {_ratio_line(v)}" for k, v in timing["default_over"].items()),
                  flush=True)



if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()

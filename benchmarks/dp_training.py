"""DP training against plain training: what a user waits for (default), or the step-by-step harness (``--per-step``).

Default: the total fit time and peak memory of a default DP fit against the same fit without DP, next to the
per-step median (``benchmarks/dp_fit.py``, whose docstring gives the method)::

    OMP_NUM_THREADS=1 python benchmarks/dp_training.py [--configs sff:64,...] [--steps 300] [--repeats 3]

``--per-step``: time (and memory) per training step with DP (DPForecastStrategy, Algorithm 2) against the same model
and batch without DP::

    python benchmarks/dp_training.py --per-step [--batch-size 256] [--steps 30] [--repeats 3]
        [--models sff,dlinear,deepar] [--batch-sizes 64,256,1024] [--threads 1] [--kinds plain,dp,dp_acc] [--memory]

For each model and batch size Lambda, the same initial weights and the same fixed batch of Lambda windows are
trained with a plain ``Trainer`` and with ``Trainer(callbacks=[DPForecastStrategy(...)])``, ``--repeats`` times,
in one process. By default (``--interleave step``) the configurations take turns step by step: each Trainer runs
in a thread of its own, exactly one of them runs at any time, and step i of every configuration is timed within
milliseconds of step i of the others, so that the slow changes of a shared machine's speed (other processes, a
virtual machine's CPU steal) hit them alike; ``paired`` is then the median of the per-step ratios DP / no-DP,
with the range of each repeat's median. ``--interleave run`` alternates whole runs instead (the method of the
figures before 2026-11-21). ``--kinds plain,dp,plain_b`` adds a second non-DP run, ``plain_b``: its paired ratio
is the A/A control, which shows the resolution of the measurement on the machine at hand. Callbacks time every
optimizer step (from before the DP callback's
``on_train_batch_start`` to after the accountant's ``on_train_batch_end``: forward, backward, per-window
gradients, clipping, noise, optimizer step). Reported: the median over all timed steps (after ``--warmup`` per
run), the best run's median and the minimum over all timed steps (the last two: least disturbed by other
processes on a shared machine), with the ratio DP / no-DP; the order of the configurations rotates between
repeats. ``cpu`` columns are the same statistics of the process CPU time per step (all threads, including the
background noise thread: the work done, less sensitive to other processes than wall time); ``main cpu`` is the
CPU time of the training thread alone (the critical path when the noise thread has a core of its own). The
load average (``os.getloadavg``) is printed before and after each model and batch size.
``--kinds`` may add ``dp_iso`` (``per_window="isolated"``: each window's gradient from ``training_step`` on
that window alone), ``dp_spot`` (a spot check at every step), ``dp_nospot`` (none) and ``dp_bare`` (neither
spot check nor probe: the fast path alone); with ``--interleave step`` each gets its paired ratio to the non-DP
step (issue 25's costs).
``--models mlp,gru`` measures a user's own module (:class:`UserForecaster`).
``+acc`` adds an :class:`AccountantCallback` (epsilon logging; budget 8 at ``--accountant-delta``) to the DP run;
``acc hook`` is the time of its per-step hook alone (median, and mean over all steps including any step that waits
for the epsilon table). ``dp_acc_bg`` is the same with ``background_table=True`` (the epsilon table computed by a
thread alongside training; ``dp_acc`` has it complete before the first step). With ``dp`` and ``dp_acc`` (or
``dp_acc_bg``) both measured, a ``dp_acc/dp`` line gives the accountant's share of the DP step side by side (its
per-step ratios, and the total of the timed steps); use ``--interleave run`` for ``dp_acc_bg``, so that the
table's background thread runs only during its own runs. ``--memory`` also records, for one step after warm-up of each
configuration, the peak of the memory allocated by torch during the step above what was allocated at its start
(torch profiler memory events: activations, gradients, temporaries; the parameters and optimizer state, equal in
both, are not included; for DP, the step's one noise vector, when drawn in the background thread from the step's
start - the profiler does not see that thread's allocation - and then handed out as the step's gradient, is added
for the whole step; with no spare core the strategy draws it at the optimizer step, where the profiler counts it).
``--threads`` sets ``torch.set_num_threads`` (default: torch's default). The header names the C allocator settings
in force (:func:`allocator_settings`): with glibc's defaults, memory freed at the end of a step may go back to the
operating system and be faulted in again by the next step (DeepAR's large temporaries);
``MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_TOP_PAD_=536870912``
(glibc's environment variables, read at process start) keep it (``benchmarks/dp_fit.py``, "Allocator").
Targets (issue 15): <= 1.15x for
SimpleFeedForward and DLinear, <= 1.5x for DeepAR; memory within 10% (feed-forward) and 25% (DeepAR).
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import statistics
import sys
import threading
import time
import warnings

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from lightning_dpts.privacy import SamplingSpec
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

PREDICTION, CONTEXT = 24, 96

#: DP kinds besides ``dp`` (the default strategy: fast path, probe, a spot check on 10% of the steps) and ``dp_acc``
STRATEGY_KINDS: dict[str, dict] = {
    "dp_iso": dict(per_window="isolated"),  # each window's gradient from training_step on that window alone
    "dp_spot": dict(spot_check=1.0),  # a spot check at every step
    "dp_nospot": dict(spot_check=0.0),  # fast path and probe, no per-step spot check
    "dp_bare": dict(spot_check=0.0, check_independence=False),  # fast path alone (the cost before issue 25)
}


#: glibc's malloc tunables that decide whether freed memory goes back to the operating system
ALLOCATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES",
                       "LD_PRELOAD")


def allocator_settings() -> str:
    """The allocator environment of this process, for the header (``glibc defaults`` when none is set)."""
    found = [f"{name}={os.environ[name]}" for name in ALLOCATOR_VARIABLES if os.environ.get(name)]
    return " ".join(found) if found else "glibc defaults"


class UserForecaster(L.LightningModule):
    """A user's own module on the datamodule's dict batches: an MLP (``kind="mlp"``, 96 -> 64 -> 64 -> 24) or a
    GRU (``kind="gru"``, one layer of 40 units over the target and its observed mask, a linear head), squared
    error averaged over the observed forecast steps of each window, then over the windows."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "mlp":
            self.net = torch.nn.Sequential(torch.nn.Linear(CONTEXT, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                           torch.nn.ReLU(), torch.nn.Linear(64, PREDICTION))
        else:
            self.gru = torch.nn.GRU(2, 40, batch_first=True)
            self.head = torch.nn.Linear(40, PREDICTION)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.kind == "mlp":
            out = self.net(batch["past_target"])
        else:
            h, _ = self.gru(torch.stack([batch["past_target"], batch["past_observed_values"]], dim=-1))
            out = self.head(h[:, -1])
        observed = batch["future_observed_values"]
        err = (out - batch["future_target"]).square() * observed
        return (err.sum(1) / observed.sum(1).clamp(min=1)).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def build(name: str) -> L.LightningModule:
    from gluonts.torch.model.d_linear import DLinearLightningModule
    from gluonts.torch.model.deepar import DeepARLightningModule
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    torch.manual_seed(0)
    if name in ("mlp", "gru"):
        return UserForecaster(name)
    if name == "sff":
        return SimpleFeedForwardLightningModule(
            model_kwargs=dict(prediction_length=PREDICTION, context_length=CONTEXT, hidden_dimensions=[64, 64])
        )
    if name == "dlinear":
        return DLinearLightningModule(
            model_kwargs=dict(prediction_length=PREDICTION, context_length=CONTEXT, hidden_dimension=64)
        )
    if name == "deepar":  # GluonTS defaults: 2 LSTM layers of 40 units; hourly lags up to one week
        return DeepARLightningModule(
            model_kwargs=dict(freq="h", prediction_length=PREDICTION, context_length=CONTEXT,
                              num_feat_dynamic_real=5, lags_seq=[1, 2, 3, 4, 5, 6, 7, 23, 24, 25, 167, 168, 169])
        )
    raise KeyError(name)


def batch_for(module: L.LightningModule, size: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    batch = {}
    if isinstance(module, UserForecaster):
        batch["past_target"] = 1.0 + torch.rand(size, CONTEXT, generator=g)
        batch["past_observed_values"] = torch.ones(size, CONTEXT)
    for key, spec in (module.model.describe_inputs(size).items() if hasattr(module, "model") else ()):
        if spec.dtype in (torch.long, torch.int64):
            batch[key] = torch.zeros(spec.shape, dtype=spec.dtype)
        elif "observed" in key:
            batch[key] = torch.ones(spec.shape)
        else:
            batch[key] = 1.0 + torch.rand(spec.shape, generator=g)
    batch["future_target"] = 1.0 + torch.rand(size, PREDICTION, generator=g)
    batch["future_observed_values"] = torch.ones(size, PREDICTION)
    return batch


class _Fixed(L.LightningDataModule):
    def __init__(self, batch: dict[str, torch.Tensor], steps: int, spec: SamplingSpec) -> None:
        super().__init__()
        self.batch, self.steps, self._spec = batch, steps, spec

    @property
    def sampling_spec(self) -> SamplingSpec:
        return self._spec

    def train_dataloader(self) -> DataLoader:
        return DataLoader([self.batch] * self.steps, batch_size=None)


def fixed_data(module: L.LightningModule, size: int, steps: int) -> _Fixed:
    """``steps`` copies of one batch of ``size`` windows for ``module``, with a sampling spec of 100 x ``size``
    series long enough for the model's past window (what the strategy and the accountant read)."""
    past = int(getattr(getattr(module, "model", None), "_past_length", CONTEXT))
    spec = SamplingSpec(num_series=100 * size, min_length=10 * (past + PREDICTION), context_length=past,
                        prediction_length=PREDICTION, batch_size=size)
    return _Fixed(batch_for(module, size), steps, spec)


def _trainer(max_steps: int, callbacks: list[Callback]) -> L.Trainer:
    """A quiet CPU Trainer (no logger, checkpoints, progress bar or summary)."""
    return L.Trainer(max_steps=max_steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)


class _Timer(Callback):
    """Times each step from before every other callback's ``on_train_batch_start`` (:meth:`first`, listed first)
    to after every other callback's ``on_train_batch_end`` (this callback, listed last)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.main: list[float] = []

    def first(self) -> Callback:
        timer = self

        class _Start(Callback):
            def on_train_batch_start(self, *args) -> None:
                timer._m = time.thread_time()
                timer._c = time.process_time()
                timer._t = time.perf_counter()

        return _Start()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self._t)
        self.cpu.append(time.process_time() - self._c)
        self.main.append(time.thread_time() - self._m)


class _PeakMemory(Callback):
    """Peak torch memory allocated during step ``at`` above the step's start (profiler memory events)."""

    def __init__(self, at: int) -> None:
        self.at, self.step, self.peak = at, 0, 0
        self.background = False  # the DP noise was drawn in the background thread (the profiler does not see it)

    def on_train_batch_start(self, *args) -> None:
        self.step += 1
        if self.step == self.at:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.__enter__()

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.step != self.at:
            return
        self._prof.__exit__(None, None, None)
        self.background = any(getattr(c, "background_noise", False) for c in trainer.callbacks)
        events = [e for e in self._prof.profiler.kineto_results.events() if e.name() == "[memory]"]
        level = 0
        for e in sorted(events, key=lambda e: e.start_ns()):
            level += e.nbytes()
            self.peak = max(self.peak, level)


class _TimedAccountant(AccountantCallback):
    """Measures the accountant's own per-step hook (epsilon look-up/evaluation + logging)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hook_times: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(*args)
        self.hook_times.append(time.perf_counter() - start)


def time_steps(
    module, dm, steps: int, warmup: int, extra: list[Callback]
) -> tuple[list[float], list[float], list[float]]:
    """Wall, process CPU and training-thread CPU seconds of every step after ``warmup``."""
    timer = _Timer()
    _trainer(steps, [timer.first(), *extra, timer]).fit(module, datamodule=dm)
    return timer.times[warmup:], timer.cpu[warmup:], timer.main[warmup:]


class _Turns:
    """Runs several Trainers in threads that take turns step by step: exactly one of them runs at any time, and
    each trains one step (timed by its :class:`_Timer`; the first after the Trainer's set-up, also in its turn)
    before handing over to the next, so step i of every
    configuration is measured within a few milliseconds of step i of the others and slow changes of the
    machine's speed (other processes, the host's CPU steal) hit them alike. Between two of its steps a Trainer
    waits inside ``on_train_batch_end`` (after the timer), so its own loop overhead (fetching the next batch)
    never overlaps another's timed step."""

    def __init__(self, kinds: list[str], steps: int) -> None:
        self.kinds, self.steps = kinds, steps
        self.done = dict.fromkeys(kinds, 0)
        self.turn = 0
        self.failed = False
        self.cond = threading.Condition()

    def _wait(self, kind: str) -> None:  # with self.cond held
        me = self.kinds.index(kind)
        while self.kinds[self.turn] != kind and not self.failed:
            if not self.cond.wait(timeout=600):
                raise RuntimeError(f"{kind}: no turn within 600 s")
        if self.failed:
            raise RuntimeError("another configuration failed")
        assert self.turn == me

    def _hand_over(self) -> None:  # with self.cond held: next configuration with steps left (or any, at the end)
        for k in range(1, len(self.kinds) + 1):
            nxt = (self.turn + k) % len(self.kinds)
            if self.done[self.kinds[nxt]] < self.steps:
                self.turn = nxt
                break
        self.cond.notify_all()

    def callbacks(self, kind: str) -> tuple[Callback, Callback]:
        """The callback to list first (waits for the first turn, before the timer starts) and the one to list
        last (after the timer stops: hands over and waits for the next turn)."""
        turns = self

        class _First(Callback):
            def on_train_batch_start(self, *args) -> None:
                with turns.cond:
                    turns._wait(kind)

        class _Last(Callback):
            def on_train_batch_end(self, *args) -> None:
                with turns.cond:
                    turns.done[kind] += 1
                    turns._hand_over()
                    if turns.done[kind] < turns.steps:
                        turns._wait(kind)
                    else:  # last step: tear down only once every configuration has taken its last step
                        turns.cond.wait_for(lambda: turns.failed or min(turns.done.values()) >= turns.steps, 600)

            def on_train_end(self, *args) -> None:  # a run that stops early (e.g. a budget) leaves the turns
                with turns.cond:
                    if turns.done[kind] < turns.steps:
                        turns.done[kind] = turns.steps
                        if turns.kinds[turns.turn] == kind:
                            turns._hand_over()
                        turns.cond.notify_all()

        return _First(), _Last()

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()


def time_interleaved(
    modules: dict[str, L.LightningModule], dms: dict[str, L.LightningDataModule], steps: int, warmup: int,
    extra: dict[str, list[Callback]],
) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """:func:`time_steps` for every configuration at once, alternating step by step (:class:`_Turns`)."""
    kinds = list(modules)
    turns = _Turns(kinds, steps)
    timers = {k: _Timer() for k in kinds}
    errors: list[BaseException] = []
    threads_wanted = torch.get_num_threads()

    def run(kind: str) -> None:
        try:
            torch.set_num_threads(threads_wanted)
            with turns.cond:  # the Trainer's set-up takes its turn too (it may use torch's process-wide RNG,
                turns._wait(kind)  # which the DP strategy's window-independence probe seeds for its two passes)
            first, last = turns.callbacks(kind)
            callbacks = [first, timers[kind].first(), *extra[kind], timers[kind], last]
            _trainer(steps, callbacks).fit(modules[kind], datamodule=dms[kind])
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            turns.fail()

    workers = [threading.Thread(target=run, args=(k,), name=f"bench-{k}") for k in kinds]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return {k: (t.times[warmup:], t.cpu[warmup:], t.main[warmup:]) for k, t in timers.items()}


def peak_memory(module, dm, warmup: int, extra: list[Callback]) -> tuple[int, bool]:
    """Peak bytes allocated during step ``warmup + 1`` above its start, and whether DP drew that step's noise in
    the background thread."""
    probe = _PeakMemory(warmup + 1)
    trainer = _trainer(warmup + 1, [*extra, probe])
    trainer.fit(module, datamodule=dm)
    return probe.peak, probe.background


def main() -> None:
    if "--per-step" not in sys.argv[1:]:
        import dp_fit

        dp_fit.main(sys.argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-step", action="store_true", help="the step-by-step harness (this parser)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--batch-sizes", default=None, help="comma-separated list (overrides --batch-size)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="sff,dlinear,deepar", help="sff,dlinear,deepar (GluonTS), mlp,gru (a "
                        "user's own module, UserForecaster)")
    parser.add_argument("--kinds", default="plain,dp,dp_acc",
                        help="plain,dp[,dp_acc][,plain_b][,dp_iso][,dp_spot][,dp_nospot][,dp_bare] (plain_b: a second "
                             "non-DP run, the A/A control of the paired ratios; dp_iso: per_window='isolated'; "
                             "dp_spot: spot_check=1.0; dp_nospot: no spot check; dp_bare: neither spot check nor "
                             "probe)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    parser.add_argument("--accountant-delta", type=float, default=1e-6, help="delta of the dp_acc budget")
    parser.add_argument("--memory", action="store_true", help="also the peak memory of one step")
    parser.add_argument("--interleave", choices=("step", "run"), default="step",
                        help="step (default): the configurations take turns step by step (one thread each, one "
                             "running at a time); run: one whole run after the other")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(b) for b in (args.batch_sizes or str(args.batch_size)).split(",")]
    order = args.kinds.split(",")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch sizes {sizes}, "
          f"{args.steps - args.warmup} timed steps x {args.repeats} repeats (median)")
    print(f"# allocator: {allocator_settings()}")
    print(f"{'model':8s} {'Lambda':>6s} {'stat':8s} {'params':>8s} {'no DP ms':>9s} {'DP ms':>8s} {'ratio':>6s} "
          f"{'cpu ratio':>9s} {'main cpu':>8s} {'DP+acc ms':>10s} {'ratio':>6s} {'acc hook ms':>11s} {'(mean)':>7s}")
    for name in args.models.split(","):
        for size in sizes:
            run_one(name, size, args, order)


def run_one(name: str, size: int, args: argparse.Namespace, order: list[str]) -> None:
    base = build(name)
    dm = fixed_data(base, size, args.steps)
    runs: dict[str, list[list[float]]] = {k: [] for k in order}
    cpu: dict[str, list[list[float]]] = {k: [] for k in order}
    main: dict[str, list[list[float]]] = {k: [] for k in order}
    hook: list[float] = []
    totals_by_kind: dict[str, list[float]] = {}
    print(f"# load average before {name} {size}: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    def callbacks_for(kind: str) -> list[Callback]:
        callbacks: list[Callback] = []
        if kind.startswith("dp"):
            callbacks.append(DPForecastStrategy(1.0, 1.0, seed=0, require_accountant=False,
                                                 **STRATEGY_KINDS.get(kind, {})))
        if kind == "dp_acc":
            callbacks.append(_TimedAccountant(8.0, args.accountant_delta))
        if kind == "dp_acc_bg":  # the epsilon table computed by a thread alongside training (before issue 26's fix)
            callbacks.append(_TimedAccountant(8.0, args.accountant_delta, background_table=True))
        return callbacks

    n_kinds = len(order)
    for repeat in range(args.repeats):
        rotated = order[repeat % n_kinds :] + order[: repeat % n_kinds]  # rotate: contention hits all alike
        extra = {kind: callbacks_for(kind) for kind in rotated}
        if args.interleave == "step":
            measured = time_interleaved({k: copy.deepcopy(base) for k in rotated},
                                        {k: fixed_data(base, size, args.steps) for k in rotated},
                                        args.steps, args.warmup, extra)
        else:
            measured = {k: time_steps(copy.deepcopy(base), dm, args.steps, args.warmup, extra[k]) for k in rotated}
        for kind, (wall, used, thread) in measured.items():
            runs[kind].append(wall)
            cpu[kind].append(used)
            main[kind].append(thread)
            if kind == "dp_acc":
                hook += extra[kind][-1].hook_times  # type: ignore[attr-defined]
            if kind.startswith("dp_acc"):
                totals_by_kind.setdefault(kind, []).append(sum(wall))
    iso = [cb for cb in extra.get("dp_iso", []) if isinstance(cb, DPForecastStrategy)]
    if iso and iso[0].vectorised is not None:
        how = "vmap" if iso[0].vectorised else "one pass per window"
        print(f"# {name} {size}: dp_iso computed the per-window gradients by {how}", flush=True)
    # median step time of each run; report the median over all steps and the best run (least contention)
    def stats(v: dict[str, list[list[float]]]) -> tuple[dict[str, float], ...]:
        med = {k: 1e3 * statistics.median([t for run in r for t in run]) for k, r in v.items()}
        best = {k: 1e3 * min(statistics.median(run) for run in r) for k, r in v.items()}
        low = {k: 1e3 * min(t for run in r for t in run) for k, r in v.items()}
        return med, best, low

    if args.interleave == "step":  # step i of each configuration ran right after step i of the others
        for kind in [k for k in order if k != "plain"]:
            per_repeat = [[d / p for d, p in zip(rd, rp, strict=False)]  # a run stopped early pairs its steps
                          for rd, rp in zip(runs[kind], runs["plain"], strict=True)]
            every = statistics.median([r for rep in per_repeat for r in rep])
            spread = [statistics.median(rep) for rep in per_repeat]
            print(f"{name:8s} {size:6d} {'paired':8s} {kind}: median of the per-step ratios {every:.3f} (median of "
                  f"each repeat {min(spread):.3f} - {max(spread):.3f})", flush=True)
    for acc_kind in [k for k in order if k.startswith("dp_acc")]:  # the accountant's share: DP with and without it
        if "dp" not in order:
            break
        per_repeat = [[a / d for a, d in zip(ra, rd, strict=False)]
                      for ra, rd in zip(runs[acc_kind], runs["dp"], strict=True)]
        ratios = [r for rep in per_repeat for r in rep]
        spread = [statistics.median(rep) for rep in per_repeat]
        totals = [sum(ra) / sum(rd) for ra, rd in zip(runs[acc_kind], runs["dp"], strict=True)]
        print(f"{name:8s} {size:6d} {'paired':8s} {acc_kind}/dp: median of the per-step ratios "
              f"{statistics.median(ratios):.3f} (median of each repeat {min(spread):.3f} - {max(spread):.3f}); "
              f"total step time of each repeat {' '.join(f'{t:.3f}' for t in totals)}", flush=True)
    med, best, low = stats(runs)
    cpu_med, cpu_best, cpu_low = stats(cpu)
    main_med, main_best, main_low = stats(main)
    n = sum(p.numel() for p in base.parameters() if p.requires_grad)
    h_med, h_mean = (1e3 * statistics.median(hook), 1e3 * statistics.mean(hook)) if hook else (math.nan, math.nan)
    for label, t, c, m in (("median", med, cpu_med, main_med), ("best run", best, cpu_best, main_best),
                           ("min", low, cpu_low, main_low)):
        a, b = t["plain"], t["dp"]
        acc = t.get("dp_acc", math.nan)
        print(f"{name:8s} {size:6d} {label:8s} {n:8d} {a:9.2f} {b:8.2f} {b / a:6.2f} {c['dp'] / c['plain']:9.2f} "
              f"{m['dp'] / m['plain']:8.2f} {acc:10.2f} {acc / a:6.2f} {h_med:11.3f} {h_mean:7.3f}", flush=True)
    if args.memory:
        measured = {k: peak_memory(copy.deepcopy(base), dm, args.warmup, callbacks_for(k)) for k in ("plain", "dp")}
        peaks = {k: v[0] for k, v in measured.items()}
        # the profiler sees neither what the background thread allocates nor frees of blocks allocated before the
        # step, so the plain step counts its new gradients (allocated in backward) and DP counts no noise: add the
        # step's noise vector (drawn from the step's start, after the previous step's gradients are released, and
        # handed out as this step's gradient), alive for the whole step; drawn at the optimizer step instead (no
        # spare core, see NoisyStep.prepare_noise), it is the main thread's and the profiler counts it
        if measured["dp"][1]:
            peaks["dp"] += 4 * n
        print(f"{name:8s} {size:6d} {'memory':8s} {n:8d} {peaks['plain'] / 2**20:8.1f}M {peaks['dp'] / 2**20:7.1f}M "
              f"{peaks['dp'] / max(peaks['plain'], 1):6.2f}", flush=True)
    print(f"# load average after {name} {size}: {'/'.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()

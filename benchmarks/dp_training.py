"""Time per training step with DP (DPForecastStrategy, Algorithm 2) against the same model and batch without DP.

Usage::

    python benchmarks/dp_training.py [--batch-size 256] [--steps 30] [--repeats 3] [--models sff,dlinear,deepar]

For each model, the same initial weights and the same fixed batch of ``--batch-size`` windows are trained with
a plain ``Trainer`` and with ``Trainer(callbacks=[DPForecastStrategy(...)])``, in alternation, ``--repeats``
times; a callback times every optimizer step (``on_train_batch_start`` -> ``on_train_batch_end``: forward,
backward, per-window gradients, clipping, noise, optimizer step). Reported: the median over all timed steps
(after ``--warmup`` per run) and the best run's median (least disturbed by other processes on a shared
machine), with the ratio DP / no-DP; the order of the three configurations rotates between repeats.
``+acc`` adds an :class:`AccountantCallback` (epsilon logging) to the DP run; ``acc hook`` is the time of
its per-step hook alone (median, and mean over all steps including the steps that evaluate a new epsilon
grid point). Targets from issue 4: <= 1.5x for SimpleFeedForward and
DLinear, <= 3x for DeepAR.
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
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


def build(name: str) -> L.LightningModule:
    from gluonts.torch.model.d_linear import DLinearLightningModule
    from gluonts.torch.model.deepar import DeepARLightningModule
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    torch.manual_seed(0)
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
    for key, spec in module.model.describe_inputs(size).items():
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


class _Timer(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_start(self, *args) -> None:
        self._t = time.perf_counter()

    def on_train_batch_end(self, *args) -> None:
        self.times.append(time.perf_counter() - self._t)


class _TimedAccountant(AccountantCallback):
    """Measures the accountant's own per-step hook (epsilon look-up/evaluation + logging)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hook_times: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        start = time.perf_counter()
        super().on_train_batch_end(*args)
        self.hook_times.append(time.perf_counter() - start)


def time_steps(module, dm, steps: int, warmup: int, extra: list[Callback]) -> list[float]:
    timer = _Timer()
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[*extra, timer])
    trainer.fit(module, datamodule=dm)
    return timer.times[warmup:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="sff,dlinear,deepar")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch size {args.batch_size}, "
          f"{args.steps - args.warmup} timed steps x {args.repeats} repeats (median)")
    print(f"{'model':8s} {'stat':8s} {'params':>8s} {'no DP ms':>9s} {'DP ms':>8s} {'ratio':>6s} "
          f"{'DP+acc ms':>10s} {'ratio':>6s} {'acc hook ms':>11s} {'(mean)':>7s}")
    for name in args.models.split(","):
        base = build(name)
        batch = batch_for(base, args.batch_size)
        past = int(getattr(base.model, "_past_length", CONTEXT))
        spec = SamplingSpec(num_series=100 * args.batch_size, min_length=10 * (past + PREDICTION),
                            context_length=past, prediction_length=PREDICTION, batch_size=args.batch_size)
        dm = _Fixed(batch, args.steps, spec)
        runs: dict[str, list[list[float]]] = {"plain": [], "dp": [], "dp_acc": []}
        hook: list[float] = []
        order = ["plain", "dp", "dp_acc"]
        for repeat in range(args.repeats):
            for kind in order[repeat % 3 :] + order[: repeat % 3]:  # rotate the order: contention hits all alike
                callbacks: list[Callback] = []
                if kind != "plain":
                    callbacks.append(DPForecastStrategy(1.0, 1.0, seed=0))
                if kind == "dp_acc":
                    callbacks.append(_TimedAccountant(8.0, 1e-6))
                runs[kind].append(time_steps(copy.deepcopy(base), dm, args.steps, args.warmup, callbacks))
                if kind == "dp_acc":
                    hook += callbacks[-1].hook_times  # type: ignore[attr-defined]
        # median step time of each run; report the median over all steps and the best run (least contention)
        med = {k: 1e3 * statistics.median([t for run in v for t in run]) for k, v in runs.items()}
        best = {k: 1e3 * min(statistics.median(run) for run in v) for k, v in runs.items()}
        n = sum(p.numel() for p in base.parameters() if p.requires_grad)
        h_med, h_mean = 1e3 * statistics.median(hook), 1e3 * statistics.mean(hook)
        for label, t in (("median", med), ("best run", best)):
            a, b, c = t["plain"], t["dp"], t["dp_acc"]
            print(f"{name:8s} {label:8s} {n:8d} {a:9.2f} {b:8.2f} {b / a:6.2f} {c:10.2f} {c / a:6.2f} "
                  f"{h_med:11.3f} {h_mean:7.3f}", flush=True)


if __name__ == "__main__":
    main()

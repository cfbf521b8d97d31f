"""Training that turns budget into accuracy: iterate averaging and a step-count learning-rate schedule.

* :class:`IterateAveraging` - a callback that keeps the running mean of the parameters after each optimizer step
  from a planned step on (Polyak-Ruppert tail averaging) and puts the mean into the module when training ends.
  DP-SGD's iterates are noisy around where the signal leads; their mean keeps the signal and divides the
  variance of the independent noise draws by about the number averaged. It is **post-processing**: a function of
  the noisy iterates (each of them already a DP release, Algorithm 2) and of the step counts, so it costs no
  privacy and the ledger's count is unchanged (the averaged model took exactly the noisy steps the last iterate
  took: the callback writes into the same module, whose ledger counts them).
* :func:`step_schedule` - warm-up then cosine (or linear) decay of the learning rate as a function of the step
  number and the planned number of steps only. A DP budget fixes the number of steps in advance (the noise
  multiplier is calibrated for it), so the schedule is data-independent: it reads no loss and no metric
  (a ``ReduceLROnPlateau`` on private losses would be a release outside the guarantee, trap 5).

Both depend on the planned number of optimizer steps, ``trainer.estimated_stepping_batches`` (from
``max_steps``/``max_epochs`` and the datamodule's steps per epoch: public).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import lightning as L
import torch

from lightning_dpts.errors import ConfigurationError

__all__ = ["IterateAveraging", "SCHEDULES", "planned_steps", "step_schedule"]

#: Learning-rate schedules of :func:`step_schedule`.
SCHEDULES: tuple[str, ...] = ("constant", "cosine", "linear")


def planned_steps(trainer: Any) -> int | None:
    """The Trainer's planned optimizer steps (``estimated_stepping_batches``), or ``None`` when unknown or infinite."""
    try:
        total = trainer.estimated_stepping_batches
    except (RuntimeError, AttributeError, TypeError):
        return None
    if not isinstance(total, (int, float)) or not math.isfinite(total) or total < 1:
        return None
    return int(total)


def _fraction(name: str, value: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not (
            (0.0 < value if low_open else 0.0 <= value) and value < 1.0):
        bound = "(0, 1)" if low_open else "[0, 1)"
        raise ConfigurationError(name, value, f"must be a number in {bound}")
    return float(value)


def step_schedule(optimizer: torch.optim.Optimizer, total_steps: int | None, kind: str = "cosine",
                  warmup: float = 0.05, final: float = 0.1) -> Any:
    """A ``LambdaLR`` whose factor depends on the step number only (module docstring).

    Args:
        optimizer: the optimizer whose learning rate(s) it scales.
        total_steps: planned optimizer steps (``None``: the schedule is constant).
        kind: ``"constant"``, ``"cosine"`` (half cosine from 1 to ``final``) or ``"linear"`` (1 to ``final``).
        warmup: share of the steps with a linear warm-up from ``1/warmup_steps`` to 1 (0: none), in [0, 1).
        final: the factor at the last planned step, in [0, 1).

    Returns:
        A ``torch.optim.lr_scheduler.LambdaLR`` to step once per optimizer step (``interval="step"``); past the
        planned steps the factor stays at ``final``.
    """
    if kind not in SCHEDULES:
        raise ConfigurationError("lr_schedule", kind, f"must be one of {', '.join(SCHEDULES)}")
    warmup = _fraction("warmup", warmup)
    final = _fraction("final", final)
    if kind == "constant" or total_steps is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ConfigurationError("total_steps", total_steps, "must be an integer >= 1")
    warm = int(round(warmup * total_steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = min(1.0, (step - warm) / max(1, total_steps - warm))
        shape = 0.5 * (1.0 + math.cos(math.pi * progress)) if kind == "cosine" else 1.0 - progress
        return final + (1.0 - final) * shape

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class IterateAveraging(L.Callback):
    """Tail averaging of the iterates (Polyak & Juditsky 1992): the module ends training at the mean of its
    parameters after each optimizer step from ``start`` on.

    Works with any LightningModule and with or without :class:`~lightning_dpts.training.DPForecastStrategy` (put
    it in the Trainer's callbacks; with the non-DP twin of a comparison use it too). The mean is kept in this
    callback's state, never in module buffers (a buffer that changes during a DP fit is refused, docs/privacy.md
    rule 9), and is saved with full checkpoints (``state_dict``), so that a resumed fit continues it. At the end of
    training it is copied into the module's parameters in place: what is evaluated, exported and checkpointed
    afterwards is the averaged model, and the module's privacy ledger (:mod:`lightning_dpts.training.ledger`)
    still counts every noisy step the iterates took. A checkpoint written *during* training holds the current
    iterate as the weights and the running mean in this callback's state.

    Privacy: the mean is post-processing of the noisy iterates (each parameter vector after a noisy step is a
    function of the DP releases so far), so it costs nothing beyond the steps the accountant counts.
    ``dp_post_processing = True`` declares this to the state guard of a DP fit: the checkpointed state of this
    callback is a function of the model's parameters (the noisy iterates) and of public settings (the step counts)
    only.

    Args:
        start: the first averaged step, as a share of the planned optimizer steps in [0, 1) (0.5: the last half;
            0: every step), or an integer step number >= 1. Without a planned total (unbounded training) a share
            counts from step 1.
    """

    dp_post_processing: ClassVar[bool] = True

    def __init__(self, start: float | int = 0.5) -> None:
        super().__init__()
        if isinstance(start, bool) or not isinstance(start, (int, float)):
            raise ConfigurationError("start", start, "must be a share in [0, 1) or an integer step >= 1")
        if isinstance(start, int) and start >= 1:
            self.start: float | int = start
        else:
            self.start = _fraction("start", float(start))
        self.count = 0
        self.first_step: int | None = None
        self._average: dict[str, torch.Tensor] | None = None
        self._last_step = -1

    @property
    def state_key(self) -> str:
        return f"IterateAveraging{{'start': {self.start!r}}}"

    def _first_step(self, trainer: L.Trainer) -> int:
        if isinstance(self.start, int):
            return self.start
        total = planned_steps(trainer)
        return 1 if total is None else max(1, int(math.floor(self.start * total)) + 1)

    @staticmethod
    def _params(pl_module: L.LightningModule) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in pl_module.named_parameters() if p.requires_grad}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.first_step is None:
            self.first_step = self._first_step(trainer)
        self._last_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step  # optimizer steps taken so far (this batch's step included)
        if step == self._last_step:  # no optimizer step on this batch (e.g. a skipped step)
            return
        self._last_step = step
        assert self.first_step is not None
        if step < self.first_step:
            return
        params = self._params(pl_module)
        with torch.no_grad():
            if self._average is None or set(self._average) != set(params):
                self._average = {name: p.detach().clone() for name, p in params.items()}
                self.count = 1
                return
            self.count += 1
            for name, p in params.items():
                self._average[name].add_(p.detach() - self._average[name], alpha=1.0 / self.count)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.apply(pl_module)

    def apply(self, pl_module: L.LightningModule) -> bool:
        """Copy the mean into ``pl_module``'s parameters in place (same tensors, so the module, its ledger and any
        optimizer keep referring to them); returns whether there was a mean to copy. Called at the end of
        training; call it yourself when a fit restored from a finished checkpoint skips training."""
        if self._average is None or self.count == 0:
            return False
        params = self._params(pl_module)
        missing = set(self._average) - set(params)
        if missing:
            raise ConfigurationError("pl_module", sorted(missing)[:3], "lacks parameters the average was taken over")
        with torch.no_grad():
            for name, value in self._average.items():
                params[name].copy_(value.to(device=params[name].device, dtype=params[name].dtype))
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "first_step": self.first_step,
                "average": None if self._average is None else {k: v.detach().cpu().clone()
                                                               for k, v in self._average.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.count = int(state_dict.get("count", 0))
        self.first_step = state_dict.get("first_step")
        average = state_dict.get("average")
        self._average = None if average is None else {k: v.clone() for k, v in average.items()}

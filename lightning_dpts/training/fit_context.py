"""What the parts of :class:`~lightning_dpts.training.DPForecastStrategy` share during a fit, in one owned object.

The strategy is composed of parts, each an object with its own state: :class:`~lightning_dpts.training.noisy_step.
NoisyStep` (the step's per-window gradients and its noise), :class:`~lightning_dpts.training.independence.WindowProbe`
and :class:`~lightning_dpts.training.independence.SpotCheck` (the fast path's evidence of independence) and
:class:`~lightning_dpts.training.ledger_wiring.FitLedger` (the privacy ledger and the checkpoint state). The facts
they all read - the trainable parameters and their per-window hooks, whether the fit computes each window alone,
Lambda, C, the ranks, the current batch - live in one :class:`FitContext` that the strategy owns and hands to them;
nothing else is shared.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn

from lightning_dpts.training.engine import PerWindowClipper

__all__ = ["FitContext"]


class FitContext:
    """The per-fit facts the strategy's parts share (set by the strategy; the parts read them and keep their own
    state elsewhere).

    Attributes:
        max_grad_norm: C, the l2 bound of one window's gradient.
        loss_reduction: ``"mean"`` or ``"sum"``, how ``training_step`` combines its windows' losses.
        per_window: the strategy's ``per_window`` option (``"auto"``, ``"fast"`` or ``"isolated"``).
        isolated: whether this fit computes each window's gradient alone (``per_window="isolated"``, or ``"auto"``
            after the probe found a mix before the first step).
        params: the trainable parameters DP training updates (:meth:`use_params`), with ``hooked_ids`` (their ids)
            and ``noise_numel`` (their number of coordinates: the size of a step's noise vector).
        clipper: the per-window gradient hooks on the module (:class:`PerWindowClipper`), ``None`` outside a fit.
        expected_batch_size: Lambda (read from the sampling spec at setup).
        noise_std: sigma * C, the std of the noise on the summed clipped gradient (set when the fit begins).
        rank, world_size: this process and the number of processes.
        batch: the current step's batch (to name the series of a window in errors).
        fit_steps: noisy steps taken in this fit; ``earlier_steps``: those the model's ledger held when it began.
    """

    def __init__(self, max_grad_norm: float, loss_reduction: str, per_window: str) -> None:
        self.max_grad_norm = max_grad_norm
        self.loss_reduction = loss_reduction
        self.per_window = per_window
        self.isolated = per_window == "isolated"
        self.params: list[nn.Parameter] = []
        self.hooked_ids: set[int] = set()
        self.noise_numel = 0
        self.clipper: PerWindowClipper | None = None
        self.expected_batch_size: int | None = None
        self.noise_std = 0.0
        self.rank, self.world_size = 0, 1
        self.batch: Any = None
        self.fit_steps = 0
        self.earlier_steps = 0

    def use_params(self, params: list[nn.Parameter]) -> None:
        """The parameters DP training updates (trainable when the per-window hooks were attached)."""
        self.params = params
        self.hooked_ids = {id(p) for p in params}
        self.noise_numel = sum(p.numel() for p in params)

    def clear(self) -> None:
        """Drop per-window state left from a previous pass (also after a forward pass without backward)."""
        if self.clipper is not None:
            self.clipper.clear(self.params)

    def start_batch(self, batch: Any) -> None:
        """A step's batch arrives: no per-window state or gradient of an earlier pass is left. Every hooked
        parameter's ``.grad`` is then written by this step alone (a parameter outside the optimizer keeps its last
        noisy ``.grad`` through ``zero_grad``; the trainable check would misread it)."""
        self.batch = batch
        self.clear()
        for p in self.params:
            p.grad = None

    def hooks_for_mode(self) -> None:
        """The fast path's hooks record this step's pass, unless each window is computed alone."""
        if self.clipper is not None:
            self.clipper.disable() if self.isolated else self.clipper.enable()

    def devices(self) -> list[int]:
        """The CUDA devices of the parameters (for ``torch.random.fork_rng``)."""
        return sorted({p.device.index or 0 for p in self.params if p.device.type == "cuda"})

    def param_names(self) -> list[str]:
        """The module's names of the trainable parameters, in gradient order."""
        assert self.clipper is not None
        return [self.clipper._names.get(id(p), f"#{k}") for k, p in enumerate(self.params)]

    def isolate(self) -> None:
        """Compute each window's gradient alone from now on (the fast path's hooks are switched off)."""
        self.isolated = True
        if self.clipper is not None:
            self.clipper.disable()

    def refusal_advice(self) -> str:
        """The fix a refusal of a window mix names."""
        done = (f" The {self.fit_steps} noisy step(s) this fit already took used the fast path: their privacy "
                "holds only if the forward kept windows apart on those batches." if self.fit_steps else "")
        return ("Remove batch statistics, batch-level scaling or cross-window operations from forward, or train with "
                "DPForecastStrategy(per_window='isolated'), which computes each window's gradient with that window "
                "alone." + done)

    def describe_windows(self, trainer: L.Trainer, windows: list[int]) -> str:
        """Error message naming the series of the windows (from the batch's ``series_index``)."""
        index = self.batch.get("series_index") if isinstance(self.batch, dict) else None
        names: list[str] = []
        if isinstance(index, torch.Tensor) and index.numel() > max(windows):
            ids = getattr(getattr(trainer, "datamodule", None), "item_ids", None)
            for w in windows:
                n = int(index[w])
                names.append(repr(ids[n]) if ids is not None and n < len(ids) else f"#{n}")
        where = f"series {', '.join(dict.fromkeys(names))}" if names else "(the batch has no 'series_index')"
        return (
            f"the per-window gradient of window(s) {windows} of the batch, {where}, is not finite (or its squared "
            "norm overflows): clipping cannot bound its contribution, so no step is taken. Check those series' "
            "values and the model's numerical stability (e.g. the loss on unscaled data)"
        )

"""What :class:`~lightning_dpts.training.DPForecastStrategy` changes on the module for a fit, and undoes after it.

:class:`ModelAttachment` (an object the strategy owns) swaps the layers Opacus cannot handle
(:func:`~lightning_dpts.training.surgery.make_private_compatible`), attaches the per-window hooks
(:class:`~lightning_dpts.training.engine.PerWindowClipper`) to the trainable parameters and wraps ``training_step``
(:meth:`~lightning_dpts.training.noisy_step.NoisyStep.wrap_training_step`) at ``setup``; takes the trainable set
again at ``on_fit_start`` (:meth:`ModelAttachment.refresh`); and puts everything back at the end of the fit
(:meth:`ModelAttachment.detach`), so that validation and prediction afterwards carry no DP overhead and
checkpoints load into the unmodified model.

:class:`StepCounter` (also owned by the strategy) enforces exactly one sampled batch per optimizer step and says
whether the next noisy step starts an epoch.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training.engine import PerWindowClipper
from lightning_dpts.training.fit_context import FitContext
from lightning_dpts.training.guards import check_layers_after_setup
from lightning_dpts.training.noisy_step import NoisyStep
from lightning_dpts.training.surgery import Surgery, make_private_compatible

__all__ = ["ModelAttachment", "StepCounter"]


class ModelAttachment:
    """The layer swaps, the per-window hooks and the wrapped ``training_step`` of one fit (state: the
    :attr:`surgery` and the ids of every parameter and submodule at ``setup``; the hooks and the trainable parameters
    are kept in the shared :class:`~lightning_dpts.training.fit_context.FitContext`)."""

    def __init__(self, context: FitContext, step: NoisyStep, scaler_default_scale: float) -> None:
        self.context = context
        self.step = step
        self.scaler_default_scale = scaler_default_scale
        self.surgery: Surgery | None = None
        self.param_ids: list[int] = []  # every parameter of the module at setup, trainable or not
        self.module_ids: list[int] = []  # every submodule at setup (after the layer swaps)

    def attach(self, pl_module: L.LightningModule) -> None:
        """At ``setup``: swap the layers (weights copied), attach the hooks, wrap ``training_step``."""
        self.surgery = make_private_compatible(pl_module, scaler_default_scale=self.scaler_default_scale)
        if self.surgery.swaps:
            rank_zero_info(f"DPForecastStrategy: swapped {', '.join(self.surgery.swapped)} (weights copied)")
        self.param_ids = [id(p) for p in pl_module.parameters()]
        self.module_ids = [id(m) for m in pl_module.modules()]
        self._hook_trainable(pl_module)
        self.step.wrap_training_step(pl_module)

    def refresh(self, pl_module: L.LightningModule) -> None:
        """Take the trainable parameters again at ``on_fit_start``, before any step, if they changed since
        ``setup``: the LightningModule's own ``setup`` hook, ``configure_model`` and callbacks listed after the
        strategy run later and may freeze or unfreeze layers (e.g. ``BaseFinetuning.freeze_before_training``). The
        hooks are attached again for the new set; from here on the set is fixed for the fit
        (:func:`~lightning_dpts.training.guards.check_trainable`). Only ``requires_grad`` may have changed:
        parameters created after ``setup`` (e.g. layers built in ``configure_model``) missed the layer swaps and
        the model checks: a new module with parameters or buffers is refused (one without, e.g. a torchmetrics
        metric built in ``setup``, is not; :func:`~lightning_dpts.training.guards.check_layers_after_setup`).
        """
        ctx = self.context
        assert ctx.clipper is not None
        check_layers_after_setup(pl_module, self.module_ids, self.param_ids)
        if [id(p) for p in pl_module.parameters() if p.requires_grad] == [id(p) for p in ctx.params]:
            return
        ctx.clipper.remove()
        ctx.clipper = None
        self._hook_trainable(pl_module)

    def _hook_trainable(self, pl_module: L.LightningModule) -> None:
        """Take the module's trainable parameters as those DP training updates, and attach the per-window hooks
        (:class:`PerWindowClipper`) for them."""
        ctx = self.context
        ctx.use_params([p for p in pl_module.parameters() if p.requires_grad])
        if not ctx.params:
            raise ConfigurationError("model", type(pl_module).__name__, "has no trainable parameters")
        ctx.clipper = PerWindowClipper(pl_module, loss_reduction=ctx.loss_reduction)

    def detach(self, pl_module: L.LightningModule) -> None:
        """Remove the hooks and the wrapper and put the original layers back (idempotent)."""
        ctx = self.context
        self.step.unwrap_training_step(pl_module)
        if ctx.clipper is not None:
            ctx.clipper.remove()
            ctx.clipper = None
        if self.surgery is not None:
            self.surgery.restore()
            self.surgery = None
        ctx.use_params([])


class StepCounter:
    """Exactly one sampled batch per optimizer step (gradient accumulation in any form is refused), and whether the
    next noisy step is the first of an epoch (the ledger counts epochs)."""

    def __init__(self) -> None:
        self.new_epoch = True  # the next noisy step counts a new epoch
        self.batches = 0  # batches started since the last optimizer step

    def begin(self) -> None:
        """A new fit."""
        self.new_epoch, self.batches = True, 0

    def batch_started(self, used: bool) -> None:
        """At ``on_train_batch_start`` (``used``: whether the previous batch reached ``training_step``)."""
        if self.batches >= 1 and not used:
            # the previous batch never reached training_step (the module's on_train_batch_start returned -1 to
            # skip the rest of the epoch, or its optimizer_step did not run the closure): nothing of it reached a
            # gradient (the strategy clears them) and no step was taken or accounted for it
            self.batches = 0
        if self.batches >= 1:
            raise ConfigurationError(
                "accumulate_grad_batches", self.batches + 1,
                "a second batch started before the optimizer step of the previous one (gradient accumulation, "
                "e.g. a GradientAccumulationScheduler): DP training needs exactly one sampled batch per "
                "optimizer step; raise the datamodule's batch_size instead",
            )
        self.batches += 1

    def check_step(self) -> None:
        """At ``on_before_optimizer_step``: the step has exactly one batch."""
        if self.batches != 1:
            raise ConfigurationError(
                "accumulate_grad_batches", self.batches,
                "DP training needs exactly one sampled batch per optimizer step",
            )

    def stepped(self) -> None:
        """After a noisy step."""
        self.new_epoch = False
        self.batches = 0

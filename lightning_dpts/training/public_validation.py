"""Choosing among the epochs of a DP fit with **public** validation data (issue 43).

Every epoch's weights are a post-processing of the noisy training, so picking the one with the lowest validation
loss costs no privacy *when the validation data is public*; on private validation data the loss, and the choice, are
releases outside the guarantee (trap 5 of the privacy notes). :class:`BestPublicEpoch` does what GluonTS' estimators
do with a ``ModelCheckpoint`` on ``val_loss``, in memory: nothing is written. Attach it only when the Trainer's
validation loader yields public windows (``PrivateEstimator.train(..., validation_is_public=True)`` does).
"""

from __future__ import annotations

import lightning as L
import torch

__all__ = ["BestPublicEpoch"]


class BestPublicEpoch(L.Callback):
    """Keep the parameters of the epoch with the lowest ``val_loss`` (in memory) and put them back at train end.

    Args:
        series: the number of public validation series (for :meth:`describe`).
        monitor: the logged validation metric (default ``"val_loss``, GluonTS' name).
    """

    def __init__(self, series: int, monitor: str = "val_loss") -> None:
        self.series = int(series)
        self.monitor = monitor
        self.best: float | None = None
        self.epoch: int | None = None
        #: the validation loss of every epoch scored, in order
        self.losses: list[float] = []
        self._state: dict[str, torch.Tensor] | None = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        loss = float(trainer.callback_metrics[self.monitor])
        self.losses.append(loss)
        if self.best is None or loss < self.best:
            self.best, self.epoch = loss, int(trainer.current_epoch)
            self._state = {n: p.detach().clone() for n, p in pl_module.named_parameters()}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._state is None:
            return
        with torch.no_grad():
            for name, param in pl_module.named_parameters():
                param.copy_(self._state[name])

    def describe(self) -> str:
        """What was chosen, in words (for reports)."""
        if self.epoch is None:
            return f"public: {self.series} series, not scored (no validation epoch ran)"
        return (f"public: {self.series} series; the weights of epoch {self.epoch + 1} (lowest {self.monitor} "
                f"{self.best:.4g}) are returned")

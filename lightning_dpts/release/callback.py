"""Lightning integration: privatise the inputs of ``predict_step`` (time-domain subsampling)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.release.mechanism import TimeDomainSubsampling

__all__ = ["PrivateInputCallback"]


class PrivateInputCallback(Callback):
    """Privatise input tensors of every predict batch in place, before ``predict_step`` sees them.

    Args:
        mechanism: the privatisation, applied to each row of a (B, T) tensor (time on the last axis).
        keys: batch keys to privatise (default ``("past_target",)``, GluonTS's context incl. lags). Nothing
            else in the batch may carry private values of the series.
        observed_key: if present in the batch, set to ones (imputation fills every step).
        seed: base seed; batch b of dataloader d uses ``numpy.random.default_rng([seed, d, b])``.

    Each predicted window is one release of its series: account it with
    :class:`~lightning_dpts.release.ReleaseAccountant` with ``context_length`` = the tensor's T.
    """

    def __init__(self, mechanism: TimeDomainSubsampling, keys: Sequence[str] = ("past_target",),
                 observed_key: str | None = "past_observed_values", seed: int = 0) -> None:
        super().__init__()
        if not isinstance(mechanism, TimeDomainSubsampling):
            raise ConfigurationError("mechanism", mechanism, "must be a TimeDomainSubsampling")
        self.mechanism = mechanism
        self.keys = tuple(keys)
        self.observed_key = observed_key
        self.seed = int(seed)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        rng = np.random.default_rng([self.seed, int(dataloader_idx), int(batch_idx)])
        for key in self.keys:
            if key not in batch:
                raise ConfigurationError("keys", key, "is not a key of the predict batch")
            tensor = batch[key]
            private = self.mechanism.privatize(tensor.detach().cpu().numpy(), rng)
            with torch.no_grad():
                tensor.copy_(torch.as_tensor(private, dtype=tensor.dtype))
        if self.observed_key is not None and self.observed_key in batch:
            with torch.no_grad():
                batch[self.observed_key].fill_(1)

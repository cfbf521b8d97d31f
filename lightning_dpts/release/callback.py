"""Lightning integration: privatise the inputs of ``predict_step`` (time-domain subsampling)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import Callback

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import SEEDED_NOTICE, Entropy, numpy_generator, resolve_entropy
from lightning_dpts.release.mechanism import TimeDomainSubsampling

__all__ = ["PrivateInputCallback"]


class PrivateInputCallback(Callback):
    """Privatise input tensors of every predict batch in place, before ``predict_step`` sees them.

    Args:
        mechanism: the privatisation, applied to each row of a (B, T) tensor (time on the last axis).
        keys: batch keys to privatise (default ``("past_target",)``, GluonTS's context incl. lags). Nothing
            else in the batch may carry private values of the series.
        observed_key: if present in the batch, set to ones (imputation fills every step).
        seed: ``None`` (default): every predict run draws fresh operating-system entropy, so no two runs share a
            mask or noise. An integer is for experiments only (warns with
            :data:`~lightning_dpts.randomness.SEEDED_NOTICE`); run k, batch b of dataloader d then use stream
            (k, d, b) of it, so repeated runs still differ from each other.

    Each predicted window is one release of its series: account it with
    :class:`~lightning_dpts.release.ReleaseAccountant` with ``context_length`` = the tensor's T.
    """

    def __init__(self, mechanism: TimeDomainSubsampling, keys: Sequence[str] = ("past_target",),
                 observed_key: str | None = "past_observed_values", seed: int | None = None) -> None:
        super().__init__()
        if not isinstance(mechanism, TimeDomainSubsampling):
            raise ConfigurationError("mechanism", mechanism, "must be a TimeDomainSubsampling")
        self.mechanism = mechanism
        self.keys = tuple(keys)
        self.observed_key = observed_key
        self._seed = seed
        self._entropy: Entropy = resolve_entropy(seed)
        self.seeded = self._entropy.seeded
        if self.seeded:
            warnings.warn(f"PrivateInputCallback(seed={seed}): {SEEDED_NOTICE}", UserWarning, stacklevel=2)
        self._run = -1

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._run += 1
        if not self.seeded:  # fresh secret for every predict run: nothing is ever replayed
            self._entropy = resolve_entropy(None)

    def state_dict(self) -> dict[str, Any]:
        return {}  # nothing that reproduces the masks or the noise is ever written

    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        rng = numpy_generator(self._entropy, max(self._run, 0), int(dataloader_idx), int(batch_idx))
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

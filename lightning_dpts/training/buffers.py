"""Buffers that change during a DP fit are refused (docs/privacy.md, "Buffers and checkpoints").

A buffer (``register_buffer``) is part of the model a DP fit releases - in every checkpoint, weights-only ones
included, and in every forecast the model makes - but DP training only clips and noises *gradients*. A buffer
that a layer updates from the windows it sees (running statistics, ``max(|x|)`` of the training inputs, a cache of
the last batch) is a noise-free function of the private data: released raw, it can tell neighbouring datasets
apart with certainty. :class:`BufferGuard` takes the module's buffers at the start of a DP fit and refuses, with
a :class:`~lightning_dpts.errors.ConfigurationError` naming the buffer, any that changes before the fit ends:

* at every optimizer step, before the step's update (:meth:`BufferGuard.check_step`: identity, version counter
  and data pointer of each buffer, with an exact comparison when one of them moved, so that an in-place write
  of the same value passes);
* in every ``state_dict()`` of the module, i.e. before any checkpoint is written, whatever saves it and whenever
  (after a validation forward, in a user's ``on_train_epoch_end``, ``ModelCheckpoint``, ``trainer.save_checkpoint``,
  ``torch.save(module.state_dict())``): an exact comparison (:meth:`BufferGuard.check`);
* at the end of training (exact), which also catches writes that bypass version counters (``buf.data.copy_``).

A module on which a changed buffer was found stays *tainted*: its guard stays attached, so its ``state_dict``
and a later DP fit are refused until the buffer holds its value from the start of the fit again. Buffers that
never change (constants, lags, scalers set before the fit) are allowed, whatever their value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training.ledger import GUARD_ATTRIBUTE, StateDictGuard, hook_state_dict

__all__ = ["GUARD_ATTRIBUTE", "BufferGuard", "guard_of"]


@dataclass
class _Buffer:
    """One buffer at the start of the fit: where it lives, the tensor object, its version and a copy."""

    name: str
    owner: nn.Module
    key: str
    tensor: torch.Tensor
    version: int
    pointer: int
    value: torch.Tensor


class BufferGuard(StateDictGuard):
    """The buffers of a module at the start of a DP fit; any that changes during the fit is refused.

    Args:
        module: the LightningModule being trained (after the strategy's layer swaps and any restored checkpoint).
    """

    def __init__(self, module: nn.Module) -> None:
        self.module_name = type(module).__name__
        self._buffers: list[_Buffer] = []
        self._counts: list[tuple[str, nn.Module, int]] = []  # every submodule's number of buffer slots
        for path, owner in module.named_modules():
            self._counts.append((path, owner, len(owner._buffers)))
            for key, tensor in owner._buffers.items():
                if tensor is None:
                    continue
                self._buffers.append(_Buffer(
                    name=f"{path}.{key}" if path else key, owner=owner, key=key, tensor=tensor,
                    version=tensor._version, pointer=tensor.data_ptr(), value=tensor.detach().clone(),
                ))

    @classmethod
    def start(cls, module: nn.Module) -> BufferGuard:
        """Refuse a module left tainted by an earlier fit, then guard ``module`` for this fit."""
        earlier = guard_of(module)
        if earlier is not None:
            earlier.check()
        guard = cls(module)
        object.__setattr__(module, GUARD_ATTRIBUTE, guard)
        hook_state_dict(module)  # every state_dict() of the module, hence every checkpoint, checks the buffers
        return guard

    def release(self, module: nn.Module) -> None:
        """Detach the guard from ``module`` at the end of a fit, unless a buffer changed (then it stays tainted)."""
        if guard_of(module) is self and not self.changed():
            object.__delattr__(module, GUARD_ATTRIBUTE)

    # ------------------------------------------------------------------------------------------------
    def check_step(self) -> None:
        """The per-step check: identity, version counter and data pointer of every buffer, and the number of
        buffer slots of every submodule; an exact comparison only where one of them moved."""
        for b in self._buffers:
            current = b.owner._buffers.get(b.key)
            if current is b.tensor and current._version == b.version and current.data_ptr() == b.pointer:
                continue
            if current is None or not _same(current, b.value):
                self._refuse([b.name])
            b.tensor, b.version, b.pointer = current, current._version, current.data_ptr()  # same value
        if any(len(owner._buffers) != count for _, owner, count in self._counts):
            self.check()

    def changed(self) -> list[str]:
        """The buffers whose value differs from the start of the fit, or that were added or removed (exact)."""
        names = [b.name for b in self._buffers
                 if (current := b.owner._buffers.get(b.key)) is None or not _same(current, b.value)]
        known = {(id(b.owner), b.key) for b in self._buffers}
        for path, owner, _ in self._counts:
            names += [f"{path}.{key}" if path else key for key, tensor in owner._buffers.items()
                      if tensor is not None and (id(owner), key) not in known]
        return names

    def check(self) -> None:
        """Raise :class:`ConfigurationError` if any buffer changed since the start of the fit (exact)."""
        names = self.changed()
        if names:
            self._refuse(names)

    def _refuse(self, names: list[str]) -> NoReturn:
        owners = {b.name: type(b.owner).__name__ for b in self._buffers}
        described = ", ".join(f"'{n}'" + (f" ({owners[n]})" if n in owners else " (registered during the fit)")
                              for n in names)
        raise ConfigurationError(
            "model", f"{self.module_name} buffer {described}",
            "changed during DP training. DP-SGD clips and noises gradients only: a buffer computed from the private "
            "windows (running statistics, a maximum of the inputs, a cache) is released raw, without noise, in "
            "every checkpoint (weights-only ones included) and every forecast, so it can tell neighbouring "
            "datasets apart (docs/privacy.md, 'Buffers and checkpoints'). The module's state_dict() refuses it too, so "
            "no checkpoint holds the changed value. Compute such a "
            "value before the fit (from public data or with its own DP release), make it a trainable parameter, "
            "or do not store it; buffers that stay constant during the fit are allowed",
        )


def guard_of(module: Any) -> BufferGuard | None:
    """The :class:`BufferGuard` attached to a module, or ``None``."""
    guard = getattr(module, GUARD_ATTRIBUTE, None)
    return guard if isinstance(guard, BufferGuard) else None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Exactly equal: same shape, dtype and device, and equal values (NaN equal to NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    return torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b])

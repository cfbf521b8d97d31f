"""Buffers that change during a DP fit are refused: now part of the state guard
(:mod:`lightning_dpts.training.state_guard`, which also covers metric states, callback state and plain tensor
attributes). Kept so that earlier imports work: ``BufferGuard`` is :class:`~lightning_dpts.training.state_guard.
StateGuard`."""

from __future__ import annotations

from lightning_dpts.training.state_guard import GUARD_ATTRIBUTE, StateGuard, guard_of

BufferGuard = StateGuard

__all__ = ["GUARD_ATTRIBUTE", "BufferGuard", "StateGuard", "guard_of"]

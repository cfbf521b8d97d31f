"""Exceptions shared by every layer of lightning-dpts."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigurationError", "TrainingRefused"]


class ConfigurationError(ValueError):
    """A parameter is outside the range the implementation (or the theorems behind it) supports.

    Attributes:
        parameter: the Python name of the offending parameter (e.g. ``"noise_multiplier"``). The command
            line maps it to its option name (``--noise-multiplier``).
        value: the rejected value.
        requirement: what would have been accepted, in words.
    """

    def __init__(self, parameter: str, value: Any, requirement: str) -> None:
        self.parameter = parameter
        self.value = value
        self.requirement = requirement
        super().__init__(f"{parameter}={value!r}: {requirement}")


class TrainingRefused(ConfigurationError):
    """A :class:`ConfigurationError` raised after training began (e.g. the spot check found a ``forward`` that mixes
    windows, or a model buffer changed): the run stopped before the refused step's update. ``dpts fit`` exits with
    status 3 for it, not 2 (input refused before any work).

    Attributes:
        steps: noisy steps the fit had taken before the refusal (each counted in the model's privacy ledger).
    """

    def __init__(self, parameter: str, value: Any, requirement: str, steps: int) -> None:
        super().__init__(parameter, value, requirement)
        self.steps = int(steps)

    @classmethod
    def after(cls, err: ConfigurationError, steps: int) -> TrainingRefused:
        """``err`` raised after ``steps`` noisy steps of a fit."""
        return cls(err.parameter, err.value, err.requirement, steps)

"""Exceptions shared by every layer of lightning-dpts."""

from __future__ import annotations

from typing import Any

__all__ = ["ConfigurationError"]


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

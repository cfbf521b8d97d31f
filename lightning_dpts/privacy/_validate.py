"""The one validation helper of the privacy layer's descriptions (specs, relations, mechanism objects).

Every check raises :class:`~lightning_dpts.errors.ConfigurationError` naming the field, the value and the accepted
range, so a refusal reads the same wherever it comes from.
"""

from __future__ import annotations

import math

from lightning_dpts.errors import ConfigurationError

__all__ = ["require_choice", "require_int", "require_nonnegative_float"]


def require_int(name: str, value: object, minimum: int) -> int:
    """``value`` if it is an integer (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, value, f"must be an integer >= {minimum}")
    if value < minimum:
        raise ConfigurationError(name, value, f"must be an integer >= {minimum}")
    return value


def require_nonnegative_float(name: str, value: object) -> float:
    """``float(value)`` if it is a finite number >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(name, value, "must be a finite number >= 0")
    if not math.isfinite(float(value)) or value < 0:
        raise ConfigurationError(name, value, "must be a finite number >= 0")
    return float(value)


def require_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``; the refusal lists them."""
    if value not in choices:
        raise ConfigurationError(name, value, f"must be one of {', '.join(repr(c) for c in choices)}")
    return str(value)

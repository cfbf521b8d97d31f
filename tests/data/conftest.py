"""Shared helpers for the data-layer tests."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

warnings.filterwarnings("ignore", category=FutureWarning)


def id_series(lengths: list[int]) -> list[np.ndarray]:
    """Series whose value at time j of series n is ``1000 * (n + 1) + j + 1`` (never 0, the padding value).

    A window's contents therefore reveal exactly which series and time steps it holds.
    """
    return [1000.0 * (n + 1) + np.arange(length) + 1.0 for n, length in enumerate(lengths)]


@pytest.fixture
def ids() -> list[np.ndarray]:
    """20 series of lengths 60..79."""
    return id_series([60 + n for n in range(20)])

"""Shared helpers for the data-layer tests."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from lightning_dpts.data import StructuredSubsamplingDataModule

warnings.filterwarnings("ignore", category=FutureWarning)


P_LEN, L_F = 8, 4  # past window and horizon of the small datamodules the data tests build


def make_dm(series, *, quiet_seed: bool = False, **kw) -> StructuredSubsamplingDataModule:
    """A small datamodule over ``series`` (past 8, horizon 4, batch 4, no test window unless given).

    ``quiet_seed`` silences the seeded-run notice (tests that seed on purpose); every other warning stays.
    """
    kw.setdefault("context_length", P_LEN)
    kw.setdefault("prediction_length", L_F)
    kw.setdefault("batch_size", 4)
    kw.setdefault("test_windows", 0)
    with warnings.catch_warnings():
        if quiet_seed:
            warnings.filterwarnings("ignore", message=".*explicit seed")
        return StructuredSubsamplingDataModule(series, **kw)


def id_series(lengths: list[int]) -> list[np.ndarray]:
    """Series whose value at time j of series n is ``1000 * (n + 1) + j + 1`` (never 0, the padding value).

    A window's contents therefore reveal exactly which series and time steps it holds.
    """
    return [1000.0 * (n + 1) + np.arange(length) + 1.0 for n, length in enumerate(lengths)]


@pytest.fixture
def ids() -> list[np.ndarray]:
    """20 series of lengths 60..79."""
    return id_series([60 + n for n in range(20)])

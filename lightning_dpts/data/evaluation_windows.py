"""The deterministic held-out windows of :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`: which
windows each split holds (the last ``test_windows`` windows of every series, the ``val_windows`` before them), the
:class:`EvaluationWindow` records to score forecasts with, and the same windows as GluonTS ``(input, label)`` pairs.
No training randomness is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.data.sources import SeriesCollection
from lightning_dpts.errors import ConfigurationError

__all__ = ["EvaluationWindow", "gluonts_pairs", "split_windows", "windows_of"]


@dataclass(frozen=True)
class EvaluationWindow:
    """One forecast to score: the history before the forecast start and the ground truth after it.

    Attributes:
        item_id: the series' identifier.
        series_index: position of the series in the datamodule (after dropping short series).
        window: 0-based index of the rolling window within its split (0 = earliest).
        start: first time stamp of the series, or ``None`` when the input had no time stamps.
        forecast_start: first time stamp of the forecast, or ``None``.
        history: every value before the forecast start, ``[t]`` (univariate) or ``[t, D]``; NaN = missing.
        target: the ``prediction_length`` true values, ``[L_F]`` or ``[L_F, D]``.
    """

    item_id: str
    series_index: int
    window: int
    start: pd.Period | None
    forecast_start: pd.Period | None
    history: np.ndarray
    target: np.ndarray


def split_windows(train_lengths: np.ndarray, prediction_length: int, val_windows: int, test_windows: int,
                  split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, forecast starts, window number) of the deterministic windows of ``split`` (``"val"`` or ``"test"``)."""
    if split == "val":
        first, count = 0, val_windows
    elif split == "test":
        first, count = val_windows, test_windows
    else:
        raise ConfigurationError("split", split, "must be 'val' or 'test'")
    num = len(train_lengths)
    rows = np.repeat(np.arange(num, dtype=np.int64), count)
    window = np.tile(np.arange(count, dtype=np.int64), num)
    starts = train_lengths[rows] + (first + window) * prediction_length
    return rows, starts, window


def windows_of(collection: SeriesCollection, rows: np.ndarray, starts: np.ndarray, window: np.ndarray,
               prediction_length: int) -> list[EvaluationWindow]:
    """The :class:`EvaluationWindow` of each (row, forecast start, window number), in that order."""
    out = []
    squeeze = collection.univariate
    for row, start, w in zip(rows.tolist(), starts.tolist(), window.tolist(), strict=True):
        series = collection.targets[row]
        first = None if collection.starts is None else collection.starts[row]
        history = series[:start]
        truth = series[start : start + prediction_length]
        out.append(
            EvaluationWindow(
                item_id=collection.item_ids[row],
                series_index=row,
                window=w,
                start=first,
                forecast_start=None if first is None else first + start,
                history=history[:, 0] if squeeze else history,
                target=truth[:, 0] if squeeze else truth,
            )
        )
    return out


def gluonts_pairs(windows: list[EvaluationWindow], collection: SeriesCollection, static_cat: np.ndarray,
                  static_real: np.ndarray, prediction_length: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """GluonTS-style ``(input entry, label entry)`` pairs of ``windows`` (as ``gluonts.dataset.split`` produces)."""
    pairs = []
    for w in windows:
        n = w.series_index
        history = w.history if collection.univariate else w.history.T
        entry: dict[str, Any] = {
            "target": np.asarray(history, dtype=np.float32),
            "start": w.start,
            "item_id": w.item_id,
            "feat_static_cat": static_cat[n],
            "feat_static_real": static_real[n],
        }
        if collection.feat_dynamic_real is not None:
            stop = len(w.history) + prediction_length
            entry["feat_dynamic_real"] = np.asarray(collection.feat_dynamic_real[n][:stop].T, np.float32)
        label = {
            "target": w.target if collection.univariate else w.target.T,
            "start": w.forecast_start,
            "item_id": w.item_id,
        }
        pairs.append((entry, label))
    return pairs

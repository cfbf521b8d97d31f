"""Deterministic validation/test windows and what evaluation needs to score forecasts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_dpts.data import StructuredSubsamplingDataModule

from .conftest import id_series

P_LEN, L_F = 8, 4


def make(**kw) -> tuple[StructuredSubsamplingDataModule, list[np.ndarray]]:
    series = id_series([30, 41, 52])
    entries = [
        {"target": s, "start": pd.Period("2010-01", freq="M") + 3 * i, "item_id": f"id{i}"}
        for i, s in enumerate(series)
    ]
    kw = {"context_length": P_LEN, "prediction_length": L_F, "batch_size": 2, **kw}
    return StructuredSubsamplingDataModule(entries, **kw), series


def test_split_lengths_and_eval_windows():
    dm, series = make(test_windows=2, val_windows=1)
    held = 3 * L_F
    assert dm.train_lengths.tolist() == [len(s) - held for s in series]
    test = dm.evaluation_windows("test")
    val = dm.evaluation_windows("val")
    assert len(test) == 3 * 2 and len(val) == 3
    for w in test:
        s = series[w.series_index]
        np.testing.assert_array_equal(w.history, s[: len(w.history)])
        assert len(w.history) == len(s) - held + (1 + w.window) * L_F
        np.testing.assert_array_equal(w.target, s[len(w.history) : len(w.history) + L_F])
        assert w.forecast_start == w.start + len(w.history)
        assert w.item_id == f"id{w.series_index}"
    last = [w for w in test if w.window == 1]
    for w in last:  # the last test window ends at the end of the series
        np.testing.assert_array_equal(w.target, series[w.series_index][-L_F:])
    for w in val:  # the validation window directly follows the training part
        assert len(w.history) == dm.train_lengths[w.series_index]


def test_eval_loaders_are_deterministic_and_match_windows():
    dm, series = make(test_windows=2, val_windows=1)
    for split, loader_fn in [("test", dm.test_dataloader), ("val", dm.val_dataloader)]:
        first = list(loader_fn())
        again = list(loader_fn())
        windows = dm.evaluation_windows(split)
        future = torch.cat([b["future_target"] for b in first])
        past = torch.cat([b["past_target"] for b in first])
        assert len(future) == len(windows)
        for b1, b2 in zip(first, again, strict=True):
            for key in b1:
                torch.testing.assert_close(b1[key], b2[key])
        for i, w in enumerate(windows):
            np.testing.assert_array_equal(future[i].numpy(), w.target)
            np.testing.assert_array_equal(past[i].numpy(), w.history[-P_LEN:])


def test_no_validation_by_default_and_gluonts_pairs():
    dm, series = make()
    assert dm.val_windows == 0
    assert not is_overridden("val_dataloader", dm) and is_overridden("test_dataloader", dm)  # no val loop
    pairs = dm.gluonts_test_pairs()
    assert len(pairs) == 3
    entry, label = pairs[1]
    np.testing.assert_array_equal(entry["target"], series[1][:-L_F])
    np.testing.assert_array_equal(label["target"], series[1][-L_F:])
    assert entry["start"] == pd.Period("2010-04", freq="M") and entry["item_id"] == "id1"
    assert label["start"] == entry["start"] + len(entry["target"])

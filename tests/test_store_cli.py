"""``dpts fit`` and ``dpts predict`` read a series store (``.arrow``; issue 41) as they read the CSV it came from,
and write no copy of it among the run's files (a store is a private input). Slow: one small fit."""

from __future__ import annotations

import pandas as pd
import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.data.store import SeriesStore, store_from_file


@pytest.mark.slow
def test_fit_and_predict_from_a_store(tiny_csv, tmp_path) -> None:
    private = tmp_path / "private-data"
    private.mkdir()
    store = store_from_file(tiny_csv, private / "tiny.arrow")
    out = tmp_path / "run"
    assert main(["fit", "--data", str(store.path), "--prediction-length", "6", "--model", "simple_feedforward",
                 "--epsilon", "2.0", "--delta", "1e-6", "--epochs", "2", "--batch-size", "8",
                 "--output-dir", str(out)]) == 0
    written = [p for p in out.rglob("*") if p.is_file()]
    assert not any(p.suffix in (".arrow", ".feather") for p in written)
    forecasts = tmp_path / "forecasts.csv"
    assert main(["predict", "--model", str(out), "--data", str(store.path), "--output", str(forecasts)]) == 0
    table = pd.read_csv(forecasts)
    assert set(table["item_id"]) == set(SeriesStore(store.path).item_ids)
    assert table.groupby("item_id").size().eq(6).all()

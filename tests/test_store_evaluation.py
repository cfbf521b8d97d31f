"""``dpts fit`` on a series store streams its evaluation from the mapped store (issue 41): the held-out histories
reach the scoring and the baselines as views of the mapping, never as per-window copies, and the job never builds
the long table. Memory is bounded by counting the bytes Python allocates (tracemalloc), not by RSS or time."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.scoring import baseline_forecasts, score_models
from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.data.store import SeriesStore, SeriesStoreWriter


def _store(path, series: int, length: int) -> SeriesStore:
    rng = np.random.default_rng(0)
    start = pd.Period("2020-01-01 00:00", freq="h")
    with SeriesStoreWriter(path, "h") as writer:
        for n in range(series):
            values = 10 + np.sin(np.arange(length) * 2 * np.pi / 24) + rng.normal(0, 0.1, length)
            values[rng.random(length) < 0.01] = np.nan
            writer.add(f"s{n}", values, start)
    return SeriesStore(path)


def test_evaluation_allocates_o_windows_not_o_values(tmp_path) -> None:
    """Scoring and seasonal naive over every test window of a 2 M-value store (8 MB as float32) allocate at most
    1/4 of the raw size: one window's float64 temporaries at a time (a few x 160 KB) plus O(windows) small arrays.
    Copying the histories (float64, as before issue 41) would allocate 2x the raw size."""
    store = _store(tmp_path / "s.arrow", 100, 20_000)
    horizon = 12
    dm = StructuredSubsamplingDataModule(store, context_length=24, prediction_length=horizon, batch_size=8,
                                         test_windows=2)
    pairs = dm.gluonts_test_pairs("test")
    inputs = [p[0] for p in pairs]
    labels = [np.asarray(p[1]["target"], dtype=float) for p in pairs]
    assert all(np.shares_memory(entry["target"], store.values) for entry in inputs)  # views, not copies
    windows = [w.window for w in dm.evaluation_windows("test")]
    warm, _ = baseline_forecasts(inputs[:1], horizon, 24, statsforecast=False)  # the imports, before counting
    score_models({"a": warm["seasonal_naive"]}, labels[:1], inputs[:1], windows[:1], 24)
    tracemalloc.start()
    try:
        forecasts, _ = baseline_forecasts(inputs, horizon, 24, statsforecast=False)
        metrics = score_models({"a": forecasts["seasonal_naive"]}, labels, inputs, windows, 24)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert metrics["a"]["forecasts"] == 200
    assert peak < store.nbytes / 4, (peak, store.nbytes)


@pytest.mark.slow
def test_fit_from_a_store_never_builds_the_table_and_matches_it(tiny_csv, tmp_path, monkeypatch) -> None:
    """The same seeded run from the mapped store and from the store's long table (the path before issue 41)
    reports the same epsilon and the same held-out metrics; the store run never calls ``to_frame``."""
    import lightning_dpts.app.jobs.fit as fit
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.data.loading import load_fit_table
    from lightning_dpts.data.store import store_from_file

    store = store_from_file(tiny_csv, tmp_path / "tiny.arrow")
    options = dict(data=str(store.path), prediction_length=6, model="simple_feedforward", epsilon=2.0, delta=1e-6,
                   epochs=2, batch_size=8, seed=3, baselines=False, private_plots=False)
    with pytest.warns(UserWarning):
        with monkeypatch.context() as patch:
            patch.setattr(fit, "_read_input", load_fit_table)  # the long table (before issue 41)
            table_run = fit.run_fit(FitConfig(output_dir=str(tmp_path / "table"), **options), progress=lambda _: None)

    def refuse(self):
        raise AssertionError("the store run built the long table")

    monkeypatch.setattr(SeriesStore, "to_frame", refuse)
    with pytest.warns(UserWarning):
        store_run = fit.run_fit(FitConfig(output_dir=str(tmp_path / "store"), **options), progress=lambda _: None)
    assert store_run["epsilon"] == table_run["epsilon"]
    assert store_run["private"]["metrics"] == table_run["private"]["metrics"]

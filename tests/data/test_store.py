"""The memory-mapped Arrow series store (issue 41): round trips, the datamodule's windows from it, its privacy as an
input (nothing a run writes or pickles carries its values) and an accountant whose work is flat in the number of
series. Fast: small stores in ``tmp_path``; the large measurements are benchmarks/scale.py."""

from __future__ import annotations

import pickle
import warnings

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

import lightning_dpts.privacy.bounds as bounds
from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.data.sampler import WindowStore
from lightning_dpts.data.store import SeriesStore, SeriesStoreWriter, StoreWindows, store_from_file, write_store
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import StructuredSubsamplingAccountant


def _long_frame(seed: int = 0) -> pd.DataFrame:
    """Hourly series of different lengths and starts, with missing values."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, n in enumerate([60, 90, 75, 120]):
        values = rng.standard_normal(n) * 10 ** i
        values[[3, n // 2]] = np.nan
        stamps = pd.date_range(pd.Timestamp("2021-03-27") + pd.Timedelta(hours=5 * i), periods=n, freq="h")
        parts.append(pd.DataFrame({"item_id": f"sensor {i}", "timestamp": stamps, "target": values}))
    return pd.concat(parts, ignore_index=True)


def _as_float32(frame: pd.DataFrame) -> np.ndarray:
    return frame["target"].to_numpy().astype(np.float32)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_long_file_round_trips_through_the_store(tmp_path, suffix) -> None:
    frame = _long_frame()
    source = tmp_path / f"data{suffix}"
    frame.to_parquet(source) if suffix == ".parquet" else frame.to_csv(source, index=False)
    store = store_from_file(source, tmp_path / "data.arrow")
    assert store.freq == "h" and store.num_series == 4 and store.item_ids == [f"sensor {i}" for i in range(4)]
    back = store.to_frame()
    np.testing.assert_array_equal(back["target"].to_numpy().astype(np.float32), _as_float32(frame))
    assert (back["timestamp"].dt.to_timestamp() == frame["timestamp"]).all()
    assert list(back["item_id"]) == list(frame["item_id"])
    # and back out to Parquet: the same table again
    back.assign(timestamp=back["timestamp"].dt.to_timestamp()).to_parquet(tmp_path / "again.parquet")
    again = store_from_file(tmp_path / "again.parquet", tmp_path / "again.arrow")
    np.testing.assert_array_equal(again.values[again.offsets[0]:], store.values[store.offsets[0]:])
    assert again.item_ids == store.item_ids and np.array_equal(again.start_ordinals, store.start_ordinals)


def test_wide_parquet_round_trips_with_ragged_starts(tmp_path) -> None:
    frame = _long_frame()
    wide = frame.pivot(index="timestamp", columns="item_id", values="target").reset_index()
    wide.to_parquet(tmp_path / "wide.parquet")
    store = store_from_file(tmp_path / "wide.parquet", tmp_path / "wide.arrow")
    assert list(store.lengths) == [60, 90, 75, 120]  # leading and trailing gaps of a column are not its series
    for n, (_, part) in enumerate(frame.groupby("item_id", sort=True)):
        np.testing.assert_array_equal(store.series(n), _as_float32(part))
        assert store.starts[n].to_timestamp() == part["timestamp"].iloc[0]


def test_series_are_views_of_one_mapping_across_record_batches(tmp_path) -> None:
    rng = np.random.default_rng(1)
    series = [rng.standard_normal(n) for n in (50, 80, 30, 7)]
    store = write_store(series, tmp_path / "s.arrow", chunk_values=60)  # 3 record batches
    for n, values in enumerate(series):
        view = store.series(n)
        np.testing.assert_array_equal(view, values.astype(np.float32))
        assert np.shares_memory(view, store.values) and not view.flags.writeable
    assert not store.values.flags.owndata and store.nbytes == 4 * 167
    subset = store.subset([3, 0])
    assert subset.item_ids == ["3", "0"] and np.shares_memory(subset.series(0), store.values)


def test_store_windows_equal_the_padded_window_store(tmp_path) -> None:
    rng = np.random.default_rng(2)
    series = [rng.standard_normal(n) for n in (40, 25, 33)]
    series[1][[0, 10, 24]] = np.nan
    store = write_store(series, tmp_path / "s.arrow", chunk_values=30)
    padded = WindowStore([s[:, None] for s in series], 12, 5)
    mapped = StoreWindows(store, store.lengths, 12, 5)
    rows = np.repeat(np.arange(3), 21)
    starts = np.concatenate([np.arange(21) % t for t in padded.num_start_positions])
    ours, theirs = mapped.gather(rows, starts), padded.gather(rows, starts)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        np.testing.assert_array_equal(ours[key], theirs[key])


def test_datamodule_from_a_store_yields_the_in_memory_batches(tmp_path) -> None:
    frame = _long_frame()
    frame["timestamp"] = frame["timestamp"].dt.to_period("h")
    write_store(frame, tmp_path / "s.arrow", chunk_values=100)
    kw = dict(context_length=12, prediction_length=4, batch_size=4, instances_per_series=2, seed=3, val_windows=1,
              test_windows=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        memory = StructuredSubsamplingDataModule(frame, **kw)
        mapped = StructuredSubsamplingDataModule(str(tmp_path / "s.arrow"), **kw)
    assert "past_time_feat" in mapped.keys and mapped.sampling_spec == memory.sampling_spec
    for epoch in range(2):
        for step in range(memory.steps_per_epoch):
            a, b = memory.train_batch(epoch, step), mapped.train_batch(epoch, step)
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    for split in ("val", "test"):
        for a, b in zip(memory._eval_loader(split), mapped._eval_loader(split), strict=True):
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
        for a, b in zip(memory.evaluation_windows(split), mapped.evaluation_windows(split), strict=True):
            assert (a.item_id, a.forecast_start, a.window) == (b.item_id, b.forecast_start, b.window)
            np.testing.assert_array_equal(a.history.astype(np.float32), b.history)


def test_bad_stores_and_inputs_are_refused_before_any_work(tmp_path) -> None:
    with pytest.raises(ConfigurationError, match="finite"):
        write_store([np.array([1.0, np.inf])], tmp_path / "a.arrow")
    assert not (tmp_path / "a.arrow").exists() and not list(tmp_path.iterdir())  # no partial file left
    with pytest.raises(ConfigurationError, match="float32"):
        write_store([np.array([1.0, 1e39])], tmp_path / "a.arrow")
    with pytest.raises(ConfigurationError, match="univariate"):
        write_store([np.ones((5, 2))], tmp_path / "a.arrow")
    import pyarrow as pa
    import pyarrow.feather as feather

    feather.write_feather(pa.table({"x": [1.0]}), tmp_path / "other.arrow")
    with pytest.raises(ConfigurationError, match="not a lightning_dpts series store"):
        SeriesStore(tmp_path / "other.arrow")
    write_store([np.arange(30.0)], tmp_path / "ok.arrow")
    with pytest.raises(ConfigurationError, match="exists"):
        write_store([np.arange(30.0)], tmp_path / "ok.arrow")
    with pytest.raises(ConfigurationError) as err:
        StructuredSubsamplingDataModule(str(tmp_path / "ok.arrow"), context_length=4, prediction_length=2,
                                        batch_size=1, freq="D")
    assert err.value.parameter == "freq"


def _private_runs(values: np.ndarray, width: int = 4) -> set[bytes]:
    """Every run of ``width`` consecutive float32 values of the data, as bytes (what a leak would contain)."""
    raw = values.astype(np.float32).tobytes()
    return {raw[4 * i: 4 * (i + width)] for i in range(len(values) - width + 1)}


def _leaks(blob: bytes, runs: set[bytes], width: int = 16) -> int:
    return sum(blob[i: i + width] in runs for i in range(len(blob) - width + 1))


def test_attacker_reading_what_a_fit_writes_or_pickles_finds_no_store_values(tmp_path) -> None:
    """The store is a private input. An attacker who reads the checkpoint of a DP fit from it, and the bytes that
    travel to DataLoader workers (the pickled datamodule pieces), must not find the values: the store pickles its
    index only (a worker re-maps the file). Would fail if the mapped values were pickled (numpy pickles a view's
    data) or written into a checkpoint."""
    from lightning_dpts.training import DPForecastStrategy
    from tests.training.ddp_worker import CLIP, CONTEXT, HORIZON, SIGMA, Tiny, series

    data = series()
    (tmp_path / "private").mkdir()
    store = write_store(data, tmp_path / "private" / "data.arrow")
    runs = set().union(*(_private_runs(v) for v in data))
    assert _leaks(store.values.tobytes(), runs) > 0  # the detector sees the values where they are

    pickled = pickle.dumps(store)
    assert _leaks(pickled, runs) == 0
    clone = pickle.loads(pickled)
    np.testing.assert_array_equal(clone.series(3), store.series(3))  # the worker's copy re-maps the same file

    dm = StructuredSubsamplingDataModule(str(store.path), context_length=CONTEXT, prediction_length=HORIZON,
                                         batch_size=8, instances_per_series=2, test_windows=0)
    assert _leaks(pickle.dumps(dm.sampler.store), runs) == 0
    out = tmp_path / "public"
    strategy = DPForecastStrategy(noise_multiplier=SIGMA, max_grad_norm=CLIP, require_accountant=False)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=3, callbacks=[strategy], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=out)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), datamodule=dm)
    trainer.save_checkpoint(out / "model.ckpt")
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and all(_leaks(p.read_bytes(), runs) == 0 for p in written)
    assert not any(p.suffix == ".arrow" for p in written)


def _count_profiles(monkeypatch) -> dict[str, int]:
    calls = {"profiles": 0}
    for name in ("_single_length_profile", "_poisson_unit_profile"):
        original = getattr(bounds, name)

        def counted(*args, _original=original, **kwargs):
            calls["profiles"] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(bounds, name, counted)
    return calls


@pytest.mark.parametrize("bottom", ["with_replacement", "poisson"])
def test_accountant_work_is_flat_in_the_number_of_series(tmp_path, monkeypatch, bottom) -> None:
    """10^5 series with 10^3 distinct lengths cost the accountant what 10^3 series with those lengths cost: the
    spec carries the distinct lengths only, and the privacy profiles evaluated are counted (not timed)."""
    calls = _count_profiles(monkeypatch)
    work = {}
    for num in (10**3, 10**5):
        path = tmp_path / f"s{num}.arrow"
        lengths = np.where(np.arange(num) < 1000, 30 + np.arange(num), 30 + np.arange(num) % 7)  # 1000 distinct
        block = np.random.default_rng(0).standard_normal(int(lengths.max())).astype(np.float32)
        with SeriesStoreWriter(path) as writer:
            for n, size in enumerate(lengths.tolist()):
                writer.add(n, block[:size])
        dm = StructuredSubsamplingDataModule(str(path), context_length=200, prediction_length=4, batch_size=64,
                                             bottom_level=bottom, test_windows=1)
        spec = dm.sampling_spec
        assert spec.num_series == num and len(spec.distinct_lengths) == 1000
        calls["profiles"] = 0
        accountant = StructuredSubsamplingAccountant(spec, 2.0)
        if bottom == "with_replacement":  # composing the 48-member Poisson profile takes ~30 s: benchmarks/scale.py
            accountant.epsilon(100, 1e-6)
        work[num] = calls["profiles"]
    # with replacement the shortest series decides (1 profile); Poisson: the lengths with lambda < T < k_max = 204
    # are the members, grouped into MAX_LENGTH_MEMBERS runs (plus one validation call)
    assert work[10**5] == work[10**3] == (1 if bottom == "with_replacement" else bounds.MAX_LENGTH_MEMBERS + 1)


def test_jobs_read_a_store_as_they_read_the_parquet_file(tmp_path) -> None:
    """``dpts fit/predict --data x.arrow``: the table the jobs read from a store is the one they read from the
    Parquet file it was converted from."""
    from lightning_dpts.data.loading import load_long_table

    frame = _long_frame()
    frame.to_parquet(tmp_path / "data.parquet")
    store_from_file(tmp_path / "data.parquet", tmp_path / "data.arrow")
    direct, freq = load_long_table(tmp_path / "data.parquet")
    mapped, freq_mapped = load_long_table(tmp_path / "data.arrow")
    assert freq == freq_mapped == "h"
    pd.testing.assert_series_equal(mapped["item_id"], direct["item_id"])
    pd.testing.assert_series_equal(mapped["timestamp"], direct["timestamp"])
    np.testing.assert_array_equal(mapped["target"].to_numpy(), direct["target"].to_numpy().astype(np.float32))
    with pytest.raises(ConfigurationError) as err:
        load_long_table(tmp_path / "data.arrow", freq="D")
    assert err.value.parameter == "freq"
    # the fit samples from the mapped store only for the very table read from it: a clipped (or filtered) table is
    # another object and keeps its own values (training on the unclipped store would break the value bound)
    from lightning_dpts.data.loading import drop_short_series, store_of

    assert isinstance(store_of(mapped), SeriesStore) and store_of(direct) is None
    assert store_of(mapped.assign(target=mapped["target"].clip(-1, 1))) is None
    assert store_of(drop_short_series(mapped, 80)[0]) is None and store_of(drop_short_series(mapped, 1)[0]) is not None



def test_fit_reads_series_lengths_without_building_the_series(tmp_path) -> None:
    """``dpts fit`` chooses its test windows from the lengths (first to last stamp, gaps included): read from the
    table's ordinals or the store's index, equal to the lengths of the series the datamodule builds."""
    from lightning_dpts.app.geometry import _series_spans
    from lightning_dpts.data.loading import load_long_table
    from lightning_dpts.data.sources import to_collection

    frame = _long_frame().drop(index=[5, 6, 7, 100, 200])  # missing time stamps inside two series
    frame.to_parquet(tmp_path / "gaps.parquet")
    table, freq = load_long_table(tmp_path / "gaps.parquet", freq="h")
    built = [len(t) for t in to_collection(table, freq=freq).targets]
    assert _series_spans(table, freq) == built == [60, 90, 75, 120]
    store_from_file(tmp_path / "gaps.parquet", tmp_path / "gaps.arrow", freq="h")
    assert _series_spans(load_long_table(tmp_path / "gaps.arrow")[0], freq) == built


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
@pytest.mark.parametrize("interleaved", [False, True])
def test_long_files_convert_batch_by_batch_or_whole_alike(tmp_path, suffix, interleaved) -> None:
    """Rows of each series together: converted in record batches (a series split across batches is joined);
    interleaved series are detected and the file is read whole. Either way the store of the whole table."""
    frame = _long_frame(seed=4)
    if interleaved:
        frame = frame.sample(frac=1.0, random_state=0).reset_index(drop=True)
    source = tmp_path / f"data{suffix}"
    frame.to_parquet(source, row_group_size=50) if suffix == ".parquet" else frame.to_csv(source, index=False)
    store = store_from_file(source, tmp_path / "data.arrow", batch_rows=37)
    reference = write_store(_long_frame(seed=4).assign(timestamp=lambda f: f["timestamp"].dt.to_period("h")),
                            tmp_path / "reference.arrow")
    order = [reference.item_ids.index(i) for i in store.item_ids]
    for n, m in enumerate(order):
        np.testing.assert_array_equal(store.series(n), reference.series(m))
        assert store.starts[n] == reference.starts[m]
    assert sorted(store.item_ids) == sorted(reference.item_ids)

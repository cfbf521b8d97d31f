"""A memory-mapped Arrow store of a series collection: data larger than the Python objects that hold it.

The store is one uncompressed Arrow IPC file (``.arrow``, the Feather v2 format) with one row per series:

* ``item_id`` (string), ``start`` (int64 period ordinal of the first value at the store's ``freq``, null when the
  data have no time stamps) and ``target`` (``large_list<float32>``: the values of every series back to back in
  one float32 buffer per record batch, with one int64 offset per series; NaN = missing);
* schema metadata ``lightning_dpts.store`` (format version) and ``freq``.

:class:`SeriesStore` maps the file (``pyarrow.memory_map``) and sees every value through one numpy float32 view of
the mapping: series ``n`` is ``values[offsets[n] : offsets[n] + lengths[n]]``, a view, never a copy. The
operating system pages in what a batch touches and shares the pages between processes (DDP ranks on one node map
the same file), so the resident memory of a fit is at most the raw float32 size of the data, whatever the number
of series. :class:`StoreWindows` gathers training and evaluation windows from the view with index arithmetic
(the same windows as :class:`~lightning_dpts.data.sampler.WindowStore`, without its padded copies), which is what
:class:`~lightning_dpts.data.StructuredSubsamplingDataModule` samples from when it is given a store.

Writing: :class:`SeriesStoreWriter` (streaming, one series at a time, constant memory), :func:`write_store` (any
input the datamodule accepts) and :func:`store_from_file` (long-format Parquet/CSV: item id, time stamp, value;
or wide: one time stamp column and one column per series).

A store holds the private values (docs/privacy.md): it is a private *input*, like the CSV it came from; write it
where the data live, never among the files a run publishes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "STORE_FORMAT",
    "SeriesStore",
    "SeriesStoreWriter",
    "StoreWindows",
    "is_store_path",
    "open_store",
    "series_lengths",
    "store_from_file",
    "write_store",
]

#: Value of the schema metadata key ``lightning_dpts.store`` (bumped when the layout changes).
STORE_FORMAT = "1"
_FORMAT_KEY = b"lightning_dpts.store"
_FREQ_KEY = b"freq"
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The only CSV cells read as a missing value (as ``dpts fit`` reads CSV files; docs/data.md).
_MISSING_CSV_CELLS = ("", "NaN", "nan", "None")
#: Values buffered by the writer before a record batch is written (2^24 float32 = 64 MiB).
DEFAULT_CHUNK_VALUES = 1 << 24


def _pa() -> Any:
    import pyarrow as pa

    return pa


def _schema(freq: str | None) -> Any:
    pa = _pa()
    meta = {_FORMAT_KEY: STORE_FORMAT.encode(), _FREQ_KEY: (freq or "").encode()}
    return pa.schema([("item_id", pa.string()), ("start", pa.int64()), ("target", pa.large_list(pa.float32()))],
                     metadata=meta)


def is_store_path(path: object) -> bool:
    """``True`` for a path (str or ``os.PathLike``) ending in ``.arrow`` or ``.feather``: a :class:`SeriesStore`."""
    return isinstance(path, (str, os.PathLike)) and str(path).lower().endswith((".arrow", ".feather"))


class SeriesStoreWriter:
    """Write a :class:`SeriesStore` one series at a time, in memory bounded by ``chunk_values`` values.

    The file appears at ``path`` only when :meth:`close` succeeds (it is written to ``path + ".partial"`` and
    renamed), so a failed or interrupted write leaves no store that looks complete.

    Args:
        path: the ``.arrow`` file to write (a private input: keep it with the data, docs/privacy.md).
        freq: the pandas period frequency of the time stamps, or ``None`` when the series have none.
        chunk_values: values per record batch (memory of the writer: ~4 bytes each).
        overwrite: replace an existing file (default: refuse).

    Raises:
        ConfigurationError: the path does not end in ``.arrow``/``.feather``, exists (without ``overwrite``), or
            an added series is empty, not one-dimensional, has an infinite value or one beyond the float32
            range, repeats an item id, or has a start when others have none (or the reverse).
    """

    def __init__(self, path: str | os.PathLike[str], freq: str | None = None, *,
                 chunk_values: int = DEFAULT_CHUNK_VALUES, overwrite: bool = False) -> None:
        pa = _pa()
        if not is_store_path(path):
            raise ConfigurationError("path", str(path), "a series store is an Arrow IPC file ending in .arrow")
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise ConfigurationError("path", str(path), "exists; pass overwrite=True to replace it")
        if freq is not None:
            from lightning_dpts.data.sources import period_freq

            freq = period_freq(freq)
        self.freq = freq
        self._chunk = max(1, int(chunk_values))
        self._partial = Path(str(self.path) + ".partial")
        self._sink = pa.OSFile(str(self._partial), "wb")
        self._writer = pa.ipc.new_file(self._sink, _schema(freq))
        self._ids: list[str] = []
        self._starts: list[int | None] = []
        self._values: list[np.ndarray] = []
        self._buffered = 0
        self._seen: set[str] = set()
        self._has_start: bool | None = None
        self.num_series = 0
        self.num_values = 0

    def add(self, item_id: object, values: Any, start: pd.Period | int | None = None) -> None:
        """Append one series: ``values`` ``[T]`` (NaN = missing), ``start`` its first period (a ``pandas.Period`` of
        the store's ``freq`` or its ordinal), or ``None`` for a store without time stamps."""
        name = str(item_id)
        arr = np.asarray(values)
        if arr.ndim == 2 and arr.shape[1] == 1:
            arr = arr[:, 0]
        if arr.ndim != 1 or len(arr) == 0:
            raise ConfigurationError("data", f"series {name!r} of shape {arr.shape}",
                                     "a store holds univariate series of at least one value ([T])")
        if not np.issubdtype(arr.dtype, np.floating) and not np.issubdtype(arr.dtype, np.integer):
            raise ConfigurationError("data", f"series {name!r} of dtype {arr.dtype}", "values must be real numbers")
        if arr.dtype != np.float32:
            wide = arr.astype(np.float64, copy=False)
            big = np.abs(np.nan_to_num(wide, nan=0.0)) > _FLOAT32_MAX
            if big.any():
                where = int(np.flatnonzero(big)[0])
                raise ConfigurationError("data", f"series {name!r}, time step {where}: {wide[where]!r}",
                                         f"every value must be finite with magnitude <= {_FLOAT32_MAX:.6g} "
                                         "(float32; NaN marks a missing value)")
            arr = wide.astype(np.float32)
        if np.isinf(arr).any():
            where = int(np.flatnonzero(np.isinf(arr))[0])
            raise ConfigurationError("data", f"series {name!r}, time step {where}: {float(arr[where])!r}",
                                     "every value must be finite (NaN marks a missing value)")
        if name in self._seen:
            raise ConfigurationError("data", f"item id {name!r}", "appears twice; every series needs its own id")
        has_start = start is not None
        if self._has_start is None:
            self._has_start = has_start
        elif self._has_start != has_start:
            raise ConfigurationError("data", f"series {name!r}", "give every series a start or none")
        if isinstance(start, pd.Period):
            if self.freq is None or start.freqstr != self.freq:
                raise ConfigurationError("data", f"series {name!r} starting {start}",
                                         f"the start's frequency must be the store's freq={self.freq!r}")
            start = int(start.ordinal)
        self._seen.add(name)
        self._ids.append(name)
        self._starts.append(None if start is None else int(start))
        self._values.append(arr)
        self._buffered += len(arr)
        self.num_series += 1
        self.num_values += len(arr)
        if self._buffered >= self._chunk:
            self._flush()

    def _flush(self) -> None:
        if not self._ids:
            return
        pa = _pa()
        lengths = np.fromiter((len(v) for v in self._values), dtype=np.int64, count=len(self._values))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = pa.array(np.concatenate(self._values), type=pa.float32())
        target = pa.LargeListArray.from_arrays(pa.array(offsets, type=pa.int64()), flat)
        batch = pa.record_batch(
            [pa.array(self._ids, type=pa.string()), pa.array(self._starts, type=pa.int64()), target],
            schema=_schema(self.freq),
        )
        self._writer.write_batch(batch)
        self._ids, self._starts, self._values, self._buffered = [], [], [], 0

    def close(self) -> Path:
        """Write the remaining series, close the file and move it into place; returns its path."""
        if self.num_series == 0:
            self.abort()
            raise ConfigurationError("data", "an empty dataset", "must contain at least one series")
        self._flush()
        self._writer.close()
        self._sink.close()
        os.replace(self._partial, self.path)
        return self.path

    def abort(self) -> None:
        """Stop writing and remove the partial file."""
        try:
            self._writer.close()
            self._sink.close()
        except Exception:  # noqa: BLE001 - best effort: the partial file is removed below either way
            pass
        self._partial.unlink(missing_ok=True)

    def __enter__(self) -> SeriesStoreWriter:
        return self

    def __exit__(self, kind: Any, value: Any, trace: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


class _Targets(Sequence):
    """``store.targets[n]``: series ``n`` as a read-only ``[L_n, 1]`` float32 view of the mapped file."""

    def __init__(self, store: SeriesStore) -> None:
        self._store = store

    def __len__(self) -> int:
        return self._store.num_series

    def __getitem__(self, n: int) -> np.ndarray:  # type: ignore[override]
        return self._store.series(int(n))[:, None]

    def __iter__(self) -> Iterator[np.ndarray]:
        for n in range(len(self)):
            yield self[n]


class _Starts(Sequence):
    """``store.starts[n]``: the first time stamp of series ``n`` as a ``pandas.Period``."""

    def __init__(self, ordinals: np.ndarray, freq: str) -> None:
        self._ordinals, self._freq = ordinals, freq

    def __len__(self) -> int:
        return len(self._ordinals)

    def __getitem__(self, n: int) -> pd.Period:  # type: ignore[override]
        return pd.Period(ordinal=int(self._ordinals[int(n)]), freq=self._freq)


class SeriesStore:
    """A memory-mapped series collection (see the module docstring); duck-types
    :class:`~lightning_dpts.data.sources.SeriesCollection` for univariate series without features.

    Open with ``SeriesStore(path)``. Nothing is copied: :attr:`values` is a read-only float32 view of the mapped
    file, :meth:`series` and :attr:`targets` return views of it. The metadata (ids, lengths, offsets, start
    ordinals) is read into memory: about 30 bytes per series plus the ids.

    Raises:
        ConfigurationError: the file is missing, not an Arrow IPC file, not a store of this format, or holds an
            infinite value (the values are checked once when opened, in bounded memory).
    """

    univariate = True
    feat_static_cat = None
    feat_static_real = None
    feat_dynamic_real = None
    num_dims = 1

    def __init__(self, path: str | os.PathLike[str]) -> None:
        pa = _pa()
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigurationError("data", str(path), "no such series store (.arrow file)")
        try:
            self._open_mapping()
            reader = pa.ipc.open_file(self._map)
        except (pa.ArrowInvalid, OSError) as err:
            raise ConfigurationError("data", str(path), f"is not an Arrow IPC file ({err})") from err
        meta = reader.schema.metadata or {}
        if meta.get(_FORMAT_KEY) != STORE_FORMAT.encode() or reader.schema.names != ["item_id", "start", "target"]:
            raise ConfigurationError("data", str(path), "is an Arrow file but not a lightning_dpts series store "
                                     "(write one with lightning_dpts.data.store.write_store or store_from_file)")
        self.freq: str | None = meta.get(_FREQ_KEY, b"").decode() or None
        whole = self._whole
        ids, starts, offsets, lengths = [], [], [], []
        for k in range(reader.num_record_batches):
            batch = reader.get_batch(k)
            target = batch.column(2)
            flat = target.values
            if flat.null_count:
                raise ConfigurationError("data", str(path), "holds null values; a store writes missing values as NaN")
            byte = flat.buffers()[1].address - whole.address + 4 * flat.offset
            if byte % 4:  # Arrow aligns buffers to 8 bytes; a foreign writer might not
                raise ConfigurationError("data", str(path),
                                         "has a misaligned value buffer; rewrite it with write_store")
            list_offsets = np.asarray(target.offsets)
            offsets.append(byte // 4 + list_offsets[:-1])
            lengths.append(np.diff(list_offsets))
            ids.extend(batch.column(0).to_pylist())
            starts.append(batch.column(1).to_numpy(zero_copy_only=False))
            self._check_finite(byte // 4 + int(list_offsets[0]), int(list_offsets[-1] - list_offsets[0]), batch)
        self.offsets = np.concatenate(offsets).astype(np.int64) if offsets else np.zeros(0, np.int64)
        #: L_n per series (time steps).
        self.lengths = np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, np.int64)
        self.item_ids: list[str] = [str(i) for i in ids]
        ordinals = np.concatenate(starts) if starts else np.zeros(0)
        if len(ordinals) and np.isnan(np.asarray(ordinals, dtype=np.float64)).any():
            self.start_ordinals: np.ndarray | None = None
        else:
            self.start_ordinals = np.asarray(ordinals, dtype=np.int64)
        if self.start_ordinals is not None and self.freq is None:
            raise ConfigurationError("data", str(path), "has start time stamps but no freq in its metadata")
        if self.num_series == 0:
            raise ConfigurationError("data", str(path), "holds no series")

    def _open_mapping(self) -> None:
        """Map the file and view every float32 of it (``values``); zero-copy, read-only."""
        pa = _pa()
        self._map = pa.memory_map(str(self.path), "r")
        self._whole = self._map.read_buffer(self._map.size())
        #: every float32 of the mapped file; series n is values[offsets[n] : offsets[n] + lengths[n]].
        self.values = np.frombuffer(self._whole, dtype=np.float32, count=self._whole.size // 4)

    def _check_finite(self, first: int, size: int, batch: Any, chunk: int = DEFAULT_CHUNK_VALUES) -> None:
        """Refuse an infinite value among ``values[first : first + size]`` (one record batch; a foreign or damaged
        file: the writer never writes one), reading ``chunk`` values at a time."""
        for a in range(0, size, chunk):
            bad = np.flatnonzero(np.isinf(self.values[first + a: first + min(size, a + chunk)]))
            if len(bad):
                where = a + int(bad[0])
                offsets = np.asarray(batch.column(2).offsets) - int(np.asarray(batch.column(2).offsets)[0])
                n = int(np.searchsorted(offsets, where, side="right")) - 1
                raise ConfigurationError("data", f"series {batch.column(0)[n].as_py()!r}, time step "
                                         f"{where - int(offsets[n])}",
                                         "is infinite; every value must be finite (NaN marks a missing value)")

    # -- the SeriesCollection interface ------------------------------------------------------------------
    @property
    def num_series(self) -> int:
        """N, the number of series."""
        return len(self.lengths)

    @property
    def num_values(self) -> int:
        """Total number of time steps over all series."""
        return int(self.lengths.sum())

    @property
    def nbytes(self) -> int:
        """Raw float32 size of the values (4 bytes per time step)."""
        return 4 * self.num_values

    @property
    def targets(self) -> Sequence[np.ndarray]:
        """Series as ``[L_n, 1]`` read-only float32 views (the ``SeriesCollection`` layout)."""
        return _Targets(self)

    @property
    def starts(self) -> Sequence[pd.Period] | None:
        """First time stamp of every series, or ``None`` when the store has none."""
        if self.start_ordinals is None or self.freq is None:
            return None
        return _Starts(self.start_ordinals, self.freq)

    def series(self, n: int) -> np.ndarray:
        """Series ``n`` as a read-only ``[L_n]`` float32 view of the mapped file (NaN = missing)."""
        o = int(self.offsets[n])
        return self.values[o: o + int(self.lengths[n])]

    def subset(self, keep: Sequence[int]) -> SeriesStore:
        """The store restricted to the series at positions ``keep`` (in that order); shares the mapping."""
        keep = np.asarray(list(keep), dtype=np.int64)
        other = object.__new__(SeriesStore)
        other.__dict__.update(self.__dict__)
        other.offsets, other.lengths = self.offsets[keep], self.lengths[keep]
        other.item_ids = [self.item_ids[i] for i in keep.tolist()]
        other.start_ordinals = None if self.start_ordinals is None else self.start_ordinals[keep]
        return other

    def to_frame(self) -> pd.DataFrame:
        """The store as a long-format table: ``item_id`` (str), ``timestamp`` (Period at ``freq``, or the step
        number 0, 1, ... when the store has no time stamps) and ``target`` (float64, NaN = missing), series after
        series; about 24 bytes per value (for the pandas-based jobs and small stores)."""
        total = self.num_values
        rows = np.repeat(np.arange(self.num_series, dtype=np.int64), self.lengths)
        firsts = np.zeros(self.num_series, dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=firsts[1:])
        steps = np.arange(total, dtype=np.int64) - firsts[rows]
        stamps: Any
        if self.start_ordinals is not None and self.freq is not None:
            from lightning_dpts.data.sources import _multiple

            ordinals = self.start_ordinals[rows] + steps * _multiple(self.freq)
            stamps = pd.PeriodIndex.from_ordinals(ordinals, freq=self.freq)
        else:
            stamps = steps
        target = np.concatenate([self.series(n) for n in range(self.num_series)]).astype(np.float64)
        ids = np.asarray(self.item_ids, dtype=object)[rows]  # references to N strings, 8 bytes per value
        return pd.DataFrame({"item_id": ids, "timestamp": stamps, "target": target})

    def __getstate__(self) -> dict[str, Any]:
        # a DataLoader worker re-maps the file (a mapping cannot be pickled): only the metadata travels
        return {k: v for k, v in self.__dict__.items() if k not in ("_map", "_whole", "values")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_mapping()

    def __repr__(self) -> str:
        return (f"SeriesStore({str(self.path)!r}: {self.num_series} series, {self.num_values} values, "
                f"freq={self.freq!r})")


class StoreWindows:
    """Windows of a :class:`SeriesStore` by index arithmetic over its mapped values (no padded copies).

    Exactly the windows of :class:`~lightning_dpts.data.sampler.WindowStore` over the same series: series ``n`` of
    length ``lengths[n]`` (its training part, or the whole series) preceded by ``P`` unobserved zeros; a start
    ``s`` selects the steps ``s - P .. s + L_F - 1`` of the series, steps before 0 are padding (value 0, observed
    0) and NaN values are unobserved (value 0, observed 0). Memory per batch: the gathered windows only.

    Args:
        store: the mapped series.
        lengths: the length of every series to use (``<= store.lengths``; the training parts for training).
        past_length: P, the past window length gathered (context plus every lag), in time steps.
        prediction_length: L_F, in time steps.
        time_features: ``"gluonts"`` builds GluonTS's time features of the store's ``freq`` plus the age feature
            (:mod:`lightning_dpts.data.features`) for the gathered steps only; ``"none"`` builds none.
    """

    def __init__(self, store: SeriesStore, lengths: np.ndarray, past_length: int, prediction_length: int,
                 time_features: str = "none") -> None:
        self.source = store
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.past_length = int(past_length)
        self.prediction_length = int(prediction_length)
        self._offsets = store.offsets
        self._window = np.arange(-self.past_length, self.prediction_length, dtype=np.int64)
        self._time_table: np.ndarray | None = None
        self._first_ordinal = 0
        self._multiple = 1
        width = 0
        if time_features == "gluonts":
            from lightning_dpts.data.features import time_feature_matrix
            from lightning_dpts.data.sources import _multiple

            if store.start_ordinals is None or store.freq is None:
                raise ConfigurationError("data", str(store.path), "time features need a store with time stamps")
            self._multiple = _multiple(store.freq)
            steps = store.start_ordinals // self._multiple
            first, last = int(steps.min()), int((steps + store.lengths).max())
            start = pd.Period(ordinal=first * self._multiple, freq=store.freq)
            self._time_table = time_feature_matrix(start, last - first + self.prediction_length, store.freq)
            self._first_step = steps - first
            width = self._time_table.shape[1] + 1
        elif time_features != "none":
            raise ConfigurationError("time_features", time_features, "must be 'gluonts' or 'none'")
        #: ``[0, F]``: only the width is used by callers that inspect the feature count.
        self.dynamic = np.zeros((0, width), dtype=np.float32)

    @property
    def num_start_positions(self) -> np.ndarray:
        """T_n = L_n - L_F + 1 per series (Algorithm 4)."""
        return self.lengths - self.prediction_length + 1

    def gather(self, rows: np.ndarray, starts: np.ndarray, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """The windows ``(rows[i], starts[i])`` as :meth:`WindowStore.gather` returns them (C-contiguous float32
        ``[B, P, 1]`` / ``[B, L_F, 1]`` targets and masks, ``[B, P, F]`` / ``[B, L_F, F]`` time features)."""
        rows = np.asarray(rows, dtype=np.int64)
        positions = np.asarray(starts, dtype=np.int64)[:, None] + self._window[None, :]  # steps of the series
        inside = (positions >= 0) & (positions < self.lengths[rows][:, None])
        index = self._offsets[rows][:, None] + np.where(inside, positions, 0)
        raw = self.source.values.take(index)
        observed = inside & ~np.isnan(raw)
        values = np.where(observed, raw, np.float32(0.0)).astype(np.float32, copy=False)[..., None]
        mask = observed.astype(np.float32)[..., None]
        P = self.past_length
        out: dict[str, np.ndarray] = {}
        want = None if keys is None else set(keys)

        def put(key: str, make: Any) -> None:
            if want is None or key in want:
                out[key] = np.ascontiguousarray(make())

        put("past_target", lambda: values[:, :P])
        put("past_observed_values", lambda: mask[:, :P])
        put("future_target", lambda: values[:, P:])
        put("future_observed_values", lambda: mask[:, P:])
        if want is None or want & {"past_time_feat", "future_time_feat"}:
            feats = self._features(rows, positions, inside)
            put("past_time_feat", lambda: feats[:, :P])
            put("future_time_feat", lambda: feats[:, P:])
        return out

    def _features(self, rows: np.ndarray, positions: np.ndarray, inside: np.ndarray) -> np.ndarray:
        width = self.dynamic.shape[1]
        if width == 0 or self._time_table is None:
            return np.zeros((*positions.shape, width), dtype=np.float32)
        # padding steps have zero features, as in WindowStore; time features of the step's own period
        safe = np.where(inside, positions, 0)
        table = self._time_table[self._first_step[rows][:, None] + safe]
        age = np.log10(np.float32(2.0) + safe.astype(np.float32))[..., None]
        feats = np.concatenate([table, age], axis=-1)
        feats[~inside] = 0.0
        return feats


def open_store(data: SeriesStore | str | os.PathLike[str], freq: str | None = None) -> SeriesStore:
    """The store ``data`` (a :class:`SeriesStore` or the path of one); ``freq``, if given, must be the store's own.

    Raises:
        ConfigurationError: ``freq`` differs from the store's (``freq``), and the rules of :class:`SeriesStore`.
    """
    store = data if isinstance(data, SeriesStore) else SeriesStore(data)
    if freq is not None:
        from lightning_dpts.data.sources import period_freq

        if store.freq is None or period_freq(freq) != store.freq:
            raise ConfigurationError("freq", freq, f"the series store {str(store.path)!r} has freq={store.freq!r}; "
                                     "omit freq or rewrite the store")
    return store


def series_lengths(collection: Any) -> np.ndarray:
    """L_n of every series (int64): a store's index, or the lengths of a collection's arrays."""
    if isinstance(collection, SeriesStore):
        return collection.lengths.copy()
    return np.array([len(t) for t in collection.targets], dtype=np.int64)


def write_store(data: Any, path: str | os.PathLike[str], *, freq: str | None = None, id_column: str = "item_id",
                timestamp_column: str = "timestamp", value_column: str = "target", overwrite: bool = False,
                chunk_values: int = DEFAULT_CHUNK_VALUES) -> SeriesStore:
    """Write any univariate input the datamodule accepts (list of arrays, GluonTS dataset, long DataFrame, bundled
    name, :class:`~lightning_dpts.data.sources.SeriesCollection`) to the store ``path`` and open it.

    Raises:
        ConfigurationError: for every input rule of :func:`~lightning_dpts.data.sources.to_collection`, for
            multivariate series or features (a store holds univariate targets only), and the writer's rules.
    """
    from lightning_dpts.data.sources import SeriesCollection, to_collection

    if isinstance(data, SeriesCollection):
        collection = data
    else:
        collection = to_collection(data, freq=freq, id_column=id_column, timestamp_column=timestamp_column,
                                   value_column=value_column)
    if not collection.univariate or collection.num_dims != 1:
        raise ConfigurationError("data", f"{collection.num_dims}-dimensional series",
                                 "a series store holds univariate series")
    if collection.feat_dynamic_real is not None or collection.feat_static_cat is not None or (
            collection.feat_static_real is not None):
        raise ConfigurationError("data", "series with features", "a series store holds targets and time stamps only")
    starts = collection.starts
    with SeriesStoreWriter(path, collection.freq if starts is not None else freq, overwrite=overwrite,
                           chunk_values=chunk_values) as writer:
        for n, target in enumerate(collection.targets):
            writer.add(collection.item_ids[n], target[:, 0], None if starts is None else starts[n])
    return SeriesStore(path)


def _read_table(path: Path, columns: list[str] | None) -> Any:
    """The file as an Arrow table (Parquet or CSV; only ``columns`` when given)."""
    pa = _pa()
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            return pq.read_table(path, columns=columns)
        if name.endswith((".csv", ".csv.gz", ".txt")):
            import pyarrow.csv as pcsv

            convert = pcsv.ConvertOptions(null_values=list(_MISSING_CSV_CELLS), strings_can_be_null=True,
                                          include_columns=columns)
            return pcsv.read_csv(path, convert_options=convert)
    except (pa.ArrowInvalid, pa.ArrowKeyError, OSError, KeyError) as err:
        raise ConfigurationError("data", str(path), f"could not be read ({type(err).__name__}: {err})") from err
    raise ConfigurationError("data", str(path), "must be a .parquet, .csv or .csv.gz file")


def _schema_names(path: Path) -> list[str]:
    name = path.name.lower()
    if name.endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception as err:  # noqa: BLE001 - unreadable file: say which and why
            raise ConfigurationError("data", str(path), f"could not be read ({type(err).__name__}: {err})") from err
    return list(_read_table(path, None).schema.names) if not name.endswith((".csv", ".csv.gz", ".txt")) else \
        list(pd.read_csv(path, nrows=0).columns)


def store_from_file(source: str | os.PathLike[str], path: str | os.PathLike[str], *, layout: str = "auto",
                    id_column: str = "item_id", timestamp_column: str = "timestamp", value_column: str = "target",
                    freq: str | None = None, overwrite: bool = False, batch_rows: int = 1 << 20) -> SeriesStore:
    """Convert a Parquet or CSV file into the store ``path`` and open it.

    Layouts: ``"long"`` (one row per series and time step: ``id_column``, ``timestamp_column``, ``value_column``;
    validated by the rules of :func:`~lightning_dpts.data.sources.long_table`), ``"wide"`` (``timestamp_column``
    plus one column per series, named by its item id; leading and trailing missing values of a column are not part
    of its series) or ``"auto"`` (long when the file has the id column, else wide).

    Memory: a long file whose rows of each series are together (any order within a series) is converted
    ``batch_rows`` rows at a time (a long file whose series are interleaved is read whole: about 240 bytes per row
    at the peak); a wide Parquet file one column at a time (one series plus the time stamps).

    Raises:
        ConfigurationError: missing file, unknown format or layout, missing columns, and every value and time
            stamp rule of :func:`~lightning_dpts.data.sources.long_table`.
    """
    source = Path(source)
    if not source.is_file():
        raise ConfigurationError("data", str(source), "no such file")
    if layout not in ("auto", "long", "wide"):
        raise ConfigurationError("layout", layout, "must be 'auto', 'long' or 'wide'")
    names = _schema_names(source)
    if layout == "auto":
        layout = "long" if id_column in names else "wide"
    if layout == "long":
        for column, parameter in ((id_column, "id_column"), (timestamp_column, "timestamp_column"),
                                  (value_column, "value_column")):
            if column not in names:
                raise ConfigurationError(parameter, column, f"is not a column of {source.name} (columns: {names[:10]})")
        columns = [id_column, timestamp_column, value_column]
        try:
            return _long_to_store(source, path, columns, freq, overwrite, stream=True, rows=batch_rows)
        except _NotGrouped:  # a series' rows are not together: read the file whole
            return _long_to_store(source, path, columns, freq, overwrite, stream=False)
    return _wide_to_store(source, path, names, timestamp_column, freq, overwrite)


class _NotGrouped(Exception):
    """A series' rows are not contiguous in the file: it cannot be converted batch by batch."""


def _record_batches(source: Path, columns: list[str], rows: int, stream: bool) -> Iterator[Any]:
    """The file's ``columns`` in record batches of about ``rows`` rows (``stream=False``: one batch)."""
    if not stream:
        yield _read_table(source, columns)  # one table: its to_pandas is the whole file
        return
    pa = _pa()
    try:
        if source.name.lower().endswith((".parquet", ".pq")):
            import pyarrow.parquet as pq

            yield from pq.ParquetFile(source).iter_batches(batch_size=rows, columns=columns)
        else:
            import pyarrow.csv as pcsv

            convert = pcsv.ConvertOptions(null_values=list(_MISSING_CSV_CELLS), strings_can_be_null=True,
                                          include_columns=columns)
            blocks = pcsv.ReadOptions(block_size=max(1 << 16, 32 * rows))
            yield from pcsv.open_csv(source, convert_options=convert, read_options=blocks)
    except (pa.ArrowInvalid, OSError) as err:
        raise ConfigurationError("data", str(source), f"could not be read ({type(err).__name__}: {err})") from err


def _long_to_store(source: Path, path: str | os.PathLike[str], columns: list[str], freq: str | None,
                   overwrite: bool, *, stream: bool, rows: int = 1 << 20) -> SeriesStore:
    """A long file into a store, a record batch at a time when ``stream`` (the rows of every series together; else
    :class:`_NotGrouped`). Every batch is validated by :func:`~lightning_dpts.data.sources.long_table`'s rules (the
    frequency inferred from the first batch holds for the rest); memory: one batch plus one series."""
    from lightning_dpts.data.sources import _from_dataframe

    id_column, timestamp_column, value_column = columns
    writer: SeriesStoreWriter | None = None
    pending: pd.DataFrame | None = None
    offset = 0

    def write(frame: pd.DataFrame) -> None:
        nonlocal writer, freq
        collection = _from_dataframe(frame, freq, id_column, timestamp_column, value_column)
        freq = collection.freq
        if writer is None:
            writer = SeriesStoreWriter(path, freq, overwrite=overwrite)
        for n, target in enumerate(collection.targets):
            name = collection.item_ids[n]
            if stream and name in writer._seen:
                raise _NotGrouped(name)
            writer.add(name, target[:, 0], None if collection.starts is None else collection.starts[n])

    try:
        for batch in _record_batches(source, columns, rows, stream):
            frame = batch.to_pandas()
            frame.index = pd.RangeIndex(offset, offset + len(frame))
            offset += len(frame)
            if pending is not None:
                frame = pd.concat([pending, frame])
            if not len(frame):
                continue
            if stream:  # every series' rows together: one run per id, and no id of an earlier batch
                ids = frame[id_column].astype(str).to_numpy()
                names = pd.unique(ids)
                runs = 1 + int(np.count_nonzero(ids[1:] != ids[:-1]))
                if runs != len(names) or (writer is not None and any(n in writer._seen for n in names)):
                    raise _NotGrouped(str(source))
            last = (frame[id_column] == frame[id_column].iloc[-1]).to_numpy()
            pending = frame[last]  # the batch's last series may go on in the next batch
            if (~last).any():
                write(frame[~last])
        if pending is not None and len(pending):
            write(pending)
        if writer is None:
            raise ConfigurationError("data", str(source), "has no rows")
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    writer.close()
    return SeriesStore(path)


def _wide_to_store(source: Path, path: str | os.PathLike[str], names: list[str], timestamp_column: str,
                   freq: str | None, overwrite: bool) -> SeriesStore:
    from lightning_dpts.data.sources import _multiple, _numeric_column, _parse_stamps, period_freq

    if timestamp_column not in names:
        raise ConfigurationError("timestamp_column", timestamp_column,
                                 f"is not a column of {source.name} (a wide file has one time stamp column and one "
                                 f"column per series; columns: {names[:10]})")
    series_columns = [c for c in names if c != timestamp_column]
    if not series_columns:
        raise ConfigurationError("data", str(source), "a wide file needs at least one series column")
    stamps = _read_table(source, [timestamp_column]).column(0).to_pandas()
    ordinals, pfreq, datetimes = _parse_stamps(stamps, "timestamp_column", timestamp_column, freq, None)
    if datetimes is not None:
        if pfreq is None:
            pfreq = pd.infer_freq(pd.DatetimeIndex(datetimes))
            if pfreq is None:
                raise ConfigurationError("freq", None, f"could not be inferred from {timestamp_column!r}; pass it")
            pfreq = period_freq(pfreq)
        ordinals = pd.PeriodIndex(pd.DatetimeIndex(datetimes), freq=pfreq).asi8.astype(np.int64)
    assert pfreq is not None
    multiple = _multiple(pfreq)
    steps = ordinals // multiple
    order = np.argsort(steps, kind="stable")
    if len(steps) > 1 and (np.diff(steps[order]) == 0).any():
        raise ConfigurationError("timestamp_column", timestamp_column,
                                 f"has two rows in one period of freq={pfreq!r}; a wide file has one row per step")
    first = int(steps.min()) if len(steps) else 0
    span = int(steps.max()) - first + 1 if len(steps) else 0
    slot = steps - first
    if source.name.lower().endswith((".parquet", ".pq")):
        import pyarrow.parquet as pq

        opened = pq.ParquetFile(source)  # one column at a time

        def read(column: str) -> pd.Series:
            return opened.read(columns=[column]).column(0).to_pandas()
    else:
        whole = _read_table(source, None)

        def read(column: str) -> pd.Series:
            return whole.column(column).to_pandas()

    with SeriesStoreWriter(path, pfreq, overwrite=overwrite) as writer:
        for column in series_columns:
            col = read(column)
            values = _numeric_column(col, "value_column", column, None)
            full = np.full(span, np.nan)
            full[slot] = values
            seen = np.flatnonzero(~np.isnan(full))
            if not len(seen):
                raise ConfigurationError("data", f"column {column!r}", "has no values; drop it from the file")
            a, b = int(seen[0]), int(seen[-1]) + 1
            writer.add(column, full[a:b], int((first + a) * multiple))
    return SeriesStore(path)


"""Dataset adapters: turn the supported inputs into one normalised :class:`SeriesCollection`.

Supported inputs (first argument of :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`):

* a GluonTS dataset, i.e. any iterable of dicts with ``target`` (``[T]`` or, GluonTS-style, ``[D, T]``),
  ``start`` (``pandas.Period``) and optional ``item_id``, ``feat_static_cat``, ``feat_static_real``,
  ``feat_dynamic_real`` (``[F, T]``);
* a list of numpy arrays, univariate ``[T]`` or multivariate ``[T, D]`` (time first);
* a long-format :class:`pandas.DataFrame` with an id, a timestamp and one or more value columns;
* the name of a bundled dataset (see :func:`load_dataset`).

NaNs are missing values; they are kept as NaN here and become "unobserved" (mask 0, value 0) when windows
are gathered, as GluonTS's ``AddObservedValuesIndicator`` does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = ["BUNDLED_DATASETS", "SeriesCollection", "load_dataset", "to_collection"]

#: Datasets shipped inside the package, name -> (file, frequency, description).
BUNDLED_DATASETS: dict[str, tuple[str, str, str]] = {
    "us_employment": (
        "us_employment.csv.gz",
        "M",
        "Monthly US employment by industry (thousands of people), 148 series, 1939-01 to 2019-09. "
        "US Bureau of Labor Statistics, Current Employment Statistics (public domain), as packaged in the "
        "fpp3 R package's us_employment table.",
    ),
}


@dataclass(frozen=True)
class SeriesCollection:
    """N time series in a common layout.

    Attributes:
        targets: one float64 array ``[L_n, D]`` per series (time first; NaN = missing).
        item_ids: one identifier per series.
        starts: the first time stamp of each series as a ``pandas.Period``, or ``None`` when unknown.
        freq: the pandas frequency string shared by all series, or ``None`` when unknown.
        univariate: whether the input was univariate (batches then drop the trailing ``D = 1`` axis).
        feat_static_cat: ``[N, C]`` int64 static categorical features, or ``None``.
        feat_static_real: ``[N, R]`` float static real features, or ``None``.
        feat_dynamic_real: one ``[L_n, F]`` array per series (time first), or ``None``.
    """

    targets: list[np.ndarray]
    item_ids: list[str]
    starts: list[pd.Period] | None
    freq: str | None
    univariate: bool
    feat_static_cat: np.ndarray | None = None
    feat_static_real: np.ndarray | None = None
    feat_dynamic_real: list[np.ndarray] | None = None

    @property
    def num_series(self) -> int:
        """N, the number of series."""
        return len(self.targets)

    @property
    def num_dims(self) -> int:
        """D, the width of every time step."""
        return int(self.targets[0].shape[1])

    def subset(self, keep: Sequence[int]) -> SeriesCollection:
        """The collection restricted to the series at positions ``keep`` (in that order)."""
        keep = list(keep)
        return SeriesCollection(
            targets=[self.targets[i] for i in keep],
            item_ids=[self.item_ids[i] for i in keep],
            starts=None if self.starts is None else [self.starts[i] for i in keep],
            freq=self.freq,
            univariate=self.univariate,
            feat_static_cat=None if self.feat_static_cat is None else self.feat_static_cat[keep],
            feat_static_real=None if self.feat_static_real is None else self.feat_static_real[keep],
            feat_dynamic_real=None if self.feat_dynamic_real is None else [self.feat_dynamic_real[i] for i in keep],
        )


def load_dataset(name: str) -> pd.DataFrame:
    """Load a dataset bundled with the package as a long-format DataFrame.

    Args:
        name: one of :data:`BUNDLED_DATASETS` (currently ``"us_employment"``).

    Returns:
        Columns ``item_id`` (str), ``timestamp`` (``pandas.Period`` with the dataset's frequency),
        ``target`` (float) plus any descriptive columns of the source (``title`` for ``us_employment``),
        sorted by ``item_id`` then ``timestamp``.
    """
    if name not in BUNDLED_DATASETS:
        raise ConfigurationError("data", name, f"bundled datasets are {', '.join(sorted(BUNDLED_DATASETS))}")
    filename, freq, _ = BUNDLED_DATASETS[name]
    path = resources.files("lightning_dpts.data").joinpath("datasets", filename)
    with resources.as_file(path) as real_path:
        raw = pd.read_csv(real_path, compression="gzip")
    frame = pd.DataFrame(
        {
            "item_id": raw["series_id"].astype(str),
            "timestamp": pd.PeriodIndex(raw["month"], freq=freq),
            "target": raw["value"].astype(float),
            "title": raw["title"].astype(str),
        }
    )
    return frame.sort_values(["item_id", "timestamp"], kind="stable").reset_index(drop=True)


def _as_period(value: Any, freq: str | None) -> pd.Period:
    if isinstance(value, pd.Period):
        return value if freq is None else value.asfreq(freq)
    if freq is None:
        raise ConfigurationError("freq", None, f"needed to interpret start {value!r}; pass e.g. freq='M'")
    return pd.Period(value, freq=freq)


def _check_widths(targets: list[np.ndarray], item_ids: list[str]) -> None:
    width = targets[0].shape[1]
    for arr, item in zip(targets, item_ids, strict=True):
        if arr.shape[1] != width:
            raise ConfigurationError(
                "data",
                f"series {item!r} with {arr.shape[1]} dimensions",
                f"all multivariate series must have the same width; series {item_ids[0]!r} has {width}",
            )


def _from_arrays(data: Sequence[Any], freq: str | None) -> SeriesCollection:
    targets = []
    univariate = True
    for i, series in enumerate(data):
        arr = np.asarray(series, dtype=np.float64)
        if arr.ndim == 1:
            arr = arr[:, None]
        elif arr.ndim == 2:
            univariate = False
        else:
            raise ConfigurationError("data", f"series {i} with shape {arr.shape}", "arrays must be [T] or [T, D]")
        targets.append(arr)
    item_ids = [str(i) for i in range(len(targets))]
    if targets:
        dims = {np.asarray(s).ndim for s in data}
        if len(dims) > 1:
            raise ConfigurationError("data", "mixed [T] and [T, D] arrays", "use one layout for all series")
        _check_widths(targets, item_ids)
    starts = None if freq is None else [pd.Period("1970-01-01", freq=freq)] * len(targets)
    return SeriesCollection(targets, item_ids, starts, freq, univariate)


def _infer_freq(stamps: pd.Series, ids: pd.Series) -> str:
    """The first frequency pandas can infer from one series' gap-free time stamps."""
    for _, group in stamps.groupby(ids.to_numpy(), sort=False):
        if len(group) >= 3:
            freq = pd.infer_freq(pd.DatetimeIndex(group.sort_values()))
            if freq is not None:
                return freq
    raise ConfigurationError("freq", None, "could not be inferred from the time stamps; pass it (e.g. freq='D')")


def _from_dataframe(
    frame: pd.DataFrame,
    freq: str | None,
    id_column: str,
    timestamp_column: str,
    value_columns: str | Sequence[str],
) -> SeriesCollection:
    columns = [value_columns] if isinstance(value_columns, str) else list(value_columns)
    for name, col in [("id_column", id_column), ("timestamp_column", timestamp_column)] + [
        ("value_column", c) for c in columns
    ]:
        if col not in frame.columns:
            raise ConfigurationError(name, col, f"must be a column of the DataFrame: {list(frame.columns)}")
    stamps = frame[timestamp_column]
    if isinstance(stamps.dtype, pd.PeriodDtype):
        freq = freq or stamps.dtype.freqstr
        periods = pd.PeriodIndex(stamps).asfreq(freq)
    else:
        stamps = pd.to_datetime(stamps)
        if freq is None:
            freq = _infer_freq(stamps, frame[id_column])
        periods = pd.PeriodIndex(stamps, freq=freq)
    work = pd.DataFrame({"id": frame[id_column].astype(str).to_numpy(), "ordinal": periods.asi8})
    for j, c in enumerate(columns):
        work[f"v{j}"] = frame[c].astype(float).to_numpy()
    targets, item_ids, starts = [], [], []
    for item, group in work.groupby("id", sort=False):
        group = group.sort_values("ordinal", kind="stable")
        ordinals = group["ordinal"].to_numpy()
        if len(np.unique(ordinals)) != len(ordinals):
            raise ConfigurationError("data", f"series {item!r}", "has duplicate timestamps")
        first = int(ordinals[0])
        length = int(ordinals[-1]) - first + 1
        arr = np.full((length, len(columns)), np.nan)
        arr[ordinals - first] = group[[f"v{j}" for j in range(len(columns))]].to_numpy()
        targets.append(arr)
        item_ids.append(str(item))
        starts.append(pd.Period(ordinal=first, freq=freq))
    return SeriesCollection(targets, item_ids, starts, freq, univariate=isinstance(value_columns, str))


def _from_entries(data: Iterable[dict[str, Any]], freq: str | None) -> SeriesCollection:
    targets, item_ids, starts, cats, reals, dyns = [], [], [], [], [], []
    univariate = True
    for i, entry in enumerate(data):
        if "target" not in entry:
            raise ConfigurationError("data", f"entry {i}", "GluonTS entries need a 'target' field")
        arr = np.asarray(entry["target"], dtype=np.float64)
        if arr.ndim == 2:  # GluonTS layout [D, T]
            arr = arr.T
            univariate = False
        elif arr.ndim == 1:
            arr = arr[:, None]
        else:
            raise ConfigurationError("data", f"entry {i} target shape {arr.shape}", "must be [T] or [D, T]")
        targets.append(arr)
        item_ids.append(str(entry.get("item_id", i)))
        if "start" in entry:
            start = entry["start"]
            if freq is None and isinstance(start, pd.Period):
                freq = start.freqstr
            starts.append(_as_period(start, freq))
        cats.append(entry.get("feat_static_cat"))
        reals.append(entry.get("feat_static_real"))
        dyn = entry.get("feat_dynamic_real")
        dyns.append(None if dyn is None else np.asarray(dyn, dtype=np.float64).T)
    if not targets:
        return SeriesCollection([], [], None, freq, True)
    _check_widths(targets, item_ids)
    if starts and len(starts) != len(targets):
        raise ConfigurationError("data", "some entries without 'start'", "give every entry a start or none")

    def _stack(values: list[Any], name: str, dtype: type) -> np.ndarray | None:
        present = [v is not None for v in values]
        if not any(present):
            return None
        if not all(present):
            raise ConfigurationError(name, "missing for some series", "give it for every series or none")
        stacked = [np.asarray(v, dtype=dtype).reshape(-1) for v in values]
        if len({len(v) for v in stacked}) != 1:
            raise ConfigurationError(name, "different lengths", "must have the same length for every series")
        return np.stack(stacked)

    dynamic = None
    if any(d is not None for d in dyns):
        if not all(d is not None for d in dyns):
            raise ConfigurationError("feat_dynamic_real", "missing for some series", "give it for all or none")
        for d, t, item in zip(dyns, targets, item_ids, strict=True):
            if d.shape[0] != t.shape[0]:
                raise ConfigurationError(
                    "feat_dynamic_real",
                    f"series {item!r} of length {d.shape[0]}",
                    f"must span {t.shape[0]} steps",
                )
        dynamic = dyns
    return SeriesCollection(
        targets,
        item_ids,
        starts or None,
        freq,
        univariate,
        feat_static_cat=_stack(cats, "feat_static_cat", np.int64),
        feat_static_real=_stack(reals, "feat_static_real", np.float64),
        feat_dynamic_real=dynamic,
    )


def to_collection(
    data: Any,
    *,
    freq: str | None = None,
    id_column: str = "item_id",
    timestamp_column: str = "timestamp",
    value_column: str | Sequence[str] = "target",
) -> SeriesCollection:
    """Normalise any supported input (see module docstring) to a :class:`SeriesCollection`.

    Raises:
        ConfigurationError: for an empty dataset, mixed or mismatched multivariate widths, unknown bundled
            names, or missing DataFrame columns.
    """
    if isinstance(data, str):
        collection = _from_dataframe(
            load_dataset(data), freq or BUNDLED_DATASETS[data][1], "item_id", "timestamp", "target"
        )
    elif isinstance(data, pd.DataFrame):
        collection = _from_dataframe(data, freq, id_column, timestamp_column, value_column)
    elif isinstance(data, np.ndarray):
        if data.ndim not in (2, 3):
            raise ConfigurationError("data", f"array of shape {data.shape}", "stack series as [N, T] or [N, T, D]")
        collection = _from_arrays(list(data), freq)
    else:
        items = list(data)
        if items and isinstance(items[0], dict):
            collection = _from_entries(items, freq)
        else:
            collection = _from_arrays(items, freq)
    if collection.num_series == 0:
        raise ConfigurationError("data", "an empty dataset", "must contain at least one series")
    for arr, item in zip(collection.targets, collection.item_ids, strict=True):
        if arr.shape[0] == 0:
            raise ConfigurationError("data", f"series {item!r}", "has no time steps")
        if np.isinf(arr).any():
            raise ConfigurationError("data", f"series {item!r}", "contains infinite values (NaN marks missing)")
    return collection

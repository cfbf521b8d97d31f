"""Reading the data a job runs on: a long-format CSV/Parquet file (or the bundled ``us_employment`` data) as a
table with columns ``item_id``, ``timestamp`` (Period), ``target``, and the public length filter.

Shared by ``dpts fit``, ``dpts predict``, ``dpts synth`` and ``dpts privacy --data``.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = ["MISSING_CSV_CELLS", "drop_short_series", "format_stamps", "load_fit_table", "load_long_table",
           "open_fit_store", "store_of", "timestamp_style"]

#: The only CSV cells read as a missing value (docs/data.md: "NaN/empty/None is a missing value").
MISSING_CSV_CELLS = ("", "NaN", "nan", "None")


def load_long_table(path: str | Path, id_column: str = "item_id", timestamp_column: str = "timestamp",
                    value_column: str = "target", freq: str | None = None, *,
                    time_column: str | None = None) -> tuple[pd.DataFrame, str]:
    """Read a long-format CSV/Parquet file (or a series store, ``.arrow``: :mod:`lightning_dpts.data.store`) into
    columns ``item_id``, ``timestamp`` (Period), ``target``.

    The column names default to ``item_id``, ``timestamp``, ``target`` (:mod:`lightning_dpts.data.columns`; a file
    with the old ``dpts`` defaults ``id`` / ``value`` is read from them with a ``DeprecationWarning``, and the
    keyword ``time_column`` is the deprecated name of ``timestamp_column``). ``table.attrs`` records the columns
    read (``"source_columns"``) and how the file writes its time stamps (``"timestamp_style"``, for writing
    forecasts the same way: :func:`timestamp_style`).

    Returns the table and its (period) frequency. Raises :class:`ConfigurationError` naming the parameter, the
    row (and CSV line) and the fix for a missing file, unknown format, missing columns, missing ids or time
    stamps, non-numeric, complex or out-of-float32-range values, integer time stamps without ``freq``, and
    time stamps whose spacing disagrees with ``freq`` (see :func:`lightning_dpts.data.sources.long_table`).
    """
    if time_column is not None:
        from lightning_dpts.data.columns import renamed_parameter

        renamed_parameter("load_long_table(time_column=...)", "timestamp_column")
        timestamp_column = time_column
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError("data", str(path), "no such file")
    from lightning_dpts.data.store import is_store_path

    if is_store_path(path):
        return _store_table(path, freq)
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            raw = pd.read_parquet(path)
        elif name.endswith((".csv", ".csv.gz", ".txt")):
            # only an empty cell, NaN or None is missing (docs/data.md); pandas' other defaults ("n/a", "NA",
            # "null", "#N/A", ...) stay text, so a value column holding them is refused, not silently emptied
            raw = pd.read_csv(path, keep_default_na=False, na_values=list(MISSING_CSV_CELLS))
        else:
            raise ConfigurationError("data", str(path), "must be a .csv, .csv.gz, .parquet or .arrow (store) file")
    except ConfigurationError:
        raise
    except Exception as err:  # unreadable file: say which and why
        raise ConfigurationError("data", str(path), f"could not be read ({type(err).__name__}: {err})") from err
    from lightning_dpts.data.sources import long_table

    table, used_freq = long_table(raw, id_column=id_column, timestamp_column=timestamp_column,
                                  value_column=value_column, freq=freq,
                                  first_line=2 if name.endswith((".csv", ".csv.gz", ".txt")) else None)
    table.attrs["timestamp_style"] = timestamp_style(raw[table.attrs["source_columns"][1]], used_freq)
    return table, used_freq


def open_fit_store(path: str | Path, freq: str | None = None) -> Any:
    """A series store (``.arrow``) opened for a job that streams from it (``dpts fit``): a
    :class:`~lightning_dpts.data.store.SeriesStore` with time stamps, its ``freq`` checked against ``freq``.

    Raises :class:`ConfigurationError` (``data``, ``freq``) as :func:`load_long_table` does."""
    from lightning_dpts.data.sources import period_freq
    from lightning_dpts.data.store import SeriesStore

    path = Path(path)
    if not path.is_file():
        raise ConfigurationError("data", str(path), "no such file")
    store = SeriesStore(path)
    if store.freq is None or store.start_ordinals is None:
        raise ConfigurationError("data", str(path), "is a series store without time stamps; write it with starts "
                                 "and freq (write_store of a long table, or store_from_file)")
    if freq is not None and period_freq(freq) != store.freq:
        raise ConfigurationError("freq", freq, f"the series store {path.name} has freq={store.freq!r}; omit --freq")
    return store


def _store_table(path: Path, freq: str | None) -> tuple[pd.DataFrame, str]:
    """A series store (:mod:`lightning_dpts.data.store`, ``.arrow``) as the long table the jobs read."""
    store = open_fit_store(path, freq)
    table = store.to_frame()
    table.attrs["source_columns"] = ("item_id", "timestamp", "target")
    table.attrs["timestamp_style"] = {"format": None, "anchor": None}
    _STORE_TABLES[id(table)] = (weakref.ref(table), store)
    return table, store.freq


#: id(table) -> (weak reference to the table, its store): the tables read from a store, unchanged (a filtered or
#: clipped table is another object, so it is never mistaken for its store).
_STORE_TABLES: dict[int, tuple[Any, Any]] = {}


def store_of(table: Any) -> Any:
    """The :class:`~lightning_dpts.data.store.SeriesStore` behind ``table``: ``table`` itself when it is a store, the
    store :func:`load_long_table` read it from when it is that very table (not a filtered, clipped or copied one),
    else ``None``: the datamodule then samples from the mapped store instead of the table's values (the same
    values; issue 41)."""
    from lightning_dpts.data.store import SeriesStore

    if isinstance(table, SeriesStore):
        return table
    entry = _STORE_TABLES.get(id(table))
    if entry is None or entry[0]() is not table:
        return None
    return entry[1]


def timestamp_style(stamps: pd.Series, freq: str) -> dict[str, Any]:
    """How a file writes its time stamps, to write new ones the same way (``dpts predict``).

    ``{"format": strftime pattern or None, "anchor": "start" | "end" | None}``: the pattern is pandas' guess from
    the first stamp (``None``: not text, e.g. Parquet datetimes or Periods, or not recognised); the anchor says
    where in its period every stamp lies (the first day, e.g. ``2024-05-01`` for May, or the last day,
    ``2024-05-31``), from up to 1,000 stamps; ``None`` when they are not dates or not all alike.
    """
    style: dict[str, Any] = {"format": None, "anchor": None}
    sample = stamps.dropna().head(1000)
    if sample.empty or pd.api.types.is_integer_dtype(sample) or isinstance(sample.dtype, pd.PeriodDtype):
        return style
    first = sample.iloc[0]
    if isinstance(first, str):
        from pandas.tseries.api import guess_datetime_format

        style["format"] = guess_datetime_format(first.strip())
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            times = pd.to_datetime(sample, format=style["format"]) if style["format"] else pd.to_datetime(sample)
        periods = times.dt.to_period(freq)
    except (ValueError, TypeError, AttributeError):
        return style
    if (times == periods.dt.start_time).all():
        style["anchor"] = "start"
    elif (times.dt.normalize() == periods.dt.end_time.dt.normalize()).all():
        style["anchor"] = "end"
    return style


def format_stamps(periods: pd.PeriodIndex, style: dict[str, Any] | None) -> list[str]:
    """The time stamps of ``periods`` written as the input wrote its own (:func:`timestamp_style`): a date at the
    same place in the period, in the same format. Without a recognised style: the period's start date (its
    start date and time for sub-daily data) in ISO 8601."""
    style = style or {}
    if style.get("anchor") == "end":
        times = periods.end_time.normalize()
    else:
        times = periods.start_time
    fmt = style.get("format")
    if fmt is None:
        sub_daily = bool((times != times.normalize()).any())
        fmt = "%Y-%m-%d %H:%M:%S" if sub_daily else "%Y-%m-%d"
    return [t.strftime(fmt) for t in times]


def load_fit_table(config: Any) -> tuple[pd.DataFrame, str, str]:
    """The table of a :class:`~lightning_dpts.app.config.FitConfig` (its ``data`` file, or the bundled
    ``us_employment`` data when ``data`` is ``None``), its frequency and the name the report gives the data."""
    if config.data is None:
        from lightning_dpts.data.sources import load_dataset

        return load_dataset("us_employment"), config.freq or "M", "us_employment (bundled)"
    table, freq = load_long_table(config.data, config.id_column, config.timestamp_column, config.value_column,
                                  config.freq)
    return table, freq, str(config.data)


def drop_short_series(table: Any, min_series_length: int | None) -> tuple[Any, int]:
    """``table`` without the series (``item_id``) shorter than ``min_series_length`` rows, and how many went.

    ``table``: a long table, or a :class:`~lightning_dpts.data.store.SeriesStore` (then a subset of it, sharing
    the mapping). Reads only the lengths (public under this package's relations). ``None`` or 1 keeps every
    series; a threshold that leaves none raises :class:`ConfigurationError` (``min_series_length``).
    """
    if min_series_length is None or min_series_length <= 1:
        return table, 0
    from lightning_dpts.data.store import SeriesStore

    if isinstance(table, SeriesStore):
        keep = np.flatnonzero(table.lengths >= min_series_length)
        if len(keep) == 0:
            raise ConfigurationError("min_series_length", min_series_length,
                                     f"leaves no series (the longest has {int(table.lengths.max())} steps)")
        gone = table.num_series - len(keep)
        return (table.subset(keep) if gone else table), gone
    lengths = table.groupby("item_id", sort=False).size()
    short = lengths.index[lengths.to_numpy() < min_series_length]
    if len(short) == len(lengths):
        raise ConfigurationError("min_series_length", min_series_length,
                                 f"leaves no series (the longest has {int(lengths.max())} steps)")
    if len(short) == 0:
        return table, 0
    return table[~table["item_id"].isin(set(short))].reset_index(drop=True), len(short)

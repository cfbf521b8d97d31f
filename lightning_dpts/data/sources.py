"""Dataset adapters: turn the supported inputs into one normalised :class:`SeriesCollection`.

Supported inputs (first argument of :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`):

* a GluonTS dataset, i.e. any iterable of dicts with ``target`` (``[T]`` or, GluonTS-style, ``[D, T]``),
  ``start`` (``pandas.Period``) and optional ``item_id``, ``feat_static_cat``, ``feat_static_real``,
  ``feat_dynamic_real`` (``[F, T]``);
* a list of numpy arrays, univariate ``[T]`` or multivariate ``[T, D]`` (time first);
* a long-format :class:`pandas.DataFrame` with an id, a timestamp and one or more value columns;
* the name of a bundled dataset (see :func:`load_dataset`).

NaNs are missing values; they are kept as NaN here and become "unobserved" (mask 0, value 0) when windows
are gathered, as GluonTS's ``AddObservedValuesIndicator`` does. Anything else that is not a real number in the
float32 range, and time stamps that do not fit one frequency, are refused with a :class:`ConfigurationError`
naming the column, the row and the fix (see :func:`long_table`); nothing is converted silently.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = ["BUNDLED_DATASETS", "SeriesCollection", "load_dataset", "long_table", "period_freq", "to_collection"]

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


def _as_period(value: Any, freq: str | None, label: str) -> pd.Period:
    if isinstance(value, pd.Period):
        if freq is not None and value.freqstr != period_freq(freq):
            raise ConfigurationError(
                "data", label,
                f"has a start of frequency {value.freqstr!r} but the data's frequency is {period_freq(freq)!r} "
                "(from freq= or the first entry's start); all starts must share one frequency, and it is not "
                "converted silently: convert the series (resample) or fix the start",
            )
        return value
    if freq is None:
        raise ConfigurationError("freq", None,
                                 f"needed to interpret the start {value!r} of {label}; pass e.g. freq='M'")
    if value is None or (isinstance(value, float) and np.isnan(value)):
        raise ConfigurationError("data", label, "has an empty 'start'; give every entry its first time stamp")
    try:
        return pd.Period(value, freq=period_freq(freq))
    except (ValueError, TypeError, OverflowError) as err:
        raise ConfigurationError("data", label, f"has a start {value!r} that is not a time stamp ({err})") from err


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
        arr = _check_series_values(series, f"series {i}")
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
    freq = None if freq is None else period_freq(freq)
    starts = None if freq is None else [pd.Period("1970-01-01", freq=freq)] * len(targets)
    return SeriesCollection(targets, item_ids, starts, freq, univariate)


_FLOAT32_MAX = float(np.finfo(np.float32).max)

# pandas offset aliases that pd.infer_freq returns but Periods do not accept -> the period frequency.
_PERIOD_ALIASES = {"MS": "M", "ME": "M", "BMS": "M", "BME": "M", "BM": "M", "QS": "Q", "QE": "Q", "BQS": "Q",
                   "BQE": "Q", "YS": "Y", "YE": "Y", "AS": "Y", "A": "Y", "BYS": "Y", "BYE": "Y", "BAS": "Y"}


def period_freq(freq: Any, parameter: str = "freq") -> str:
    """The pandas *period* frequency string for ``freq`` (``"MS"``/``"ME"`` -> ``"M"``, ``"QS-OCT"`` -> ``"Q"``, ...).

    Raises:
        ConfigurationError: ``freq`` is not a frequency pandas Periods support.
    """
    if not isinstance(freq, str) or not freq.strip():
        raise ConfigurationError(parameter, freq, "must be a pandas frequency string such as 'D', 'W', 'M', 'Q', 'h'")
    head, _, tail = freq.strip().partition("-")
    alias = _PERIOD_ALIASES.get(head)
    if alias is not None:  # start/end anchored offsets: the period of the stamp is what matters
        candidate = alias if head.endswith(("S", "A")) or not tail else f"{alias}-{tail}"
    else:
        candidate = freq.strip()
    try:
        return pd.Period("2000-01-01", freq=candidate).freqstr
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ConfigurationError(
            parameter, freq, "is not a pandas period frequency (e.g. 'D', 'B', 'W', 'M', 'Q', 'Y', 'h', 'min', '15min')"
        ) from err


def _row(label: Any, first_line: int | None) -> str:
    """'row 7' or, for a file read with a header, 'row 7 (line 9 of the file)'."""
    if first_line is not None and isinstance(label, (int, np.integer)):
        return f"row {label} (line {int(label) + first_line} of the file)"
    return f"row {label!r}" if not isinstance(label, (int, np.integer)) else f"row {label}"


def _numeric_column(column: pd.Series, parameter: str, name: str, first_line: int | None) -> np.ndarray:
    """float64 values of one value column; NaN/empty = missing; refuses complex, text, inf and |x| > float32 max."""
    if pd.api.types.is_complex_dtype(column.dtype):
        bad = np.flatnonzero(np.asarray(column.to_numpy()).imag != 0)
        where = f"e.g. {_row(column.index[bad[0]], first_line)}: {_plain(column.iloc[bad[0]])!r}" if len(bad) else ""
        raise ConfigurationError(
            parameter, name,
            f"holds complex numbers {where}; forecasting needs real values (take the real part or the "
            "magnitude yourself if that is what you mean)",
        )
    if pd.api.types.is_bool_dtype(column.dtype):
        raise ConfigurationError(parameter, name, "holds booleans; it must hold numbers (convert them explicitly)")
    if pd.api.types.is_numeric_dtype(column.dtype):
        values = column.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        numeric = pd.to_numeric(column, errors="coerce")
        if pd.api.types.is_complex_dtype(numeric.dtype):  # Python complex objects in an object column
            return _numeric_column(numeric, parameter, name, first_line)
        values = numeric.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.flatnonzero(np.isnan(values) & column.notna().to_numpy())
        if len(bad):
            example = _plain(column.iloc[bad[0]])
            kind = "complex numbers are not supported" if _looks_complex(example) else "not a number"
            raise ConfigurationError(
                parameter, name,
                f"must hold numbers (empty cells are missing values); {len(bad)} rows do not, first "
                f"{_row(column.index[bad[0]], first_line)}: {example!r} ({kind})",
            )
    _check_range(values, lambda i: _row(column.index[i], first_line), parameter, name)
    return values


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value (so messages show ``5``, not ``np.int64(5)``)."""
    if isinstance(value, (pd.Timestamp, pd.Period)):
        return str(value)
    return value.item() if isinstance(value, np.generic) else value


def _multiple(freq: str) -> int:
    """n of a multiple frequency such as ``'15min'`` or ``'2D'`` (1 otherwise).

    Period ordinals of a multiple frequency count the *base* unit (minutes, days), so consecutive ``'15min'``
    periods are 15 ordinals apart; time steps are ``ordinal // n``.
    """
    return int(pd.Period("2000-01-01", freq=freq).freq.n)


def _looks_complex(value: Any) -> bool:
    if isinstance(value, complex):
        return True
    try:
        complex(str(value).replace(" ", ""))
        return True
    except ValueError:
        return False


def _check_range(values: np.ndarray, where: Any, parameter: str, name: Any) -> None:
    """Refuse +-inf and finite values beyond float32 (training runs in float32; they would become inf)."""
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(np.abs(values.reshape(-1)) > _FLOAT32_MAX)
    if len(bad):
        i = int(bad[0])
        flat = values.reshape(-1)
        width = 1 if values.ndim < 2 else int(np.prod(values.shape[1:]))
        raise ConfigurationError(
            parameter, name,
            f"{where(i // width)} holds {float(flat[i])!r}; values must be finite and within the float32 range "
            f"+-{_FLOAT32_MAX:.4g} (NaN marks missing values); rescale the data (e.g. other units) or fix the cell",
        )


def _check_series_values(series: Any, label: str) -> np.ndarray:
    """One numpy/GluonTS series as float64, refusing complex, non-numeric, inf and out-of-float32 values."""
    raw = np.asarray(series)
    if np.iscomplexobj(raw):
        raise ConfigurationError(
            "data", label, "holds complex numbers; forecasting needs real values (take .real or abs() yourself)"
        )
    if raw.dtype == bool:
        raise ConfigurationError("data", label, "holds booleans; it must hold numbers")
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except (ValueError, TypeError) as err:
        raise ConfigurationError("data", label, f"must hold numbers (NaN or None mark missing values): {err}") from err
    _check_range(arr, lambda t: f"time step {t}", "data", label)
    return arr


@dataclass(frozen=True)
class _LongRows:
    """Validated long-format rows: one entry per row of the input table."""

    ids: np.ndarray  # str item ids
    ordinals: np.ndarray  # int64 period ordinals at ``freq`` (base units for multiples such as '15min')
    steps: np.ndarray  # int64 time step numbers, ordinals // n: consecutive periods differ by 1
    values: np.ndarray  # float64 [rows, columns]
    freq: str
    labels: pd.Index  # the input's row labels, for messages


def _parse_stamps(stamps: pd.Series, parameter: str, name: str, freq: str | None,
                  first_line: int | None) -> tuple[np.ndarray, str | None, pd.Series | None]:
    """(period ordinals if already known, freq, datetimes otherwise)."""
    if isinstance(stamps.dtype, pd.PeriodDtype):
        own = stamps.dtype.freq.freqstr
        if freq is not None and period_freq(freq) != period_freq(own):
            raise ConfigurationError(
                "freq", freq,
                f"differs from the frequency {own!r} of the Period column {name!r}; omit freq or convert the column",
            )
        return pd.PeriodIndex(stamps).asi8.astype(np.int64), period_freq(own), None
    if pd.api.types.is_bool_dtype(stamps.dtype):
        raise ConfigurationError(parameter, name, "holds booleans, not time stamps")
    if pd.api.types.is_numeric_dtype(stamps.dtype):
        # Integer time stamps are step numbers (never nanoseconds): step t is the t-th period of freq after
        # the one that contains 1970-01-01. Without an explicit freq their unit is unknown: refuse.
        values = stamps.to_numpy(dtype=np.float64)
        example = _plain(stamps.iloc[0])
        if freq is None:
            raise ConfigurationError(
                parameter, name,
                f"holds numbers (e.g. {example!r}), not dates; write dates (ISO 8601, e.g. 2020-01-31), or pass "
                "freq (--freq) to read them as step numbers t = 0, 1, 2, ... (step t is the t-th period of freq "
                "after the one containing 1970-01-01)",
            )
        bad = np.flatnonzero(values != np.round(values))
        if len(bad):
            raise ConfigurationError(
                parameter, name,
                f"{_row(stamps.index[bad[0]], first_line)} holds {_plain(stamps.iloc[bad[0]])!r}; numeric time stamps "
                "must be whole step numbers",
            )
        pfreq = period_freq(freq)
        low, high = float(values.min()), float(values.max())
        multiple = _multiple(pfreq)
        try:
            pd.Period(ordinal=int(low) * multiple, freq=pfreq).to_timestamp()
            pd.Period(ordinal=int(high) * multiple, freq=pfreq).to_timestamp()
        except (OverflowError, ValueError, pd.errors.OutOfBoundsDatetime) as err:
            raise ConfigurationError(
                parameter, name,
                f"step numbers {low:.0f}..{high:.0f} at freq={pfreq!r} fall outside the dates pandas supports "
                "(years 1677-2262); are these really step numbers? Write dates instead",
            ) from err
        return values.astype(np.int64) * multiple, pfreq, None
    try:
        parsed = pd.to_datetime(stamps)
    except (ValueError, TypeError, OverflowError) as err:
        raise ConfigurationError(parameter, name, _unparseable(stamps, first_line, err)) from err
    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_localize(None)
    return np.empty(0, np.int64), None if freq is None else period_freq(freq), parsed


def _unparseable(stamps: pd.Series, first_line: int | None, err: Exception) -> str:
    """Which row breaks the date format, and the likely fix."""
    from pandas.tseries.api import guess_datetime_format

    text = stamps.astype(str)
    fmt = guess_datetime_format(text.iloc[0])
    if fmt is not None:
        with_fmt = pd.to_datetime(text, format=fmt, errors="coerce")
        bad = np.flatnonzero(with_fmt.isna().to_numpy())
        if len(bad):
            i = int(bad[0])
            hint = ""
            if fmt.startswith(("%m", "%d")):
                hint = (" (month-first and day-first dates cannot be told apart from the first rows; "
                        "write the dates as ISO 8601, YYYY-MM-DD)")
            return (f"{_row(stamps.index[i], first_line)} holds {_plain(stamps.iloc[i])!r}, which does not match "
                    f"the date format {fmt!r} of the first row {_plain(stamps.iloc[0])!r}{hint}")
    mixed = pd.to_datetime(text, format="mixed", errors="coerce")
    bad = np.flatnonzero(mixed.isna().to_numpy())
    if len(bad):
        i = int(bad[0])
        return f"{_row(stamps.index[i], first_line)} holds {_plain(stamps.iloc[i])!r}, which is not a time stamp"
    return f"holds values that are not time stamps in one format ({type(err).__name__}: {str(err).splitlines()[0]})"


def _infer_freq(datetimes: np.ndarray, codes: np.ndarray, parameter: str) -> str:
    """The frequency pandas infers from the first series (in row order) with >= 3 regular time stamps."""
    order = np.lexsort((datetimes, codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    for chunk in np.split(order, bounds)[:1000]:
        if len(chunk) >= 3:
            freq = pd.infer_freq(pd.DatetimeIndex(datetimes[chunk]))
            if freq is not None:
                return period_freq(freq)
    raise ConfigurationError("freq", None, f"could not be inferred from the time stamps of {parameter}; "
                                           "pass it (e.g. freq='D' / --freq D)")


def _parse_long(
    frame: pd.DataFrame,
    freq: str | None,
    id_column: Any,
    timestamp_column: Any,
    value_columns: Sequence[Any],
    parameters: tuple[str, str, str],
    first_line: int | None,
) -> _LongRows:
    """Validate a long-format table and turn it into (ids, period ordinals, values); see :func:`to_collection`."""
    id_param, time_param, value_param = parameters
    wanted = [(id_param, id_column), (time_param, timestamp_column)] + [(value_param, c) for c in value_columns]
    for param, col in wanted:
        if col not in frame.columns:
            raise ConfigurationError(param, col, f"must be a column of the table; columns are {list(frame.columns)}")
    if len(frame) == 0:
        raise ConfigurationError("data", "an empty table", "must contain at least one row (one series)")
    labels = frame.index
    raw_ids = frame[id_column]
    missing = np.flatnonzero(raw_ids.isna().to_numpy())
    if len(missing):
        raise ConfigurationError(
            id_param, id_column,
            f"{_row(labels[missing[0]], first_line)} has no series id ({len(missing)} rows lack one); "
            "give every row the id of its series, or remove the rows",
        )
    stamps = frame[timestamp_column]
    missing = np.flatnonzero(stamps.isna().to_numpy())
    if len(missing):
        raise ConfigurationError(
            time_param, timestamp_column,
            f"{_row(labels[missing[0]], first_line)} (series {str(raw_ids.iloc[missing[0]])!r}) has no time stamp "
            f"({len(missing)} rows lack one); fill it in or remove the row (a missing value is an empty value "
            "cell, not an empty time stamp)",
        )
    values = np.stack(
        [_numeric_column(frame[c], value_param, c, first_line) for c in value_columns], axis=1
    ) if len(value_columns) else np.empty((len(frame), 0))
    ids = raw_ids.astype(str).to_numpy()
    codes, uniques = pd.factorize(ids)
    ordinals, pfreq, datetimes = _parse_stamps(stamps, time_param, timestamp_column, freq, first_line)
    inferred = False
    if datetimes is not None:
        dt = datetimes.to_numpy(dtype="datetime64[ns]")
        if pfreq is None:
            pfreq = _infer_freq(dt, codes, repr(timestamp_column))
            inferred = True
        ordinals = pd.PeriodIndex(pd.DatetimeIndex(dt), freq=pfreq).asi8.astype(np.int64)
    assert pfreq is not None
    steps = ordinals // _multiple(pfreq)
    _check_spacing(steps, codes, uniques, labels, stamps, pfreq, inferred, time_param, timestamp_column,
                   first_line)
    return _LongRows(ids=ids, ordinals=ordinals, steps=steps, values=values, freq=pfreq, labels=labels)


def _check_spacing(ordinals: np.ndarray, codes: np.ndarray, uniques: np.ndarray, labels: pd.Index,
                   stamps: pd.Series, freq: str, inferred: bool, parameter: str, name: Any,
                   first_line: int | None) -> None:
    """Every series must have unique periods spaced mostly one period of ``freq`` apart.

    Refuses (naming the series, the rows and the fix): two rows in one period (freq too coarse), a series whose
    most common gap is not one period (a weekly series among daily ones, a wrong freq, day-first dates read
    month-first) and a series that reindexing to ``freq`` would leave more than 90% missing.
    """
    order = np.lexsort((ordinals, codes))
    c, o = codes[order], ordinals[order]
    same = c[1:] == c[:-1]
    gaps = np.diff(o)
    dup = np.flatnonzero(same & (gaps == 0))
    how = "inferred" if inferred else "given"
    if len(dup):
        a, b = order[dup[0]], order[dup[0] + 1]
        raise ConfigurationError(
            parameter, name,
            f"series {uniques[c[dup[0]]]!r} has two rows in the same period of freq={freq!r} ({how}): "
            f"{_row(labels[min(a, b)], first_line)} ({_plain(stamps.iloc[min(a, b)])!r}) and "
            f"{_row(labels[max(a, b)], first_line)} ({_plain(stamps.iloc[max(a, b)])!r}); remove duplicates or pass "
            "the series' real frequency",
        )
    if not len(o):
        return
    series_gap = c[1:][same]
    gap = gaps[same]
    if len(gap):
        table = pd.DataFrame({"s": series_gap, "g": gap}).value_counts().reset_index(name="n")
        table = table.sort_values(["s", "n", "g"], ascending=[True, False, True], kind="stable")
        modes = table.drop_duplicates("s")
        counts = np.bincount(c, minlength=len(uniques))
        wrong = modes[(modes["g"] != 1) & (counts[modes["s"].to_numpy()] >= 3)]
        if len(wrong):
            s, g = int(wrong["s"].iloc[0]), int(wrong["g"].iloc[0])
            rows = order[c == s]
            fix = ("pass the frequency the data has (--freq / freq=)" if not inferred
                   else f"freq {freq!r} was inferred from the first regular series; all series must share it")
            raise ConfigurationError(
                parameter, name,
                f"series {uniques[s]!r} ({_row(labels[rows[0]], first_line)} onwards) has time stamps mostly {g} "
                f"periods of freq={freq!r} ({how}) apart, e.g. {stamps.iloc[rows[0]]!r} then "
                f"{stamps.iloc[rows[1]]!r}, so it would be {100 * (1 - 1 / g):.0f}% missing after reindexing to "
                f"{freq!r}; {fix}. Resample or drop that series, or, if the dates are day-first (31/12/2020) "
                "and were read month-first, write them as ISO 8601 (YYYY-MM-DD)",
            )
    first = np.r_[True, ~same]
    starts = np.flatnonzero(first)
    lengths = np.r_[o[np.r_[starts[1:] - 1, len(o) - 1]] - o[starts] + 1]
    counts = np.diff(np.r_[starts, len(o)])
    sparse = np.flatnonzero((lengths > 10 * counts) & (lengths > 1000))
    if len(sparse):
        k = int(sparse[0])
        raise ConfigurationError(
            parameter, name,
            f"series {uniques[c[starts[k]]]!r} has {int(counts[k])} time stamps spread over {int(lengths[k])} "
            f"periods of freq={freq!r} ({how}): {int(lengths[k] - counts[k])} of its {int(lengths[k])} steps "
            "would be missing; "
            "pass the frequency the data has (--freq / freq=) or check the time stamps",
        )


def long_table(
    frame: pd.DataFrame,
    *,
    id_column: Any = "item_id",
    timestamp_column: Any = "timestamp",
    value_column: Any = "target",
    freq: str | None = None,
    parameters: tuple[str, str, str] = ("id_column", "timestamp_column", "value_column"),
    first_line: int | None = None,
) -> tuple[pd.DataFrame, str]:
    """Validate a long-format table and return it as columns ``item_id`` (str), ``timestamp`` (Period), ``target``.

    The rules (each violation is a :class:`ConfigurationError` naming the column, the row and the fix):

    * every row has an id and a time stamp (an empty *value* cell is a missing value, NaN);
    * values are real numbers within the float32 range (no text, complex numbers, booleans or +-inf);
    * time stamps are dates (ISO 8601 recommended: ``01/02/2020`` is read month-first like pandas does, and a
      row that contradicts the format of the first row is an error), ``pandas.Period`` values, or whole step
      numbers *only with an explicit* ``freq`` (step t = the t-th period of ``freq`` after the one containing
      1970-01-01; never nanoseconds);
    * ``freq`` is given or inferred from the first series with 3 or more regular stamps; every series' most
      common gap is one period of it, no two rows of a series fall in one period, and no series would be more
      than 90% missing after reindexing (so a weekly series among daily ones, or a wrong freq, is refused).

    Args:
        frame: the table (one row per series and time step).
        id_column, timestamp_column, value_column: its column names (a name left at its default that the table
            lacks is read from the old ``dpts`` default, ``id`` / ``value``, with a ``DeprecationWarning``:
            :func:`lightning_dpts.data.columns.resolve_columns`).
        freq: the pandas frequency, or ``None`` to infer it.
        parameters: the names under which errors report the three columns.
        first_line: file line number of row 0 (2 for a CSV with a header), to name lines in errors.

    Returns:
        The table sorted by series (first appearance) then time, and the period frequency string.
    """
    from lightning_dpts.data.columns import resolve_columns

    id_column, timestamp_column, value_column = resolve_columns(frame.columns, id_column, timestamp_column,
                                                                value_column)
    rows = _parse_long(frame, freq, id_column, timestamp_column, [value_column], parameters, first_line)
    codes, _ = pd.factorize(rows.ids)
    order = np.lexsort((rows.steps, codes))
    table = pd.DataFrame({
        "item_id": rows.ids[order],
        "timestamp": pd.PeriodIndex.from_ordinals(rows.ordinals[order], freq=rows.freq),
        "target": rows.values[order, 0],
    })
    table.attrs["source_columns"] = (id_column, timestamp_column, value_column)  # the columns read (public names)
    return table, rows.freq


def _from_dataframe(
    frame: pd.DataFrame,
    freq: str | None,
    id_column: str,
    timestamp_column: str,
    value_columns: str | Sequence[str],
) -> SeriesCollection:
    columns = [value_columns] if isinstance(value_columns, str) else list(value_columns)
    if not columns:
        raise ConfigurationError("value_column", value_columns, "name at least one value column")
    rows = _parse_long(frame, freq, id_column, timestamp_column, columns,
                       ("id_column", "timestamp_column", "value_column"), None)
    codes, uniques = pd.factorize(rows.ids)
    order = np.lexsort((rows.steps, codes))
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    targets, item_ids, starts = [], [], []
    for chunk in np.split(order, bounds) if len(order) else []:
        steps = rows.steps[chunk]
        first = int(steps[0])
        arr = np.full((int(steps[-1]) - first + 1, len(columns)), np.nan)
        arr[steps - first] = rows.values[chunk]
        targets.append(arr)
        item_ids.append(str(uniques[codes[chunk[0]]]))
        starts.append(pd.Period(ordinal=int(rows.ordinals[chunk[0]]), freq=rows.freq))
    return SeriesCollection(targets, item_ids, starts, rows.freq, univariate=isinstance(value_columns, str))


def _from_entries(data: Iterable[dict[str, Any]], freq: str | None) -> SeriesCollection:
    targets, item_ids, starts, cats, reals, dyns = [], [], [], [], [], []
    univariate = True
    freq = None if freq is None else period_freq(freq)
    for i, entry in enumerate(data):
        if "target" not in entry:
            raise ConfigurationError("data", f"entry {i}", "GluonTS entries need a 'target' field")
        label = f"entry {i}" + (f" (item_id {entry['item_id']!r})" if "item_id" in entry else "")
        arr = _check_series_values(entry["target"], label)
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
            starts.append(_as_period(start, freq, label))
        cats.append(entry.get("feat_static_cat"))
        reals.append(entry.get("feat_static_real"))
        dyn = entry.get("feat_dynamic_real")
        dyns.append(None if dyn is None else _check_series_values(dyn, f"feat_dynamic_real of {label}").T)
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
            names, missing DataFrame columns; values that are text, complex, +-inf or beyond the float32 range;
            GluonTS starts of another frequency than the data's; and every long-format rule of
            :func:`long_table` (missing ids or time stamps, integer stamps without ``freq``, spacing that
            disagrees with ``freq``), each naming the column or series, the row and the fix.
    """
    if isinstance(data, str):
        collection = _from_dataframe(
            load_dataset(data), freq or BUNDLED_DATASETS[data][1], "item_id", "timestamp", "target"
        )
    elif isinstance(data, pd.DataFrame):
        if isinstance(value_column, str):  # old default columns (id, value): read with a DeprecationWarning
            from lightning_dpts.data.columns import resolve_columns

            id_column, timestamp_column, value_column = resolve_columns(data.columns, id_column, timestamp_column,
                                                                        value_column)
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

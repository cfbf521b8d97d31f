"""Reading the data a job runs on: a long-format CSV/Parquet file (or the bundled ``us_employment`` data) as a
table with columns ``item_id``, ``timestamp`` (Period), ``target``, and the public length filter.

Shared by ``dpts fit``, ``dpts predict``, ``dpts synth`` and ``dpts privacy --data``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = ["MISSING_CSV_CELLS", "drop_short_series", "load_fit_table", "load_long_table"]

#: The only CSV cells read as a missing value (docs/data.md: "NaN/empty/None is a missing value").
MISSING_CSV_CELLS = ("", "NaN", "nan", "None")


def load_long_table(path: str | Path, id_column: str, time_column: str, value_column: str,
                    freq: str | None = None) -> tuple[pd.DataFrame, str]:
    """Read a long-format CSV/Parquet file into columns ``item_id``, ``timestamp`` (Period), ``target``.

    Returns the table and its (period) frequency. Raises :class:`ConfigurationError` naming the parameter, the
    row (and CSV line) and the fix for a missing file, unknown format, missing columns, missing ids or time
    stamps, non-numeric, complex or out-of-float32-range values, integer time stamps without ``freq``, and
    time stamps whose spacing disagrees with ``freq`` (see :func:`lightning_dpts.data.sources.long_table`).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError("data", str(path), "no such file")
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            raw = pd.read_parquet(path)
        elif name.endswith((".csv", ".csv.gz", ".txt")):
            # only an empty cell, NaN or None is missing (docs/data.md); pandas' other defaults ("n/a", "NA",
            # "null", "#N/A", ...) stay text, so a value column holding them is refused, not silently emptied
            raw = pd.read_csv(path, keep_default_na=False, na_values=list(MISSING_CSV_CELLS))
        else:
            raise ConfigurationError("data", str(path), "must be a .csv, .csv.gz or .parquet file")
    except ConfigurationError:
        raise
    except Exception as err:  # unreadable file: say which and why
        raise ConfigurationError("data", str(path), f"could not be read ({type(err).__name__}: {err})") from err
    from lightning_dpts.data.sources import long_table

    return long_table(raw, id_column=id_column, timestamp_column=time_column, value_column=value_column, freq=freq,
                      parameters=("id_column", "time_column", "value_column"),
                      first_line=2 if name.endswith((".csv", ".csv.gz", ".txt")) else None)


def load_fit_table(config: Any) -> tuple[pd.DataFrame, str, str]:
    """The table of a :class:`~lightning_dpts.config.FitConfig` (its ``data`` file, or the bundled
    ``us_employment`` data when ``data`` is ``None``), its frequency and the name the report gives the data."""
    if config.data is None:
        from lightning_dpts.data.sources import load_dataset

        return load_dataset("us_employment"), config.freq or "M", "us_employment (bundled)"
    table, freq = load_long_table(config.data, config.id_column, config.time_column, config.value_column,
                                  config.freq)
    return table, freq, str(config.data)


def drop_short_series(table: pd.DataFrame, min_series_length: int | None) -> tuple[pd.DataFrame, int]:
    """``table`` without the series (``item_id``) shorter than ``min_series_length`` rows, and how many went.

    Reads only the lengths (public under this package's relations). ``None`` or 1 keeps every series; a
    threshold that leaves none raises :class:`ConfigurationError` (``min_series_length``).
    """
    if min_series_length is None or min_series_length <= 1:
        return table, 0
    lengths = table.groupby("item_id", sort=False).size()
    short = lengths.index[lengths.to_numpy() < min_series_length]
    if len(short) == len(lengths):
        raise ConfigurationError("min_series_length", min_series_length,
                                 f"leaves no series (the longest has {int(lengths.max())} steps)")
    if len(short) == 0:
        return table, 0
    return table[~table["item_id"].isin(set(short))].reset_index(drop=True), len(short)

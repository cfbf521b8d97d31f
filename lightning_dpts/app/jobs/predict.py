"""``dpts predict``: forecast new data with the model a ``dpts fit`` run exported, as quantiles in a CSV file.

The model is read back with :mod:`lightning_dpts.app.export`, the data with :mod:`lightning_dpts.data.loading`;
the CSV is written atomically (:mod:`lightning_dpts.outputs`). Forecasting is post-processing of the DP model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_dpts.app.export import check_quantiles, forecast_table, load_predictor, model_frequency
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.outputs import atomic_path

__all__ = ["predict_to_csv"]


def predict_to_csv(model: str | Path, data: str | Path, output: str | Path, *, id_column: str | None = None,
                   timestamp_column: str | None = None, value_column: str | None = None, freq: str | None = None,
                   quantiles: Sequence[float] | None = None, seed: int | None = None,
                   time_column: str | None = None) -> pd.DataFrame:
    """Forecast the ``prediction_length`` steps after the end of every series of ``data``; write a CSV.

    Args:
        model: a ``dpts fit`` output directory or a serialized GluonTS predictor directory.
        data: a long-format CSV/Parquet file (one row per series and time stamp), read like ``dpts fit`` does
            (missing periods inside a series become missing values).
        output: the CSV file to write: the id and time stamp columns under the names ``data`` uses, ``horizon``,
            ``mean`` and one column per quantile level; time stamps in the format of ``data``'s own (e.g.
            ``2024-06-01`` after a monthly series that ends ``2024-05-01``; :func:`lightning_dpts.data.loading.
            format_stamps`).
        id_column, timestamp_column, value_column: column names in ``data``; each ``None`` (default): the one
            the ``dpts fit`` run read its data with (``model.json``), else ``item_id``, ``timestamp``, ``target``
            (:mod:`lightning_dpts.data.columns`). ``time_column`` is the deprecated name of ``timestamp_column``.
        freq: pandas frequency; default: the model's (from ``model.json``), else inferred from the time stamps.
            A frequency different from the model's is an error.
        quantiles: quantile levels in (0, 1); default :data:`lightning_dpts.metrics.DEFAULT_QUANTILES`.
        seed: seed of torch's global generator for sample-based forecasts (reproducible output). Forecasting
            is post-processing of the DP model, so this seed does not touch the privacy guarantee.

    Returns:
        The table written.
    """
    from lightning_dpts.app.export import model_columns
    from lightning_dpts.data.columns import DEFAULT_ID_COLUMN, DEFAULT_TIMESTAMP_COLUMN, DEFAULT_VALUE_COLUMN
    from lightning_dpts.data.loading import load_long_table
    from lightning_dpts.data.sources import period_freq, to_collection
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    if time_column is not None:
        from lightning_dpts.data.columns import renamed_parameter

        renamed_parameter("predict_to_csv(time_column=...)", "timestamp_column")
        timestamp_column = timestamp_column or time_column
    levels = check_quantiles(DEFAULT_QUANTILES if quantiles is None else quantiles)
    if freq is not None:
        period_freq(freq, "freq")  # before any work: a name pandas does not know is refused, naming --freq
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ConfigurationError("seed", seed, "must be an integer >= 0")
    output = Path(output)
    _check_output_file(output)
    predictor = load_predictor(model)
    run = model_columns(model) or {}  # the run's own column names
    id_column = id_column or run.get("id_column", DEFAULT_ID_COLUMN)
    timestamp_column = timestamp_column or run.get("timestamp_column", DEFAULT_TIMESTAMP_COLUMN)
    value_column = value_column or run.get("value_column", DEFAULT_VALUE_COLUMN)
    model_freq = model_frequency(model)
    if freq is not None and model_freq is not None and period_freq(freq) != period_freq(model_freq):
        raise ConfigurationError("freq", freq, f"must be the model's frequency {model_freq!r}")
    try:
        table, used_freq = load_long_table(data, id_column, timestamp_column, value_column, freq or model_freq)
    except ConfigurationError as err:
        if "same period" not in err.requirement:
            raise
        # the loader refuses two rows of a series in one period: here that means data finer than the model's
        raise ConfigurationError(
            "freq", freq or model_freq, "puts several time stamps of one series into the same period: the data is "
            f"not at this frequency{'' if model_freq is None else f' (the model was trained at {model_freq!r})'}; "
            f"{err}",
        ) from err
    # the datamodule's reading: one value per period from the first time stamp on, gaps as missing values
    collection = to_collection(table, freq=used_freq, id_column="item_id", timestamp_column="timestamp",
                               value_column="target")
    entries = [
        {"target": target[:, 0].astype(np.float32), "start": start, "item_id": item}
        for target, start, item in zip(collection.targets, collection.starts or [], collection.item_ids, strict=True)
    ]
    if seed is not None:
        import torch

        torch.manual_seed(seed)
    read_id, read_time, _ = table.attrs["source_columns"]  # the user's names (old defaults included)
    frame = forecast_table(list(predictor.predict(entries)), levels, id_column=read_id, timestamp_column=read_time,
                           timestamp_style=table.attrs.get("timestamp_style"))
    try:
        with atomic_path(output) as tmp:  # a failure leaves no truncated CSV
            frame.to_csv(tmp, index=False)
    except OSError as err:  # e.g. a directory that could not be created, a full disk: nothing is left behind
        raise ConfigurationError("output", str(output), f"cannot be written ({err.strerror or err})") from None
    return frame


def _check_output_file(output: Path) -> None:
    """Refuse (``output``) a path that cannot take a new file, before any work: a directory, a path under a
    file, or a directory in which no file can be created (probed with a temporary file, removed at once)."""
    import tempfile

    if output.is_dir():
        raise ConfigurationError("output", str(output), "is a directory; give a file name such as forecasts.csv")
    existing = next((p for p in (output.parent, *output.parent.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise ConfigurationError("output", str(output), f"{existing} is a file, not a directory")
    if existing != output.parent:  # missing directories are created at write time: the first existing one decides
        import os

        if not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigurationError("output", str(output), f"cannot create directories in {existing}")
        return
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".dpts-probe-"):
            pass
    except OSError as err:
        raise ConfigurationError("output", str(output), f"cannot be written ({err.strerror or err}): choose a "
                                 "writable directory") from None

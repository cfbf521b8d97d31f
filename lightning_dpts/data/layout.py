"""How :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` lays out its data at construction: reading a
file, the window lengths from the model, the series too short for the held-out windows, and the batch's fields
(keys, static and dynamic features) a GluonTS model declares (``describe_inputs``). Functions of public metadata
and the data's shapes; the datamodule calls them in its constructor.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.data.features import dynamic_feature_stack, num_time_features
from lightning_dpts.data.sampler import WindowStore, check_float32_range
from lightning_dpts.data.sources import BUNDLED_DATASETS, SeriesCollection, to_collection
from lightning_dpts.data.store import SeriesStore, StoreWindows, is_store_path, open_store, series_lengths
from lightning_dpts.errors import ConfigurationError

__all__ = ["check_time_feat_width", "collect", "drop_short", "dynamic_features", "inspect_model", "plan_fields",
           "read_file", "static_block", "too_short", "window_lengths", "window_stores"]

_TARGET_KEYS = ("past_target", "past_observed_values", "future_target", "future_observed_values")
_PRODUCIBLE = set(_TARGET_KEYS) | {
    "past_time_feat",
    "future_time_feat",
    "feat_static_cat",
    "feat_static_real",
}


def too_short(lengths: Any, prediction_length: int, held_out_windows: int) -> np.ndarray:
    """Which series are too short to train on: a boolean mask over ``lengths`` (time steps, public metadata).

    A series is too short when its training part, what is left after the ``held_out_windows`` windows of
    ``prediction_length`` steps held out at its end (test and validation windows), is shorter than
    ``prediction_length``: no training window fits in it. The one rule that
    :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` refuses (or drops, ``drop_short_series=True``)
    by, and that the recipe's :meth:`~lightning_dpts.recipe.PrivateTraining.keep` leaves out by (issue 38: they
    disagreed).
    """
    sizes = np.asarray([int(n) for n in lengths], dtype=np.int64)
    return sizes - int(held_out_windows) * int(prediction_length) < int(prediction_length)


def _require_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigurationError(name, value, f"must be an integer >= {minimum}")
    return int(value)


def read_file(path: str | os.PathLike[str], freq: str | None, id_column: str, timestamp_column: str,
               value_column: str | Sequence[str]) -> tuple[pd.DataFrame, str]:
    """A long-format CSV/Parquet file as ``dpts fit`` reads it
    (:func:`~lightning_dpts.data.loading.load_long_table`)."""
    from lightning_dpts.data.loading import load_long_table

    if not os.path.isfile(path):
        raise ConfigurationError("data", str(path), "is neither a bundled dataset name "
                                 f"({', '.join(sorted(BUNDLED_DATASETS))}) nor an existing CSV/Parquet file")
    if not isinstance(value_column, str):
        raise ConfigurationError("value_column", value_column, "must be one column name when data is a file")
    return load_long_table(path, id_column, timestamp_column, value_column, freq)

def collect(data: Any, freq: str | None, id_column: str, timestamp_column: str,
            value_column: str | Sequence[str]) -> SeriesCollection | SeriesStore:
    """The datamodule's input as a :class:`~lightning_dpts.data.sources.SeriesCollection`, or, for a series store
    (a :class:`~lightning_dpts.data.store.SeriesStore` or a ``.arrow`` path), the memory-mapped store itself."""
    if isinstance(data, SeriesStore) or is_store_path(data):
        return open_store(data, freq)
    if isinstance(data, (str, os.PathLike)) and str(data) not in BUNDLED_DATASETS:
        data, freq = read_file(data, freq, id_column, timestamp_column, value_column)
        id_column, timestamp_column, value_column = "item_id", "timestamp", "target"
    return to_collection(data, freq=freq, id_column=id_column, timestamp_column=timestamp_column,
                         value_column=value_column)


def window_stores(collection: SeriesCollection | SeriesStore, train_lengths: np.ndarray, past_length: int,
                  prediction_length: int, feature_kind: str) -> tuple[Any, Any]:
    """(all windows, training windows): :class:`~lightning_dpts.data.store.StoreWindows` over a store (index
    arithmetic over the mapping, no copy; issue 41), else padded :class:`~lightning_dpts.data.sampler.WindowStore`
    arrays of the series and of their training parts."""
    if isinstance(collection, SeriesStore):
        kind = "gluonts" if feature_kind == "gluonts" else "none"
        return (StoreWindows(collection, collection.lengths, past_length, prediction_length, kind),
                StoreWindows(collection, train_lengths, past_length, prediction_length, kind))
    dynamic = dynamic_features(collection, feature_kind)
    full = WindowStore(collection.targets, past_length, prediction_length, dynamic, names=collection.item_ids)
    train = WindowStore(
        [t[:n] for t, n in zip(collection.targets, train_lengths, strict=True)], past_length, prediction_length,
        None if dynamic is None else [d[:n] for d, n in zip(dynamic, train_lengths, strict=True)],
        names=collection.item_ids,
    )
    return full, train


def inspect_model(
    model: Any,
) -> tuple[dict[str, tuple[int, ...]] | None, int | None, int | None, int | None]:
    """(input name -> shape for batch size 1, past length, context length, prediction length)."""
    if model is None:
        return None, None, None, None
    inner = getattr(model, "model", model)
    if not hasattr(inner, "describe_inputs"):
        raise ConfigurationError(
            "model",
            type(model).__name__,
            "must be a GluonTS torch model/LightningModule with describe_inputs()",
        )
    spec = inner.describe_inputs(1)
    inputs = {name: tuple(int(s) for s in spec[name].shape) for name in spec}
    past = inputs["past_target"][1] if "past_target" in inputs else None
    context = getattr(inner, "context_length", None)
    prediction = getattr(inner, "prediction_length", None)
    return inputs, past, context, prediction

def drop_short(collection: SeriesCollection, drop: bool, prediction_length: int, held_out_windows: int
               ) -> tuple[SeriesCollection, list[str]]:
    """The collection without the series whose training part (length minus ``held_out_windows`` windows of
    ``prediction_length``) is shorter than ``prediction_length``, and their names; refused unless ``drop``."""
    held_out = held_out_windows * prediction_length
    lengths = series_lengths(collection)  # a store's index: no series is read (issue 41)
    mask = too_short(lengths, prediction_length, held_out_windows)
    short = [int(i) for i in np.flatnonzero(mask)]
    if not short:
        return collection, []
    if not drop:
        item = collection.item_ids[short[0]]
        raise ConfigurationError(
            "data",
            f"series {item!r} of length {int(lengths[short[0]])}",
            f"its training part (length - {held_out} held-out steps) must have >= prediction_length="
            f"{prediction_length} steps; {len(short)} series are too short. Pass "
            "drop_short_series=True to drop them",
        )
    dropped = set(short)  # built once: the membership test inside the loop made this quadratic
    keep = [i for i in range(collection.num_series) if i not in dropped]
    if not keep:
        raise ConfigurationError("data", f"{len(short)} series", "all series are too short; none is left")
    warnings.warn(
        f"dropped {len(short)} of {collection.num_series} series whose training part is shorter than "
        f"prediction_length={prediction_length}",
        UserWarning,
        stacklevel=3,
    )
    return collection.subset(keep), [collection.item_ids[i] for i in short]

def plan_fields(
    inputs: dict[str, tuple[int, ...]] | None, collection: SeriesCollection
) -> tuple[tuple[str, ...], str, int, int]:
    """Batch keys, dynamic-feature kind, static cat width, static real width."""
    has_time = collection.starts is not None and collection.freq is not None
    if inputs is None:
        keys = list(_TARGET_KEYS)
        kind = "gluonts" if has_time else ("user" if collection.feat_dynamic_real is not None else "none")
        if kind != "none":
            keys += ["past_time_feat", "future_time_feat"]
        cat = 1 if collection.feat_static_cat is None else collection.feat_static_cat.shape[1]
        real = 1 if collection.feat_static_real is None else collection.feat_static_real.shape[1]
        return tuple(keys + ["feat_static_cat", "feat_static_real"]), kind, cat, real
    if "past_target" not in inputs:
        raise ConfigurationError("model", sorted(inputs), "must declare a 'past_target' input")
    unknown = sorted(set(inputs) - _PRODUCIBLE)
    if unknown:
        raise ConfigurationError(
            "model", f"input {unknown[0]!r}", f"the datamodule produces only {sorted(_PRODUCIBLE)}"
        )
    keys = [k for k in inputs if k not in ("future_target", "future_observed_values")]
    keys += ["future_target", "future_observed_values"]
    kind = "none"
    if "past_time_feat" in inputs or "future_time_feat" in inputs:
        width = inputs.get("past_time_feat", inputs.get("future_time_feat"))[-1]
        user = 0 if collection.feat_dynamic_real is None else collection.feat_dynamic_real[0].shape[1]
        full = num_time_features(collection.freq) + 1 + user if has_time else None
        if width == 0:
            kind = "none"
        elif full is not None and width == full:
            kind = "gluonts"
        elif user and width == user:
            kind = "user"
        else:
            raise ConfigurationError(
                "model",
                f"num_feat_dynamic_real={width}",
                f"the datamodule builds time features + age + feat_dynamic_real = {full} columns "
                f"(needs time stamps and freq; got freq={collection.freq!r}) "
                f"or the user's {user} columns",
            )
    cat = inputs.get("feat_static_cat", (1, 0))[-1]
    real = inputs.get("feat_static_real", (1, 0))[-1]
    return tuple(keys), kind, cat, real

def static_block(collection: SeriesCollection, given: np.ndarray | None, width: int, dtype: type, name: str
                 ) -> np.ndarray:
    """One static feature block, ``[num_series, width]`` (zeros where the data has none)."""
    num = collection.num_series
    if given is None:
        # GluonTS estimators add a dummy static feature ([0] / [0.0]) when none exists.
        return np.zeros((num, width), dtype=dtype)
    if given.shape[1] != width:
        raise ConfigurationError(name, f"{given.shape[1]} columns", f"the model expects {width}")
    if np.issubdtype(dtype, np.floating):
        check_float32_range(list(np.asarray(given, dtype=np.float64)), name, collection.item_ids)
    return np.ascontiguousarray(given, dtype=dtype)

def dynamic_features(collection: SeriesCollection, kind: str) -> list[np.ndarray] | None:
    """Each series' dynamic features (time features, age, the user's columns), or ``None``."""
    if kind == "none":
        return None
    out = []
    for n, target in enumerate(collection.targets):
        out.append(
            dynamic_feature_stack(
                None if collection.starts is None else collection.starts[n],
                len(target),
                collection.freq,
                None if collection.feat_dynamic_real is None else collection.feat_dynamic_real[n],
                kind,
            )
        )
    return out

def check_time_feat_width(inputs: dict[str, tuple[int, ...]] | None, store: WindowStore) -> None:
    """The time-feature width the model declares is the one built."""
    if inputs is None or "past_time_feat" not in inputs:
        return
    expected, got = inputs["past_time_feat"][-1], store.dynamic.shape[-1]
    if expected != got:  # pragma: no cover - guarded by plan_fields
        raise ConfigurationError("model", f"num_feat_dynamic_real={expected}", f"the datamodule built {got}")


def window_lengths(context_length: int | None, prediction_length: int | None, past_length: int | None,
                   model_context: int | None, model_prediction: int | None, model_past: int | None
                   ) -> tuple[int, int, int]:
    """(context, prediction, past) lengths: the given ones, else the model's; given ones must match the model's."""
    if prediction_length is None:
        prediction_length = model_prediction
    if prediction_length is None:
        raise ConfigurationError("prediction_length", None, "give it, or a model that knows it")
    prediction_length = _require_int("prediction_length", prediction_length, 1)
    if model_prediction is not None and model_prediction != prediction_length:
        raise ConfigurationError(
            "prediction_length",
            prediction_length,
            f"must match the model's prediction_length={model_prediction}",
        )
    if context_length is None:
        context_length = model_context
    if context_length is None:
        raise ConfigurationError("context_length", None, "give it, or a model that knows it")
    context_length = _require_int("context_length", context_length, 1)
    if model_context is not None and model_context != context_length:
        raise ConfigurationError(
            "context_length", context_length, f"must match the model's context_length={model_context}"
        )
    if past_length is None:
        past_length = model_past if model_past is not None else context_length
    past_length = _require_int("past_length", past_length, context_length)
    if model_past is not None and model_past != past_length:
        raise ConfigurationError(
            "past_length", past_length, f"must match the past length the model reads ({model_past})"
        )
    return context_length, prediction_length, past_length

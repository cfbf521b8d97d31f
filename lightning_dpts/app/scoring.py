"""Forecasting and scoring the held-out test windows of a ``dpts fit`` run: the models' quantile matrices, the
unclipped truth of a clipped run, the baselines (:mod:`lightning_dpts.baselines`: seasonal naive with calibrated
intervals, AutoETS, AutoTheta) as GluonTS forecasts, and the pooled metrics
(:func:`lightning_dpts.evaluation.score_windows`). Computed from the private data without DP: the results belong
under ``private/`` (or in a DP release, :func:`lightning_dpts.app.reporting.dp_metrics`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["baseline_forecasts", "raw_evaluation", "score_forecasts", "score_models", "score_paired"]


def _histories(inputs: list[dict[str, Any]]) -> list[np.ndarray]:
    """The inputs' histories as they are (views of the series, float32; no per-window copy: issue 41). Every
    consumer reads them as float64 itself, one window at a time, which gives the same numbers as a float64 copy."""
    return [np.asarray(entry["target"]) for entry in inputs]


def score_forecasts(forecasts: list[Any], labels: list[np.ndarray]) -> dict[str, float]:
    """Mean weighted quantile loss (GluonTS ``mean_wQuantileLoss``, the paper's CRPS) and MAE of the median.

    One window per forecast, pooled: :func:`lightning_dpts.evaluation.score_windows` without histories.
    """
    from lightning_dpts.evaluation import score_windows

    n = len(forecasts)
    scores = score_windows(_matrices(forecasts), labels, [np.empty(0)] * n, [0] * n, season=1)
    return {"crps": scores["crps"], "mae": scores["mae"]}


def _matrices(forecasts: Sequence[Any]) -> Sequence[np.ndarray]:
    """``forecasts`` as (horizon, quantiles) matrices: a :class:`~lightning_dpts.evaluation.QuantileForecasts` as
    it is, GluonTS forecasts converted into one."""
    from lightning_dpts.evaluation import QuantileForecasts

    if isinstance(forecasts, QuantileForecasts):
        return forecasts
    return QuantileForecasts.collect(forecasts, len(forecasts))


def raw_evaluation(dm: Any, pairs: list[Any], raw_table: pd.DataFrame,
                    freq: str) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """Unclipped inputs and labels of the test windows (clipping changes only what the private model is trained on).

    The raw table has the clipped table's geometry (clipping keeps every row), so the raw series are read at the
    same positions: history = the first ``len(history)`` values, label = the next ``prediction_length``.
    """
    from lightning_dpts.data.sources import to_collection

    raw = to_collection(raw_table, freq=freq, id_column="item_id", timestamp_column="timestamp", value_column="target")
    by_id = dict(zip(raw.item_ids, raw.targets, strict=True))
    inputs, labels = [], []
    for entry, _ in pairs:
        series = np.asarray(by_id[entry["item_id"]], dtype=float).reshape(len(by_id[entry["item_id"]]), -1)[:, 0]
        n = len(entry["target"])
        inputs.append({**entry, "target": np.asarray(series[:n], dtype=np.float32)})
        labels.append(series[n:n + dm.prediction_length])
    return inputs, labels


def baseline_forecasts(raw_inputs: list[dict[str, Any]], prediction_length: int, season: int, *,
                       statsforecast: bool = True, cache: Any = None, progress: Any = None,
                       max_windows: int | None = None) -> tuple[dict[str, Any], Any]:
    """The baselines of :func:`lightning_dpts.baselines.baseline_quantiles` from the unclipped histories, each as a
    :class:`~lightning_dpts.evaluation.QuantileForecasts` (one array; what the scoring, the plots and the DP
    release read); returns ``(forecasts by name, the :class:`~lightning_dpts.baselines.Baselines` with the fallback
    counts and the skip reason)``, whose ``forecasts`` are those arrays too. With ``max_windows`` the statsforecast
    baselines hold only the windows of ``Baselines.subset``."""
    from lightning_dpts.baselines import baseline_quantiles
    from lightning_dpts.evaluation import QuantileForecasts

    histories = _histories(raw_inputs)
    result = baseline_quantiles(histories, prediction_length, season, statsforecast=statsforecast, cache=cache,
                                progress=progress, max_windows=max_windows)
    for name in list(result.forecasts):  # one array each, replacing the list of per-window arrays
        result.forecasts[name] = QuantileForecasts.collect(result.forecasts[name], len(result.forecasts[name]))
    return dict(result.forecasts), result


def score_models(predictions: dict[str, Sequence[Any]], labels: list[np.ndarray], raw_inputs: list[dict[str, Any]],
                 windows: list[int], season: int) -> dict[str, dict[str, Any]]:
    """Pooled metrics of every model's forecasts (:func:`~lightning_dpts.evaluation.score_windows`; GluonTS forecasts
    or :class:`~lightning_dpts.evaluation.QuantileForecasts`). Each history's seasonal error (MASE's scale, a pass
    over the history) is computed once for all models."""
    from lightning_dpts.evaluation import score_windows, seasonal_errors

    histories = _histories(raw_inputs)
    scales = seasonal_errors(histories, season) if len(predictions) else None
    return {name: score_windows(_matrices(fc), labels, histories, windows, season, scales=scales)
            for name, fc in predictions.items()}


def score_paired(predictions: dict[str, Sequence[Any]], labels: list[np.ndarray], raw_inputs: list[dict[str, Any]],
                 windows: list[int], season: int, subset: list[int] | None
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]] | None]:
    """(metrics every model is compared by, metrics over every window or ``None``).

    ``subset`` (:attr:`~lightning_dpts.baselines.Baselines.subset`): the windows the statsforecast baselines were
    fitted to, whose lists hold those windows only. Then every model is scored on those windows (a paired
    comparison: the table and the verdict), and the models that forecast every window are also scored on all of
    them. ``None``: one scoring over every window."""
    from lightning_dpts.baselines import STATSFORECAST_BASELINES

    if subset is None:
        return score_models(predictions, labels, raw_inputs, windows, season), None
    full = {k: v for k, v in predictions.items() if k not in STATSFORECAST_BASELINES}
    every = score_models(full, labels, raw_inputs, windows, season)

    def pick(seq: Sequence[Any]) -> Sequence[Any]:
        from lightning_dpts.evaluation import QuantileForecasts

        return seq.take(subset) if isinstance(seq, QuantileForecasts) else [seq[i] for i in subset]

    paired = {k: (v if k in STATSFORECAST_BASELINES else pick(v)) for k, v in predictions.items()}
    return score_models(paired, pick(labels), pick(raw_inputs), pick(windows), season), every

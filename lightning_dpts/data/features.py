"""Dynamic features as GluonTS's estimators build them, computed once per series (not per window).

The stack matches ``DeepAREstimator.create_transformation``: time features for the frequency
(``gluonts.time_feature.time_features_from_frequency_str``), then the age feature of ``AddAgeFeature``
(``log10(2 + t)`` for time step ``t = 0, 1, ...`` of the series), then the user's ``feat_dynamic_real``.
All features are public functions of the time stamp or position (or given by the user), never of the
private values, so they do not affect the privacy analysis.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from lightning_dpts.data.seasonality import pandas_alias_notices_hidden

__all__ = ["age_feature", "dynamic_feature_stack", "num_time_features", "time_feature_matrix"]


def _time_feature_functions(freq: str) -> list:
    from gluonts.time_feature import time_features_from_frequency_str

    with pandas_alias_notices_hidden():
        return list(time_features_from_frequency_str(freq))


def num_time_features(freq: str) -> int:
    """How many time features GluonTS derives for ``freq`` (e.g. 1 for monthly: month of year)."""
    return len(_time_feature_functions(freq))


def time_feature_matrix(start: pd.Period, length: int, freq: str) -> np.ndarray:
    """GluonTS time features of ``length`` consecutive steps from ``start``, shape ``[length, F_time]``."""
    functions = _time_feature_functions(freq)
    if not functions or length == 0:
        return np.zeros((length, len(functions)), dtype=np.float32)
    index = pd.period_range(start, periods=length, freq=start.freq)
    return np.stack([np.asarray(f(index), dtype=np.float32) for f in functions], axis=1)


def age_feature(length: int) -> np.ndarray:
    """GluonTS ``AddAgeFeature(log_scale=True)``: ``log10(2 + t)``, shape ``[length, 1]``."""
    return np.log10(2.0 + np.arange(length, dtype=np.float32))[:, None]


def dynamic_feature_stack(
    start: pd.Period | None,
    length: int,
    freq: str | None,
    user_dynamic: np.ndarray | None,
    kind: str,
) -> np.ndarray:
    """The dynamic features of one series, ``[length, F]``.

    Args:
        start: first time stamp of the series (needed when ``kind == "gluonts"``).
        length: number of time steps.
        freq: pandas frequency string (needed when ``kind == "gluonts"``).
        user_dynamic: the series' ``feat_dynamic_real`` as ``[length, F_user]``, or ``None``.
        kind: ``"gluonts"`` for [time features, age, user features] as DeepAR's estimator builds them,
            ``"user"`` for the user's features only (PatchTST's estimator), ``"none"`` for no features.
    """
    parts: list[np.ndarray] = []
    if kind == "gluonts":
        assert start is not None and freq is not None
        parts += [time_feature_matrix(start, length, freq), age_feature(length)]
    if kind in ("gluonts", "user") and user_dynamic is not None:
        parts.append(np.asarray(user_dynamic, dtype=np.float32))
    if not parts:
        return np.zeros((length, 0), dtype=np.float32)
    return np.concatenate(parts, axis=1).astype(np.float32, copy=False)

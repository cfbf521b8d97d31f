"""The forecasts a user gets without any learning: the yardstick a private model must beat (issue 37).

Per held-out window, from the window's own history (everything before the forecast start, unclipped):

* **seasonal naive with calibrated intervals** (:func:`seasonal_naive_quantiles`): the point forecast repeats the
  last season, y_{T+h} = y_{T+h-m(k+1)} with k = floor((h-1)/m) whole seasons ahead; its quantiles are those of a
  Gaussian around it whose standard deviation is the root mean square of the history's own seasonal differences
  (the in-sample residuals of seasonal naive) times sqrt(k + 1), as in Hyndman & Athanasopoulos, *Forecasting:
  Principles and Practice* (3rd ed.), section 5.5, table 5.2. Without a spread its CRPS would be its absolute
  error, a yardstick that flatters any probabilistic model;
* **AutoETS** and **AutoTheta** (statsforecast, the optional extra ``lightning-dpts[baselines]``): fitted to each
  window's history, with their own prediction intervals read at the quantile levels (levels 20/40/60/80 give the
  quantiles 0.1 ... 0.9). When statsforecast is missing they are skipped and the evaluation says so
  (:data:`STATSFORECAST_HINT`); a fit that fails on one window (a history too short for the model) falls back to
  seasonal naive for that window and is counted (``fallbacks``).

Everything here is computed from private data without noise: the results belong under a run's ``private/``
folder. :class:`BaselineCache` memoises the statsforecast forecasts by the exact history, horizon, season and
levels (they depend on nothing else: not on the seed, the budget or the model), in memory and, for benchmarks, in
a file the caller keeps with the data.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dpts.errors import ConfigurationError

__all__ = ["BASELINES", "BASELINE_WINDOWS", "STATSFORECAST_BASELINES", "STATSFORECAST_HINT", "SUBSAMPLE_SEED",
           "BaselineCache", "Baselines", "baseline_quantiles", "baseline_subset", "best_baseline",
           "seasonal_naive_quantiles", "statsforecast_available", "statsforecast_quantiles"]

#: The baselines' names in evaluation reports, in the order they are printed.
BASELINES: tuple[str, ...] = ("seasonal_naive", "autoets", "autotheta")
#: The baselines that need statsforecast.
STATSFORECAST_BASELINES: tuple[str, ...] = ("autoets", "autotheta")
#: Default cap on the held-out windows AutoETS and AutoTheta are fitted to (``dpts fit --baseline-windows``; 0: all).
#: They cost ~0.1-0.5 s per window of a long history, the rest of a default ``dpts fit`` ~15 s in all; above the
#: cap a fixed subsample of the windows is scored by every model (:func:`baseline_subset`).
BASELINE_WINDOWS = 120
#: Seed of the subsample :func:`baseline_subset` draws. Not privacy randomness: which windows are scored depends on
#: their count only, and a fixed seed keeps the subsample (and so a cache of the fits) the same in every run.
SUBSAMPLE_SEED = 37
#: How to get the optional baselines.
STATSFORECAST_HINT = "pip install 'lightning-dpts[baselines]' (or pip install statsforecast)"


def statsforecast_available() -> bool:
    """Whether the optional package statsforecast (AutoETS, AutoTheta) can be imported."""
    return importlib.util.find_spec("statsforecast") is not None


def _levels(levels: Sequence[float] | None) -> np.ndarray:
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    out = np.asarray(DEFAULT_QUANTILES if levels is None else levels, dtype=float)
    if out.ndim != 1 or not out.size or not np.all((out > 0) & (out < 1)):
        raise ConfigurationError("levels", levels, "must be quantile levels in (0, 1)")
    return out


def _filled(history: Any) -> np.ndarray:
    """The history as float64 with missing values (NaN) interpolated linearly, ends held; all missing: empty."""
    y = np.asarray(history, dtype=float).reshape(-1)
    ok = np.isfinite(y)
    if ok.all():
        return y
    if not ok.any():
        return np.zeros(0)
    index = np.arange(len(y))
    return np.interp(index, index[ok], y[ok])


def seasonal_naive_quantiles(history: Any, horizon: int, season: int,
                             levels: Sequence[float] | None = None) -> np.ndarray:
    """Seasonal naive's quantile forecast with Gaussian intervals from the history's seasonal differences.

    Args:
        history: the values before the forecast start (NaN: missing, interpolated).
        horizon: H, steps to forecast.
        season: m >= 1 (a history of at most m values falls back to m = 1, the last value).
        levels: quantile levels (default 0.1, ..., 0.9).

    Returns:
        ``[H, Q]``: y_{T+h-m(k+1)} + sigma sqrt(k + 1) z_q with k = floor((h-1)/m), sigma the root mean square of
        the finite seasonal differences y_t - y_{t-m} of the history (FPP3 section 5.5, seasonal naive), z_q the
        standard normal quantile. An empty history forecasts 0 with no spread.
    """
    q = _levels(levels)
    if isinstance(season, bool) or not isinstance(season, (int, np.integer)) or season < 1:
        raise ConfigurationError("season_length", season, "must be an integer >= 1")
    raw = np.asarray(history, dtype=float).reshape(-1)
    y = _filled(raw)
    n = len(y)
    if n == 0:
        return np.zeros((horizon, len(q)))
    m = int(season) if n > season else 1
    h = np.arange(horizon)
    point = y[n - m + h % m]
    diff = raw[m:] - raw[:-m]  # residuals of the observed values only: interpolated ones would shrink sigma
    diff = diff[np.isfinite(diff)]
    sigma = float(np.sqrt(np.mean(diff ** 2))) if diff.size else 0.0
    from scipy.stats import norm

    spread = sigma * np.sqrt(h // m + 1.0)
    return point[:, None] + spread[:, None] * norm.ppf(q)[None, :]


def _interval_levels(q: np.ndarray) -> list[int]:
    """statsforecast's interval levels (percent) whose ends are the quantiles ``q`` (0.5: the mean)."""
    widths = np.abs(2 * q - 1) * 100
    if not np.allclose(widths, np.round(widths), atol=1e-9):
        raise ConfigurationError("levels", q.tolist(), "must be quantiles whose central intervals have whole "
                                 "percent levels (as 0.1, ..., 0.9) for the statsforecast baselines")
    return sorted({int(round(w)) for w in widths if w > 0})


def statsforecast_quantiles(method: str, history: Any, horizon: int, season: int,
                            levels: Sequence[float] | None = None) -> np.ndarray:
    """AutoETS' or AutoTheta's ``[H, Q]`` quantile forecast of one history (statsforecast; raises on failure).

    Quantile q < 0.5 is the lower end of the central interval at level 100(1 - 2q) %, q > 0.5 the upper end of the
    one at 100(2q - 1) %, q = 0.5 the mean (the models' intervals are symmetric). Missing values are interpolated.
    """
    q = _levels(levels)
    y = _filled(history)
    if method == "autoets":
        from statsforecast.models import AutoETS as Model
    elif method == "autotheta":
        from statsforecast.models import AutoTheta as Model
    else:
        raise ConfigurationError("method", method, f"must be one of {', '.join(STATSFORECAST_BASELINES)}")
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = Model(season_length=int(season)).forecast(y=y, h=int(horizon), level=_interval_levels(q))
    cols = []
    for level in q:
        width = int(round(abs(2 * level - 1) * 100))
        key = "mean" if width == 0 else f"{'lo' if level < 0.5 else 'hi'}-{width}"
        cols.append(np.asarray(out[key], dtype=float).reshape(-1))
    result = np.stack(cols, axis=-1)
    if result.shape != (horizon, len(q)) or not np.isfinite(result).all():
        raise ValueError(f"{method} gave a forecast of shape {result.shape} with non-finite values")
    return result


class BaselineCache:
    """Memo of baseline forecasts keyed by (method, exact history, horizon, season, levels); bounded (LRU).

    The key hashes the history's float64 bytes, so a hit is the same computation's result. Private, like the
    forecasts: :meth:`save` writes them to a ``.npz`` file that belongs with the data (benchmarks keep it in their
    run directory).
    """

    def __init__(self, max_entries: int = 50_000) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigurationError("max_entries", max_entries, "must be an integer >= 1")
        self.max_entries = max_entries
        self._store: OrderedDict[str, np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(method: str, history: Any, horizon: int, season: int, levels: np.ndarray) -> str:
        digest = hashlib.sha256(np.ascontiguousarray(np.asarray(history, dtype=np.float64)).tobytes())
        digest.update(np.ascontiguousarray(levels, dtype=np.float64).tobytes())
        return f"{method}|{int(horizon)}|{int(season)}|{digest.hexdigest()}"

    def get(self, key: str) -> np.ndarray | None:
        value = self._store.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self._store.move_to_end(key)
        return value

    def put(self, key: str, value: np.ndarray) -> None:
        self._store[key] = np.asarray(value, dtype=float)
        self._store.move_to_end(key)
        while len(self._store) > self.max_entries:
            self._store.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._store

    def __len__(self) -> int:
        return len(self._store)

    def save(self, path: str | Path) -> None:
        """Write every entry to ``path`` (``.npz``, atomically: a temporary file renamed)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, keys=np.asarray(list(self._store), dtype=str),
                 **{f"v{i}": v for i, v in enumerate(self._store.values())})
        tmp.replace(path)

    def load(self, path: str | Path) -> int:
        """Add the entries of a file :meth:`save` wrote (none if it does not exist); returns how many."""
        path = Path(path)
        if not path.is_file():
            return 0
        with np.load(path, allow_pickle=False) as data:
            keys = data["keys"].tolist()
            for i, key in enumerate(keys):
                self.put(str(key), data[f"v{i}"])
        return len(keys)


#: The process's memo (a rerun of the same data in one process, e.g. a test suite or a notebook, refits nothing).
_MEMO = BaselineCache()


@dataclass
class Baselines:
    """The baselines' forecasts of a list of windows.

    Attributes:
        forecasts: name -> one ``[H, Q]`` array per window (seasonal naive always; AutoETS and AutoTheta unless
            skipped).
        fallbacks: name -> windows on which the model failed and seasonal naive stands in for it.
        skipped: why AutoETS and AutoTheta were not run (``None``: they were).
        subset: the positions of the windows AutoETS and AutoTheta were fitted to, when capped
            (:func:`baseline_subset`; their lists then hold those windows only, in this order); ``None``: every one.
    """

    forecasts: dict[str, list[np.ndarray]]
    fallbacks: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None
    subset: list[int] | None = None


def baseline_subset(count: int, most: int | None) -> list[int] | None:
    """Positions of the windows AutoETS and AutoTheta are fitted to: all (``None``) when ``count <= most`` or
    ``most`` is 0/``None``, else ``most`` of them drawn uniformly without replacement by a generator seeded with
    :data:`SUBSAMPLE_SEED` (sorted). A function of the two counts only: the same windows in every run on the same
    data, whatever the seed, the budget or the model, so the comparison is paired and its fits can be cached."""
    for name, value in (("windows", count), ("baseline_windows", most)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0):
            raise ConfigurationError(name, value, "must be an integer >= 0")
    if not most or count <= most:
        return None
    return sorted(int(i) for i in np.random.default_rng(SUBSAMPLE_SEED).choice(count, size=int(most), replace=False))


def baseline_quantiles(histories: Sequence[Any], horizon: int, season: int, *, statsforecast: bool = True,
                       levels: Sequence[float] | None = None, cache: BaselineCache | None = None,
                       progress: Any = None, max_windows: int | None = None) -> Baselines:
    """Every baseline's ``[H, Q]`` forecast of each history (module docstring).

    Args:
        histories: one history per window (unclipped values before the forecast start).
        horizon: H.
        season: m, the primary season.
        statsforecast: also run AutoETS and AutoTheta (skipped, with the reason in ``skipped``, when the package
            is missing).
        levels: quantile levels (default 0.1, ..., 0.9).
        cache: where to memoise the statsforecast forecasts (default: the process's memo).
        progress: ``callable(str)`` told once how many fits will run (``None``: silent).
        max_windows: fit AutoETS and AutoTheta to at most this many windows (:func:`baseline_subset`; the result's
            ``subset`` says which); ``None`` or 0: every window. Seasonal naive always forecasts every window.
    """
    q = _levels(levels)
    out = Baselines({"seasonal_naive": [seasonal_naive_quantiles(h, horizon, season, q) for h in histories]})
    if not statsforecast:
        out.skipped = "not asked for (--no-baselines)"
        return out
    if not statsforecast_available():
        out.skipped = f"the optional package statsforecast is not installed ({STATSFORECAST_HINT})"
        return out
    memo = _MEMO if cache is None else cache
    out.subset = baseline_subset(len(histories), max_windows)
    chosen = range(len(histories)) if out.subset is None else out.subset
    fitted = [histories[i] for i in chosen]
    naives = [out.forecasts["seasonal_naive"][i] for i in chosen]
    keys = {name: [BaselineCache.key(name, _filled(h), horizon, season, q) for h in fitted]
            for name in STATSFORECAST_BASELINES}
    todo = sum(any(keys[name][i] not in memo for name in keys) for i in range(len(fitted)))
    if progress is not None and todo:
        which = "" if out.subset is None else (f" (a fixed subsample of the {len(histories)} windows; every model is "
                                               "compared on it; --baseline-windows 0 fits all)")
        progress(f"fitting AutoETS and AutoTheta to {todo} held-out window histories{which} (statsforecast; "
                 "--no-baselines skips them) ...")
    for name in STATSFORECAST_BASELINES:
        forecasts, failed = [], 0
        for history, key, naive in zip(fitted, keys[name], naives, strict=True):
            value = memo.get(key)
            if value is None:
                try:
                    value = statsforecast_quantiles(name, history, horizon, season, q)
                except Exception:  # statsforecast refuses tiny or degenerate histories: seasonal naive stands in
                    value = np.full_like(naive, np.nan)
                memo.put(key, value)
            if not np.isfinite(value).all():
                failed += 1
                value = naive
            forecasts.append(value)
        out.forecasts[name] = forecasts
        out.fallbacks[name] = failed
    return out


def best_baseline(metrics: dict[str, dict[str, Any]], metric: str) -> tuple[str, float] | None:
    """(name, value) of the baseline with the lowest finite ``metric`` in ``metrics`` (``None`` if none has one)."""
    scored = [(float(m[metric]), name) for name, m in metrics.items()
              if name in BASELINES and metric in m and math.isfinite(float(m[metric]))]
    if not scored:
        return None
    value, name = min(scored)
    return name, value

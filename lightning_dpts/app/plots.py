"""The plots ``dpts fit`` writes: epsilon against optimizer step, and forecasts of a few test windows.

``epsilon.png`` (:func:`plot_epsilon`) shows only privacy accounting (no data; ``dpts fit`` computes the curve from
the accountant, not from the training log). ``private/forecasts.png`` (:func:`plot_forecasts`) shows **private
data**: the history and the held-out truth of some series, and the forecasts of models trained on them (the non-DP
reference model carries no guarantee at all). Do not publish it for private data; ``dpts fit --no-private-plots``
(or ``--no-private-outputs``) skips it (:data:`PRIVATE_PLOT_NOTICE` is what the manifest says). Every plot is
written atomically (:func:`save_figure`).
"""

from __future__ import annotations

import textwrap
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.outputs import pyplot, save_figure

__all__ = ["PRIVATE_PLOT_NOTICE", "plot_epsilon", "plot_forecasts", "read_epsilon_log", "save_figure"]

#: The sentence ``report.json`` carries about ``forecasts.png``.
PRIVATE_PLOT_NOTICE = (
    "forecasts.png shows private data (the history and held-out values of the first series and forecasts of "
    "models trained on them; the non-DP model has no privacy guarantee): it is not covered by the (epsilon, "
    "delta) guarantee - do not publish it for private data, or run with --no-private-plots / --no-private-outputs"
)

_COLORS = {"dp": "C0", "non_dp": "C1", "seasonal_naive": "C2", "autoets": "C4"}
_LABELS = {"dp": "private model (DP-SGD)", "non_dp": "same model, no DP", "seasonal_naive": "seasonal naive",
           "autoets": "AutoETS"}


def read_epsilon_log(metrics_csv: str | Path, name: str = "epsilon") -> tuple[np.ndarray, np.ndarray]:
    """(optimizer steps 1..n, logged epsilon) from a Lightning ``CSVLogger`` ``metrics.csv``."""
    metrics = pd.read_csv(metrics_csv)
    if name not in metrics:
        return np.zeros(0, dtype=int), np.zeros(0)
    eps = metrics.dropna(subset=[name])
    return eps["step"].to_numpy(dtype=int) + 1, eps[name].to_numpy(dtype=float)


def plot_epsilon(path: str | Path, steps: Sequence[int] | np.ndarray, epsilon: Sequence[float] | np.ndarray, *,
                 budget: float, delta: float, theorem: str | None = None, kind: str | None = None,
                 spent: float | None = None) -> Path:
    """Epsilon spent against optimizer step, the budget as a dashed line, delta and the theorem in the title.

    Args:
        path: the PNG file to write.
        steps: optimizer step numbers (1-based).
        epsilon: the logged epsilon after each step (a sound upper bound within 1% of the epsilon spent; see
            AccountantCallback).
        budget: the epsilon budget.
        delta: the delta of every epsilon on the plot.
        theorem, kind: the accountant's theorem and bound kind (e.g. ``"Theorem 4.4"``, ``"tight"``).
        spent: the exact final epsilon of the report (marked with a dot), if known.
    """
    plt = pyplot()
    steps = np.asarray(steps)
    epsilon = np.asarray(epsilon, dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(steps, epsilon, color="C0", label=f"epsilon spent after each step (upper bound, delta = {delta:g})")
    ax.axhline(budget, color="C3", linestyle="--", label=f"budget epsilon = {budget:g}")
    if spent is not None and len(steps):
        ax.plot([steps[-1]], [spent], "o", color="C0", label=f"final epsilon = {spent:.4g}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("epsilon")
    ax.set_ylim(0, max(budget, float(epsilon.max()) if len(epsilon) else 0.0) * 1.1)
    if len(steps):
        ax.set_xlim(0, max(int(steps[-1]), 1))
    source = ", ".join(x for x in (theorem, None if kind is None else f"{kind} bound") if x)
    # the theorem can be long ("Theorem 4.4, max over 10 series lengths (...)"): wrap it below the headline
    lines = [f"Privacy spent after each optimizer step, delta = {delta:g}"]
    lines += textwrap.wrap(source, width=80) if source else []
    ax.set_title("\n".join(lines), fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _dates(start: Any, length: int, offset: int = 0) -> Any:
    """Time stamps (matplotlib-friendly) of ``length`` steps from ``start + offset``, or step indices."""
    if isinstance(start, pd.Period):
        return pd.period_range(start + offset, periods=length, freq=start.freq).to_timestamp()
    return np.arange(offset, offset + length)


def plot_forecasts(path: str | Path, inputs: Sequence[Mapping[str, Any]], labels: Sequence[np.ndarray],
                   forecasts: Mapping[str, Sequence[Any]], *, names: Mapping[str, str] | None = None,
                   count: int = 4, history: int = 48) -> Path:
    """Forecasts of the first ``count`` test windows: every model's median, the DP model's 10-90% band, truth.

    Args:
        path: the PNG file to write. **The plot shows private data** (see :data:`PRIVATE_PLOT_NOTICE`).
        inputs: GluonTS input entries (``target`` history, ``start`` Period, ``item_id``).
        labels: the true values after each history (``prediction_length`` each).
        forecasts: model key (``"dp"``, ``"non_dp"``, ``"seasonal_naive"``, ...) -> GluonTS forecasts (or a
            :class:`~lightning_dpts.evaluation.QuantileForecasts`) in the order of ``inputs``. ``"dp"`` gets the
            10-90% band; every model gets its median.
        names: item id -> readable series name (e.g. the bundled data's ``title``); the title shows both.
        count: number of windows (panels).
        history: past time steps shown before the forecast start.
    """
    from lightning_dpts.evaluation import quantile_matrix
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    if not inputs or count < 1:
        raise ConfigurationError("count", min(count, len(inputs)), "needs at least one forecast window to plot")
    plt = pyplot()
    count = min(count, len(inputs))
    fig, axes = plt.subplots(count, 1, figsize=(7.5, 2.4 * count + 0.6), squeeze=False)
    every = [k for k in forecasts if len(forecasts[k]) == len(inputs)]  # a subsample's baselines are not aligned
    order = [k for k in ("dp", "non_dp", "seasonal_naive", "autoets") if k in every]
    order += [k for k in every if k not in order]
    for row, ax in enumerate(axes[:, 0]):
        entry, truth = inputs[row], np.asarray(labels[row], dtype=float)
        target = np.asarray(entry["target"], dtype=float)
        shown = min(history, len(target))
        start = entry.get("start")
        t_past = _dates(start, shown, len(target) - shown)
        t_future = _dates(start, len(truth), len(target))
        ax.plot(t_past, target[len(target) - shown:], color="black", lw=1, label="history")
        for i, key in enumerate(order):
            color = _COLORS.get(key, f"C{5 + i}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                matrix = quantile_matrix(forecasts[key][row])
                median = matrix[:, DEFAULT_QUANTILES.index(0.5)]
                if key == "dp":
                    lo, hi = (matrix[:, DEFAULT_QUANTILES.index(q)] for q in (0.1, 0.9))
                    ax.fill_between(t_future, lo, hi, color=color, alpha=0.25, label="DP 10-90%")
            ax.plot(t_future, median, color=color, lw=1.4, ls="-" if key == "dp" else "--",
                    label=f"{_LABELS.get(key, key)} (median)")
        ax.plot(t_future, truth, color="black", lw=1, marker="o", markersize=2.5, zorder=5, label="truth")
        item = str(entry.get("item_id", ""))
        name = (names or {}).get(item)
        ax.set_title(f"{name} ({item})" if name and name != item else item, fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("date" if isinstance(inputs[0].get("start"), pd.Period) else "time step")
    fig.suptitle("Test-window forecasts - shows PRIVATE data, not covered by the DP guarantee", fontsize=9)
    handles, texts = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, texts, fontsize=7, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.06 if count > 1 else 0.1, 1, 1))
    return save_figure(fig, path, dpi=120)

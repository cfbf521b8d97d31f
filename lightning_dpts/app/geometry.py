"""What ``dpts fit`` trains on, from public metadata: the options the recipe fills, the held-out test windows and
the :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` (shared with ``dpts privacy --data``, so that
planning and training cannot disagree)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.app.config import LEGACY_DEFAULTS, RECIPE_FIELDS, FitConfig

__all__ = ["build_datamodule", "fit_test_windows", "resolve_config", "resolve_with_test_windows"]


def resolve_config(config: FitConfig, lengths: Any, freq: str,
                   held_out_windows: int = 1) -> tuple[FitConfig, Any, list[str]]:
    """Fill the options the user left unset: by the recipe for the recipe's model, else :data:`LEGACY_DEFAULTS`.

    Args:
        config: a validated config (``None`` marks an unset option).
        lengths: the length of every series (time steps): public metadata, never values.
        freq: the series' frequency.
        held_out_windows: windows of H steps held out at the end of every series (the rolling test windows).

    Returns:
        ``(resolved config, recipe or None, names of the fields the recipe chose)``. The recipe is computed
        only when the model is unset or one of the recipe's models; explicit values are kept.
    """
    from dataclasses import replace

    from lightning_dpts.recipe import RECIPE_MODEL, RECIPE_MODELS, choose_recipe

    if config.model not in (None, *RECIPE_MODELS):
        fill = {k: v for k, v in LEGACY_DEFAULTS.items() if getattr(config, k) is None}
        return replace(config, **fill), None, []
    recipe = choose_recipe(lengths, freq=freq, prediction_length=config.prediction_length, epsilon=config.epsilon,
                           delta=config.delta, level=config.level, size=config.size,
                           held_out_windows=held_out_windows, min_series_length=config.min_series_length,
                           groups=config.bands if config.bands is not None and not config.monte_carlo else 1,
                           season_length=config.season_length, model=config.model or RECIPE_MODEL)
    choice = {"model": recipe.model, "context_length": recipe.context_length, "epochs": recipe.epochs,
              "batch_size": recipe.batch_size, "max_grad_norm": recipe.max_grad_norm,
              "learning_rate": recipe.learning_rate, "min_series_length": recipe.min_series_length or 1}
    chosen = [name for name in RECIPE_FIELDS if getattr(config, name) is None]
    if config.batch_size is not None and config.epochs is None:
        # the recipe's epochs assume its batch size: keep its number of steps for the given one
        per_epoch = max(1, recipe.num_series // config.batch_size)
        choice["epochs"] = max(1, round(recipe.steps / per_epoch))
    resolved = replace(config, **{name: choice[name] for name in chosen})
    resolved.validate()
    return resolved, recipe, chosen


def resolve_with_test_windows(config: FitConfig, lengths: Any,
                              freq: str) -> tuple[FitConfig, Any, list[str], tuple[int, str] | None]:
    """:func:`resolve_config` planned for the rolling test windows ``dpts fit`` will hold out.

    With ``test_windows`` unset and the recipe in charge, the windows are chosen from the kept lengths and the
    recipe's past window (its model reads no lag beyond it) by
    :func:`~lightning_dpts.evaluation.choose_test_windows`, and the recipe is recomputed for them. Returns
    ``(config, recipe, chosen, planned)`` with ``planned = (windows, explanation)`` or ``None`` (decided later by
    :func:`fit_test_windows`). Public metadata only.
    """
    resolved, recipe, chosen = resolve_config(config, lengths, freq, held_out_windows=config.test_windows or 1)
    if config.test_windows is not None or recipe is None:
        return resolved, recipe, chosen, None
    from lightning_dpts.evaluation import choose_test_windows

    kept = np.asarray(lengths)
    kept = kept[kept >= (resolved.min_series_length or 1)]
    planned = choose_test_windows(kept.tolist(), resolved.context_length, config.prediction_length)
    if planned[0] > 1:
        resolved, recipe, chosen = resolve_config(config, lengths, freq, held_out_windows=planned[0])
    return resolved, recipe, chosen, planned


def fit_test_windows(config: FitConfig, planned: tuple[int, str] | None, table: pd.DataFrame, freq: str,
                     module: Any) -> tuple[int, str]:
    """The number of rolling test windows ``dpts fit`` holds out, and why (given, planned with the recipe, or chosen
    from the lengths and the model's past length including lags)."""
    if config.test_windows is not None:
        return config.test_windows, "given (--test-windows)"
    if planned is not None:
        return planned
    from lightning_dpts.data.layout import inspect_model
    from lightning_dpts.data.sources import to_collection
    from lightning_dpts.evaluation import choose_test_windows

    past = inspect_model(module)[1] or (config.context_length or config.prediction_length)
    lengths = _series_spans(table, freq)
    if lengths is None:
        lengths = [len(t) for t in to_collection(table, freq=freq, id_column="item_id", timestamp_column="timestamp",
                                                 value_column="target").targets]
    if config.drop_short_series:
        lengths = [n for n in lengths if n >= 2 * config.prediction_length] or lengths
    return choose_test_windows(lengths, past, config.prediction_length)


def _series_spans(table: pd.DataFrame, freq: str) -> list[int] | None:
    """Every series' length in steps (first to last time stamp, gaps included, as the datamodule builds them), from
    the store's index or the table's Period ordinals without building the series (issue 41: the series themselves
    cost ~160 bytes per value); ``None`` when the time stamps are not Periods of ``freq``."""
    from lightning_dpts.data.loading import store_of
    from lightning_dpts.data.sources import _multiple, period_freq

    store = store_of(table)
    if store is not None:
        return [int(n) for n in store.lengths]
    stamps = table["timestamp"]
    if not isinstance(stamps.dtype, pd.PeriodDtype) or stamps.dtype.freq.freqstr != period_freq(freq):
        return None
    steps = pd.Series(stamps.array.asi8 // _multiple(period_freq(freq)))
    grouped = steps.groupby(table["item_id"].to_numpy(), sort=False)
    return [int(n) for n in (grouped.max() - grouped.min() + 1).to_numpy()]


def build_datamodule(config: FitConfig, table: Any, freq: str, module: Any, test_windows: int,
                     relation: Any) -> Any:
    """The datamodule ``dpts fit`` trains ``module`` with: ``table`` (columns ``item_id``, ``timestamp``,
    ``target``) sampled as ``config`` says (``bands``: cyclic Poisson sampling in b groups, or b-min-sep with
    ``top_level="b_min_sep"``), ``relation`` protected."""
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.privacy.mechanisms import top_level_from_name

    top_level = config.top_level if config.bands is None else top_level_from_name(config.bands_top_level,
                                                                                  bands=config.bands)
    from lightning_dpts.data.loading import store_of

    store = store_of(table)  # a store, or a table read from one, unchanged: sample from the mapped store (issue 41)
    return StructuredSubsamplingDataModule(
        table if store is None else store, batch_size=config.batch_size,
        instances_per_series=config.instances_per_series,
        top_level=top_level, bottom_level=config.bottom_level, relation=relation,
        context_noise=config.context_noise, forecast_noise=config.forecast_noise, seed=config.seed,
        secure_mode=config.secure_mode, model=module, freq=freq, id_column="item_id", timestamp_column="timestamp",
        value_column="target", drop_short_series=config.drop_short_series, test_windows=test_windows,
    )

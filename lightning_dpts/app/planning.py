"""Plan a privacy budget from the shell with the geometry ``dpts fit`` will train on.

``dpts privacy epsilon|steps|noise`` accounts a :class:`~lightning_dpts.privacy.SamplingSpec`. Typed by hand, two
of its numbers are easy to get wrong: N and L, the length of the shortest *training* part (after the held-out
test windows; Appendix I.1 - using whole series lengths was 7% too optimistic in one trial), and L_C, which must
include every lag the model reads (docs/privacy.md, rule 3). With ``--data PATH`` the spec is instead the
``sampling_spec`` of the very :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` that ``dpts fit``
builds for the same options (data file and columns, ``--model``, ``--context-length``, ``--prediction-length``,
``--batch-size``, ``--instances-per-series``, sampling levels, relation, augmentation; unset options take
``dpts fit``'s defaults), so planning and training cannot disagree. ``--epochs E`` converts to
E * steps_per_epoch optimizer steps (Algorithm 1: floor(N * lambda / Lambda) steps per epoch).

:func:`add_planning_options` adds these options to the ``privacy`` subcommands; :func:`resolve_planning` turns
the parsed arguments into the spec (and fills ``args.steps`` from ``args.epochs``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from lightning_dpts.app.config import FIT_RANGES, FitConfig
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation, SamplingSpec

__all__ = ["add_planning_options", "fit_sampling_spec", "resolve_planning"]

# Options of the manual planning mode that --data replaces (N, L, L_C) or gives dpts fit's defaults to.
_FROM_DATA = ("num_series", "min_length")
_FIT_DEFAULTED = ("context_length", "prediction_length", "batch_size")
_WITH_DATA = {
    "num_series": "required unless --data gives it",
    "min_length": "required unless --data gives it",
    "context_length": "required unless --data; with --data: the model's context as for dpts fit (default: the "
                      "recipe's; the lags of --model are added)",
    "prediction_length": "required unless --data (then default 12)",
    "batch_size": "required unless --data (then dpts fit's default: the recipe's)",
    "steps": "or give --epochs",
}


def add_planning_options(parser: argparse.ArgumentParser, *, needs_steps: bool, multi_steps: bool) -> None:
    """Add ``--data`` (with ``dpts fit``'s data and model options) and ``--epochs`` to a privacy subparser.

    ``--num-series``, ``--min-length``, ``--context-length``, ``--prediction-length``, ``--batch-size`` and
    ``--steps`` become optional at parse time; :func:`resolve_planning` then requires what the chosen mode
    needs and names the missing option.
    """
    from lightning_dpts.app.config import add_option

    for action in parser._actions:  # argparse has no public API to relax ``required`` after the fact
        if action.dest in (*_FROM_DATA, *_FIT_DEFAULTED) or (needs_steps and action.dest == "steps"):
            action.required = False
            action.help = f"{action.help}; {_WITH_DATA[action.dest]}"
    group = parser.add_argument_group(
        "geometry from a data file (instead of --num-series/--min-length; the same options as dpts fit)",
        "N and the shortest training length L are read as the datamodule of dpts fit reads them (after the "
        "held-out test window); the past window includes the lags of --model. Unset options take dpts fit's "
        "defaults (the recipe: docs/recipe.md); --prediction-length defaults to 12.",
    )
    # dpts fit's declarations (lightning_dpts.app.config), with dpts fit's defaults
    add_option(group, "data", default=None, help="long-format CSV or Parquet file")
    for name in ("id_column", "timestamp_column", "value_column", "freq"):
        add_option(group, name, default=FitConfig.__dataclass_fields__[name].default)
    from lightning_dpts.data.columns import add_deprecated_time_column

    add_deprecated_time_column(group)
    add_option(group, "model", default=None,
               help="model of dpts fit, whose lags extend the past window (default: the recipe's)")
    if needs_steps:
        if multi_steps:
            group.add_argument("--epochs", type=int, nargs="+", default=None, metavar="E",
                               help="epochs instead of --steps (E * steps_per_epoch optimizer steps)")
        else:
            group.add_argument("--epochs", type=int, default=None, metavar="E",
                               help="epochs instead of --steps (E * steps_per_epoch optimizer steps)")


def fit_sampling_spec(config: Any, *, num_dims: int = 1) -> SamplingSpec:
    """The ``sampling_spec`` of the datamodule ``dpts fit`` builds for ``config`` (a :class:`FitConfig`).

    Reads the data, fills unset options as ``dpts fit`` does (the recipe,
    :func:`lightning_dpts.app.geometry.resolve_config`, including its short-series threshold), builds the model (for its
    past length: context plus lags) and the :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` with the
    same :func:`~lightning_dpts.app.geometry.build_datamodule` as ``dpts fit``, without training. ``num_dims`` is the
    relation's D (Appendix I.1), which ``dpts fit`` leaves at 1.
    """
    from lightning_dpts.app.forecasters import make_estimator
    from lightning_dpts.app.geometry import build_datamodule, fit_test_windows, resolve_with_test_windows
    from lightning_dpts.data.loading import drop_short_series, load_fit_table
    from lightning_dpts.data.seasonality import pandas_alias_notices_hidden

    config.validate()
    table, freq, _ = load_fit_table(config)
    config, _, _, planned = resolve_with_test_windows(config, table.groupby("item_id", sort=False).size().to_numpy(),
                                                      freq)
    table, _ = drop_short_series(table, config.min_series_length)
    relation = NeighbouringRelation(level=config.level, size=config.size, value_bound=config.value_bound,
                                    num_dims=num_dims)
    with pandas_alias_notices_hidden():
        module = make_estimator(config, freq).create_lightning_module()
    test_windows, _ = fit_test_windows(config, planned, table, freq, module)
    dm = build_datamodule(config, table, freq, module, test_windows, relation)
    return dm.sampling_spec


def resolve_planning(args: argparse.Namespace, manual: Callable[[argparse.Namespace], SamplingSpec]) -> SamplingSpec:
    """The spec for a parsed ``dpts privacy`` command; fills ``args.steps`` from ``args.epochs``.

    Args:
        args: parsed arguments of ``dpts privacy epsilon|steps|noise``.
        manual: builds the spec from ``--num-series``/``--min-length``/... (the CLI's own function).

    Raises:
        ConfigurationError: ``--data`` together with ``--num-series``/``--min-length``; a missing option of the
            chosen mode; both or neither of ``--steps`` and ``--epochs`` where steps are needed; epochs < 1.
    """
    data = getattr(args, "data", None)
    if data is not None:
        for name in _FROM_DATA:
            if getattr(args, name, None) is not None:
                raise ConfigurationError(name, getattr(args, name), "comes from --data; give one or the other")
        values: dict[str, Any] = {
            "data": data, "id_column": args.id_column, "timestamp_column": args.timestamp_column,
            "value_column": args.value_column, "freq": args.freq, "model": args.model or FitConfig.model,
            "instances_per_series": args.instances_per_series, "top_level": args.top_level,
            "bottom_level": args.bottom_level, "level": args.level, "size": args.size,
            "value_bound": args.value_bound, "context_noise": args.context_noise,
            "forecast_noise": args.forecast_noise,
        }
        for name in _FIT_DEFAULTED:
            if getattr(args, name, None) is not None:
                values[name] = getattr(args, name)
        # the recipe (unset options of dpts fit) depends on the budget: plan with the one given here
        for name in ("epsilon", "delta"):
            value, (low, high, _, _) = getattr(args, name, None), FIT_RANGES[name]
            if isinstance(value, float) and low < value <= high:  # else dpts fit's default budget
                values[name] = value
        spec = fit_sampling_spec(FitConfig(**values), num_dims=args.num_dims)
        if not getattr(args, "json", False):
            print(f"geometry of {data} as dpts fit trains on it: N={spec.num_series} series, shortest training "
                  f"length L={spec.min_length}, past window L_C={spec.context_length} (incl. lags), "
                  f"L_F={spec.prediction_length}, Lambda={spec.batch_size}, {spec.steps_per_epoch} steps/epoch")
    else:
        for name in ("model", "freq"):
            if getattr(args, name, None) is not None:
                raise ConfigurationError(name, getattr(args, name), "only applies with --data")
        for name in (*_FROM_DATA, *_FIT_DEFAULTED):
            if getattr(args, name, None) is None:
                raise ConfigurationError(name, None, "is required without --data")
        spec = manual(args)
    _resolve_steps(args, spec)
    return spec


def _resolve_steps(args: argparse.Namespace, spec: SamplingSpec) -> None:
    if not hasattr(args, "epochs"):
        return  # this subcommand takes no steps
    epochs, steps = args.epochs, getattr(args, "steps", None)
    if epochs is not None and steps is not None:
        raise ConfigurationError("epochs", epochs, "give either --steps or --epochs, not both")
    if epochs is None:
        if steps is None:
            raise ConfigurationError("steps", None, "is required (or give --epochs)")
        return
    many = isinstance(epochs, list)
    for e in epochs if many else [epochs]:
        if isinstance(e, bool) or not isinstance(e, int) or e < 1:
            raise ConfigurationError("epochs", e, "must be an integer >= 1")
    per = spec.steps_per_epoch
    args.steps = [e * per for e in epochs] if many else epochs * per

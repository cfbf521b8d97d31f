"""The ``dpts`` command.

``dpts privacy epsilon|steps|noise`` runs the structured-subsampling accountant without torch;
``dpts fit`` runs the main job (train a private forecaster, evaluate, report); ``dpts release
epsilon|noise`` accounts inference-time privacy of released forecasts. Invalid values and
combinations exit with status 2 and a message naming the option.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lightning_dpts.errors import ConfigurationError

__all__ = ["main", "build_parser"]

# Python parameter name (as raised in ConfigurationError) -> command-line option.
_OPTION_NAMES = {
    "num_series": "--num-series",
    "min_length": "--min-length",
    "lengths": "--lengths",
    "context_length": "--context-length",
    "prediction_length": "--prediction-length",
    "batch_size": "--batch-size",
    "instances_per_series": "--instances-per-series",
    "top_level": "--top-level",
    "bottom_level": "--bottom-level",
    "noise_multiplier": "--noise-multiplier",
    "level": "--level",
    "size": "--size",
    "value_bound": "--value-bound",
    "relation.value_bound": "--value-bound",
    "context_noise": "--context-noise",
    "forecast_noise": "--forecast-noise",
    "num_dims": "--num-dims",
    "bound": "--bound",
    "delta": "--delta",
    "steps": "--steps",
    "epsilon": "--epsilon",
    "data": "--data",
    "id_column": "--id-column",
    "time_column": "--time-column",
    "value_column": "--value-column",
    "freq": "--freq",
    "model": "--model",
    "epochs": "--epochs",
    "max_grad_norm": "--max-grad-norm",
    "learning_rate": "--learning-rate",
    "seed": "--seed",
    "autoets": "--autoets",
    "config": "--config",
}


def _add_privacy_options(parser: argparse.ArgumentParser, *, needs_noise: bool, multi_steps: bool,
                         needs_steps: bool, needs_epsilon: bool) -> None:
    from lightning_dpts.privacy.spec import BOTTOM_LEVELS, LEVELS, TOP_LEVELS

    data = parser.add_argument_group("data and sampling (from the datamodule)")
    data.add_argument("--num-series", type=int, required=True, metavar="N", help="number of training series")
    data.add_argument("--min-length", type=int, required=True, metavar="L",
                      help="length of the shortest training series (time steps); alone, every series has L steps")
    data.add_argument("--lengths", type=int, nargs="+", default=None, metavar="LEN",
                      help="the distinct lengths of all training series, if they differ (the bound is the maximum "
                           "over them; the smallest must equal --min-length)")
    data.add_argument("--context-length", type=int, required=True, metavar="LC",
                      help="past window length the model reads, including every lag (time steps)")
    data.add_argument("--prediction-length", type=int, required=True, metavar="LF",
                      help="forecast window length (time steps)")
    data.add_argument("--batch-size", type=int, required=True, metavar="B", help="windows per batch (Lambda)")
    data.add_argument("--instances-per-series", type=int, default=1, metavar="LAMBDA",
                      help="windows per sampled series (lambda, default 1; must divide --batch-size)")
    data.add_argument("--top-level", choices=TOP_LEVELS, default="without_replacement",
                      help="top-level (series) sampling (default without_replacement)")
    data.add_argument("--bottom-level", choices=BOTTOM_LEVELS, default="with_replacement",
                      help="bottom-level (window) sampling (default with_replacement)")
    priv = parser.add_argument_group("privacy")
    if needs_noise:
        priv.add_argument("--noise-multiplier", type=float, required=True, metavar="SIGMA",
                          help="noise std on the summed clipped gradient divided by the clipping norm")
    priv.add_argument("--level", choices=LEVELS, default="event",
                      help="event: protect SIZE consecutive steps; user: any SIZE steps (default event)")
    priv.add_argument("--size", type=int, default=1, metavar="W", help="protected time steps w (default 1)")
    priv.add_argument("--value-bound", type=float, default=None, metavar="V",
                      help="each protected step changes by at most V (needed for augmentation noise)")
    priv.add_argument("--context-noise", type=float, default=0.0, metavar="SC",
                      help="context augmentation noise std in units of V (Eq. 1, default 0)")
    priv.add_argument("--forecast-noise", type=float, default=0.0, metavar="SF",
                      help="forecast augmentation noise std in units of V (Eq. 1, default 0)")
    priv.add_argument("--num-dims", type=int, default=1, metavar="D",
                      help="V bounds each of D coordinates of a multivariate series (Appendix I.1, default 1)")
    priv.add_argument("--bound", choices=("upper", "lower"), default="upper",
                      help="upper: sound guarantee (default); lower: the paper's optimistic lower bound")
    priv.add_argument("--delta", type=float, required=True, metavar="D", help="target delta in (0, 1)")
    if needs_steps:
        if multi_steps:
            priv.add_argument("--steps", type=int, nargs="+", required=True, metavar="S",
                              help="optimizer steps (converted to epochs for iteration/shuffling)")
        else:
            priv.add_argument("--steps", type=int, required=True, metavar="S", help="optimizer steps")
    if needs_epsilon:
        priv.add_argument("--epsilon", type=float, required=True, metavar="E", help="target epsilon")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    """The ``dpts`` argument parser."""
    parser = argparse.ArgumentParser(prog="dpts", description="Differentially private forecasting tools.")
    sub = parser.add_subparsers(dest="command", required=True)
    privacy = sub.add_parser("privacy", help="privacy accounting for structured subsampling",
                             description="Privacy accounting for DP-SGD with structured subsampling.")
    psub = privacy.add_subparsers(dest="action", required=True)
    p_eps = psub.add_parser("epsilon", help="epsilon after given numbers of steps")
    _add_privacy_options(p_eps, needs_noise=True, multi_steps=True, needs_steps=True, needs_epsilon=False)
    p_steps = psub.add_parser("steps", help="largest number of steps within (epsilon, delta)")
    _add_privacy_options(p_steps, needs_noise=True, multi_steps=False, needs_steps=False, needs_epsilon=True)
    p_noise = psub.add_parser("noise", help="smallest noise multiplier reaching (epsilon, delta) in --steps")
    _add_privacy_options(p_noise, needs_noise=False, multi_steps=False, needs_steps=True, needs_epsilon=True)
    _add_fit_parser(sub)
    from lightning_dpts.release.cli import add_release_parser

    add_release_parser(sub)
    return parser


def _add_fit_parser(sub: argparse._SubParsersAction) -> None:
    from lightning_dpts.fit import MODELS

    fit = sub.add_parser(
        "fit", help="train, evaluate and report a private forecaster (the main job)",
        description="Train a GluonTS forecaster with DP-SGD to a target (epsilon, delta), evaluate it on the "
                    "held-out test windows against baselines and write a report. Options override --config.",
    )
    d = argparse.SUPPRESS  # unset options fall back to --config, then to FitConfig's defaults
    fit.add_argument("--config", metavar="YAML", help="YAML file with FitConfig fields (see examples/fit_default.yaml)")
    fit.add_argument("--data", metavar="PATH", default=d,
                     help="long-format CSV or Parquet file (default: the bundled us_employment data)")
    fit.add_argument("--id-column", default=d, help="series id column (default id)")
    fit.add_argument("--time-column", default=d, help="time stamp column (default timestamp)")
    fit.add_argument("--value-column", default=d, help="value column (default value)")
    fit.add_argument("--freq", default=d, help="pandas frequency (default: inferred from the time stamps)")
    fit.add_argument("--prediction-length", type=int, metavar="H", default=d, help="forecast horizon (default 12)")
    fit.add_argument("--context-length", type=int, default=d, help="model context (default: the horizon)")
    fit.add_argument("--model", choices=MODELS, default=d, help="GluonTS model (default dlinear)")
    fit.add_argument("--epsilon", type=float, metavar="E", default=d, help="privacy budget epsilon (default 1)")
    fit.add_argument("--delta", type=float, metavar="D", default=d, help="privacy budget delta (default 1e-7)")
    fit.add_argument("--noise-multiplier", type=float, default=d,
                     help="sigma (default: calibrated for (epsilon, delta) in --epochs epochs)")
    fit.add_argument("--epochs", type=int, default=d, help="training horizon to calibrate the noise for")
    fit.add_argument("--batch-size", type=int, default=d, help="windows per batch")
    fit.add_argument("--instances-per-series", type=int, default=d, help="windows per sampled series")
    fit.add_argument("--top-level", default=d, help="series sampling (default without_replacement)")
    fit.add_argument("--bottom-level", default=d, help="window sampling (default with_replacement)")
    fit.add_argument("--max-grad-norm", type=float, default=d, help="per-window clipping norm C")
    fit.add_argument("--learning-rate", type=float, default=d, help="Adam learning rate")
    fit.add_argument("--level", default=d, help="event or user level privacy (default event)")
    fit.add_argument("--size", type=int, default=d, help="protected time steps w (default 1)")
    fit.add_argument("--value-bound", type=float, default=d, help="per-step change bound v (for augmentation)")
    fit.add_argument("--context-noise", type=float, default=d, help="context augmentation std in units of v")
    fit.add_argument("--forecast-noise", type=float, default=d, help="forecast augmentation std in units of v")
    fit.add_argument("--no-non-dp", action="store_true", default=d,
                     help="skip training the same model without DP (on by default)")
    fit.add_argument("--autoets", action="store_true", default=d,
                     help="also score AutoETS (needs the optional statsforecast package)")
    fit.add_argument("--seed", type=int, default=d, help="seed for sampling, initialisation and DP noise")
    fit.add_argument("--output-dir", metavar="DIR", default=d, help="where results go (default dpts-run)")


def _spec_from_args(args: argparse.Namespace):
    from lightning_dpts.privacy.spec import NeighbouringRelation, SamplingSpec

    relation = NeighbouringRelation(level=args.level, size=args.size, value_bound=args.value_bound,
                                    num_dims=args.num_dims)
    return SamplingSpec(
        num_series=args.num_series,
        min_length=args.min_length,
        context_length=args.context_length,
        prediction_length=args.prediction_length,
        batch_size=args.batch_size,
        instances_per_series=args.instances_per_series,
        top_level=args.top_level,
        bottom_level=args.bottom_level,
        relation=relation,
        context_noise=args.context_noise,
        forecast_noise=args.forecast_noise,
        lengths=args.lengths,
    )


def _run_privacy(args: argparse.Namespace) -> int:
    from lightning_dpts.privacy.accountant import StructuredSubsamplingAccountant, calibrate_noise_multiplier

    spec = _spec_from_args(args)
    if args.action == "noise":
        if args.steps < 1:
            raise ConfigurationError("steps", args.steps, "must be >= 1")
        sigma = calibrate_noise_multiplier(spec, args.epsilon, args.delta, steps=args.steps, bound=args.bound)
        acc = StructuredSubsamplingAccountant(spec, sigma, bound=args.bound)
        if args.json:
            print(json.dumps({"noise_multiplier": sigma}))
        else:
            print(f"noise multiplier {sigma:.6g} reaches epsilon <= {args.epsilon:g} at delta={args.delta:g} "
                  f"after {args.steps} steps ({acc.compositions(args.steps)} {acc.unit}s; {acc.theorem}, "
                  f"{acc.kind} bound)")
        return 0

    acc = StructuredSubsamplingAccountant(spec, args.noise_multiplier, bound=args.bound)
    if args.action == "epsilon":
        for s in args.steps:
            if s < 0:
                raise ConfigurationError("steps", s, "must be an integer >= 0")
        values = {str(s): acc.epsilon(s, args.delta) for s in args.steps}
        if args.json:
            print(json.dumps({"epsilon": values}))
        else:
            print(f"{acc.theorem} ({acc.kind} bound), composed per {acc.unit}, delta={args.delta:g}")
            print(f"{'steps':>12} {acc.unit + 's':>12} {'epsilon':>12}")
            for s in args.steps:
                print(f"{s:>12d} {acc.compositions(s):>12d} {values[str(s)]:>12.6g}")
        return 0

    # steps
    n = acc.max_steps(args.epsilon, args.delta)
    if args.json:
        print(json.dumps({"steps": n}))
    else:
        print(f"at most {n} steps stay within epsilon={args.epsilon:g}, delta={args.delta:g} "
              f"({acc.theorem}, {acc.kind} bound, composed per {acc.unit})")
    return 0


def _fit_config(args: argparse.Namespace):
    from dataclasses import fields

    from lightning_dpts.fit import FitConfig

    values: dict = {}
    if getattr(args, "config", None):
        import yaml

        try:
            with open(args.config) as handle:
                loaded = yaml.safe_load(handle) or {}
        except OSError as err:
            raise ConfigurationError("config", args.config, f"cannot be read ({err.strerror})") from err
        if not isinstance(loaded, dict):
            raise ConfigurationError("config", args.config, "must be a YAML mapping of FitConfig fields")
        known = {f.name for f in fields(FitConfig)}
        unknown = sorted(set(loaded) - known)
        if unknown:
            raise ConfigurationError("config", args.config, f"has unknown keys {unknown}; known: {sorted(known)}")
        values.update(loaded)
    for key, value in vars(args).items():
        if key in ("command", "config"):
            continue
        if key == "no_non_dp":
            values["non_dp"] = not value
        else:
            values[key] = value
    return FitConfig(**values)


def _run_fit(args: argparse.Namespace) -> int:
    from lightning_dpts.fit import run_fit

    config = _fit_config(args)
    out = config.output_dir
    try:
        run_fit(config)
    except ConfigurationError:
        raise
    except Exception as err:
        import os

        where = f"; partial results may be in {out}" if os.path.isdir(out) else ""
        print(f"dpts: error: fit failed ({type(err).__name__}: {err}){where}", file=sys.stderr)
        return 1
    print(f"results written to {out}/ (report.json, epsilon.png, forecasts.png, dp-model.ckpt, logs/)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpts`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "privacy":
            return _run_privacy(args)
        if args.command == "fit":
            return _run_fit(args)
        if args.command == "release":
            from lightning_dpts.release.cli import run_release

            return run_release(args)
    except ConfigurationError as err:
        from lightning_dpts.release.cli import RELEASE_OPTION_NAMES

        option = {**_OPTION_NAMES, **RELEASE_OPTION_NAMES}.get(err.parameter, err.parameter)
        parser.exit(2, f"dpts: error: {option}: {err.requirement} (got {err.value!r})\n")
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

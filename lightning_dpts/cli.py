"""The ``dpts`` command.

``dpts privacy epsilon|steps|noise`` runs the structured-subsampling accountant (without torch, unless
``--data`` asks for the geometry ``dpts fit`` would train on; :mod:`lightning_dpts.planning`);
``dpts fit`` runs the main job (train a private forecaster, evaluate, report); ``dpts predict`` forecasts
new data with the exported model (:mod:`lightning_dpts.export`); ``dpts synth`` releases a DP
synthetic dataset by Private Evolution; ``dpts release
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
    "secure_mode": "--secure-mode",
    "autoets": "--autoets",
    "config": "--config",
    "quantiles": "--quantiles",
    # dpts privacy bandmf
    "iterations": "--iterations",
    "bands": "--bands",
    "sampling_prob": "--sampling-prob",
    "coefficients": "--coefficients",
    "samples": "--samples",
    "monte_carlo_samples": "--monte-carlo-samples",
    "timestamp_column": "--time-column",
    "drop_short_series": "--drop-short-series",
    "max_lag": "--max-lag",
    "min_series_length": "--min-series-length",
    "output_dir": "--output-dir",
    "non_dp": "--no-non-dp",
    "test_windows": "--test-windows",
    "clip_low": "--clip-low",
    "clip_high": "--clip-high",
    "clip_count_epsilon": "--clip-count-epsilon",
    "dp_metrics_epsilon": "--dp-metrics-epsilon",
    "private_plots": "--no-private-plots",
    "private_outputs": "--no-private-outputs",
    "overwrite": "--overwrite",
    "output": "--output",
}


def _add_privacy_options(parser: argparse.ArgumentParser, *, needs_noise: bool, multi_steps: bool,
                         needs_steps: bool, needs_epsilon: bool) -> None:
    from lightning_dpts.privacy.spec import BOTTOM_LEVELS, LEVELS, TOP_LEVELS

    data = parser.add_argument_group("data and sampling (from the datamodule)")
    data.add_argument("--num-series", type=int, required=True, metavar="N", help="number of training series")
    data.add_argument("--min-length", type=int, required=True, metavar="L",
                      help="length of the shortest training series (time steps); alone, every series has at least "
                           "L steps and the bound is the worst case over all lengths >= L")
    data.add_argument("--lengths", type=int, nargs="+", default=None, metavar="LEN",
                      help="the exact distinct lengths of all training series (the bound is the maximum over them; "
                           "the smallest must equal --min-length; --lengths L alone: every series has exactly L "
                           "steps)")
    data.add_argument("--context-length", type=int, required=True, metavar="LC",
                      help="past window length the model reads, including every lag (time steps)")
    data.add_argument("--prediction-length", type=int, required=True, metavar="LF",
                      help="forecast window length (time steps)")
    data.add_argument("--batch-size", type=int, required=True, metavar="B", help="windows per batch (Lambda)")
    data.add_argument("--instances-per-series", type=int, default=1, metavar="LAMBDA",
                      help="windows per sampled series (lambda, default 1; must divide --batch-size)")
    data.add_argument("--top-level", choices=[t for t in TOP_LEVELS if t != "b_min_sep"],  # b_min_sep: Python API
                      default="without_replacement",
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
    from lightning_dpts.planning import add_planning_options

    add_planning_options(parser, needs_steps=needs_steps, multi_steps=multi_steps)


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
    _add_bandmf_parser(psub)
    _add_fit_parser(sub)
    _add_predict_parser(sub)
    from lightning_dpts.synthetic.cli import add_synth_parser

    add_synth_parser(sub)
    from lightning_dpts.release.cli import add_release_parser

    add_release_parser(sub)
    return parser


def _whole_number(text: str) -> int:
    """argparse type for ``dpts fit``'s integer options: ``100``, ``1e3`` and ``100.0`` mean the same."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number (got {text!r})") from None
    if not (value == value and abs(value) != float("inf") and value == int(value)):
        raise argparse.ArgumentTypeError(f"must be a whole number (got {text!r})")
    return int(value)


_RECIPE = " (default: the recipe's, docs/recipe.md; 100 epochs, batch 64, C 1, learning rate 5e-3 for a --model " \
    "other than seasonal_linear)"


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
    fit.add_argument("--prediction-length", type=_whole_number, metavar="H", default=d,
                     help="forecast horizon (default 12)")
    fit.add_argument("--context-length", type=_whole_number, default=d,
                     help="model context (default: the recipe's; the horizon for a --model other than seasonal_linear)")
    fit.add_argument("--model", choices=MODELS, default=d, help="model (default: the recipe's, seasonal_linear; "
                     "docs/recipe.md)")
    fit.add_argument("--epsilon", type=float, metavar="E", default=d, help="privacy budget epsilon (default 1)")
    fit.add_argument("--delta", type=float, metavar="D", default=d, help="privacy budget delta (default 1e-7)")
    fit.add_argument("--noise-multiplier", type=float, default=d,
                     help="sigma (default: calibrated for (epsilon, delta) in --epochs epochs)")
    fit.add_argument("--epochs", type=_whole_number, default=d, help="training horizon to calibrate the noise for"
                     f"{_RECIPE}")
    fit.add_argument("--batch-size", type=_whole_number, default=d, help=f"windows per batch{_RECIPE}")
    fit.add_argument("--instances-per-series", type=_whole_number, default=d, help="windows per sampled series")
    fit.add_argument("--top-level", default=d, help="series sampling (default without_replacement)")
    fit.add_argument("--bottom-level", default=d, help="window sampling (default with_replacement)")
    fit.add_argument("--max-grad-norm", type=float, default=d, help=f"per-window clipping norm C{_RECIPE}")
    fit.add_argument("--learning-rate", type=float, default=d, help=f"Adam learning rate{_RECIPE}")
    fit.add_argument("--min-series-length", type=_whole_number, metavar="STEPS", default=d,
                     help=f"leave out series shorter than STEPS (1 keeps all){_RECIPE}")
    fit.add_argument("--level", default=d, help="event or user level privacy (default event)")
    fit.add_argument("--size", type=_whole_number, default=d, help="protected time steps w (default 1)")
    fit.add_argument("--value-bound", type=float, default=d, help="per-step change bound v (for augmentation)")
    fit.add_argument("--context-noise", type=float, default=d, help="context augmentation std in units of v")
    fit.add_argument("--forecast-noise", type=float, default=d, help="forecast augmentation std in units of v")
    fit.add_argument("--drop-short-series", action="store_true", default=d,
                     help="drop series too short for one training window plus the test window (default: refuse)")
    fit.add_argument("--max-lag", type=_whole_number, metavar="LAG", default=d,
                     help="deepar: keep only GluonTS's default lags <= LAG time steps (long lags lengthen the "
                          "past window and can destroy privacy amplification; default: all)")
    fit.add_argument("--no-non-dp", action="store_true", default=d,
                     help="skip training the same model without DP (on by default)")
    fit.add_argument("--autoets", action="store_true", default=d,
                     help="also score AutoETS (needs the optional statsforecast package)")
    fit.add_argument("--no-private-plots", dest="private_plots", action="store_false", default=d,
                     help="do not write private/forecasts.png, which shows private data (history, truth, forecasts)")
    fit.add_argument("--no-private-outputs", dest="private_outputs", action="store_false", default=d,
                     help="write nothing computed from the private data without DP (no private/ folder: no "
                          "evaluation.json, training logs or forecasts.png); the terminal still shows the evaluation")
    fit.add_argument("--dp-metrics-epsilon", type=float, metavar="E", default=d,
                     help="spend E of --epsilon to publish in report.json a Laplace-noised count of the test windows "
                          "the private model forecasts better than seasonal naive (default: publish no evaluation)")
    fit.add_argument("--overwrite", action="store_true", default=d,
                     help="allow a non-empty --output-dir: first remove the files of the earlier dpts run there "
                          "(refused if it holds files no dpts run wrote)")
    fit.add_argument("--seed", type=_whole_number, default=d,
                     help="explicit seed for sampling, initialisation and DP noise, for experiments only: the "
                          "guarantee does not hold against anyone who knows it (default: secret OS entropy)")
    fit.add_argument("--secure-mode", action="store_true", default=d,
                     help="draw DP noise and sampling from the OS CSPRNG (Opacus secure_mode; no --seed)")
    fit.add_argument("--output-dir", metavar="DIR", default=d,
                     help="where results go, new or empty unless --overwrite (default dpts-run)")
    fit.add_argument("--test-windows", type=_whole_number, metavar="K", default=d,
                     help="rolling test windows of the horizon at the end of every series, scored and never trained "
                          "on (default 4)")
    fit.add_argument("--clip-low", type=float, metavar="LOW", default=d,
                     help="declared public value range: clip every value to [LOW, HIGH] before training so that the "
                          "value bound v = HIGH - LOW of noise augmentation (Theorem G.1) holds; needs "
                          "--context-noise/--forecast-noise, not --value-bound")
    fit.add_argument("--clip-high", type=float, metavar="HIGH", default=d, help="upper end of the public range")
    fit.add_argument("--clip-count-epsilon", type=float, metavar="E", default=d,
                     help="epsilon spent to release a Laplace-noised count of clipped values (default 2%% of "
                          "--epsilon; 0: not released)")
    fit.add_argument("--bands", type=_whole_number, metavar="B", default=d,
                     help="train with BandMF (B-banded correlated noise), b-min-sep sampling of series and the Monte "
                          "Carlo accountant (series level; docs/bandmf.md); needs --noise-multiplier")
    fit.add_argument("--monte-carlo-samples", type=_whole_number, metavar="M", default=d,
                     help="with --bands: Monte Carlo samples per direction (default 100000)")


def _add_predict_parser(sub: argparse._SubParsersAction) -> None:
    predict = sub.add_parser(
        "predict", help="forecast new data with a model dpts fit exported",
        description="Forecast the prediction_length steps after the end of every series of a long-format file "
                    "with the GluonTS predictor dpts fit exported, and write quantiles as CSV (columns item_id, "
                    "timestamp, horizon, mean, one per quantile level).",
    )
    predict.add_argument("--model", metavar="DIR", required=True,
                         help="dpts fit output directory (or its predictor/ directory)")
    predict.add_argument("--data", metavar="PATH", required=True, help="long-format CSV or Parquet file")
    predict.add_argument("--output", metavar="CSV", default="forecasts.csv", help="default forecasts.csv")
    predict.add_argument("--id-column", default="id", help="series id column (default id)")
    predict.add_argument("--time-column", default="timestamp", help="time stamp column (default timestamp)")
    predict.add_argument("--value-column", default="value", help="value column (default value)")
    predict.add_argument("--freq", default=None, help="pandas frequency (default: the model's)")
    predict.add_argument("--quantiles", type=float, nargs="+", default=None, metavar="Q",
                         help="quantile levels in (0, 1) (default 0.1 ... 0.9)")
    predict.add_argument("--seed", type=int, default=None,
                         help="seed for sample-based forecasts (post-processing; no effect on privacy)")


def _run_predict(args: argparse.Namespace) -> int:
    from lightning_dpts.export import predict_to_csv

    table = predict_to_csv(args.model, args.data, args.output, id_column=args.id_column,
                           time_column=args.time_column, value_column=args.value_column, freq=args.freq,
                           quantiles=args.quantiles, seed=args.seed)
    print(f"{table['item_id'].nunique()} series x {table['horizon'].max()} steps of forecasts written to "
          f"{args.output}")
    return 0


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


# ---- dpts privacy bandmf (BandMF with b-min-sep sampling, Monte Carlo accounting; docs/bandmf.md) -------------
def _add_bandmf_parser(psub: argparse._SubParsersAction) -> None:
    p = psub.add_parser(
        "bandmf", help="Monte Carlo delta(epsilon) of BandMF with warm-start b-min-sep sampling",
        description="Monte Carlo accounting of b-banded BandMF (correlated noise) with warm-start b-min-sep sampling "
                    "(Dong & Ganesh 2026, Theorem 5.1); 'upper' is the Estimate-Verify-Release bound (Theorem A.1).")
    p.add_argument("--iterations", type=int, required=True, metavar="N", help="optimizer steps of the whole run")
    p.add_argument("--bands", type=int, required=True, metavar="B", help="bands b of C (= minimum separation)")
    p.add_argument("--sampling-prob", type=float, required=True, metavar="P",
                   help="probability p that an available example is sampled (Algorithm 2); the expected batch "
                        "fraction is p / (1 + (b - 1) p)")
    p.add_argument("--noise-multiplier", type=float, required=True, metavar="SIGMA",
                   help="noise std over the clipping norm")
    p.add_argument("--epsilon", type=float, nargs="+", required=True, metavar="E", help="epsilons to report")
    p.add_argument("--coefficients", type=float, nargs="+", default=None, metavar="C",
                   help="non-zero entries c_0..c_{b-1} of C's first column (non-negative; default: banded square "
                        "root of the prefix-sum matrix, unit column norm)")
    p.add_argument("--samples", type=int, default=100_000, metavar="M",
                   help="Monte Carlo samples per direction (default 100000)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="seed of the Monte Carlo samples (no private data is involved; default fresh)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _run_bandmf(args: argparse.Namespace) -> int:
    from lightning_dpts.privacy.montecarlo import BandMFMechanism, MonteCarloAccountant, banded_sqrt_coefficients

    if args.bands < 1:
        raise ConfigurationError("bands", args.bands, "must be an integer >= 1")
    if args.coefficients is None:
        coefficients = tuple(banded_sqrt_coefficients(args.bands))
    else:
        if len(args.coefficients) != args.bands:
            raise ConfigurationError("coefficients", args.coefficients, f"must have exactly --bands={args.bands} "
                                                                        "values")
        coefficients = tuple(args.coefficients)
    for e in args.epsilon:
        if not e >= 0:
            raise ConfigurationError("epsilon", e, "must be a number >= 0")
    mech = BandMFMechanism(args.iterations, coefficients, args.sampling_prob, args.noise_multiplier)
    acc = MonteCarloAccountant(mech, samples=args.samples, seed=args.seed)
    values = {format(e, "g"): {"estimate": acc.delta_estimate(e), "upper": acc.delta_upper(e)} for e in args.epsilon}
    if args.json:
        print(json.dumps({"delta": values}))
    else:
        print(f"BandMF b={mech.bands}, n={mech.iterations}, p={mech.sampling_prob:g}, sigma={mech.noise_multiplier:g}, "
              f"coefficients={[round(c, 6) for c in mech.coefficients]}; warm-start b-min-sep sampling")
        print(f"Monte Carlo with {acc.samples} samples per direction; 'upper' is the EVR-verified bound (Theorem A.1)")
        print(f"{'epsilon':>10} {'estimate':>14} {'upper':>14}")
        for e in args.epsilon:
            v = values[format(e, "g")]
            print(f"{e:>10g} {v['estimate']:>14.6g} {v['upper']:>14.6g}")
    return 0


def _run_privacy(args: argparse.Namespace) -> int:
    from lightning_dpts.planning import resolve_planning
    from lightning_dpts.privacy.accountant import StructuredSubsamplingAccountant, calibrate_noise_multiplier

    if args.action == "bandmf":
        return _run_bandmf(args)

    spec = resolve_planning(args, _spec_from_args)
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
    from lightning_dpts.fit import FitConfig

    values: dict = {}
    if getattr(args, "config", None):
        import yaml

        try:
            with open(args.config) as handle:
                loaded = yaml.safe_load(handle) or {}
        except OSError as err:
            raise ConfigurationError("config", args.config, f"cannot be read ({err.strerror})") from err
        except (UnicodeDecodeError, ValueError) as err:  # a binary file (ValueError: e.g. NUL bytes)
            raise ConfigurationError("config", args.config, "is not a text YAML file (it cannot be decoded as "
                                     "UTF-8 text)") from err
        except yaml.YAMLError as err:
            raise ConfigurationError("config", args.config, f"is not valid YAML ({err})") from err
        if not isinstance(loaded, dict):
            raise ConfigurationError("config", args.config, "must be a YAML mapping of FitConfig fields")
        loaded = {str(k): v for k, v in loaded.items()}
        from_file = FitConfig.from_mapping(loaded)  # text values converted; errors name the YAML key
        values.update({key: getattr(from_file, key) for key in loaded})
    for key, value in vars(args).items():
        if key in ("command", "config"):
            continue
        if key == "no_non_dp":
            values["non_dp"] = not value
        else:
            values[key] = value
    return FitConfig.from_mapping(values, source=None)


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
    private = "" if not config.private_outputs else (
        "; NOT covered, keep private: private/ (evaluation.json, logs/"
        + (", forecasts.png)" if config.private_plots else ")"))
    print(f"results written to {out}/: covered by the guarantee or public: report.json (lists every file), "
          f"epsilon.png, dp-model.ckpt, model.json, predictor/{private}")
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
        if args.command == "predict":
            return _run_predict(args)
        if args.command == "release":
            from lightning_dpts.release.cli import run_release

            return run_release(args)
        if args.command == "synth":
            from lightning_dpts.synthetic.cli import run_synth_command

            return run_synth_command(args)
    except ConfigurationError as err:
        from lightning_dpts.release.cli import RELEASE_OPTION_NAMES
        from lightning_dpts.synthetic.cli import SYNTH_OPTION_NAMES

        names = {**_OPTION_NAMES, **RELEASE_OPTION_NAMES}
        if args.command == "synth":
            names.update(SYNTH_OPTION_NAMES)
        option = names.get(err.parameter, err.parameter)
        parser.exit(2, f"dpts: error: {option}: {err.requirement} (got {err.value!r})\n")
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

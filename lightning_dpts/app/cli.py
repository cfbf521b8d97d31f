"""The ``dpts`` command.

``dpts privacy epsilon|steps|noise`` runs the structured-subsampling accountant (without torch, unless
``--data`` asks for the geometry ``dpts fit`` would train on; :mod:`lightning_dpts.app.planning`);
``dpts fit`` runs the main job (train a private forecaster, evaluate, report; :mod:`lightning_dpts.app.jobs.fit`, its
options declared once by :class:`~lightning_dpts.app.config.FitConfig`); ``dpts predict`` forecasts new data with the
exported model (:mod:`lightning_dpts.app.jobs.predict`); ``dpts synth`` releases a DP synthetic dataset by Private
Evolution (:mod:`lightning_dpts.app.jobs.synth`); ``dpts release epsilon|noise`` accounts inference-time privacy of
released forecasts. Invalid values and combinations exit with status 2 and a message naming the option; no parser
accepts an abbreviated option (``allow_abbrev=False``), so a shortened option never sets another one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lightning_dpts.errors import ConfigurationError, TrainingRefused

__all__ = ["EXIT_INTERRUPTED", "EXIT_REFUSED_DURING_TRAINING", "main", "build_parser"]

#: ``dpts fit``: a check refused training after it began (docs/cli.md, exit codes; 2 is input refused before any work)
EXIT_REFUSED_DURING_TRAINING = 3
#: ``dpts fit`` stopped by Ctrl-C (128 + SIGINT, the shell's convention); the message says how to resume
EXIT_INTERRUPTED = 130

# Python parameter name (as raised in ConfigurationError) -> command-line option, for the options that are not
# FitConfig fields (those derive from their declarations: lightning_dpts.app.config.option_flags).
_OPTION_NAMES = {
    "num_series": "--num-series",
    "min_length": "--min-length",
    "lengths": "--lengths",
    "relation.value_bound": "--value-bound",
    "num_dims": "--num-dims",
    "bound": "--bound",
    "steps": "--steps",
    "config": "--config",
    "quantiles": "--quantiles",
    "iterations": "--iterations",
    "sampling_prob": "--sampling-prob",
    "coefficients": "--coefficients",
    "samples": "--samples",
    "groups": "--groups",
    "num_examples": "--num-examples",
    "leak_probability": "--leak-probability",
    "delta": "--delta",
    "output": "--output",
}


def _add_privacy_options(parser: argparse.ArgumentParser, *, needs_noise: bool, multi_steps: bool,
                         needs_steps: bool, needs_epsilon: bool) -> None:
    from lightning_dpts.privacy.mechanisms import TOP_LEVEL_SCHEMES
    from lightning_dpts.privacy.spec import BOTTOM_LEVELS, LEVELS

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
    # a top level that needs the Monte Carlo accountant (b_min_sep) is the Python API's (or dpts fit --bands')
    data.add_argument("--top-level", choices=[name for name, scheme in TOP_LEVEL_SCHEMES.items()
                                              if not scheme.needs_monte_carlo],
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
    from lightning_dpts.app.planning import add_planning_options

    add_planning_options(parser, needs_steps=needs_steps, multi_steps=multi_steps)


def build_parser() -> argparse.ArgumentParser:
    """The ``dpts`` argument parser."""
    parser = argparse.ArgumentParser(prog="dpts", description="Differentially private forecasting tools.",
                                     allow_abbrev=False)  # a shortened option must never set another one
    sub = parser.add_subparsers(dest="command", required=True)
    privacy = sub.add_parser("privacy", help="privacy accounting for structured subsampling", allow_abbrev=False,
                             description="Privacy accounting for DP-SGD with structured subsampling.")
    psub = privacy.add_subparsers(dest="action", required=True)
    p_eps = psub.add_parser("epsilon", help="epsilon after given numbers of steps", allow_abbrev=False)
    _add_privacy_options(p_eps, needs_noise=True, multi_steps=True, needs_steps=True, needs_epsilon=False)
    p_steps = psub.add_parser("steps", help="largest number of steps within (epsilon, delta)", allow_abbrev=False)
    _add_privacy_options(p_steps, needs_noise=True, multi_steps=False, needs_steps=False, needs_epsilon=True)
    p_noise = psub.add_parser("noise", help="smallest noise multiplier reaching (epsilon, delta) in --steps",
                              allow_abbrev=False)
    _add_privacy_options(p_noise, needs_noise=False, multi_steps=False, needs_steps=True, needs_epsilon=True)
    _add_bandmf_parser(psub)
    _add_fit_parser(sub)
    _add_predict_parser(sub)
    from lightning_dpts.app.synth_cli import add_synth_parser
    from lightning_dpts.app.tune_cli import add_tune_parser

    add_tune_parser(sub)
    add_synth_parser(sub)
    from lightning_dpts.app.release_cli import add_release_parser

    add_release_parser(sub)
    from lightning_dpts.app.audit_cli import add_audit_parser

    add_audit_parser(sub)
    return parser


def _add_fit_parser(sub: argparse._SubParsersAction) -> None:
    from lightning_dpts.app.config import add_config_arguments

    fit = sub.add_parser(
        "fit", help="train, evaluate and report a private forecaster (the main job)", allow_abbrev=False,
        description="Train a GluonTS forecaster with DP-SGD to a target (epsilon, delta), evaluate it on the "
                    "held-out test windows against baselines and write a report. Options override --config.",
    )
    fit.add_argument("--config", metavar="YAML", help="YAML file with FitConfig fields (see examples/fit_default.yaml)")
    add_config_arguments(fit)  # one option per FitConfig field; unset: --config, then the field's default
    from lightning_dpts.data.columns import add_deprecated_time_column

    add_deprecated_time_column(fit)  # the old --time-column, as --timestamp-column


def _add_predict_parser(sub: argparse._SubParsersAction) -> None:
    predict = sub.add_parser(
        "predict", help="forecast new data with a model dpts fit exported", allow_abbrev=False,
        description="Forecast the prediction_length steps after the end of every series of a long-format file "
                    "with the GluonTS predictor dpts fit exported, and write quantiles as CSV (the id and time stamp "
                    "columns named and written as in --data, horizon, mean, one per quantile level).",
    )
    predict.add_argument("--model", metavar="DIR", required=True,
                         help="dpts fit output directory (or its predictor/ directory)")
    predict.add_argument("--data", metavar="PATH", required=True, help="long-format CSV or Parquet file")
    predict.add_argument("--output", metavar="CSV", default="forecasts.csv", help="default forecasts.csv")
    for name, default in (("id_column", "item_id"), ("timestamp_column", "timestamp"), ("value_column", "target")):
        predict.add_argument("--" + name.replace("_", "-"), default=None, metavar="COLUMN",
                             help=f"column in --data (default: the name the dpts fit run read, else {default})")
    from lightning_dpts.data.columns import add_deprecated_time_column

    add_deprecated_time_column(predict)
    predict.add_argument("--freq", default=None, help="pandas frequency (default: the model's)")
    predict.add_argument("--quantiles", type=float, nargs="+", default=None, metavar="Q",
                         help="quantile levels in (0, 1) (default 0.1 ... 0.9)")
    predict.add_argument("--verbose", action="store_true",
                         help="show third-party warnings and Lightning's info lines (default: quiet)")
    predict.add_argument("--seed", type=int, default=None,
                         help="seed for sample-based forecasts (post-processing; no effect on privacy)")


def _run_predict(args: argparse.Namespace) -> int:
    from lightning_dpts.app.console import dpts_console
    from lightning_dpts.app.jobs.predict import predict_to_csv

    with dpts_console(args.verbose):
        table = predict_to_csv(args.model, args.data, args.output, id_column=args.id_column,
                               timestamp_column=args.timestamp_column, value_column=args.value_column,
                               freq=args.freq, quantiles=args.quantiles, seed=args.seed)
    print(f"{table.iloc[:, 0].nunique()} series x {table['horizon'].max()} steps of forecasts written to "
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
        "bandmf", help="delta(epsilon) of BandMF: cyclic Poisson (exact PLD) or b-min-sep (Monte Carlo) sampling",
        allow_abbrev=False,
        description="Accounting of b-banded BandMF (correlated noise). --sampling b_min_sep (default): warm-start "
                    "b-min-sep sampling, Monte Carlo (Dong & Ganesh 2026, Theorem 5.1; 'upper' is the "
                    "Estimate-Verify-Release bound, Theorem A.1), add/remove of one example. --sampling "
                    "cyclic_poisson: k >= b groups, group t mod k eligible at step t (Choquette-Choo et al. 2023), "
                    "exact PLD composition of ceil(N/k) structured steps (docs/bandmf.md, Theorem B.2), substitution "
                    "of one example (estimate = upper).")
    p.add_argument("--sampling", choices=("b_min_sep", "cyclic_poisson"), default="b_min_sep",
                   help="b_min_sep (Monte Carlo, default) or cyclic_poisson (exact PLD, any delta)")
    p.add_argument("--iterations", type=int, required=True, metavar="N", help="optimizer steps of the whole run")
    p.add_argument("--bands", type=int, required=True, metavar="B", help="bands b of C (= minimum separation)")
    p.add_argument("--groups", type=int, default=None, metavar="K",
                   help="cyclic_poisson: number of groups k >= b (default b)")
    p.add_argument("--leak-probability", type=float, default=1.0, metavar="R",
                   help="cyclic_poisson: probability r that a sampled example's window holds the protected unit "
                        "(structured subsampling's bottom level; default 1, the whole example)")
    p.add_argument("--sampling-prob", type=float, required=True, metavar="P",
                   help="b_min_sep: probability p that an available example is sampled (Algorithm 2; expected batch "
                        "fraction p / (1 + (b - 1) p)); cyclic_poisson: probability that an eligible example is "
                        "sampled (expected batch fraction p / k)")
    p.add_argument("--noise-multiplier", type=float, required=True, metavar="SIGMA",
                   help="noise std over the clipping norm")
    p.add_argument("--epsilon", type=float, nargs="+", default=None, metavar="E", help="epsilons to report")
    p.add_argument("--delta", type=float, nargs="+", default=None, metavar="D",
                   help="cyclic_poisson: deltas at which to report epsilon")
    p.add_argument("--num-examples", type=int, default=None, metavar="N",
                   help="number of examples (series, users): warn when a delta is >= 1/N")
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
    if not args.epsilon and not args.delta:
        raise ConfigurationError("epsilon", None, "give --epsilon E ... (and, with --sampling cyclic_poisson, or "
                                 "--delta D ...)")
    for e in args.epsilon or ():
        if not e >= 0:
            raise ConfigurationError("epsilon", e, "must be a number >= 0")
    from lightning_dpts.privacy.mechanisms import TOP_LEVEL_SCHEMES

    if not TOP_LEVEL_SCHEMES[args.sampling].needs_monte_carlo:  # cyclic Poisson: exact PLD (Theorem B.2)
        return _run_bandmf_cyclic(args, coefficients)
    for name in ("groups", "delta"):
        if getattr(args, name) is not None:
            raise ConfigurationError(name, getattr(args, name), "is only for --sampling cyclic_poisson")
    if args.leak_probability != 1.0:
        raise ConfigurationError("leak_probability", args.leak_probability,
                                 "is only for --sampling cyclic_poisson (the Monte Carlo accountant refuses r < 1)")
    if not args.epsilon:
        raise ConfigurationError("epsilon", None, "give --epsilon E ... with --sampling b_min_sep")
    mech = BandMFMechanism(args.iterations, coefficients, args.sampling_prob, args.noise_multiplier)
    acc = MonteCarloAccountant(mech, samples=args.samples, seed=args.seed)
    values = {format(e, "g"): {"estimate": acc.delta_estimate(e), "upper": acc.delta_upper(e)} for e in args.epsilon}
    if args.num_examples is not None and args.num_examples < 1:
        raise ConfigurationError("num_examples", args.num_examples, "must be an integer >= 1")
    from lightning_dpts.app.console import warn_delta_above_one_over_n

    warn_delta_above_one_over_n(max(v["upper"] for v in values.values()), args.num_examples, "examples")
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


def _run_bandmf_cyclic(args: argparse.Namespace, coefficients: tuple[float, ...]) -> int:
    from lightning_dpts.app.console import warn_delta_above_one_over_n
    from lightning_dpts.privacy.accountant import MIN_DELTA, AmplifiedBandMFAccountant

    if args.num_examples is not None and args.num_examples < 1:
        raise ConfigurationError("num_examples", args.num_examples, "must be an integer >= 1")

    acc = AmplifiedBandMFAccountant(args.iterations, coefficients, args.sampling_prob, args.noise_multiplier,
                                    groups=args.groups, leak_probability=args.leak_probability)
    for d in args.delta or ():
        if not MIN_DELTA <= d < 1:
            raise ConfigurationError("delta", d, f"must lie in [{MIN_DELTA:g}, 1)")
    exact = {format(e, "g"): acc.delta(e) for e in args.epsilon or ()}
    largest = max([*(args.delta or ()), *exact.values()], default=None)  # one warning: the largest delta
    warn_delta_above_one_over_n(largest, args.num_examples, "examples")
    values = {key: {"estimate": v, "upper": v} for key, v in exact.items()}
    epsilons = {format(d, "g"): acc.epsilon(d) for d in args.delta or ()}
    if args.json:
        out: dict = {"delta": values}
        if epsilons:
            out["epsilon"] = epsilons
        out["accounting"] = {"sampling": "cyclic_poisson", "groups": acc.groups, "compositions": acc.compositions,
                             "column_norm": acc.column_norm, "leak_probability": acc.leak_probability,
                             "theorem": "Theorem B.2 (docs/bandmf.md): ceil(N/k) x Theorem 4.4 (Lemma F.3), exact PLD"}
        print(json.dumps(out))
        return 0
    print(f"BandMF b={len(coefficients)}, n={acc.iterations}, cyclic Poisson with k={acc.groups} groups, "
          f"p={acc.sampling_prob:g}, r={acc.leak_probability:g}, sigma={acc.noise_multiplier:g}, "
          f"coefficients={[round(float(c), 6) for c in coefficients]} (column norm {acc.column_norm:.6g})")
    print(f"exact PLD composition of {acc.compositions} opportunities (Theorem B.2, docs/bandmf.md; substitution)")
    if exact:
        print(f"{'epsilon':>10} {'delta':>14}")
        for e in args.epsilon:
            print(f"{e:>10g} {exact[format(e, 'g')]:>14.6g}")
    if epsilons:
        print(f"{'delta':>10} {'epsilon':>14}")
        for d in args.delta:
            print(f"{d:>10g} {epsilons[format(d, 'g')]:>14.6g}")
    return 0


def _run_privacy(args: argparse.Namespace) -> int:
    from lightning_dpts.app.console import dpts_console, to_stderr

    # warnings (delta >= 1/N) to stderr, once, as "WARNING: ...": stdout may be one JSON object
    with dpts_console(False, write=to_stderr):
        return _run_privacy_quiet(args)


def _run_privacy_quiet(args: argparse.Namespace) -> int:
    from lightning_dpts.app.console import warn_delta_above_one_over_n
    from lightning_dpts.app.planning import resolve_planning
    from lightning_dpts.privacy.accountant import StructuredSubsamplingAccountant, calibrate_noise_multiplier
    from lightning_dpts.privacy.risk import FPRS

    if args.action != "bandmf" and isinstance(args.delta, float) and 0 < args.delta < 1:
        warn_delta_above_one_over_n(args.delta, args.num_series, "series")
    if args.action == "bandmf":
        return _run_bandmf(args)

    spec = resolve_planning(args, _spec_from_args)
    if args.action == "noise":
        if args.steps < 1:
            raise ConfigurationError("steps", args.steps, "must be >= 1")
        sigma = calibrate_noise_multiplier(spec, args.epsilon, args.delta, steps=args.steps, bound=args.bound)
        acc = StructuredSubsamplingAccountant(spec, sigma, bound=args.bound)
        risk = acc.risk(args.steps, args.delta) if args.bound == "upper" else None
        if args.json:
            print(json.dumps({"noise_multiplier": sigma, **_risk_json(risk)}))
        else:
            print(f"noise multiplier {sigma:.6g} reaches epsilon <= {args.epsilon:g} at delta={args.delta:g} "
                  f"after {args.steps} steps ({acc.compositions(args.steps)} {acc.unit}s; {acc.theorem}, "
                  f"{acc.kind} bound)")
            _print_risk(risk)
        return 0

    acc = StructuredSubsamplingAccountant(spec, args.noise_multiplier, bound=args.bound)
    if args.action == "epsilon":
        for s in args.steps:
            if s < 0:
                raise ConfigurationError("steps", s, "must be an integer >= 0")
        values = {str(s): acc.epsilon(s, args.delta) for s in args.steps}
        # the membership-attack read-outs from the same compositions (issue 43); not of the optimistic lower bound
        risks = {str(s): acc.risk(s, args.delta) for s in args.steps} if args.bound == "upper" else {}
        if args.json:
            out: dict = {"epsilon": values}
            if risks:
                out["risk"] = {s: r.to_dict() for s, r in risks.items()}
            print(json.dumps(out))
        else:
            print(f"{acc.theorem} ({acc.kind} bound), composed per {acc.unit}, delta={args.delta:g}")
            per_step = acc.unit == "step"  # composed per step: the second column would repeat the first
            print(f"{'steps':>12}" + ("" if per_step else f" {acc.unit + 's':>12}") + f" {'epsilon':>12}"
                  + ("".join(f" {'TPR@' + format(a, 'g'):>12}" for a in FPRS) + f" {'mu-GDP':>10}" if risks else ""))
            for s in args.steps:
                r = risks.get(str(s))
                print(f"{s:>12d}" + ("" if per_step else f" {acc.compositions(s):>12d}")
                      + f" {values[str(s)]:>12.6g}"
                      + ("" if r is None else "".join(f" {t:>12.4g}" for t in r.tprs) + f" {r.mu:>10.4g}"))
            if risks:
                print("TPR@a: the largest true-positive rate of a membership test on the unit of privacy at "
                      f"false-positive rate a; mu-GDP: Gaussian-DP equivalent for delta >= {args.delta:g} (upper "
                      "bounds)")
        return 0

    # steps
    n = acc.max_steps(args.epsilon, args.delta)
    risk = acc.risk(n, args.delta) if args.bound == "upper" and n > 0 else None
    if args.json:
        print(json.dumps({"steps": n, **_risk_json(risk)}))
    else:
        print(f"at most {n} steps stay within epsilon={args.epsilon:g}, delta={args.delta:g} "
              f"({acc.theorem}, {acc.kind} bound, composed per {acc.unit})")
        _print_risk(risk)
    return 0


def _risk_json(risk) -> dict:
    """The read-outs of ``dpts privacy noise/steps`` as JSON (issue 43): none for the optimistic lower bound."""
    return {} if risk is None else {"risk": risk.to_dict()}


def _print_risk(risk) -> None:
    """One line of membership-attack read-outs after the run that the line above describes (upper bounds)."""
    if risk is None:
        return
    tprs = ", ".join(f"TPR@{a:g} <= {t:.4g}" for a, t in zip(risk.fprs, risk.tprs, strict=True))
    print(f"membership risk for the unit of privacy after those steps: {tprs}; mu-GDP <= {risk.mu:.4g} "
          f"(for delta >= {risk.delta:g})")


def _fit_config(args: argparse.Namespace):
    from lightning_dpts.app.config import FitConfig

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
        if key not in ("command", "config"):
            values[key] = value
    config = FitConfig.from_mapping(values, source=None)
    if config.resume is not None:  # the run's own configuration; the options given here must agree with it
        config.validate()
        from lightning_dpts.app.resume import resumed_config

        config = resumed_config(config.resume, {key: getattr(config, key) for key in values})
    return config


def _run_fit(args: argparse.Namespace) -> int:
    from lightning_dpts.app.console import dpts_console
    from lightning_dpts.app.jobs.fit import run_fit

    config = _fit_config(args)
    out = config.output_dir
    try:
        with dpts_console(config.verbose) as console:
            if not config.verbose:  # the summary table prints the verdict; its Python warning is for Python callers
                import warnings

                warnings.filterwarnings("ignore", message="dpts fit: VERDICT")
            run_fit(config, progress=console.say)
    except ConfigurationError:
        raise
    except KeyboardInterrupt as err:  # Ctrl-C: say what was kept and how to continue
        from lightning_dpts.app.jobs.fit import FitInterrupted

        text = err.message() if isinstance(err, FitInterrupted) else _interrupted_outside_training(out)
        print(f"dpts: {text}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        import os

        where = f"; partial results may be in {out}" if os.path.isdir(out) else ""
        print(f"dpts: error: fit failed ({type(err).__name__}: {err}){where}", file=sys.stderr)
        return 1
    private = "" if not config.private_outputs else (
        "; NOT covered, keep private: private/ (evaluation.json, logs/"
        + (", forecasts.png)" if config.private_plots else ")"))
    print(f"results written to {out}/: covered by the guarantee or public: report.json (lists every file), "
          f"epsilon.png, dp-model.ckpt, model.json, predictor/, ledger.json and checkpoints/ (for --resume){private}")
    return 0


def _interrupted_outside_training(out: str) -> str:
    """What a Ctrl-C outside training (loading, evaluation, writing) leaves: a resumable run or nothing to resume."""
    from pathlib import Path

    from lightning_dpts.app.resume import LAST_CHECKPOINT, RUN_LEDGER

    run = Path(out)
    if (run / RUN_LEDGER).is_file() and (run / LAST_CHECKPOINT).is_file():
        return (f"interrupted: {run / RUN_LEDGER} counts the noisy steps taken and {run / LAST_CHECKPOINT} holds the "
                f"model; continue with: dpts fit --resume {run}")
    return (f"interrupted before training: nothing to resume (start the run again; with --overwrite if {run} is not "
            "empty)")


def _check_input_files(args: argparse.Namespace) -> None:
    """Refuse a missing ``--data`` / ``--public-data`` file before a job imports torch, GluonTS and Lightning."""
    from pathlib import Path

    if args.command not in ("fit", "predict", "synth"):  # dpts privacy --data checks its options first, then reads
        return
    for name in ("data", "public_data"):
        value = getattr(args, name, None)
        if isinstance(value, str) and not Path(value).is_file():
            raise ConfigurationError(name, value, "no such file")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dpts`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_input_files(args)  # before any job's heavy imports: a mistyped path is reported at once
        if args.command == "privacy":
            return _run_privacy(args)
        if args.command == "fit":
            return _run_fit(args)
        if args.command == "predict":
            return _run_predict(args)
        if args.command == "release":
            from lightning_dpts.app.release_cli import run_release

            return run_release(args)
        if args.command == "synth":
            from lightning_dpts.app.synth_cli import run_synth_command

            return run_synth_command(args)
        if args.command == "tune":
            from lightning_dpts.app.tune_cli import run_tune_command

            return run_tune_command(args)
        if args.command == "audit":
            from lightning_dpts.app.audit_cli import run_audit_command

            return run_audit_command(args)
    except ConfigurationError as err:
        from lightning_dpts.app.config import option_flags
        from lightning_dpts.app.release_cli import RELEASE_OPTION_NAMES
        from lightning_dpts.app.synth_cli import SYNTH_OPTION_NAMES

        names = {**option_flags(), **_OPTION_NAMES, **RELEASE_OPTION_NAMES}
        if args.command == "synth":
            names.update(SYNTH_OPTION_NAMES)
        if args.command == "tune":
            from lightning_dpts.app.tune_cli import TUNE_OPTION_NAMES

            names.update(TUNE_OPTION_NAMES)
        if args.command == "audit":
            from lightning_dpts.app.audit_cli import AUDIT_OPTION_NAMES

            names.update(AUDIT_OPTION_NAMES)
        option = names.get(err.parameter, err.parameter)
        if isinstance(err, TrainingRefused):  # after training began: its own status, not 2 (input refused)
            parser.exit(EXIT_REFUSED_DURING_TRAINING,
                        f"dpts: error: training refused after {err.steps} noisy steps, before the next one's update: "
                        f"{option}: {err.requirement} (got {err.value!r}); nothing of this run was kept\n")
        parser.exit(2, f"dpts: error: {option}: {err.requirement} (got {err.value!r})\n")
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover
    return 2  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

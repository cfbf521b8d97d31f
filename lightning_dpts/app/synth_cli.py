"""The ``dpts synth`` subcommand: options, mapping of parameter names to options, and the runner."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lightning_dpts.errors import ConfigurationError

__all__ = ["SYNTH_OPTION_NAMES", "add_synth_parser", "run_synth_command"]

#: SynthConfig parameter (as raised in ConfigurationError) -> command-line option.
SYNTH_OPTION_NAMES = {
    "data": "--data",
    "id_column": "--id-column",
    "timestamp_column": "--timestamp-column",
    "value_column": "--value-column",
    "freq": "--freq",
    "class_column": "--class-column",
    "classes": "--classes",
    "length": "--length",
    "num_samples": "--num-samples",
    "iterations": "--iterations",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "unit": "--unit",
    "max_windows_per_series": "--max-windows-per-series",
    "relation": "--relation",
    "threshold": "--threshold",
    "lookahead": "--lookahead",
    "variation_schedule": "--variation-schedule",
    "variation_degree": "--variation-schedule",
    "prediction_length": "--prediction-length",
    "tstr_steps": "--tstr-steps",
    "public_data": "--public-data",
    "pretrain_epochs": "--pretrain-epochs",
    "num_public": "--num-public",
    "seed": "--seed",
    "output_dir": "--output-dir",
    "private_outputs": "--no-private-outputs",
    "private_plots": "--no-private-plots",
    "overwrite": "--overwrite",
    "value_range": "--value-range",
    "start": "--start",
}


def add_synth_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``dpts synth`` to the ``dpts`` subparsers."""
    from lightning_dpts.app.synth_pipeline import SynthConfig
    from lightning_dpts.synthetic.privacy import PROTECTS, RELATIONS, UNITS

    d = SynthConfig()
    p = sub.add_parser(
        "synth", help="release a DP synthetic dataset by Private Evolution (PETS)", allow_abbrev=False,
        description="Generate a differentially private synthetic dataset of windows by Private Evolution "
                    "(PETS): public models, noisy nearest-neighbour votes of the private data, T rounds. Writes "
                    "synthetic.csv.gz (the release) and report.json (public), and under private/ the evaluation "
                    "computed from the private data (evaluation.json, real_vs_synthetic.png; not covered).",
    )
    p.add_argument("--data", metavar="PATH", help="long-format CSV or Parquet file (default: bundled us_employment)")
    p.add_argument("--id-column", default=d.id_column, metavar="COLUMN",
                   help=f"series id column (default {d.id_column})")
    p.add_argument("--timestamp-column", default=d.timestamp_column, metavar="COLUMN",
                   help=f"time stamp column (default {d.timestamp_column})")
    p.add_argument("--value-column", default=d.value_column, metavar="COLUMN",
                   help=f"value column (default {d.value_column})")
    from lightning_dpts.data.columns import add_deprecated_time_column

    add_deprecated_time_column(p)
    p.add_argument("--freq", help="pandas frequency (default: inferred)")
    p.add_argument("--class-column", help="column with each series' class (conditional generation)")
    p.add_argument("--classes", help="comma-separated public list of classes (required with --class-column)")
    p.add_argument("--length", type=int, metavar="T", default=d.length, help=f"window length (default {d.length})")
    p.add_argument("--num-samples", type=int, metavar="M", default=d.num_samples,
                   help=f"synthetic windows to release (default {d.num_samples})")
    p.add_argument("--iterations", type=int, default=d.iterations,
                   help=f"PE rounds, each one noisy vote (default {d.iterations}: more rounds gave a worse C-FID on "
                        "both real datasets, see docs/synthetic.md)")
    p.add_argument("--epsilon", type=float, metavar="E", default=d.epsilon, help=f"epsilon (default {d.epsilon:g})")
    p.add_argument("--delta", type=float, metavar="D", default=d.delta, help=f"delta (default {d.delta:g})")
    p.add_argument("--unit", choices=UNITS, default=d.unit,
                   help="privacy unit. series (default) protects " + PROTECTS["series"] + ". window (the paper's "
                        "unit; many more voters, so a better release at the same epsilon) protects "
                        + PROTECTS["window"])
    p.add_argument("--max-windows-per-series", type=int, metavar="m", default=d.max_windows_per_series,
                   help=f"windows per series with --unit series, vote weight 1/m (default {d.max_windows_per_series})")
    p.add_argument("--relation", choices=RELATIONS, default=d.relation,
                   help="neighbouring relation: add_remove (sensitivity 1; default with --unit series) or "
                        "substitution (sensitivity sqrt 2; default with --unit window)")
    p.add_argument("--threshold", type=float, metavar="H", default=d.threshold,
                   help="histogram threshold H of Algorithm 2, in votes (default: one noise standard deviation, "
                        "which depends only on epsilon, delta, the rounds and the relation)")
    p.add_argument("--lookahead", type=int, metavar="K", default=d.lookahead,
                   help=f"variations averaged per candidate embedding (default {d.lookahead})")
    p.add_argument("--variation-schedule", metavar="DEGREES",
                   help="comma-separated variation degrees in [0, 100] (default PETS S3: 40,35,...,5)")
    p.add_argument("--prediction-length", type=int, metavar="H", default=d.prediction_length,
                   help=f"TSTR horizon held out at the end of each series (default {d.prediction_length})")
    p.add_argument("--no-tstr", action="store_true", help="skip Train-on-Synthetic-Test-on-Real")
    p.add_argument("--tstr-steps", type=int, default=d.tstr_steps, help=f"TSTR training steps ({d.tstr_steps})")
    p.add_argument("--compare-dp-sgd", action="store_true",
                   help="also train DLinear with DP-SGD (dpts fit) at the same (epsilon, delta)")
    p.add_argument("--public-data", metavar="PATH", help="long-format file declared public to pretrain on "
                   "(default: the rule-based generator's output)")
    p.add_argument("--pretrain-epochs", metavar="VAE,ENC", default=",".join(map(str, d.pretrain_epochs)),
                   help="public pretraining epochs of the VAE and of each encoder (default %(default)s)")
    p.add_argument("--num-public", type=int, default=d.num_public, help=f"generated public windows ({d.num_public})")
    p.add_argument("--secure-noise", action="store_true", help="draw the vote noise from the OS CSPRNG")
    p.add_argument("--seed", type=int, help="experiments only: a seed makes the noise public (default: OS entropy)")
    p.add_argument("--output-dir", metavar="DIR", default=d.output_dir,
                   help=f"outputs, new or empty unless --overwrite (default {d.output_dir})")
    p.add_argument("--overwrite", action="store_true",
                   help="allow a non-empty --output-dir: first remove the earlier dpts run's files there (its public "
                        "pretrained weights are kept for reuse; refused if it holds files no dpts run wrote)")
    p.add_argument("--no-private-outputs", dest="private_outputs", action="store_false",
                   help="write nothing computed from the private data (no private/ folder); the terminal still "
                        "shows the evaluation")
    p.add_argument("--no-private-plots", dest="private_plots", action="store_false",
                   help="do not write private/real_vs_synthetic.png, which shows real private windows")
    p.add_argument("--value-range", type=float, nargs=2, metavar=("LO", "HI"),
                   help="bounds of the values, declared public: write the release in the data's units with a DP "
                        "level and spread (one more noisy round, accounted in epsilon). Default: standardised "
                        "values (mean 0, std 1 per window), and the output says so")
    p.add_argument("--start", metavar="DATE", help="first time stamp of every synthetic window, declared public "
                   "(default: the placeholder 2000-01-01; the data's own dates are private)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--verbose", action="store_true",
                   help="show third-party warnings, Lightning's info lines and progress bars even when stdout is not "
                        "a terminal (default: quiet)")


def _numbers(text: str | None, parameter: str, kind: type) -> list | None:
    if text is None:
        return None
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise ConfigurationError(parameter, text, f"must be comma-separated {kind.__name__} values") from err


def _dp_sgd_reference(fit_config: Any) -> dict[str, Any]:
    """``--compare-dp-sgd``: the ``dpts fit`` job (:func:`lightning_dpts.app.jobs.fit.run_fit`, quiet) on the
    comparison's config; the command line composes the two jobs, neither imports the other."""
    from lightning_dpts.app.jobs.fit import run_fit

    return run_fit(fit_config, progress=lambda _m: None)


def run_synth_command(args: argparse.Namespace) -> int:
    """Build a :class:`~lightning_dpts.app.synth_pipeline.SynthConfig` from ``args`` and run it
    (:func:`lightning_dpts.app.jobs.synth.run_synth`)."""
    from lightning_dpts.app.console import dpts_console, progress_bar_wanted
    from lightning_dpts.app.jobs.synth import SynthConfig, run_synth

    epochs = _numbers(args.pretrain_epochs, "pretrain_epochs", int)
    config = SynthConfig(
        data=args.data, id_column=args.id_column, timestamp_column=args.timestamp_column,
        value_column=args.value_column,
        freq=args.freq, class_column=args.class_column,
        classes=None if args.classes is None else [c.strip() for c in args.classes.split(",") if c.strip()],
        length=args.length, num_samples=args.num_samples, iterations=args.iterations, epsilon=args.epsilon,
        delta=args.delta, unit=args.unit, max_windows_per_series=args.max_windows_per_series,
        relation=args.relation, threshold=args.threshold, lookahead=args.lookahead,
        variation_schedule=_numbers(args.variation_schedule, "variation_schedule", float),
        prediction_length=args.prediction_length, tstr=not args.no_tstr, tstr_steps=args.tstr_steps,
        compare_dp_sgd=args.compare_dp_sgd, public_data=args.public_data,
        pretrain_epochs=tuple(epochs) if epochs is not None else (0, 0), num_public=args.num_public,
        secure_noise=args.secure_noise, seed=args.seed, output_dir=args.output_dir,
        progress=not args.no_progress and progress_bar_wanted(args.verbose),
        private_outputs=args.private_outputs, private_plots=args.private_plots, overwrite=args.overwrite,
        value_range=None if args.value_range is None else tuple(args.value_range), start=args.start,
    )
    try:
        with dpts_console(args.verbose):
            run_synth(config, compare=_dp_sgd_reference)
    except ConfigurationError:
        raise
    except Exception as err:
        print(f"dpts: error: synth failed ({type(err).__name__}: {err})", file=sys.stderr)
        return 1
    private = "" if not config.private_outputs else (
        "; NOT covered, keep private: private/ (evaluation.json"
        + (", real_vs_synthetic.png)" if config.private_plots else ")"))
    print(f"results written to {config.output_dir}/: covered by the guarantee or public: synthetic.csv.gz, "
          f"report.json (lists every file){private}")
    return 0

"""``dpts tune``: private hyperparameter selection from the command line (:func:`lightning_dpts.tuning.tune`).

Writes ``OUTPUT/tuning.json`` (public: the procedure, K, every candidate's setting and noise, the total epsilon, the
selected candidate and its noisy score), ``OUTPUT/model.ckpt`` (the selected weights; their privacy ledger records
the search) and ``OUTPUT/private/tuning.json`` (the number of runs and every run's noisy score: private).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lightning_dpts.errors import ConfigurationError

__all__ = ["TUNE_OPTION_NAMES", "add_tune_parser", "run_tune_command"]

TUNE_OPTION_NAMES = {"mean_runs": "--mean-runs", "eta": "--eta", "candidates": "--candidates",
                     "score_clip": "--score-clip", "score_share": "--score-share", "epsilon": "--epsilon",
                     "delta": "--delta", "prediction_length": "--prediction-length", "freq": "--freq"}


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune", help="choose a setting among candidates privately; epsilon covers the whole search",
        allow_abbrev=False,
        description="Train candidate settings with DP-SGD, score them on private validation windows with a DP "
                    "score, and keep the best by random stopping (Papernot & Steinke 2022): the reported epsilon "
                    "covers every run, every score and the selection. docs/tuning.md.")
    p.add_argument("--data", default="us_employment", metavar="PATH",
                   help="long-format CSV/Parquet file or a bundled dataset name (default us_employment)")
    p.add_argument("--id-column", default="item_id")
    p.add_argument("--timestamp-column", default="timestamp")
    p.add_argument("--value-column", default="target")
    p.add_argument("--freq", default=None, help="pandas frequency (default: inferred / the bundled data's)")
    p.add_argument("--prediction-length", type=int, default=None, metavar="H",
                   help="horizon (default 12, as dpts fit: the tuned setting is then the one dpts fit would train)")
    p.add_argument("--epsilon", type=float, default=4.0, help="total epsilon of the search (default 4)")
    p.add_argument("--delta", type=float, default=1e-7, help="default 1e-7")
    p.add_argument("--candidates", metavar="JSON", default=None,
                   help="JSON file with a list of candidate settings (model, context_length, batch_size, epochs, "
                        "max_grad_norm, learning_rate); default: the recipe and seven neighbours")
    p.add_argument("--mean-runs", type=float, default=8.0, help="E[number of runs] (> 1, default 8)")
    p.add_argument("--eta", type=float, default=0.0, help="eta of the truncated negative binomial (> -1, default 0)")
    p.add_argument("--score-clip", type=float, default=0.2, help="b of the clipped log score ratio (default 0.2)")
    p.add_argument("--score-share", type=float, default=0.25,
                   help="share of epsilon one score alone would spend, sets its noise (0-1, default 0.25)")
    p.add_argument("--output", default="runs/tune", metavar="DIR", help="default runs/tune")
    p.add_argument("--seed", type=int, default=None,
                   help="for experiments only: the guarantee does not hold against anyone who knows it")
    p.add_argument("--plan-only", action="store_true",
                   help="print the calibrated plan (noise per candidate, total epsilon) and train nothing")


def _load(args: argparse.Namespace) -> tuple[list, str]:
    import numpy as np

    from lightning_dpts.data.sources import BUNDLED_DATASETS, to_collection

    if args.data in BUNDLED_DATASETS:
        collection = to_collection(args.data, freq=args.freq)
    else:
        if not Path(args.data).is_file():
            raise ConfigurationError("data", args.data, "no such file (or a bundled dataset name)")
        from lightning_dpts.data.loading import load_long_table

        table, freq = load_long_table(args.data, args.id_column, args.timestamp_column, args.value_column, args.freq)
        collection = to_collection(table, freq=freq, id_column="item_id", timestamp_column="timestamp",
                                   value_column=["target"])
    if collection.targets[0].ndim == 2 and collection.targets[0].shape[1] != 1:
        raise ConfigurationError("data", "multivariate", "dpts tune trains univariate series")
    return [np.asarray(t, dtype=np.float32).reshape(len(t), -1)[:, 0] for t in collection.targets], collection.freq


def _check(args: argparse.Namespace) -> None:
    if not (args.epsilon > 0):
        raise ConfigurationError("epsilon", args.epsilon, "must be > 0")
    if not (0 < args.delta < 1):
        raise ConfigurationError("delta", args.delta, "must lie in (0, 1)")
    if not (args.mean_runs > 1):
        raise ConfigurationError("mean_runs", args.mean_runs, "must be > 1")
    if not (args.eta > -1):
        raise ConfigurationError("eta", args.eta, "must be > -1")
    if not (args.score_clip > 0):
        raise ConfigurationError("score_clip", args.score_clip, "must be > 0")
    if not (0 < args.score_share < 1):
        raise ConfigurationError("score_share", args.score_share, "must lie in (0, 1)")
    if args.prediction_length is not None and args.prediction_length < 1:
        raise ConfigurationError("prediction_length", args.prediction_length, "must be an integer >= 1")
    if args.candidates is not None and not Path(args.candidates).is_file():
        raise ConfigurationError("candidates", args.candidates, "no such file")


def run_tune_command(args: argparse.Namespace) -> int:
    """Run ``dpts tune``; ConfigurationError propagates (exit status 2 in :func:`lightning_dpts.app.cli.main`).

    Known third-party notices are hidden and this package's warnings go to stderr once each, as for the other
    commands (:func:`~lightning_dpts.app.console.dpts_console`): stdout is the result, or one JSON object with
    ``--plan-only``."""
    _check(args)  # before reading data or importing torch
    from lightning_dpts.app.console import dpts_console, to_stderr

    with dpts_console(False, write=to_stderr):
        return _run_tune(args)


def _run_tune(args: argparse.Namespace) -> int:
    candidates = None
    if args.candidates is not None:
        from lightning_dpts.tuning import Candidate

        try:
            raw = json.loads(Path(args.candidates).read_text())
        except json.JSONDecodeError as err:
            raise ConfigurationError("candidates", args.candidates, f"is not JSON ({err})") from None
        if not isinstance(raw, list) or not raw or not all(isinstance(c, dict) for c in raw):
            raise ConfigurationError("candidates", args.candidates, "must hold a non-empty JSON list of objects")
        candidates = [Candidate.from_dict(c) for c in raw]
    series, freq = _load(args)
    from lightning_dpts.app.config import default_of
    from lightning_dpts.tuning import default_candidates, plan, tune

    # dpts fit's default horizon: the tuned setting is then the one a default dpts fit trains
    horizon = args.prediction_length or int(default_of("prediction_length"))
    if args.plan_only:
        cands = candidates or default_candidates([len(s) for s in series], freq=freq, prediction_length=horizon,
                                                 epsilon=args.epsilon, delta=args.delta)
        described = plan(series, freq=freq, prediction_length=horizon, epsilon=args.epsilon, delta=args.delta,
                         candidates=cands, mean_runs=args.mean_runs, eta=args.eta,
                         score_share=args.score_share).describe()
        print(json.dumps(described, indent=2, default=float))
        return 0
    result = tune(series, freq=freq, prediction_length=horizon, epsilon=args.epsilon, delta=args.delta,
                  candidates=candidates, mean_runs=args.mean_runs, eta=args.eta, score_clip=args.score_clip,
                  score_share=args.score_share, seed=args.seed)
    out = Path(args.output)
    result.write(out)
    import torch

    torch.save({"state_dict": result.module.state_dict(), "candidate": result.candidate.to_dict()},
               out / "model.ckpt")
    r = result.report
    print(f"{r['procedure']}: K = {r['K']} candidates, E[runs] = {r['expected_runs']:.3g}; total epsilon = "
          f"{r['epsilon']:.4g} at delta = {r['delta']:g} (one run alone {r['single_run_epsilon']:.4g}, every "
          f"candidate once and the best kept {r['fixed_runs_epsilon']:.4g})")
    print(f"selected: {result.candidate.to_dict()}; written to {out}/ (tuning.json, model.ckpt; private/tuning.json "
          "is private)")
    return 0


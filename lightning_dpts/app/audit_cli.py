"""``dpts audit``: an empirical privacy audit of DP-SGD training (docs/audit.md).

Wiring into the ``dpts`` command (``lightning_dpts/app/cli.py``): ``add_audit_parser(sub)`` in ``build_parser``, and in
``main`` ``run_audit_command(args)`` for ``args.command == "audit"``; :data:`AUDIT_OPTION_NAMES` maps every
parameter a :class:`~lightning_dpts.errors.ConfigurationError` of the audit can name to its option.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lightning_dpts.errors import ConfigurationError

__all__ = ["AUDIT_OPTION_NAMES", "add_audit_parser", "run_audit_command"]

AUDIT_OPTION_NAMES: dict[str, str] = {
    "epsilon": "--epsilon",
    "delta": "--delta",
    "canaries": "--canaries",
    "steps": "--steps",
    "output_dir": "--output-dir",
    "seed": "--seed",
    "level": "--level",
    "size": "--size",
    "value_bound": "--value-bound",
    "magnitude": "--magnitude",
    "max_grad_norm": "--max-grad-norm",
    "confidence": "--confidence",
    "config": "--config",
    "runs": "--runs",
}


def add_audit_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``dpts audit``."""
    audit = sub.add_parser(
        "audit", help="empirical privacy audit: train once with canaries, lower-bound epsilon", allow_abbrev=False,
        description="Train once with DP-SGD on the bundled data (or the --config's) holding canaries, each a "
                    "protected unit included with probability 1/2, and turn white-box (noisy updates) and black-box "
                    "(final model) scores into empirical lower bounds on epsilon with their confidence, next to "
                    "the accountant's epsilon for the same configuration (docs/audit.md).",
    )
    audit.add_argument("--config", metavar="YAML", default=None,
                       help="a dpts fit YAML: its epsilon, delta, level, size, value_bound, max_grad_norm, seed and "
                            "data are audited (the options below override them)")
    audit.add_argument("--quick", action="store_true", help="1024 canaries, 5 steps (default 32768, 5)")
    audit.add_argument("--check", action="store_true",
                       help="the CI regression check: 512 canaries, 5 steps, white-box only; exit "
                            "code 1 if the primary bound exceeds the accountant's epsilon (docs/audit.md)")
    audit.add_argument("--runs", type=int, default=None, metavar="R",
                       help="independent trainings whose canaries are pooled, in [1, 1000] (default 1)")
    audit.add_argument("--epsilon", type=float, default=None, metavar="E",
                       help="the accountant's epsilon to calibrate for, in (0, 100] (default 8)")
    audit.add_argument("--delta", type=float, default=None, metavar="D", help="delta in (0, 0.1] (default 1e-5)")
    audit.add_argument("--canaries", type=int, default=None, metavar="M", help="number of canaries, >= 2")
    audit.add_argument("--steps", type=int, default=None, metavar="S", help="noisy optimizer steps, >= 1")
    audit.add_argument("--level", choices=("event", "user"), default=None, help="protected unit (default event)")
    audit.add_argument("--size", type=int, default=None, metavar="W", help="protected steps w (default 1)")
    audit.add_argument("--value-bound", type=float, default=None, metavar="V",
                       help="per-step change bound (units of each series' mean absolute value); caps --magnitude")
    audit.add_argument("--magnitude", type=float, default=None, metavar="A",
                       help="difference between a canary's two worlds per step (default: the value bound, else 100)")
    audit.add_argument("--max-grad-norm", type=float, default=None, metavar="C", help="clipping norm (default 1)")
    audit.add_argument("--confidence", type=float, default=None,
                       help="confidence of the bounds, in (0, 1) (default 0.999)")
    audit.add_argument("--no-black-box", action="store_true", help="skip the black-box (final model) score")
    audit.add_argument("--seed", type=int, default=None,
                       help="explicit seed for the canaries' coins, sampling, initialisation and DP noise, for "
                            "experiments (default: fresh secret entropy, as dpts fit)")
    audit.add_argument("--output-dir", default=None, metavar="DIR",
                       help="write report.json and private/ (audit.json, audit.png, scores.csv) here")
    audit.add_argument("--overwrite", action="store_true", help="allow a non-empty --output-dir of an earlier run")
    audit.add_argument("--json", action="store_true", help="print one JSON object instead of the table")


def _from_config(path: str) -> dict[str, Any]:
    """The audited fields of a dpts fit YAML (:func:`~lightning_dpts.audit.runner.options_from_fit_config`)."""
    import yaml

    from lightning_dpts.app.config import FitConfig

    try:
        with open(path) as handle:
            loaded = yaml.safe_load(handle) or {}
    except OSError as err:
        raise ConfigurationError("config", path, f"cannot be read ({err.strerror})") from err
    except (UnicodeDecodeError, ValueError) as err:
        raise ConfigurationError("config", path, "is not a text YAML file") from err
    except yaml.YAMLError as err:
        raise ConfigurationError("config", path, f"is not valid YAML ({err})") from err
    if not isinstance(loaded, dict):
        raise ConfigurationError("config", path, "must be a YAML mapping of FitConfig fields")
    from lightning_dpts.audit.runner import options_from_fit_config

    return options_from_fit_config(FitConfig.from_mapping({str(k): v for k, v in loaded.items()}))


def run_audit_command(args: argparse.Namespace) -> int:
    """Run ``dpts audit``; a bad option raises :class:`ConfigurationError` before any work (exit code 2)."""
    from lightning_dpts.audit.runner import relation_from, run_audit

    options: dict[str, Any] = _from_config(args.config) if args.config else {}
    relation = options.pop("relation", None)
    if args.check:
        from lightning_dpts.audit.runner import CHECK_OPTIONS

        options.update(CHECK_OPTIONS)
    for name in ("epsilon", "delta", "canaries", "steps", "magnitude", "max_grad_norm", "seed", "runs"):
        value = getattr(args, name)
        if value is not None:
            options[name] = value
    if args.level is not None or args.size is not None or args.value_bound is not None:
        relation = relation_from(args.level, args.size, args.value_bound, relation)
    from lightning_dpts.app.console import dpts_console

    with dpts_console(False) as console:
        confidence = args.confidence if args.confidence is not None else 0.999
        black_box = options.pop("black_box", True) and not args.no_black_box
        result = run_audit(quick=args.quick, relation=relation, confidence=confidence,
                           black_box=black_box, output_dir=args.output_dir, overwrite=args.overwrite,
                           progress=None if args.json else console.say, **options)
    if args.json:
        print(json.dumps(result.as_dict(), sort_keys=True))
    elif args.output_dir is not None:
        print(f"results written to {args.output_dir}/: public: report.json (configuration, the accountant's "
              "epsilon); NOT covered, keep private: private/ (audit.json with the bounds, audit.png, scores.csv)",
              file=sys.stdout)
    if args.check and result.white_box_epsilon > result.accountant_epsilon:
        print(f"dpts audit --check: FAILED: the primary bound {result.white_box_epsilon:.3f} exceeds the "
              f"accountant's epsilon {result.accountant_epsilon:.3f}", file=sys.stderr)
        return 1
    return 0

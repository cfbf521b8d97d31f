"""``dpts release epsilon|noise``: accounting for privatised forecast releases (time-domain subsampling).

Wiring into the ``dpts`` command (``lightning_dpts/app/cli.py``)::

    from lightning_dpts.app.release_cli import RELEASE_OPTION_NAMES, add_release_parser, run_release
    add_release_parser(sub)                  # in build_parser(), next to the "privacy" sub-command
    if args.command == "release":            # in main(), inside the try/except ConfigurationError
        return run_release(args)
    option = {**_OPTION_NAMES, **RELEASE_OPTION_NAMES}.get(err.parameter, err.parameter)

``RELEASE_OPTION_NAMES`` maps every parameter name a :class:`~lightning_dpts.errors.ConfigurationError` from
this sub-command can carry to its option (release names take precedence: ``size``, ``delta``... coincide).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from lightning_dpts.errors import ConfigurationError

__all__ = ["RELEASE_OPTION_NAMES", "add_release_parser", "run_release"]

RELEASE_OPTION_NAMES: dict[str, str] = {
    "rate": "--rate",
    "size": "--size",
    "level": "--level",
    "value_bound": "--value-bound",
    "relation.value_bound": "--value-bound",
    "num_dims": "--num-dims",
    "context_length": "--context-length",
    "filter_kernel": "--filter-width",
    "width": "--filter-width",
    "length": "--context-length",
    "noise_std": "--noise-std",
    "delta": "--delta",
    "epsilon": "--epsilon",
    "releases": "--releases",
    "bound": "--bound",
    "gaussian": "--gaussian",
}


def _add_options(parser: argparse.ArgumentParser, *, needs_noise: bool) -> None:
    from lightning_dpts.privacy.spec import LEVELS
    from lightning_dpts.release.accounting import BOUNDS, GAUSSIAN_STEPS

    mech = parser.add_argument_group("mechanism")
    mech.add_argument("--rate", type=float, required=True, metavar="P",
                      help="Poisson subsampling rate of time steps, in (0, 1]")
    if needs_noise:
        mech.add_argument("--noise-std", type=float, required=True, metavar="S",
                          help="std of the Gaussian noise on each sampled value (series units)")
    mech.add_argument("--context-length", type=int, default=None, metavar="T",
                      help="released window length incl. lags (time steps); caps W at T (default: no cap)")
    mech.add_argument("--filter-width", type=float, default=None, metavar="SIGMA_G",
                      help="apply Koga et al.'s Gaussian circulant filter of this width (time steps) before "
                           "subsampling; needs --context-length and --bound koga")
    priv = parser.add_argument_group("privacy")
    priv.add_argument("--level", choices=LEVELS, default="event",
                      help="event or user level (same bound for releases; default event)")
    priv.add_argument("--size", type=int, required=True, metavar="W", help="protected time steps w")
    priv.add_argument("--value-bound", type=float, required=True, metavar="V",
                      help="each protected step changes by at most V (series units)")
    priv.add_argument("--num-dims", type=int, default=1, metavar="D",
                      help="V bounds each of D coordinates of a multivariate series (default 1)")
    priv.add_argument("--delta", type=float, required=True, metavar="D", help="target delta in (0, 1)")
    priv.add_argument("--releases", type=int, default=1, metavar="K",
                      help="number of releases from the same series (rolling forecasts; default 1)")
    priv.add_argument("--bound", choices=BOUNDS, default="exact",
                      help="exact: tight profile (identity filter only); koga: Koga et al. Cor. 3 / Cor. 2")
    priv.add_argument("--gaussian", choices=GAUSSIAN_STEPS, default="analytic",
                      help="Gaussian step inside the koga bound: analytic (default) or classical "
                           "(Koga et al. Theorem 1, proven for epsilon < 1 only)")
    if not needs_noise:
        priv.add_argument("--epsilon", type=float, required=True, metavar="E", help="target epsilon")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_release_parser(subparsers: Any) -> None:
    """Add the ``release`` sub-command (actions ``epsilon`` and ``noise``) to an argparse subparsers object."""
    release = subparsers.add_parser(
        "release", help="privacy of forecasts released from a privatised series", allow_abbrev=False,
        description="Accounting for Poisson time-step subsampling + Gaussian noise before forecasting "
                    "(Koga et al. 2022; Appendix H).")
    rsub = release.add_subparsers(dest="action", required=True)
    _add_options(rsub.add_parser("epsilon", help="epsilon of K releases at noise std S", allow_abbrev=False),
                 needs_noise=True)
    _add_options(rsub.add_parser("noise", help="smallest noise std reaching (epsilon, delta) for K releases",
                                 allow_abbrev=False), needs_noise=False)


def _spec_from_args(args: argparse.Namespace):
    from lightning_dpts.privacy.spec import NeighbouringRelation
    from lightning_dpts.release.accounting import ReleaseSpec
    from lightning_dpts.release.mechanism import gaussian_filter_kernel

    relation = NeighbouringRelation(level=args.level, size=args.size, value_bound=args.value_bound,
                                    num_dims=args.num_dims)
    kernel = None
    if args.filter_width is not None:
        if args.context_length is None:
            raise ConfigurationError("context_length", None, "is required with --filter-width (the filter is "
                                     "circulant over the released window)")
        if args.bound == "exact":
            raise ConfigurationError("bound", "exact", "the exact bound covers the identity filter only; use "
                                     "--bound koga with --filter-width")
        kernel = gaussian_filter_kernel(args.context_length, args.filter_width)
    return ReleaseSpec(rate=args.rate, relation=relation, context_length=args.context_length, filter_kernel=kernel)


def run_release(args: argparse.Namespace) -> int:
    """Run ``dpts release epsilon|noise``; prints the result and returns 0, raises ConfigurationError."""
    from lightning_dpts.release.accounting import ReleaseAccountant, calibrate_release_noise

    spec = _spec_from_args(args)
    if args.releases is None or args.releases < 1:
        raise ConfigurationError("releases", args.releases, "must be an integer >= 1")
    if args.action == "noise":
        s = calibrate_release_noise(spec, args.epsilon, args.delta, args.releases, bound=args.bound,
                                    gaussian=args.gaussian)
        if args.json:
            print(json.dumps({"noise_std": s}))
        else:
            print(f"noise std {s:.6g} reaches epsilon <= {args.epsilon:g} at delta={args.delta:g} for "
                  f"{args.releases} release(s) ({args.bound} bound)")
        return 0
    acc = ReleaseAccountant(spec, args.noise_std, bound=args.bound, gaussian=args.gaussian)
    eps = acc.epsilon(args.delta, args.releases)
    if eps == float("inf") and args.gaussian != "classical":
        raise ConfigurationError("noise_std", args.noise_std, "is too small for --value-bound: no finite epsilon "
                                 "(up to 1e7) is certified; add noise")
    if eps == float("inf"):  # the classical step is the culprit (proven for epsilon < 1 only), not the noise
        raise ConfigurationError("gaussian", args.gaussian, f"the {acc.theorem} bound with the classical "
                                 f"Gaussian step certifies no epsilon < 1 at --noise-std {args.noise_std:g}; use "
                                 "--gaussian analytic (or more noise)")
    if args.json:
        print(json.dumps({"epsilon": eps}))
    else:
        print(f"epsilon {eps:.6g} at delta={args.delta:g} after {args.releases} release(s) ({acc.theorem})")
    return 0

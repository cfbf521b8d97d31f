"""Soundness, power, sharpness and cost of the empirical privacy audit (issue 28; docs/audit.md "Measurements").

For each seed, ``lightning_dpts.audit.run_audit`` on the bundled data (1-event canaries, delta = 1e-5):

* power and soundness: the default audit (32768 canaries, 5 steps; ``--quick``: 1024 canaries, 5 steps) at the
  accountant's epsilon = 8 and 4: the white-box and black-box one-run lower bounds (Steinke et al. 2023) and their
  Gaussian-DP reading (after Mahloujifar et al. 2025), each at confidence 0.95, next to the accountant's epsilon.
  Soundness: no bound above the accountant's epsilon; power target: white-box >= epsilon / 2;
* sharpness (epsilon = 2, 2048 resp. 1024 canaries, 5 steps): a run whose noise is 1/4 of what sigma says (the
  ``_noise_scale`` test seam) and :class:`~lightning_dpts.audit.models.WindowMixingForecaster` with the probe and
  spot check switched off: both must give a bound above the accountant's epsilon;
* the reference: the ideal one-run bound for the same number of canaries, from scores drawn directly from the two
  Gaussians N(+-mu/2, 1) the Gaussian mechanism at this epsilon implies (mu from delta(epsilon) of mu-GDP): what
  any score can reach with this estimator and this many canaries;
* cost: the wall-clock seconds of every run (state the machine's load next to them).

Run: ``python benchmarks/audit.py [--seeds 3] [--quick] [--canaries M --steps S] [--json results.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

warnings.filterwarnings("ignore")


def _ideal(epsilon: float, delta: float, m: int, seed: int) -> dict[str, float]:
    import numpy as np
    from scipy.optimize import brentq

    from lightning_dpts.audit import gaussian_dp_epsilon, one_run_epsilon_lower_bound, one_run_fdp_lower_bound

    mu = brentq(lambda u: gaussian_dp_epsilon(u, delta) - epsilon, 1e-3, 40.0)
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    scores = rng.normal(size=m) + np.where(included, mu / 2, -mu / 2)
    return {"mu": mu,
            "one_run": one_run_epsilon_lower_bound(scores, included, delta=delta).epsilon,
            "fdp": one_run_fdp_lower_bound(scores, included, delta=delta).epsilon}


def _row(kind: str, epsilon: float, seed: int, result, seconds: float) -> dict:  # noqa: ANN001
    return {"kind": kind, "epsilon": epsilon, "seed": seed, "accountant": result.accountant_epsilon,
            **{name: float(b["epsilon"]) for name, b in result.bounds.items()}, "seconds": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--canaries", type=int, default=None, help="canaries of the power runs (default: the audit's)")
    parser.add_argument("--steps", type=int, default=None, help="steps of the power runs (default: the audit's)")
    parser.add_argument("--skip", nargs="*", default=[], choices=("power", "sharp", "ideal"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from lightning_dpts.audit.models import WindowMixingForecaster
    from lightning_dpts.audit.runner import DEFAULT_SIZE, QUICK_SIZE, run_audit

    m = args.canaries or (QUICK_SIZE if args.quick else DEFAULT_SIZE)[0]
    rows: list[dict] = []
    print(f"load average: {os.getloadavg()}")

    def record(kind: str, epsilon: float, seed: int, **kwargs) -> None:  # noqa: ANN003
        start = time.perf_counter()
        result = run_audit(epsilon=epsilon, seed=seed, progress=None, **kwargs)
        rows.append(_row(kind, epsilon, seed, result, time.perf_counter() - start))
        print(json.dumps(rows[-1]), flush=True)

    for seed in range(args.seeds):
        if "power" not in args.skip:
            for epsilon in (8.0, 4.0):
                record("default", epsilon, seed, quick=args.quick, canaries=args.canaries, steps=args.steps)
        if "sharp" not in args.skip:
            record("quarter_noise", 2.0, seed, canaries=2048 if not args.quick else 1024, steps=5, black_box=False,
                   _noise_scale=0.25)
            record("window_mixing", 2.0, seed, canaries=1024, steps=5, black_box=False,
                   module=lambda n, p, h: WindowMixingForecaster(n, p, h),
                   strategy_options={"per_window": "fast", "check_independence": False, "spot_check": 0.0})
        if "ideal" not in args.skip:
            for epsilon in (8.0, 4.0):
                ideal = _ideal(epsilon, 1e-5, m, seed)
                rows.append({"kind": "ideal_gaussian", "epsilon": epsilon, "seed": seed, "canaries": m, **ideal})
                print(json.dumps(rows[-1]), flush=True)
    print(f"load average: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()

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
* cost: the wall-clock seconds of every run (state the machine's load next to them);
* issue 42: every power run also reports ``white_box_gauss`` (the primary bound in the audit's geometry: the canary
  scores read as Gaussian, Agrawal et al. 2026); ``--runs R`` pools R independent runs; ``ci`` is the regression
  check a user runs in CI (``CHECK_OPTIONS``: 512 canaries, 5 steps, confidence 0.999): its false-alarm rate over
  ``--ci-seeds`` correct runs and its power against runs with half the noise (``_noise_scale=0.5``), with CPU
  seconds per run;
* every run also reports ``white_box_order`` / ``black_box_order``: the order-statistics bound (Xiang et al. 2025,
  Theorem 2; ``lightning_dpts.audit.order_statistics``), the r most confident guesses' mistakes read under mu-GDP;
* ``models``: the modules ``dpts fit`` trains (``fit_model``: seasonal_linear, dlinear, combination, with its
  clipping norm) at epsilon = 8 with spike canaries in pieces of the bundled series, in two geometries: nothing
  sampled (every piece in every batch: ``--model-canaries`` per run, ``--model-runs`` runs pooled) and subsampled
  whole series (``dpts fit``'s geometry: one window per series per step, a quarter of the series per step, 20
  steps);
  next to it the Gaussian-score bound on ideal scores with as many canaries (what the estimator could reach);
  ``benchmarks/audit_ceiling.py`` gives each model's ceiling: the share of mu one canary can show, for any score.

Run: ``python benchmarks/audit.py [--seeds 3] [--quick] [--canaries M --steps S] [--runs R] [--ci-seeds 100]
[--skip power sharp ideal ci] [--json results.json]``
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

    from lightning_dpts.audit import (
        gaussian_dp_epsilon,
        gaussian_scores_lower_bound,
        one_run_epsilon_lower_bound,
        one_run_fdp_lower_bound,
        order_statistics_lower_bound,
    )

    mu = brentq(lambda u: gaussian_dp_epsilon(u, delta) - epsilon, 1e-3, 40.0)
    rng = np.random.default_rng(seed)
    included = rng.random(m) < 0.5
    scores = rng.normal(size=m) + np.where(included, mu / 2, -mu / 2)
    return {"mu": mu,
            "one_run": one_run_epsilon_lower_bound(scores, included, delta=delta).epsilon,
            "fdp": one_run_fdp_lower_bound(scores, included, delta=delta).epsilon,
            "gauss": gaussian_scores_lower_bound(scores, included, delta=delta).epsilon,
            "order": order_statistics_lower_bound(scores, included, delta=delta).epsilon}


def _row(kind: str, epsilon: float, seed: int, result, seconds: float) -> dict:  # noqa: ANN001
    return {"kind": kind, "epsilon": epsilon, "seed": seed, "accountant": result.accountant_epsilon,
            "canaries": result.canaries, "runs": result.runs, "primary": result.primary,
            "confidence": result.bounds[result.primary]["confidence"], "mu": result.bounds["white_box_gauss"]["mu"],
            **{name: float(b["epsilon"]) for name, b in result.bounds.items()}, "seconds": round(seconds, 1)}


def _ci_summary(rows: list[dict]) -> None:
    """False alarms of the CI check on correct runs and its power on half-noise runs, with Clopper-Pearson 95%
    intervals, and the CPU seconds per run."""
    from scipy.stats import beta

    for kind in ("ci_correct", "ci_half_noise"):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        hits = sum(r[r["primary"]] > r["accountant"] for r in sel)
        n = len(sel)
        lo = 0.0 if hits == 0 else beta.ppf(0.025, hits, n - hits + 1)
        hi = 1.0 if hits == n else beta.ppf(0.975, hits + 1, n - hits)
        also = sum(r["white_box_fdp"] > r["accountant"] for r in sel)
        cpu = sorted(r["cpu_seconds"] for r in sel)
        print(f"{kind}: primary above the accountant in {hits}/{n} runs (95% CI {lo:.3f}-{hi:.3f}); "
              f"assumption-free f-DP bound above in {also}/{n}; CPU s/run median {cpu[n // 2]} max {cpu[-1]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--canaries", type=int, default=None, help="canaries of the power runs (default: the audit's)")
    parser.add_argument("--steps", type=int, default=None, help="steps of the power runs (default: the audit's)")
    parser.add_argument("--runs", type=int, default=1, help="independent runs pooled per power audit")
    parser.add_argument("--ci-seeds", type=int, default=100, help="correct runs of the CI check (false alarms)")
    parser.add_argument("--ci-power-seeds", type=int, default=20, help="half-noise runs of the CI check (power)")
    parser.add_argument("--epsilons", type=float, nargs="*", default=[8.0, 4.0])
    parser.add_argument("--models", nargs="*", default=["seasonal_linear", "dlinear", "combination"])
    parser.add_argument("--model-canaries", type=int, default=2)
    parser.add_argument("--model-runs", type=int, default=60)
    parser.add_argument("--skip", nargs="*", default=[], choices=("power", "sharp", "ideal", "ci", "models"))
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from lightning_dpts.audit.models import WindowMixingForecaster
    from lightning_dpts.audit.runner import CHECK_OPTIONS as CI_CHECK
    from lightning_dpts.audit.runner import DEFAULT_SIZE, QUICK_SIZE, run_audit

    m = args.canaries or (QUICK_SIZE if args.quick else DEFAULT_SIZE)[0]
    rows: list[dict] = []
    print(f"load average: {os.getloadavg()}")

    def record(kind: str, epsilon: float, seed: int, **kwargs) -> None:  # noqa: ANN003
        start, cpu = time.perf_counter(), time.process_time()
        result = run_audit(epsilon=epsilon, seed=seed, progress=None, **kwargs)
        rows.append(_row(kind, epsilon, seed, result, time.perf_counter() - start))
        rows[-1]["cpu_seconds"] = round(time.process_time() - cpu, 1)
        print(json.dumps(rows[-1]), flush=True)

    for seed in range(args.seeds):
        if "power" not in args.skip:
            for epsilon in args.epsilons:
                record("default" if args.runs == 1 else f"runs{args.runs}", epsilon, seed, quick=args.quick,
                       canaries=args.canaries, steps=args.steps, runs=args.runs)
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
    if "models" not in args.skip:
        from lightning_dpts.app.audit_models import fit_model
        from lightning_dpts.recipe import MAX_GRAD_NORM, MAX_GRAD_NORMS

        for name in args.models:
            factory = fit_model(name, season_length=12) if name != "dlinear" else fit_model(name)
            # dpts fit's clipping norm: the recipe's (0.1; combination 0.001), the legacy 1.0 for GluonTS ones
            extra: dict = {"max_grad_norm": MAX_GRAD_NORMS.get(name, MAX_GRAD_NORM)}
            per_run = args.model_canaries
            if name == "dlinear":  # a padded past has the fixed scale 1 (surgery), so every canary window is the
                # same: one canary per run (no interference), excluded world 0, included 3 (Student-t's loss turns
                # most there: the clipped difference measured 0.98-0.99 of 2C at every step)
                extra = {"max_grad_norm": 1.0, "magnitude": 3.0, "canary_level": 1.5}
                per_run = 1
            runs = args.model_runs * args.model_canaries // per_run
            record(f"model_{name}", 8.0, 0, canaries=per_run, steps=5, runs=runs, context_length=13,
                   module=factory, canary_shape="spike", **extra)
            extra.pop("canary_level", None)
            record(f"model_{name}_subsampled", 8.0, 0, canaries=256, steps=20, context_length=13, module=factory,
                   canary_shape="spike", chunk_length=None, batch_size=37, **extra)
            ideal = _ideal(8.0, 1e-5, args.model_canaries * args.model_runs, 0)
            rows.append({"kind": f"model_{name}_ideal", "epsilon": 8.0, "seed": 0, **ideal})
            print(json.dumps(rows[-1]), flush=True)
    if "ci" not in args.skip:
        for seed in range(args.ci_seeds):
            record("ci_correct", 8.0, 1000 + seed, **CI_CHECK)
        for seed in range(args.ci_power_seeds):
            record("ci_half_noise", 8.0, 2000 + seed, _noise_scale=0.5, **CI_CHECK)
        _ci_summary(rows)
    print(f"load average: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()

"""BandMF Monte Carlo accounting: samples per second (ours vs jax_privacy's numpy implementation) and agreement.

Usage::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bandmf.py [--samples 20000] [--repeats 5] [--json out.json]

For each configuration (iterations n, bands b, sampling prob p, sigma; default coefficients: banded square root,
unit column norm) it times privacy-loss sampling in the "remove" direction (y ~ P, ln P/Q) for
:class:`lightning_dpts.privacy.montecarlo.BandMFMechanism` and, when ``jax_privacy`` (>= 2.0) is importable,
``jax_privacy.experimental.monte_carlo.sample_generation.get_privacy_loss_sample`` with
``BMinSepSampling(warm_start=True)``, and reports both samples/s and both delta estimates at a few epsilons with
their standard errors. Timing: CPU time of this process (``time.process_time``; on a shared machine wall time
also measures the other tenants), both single-threaded (OMP_NUM_THREADS=1), ``--repeats`` runs of each interleaved,
median rates and median of the back-to-back ratios. Each run's CPU time is also split into user and system time
(``resource.getrusage``): jax_privacy's sampler allocates n x m arrays per call, and on the shared machine the kernel
time of their first-touch page faults varied from 0.05 to 0.95 s per 16,000-sample call at n = 500, so the report
gives the ratio of user times (``speedup_user``) next to the ratio of process times (``speedup``). It also times
:func:`~lightning_dpts.training.correlated_noise.optimize_coefficients`.
``--mse`` instead compares the prefix-sum MSE of DP-SGD and BandMF (b = 4, 16) at equal (epsilon, delta) with sigma
from Algorithm 5 (minutes per row). The private-CRPS comparison needs the training integration and is not run here.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import time

import numpy as np

from lightning_dpts.privacy.montecarlo import BandMFMechanism, hockey_stick_estimate
from lightning_dpts.training.correlated_noise import banded_sqrt_coefficients, optimize_coefficients

CONFIGS = [(500, 4, 0.02, 1.0), (1000, 16, 0.01, 1.5), (2000, 8, 0.005, 0.9)]
EPSILONS = (1.0, 2.0, 4.0)


def _se(losses: np.ndarray, eps: float) -> float:
    return float((-np.expm1(np.minimum(eps - losses, 0.0))).std() / math.sqrt(losses.size))


def mse_at_equal_privacy(iterations: int = 500, rate: float = 0.02, delta: float = 1e-3,
                         epsilons: tuple[float, ...] = (2.0, 8.0), seed: int = 0) -> list[dict]:
    """Section 7.1's comparison: sigma calibrated by Algorithm 5 for (epsilon, delta), then the prefix-sum MSE
    sigma^2 * prefix_sum_error(C), for DP-SGD (b = 1) and BandMF (b = 4, 16, optimised C) at the same expected batch
    fraction ``rate`` (p = rate / (1 - rate (b - 1)))."""
    from lightning_dpts.data.bminsep import sampling_prob_for_rate
    from lightning_dpts.privacy.montecarlo import calibrate_noise_multiplier_monte_carlo
    from lightning_dpts.training.correlated_noise import prefix_sum_error

    rows = []
    for eps in epsilons:
        for b in (1, 4, 16):
            c = np.array([1.0]) if b == 1 else optimize_coefficients(b, iterations).coefficients
            mech = BandMFMechanism(iterations, tuple(c), sampling_prob_for_rate(rate, b), 1.0)
            t = time.perf_counter()
            res = calibrate_noise_multiplier_monte_carlo(mech, eps, delta, seed=seed)
            row = {"epsilon": eps, "delta": delta, "bands": b, "iterations": iterations, "rate": rate,
                   "sigma": res.noise_multiplier, "verified": res.verified, "samples": res.samples,
                   "mse": res.noise_multiplier**2 * prefix_sum_error(c, iterations),
                   "calibration_seconds": time.perf_counter() - t}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing repeats (median reported)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--mse", action="store_true",
                        help="instead: prefix-sum MSE at equal (epsilon, delta) for b in {1, 4, 16} (Algorithm 5)")
    args = parser.parse_args()
    if args.mse:
        rows = mse_at_equal_privacy()
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(rows, handle, indent=1)
        return
    try:
        from jax_privacy import batch_selection
        from jax_privacy.experimental.monte_carlo import sample_generation
    except ImportError:
        batch_selection = sample_generation = None
        print("jax_privacy not installed: timing ours only (pip install jax-privacy to compare)")
    rows = []
    for n, b, p, sigma in CONFIGS:
        c = banded_sqrt_coefficients(b)
        mech = BandMFMechanism(n, tuple(c), p, sigma)
        strategy = None
        if sample_generation is not None:
            strategy = batch_selection.BMinSepSampling(sampling_prob=p, iterations=n, min_sep=b, warm_start=True)
        ours_rates, their_rates, ours, theirs = [], [], [], []
        ours_user, their_user, ours_sys, their_sys = [], [], [], []
        for rep in range(args.repeats):  # interleaved: the shared machine's load hits both alike
            t, usage = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
            ours.append(mech.privacy_loss_samples(np.random.Generator(np.random.SFC64(1 + rep)), args.samples,
                                                  "remove"))
            ours_rates.append(args.samples / (time.process_time() - t))
            after = resource.getrusage(resource.RUSAGE_SELF)
            ours_user.append(after.ru_utime - usage.ru_utime)
            ours_sys.append(after.ru_stime - usage.ru_stime)
            if strategy is not None:
                t, usage = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
                sample, _ = sample_generation.get_privacy_loss_sample(strategy, sigma, c, seed=100 + rep,
                                                                      positive_sample=True, num_samples=args.samples)
                their_rates.append(args.samples / (time.process_time() - t))
                after = resource.getrusage(resource.RUSAGE_SELF)
                their_user.append(after.ru_utime - usage.ru_utime)
                their_sys.append(after.ru_stime - usage.ru_stime)
                theirs.append(np.asarray(sample))
        ours = np.concatenate(ours)
        row = {"iterations": n, "bands": b, "sampling_prob": p, "sigma": sigma, "samples": args.samples,
               "repeats": args.repeats, "ours_samples_per_s": float(np.median(ours_rates)),
               "ours_user_s": float(np.median(ours_user)), "ours_system_s": float(np.median(ours_sys)),
               "ours_delta": {str(e): [hockey_stick_estimate(ours, e), _se(ours, e)] for e in EPSILONS}}
        if strategy is not None:
            theirs = np.concatenate(theirs)
            row["jax_privacy_samples_per_s"] = float(np.median(their_rates))
            # median over repeats of the ratio of back-to-back runs (robust to load changes between repeats)
            row["speedup"] = float(np.median(np.array(ours_rates) / np.array(their_rates)))
            row["speedups"] = [round(v, 2) for v in np.array(ours_rates) / np.array(their_rates)]
            row["jax_privacy_user_s"] = float(np.median(their_user))
            row["jax_privacy_system_s"] = float(np.median(their_sys))
            # the same ratio on user time only (without the kernel time of page faults, which varies with the host)
            row["speedup_user"] = float(np.median(np.array(their_user) / np.array(ours_user)))
            row["speedups_user"] = [round(v, 2) for v in np.array(their_user) / np.array(ours_user)]
            row["jax_privacy_delta"] = {str(e): [hockey_stick_estimate(theirs, e), _se(theirs, e)]
                                        for e in EPSILONS}
        rows.append(row)
        print(json.dumps(row), flush=True)
    for b, n in ((4, 1000), (16, 1000), (64, 10_000)):
        res = optimize_coefficients(b, n)
        rows.append({"optimise_bands": b, "iterations": n, "seconds": res.seconds, "lbfgs_iterations": res.iterations,
                     "error": res.error, "initial_error": res.initial_error, "dpsgd_error": (n + 1) / 2})
        print(json.dumps(rows[-1]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()

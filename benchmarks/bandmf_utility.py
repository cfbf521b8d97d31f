"""Utility that BandMF buys: private CRPS at equal (epsilon, delta) for DP-SGD vs BandMF (b-min-sep, b in {4, 16}).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bandmf_utility.py [--datasets us_employment,m4_weekly] [--epsilons 4,8]
        [--delta 1e-2] [--seeds 3] [--steps-factor 1] [--bands 1,4,16] [--grid-size 12] [--pilot-samples 20000]
        [--json results.jsonl] [--m4 /work/shared/data/m4_weekly.csv.gz]
    python benchmarks/bandmf_utility.py --table results.jsonl      # the markdown tables of a (partial) run

Results and commentary: docs/bandmf.md, "Utility: private CRPS at equal (epsilon, delta)".

**What runs.** Every training is one call of :func:`lightning_dpts.app.jobs.fit.run_fit`, i.e. ``dpts fit --bands B
--noise-multiplier SIGMA`` as it ships: the recipe's model (``seasonal_linear``), past window, clipping norm,
learning rate, short-series threshold and rolling test windows (docs/recipe.md), chosen from public metadata. Two
things are fixed here for all methods alike, because b-min-sep needs them: the batch (N' series per step, with
N'/N <= 1/16 so that b = 16 is allowed: 8 of 145 series on us_employment, 16 of 293 on M4 weekly; the recipe's
own batch is the whole dataset, which no b > 1 admits) and the number of steps (the recipe's steps for that
batch, times ``--steps-factor``). DP-SGD is the b = 1 member of the family (``--bands 1``: Gaussian noise, C = (1),
Poisson sampling of series at rate N'/N); BandMF b = 4 and 16 use ``optimize_coefficients(b, steps)`` (what
``dpts fit --bands`` uses) and b-min-sep sampling with the same expected batch N'.

**Equal privacy, one unit, one kind of number.** BandMF's guarantee is series-level add/remove (docs/bandmf.md,
"Which guarantee BandMF gives"), so every method is accounted in that unit by the same accountant: the Monte Carlo
accountant of Dong & Ganesh (2026), Theorem 5.1, with the EVR-verified upper bound (Theorem A.1), converted to the
package's substitution relation by group privacy (add/remove (eps/2, delta/(1 + e^{eps/2})) gives substitution
(eps, delta)). Sigma of every method is calibrated by Algorithm 5 (``calibrate_noise_multiplier_monte_carlo``) at that
add/remove target, and every ``run_fit`` re-verifies the planned run twice with fresh samples (before anything is
written and before the first step; ``monte_carlo_samples`` = 2x the calibration's, so a sigma at the edge of the
grid still verifies). For DP-SGD the exact PLD sigma (dp_accounting, Poisson-subsampled Gaussian, add/remove, same
target) is printed next to it: the sigma an exact accountant would give DP-SGD (verification costs DP-SGD a few
per cent of sigma, which favours BandMF in this comparison). delta = 1e-2 (substitution) by default: full EVR
verification needs ~1/delta samples per candidate and direction (485,040 at epsilon 8), which is what 2 shared CPU
cores allow; it is an experiment's delta, not a recommendation.

Also reported (from ``run_fit``'s own report): the same model trained without DP for the same steps (trained in the
DP-SGD run of every seed), seasonal naive (deterministic), MAE, steps, sigma and the prefix-sum MSE
sigma^2 ||c||^2 ||A C^{-1}||_F^2 / n that BandMF lowers (Section 2.3).

**Seeded experiments.** Every run is seeded (``seed`` = 0, 1, ...: sampling, DP noise, initialisation, forecast
samples, Monte Carlo samples) so that the table is reproducible; a seeded run's guarantee does not hold against
anyone who knows the seed (SEEDED_NOTICE). Outputs go to a temporary directory that is deleted; the JSON lines
hold numbers only (no seed-derived state).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from utility import DATASETS as UTILITY_DATASETS  # benchmarks/ is the script's directory, first on sys.path
from utility import fmt

#: benchmarks/utility.py's datasets (file, columns, frequency, horizon) plus N' (series per step): b-min-sep with
#: b = 16 needs N'/N <= 1/16, which the recipe's batch at delta = 1e-2 (the whole dataset) does not allow
DATASETS: dict[str, dict[str, Any]] = {
    "us_employment": {**UTILITY_DATASETS["us_employment"], "batch_size": 8},  # 8/145 = 0.055 <= 1/16
    "m4_weekly": {**UTILITY_DATASETS["m4_weekly"], "batch_size": 16},  # 16/293
}
LABELS = {1: "DP-SGD (b=1)", 4: "BandMF b=4", 16: "BandMF b=16"}


def label(b: int) -> str:
    return LABELS.get(b, f"BandMF b={b}")


def plan(base: dict[str, Any], epsilon: float, delta: float, factor: int, max_bands: int) -> dict[str, Any]:
    """The run ``run_fit`` will do for ``base`` at (epsilon, delta): epochs, steps, N, N'/N (public metadata only)."""
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.forecasters import make_estimator as _estimator
    from lightning_dpts.app.geometry import fit_test_windows, resolve_with_test_windows
    from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset
    from lightning_dpts.data.loading import drop_short_series, load_long_table
    from lightning_dpts.privacy import NeighbouringRelation

    given = FitConfig.from_mapping({**base, "epsilon": epsilon, "delta": delta})
    if given.data is None:
        table, freq = load_dataset("us_employment"), given.freq or "M"
    else:
        table, freq = load_long_table(given.data, given.id_column, given.timestamp_column, given.value_column,
                                      given.freq)
    lengths = table.groupby("item_id", sort=False).size().to_numpy()
    config, _, _, planned = resolve_with_test_windows(given, lengths, freq)
    kept, _ = drop_short_series(table, config.min_series_length)
    module = _estimator(config, freq).create_lightning_module()
    windows = fit_test_windows(config, planned, kept, freq, module)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm = StructuredSubsamplingDataModule(
            kept, batch_size=config.batch_size, instances_per_series=config.instances_per_series,
            top_level="b_min_sep", bands=max_bands, bottom_level=config.bottom_level,
            relation=NeighbouringRelation(level=config.level, size=config.size), model=module, freq=freq,
            id_column="item_id", timestamp_column="timestamp", value_column="target",
            drop_short_series=config.drop_short_series, test_windows=windows)
    spec = dm.sampling_spec
    epochs = int(config.epochs) * factor
    return {"epochs": epochs, "recipe_epochs": int(config.epochs), "steps": epochs * spec.steps_per_epoch,
            "num_series": spec.num_series, "batch": config.batch_size, "rate": spec.top_level_rate,
            "instances_per_series": spec.instances_per_series, "model": config.model, "test_windows": windows,
            "context_length": spec.context_length}


def coefficients_for(b: int, steps: int) -> tuple[float, ...]:
    """C's first column as ``dpts fit --bands b`` builds it (``_bandmf_callbacks``)."""
    from lightning_dpts.training.correlated_noise import optimize_coefficients

    if b == 1:
        return (1.0,)
    return tuple(float(v) for v in optimize_coefficients(b, steps).coefficients)


def pld_sigma(rate: float, steps: int, epsilon: float, delta: float) -> float:
    """Exact (PLD) add/remove sigma of Poisson-subsampled Gaussian DP-SGD, sensitivity 1 (dp_accounting's
    ``calibrate_dp_mechanism``, to 0.1% of sigma)."""
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    return float(dp_accounting.calibrate_dp_mechanism(
        lambda: pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4),
        lambda sigma: dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps),
        epsilon, delta, dp_accounting.LowerEndpointAndGuess(0.1, 1.0), tol=1e-3))


def calibrate(p: dict[str, Any], b: int, epsilon: float, delta: float, grid: int, pilot: int) -> dict[str, Any]:
    """Algorithm 5 at the series-level add/remove target that gives substitution (epsilon, delta)."""
    from lightning_dpts.data.bminsep import sampling_prob_for_rate
    from lightning_dpts.privacy.montecarlo import BandMFMechanism, calibrate_noise_multiplier_monte_carlo
    from lightning_dpts.training.correlated_noise import prefix_sum_error

    eps_ar, delta_ar = epsilon / 2, delta / (1 + math.exp(epsilon / 2))
    c = coefficients_for(b, p["steps"])
    mech = BandMFMechanism(p["steps"], c, sampling_prob_for_rate(p["rate"], b), 1.0,
                           sensitivity=float(p["instances_per_series"]))
    t0 = time.perf_counter()
    cal = calibrate_noise_multiplier_monte_carlo(mech, eps_ar, delta_ar, seed=1234 + b, grid_size=grid,
                                                pilot_samples=pilot)
    out = {"sigma": cal.noise_multiplier, "verified": cal.verified, "samples": cal.samples,
           "threshold": cal.threshold, "candidates": len(cal.candidates), "seconds": time.perf_counter() - t0,
           "mse": cal.noise_multiplier**2 * prefix_sum_error(c, p["steps"]) * p["instances_per_series"]**2}
    if b == 1:
        out["sigma_pld"] = pld_sigma(p["rate"], p["steps"], eps_ar, delta_ar)
    return out


def share_verification() -> None:
    """Let every ``AccountantCallback.build_monte_carlo`` of the same mechanism and sample count return one accountant.

    ``run_fit`` checks a planned BandMF run twice (before writing, and before the first step), each time with fresh
    Monte Carlo samples; over seeds the mechanism is the same. With this, the first check of a mechanism draws its
    samples (fresh OS entropy) and every later check of the same mechanism reads the same EVR verification, so a
    (dataset, epsilon, b) cell is verified once instead of twice per seed. Benchmark-only (a process-wide patch).
    """
    from lightning_dpts.training import AccountantCallback

    original = AccountantCallback.build_monte_carlo
    cache: dict[tuple[Any, int], Any] = {}

    def build(self: Any, spec: Any, strategy: Any, sigma: float, planned_steps: int) -> Any:
        accountant = original(self, spec, strategy, sigma, planned_steps)
        return cache.setdefault((accountant.mechanism, accountant.samples), accountant)

    AccountantCallback.build_monte_carlo = build  # type: ignore[method-assign]


def run_one(base: dict[str, Any], p: dict[str, Any], epsilon: float, delta: float, b: int, sigma: float,
            samples: int, seed: int, non_dp: bool, workdir: Path) -> dict[str, Any]:
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.jobs.fit import run_fit

    values = {**base, "epsilon": epsilon, "delta": delta, "epochs": p["epochs"], "bands": b,
              "noise_multiplier": sigma, "monte_carlo_samples": samples, "seed": seed, "non_dp": non_dp,
              "private_plots": False, "output_dir": str(workdir / f"b{b}-e{epsilon:g}-s{seed}")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_fit(FitConfig.from_mapping(values), progress=lambda _message: None)
    if report["steps"] != p["steps"]:
        raise RuntimeError(f"run_fit took {report['steps']} steps, planned {p['steps']}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--epsilons", default="4,8", help="series-level substitution epsilons")
    parser.add_argument("--delta", type=float, default=1e-2, help="series-level substitution delta")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..n-1")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--steps-factor", type=int, default=1, help="steps = the recipe's steps x this")
    parser.add_argument("--bands", default="1,4,16", help="methods: 1 = DP-SGD, b > 1 = BandMF b")
    parser.add_argument("--grid-size", type=int, default=12, help="Algorithm 5 candidates")
    parser.add_argument("--pilot-samples", type=int, default=20_000, help="Algorithm 5 pilot samples per direction")
    parser.add_argument("--m4", default=DATASETS["m4_weekly"]["data"])
    parser.add_argument("--json", metavar="PATH", help="append one JSON line per calibration and per run")
    parser.add_argument("--table", metavar="PATH", help="only print the tables of the JSON lines in PATH")
    parser.add_argument("--calibrations", metavar="PATH",
                        help="reuse the calibration records of these JSON lines (same dataset, epsilon, delta, steps, "
                             "b) instead of running Algorithm 5 again")
    parser.add_argument("--share-verification", action="store_true",
                        help="verify each planned mechanism once (2x the calibration's samples, fresh) and let every "
                             "seed's run_fit and both of its checks read that one verification (cheaper at large "
                             "epsilon; the default re-verifies twice per run)")
    args = parser.parse_args()
    if args.table:
        print_tables([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()])
        return
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    import torch

    from lightning_dpts.randomness import SEEDED_NOTICE

    torch.set_num_threads(1)
    if args.share_verification:
        share_verification()
    known: dict[tuple[Any, ...], dict[str, Any]] = {}
    if args.calibrations:
        for line in Path(args.calibrations).read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("kind") == "calibration":
                known[(r["dataset"], r["epsilon"], r["delta"], r["steps"], r["bands"])] = r
    bands = [int(b) for b in args.bands.split(",")]
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    print(f"SEEDED EXPERIMENT (seeds {seeds}): {SEEDED_NOTICE}", flush=True)
    records: list[dict[str, Any]] = []

    def emit(record: dict[str, Any]) -> None:
        records.append(record)
        if args.json:
            with open(args.json, "a") as fh:
                fh.write(json.dumps(record, default=float) + "\n")

    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dpts-bandmf-utility-") as tmp:
        for name in args.datasets.split(","):
            base = dict(DATASETS[name])
            if name == "m4_weekly":
                base["data"] = args.m4
            for epsilon in [float(e) for e in args.epsilons.split(",")]:
                p = plan(base, epsilon, args.delta, args.steps_factor, max(bands))
                key = {"dataset": name, "epsilon": epsilon, "delta": args.delta, "steps": p["steps"],
                       "batch": p["batch"], "num_series": p["num_series"]}
                print(f"\n{name} eps={epsilon:g} delta={args.delta:g}: {p['model']}, {p['num_series']} series, "
                      f"N'={p['batch']} (N'/N={p['rate']:.4f}), {p['steps']} steps ({p['epochs']} epochs = "
                      f"{args.steps_factor} x the recipe's), past window {p['context_length']}, "
                      f"{p['test_windows']} test windows", flush=True)
                cals = {}
                for b in bands:
                    reuse = known.get((name, epsilon, args.delta, p["steps"], b))
                    if reuse is not None:
                        cals[b] = {k: v for k, v in reuse.items() if k not in key and k not in ("kind", "bands")}
                        print(f"  {label(b)}: calibration reused from {args.calibrations}")
                    else:
                        cals[b] = calibrate(p, b, epsilon, args.delta, args.grid_size, args.pilot_samples)
                    emit({"kind": "calibration", **key, "bands": b, **cals[b]})
                    extra = f", PLD sigma {cals[b]['sigma_pld']:.3f}" if b == 1 else ""
                    how = "verified" if cals[b]["verified"] else "analytic"
                    print(f"  {label(b)}: sigma {cals[b]['sigma']:.3f} ({how}, {cals[b]['samples']} samples/dir, "
                          f"{cals[b]['seconds']:.0f} s), prefix-sum "
                          f"MSE {cals[b]['mse']:.1f}{extra}", flush=True)
                for seed in seeds:
                    for i, b in enumerate(bands):
                        t0 = time.perf_counter()
                        report = run_one(base, p, epsilon, args.delta, b, cals[b]["sigma"],
                                         2 * cals[b]["samples"], seed, i == 0, Path(tmp))
                        m = report["private"]["metrics"]
                        rec = {"kind": "run", **key, "bands": b, "seed": seed, "sigma": cals[b]["sigma"],
                               "epsilon_verified": report["epsilon"], "crps": m["dp"]["crps"],
                               "mae": m["dp"]["mae"], "naive_crps": m["seasonal_naive"]["crps"],
                               "naive_mae": m["seasonal_naive"]["mae"], "model": report["model"],
                               "test_windows": report["private"]["evaluation"]["test_windows"],
                               "seconds": time.perf_counter() - t0}
                        if "non_dp" in m:
                            rec["non_dp_crps"], rec["non_dp_mae"] = m["non_dp"]["crps"], m["non_dp"]["mae"]
                        emit(rec)
                        print(f"  seed {seed} {label(b):14s} CRPS {rec['crps']:.4f} MAE {rec['mae']:.1f} "
                              f"(naive {rec['naive_crps']:.4f}"
                              + (f", non-DP {rec['non_dp_crps']:.4f}" if "non_dp_crps" in rec else "")
                              + f"), verified eps <= {rec['epsilon_verified']:.3f}, {rec['seconds']:.0f} s",
                              flush=True)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    print_tables(records)


def print_tables(records: list[dict[str, Any]]) -> None:
    """One markdown row per (dataset, epsilon, steps): CRPS mean ± sd over seeds per method, references, sigma."""
    cals = {(r["dataset"], r["epsilon"], r["steps"], r["bands"]): r for r in records if r["kind"] == "calibration"}
    runs = [r for r in records if r["kind"] == "run"]
    groups = sorted({(r["dataset"], r["epsilon"], r["steps"]) for r in runs})
    bands = sorted({r["bands"] for r in runs})
    print("\nCRPS (mean wQuantileLoss over the rolling test windows x kept series; mean ± sd over seeds; n = seeds)")
    print("| data | ε | δ | steps | N'/N | " + " | ".join(label(b) for b in bands)
          + " | no DP (same steps) | seasonal naive |")
    print("|---|---|---|---|---|" + "---|" * (len(bands) + 2))
    for g in groups:
        rows = [r for r in runs if (r["dataset"], r["epsilon"], r["steps"]) == g]
        cells = []
        for b in bands:
            vals = [r["crps"] for r in rows if r["bands"] == b]
            cells.append(f"{fmt(vals)} (n={len(vals)})" if vals else "-")
        plain = [r["non_dp_crps"] for r in rows if "non_dp_crps" in r]
        first = rows[0]
        print(f"| {g[0]} | {g[1]:g} | {first['delta']:g} | {g[2]} | {first['batch']}/{first['num_series']} | "
              + " | ".join(cells) + f" | {fmt(plain)} | {first['naive_crps']:.4f} |")
    print("\nsigma (Algorithm 5, EVR-verified), prefix-sum MSE sigma^2||c||^2||AC^-1||_F^2/n, largest verified "
          "substitution epsilon over the runs")
    print("| data | ε | steps | " + " | ".join(label(b) for b in bands) + " | DP-SGD σ by PLD (exact) |")
    print("|---|---|---|" + "---|" * (len(bands) + 1))
    for g in groups:
        cells = []
        for b in bands:
            c = cals.get((*g, b))
            spent = [r["epsilon_verified"] for r in runs if (r["dataset"], r["epsilon"], r["steps"]) == g
                     and r["bands"] == b]
            cells.append("-" if c is None else f"σ {c['sigma']:.3f}, MSE {c['mse']:.0f}"
                         + (f", ε ≤ {max(spent):.2f}" if spent else ""))
        c1 = cals.get((*g, 1))
        pld_cell = f"{c1['sigma_pld']:.3f}" if c1 and "sigma_pld" in c1 else "-"
        print(f"| {g[0]} | {g[1]:g} | {g[2]} | " + " | ".join(cells) + f" | {pld_cell} |")


if __name__ == "__main__":
    main()

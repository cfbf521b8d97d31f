"""Private hyperparameter selection against the fixed recipe at the same total epsilon (issue 40).

Usage::

    nice -n 10 python benchmarks/tuning.py [--datasets us_employment,m4_weekly] [--epsilons 1,4] [--seeds 0,1,2,3,4]
        [--mean-runs 8] [--eta 0] [--out runs/tuning.jsonl]

For every dataset x epsilon x seed (delta = 1e-7; every series ends with a test window of H steps, never read, and a
validation window of H steps before it; the recipe's short-series rule):

* **fixed**: the recipe's setting (combination model), sigma calibrated by the PLD accountant to (epsilon, delta)
  over its planned steps, as ``dpts fit`` does;
* **tuned**: :func:`lightning_dpts.tuning.tune` over the 8 default candidates (the recipe and its neighbours),
  random stopping with E[K] = ``--mean-runs`` and the truncated negative binomial's ``--eta`` (docs/tuning.md), the
  whole search calibrated to the same (epsilon, delta).

Both are scored on the test windows in CRPS (pooled mean weighted quantile loss, as ``dpts fit`` reports it), next
to seasonal naive. It also prints the search's total epsilon against one run of the recipe's setting at the noise the
search uses (PLD accountant, the package's guarantee for a single run): the price of the search. Seeded runs are
experiments (the guarantee does not hold against anyone who knows the seed); a seed fixes the number of runs, the
same for every dataset and epsilon of that seed. ``--summarize FILE...`` prints the table of earlier runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

M4 = "/work/shared/data/m4_weekly.csv.gz"
DATASETS: dict[str, dict[str, Any]] = {
    "us_employment": {"data": "us_employment", "freq": None, "horizon": 12},
    "m4_weekly": {"data": M4, "freq": "W", "horizon": 13, "columns": ("id", "timestamp", "value")},
}
DELTA = 1e-7


def load(name: str) -> tuple[list[np.ndarray], str]:
    from lightning_dpts.data.sources import to_collection

    spec = DATASETS[name]
    data: Any = spec["data"]
    kwargs: dict[str, Any] = {}
    if "columns" in spec:
        import pandas as pd

        data = pd.read_csv(data)
        kwargs = dict(zip(("id_column", "timestamp_column", "value_column"), spec["columns"], strict=True))
    collection = to_collection(data, freq=spec["freq"], **kwargs)
    return [t[:, 0].astype(np.float32) for t in collection.targets], collection.freq


def test_crps(module: Any, dm: Any, context: int, season: int) -> float:
    from lightning_dpts.evaluation import score_windows
    from lightning_dpts.tuning import quantiles

    held = dm.evaluation_windows("test")
    hist = [np.asarray(w.history, dtype=float) for w in held]
    q = quantiles(module, hist, context)
    return float(score_windows(q, [np.asarray(w.target, dtype=float) for w in held], hist,
                               [w.window for w in held], season)["crps"])


def naive_crps(dm: Any, season: int) -> float:
    """Seasonal naive with Gaussian intervals (the package's baseline) on the test windows, in CRPS."""
    from lightning_dpts.baselines import seasonal_naive_quantiles
    from lightning_dpts.evaluation import score_windows

    held = dm.evaluation_windows("test")
    hist = [np.asarray(w.history, dtype=float) for w in held]
    out = [seasonal_naive_quantiles(y, len(w.target), season) for y, w in zip(hist, held, strict=True)]
    return float(score_windows(out, [np.asarray(w.target, dtype=float) for w in held], hist,
                               [w.window for w in held], season)["crps"])


def run(name: str, epsilon: float, seed: int, mean_runs: float, eta: float) -> dict[str, Any]:
    import lightning as L

    from lightning_dpts.data.seasonality import season_lengths
    from lightning_dpts.privacy import StructuredSubsamplingAccountant
    from lightning_dpts.recipe import averaging_callbacks, choose_recipe
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy
    from lightning_dpts.tuning import _datamodule, build_module, default_candidates, tune

    series, freq = load(name)
    h = DATASETS[name]["horizon"]
    season = season_lengths(freq)[0]
    recipe = choose_recipe([len(s) for s in series], freq=freq, prediction_length=h, epsilon=epsilon, delta=DELTA,
                           held_out_windows=2)
    kept = [s for s in series if len(s) >= (recipe.min_series_length or 1)]
    candidates = default_candidates([len(s) for s in kept], freq=freq, prediction_length=h, epsilon=epsilon,
                                    delta=DELTA)
    row: dict[str, Any] = {"dataset": name, "epsilon": epsilon, "seed": seed, "series": len(kept), "eta": eta}
    # fixed recipe
    t0 = time.time()
    base = candidates[0]
    torch.manual_seed(seed)
    dm = _datamodule(kept, base, freq, h, seed)
    module = build_module(base, freq, h)
    strategy = DPForecastStrategy(max_grad_norm=base.max_grad_norm, target_epsilon=epsilon, target_delta=DELTA,
                                  epochs=base.epochs, seed=seed)
    trainer = L.Trainer(max_epochs=base.epochs, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                        num_sanity_val_steps=0, limit_val_batches=0,
                        callbacks=[strategy, AccountantCallback(epsilon=epsilon, delta=DELTA),
                                   *averaging_callbacks(None)])
    trainer.fit(module, datamodule=dm)
    row["fixed_sigma"] = float(strategy.noise_multiplier)
    row["fixed_crps"] = test_crps(module, dm, base.context_length, season)
    row["naive_crps"] = naive_crps(dm, season)
    row["fixed_seconds"] = round(time.time() - t0, 1)
    # tuned
    t0 = time.time()
    torch.manual_seed(seed)
    result = tune(kept, freq=freq, prediction_length=h, epsilon=epsilon, delta=DELTA, candidates=candidates,
                  mean_runs=mean_runs, eta=eta, seed=seed, print_fn=None)
    c = result.candidate
    row["tuned_crps"] = test_crps(result.module, _datamodule(kept, c, freq, h, seed), c.context_length, season)
    row["tuned_index"] = result.index
    row["runs"] = result.private["runs"]
    row["tuned_seconds"] = round(time.time() - t0, 1)
    report = result.report
    row["total_epsilon"] = report["epsilon"]
    sigma0 = report["candidates"][0]["noise_multiplier"]
    spec = dm.sampling_spec
    single = StructuredSubsamplingAccountant(spec, sigma0).epsilon(report["candidates"][0]["steps"], DELTA)
    row["single_run_epsilon_pld"] = single
    row["single_run_epsilon_rdp"] = report["single_run_epsilon"]
    row["ratio_total_to_single"] = report["epsilon"] / single
    row["tuned_sigma0"] = sigma0
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--epsilons", default="1,4")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    from lightning_dpts.privacy.selection import TruncatedNegativeBinomial
    from lightning_dpts.tuning import ETA, MEAN_RUNS

    parser.add_argument("--mean-runs", type=float, default=MEAN_RUNS)
    parser.add_argument("--eta", type=float, default=ETA, help="eta of the number of runs' law (> -1; default: "
                        "dpts tune's)")
    parser.add_argument("--out", default="runs/tuning.jsonl")
    parser.add_argument("--summarize", nargs="+", metavar="JSONL", help="only print the table of earlier runs' files")
    args = parser.parse_args()
    TruncatedNegativeBinomial.with_mean(args.mean_runs, args.eta)  # a bad --mean-runs / --eta: refused before work
    if args.summarize:
        summary([json.loads(line) for path in args.summarize for line in Path(path).read_text().splitlines() if line])
        return
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for name in args.datasets.split(","):
            for epsilon in [float(e) for e in args.epsilons.split(",")]:
                row = run(name, epsilon, seed, args.mean_runs, args.eta)
                rows.append(row)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{name} eps={epsilon:g} seed={seed} N={row['series']} | CRPS fixed {row['fixed_crps']:.5f} "
                      f"tuned {row['tuned_crps']:.5f} (cand {row['tuned_index']}, {row['runs']} runs) naive "
                      f"{row['naive_crps']:.5f} | total eps {row['total_epsilon']:.3f} vs one run "
                      f"{row['single_run_epsilon_pld']:.3f} (x{row['ratio_total_to_single']:.2f}) | "
                      f"{row['fixed_seconds']}s + {row['tuned_seconds']}s", flush=True)
    summary(rows)


def summary(rows: list[dict[str, Any]]) -> None:
    """Mean over seeds; the tuned/fixed ratio with the paired standard error of the per-seed differences."""
    keys = sorted({(r["dataset"], r.get("eta", 0.0), r["epsilon"]) for r in rows})  # (rows before --eta: 0)
    print("| dataset | η | ε | seeds | CRPS fixed | CRPS tuned | tuned / fixed (± s.e.) | seasonal naive "
          "| search ε / one run |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, eta, eps in keys:
        sel = [r for r in rows if r["dataset"] == name and r.get("eta", 0.0) == eta and r["epsilon"] == eps]
        f = statistics.mean(r["fixed_crps"] for r in sel)
        t = statistics.mean(r["tuned_crps"] for r in sel)
        d = [r["tuned_crps"] - r["fixed_crps"] for r in sel]
        se = statistics.stdev(d) / len(d) ** 0.5 / f if len(d) > 1 else float("nan")
        print(f"| {name} | {eta:g} | {eps:g} | {len(sel)} | {f:.5f} | {t:.5f} | {t / f:.3f} ± {se:.3f} | "
              f"{statistics.mean(r['naive_crps'] for r in sel):.5f} | "
              f"{statistics.mean(r['ratio_total_to_single'] for r in sel):.2f} |")


if __name__ == "__main__":
    main()

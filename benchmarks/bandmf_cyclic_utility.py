"""Amplified BandMF (cyclic Poisson) vs DP-SGD at equal event-level (epsilon, delta = 1e-7), as ``dpts fit`` ships.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bandmf_cyclic_utility.py [--datasets us_employment,m4_weekly]
        [--epsilons 1,4,8] [--seeds 5] [--first-seed 0] [--bands 0,2,4,8] [--json runs.jsonl]
    python benchmarks/bandmf_cyclic_utility.py --table runs.jsonl       # the markdown table of a (partial) run

Results: docs/bandmf.md, "Measurements: amplified BandMF at delta = 1e-7".

Every training is one call of :func:`lightning_dpts.app.jobs.fit.run_fit` with the dataset's public description, the
budget and a seed, nothing else: ``--bands 0`` is ``dpts fit`` without ``--bands`` (DP-SGD, the recipe's batch and
steps, top level without replacement, Theorem 4.4 composed per step); ``--bands b`` is ``dpts fit --bands b``
(BandMF with C optimised for participation every b steps, cyclic Poisson sampling in b groups, the recipe's batch at
most N/b and its steps, the PLD accountant composing ceil(steps/b) opportunities, Theorem B.2). Sigma is calibrated
by each run's own accountant for (epsilon, 1e-7) at the 1-event level, so the guarantees are equal in unit and
number. Metric: CRPS (mean weighted quantile loss) over the 4 rolling test windows x kept series; the same model
without DP (trained in the DP-SGD run of every seed, the recipe's steps) and seasonal naive come from the same
reports. Seeded experiments (seed = 0, 1, ...): a seeded run's guarantee does not hold against whoever knows the
seed. Outputs go to a temporary directory that is deleted; the JSON lines hold numbers only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from utility import DATASETS  # benchmarks/ is the script's directory, first on sys.path


def label(b: int) -> str:
    return "DP-SGD" if b == 0 else f"BandMF b={b}"


def run_one(base: dict[str, Any], epsilon: float, b: int, seed: int, workdir: Path) -> dict[str, Any]:
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.jobs.fit import run_fit

    values = {**base, "epsilon": epsilon, "delta": 1e-7, "seed": seed, "non_dp": b == 0, "private_plots": False,
              "output_dir": str(workdir / f"b{b}-e{epsilon:g}-s{seed}")}
    if b:
        values["bands"] = b
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_fit(FitConfig.from_mapping(values), progress=lambda _message: None)
    m = report["private"]["metrics"]
    rec = {"bands": b, "seed": seed, "epsilon": epsilon, "epsilon_spent": report["epsilon"], "delta": 1e-7,
           "steps": report["steps"], "compositions": report["compositions"], "sigma": report["noise_multiplier"],
           "batch_size": report["config"]["batch_size"], "crps": m["dp"]["crps"], "mae": m["dp"]["mae"],
           "naive_crps": m["seasonal_naive"]["crps"], "seconds": time.perf_counter() - t0}
    if "non_dp" in m:
        rec["non_dp_crps"] = m["non_dp"]["crps"]
    return rec


def _cell(rows: list[dict[str, Any]]) -> str:
    vals = [r["crps"] for r in rows]
    if not vals:
        return "not run"
    sd = f" ± {statistics.stdev(vals):.4f}" if len(vals) > 1 else ""
    return f"{statistics.mean(vals):.4f}{sd} (n={len(vals)})"


def print_table(records: list[dict[str, Any]]) -> None:
    bands = sorted({r["bands"] for r in records})
    print("| data | ε | " + " | ".join(label(b) for b in bands) + " | no DP | seasonal naive |")
    print("|---|---|" + "---|" * (len(bands) + 2))
    for data in sorted({r["dataset"] for r in records}):
        for eps in sorted({r["epsilon"] for r in records if r["dataset"] == data}):
            rows = [r for r in records if r["dataset"] == data and r["epsilon"] == eps]
            cells = [_cell([r for r in rows if r["bands"] == b]) for b in bands]
            nondp = [r["non_dp_crps"] for r in rows if "non_dp_crps" in r]
            naive = rows[0]["naive_crps"]
            nd = f"{statistics.mean(nondp):.4f}" if nondp else "-"
            print(f"| {data} | {eps:g} | " + " | ".join(cells) + f" | {nd} | {naive:.4f} |")
    print()
    print("| data | ε | method | batch | steps | compositions | σ | ε spent (max) | s per fit |")
    print("|---|---|---|---|---|---|---|---|---|")
    for data in sorted({r["dataset"] for r in records}):
        for eps in sorted({r["epsilon"] for r in records if r["dataset"] == data}):
            for b in bands:
                rows = [r for r in records if r["dataset"] == data and r["epsilon"] == eps and r["bands"] == b]
                if rows:
                    r = rows[0]
                    print(f"| {data} | {eps:g} | {label(b)} | {r['batch_size']} | {r['steps']} | {r['compositions']} "
                          f"| {r['sigma']:.3f} | {max(x['epsilon_spent'] for x in rows):.4f} | "
                          f"{statistics.mean(x['seconds'] for x in rows):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--epsilons", default="1,4,8")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--bands", default="0,2,4,8", help="0 = DP-SGD (dpts fit), b = dpts fit --bands b")
    parser.add_argument("--json", metavar="PATH", help="append one JSON line per run")
    parser.add_argument("--table", metavar="PATH", help="only print the tables of the JSON lines in PATH")
    args = parser.parse_args()
    if args.table:
        print_table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()])
        return
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets.split(","):
            for eps in (float(e) for e in args.epsilons.split(",")):
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    for b in (int(v) for v in args.bands.split(",")):
                        rec = {"dataset": name, **run_one(DATASETS[name], eps, b, seed, Path(tmp))}
                        records.append(rec)
                        if args.json:
                            with open(args.json, "a") as handle:
                                handle.write(json.dumps(rec) + "\n")
                        print(f"{name} eps={eps:g} seed={seed} {label(b):12s} CRPS {rec['crps']:.4f} "
                              f"(sigma {rec['sigma']:.3f}, batch {rec['batch_size']}, {rec['steps']} steps, "
                              f"{rec['seconds']:.0f} s)", flush=True)
    print_table(records)


if __name__ == "__main__":
    main()

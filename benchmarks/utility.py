"""Utility of ``dpts fit`` as it ships: a table like the paper's Table 2 (dataset x model x epsilon).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/utility.py --python-path [--datasets ...] [--models deepar,mlp]
        [--recipes recipe,norecipe] [--wrappers wrap,plain] [--epsilons 1,4] [--seeds 5] [--seed-list 0,3]
        [--results python_path.jsonl] [--no-non-dp] [--max-steps-m4 N] [--table]
    OMP_NUM_THREADS=1 python benchmarks/utility.py [--datasets us_employment,m4_weekly] [--models dlinear]
        [--epsilons 0.5,1,2,4,8] [--seeds 3] [--quick] [--set key=value ...] [--json results.json]
        [--m4 /work/shared/data/m4_weekly.csv.gz]

Every cell is one call of :func:`lightning_dpts.jobs.fit.run_fit` with a :class:`~lightning_dpts.config.FitConfig`
that sets only what describes the dataset (file, column names, frequency, horizon), the model, epsilon and the seed;
every other setting is ``FitConfig``'s default, i.e. exactly what ``dpts fit`` runs (``--set key=value`` overrides a
field for an experiment, e.g. ``--set clip_low=0 --set clip_high=1e5 --set context_noise=1``; the table then says so).
Models default to ``dpts fit``'s default (``model`` unset: the recipe chooses; the table names the model it ran).

``--python-path`` runs the matrix of issue 27 instead: models trained in your own Trainer with the package's
callbacks, with and without the recipe (``make_private_with_epsilon``) and the ``seasonal_residual`` wrapper,
next to seasonal naive and the non-DP model (:mod:`python_path`, whose docstring lists every setting). Each cell
is appended to ``--results`` as it finishes and a rerun skips the cells already there, so the full matrix
(6 models x 2 x 2 x 2 datasets x 2 epsilons x 5 seeds) can be run in pieces; ``--table`` prints the table.

**Protocol ("hyperparameters without peeking").** Nothing here is tuned: each configuration is trained once per
seed and its rolling test windows (``FitConfig.test_windows``, the last ``test_windows * prediction_length`` steps
of every series, never sampled for training) are scored once. Any tuning of the defaults must be done elsewhere:
on other datasets, or on validation windows before the test windows whose use the guarantee accounts for or that
are declared public (``StructuredSubsamplingDataModule(val_windows=...)``); never on these test windows. Reported:
the private model's CRPS (mean weighted quantile loss, GluonTS ``mean_wQuantileLoss``, the paper's metric) and MAE
of the median, pooled over every window and series, mean ± sample standard deviation over the seeds; the same model
trained without DP for the same number of steps, in every cell as ``dpts fit`` does (``--share-non-dp`` trains
it once per seed and reuses it: exact only when the steps do not depend on epsilon, which the recipe's do; a note
is printed when they differ); seasonal naive (deterministic); the
noise multiplier; and in how many seeds the private model beat seasonal naive.

**Seeded experiments.** Every run is seeded (``seed`` = 0, 1, ...) so that the table is reproducible; a seeded run's
guarantee does not hold against anyone who knows the seed (``SEEDED_NOTICE``). Outputs go to a temporary directory
that is deleted; the seeds appear nowhere but on the command line.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from lightning_dpts.config import FitConfig
from lightning_dpts.jobs.fit import run_fit
from lightning_dpts.randomness import SEEDED_NOTICE

#: name -> FitConfig fields that describe the dataset (nothing tuned: file, columns, frequency, official horizon)
DATASETS: dict[str, dict[str, Any]] = {
    "us_employment": {"data": None, "prediction_length": 12},  # bundled, monthly
    "m4_weekly": {"data": "/work/shared/data/m4_weekly.csv.gz", "id_column": "id", "timestamp_column": "timestamp",
                  "value_column": "value", "freq": "W", "prediction_length": 13},
}
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
#: ``--models`` name for "leave ``model`` unset": ``dpts fit``'s default (the recipe picks the model and its settings).
DEFAULT_MODEL = "default"


def run_cell(base: dict[str, Any], model: str, epsilon: float, seed: int, non_dp: bool,
             overrides: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One ``run_fit`` call; returns its report (metrics, sigma, steps, seconds)."""
    values = {**base, **overrides, "epsilon": epsilon, "seed": seed, "non_dp": non_dp,
              "private_plots": False, "output_dir": str(workdir / f"{model}-{epsilon:g}-{seed}")}
    if model != DEFAULT_MODEL:
        values["model"] = model
    config = FitConfig.from_mapping(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_fit(config, progress=lambda _message: None)


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

    from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset
    from lightning_dpts.evaluation import choose_test_windows
    from lightning_dpts.forecasters import make_estimator as _estimator
    from lightning_dpts.geometry import resolve_config
    from lightning_dpts.loading import drop_short_series, load_long_table
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--models", default=DEFAULT_MODEL,
                        help="comma-separated model names; 'default' (the default) leaves the model unset, i.e. "
                             "dpts fit's default (the recipe's choice)")
    parser.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..n-1")
    parser.add_argument("--quick", action="store_true", help="epsilon 1 and 4, one seed (a smoke run)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a FitConfig field for every run (stated in the output)")
    parser.add_argument("--m4", default=DATASETS["m4_weekly"]["data"])
    parser.add_argument("--json", metavar="PATH", help="also write every run's numbers here")
    parser.add_argument("--share-non-dp", action="store_true",
                        help="train the non-DP reference once per seed (at the first epsilon) and reuse it; faster, "
                             "exact only when the number of steps does not depend on epsilon (the recipe's does: "
                             "a note is printed when they differ)")
    parser.add_argument("--accountant", action="store_true",
                        help="only print the noise multipliers (test windows, noise augmentation); no training")
    parser.add_argument("--python-path", action="store_true",
                        help="the Python-path matrix (own Trainer; models x recipe x wrapper), resumable")
    parser.add_argument("--recipes", default="recipe,norecipe", help="--python-path: recipe,norecipe")
    parser.add_argument("--wrappers", default="wrap,plain", help="--python-path: wrap,plain")
    parser.add_argument("--seed-list", default=None, help="--python-path: explicit seeds (comma-separated)")
    parser.add_argument("--results", default="python_path.jsonl", help="--python-path: JSON-lines results file")
    parser.add_argument("--no-non-dp", action="store_true", help="--python-path: skip the non-DP reference")
    parser.add_argument("--max-steps-m4", type=int, default=None,
                        help="--python-path: cap the optimizer steps on m4_weekly (sigma calibrated for them)")
    parser.add_argument("--table", action="store_true", help="--python-path: only print the table of --results")
    args = parser.parse_args()
    if args.python_path:
        import python_path

        results = Path(args.results)
        if not args.table:
            models = list(python_path.MODELS) if args.models == DEFAULT_MODEL else args.models.split(",")
            seeds = ([int(s) for s in args.seed_list.split(",")] if args.seed_list
                     else list(range(args.seeds)))
            epsilons = [1.0, 4.0] if args.quick else [float(e) for e in args.epsilons.split(",")]
            todo = python_path.cells(args.datasets.split(","), models, args.recipes.split(","),
                                     args.wrappers.split(","), epsilons, seeds)
            print(f"SEEDED EXPERIMENT: {SEEDED_NOTICE}")
            python_path.run_matrix(todo, results, args.m4, not args.no_non_dp, 1e-7,
                                   {"m4_weekly": args.max_steps_m4})
        print(python_path.table(results))
        return
    if args.accountant:
        for name in args.datasets.split(","):
            base = dict(DATASETS[name], **parse_overrides(args.set))
            if name == "m4_weekly":
                base["data"] = args.m4
            accountant_table(name, base, [1.0, 4.0] if args.quick else [float(e) for e in args.epsilons.split(",")])
        return
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    import torch

    torch.set_num_threads(1)
    epsilons = [1.0, 4.0] if args.quick else [float(e) for e in args.epsilons.split(",")]
    seeds = list(range(1 if args.quick else args.seeds))
    overrides = parse_overrides(args.set)
    models = args.models.split(",")
    print(f"SEEDED EXPERIMENT (seeds {seeds}): {SEEDED_NOTICE}")
    extra = f"; overrides {overrides}" if overrides else ""
    print(f"FitConfig defaults except the dataset's fields, model, epsilon and seed{extra}")
    started = time.perf_counter()
    rows, raw = [], []
    with tempfile.TemporaryDirectory(prefix="dpts-utility-") as tmp:
        for name in args.datasets.split(","):
            base = dict(DATASETS[name])
            if name == "m4_weekly":
                base["data"] = args.m4
            for model in models:
                plain: dict[int, dict[str, Any]] = {}
                naive: dict[str, float] | None = None
                for epsilon in epsilons:
                    cell: dict[str, list[float]] = {"crps": [], "mae": [], "sigma": [], "wins": []}
                    for seed in seeds:
                        t0 = time.perf_counter()
                        own = seed not in plain or not args.share_non_dp
                        report = run_cell(base, model, epsilon, seed, own, overrides, Path(tmp))
                        m = report["private"]["metrics"]
                        if own:
                            plain[seed] = {"steps": report["steps"], **m["non_dp"]}
                        elif plain[seed]["steps"] != report["steps"]:
                            print(f"  note: {name} {model} eps={epsilon:g} seed {seed}: {report['steps']} steps, the "
                                  f"non-DP reference was trained for {plain[seed]['steps']}")
                        naive = m["seasonal_naive"]
                        cell["crps"].append(m["dp"]["crps"])
                        cell["mae"].append(m["dp"]["mae"])
                        cell["sigma"].append(report["noise_multiplier"])
                        cell["wins"].append(float(m["dp"]["crps"] < m["seasonal_naive"]["crps"]))
                        model_run = report["model"]
                        raw.append({"dataset": name, "model": model_run, "epsilon": epsilon, "seed": seed,
                                    "epsilon_spent": report["epsilon"], "steps": report["steps"],
                                    "noise_multiplier": report["noise_multiplier"], "metrics": m,
                                    "spec": report["privacy_configuration"]["sampling_spec"],
                                    "test_windows": report["private"]["evaluation"]["test_windows"],
                                    "verdict": report["private"]["verdict"],
                                    "seconds": round(time.perf_counter() - t0, 1)})
                        print(f"  {name} {model_run} eps={epsilon:g} seed {seed}: private CRPS {m['dp']['crps']:.4f} "
                              f"MAE {m['dp']['mae']:.1f} (naive {m['seasonal_naive']['crps']:.4f} / "
                              f"{m['seasonal_naive']['mae']:.1f}, non-DP {plain[seed]['crps']:.4f} / "
                              f"{plain[seed]['mae']:.1f}), windows {report['private']['evaluation']['test_windows']}, "
                              f"sigma {report['noise_multiplier']:.3g}, {report['steps']} steps, "
                              f"{time.perf_counter() - t0:.0f} s", flush=True)
                    rows.append((name, raw[-1]["model"], epsilon, cell, [plain[s] for s in seeds], naive,
                                 raw[-1]["test_windows"]))
    print("\nCRPS = mean wQuantileLoss pooled over the rolling test windows x all series; mean ± sd over "
          f"{len(seeds)} seed(s); delta = FitConfig default "
          f"({FitConfig().delta:g}), event level. Total {time.perf_counter() - started:.0f} s.")
    print("| data | windows | model | ε | private CRPS | private MAE | non-DP CRPS | non-DP MAE | "
          "seasonal naive CRPS | naive MAE | σ | private < naive |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, model, epsilon, cell, plains, naive, windows in rows:
        print(f"| {name} | {windows} | {model} | {epsilon:g} | {fmt(cell['crps'])} | {fmt(cell['mae'], 1)} | "
              f"{fmt([p['crps'] for p in plains])} | {fmt([p['mae'] for p in plains], 1)} | {naive['crps']:.4f} | "
              f"{naive['mae']:.1f} | {fmt(cell['sigma'], 2)} | {int(sum(cell['wins']))}/{len(cell['wins'])} |")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1, default=str))


if __name__ == "__main__":
    main()

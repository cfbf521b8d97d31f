"""PETS (``dpts synth``) against its starting point and its noise-free ceiling: C-FID and TSTR per epsilon.

Usage::

    python benchmarks/synthetic.py [--datasets us_employment,m4_weekly] [--epsilons 0.5,1,2,4,8] [--seeds 3]
        [--units series,window] [--m4-path /work/shared/data/m4_weekly.csv.gz] [--output-dir bench-synth]

For every dataset, privacy unit and seed, the steps of ``dpts synth`` (:mod:`lightning_dpts.app.jobs.synth`, with its
default settings: one round, threshold one noise std, M = 128, lookahead 4) are run with the library's own pieces
on the same private windows and the same public models:

* **initial**: the initial public population S_0 (the same for every epsilon of a seed: paired comparison);
* **PETS at epsilon**: the release, sigma calibrated by ``calibrate_pets_noise`` for (epsilon, delta = 1e-5);
* **ceiling**: the same run with the vote noise switched off (``private_evolution(..., noise_free=True)``, a seam
  no ``dpts synth`` option reaches; threshold 0): what the votes could do without privacy.

Scores (computed from the private data, as ``dpts synth``'s ``private/evaluation.json``): C-FID with the
separately trained evaluation encoder against the unit's private windows, and TSTR CRPS of DLinear trained on
the windows and tested on the last ``horizon`` real steps of every series (never voted), next to seasonal naive.
Seeds are for this experiment only (the released ``dpts synth`` never takes one by default). Results go to
``--output-dir/results.json``; the table is printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np

warnings.filterwarnings("ignore")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--epsilons", default="0.5,1,2,4,8")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--units", default="series,window")
    parser.add_argument("--m4-path", default="/work/shared/data/m4_weekly.csv.gz")
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--no-tstr", action="store_true", help="C-FID only")
    parser.add_argument("--output-dir", default="bench-synth")
    args = parser.parse_args()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for dataset in args.datasets.split(","):
        rows += bench_dataset(dataset, [float(e) for e in args.epsilons.split(",")], args.seeds,
                              args.units.split(","), args, out)
        (out / "results.json").write_text(json.dumps(rows, indent=1))
    print()
    print(table(rows))


def bench_dataset(dataset: str, epsilons: list[float], seeds: int, units: list[str], args: argparse.Namespace,
                  out: Path) -> list[dict]:
    import torch

    from lightning_dpts.app.synth_pipeline import SynthConfig, load_series, tstr_scores
    from lightning_dpts.randomness import resolve_entropy
    from lightning_dpts.synthetic.evolution import private_evolution, private_windows
    from lightning_dpts.synthetic.generator import standardize_windows
    from lightning_dpts.synthetic.metrics import ContextFID
    from lightning_dpts.synthetic.models import variation_schedule
    from lightning_dpts.synthetic.pretrain import PretrainConfig, pretrain_public_models
    from lightning_dpts.synthetic.privacy import calibrate_pets_noise, sensitivity

    weekly = dataset == "m4_weekly"
    length, horizon = (39, 13) if weekly else (36, 12)
    base = SynthConfig(data=args.m4_path if weekly else None, length=length, prediction_length=horizon)
    series, _, _, freq, _ = load_series(base)
    train = [s[:len(s) - horizon] for s in series]
    started = time.perf_counter()
    defaults = SynthConfig()
    models = pretrain_public_models(length, out / dataset, progress=False, log=lambda _m: None,
                                    config=PretrainConfig(vae_epochs=defaults.pretrain_epochs[0],
                                                          encoder_epochs=defaults.pretrain_epochs[1]))
    print(f"{dataset}: public models {'reused' if models.reused else 'pretrained'} in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    rows = []
    for unit in units:
        cfg = SynthConfig(unit=unit)
        private = private_windows(train, length, unit=unit, max_windows=cfg.max_windows_per_series)
        relation = cfg.resolved_relation
        real = torch.as_tensor(private.windows, dtype=torch.float32)

        def cfid(fake: np.ndarray, real: torch.Tensor = real) -> float:
            metric = ContextFID(models.eval_encoder.hparams.output_dim, encoder=models.eval_encoder.embed)
            metric.update(real, real=True)
            metric.update(torch.as_tensor(fake, dtype=torch.float32), real=False)
            return float(metric.compute())

        def tstr(windows: np.ndarray, steps: int = cfg.tstr_steps) -> tuple[float, float]:
            if args.no_tstr:
                return float("nan"), float("nan")
            scores = tstr_scores(windows, series, freq, horizon, steps=steps)
            return scores["tstr_dlinear"]["crps"], scores["seasonal_naive"]["crps"]

        schedule = variation_schedule(cfg.iterations, cfg.variation_schedule)
        for seed in range(seeds):
            common = dict(num_samples=cfg.num_samples, num_classes=1, iterations=cfg.iterations, relation=relation,
                          lookahead=cfg.lookahead, schedule=schedule, vae=models.vae, encoder=models.select_encoder)
            runs = [("ceiling", None)] + [("pets", eps) for eps in epsilons]
            for kind, eps in runs:
                t0 = time.perf_counter()
                entropy = resolve_entropy(1000 * (seed + 1))  # same initial population for every run of a seed
                if kind == "ceiling":
                    result = private_evolution(private, noise_multiplier=1.0, threshold=0.0, entropy=entropy,
                                               noise_free=True, **common)
                    sigma = 0.0
                else:
                    sigma = calibrate_pets_noise(eps, args.delta, cfg.iterations)
                    noise_std = sigma * sensitivity(relation)
                    result = private_evolution(private, noise_multiplier=sigma, entropy=entropy,
                                               threshold=cfg.resolved_threshold(noise_std), **common)
                synthetic = standardize_windows(result.synthetic)
                crps, naive = tstr(synthetic)
                row = {"dataset": dataset, "unit": unit, "relation": relation, "seed": seed, "kind": kind,
                       "epsilon": eps, "sigma": sigma, "c_fid": cfid(synthetic), "tstr_crps": crps,
                       "seasonal_naive_crps": naive, "votes": float(private.weights.sum()),
                       "voted": result.vote_stats[0]["voted"], "kept": result.vote_stats[0]["kept"],
                       "noise_share": result.vote_stats[0]["noise_share"],
                       "seconds": time.perf_counter() - t0}
                if kind == "ceiling":  # the initial population of this seed, scored once
                    c0 = cfid(result.initial)
                    t0_crps, _ = tstr(result.initial)
                    rows.append({**row, "kind": "initial", "c_fid": c0, "tstr_crps": t0_crps, "sigma": None})
                rows.append(row)
                print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}),
                      flush=True)
    return rows


def table(rows: list[dict]) -> str:
    """Markdown table: mean (min-max over seeds) per dataset, unit and run."""
    lines = ["| dataset | unit | run | C-FID mean (min-max) | improved over initial | TSTR CRPS mean | "
             "seasonal naive | votes | kept candidates |", "|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["dataset"], r["unit"]) for r in rows}, key=lambda k: (k[0] != "us_employment", k[1]))
    for dataset, unit in keys:
        mine = [r for r in rows if r["dataset"] == dataset and r["unit"] == unit]
        initial = {r["seed"]: r["c_fid"] for r in mine if r["kind"] == "initial"}
        runs = [("initial", None), ("ceiling", None)] + sorted({("pets", r["epsilon"]) for r in mine
                                                                if r["kind"] == "pets"}, key=lambda k: k[1])
        for kind, eps in runs:
            sel = [r for r in mine if r["kind"] == kind and r["epsilon"] == eps]
            c = np.array([r["c_fid"] for r in sel])
            better = sum(r["c_fid"] < initial[r["seed"]] for r in sel) if kind != "initial" else None
            name = {"initial": "initial population", "ceiling": "noise-free vote (ceiling)"}.get(kind, f"eps = {eps}")
            kept = "-" if kind == "initial" else f"{np.mean([r['kept'] for r in sel]):.0f}"
            improved = "-" if better is None else f"{better}/{len(sel)}"
            tstr = np.nanmean([r["tstr_crps"] for r in sel])
            naive = np.nanmean([r["seasonal_naive_crps"] for r in sel])
            lines.append(
                f"| {dataset} | {unit} | {name} | {c.mean():.2f} ({c.min():.2f}-{c.max():.2f}) | {improved} | "
                f"{tstr:.4f} | {naive:.4f} | {sel[0]['votes']:.0f} | {kept} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

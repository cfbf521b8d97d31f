"""Where the DP gap of the recipe's model comes from (issue 37): private vs non-DP twin under training variants.

Usage::

    nice -n 10 python benchmarks/dp_gap.py DATASET PROTOCOL EPSILON SEEDS "VARIANT;VARIANT;..."
    # e.g. us_employment last 4 0,1,2,3,4 "twin=1;steps=3;avg=0.2;clip=1;spread_lr=0.2,twin=1"

For one dataset (``benchmarks/combination.py``'s) x protocol (``rolling``: 4 held-out windows, ``last``: 1) x
epsilon, the recipe is chosen from public metadata as ``dpts fit`` does; each variant trains the recipe's model
(``combination``) with DP-SGD calibrated to (epsilon, delta = 1e-7) for every seed, and with ``twin=1`` also without
DP (same initialisation and steps), and scores both on the held-out test windows (MASE, CRPS; mean over seeds, then
each seed's private scores). A variant is comma-separated ``key=value`` changes to the recipe: ``lr`` (learning
rate), ``clip`` (C), ``steps`` (a multiple of the recipe's epochs; sigma is recalibrated), ``avg`` (share of the
steps after which iterates are averaged), ``schedule`` (``cosine``, ``linear``, ``constant``), ``gate_lr`` and
``spread_lr`` (multiples of the learning rate for the gate's and the spread's weights: the model's
``GATE_LR_FACTOR``, ``SPREAD_LR_FACTOR``), and the model's constants ``spread_feature_scale``, ``initial_selection``,
``initial_holdout``, ``spread0`` (the intercept of ``INITIAL_SPREAD``: the initial spread times e^(spread0 + 0.1));
``past`` (the past window P instead of the recipe's), ``prior=NAME:WEIGHT`` (candidate NAME's initial weight, the
others 1) and ``eps`` (the private run's epsilon, its sigma calibrated to it, the recipe still EPSILON's: ``eps=1000``
trains almost without noise, to tell clipping's share of the gap from noise's). Each variant's line starts with its
untrained model's scores; scores are MASE / CRPS / the coverage of the 10-90% interval.
``--val`` trains without the ``windows`` validation windows before the test windows (on the test protocol's series;
the recipe, past window included, chosen with both held out) and scores on them instead:
choose settings there, never on the test windows. With the recipe's own settings (the empty variant) the numbers
are those of ``benchmarks/utility.py``'s private model and twin for the same cell. Seeded runs are experiments.
"""

from __future__ import annotations

import logging
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import combination as cb  # noqa: E402

#: variant keys of the model's constants that are not their lower-case names
ALIASES = {"GATE_LR_FACTOR": "gate_lr", "SPREAD_LR_FACTOR": "spread_lr"}


def main(name: str, protocol: str, epsilon: float, seeds: list[int], variants: list[str],
         validation: bool = False) -> None:
    import lightning_dpts.recipe as recipe_module
    from lightning_dpts.data.seasonality import season_lengths
    from lightning_dpts.evaluation import score_windows
    from lightning_dpts.models import CombinationEstimator

    setup = cb.cell(name, protocol, epsilon, validation)
    recipe, kept, freq, h, season = setup.recipe, setup.kept, setup.freq, setup.horizon, setup.season
    print(f"{name} {protocol} eps={epsilon:g}: N={len(kept)} B={recipe.batch_size} S={recipe.steps} "
          f"P={recipe.context_length} C={recipe.max_grad_norm:g} lr={recipe.learning_rate:g}", flush=True)
    held = setup.held_out()
    hist = [np.asarray(w.history, dtype=float) for w in held]
    labels = [np.asarray(w.target, dtype=float) for w in held]
    index = [w.window for w in held]

    def score(module: Any, past: int) -> tuple[float, float, float]:
        s = score_windows(cb.model_quantiles(module, hist, past), labels, hist, index, season)
        return s["mase"], s["crps"], s["coverage"]

    default_start = recipe_module.AVERAGING_START
    from lightning_dpts.models import classical
    from lightning_dpts.models import combination as comb_module
    initial_weights, initial_spread = comb_module.INITIAL_WEIGHTS, comb_module.INITIAL_SPREAD
    names = classical.candidate_names(season_lengths(freq))
    model_defaults = {key: getattr(comb_module, key)
                      for key in ("SPREAD_FEATURE_SCALE", "INITIAL_SELECTION", "INITIAL_HOLDOUT", "GATE_LR_FACTOR",
                                  "SPREAD_LR_FACTOR")}
    try:
        for variant in variants:
            kv = dict(item.split("=") for item in variant.split(",") if item)
            recipe_module.AVERAGING_START = float(kv.get("avg", default_start))
            for key, value in model_defaults.items():  # model constants: spread_feature_scale, initial_holdout, ...
                setattr(comb_module, key, float(kv.get(ALIASES.get(key, key.lower()), value)))
            comb_module.INITIAL_WEIGHTS = initial_weights
            comb_module.INITIAL_SPREAD = (float(kv.get("spread0", initial_spread[0])), *initial_spread[1:])
            if "prior" in kv:  # prior=NAME:WEIGHT: NAME's initial weight (the others 1)
                chosen, weight = kv["prior"].split(":")
                comb_module.INITIAL_WEIGHTS = {**{n: 1.0 for n in names}, chosen: float(weight)}
            past = int(kv.get("past", recipe.context_length))
            estimator = CombinationEstimator(prediction_length=h, context_length=past, freq=freq,
                                             lr=float(kv.get("lr", recipe.learning_rate)),
                                             lr_schedule=kv.get("schedule", "cosine"))
            epochs = max(1, round(recipe.epochs * float(kv.get("steps", 1))))
            results: dict[str, list[tuple[float, float, float]]] = {"private": [], "twin": []}
            t0 = time.time()
            for seed in seeds:
                for kind in ("private", "twin") if kv.get("twin") else ("private",):
                    torch.manual_seed(seed)
                    module = estimator.create_lightning_module()
                    cb._train(module, setup.datamodule(seed, past), epochs, float(kv.get("clip", recipe.max_grad_norm)),
                              float(kv.get("eps", epsilon)) if kind == "private" else None, seed)
                    results[kind].append(score(module, past))
            means = {k: "{:.4f} / {:.5f} / {:.2f}".format(*tuple(statistics.mean(r[i] for r in v) for i in (0, 1, 2)))
                     for k, v in results.items() if v}
            torch.manual_seed(0)
            untrained = score(estimator.create_lightning_module(), past)
            print(f"[{variant or 'recipe'}] untrained {untrained[0]:.4f} / {untrained[1]:.5f} / {untrained[2]:.2f} "
                  f"{means} private per seed {['{:.4f} / {:.5f}'.format(*r[:2]) for r in results['private']]} "
                  f"({time.time() - t0:.0f} s)", flush=True)
    finally:  # the module constants as they were, also after an error
        recipe_module.AVERAGING_START = default_start
        comb_module.INITIAL_WEIGHTS, comb_module.INITIAL_SPREAD = initial_weights, initial_spread
        for key, value in model_defaults.items():
            setattr(comb_module, key, value)


if __name__ == "__main__":
    validation = "--val" in sys.argv
    sys.argv = [a for a in sys.argv if a != "--val"]
    if len(sys.argv) != 6:
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]), [int(s) for s in sys.argv[4].split(",")],
         sys.argv[5].split(";"), validation)

"""How much issue 37's ratios move with the sample of series: series-bootstrap intervals for one utility cell.

Usage::

    nice -n 10 python benchmarks/utility_intervals.py [--dataset m4_weekly] [--protocol rolling] [--epsilon 4]
        [--seeds 0,1,2,3,4] [--subsample 120] [--resamples 4000] [--cache DIR]

For one cell of ``benchmarks/utility.py`` (dataset x protocol x epsilon, delta = 1e-7), it trains the recipe's model
(``combination``, the recipe chosen from public metadata as ``dpts fit`` does) with DP-SGD and its non-DP twin for
every seed, set up by ``combination.cell`` as in ``benchmarks/dp_gap.py`` (its point estimates equal
``utility.py``'s: M4 weekly rolling at epsilon = 4 gives the table's 0.944 / 0.880 and 1.002 on all windows). It
fits seasonal naive with intervals, AutoETS and AutoTheta to every held-out window
(:func:`lightning_dpts.baselines.baseline_quantiles`, the fits kept in ``--cache``, about 12 minutes for M4 weekly's
1,172 windows on one core) and prints every model's pooled MASE, CRPS and coverage, then the ratios private / best
baseline and private / twin (MASE, CRPS; the private model's and the twin's metric is the mean over seeds), each
with a 90% interval, for all windows and for ``dpts fit``'s fixed subsample of ``--subsample`` windows
(:func:`~lightning_dpts.baselines.baseline_subset`).

**The interval** is a percentile bootstrap over series: a resample draws the series with replacement and keeps all
windows of each (a series' rolling windows are not independent), then recomputes every model's pooled metric, the
best baseline and the ratios. It says how far the ratio could move on other series like these (the question behind
issue 37's "the same holds on data we hold back"); it does not cover the seeds' training noise beyond the mean over
seeds. Seeded runs are experiments; everything here is computed from the data without DP.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: Quantiles of the bootstrap distribution printed as the interval (a 90% interval).
INTERVAL = (0.05, 0.95)


def per_forecast(quantiles: list[np.ndarray], labels: list[np.ndarray], scales: np.ndarray,
                 levels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per forecast: the CRPS numerator and denominator of the pooled metric (CRPS = sum num / sum den: the states of
    :class:`~lightning_dpts.metrics.WeightedQuantileLoss`, GluonTS' ``mean_wQuantileLoss`` over ``levels``) and the
    MASE term (MAE of the median / the history's seasonal error; NaN where
    :func:`~lightning_dpts.evaluation.score_windows` skips it). Missing labels (NaN) are left out."""
    import torch

    from lightning_dpts.metrics import WeightedQuantileLoss

    n = len(labels)
    num, den, mase = np.zeros(n), np.zeros(n), np.full(n, np.nan)
    median = list(levels).index(0.5)
    loss = WeightedQuantileLoss(tuple(levels))
    for i, (q, y) in enumerate(zip(quantiles, labels, strict=True)):
        q = np.asarray(q, dtype=float)
        loss.reset()
        loss.update(torch.from_numpy(q), torch.from_numpy(np.asarray(y, dtype=float)))
        num[i], den[i] = float(loss.quantile_loss.mean()), float(loss.abs_target)
        seen = np.isfinite(y)
        if seen.any() and np.isfinite(scales[i]) and scales[i] > 0:
            mase[i] = np.abs(y[seen] - q[seen, median]).mean() / scales[i]
    return num, den, mase


def series_bootstrap(terms: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], series: np.ndarray,
                     private: list[str], twin: list[str], baselines: list[str], resamples: int,
                     seed: int = 0) -> dict[str, tuple[float, float, float]]:
    """``{"MASE private/best": (point, low, high), ...}`` for MASE and CRPS, private / best baseline and private /
    twin, from :func:`per_forecast`'s ``terms`` per model; ``series`` is each forecast's series (the bootstrap's
    cluster); ``private`` and ``twin`` name the seeds' runs (their metric: the mean over them). ``low``, ``high``:
    the :data:`INTERVAL` quantiles over ``resamples`` resamples of the series (drawn by a generator seeded with
    ``seed``: the resampling is part of the measurement, not a privacy draw)."""
    ids, cluster = np.unique(series, return_inverse=True)
    k = len(ids)
    weights = np.vstack([np.ones(k), np.random.default_rng(seed).multinomial(k, np.full(k, 1.0 / k), size=resamples)])

    def metrics(name: str) -> tuple[np.ndarray, np.ndarray]:
        num, den, mase = terms[name]
        scored = np.isfinite(mase)
        sums = [np.bincount(cluster, v, k) for v in (num, den, np.where(scored, mase, 0.0), scored.astype(float))]
        return weights @ sums[0] / (weights @ sums[1]), weights @ sums[2] / (weights @ sums[3])

    every = {name: metrics(name) for name in {*private, *twin, *baselines}}
    out: dict[str, tuple[float, float, float]] = {}
    for j, metric in ((1, "MASE"), (0, "CRPS")):
        mine = np.mean([every[name][j] for name in private], axis=0)
        for label, other in (("best", np.min([every[name][j] for name in baselines], axis=0)),
                             ("twin", np.mean([every[name][j] for name in twin], axis=0))):
            ratio = mine / other
            low, high = np.quantile(ratio[1:], INTERVAL)
            out[f"{metric} private/{label}"] = (float(ratio[0]), float(low), float(high))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="m4_weekly")
    parser.add_argument("--protocol", choices=("rolling", "last"), default="rolling")
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--subsample", type=int, default=120, help="dpts fit's --baseline-windows (0: none)")
    parser.add_argument("--resamples", type=int, default=4000)
    parser.add_argument("--cache", type=Path, default=Path("runs/utility-intervals"))
    args = parser.parse_args(argv)
    import combination as cb
    import torch

    from lightning_dpts.baselines import BaselineCache, baseline_quantiles, baseline_subset
    from lightning_dpts.evaluation import score_windows, seasonal_errors
    from lightning_dpts.models import CombinationEstimator

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    seeds = [int(s) for s in args.seeds.split(",")]
    setup = cb.cell(args.dataset, args.protocol, args.epsilon)
    recipe, h, season = setup.recipe, setup.horizon, setup.season
    held = setup.held_out()
    hist = [np.asarray(w.history, dtype=float) for w in held]
    labels = [np.asarray(w.target, dtype=float) for w in held]
    index = [w.window for w in held]
    owner = np.array([w.series_index for w in held])
    t0 = time.time()
    args.cache.mkdir(parents=True, exist_ok=True)
    cache_file = args.cache / f"baselines-{args.dataset}-{args.protocol}.npz"
    cache = BaselineCache()
    cache.load(cache_file)  # (none the first time)
    forecasts = dict(baseline_quantiles(hist, h, season, cache=cache, max_windows=None).forecasts)
    cache.save(cache_file)
    print(f"{args.dataset} {args.protocol} eps={args.epsilon:g}: {len(held)} forecasts of {len(setup.kept)} "
          f"series; baselines {time.time() - t0:.0f} s", flush=True)
    estimator = CombinationEstimator(prediction_length=h, context_length=recipe.context_length, freq=setup.freq,
                                     lr=recipe.learning_rate)
    for seed in seeds:
        for kind, epsilon in (("private", args.epsilon), ("twin", None)):
            torch.manual_seed(seed)
            module = estimator.create_lightning_module()
            cb._train(module, setup.datamodule(seed), recipe.epochs, recipe.max_grad_norm, epsilon, seed)
            forecasts[f"{kind}{seed}"] = cb.model_quantiles(module, hist, recipe.context_length)
    scales = np.asarray(seasonal_errors(hist, season), dtype=float)
    terms = {name: per_forecast(q, labels, scales, cb._levels()) for name, q in forecasts.items()}
    private, twin = [f"private{s}" for s in seeds], [f"twin{s}" for s in seeds]
    subsets = [("all windows", np.arange(len(held)))]
    chosen = baseline_subset(len(held), args.subsample)
    if chosen is not None:
        subsets.append((f"dpts fit's {args.subsample}-window subsample", np.asarray(chosen)))
    for label, rows in subsets:
        part = {name: tuple(v[rows] for v in t) for name, t in terms.items()}
        metrics = {}  # the package's pooled metrics (utility.py's); the bootstrap's terms must pool to them
        for name, (num, den, mase) in part.items():
            pooled = score_windows([forecasts[name][i] for i in rows], [labels[i] for i in rows],
                                   [hist[i] for i in rows], [index[i] for i in rows], season)
            assert np.isclose(num.sum() / den.sum(), pooled["crps"], rtol=1e-6), name
            assert np.isclose(np.nanmean(mase), pooled["mase"], rtol=1e-6), name
            metrics[name] = np.array([pooled["mase"], pooled["crps"], pooled["coverage"]])
        shown = {"private": np.mean([metrics[n] for n in private], 0), "twin": np.mean([metrics[n] for n in twin], 0),
                 **{name: metrics[name] for name in cb.BASELINES}}
        print(f"{label} ({len(rows)} forecasts, {len(np.unique(owner[rows]))} series); MASE / CRPS / coverage: "
              + ", ".join(f"{name} {m:.3f} / {c:.5f} / {v:.2f}" for name, (m, c, v) in shown.items()))
        print("  ratios with 90% series-bootstrap intervals:")
        result = series_bootstrap(part, owner[rows], private, twin, list(cb.BASELINES), args.resamples)
        for key, (ratio, low, high) in result.items():
            print(f"  {key:20} {ratio:.3f}  [{low:.3f}, {high:.3f}]")


if __name__ == "__main__":
    main()

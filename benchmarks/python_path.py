"""The Python path (your own Trainer) benchmark of issue 27: model x recipe x wrapper x dataset x epsilon x seed.

Run through ``benchmarks/utility.py --python-path`` (usage there). One cell trains one model with
``DPForecastStrategy`` + ``AccountantCallback`` in a plain ``lightning.Trainer`` on a
``StructuredSubsamplingDataModule`` and scores it with ``HeldOutEvaluation(non_dp=...)`` on the held-out rolling
test windows next to seasonal naive and, by default, the same model trained without DP for the same steps.

* **models**: ``deepar`` (GluonTS DeepAR 2x40, context = horizon, GluonTS' default lags), ``dlinear`` (GluonTS
  DLinear, hidden 20), ``sff`` (GluonTS SimpleFeedForward, hidden [20, 20]), ``mlp`` (P-32-H, ReLU) and ``gru``
  (GRU(1, 16) + linear head), the last two with the Gaussian CRPS head of ``seasonal_residual``;
  ``seasonal_linear`` (the recipe's own model; it is seasonal naive plus a correction by construction, so it has
  no unwrapped variant) is the configuration the README shows.
* **wrapper** ``wrap``: ``seasonal_residual`` (GluonTS modules: the distribution's location is seasonal naive /
  y[t - m]; mlp/gru: seasonal naive plus the zero-initialised correction); ``plain``: the unchanged GluonTS module,
  or for mlp/gru the same network and head with the mean = the network's output (``residual=False``).
* **recipe** ``recipe``: ``make_private_with_epsilon`` (C, batch size, epochs, the short-series threshold; the past
  window of mlp/gru/sff/dlinear is the recipe's, DeepAR keeps its own); ``norecipe``: the defaults ``dpts fit``
  had before the recipe (C = 1, batch 64, 100 epochs, every series kept that has a training window; past window
  = horizon, raised to m + 1 where seasonal naive needs it).
* learning rates: GluonTS models 5e-3 (the example's DeepAR), mlp/gru 1e-2 (``seasonal_residual``'s default),
  seasonal_linear 1e-2 (the recipe's); Adam; not tuned on these windows.

Results are appended to a JSON-lines file, one line per cell; a rerun skips the cells already there (resumable).
Seeds: ``lightning.seed_everything(seed)`` for the initialisation, and the seed for the datamodule and the
strategy (seeded experiments: the guarantee does not hold against anyone who knows the seed).
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

MODELS = ("seasonal_linear", "deepar", "dlinear", "sff", "mlp", "gru")
RECIPES = ("recipe", "norecipe")
WRAPPERS = ("wrap", "plain")
TEST_WINDOWS = 4
#: dpts fit's defaults before the recipe (docs/utility.md): C, batch size, epochs
NO_RECIPE = {"max_grad_norm": 1.0, "batch_size": 64, "epochs": 100}
GLUONTS_LR = 5e-3
PLAIN_LR = 1e-2


def load(name: str, m4_path: str) -> tuple[pd.DataFrame, str, int]:
    """(long table with item_id/timestamp/target, freq, horizon) of a benchmark dataset; ``NAME/k`` keeps every
    k-th series (sorted ids), to vary the number of series N and so N/r."""
    from lightning_dpts.data import load_dataset
    from lightning_dpts.data.loading import load_long_table

    base, _, every = name.partition("/")
    if base == "us_employment":
        table, freq, horizon = load_dataset("us_employment"), "M", 12
    elif base == "m4_weekly":
        table, freq = load_long_table(m4_path, "id", "timestamp", "value", "W")
        horizon = 13
    else:
        raise SystemExit(f"unknown dataset {name!r}")
    if every:  # "m4_weekly/4": every 4th series in sorted id order (a subset with N/4 series: N/r varies)
        ids = sorted(table["item_id"].unique())
        table = table[table["item_id"].isin(ids[::int(every)])]
    return table, freq, horizon


def cell_key(cell: dict[str, Any]) -> tuple:
    return (cell["dataset"], cell["model"], cell["recipe"], cell["wrapper"], float(cell["epsilon"]),
            int(cell["seed"]), cell.get("max_steps"))


def cells(datasets: list[str], models: list[str], recipes: list[str], wrappers: list[str], epsilons: list[float],
          seeds: list[int]) -> list[dict[str, Any]]:
    """The matrix in the given order (seasonal_linear only with the recipe and its own structure, 'wrap')."""
    out = []
    for dataset in datasets:
        for epsilon in epsilons:
            for model in models:
                for recipe in recipes:
                    for wrapper in wrappers:
                        if model == "seasonal_linear" and (recipe, wrapper) != ("recipe", "wrap"):
                            continue
                        for seed in seeds:
                            out.append({"dataset": dataset, "model": model, "recipe": recipe, "wrapper": wrapper,
                                        "epsilon": epsilon, "seed": seed})
    return out


def _build(model: str, wrapper: str, freq: str, horizon: int, past: int, season: int) -> tuple[Any, Any]:
    """(LightningModule, predictor factory or None)."""
    from lightning_dpts.models import SeasonalResidualLightningModule, seasonal_residual

    wrap = wrapper == "wrap"
    if model in ("mlp", "gru"):
        if model == "mlp":
            net: nn.Module = nn.Sequential(nn.Linear(past, 32), nn.ReLU(), nn.Linear(32, horizon))
        else:
            net = GRUHead(horizon)
        return SeasonalResidualLightningModule(net, horizon, past, season, PLAIN_LR, residual=wrap), None
    if model == "seasonal_linear":
        from lightning_dpts.models import SeasonalLinearEstimator

        estimator: Any = SeasonalLinearEstimator(prediction_length=horizon, context_length=past,
                                                 season_length=season)
    elif model == "deepar":
        from gluonts.torch.model.deepar import DeepAREstimator

        estimator = DeepAREstimator(freq=freq, prediction_length=horizon, context_length=horizon, num_layers=2,
                                    hidden_size=40, dropout_rate=0.0, lr=GLUONTS_LR)
    elif model == "dlinear":
        from gluonts.torch.model.d_linear import DLinearEstimator

        estimator = DLinearEstimator(prediction_length=horizon, context_length=past, hidden_dimension=20,
                                     lr=GLUONTS_LR)
    elif model == "sff":
        from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

        estimator = SimpleFeedForwardEstimator(prediction_length=horizon, context_length=past,
                                               hidden_dimensions=[20, 20], lr=GLUONTS_LR)
    else:
        raise SystemExit(f"unknown model {model!r}")
    module = estimator.create_lightning_module()
    if wrap and model != "seasonal_linear":
        seasonal_residual(module, season_length=season)
    return module, lambda m: estimator.create_predictor(estimator.create_transformation(), m)


class GRUHead(nn.Module):
    """GRU(1, 16) over the scaled past window, a linear head to the horizon."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.gru = nn.GRU(1, 16, batch_first=True)
        self.head = nn.Linear(16, horizon)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out, _ = self.gru(z[..., None])
        return self.head(out[:, -1])


def run_cell(cell: dict[str, Any], data: tuple[pd.DataFrame, str, int], non_dp: bool, delta: float,
             max_steps: int | None) -> dict[str, Any]:
    """Train and score one cell; returns its JSON record."""
    import lightning as L
    from gluonts.time_feature import get_seasonality

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.recipe import make_private_with_epsilon
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy, HeldOutEvaluation

    table, freq, horizon = data
    season = int(get_seasonality(freq))
    lengths = table.groupby("item_id", sort=False).size()
    epsilon, seed = float(cell["epsilon"]), int(cell["seed"])
    t0 = time.perf_counter()
    L.seed_everything(seed, verbose=False)
    if cell["recipe"] == "recipe":
        past = make_private_with_epsilon(lengths.to_numpy(), epsilon=epsilon, delta=delta, freq=freq,
                                         prediction_length=horizon, held_out_windows=TEST_WINDOWS
                                         ).settings["past_length"]
    else:
        past = max(horizon, season + 1, 2)
    module, predictor = _build(cell["model"], cell["wrapper"], freq, horizon, past, season)
    if cell["recipe"] == "recipe":
        plan = make_private_with_epsilon(lengths.to_numpy(), module, epsilon=epsilon, delta=delta, freq=freq,
                                         prediction_length=horizon, held_out_windows=TEST_WINDOWS, seed=seed)
        kept = table[table["item_id"].isin(lengths.index[plan.keep(lengths.to_numpy())])]
        batch_size, epochs = plan.settings["batch_size"], plan.settings["epochs"]
        strategy, accountant = plan.strategy, plan.accountant
        drop = False
        max_grad_norm = plan.settings["max_grad_norm"]
    else:
        kept, drop = table, True
        batch_size, epochs, max_grad_norm = NO_RECIPE["batch_size"], NO_RECIPE["epochs"], NO_RECIPE["max_grad_norm"]
        strategy = DPForecastStrategy(max_grad_norm=max_grad_norm, target_epsilon=epsilon, target_delta=delta,
                                      epochs=epochs, seed=seed)
        accountant = AccountantCallback(epsilon=epsilon, delta=delta)
    dm = StructuredSubsamplingDataModule(kept, freq=freq, model=module, batch_size=batch_size,
                                         test_windows=TEST_WINDOWS, drop_short_series=drop, seed=seed)
    if max_steps is not None:  # a shorter run: sigma calibrated for the epochs that fit in max_steps
        per_epoch = dm.sampling_spec.steps_per_epoch
        epochs = max(1, min(epochs, max_steps // per_epoch))
        strategy = DPForecastStrategy(max_grad_norm=max_grad_norm, target_epsilon=epsilon, target_delta=delta,
                                      epochs=epochs, seed=seed)
        accountant = AccountantCallback(epsilon=epsilon, delta=delta)
    evaluation = HeldOutEvaluation(predictor=predictor, non_dp=non_dp, print_fn=None)
    trainer = L.Trainer(max_epochs=epochs, callbacks=[evaluation, strategy, accountant], accelerator="cpu",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, datamodule=dm)
    report = evaluation.report
    assert report is not None
    spec = dm.sampling_spec
    metrics = {k: {n: float(v) for n, v in m.items() if n in ("crps", "mae", "mase")}
               for k, m in report["metrics"].items()}
    return {**cell, "max_steps": max_steps, "delta": delta, "steps": trainer.global_step,
            "epsilon_spent": float(accountant.report.epsilon), "noise_multiplier": float(strategy.noise_multiplier),
            "max_grad_norm": max_grad_norm, "batch_size": batch_size, "past_window": past,
            "num_series": spec.num_series, "bottom_level_rate": spec.bottom_level_rate,
            "effective_dataset_size": spec.num_series / spec.bottom_level_rate, "forecasts": report["forecasts"],
            "metrics": metrics, "seconds": round(time.perf_counter() - t0, 1)}


def run_matrix(todo: list[dict[str, Any]], results: Path, m4_path: str, non_dp: bool, delta: float,
               max_steps: dict[str, int | None]) -> None:
    """Run every cell of ``todo`` not yet in ``results`` (JSON lines), appending each as it finishes."""
    import logging

    torch.set_num_threads(1)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    done = {cell_key(r) for r in read(results)}
    data: dict[str, Any] = {}
    for cell in todo:
        cap = max_steps.get(cell["dataset"])
        if cell_key({**cell, "max_steps": cap}) in done:
            continue
        if cell["dataset"] not in data:
            data[cell["dataset"]] = load(cell["dataset"], m4_path)
        record = run_cell(cell, data[cell["dataset"]], non_dp, delta, cap)
        with results.open("a") as f:
            f.write(json.dumps(record) + "\n")
        m = record["metrics"]
        plain = f", non-DP {m['non_dp']['crps']:.4f}" if "non_dp" in m else ""
        print(f"  {cell['dataset']} {cell['model']} {cell['recipe']} {cell['wrapper']} eps={cell['epsilon']:g} "
              f"seed {cell['seed']}: private CRPS {m['dp']['crps']:.4f} (naive {m['seasonal_naive']['crps']:.4f}"
              f"{plain}), sigma {record['noise_multiplier']:.3g}, {record['steps']} steps, {record['seconds']:.0f} s",
              flush=True)


def read(results: Path) -> list[dict[str, Any]]:
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


def _fmt(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def table(results: Path) -> str:
    """Markdown table: one row per (dataset, epsilon, model, recipe, wrapper, step cap), over its seeds."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in read(results):
        key = (r["dataset"], r["epsilon"], r["model"], r["recipe"], r["wrapper"], r.get("max_steps"))
        groups.setdefault(key, []).append(r)
    lines = ["| data | ε | model | recipe | wrapper | seeds | steps | private CRPS | non-DP CRPS | seasonal naive "
             "| private / naive | private < naive |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(groups, key=lambda k: (k[0], k[1], MODELS.index(k[2]), k[3], k[4])):
        rs = sorted(groups[key], key=lambda r: r["seed"])
        dp = [r["metrics"]["dp"]["crps"] for r in rs]
        naive = [r["metrics"]["seasonal_naive"]["crps"] for r in rs]
        plain = [r["metrics"]["non_dp"]["crps"] for r in rs if "non_dp" in r["metrics"]]
        wins = sum(d < n for d, n in zip(dp, naive, strict=True))
        steps = sorted({r["steps"] for r in rs})
        cap = f" (cap {key[5]})" if key[5] else ""
        ratio = statistics.fmean(d / n for d, n in zip(dp, naive, strict=True))
        lines.append(f"| {key[0]} | {key[1]:g} | {key[2]} | {key[3]} | {key[4]} | "
                     f"{','.join(str(r['seed']) for r in rs)} | {'/'.join(map(str, steps))}{cap} | {_fmt(dp)} | "
                     f"{_fmt(plain)} | {statistics.fmean(naive):.4f} | {ratio:.2f} | {wins}/{len(rs)} |")
    return "\n".join(lines)


__all__ = ["MODELS", "RECIPES", "WRAPPERS", "cells", "read", "run_matrix", "table"]

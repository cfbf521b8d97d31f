"""The main job: train a private GluonTS forecaster to a target (epsilon, delta), evaluate it and report.

:func:`run_fit` is what ``dpts fit`` runs. Phases:

1. load and validate the data (the bundled ``us_employment`` by default, or a long-format CSV/Parquet file);
2. build the GluonTS torch LightningModule and the :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`;
3. take the noise multiplier as given or calibrate it for (epsilon, delta, epochs) with the accountant;
4. train with :class:`~lightning_dpts.training.DPForecastStrategy` and
   :class:`~lightning_dpts.training.AccountantCallback` (stops before the budget is exceeded);
5. optionally train the same model without DP for the same number of steps;
6. forecast the held-out test windows with GluonTS predictors and score them (mean weighted quantile loss
   as GluonTS reports it, and MAE of the median) next to seasonal naive (and optionally AutoETS);
7. write ``report.json``, ``epsilon.png``, ``forecasts.png`` (private data; ``private_plots=False`` skips it),
   the checkpoint, the exported GluonTS predictor and ``model.json`` (:mod:`lightning_dpts.export`) and the
   Lightning logs (with the DP settings as hyperparameters, :mod:`lightning_dpts.hparams`).
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError

__all__ = ["MODELS", "FitConfig", "load_long_table", "run_fit", "format_table"]

MODELS: tuple[str, ...] = ("simple_feedforward", "deepar", "dlinear", "patch_tst")


@dataclass
class FitConfig:
    """Everything ``dpts fit`` needs; the defaults are the documented default job.

    Attributes (units in brackets):
        data: path of a long-format CSV/Parquet file, or ``None`` for the bundled ``us_employment`` data.
        id_column, time_column, value_column: column names in ``data``.
        freq: pandas frequency of the series (inferred from the time stamps when ``None``).
        prediction_length: forecast horizon [time steps].
        context_length: model context [time steps]; default = prediction_length (one season for the monthly
            default; shorter windows leak less, Theorem 4.4's r = (L_C + L_F)/T).
        model: one of :data:`MODELS`.
        epsilon, delta: the privacy budget (1-event level unless ``level``/``size`` say otherwise).
        noise_multiplier: sigma; ``None`` calibrates it for (epsilon, delta) in ``epochs`` epochs.
        epochs: training horizon the noise is calibrated for (and the epoch cap without calibration).
        batch_size: Lambda [windows]; instances_per_series: lambda; top_level, bottom_level: sampling modes.
        max_grad_norm: C, the per-window gradient clipping norm.
        learning_rate: Adam learning rate.
        level, size, value_bound, context_noise, forecast_noise: the neighbouring relation and Eq. 1
            augmentation (see docs/privacy.md).
        non_dp: also train the model without DP for the same number of steps (a utility reference).
        autoets: also score AutoETS (needs the optional ``statsforecast`` package).
        private_plots: write ``forecasts.png``, which shows private data (history, held-out truth, forecasts
            of the first test windows); ``False`` (``--no-private-plots``) skips it. ``epsilon.png`` has no data.
        seed: ``None`` (default): sampling, initialisation and noise come from fresh, secret operating-system
            entropy (PRIVACY-NOTES trap 7), so two runs differ. An integer >= 0 makes the run reproducible for
            experiments only: its guarantee does not hold against anyone who knows the seed, and the log, the
            report (``"seeded": true``) and the checkpoint say so; the seed itself is never written anywhere.
        secure_mode: draw the DP noise and the batch sampling from the operating system's CSPRNG (Opacus'
            ``secure_mode`` threat model; needs ``seed=None``).
        output_dir: where checkpoint, logs, report and plots go.
    """

    data: str | None = None
    id_column: str = "id"
    time_column: str = "timestamp"
    value_column: str = "value"
    freq: str | None = None
    prediction_length: int = 12
    context_length: int | None = None
    model: str = "dlinear"
    epsilon: float = 1.0
    delta: float = 1e-7
    noise_multiplier: float | None = None
    epochs: int = 100
    batch_size: int = 64
    instances_per_series: int = 1
    top_level: str = "without_replacement"
    bottom_level: str = "with_replacement"
    max_grad_norm: float = 1.0
    learning_rate: float = 5e-3
    level: str = "event"
    size: int = 1
    value_bound: float | None = None
    context_noise: float = 0.0
    forecast_noise: float = 0.0
    non_dp: bool = True
    autoets: bool = False
    private_plots: bool = True
    seed: int | None = None
    secure_mode: bool = False
    output_dir: str = "dpts-run"

    def validate(self) -> None:
        """Range checks that do not need the data (the datamodule and accountant check the rest)."""
        if self.model not in MODELS:
            raise ConfigurationError("model", self.model, f"must be one of {', '.join(MODELS)}")
        for name in ("prediction_length", "epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(name, value, "must be an integer >= 1")
        if self.context_length is not None and (not isinstance(self.context_length, int) or self.context_length < 1):
            raise ConfigurationError("context_length", self.context_length, "must be an integer >= 1")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ConfigurationError("epsilon", self.epsilon, "must be a finite number > 0")
        if not 0 < self.delta < 1:
            raise ConfigurationError("delta", self.delta, "must lie strictly between 0 and 1")
        sigma = self.noise_multiplier
        if sigma is not None and not (sigma > 0 and math.isfinite(sigma)):
            raise ConfigurationError("noise_multiplier", self.noise_multiplier, "must be a finite number > 0")
        if not (self.max_grad_norm > 0 and math.isfinite(self.max_grad_norm)):
            raise ConfigurationError("max_grad_norm", self.max_grad_norm, "must be a finite number > 0")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ConfigurationError("learning_rate", self.learning_rate, "must be a finite number > 0")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ConfigurationError("seed", self.seed,
                                     "must be None (secret OS entropy, the default) or an integer >= 0")
        if not isinstance(self.secure_mode, bool):
            raise ConfigurationError("secure_mode", self.secure_mode, "must be true or false")
        if self.secure_mode and self.seed is not None:
            raise ConfigurationError("secure_mode", True, "draws from the operating system's CSPRNG and cannot be "
                                     "combined with seed; leave seed unset")
        if self.autoets:
            import importlib.util

            if importlib.util.find_spec("statsforecast") is None:
                raise ConfigurationError("autoets", True, "needs the optional package statsforecast "
                                         "(pip install 'lightning-dpts[baselines]' or pip install statsforecast)")


# ---------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------
def load_long_table(path: str | Path, id_column: str, time_column: str, value_column: str,
                    freq: str | None = None) -> tuple[pd.DataFrame, str]:
    """Read a long-format CSV/Parquet file into columns ``item_id``, ``timestamp`` (Period), ``target``.

    Returns the table and its frequency. Raises :class:`ConfigurationError` naming the parameter for a
    missing file, unknown format, missing columns, non-numeric values or unparseable/irregular time stamps.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError("data", str(path), "no such file")
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            raw = pd.read_parquet(path)
        elif name.endswith((".csv", ".csv.gz", ".txt")):
            raw = pd.read_csv(path)
        else:
            raise ConfigurationError("data", str(path), "must be a .csv, .csv.gz or .parquet file")
    except ConfigurationError:
        raise
    except Exception as err:  # unreadable file: say which and why
        raise ConfigurationError("data", str(path), f"could not be read ({type(err).__name__}: {err})") from err
    for param, column in (("id_column", id_column), ("time_column", time_column), ("value_column", value_column)):
        if column not in raw.columns:
            raise ConfigurationError(param, column, f"is not a column of {path.name}; columns are {list(raw.columns)}")
    values = pd.to_numeric(raw[value_column], errors="coerce")
    bad = values.isna() & raw[value_column].notna()
    if bad.any():
        example = raw.loc[bad, value_column].iloc[0]
        raise ConfigurationError(
            "value_column", value_column,
            f"must hold numbers (empty cells are missing values); {int(bad.sum())} rows are not, e.g. {example!r}",
        )
    try:
        stamps = pd.to_datetime(raw[time_column])
    except (ValueError, TypeError) as err:
        raise ConfigurationError("time_column", time_column, f"holds values that are not time stamps ({err})") from err
    table = pd.DataFrame({"item_id": raw[id_column].astype(str), "timestamp": stamps, "target": values})
    table = table.sort_values(["item_id", "timestamp"], kind="stable")
    if table.duplicated(["item_id", "timestamp"]).any():
        raise ConfigurationError("time_column", time_column, "has duplicate time stamps within a series")
    if freq is None:
        freq = _infer_freq(table)
    try:
        table["timestamp"] = table["timestamp"].dt.to_period(freq)
    except (ValueError, TypeError) as err:
        raise ConfigurationError("freq", freq, f"is not a pandas frequency ({err})") from err
    return table.reset_index(drop=True), freq


def _infer_freq(table: pd.DataFrame) -> str:
    for _, group in table.groupby("item_id", sort=False):
        if len(group) >= 3:
            freq = pd.infer_freq(pd.DatetimeIndex(group["timestamp"]))
            if freq is not None:
                return {"MS": "M", "ME": "M", "QS": "Q", "QE": "Q", "YS": "Y", "YE": "Y"}.get(freq, freq)
    raise ConfigurationError("freq", None, "could not infer the frequency from the time stamps; pass --freq")


# ---------------------------------------------------------------------------------------------------------
# models and forecasting
# ---------------------------------------------------------------------------------------------------------
def _estimator(config: FitConfig, freq: str):
    """The GluonTS estimator whose LightningModule and predictor we use (defaults as in the paper, B.2)."""
    h = config.prediction_length
    ctx = config.context_length or h
    lr = config.learning_rate
    if config.model == "simple_feedforward":
        from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

        return SimpleFeedForwardEstimator(prediction_length=h, context_length=ctx, hidden_dimensions=[64, 64], lr=lr)
    if config.model == "deepar":
        from gluonts.torch.model.deepar import DeepAREstimator

        return DeepAREstimator(freq=freq, prediction_length=h, context_length=ctx, num_layers=2, hidden_size=40,
                               dropout_rate=0.0, lr=lr)
    if config.model == "dlinear":
        from gluonts.torch.model.d_linear import DLinearEstimator

        return DLinearEstimator(prediction_length=h, context_length=ctx, hidden_dimension=20, lr=lr)
    from gluonts.torch.model.patch_tst import PatchTSTEstimator

    return PatchTSTEstimator(prediction_length=h, context_length=ctx, patch_len=max(1, min(ctx, h) // 2),
                             stride=max(1, min(ctx, h) // 4), dropout=0.0, lr=lr)


def _quantile_matrix(forecast: Any) -> np.ndarray:
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    return np.stack([np.asarray(forecast.quantile(q), dtype=float) for q in DEFAULT_QUANTILES], axis=-1)


def score_forecasts(forecasts: list[Any], labels: list[np.ndarray]) -> dict[str, float]:
    """Mean weighted quantile loss (GluonTS ``mean_wQuantileLoss``, the paper's CRPS) and MAE of the median."""
    import torch

    from lightning_dpts.metrics import DEFAULT_QUANTILES, WeightedQuantileLoss

    metric = WeightedQuantileLoss(DEFAULT_QUANTILES)
    abs_err, count = 0.0, 0
    for forecast, truth in zip(forecasts, labels, strict=True):
        q = _quantile_matrix(forecast)
        y = np.asarray(truth, dtype=float)
        metric.update(torch.from_numpy(q)[None], torch.from_numpy(y)[None])
        ok = np.isfinite(y)
        abs_err += float(np.abs(q[..., DEFAULT_QUANTILES.index(0.5)] - y)[ok].sum())
        count += int(ok.sum())
    return {"crps": float(metric.compute()), "mae": abs_err / max(count, 1)}


def _season_length(freq: str) -> int:
    from gluonts.time_feature import get_seasonality

    return int(get_seasonality(freq))


# ---------------------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------------------
def run_fit(config: FitConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the main job (see the module docstring) and return the report that is written to report.json."""
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.privacy import NeighbouringRelation, calibrate_noise_multiplier
    from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    config.validate()
    out = Path(config.output_dir)
    started = time.perf_counter()
    entropy = resolve_entropy(config.seed)  # None: fresh OS entropy; never written anywhere
    if entropy.seeded:
        warnings.warn(f"dpts fit: {SEEDED_NOTICE}", UserWarning, stacklevel=2)
        progress(f"WARNING: {SEEDED_NOTICE}")

    def torch_seed(stream: int) -> int:
        """A torch seed from stream ``stream`` of the run's entropy (initialisation, forecast sampling)."""
        return int(entropy.seed_sequence(stream).generate_state(1, np.uint64)[0] >> np.uint64(1))

    if config.data is None:
        from lightning_dpts.data import load_dataset

        table, freq = load_dataset("us_employment"), config.freq or "M"
        data_name = "us_employment (bundled)"
    else:
        table, freq = load_long_table(config.data, config.id_column, config.time_column, config.value_column,
                                      config.freq)
        data_name = str(config.data)
    relation = NeighbouringRelation(level=config.level, size=config.size, value_bound=config.value_bound)

    def datamodule(module: Any) -> StructuredSubsamplingDataModule:
        return StructuredSubsamplingDataModule(
            table, batch_size=config.batch_size, instances_per_series=config.instances_per_series,
            top_level=config.top_level, bottom_level=config.bottom_level, relation=relation,
            context_noise=config.context_noise, forecast_noise=config.forecast_noise, seed=config.seed,
            secure_mode=config.secure_mode, model=module, freq=freq, id_column="item_id", timestamp_column="timestamp",
            value_column="target",
        )

    init_seed = torch_seed(3)  # the initialisation is secret too (unless seeded); the non-DP reference reuses it
    torch.manual_seed(init_seed)
    estimator = _estimator(config, freq)
    module = estimator.create_lightning_module()
    from lightning_dpts.export import make_checkpoint_loadable

    make_checkpoint_loadable(module)  # GluonTS modules do not record their hyperparameters (load_from_checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the seeded notice was given above
        dm = datamodule(module)
    spec = dm.sampling_spec
    progress(f"data: {data_name}, {spec.num_series} series, shortest training part {spec.min_length} steps; "
             f"model {config.model}, past window {spec.context_length} (incl. lags), horizon {spec.prediction_length}")

    sigma = config.noise_multiplier
    if sigma is None:
        progress(f"calibrating the noise multiplier for epsilon={config.epsilon:g}, delta={config.delta:g} "
                 f"in {config.epochs} epochs ({config.epochs * spec.steps_per_epoch} steps) ...")
        sigma = calibrate_noise_multiplier(spec, config.epsilon, config.delta, epochs=config.epochs)
        progress(f"noise multiplier {sigma:.4f}")

    out.mkdir(parents=True, exist_ok=True)
    strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                  secure_mode=config.secure_mode)
    accountant = AccountantCallback(epsilon=config.epsilon, delta=config.delta)
    logger = CSVLogger(str(out), name="logs")
    trainer = L.Trainer(max_epochs=config.epochs, accelerator="cpu", devices=1, logger=logger,
                        callbacks=[strategy, accountant], enable_checkpointing=False, enable_model_summary=False,
                        log_every_n_steps=1)
    progress("training with DP-SGD (stops before the privacy budget is exceeded) ...")
    trainer.fit(module, datamodule=dm)
    report_privacy = accountant.report
    assert report_privacy is not None
    steps = int(trainer.global_step)
    trainer.save_checkpoint(str(out / "dp-model.ckpt"))
    from lightning_dpts.export import export_model

    export_model(estimator, module, out, freq=freq, checkpoint="dp-model.ckpt")

    predictions: dict[str, list[Any]] = {}
    pairs = dm.gluonts_test_pairs("test")
    inputs = [p[0] for p in pairs]
    labels = [np.asarray(p[1]["target"], dtype=float) for p in pairs]
    predictor = estimator.create_predictor(estimator.create_transformation(), module)
    eval_seed = torch_seed(4)  # sample-based forecasts (reproducible when seeded)
    torch.manual_seed(eval_seed)
    predictions["dp"] = list(predictor.predict(inputs))

    if config.non_dp and steps > 0:
        progress(f"training the same model without DP for the same {steps} steps ...")
        torch.manual_seed(init_seed)
        plain_estimator = _estimator(config, freq)
        plain = plain_estimator.create_lightning_module()
        plain_trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                                  enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            plain_dm = datamodule(plain)
        plain_trainer.fit(plain, datamodule=plain_dm)
        plain_predictor = plain_estimator.create_predictor(plain_estimator.create_transformation(), plain)
        torch.manual_seed(eval_seed)
        predictions["non_dp"] = list(plain_predictor.predict(inputs))

    from gluonts.model.seasonal_naive import SeasonalNaivePredictor

    season = _season_length(freq)
    predictions["seasonal_naive"] = list(
        SeasonalNaivePredictor(prediction_length=config.prediction_length, season_length=season).predict(inputs)
    )
    if config.autoets:
        predictions["autoets"] = _autoets_forecasts(inputs, config.prediction_length, season, freq)

    metrics = {name: score_forecasts(fc, labels) for name, fc in predictions.items()}
    report = {
        "epsilon": report_privacy.epsilon,
        "delta": report_privacy.delta,
        "epsilon_budget": config.epsilon,
        "steps": steps,
        "compositions": report_privacy.compositions,
        "composition_unit": report_privacy.unit,
        "bound": {"theorem": report_privacy.theorem, "kind": report_privacy.kind},
        "noise_multiplier": sigma,
        "max_grad_norm": config.max_grad_norm,
        "metrics": metrics,
        "dp_hyperparameters": accountant.hyperparameters,
        "privacy_configuration": {
            "sampling_spec": _spec_dict(spec),
            "noise_multiplier": sigma,
            "calibrated": config.noise_multiplier is None,
        },
        "seeded": entropy.seeded,
        "secure_mode": config.secure_mode,
        "privacy_ledger": strategy.ledger.to_dict(),
        "data": data_name,
        "model": config.model,
        "config": _config_dict(config),
        "seconds": round(time.perf_counter() - started, 1),
    }
    if entropy.seeded:
        report["seeded_notice"] = SEEDED_NOTICE
    from lightning_dpts.plots import PRIVATE_PLOT_NOTICE, plot_epsilon, plot_forecasts, read_epsilon_log

    report["plots"] = {"epsilon.png": "epsilon against optimizer step (no data)",
                       "forecasts.png": PRIVATE_PLOT_NOTICE if config.private_plots else
                       "not written (private_plots=False / --no-private-plots)"}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    plot_epsilon(out / "epsilon.png", *read_epsilon_log(Path(logger.log_dir) / "metrics.csv"), budget=config.epsilon,
                 delta=report_privacy.delta, theorem=report_privacy.theorem, kind=report_privacy.kind,
                 spent=report_privacy.epsilon)
    if config.private_plots:
        names = dict(zip(table["item_id"], table["title"], strict=True)) if "title" in table else None
        plot_forecasts(out / "forecasts.png", inputs, labels, predictions, names=names)
    progress(format_table(report))
    return report


def _config_dict(config: FitConfig) -> dict[str, Any]:
    """The configuration for the report, without the seed (never written: it would reproduce the randomness)."""
    d = asdict(config)
    d["seed"] = "explicit (not recorded)" if config.seed is not None else None
    return d


def _spec_dict(spec: Any) -> dict[str, Any]:
    d = asdict(spec)
    d.update(top_level_rate=spec.top_level_rate, bottom_level_rate=spec.bottom_level_rate,
             windows_per_unit=spec.windows_per_unit, steps_per_epoch=spec.steps_per_epoch)
    return d


def _autoets_forecasts(inputs: list[dict[str, Any]], horizon: int, season: int, freq: str) -> list[Any]:
    from gluonts.model.forecast import QuantileForecast
    from scipy.stats import norm
    from statsforecast.models import AutoETS

    from lightning_dpts.metrics import DEFAULT_QUANTILES

    out = []
    for entry in inputs:
        y = np.asarray(entry["target"], dtype=float)
        y = pd.Series(y).interpolate(limit_direction="both").to_numpy()
        fit = AutoETS(season_length=season).forecast(y=y, h=horizon, level=[80])
        mean = np.asarray(fit["mean"])
        sd = (np.asarray(fit["hi-80"]) - mean) / norm.ppf(0.9)
        arrays = np.stack([mean + norm.ppf(q) * sd for q in DEFAULT_QUANTILES])
        start = entry["start"] + len(y)
        out.append(QuantileForecast(arrays, start_date=start, forecast_keys=[str(q) for q in DEFAULT_QUANTILES]))
    return out


def format_table(report: dict[str, Any]) -> str:
    """The printed result table: metrics per model plus the spent (epsilon, delta) and the bound used."""
    names = {"dp": "private model (DP-SGD)", "non_dp": "same model, no DP", "seasonal_naive": "seasonal naive",
             "autoets": "AutoETS"}
    lines = [f"{'model':28} {'CRPS (mean wQL)':>16} {'MAE':>12}"]
    for key, values in report["metrics"].items():
        lines.append(f"{names.get(key, key):28} {values['crps']:>16.4f} {values['mae']:>12.3f}")
    bound = report["bound"]
    lines.append(f"privacy spent: epsilon={report['epsilon']:.4f} (budget {report['epsilon_budget']:g}), "
                 f"delta={report['delta']:g} after {report['steps']} steps; "
                 f"{bound['theorem']} ({bound['kind']} bound), "
                 f"noise multiplier {report['noise_multiplier']:.4f}")
    if report.get("seeded"):
        lines.append(f"WARNING: {report.get('seeded_notice', 'this run used an explicit seed')}")
    return "\n".join(lines)


"""The main job: train a private GluonTS forecaster to a target (epsilon, delta), evaluate it and report.

:func:`run_fit` is what ``dpts fit`` runs. Phases:

1. load and validate the data (the bundled ``us_employment`` by default, or a long-format CSV/Parquet file;
   :mod:`lightning_dpts.data.loading`) and fill the unset options (the recipe; :mod:`lightning_dpts.app.geometry`);
2. build the GluonTS torch LightningModule (:mod:`lightning_dpts.app.forecasters`) and the
   :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`;
3. take the noise multiplier as given or calibrate it for (epsilon, delta, epochs) with the accountant
   (:mod:`lightning_dpts.app.budget`);
4. train with :class:`~lightning_dpts.training.DPForecastStrategy` and
   :class:`~lightning_dpts.training.AccountantCallback` (stops before the budget is exceeded);
5. optionally train the same model without DP for the same number of steps;
6. forecast the held-out test windows (``--evaluation rolling`` or ``last``) with GluonTS predictors and score
   them (CRPS = mean weighted quantile loss as GluonTS reports it, MASE, MAE of the median, interval coverage)
   next to the yardstick: seasonal naive with calibrated intervals, AutoETS and AutoTheta
   (:mod:`lightning_dpts.baselines`, :mod:`lightning_dpts.app.scoring`) and the non-DP twin;
7. write the run directory (:mod:`lightning_dpts.outputs`: refused if not empty unless ``overwrite``, locked,
   every file written atomically), split by what the (epsilon, delta) guarantee covers
   (:mod:`lightning_dpts.app.reporting`). At the top, public: ``report.json`` (configuration, epsilon, delta, sigma,
   C, sampling spec, ledger, recipe, the epsilon curve and the ``"files"`` manifest saying for each file whether
   the guarantee covers it), ``epsilon.png`` (from the accountant, no data), the DP model (``dp-model.ckpt``,
   ``predictor/``, ``model.json``; :mod:`lightning_dpts.app.export`). Under ``private/``, computed from the private
   data without DP and not covered: ``evaluation.json`` (metrics of every model on the held-out windows,
   baselines, verdict, levers), ``forecasts.png`` (``private_plots=False`` skips it) and the Lightning logs
   ``logs/`` (noise-free training loss; the DP settings as hyperparameters, :mod:`lightning_dpts.training.hparams`).
   ``private_outputs=False`` writes nothing under ``private/``; the terminal shows the evaluation either way.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dpts.app.config import FitConfig
from lightning_dpts.errors import ConfigurationError, TrainingRefused
from lightning_dpts.outputs import PRIVATE_DIR

__all__ = ["FitConfig", "FitInterrupted", "run_fit"]

#: Pattern of the datamodule's seeded-run warning, silenced where ``run_fit`` already gave it once.
_SEEDED_WARNING = ".*explicit seed"
#: The datamodule's lag warning; ``run_fit`` states the same cause with the accountant's numbers instead.
_LAG_WARNING = "StructuredSubsamplingDataModule: the model's lags"


class FitInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped ``dpts fit``'s training; what a resume needs was written if ``saved``.

    Attributes:
        run_dir: the run directory. steps: noisy steps taken (all counted in ``ledger.json``). saved: ``ledger.json``
        and ``checkpoints/last.ckpt`` hold the interrupted state (``dpts fit --resume run_dir`` continues it).
    """

    def __init__(self, run_dir: Path, steps: int, saved: bool) -> None:
        self.run_dir, self.steps, self.saved = Path(run_dir), int(steps), bool(saved)
        super().__init__(self.message())

    def message(self) -> str:
        if not self.saved:
            return ("interrupted before training began: nothing to resume (start the run again; with --overwrite if "
                    f"{self.run_dir} is not empty)")
        return (f"interrupted after {self.steps} noisy steps: {self.run_dir / 'ledger.json'} counts them and "
                f"{self.run_dir / 'checkpoints' / 'last.ckpt'} holds the model; continue with: dpts fit --resume "
                f"{self.run_dir}")


@dataclass
class _Data:
    """The job's data after loading, the recipe, the length filter and clipping (public metadata besides tables)."""

    config: FitConfig  # resolved: the recipe's choices filled in
    table: Any  # what the private model is trained on (clipped with a declared range): a table or a SeriesStore
    raw_table: Any  # the same rows unclipped (scored against)
    freq: str
    name: str
    recipe: Any
    chosen: list[str]
    planned_windows: tuple[int, str] | None
    dropped_by_length: int
    clipped_count: int | None
    relation: Any


def run_fit(config: FitConfig, progress: Callable[[str], None] = print, *,
            baseline_cache: Any = None) -> dict[str, Any]:
    """Run the main job (see the module docstring) and return the report that is written to report.json.

    Every check that can refuse the job (the config's ranges, the data, the model geometry, the season, a budget
    that allows no step) runs before training and before anything is written: a :class:`ConfigurationError` leaves
    ``output_dir`` untouched.

    ``baseline_cache``: a :class:`~lightning_dpts.baselines.BaselineCache` to memoise the AutoETS/AutoTheta
    forecasts in (benchmarks keep one per dataset across runs: they depend on neither the seed nor epsilon);
    default: the process's memo.
    """
    config.validate()  # first, before the heavy imports: a bad option is refused at once
    from lightning_dpts.app.budget import dp_callbacks, noise_multiplier
    from lightning_dpts.app.resume import check_resume, resumed_config
    from lightning_dpts.outputs import OutputDirectory, check_output_dir

    resume = None
    if config.resume is not None:  # the stored configuration; a conflicting option or a mismatched ledger: refused
        config = resumed_config(config.resume, _given(config))
        resume = check_resume(config.resume)
        progress(f"resuming {config.resume}: {resume.steps} noisy steps already taken (accounted once), continuing "
                 f"from {resume.checkpoint.name}")
    else:
        check_output_dir(config.output_dir, config.overwrite)  # a file, a non-empty or a locked directory: refused
    given = config
    started = time.perf_counter()
    entropy = _entropy(config, progress)
    data = _load_data(config, progress)
    config = data.config
    train_epsilon = config.epsilon - config.reserved_epsilon  # basic composition: noisy clipped count, DP metrics
    seasons = _seasons(config, data.freq)
    estimator, module, init_seed = _model(config, data.freq, entropy)
    dm, test_windows, windows_note = _datamodule(config, data, module, train_epsilon, progress)
    spec = dm.sampling_spec
    from lightning_dpts.evaluation import check_season

    check_season(seasons[0], spec.min_length)  # the shortest history any test window's forecast sees
    sigma, bandmf = noise_multiplier(config, spec, train_epsilon, progress)  # checked before writing

    out = Path(config.output_dir)
    # lock; --overwrite removes the earlier run's files, --resume keeps them
    with OutputDirectory(out, config.overwrite, resume=resume is not None) as run_dir:
        strategy, accountant = dp_callbacks(config, sigma, train_epsilon, bandmf)
        run = (given, resume)
        steps = _train_and_export(config, estimator, module, dm, strategy, accountant, run_dir, data.freq, progress,
                                  run)
        privacy = accountant.report
        assert privacy is not None
        predictions, inputs, raw_inputs, labels, baselines = _forecast_test_windows(
            config, data, dm, estimator, module, test_windows, init_seed, entropy, steps, progress, seasons[0],
            baseline_cache)
        from lightning_dpts.app.reporting import private_report, public_report, write_run_files
        from lightning_dpts.app.scoring import score_paired

        windows = [w.window for w in dm.evaluation_windows("test")]
        metrics, every = score_paired(predictions, labels, raw_inputs, windows, seasons[0], baselines.subset)
        report = public_report(config, privacy=privacy, accountant=accountant, strategy=strategy, spec=spec,
                               sigma=sigma, steps=steps, test_windows=test_windows, windows_note=windows_note,
                               entropy=entropy, data_name=data.name, recipe=data.recipe, chosen=data.chosen,
                               dropped_by_length=data.dropped_by_length, clipped_count=data.clipped_count,
                               relation=data.relation, predictions=predictions, labels=labels, inputs=inputs,
                               seasons=seasons)
        private = private_report(config, report, metrics=metrics, spec=spec, steps=steps, test_windows=test_windows,
                                 forecasts=len(labels), season=seasons[0], started=started, baselines=baselines,
                                 metrics_all_windows=every)
        for line in private["verdict"]:
            if line.startswith("VERDICT"):
                warnings.warn(f"dpts fit: {line}", UserWarning, stacklevel=2)
        write_run_files(run_dir, out, config, report, private, steps=steps, table=data.table, inputs=inputs,
                        labels=labels, predictions=predictions)
    from lightning_dpts.app.reporting import format_table

    progress(format_table({**report, "private": private}))
    return {**report, "private": private}


# ---------------------------------------------------------------------------------------------------------
# the steps (warnings use stacklevel=3: they name the caller of run_fit, as the job always did)
# ---------------------------------------------------------------------------------------------------------
def _entropy(config: FitConfig, progress: Callable[[str], None]) -> Any:
    """The run's secret randomness (``None`` seed: fresh OS entropy, never written anywhere); a seed is announced."""
    from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy

    entropy = resolve_entropy(config.seed)
    if entropy.seeded:
        warnings.warn(f"dpts fit: {SEEDED_NOTICE}", UserWarning, stacklevel=3)
        progress(f"WARNING: {SEEDED_NOTICE}")
    return entropy


def _torch_seed(entropy: Any, stream: int) -> int:
    """A torch seed from stream ``stream`` of the run's entropy (initialisation, forecast sampling)."""
    return int(entropy.seed_sequence(stream).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _load_data(config: FitConfig, progress: Callable[[str], None]) -> _Data:
    """Load the data, fill the unset options (the recipe, announced), drop short series, clip to a public range."""
    from lightning_dpts.app.geometry import resolve_with_test_windows
    from lightning_dpts.data.loading import drop_short_series
    from lightning_dpts.privacy import NeighbouringRelation

    table, freq, name = _read_input(config)
    if config.evaluation == "last" and config.test_windows is None:  # M4's protocol: the last H steps, one window
        from dataclasses import replace

        config = replace(config, test_windows=1)
    if _is_store(table):  # a store has the default column names
        from dataclasses import replace

        config = replace(config, id_column="item_id", timestamp_column="timestamp", value_column="target")
    elif "source_columns" in table.attrs:  # the columns read (the old default names, if the data has those)
        from dataclasses import replace

        id_column, timestamp_column, value_column = table.attrs["source_columns"]
        config = replace(config, id_column=id_column, timestamp_column=timestamp_column, value_column=value_column)
    lengths = _lengths(table)
    config, recipe, chosen, planned_windows = resolve_with_test_windows(config, lengths, freq)
    if recipe is not None:
        for line in recipe.describe():
            progress(line)
        if chosen:
            progress(f"chosen by the recipe: {', '.join(chosen)} (give an option to override it)")
        for text in recipe.warnings:
            warnings.warn(f"dpts fit: {text}", UserWarning, stacklevel=3)
            progress(f"WARNING: {text}")
    if config.clipping and _is_store(table):  # clipping rewrites every value: the pandas path (a table in memory)
        table = table.to_frame()
        table.attrs["source_columns"] = ("item_id", "timestamp", "target")
    table, dropped_by_length = drop_short_series(table, config.min_series_length)
    if dropped_by_length:
        progress(f"left out {dropped_by_length} of {len(lengths)} series shorter than {config.min_series_length} "
                 "steps (min_series_length; not trained on and not evaluated)")
    raw_table = table
    clipped_count = None
    if config.clipping:  # a declared public range: the value bound of Theorem G.1 then holds for any change
        from lightning_dpts.evaluation import clip_values

        values, clipped_count = clip_values(table["target"].to_numpy(), config.clip_low, config.clip_high)
        table = table.assign(target=values)
    relation = NeighbouringRelation(level=config.level, size=config.size, value_bound=config.effective_value_bound)
    return _Data(config, table, raw_table, freq, name, recipe, chosen, planned_windows, dropped_by_length,
                 clipped_count, relation)


def _is_store(data: Any) -> bool:
    from lightning_dpts.data.store import SeriesStore

    return isinstance(data, SeriesStore)


def _read_input(config: FitConfig) -> tuple[Any, str, str]:
    """(data, freq, name): a series store (``.arrow``) stays memory-mapped (a
    :class:`~lightning_dpts.data.store.SeriesStore`: the job streams from it and never builds the long table,
    issue 41); any other input is read into the long table (:func:`~lightning_dpts.data.loading.load_fit_table`)."""
    from lightning_dpts.data.loading import load_fit_table, open_fit_store
    from lightning_dpts.data.store import is_store_path

    if config.data is not None and is_store_path(config.data):
        store = open_fit_store(config.data, config.freq)
        return store, str(store.freq), str(config.data)
    return load_fit_table(config)


def _lengths(data: Any) -> np.ndarray:
    """Every series' number of rows (public metadata), from the store's index or the table."""
    if _is_store(data):
        return np.asarray(data.lengths, dtype=np.int64)
    return data.groupby("item_id", sort=False).size().to_numpy()


def _seasons(config: FitConfig, freq: str) -> tuple[int, ...]:
    """The seasons of the run (:func:`~lightning_dpts.app.forecasters.model_seasons`; public metadata), refused before
    any work when the recipe's seasonal model could not read the primary one from its past window (the training
    parts are checked once the datamodule has dropped or refused the short series)."""
    from lightning_dpts.app.forecasters import model_seasons
    from lightning_dpts.evaluation import check_season
    from lightning_dpts.recipe import RECIPE_MODEL

    seasons = model_seasons(config, freq)
    reads_season = config.model in (None, RECIPE_MODEL, "seasonal_linear")
    check_season(seasons[0], 10**12, config.context_length if reads_season else None)
    return seasons


def _model(config: FitConfig, freq: str, entropy: Any) -> tuple[Any, Any, int]:
    """(estimator, LightningModule, initialisation seed): the initialisation is secret too (unless seeded); the
    non-DP reference reuses its seed."""
    import torch

    from lightning_dpts.app.export import make_checkpoint_loadable
    from lightning_dpts.app.forecasters import make_estimator

    init_seed = _torch_seed(entropy, 3)
    torch.manual_seed(init_seed)
    estimator = make_estimator(config, freq)
    module = estimator.create_lightning_module()
    make_checkpoint_loadable(module)  # GluonTS modules do not record their hyperparameters (load_from_checkpoint)
    return estimator, module, init_seed


def _quiet_datamodule(config: FitConfig, data: _Data, module: Any, test_windows: int) -> Any:
    """:func:`~lightning_dpts.app.geometry.build_datamodule` without the warnings ``run_fit`` gives itself."""
    from lightning_dpts.app.geometry import build_datamodule

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SEEDED_WARNING)  # the seeded notice was given above
        warnings.filterwarnings("ignore", message=_LAG_WARNING)  # restated with the accountant's numbers
        return build_datamodule(config, data.table, data.freq, module, test_windows, data.relation)


def _datamodule(config: FitConfig, data: _Data, module: Any, train_epsilon: float,
                progress: Callable[[str], None]) -> tuple[Any, int, str]:
    """(datamodule, test windows, why that many): the geometry, announced, with the cost of DeepAR's lags."""
    from lightning_dpts.app.budget import lag_cost
    from lightning_dpts.app.geometry import fit_test_windows

    test_windows, windows_note = fit_test_windows(config, data.planned_windows, data.table, data.freq, module)
    try:
        dm = _quiet_datamodule(config, data, module, test_windows)
    except ConfigurationError as err:
        if "drop_short_series=True" not in err.requirement:
            raise
        raise ConfigurationError(err.parameter, err.value, err.requirement.replace(
            "drop_short_series=True", "--drop-short-series (YAML: drop_short_series: true)")) from err
    spec = dm.sampling_spec
    progress(f"data: {data.name}, {spec.num_series} series, shortest training part {spec.min_length} steps; "
             f"model {config.model}, past window {spec.context_length} (incl. lags), horizon {spec.prediction_length}")
    if dm.dropped_series:
        progress(f"dropped {len(dm.dropped_series)} series too short for training (--drop-short-series)")
    from lightning_dpts.app.console import warn_delta_above_one_over_n

    warn_delta_above_one_over_n(config.delta, spec.num_series, "training series")
    cost = None if config.monte_carlo else lag_cost(  # the series-level Monte Carlo reading has no lag cost
        spec, config.context_length or config.prediction_length, train_epsilon, config.delta, config.epochs,
        config.noise_multiplier)
    if cost is not None:
        warnings.warn(cost, UserWarning, stacklevel=3)
        progress(f"warning: {cost}")
    return dm, test_windows, windows_note


def _given(config: FitConfig) -> dict[str, Any]:
    """The fields of ``config`` that differ from their defaults (what a Python caller set)."""
    from dataclasses import fields

    return {f.name: getattr(config, f.name) for f in fields(config) if getattr(config, f.name) != f.default}


def _train_and_export(config: FitConfig, estimator: Any, module: Any, dm: Any, strategy: Any, accountant: Any,
                      run_dir: Any, freq: str, progress: Callable[[str], None], run: tuple[Any, Any]) -> int:
    """Train privately, then export the DP model (checkpoint, predictor, model.json); returns the steps taken.

    ``run``: (the configuration as given, the :class:`~lightning_dpts.app.resume.ResumeState` or ``None``):
    ``ledger.json`` and ``checkpoints/last.ckpt`` are kept for ``--resume`` (:mod:`lightning_dpts.app.resume`)."""
    import lightning as L

    from lightning_dpts.app.export import MODEL_FILE, PREDICTOR_DIR, export_model
    from lightning_dpts.app.resume import LAST_CHECKPOINT, RUN_LEDGER, make_run_ledger_callback
    from lightning_dpts.outputs import atomic_path

    out = Path(config.output_dir)
    logger: Any = False
    if config.private_outputs:  # the training loss of private batches is logged without noise: private
        run_dir.register("private/logs/", f"private: Lightning {config.logger} logs (noise-free training loss of "
                         "private batches, epsilon by step, the DP settings as hyperparameters)")
        logger = make_logger(config.logger, out / PRIVATE_DIR)
    from lightning_dpts.app.console import progress_bar_wanted, step_lines

    given, resume = run
    run_dir.register(RUN_LEDGER, "public: the run's configuration and privacy ledger (noisy steps taken, sigma, "
                     "C, sampling), rewritten after every step (dpts fit --resume)")
    run_dir.register(LAST_CHECKPOINT.split("/")[0] + "/", "public: the DP model's Lightning checkpoint at the end of "
                     "the last epoch (dpts fit --resume continues it)")
    keeper = make_run_ledger_callback(out, given, resume)
    bar = progress_bar_wanted(config.verbose)  # a progress bar only on a terminal; a log gets a line per tenth
    averaging = _averaging(config)
    trainer = L.Trainer(max_epochs=config.epochs, accelerator="cpu", devices=1, logger=logger,
                        callbacks=[strategy, accountant, keeper, *averaging,
                                   *([] if bar else [step_lines(write=progress)])],
                        enable_checkpointing=False, enable_model_summary=False, log_every_n_steps=1,
                        enable_progress_bar=bar)
    progress("training with DP-SGD (stops before the privacy budget is exceeded) ..." if config.bands is None else
             f"training with BandMF (bands={config.bands}, "
             + ("b-min-sep sampling" if config.monte_carlo else f"cyclic Poisson sampling in {config.bands} groups")
             + f", {trainer.max_epochs} epochs) ...")
    try:
        trainer.fit(module, datamodule=dm, ckpt_path=None if resume is None else str(resume.checkpoint))
    except ConfigurationError as err:
        if not keeper.started:  # refused by a check before training began: input refused, exit 2
            raise
        raise TrainingRefused.after(err, strategy.ledger.steps) from err
    except SystemExit as exc:  # Lightning ends a fit stopped by Ctrl-C with sys.exit(1), after the callbacks' clean-up
        if not keeper.interrupted:
            raise
        raise FitInterrupted(out, strategy.ledger.steps, keeper.saved) from exc
    if resume is not None and accountant.report is None:
        # the checkpoint had already finished the run's epochs, so Lightning skipped training: account the steps taken
        # (the accountant finds the budget spent, or allows no step in no epoch left) without training
        accountant.on_train_start(trainer, module)
        accountant.on_train_end(trainer, module)
        for callback in averaging:  # the restored mean of the iterates (post-processing), as at the end of training
            callback.apply(module)
    run_dir.register("dp-model.ckpt", "public: the DP model's Lightning checkpoint (weights and optimizer state "
                     "are functions of the noisy gradients only; the privacy ledger travels with them)")
    with atomic_path(out / "dp-model.ckpt") as tmp:
        trainer.save_checkpoint(str(tmp))
    run_dir.register(f"{PREDICTOR_DIR}/", "public: the DP model as a GluonTS predictor (dpts predict)")
    run_dir.register(MODEL_FILE, "public: the model's class, constructor arguments and window geometry")
    columns = None if config.data is None else {  # dpts predict reads new data with the run's column names
        "id_column": config.id_column, "timestamp_column": config.timestamp_column, "value_column": config.value_column}
    export_model(estimator, module, out, freq=freq, checkpoint="dp-model.ckpt", extra={"columns": columns})
    return int(trainer.global_step)


def _averaging(config: FitConfig) -> list[Any]:
    """The recipe model's tail averaging of the iterates (post-processing of the noisy iterates, no privacy cost;
    :class:`~lightning_dpts.training.IterateAveraging`), for the DP fit and its non-DP twin alike."""
    from lightning_dpts.recipe import averaging_callbacks

    return averaging_callbacks(config.model)


def make_logger(kind: str, private_dir: Path) -> Any:
    """The Lightning logger ``--logger`` names, writing under ``private_dir/logs`` (its package was checked by
    :meth:`FitConfig.validate`)."""
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(str(private_dir), name="logs")
    if kind == "mlflow":  # a SQLite store in private/logs (MLflow 3 refuses new file stores); artifacts beside it
        from lightning.pytorch.loggers import MLFlowLogger

        logs = (private_dir / "logs").resolve()
        logs.mkdir(parents=True, exist_ok=True)
        return MLFlowLogger(experiment_name="dpts", tracking_uri=f"sqlite:///{logs / 'mlflow.db'}",
                            artifact_location=(logs / "artifacts").as_uri())
    from lightning.pytorch.loggers import CSVLogger

    return CSVLogger(str(private_dir), name="logs")


def _forecast_test_windows(config: FitConfig, data: _Data, dm: Any, estimator: Any, module: Any, test_windows: int,
                           init_seed: int, entropy: Any, steps: int, progress: Callable[[str], None], season: int,
                           baseline_cache: Any) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                         list[dict[str, Any]], list[Any], Any]:
    """Forecasts of every model on the held-out test windows: (predictions by model, inputs, unclipped inputs,
    unclipped labels, the :class:`~lightning_dpts.baselines.Baselines` record). The DP model, the same model
    trained without DP for the same steps (``non_dp``), and the baselines from the unclipped histories;
    sample-based forecasts draw from stream 4 of the run's entropy. Each model's forecasts are a
    :class:`~lightning_dpts.evaluation.QuantileForecasts`, filled as the predictor yields them (issue 41)."""
    import lightning as L
    import torch

    from lightning_dpts.app.forecasters import make_estimator
    from lightning_dpts.app.scoring import baseline_forecasts, raw_evaluation
    from lightning_dpts.evaluation import QuantileForecasts

    pairs = dm.gluonts_test_pairs("test")
    inputs = [p[0] for p in pairs]
    raw_inputs, labels = raw_evaluation(dm, pairs, data.raw_table, data.freq) if config.clipping else (
        inputs, [np.asarray(p[1]["target"], dtype=float) for p in pairs])
    predictor = estimator.create_predictor(estimator.create_transformation(), module)
    eval_seed = _torch_seed(entropy, 4)  # sample-based forecasts (reproducible when seeded)
    torch.manual_seed(eval_seed)
    predictions: dict[str, Any] = {"dp": QuantileForecasts.collect(predictor.predict(inputs), len(inputs))}
    if config.non_dp and steps > 0:
        progress(f"training the same model without DP for the same {steps} steps ...")
        torch.manual_seed(init_seed)
        plain_estimator = make_estimator(config, data.freq)
        plain = plain_estimator.create_lightning_module()
        plain_trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                                  enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                                  callbacks=_averaging(config))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_SEEDED_WARNING)
            from lightning_dpts.app.geometry import build_datamodule

            plain_dm = build_datamodule(config, data.table, data.freq, plain, test_windows, data.relation)
        plain_trainer.fit(plain, datamodule=plain_dm)
        plain_predictor = plain_estimator.create_predictor(plain_estimator.create_transformation(), plain)
        torch.manual_seed(eval_seed)
        predictions["non_dp"] = QuantileForecasts.collect(plain_predictor.predict(inputs), len(inputs))
    forecasts, baselines = baseline_forecasts(raw_inputs, config.prediction_length, season,
                                              statsforecast=config.baselines, cache=baseline_cache, progress=progress,
                                              max_windows=config.baseline_windows)
    predictions.update(forecasts)
    return predictions, inputs, raw_inputs, labels, baselines

"""HeldOutEvaluation: at the end of a fit, score the model on the held-out windows against the honest yardstick.

**Its numbers are private.** They are computed from the private data (the held-out windows) without DP, so the
(epsilon, delta) guarantee does not cover them: they are for the data owner. The callback logs them to the
Trainer's loggers (keep those logs with the data, as ``dpts fit`` keeps its own under ``private/logs/``), prints
them with the verdict ``dpts fit`` prints, and, given ``output_dir``, writes them to
``output_dir/private/evaluation.json`` (:data:`~lightning_dpts.outputs.PRIVATE_DIR`; docs/privacy.md, "What a
run writes"). Scoring reuses :func:`lightning_dpts.evaluation.score_windows` (pooled CRPS = mean weighted quantile
loss over the quantiles 0.1-0.9, MASE scaled by the primary season, MAE of the median, 10-90% coverage) and
:func:`lightning_dpts.evaluation.verdict`. The yardstick (:mod:`lightning_dpts.baselines`): seasonal naive with
calibrated intervals, AutoETS and AutoTheta (statsforecast, when installed; ``baselines=False`` skips them) and,
with ``non_dp=True``, the non-DP twin. ``evaluation="last"`` scores only the last window of every series (its last
H points, the M4 protocol) instead of every rolling window.

With ``non_dp=True`` it also trains **the same model without DP** (a deep copy of the module taken at ``setup``,
before any step, trained on the same datamodule for the same number of optimizer steps, with a plain Trainer and
no DP callbacks) and scores it next to the private model and seasonal naive, as ``dpts fit`` does: the cost of
privacy, and whether the model itself (not the budget) is the limit. This doubles the training time; the non-DP
model is computed from the private data without DP, so its numbers and the model itself are private too (the
callback keeps only its scores).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np

from lightning_dpts.baselines import BASELINE_WINDOWS
from lightning_dpts.errors import ConfigurationError

__all__ = ["HeldOutEvaluation"]


def _score(forecasts: dict[str, list[np.ndarray]], labels: list[np.ndarray], histories: list[np.ndarray],
           index: list[int], season: int, subset: list[int] | None
           ) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]] | None]:
    """(metrics the models are compared by, metrics over every window or ``None``): with a baseline ``subset``
    every model is scored on its windows (the statsforecast lists hold those only), and the others also on all."""
    from lightning_dpts.baselines import STATSFORECAST_BASELINES
    from lightning_dpts.evaluation import score_windows, seasonal_errors

    scales = seasonal_errors(histories, season)
    if subset is None:
        return {k: score_windows(q, labels, histories, index, season, scales=scales)
                for k, q in forecasts.items()}, None
    every = {k: score_windows(q, labels, histories, index, season, scales=scales)
             for k, q in forecasts.items() if k not in STATSFORECAST_BASELINES}

    def pick(seq: list[Any]) -> list[Any]:
        return [seq[i] for i in subset]

    paired = {k: score_windows(q if k in STATSFORECAST_BASELINES else pick(q), pick(labels), pick(histories),
                               pick(index), season, scales=pick(list(scales)))
              for k, q in forecasts.items()}
    return paired, every


class HeldOutEvaluation(pl.Callback):
    """Score the trained model on the datamodule's held-out windows against the baselines (module docstring).

    Args:
        split: ``"test"`` (default) or ``"val"``: which held-out windows of the
            :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`.
        predictor: for GluonTS modules, ``module -> GluonTS Predictor`` (e.g.
            ``lambda m: estimator.create_predictor(estimator.create_transformation(), m)``). Not needed for a module
            with ``quantile_forecasts(histories)`` (:func:`~lightning_dpts.models.seasonal_residual`).
        season_length: m of seasonal naive, the baselines and MASE (default: the primary season of the
            datamodule's frequency, :func:`~lightning_dpts.data.seasonality.season_lengths`: daily 7, hourly 24,
            monthly 12, weekly 1); refused when not shorter than the shortest scored history.
        evaluation: ``"rolling"`` (default: every held-out window of the split) or ``"last"`` (only the last
            window of every series).
        baselines: also score AutoETS and AutoTheta (statsforecast; skipped, with a verdict line saying so, when
            it is not installed).
        baseline_windows: fit AutoETS and AutoTheta to at most this many held-out windows (``dpts fit
            --baseline-windows``; default :data:`~lightning_dpts.baselines.BASELINE_WINDOWS`; 0 or ``None``: all).
            Above it they are fitted to a fixed subsample (:func:`~lightning_dpts.baselines.baseline_subset`, a
            function of the window count only) on which every model is scored for the table and the verdict
            (paired); the other models' scores over every window are in ``report["metrics_all_windows"]``.
        output_dir: if given, write ``output_dir/private/evaluation.json`` (private: not covered by the guarantee).
        print_fn: where the comparison and the verdict go (``print``; ``None`` prints nothing).
        non_dp: also train and score the same model without DP (module docstring). List this callback **before**
            the ``DPForecastStrategy`` in ``callbacks`` so that its copy is taken before the strategy prepares the
            module (refused otherwise).
        non_dp_trainer_kwargs: extra ``lightning.Trainer`` arguments for the non-DP fit (e.g. ``accelerator``);
            ``max_steps``, ``logger``, checkpointing and progress bars are set by the callback.

    After the fit, :attr:`report` holds ``{"metrics": {"dp": ..., "seasonal_naive": ..., "autoets": ...,
    "autotheta": ..., "non_dp": ...}, "best_baseline": ..., "verdict": [...], ...}`` (``non_dp`` only with
    ``non_dp=True``; the statsforecast baselines only when they ran).
    """

    def __init__(self, split: str = "test", *, predictor: Callable[[Any], Any] | None = None,
                 season_length: int | None = None, output_dir: str | Path | None = None,
                 print_fn: Callable[[str], None] | None = print, non_dp: bool = False,
                 non_dp_trainer_kwargs: dict[str, Any] | None = None, evaluation: str = "rolling",
                 baselines: bool = True, baseline_windows: int | None = BASELINE_WINDOWS) -> None:
        from lightning_dpts.evaluation import PROTOCOLS

        if split not in ("test", "val"):
            raise ConfigurationError("split", split, "must be 'test' or 'val'")
        if evaluation not in PROTOCOLS:
            raise ConfigurationError("evaluation", evaluation, f"must be one of {', '.join(PROTOCOLS)}")
        if not isinstance(baselines, bool):
            raise ConfigurationError("baselines", baselines, "must be True or False")
        if baseline_windows is not None and (isinstance(baseline_windows, bool) or not isinstance(baseline_windows, int)
                                             or baseline_windows < 0):
            raise ConfigurationError("baseline_windows", baseline_windows, "must be an integer >= 0 (0 or None: all)")
        if season_length is not None and (isinstance(season_length, bool) or not isinstance(season_length, int)
                                          or season_length < 1):
            raise ConfigurationError("season_length", season_length, "must be an integer >= 1 (or None: from the "
                                     "frequency)")
        if not isinstance(non_dp, bool):
            raise ConfigurationError("non_dp", non_dp, "must be True or False")
        reserved = {"max_steps", "max_epochs", "callbacks", "logger"} & set(non_dp_trainer_kwargs or {})
        if reserved:
            raise ConfigurationError("non_dp_trainer_kwargs", sorted(reserved), "are set by HeldOutEvaluation")
        self.non_dp = non_dp
        self.non_dp_trainer_kwargs = dict(non_dp_trainer_kwargs or {})
        self._initial: Any = None
        self.split = split
        self.predictor = predictor
        self.season_length = season_length
        self.evaluation = evaluation
        self.baselines = baselines
        self.baseline_windows = baseline_windows
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.print_fn = print_fn
        self.report: dict[str, Any] | None = None
        self._chosen: list[int] = []

    def _model_quantiles(self, module: Any, dm: Any, windows: list[Any]) -> list[np.ndarray]:
        from lightning_dpts.evaluation import quantile_matrix

        if self.predictor is not None:
            entries = [entry for entry, _ in dm.gluonts_test_pairs(self.split)]
            entries = [entries[i] for i in self._chosen]
            return [quantile_matrix(f) for f in self.predictor(module).predict(entries)]
        if hasattr(module, "quantile_forecasts"):
            return module.quantile_forecasts([w.history for w in windows])
        raise ConfigurationError("predictor", None, f"{type(module).__name__} has no quantile_forecasts(histories): "
                                 "pass predictor=lambda m: estimator.create_predictor("
                                 "estimator.create_transformation(), m) for a GluonTS module")

    def _quantiles(self, module: Any, dm: Any, windows: list[Any]) -> list[np.ndarray]:
        was_training = module.training
        module.eval()
        try:
            return self._model_quantiles(module, dm, windows)
        finally:
            module.train(was_training)

    def evaluate(self, module: Any, dm: Any, strategy: Any = None, accountant: Any = None,
                 non_dp_module: Any = None) -> dict[str, Any]:
        """Score ``module`` (and ``non_dp_module``, if given) on ``dm``'s held-out windows against the baselines;
        returns (and keeps) the report."""
        from lightning_dpts.baselines import baseline_quantiles, best_baseline
        from lightning_dpts.data.seasonality import season_lengths
        from lightning_dpts.evaluation import check_season, protocol_windows, verdict

        windows = dm.evaluation_windows(self.split)
        if not windows:
            raise ConfigurationError(f"{self.split}_windows", 0, "must be >= 1 for HeldOutEvaluation")
        self._chosen = protocol_windows([w.window for w in windows], self.evaluation)
        windows = [windows[i] for i in self._chosen]
        seasons = season_lengths(dm.freq, self.season_length)
        season = seasons[0]
        histories = [np.asarray(w.history, dtype=float) for w in windows]
        check_season(season, min(len(h) for h in histories))
        model_q = self._quantiles(module, dm, windows)
        baselines = baseline_quantiles(histories, dm.prediction_length, season, statsforecast=self.baselines,
                                       max_windows=self.baseline_windows)
        labels = [np.asarray(w.target, dtype=float) for w in windows]
        index = [w.window for w in windows]
        forecasts = {"dp": model_q}
        if non_dp_module is not None:
            forecasts["non_dp"] = self._quantiles(non_dp_module, dm, windows)
        forecasts.update(baselines.forecasts)
        metrics, every = _score(forecasts, labels, histories, index, season, baselines.subset)
        spec = dm.sampling_spec
        report: dict[str, Any] = {
            "notice": "private: computed from the held-out windows of the private data without DP; the (epsilon, "
                      "delta) guarantee does not cover these numbers (keep them with the data owner)",
            "split": self.split, "protocol": self.evaluation, "forecasts": len(windows), "season_length": season,
            "season_lengths": list(seasons), "metrics": metrics,
            "baselines": {"run": list(baselines.forecasts), "skipped": baselines.skipped,
                          "fallbacks": dict(baselines.fallbacks),
                          "windows": len(windows) if baselines.subset is None else len(baselines.subset)},
            "best_baseline": {metric: None if b is None else {"model": b[0], "value": b[1]}
                              for metric in ("crps", "mase") for b in [best_baseline(metrics, metric)]},
            "privacy_configuration": {"sampling_spec": {
                "num_series": spec.num_series, "context_length": spec.context_length,
                "prediction_length": spec.prediction_length, "min_length": spec.min_length,
                "bottom_level_rate": spec.bottom_level_rate}},
        }
        if every is not None:
            report["metrics_all_windows"] = every
        if accountant is not None and getattr(accountant, "epsilon", None) is not None:
            report["epsilon_budget"] = accountant.epsilon
        if strategy is not None:
            try:
                report["noise_multiplier"] = strategy.noise_multiplier
            except Exception:  # sigma not calibrated (no fit): the levers then omit it
                pass
        # verdict() is dpts fit's: name this callback's arguments instead of the command's options
        names = {" (--no-non-dp)": " (non_dp=False)", "--no-baselines": "baselines=False",
                 "--model, --context-length, --season-length": "the model, its past window, season_length"}
        lines = verdict(report)
        for old, new in names.items():
            lines = [line.replace(old, new) for line in lines]
        report["verdict"] = lines
        self.report = report
        return report

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from lightning_dpts.training.strategy import DPForecastStrategy

        if stage != "fit":
            return
        self._check_season(trainer.datamodule)  # before any step: a season the windows cannot hold is refused now
        if not self.non_dp:
            return
        if any(isinstance(c, DPForecastStrategy) and c.surgery is not None for c in trainer.callbacks):
            raise ConfigurationError("callbacks", "HeldOutEvaluation after DPForecastStrategy",
                                     "list HeldOutEvaluation(non_dp=True) before the DPForecastStrategy: its copy of "
                                     "the initial model must be taken before the strategy prepares the module")
        self._initial = copy.deepcopy(pl_module)  # the initial weights, before any step

    def _check_season(self, dm: Any) -> None:
        """Refuse a season not shorter than the shortest history the evaluation will score (when ``dm`` has
        held-out windows; ``on_fit_end`` names a missing datamodule)."""
        from lightning_dpts.data.seasonality import season_lengths
        from lightning_dpts.evaluation import check_season

        if dm is None or not hasattr(dm, "evaluation_windows") or getattr(dm, "freq", None) is None:
            return
        windows = dm.evaluation_windows(self.split)
        if windows:
            check_season(season_lengths(dm.freq, self.season_length)[0], min(len(w.history) for w in windows))

    def _train_non_dp(self, trainer: pl.Trainer, dm: Any) -> Any:
        """Train the initial copy without DP for the DP run's number of optimizer steps; returns it."""
        import warnings

        module, self._initial = self._initial, None
        plain = pl.Trainer(**{"accelerator": "cpu", "enable_checkpointing": False, "enable_progress_bar": False,
                              "enable_model_summary": False, "limit_val_batches": 0, "num_sanity_val_steps": 0,
                              **self.non_dp_trainer_kwargs},
                           max_steps=trainer.global_step, max_epochs=-1, logger=False, callbacks=[])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain.fit(module, datamodule=dm)
        return module

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from lightning_dpts.training.accountant_callback import AccountantCallback
        from lightning_dpts.training.strategy import DPForecastStrategy

        if trainer.global_rank != 0:
            return
        dm = trainer.datamodule
        if dm is None or not hasattr(dm, "evaluation_windows"):
            raise ConfigurationError("datamodule", type(dm).__name__, "HeldOutEvaluation needs a "
                                     "StructuredSubsamplingDataModule (fit(model, datamodule=dm))")
        strategy = next((c for c in trainer.callbacks if isinstance(c, DPForecastStrategy)), None)
        accountant = next((c for c in trainer.callbacks if isinstance(c, AccountantCallback)), None)
        non_dp_module = self._train_non_dp(trainer, dm) if self.non_dp and self._initial is not None else None
        report = self.evaluate(pl_module, dm, strategy, accountant, non_dp_module)
        if non_dp_module is not None:
            report["non_dp_steps"] = trainer.global_step
        metrics = report["metrics"]
        logged = {f"heldout_{self.split}/{model}_{name}": value for model, m in metrics.items()
                  for name, value in m.items() if name in ("crps", "mae", "mase", "coverage")
                  and math.isfinite(value)}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=trainer.global_step)
            logger.save()
        if self.print_fn is not None:
            scores = ", ".join(f"{model} CRPS {m['crps']:.4f} MASE {m['mase']:.3f} MAE {m['mae']:.4g}"
                               for model, m in metrics.items())
            self.print_fn(f"held-out {self.split} windows ({report['forecasts']} forecasts, {self.evaluation}, season "
                          f"{report['season_length']}; private numbers, not covered by the guarantee): {scores}")
            for line in report["verdict"]:
                self.print_fn(line)
        if self.output_dir is not None:
            from lightning_dpts.outputs import PRIVATE_DIR, write_json

            (self.output_dir / PRIVATE_DIR).mkdir(parents=True, exist_ok=True)
            write_json(self.output_dir / PRIVATE_DIR / "evaluation.json", report)

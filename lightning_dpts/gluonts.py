"""A GluonTS-style entry point: ``PrivateEstimator(estimator, epsilon=..., delta=...).train(dataset)``.

GluonTS users train with ``estimator.train(dataset)`` and get a ``Predictor``. :class:`PrivateEstimator` keeps that
habit for differentially private training. It wraps a supported GluonTS torch estimator (DeepAR,
SimpleFeedForward, DLinear, PatchTST, or this package's Combination - the recommended one - and SeasonalLinear) and,
in :meth:`PrivateEstimator.train`:

1. reads the dataset's **public metadata** (series lengths and frequency, never a value) and the model's past
   window (context plus every lag), and applies the recipe of ``dpts fit``
   (:func:`~lightning_dpts.recipe.make_private_with_epsilon`): clipping norm C, batch size, epochs, the
   short-series threshold; the settings given to :class:`PrivateEstimator` win over the recipe;
2. trains the estimator's own LightningModule (``create_lightning_module()``) on a
   :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` (one window per sampled series, the scheme of
   Theorem 4.4 of Schuchardt et al., *Privacy Amplification by Structured Subsampling for Deep Differentially
   Private Time Series Forecasting*) with :class:`~lightning_dpts.training.DPForecastStrategy` (per-window
   clipping, Gaussian noise calibrated by the PLD accountant) and
   :class:`~lightning_dpts.training.AccountantCallback` (stops before the budget is spent);
3. returns the estimator's own GluonTS predictor (``create_predictor(create_transformation(), module)``) with the
   privacy report attached as ``predictor.privacy_report`` (:class:`PrivacyReportSummary`).

The whole dataset passed to ``train`` is training data (GluonTS' convention: split off your test windows first,
e.g. with ``gluonts.dataset.split.split``), so no window is held out inside. ``validation_data`` is accepted when
declared public (``validation_is_public=True``): its last window per series is scored after every epoch and the
weights of the epoch with the lowest validation loss are returned, as GluonTS does (a post-processing of the DP
training with public data); private validation data is refused (see :meth:`PrivateEstimator.train_model`).
Evaluate the predictor with GluonTS' own ``evaluate_model`` or ``make_evaluation_predictions`` and ``Evaluator``
(``examples/gluonts_estimator.py``, ``examples/gluonts_validation.py``).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from gluonts.model import Estimator

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation

__all__ = ["SUPPORTED_ESTIMATORS", "PrivacyReportSummary", "PrivateEstimator", "PrivateTrainOutput"]

#: The GluonTS torch estimators :class:`PrivateEstimator` wraps (module path, class name): their LightningModules
#: read only the fields the datamodule builds (targets, observed masks, time features, static features).
SUPPORTED_ESTIMATORS: tuple[tuple[str, str], ...] = (
    ("gluonts.torch.model.deepar", "DeepAREstimator"),
    ("gluonts.torch.model.simple_feedforward", "SimpleFeedForwardEstimator"),
    ("gluonts.torch.model.d_linear", "DLinearEstimator"),
    ("gluonts.torch.model.patch_tst", "PatchTSTEstimator"),
    ("lightning_dpts.models.combination", "CombinationEstimator"),
    ("lightning_dpts.models.seasonal_linear", "SeasonalLinearEstimator"),
)

#: Trainer arguments the recipe sets (give ``epochs=`` to :class:`PrivateEstimator` instead).
_RECIPE_TRAINER_KEYS = ("max_epochs", "max_steps", "min_epochs", "min_steps")
#: Trainer arguments of GluonTS' estimator defaults that DP training replaces: per-window clipping to C replaces
#: ``gradient_clip_val`` (GluonTS' estimators default to 10.0; DPForecastStrategy refuses a second clipping).
_REPLACED_TRAINER_KEYS = ("gradient_clip_val", "gradient_clip_algorithm")


@dataclass(frozen=True)
class PrivacyReportSummary:
    """What a :meth:`PrivateEstimator.train` run spent, and the settings it ran with.

    Attributes:
        epsilon: the epsilon spent by the steps taken (the accountant's sound upper bound), <= ``epsilon_budget``.
        delta: the delta of the guarantee.
        epsilon_budget: the epsilon the run was allowed (the ``epsilon`` given to :class:`PrivateEstimator`).
        steps: noisy optimizer steps taken (each accounted once).
        noise_multiplier: sigma, calibrated by the PLD accountant for (``epsilon_budget``, ``delta``) in the planned
            steps; the noise std on the summed clipped gradient is ``noise_multiplier * max_grad_norm``.
        max_grad_norm: C, the per-window clipping norm.
        batch_size: Lambda, windows per step (one window per sampled series).
        epochs: the epochs sigma was calibrated for.
        relation: the unit of privacy, e.g. ``"1-event"``: any one time step of one series (Definitions 3.5-3.7).
        theorem: the theorem of the accountant's bound.
        series: series trained on.
        series_left_out: series below the recipe's (or the given) short-series threshold, not trained on.
        seeded: ``True`` when a seed was given: the guarantee then does not hold against anyone who knows it.
        settings: every setting of the recipe by name (:attr:`lightning_dpts.recipe.PrivateTraining.settings`).
        reasons: one sentence per setting (``"given"`` for an explicit one).
        risk: the membership-attack read-outs next to epsilon for the unit of privacy (TPR at FPR 1e-3/1e-2, mu-GDP;
            :mod:`lightning_dpts.privacy.risk`).
        validation: ``"none"``, or what the public validation data chose (series, the epoch returned).
    """

    epsilon: float
    delta: float
    epsilon_budget: float
    steps: int
    noise_multiplier: float
    max_grad_norm: float
    batch_size: int
    epochs: int
    relation: str
    theorem: str
    series: int
    series_left_out: int
    seeded: bool
    settings: dict[str, Any] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    risk: dict[str, Any] = field(default_factory=dict)
    validation: str = "none"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dictionary."""
        return json.loads(json.dumps(asdict(self), default=str))

    def __str__(self) -> str:
        seeded = " (seeded: for experiments only)" if self.seeded else ""
        return (f"({self.epsilon:.4g}, {self.delta:g})-DP for the {self.relation} relation after {self.steps} "
                f"steps (budget epsilon {self.epsilon_budget:g}; sigma {self.noise_multiplier:.4g}, "
                f"C {self.max_grad_norm:g}, "
                f"batch size {self.batch_size}, {self.epochs} epochs; {self.series} series, {self.series_left_out} "
                f"left out; {self.theorem}){seeded}")


class PrivateTrainOutput(NamedTuple):
    """What :meth:`PrivateEstimator.train_model` returns: GluonTS' ``TrainOutput`` fields plus the privacy report."""

    transformation: Any
    trained_net: Any
    trainer: Any
    predictor: Any
    privacy_report: PrivacyReportSummary


def _supported(estimator: Any) -> bool:
    import importlib

    for module, name in SUPPORTED_ESTIMATORS:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # an estimator this GluonTS version does not have
            continue
        if type(estimator) is cls:
            return True
    return False


def _same_freq(a: str, b: str) -> bool:
    import pandas as pd

    from lightning_dpts.data.seasonality import pandas_alias_notices_hidden

    with pandas_alias_notices_hidden():
        return pd.Period("2000-01-01", freq=a).freqstr == pd.Period("2000-01-01", freq=b).freqstr


class PrivateEstimator(Estimator):
    """A GluonTS estimator trained with differential privacy: ``PrivateEstimator(est, epsilon=1, delta=1e-7)``.

    A ``gluonts.model.Estimator``: ``train(training_data)`` returns a ``Predictor``.

    Args:
        estimator: a GluonTS torch estimator of :data:`SUPPORTED_ESTIMATORS`, configured as usual (its
            ``prediction_length``, ``context_length``, lags and learning rate are used; its ``batch_size`` and its
            Trainer's ``max_epochs`` are not: the recipe chooses them, or give ``batch_size=``/``epochs=`` here).
            Other entries of its ``trainer_kwargs`` (e.g. ``accelerator``, ``callbacks``) are kept, except
            ``gradient_clip_val`` (GluonTS' default 10.0): per-window clipping to C replaces it.
        epsilon: the budget epsilon > 0.
        delta: the budget delta in (0, 1).
        relation: the unit of privacy (default: one time step of one series, ``NeighbouringRelation()``).
        batch_size, epochs, max_grad_norm, min_series_length: explicit settings; they win over the recipe
            (:func:`~lightning_dpts.recipe.make_private_with_epsilon`). ``min_series_length=1`` keeps every series.
        seed: ``None`` (default): sampling and noise from secret operating-system entropy. An integer makes
            them a public function of it (experiments only: the guarantee does not hold against anyone who knows
            it).
        secure_mode: draw every step's sampling and noise from fresh CSPRNG bits (needs ``seed=None``).
        trainer_kwargs: Lightning ``Trainer`` arguments that win over the estimator's (default here: no logger,
            no checkpoints, no model summary, ``accelerator="auto"``: a logger would record the training loss, a
            statistic of the private data without DP). ``max_epochs``/``max_steps``/``min_*`` are refused (the
            epochs are part of the privacy calibration: use ``epochs=``).

    Raises:
        ConfigurationError: an unsupported estimator (naming the supported ones), a ``lead_time`` other than 0,
            a bad budget or setting; all before any work is done.
    """

    def __init__(
        self,
        estimator: Any,
        *,
        epsilon: float,
        delta: float,
        relation: NeighbouringRelation | None = None,
        batch_size: int | None = None,
        epochs: int | None = None,
        max_grad_norm: float | None = None,
        min_series_length: int | None = None,
        seed: int | None = None,
        secure_mode: bool = False,
        trainer_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not _supported(estimator):
            names = ", ".join(name for _, name in SUPPORTED_ESTIMATORS)
            raise ConfigurationError(
                "estimator", type(estimator).__name__,
                f"is not supported: PrivateEstimator wraps {names}, whose LightningModules read only targets, "
                "observed masks, time and static features (what StructuredSubsamplingDataModule builds); for "
                "another model use the datamodule, DPForecastStrategy and AccountantCallback in your own Trainer "
                "(docs/your-own-trainer.md)")
        if getattr(estimator, "lead_time", 0) != 0:
            raise ConfigurationError("estimator.lead_time", estimator.lead_time, "must be 0 (the datamodule's "
                                     "windows start the forecast right after the context)")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < float("inf"):
            raise ConfigurationError("epsilon", epsilon, "must be a finite number > 0")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
        if relation is not None and not isinstance(relation, NeighbouringRelation):
            raise ConfigurationError("relation", type(relation).__name__, "must be a NeighbouringRelation or None")
        for name, value in (("batch_size", batch_size), ("epochs", epochs), ("min_series_length", min_series_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigurationError(name, value, "must be an integer >= 1, or None (the recipe's)")
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                          or not 0 < max_grad_norm < float("inf")):
            raise ConfigurationError("max_grad_norm", max_grad_norm, "must be a finite number > 0, or None")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigurationError("seed", seed, "must be None (secret OS entropy) or an integer >= 0")
        if not isinstance(secure_mode, bool) or (secure_mode and seed is not None):
            raise ConfigurationError("secure_mode", secure_mode, "must be True or False, and True needs seed=None")
        trainer_kwargs = dict(trainer_kwargs or {})
        for key in _RECIPE_TRAINER_KEYS:
            if key in trainer_kwargs:
                raise ConfigurationError(f"trainer_kwargs[{key!r}]", trainer_kwargs[key],
                                         "is set by the privacy calibration: give epochs= to PrivateEstimator")
        if "strategy" in trainer_kwargs:
            raise ConfigurationError("trainer_kwargs['strategy']", trainer_kwargs["strategy"],
                                     "is not accepted: PrivateEstimator adds DPForecastStrategy as a callback")
        super().__init__(lead_time=0)
        self.estimator = estimator
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.relation = relation or NeighbouringRelation()
        self.batch_size = batch_size
        self.epochs = epochs
        self.max_grad_norm = max_grad_norm
        self.min_series_length = min_series_length
        self.seed = seed
        self.secure_mode = secure_mode
        self.trainer_kwargs = trainer_kwargs

    @property
    def prediction_length(self) -> int:
        """H, the wrapped estimator's horizon."""
        return int(self.estimator.prediction_length)

    def _trainer_arguments(self) -> tuple[dict[str, Any], list[Any]]:
        """(Trainer arguments without callbacks, the user's callbacks)."""
        base = {k: v for k, v in dict(getattr(self.estimator, "trainer_kwargs", {}) or {}).items()
                if k not in _RECIPE_TRAINER_KEYS + _REPLACED_TRAINER_KEYS}
        merged = {"accelerator": "auto", "logger": False, "enable_checkpointing": False,
                  "enable_model_summary": False, **base, **self.trainer_kwargs}
        callbacks = list(merged.pop("callbacks", None) or [])
        return merged, callbacks

    def train_model(self, training_data: Any, validation_data: Any = None, *, validation_is_public: bool = False,
                    **kwargs: Any) -> PrivateTrainOutput:
        """Train privately on ``training_data`` (a GluonTS dataset: an iterable of entries with ``target`` and
        ``start``); return GluonTS' ``TrainOutput`` fields and the privacy report (:class:`PrivateTrainOutput`).

        Args:
            validation_data: series to validate on, as GluonTS' ``Estimator.train`` takes them; only with
                ``validation_is_public=True``. Their last ``prediction_length`` steps are forecast from the steps
                before them after every epoch, and the weights of the epoch with the lowest ``val_loss`` are returned
                (kept in memory, never written). The guarantee covers ``training_data``; choosing among the DP
                model's epochs with public data is post-processing, so epsilon is unchanged.
            validation_is_public: the deliberate declaration that ``validation_data`` holds no private data (e.g.
                published series of the same kind, or a public benchmark); nothing in it is protected.

        Raises:
            ConfigurationError: ``validation_data`` not declared public. Private validation is refused rather than
                paid for: GluonTS uses it to pick the epoch with the lowest validation loss, and a DP version
                (noisy losses of every epoch, composed with the training) would take budget from the training noise
                for a choice we have not measured to beat the last epoch; its sensitivity also grows with the
                validation windows that share one protected event. Also: unknown keyword arguments, a dataset whose
                frequency differs from the estimator's ``freq``, and whatever the recipe or the datamodule refuse.
        """
        import lightning as L

        from lightning_dpts.data import StructuredSubsamplingDataModule
        from lightning_dpts.data.sources import to_collection
        from lightning_dpts.recipe import make_private_with_epsilon

        if not isinstance(validation_is_public, bool):
            raise ConfigurationError("validation_is_public", validation_is_public, "must be True or False")
        if validation_data is not None and not validation_is_public:
            raise ConfigurationError(
                "validation_data", type(validation_data).__name__,
                "is private unless declared public: pass validation_is_public=True only for series that hold no "
                "private data. Private validation is refused, not paid for: a validation loss on private windows, "
                "and the epoch chosen by it, are releases outside the guarantee, and a DP version would take budget "
                "from the training for a choice not shown to beat the last epoch; evaluate the returned predictor on "
                "your held-out data instead (a private number, for you)")
        if validation_is_public and validation_data is None:
            raise ConfigurationError("validation_is_public", True, "declares validation_data public: give it too")
        if kwargs:
            raise ConfigurationError(", ".join(sorted(kwargs)), "given", "is not supported by PrivateEstimator.train "
                                     "(GluonTS' shuffle_buffer_length, cache_data and ckpt_path do not apply)")
        entries = [dict(entry) for entry in training_data]
        collection = to_collection(entries)  # refuses text, infinities, mixed frequencies, empty data
        freq = collection.freq
        if freq is None:
            raise ConfigurationError("training_data", "entries without a pandas.Period 'start'",
                                     "must carry 'start' time stamps (their frequency sets the time features)")
        own = getattr(self.estimator, "freq", None)
        if own is not None and not _same_freq(str(own), freq):
            raise ConfigurationError("training_data", f"frequency {freq!r}", f"must match the estimator's "
                                     f"freq={own!r} (its predictor builds time features for that frequency)")
        module = self.estimator.create_lightning_module()
        lengths = [len(t) for t in collection.targets]  # public metadata: lengths only
        plan = make_private_with_epsilon(
            lengths, module, epsilon=self.epsilon, delta=self.delta, freq=freq,
            prediction_length=self.prediction_length, held_out_windows=0, level=self.relation.level,
            size=self.relation.size, batch_size=self.batch_size, epochs=self.epochs,
            max_grad_norm=self.max_grad_norm, min_series_length=self.min_series_length, seed=self.seed,
            secure_mode=self.secure_mode)
        for text in plan.warnings:
            warnings.warn(f"PrivateEstimator: {text}", UserWarning, stacklevel=2)
        keep = plan.keep(lengths)
        kept = [entry for entry, k in zip(entries, keep.tolist(), strict=True) if k]
        dm = StructuredSubsamplingDataModule(
            kept, model=module, freq=freq, relation=self.relation, seed=self.seed, secure_mode=self.secure_mode,
            test_windows=0, val_windows=0, batch_size=plan.settings["batch_size"])
        arguments, callbacks = self._trainer_arguments()
        best = None
        if validation_data is not None:
            public = self._public_windows(validation_data, module, freq, plan.settings["batch_size"])
            dm.val_dataloader = public.val_dataloader  # type: ignore[method-assign]  (public windows only)
            from lightning_dpts.training.public_validation import BestPublicEpoch

            best = BestPublicEpoch(public.num_series)
            callbacks = [*callbacks, best]
            arguments.setdefault("num_sanity_val_steps", 0)
        trainer = L.Trainer(**arguments, max_epochs=plan.settings["epochs"],
                            callbacks=[plan.strategy, plan.accountant, *plan.averaging, *callbacks])
        trainer.fit(module, datamodule=dm)
        spent = plan.accountant.report
        report = PrivacyReportSummary(
            epsilon=float(spent.epsilon), delta=float(spent.delta), epsilon_budget=self.epsilon,
            steps=int(spent.steps), noise_multiplier=float(plan.strategy.noise_multiplier),
            max_grad_norm=float(plan.settings["max_grad_norm"]), batch_size=int(plan.settings["batch_size"]),
            epochs=int(plan.settings["epochs"]), relation=f"{self.relation.size}-{self.relation.level}",
            theorem=str(spent.theorem),
            series=dm.num_series, series_left_out=len(entries) - len(kept), seeded=self.seed is not None,
            settings=dict(plan.settings), reasons=dict(plan.reasons),
            risk={} if spent.risk is None else spent.risk.to_dict(),
            validation="none" if best is None else best.describe())
        transformation = self.estimator.create_transformation()
        predictor = self.estimator.create_predictor(transformation, module)
        predictor.privacy_report = report
        return PrivateTrainOutput(transformation=transformation, trained_net=module, trainer=trainer,
                                  predictor=predictor, privacy_report=report)

    def _public_windows(self, validation_data: Any, module: Any, freq: str, batch_size: int) -> Any:
        """A datamodule over the public validation series whose ``val_dataloader`` yields each one's last window
        (its sampler is never used: nothing is trained on these series)."""
        from lightning_dpts.data import StructuredSubsamplingDataModule
        from lightning_dpts.data.sources import to_collection

        entries = [dict(entry) for entry in validation_data]
        collection = to_collection(entries)
        if collection.freq is not None and not _same_freq(collection.freq, freq):
            raise ConfigurationError("validation_data", f"frequency {collection.freq!r}",
                                     f"must match the training data's {freq!r}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the sampling notices concern private training, not these series
                return StructuredSubsamplingDataModule(
                    entries, model=module, freq=freq, test_windows=0, val_windows=1,
                    batch_size=min(batch_size, len(entries)))
        except ConfigurationError as err:
            raise ConfigurationError("validation_data", f"{len(entries)} series",
                                     f"cannot be validated on: {err}") from None

    def train(self, training_data: Any, validation_data: Any = None, *, validation_is_public: bool = False,
              **kwargs: Any) -> Any:
        """GluonTS' ``Estimator.train``: the trained predictor, with the report as ``predictor.privacy_report``
        (``validation_data`` only with ``validation_is_public=True``; :meth:`train_model`)."""
        return self.train_model(training_data, validation_data, validation_is_public=validation_is_public,
                                **kwargs).predictor

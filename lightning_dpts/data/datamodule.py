"""``StructuredSubsamplingDataModule``: bi-level batches that are exactly what the accountant assumes."""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
from torch import nn
from torch.utils.data import DataLoader

from lightning_dpts.data.features import dynamic_feature_stack, num_time_features
from lightning_dpts.data.model_checks import lag_amplification_warning
from lightning_dpts.data.sampler import (
    EpochDataLoader,
    FixedWindows,
    StructuredSampler,
    WindowStore,
    check_float32_range,
)
from lightning_dpts.data.sources import BUNDLED_DATASETS, SeriesCollection, to_collection
from lightning_dpts.data.store import SeriesStore, StoreWindows, is_store_path
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import BottomLevelScheme, TopLevelScheme
from lightning_dpts.privacy.spec import NeighbouringRelation, SamplingSpec
from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy

__all__ = ["EvaluationWindow", "StructuredSubsamplingDataModule", "too_short"]

_TARGET_KEYS = ("past_target", "past_observed_values", "future_target", "future_observed_values")
_PRODUCIBLE = set(_TARGET_KEYS) | {
    "past_time_feat",
    "future_time_feat",
    "feat_static_cat",
    "feat_static_real",
}


@dataclass(frozen=True)
class EvaluationWindow:
    """One forecast to score: the history before the forecast start and the ground truth after it.

    Attributes:
        item_id: the series' identifier.
        series_index: position of the series in the datamodule (after dropping short series).
        window: 0-based index of the rolling window within its split (0 = earliest).
        start: first time stamp of the series, or ``None`` when the input had no time stamps.
        forecast_start: first time stamp of the forecast, or ``None``.
        history: every value before the forecast start, ``[t]`` (univariate) or ``[t, D]``; NaN = missing.
        target: the ``prediction_length`` true values, ``[L_F]`` or ``[L_F, D]``.
    """

    item_id: str
    series_index: int
    window: int
    start: pd.Period | None
    forecast_start: pd.Period | None
    history: np.ndarray
    target: np.ndarray


def too_short(lengths: Any, prediction_length: int, held_out_windows: int) -> np.ndarray:
    """Which series are too short to train on: a boolean mask over ``lengths`` (time steps, public metadata).

    A series is too short when its training part, what is left after the ``held_out_windows`` windows of
    ``prediction_length`` steps held out at its end (test and validation windows), is shorter than
    ``prediction_length``: no training window fits in it. The one rule that
    :class:`StructuredSubsamplingDataModule` refuses (or drops, ``drop_short_series=True``) by, and that the recipe's
    :meth:`~lightning_dpts.recipe.PrivateTraining.keep` leaves out by (issue 38: they disagreed).
    """
    sizes = np.asarray([int(n) for n in lengths], dtype=np.int64)
    return sizes - int(held_out_windows) * int(prediction_length) < int(prediction_length)


def _require_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigurationError(name, value, f"must be an integer >= {minimum}")
    return int(value)


class StructuredSubsamplingDataModule(L.LightningDataModule):
    """A LightningDataModule whose training batches are bi-level structured subsampling.

    Training batches follow Algorithm 1 of *Privacy Amplification by Structured Subsampling for Deep
    Differentially Private Time Series Forecasting* with the top-level schemes of Algorithms 3/5 (plus
    shuffling and Poisson), the bottom-level schemes of Algorithms 4/6 and the noise augmentation of Eq. (1);
    see :class:`~lightning_dpts.data.sampler.StructuredSampler`. :attr:`sampling_spec` describes exactly
    that sampling to :mod:`lightning_dpts.privacy`, so no parameter is typed twice.

    Splits (per series, by time): the last ``test_windows * prediction_length`` steps are test windows, the
    ``val_windows * prediction_length`` steps before them validation windows, the rest is the training
    part. Only the training part is sampled privately; validation and test windows read their history from
    the whole series before them.

    Args:
        data: a GluonTS dataset, a list of numpy arrays (``[T]`` or ``[T, D]``), a long-format DataFrame,
            a bundled dataset name (``"us_employment"``; see :mod:`lightning_dpts.data.sources`) or the path of a
            long-format CSV/Parquet file, read as ``dpts fit`` reads it with the three column names below. (Typed
            ``str | os.PathLike | Iterable``: DataFrames, arrays and datasets are iterables; naming the pandas and
            numpy classes in the annotation would make LightningCLI's parser read a file path as a class config.)
        context_length: L_C without lags, in time steps. Taken from ``model`` when omitted.
        prediction_length: L_F, in time steps. Taken from ``model`` when omitted.
        batch_size: Lambda, windows per batch (expected number for Poisson schemes).
        instances_per_series: lambda, windows per sampled series (expected for bottom-level Poisson).
        top_level: a top-level object of :mod:`lightning_dpts.privacy.mechanisms` (e.g. ``WithoutReplacement()``,
            ``BMinSep(bands=4)``, which also sets ``bands``) or its name: ``"iteration"``, ``"shuffling"``,
            ``"without_replacement"``, ``"poisson"`` or ``"b_min_sep"``
            (b-min-sep over series, warm start, Dong & Ganesh 2026 Algorithm 2: each step, every series that did not
            take part in the last ``bands - 1`` steps is included with the probability p = p0 / (1 - p0 (b - 1))
            that makes the expected fraction p0 = N'/N; for BandMF noise; accounted by the Monte Carlo accountant), or
            ``"cyclic_poisson"`` (``bands`` = k groups, series i in group i mod k, group t mod k eligible at step t,
            each eligible series with probability N' k / N; for BandMF noise with at most k bands, accounted exactly by
            the PLD accountant, docs/bandmf.md).
        bottom_level: a bottom-level object (``WithReplacement()``, ``PoissonBottomLevel()``) or its name,
            ``"with_replacement"`` or ``"poisson"``.
        bands: b >= 1, the minimum separation of ``top_level="b_min_sep"`` (use the strategy's ``bands``) or the
            number of groups k >= the strategy's bands of ``top_level="cyclic_poisson"``; 1 for every other top level.
        relation: the neighbouring relation; needs a ``value_bound`` when noise augmentation is on.
        context_noise: sigma_C >= 0, past-window noise std in units of ``relation.value_bound`` (Eq. 1).
        forecast_noise: sigma_F >= 0, future-window noise std in units of ``relation.value_bound`` (Eq. 1).
        seed: ``None`` (default): the sampling and augmentation randomness comes from fresh, secret
            operating-system entropy (docs/privacy.md, rule 7; the reported epsilon assumes the batches are
            secret). An integer >= 0 makes the batches a public function of it - for experiments and tests
            only: a warning with :data:`~lightning_dpts.randomness.SEEDED_NOTICE` is issued, and the guarantee
            does not hold against anyone who knows the seed. The seed is never written to a checkpoint.
        secure_mode: draw every training step's sampling from 128 fresh bits of the operating system's CSPRNG
            (see :class:`~lightning_dpts.data.sampler.StructuredSampler`); needs ``seed=None``.
        model: optional GluonTS torch LightningModule (or its ``.model``). Its ``describe_inputs()`` decides
            the batch fields and shapes; its past length (DeepAR: ``context_length + max(lags_seq)``) becomes
            ``past_length``. With LightningCLI, link it from the model (``examples/lightning_cli.py``).
        past_length: P, the past window actually gathered: ``context_length`` plus every lag the model
            reads (docs/privacy.md, rule 3). Defaults to the model's past length or ``context_length``.
        freq: pandas frequency string, needed for time features when the input has no time stamps.
        test_windows: number of rolling test windows of ``prediction_length`` steps at the end (>= 0).
        val_windows: number of validation windows before the test windows (>= 0). Default 0: validation
            losses on private windows are released information outside the guarantee (trap 5).
        drop_short_series: drop series whose training part is shorter than ``prediction_length`` (with a
            warning stating how many) instead of raising.
        eval_batch_size: windows per validation/test batch (defaults to ``batch_size``).
        num_workers: DataLoader workers for training batches (batches are identical for any value).
        id_column, timestamp_column, value_column: column names for long-format DataFrames.
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | Iterable[Any],
        *,
        context_length: int | None = None,
        prediction_length: int | None = None,
        batch_size: int,
        instances_per_series: int = 1,
        top_level: str | TopLevelScheme = "without_replacement",
        bottom_level: str | BottomLevelScheme = "with_replacement",
        bands: int = 1,
        relation: NeighbouringRelation | None = None,
        context_noise: float = 0.0,
        forecast_noise: float = 0.0,
        seed: int | None = None,
        secure_mode: bool = False,
        model: L.LightningModule | nn.Module | None = None,
        past_length: int | None = None,
        freq: str | None = None,
        test_windows: int = 1,
        val_windows: int = 0,
        drop_short_series: bool = False,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        id_column: str = "item_id",
        timestamp_column: str = "timestamp",
        value_column: str | Sequence[str] = "target",
    ) -> None:
        super().__init__()
        self._entropy = resolve_entropy(seed, "seed")
        if not isinstance(secure_mode, bool):
            raise ConfigurationError("secure_mode", secure_mode, "must be True or False")
        if self._entropy.seeded:
            warnings.warn(f"StructuredSubsamplingDataModule: {SEEDED_NOTICE}", UserWarning, stacklevel=2)
        self.test_windows = _require_int("test_windows", test_windows, 0)
        self.val_windows = _require_int("val_windows", val_windows, 0)
        self.num_workers = _require_int("num_workers", num_workers, 0)
        relation = NeighbouringRelation() if relation is None else relation

        inputs, model_past, model_context, model_prediction = self._inspect_model(model)
        if prediction_length is None:
            prediction_length = model_prediction
        if prediction_length is None:
            raise ConfigurationError("prediction_length", None, "give it, or a model that knows it")
        self.prediction_length = _require_int("prediction_length", prediction_length, 1)
        if model_prediction is not None and model_prediction != self.prediction_length:
            raise ConfigurationError(
                "prediction_length",
                prediction_length,
                f"must match the model's prediction_length={model_prediction}",
            )
        if context_length is None:
            context_length = model_context
        if context_length is None:
            raise ConfigurationError("context_length", None, "give it, or a model that knows it")
        self.context_length = _require_int("context_length", context_length, 1)
        if model_context is not None and model_context != self.context_length:
            raise ConfigurationError(
                "context_length", context_length, f"must match the model's context_length={model_context}"
            )
        if past_length is None:
            past_length = model_past if model_past is not None else self.context_length
        self.past_length = _require_int("past_length", past_length, self.context_length)
        if model_past is not None and model_past != self.past_length:
            raise ConfigurationError(
                "past_length", past_length, f"must match the past length the model reads ({model_past})"
            )
        self.batch_size = _require_int("batch_size", batch_size, 1)
        self.eval_batch_size = _require_int(
            "eval_batch_size", self.batch_size if eval_batch_size is None else eval_batch_size, 1
        )

        # --- data, splits -----------------------------------------------------------------------------
        collection: SeriesCollection | SeriesStore
        if isinstance(data, SeriesStore) or is_store_path(data):
            collection = self._open_store(data, freq)  # type: ignore[arg-type]
        else:
            if isinstance(data, (str, os.PathLike)) and str(data) not in BUNDLED_DATASETS:
                data, freq = self._read_file(data, freq, id_column, timestamp_column, value_column)
                id_column, timestamp_column, value_column = "item_id", "timestamp", "target"
            collection = to_collection(
                data, freq=freq, id_column=id_column, timestamp_column=timestamp_column, value_column=value_column
            )
        self.dropped_series: list[str] = []
        collection = self._drop_short(collection, drop_short_series)
        self.collection = collection
        self.freq = collection.freq
        held_out = (self.test_windows + self.val_windows) * self.prediction_length
        self.train_lengths = _series_lengths(collection) - held_out

        # --- the sampling description (validates Lambda, lambda, N, modes, noise, relation) -------------
        self._spec = SamplingSpec(
            num_series=collection.num_series,
            min_length=int(self.train_lengths.min()),
            lengths=tuple(int(n) for n in np.unique(self.train_lengths)),
            context_length=self.past_length,
            prediction_length=self.prediction_length,
            batch_size=self.batch_size,
            instances_per_series=_require_int("instances_per_series", instances_per_series, 1),
            top_level=top_level,  # type: ignore[arg-type]
            bottom_level=bottom_level,  # type: ignore[arg-type]
            relation=relation,
            context_noise=context_noise,
            forecast_noise=forecast_noise,
            bands=bands,
        )

        lag_cost = lag_amplification_warning(self._spec, self.context_length)
        if lag_cost is not None:
            warnings.warn(f"StructuredSubsamplingDataModule: {lag_cost}; cap the model's lags (GluonTS lags_seq, or "
                          "dpts fit --max-lag), e.g. to the seasonal period", UserWarning, stacklevel=2)

        # --- batch fields and features ------------------------------------------------------------------
        self.keys, self._feature_kind, static_cat_width, static_real_width = self._plan_fields(inputs, collection)
        self.static_cat = self._static(collection.feat_static_cat, static_cat_width, np.int64, "feat_static_cat")
        self.static_real = self._static(collection.feat_static_real, static_real_width, np.float32, "feat_static_real")
        self._full_store: WindowStore | StoreWindows
        self._train_store: WindowStore | StoreWindows
        if isinstance(collection, SeriesStore):
            # windows by index arithmetic over the mapped values: no copy of any series (issue 41)
            kind = "gluonts" if self._feature_kind == "gluonts" else "none"
            self._full_store = StoreWindows(collection, collection.lengths, self.past_length, self.prediction_length,
                                            kind)
            self._train_store = StoreWindows(collection, self.train_lengths, self.past_length,
                                             self.prediction_length, kind)
        else:
            dynamic = self._dynamic_features(collection)
            self._full_store = WindowStore(
                collection.targets, self.past_length, self.prediction_length, dynamic, names=collection.item_ids
            )
            self._train_store = WindowStore(
                [t[:n] for t, n in zip(collection.targets, self.train_lengths, strict=True)],
                self.past_length,
                self.prediction_length,
                None if dynamic is None else [d[:n] for d, n in zip(dynamic, self.train_lengths, strict=True)],
                names=collection.item_ids,
            )
        self._check_time_feat_width(inputs)
        # With no validation (test) windows, present val_dataloader (test_dataloader) as not overridden so
        # that Lightning has no validation loop (GluonTS modules then monitor train_loss, not val_loss).
        if self.val_windows == 0:
            self.val_dataloader = types.MethodType(L.LightningDataModule.val_dataloader, self)  # type: ignore
        if self.test_windows == 0:
            self.test_dataloader = types.MethodType(L.LightningDataModule.test_dataloader, self)  # type: ignore
        self._sampler = StructuredSampler(
            self._train_store,
            self._spec,
            self.keys,
            self._entropy,
            static_cat=self.static_cat,
            static_real=self.static_real,
            univariate=collection.univariate,
            secure_mode=secure_mode,
        )

    # ------------------------------------------------------------------------------------------------------
    # Construction helpers
    # ------------------------------------------------------------------------------------------------------
    @staticmethod
    def _open_store(data: SeriesStore | str | os.PathLike[str], freq: str | None) -> SeriesStore:
        """The memory-mapped store ``data`` (:mod:`lightning_dpts.data.store`); ``freq``, if given, must be its own."""
        store = data if isinstance(data, SeriesStore) else SeriesStore(data)
        if freq is not None:
            from lightning_dpts.data.sources import period_freq

            if store.freq is None or period_freq(freq) != store.freq:
                raise ConfigurationError("freq", freq, f"the series store {str(store.path)!r} has freq={store.freq!r}; "
                                         "omit freq or rewrite the store")
        return store

    @staticmethod
    def _read_file(path: str | os.PathLike[str], freq: str | None, id_column: str, timestamp_column: str,
                   value_column: str | Sequence[str]) -> tuple[pd.DataFrame, str]:
        """A long-format CSV/Parquet file as ``dpts fit`` reads it
        (:func:`~lightning_dpts.data.loading.load_long_table`)."""
        from lightning_dpts.data.loading import load_long_table

        if not os.path.isfile(path):
            raise ConfigurationError("data", str(path), "is neither a bundled dataset name "
                                     f"({', '.join(sorted(BUNDLED_DATASETS))}) nor an existing CSV/Parquet file")
        if not isinstance(value_column, str):
            raise ConfigurationError("value_column", value_column, "must be one column name when data is a file")
        return load_long_table(path, id_column, timestamp_column, value_column, freq)

    @staticmethod
    def _inspect_model(
        model: Any,
    ) -> tuple[dict[str, tuple[int, ...]] | None, int | None, int | None, int | None]:
        """(input name -> shape for batch size 1, past length, context length, prediction length)."""
        if model is None:
            return None, None, None, None
        inner = getattr(model, "model", model)
        if not hasattr(inner, "describe_inputs"):
            raise ConfigurationError(
                "model",
                type(model).__name__,
                "must be a GluonTS torch model/LightningModule with describe_inputs()",
            )
        spec = inner.describe_inputs(1)
        inputs = {name: tuple(int(s) for s in spec[name].shape) for name in spec}
        past = inputs["past_target"][1] if "past_target" in inputs else None
        context = getattr(inner, "context_length", None)
        prediction = getattr(inner, "prediction_length", None)
        return inputs, past, context, prediction

    def _drop_short(self, collection: SeriesCollection, drop: bool) -> SeriesCollection:
        held_out = (self.test_windows + self.val_windows) * self.prediction_length
        lengths = _series_lengths(collection)
        mask = too_short(lengths, self.prediction_length, self.test_windows + self.val_windows)
        short = [int(i) for i in np.flatnonzero(mask)]
        if not short:
            return collection
        if not drop:
            item = collection.item_ids[short[0]]
            raise ConfigurationError(
                "data",
                f"series {item!r} of length {int(lengths[short[0]])}",
                f"its training part (length - {held_out} held-out steps) must have >= prediction_length="
                f"{self.prediction_length} steps; {len(short)} series are too short. Pass "
                "drop_short_series=True to drop them",
            )
        self.dropped_series = [collection.item_ids[i] for i in short]
        dropped = set(short)  # built once: the membership test inside the loop made this quadratic
        keep = [i for i in range(collection.num_series) if i not in dropped]
        if not keep:
            raise ConfigurationError("data", f"{len(short)} series", "all series are too short; none is left")
        warnings.warn(
            f"dropped {len(short)} of {collection.num_series} series whose training part is shorter than "
            f"prediction_length={self.prediction_length}",
            UserWarning,
            stacklevel=3,
        )
        return collection.subset(keep)

    def _plan_fields(
        self, inputs: dict[str, tuple[int, ...]] | None, collection: SeriesCollection
    ) -> tuple[tuple[str, ...], str, int, int]:
        """Batch keys, dynamic-feature kind, static cat width, static real width."""
        has_time = collection.starts is not None and collection.freq is not None
        if inputs is None:
            keys = list(_TARGET_KEYS)
            kind = "gluonts" if has_time else ("user" if collection.feat_dynamic_real is not None else "none")
            if kind != "none":
                keys += ["past_time_feat", "future_time_feat"]
            cat = 1 if collection.feat_static_cat is None else collection.feat_static_cat.shape[1]
            real = 1 if collection.feat_static_real is None else collection.feat_static_real.shape[1]
            return tuple(keys + ["feat_static_cat", "feat_static_real"]), kind, cat, real
        if "past_target" not in inputs:
            raise ConfigurationError("model", sorted(inputs), "must declare a 'past_target' input")
        unknown = sorted(set(inputs) - _PRODUCIBLE)
        if unknown:
            raise ConfigurationError(
                "model", f"input {unknown[0]!r}", f"the datamodule produces only {sorted(_PRODUCIBLE)}"
            )
        keys = [k for k in inputs if k not in ("future_target", "future_observed_values")]
        keys += ["future_target", "future_observed_values"]
        kind = "none"
        if "past_time_feat" in inputs or "future_time_feat" in inputs:
            width = inputs.get("past_time_feat", inputs.get("future_time_feat"))[-1]
            user = 0 if collection.feat_dynamic_real is None else collection.feat_dynamic_real[0].shape[1]
            full = num_time_features(collection.freq) + 1 + user if has_time else None
            if width == 0:
                kind = "none"
            elif full is not None and width == full:
                kind = "gluonts"
            elif user and width == user:
                kind = "user"
            else:
                raise ConfigurationError(
                    "model",
                    f"num_feat_dynamic_real={width}",
                    f"the datamodule builds time features + age + feat_dynamic_real = {full} columns "
                    f"(needs time stamps and freq; got freq={collection.freq!r}) "
                    f"or the user's {user} columns",
                )
        cat = inputs.get("feat_static_cat", (1, 0))[-1]
        real = inputs.get("feat_static_real", (1, 0))[-1]
        return tuple(keys), kind, cat, real

    def _static(self, given: np.ndarray | None, width: int, dtype: type, name: str) -> np.ndarray:
        num = self.collection.num_series
        if given is None:
            # GluonTS estimators add a dummy static feature ([0] / [0.0]) when none exists.
            return np.zeros((num, width), dtype=dtype)
        if given.shape[1] != width:
            raise ConfigurationError(name, f"{given.shape[1]} columns", f"the model expects {width}")
        if np.issubdtype(dtype, np.floating):
            check_float32_range(list(np.asarray(given, dtype=np.float64)), name, self.collection.item_ids)
        return np.ascontiguousarray(given, dtype=dtype)

    def _dynamic_features(self, collection: SeriesCollection) -> list[np.ndarray] | None:
        if self._feature_kind == "none":
            return None
        out = []
        for n, target in enumerate(collection.targets):
            out.append(
                dynamic_feature_stack(
                    None if collection.starts is None else collection.starts[n],
                    len(target),
                    collection.freq,
                    None if collection.feat_dynamic_real is None else collection.feat_dynamic_real[n],
                    self._feature_kind,
                )
            )
        return out

    def _check_time_feat_width(self, inputs: dict[str, tuple[int, ...]] | None) -> None:
        if inputs is None or "past_time_feat" not in inputs:
            return
        expected, got = inputs["past_time_feat"][-1], self._train_store.dynamic.shape[-1]
        if expected != got:  # pragma: no cover - guarded by _plan_fields
            raise ConfigurationError("model", f"num_feat_dynamic_real={expected}", f"the datamodule built {got}")

    # ------------------------------------------------------------------------------------------------------
    # Public description
    # ------------------------------------------------------------------------------------------------------
    @property
    def sampling_spec(self) -> SamplingSpec:
        """Read-only :class:`SamplingSpec` of the training sampling, built from the actual geometry.

        ``num_series`` = N training series, ``min_length`` = shortest training part, ``context_length`` =
        ``past_length`` (context plus lags, what is actually gathered), ``prediction_length``, Lambda, lambda,
        modes, relation and noises. Pass it to :mod:`lightning_dpts.privacy` unchanged.
        """
        return self._spec

    @property
    def num_series(self) -> int:
        """N, the number of training series."""
        return self._spec.num_series

    @property
    def item_ids(self) -> list[str]:
        """Identifiers of the series, in the datamodule's (and ``iteration``'s) order."""
        return list(self.collection.item_ids)

    @property
    def steps_per_epoch(self) -> int:
        """floor(N * lambda / Lambda) training steps per epoch (Algorithm 1)."""
        return self._spec.steps_per_epoch

    @property
    def sampler(self) -> StructuredSampler:
        """The training sampler (an ``IterableDataset`` of whole batches)."""
        return self._sampler

    @property
    def seeded(self) -> bool:
        """``True`` if the sampling came from an explicit seed (the guarantee then does not hold against anyone
        who knows it; see :data:`~lightning_dpts.randomness.SEEDED_NOTICE`)."""
        return self._entropy.seeded

    def train_batch(self, epoch: int = 0, step: int = 0) -> dict[str, Any]:
        """The training batch of step ``step`` of pass ``epoch``, exactly as a loader iterating that pass yields it.

        Passes are numbered in the order training loaders are iterated (the first iteration of any loader of
        this datamodule is pass 0, the next one pass 1, ...). With ``seed=None`` the batches come from secret
        entropy: this is for inspection and tests, the values are not reproducible in another process.
        """
        return self._sampler.batch(epoch, step)

    # ------------------------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """The data is prepared in ``__init__`` so that the spec exists before training; here the module the
        Trainer attached is checked to read no further back than ``past_length`` (see
        :func:`~lightning_dpts.data.model_checks.check_model_window`)."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and getattr(trainer, "lightning_module", None) is not None:
            from lightning_dpts.data.model_checks import check_model_window

            check_model_window(self, trainer.lightning_module)

    def train_dataloader(self) -> DataLoader:
        """Training batches; every iteration of the loader samples a pass never used before (fresh randomness).

        Each batch is a dict with the model's fields plus ``"series_index"`` (int64 ``[B]``, the datamodule
        index of every window's series; models ignore it, the DP strategy uses it to name a series whose window
        has a non-finite gradient).

        Under a Trainer with several processes (Lightning DDP) every rank adopts rank 0's secret sampling entropy
        (broadcast in memory, never written) and yields its share of each global batch; see :meth:`_distribute`.
        """
        self._distribute()
        self._train_loader = EpochDataLoader(self._sampler, num_workers=self.num_workers, persistent_workers=False)
        return self._train_loader

    def _distribute(self) -> None:
        """One global structured sample per step across the Trainer's processes (docs/distributed.md).

        With ``trainer.world_size = W > 1`` (Lightning DDP; called on every rank when the training loader is
        requested, after any checkpoint was restored) rank 0's entropy - fresh operating-system entropy drawn at
        construction or at the restore, unless seeded - and the largest pass counter are broadcast over the
        process group (:func:`lightning_dpts.distributed.broadcast_sampling_state`, in memory); every rank then
        computes the same global batch and keeps its share (:meth:`StructuredSampler.shard`). ``secure_mode``
        draws each step's sampling from the local CSPRNG, which the ranks cannot share: refused with W > 1.
        """
        from lightning_dpts.distributed import broadcast_sampling_state, rank_and_world_size

        trainer = getattr(self, "trainer", None)
        world = int(getattr(trainer, "world_size", 1) or 1)
        if world > 1 and self._sampler.secure_mode:
            raise ConfigurationError(
                "secure_mode", True,
                f"draws every step's sampling from this process's CSPRNG, which the {world} processes of the "
                "Trainer cannot share (each would sample its own batch); use secure_mode=False (the sampling is "
                "then keyed by rank 0's 128 bits of operating-system entropy, broadcast in memory) or one process",
            )
        rank, world = rank_and_world_size(trainer)
        if world == 1:
            self._sampler.shard(0, 1)
            return
        assert trainer is not None
        entropy, passes = broadcast_sampling_state(
            self._sampler.entropy, self._sampler.passes_started, trainer.strategy.root_device
        )
        self._entropy = entropy
        self._sampler.synchronise(entropy, passes)
        self._sampler.shard(rank, world)

    def __getstate__(self) -> dict[str, Any]:
        # The datamodule holds the secret sampling Entropy (which refuses pickling too); say what to do instead.
        raise TypeError(
            "StructuredSubsamplingDataModule must not be pickled: it holds the secret sampling entropy, which would "
            "let anyone who reads the bytes regenerate the batches. For several processes use Lightning's "
            "strategy='ddp' (processes started by re-running the script, torchrun or SLURM; rank 0's entropy is "
            "then broadcast in memory), not 'ddp_spawn'/'ddp_notebook', which pickle the datamodule "
            "(docs/distributed.md)"
        )

    def state_dict(self) -> dict[str, Any]:
        """``{"passes_started": k}``, saved in Lightning checkpoints.

        Only the number of training passes started: nothing that reproduces the sampling (no seed, no generator
        state; docs/privacy.md, rule 7). The privacy ledger (steps and epochs accounted) is kept by
        :class:`~lightning_dpts.training.DPForecastStrategy`, not here.
        """
        return {"passes_started": int(self._sampler.passes_started)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue after a checkpoint with *fresh* randomness: new OS entropy (unless seeded), new pass numbers.

        A resumed run never replays a batch, whichever checkpoint it starts from (older ones, or the same one
        twice); a partially used epoch is not completed but a new pass starts (the strategy's ledger counts it
        as a new epoch). Checkpoints of older versions (``next_epoch``/``seed`` keys) are accepted; their seed is
        ignored.
        """
        started = state_dict.get("passes_started", state_dict.get("next_epoch", 0))
        self._sampler.refresh(int(started))

    def _windows(self, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows, forecast starts, window number) of the deterministic windows of ``split``."""
        if split == "val":
            first, count = 0, self.val_windows
        elif split == "test":
            first, count = self.val_windows, self.test_windows
        else:
            raise ConfigurationError("split", split, "must be 'val' or 'test'")
        num = self.collection.num_series
        rows = np.repeat(np.arange(num, dtype=np.int64), count)
        window = np.tile(np.arange(count, dtype=np.int64), num)
        starts = self.train_lengths[rows] + (first + window) * self.prediction_length
        return rows, starts, window

    def _eval_loader(self, split: str) -> DataLoader | list:
        rows, starts, _ = self._windows(split)
        if len(rows) == 0:
            return []
        dataset = FixedWindows(
            self._full_store,
            rows,
            starts,
            self.eval_batch_size,
            self.keys,
            self.static_cat,
            self.static_real,
            self.collection.univariate,
        )
        return DataLoader(dataset, batch_size=None, shuffle=False)

    def val_dataloader(self) -> DataLoader | list:
        """Validation windows (the ``val_windows`` windows before the test part), deterministic.

        With ``val_windows == 0`` (the default) the datamodule has no validation dataloader at all, so the
        Trainer runs no validation loop.
        """
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader | list:
        """Test windows (the last ``test_windows`` windows of every series), deterministic.

        With ``test_windows == 0`` the datamodule has no test dataloader.
        """
        return self._eval_loader("test")

    #: Which deterministic windows :meth:`predict_dataloader` yields: ``"test"`` (default) or ``"val"``.
    predict_split: str = "test"

    def predict_dataloader(self) -> DataLoader | list:
        """Windows for ``trainer.predict``: the test windows by default (``predict_split = "val"`` for validation).

        Batches are the same dicts as :meth:`test_dataloader` (the model's input fields plus ``future_target``
        and ``future_observed_values``), in the order of :meth:`evaluation_windows` for that split, so
        ``trainer.predict`` outputs line up with ``evaluation_windows(dm.predict_split)``. Deterministic: no
        training randomness is used. GluonTS modules have no ``predict_step``; see
        :func:`lightning_dpts.app.export.attach_quantile_predict_step`: without it, ``trainer.predict`` on a GluonTS
        module is refused here (Lightning's default step would fail inside GluonTS' ``forward``).
        """
        _check_predict_step(getattr(self, "trainer", None))
        return self._eval_loader(self.predict_split)

    def evaluation_windows(self, split: str = "test") -> list[EvaluationWindow]:
        """Everything needed to score forecasts of ``split`` (``"val"`` or ``"test"``), in loader order."""
        rows, starts, window = self._windows(split)
        out = []
        squeeze = self.collection.univariate
        for row, start, w in zip(rows.tolist(), starts.tolist(), window.tolist(), strict=True):
            series = self.collection.targets[row]
            first = None if self.collection.starts is None else self.collection.starts[row]
            history = series[:start]
            truth = series[start : start + self.prediction_length]
            out.append(
                EvaluationWindow(
                    item_id=self.collection.item_ids[row],
                    series_index=row,
                    window=w,
                    start=first,
                    forecast_start=None if first is None else first + start,
                    history=history[:, 0] if squeeze else history,
                    target=truth[:, 0] if squeeze else truth,
                )
            )
        return out

    def gluonts_test_pairs(self, split: str = "test") -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """GluonTS-style ``(input entry, label entry)`` pairs, as ``gluonts.dataset.split`` produces.

        Input entries hold ``target`` (history, ``[t]`` or ``[D, t]``, float32 as GluonTS's own dataset loading
        produces), ``start``, ``item_id`` and the static features; label entries hold the ``prediction_length``
        true values and the forecast start. Use them with a GluonTS ``Predictor`` and
        ``gluonts.model.evaluate_forecasts``.
        """
        pairs = []
        for w in self.evaluation_windows(split):
            n = w.series_index
            history = w.history if self.collection.univariate else w.history.T
            entry: dict[str, Any] = {
                "target": np.asarray(history, dtype=np.float32),
                "start": w.start,
                "item_id": w.item_id,
                "feat_static_cat": self.static_cat[n],
                "feat_static_real": self.static_real[n],
            }
            if self.collection.feat_dynamic_real is not None:
                stop = len(w.history) + self.prediction_length
                entry["feat_dynamic_real"] = np.asarray(self.collection.feat_dynamic_real[n][:stop].T, np.float32)
            label = {
                "target": w.target if self.collection.univariate else w.target.T,
                "start": w.forecast_start,
                "item_id": w.item_id,
            }
            pairs.append((entry, label))
        return pairs

    def describe(self) -> str:
        """A one-paragraph human-readable summary of data, splits and sampling."""
        s = self._spec
        return (
            f"{s.num_series} series ({len(self.dropped_series)} dropped), training lengths "
            f"{int(self.train_lengths.min())}..{int(self.train_lengths.max())}, "
            f"past_length={self.past_length} "
            f"(context {self.context_length} + lags {self.past_length - self.context_length}), "
            f"prediction_length={s.prediction_length}, batch_size={s.batch_size}, "
            f"instances_per_series={s.instances_per_series}, top_level={s.top_level}, "
            f"bottom_level={s.bottom_level}, {s.steps_per_epoch} steps/epoch, rho={s.top_level_rate:.4g}, "
            f"r={s.bottom_level_rate:.4g}, context_noise={s.context_noise}, forecast_noise={s.forecast_noise}"
        )


def _series_lengths(collection: SeriesCollection | SeriesStore) -> np.ndarray:
    """L_n of every series (int64), from a store's index or the collection's arrays."""
    if isinstance(collection, SeriesStore):
        return collection.lengths.copy()
    return np.array([len(t) for t in collection.targets], dtype=np.int64)


def _check_predict_step(trainer: Any) -> None:
    """Refuse ``trainer.predict`` on a GluonTS torch module that has no ``predict_step`` of its own: Lightning's
    default calls ``module(batch)`` with the whole dict, which fails inside GluonTS (``'dict' object has no
    attribute 'abs'``)."""
    if trainer is None or not getattr(trainer, "predicting", False):
        return  # called directly (or by another stage): no predict_step runs
    module = getattr(trainer, "lightning_module", None)
    if module is None or not hasattr(getattr(module, "model", None), "describe_inputs"):
        return  # not a GluonTS torch module: its own predict_step (or Lightning's default) decides
    if "predict_step" in vars(module) or type(module).predict_step is not L.LightningModule.predict_step:
        return  # attach_quantile_predict_step (an instance attribute) or a subclass's own step
    raise ConfigurationError(
        "predict_step", type(module).__name__,
        "a GluonTS module has no predict_step, and Lightning's default cannot feed it a batch dict: call "
        "lightning_dpts.app.export.attach_quantile_predict_step(module) before trainer.predict (it returns forecast "
        "quantiles [B, L_F, Q]), or forecast with the GluonTS predictor (estimator.create_predictor)",
    )

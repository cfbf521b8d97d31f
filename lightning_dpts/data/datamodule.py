"""``StructuredSubsamplingDataModule``: bi-level batches that are exactly what the accountant assumes."""

from __future__ import annotations

import os
import types
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import lightning as L
import numpy as np
from torch import nn
from torch.utils.data import DataLoader

from lightning_dpts.data.evaluation_windows import EvaluationWindow, gluonts_pairs, split_windows, windows_of
from lightning_dpts.data.layout import (
    _require_int,
    check_time_feat_width,
    collect,
    drop_short,
    inspect_model,
    plan_fields,
    static_block,
    too_short,
    window_lengths,
    window_stores,
)
from lightning_dpts.data.model_checks import lag_amplification_warning
from lightning_dpts.data.sampler import (
    EpochDataLoader,
    FixedWindows,
    StructuredSampler,
)
from lightning_dpts.data.store import series_lengths
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import BottomLevelScheme, TopLevelScheme
from lightning_dpts.privacy.spec import NeighbouringRelation, SamplingSpec
from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy

__all__ = ["EvaluationWindow", "StructuredSubsamplingDataModule", "too_short"]



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

        inputs, model_past, model_context, model_prediction = inspect_model(model)
        self.context_length, self.prediction_length, self.past_length = window_lengths(
            context_length, prediction_length, past_length, model_context, model_prediction, model_past)
        self.batch_size = _require_int("batch_size", batch_size, 1)
        self.eval_batch_size = _require_int(
            "eval_batch_size", self.batch_size if eval_batch_size is None else eval_batch_size, 1
        )

        # --- data, splits -----------------------------------------------------------------------------
        collection = collect(data, freq, id_column, timestamp_column, value_column)
        collection, self.dropped_series = drop_short(collection, drop_short_series, self.prediction_length,
                                                     self.test_windows + self.val_windows)
        self.collection = collection
        self.freq = collection.freq
        held_out = (self.test_windows + self.val_windows) * self.prediction_length
        self.train_lengths = series_lengths(collection) - held_out

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
        self.keys, self._feature_kind, static_cat_width, static_real_width = plan_fields(inputs, collection)
        self.static_cat = static_block(collection, collection.feat_static_cat, static_cat_width, np.int64,
                                       "feat_static_cat")
        self.static_real = static_block(collection, collection.feat_static_real, static_real_width, np.float32,
                                        "feat_static_real")
        self._full_store, self._train_store = window_stores(collection, self.train_lengths, self.past_length,
                                                            self.prediction_length, self._feature_kind)
        check_time_feat_width(inputs, self._train_store)
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
        return split_windows(self.train_lengths, self.prediction_length, self.val_windows, self.test_windows, split)

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
        return windows_of(self.collection, *self._windows(split), self.prediction_length)

    def gluonts_test_pairs(self, split: str = "test") -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """GluonTS-style ``(input entry, label entry)`` pairs, as ``gluonts.dataset.split`` produces.

        Input entries hold ``target`` (history, ``[t]`` or ``[D, t]``, float32 as GluonTS's own dataset loading
        produces), ``start``, ``item_id`` and the static features; label entries hold the ``prediction_length``
        true values and the forecast start. Use them with a GluonTS ``Predictor`` and
        ``gluonts.model.evaluate_forecasts``.
        """
        return gluonts_pairs(self.evaluation_windows(split), self.collection, self.static_cat, self.static_real,
                             self.prediction_length)

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

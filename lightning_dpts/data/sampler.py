"""Vectorised bi-level structured subsampling (Algorithms 1, 3, 4, 5, 6 and Eq. 1 of the paper).

All series live in one zero-padded array; a window is gathered with index arithmetic, so a whole batch is a
handful of numpy calls regardless of its size. Randomness is owned by :class:`StructuredSampler`: it derives
from the run's secret :class:`~lightning_dpts.randomness.Entropy` (fresh operating-system entropy unless an
explicit seed was given; docs/privacy.md, rule 7) and the stream key ``(pass, step)``, so batches are identical
for any number of DataLoader workers, and every iteration of a training loader claims a pass that was never
used before (nothing is replayed, not by a second Trainer nor by a resume).

Indexing convention (0-based translation of Algorithm 4): series ``n`` of length ``L_n`` is stored after
``P = past_length`` zeros (observed mask 0). A start position ``s in {0, ..., T_n - 1}``, with
``T_n = L_n - L_F + 1`` (the paper's ``t = s + 1``), selects ``padded[s : s + P + L_F]``; its past part
is the first ``P`` steps and its future part is ``series[s : s + L_F]``. The last window therefore ends
exactly at the end of the series.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from lightning_dpts.data.bminsep import BMinSepSampler, sampling_prob_for_rate
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import SamplingSpec
from lightning_dpts.randomness import Entropy, allow_worker_pickling, numpy_generator

#: The largest finite float32 value: data are stored as float32, larger magnitudes would become infinite.
FLOAT32_MAX = float(np.finfo(np.float32).max)

__all__ = [
    "FLOAT32_MAX",
    "SERIES_INDEX_KEY",
    "EpochDataLoader",
    "FixedWindows",
    "StructuredSampler",
    "WindowStore",
    "check_float32_range",
]


class WindowStore:
    """Series kept in one padded array for fast window gathering.

    Each series occupies a row of ``width = P + max_n L_n`` steps: ``P`` zeros (observed mask 0), its
    values (NaN replaced by 0 with mask 0, like GluonTS's ``AddObservedValuesIndicator``), then zeros.
    Rows are stored flat (``[N * width, D]``) so a batch is gathered with a few ``numpy.take`` calls.

    Args:
        targets: one ``[L_n, D]`` float array per series; NaN marks a missing value.
        past_length: P, the past window length gathered (context plus every lag), in time steps.
        prediction_length: L_F, the future window length, in time steps.
        dynamic: optional ``[L_n, F]`` dynamic features per series (same ``F`` for all).
        names: optional series names for error messages.

    Raises:
        ConfigurationError: a value (target or dynamic feature) is infinite or its magnitude exceeds the float32
            range (it would become infinite in the float32 batches and make every gradient of its window
            non-finite); NaN targets are missing values.
    """

    def __init__(
        self,
        targets: Sequence[np.ndarray],
        past_length: int,
        prediction_length: int,
        dynamic: Sequence[np.ndarray] | None = None,
        names: Sequence[str] | None = None,
    ) -> None:
        check_float32_range(targets, "data", names)
        if dynamic is not None:
            check_float32_range(dynamic, "feat_dynamic_real", names)
        self.past_length = int(past_length)
        self.prediction_length = int(prediction_length)
        self.lengths = np.array([len(t) for t in targets], dtype=np.int64)
        num, dims = len(targets), targets[0].shape[1]
        self.width = width = self.past_length + int(self.lengths.max())
        values = np.zeros((num, width, dims), dtype=np.float32)
        observed = np.zeros((num, width, dims), dtype=np.float32)
        for n, series in enumerate(targets):
            stop = self.past_length + len(series)
            finite = np.isfinite(series)
            values[n, self.past_length : stop] = np.where(finite, series, 0.0)
            observed[n, self.past_length : stop] = finite
        num_features = 0 if dynamic is None else dynamic[0].shape[1]
        feats = np.zeros((num, width, num_features), dtype=np.float32)
        if dynamic is not None:
            for n, f in enumerate(dynamic):
                feats[n, self.past_length : self.past_length + len(f)] = f
        self.values = values.reshape(num * width, dims)
        self.observed = observed.reshape(num * width, dims)
        self.dynamic = feats.reshape(num * width, num_features)
        self._past_offsets = np.arange(self.past_length, dtype=np.int64)
        self._future_offsets = np.arange(self.past_length, self.past_length + self.prediction_length)

    @property
    def num_start_positions(self) -> np.ndarray:
        """T_n = L_n - L_F + 1 per series (Algorithm 4)."""
        return self.lengths - self.prediction_length + 1

    def gather(self, rows: np.ndarray, starts: np.ndarray, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Windows ``padded[rows[i], starts[i] : starts[i] + P + L_F]`` split into past and future parts.

        Returns C-contiguous arrays ``past_target``/``past_observed_values`` ``[B, P, D]``,
        ``future_target``/``future_observed_values`` ``[B, L_F, D]``, ``past_time_feat`` ``[B, P, F]`` and
        ``future_time_feat`` ``[B, L_F, F]`` (only those in ``keys`` when it is given).
        """
        base = (rows * self.width + starts)[:, None]
        index = {"past": base + self._past_offsets[None, :], "future": base + self._future_offsets[None, :]}
        sources = {
            "past_target": (self.values, "past"),
            "past_observed_values": (self.observed, "past"),
            "future_target": (self.values, "future"),
            "future_observed_values": (self.observed, "future"),
            "past_time_feat": (self.dynamic, "past"),
            "future_time_feat": (self.dynamic, "future"),
        }
        wanted = sources if keys is None else [k for k in keys if k in sources]
        return {k: sources[k][0].take(index[sources[k][1]], axis=0) for k in wanted}


def check_float32_range(arrays: Sequence[np.ndarray], parameter: str, names: Sequence[str] | None = None) -> None:
    """Raise :class:`ConfigurationError` if any value is +-inf or has magnitude above :data:`FLOAT32_MAX`.

    NaN is allowed (a missing value). The check runs once, when the data are loaded.
    """
    for n, values in enumerate(arrays):
        arr = np.asarray(values, dtype=np.float64)
        bad = np.isinf(arr) | (np.abs(np.nan_to_num(arr, nan=0.0)) > FLOAT32_MAX)
        if bad.any():
            where = int(np.flatnonzero(bad.reshape(len(arr), -1).any(axis=1))[0]) if arr.ndim else 0
            name = names[n] if names is not None else f"#{n}"
            raise ConfigurationError(
                parameter, f"series {name!r}, time step {where}: {arr.reshape(len(arr), -1)[where].tolist()}",
                f"every value must be finite with magnitude <= {FLOAT32_MAX:.6g} (the float32 range the batches "
                "use; NaN marks a missing value)",
            )


_TARGET_FIELDS = frozenset({"past_target", "past_observed_values", "future_target", "future_observed_values"})


def _to_tensors(
    arrays: dict[str, np.ndarray],
    rows: np.ndarray,
    keys: Sequence[str],
    static_cat: np.ndarray | None,
    static_real: np.ndarray | None,
    univariate: bool,
) -> dict[str, torch.Tensor]:
    """Batch dict of tensors sharing memory with the gathered arrays (no further copies)."""
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        if key == "feat_static_cat":
            assert static_cat is not None
            out[key] = torch.from_numpy(static_cat[rows])
        elif key == "feat_static_real":
            assert static_real is not None
            out[key] = torch.from_numpy(static_real[rows])
        else:
            arr = arrays[key]
            if univariate and key in _TARGET_FIELDS:
                arr = arr.reshape(arr.shape[:2])  # [B, W, 1] -> [B, W], a view of contiguous memory
            out[key] = torch.from_numpy(arr)
    return out


#: Batch key of the series index of every window (int64 ``[B]``): not a model input (GluonTS modules select
#: their inputs by name), it lets :class:`~lightning_dpts.training.DPForecastStrategy` name the series of a window
#: whose gradient is not finite.
SERIES_INDEX_KEY = "series_index"


class StructuredSampler(IterableDataset):
    """Yields whole training batches of bi-level structured subsampling; use with ``batch_size=None``.

    Each epoch has ``spec.steps_per_epoch = floor(N * lambda / Lambda)`` steps (Algorithm 1). Step ``b``:

    * top level (which series): ``iteration`` takes series ``b*N' .. (b+1)*N' - 1`` in dataset order
      (Algorithm 3, leftover series unused); ``shuffling`` does the same over a fresh permutation per epoch;
      ``without_replacement`` draws a fresh uniform N'-subset (Algorithm 5); ``poisson`` includes each series
      independently with probability N'/N (variable batch size, possibly 0);
    * bottom level (which windows): ``with_replacement`` draws lambda start positions uniformly with
      replacement from ``{0..T_n-1}`` (Algorithm 4); ``poisson`` includes each start position independently
      with rate ``min(1, lambda/T_n)`` (Algorithm 6);
    * augmentation (Eq. 1): i.i.d. Gaussian noise with std ``context_noise * v`` on the whole past window and
      ``forecast_noise * v`` on the whole future window of every sampled window, drawn fresh every time.

    Randomness (docs/privacy.md, rule 7): every draw comes from the secret ``entropy``
    (:func:`~lightning_dpts.randomness.numpy_generator` with stream ``(pass, 1, step)``; the per-pass
    permutation of ``shuffling`` uses ``(pass, 0)``); nothing depends on data values (trap 5). A *pass* is
    one iteration of a training loader: :meth:`claim_pass` hands out pass numbers that were never used by this
    sampler, so iterating a loader again, a second Trainer on the same datamodule or a resume never replays
    the batches of a pass already used. Nothing that reproduces the batches is ever stored: the datamodule's
    ``state_dict`` keeps only the number of passes started, and a datamodule restored from a checkpoint draws
    fresh entropy. With ``k`` DataLoader workers, worker ``w`` produces steps ``w, w + k, ...``; the
    DataLoader's round-robin then restores the order, so the batches are the same as with ``num_workers=0``.

    Args:
        store: the training series (:class:`WindowStore`).
        spec: the sampling description; its ``top_level``, ``bottom_level``, ``batch_size``,
            ``instances_per_series``, noises and ``relation.value_bound`` drive the sampling.
        keys: the batch fields to emit (every batch also carries :data:`SERIES_INDEX_KEY`).
        entropy: the secret root of the sampling randomness (:func:`~lightning_dpts.randomness.resolve_entropy`).
        static_cat / static_real: ``[N, C]`` / ``[N, R]`` static features, when ``keys`` asks for them.
        univariate: drop the trailing ``D = 1`` axis of targets and masks.
        secure_mode: draw every step's sampling and augmentation from a generator seeded with 128 fresh bits
            of the operating system's CSPRNG (:mod:`secrets`) instead of the ``entropy`` stream (the per-pass
            permutation of ``shuffling`` stays on the stream, so that workers agree on it). Batches are then not
            reproducible, not even with :meth:`batch` and an explicit seed (a seeded secure sampler is refused).
    """

    def __init__(
        self,
        store: WindowStore,
        spec: SamplingSpec,
        keys: Sequence[str],
        entropy: Entropy,
        static_cat: np.ndarray | None = None,
        static_real: np.ndarray | None = None,
        univariate: bool = True,
        secure_mode: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(entropy, Entropy):
            raise ConfigurationError("entropy", type(entropy).__name__, "must be a lightning_dpts.randomness.Entropy")
        if secure_mode and entropy.seeded:
            raise ConfigurationError(
                "secure_mode", True, "draws from the operating system's CSPRNG and cannot be seeded; use seed=None"
            )
        self.secure_mode = bool(secure_mode)
        self.store = store
        self.spec = spec
        self.keys = tuple(keys)
        self.entropy = entropy
        self.static_cat = static_cat
        self.static_real = static_real
        self.univariate = univariate
        self.epoch = 0  # the pass the next iteration samples (set by EpochDataLoader before workers start)
        self.passes_started = 0  # passes handed out by claim_pass; never decreases
        v = spec.relation.value_bound or 0.0
        self._context_std = spec.context_noise * v
        self._forecast_std = spec.forecast_noise * v
        self._num_series = len(store.lengths)
        self._t = store.num_start_positions
        self._draw_series = spec.top_level_scheme.draw_series  # the levels' sampling code (privacy.mechanisms)
        self._draw_windows = spec.bottom_level_scheme.draw_windows
        self._bminsep: BMinSepSampler | None = None  # b_min_sep chain of this process (never pickled)
        self.rank, self.world_size = 0, 1  # this process's share of every global batch (see shard)

    def __len__(self) -> int:
        return self.spec.steps_per_epoch

    def claim_pass(self) -> int:
        """A pass number never used by this sampler's loaders (0, 1, 2, ... in order of iteration)."""
        claimed = self.passes_started
        self.passes_started += 1
        return claimed

    def refresh(self, passes_started: int = 0) -> None:
        """Continue with fresh randomness after a restore: new OS entropy (unless seeded), passes not reused."""
        if not self.entropy.seeded:
            self.entropy = type(self.entropy).fresh()
        self._bminsep = None
        self.passes_started = max(self.passes_started, int(passes_started))
        self.epoch = self.passes_started

    def shard(self, rank: int, world_size: int) -> None:
        """Yield only this process's share of every global batch (DDP: ``world_size`` processes).

        The global batch of a step is computed in full on every rank (from the same secret entropy, see
        :meth:`synchronise`) and rank ``r`` keeps windows ``floor(B r / W) .. floor(B (r + 1) / W) - 1`` of its
        ``B`` windows, so the shares are disjoint, cover the batch and differ in size by at most one; a share may
        be empty (Poisson levels): the rank then contributes zero to the step. Augmentation noise is drawn for
        the whole batch and sliced, so the union of the shares is exactly the single-process batch.
        """
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ConfigurationError("world_size", world_size, "must be an integer >= 1")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ConfigurationError("rank", rank, f"must be an integer in [0, {world_size})")
        self.rank, self.world_size = rank, world_size

    def synchronise(self, entropy: Entropy, passes_started: int) -> None:
        """Adopt the entropy and pass counter that every rank shares (rank 0's, broadcast in memory by
        :func:`lightning_dpts.distributed.broadcast_sampling_state`); the b-min-sep chain restarts from it."""
        if not isinstance(entropy, Entropy):
            raise ConfigurationError("entropy", type(entropy).__name__, "must be a lightning_dpts.randomness.Entropy")
        self.entropy = entropy
        self._bminsep = None
        self.passes_started = max(self.passes_started, int(passes_started))
        self.epoch = self.passes_started

    def _share(self, total: int) -> slice:
        """This rank's windows among ``total`` windows of a global batch (all of them on one process)."""
        if self.world_size == 1:
            return slice(0, total)
        return slice(total * self.rank // self.world_size, total * (self.rank + 1) // self.world_size)

    # -- top level ---------------------------------------------------------------------------------------
    @property
    def num_series(self) -> int:
        """N, the number of training series."""
        return self._num_series

    def top_level(self, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        """Series indices of step ``step`` of pass ``epoch`` (int64, possibly empty for Poisson), drawn by the spec's
        top-level object (:meth:`~lightning_dpts.privacy.mechanisms.TopLevelScheme.draw_series`)."""
        return self._draw_series(self, epoch, step, rng)

    @property
    def b_min_sep_sampling_prob(self) -> float:
        """p = p0 / (1 - p0 (b - 1)) with p0 = N'/N: the rate on available series that gives N'/N per step."""
        return sampling_prob_for_rate(self.spec.top_level_rate, self.spec.bands)

    def b_min_sep_series(self, global_step: int) -> np.ndarray:
        """Series of chain step ``global_step`` (= pass * steps_per_epoch + step) of the b-min-sep top level.

        One :class:`~lightning_dpts.data.bminsep.BMinSepSampler` chain (warm start, Algorithm 2) spans the whole
        run, across passes; its randomness is the streams ``(21,)`` and ``(22, i)`` of the secret ``entropy``, so
        a DataLoader worker replays the chain up to its steps and sees the single-process batches. The chain only
        moves forward; a step before the chain's position (another loader of the same sampler going back) starts
        a fresh replay from step 0 with the same entropy, which gives the same batches.
        """
        chain = self._bminsep
        if chain is None or chain._next_step > global_step:
            chain = BMinSepSampler(self._num_series, self.spec.bands, self.b_min_sep_sampling_prob, self.entropy)
            self._bminsep = chain
        return chain.indices_at(global_step).astype(np.int64, copy=False)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_bminsep"] = None  # rebuilt (replayed) in the worker: the chain refuses pickling
        return state

    # -- bottom level ------------------------------------------------------------------------------------
    def bottom_level(self, series: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(row, start) pairs of the windows sampled from ``series`` (0-based starts in ``[0, T_n)``), drawn by the
        spec's bottom-level object (:meth:`~lightning_dpts.privacy.mechanisms.BottomLevelScheme.draw_windows`)."""
        return self._draw_windows(series, self._t[series], self.spec.instances_per_series, rng)

    def sample_indices(self, epoch: int, step: int) -> tuple[np.ndarray, np.ndarray, np.random.Generator]:
        """(rows, starts, generator) of one step; the generator continues with the augmentation noise."""
        if self.secure_mode:
            rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(secrets.randbits(128))))
        else:
            rng = numpy_generator(self.entropy, epoch, 1, step)
        series = self.top_level(epoch, step, rng)
        rows, starts = self.bottom_level(series, rng)
        return rows, starts, rng

    def batch(self, epoch: int, step: int) -> dict[str, torch.Tensor]:
        """The training batch of step ``step`` of pass ``epoch`` (this rank's share of it, see :meth:`shard`)."""
        rows, starts, rng = self.sample_indices(epoch, step)
        total = len(rows)
        part = self._share(total)
        rows, starts = rows[part], starts[part]
        arrays = self.store.gather(rows, starts, self.keys)
        if self._context_std > 0:
            past = arrays["past_target"]
            noise = rng.standard_normal((total, *past.shape[1:]), dtype=np.float32)[part]
            past += noise * np.float32(self._context_std)
        if self._forecast_std > 0:
            future = arrays["future_target"]
            noise = rng.standard_normal((total, *future.shape[1:]), dtype=np.float32)[part]
            future += noise * np.float32(self._forecast_std)
        out = _to_tensors(arrays, rows, self.keys, self.static_cat, self.static_real, self.univariate)
        out[SERIES_INDEX_KEY] = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        return out

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        epoch = self.epoch
        info = get_worker_info()
        first, stride = (0, 1) if info is None else (info.id, info.num_workers)
        for step in range(first, self.spec.steps_per_epoch, stride):
            yield self.batch(epoch, step)


class EpochDataLoader(DataLoader):
    """DataLoader that samples a pass never used before each time it is iterated.

    The pass is claimed from the :class:`StructuredSampler` (shared by every loader of the datamodule) and set
    before the workers are started, so every worker samples the same pass. Persistent workers would keep a
    stale copy of the pass and are therefore rejected by the datamodule. Worker processes receive the sampler
    (and its secret entropy) in memory only (:class:`~lightning_dpts.randomness.allow_worker_pickling`).
    """

    def __init__(self, dataset: StructuredSampler, **kwargs) -> None:
        super().__init__(dataset, batch_size=None, **kwargs)

    def __iter__(self):  # type: ignore[override]
        self.dataset.epoch = self.dataset.claim_pass()
        if self.num_workers > 0:
            with allow_worker_pickling():
                return super().__iter__()
        return super().__iter__()


class FixedWindows(Dataset):
    """Deterministic batches of given windows (validation/test), in order, without augmentation."""

    def __init__(
        self,
        store: WindowStore,
        rows: np.ndarray,
        starts: np.ndarray,
        batch_size: int,
        keys: Sequence[str],
        static_cat: np.ndarray | None,
        static_real: np.ndarray | None,
        univariate: bool,
    ) -> None:
        self.store, self.rows, self.starts = store, rows, starts
        self.batch_size, self.keys = batch_size, tuple(keys)
        self.static_cat, self.static_real, self.univariate = static_cat, static_real, univariate

    def __len__(self) -> int:
        return -(-len(self.rows) // self.batch_size)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        part = slice(i * self.batch_size, (i + 1) * self.batch_size)
        rows, starts = self.rows[part], self.starts[part]
        arrays = self.store.gather(rows, starts, self.keys)
        return _to_tensors(arrays, rows, self.keys, self.static_cat, self.static_real, self.univariate)

"""b-min-sep sampling of series (Dong & Ganesh 2026, Algorithms 1 and 2), with warm start by default.

Each step, every *available* series (one that did not take part in the previous b - 1 steps) is included
independently with probability p; a series that takes part is excluded for the next b - 1 steps. Warm start
(Algorithm 2) draws each series' virtual history from the stationary law of the availability chain (Figure 1), so the
inclusion probability is the same p0 = p / (1 + (b - 1) p) at every step. For a target expected fraction p0 of series
per step use :func:`sampling_prob_for_rate`: p = p0 / (1 - p0 (b - 1)) (Section 4), which requires p0 <= 1/b.

This is the *top level* of structured subsampling over series; windows inside a sampled series are drawn by the
bottom level as for the other top levels. Randomness: a fresh :class:`~lightning_dpts.randomness.Entropy` (OS entropy by
default) and :func:`~lightning_dpts.randomness.numpy_generator` streams; the sampler's history (which series were
excluded) derives from that secret and is never written anywhere (no ``state_dict``, pickling refused). A resumed run
would start a fresh sampler, breaking the b-min-sep property across the restart, which the Monte Carlo accounting of
the run does not cover: b-min-sep runs are not resumable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import Entropy, numpy_generator

__all__ = ["BMinSepSampler", "inclusion_rate", "sampling_prob_for_rate"]

#: Stream keys under the run's Entropy (distinct from the other samplers' and the noise's keys).
_WARM_START_STREAM = 21
_STEP_STREAM = 22


def _check_bands(bands: object) -> int:
    if isinstance(bands, bool) or not isinstance(bands, (int, np.integer)) or int(bands) < 1:
        raise ConfigurationError("bands", bands, "must be an integer >= 1")
    return int(bands)


def sampling_prob_for_rate(rate: float, bands: int) -> float:
    """p = p0 / (1 - p0 (b - 1)): the per-available-step probability that gives expected fraction p0 per step.

    Raises:
        ConfigurationError: p0 not in (0, 1/b] (the chain cannot sample more than one step in b).
    """
    b = _check_bands(bands)
    try:
        p0 = float(rate)
    except (TypeError, ValueError):
        raise ConfigurationError("rate", rate, f"must be a number in (0, 1/bands] = (0, {1 / b:.6g}]") from None
    if not (p0 > 0 and p0 * b <= 1 + 1e-12 and math.isfinite(p0)):
        raise ConfigurationError("rate", rate, f"must lie in (0, 1/bands] = (0, {1 / b:.6g}] for bands={b}")
    return min(1.0, p0 / (1.0 - p0 * (b - 1)))


def inclusion_rate(sampling_prob: float, bands: int) -> float:
    """p0 = p / (1 + (b - 1) p): stationary (warm-start) probability that a series is in a step's sample."""
    b = _check_bands(bands)
    p = float(sampling_prob)
    if not 0 < p <= 1:
        raise ConfigurationError("sampling_prob", sampling_prob, "must lie in (0, 1]")
    return p / (1.0 + (b - 1) * p)


class BMinSepSampler:
    """Top-level b-min-sep sampler over ``num_series`` series: ``step(i)`` gives step i's sorted series indices.

    Args:
        num_series: N >= 1.
        bands: b >= 1, the minimum separation (the number of bands of the BandMF strategy). b = 1 is Poisson sampling.
        sampling_prob: p in (0, 1], the rate applied to available series (see :func:`sampling_prob_for_rate`).
        entropy: the run's secret :class:`~lightning_dpts.randomness.Entropy`.
        warm_start: Algorithm 2 (default) or Algorithm 1 (all series start available).

    Steps must be drawn in order 0, 1, 2, ... (the exclusion depends on the previous b - 1 steps).
    """

    def __init__(self, num_series: int, bands: int, sampling_prob: float, entropy: Entropy, *,
                 warm_start: bool = True) -> None:
        if isinstance(num_series, bool) or not isinstance(num_series, (int, np.integer)) or num_series < 1:
            raise ConfigurationError("num_series", num_series, "must be an integer >= 1")
        if not isinstance(entropy, Entropy):
            raise ConfigurationError("entropy", entropy, "must be a lightning_dpts.randomness.Entropy")
        self.num_series = int(num_series)
        self.bands = _check_bands(bands)
        p = float(sampling_prob)
        if not (0 < p <= 1):
            raise ConfigurationError("sampling_prob", sampling_prob, "must lie in (0, 1]")
        self.sampling_prob = p
        self.warm_start = bool(warm_start)
        self.seeded = entropy.seeded
        self._entropy = entropy
        self._countdown = np.zeros(self.num_series, dtype=np.int64)
        if self.warm_start and self.bands > 1:
            rng = numpy_generator(entropy, _WARM_START_STREAM)
            busy = rng.random(self.num_series) >= 1.0 / (1.0 + (self.bands - 1) * p)
            self._countdown[busy] = rng.integers(1, self.bands, size=int(busy.sum()))
        self._next_step = 0

    @property
    def inclusion_rate(self) -> float:
        """Expected fraction of series per step at stationarity (every step under warm start)."""
        return inclusion_rate(self.sampling_prob, self.bands)

    @property
    def expected_batch_series(self) -> float:
        """Expected number of series per step: N p0."""
        return self.num_series * self.inclusion_rate

    def step(self, index: int) -> np.ndarray:
        """Sorted indices of the series sampled at step ``index`` (must be the next step)."""
        if int(index) != self._next_step:
            raise ConfigurationError("index", index, f"must be the next step {self._next_step} (steps are sequential)")
        rng = numpy_generator(self._entropy, _STEP_STREAM, self._next_step)
        take = (self._countdown == 0) & (rng.random(self.num_series) < self.sampling_prob)
        self._countdown = np.where(take, self.bands - 1, np.maximum(self._countdown - 1, 0))
        self._next_step += 1
        return np.flatnonzero(take)

    def indices_at(self, step: int) -> np.ndarray:
        """Series of step ``step`` >= the next step, advancing the chain through the steps in between.

        Step i's draws come from the stream ``(entropy, 22, i)`` alone, so a DataLoader worker that only serves some
        steps can replay the others and obtain exactly the batches a single process would (the chain is sequential,
        the randomness is not). Going back is refused (the history is not stored).
        """
        target = int(step)
        if target < self._next_step:
            raise ConfigurationError("step", step, f"must be >= the next step {self._next_step} (no going back)")
        while self._next_step < target:
            self.step(self._next_step)
        return self.step(target)

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield self.step(self._next_step)

    def __reduce__(self) -> Any:
        raise TypeError("BMinSepSampler must not be pickled: its history derives from the run's secret entropy")

    def __repr__(self) -> str:
        return (f"BMinSepSampler(num_series={self.num_series}, bands={self.bands}, "
                f"sampling_prob={self.sampling_prob:g}, warm_start={self.warm_start})")

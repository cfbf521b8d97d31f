"""Canaries that are the protected unit: events inserted into series, each in the training data with probability 1/2.

An empirical audit (Steinke, Nasr & Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training run") trains
once on data holding m canaries, each included independently with probability 1/2, and then guesses from what
the adversary sees which canaries were included. Every canary here is one protected unit of the neighbouring
relation (:class:`~lightning_dpts.privacy.NeighbouringRelation`, docs/privacy.md "What is protected"):

* ``level="event"``, ``size=1``: one time step of one series;
* ``level="event"``, ``size=w`` and ``level="user"``, ``size=w``: a run of w consecutive steps of one series (for the
  w-user relation, w steps anywhere in the series, so a run of w steps is one such unit).

The two worlds of a canary differ in those steps only, by ``magnitude`` in every coordinate: the series holds
``base + magnitude / 2`` where the canary is included and ``base - magnitude / 2`` where it is not ("signed"
canaries: of all pairs of values ``magnitude`` apart, the pair whose clipped gradients point in opposite
directions, so that one canary can move the noisy update by up to 2C, the sensitivity the accountant assumes).
With a ``value_bound`` v the two worlds differ by at most v per step and coordinate (Definition 3.7), so
``magnitude <= v``; without one, any magnitude is a neighbouring pair.

Canaries are placed so that no window of ``past_length + prediction_length`` steps holds two of them: each window
that can contain canary j differs between its two worlds in canary j alone, which is what lets the white-box
score (:mod:`lightning_dpts.audit.scores`) attribute a window's gradient to one canary.

Which canaries are included is drawn by the auditor (a generator the auditor owns and knows, not the training's
secret randomness, which stays in :mod:`lightning_dpts.randomness`): the one-run estimators need exactly these
independent fair coins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation

__all__ = ["SHAPES", "Canary", "CanaryPlan", "chunk_series", "plan_canaries", "window_starts"]

#: event shapes a canary can take inside its w steps (each a neighbouring pair of the w-event / w-user relation):
#: ``"shift"`` a level shift over the w-run (every step moved by the same amount), ``"spike"`` one step (the
#: run's first), ``"zigzag"`` a w-run of alternating sign
SHAPES = ("shift", "spike", "zigzag")


@dataclass(frozen=True)
class Canary:
    """One canary: steps ``position .. position + length - 1`` of series ``series`` (0-based, in the training part).

    Attributes:
        series: index of the series in the audited dataset.
        position: first changed time step of the series.
        length: number of consecutive changed steps (the relation's w).
        magnitude: the difference between its two worlds at each changed step and coordinate, in the units of the
            series.
        shape: one of :data:`SHAPES`, the event's profile over its ``length`` steps.
    """

    series: int
    position: int
    length: int
    magnitude: float
    shape: str = "shift"

    def profile(self) -> np.ndarray:
        """``[length]`` the included world minus the excluded one at each step, divided by ``magnitude``: entries
        in {-1, 0, 1}."""
        out = np.ones(self.length)
        if self.shape == "spike":
            out[1:] = 0.0
        elif self.shape == "zigzag":
            out[1::2] = -1.0
        return out


def window_starts(canary: Canary, series_length: int, past_length: int, prediction_length: int) -> np.ndarray:
    """The 0-based window starts (Algorithm 4's ``[0, T)``, T = L - L_F + 1, after P zeros of padding) whose window
    of ``past_length + prediction_length`` steps contains a step of ``canary``: window s covers series steps
    ``s - P .. s + L_F - 1``."""
    t_count = series_length - prediction_length + 1
    lo = max(0, canary.position - prediction_length + 1)
    hi = min(t_count - 1, canary.position + canary.length - 1 + past_length)
    return np.arange(lo, hi + 1, dtype=np.int64)


@dataclass(frozen=True)
class CanaryPlan:
    """The canaries of one audit run and the auditor's coin flips.

    Attributes:
        canaries: the m canaries.
        included: ``[m]`` bool, whether each canary is in the training data (drawn with probability 1/2).
    """

    canaries: tuple[Canary, ...]
    included: np.ndarray

    def __len__(self) -> int:
        return len(self.canaries)

    def world(self, base: Sequence[np.ndarray], which: str) -> list[np.ndarray]:
        """Copies of the ``base`` series with every canary set as in the training data (``which="train"``), or every
        canary in its included (``"in"``) or excluded (``"out"``) version.

        Raises:
            ConfigurationError: ``which`` is not one of those three.
        """
        if which not in ("train", "in", "out"):
            raise ConfigurationError("which", which, "must be 'train', 'in' or 'out'")
        out = [np.array(s, dtype=np.float64, copy=True) for s in base]
        for k, c in enumerate(self.canaries):
            sign = (1.0 if self.included[k] else -1.0) if which == "train" else (1.0 if which == "in" else -1.0)
            out[c.series][c.position : c.position + c.length] += sign * c.magnitude / 2.0 * c.profile()
        return out


def chunk_series(series: Sequence[np.ndarray], chunk_length: int, max_chunks: int | None = None) -> list[np.ndarray]:
    """Cut every series into consecutive pieces of ``chunk_length`` steps (the rest of a series is left out).

    The audit's default data are short pieces of the bundled series: with pieces of ``prediction_length`` steps
    each window covers a whole piece (T = 1), so the accountant credits no subsampling (r = rho = 1) and the audit
    measures the noise and the clipping directly. ``max_chunks`` keeps that many pieces, taken round-robin over the
    series (so every series contributes).

    Raises:
        ConfigurationError: ``chunk_length < 1`` or no series is that long.
    """
    if isinstance(chunk_length, bool) or not isinstance(chunk_length, (int, np.integer)) or chunk_length < 1:
        raise ConfigurationError("chunk_length", chunk_length, "must be an integer >= 1")
    pieces: list[list[np.ndarray]] = []
    for s in series:
        arr = np.asarray(s, dtype=np.float64)
        pieces.append([arr[i : i + chunk_length] for i in range(0, len(arr) - chunk_length + 1, chunk_length)])
    out: list[np.ndarray] = []
    depth = max((len(p) for p in pieces), default=0)
    for i in range(depth):
        for p in pieces:
            if i < len(p):
                out.append(p[i])
    if not out:
        raise ConfigurationError("chunk_length", chunk_length, "must not exceed the length of the longest series")
    return out if max_chunks is None else out[:max_chunks]


def plan_canaries(
    lengths: Sequence[int],
    *,
    count: int,
    relation: NeighbouringRelation,
    past_length: int,
    prediction_length: int,
    magnitude: float,
    rng: np.random.Generator,
    shape: str = "shift",
    offset: int | None = None,
) -> CanaryPlan:
    """Place ``count`` canaries of the ``relation``'s unit in series of the given ``lengths`` and flip their coins.

    Canaries are spread round-robin over the series; inside a series they are at least ``past_length +
    prediction_length + w - 1`` steps apart, so that no window contains two (the first at a random offset drawn
    from ``rng``). Each canary is included independently with probability 1/2 (``rng``).

    Args:
        lengths: the training length of every series, in time steps.
        count: m >= 1, the number of canaries.
        relation: the neighbouring relation whose unit a canary is (its ``size`` w, its ``value_bound`` v).
        past_length: P, the past window the model reads (context plus lags), in time steps.
        prediction_length: L_F, in time steps.
        magnitude: > 0, the difference between a canary's two worlds per step and coordinate; at most v.
        rng: the auditor's generator.
        shape: the event's profile (:data:`SHAPES`).
        offset: the first canary's position in every series (default: random); 0 puts each canary at the start,
            where it lies in every window of a piece of ``past_length + prediction_length`` steps.

    Raises:
        ConfigurationError: ``count`` < 1 or more than the series can hold (the message says how many fit),
            ``magnitude`` not positive or above the value bound.
    """
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise ConfigurationError("canaries", count, "must be an integer >= 1")
    if not np.isfinite(magnitude) or magnitude <= 0:
        raise ConfigurationError("magnitude", magnitude, "must be a finite number > 0")
    bound = relation.value_bound
    if bound is not None and magnitude > bound:
        raise ConfigurationError("magnitude", magnitude, f"must be <= the relation's value_bound={bound}")
    if shape not in SHAPES:
        raise ConfigurationError("canary_shape", shape, f"one of {', '.join(SHAPES)}")
    if offset is not None and (isinstance(offset, bool) or not isinstance(offset, (int, np.integer)) or offset < 0):
        raise ConfigurationError("canary_offset", offset, "an integer >= 0")
    w = int(relation.size)
    spacing = past_length + prediction_length + w - 1
    slots: list[list[int]] = []
    for n in lengths:
        room = int(n) - w + 1  # positions 0 .. n - w
        if room <= 0:
            slots.append([])
            continue
        if offset is not None and offset >= room:
            slots.append([])
            continue
        first = offset if offset is not None else None
        per = 1 + (room - 1 - (first or 0)) // spacing
        if first is None:
            first = int(rng.integers(0, room - (per - 1) * spacing))
        slots.append([first + i * spacing for i in range(per)])
    capacity = sum(len(s) for s in slots)
    if count > capacity:
        raise ConfigurationError("canaries", count, f"must be <= {capacity}, the canaries the data can hold apart")
    canaries: list[Canary] = []
    depth = 0
    while len(canaries) < count:
        for series, positions in enumerate(slots):
            if depth < len(positions) and len(canaries) < count:
                canaries.append(Canary(series, positions[depth], w, float(magnitude), shape))
        depth += 1
    included = rng.random(count) < 0.5
    return CanaryPlan(tuple(canaries), included)

"""Declarative description of a structured-subsampling training scheme.

A :class:`SamplingSpec` is the single source of truth shared by the data pipeline and the accountant: the
datamodule *describes* the sampling it performs with one, and :mod:`lightning_dpts.privacy` turns it (plus
the noise multiplier) into privacy guarantees. It mirrors ``dp_accounting``'s ``DpEvent``: a description of
the mechanism, kept separate from the arithmetic that accounts for it.

Notation follows *Privacy Amplification by Structured Subsampling for Deep Differentially Private Time
Series Forecasting* (Schuchardt et al., ICML 2025), referred to below as "the paper".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy._validate import require_choice as _require_choice
from lightning_dpts.privacy._validate import require_int as _require_int
from lightning_dpts.privacy._validate import require_nonnegative_float as _require_nonnegative_float
from lightning_dpts.privacy.mechanisms import (
    BOTTOM_LEVEL_SCHEMES,
    TOP_LEVEL_SCHEMES,
    BottomLevelScheme,
    TopLevelScheme,
)

__all__ = [
    "TOP_LEVELS",
    "BOTTOM_LEVELS",
    "LEVELS",
    "NeighbouringRelation",
    "SamplingSpec",
]

TopLevel = Literal["iteration", "shuffling", "without_replacement", "poisson", "b_min_sep", "cyclic_poisson"]
BottomLevel = Literal["with_replacement", "poisson"]
Level = Literal["event", "user"]

#: Names of the top-level schemes (the registry of :mod:`~lightning_dpts.privacy.mechanisms`).
TOP_LEVELS: tuple[str, ...] = tuple(TOP_LEVEL_SCHEMES)
#: Names of the bottom-level schemes.
BOTTOM_LEVELS: tuple[str, ...] = tuple(BOTTOM_LEVEL_SCHEMES)
LEVELS: tuple[str, ...] = ("event", "user")
#: Names of the top levels accounted per epoch (derived from the objects' ``accounts_per_epoch``).
EPOCH_LEVEL_TOP_LEVELS: tuple[str, ...] = tuple(n for n, c in TOP_LEVEL_SCHEMES.items() if c.accounts_per_epoch)


@dataclass(frozen=True)
class NeighbouringRelation:
    """The unit of privacy: which changes to one series the guarantee hides (Definitions 3.5-3.7).

    Args:
        level: ``"event"`` protects any ``size`` *consecutive* time steps of one series (w-event level,
            Definition 3.5); ``"user"`` protects any ``size`` time steps of one series, wherever they are
            (w-user level, Definition 3.6).
        size: w >= 1, the number of time steps the protected unit may change.
        value_bound: v > 0 in the units of the series, or ``None`` for unbounded changes. With a bound,
            each changed time step moves by at most v ((w, v)-relations, Definition 3.7). Only needed for
            amplification by context/forecast noise augmentation (Theorem G.1), whose noise std is
            ``context_noise * v`` and ``forecast_noise * v``.
        num_dims: D >= 1. With ``num_dims = D > 1`` the value bound holds for *each coordinate* of a
            D-dimensional series, so one time step moves by at most v*sqrt(D) in l2 (Appendix I.1). Keep 1
            for univariate series or when v already bounds the l2 norm of a whole time step.
    """

    level: Level = "event"
    size: int = 1
    value_bound: float | None = None
    num_dims: int = 1

    def __post_init__(self) -> None:
        _require_choice("level", self.level, LEVELS)
        _require_int("size", self.size, 1)
        _require_int("num_dims", self.num_dims, 1)
        if self.value_bound is not None:
            v = self.value_bound
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigurationError("value_bound", v, "must be a finite number > 0, or None (unbounded)")

    def windows_containing(self, window_length: int, num_start_positions: int) -> int:
        """k: how many of the T possible windows can contain (part of) the protected unit (Appendix I).

        w-event: L_C + L_F + w - 1 (the changed steps are adjacent); w-user: w * (L_C + L_F) (the changed
        steps can be placed so that no window holds two of them). Always capped at T (Appendix I.1).

        Args:
            window_length: L_C + L_F, the length of one sampled window (context incl. lags + forecast).
            num_start_positions: T = L - L_F + 1, the number of window start positions.
        """
        if self.level == "event":
            k = window_length + self.size - 1
        else:
            k = self.size * window_length
        return max(0, min(k, num_start_positions))

    @property
    def value_shift(self) -> float:
        """l2 distance, in units of v, between two windows that differ in the protected steps.

        sqrt(w) for w changed steps (Appendix I.2), times sqrt(D) when v bounds each of D coordinates
        (Appendix I.1). Used as the mean shift of the total-variation distance in Theorem G.1.
        """
        return math.sqrt(self.size * self.num_dims)


@dataclass(frozen=True)
class SamplingSpec:
    """Immutable description of bi-level structured subsampling (Algorithms 1-6 and Eq. 1 of the paper).

    Args:
        num_series: N, the number of training series.
        min_length: L, the length of the *shortest* training series, in time steps.
        lengths: the distinct lengths of all training series (time steps; ``(L,)``: every series has exactly L
            steps), or ``None``: every series has *at least* ``min_length`` steps, and the accountant takes the
            worst case over all lengths >= ``min_length`` (a finite range, :meth:`at_least_lengths`). The
            protected unit lies in one series, so the accountant takes the pointwise maximum of the per-length
            privacy profiles (see :func:`~lightning_dpts.privacy.bounds.select_profile` and docs/privacy.md):
            "the shortest series decides" is *not* sound for the Poisson bottom level or for augmentation with
            sigma_F != sigma_C. Stored sorted and deduplicated; must contain ``min_length`` and nothing
            shorter. The datamodule passes the exact lengths.
        context_length: L_C, the past window length actually read by the model, **including every lag**
            (DeepAR's context_length + max(lags_seq); Appendix B.4.2). Time steps.
        prediction_length: L_F, the forecast window length, in time steps.
        batch_size: Lambda, the (expected) number of windows per batch.
        instances_per_series: lambda, the (expected) number of windows per sampled series. Must divide
            ``batch_size``; the top-level sample holds N' = Lambda / lambda series.
        top_level: a top-level object of :mod:`~lightning_dpts.privacy.mechanisms` or its name:
            ``"iteration"`` (Algorithm 3), ``"shuffling"`` (Algorithm 3 over a fresh random permutation each
            epoch), ``"without_replacement"`` (Algorithm 5, a fresh sample of N' series every step), ``"poisson"``
            (each series independently with rate N'/N every step), ``"b_min_sep"`` or ``"cyclic_poisson"`` (k =
            ``bands`` groups, group t mod k eligible at step t, each eligible series with probability N' k / N).
            Stored as the *name* (the ``repr`` is written to privacy ledgers); :attr:`top_level_scheme` is the
            object. An object with a separation (:class:`~lightning_dpts.privacy.mechanisms.BMinSep`,
            :class:`~lightning_dpts.privacy.mechanisms.CyclicPoisson`) sets ``bands``.
        bottom_level: a bottom-level object or its name: ``"with_replacement"`` (Algorithm 4, lambda uniform
            start positions) or ``"poisson"`` (Algorithm 6, each start position with rate min(1, lambda/T)).
            Stored as the name; :attr:`bottom_level_scheme` is the object.
        relation: the neighbouring relation (unit of privacy).
        context_noise: sigma_C >= 0; the past target of every sampled window gets Gaussian noise with std
            ``context_noise * relation.value_bound`` (Eq. 1).
        forecast_noise: sigma_F >= 0; likewise for the future target.
        bands: b >= 1, the minimum separation between two participations of one series: b of the ``"b_min_sep"`` top
            level (a series that takes part is excluded for the next b - 1 steps), the number of groups k of
            ``"cyclic_poisson"``; must be 1 for every other top level. N'/N must be <= 1/b.
    """

    num_series: int
    min_length: int
    context_length: int
    prediction_length: int
    batch_size: int
    instances_per_series: int = 1
    top_level: TopLevel | TopLevelScheme = "without_replacement"
    bottom_level: BottomLevel | BottomLevelScheme = "with_replacement"
    relation: NeighbouringRelation = field(default_factory=NeighbouringRelation)
    context_noise: float = 0.0
    forecast_noise: float = 0.0
    lengths: tuple[int, ...] | None = None
    bands: int = 1

    def __post_init__(self) -> None:
        self._accept_objects()
        _require_int("num_series", self.num_series, 1)
        _require_int("context_length", self.context_length, 1)
        _require_int("prediction_length", self.prediction_length, 1)
        _require_int("min_length", self.min_length, 1)
        _require_int("batch_size", self.batch_size, 1)
        _require_int("instances_per_series", self.instances_per_series, 1)
        top_class = TOP_LEVEL_SCHEMES[_require_choice("top_level", self.top_level, TOP_LEVELS)]
        bottom_class = BOTTOM_LEVEL_SCHEMES[_require_choice("bottom_level", self.bottom_level, BOTTOM_LEVELS)]
        _require_nonnegative_float("context_noise", self.context_noise)
        _require_nonnegative_float("forecast_noise", self.forecast_noise)
        _require_int("bands", self.bands, 1)
        if self.bands != 1 and not top_class.separates_participations:
            raise ConfigurationError("bands", self.bands,
                                     "must be 1 unless top_level='b_min_sep' or top_level='cyclic_poisson'")
        if not isinstance(self.relation, NeighbouringRelation):
            raise ConfigurationError("relation", self.relation, "must be a NeighbouringRelation")
        if self.lengths is not None:
            object.__setattr__(self, "lengths", self._normalise_lengths(self.lengths))
        if self.min_length < self.prediction_length:
            raise ConfigurationError(
                "min_length",
                self.min_length,
                f"the shortest training series must have at least prediction_length={self.prediction_length} "
                "time steps (L >= L_F), otherwise no window fits",
            )
        if self.batch_size < self.instances_per_series:
            raise ConfigurationError(
                "batch_size",
                self.batch_size,
                f"must be >= instances_per_series={self.instances_per_series} (Lambda >= lambda)",
            )
        if self.batch_size % self.instances_per_series != 0:
            raise ConfigurationError(
                "batch_size",
                self.batch_size,
                f"must be divisible by instances_per_series={self.instances_per_series}; the theorems assume "
                "a top-level sample of exactly Lambda/lambda series",
            )
        if self.top_sample_size > self.num_series:
            raise ConfigurationError(
                "batch_size",
                self.batch_size,
                f"batch_size/instances_per_series = {self.top_sample_size} series per step exceeds "
                f"num_series={self.num_series}; lower batch_size or raise instances_per_series",
            )
        # the objects, kept out of the fields (and so out of repr, ==, hash and the ledger's spec repr)
        object.__setattr__(self, "_bottom_scheme", bottom_class())
        object.__setattr__(self, "_top_scheme", top_class.for_spec(self))
        self.top_level_scheme.check_spec(self)
        if self.has_augmentation and self.relation.value_bound is None:
            raise ConfigurationError(
                "relation.value_bound",
                None,
                "context_noise/forecast_noise are multiples of the value bound v (Eq. 1); set a value bound",
            )

    def _accept_objects(self) -> None:
        """Store mechanism objects given for ``top_level``/``bottom_level`` by name (one conversion, here)."""
        top = self.top_level
        if isinstance(top, TopLevelScheme):
            if top.min_separation != 1:
                if self.bands not in (1, top.min_separation):
                    raise ConfigurationError(
                        "bands", self.bands, f"must equal the top level's bands={top.min_separation} (or be left at 1)")
                object.__setattr__(self, "bands", top.min_separation)
            object.__setattr__(self, "top_level", top.name)
        if isinstance(self.bottom_level, BottomLevelScheme):
            object.__setattr__(self, "bottom_level", self.bottom_level.name)

    @property
    def top_level_scheme(self) -> TopLevelScheme:
        """The top-level object (:mod:`~lightning_dpts.privacy.mechanisms`): read its capability properties
        (``accounts_per_epoch``, ``needs_monte_carlo``, ``separates_participations``, ...) instead of comparing
        :attr:`top_level` with names."""
        return self._top_scheme  # type: ignore[attr-defined, no-any-return]

    @property
    def bottom_level_scheme(self) -> BottomLevelScheme:
        """The bottom-level object (:mod:`~lightning_dpts.privacy.mechanisms`)."""
        return self._bottom_scheme  # type: ignore[attr-defined, no-any-return]

    def _normalise_lengths(self, lengths: object) -> tuple[int, ...] | None:
        try:
            values = list(lengths)  # type: ignore[call-overload]
        except TypeError:
            raise ConfigurationError("lengths", lengths, "must be a sequence of integers (series lengths)") from None
        out: set[int] = set()
        for value in values:
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise ConfigurationError("lengths", value, "every length must be an integer >= min_length")
            out.add(int(value.__index__()))
        if not out:
            raise ConfigurationError("lengths", lengths, "must hold at least one length (or be None)")
        if min(out) != self.min_length:
            raise ConfigurationError(
                "lengths", min(out), f"the shortest of the lengths must equal min_length={self.min_length}"
            )
        return tuple(sorted(out))

    @property
    def distinct_lengths(self) -> tuple[int, ...]:
        """The distinct training-series lengths (``(min_length,)`` when ``lengths`` is ``None``)."""
        return (self.min_length,) if self.lengths is None else self.lengths

    def at_length(self, length: int) -> SamplingSpec:
        """This spec for a dataset in which every series has exactly ``length`` steps (one member of the
        maximum)."""
        return dataclasses.replace(self, min_length=int(length), lengths=(int(length),))

    def at_least_lengths(self) -> tuple[int, ...]:
        """The lengths L >= ``min_length`` whose profiles can attain the worst case over *every* length >=
        ``min_length`` (the reading of ``lengths=None``), with T = L - L_F + 1:

        * bottom level with replacement, no augmentation (Theorems 4.2, 4.4, E.1, F.1): r = min(k, T)/T is
          non-increasing in T and the profile non-decreasing in r: ``(min_length,)``;
        * augmentation (Theorem G.1): beyond T = L_C + L_F the worst-placed step is in every window and
          p2 = rho k (phi tau_F + (1 - phi) tau_C)/T falls as 1/T; the profile is non-decreasing in p2, so
          the maximum is attained at some T <= max(T_min, L_C + L_F);
        * bottom-level Poisson (Theorems E.8, F.2): k = min(k_max, T) and r = min(1, lambda/T), with the
          profile non-decreasing in both; for T >= max(k_max, lambda), k = k_max is constant and r falls, so
          the maximum is attained at some T <= max(T_min, k_max, lambda).

        (docs/privacy.md, "Series of different lengths".) The range is finite; as L -> infinity r = k/T -> 0.
        """
        if self.bottom_level_scheme.shortest_series_decides and not self.has_augmentation:
            return (self.min_length,)
        first = self.num_start_positions
        k_max = self.relation.windows_containing(self.window_length, 2**62)
        if self.has_augmentation:  # (k_max >= L_C + L_F; for T in [L_C + L_F, k_max] p2 is constant)
            last = max(first, k_max)
        else:
            last = max(first, k_max, self.instances_per_series)
        return tuple(range(self.min_length, self.min_length + last - first + 1))

    def matches_repr(self, text: str) -> bool:
        """Whether ``text`` is ``repr(self)``, or the repr this spec had before issue 26 (exactly one length
        was stored as ``lengths=None``): checkpoints and ledgers written then still resume."""
        if text == repr(self):
            return True
        return self.lengths is not None and len(self.lengths) == 1 and text == repr(
            dataclasses.replace(self, lengths=None))

    # ----------------------------------------------------------------------------------------------
    # Derived quantities (never stored twice)
    # ----------------------------------------------------------------------------------------------
    @property
    def top_sample_size(self) -> int:
        """N' = floor(Lambda / lambda), series per step (expected number for Poisson)."""
        return self.batch_size // self.instances_per_series

    @property
    def top_level_rate(self) -> float:
        """rho = N'/N, the probability that a given series is in a step's top-level sample."""
        return self.top_sample_size / self.num_series

    @property
    def window_length(self) -> int:
        """L_C + L_F, the length of one sampled window in time steps."""
        return self.context_length + self.prediction_length

    @property
    def num_start_positions(self) -> int:
        """T = L - L_F + 1, window start positions after zero-padding L_C steps in front (Algorithm 4)."""
        return self.min_length - self.prediction_length + 1

    @property
    def windows_per_unit(self) -> int:
        """k, how many windows can contain the protected unit (Appendix I), capped at T."""
        return self.relation.windows_containing(self.window_length, self.num_start_positions)

    @property
    def bottom_level_rate(self) -> float:
        """r. With replacement: k/T, the chance one sampled window holds the protected unit (Thm 4.2).

        Poisson: min(1, lambda/T), the inclusion rate of every start position (Algorithm 6).
        """
        return self.bottom_level_scheme.rate(self)

    @property
    def steps_per_epoch(self) -> int:
        """floor(N * lambda / Lambda) optimizer steps per epoch (Algorithm 1)."""
        return (self.num_series * self.instances_per_series) // self.batch_size

    @property
    def forecast_fraction(self) -> float:
        """phi = L_F / (L_C + L_F), the forecast-to-window ratio of Theorem G.1."""
        return self.prediction_length / self.window_length

    @property
    def has_augmentation(self) -> bool:
        """Whether context or forecast noise augmentation (Eq. 1) is configured."""
        return self.context_noise > 0 or self.forecast_noise > 0

    @property
    def accounts_per_epoch(self) -> bool:
        """Iteration/shuffling are accounted per epoch (Lemma E.2), sampling top levels per step."""
        return self.top_level_scheme.accounts_per_epoch

    def compositions(self, steps: int) -> int:
        """Number of mechanism compositions after ``steps`` optimizer steps.

        Per-step schemes compose once per step. Iteration/shuffling compose once per epoch of
        ``steps_per_epoch`` steps, and a started epoch counts whole. Cyclic Poisson composes once per participation
        opportunity of a series: ceil(steps / k).
        """
        _require_int("steps", steps, 0)
        return self.top_level_scheme.compositions(self, steps)

    def max_steps_for_compositions(self, compositions: int) -> int:
        """The largest number of optimizer steps that uses at most ``compositions`` compositions."""
        _require_int("compositions", compositions, 0)
        return self.top_level_scheme.max_steps_for_compositions(self, compositions)

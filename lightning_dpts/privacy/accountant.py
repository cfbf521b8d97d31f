"""The structured-subsampling privacy accountant: (spec, sigma) -> epsilon, delta, steps, noise.

Example:
    >>> from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant
    >>> spec = SamplingSpec(num_series=862, min_length=13916, context_length=96, prediction_length=24,
    ...                     batch_size=256)
    >>> acc = StructuredSubsamplingAccountant(spec, noise_multiplier=4.0)
    >>> round(acc.epsilon(10_000, delta=1e-7), 3)   # Theorem 4.4 on the paper's traffic configuration
    0.74
"""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import curve as _curve
from lightning_dpts.privacy._dp_accounting import PrivacyLossDistribution, symmetric_pld
from lightning_dpts.privacy.bounds import BOUNDS, naive_dpsgd_profile, select_profile
from lightning_dpts.privacy.pld import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_MIN_GRID_POINTS,
    DEFAULT_TAIL_MASS,
    MAX_COMPOSED_POINTS,
    MAX_GRID_POINTS,
    Composition,
    SquaredComposition,
    compose,
    compose_by_squaring,
    delta_from_pld,
    epsilon_for_delta,
    epsilon_from_pld,
    pld_from_profile,
    saddlepoint_tilt,
)
from lightning_dpts.privacy.profiles import PrivacyProfile, theorem_4_4
from lightning_dpts.privacy.risk import RiskReadout, compose_randomized_response, no_risk, risk_from_plds
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["MIN_DELTA", "AmplifiedBandMFAccountant", "ProfileAccountant", "StructuredSubsamplingAccountant",
           "calibrate_noise_multiplier", "narrow_noise_bracket",
           "PrivacyReport"]

_CACHE_SIZE = 32

#: Smallest delta the accountant reads out. Below it the tail truncation (and the FFT round-off of
#: dp_accounting's composition, about 1e-16 per grid point) would no longer be negligible against delta.
MIN_DELTA = 1e-18
#: Read-outs at delta >= this use the configured tail truncation (default 1e-15, Appendix B.4.3); smaller
#: deltas use a PLD truncated at 1e-27 per unit and 1e-22 per composition ("fine" level).
FINE_DELTA = 1e-6
_FINE_UNIT_TAIL = 1e-27
_FINE_COMPOSE_TAIL = 1e-22
#: The delta each read-out level aims the tilted composition at (pld.compose).
_TILT_DELTA = {0: 1e-6, 1: 1e-12}
#: Largest epsilon :func:`calibrate_noise_multiplier` accepts.
MAX_CALIBRATION_EPSILON = 1e3
#: The grid of a composed read-out is refined (halving the spacing) until n h^2 / s_n <= this (about 0.03%
#: relative excess of epsilon; see StructuredSubsamplingAccountant._grid).
GRID_ERROR = 1e-3
#: At most 2^this times finer than the unit's own refined grid.
MAX_REFINEMENT = 6
#: A composition by squaring whose estimated overstatement exceeds this warns once (RuntimeWarning).
STATED_EXCESS = 0.01
#: Largest number of compositions any read-out attempts.
MAX_COMPOSITIONS = 10**12


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not MIN_DELTA <= delta < 1:
        raise ConfigurationError("delta", delta, f"must lie in [{MIN_DELTA:g}, 1)")
    return float(delta)


class _TooLarge(Exception):
    """A composition would exceed :data:`~lightning_dpts.privacy.pld.MAX_COMPOSED_POINTS`."""


def _check_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ConfigurationError("epsilon", epsilon, "must be a finite number >= 0")
    if not (epsilon >= 0 and math.isfinite(epsilon)):
        raise ConfigurationError("epsilon", epsilon, "must be a finite number >= 0")
    return float(epsilon)


def _check_steps(name: str, steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ConfigurationError(name, steps, "must be an integer >= 0")
    return steps


@dataclass(frozen=True)
class PrivacyReport:
    """What a training run spent: (epsilon, delta) after ``steps`` optimizer steps under ``theorem``."""

    epsilon: float
    delta: float
    steps: int
    compositions: int
    unit: str
    theorem: str
    kind: str
    #: TPR at FPR 1e-3/1e-2 and the mu-GDP equivalent (:mod:`lightning_dpts.privacy.risk`); ``None`` where the
    #: accountant has no PLD (Monte Carlo).
    risk: RiskReadout | None = None


class ProfileAccountant:
    """Composition of one privacy profile with itself: the package's one composition path.

    The profile of one composition unit becomes a pessimistic connect-the-dots PLD (Lemma D.16) on the grid
    :meth:`_grid` picks for the count read out, composed by :class:`~lightning_dpts.privacy.pld.Composition`
    (tilted FFT with an explicit round-off bound), with tail truncations chosen from delta and the count
    (:data:`FINE_DELTA`, :meth:`_fine_only`). :class:`StructuredSubsamplingAccountant` (DP-SGD steps), the PETS
    accountant (:mod:`lightning_dpts.synthetic.privacy`, rounds) and the release accountant
    (:mod:`lightning_dpts.release.accounting`, releases) compose through it.

    Args:
        profile: the (symmetric) privacy profile of one unit.
        discretization: the coarsest privacy-loss grid spacing (Appendix B.4.3: 1e-3).
        tail_mass_truncation: mass beyond the grid, accounted as infinite loss (Appendix B.4.3: 1e-15).
        min_grid_points: refine grid 0 until the unit's loss range holds this many points (0: the fixed
            ``discretization`` grid).
        scale: (name, value) of the parameter that sets the noise, for error messages.
    """

    def __init__(self, profile: PrivacyProfile, *, discretization: float = DEFAULT_DISCRETIZATION,
                 tail_mass_truncation: float = DEFAULT_TAIL_MASS, min_grid_points: int = DEFAULT_MIN_GRID_POINTS,
                 scale: tuple[str, float] = ("noise_multiplier", math.nan)) -> None:
        if not (isinstance(discretization, (int, float)) and 0 < discretization <= 1):
            raise ConfigurationError("discretization", discretization, "must lie in (0, 1]")
        if not (isinstance(tail_mass_truncation, (int, float)) and 0 < tail_mass_truncation <= 1e-6):
            raise ConfigurationError("tail_mass_truncation", tail_mass_truncation, "must lie in (0, 1e-6]")
        if isinstance(min_grid_points, bool) or not isinstance(min_grid_points, int) or min_grid_points < 0:
            raise ConfigurationError("min_grid_points", min_grid_points, "must be an integer >= 0")
        self.profile = profile
        self.discretization = float(discretization)
        self.tail_mass_truncation = float(tail_mass_truncation)
        self.min_grid_points = min_grid_points
        self._scale = scale
        self._unit_plds: dict[tuple[int, int], PrivacyLossDistribution] = {}
        self._compositions: dict[tuple[int, int], Composition] = {}
        self._composed: OrderedDict[tuple[int, int], tuple[list[PrivacyLossDistribution],
                                                            PrivacyLossDistribution | None]] = OrderedDict()
        self._squared_cache: dict[tuple[int, int], SquaredComposition] = {}
        self._single: dict[float, float] = {}  # epsilon of one unit (the profile itself) by delta
        self._warned = False

    def epsilon_after(self, compositions: int, delta: float) -> float:
        """epsilon after ``compositions`` units at ``delta`` (one unit: the profile itself, no discretisation).

        Raises ConfigurationError (``compositions``) beyond the memory bound."""
        delta = _check_delta(delta)
        _check_steps("compositions", compositions)
        try:
            value = self._epsilon_units(compositions, delta)
            self._state_excess(compositions, delta)
            return value
        except _TooLarge:
            raise self._too_many(compositions) from None

    def delta_after(self, compositions: int, epsilon: float) -> float:
        """The smallest delta (in [0, 1]) after ``compositions`` units at ``epsilon``."""
        epsilon = _check_epsilon(epsilon)
        _check_steps("compositions", compositions)
        if compositions == 0:
            return 0.0
        if compositions == 1:
            # e^eps overflows beyond eps ~ 709; delta is non-increasing, so its value at 700 bounds it there
            value = float(self.profile.delta(min(epsilon, 700.0))[0])
            return min(1.0, max(0.0, value))
        try:
            if self._fine_only(compositions):
                return self._delta(compositions, 1, epsilon)
            coarse = self._delta(compositions, 0, epsilon)
            if coarse >= FINE_DELTA:
                return coarse
            return min(coarse, self._delta(compositions, 1, epsilon))
        except _TooLarge:
            raise self._too_many(compositions) from None

    def composed_pld(self, compositions: int) -> PrivacyLossDistribution:
        """PLD after ``compositions`` units at the default tail truncation (cached, most recent first).

        Raises:
            ConfigurationError: the composition would exceed the memory bound (``steps`` for DP-SGD, ``compositions``
                otherwise).
        """
        try:
            plds = self._composed_at(compositions, 0)
            return plds[-1]
        except _TooLarge:
            raise self._too_many(compositions) from None

    def _too_many(self, compositions: int) -> ConfigurationError:
        return ConfigurationError(
            "compositions", compositions,
            f"more than this accountant composes in bounded memory (at most {MAX_COMPOSED_POINTS} privacy-loss "
            "grid points)",
        )

    def _tails(self, level: int) -> tuple[float, float]:
        """(unit, composition) tail-mass truncation of read-out level 0 (delta >= FINE_DELTA) or 1."""
        if level == 0:
            return self.tail_mass_truncation, self.tail_mass_truncation
        return min(self.tail_mass_truncation, _FINE_UNIT_TAIL), min(self.tail_mass_truncation, _FINE_COMPOSE_TAIL)

    def _unit(self, level: int, grid: int = 0) -> PrivacyLossDistribution:
        """The unit PLD at read-out ``level`` on grid ``grid`` of the ladder: grid 0 is the refined spacing h_0
        (``discretization``, refined to ``min_grid_points`` points, :func:`~lightning_dpts.privacy.pld.grid_spacing`),
        grid j the spacing h_0 / 2^j, never coarser than ``discretization``."""
        key = (level, grid)
        if key not in self._unit_plds:
            try:
                if grid == 0:
                    unit = pld_from_profile(self.profile, self.discretization, self._tails(level)[0],
                                            self.min_grid_points)
                else:
                    h0 = self._composition(level, 0).h
                    unit = pld_from_profile(self.profile, min(self.discretization, h0 * 2.0**-grid),
                                            self._tails(level)[0], 0)
            except ValueError as err:  # the loss range does not fit the grid bound: sigma far too small
                raise ConfigurationError(
                    self._scale[0], self._scale[1], f"is too small to account ({err}); raise the noise",
                ) from None
            self._unit_plds[key] = unit
        return self._unit_plds[key]

    def _composition(self, level: int, grid: int = 0) -> Composition:
        """The untilted :class:`~lightning_dpts.privacy.pld.Composition` of :meth:`_unit` (kept, so its Chernoff
        log-MGF and FFT spectrum serve every count)."""
        key = (level, grid)
        if key not in self._compositions:
            self._compositions[key] = Composition(self._unit(level, grid), self._tails(level)[1], 0.0)
        return self._compositions[key]

    def _grid(self, compositions: int, level: int) -> int:
        """The ladder grid of the FFT composition for ``compositions`` units (:meth:`_grid_and_limit`)."""
        return self._grid_and_limit(compositions, level)[0]

    def _grid_and_limit(self, compositions: int, level: int) -> tuple[int, bool]:
        """The ladder grid for ``compositions`` units (see :meth:`_unit`).

        The connect-the-dots error of every unit (Lemma D.16) adds up over the compositions: on the paper's
        configurations the relative excess of epsilon after n units on spacing h is about 0.3 n h^2 / s_n, with
        s_n = sqrt(n Var[L]) the standard deviation of the composed privacy loss (electricity-like, n = 10^4:
        0.34% at h = 4e-4, 0.08% at 2e-4, 0.016% at 1e-4). The grid is the coarsest with n h^2 / s_n <=
        :data:`GRID_ERROR` (at most 2^:data:`MAX_REFINEMENT` times finer than grid 0), unless the composed range
        would exceed :data:`~lightning_dpts.privacy.pld.MAX_COMPOSED_POINTS`: then the finest that fits, and the
        second value (limited) is True, which sends the count to the composition by squaring (:meth:`_squares`).
        """
        if compositions <= 1 or self.min_grid_points == 0:  # min_grid_points=0: the fixed grid of Appendix B.4.3
            return 0, False
        base = self._composition(level, 0)
        lo, hi = base.window(compositions)
        width = hi - lo + 1
        spread = math.sqrt(max(compositions * base.var, 1e-300))
        excess = compositions * base.h**2 / (spread * GRID_ERROR)  # n h^2 / (s_n GRID_ERROR) on grid 0
        finer = max(0, math.ceil(0.5 * math.log2(excess))) if excess > 1 else 0
        fits = math.floor(math.log2(MAX_COMPOSED_POINTS / width))  # the composed range at grid j: width 2^j
        unit_limit = math.floor(math.log2(MAX_GRID_POINTS / base.probs.size)) - 1
        wanted = min(finer, MAX_REFINEMENT, unit_limit)
        return min(wanted, fits), fits < wanted

    def _plain(self, compositions: int, level: int) -> tuple[int | None, list[PrivacyLossDistribution]]:
        """(grid, untilted composed PLDs, each an upper bound) for ``compositions`` units at ``level``.

        Huge counts (:meth:`_fine_only`) are composed by squaring (grid ``None``; :func:`~lightning_dpts.privacy.
        pld.compose_by_squaring`). Otherwise by FFT on :meth:`_grid`'s grid, or the next coarser grids if its
        range exceeds the memory bound; where the memory bound limits that grid (or no grid fits), the composition
        by squaring is added and the read-outs take the better of the two. Raises _TooLarge beyond
        :data:`MAX_COMPOSITIONS`, or with ``min_grid_points=0`` beyond the memory bound.
        """
        if compositions > MAX_COMPOSITIONS:
            raise _TooLarge
        grid, limited = self._grid_and_limit(compositions, level)
        if self._squares(compositions, False):
            return None, [self._squared(compositions, level).pld]
        while True:
            try:
                plain = self._composition(level, grid).power(compositions)
                break
            except OverflowError:
                h0 = self._composition(level, 0).h
                limited = True
                if self.min_grid_points == 0 or h0 * 2.0**-grid >= self.discretization:
                    if self._squares(compositions, True):
                        return None, [self._squared(compositions, level).pld]
                    raise _TooLarge from None
                grid -= 1
        if self._squares(compositions, limited):
            return grid, [plain, self._squared(compositions, level).pld]
        return grid, [plain]

    def _squares(self, compositions: int, limited: bool) -> bool:
        """Whether ``compositions`` units are composed by squaring (:func:`~lightning_dpts.privacy.pld.
        compose_by_squaring`): huge counts (:meth:`_fine_only`: the FFT's grid and round-off no longer keep
        epsilon within 1%), or a count whose FFT grid is limited by the memory bound. Not with
        ``min_grid_points=0`` (the fixed grid of Appendix B.4.3)."""
        return self.min_grid_points > 0 and compositions > 1 and (self._fine_only(compositions) or limited)

    def _squared(self, compositions: int, level: int) -> SquaredComposition:
        """The composition by squaring of the level's unit (grid 0), cached with the read-out level."""
        key = (level, compositions)
        if key not in self._squared_cache:
            try:
                result = compose_by_squaring(self._unit(level, 0), compositions, self._tails(level)[1])
            except OverflowError:
                raise _TooLarge from None
            self._squared_cache[key] = result
            if len(self._squared_cache) > _CACHE_SIZE:
                self._squared_cache.pop(next(iter(self._squared_cache)))
        return self._squared_cache[key]

    def excess_estimate(self, compositions: int, delta: float) -> float:
        """Estimated relative overstatement of :meth:`epsilon_after` (``compositions`` units at ``delta``) by the
        discretisation and round-off bounds (the result is an upper bound on the true epsilon in any case).

        Squaring (huge counts): half the relative excess of the composed loss variance over n times the unit's
        (the re-gridding's spreading; epsilon of a Gaussian-like loss scales with its standard deviation) plus
        the part of epsilon due to the round-off bound, computed exactly (epsilon at delta against epsilon at
        delta / (1 - 2r), the PLD without the bound's factor). Against the Gaussian closed form it was within 5%
        of the true excess at 10^9 to 10^11 steps (tests/privacy/test_huge_steps.py). FFT: 0.3 n h^2 / s_n
        (:meth:`_grid`, measured on the paper's configurations).
        """
        delta = _check_delta(delta)
        _check_steps("compositions", compositions)
        if compositions <= 1:
            return 0.0
        level = 1 if (self._fine_only(compositions) or delta < FINE_DELTA) else 0
        try:
            grid, limited = self._grid_and_limit(compositions, level)
            if self._squares(compositions, limited):
                result = self._squared(compositions, level)
                eps = epsilon_from_pld(result.pld, delta)
                # without the round-off bound's factor 1 / (1 - 2r) the PLD's delta(eps) is (1 - 2r) times lower
                exact = epsilon_from_pld(result.pld, min(delta / (1.0 - 2.0 * result.round_off), 1.0 - 1e-12))
                part = (eps - exact) / eps if eps > 0 and math.isfinite(eps) else 0.0
                return 0.5 * max(result.variance_excess, 0.0) + max(part, 0.0)
        except _TooLarge:
            raise self._too_many(compositions) from None
        base = self._composition(level, grid)
        h = base.h
        return 0.3 * compositions * h * h / math.sqrt(max(compositions * base.var, 1e-300))

    def _state_excess(self, compositions: int, delta: float) -> None:
        """Warn once (RuntimeWarning) when a read-out composed by squaring is estimated to overstate epsilon by
        more than :data:`STATED_EXCESS` (:meth:`excess_estimate`; huge counts beyond about 10^10)."""
        if self._warned or compositions <= 1 or not self._squares(
                compositions, self._grid_and_limit(compositions, 1 if self._fine_only(compositions) else 0)[1]):
            return
        estimate = self.excess_estimate(compositions, delta)
        if estimate > STATED_EXCESS:
            self._warned = True
            warnings.warn(f"epsilon after {compositions} compositions at delta={delta:g} may be overstated by about "
                          f"{estimate:.2%} (discretisation and round-off bounds of the composition by squaring; "
                          "excess_estimate() returns it); it remains an upper bound", RuntimeWarning, stacklevel=3)

    def prepare(self, delta: float) -> None:
        """Build what every read-out at ``delta`` starts from: the unit PLDs of its read-out levels (at grid 0) and
        epsilon of one unit. A :meth:`clone` made afterwards shares them (the AccountantCallback builds them once,
        then searches the budget and computes its epsilon table in two threads)."""
        delta = _check_delta(delta)
        try:
            for level in (0, 1) if delta < FINE_DELTA else (0,):
                self._unit(level, 0)
            self._epsilon_units(1, delta)
        except _TooLarge:  # pragma: no cover - one unit is never beyond the memory bound
            pass

    def plds(self, compositions: int, delta: float) -> list[PrivacyLossDistribution]:
        """The pessimistic PLDs after ``compositions`` >= 1 units that the read-outs at ``delta`` take the best of (one
        unit: the unit PLD; more: the untilted and, where composed, the tilted and squared ones, at the read-out
        level of ``delta``). Each is an upper bound on its own.

        Raises ConfigurationError (``compositions``, ``steps`` for DP-SGD) beyond the memory bound."""
        delta = _check_delta(delta)
        _check_steps("compositions", compositions)
        if compositions < 1:
            raise ConfigurationError("compositions", compositions, "must be >= 1")
        level = 1 if (self._fine_only(compositions) or delta < FINE_DELTA) else 0
        try:
            return [self._unit(level, 0)] if compositions == 1 else list(self._composed_at(compositions, level))
        except _TooLarge:
            raise self._too_many(compositions) from None

    def risk_after(self, compositions: int, delta: float, *, pure_epsilons: Sequence[float] = ()) -> RiskReadout:
        """Membership-attack read-outs after ``compositions`` units (:mod:`lightning_dpts.privacy.risk`): TPR at FPR
        1e-3 and 1e-2 and the mu-GDP equivalent down to ``delta``, from the same pessimistic PLDs as
        :meth:`epsilon_after` (the best of them; upper bounds on the risk).

        Args:
            pure_epsilons: epsilons of further (epsilon, 0)-DP releases about the same data (e.g. Laplace counts),
                composed as randomized response, the pair that dominates every such mechanism.
        """
        delta = _check_delta(delta)
        _check_steps("compositions", compositions)
        if compositions == 0 and not pure_epsilons:
            return no_risk(delta)
        if compositions == 0:
            plds = [symmetric_pld(self.discretization, 0, np.ones(1), 0.0)]  # no privacy loss at all
        else:
            plds = self.plds(compositions, delta)
        for eps in pure_epsilons:
            plds = [compose_randomized_response(p, float(eps)) for p in plds]
        return risk_from_plds(plds, delta)

    @property
    def unit_pld(self) -> PrivacyLossDistribution:
        """The PLD of one composition unit at the default tail truncation (built once, lazily)."""
        return self._unit(0, 0)

    def _composed_at(self, compositions: int, level: int) -> list[PrivacyLossDistribution]:
        """Upper-bounding PLDs after ``compositions`` units at read-out ``level`` (each is pessimistic; the
        read-outs take the best of them, so they stay monotone in delta and inverse to each other): the untilted
        ones and, where one was composed, the tilted one (:meth:`_composed_parts`)."""
        untilted, tilted = self._composed_parts(compositions, level)
        return untilted if tilted is None else [*untilted, tilted]

    def _composed_parts(self, compositions: int, level: int) -> tuple[list[PrivacyLossDistribution],
                                                                      PrivacyLossDistribution | None]:
        """(untilted PLDs, tilted PLD or ``None``) after ``compositions`` units at ``level``, cached (most recent
        first; the epsilon curve reads the untilted ones too).

        On the grid of :meth:`_grid` (the finest that fits the count; coarser, still pessimistic, when the range
        would exceed :data:`~lightning_dpts.privacy.pld.MAX_COMPOSED_POINTS`). Composed by
        :class:`~lightning_dpts.privacy.pld.Composition` untilted and, for the fine level, also tilted at the
        saddle point of the epsilon the untilted one gives at delta = :data:`_TILT_DELTA` of the level.
        """
        key = (level, compositions)
        if key in self._composed:
            self._composed.move_to_end(key)
            return self._composed[key]
        tilted = None
        if compositions == 1:
            plds = [self._unit(level, 0)]
        else:
            grid, plds = self._plain(compositions, level)
            tilt = 0.0
            if level > 0 and grid is not None:  # below FINE_DELTA the FFT round-off can matter: add the tilted one
                unit = self._unit(level, grid)
                tilt = saddlepoint_tilt(unit, compositions, epsilon_from_pld(plds[0], _TILT_DELTA[level]))
            if tilt != 0.0:
                try:
                    tilted = compose(unit, compositions, self._tails(level)[1], tilt)
                except OverflowError:
                    pass  # the untilted one alone is an upper bound
        self._composed[key] = (plds, tilted)
        if len(self._composed) > _CACHE_SIZE:
            self._composed.popitem(last=False)
        return plds, tilted

    def _eps(self, compositions: int, level: int, delta: float) -> float:
        return min(epsilon_from_pld(p, delta) for p in self._composed_at(compositions, level))

    def _delta(self, compositions: int, level: int, epsilon: float) -> float:
        return min(delta_from_pld(p, epsilon) for p in self._composed_at(compositions, level))

    def _epsilon_units(self, compositions: int, delta: float) -> float:
        """epsilon after ``compositions`` units (raises _TooLarge); monotone in delta and compositions."""
        if compositions == 0:
            return 0.0
        if compositions == 1:  # one unit: the profile itself, no discretisation
            if delta not in self._single:
                self._single[delta] = float(epsilon_for_delta(self.profile, delta, rtol=1e-9))
            return self._single[delta]
        if self._fine_only(compositions):
            return self._eps(compositions, 1, delta)
        if delta >= FINE_DELTA:
            return self._eps(compositions, 0, delta)
        # Finer truncation below FINE_DELTA; never below the value at the level boundary (monotone in delta).
        return max(self._eps(compositions, 1, delta), self._eps(compositions, 0, FINE_DELTA))

    def _fine_only(self, compositions: int) -> bool:
        """Whether ``compositions`` units are read at the fine level for every delta: the coarse level's tail,
        ``tail_mass_truncation`` per unit, would add up to more than 1e-3 FINE_DELTA at +infinity (n > 10^6 at
        the default 1e-15), which is not negligible against delta >= FINE_DELTA. One level for every delta keeps
        the read-outs monotone in delta."""
        return compositions * self.tail_mass_truncation > 1e-3 * FINE_DELTA



def _strategy(spec: SamplingSpec, coefficients: Sequence[float] | None,
              naive: bool) -> tuple[tuple[float, ...] | None, float]:
    """(coefficients, largest column norm of C) of the noise; (None, 1.0) for i.i.d. Gaussian noise."""
    if coefficients is None:
        return None, 1.0
    try:
        c = tuple(float(v) for v in coefficients)
    except (TypeError, ValueError):
        raise ConfigurationError("coefficients", coefficients, "must be a sequence of numbers (c_0, ..., c_{b-1})"
                                 ) from None
    if not c or not all(math.isfinite(v) for v in c) or c[0] <= 0:
        raise ConfigurationError("coefficients", coefficients, "must be finite numbers with c_0 > 0")
    bands = len(c)
    if naive and bands > 1:
        raise ConfigurationError("naive", naive, "naive DP-SGD accounting does not take BandMF coefficients")
    top = spec.top_level_scheme
    if bands > 1 and not top.pld_bands_covered(bands):
        raise ConfigurationError(
            "coefficients", len(c),
            f"BandMF noise with {bands} bands is covered by the structured (PLD) accountant only with "
            f"top_level='cyclic_poisson' and groups (spec.bands) >= {bands}: two participations of one series "
            f"must be >= b steps apart so that they move disjoint rows of C (docs/bandmf.md, Theorem B.2); got "
            f"top_level={spec.top_level!r} with bands={spec.bands}",
        )
    # C is Toeplitz: every column is (c_0, ..., c_{b-1}) truncated at the last row; the untruncated one is largest
    return c, math.sqrt(math.fsum(v * v for v in c))


def _effective_sigma(noise_multiplier: float, column_norm: float) -> float:
    """sigma / ||c||: a participation of sensitivity ||c|| Delta under noise sigma is the unit-sensitivity one under
    sigma / ||c|| (the Gaussian mechanism depends on the ratio only)."""
    try:
        sigma = float(noise_multiplier)
    except (TypeError, ValueError):
        return noise_multiplier  # type: ignore[return-value]  (select_profile names the bad value)
    return sigma if column_norm == 1.0 else sigma / column_norm


class StructuredSubsamplingAccountant(ProfileAccountant):
    """Privacy accounting for DP-SGD with bi-level structured subsampling (the paper's Sections 4.1-4.3).

    The accountant selects the theorem for ``spec`` (see :func:`~lightning_dpts.privacy.bounds.select_profile`),
    turns that single per-step (or per-epoch) privacy profile into a pessimistic connect-the-dots privacy-loss
    distribution (Lemma D.16) and composes it through :class:`ProfileAccountant` (grid chosen for the count,
    tails from delta and the count, bounded tilted FFT).

    Args:
        spec: the sampling description, e.g. ``datamodule.sampling_spec``.
        noise_multiplier: sigma > 0; the noise std on the summed clipped gradient is ``sigma * C``.
        bound: ``"upper"`` (default; the best sound guarantee) or ``"lower"`` (the paper's optimistic lower
            bound, Theorems 4.3/F.7/F.8 -- useful for comparisons, never as a guarantee).
        discretization: the coarsest privacy-loss grid spacing (default 1e-3, as in Appendix B.4.3).
        tail_mass_truncation: mass allowed beyond the grid, accounted as infinite loss (default 1e-15).
        min_grid_points: refine the grid below ``discretization`` until the per-unit loss range holds this
            many points (default 4096; 0 disables, and with it the grid ladder: the fixed grid of Appendix B.4.3).
            Each read-out then refines further for its count (``_grid``). See
            :func:`~lightning_dpts.privacy.pld.pld_from_profile`.
        naive: if ``True``, account naive DP-SGD over the flattened set of all windows instead
            (Proposition C.1 for ``bound="upper"``: what standard DP-SGD would report; Proposition C.2 for
            ``bound="lower"``: its true leakage under the spec's relation). For comparisons only.
        coefficients: (c_0, ..., c_{b-1}) of the b-banded lower-triangular Toeplitz strategy C of BandMF noise
            (``None``: i.i.d. Gaussian noise, C = I). Needs a top level that covers b bands by the PLD accountant
            (``cyclic_poisson`` with k = ``spec.bands`` >= b groups, docs/bandmf.md Theorem B.2): one participation
            moves the output C G + sigma Z by its column of C, so every composition unit is the structured step
            with sensitivity multiplied by the largest column norm ||c||_2, i.e. noise multiplier sigma / ||c||_2.
    """

    def __init__(
        self,
        spec: SamplingSpec,
        noise_multiplier: float,
        *,
        bound: str = "upper",
        discretization: float = DEFAULT_DISCRETIZATION,
        tail_mass_truncation: float = DEFAULT_TAIL_MASS,
        min_grid_points: int = DEFAULT_MIN_GRID_POINTS,
        naive: bool = False,
        coefficients: Sequence[float] | None = None,
    ) -> None:
        if not isinstance(spec, SamplingSpec):
            raise ConfigurationError("spec", spec, "must be a lightning_dpts.privacy.SamplingSpec")
        if spec.top_level_scheme.needs_monte_carlo:
            raise ConfigurationError(
                "spec.top_level", spec.top_level,
                "is not covered by the structured (PLD) accountant: b-min-sep sampling is accounted by the Monte "
                "Carlo accountant, lightning_dpts.privacy.montecarlo.MonteCarloAccountant (AccountantCallback builds "
                "it for you; docs/bandmf.md)",
            )
        if bound not in BOUNDS:
            raise ConfigurationError("bound", bound, "must be 'upper' or 'lower'")
        self.spec = spec
        self.bound = bound
        self.naive = bool(naive)
        self.coefficients, self.column_norm = _strategy(spec, coefficients, self.naive)
        if self.naive:
            profile = naive_dpsgd_profile(spec, noise_multiplier, bound)
        else:
            profile = select_profile(spec, _effective_sigma(noise_multiplier, self.column_norm), bound)
        self.noise_multiplier = float(noise_multiplier)
        super().__init__(profile, discretization=discretization, tail_mass_truncation=tail_mass_truncation,
                         min_grid_points=min_grid_points, scale=("noise_multiplier", self.noise_multiplier))

    def clone(self) -> StructuredSubsamplingAccountant:
        """A new accountant with the same settings for another thread (the compositions' caches are not
        thread-safe): it starts with this one's unit PLDs and one-unit epsilons (immutable, so shared; see
        :meth:`prepare`) and empty composition caches."""
        other = StructuredSubsamplingAccountant(
            self.spec, self.noise_multiplier, bound=self.bound, discretization=self.discretization,
            tail_mass_truncation=self.tail_mass_truncation, min_grid_points=self.min_grid_points, naive=self.naive,
            coefficients=self.coefficients,
        )
        other._unit_plds = dict(self._unit_plds)
        other._single = dict(self._single)
        return other

    # ------------------------------------------------------------------------------------------------
    @property
    def theorem(self) -> str:
        """The result that proves the bound in use, e.g. ``"Theorem 4.4"``."""
        return self.profile.theorem

    @property
    def kind(self) -> str:
        """``"tight"``, ``"upper"`` or ``"lower"`` (see :class:`~lightning_dpts.privacy.profiles.PrivacyProfile`)."""
        return self.profile.kind

    @property
    def unit(self) -> str:
        """The unit of composition: ``"epoch"`` for iteration/shuffling, ``"opportunity"`` (a participation
        opportunity of a series, every k steps) for cyclic Poisson, ``"step"`` otherwise."""
        return "step" if self.naive else self.spec.top_level_scheme.composition_unit

    def compositions(self, steps: int) -> int:
        """How many units ``steps`` optimizer steps compose (a started epoch counts whole)."""
        _check_steps("steps", steps)
        return steps if self.naive else self.spec.compositions(steps)

    def _steps_for(self, compositions: int) -> int:
        return compositions if self.naive else self.spec.max_steps_for_compositions(compositions)

    def _too_many(self, compositions: int) -> ConfigurationError:
        return ConfigurationError(
            "steps", self._steps_for(compositions),
            f"{compositions} {self.unit}s are more than this accountant composes in bounded memory "
            f"(at most {MAX_COMPOSED_POINTS} privacy-loss grid points); account fewer steps",
        )

    def epsilon_curve(self, compositions: int, delta: float, *, rtol: float = 0.01,
                      start: int = 1) -> Iterator[tuple[int, float]]:
        """Epsilon at increasing composition counts ``start = c_0 < c_1 < ... = compositions``, lazily.

        Each value e_i is a sound upper bound on epsilon after c_i units at ``delta`` (a pessimistic PLD of
        Lemma D.16, composed in batches on the coarsest grid of the ladder whose excess over this accountant's
        own grid, measured at the last count, is at most ``rtol / 4``, and with an exponential tilt too where the
        FFT's round-off bound would matter; :mod:`lightning_dpts.privacy.curve`). Since
        the true epsilon is nondecreasing in the count, e_{i+1} bounds epsilon at every count in (c_i, c_{i+1}],
        and the counts are chosen so that it is within a factor 1 + ``rtol`` of :meth:`epsilon_after` at every
        such count (consecutive values differ by at most that factor, over the grid's measured excess, wherever
        one composition does not already step further). Every value is >= :meth:`epsilon_after` at the same count
        up to round-off (nested grids: a coarser connect-the-dots PLD dominates a finer one).

        Raises ConfigurationError (``steps``) when a count exceeds the memory bound.
        """
        delta = _check_delta(delta)
        _check_steps("compositions", compositions)
        if not 0 < rtol <= 1:
            raise ConfigurationError("rtol", rtol, "must lie in (0, 1]")
        curve = _curve.epsilon_curve(self, compositions, delta, rtol, start, fine_delta=FINE_DELTA)
        while True:
            try:
                point = next(curve)
            except StopIteration:
                return
            except _TooLarge:
                raise self._too_many(compositions) from None
            yield point

    def risk_curve(self, compositions: int, delta: float, *, rtol: float = 0.01,
                   start: int = 1) -> Iterator[tuple[int, float, RiskReadout]]:
        """:meth:`epsilon_curve` with the risk read-outs of every point, (count, epsilon, :class:`~lightning_dpts.
        privacy.risk.RiskReadout`), read from the same compositions (TPR at FPR 1e-3/1e-2, mu-GDP down to ``delta``;
        upper bounds that grow with the count, like epsilon). The AccountantCallback logs from it."""
        delta = _check_delta(delta)
        _check_steps("compositions", compositions)
        if not 0 < rtol <= 1:
            raise ConfigurationError("rtol", rtol, "must lie in (0, 1]")
        curve = _curve.risk_curve(self, compositions, delta, rtol, start, fine_delta=FINE_DELTA)
        while True:
            try:
                point = next(curve)
            except StopIteration:
                return
            except _TooLarge:
                raise self._too_many(compositions) from None
            yield point

    # ------------------------------------------------------------------------------------------------
    # read-outs
    # ------------------------------------------------------------------------------------------------
    def epsilon(self, steps: int, delta: float) -> float:
        """The smallest epsilon such that training for ``steps`` optimizer steps is (epsilon, delta)-DP.

        One composition unit is read from the profile directly; more from the pessimistic PLD, with a tail
        truncation chosen from ``delta`` (:data:`FINE_DELTA`). ``math.inf`` only when no finite epsilon is
        certified. Raises ConfigurationError (``steps``) when the composition exceeds the memory bound.
        """
        delta = _check_delta(delta)
        n = self.compositions(steps)
        try:
            value = self._epsilon_units(n, delta)
            self._state_excess(n, delta)
            return value
        except _TooLarge:
            raise self._too_many(n) from None

    def epsilons(self, steps: Sequence[int], delta: float) -> list[float]:
        """:meth:`epsilon` for several step counts."""
        return [self.epsilon(s, delta) for s in steps]

    def delta(self, steps: int, epsilon: float) -> float:
        """The smallest delta (in [0, 1]) such that training for ``steps`` steps is (epsilon, delta)-DP."""
        epsilon = _check_epsilon(epsilon)
        return self.delta_after(self.compositions(steps), epsilon)

    def max_steps(self, epsilon: float, delta: float, *, limit: int = 10**9, stop_at: int | None = None) -> int:
        """The largest number of optimizer steps whose composed epsilon stays <= ``epsilon`` at ``delta``.

        For iteration/shuffling this is a whole number of epochs times the steps per epoch. Returns 0 if even
        one unit exceeds the budget. Time and memory are bounded: raises ConfigurationError (``epsilon``) if
        the budget allows more than ``limit`` steps, or more compositions than the accountant evaluates in
        bounded memory (the message gives the number of steps known to fit).

        Args:
            stop_at: search only up to this many steps (e.g. a Trainer's plan): if the budget allows them (their
                compositions), return ``stop_at`` rounded up to whole units without searching further.
        """
        epsilon = _check_epsilon(epsilon)
        delta = _check_delta(delta)

        def fits(n: int) -> bool:
            return self._epsilon_units(n, delta) <= epsilon

        if not fits(1):
            return 0
        if stop_at is not None:
            _check_steps("stop_at", stop_at)
            planned = max(1, self.compositions(stop_at))
            try:
                if fits(planned):
                    return self._steps_for(planned)
            except _TooLarge:
                pass  # the plan is beyond the memory bound: search below it
        lo, hi = 1, 2
        try:
            while fits(hi):
                lo = hi
                if self._steps_for(lo) > limit:
                    raise ConfigurationError(
                        "epsilon", epsilon, f"the budget allows more than limit={limit} steps; lower epsilon or "
                        "raise the limit"
                    )
                hi *= 2
        except _TooLarge:
            raise ConfigurationError(
                "epsilon", epsilon,
                f"the budget allows at least {self._steps_for(lo)} steps, more than this accountant composes in "
                "bounded memory; lower epsilon (or stop training by a step count you choose)",
            ) from None
        while hi - lo > 1:  # invariant: fits(lo), not fits(hi)
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return self._steps_for(lo)

    def risk(self, steps: int, delta: float, *, pure_epsilons: Sequence[float] = ()) -> RiskReadout:
        """Membership-attack read-outs after ``steps`` optimizer steps (:meth:`ProfileAccountant.risk_after`): TPR at
        FPR 1e-3 and 1e-2 for the unit of privacy and the mu-GDP equivalent down to ``delta``. Upper bounds on the
        risk with ``bound="upper"``; with ``bound="lower"`` those of the optimistic lower bound (comparisons only)."""
        _check_steps("steps", steps)
        return self.risk_after(self.compositions(steps), delta, pure_epsilons=pure_epsilons)

    def report(self, steps: int, delta: float) -> PrivacyReport:
        """A :class:`PrivacyReport` of (epsilon, delta) after ``steps`` steps, with the bound used and the risk
        read-outs (:meth:`risk`)."""
        return PrivacyReport(
            epsilon=self.epsilon(steps, delta),
            delta=delta,
            steps=steps,
            compositions=self.compositions(steps),
            unit=self.unit,
            theorem=self.theorem,
            kind=self.kind,
            risk=self.risk(steps, delta),
        )


def calibrate_noise_multiplier(
    spec: SamplingSpec,
    epsilon: float,
    delta: float,
    *,
    steps: int | None = None,
    epochs: int | None = None,
    bound: str = "upper",
    discretization: float = DEFAULT_DISCRETIZATION,
    tail_mass_truncation: float = DEFAULT_TAIL_MASS,
    min_grid_points: int = DEFAULT_MIN_GRID_POINTS,
    rtol: float = 1e-3,
    max_noise_multiplier: float = 1e4,
    min_noise_multiplier: float = 0.1,
    coefficients: Sequence[float] | None = None,
) -> float:
    """The smallest noise multiplier (to relative tolerance ``rtol``) reaching (epsilon, delta).

    Exactly one of ``steps`` (optimizer steps) or ``epochs`` (each ``spec.steps_per_epoch`` steps) must be
    given. The returned sigma is the upper end of the final bracket (:func:`narrow_noise_bracket`), so the
    accountant at that sigma always satisfies the target. The search is confined to [``min_noise_multiplier``,
    ``max_noise_multiplier``] (default [0.1, 1e4]) so that it stays bounded in time: if the floor already
    reaches the target, the floor is returned (more noise than needed, never less); if the ceiling does not,
    ConfigurationError (``epsilon``; ``steps`` when the steps cannot be composed in bounded memory).
    ``coefficients``: BandMF's C (:class:`StructuredSubsamplingAccountant`; cyclic Poisson sampling).
    """
    epsilon = _check_epsilon(epsilon)
    if not 0 < epsilon <= MAX_CALIBRATION_EPSILON:
        raise ConfigurationError("epsilon", epsilon, f"must lie in (0, {MAX_CALIBRATION_EPSILON:g}] to calibrate a "
                                 "noise multiplier (larger budgets protect nothing)")
    delta = _check_delta(delta)
    if (steps is None) == (epochs is None):
        raise ConfigurationError("steps", steps, "give exactly one of steps or epochs")
    if epochs is not None:
        _check_steps("epochs", epochs)
        steps = epochs * spec.steps_per_epoch
    assert steps is not None
    _check_steps("steps", steps)
    if steps == 0:
        raise ConfigurationError("steps", steps, "must be >= 1 to calibrate")
    if not 0 < rtol < 1:
        raise ConfigurationError("rtol", rtol, "must lie in (0, 1)")

    def eps_at(sigma: float) -> float:
        acc = StructuredSubsamplingAccountant(
            spec, sigma, bound=bound, discretization=discretization, tail_mass_truncation=tail_mass_truncation,
            min_grid_points=min_grid_points, coefficients=coefficients,
        )
        try:
            return acc.epsilon(steps, delta)
        except ConfigurationError as err:
            if err.parameter in ("steps", "noise_multiplier"):  # too small a sigma to evaluate: not certified
                failures.append(err)
                return math.inf
            raise

    failures: list[ConfigurationError] = []

    # Geometric bracketing on log(sigma), 4x a step up to the ceiling (the values at both ends kept), then the
    # bracket narrowed by narrow_noise_bracket.
    lo, hi = 0.5, 1.0
    eps_hi = eps_at(hi)
    eps_lo = math.inf
    if eps_hi > epsilon:
        while eps_hi > epsilon:
            if hi >= max_noise_multiplier:
                if failures and failures[-1].parameter == "steps":  # not the budget: too many steps to compose
                    raise failures[-1]
                raise ConfigurationError(
                    "epsilon", epsilon,
                    f"not reachable with noise_multiplier <= {max_noise_multiplier} in {steps} steps",
                )
            lo, eps_lo, hi = hi, eps_hi, min(hi * 4.0, max_noise_multiplier)
            eps_hi = eps_at(hi)
    else:
        while (eps_lo := eps_at(lo)) <= epsilon:
            if lo <= min_noise_multiplier:  # already enough at the floor: return the floor (more noise, sound)
                return min_noise_multiplier
            hi, eps_hi, lo = lo, eps_lo, max(lo / 4.0, min_noise_multiplier)
    return narrow_noise_bracket(eps_at, epsilon, lo, eps_lo, hi, eps_hi, rtol)


def narrow_noise_bracket(eps_at: Callable[[float], float], epsilon: float, lo: float, eps_lo: float, hi: float,
                         eps_hi: float, rtol: float) -> float:
    """The upper end of a bracket [lo, hi] of noise multipliers, eps_at(lo) > ``epsilon`` >= eps_at(hi), narrowed
    until hi / lo <= 1 + ``rtol``: a sigma that reaches the target, at most ``rtol`` above the smallest that does
    (:func:`calibrate_noise_multiplier`; :func:`~lightning_dpts.release.calibrate_release_noise` on noise stds).

    epsilon falls with sigma about as a power law (log epsilon nearly linear in log sigma), so the root is
    estimated by the secant of log epsilon - log ``epsilon`` over log sigma through the last two points evaluated,
    and each guess aims ``rtol``/4 above it, on the side that reaches the target (a bisection in log sigma where the
    secant leaves the bracket, a value is not finite or not positive, or the last two guesses did not halve the
    bracket); guesses stay inside the bracket by ``rtol``/4. When a guess lands within about two tolerances of the
    root, a partner on the other side of the refreshed estimate, ``rtol``/4 below it and within one tolerance of
    the guess, is evaluated too: together they close the bracket. From a bracket of 4x to rtol = 1e-3: 2-4
    evaluations where a bisection makes 11. The value returned is one whose epsilon was computed and is
    <= ``epsilon``.
    """
    target = math.log(epsilon)
    quarter = 0.25 * rtol
    margin = 1.0 + quarter

    def residual(value: float) -> float:  # log epsilon - target (not finite where epsilon is 0 or infinite)
        return math.log(value) - target if 0 < value < math.inf else math.nan

    def root(points: list[tuple[float, float]]) -> tuple[float, float] | None:
        """(sigma where the secant through the two points crosses the target, its slope in log sigma)."""
        (x1, f1), (x2, f2) = points
        if not (math.isfinite(f1) and math.isfinite(f2)) or f1 == f2 or x1 == x2:
            return None
        slope = (f2 - f1) / (x2 - x1)
        return (math.exp(x2 - f2 / slope), slope) if slope < 0 else None

    last = [(math.log(lo), residual(eps_lo)), (math.log(hi), residual(eps_hi))]  # the two latest points
    before = math.inf  # log(hi / lo) two guesses ago
    previous = math.inf  # ... and one guess ago
    while hi / lo - 1.0 > rtol:
        width = math.log(hi / lo)
        estimate = root(last) if width <= 0.5 * before else None  # a bisection where two guesses did not halve it
        if estimate is not None and not lo < estimate[0] < hi:
            estimate = None
        before, previous = previous, width
        if estimate is not None:
            guess = min(max(estimate[0] * (1.0 + quarter), lo * margin), hi / margin)
        else:
            guess = math.sqrt(lo * hi)
        value = eps_at(guess)
        f = residual(value)
        last = [last[1], (math.log(guess), f)]
        passed = value <= epsilon
        if passed:
            hi = guess
        else:
            lo = guess
        if estimate is None or not (math.isfinite(f) and abs(f / estimate[1]) <= 2.0 * rtol):
            continue
        refreshed = root(last)
        if passed:  # below the refreshed root, but no further than one tolerance below the guess
            partner = hi / (1.0 + rtol) * margin
            if refreshed is not None:
                partner = max(partner, refreshed[0] * (1.0 - quarter))
        else:
            partner = lo * (1.0 + rtol) / margin
            if refreshed is not None:
                partner = min(partner, refreshed[0] * (1.0 + quarter))
        if lo < partner < hi:
            value = eps_at(partner)
            last = [last[1], (math.log(partner), residual(value))]
            if value <= epsilon:
                hi = partner
            else:
                lo = partner
    return hi


class AmplifiedBandMFAccountant(ProfileAccountant):
    """Amplified BandMF with cyclic Poisson sampling for one example-level mechanism, without a SamplingSpec
    (``dpts privacy bandmf --sampling cyclic_poisson``; docs/bandmf.md, Theorem B.2).

    The examples are split into k >= b groups, group t mod k is eligible at step t and each eligible example is
    sampled with probability p; C is b-banded lower-triangular Toeplitz. The protected example has at most
    ceil(n / k) participation opportunities, whose columns of C occupy disjoint rows, so the run is the adaptive
    composition of ceil(n / k) structured steps: the switching profile of Theorem 4.4 (Lemma F.3 for the Poisson
    draw) with rho = p, window leak probability r and noise multiplier sigma / ||c||_2 (substitution of the
    example's contribution, clipped to norm 1: shift 2). Exact (a PLD, no Monte Carlo) at any delta.

    Args:
        iterations: n >= 1 optimizer steps of the run.
        coefficients: (c_0, ..., c_{b-1}), c_0 > 0.
        sampling_prob: p in (0, 1].
        noise_multiplier: sigma > 0 (noise std over the clipping norm).
        groups: k >= b (default b).
        leak_probability: r in (0, 1] (1: the whole example is the unit, as in the paper's add/remove setting but
            under substitution).
    """

    def __init__(self, iterations: int, coefficients: Sequence[float], sampling_prob: float,
                 noise_multiplier: float, *, groups: int | None = None, leak_probability: float = 1.0) -> None:
        _check_steps("iterations", iterations)
        if iterations < 1:
            raise ConfigurationError("iterations", iterations, "must be an integer >= 1")
        try:
            c = tuple(float(v) for v in coefficients)
        except (TypeError, ValueError):
            raise ConfigurationError("coefficients", coefficients, "must be numbers") from None
        if not c or not all(math.isfinite(v) for v in c) or c[0] <= 0:
            raise ConfigurationError("coefficients", coefficients, "must be finite numbers with c_0 > 0")
        k = len(c) if groups is None else groups
        if isinstance(k, bool) or not isinstance(k, int) or k < len(c):
            raise ConfigurationError(
                "groups", groups, f"must be an integer >= bands={len(c)}: with fewer groups two participations of "
                "one example are less than b steps apart, their columns of C share rows and the opportunities are "
                "not independent (docs/bandmf.md, Theorem B.2)")
        for name, value in (("sampling_prob", sampling_prob), ("leak_probability", leak_probability)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise ConfigurationError(name, value, "must lie in (0, 1]")
        if isinstance(noise_multiplier, bool) or not isinstance(noise_multiplier, (int, float)) or not (
                math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise ConfigurationError("noise_multiplier", noise_multiplier, "must be a finite number > 0")
        self.iterations, self.coefficients, self.groups = int(iterations), c, int(k)
        self.sampling_prob, self.leak_probability = float(sampling_prob), float(leak_probability)
        self.noise_multiplier = float(noise_multiplier)
        self.column_norm = math.sqrt(math.fsum(v * v for v in c))
        profile = theorem_4_4(self.sampling_prob, self.leak_probability,
                                       _effective_sigma(self.noise_multiplier, self.column_norm))
        super().__init__(profile, scale=("noise_multiplier", self.noise_multiplier))

    @property
    def compositions(self) -> int:
        """ceil(n / k): the participation opportunities of the worst-placed example (group 0)."""
        return -(-self.iterations // self.groups)

    def epsilon(self, delta: float) -> float:
        """epsilon of the whole run at ``delta``."""
        return self.epsilon_after(self.compositions, delta)

    def delta(self, epsilon: float) -> float:
        """delta of the whole run at ``epsilon``."""
        return self.delta_after(self.compositions, epsilon)

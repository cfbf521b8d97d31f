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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.bounds import BOUNDS, naive_dpsgd_profile, select_profile
from lightning_dpts.privacy.pld import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_MIN_GRID_POINTS,
    DEFAULT_TAIL_MASS,
    pld_from_profile,
)
from lightning_dpts.privacy.profiles import PrivacyProfile
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["StructuredSubsamplingAccountant", "calibrate_noise_multiplier", "PrivacyReport"]

_CACHE_SIZE = 32


def _check_delta(delta: float) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
    return float(delta)


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


class StructuredSubsamplingAccountant:
    """Privacy accounting for DP-SGD with bi-level structured subsampling (the paper's Sections 4.1-4.3).

    The accountant selects the theorem for ``spec`` (see :func:`~lightning_dpts.privacy.bounds.select_profile`),
    turns that single per-step (or per-epoch) privacy profile into a pessimistic connect-the-dots privacy-loss
    distribution (Lemma D.16) and composes it with dp_accounting's FFT routines.

    Args:
        spec: the sampling description, e.g. ``datamodule.sampling_spec``.
        noise_multiplier: sigma > 0; the noise std on the summed clipped gradient is ``sigma * C``.
        bound: ``"upper"`` (default; the best sound guarantee) or ``"lower"`` (the paper's optimistic lower
            bound, Theorems 4.3/F.7/F.8 -- useful for comparisons, never as a guarantee).
        discretization: the coarsest privacy-loss grid spacing (default 1e-3, as in Appendix B.4.3).
        tail_mass_truncation: mass allowed beyond the grid, accounted as infinite loss (default 1e-15).
        min_grid_points: refine the grid below ``discretization`` until the per-unit loss range holds this
            many points (default 4096; 0 disables). See :func:`~lightning_dpts.privacy.pld.pld_from_profile`.
        naive: if ``True``, account naive DP-SGD over the flattened set of all windows instead
            (Proposition C.1 for ``bound="upper"``: what standard DP-SGD would report; Proposition C.2 for
            ``bound="lower"``: its true leakage under the spec's relation). For comparisons only.
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
    ) -> None:
        if not isinstance(spec, SamplingSpec):
            raise ConfigurationError("spec", spec, "must be a lightning_dpts.privacy.SamplingSpec")
        if spec.top_level == "b_min_sep":
            raise ConfigurationError(
                "spec.top_level", "b_min_sep",
                "is not covered by the structured (PLD) accountant: b-min-sep sampling is accounted by the Monte "
                "Carlo accountant, lightning_dpts.privacy.montecarlo.MonteCarloAccountant (AccountantCallback builds "
                "it for you; docs/bandmf.md)",
            )
        if bound not in BOUNDS:
            raise ConfigurationError("bound", bound, "must be 'upper' or 'lower'")
        if not (isinstance(discretization, (int, float)) and 0 < discretization <= 1):
            raise ConfigurationError("discretization", discretization, "must lie in (0, 1]")
        if not (isinstance(tail_mass_truncation, (int, float)) and 0 < tail_mass_truncation <= 1e-6):
            raise ConfigurationError("tail_mass_truncation", tail_mass_truncation, "must lie in (0, 1e-6]")
        if isinstance(min_grid_points, bool) or not isinstance(min_grid_points, int) or min_grid_points < 0:
            raise ConfigurationError("min_grid_points", min_grid_points, "must be an integer >= 0")
        self.min_grid_points = min_grid_points
        self.spec = spec
        self.bound = bound
        self.naive = bool(naive)
        self.discretization = float(discretization)
        self.tail_mass_truncation = float(tail_mass_truncation)
        if self.naive:
            self.profile: PrivacyProfile = naive_dpsgd_profile(spec, noise_multiplier, bound)
        else:
            self.profile = select_profile(spec, noise_multiplier, bound)
        self.noise_multiplier = float(noise_multiplier)
        self._unit_pld: PrivacyLossDistribution | None = None
        self._composed: OrderedDict[int, PrivacyLossDistribution] = OrderedDict()

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
        """The unit of composition: ``"epoch"`` for iteration/shuffling, ``"step"`` otherwise."""
        return "epoch" if (self.spec.accounts_per_epoch and not self.naive) else "step"

    def compositions(self, steps: int) -> int:
        """How many units ``steps`` optimizer steps compose (a started epoch counts whole)."""
        _check_steps("steps", steps)
        return steps if self.naive else self.spec.compositions(steps)

    def _steps_for(self, compositions: int) -> int:
        return compositions if self.naive else self.spec.max_steps_for_compositions(compositions)

    @property
    def unit_pld(self) -> PrivacyLossDistribution:
        """The PLD of one composition unit (built once, lazily)."""
        if self._unit_pld is None:
            self._unit_pld = pld_from_profile(
                self.profile, self.discretization, self.tail_mass_truncation, self.min_grid_points
            )
        return self._unit_pld

    def composed_pld(self, compositions: int) -> PrivacyLossDistribution:
        """PLD after ``compositions`` units (cached, most recent first)."""
        if compositions in self._composed:
            self._composed.move_to_end(compositions)
            return self._composed[compositions]
        pld = self.unit_pld.self_compose(compositions, tail_mass_truncation=self.tail_mass_truncation)
        self._composed[compositions] = pld
        if len(self._composed) > _CACHE_SIZE:
            self._composed.popitem(last=False)
        return pld

    # ------------------------------------------------------------------------------------------------
    # read-outs
    # ------------------------------------------------------------------------------------------------
    def epsilon(self, steps: int, delta: float) -> float:
        """The smallest epsilon such that training for ``steps`` optimizer steps is (epsilon, delta)-DP."""
        delta = _check_delta(delta)
        n = self.compositions(steps)
        if n == 0:
            return 0.0
        return float(self.composed_pld(n).get_epsilon_for_delta(delta))

    def epsilons(self, steps: Sequence[int], delta: float) -> list[float]:
        """:meth:`epsilon` for several step counts."""
        return [self.epsilon(s, delta) for s in steps]

    def delta(self, steps: int, epsilon: float) -> float:
        """The smallest delta such that training for ``steps`` steps is (epsilon, delta)-DP."""
        epsilon = _check_epsilon(epsilon)
        n = self.compositions(steps)
        if n == 0:
            return 0.0
        return float(self.composed_pld(n).get_delta_for_epsilon(epsilon))

    def max_steps(self, epsilon: float, delta: float, *, limit: int = 10**9) -> int:
        """The largest number of optimizer steps whose composed epsilon stays <= ``epsilon`` at ``delta``.

        For iteration/shuffling this is a whole number of epochs times the steps per epoch. Returns 0 if even
        one unit exceeds the budget. Raises if the budget allows more than ``limit`` steps.
        """
        epsilon = _check_epsilon(epsilon)
        delta = _check_delta(delta)

        def fits(n: int) -> bool:
            return float(self.composed_pld(n).get_epsilon_for_delta(delta)) <= epsilon

        if not fits(1):
            return 0
        lo, hi = 1, 1
        while fits(hi):
            lo = hi
            hi *= 2
            if self._steps_for(lo) > limit:
                raise ConfigurationError(
                    "epsilon", epsilon, f"the budget allows more than limit={limit} steps; raise the limit"
                )
        while hi - lo > 1:  # invariant: fits(lo), not fits(hi)
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        return self._steps_for(lo)

    def report(self, steps: int, delta: float) -> PrivacyReport:
        """A :class:`PrivacyReport` of (epsilon, delta) after ``steps`` steps, with the bound used."""
        return PrivacyReport(
            epsilon=self.epsilon(steps, delta),
            delta=delta,
            steps=steps,
            compositions=self.compositions(steps),
            unit=self.unit,
            theorem=self.theorem,
            kind=self.kind,
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
) -> float:
    """The smallest noise multiplier (to relative tolerance ``rtol``) reaching (epsilon, delta).

    Exactly one of ``steps`` (optimizer steps) or ``epochs`` (each ``spec.steps_per_epoch`` steps) must be
    given. The returned sigma is the upper end of the final bisection bracket, so the accountant at that
    sigma always satisfies the target.
    """
    epsilon = _check_epsilon(epsilon)
    if epsilon == 0:
        raise ConfigurationError("epsilon", epsilon, "must be > 0 to calibrate a finite noise multiplier")
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
            min_grid_points=min_grid_points,
        )
        return acc.epsilon(steps, delta)

    # Geometric bracketing on log(sigma), then bisection.
    lo, hi = 0.5, 1.0
    if eps_at(hi) > epsilon:
        lo = hi
        while eps_at(hi) > epsilon:
            lo, hi = hi, hi * 2.0
            if hi > max_noise_multiplier:
                raise ConfigurationError(
                    "epsilon", epsilon,
                    f"not reachable with noise_multiplier <= {max_noise_multiplier} in {steps} steps",
                )
    else:
        while eps_at(lo) <= epsilon:
            hi, lo = lo, lo / 2.0
            if lo < 1e-3:
                return hi
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if eps_at(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi

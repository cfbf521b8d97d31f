"""Mechanism objects: each sampling level and noise kind is a small frozen dataclass that validates itself,
documents its formal guarantee and its public fields, draws its own sample and names the accounting it implies.

In the style of jax_privacy's batch-selection strategies and dp_accounting's ``DpEvent``\\ s: a description of one
part of the mechanism, separate from the arithmetic that accounts for it. The accountant
(:mod:`~lightning_dpts.privacy.bounds`, :mod:`~lightning_dpts.privacy.accountant`) and the sampler
(:class:`~lightning_dpts.data.sampler.StructuredSampler`) call the methods and capability properties of these objects
instead of comparing kind names, so **adding a scheme means adding one object** (and one registry entry).

* top levels (which series a step uses; :class:`TopLevelScheme`): :class:`Iteration`, :class:`Shuffling`,
  :class:`WithoutReplacement`, :class:`PoissonTopLevel`, :class:`BMinSep`, :class:`CyclicPoisson`;
* bottom levels (which windows of a sampled series; :class:`BottomLevelScheme`): :class:`WithReplacement`,
  :class:`PoissonBottomLevel`;
* noise (:class:`NoiseSpec`, a torch-free description; the generators live in ``lightning_dpts.training``):
  :class:`GaussianNoiseSpec`, :class:`BandMFNoiseSpec`;
* the neighbouring relation is :class:`~lightning_dpts.privacy.spec.NeighbouringRelation`.

Strings stay accepted at the public boundary (datamodule, :class:`~lightning_dpts.privacy.spec.SamplingSpec`, YAML
configs, the CLI) and are converted in one place: :func:`top_level_from_name`, :func:`bottom_level_from_name`,
:func:`noise_from_name`. ``SamplingSpec.top_level`` keeps the *name* (its ``repr`` is written to privacy ledgers and
checkpoints); ``SamplingSpec.top_level_scheme`` is the object.

Theorem numbers refer to *Privacy Amplification by Structured Subsampling for Deep Differentially Private Time Series
Forecasting* (Schuchardt et al., ICML 2025); see docs/privacy.md, "Mechanism objects".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import profiles
from lightning_dpts.privacy._validate import require_choice, require_int
from lightning_dpts.privacy.profiles import PrivacyProfile
from lightning_dpts.randomness import numpy_generator

__all__ = [
    "Accounting",
    "BMinSep",
    "BOTTOM_LEVEL_SCHEMES",
    "BandMFNoiseSpec",
    "BottomLevelScheme",
    "CyclicPoisson",
    "GaussianNoiseSpec",
    "Iteration",
    "Mechanism",
    "NOISE_SPECS",
    "NoiseSpec",
    "PoissonBottomLevel",
    "PoissonTopLevel",
    "Shuffling",
    "TOP_LEVEL_SCHEMES",
    "TopLevelScheme",
    "WithReplacement",
    "WithoutReplacement",
    "bottom_level_from_name",
    "noise_from_name",
    "top_level_from_name",
]


class SpecView(Protocol):
    """What the mechanism objects read of the sampling description: a
    :class:`~lightning_dpts.privacy.spec.SamplingSpec` is one. A protocol, not an import (not even for type
    checking): ``spec.py`` imports this module, and the package's import graph has no cycle."""

    @property
    def num_series(self) -> int: ...
    @property
    def min_length(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def instances_per_series(self) -> int: ...
    @property
    def bands(self) -> int: ...
    @property
    def top_sample_size(self) -> int: ...
    @property
    def top_level_rate(self) -> float: ...
    @property
    def num_start_positions(self) -> int: ...
    @property
    def windows_per_unit(self) -> int: ...
    @property
    def bottom_level_rate(self) -> float: ...
    @property
    def steps_per_epoch(self) -> int: ...
    @property
    def bottom_level_scheme(self) -> BottomLevelScheme: ...


@dataclass(frozen=True)
class Accounting:
    """The accounting a mechanism object implies.

    Attributes:
        method: ``"pld"`` (the structured accountant: a privacy profile, its connect-the-dots PLD, composed) or
            ``"monte_carlo"`` (:class:`~lightning_dpts.privacy.montecarlo.MonteCarloAccountant`).
        composition: the unit composed: ``"step"`` (one profile per optimizer step), ``"epoch"`` (one per epoch; a
            started epoch counts whole), ``"opportunity"`` (one per participation opportunity of a series: every k
            steps under cyclic Poisson sampling) or ``"run"`` (the whole run is one mechanism).
        theorems: the results that prove the bounds this object can select.
    """

    method: str
    composition: str
    theorems: tuple[str, ...]


@dataclass(frozen=True)
class Mechanism:
    """Base of every mechanism object: frozen, validated on construction (:meth:`validate`), named.

    Class attributes:
        name: the registry name (what YAML configs, the CLI and ``SamplingSpec.top_level`` use).
        public_fields: the fields that may be released (they are part of the configuration; the guarantee assumes the
            adversary knows them). The randomness a scheme draws is never public.
    """

    name: ClassVar[str] = ""
    public_fields: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`~lightning_dpts.errors.ConfigurationError` naming the first invalid field."""

    @property
    def accounting(self) -> Accounting:  # pragma: no cover - every concrete object overrides it
        raise NotImplementedError


@dataclass(frozen=True)
class _Banded(Mechanism):
    """A mechanism with a public number of bands b >= 1 (b-min-sep sampling, BandMF noise): accounted for the whole
    run by the Monte Carlo accountant."""

    bands: int = 1
    public_fields: ClassVar[tuple[str, ...]] = ("bands",)
    needs_monte_carlo: ClassVar[bool] = True

    def validate(self) -> None:
        require_int("bands", self.bands, 1)

    @property
    def accounting(self) -> Accounting:
        return Accounting("monte_carlo", "run", ("Dong & Ganesh 2026, Theorem 5.1 (Monte Carlo, Appendix A)",))


# ----------------------------------------------------------------------------------------------------------------
# top levels (which series)
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TopLevelScheme(Mechanism):
    """Which series a step uses. Capability properties (read them instead of comparing names):

    * ``accounts_per_epoch``: composed once per epoch of ``spec.steps_per_epoch`` steps (Lemma E.2), not per step;
    * ``needs_monte_carlo``: only :class:`~lightning_dpts.privacy.montecarlo.MonteCarloAccountant` accounts it (the
      structured PLD accountant refuses it);
    * ``separates_participations``: a series that takes part is excluded for the next ``bands - 1`` steps
      (``min_separation`` = b > 1 possible); the scheme BandMF noise needs;
    * ``supports_augmentation``: amplification by context/forecast noise (Theorem G.1) is proven for it;
    * ``has_lower_bound``: the paper proves an optimistic lower bound for it (``bound="lower"``).
    """

    accounts_per_epoch: ClassVar[bool] = False
    needs_monte_carlo: ClassVar[bool] = False
    separates_participations: ClassVar[bool] = False
    supports_augmentation: ClassVar[bool] = False
    has_lower_bound: ClassVar[bool] = True

    @property
    def min_separation(self) -> int:
        """b: steps between two participations of one series (1: no constraint)."""
        return 1

    @property
    def composition_unit(self) -> str:
        """``"epoch"``, ``"step"`` or ``"run"`` (see :class:`Accounting`)."""
        return self.accounting.composition

    @classmethod
    def for_spec(cls, spec: SpecView) -> TopLevelScheme:
        """The object a :class:`~lightning_dpts.privacy.spec.SamplingSpec` with this name describes."""
        return cls()

    def check_spec(self, spec: SpecView) -> None:
        """Constraints the scheme puts on the rest of the spec (called by ``SamplingSpec`` after its own checks)."""

    def compositions(self, spec: SpecView, steps: int) -> int:
        """How many composition units ``steps`` optimizer steps compose (per step; per epoch for the epoch-level
        top levels, a started epoch counting whole; per participation opportunity for :class:`CyclicPoisson`)."""
        if self.accounts_per_epoch:
            return -(-steps // spec.steps_per_epoch)
        return steps

    def max_steps_for_compositions(self, spec: SpecView, compositions: int) -> int:
        """The largest number of optimizer steps that composes at most ``compositions`` units."""
        if self.accounts_per_epoch:
            return compositions * spec.steps_per_epoch
        return compositions

    def pld_bands_covered(self, bands: int) -> bool:
        """Whether the structured (PLD) accountant covers BandMF noise with ``bands`` bands under this top level
        (b = 1, independent noise: every top level the PLD accountant accepts)."""
        return bands == 1 and not self.needs_monte_carlo

    def unit_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        """The privacy profile of one composition unit without augmentation, every series of ``spec.min_length``
        steps (``k``, ``r``: override the windows per unit and the bottom-level rate, for the per-length members of
        a maximum over series lengths)."""
        raise NotImplementedError  # pragma: no cover

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        """Series indices (int64) of step ``step`` of pass ``epoch`` of ``sampler``
        (:class:`~lightning_dpts.data.sampler.StructuredSampler`: ``spec``, ``num_series``, ``entropy``); ``rng``
        is the step's secret generator (the bottom level and the augmentation continue with it)."""
        raise NotImplementedError  # pragma: no cover


@dataclass(frozen=True)
class _EpochTopLevel(TopLevelScheme):
    """Top levels that visit every series once per epoch (Algorithm 3): accounted per epoch (Appendix E)."""

    accounts_per_epoch: ClassVar[bool] = True

    @property
    def accounting(self) -> Accounting:
        return Accounting("pld", "epoch", ("Theorem 4.2", "Theorem 4.3", "Theorem E.1", "Theorem E.8"))

    def unit_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        return spec.bottom_level_scheme.epoch_profile(spec, sigma, bound, k, r)


@dataclass(frozen=True)
class Iteration(_EpochTopLevel):
    """Top-level iteration (Algorithm 3): step b of an epoch takes series b N' .. (b + 1) N' - 1 in dataset order
    (the leftover N mod N' series are unused).

    Guarantee: per epoch, Theorem 4.2 (lambda = 1, tight), E.1 (lambda >= 1, upper; Theorem 4.3 the lower bound)
    with a bottom level with replacement, E.8 (tight) with a Poisson bottom level; composed over epochs.
    Public: no fields; the series order is public (only the bottom level's randomness amplifies).
    """

    name: ClassVar[str] = "iteration"

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        n_top = sampler.spec.top_sample_size
        return np.arange(step * n_top, (step + 1) * n_top, dtype=np.int64)


@dataclass(frozen=True)
class Shuffling(_EpochTopLevel):
    """Top-level shuffling: Algorithm 3 over a fresh secret permutation of the series every pass.

    Guarantee: accounted exactly as :class:`Iteration` (Theorems 4.2, E.1, E.8 per epoch; the shuffle is not
    credited). Public: no fields; the permutation is secret (stream ``(pass, 0)`` of the run's entropy).
    """

    name: ClassVar[str] = "shuffling"

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        n_top = sampler.spec.top_sample_size
        perm = numpy_generator(sampler.entropy, epoch, 0).permutation(sampler.num_series)
        return perm[step * n_top : (step + 1) * n_top].astype(np.int64)


@dataclass(frozen=True)
class _StepTopLevel(TopLevelScheme):
    """Top levels that draw a fresh sample of rate rho = N'/N every step: accounted per step (Appendix F)."""

    @property
    def accounting(self) -> Accounting:
        return Accounting("pld", "step", ("Theorem 4.4", "Theorem F.1", "Theorem F.2", "Theorem F.7", "Theorem F.8",
                                          "Theorem G.1"))

    def unit_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        if bound == "lower" and not self.has_lower_bound:
            raise ConfigurationError(
                "bound",
                bound,
                "the paper proves optimistic lower bounds (Theorems F.7, F.8) for top_level='without_replacement' "
                f"only; use bound='upper' with top_level={self.name!r}",
            )
        profile = spec.bottom_level_scheme.step_profile(spec, spec.top_level_rate, sigma, bound, k, r)
        return self.adjust_step_profile(profile)

    def adjust_step_profile(self, profile: PrivacyProfile) -> PrivacyProfile:
        """The profile of the bottom level under this top level (the identity: Lemma F.4 as stated)."""
        return profile


@dataclass(frozen=True)
class WithoutReplacement(_StepTopLevel):
    """Top-level sampling without replacement (Algorithm 5): a fresh uniform N'-subset of the series every step.

    Guarantee: per step, Theorem 4.4 (lambda = 1, tight), F.1 (lambda >= 1, upper; F.7 lower) with a bottom level
    with replacement, F.2 (upper; F.8 lower) with a Poisson bottom level, G.1/4.5 with context/forecast noise
    augmentation; composed over steps. Public: no fields; the subsets are secret.
    """

    name: ClassVar[str] = "without_replacement"
    supports_augmentation: ClassVar[bool] = True

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        n_top, num = sampler.spec.top_sample_size, sampler.num_series
        if num <= 1024:  # faster for small N; Generator.choice uses Floyd's algorithm for large N
            return rng.permutation(num)[:n_top].astype(np.int64, copy=False)
        return rng.choice(num, size=n_top, replace=False).astype(np.int64, copy=False)


@dataclass(frozen=True)
class PoissonTopLevel(_StepTopLevel):
    """Top-level Poisson sampling: every series independently with probability rho = N'/N every step (variable
    batch size, possibly empty).

    Guarantee: the per-step bounds of :class:`WithoutReplacement` are sound via Lemma F.3 (Theorem 4.4 is then an
    upper bound, tightness not claimed); no optimistic lower bound is proven (``bound="lower"`` is refused).
    Public: no fields; the samples are secret.
    """

    name: ClassVar[str] = "poisson"
    supports_augmentation: ClassVar[bool] = True
    has_lower_bound: ClassVar[bool] = False

    @property
    def accounting(self) -> Accounting:
        base = super().accounting
        return dataclasses.replace(base, theorems=("Lemma F.3",) + base.theorems)

    def adjust_step_profile(self, profile: PrivacyProfile) -> PrivacyProfile:
        if profile.kind == "tight":  # Theorem 4.4: sound via Lemma F.3, tightness not claimed
            return dataclasses.replace(profile, theorem=f"{profile.theorem} (Poisson top level)", kind="upper")
        return profile

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        n_top, num = sampler.spec.top_sample_size, sampler.num_series
        return np.flatnonzero(rng.random(num) < n_top / num).astype(np.int64)


@dataclass(frozen=True)
class BMinSep(_Banded, _StepTopLevel):
    """b-min-sep sampling of series with warm start (Dong & Ganesh 2026, Algorithm 2): every step, each series that
    did not take part in the last ``bands - 1`` steps is included with probability p = p0 / (1 - p0 (b - 1)), so
    that the expected fraction per step is p0 = N'/N (needs N'/N <= 1/b).

    Guarantee: accounted for the whole run by the Monte Carlo accountant (Dong & Ganesh 2026, Theorem 5.1 and
    Estimate-Verify-Release, Appendix A; :class:`~lightning_dpts.privacy.montecarlo.MonteCarloAccountant`), with
    i.i.d. Gaussian or BandMF noise of the same ``bands``; the structured PLD accountant refuses it.
    Public: ``bands``. The chain's history derives from the run's secret entropy and is never stored.

    Args:
        bands: b >= 1, the minimum separation (b = 1 is Poisson sampling).
    """

    name: ClassVar[str] = "b_min_sep"
    separates_participations: ClassVar[bool] = True

    @property
    def min_separation(self) -> int:
        return self.bands

    @classmethod
    def for_spec(cls, spec: SpecView) -> TopLevelScheme:
        return cls(bands=spec.bands)

    def check_spec(self, spec: SpecView) -> None:
        if spec.top_sample_size * self.bands > spec.num_series:
            raise ConfigurationError(
                "batch_size",
                spec.batch_size,
                f"b_min_sep with bands={self.bands} can sample at most num_series/bands = "
                f"{spec.num_series / self.bands:g} series per step on average (N'/N <= 1/b), but "
                f"batch_size/instances_per_series = {spec.top_sample_size}; lower batch_size or bands",
            )

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        return sampler.b_min_sep_series(epoch * sampler.spec.steps_per_epoch + step)


@dataclass(frozen=True)
class CyclicPoisson(_StepTopLevel):
    """Cyclic Poisson sampling of series (Choquette-Choo et al., "(Amplified) Banded Matrix Factorization",
    NeurIPS 2023, Section 4): the series are split into ``groups`` = k fixed groups by a public rule (series i, in
    dataset order, is in group i mod k); at optimizer step t (counted from the run's first step) only group t mod k
    is eligible, and each of its series is included independently with probability p = min(1, N' k / N), so that a
    step holds N' series on average. Two participations of one series are therefore at least k steps apart.

    Guarantee: for BandMF noise with b <= k bands (and i.i.d. Gaussian noise, b = 1) the release is an adaptive
    composition of one structured step per participation opportunity of the protected series: the switching profile
    of Theorem 4.4 (F.1, F.2 for the other bottom levels; sound for a Poisson top level by Lemma F.3) with rho = p
    and the noise multiplier divided by the largest column norm of C, composed ceil(steps / k) times by the PLD
    accountant (docs/bandmf.md, "Amplified BandMF: cyclic Poisson sampling", Theorem B.2). Exact at any delta; no
    Monte Carlo. Public: ``groups`` and the grouping rule; which series are sampled is secret.

    Args:
        groups: k >= 1, the number of groups (= the minimum separation between two participations of a series;
            BandMF with b bands needs k >= b). ``groups=1`` is Poisson sampling with rate N'/N.
    """

    name: ClassVar[str] = "cyclic_poisson"
    separates_participations: ClassVar[bool] = True
    has_lower_bound: ClassVar[bool] = False
    groups: int = 1
    public_fields: ClassVar[tuple[str, ...]] = ("groups",)

    def validate(self) -> None:
        require_int("groups", self.groups, 1)

    @property
    def accounting(self) -> Accounting:
        return Accounting("pld", "opportunity", (
            "Theorem B.2 (docs/bandmf.md: adaptive composition over participation opportunities)", "Lemma F.3",
            "Theorem 4.4", "Theorem F.1", "Theorem F.2"))

    @property
    def min_separation(self) -> int:
        return self.groups

    @classmethod
    def for_spec(cls, spec: SpecView) -> TopLevelScheme:
        return cls(groups=spec.bands)

    def sampling_prob(self, spec: SpecView) -> float:
        """p = N' k / N, the probability that an eligible series is sampled (rho of the per-opportunity step)."""
        return min(1.0, spec.top_sample_size * self.groups / spec.num_series)

    def check_spec(self, spec: SpecView) -> None:
        if self.groups > spec.num_series:
            raise ConfigurationError("bands", self.groups, f"cyclic_poisson needs groups = bands <= num_series="
                                     f"{spec.num_series} (every group holds at least one series)")
        if spec.top_sample_size * self.groups > spec.num_series:
            raise ConfigurationError(
                "batch_size",
                spec.batch_size,
                f"cyclic_poisson with {self.groups} groups can sample at most num_series/groups = "
                f"{spec.num_series / self.groups:g} series per step on average (p = N' k / N <= 1), but "
                f"batch_size/instances_per_series = {spec.top_sample_size}; lower batch_size or the groups",
            )

    def unit_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        if bound == "lower":
            raise ConfigurationError("bound", bound, "no optimistic lower bound is proven for top_level="
                                     "'cyclic_poisson'; use bound='upper'")
        profile = spec.bottom_level_scheme.step_profile(spec, self.sampling_prob(spec), sigma, bound, k, r)
        if profile.kind == "tight":  # Theorem 4.4 with a Poisson top level: sound via Lemma F.3, tightness not claimed
            profile = dataclasses.replace(profile, theorem=f"{profile.theorem} (cyclic Poisson, per opportunity)",
                                          kind="upper")
        return profile

    def compositions(self, spec: SpecView, steps: int) -> int:
        # the series of group 0 are eligible at steps 0, k, 2k, ...: ceil(steps / k) opportunities, the most of any
        return -(-steps // self.groups)

    def max_steps_for_compositions(self, spec: SpecView, compositions: int) -> int:
        return compositions * self.groups

    def pld_bands_covered(self, bands: int) -> bool:
        return 1 <= bands <= self.groups

    def eligible(self, num_series: int, step: int) -> np.ndarray:
        """The series eligible at optimizer step ``step`` (public: group ``step mod k``)."""
        return np.arange(step % self.groups, num_series, self.groups, dtype=np.int64)

    def draw_series(self, sampler: Any, epoch: int, step: int, rng: np.random.Generator) -> np.ndarray:
        # the run's step t = pass * steps_per_epoch + step (as b_min_sep: passes are consecutive, each runs all its
        # steps; limit_train_batches is refused for top levels that separate participations)
        t = epoch * sampler.spec.steps_per_epoch + step
        group = self.eligible(sampler.num_series, t)
        return group[rng.random(group.size) < self.sampling_prob(sampler.spec)]


# ----------------------------------------------------------------------------------------------------------------
# bottom levels (which windows)
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BottomLevelScheme(Mechanism):
    """Which windows of a sampled series a step uses. Capability properties:

    * ``shortest_series_decides``: the profile is non-decreasing in r = k/T, so the shortest series decides the
      maximum over series lengths (docs/privacy.md, "Series of different lengths");
    * ``supports_augmentation``: amplification by context/forecast noise (Theorem G.1) is proven for it;
    * ``bounded_windows_per_series``: a sampled series contributes at most lambda windows to a step (the
      series-level sensitivity the Monte Carlo accountant of b-min-sep sampling assumes).
    """

    shortest_series_decides: ClassVar[bool] = False
    supports_augmentation: ClassVar[bool] = False
    bounded_windows_per_series: ClassVar[bool] = False

    def rate(self, spec: SpecView) -> float:
        """r of the theorems for ``spec`` (every series of ``spec.min_length`` steps)."""
        raise NotImplementedError  # pragma: no cover

    def epoch_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                      r: float | None = None) -> PrivacyProfile:
        """Profile of one epoch under an epoch-level top level (Appendix E)."""
        raise NotImplementedError  # pragma: no cover

    def step_profile(self, spec: SpecView, rho: float, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        """Profile of one step under a top level of rate ``rho`` (Appendix F)."""
        raise NotImplementedError  # pragma: no cover

    def draw_windows(self, series: np.ndarray, num_start_positions: np.ndarray, instances_per_series: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(row, start) pairs of the windows sampled from ``series`` (0-based starts in ``[0, T_n)``;
        ``num_start_positions``: T_n of each of ``series``)."""
        raise NotImplementedError  # pragma: no cover


@dataclass(frozen=True)
class WithReplacement(BottomLevelScheme):
    """Bottom level with replacement (Algorithm 4): lambda start positions uniform with replacement from
    {0..T_n-1}; r = k/T is the chance that one sampled window holds the protected unit.

    Guarantee: Theorems 4.2/E.1 (per epoch), 4.4/F.1 (per step), G.1 (with augmentation, lambda = 1).
    Public: no fields (lambda is the spec's ``instances_per_series``); the start positions are secret.
    """

    name: ClassVar[str] = "with_replacement"
    shortest_series_decides: ClassVar[bool] = True
    supports_augmentation: ClassVar[bool] = True
    bounded_windows_per_series: ClassVar[bool] = True

    @property
    def accounting(self) -> Accounting:
        return Accounting("pld", "step", ("Theorem 4.2", "Theorem 4.3", "Theorem 4.4", "Theorem E.1", "Theorem F.1",
                                          "Theorem F.7", "Theorem G.1"))

    def rate(self, spec: SpecView) -> float:
        return spec.windows_per_unit / spec.num_start_positions

    def epoch_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                      r: float | None = None) -> PrivacyProfile:
        lam = spec.instances_per_series
        r = spec.bottom_level_rate if r is None else r
        if lam == 1:
            return profiles.theorem_4_2(r, sigma)  # tight
        return profiles.theorem_e_1(lam, r, sigma) if bound == "upper" else profiles.theorem_4_3(lam, r, sigma)

    def step_profile(self, spec: SpecView, rho: float, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        lam = spec.instances_per_series
        r = spec.bottom_level_rate if r is None else r
        if lam == 1:
            return profiles.theorem_4_4(rho, r, sigma)
        if bound == "upper":
            return profiles.theorem_f_1(rho, lam, r, sigma)
        return profiles.theorem_f_7(rho, lam, r, sigma)

    def draw_windows(self, series: np.ndarray, num_start_positions: np.ndarray, instances_per_series: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        rows = np.repeat(series, instances_per_series)
        starts = rng.integers(0, np.repeat(num_start_positions, instances_per_series))
        return rows, starts.astype(np.int64)


@dataclass(frozen=True)
class PoissonBottomLevel(BottomLevelScheme):
    """Bottom-level Poisson sampling (Algorithm 6): every start position independently with rate min(1, lambda/T_n).

    Guarantee: Theorem E.8 (per epoch, tight), F.2 (per step, upper; F.8 lower); the maximum over series lengths is
    taken over every length that can attain it (k grows and r falls with T). Not with augmentation.
    Public: no fields (lambda is the spec's ``instances_per_series``); the start positions are secret.
    """

    name: ClassVar[str] = "poisson"

    @property
    def accounting(self) -> Accounting:
        return Accounting("pld", "step", ("Theorem E.8", "Theorem F.2", "Theorem F.8"))

    def rate(self, spec: SpecView) -> float:
        return min(1.0, spec.instances_per_series / spec.num_start_positions)

    def epoch_profile(self, spec: SpecView, sigma: float, bound: str, k: int | None = None,
                      r: float | None = None) -> PrivacyProfile:
        k = spec.windows_per_unit if k is None else k
        r = spec.bottom_level_rate if r is None else r
        return profiles.theorem_e_8(k, r, sigma)  # tight: upper == lower

    def step_profile(self, spec: SpecView, rho: float, sigma: float, bound: str, k: int | None = None,
                     r: float | None = None) -> PrivacyProfile:
        k = spec.windows_per_unit if k is None else k
        r = spec.bottom_level_rate if r is None else r
        return profiles.theorem_f_2(rho, k, r, sigma) if bound == "upper" else profiles.theorem_f_8(rho, k, r, sigma)

    def draw_windows(self, series: np.ndarray, num_start_positions: np.ndarray, instances_per_series: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        if len(series) == 0:
            return series, series.copy()
        t = num_start_positions
        rate = np.minimum(1.0, instances_per_series / t)
        grid = np.arange(int(t.max()))
        mask = (rng.random((len(series), len(grid))) < rate[:, None]) & (grid[None, :] < t[:, None])
        which, starts = np.nonzero(mask)
        return series[which], starts.astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# noise (torch-free descriptions; the generators are lightning_dpts.training's)
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NoiseSpec(Mechanism):
    """The gradient noise of a DP step, as a description. Capability properties:

    * ``correlated``: the noise of different steps is correlated (matrix factorisation), so a step's privacy cannot
      be composed step by step;
    * ``needs_monte_carlo``: only the Monte Carlo accountant covers it.
    """

    correlated: ClassVar[bool] = False
    needs_monte_carlo: ClassVar[bool] = False

    @property
    def kind(self) -> str:
        """The registry name (``"gaussian"``, ``"bandmf"``), as ``DPForecastStrategy(noise=...)`` and ledgers use."""
        return self.name

    @property
    def bands(self) -> int:
        """b, the number of bands of the strategy matrix (1: independent noise)."""
        return 1

    def compatible_top_level(self, top: TopLevelScheme) -> bool:
        """Whether the guarantee of this noise covers sampling with ``top``."""
        return True


@dataclass(frozen=True)
class GaussianNoiseSpec(NoiseSpec):
    """I.i.d. Gaussian noise N(0, sigma^2 C^2) on every step's summed clipped gradient (DP-SGD, Algorithm 2).

    Guarantee: the accounting of the top and bottom levels (the paper's theorems, per step or per epoch; with a
    b-min-sep top level the Monte Carlo accountant at b bands with the identity strategy). Public: no fields (sigma
    and C are the strategy's); the noise is secret.
    """

    name: ClassVar[str] = "gaussian"

    @property
    def accounting(self) -> Accounting:
        return Accounting("pld", "step", ("the top and bottom levels' theorems",))


@dataclass(frozen=True)
class BandMFNoiseSpec(_Banded, NoiseSpec):
    """BandMF noise (Dong & Ganesh 2026): step i adds row i of C^{-1} Z for a b-banded lower-triangular Toeplitz
    strategy C (the torch generator is ``lightning_dpts.training.correlated_noise.BandMFNoise``).

    Guarantee: Monte Carlo accounting of the whole run (Theorem 5.1, Estimate-Verify-Release) with b-min-sep sampling
    of the same ``bands``. Public: ``bands`` (and the strategy's coefficients); the noise Z is secret.

    Args:
        bands: b >= 1.
    """

    name: ClassVar[str] = "bandmf"
    correlated: ClassVar[bool] = True

    def compatible_top_level(self, top: TopLevelScheme) -> bool:
        if top.needs_monte_carlo:  # b-min-sep: the Monte Carlo accountant needs the same separation
            return top.separates_participations and top.min_separation == self.bands
        return top.pld_bands_covered(self.bands)  # cyclic Poisson: k >= b (Theorem B.2)


# ----------------------------------------------------------------------------------------------------------------
# the registry: the one place where names become objects
# ----------------------------------------------------------------------------------------------------------------
#: Top-level schemes by name, in the order the documentation and error messages list them.
TOP_LEVEL_SCHEMES: dict[str, type[TopLevelScheme]] = {
    cls.name: cls for cls in (Iteration, Shuffling, WithoutReplacement, PoissonTopLevel, BMinSep, CyclicPoisson)
}
#: Bottom-level schemes by name.
BOTTOM_LEVEL_SCHEMES: dict[str, type[BottomLevelScheme]] = {
    cls.name: cls for cls in (WithReplacement, PoissonBottomLevel)
}
#: Noise descriptions by name.
NOISE_SPECS: dict[str, type[NoiseSpec]] = {cls.name: cls for cls in (GaussianNoiseSpec, BandMFNoiseSpec)}


def _from_name(registry: dict[str, type[Mechanism]], base: type[Mechanism], name: object, parameter: str,
               bands: int = 1) -> Any:
    """The object of ``registry`` named ``name`` (an instance of ``base`` is returned unchanged); ``bands`` goes to
    the banded objects and must be 1 for the others."""
    if isinstance(name, base):
        return name
    cls = registry[require_choice(parameter, name, tuple(registry))]
    if issubclass(cls, _Banded):
        return cls(bands=bands)
    if issubclass(cls, CyclicPoisson):
        return cls(groups=bands)
    if bands != 1:
        banded = " or ".join(f"{parameter}={n!r}" for n, c in registry.items()
                             if issubclass(c, (_Banded, CyclicPoisson)))
        raise ConfigurationError("bands", bands, f"must be 1 unless {banded}")
    return cls()


def top_level_from_name(name: object, *, bands: int = 1, parameter: str = "top_level") -> TopLevelScheme:
    """The top-level object named ``name`` (``bands``: the minimum separation of ``"b_min_sep"``, the number of groups
    of ``"cyclic_poisson"``; must be 1 for the others). An object is returned unchanged. Unknown names are refused
    listing the accepted ones."""
    return _from_name(TOP_LEVEL_SCHEMES, TopLevelScheme, name, parameter, bands)


def bottom_level_from_name(name: object, *, parameter: str = "bottom_level") -> BottomLevelScheme:
    """The bottom-level object named ``name`` (an object is returned unchanged)."""
    return _from_name(BOTTOM_LEVEL_SCHEMES, BottomLevelScheme, name, parameter)


def noise_from_name(name: object, *, bands: int = 1, parameter: str = "noise") -> NoiseSpec:
    """The noise description named ``name`` (``bands``: b of ``"bandmf"``; must be 1 for ``"gaussian"``)."""
    return _from_name(NOISE_SPECS, NoiseSpec, name, parameter, bands)

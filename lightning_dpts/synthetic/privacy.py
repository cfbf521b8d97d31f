"""Privacy of PETS: the noisy nearest-neighbour histogram as a Gaussian mechanism, composed over T rounds.

What is protected (the neighbouring relation):

* ``unit="window"`` (the paper's unit): one private sample is one window. Adding or removing one window changes
  the vote histogram of Algorithm 2 by one count in one bin: L2 sensitivity Delta = 1. Under *substitution*
  (replace one window) one count moves between two bins: Delta = sqrt(2). Substitution is ``dpts synth``'s
  default for this unit because it is what a changed value does: the windows do not overlap, so one time step
  lies in exactly one window, and changing it can move that window's vote to another candidate.
* ``unit="series"`` (beyond the paper, for forecasting users): one private sample is a whole series. Each series
  contributes at most ``m`` windows, each with vote weight 1/m, so its vote vector v is non-negative with
  ||v||_2 <= ||v||_1 <= 1: Delta = 1 under add/remove; under substitution ||v - v'||_2^2 = ||v||^2 + ||v'||^2
  - 2<v, v'> <= 2, so Delta = sqrt(2).

Conditional generation (a class column) runs every class's histogram in the same round; one sample votes in
its own class only, so the concatenated histogram has the same Delta (PETS Appendix B, "Conditional
generation"; under substitution the class may change, which the sqrt(2) covers).

Each round adds N(0, (sigma * Delta)^2) to every bin (``sigma`` is the noise multiplier), so one round is the
Gaussian mechanism with Delta / std = 1 / sigma (PETS Theorem 1). Its privacy profile has the closed form

    H(e^eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu),   mu = Delta / std,

which is what :func:`gaussian_mechanism_profile` returns. The T rounds are composed by the package's one
composition path (:class:`~lightning_dpts.privacy.accountant.ProfileAccountant`: connect-the-dots PLD,
pessimistic, tail truncation chosen from delta and T, FFT round-off bounded), and the result
is checked in the tests against PETS Theorem 2's closed form (T Gaussian mechanisms compose to one with
mu_T = sqrt(T) * Delta / std): the PLD epsilon is never below it and exceeds it only by the discretisation.
Thresholding, normalisation, resampling and variation are post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy.special import log_ndtr, ndtr

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import ProfileAccountant
from lightning_dpts.privacy.profiles import PrivacyProfile

__all__ = [
    "PROTECTS",
    "RELATIONS",
    "UNITS",
    "PETSAccountant",
    "calibrate_pets_noise",
    "gaussian_mechanism_profile",
    "sensitivity",
    "theorem_2_delta",
    "theorem_2_epsilon",
]

#: Neighbouring relations: add/remove one unit (Delta = 1) or substitute one unit (Delta = sqrt(2)).
RELATIONS: tuple[str, ...] = ("add_remove", "substitution")
#: Privacy units: one series (at most m windows, vote weight 1/m each) or one window (the paper's, weight 1).
UNITS: tuple[str, ...] = ("series", "window")
#: What each unit protects, in words (``report.json``'s ``protects``, ``dpts synth --help``, docs/synthetic.md).
PROTECTS: dict[str, str] = {
    "series": "one whole series (all its values) joining or leaving the data (relation add_remove, the default), "
              "or being replaced (substitution)",
    "window": "one window of --length consecutive steps of one series: with relation substitution (the default) "
              "any change of the values inside it, e.g. one time step's value (the windows do not overlap, so one "
              "step lies in exactly one window); with add_remove only one window joining or leaving. A change "
              "spanning k windows (w consecutive steps reach up to ceil((w - 1) / length) + 1 windows) is covered "
              "only by group privacy over k units, a whole series over all its windows",
}


def sensitivity(relation: str) -> float:
    """L2 sensitivity Delta of the (weighted) vote histogram under ``relation`` (see the module docstring)."""
    if relation == "add_remove":
        return 1.0
    if relation == "substitution":
        return math.sqrt(2.0)
    raise ConfigurationError("relation", relation, f"must be one of {', '.join(RELATIONS)}")


def _check_sigma(sigma: float) -> float:
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (sigma > 0 and math.isfinite(sigma)):
        raise ConfigurationError("noise_multiplier", sigma, "must be a finite number > 0")
    return float(sigma)


def _check_rounds(rounds: int) -> int:
    if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 1:
        raise ConfigurationError("iterations", rounds, "must be an integer >= 1")
    return int(rounds)


def _gaussian_delta(mu: float, eps: np.ndarray) -> np.ndarray:
    """Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) (PETS Theorem 1 with mu = Delta/std), overflow-safe."""
    eps = np.asarray(eps, dtype=np.float64)
    first = ndtr(mu / 2.0 - eps / mu)
    second = np.exp(eps + log_ndtr(-mu / 2.0 - eps / mu))
    return np.clip(first - second, 0.0, 1.0)


def gaussian_mechanism_profile(noise_multiplier: float) -> PrivacyProfile:
    """Privacy profile of one round: the Gaussian mechanism with Delta / std = 1 / ``noise_multiplier``.

    The profile is symmetric (the pair N(0, s) vs N(Delta, s) mirrors itself), which is what
    :class:`~lightning_dpts.privacy.profiles.PrivacyProfile` assumes; the values for alpha >= 1 are PETS
    Theorem 1's closed form (Balle & Wang 2018, Theorem 8).
    """
    mu = 1.0 / _check_sigma(noise_multiplier)
    return PrivacyProfile(
        theorem="PETS Theorem 1 (Gaussian mechanism)",
        kind="tight",
        description=f"N(0, sigma^2) vs N(1, sigma^2), sigma = {noise_multiplier:g}",
        _upper_half=lambda log_alpha: _gaussian_delta(mu, log_alpha),
    )


def theorem_2_delta(epsilon: float, noise_multiplier: float, rounds: int) -> float:
    """delta(epsilon) of T rounds in closed form, PETS Theorem 2 (mu_T = sqrt(T) / sigma)."""
    mu = math.sqrt(_check_rounds(rounds)) / _check_sigma(noise_multiplier)
    return float(_gaussian_delta(mu, np.array([float(epsilon)]))[0])


def theorem_2_epsilon(delta: float, noise_multiplier: float, rounds: int) -> float:
    """The smallest epsilon >= 0 with :func:`theorem_2_delta` <= ``delta`` (root of the closed form)."""
    if not 0 < delta < 1:
        raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
    if theorem_2_delta(0.0, noise_multiplier, rounds) <= delta:
        return 0.0
    hi = 1.0
    while theorem_2_delta(hi, noise_multiplier, rounds) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: theorem_2_delta(e, noise_multiplier, rounds) - delta, 0.0, hi,
                                 xtol=1e-12, rtol=1e-12))


@dataclass
class PETSAccountant:
    """(epsilon, delta) of ``rounds`` rounds of Algorithm 2 at noise multiplier sigma, by PLD composition.

    Args:
        noise_multiplier: sigma; the noise std per histogram bin is ``sigma * sensitivity(relation)``.
        discretization: privacy-loss grid spacing of the connect-the-dots PLD (pessimistic).
    """

    noise_multiplier: float
    discretization: float = 1e-4

    def __post_init__(self) -> None:
        self.noise_multiplier = _check_sigma(self.noise_multiplier)
        self.profile = gaussian_mechanism_profile(self.noise_multiplier)
        self._accountant = ProfileAccountant(self.profile, discretization=self.discretization,
                                             scale=("noise_multiplier", self.noise_multiplier))

    def _rounds(self, rounds: int, read: Callable[[int], float]) -> float:
        rounds = _check_rounds(rounds)
        try:
            return float(read(rounds))
        except ConfigurationError as err:
            if err.parameter == "compositions":
                raise ConfigurationError("iterations", rounds, "are more rounds than the accountant composes in "
                                         "bounded memory; raise the noise multiplier or use fewer rounds") from None
            raise

    def epsilon(self, rounds: int, delta: float) -> float:
        """The epsilon (an upper bound, PLD-pessimistic) after ``rounds`` adaptive rounds at ``delta``."""
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
        return self._rounds(rounds, lambda n: self._accountant.epsilon_after(n, float(delta)))

    def delta(self, rounds: int, epsilon: float) -> float:
        """The delta (an upper bound) after ``rounds`` rounds at ``epsilon``."""
        return self._rounds(rounds, lambda n: self._accountant.delta_after(n, float(epsilon)))


def calibrate_pets_noise(epsilon: float, delta: float, rounds: int, rtol: float = 1e-3) -> float:
    """The smallest noise multiplier (within ``rtol``, rounded up) whose PLD epsilon after ``rounds`` is <= target.

    The bracket starts from Theorem 2's closed form; the returned sigma is checked with :class:`PETSAccountant`
    (the number the report states), so the target always holds for the accounted epsilon.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (0 < epsilon < math.inf):
        raise ConfigurationError("epsilon", epsilon, "must be a finite number > 0")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
    rounds = _check_rounds(rounds)

    def fits(sigma: float) -> bool:
        return PETSAccountant(sigma).epsilon(rounds, delta) <= epsilon

    # closed-form guess, then bracket [lo (fails), hi (fits)] and bisect on log sigma
    smallest, largest = 1e-3, 1e6
    if theorem_2_delta(epsilon, smallest, rounds) <= delta:
        raise ConfigurationError("epsilon", epsilon, f"is too large to calibrate: {rounds} round(s) would need a noise "
                                 f"multiplier below {smallest:g} (the votes would be released almost exactly)")
    if theorem_2_delta(epsilon, largest, rounds) > delta:
        raise ConfigurationError("epsilon", epsilon, f"is too small to calibrate: {rounds} round(s) would need a noise "
                                 f"multiplier above {largest:g}")
    guess = optimize.brentq(lambda s: theorem_2_delta(epsilon, s, rounds) - delta, smallest, largest)
    hi = guess * 1.01
    while not fits(hi):
        hi *= 1.1
    lo = guess * 0.99
    while fits(lo):
        lo *= 0.9
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi

"""Privacy profiles of structured subsampling, one function per theorem of the paper.

A privacy profile is H(alpha) = sup_{x ~ x'} H_alpha(M_x || M_x') for alpha >= 0 (Definition D.9). Every
bound here is **symmetric** in the sense H(alpha) = 1 - alpha + alpha * H(1/alpha) for alpha < 1:

* the *switching* profiles of Theorems 4.2, 4.3, 4.4, 4.5, F.7, G.1 and Propositions C.1/C.2 use
  H_alpha(P || N(0, sigma)) for alpha >= 1 and H_alpha(N(0, sigma) || P) for alpha < 1, and
  H_alpha(Q||P) = 1 - alpha + alpha H_{1/alpha}(P||Q) holds for any pair;
* the opposed mixtures MoG(-mu, p) vs MoG(mu, p) of Theorems E.1, E.8 (and F.8's construction) are mirror
  images of each other, so their profile satisfies the same identity;
* Theorems F.1/F.2 are (1 - rho) * max(0, 1 - alpha) + rho * (one of the above), which preserves it.

So a profile is fully described by its values for alpha >= 1, which is all :class:`PrivacyProfile` stores.
Per trap 1 of the privacy notes, the accountant composes *this single profile* (through its
connect-the-dots PLD), never the add and remove directions separately.

Means are in units of the clipping norm C and sigma is the noise multiplier: the noise std on the summed
gradient is sigma * C (Algorithm 2), so only their ratio matters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.special import ndtr

from lightning_dpts.privacy.mixtures import MonotoneMixturePair

__all__ = [
    "PrivacyProfile",
    "gaussian_tvd",
    "theorem_4_2",
    "theorem_4_3",
    "theorem_4_4",
    "theorem_e_1",
    "theorem_e_8",
    "theorem_f_1",
    "theorem_f_2",
    "theorem_f_7",
    "theorem_f_8",
    "theorem_g_1",
    "proposition_c_1",
    "proposition_c_2",
    "pointwise_max",
]

#: Default total weight of negligible mixture components that may be dropped (and accounted as a fully
#: distinguishable pair). Far below the PLD tail-mass truncations (1e-15, and 1e-27 for delta < 1e-6).
COMPONENT_TRUNCATION = 1e-30


@dataclass(frozen=True, eq=False)
class PrivacyProfile:
    """A symmetric privacy profile alpha -> H(alpha), known through its values for alpha >= 1.

    Attributes:
        theorem: the result that proves the bound (e.g. ``"Theorem 4.4"``).
        kind: ``"tight"`` (proven equal to the mechanism's profile), ``"upper"`` (sound, maybe loose) or
            ``"lower"`` (optimistic: a profile the mechanism provably reaches, *not* a guarantee).
        description: the mixtures being compared, for reports.
        pair: the dominating mixture pair, when the profile is rho * H_pair for alpha >= 1 (all theorems of
            the paper); ``None`` for profiles given only through ``_upper_half``.
        rho: the top-level weight of Lemma F.4 ((1 - rho) * max(0, 1 - alpha) + rho * H_pair); 1 otherwise.
    """

    theorem: str
    kind: str
    description: str
    _upper_half: Callable[[np.ndarray], np.ndarray]
    pair: MonotoneMixturePair | None = None
    rho: float = 1.0

    def hockey_stick_at_log_alpha(self, log_alpha: np.ndarray) -> np.ndarray:
        """H(e^eps) for eps = ``log_alpha`` of any sign (vectorised)."""
        log_alpha = np.atleast_1d(np.asarray(log_alpha, dtype=np.float64))
        out = np.empty_like(log_alpha)
        upper = log_alpha >= 0
        out[upper] = self._upper_half(log_alpha[upper])
        if np.any(~upper):
            lower = log_alpha[~upper]
            alpha = np.exp(lower)
            out[~upper] = 1.0 - alpha + alpha * self._upper_half(-lower)
        return np.clip(out, 0.0, 1.0)

    def __call__(self, alpha: float | np.ndarray) -> np.ndarray:
        """H(alpha) for alpha >= 0."""
        alpha = np.atleast_1d(np.asarray(alpha, dtype=np.float64))
        if np.any(alpha < 0):
            raise ValueError("alpha must be >= 0")
        out = np.ones_like(alpha)  # H(0) = 1
        pos = alpha > 0
        out[pos] = self.hockey_stick_at_log_alpha(np.log(alpha[pos]))
        return out

    def delta(self, epsilon: float | np.ndarray) -> np.ndarray:
        """delta(eps) = H(e^eps) of a single composition unit."""
        return self.hockey_stick_at_log_alpha(np.asarray(epsilon, dtype=np.float64))


def pointwise_max(members: list[PrivacyProfile], theorem: str, kind: str, description: str) -> PrivacyProfile:
    """The profile alpha -> max_j H_j(alpha) of several symmetric privacy profiles.

    Used for datasets whose series have different lengths: the protected unit lies in *one* series, so every
    neighbouring pair of datasets is covered by the profile of that series' length, and the maximum covers
    them all. The maximum of symmetric profiles is symmetric (the map H -> 1 - alpha + alpha H is increasing),
    convex in alpha (a maximum of convex functions) and hence a valid profile for connect-the-dots; a PLD
    built from values that dominate each member's values dominates each member's PLD (docs/privacy.md).
    """
    if not members:
        raise ValueError("pointwise_max needs at least one profile")
    if len(members) == 1:
        only = members[0]
        return PrivacyProfile(theorem, kind, description, only._upper_half, only.pair, only.rho)
    halves = [m._upper_half for m in members]

    def upper_half(log_alpha: np.ndarray) -> np.ndarray:
        out = np.asarray(halves[0](log_alpha), dtype=np.float64)
        for half in halves[1:]:
            out = np.maximum(out, half(log_alpha))
        return out

    return PrivacyProfile(theorem, kind, description, upper_half)


def gaussian_tvd(shift: float, std: float) -> float:
    """Total variation distance TVD(N(0, std), N(shift, std)) = 2 Phi(shift / (2 std)) - 1; 1 if std = 0."""
    if std == 0:
        return 1.0 if shift > 0 else 0.0
    return float(2.0 * ndtr(shift / (2.0 * std)) - 1.0)


def _check_probability(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must lie in [0, 1], got {value}")


def _check_sigma(sigma: float) -> None:
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"noise multiplier sigma must be finite and > 0, got {sigma}")


def _mixture_vs_gaussian(means: np.ndarray, weights: np.ndarray, sigma: float) -> MonotoneMixturePair:
    return MonotoneMixturePair(np.asarray(means) / sigma, weights, opposed=False,
                               component_truncation=COMPONENT_TRUNCATION)


def _opposed(means: np.ndarray, weights: np.ndarray, sigma: float) -> MonotoneMixturePair:
    return MonotoneMixturePair(np.asarray(means) / sigma, weights, opposed=True,
                               component_truncation=COMPONENT_TRUNCATION)


def _binomial_weights(n: int, p: float) -> np.ndarray:
    return stats.binom.pmf(np.arange(n + 1), n, p)


def _profile(theorem: str, kind: str, description: str, pair: MonotoneMixturePair,
             rho: float = 1.0) -> PrivacyProfile:
    """Wrap a mixture pair; rho < 1 gives (1 - rho) * max(0, 1 - alpha) + rho * H_pair (Lemma F.4)."""
    if rho == 1.0:
        return PrivacyProfile(theorem, kind, description, pair.hockey_stick, pair, 1.0)

    def upper_half(log_alpha: np.ndarray) -> np.ndarray:
        return rho * pair.hockey_stick(log_alpha)

    return PrivacyProfile(theorem, kind, description, upper_half, pair, rho)


# ------------------------------------------------------------------------------------------------------
# Top-level iteration / shuffling (per-epoch profiles, Appendix E)
# ------------------------------------------------------------------------------------------------------
def theorem_4_2(r: float, sigma: float) -> PrivacyProfile:
    """Theorem 4.2 (tight): epoch of top-level iteration, bottom level with replacement, lambda = 1.

    Switching profile of P(1) = MoG([0, 2], [1 - r, r], sigma) against N(0, sigma), with r = k/T the
    probability that the single sampled window contains the protected unit.
    """
    return theorem_4_4(1.0, r, sigma, _theorem="Theorem 4.2")


def theorem_4_3(lam: int, r: float, sigma: float) -> PrivacyProfile:
    """Theorem 4.3 (optimistic lower bound): iteration, with replacement, lambda >= 1, per epoch.

    Switching profile of MoG(mu, p, sigma) vs N(0, sigma), mu_i = 2i, p_i = Binomial(i | lambda, r),
    i = 0..lambda. Equals Theorem 4.2 for lambda = 1.
    """
    return theorem_f_7(1.0, lam, r, sigma, _theorem="Theorem 4.3")


def theorem_e_1(lam: int, r: float, sigma: float) -> PrivacyProfile:
    """Theorem E.1 (sound upper bound): iteration, with replacement, lambda >= 1, per epoch.

    H_alpha(MoG(-mu, p, sigma) || MoG(mu, p, sigma)), mu_i = 2i, p_i = Binomial(i | lambda, r), i = 0..lambda
    (the double mixture; trap 2: comparing MoG(mu, p) with N(0, sigma) would be Theorem 4.3's lower bound).
    """
    return theorem_f_1(1.0, lam, r, sigma, _theorem="Theorem E.1")


def theorem_e_8(k: int, r: float, sigma: float) -> PrivacyProfile:
    """Theorem E.8 (tight): iteration, bottom-level Poisson with rate r = min(1, lambda/T), per epoch.

    H_alpha(MoG(-mu, p, sigma) || MoG(mu, p, sigma)), mu_i = i, p_i = Binomial(i | k, r), i = 0..k, where k
    windows can contain the protected unit (insertion/removal sensitivity C, hence unit spacing).
    """
    return theorem_f_2(1.0, k, r, sigma, _theorem="Theorem E.8", _kind="tight")


# ------------------------------------------------------------------------------------------------------
# Top-level sampling without replacement (per-step profiles, Appendix F) -- also used for Poisson top level
# ------------------------------------------------------------------------------------------------------
def theorem_4_4(rho: float, r: float, sigma: float, *, _theorem: str = "Theorem 4.4") -> PrivacyProfile:
    """Theorem 4.4 (tight): top level without replacement, bottom level with replacement, lambda = 1.

    Switching profile of MoG([0, 2], [1 - rho r, rho r], sigma) vs N(0, sigma), rho = N'/N.
    """
    _check_probability("rho", rho)
    _check_probability("r", r)
    _check_sigma(sigma)
    q = rho * r
    pair = _mixture_vs_gaussian(np.array([0.0, 2.0]), np.array([1.0 - q, q]), sigma)
    return _profile(_theorem, "tight", f"MoG([0, 2], [1-{q:.6g}, {q:.6g}], sigma={sigma:g}) vs N(0, sigma)",
                    pair)


def theorem_f_1(rho: float, lam: int, r: float, sigma: float, *, _theorem: str = "Theorem F.1"
                ) -> PrivacyProfile:
    """Theorem F.1 (sound upper bound): without replacement + with replacement, lambda >= 1, per step.

    (1 - rho) * max(0, 1 - alpha) + rho * H_alpha(MoG(-mu, p) || MoG(mu, p)) with Theorem E.1's mixtures.
    """
    _check_probability("rho", rho)
    _check_probability("r", r)
    _check_sigma(sigma)
    means = 2.0 * np.arange(lam + 1)
    pair = _opposed(means, _binomial_weights(lam, r), sigma)
    desc = f"MoG(-mu, Bin({lam}, {r:.6g})) vs MoG(mu, Bin), mu_i = 2i, sigma={sigma:g}"
    if rho < 1:
        desc = f"(1-{rho:.6g}) * identity + {rho:.6g} * [{desc}]"
    return _profile(_theorem, "upper", desc, pair, rho)


def theorem_f_2(rho: float, k: int, r: float, sigma: float, *, _theorem: str = "Theorem F.2",
                _kind: str = "upper") -> PrivacyProfile:
    """Theorem F.2 (sound upper bound): without replacement + bottom-level Poisson, any lambda, per step.

    (1 - rho) * max(0, 1 - alpha) + rho * H_alpha(MoG(-mu, p) || MoG(mu, p)) with Theorem E.8's mixtures.
    """
    _check_probability("rho", rho)
    _check_probability("r", r)
    _check_sigma(sigma)
    means = np.arange(k + 1, dtype=np.float64)
    pair = _opposed(means, _binomial_weights(k, r), sigma)
    desc = f"MoG(-mu, Bin({k}, {r:.6g})) vs MoG(mu, Bin), mu_i = i, sigma={sigma:g}"
    if rho < 1:
        desc = f"(1-{rho:.6g}) * identity + {rho:.6g} * [{desc}]"
    return _profile(_theorem, _kind, desc, pair, rho)


def theorem_f_7(rho: float, lam: int, r: float, sigma: float, *, _theorem: str = "Theorem F.7"
                ) -> PrivacyProfile:
    """Theorem F.7 (optimistic lower bound): without replacement + with replacement, lambda >= 1, per step.

    Switching profile of (1 - rho) N(0, sigma) + rho MoG(mu, p, sigma) vs N(0, sigma), mu_i = 2i,
    p_i = Binomial(i | lambda, r). Equals Theorem 4.4 for lambda = 1.
    """
    _check_probability("rho", rho)
    _check_probability("r", r)
    _check_sigma(sigma)
    weights = rho * _binomial_weights(lam, r)
    weights[0] += 1.0 - rho
    pair = _mixture_vs_gaussian(2.0 * np.arange(lam + 1), weights, sigma)
    kind = "tight" if lam == 1 else "lower"
    return _profile(_theorem, kind, f"(1-{rho:.6g}) N(0) + {rho:.6g} MoG(2i, Bin({lam}, {r:.6g})) vs N(0), "
                    f"sigma={sigma:g}", pair)


def theorem_f_8(rho: float, k: int, r: float, sigma: float) -> PrivacyProfile:
    """Theorem F.8 (optimistic lower bound): without replacement + bottom-level Poisson, per step.

    The proof's construction (Lemma E.12 thinned by top-level sampling) yields the pair
    (1 - rho) N(0) + rho MoG(-mu, p)  vs  (1 - rho) N(0) + rho MoG(mu, p), mu_i = i, p_i = Binomial(i | k, r).
    We implement that pair; it reduces to Theorem E.8 at rho = 1. (The theorem as typeset compares with
    N(0, sigma), a weaker lower bound from a one-sided construction.)
    """
    _check_probability("rho", rho)
    _check_probability("r", r)
    _check_sigma(sigma)
    weights = rho * _binomial_weights(k, r)
    weights[0] += 1.0 - rho
    pair = _opposed(np.arange(k + 1, dtype=np.float64), weights, sigma)
    return _profile("Theorem F.8", "lower",
                    f"(1-{rho:.6g}) N(0) + {rho:.6g} MoG(-i, Bin({k}, {r:.6g})) vs its mirror image, "
                    f"sigma={sigma:g}", pair)


def theorem_g_1(p2: float, sigma: float, *, _theorem: str = "Theorem G.1") -> PrivacyProfile:
    """Theorem G.1 (sound upper bound): without replacement + with replacement, lambda = 1, plus Eq. (1)
    context/forecast noise augmentation, per step.

    Switching profile of MoG([0, 2], [1 - p2, p2], sigma) vs N(0, sigma), with
    p2 = rho * r * (phi * tau_F + (1 - phi) * tau_C) computed by the caller (see
    :func:`lightning_dpts.privacy.bounds.augmentation_leak_probability`).
    """
    _check_probability("p2", p2)
    _check_sigma(sigma)
    pair = _mixture_vs_gaussian(np.array([0.0, 2.0]), np.array([1.0 - p2, p2]), sigma)
    return _profile(_theorem, "upper", f"MoG([0, 2], [1-{p2:.6g}, {p2:.6g}], sigma={sigma:g}) vs N(0, sigma)",
                    pair)


# ------------------------------------------------------------------------------------------------------
# Naive DP-SGD over the flattened set of all windows (Appendix C.3)
# ------------------------------------------------------------------------------------------------------
def proposition_c_1(total_windows: int, batch_size: int, sigma: float) -> PrivacyProfile:
    """Proposition C.1: what standard DP-SGD would *claim* when sampling Lambda of N_total windows WOR.

    Switching profile of MoG([0, 2], [1 - q, q], sigma) vs N(0, sigma), q = Lambda / N_total. Only valid for
    a relation under which one record is one window -- not for events inside series.
    """
    if not 1 <= batch_size <= total_windows:
        raise ValueError("need 1 <= batch_size <= total_windows")
    return theorem_4_4(1.0, batch_size / total_windows, sigma, _theorem="Proposition C.1")


def proposition_c_2(total_windows: int, group_size: int, batch_size: int, sigma: float) -> PrivacyProfile:
    """Proposition C.2 (optimistic lower bound): naive DP-SGD over all windows when k windows change.

    Switching profile of MoG(mu, p, sigma) vs N(0, sigma), mu_i = 2i, p_i = Hypergeom(i | N_total, k, Lambda).
    """
    if not 1 <= batch_size <= total_windows or not 1 <= group_size <= total_windows:
        raise ValueError("need 1 <= batch_size, group_size <= total_windows")
    upper = min(group_size, batch_size)
    i = np.arange(upper + 1)
    weights = stats.hypergeom.pmf(i, total_windows, group_size, batch_size)
    weights = weights / weights.sum()
    _check_sigma(sigma)
    pair = _mixture_vs_gaussian(2.0 * i, weights, sigma)
    return _profile("Proposition C.2", "lower",
                    f"MoG(2i, Hypergeom({total_windows}, {group_size}, {batch_size})) vs N(0), sigma={sigma:g}",
                    pair)

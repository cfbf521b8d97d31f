"""Privacy accounting for releasing forecasts made from a privatised series (time-domain subsampling).

The mechanism (see :mod:`lightning_dpts.release.mechanism`) keeps each time step of the released window
independently with probability p (Poisson subsampling, data-independent), adds N(0, s^2) to the kept values
and imputes the others; optionally it first applies a circulant low-pass filter A (Koga et al., 2022,
Section 2 and Algorithm 1). The protected unit is the package's (w, v) relation
(:class:`~lightning_dpts.privacy.spec.NeighbouringRelation`): it changes at most w steps of the released
window by at most v each (times sqrt(D) per step when v bounds each of D coordinates), so the change has l2
norm at most v*sqrt(w*D). Only the overlap of the unit with the released window counts: with a window of T
steps, w is replaced by min(w, T). Event- and user-level units give the same bounds, because the sampled set
J treats every time step alike and the filter bound only uses ||x - x'||_2.

Bounds (all in ``bound=...``):

* ``"exact"`` (identity filter only): the tight privacy profile. J is data-independent and part of the
  output, so the hockey-stick divergence is the expectation over J of Gaussian-mechanism divergences with
  sensitivity v*sqrt(|J cap j|), |J cap j| ~ Binom(w, p) in the worst case:
  ``delta(eps) = sum_m Binom(m; w, p) [Phi(mu_m/2 - eps/mu_m) - e^eps Phi(-mu_m/2 - eps/mu_m)]``,
  ``mu_m = v sqrt(m) / s`` (m = 0 contributes 0). Proof in ``docs/release.md``. Composed over K releases
  with the package's connect-the-dots PLD machinery.
* ``"koga"``: Koga et al. (AISTATS 2022) Theorem 2 + Corollary 3 (identity filter) or Theorem 4 +
  Corollary 2 (filter), with the typos corrected (see ``docs/release.md``). The per-branch Gaussian-mechanism
  step is evaluated with the exact (analytic) Gaussian delta by default (``gaussian="analytic"``), which is
  valid for every eps; ``gaussian="classical"`` uses the paper's Theorem 1 (sigma >= sqrt(2 ln(1.25/delta))
  Delta/eps), which only holds for eps < 1 in *both* branches, and raises outside that range. K > 1 releases
  compose the single-release (eps, delta) guarantee with the better of basic and advanced composition.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np
from scipy import stats
from scipy.special import log_ndtr

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy._dp_accounting import PrivacyLossDistribution
from lightning_dpts.privacy.accountant import ProfileAccountant, narrow_noise_bracket
from lightning_dpts.privacy.pld import (
    DEFAULT_DISCRETIZATION,
    DEFAULT_MIN_GRID_POINTS,
    DEFAULT_TAIL_MASS,
    MAX_COMPOSED_POINTS,
    epsilon_for_delta,
)
from lightning_dpts.privacy.profiles import PrivacyProfile
from lightning_dpts.privacy.spec import NeighbouringRelation

_T = TypeVar("_T")

__all__ = [
    "BOUNDS",
    "GAUSSIAN_STEPS",
    "ReleaseSpec",
    "ReleaseAccountant",
    "calibrate_release_noise",
    "gaussian_delta",
    "exact_release_profile",
    "exact_release_delta",
    "filter_constants",
    "koga_identity_failure_probability",
    "koga_filter_failure_probability",
    "koga_identity_delta",
    "koga_filter_delta",
    "koga_epsilon",
]

Bound = Literal["exact", "koga"]
GaussianStep = Literal["analytic", "classical"]
BOUNDS: tuple[str, ...] = ("exact", "koga")
GAUSSIAN_STEPS: tuple[str, ...] = ("analytic", "classical")

#: Binomial weight that may be moved pessimistically (upwards to a larger m, or to a fully distinguishable
#: component) when evaluating the exact profile for large w.
_WEIGHT_TRUNCATION = 1e-18


# ------------------------------------------------------------------------------------------------------
# validation helpers
# ------------------------------------------------------------------------------------------------------
def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise ConfigurationError(name, value, "must be a finite number")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigurationError(name, value, "must be a finite number")
    return value


def _check_rate(rate: object) -> float:
    p = _number("rate", rate)
    if not 0 < p <= 1:
        raise ConfigurationError("rate", rate, "must lie in (0, 1] (Poisson subsampling rate p)")
    return p


#: Accepted range of the noise std and of the per-step l2 bound v sqrt(D) (series units): their ratio must be
#: representable, so that no sensitivity-to-noise ratio overflows or underflows.
SCALE_RANGE = (1e-100, 1e100)
#: Largest epsilon :func:`calibrate_release_noise` calibrates for (as ``dpts fit``'s budget cap: a larger epsilon
#: protects nothing). It bounds the time: tiny noise stds make the composed grid large (3 releases: 4 s at 100,
#: 20 s at 1000 on the project machines).
MAX_RELEASE_CALIBRATION_EPSILON = 100.0
#: Largest relation size w a release accounts (the binomial over w + 1 counts is evaluated in memory).
MAX_RELEASE_SIZE = 10**6


def _check_noise_std(noise_std: object) -> float:
    s = _number("noise_std", noise_std)
    if not SCALE_RANGE[0] <= s <= SCALE_RANGE[1]:
        raise ConfigurationError("noise_std", noise_std, f"must be a number in [{SCALE_RANGE[0]:g}, "
                                 f"{SCALE_RANGE[1]:g}] (series units)")
    return s


def _check_delta(delta: object) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.floating)) or not 0 < delta < 1:
        raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
    return float(delta)


def _check_epsilon(epsilon: object) -> float:
    e = _number("epsilon", epsilon)
    if e < 0:
        raise ConfigurationError("epsilon", epsilon, "must be a finite number >= 0")
    return e


def _check_releases(releases: object) -> int:
    if isinstance(releases, bool) or not isinstance(releases, (int, np.integer)) or releases < 1:
        raise ConfigurationError("releases", releases, "must be an integer >= 1 (number of releases K)")
    return int(releases)


def _check_bound(bound: object) -> str:
    if bound not in BOUNDS:
        raise ConfigurationError("bound", bound, "must be 'exact' or 'koga'")
    return str(bound)


def _check_gaussian(gaussian: object) -> str:
    if gaussian not in GAUSSIAN_STEPS:
        raise ConfigurationError("gaussian", gaussian, "must be 'analytic' or 'classical'")
    return str(gaussian)


# ------------------------------------------------------------------------------------------------------
# the Gaussian mechanism
# ------------------------------------------------------------------------------------------------------
def gaussian_delta(epsilon: np.ndarray | float, mu: np.ndarray | float) -> np.ndarray:
    """Tight delta(eps) of the Gaussian mechanism with sensitivity/std ratio ``mu`` (Balle & Wang, 2018).

    ``Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)``, evaluated in log space (log_ndtr, expm1) so that
    tiny deltas keep their relative precision instead of cancelling; ``mu = 0`` gives 0 and ``mu = inf``
    gives 1 (for finite eps). Broadcasts ``epsilon`` (>= 0) against ``mu`` (>= 0).
    """
    eps, mu = np.broadcast_arrays(np.asarray(epsilon, dtype=np.float64), np.asarray(mu, dtype=np.float64))
    out = np.zeros(eps.shape, dtype=np.float64)
    inf = np.isinf(mu)
    out[inf] = 1.0
    pos = (mu > 0) & ~inf
    if np.any(pos):
        e, m = eps[pos], mu[pos]
        la = log_ndtr(m / 2 - e / m)
        lb = e + log_ndtr(-m / 2 - e / m)
        diff = np.minimum(lb - la, 0.0)  # la >= lb mathematically; clip rounding
        with np.errstate(divide="ignore"):
            out[pos] = np.exp(la) * -np.expm1(diff)
    return np.clip(out, 0.0, 1.0)


def _gaussian_classical_delta(epsilon: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Koga et al. Theorem 1 (Dwork & Roth): noise s = c Delta / eps with c^2 = 2 ln(1.25/delta) gives
    (eps, delta)-DP for eps in (0, 1); solved for delta: 1.25 exp(-(eps/mu)^2 / 2), mu = Delta/s."""
    eps, mu = np.broadcast_arrays(np.asarray(epsilon, dtype=np.float64), np.asarray(mu, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(mu > 0, 1.25 * np.exp(-0.5 * (eps / np.where(mu > 0, mu, 1.0)) ** 2), 0.0)
    return np.minimum(out, 1.0)


# ------------------------------------------------------------------------------------------------------
# the release description
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ReleaseSpec:
    """What one release does, for accounting: sampling rate, the unit of privacy, window and filter.

    Args:
        rate: p in (0, 1], the Poisson probability that a time step of the released window is kept.
        relation: the (w, v) relation; ``value_bound`` (v, series units) is required. ``level`` does not
            change the bounds (see the module docstring).
        context_length: T, the number of time steps of the released window (what the forecaster reads,
            including lags), or ``None`` if unknown (then all w steps are assumed to fall inside it).
            The effective size is min(w, T).
        filter_kernel: ``None`` for the identity filter, or the first column h (length T, non-negative,
            summing to 1) of the circulant filter A of Koga et al. Section 2; requires ``context_length``.
    """

    rate: float
    relation: NeighbouringRelation
    context_length: int | None = None
    filter_kernel: np.ndarray | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", _check_rate(self.rate))
        if not isinstance(self.relation, NeighbouringRelation):
            raise ConfigurationError("relation", self.relation, "must be a NeighbouringRelation")
        if self.relation.value_bound is None:
            raise ConfigurationError("value_bound", None, "a finite value bound v > 0 is required for releases")
        if not SCALE_RANGE[0] <= self.step_bound <= SCALE_RANGE[1]:
            raise ConfigurationError("value_bound", self.relation.value_bound,
                                     f"v * sqrt(num_dims) must lie in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]")
        if self.size > MAX_RELEASE_SIZE:
            raise ConfigurationError("size", self.relation.size, f"must be <= {MAX_RELEASE_SIZE} protected steps "
                                     "inside the released window (or give context_length to cap it)")
        if self.context_length is not None:
            t = self.context_length
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 1:
                raise ConfigurationError("context_length", t, "must be an integer >= 1 or None")
        if self.filter_kernel is not None:
            h = np.asarray(self.filter_kernel, dtype=np.float64)
            if h.ndim != 1 or self.context_length is None or h.shape[0] != self.context_length:
                raise ConfigurationError(
                    "filter_kernel", f"array of shape {h.shape}",
                    "must be a 1-d array of length context_length (the released window length T)")
            if not np.all(np.isfinite(h)) or np.any(h < 0) or abs(h.sum() - 1.0) > 1e-9:
                raise ConfigurationError(
                    "filter_kernel", "array", "must be non-negative and sum to 1 (Koga et al. Section 2: "
                    "||A_t||_1 = 1, which with h >= 0 gives sigma_max(A) = 1)")
            h.setflags(write=False)
            object.__setattr__(self, "filter_kernel", h)

    @property
    def size(self) -> int:
        """w_eff = min(w, T): protected time steps that can fall inside the released window."""
        w = self.relation.size
        return w if self.context_length is None else min(w, int(self.context_length))

    @property
    def step_bound(self) -> float:
        """l2 bound of the change at one time step: v, times sqrt(D) for D-dimensional series."""
        return float(self.relation.value_bound) * math.sqrt(self.relation.num_dims)  # type: ignore[arg-type]

    @property
    def has_filter(self) -> bool:
        return self.filter_kernel is not None

    def mu(self, noise_std: float, m: np.ndarray | float) -> np.ndarray:
        """mu_m = v sqrt(D m) / s, the sensitivity-to-noise ratio when m protected steps are sampled."""
        return self.step_bound * np.sqrt(np.asarray(m, dtype=np.float64)) / noise_std


def _binomial_components(w: int, p: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(m values, weights, mass sent to a fully distinguishable component) for Binom(w, p), with negligible
    lower-tail weight moved up to the first kept m and negligible upper-tail weight sent to delta = 1
    (both pessimistic because the Gaussian delta grows with m)."""
    m = np.arange(w + 1)
    weights = stats.binom.pmf(m, w, p)
    if p == 1.0:
        return np.array([w]), np.array([1.0]), 0.0
    cdf = np.cumsum(weights)
    lo = int(np.searchsorted(cdf, _WEIGHT_TRUNCATION))
    sf = stats.binom.sf(m, w, p)  # P(M > m)
    keep_hi = np.nonzero(sf > _WEIGHT_TRUNCATION)[0]
    hi = min(w, int(keep_hi[-1]) + 1) if keep_hi.size else 0
    hi = max(hi, lo)
    ms = m[lo:hi + 1].copy()
    ws = weights[lo:hi + 1].copy()
    ws[0] += cdf[lo] - weights[lo] if lo > 0 else 0.0
    tail = float(sf[hi]) if hi < w else 0.0
    return ms, ws, tail


def exact_release_delta(spec: ReleaseSpec, noise_std: float, epsilon: np.ndarray | float) -> np.ndarray:
    """Exact delta(eps) of one release with the identity filter (eps >= 0, vectorised).

    ``sum_{m=0..w} Binom(m; w, p) [Phi(mu_m/2 - eps/mu_m) - e^eps Phi(-mu_m/2 - eps/mu_m)]``,
    ``mu_m = v sqrt(D m)/s`` (proof in docs/release.md).
    """
    if spec.has_filter:
        raise ConfigurationError("bound", "exact", "the exact bound covers the identity filter only; use "
                                 "bound='koga' (Koga et al. Corollary 2) with a filter")
    s = _check_noise_std(noise_std)
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))
    ms, ws, tail = _binomial_components(spec.size, spec.rate)
    mus = spec.mu(s, ms)
    out = np.full(eps.shape, tail)
    chunk = max(1, 2_000_000 // max(1, ms.size))
    for start in range(0, eps.size, chunk):
        block = eps[start:start + chunk]
        out[start:start + chunk] += gaussian_delta(block[:, None], mus[None, :]) @ ws
    return np.clip(out, 0.0, 1.0)


def exact_release_profile(spec: ReleaseSpec, noise_std: float) -> PrivacyProfile:
    """The tight, symmetric privacy profile of one release (identity filter) as a
    :class:`~lightning_dpts.privacy.profiles.PrivacyProfile`, ready for
    :func:`~lightning_dpts.privacy.pld.pld_from_profile`."""
    s = _check_noise_std(noise_std)
    exact_release_delta(spec, s, 0.0)  # validates (raises for a filter)
    return PrivacyProfile(
        theorem="exact time-domain subsampling profile (docs/release.md)",
        kind="tight",
        description=f"E_m~Binom({spec.size}, {spec.rate:g}) Gaussian(mu = {spec.step_bound:g} sqrt(m) / {s:g})",
        _upper_half=lambda log_alpha: exact_release_delta(spec, s, log_alpha),
    )


# ------------------------------------------------------------------------------------------------------
# Koga et al. (2022)
# ------------------------------------------------------------------------------------------------------
def koga_identity_failure_probability(size: int, rate: float, kept: np.ndarray | int) -> np.ndarray:
    """Koga et al. Theorem 2: delta' = Pr{|J cap j| > I'} = sum_{t=I'+1}^{I} Binom(t; I, p), I = ``size``,
    I' = ``kept`` (so that with probability 1 - delta' the l2 sensitivity is at most v sqrt(I'))."""
    return stats.binom.sf(np.asarray(kept), size, rate)


def filter_constants(kernel: np.ndarray) -> tuple[float, float]:
    """(srnk(A), L) of the circulant filter with first column ``kernel`` (Koga et al. Theorem 3):
    L = max_t ||A_t||_2^2 = ||h||_2^2 and srnk(A) = ||A||_F^2 / ||A||_2^2 = T ||h||_2^2 (sigma_max(A) = 1)."""
    h = np.asarray(kernel, dtype=np.float64)
    lmax = float(np.sum(h * h))
    return h.shape[0] * lmax, lmax


def koga_filter_failure_probability(kernel: np.ndarray, rate: float, alpha: np.ndarray | float) -> np.ndarray:
    """Koga et al. Theorem 4 (typo corrected): delta'(alpha) bounding Pr{sigma_max(B) > alpha}.

    Published: ``2 srnk(A) ((e^{a/p} - 1) / (a/p)^{a/p})^{p/L}`` with a = alpha^2. The proof (Appendix A.3)
    substitutes eps = a/p - 1 into Tropp's matrix Chernoff bound, giving ``e^{a/p - 1}`` in the numerator
    (the "- 1" belongs to the exponent). Tropp (2015) Theorem 7.2.1 (intrinsic dimension) needs
    eps >= L/mu_max, i.e. alpha^2 >= p + L; otherwise we use Theorem 5.1.1 (dimension T, any eps >= 0). The
    result is capped at 1, and is 0 at alpha = 1 (sigma_max(B) <= sigma_max(A) = 1 always).
    """
    a = np.atleast_1d(np.asarray(alpha, dtype=np.float64)) ** 2
    p = float(rate)
    srnk, lmax = filter_constants(kernel)
    t = np.asarray(kernel).shape[0]
    ratio = a / p
    with np.errstate(divide="ignore", invalid="ignore"):
        log_g = (p / lmax) * ((ratio - 1.0) - ratio * np.log(ratio))  # log (e^{eps}/(1+eps)^{1+eps})^{p/L}
    out = np.ones_like(a)
    valid = ratio >= 1.0
    dim_free = np.minimum(1.0, t * np.exp(np.where(valid, log_g, 0.0)))
    out = np.where(valid, dim_free, 1.0)
    intrinsic = valid & (a >= p + lmax)
    out = np.where(intrinsic, np.minimum(out, 2.0 * srnk * np.exp(np.where(intrinsic, log_g, 0.0))), out)
    out = np.where(a >= 1.0, 0.0, out)
    return out


def _koga_delta(eps: np.ndarray, mu_good: np.ndarray, mu_bad: float, scale: np.ndarray, fail: np.ndarray,
                gaussian: str) -> np.ndarray:
    """delta of Koga et al.'s Corollary 2/3 argument (Appendix A.4), broadcasting over eps x candidates.

    Good branch (J not in F): sensitivity ratio ``mu_good``, (eps, delta_a)-DP. Bad branch (J in F): the
    sensitivity is ``scale`` = 1/alpha times larger and the paper uses (eps/alpha, delta_b)-DP. Then
    ``delta <= delta_a + Pr{F} (e^{eps/alpha} - e^eps + delta_b - delta_a)_+`` and Pr{F} <= ``fail``. With
    the classical Gaussian step delta_a = delta_b and this is the published delta + delta'(e^{eps/a} - e^eps).
    """
    eps_bad = eps * scale
    if gaussian == "classical":
        d_good = _gaussian_classical_delta(eps, mu_good)
        d_bad = d_good
        # Theorem 1 needs eps < 1 in both branches (eps_bad >= eps); outside it the bound is not proven.
        ok = (eps_bad < 1.0) & (eps > 0)
    else:
        d_good = gaussian_delta(eps, mu_good)
        d_bad = gaussian_delta(eps_bad, mu_bad)
        ok = np.ones(np.broadcast(eps, mu_good).shape, dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        extra = np.maximum(0.0, np.exp(eps_bad) - np.exp(eps) + d_bad - d_good)
        total = d_good + np.where(fail > 0, fail * extra, 0.0)
    total = np.where(ok, total, np.inf)
    return np.minimum(total, np.where(ok, 1.0, np.inf))


def koga_identity_delta(spec: ReleaseSpec, noise_std: float, epsilon: np.ndarray | float,
                        gaussian: GaussianStep = "analytic") -> np.ndarray:
    """Koga et al. Corollary 3 (with Theorem 2): the best delta over I' in {1..w} at each eps (vectorised).

    For I' < w: delta = delta_a + delta'(I') (e^{eps sqrt(w/I')} - e^eps + delta_b - delta_a)_+, the
    sensitivity under F^c being v sqrt(I') (Theorem 2) and v sqrt(w) under F. The published statement reads
    ``exp(sqrt(I/I') eps)``; its proof (A.5) says "replacing alpha with sqrt(I')/I", which must read
    sqrt(I'/I). I' = w is the plain Gaussian mechanism (delta' = 0). ``inf`` marks eps where
    ``gaussian="classical"`` is not proven (eps sqrt(w/I') >= 1 for every I').
    """
    if spec.has_filter:
        raise ConfigurationError("filter_kernel", "array", "Corollary 3 is for the identity filter; use "
                                 "koga_filter_delta (Corollary 2)")
    s = _check_noise_std(noise_std)
    gaussian = _check_gaussian(gaussian)
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))[:, None]
    w = spec.size
    kept = np.arange(1, w + 1, dtype=np.float64)[None, :]
    fail = koga_identity_failure_probability(w, spec.rate, kept.astype(int))
    deltas = _koga_delta(eps, spec.mu(s, kept), float(spec.mu(s, w)), np.sqrt(w / kept), fail, gaussian)
    return deltas.min(axis=1)


def koga_filter_delta(spec: ReleaseSpec, noise_std: float, epsilon: np.ndarray | float,
                      gaussian: GaussianStep = "analytic", num_alphas: int = 256) -> np.ndarray:
    """Koga et al. Corollary 2 (with Theorem 4): the best delta over alpha in [sqrt(p), 1] at each eps.

    Sensitivity alpha v sqrt(w) under F^c (sigma_max(B) <= alpha; Theorem 4, whose statement and Algorithm 1
    say alpha sqrt(T): the proof in A.3 gives alpha sqrt(I), which we use, I = w) and v sqrt(w) under F.
    ``num_alphas`` grid points (log-spaced) are tried, plus alpha = 1 (the plain Gaussian mechanism).
    """
    if not spec.has_filter:
        raise ConfigurationError("filter_kernel", None, "Corollary 2 needs a filter; use koga_identity_delta")
    s = _check_noise_std(noise_std)
    gaussian = _check_gaussian(gaussian)
    eps = np.atleast_1d(np.asarray(epsilon, dtype=np.float64))[:, None]
    alphas = np.unique(np.concatenate([np.geomspace(math.sqrt(spec.rate), 1.0, num_alphas), [1.0]]))[None, :]
    fail = koga_filter_failure_probability(spec.filter_kernel, spec.rate, alphas)  # type: ignore[arg-type]
    mu_full = float(spec.mu(s, spec.size))
    deltas = _koga_delta(eps, alphas * mu_full, mu_full, 1.0 / alphas, fail, gaussian)
    return deltas.min(axis=1)


def _koga_single_delta(spec: ReleaseSpec, noise_std: float, eps: np.ndarray, gaussian: str) -> np.ndarray:
    if spec.has_filter:
        return koga_filter_delta(spec, noise_std, eps, gaussian)
    return koga_identity_delta(spec, noise_std, eps, gaussian)


def koga_epsilon(spec: ReleaseSpec, noise_std: float, delta: float, gaussian: GaussianStep = "analytic") -> float:
    """The smallest eps (to ~1e-9 relative) at which Koga et al.'s bound certifies (eps, delta)-DP for one
    release, or ``inf`` if none does (possible with ``gaussian="classical"``, which needs eps < 1).

    The bound's delta is not monotone in eps (its e^{eps/alpha} - e^eps term grows), so we scan a grid for
    the first eps whose delta is <= ``delta`` and bisect inside that bracket, keeping the upper end certified.
    """
    delta = _check_delta(delta)
    s = _check_noise_std(noise_std)
    if float(_koga_single_delta(spec, s, np.array([0.0]), gaussian)[0]) <= delta:
        return 0.0
    # eps large enough for the plain Gaussian mechanism (always certified in the analytic variant)
    mu = float(spec.mu(s, spec.size))
    z = math.sqrt(2 * math.log(1 / delta)) + 2.0
    top = max(1.0, mu * mu / 2 + mu * z) if gaussian == "analytic" else 1.0
    while True:
        grid = np.concatenate([[0.0], np.geomspace(1e-6, top, 1000)])
        d = _koga_single_delta(spec, s, grid, gaussian)
        ok = np.nonzero(d <= delta)[0]
        if ok.size or gaussian == "classical" or top > 1e6:
            break
        top *= 4.0
    if ok.size == 0:
        return math.inf
    i = int(ok[0])
    lo, hi = float(grid[i - 1]), float(grid[i])
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if float(_koga_single_delta(spec, s, np.array([mid]), gaussian)[0]) <= delta:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-9 * max(hi, 1e-12):
            break
    return hi


def _compose_koga(single_epsilon, delta: float, releases: int) -> float:
    """Best of basic composition (K eps_1 at delta/K each) and advanced composition (Dwork, Rothblum &
    Vadhan 2010, Thm III.3: eps_1 sqrt(2K ln(1/d0)) + K eps_1 (e^{eps_1} - 1) with per-release delta/(2K)
    and slack d0 = delta/2). Both hold for any (eps_1, delta_1)-DP mechanisms under adaptive composition."""
    if releases == 1:
        return single_epsilon(delta)
    basic = releases * single_epsilon(delta / releases)
    e1 = single_epsilon(delta / (2 * releases))
    advanced = e1 * math.sqrt(2 * releases * math.log(2.0 / delta)) + releases * e1 * math.expm1(e1)
    return min(basic, advanced)


# ------------------------------------------------------------------------------------------------------
# accountant
# ------------------------------------------------------------------------------------------------------
class ReleaseAccountant:
    """(eps, delta) of K releases of privatised forecasts made from the same series.

    Args:
        spec: the release description.
        noise_std: s > 0, the std of the Gaussian noise on each sampled value, in series units.
        bound: ``"exact"`` (identity filter only; tight profile, K releases composed with a connect-the-dots
            PLD) or ``"koga"`` (Koga et al. Corollary 3 / Corollary 2; K releases by basic/advanced
            composition).
        gaussian: Gaussian step inside the Koga bound, ``"analytic"`` (default) or ``"classical"`` (Theorem 1
            as published; only proven for eps < 1).
        discretization, tail_mass_truncation, min_grid_points: PLD settings, see
            :func:`~lightning_dpts.privacy.pld.pld_from_profile`.

    A single release with ``bound="exact"`` is read from the closed form (no discretisation); K > 1 from
    the composed PLD (pessimistic discretisation).
    """

    def __init__(self, spec: ReleaseSpec, noise_std: float, *, bound: Bound = "exact",
                 gaussian: GaussianStep = "analytic", discretization: float = DEFAULT_DISCRETIZATION,
                 tail_mass_truncation: float = DEFAULT_TAIL_MASS,
                 min_grid_points: int = DEFAULT_MIN_GRID_POINTS) -> None:
        if not isinstance(spec, ReleaseSpec):
            raise ConfigurationError("spec", spec, "must be a lightning_dpts.release.ReleaseSpec")
        self.spec = spec
        self.noise_std = _check_noise_std(noise_std)
        self.bound = _check_bound(bound)
        self.gaussian = _check_gaussian(gaussian)
        if self.bound == "exact" and spec.has_filter:
            raise ConfigurationError("bound", "exact", "the exact bound covers the identity filter only; use "
                                     "bound='koga' (Koga et al. Corollary 2) with a filter")
        self.discretization = float(discretization)
        self.tail_mass_truncation = float(tail_mass_truncation)
        self.min_grid_points = int(min_grid_points)
        self._accountant: ProfileAccountant | None = None

    @property
    def theorem(self) -> str:
        if self.bound == "exact":
            return "exact time-domain subsampling profile"
        return "Koga et al. Corollary 2 (Theorem 4)" if self.spec.has_filter else "Koga et al. Corollary 3 (Theorem 2)"

    def profile(self) -> PrivacyProfile:
        """The exact single-release profile (``bound="exact"`` only)."""
        if self.bound != "exact":
            raise ConfigurationError("bound", self.bound, "only the exact bound is a full privacy profile")
        return exact_release_profile(self.spec, self.noise_std)

    def _composition(self) -> ProfileAccountant:
        """The package's one composition path for the exact profile (``bound="exact"`` only): tail truncation
        chosen from delta and the number of releases, grid chosen for the count, FFT round-off bounded."""
        if self._accountant is None:
            self._accountant = ProfileAccountant(self.profile(), discretization=self.discretization,
                                                 tail_mass_truncation=self.tail_mass_truncation,
                                                 min_grid_points=self.min_grid_points,
                                                 scale=("noise_std", self.noise_std))
        return self._accountant

    def _releases(self, releases: int, read: Callable[[ProfileAccountant], _T]) -> _T:
        try:
            return read(self._composition())
        except ConfigurationError as err:
            if err.parameter == "compositions":
                raise ConfigurationError(
                    "releases", releases, f"{releases} releases are more than the exact bound composes in "
                    f"bounded memory (at most {MAX_COMPOSED_POINTS} privacy-loss grid points); use fewer "
                    "releases, or --bound koga (closed form)") from None
            if err.parameter == "noise_std":  # the loss scales with v / s: name the bound as well as the noise
                raise ConfigurationError(
                    "value_bound", self.spec.relation.value_bound, f"is too large against the noise std "
                    f"{self.noise_std:g} for the exact bound to compose {releases} releases (the privacy loss "
                    "exceeds what a bounded privacy-loss grid holds, i.e. epsilon is enormous): add noise (a larger "
                    "--noise-std) or lower --value-bound") from None
            raise

    def composed_pld(self, releases: int) -> PrivacyLossDistribution:
        """PLD of ``releases`` releases (``bound="exact"`` only) at the configured tail truncation."""
        releases = _check_releases(releases)
        return self._releases(releases, lambda acc: acc.composed_pld(releases))

    def _exact_single_epsilon(self, delta: float) -> float:
        return epsilon_for_delta(exact_release_profile(self.spec, self.noise_std), delta, rtol=1e-10)

    def epsilon(self, delta: float, releases: int = 1) -> float:
        """Smallest eps such that ``releases`` releases are (eps, delta)-DP under the chosen bound."""
        delta = _check_delta(delta)
        releases = _check_releases(releases)
        if self.bound == "exact":
            if releases == 1:
                return self._exact_single_epsilon(delta)
            return self._releases(releases, lambda acc: acc.epsilon_after(releases, delta))
        return _compose_koga(lambda d: koga_epsilon(self.spec, self.noise_std, d, self.gaussian), delta, releases)

    def delta(self, epsilon: float, releases: int = 1) -> float:
        """delta(eps) of ``releases`` releases. For ``bound="koga"`` only ``releases=1`` (the bound's delta,
        made non-increasing in eps)."""
        epsilon = _check_epsilon(epsilon)
        releases = _check_releases(releases)
        if self.bound == "exact":
            if releases == 1:
                return float(exact_release_delta(self.spec, self.noise_std, epsilon)[0])
            return self._releases(releases, lambda acc: acc.delta_after(releases, epsilon))
        if releases != 1:
            raise ConfigurationError("releases", releases, "delta(eps) of the Koga bound is only available for a "
                                     "single release; use epsilon(delta, releases) for K > 1")
        grid = np.linspace(0.0, epsilon, 2001)
        return float(min(1.0, np.min(_koga_single_delta(self.spec, self.noise_std, grid, self.gaussian))))


def calibrate_release_noise(spec: ReleaseSpec, epsilon: float, delta: float, releases: int = 1, *,
                            bound: Bound = "exact", gaussian: GaussianStep = "analytic",
                            rel_tol: float = 1e-4, **pld_options: float) -> float:
    """The smallest noise std s (series units, to ``rel_tol``) whose ``releases`` releases are
    (``epsilon``, ``delta``)-DP under ``bound``; the returned s is always certified (eps(s) <= epsilon).

    A bracket of log s, narrowed by :func:`~lightning_dpts.privacy.accountant.narrow_noise_bracket` (secant steps of
    log eps over log s, bisection where they do not shrink it); eps is non-increasing in s for the exact bound, and
    the s returned was evaluated and reaches the target for every bound.
    """
    epsilon = _check_epsilon(epsilon)
    if not 0 < epsilon <= MAX_RELEASE_CALIBRATION_EPSILON:
        raise ConfigurationError("epsilon", epsilon, f"must lie in (0, {MAX_RELEASE_CALIBRATION_EPSILON:g}] to "
                                 "calibrate a finite noise std (a larger epsilon protects nothing)")
    delta = _check_delta(delta)
    releases = _check_releases(releases)
    _check_bound(bound)

    def eps_of(s: float) -> float:
        """epsilon at noise std s; inf where the exact bound cannot compose it (far too little noise)."""
        try:
            return ReleaseAccountant(spec, s, bound=bound, gaussian=gaussian, **pld_options).epsilon(delta, releases)
        except ConfigurationError as err:
            if err.parameter != "value_bound":
                raise
            return math.inf

    base = spec.step_bound * math.sqrt(spec.size)
    hi = base
    eps_hi = eps_of(hi)
    while eps_hi > epsilon:
        hi *= 2.0
        if hi > base * 1e8:
            raise ConfigurationError("epsilon", epsilon, f"no noise std up to {hi:g} reaches it under bound={bound!r}"
                                     + (" (the classical Gaussian step needs eps < 1)" if gaussian == "classical"
                                        else ""))
        eps_hi = eps_of(hi)
    lo = hi / 2.0
    eps_lo = math.inf  # not evaluated below the floor (treated as not reaching the target)
    while lo > base * 1e-8:
        eps_lo = eps_of(lo)
        if eps_lo > epsilon:
            break
        hi, eps_hi, lo, eps_lo = lo, eps_lo, lo / 2.0, math.inf
    return narrow_noise_bracket(eps_of, epsilon, lo, eps_lo, hi, eps_hi, rel_tol)

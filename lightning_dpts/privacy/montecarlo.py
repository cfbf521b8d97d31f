"""Monte Carlo accounting of b-banded BandMF with b-min-sep sampling (Dong & Ganesh 2026, Section 5, Appendix A).

The mechanism (Section 2.4): after the reduction of Lemma 4.5 of Choquette-Choo et al. (2023), releasing the noisy
gradients of DP-MF with a lower-triangular, non-negative, b-banded Toeplitz strategy matrix C is as private as the
one-dimensional matrix mechanism ``y = C x + z``, ``z ~ N(0, sigma^2 I_n)``, where under P the vector x is 1 at the
iterations in which the protected example takes part (b-min-sep sampling, Algorithms 1 and 2) and under Q it is 0.
The (epsilon, delta) guarantee is ``delta(eps) = max(H_{e^eps}(P||Q), H_{e^eps}(Q||P))``.

What this module computes:

* :func:`log_likelihood_ratio`: ``ln P(y)/Q(y)`` for a batch of outputs with the dynamic program of Theorem 5.1
  (and its warm-start corollary), O(n b) per sample and vectorised over samples; in linear space with
  per-sample rescaling and an exact log-space fallback for extreme losses.
* :class:`BandMFMechanism`: sampling y from P or from Q (O(n b) per sample) and the privacy-loss samples of both
  directions.
* Estimate-Verify-Release (Appendix A, Algorithm 5, Theorem A.1) with the KL-Chernoff tail bound of
  Chua et al. (2025, Fact 4.2): :func:`verification_failure_probability`, :func:`overall_delta`,
  :func:`verification_threshold`, :func:`samples_for_target_delta`.
* :class:`MonteCarloAccountant`: estimates and EVR-verified upper bounds of delta(eps), epsilon read-outs and a
  report, with the interface the training callback uses (``is_monte_carlo = True``).
* :func:`calibrate_noise_multiplier_monte_carlo`: Algorithm 5 over a geometric grid of noise multipliers whose top
  element is a mechanism with an analytic guarantee (the unamplified Gaussian mechanism of b-min-sep BandMF).

Structured extension (docs/bandmf.md, Theorem B.1 there): ``leak_probability`` r < 1 makes each participation move
the output only with probability r (independently), and ``sensitivity`` s scales the shift; the recursion replaces the
per-participation likelihood ratio ``exp(L_i)`` by ``(1 - r) + r exp(L_i)``. The recursion is exact for that pair
(P, Q) for every b. **Scope:** (P, Q) is a dominating pair for add/remove of the unit whose contribution is the
shift; under the forecasting paper's *substitution* relations the per-step worst case may switch direction
between steps (docs/privacy.md, rule 1), and max(H(P||Q), H(Q||P)) is then *not* proven to bound the mechanism (at
b = 1 it is below the switching-profile bound the package's accountant composes). :class:`MonteCarloAccountant`
therefore refuses ``leak_probability < 1`` unless ``fixed_direction=True`` is given explicitly (analysis and
research use); nothing in the package turns such a number into a training guarantee.

Units: sigma is the noise multiplier (noise std over the per-participation L2 sensitivity of the summed clipped
gradient, i.e. over the clipping norm), coefficients are the non-zero entries of C's first column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import ndimage
from scipy.special import log_ndtr

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "BandMFMechanism",
    "CalibrationResult",
    "MonteCarloAccountant",
    "banded_sqrt_coefficients",
    "calibrate_noise_multiplier_monte_carlo",
    "gaussian_mechanism_delta",
    "hockey_stick_estimate",
    "kl_bernoulli",
    "log_likelihood_ratio",
    "overall_delta",
    "samples_for_target_delta",
    "verification_failure_probability",
    "verification_threshold",
]

#: Number of float64 values per chunk when sampling (16 MB per array: cache-friendly, measured fastest).
_CHUNK_VALUES = 2_000_000


# ---------------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------------
def _int_at_least(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ConfigurationError(name, value, f"must be an integer >= {minimum}")
    return int(value)


def _probability(name: str, value: object, *, allow_zero: bool = False) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(name, value, "must be a number in (0, 1]") from None
    low_ok = v >= 0 if allow_zero else v > 0
    if not (low_ok and v <= 1 and math.isfinite(v)):
        raise ConfigurationError(name, value, "must lie in [0, 1]" if allow_zero else "must lie in (0, 1]")
    return v


def _positive(name: str, value: object) -> float:
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(name, value, "must be a finite number > 0") from None
    if not (v > 0 and math.isfinite(v)):
        raise ConfigurationError(name, value, "must be a finite number > 0")
    return v


def check_coefficients(coefficients: Sequence[float] | np.ndarray, bands: int | None = None) -> np.ndarray:
    """Validate the non-zero entries (c_0, ..., c_{b-1}) of the first column of a b-banded Toeplitz C.

    Requirements of Theorem 5.1 / Lemma 4.5 of [10]: non-negative entries, c_0 > 0 (C invertible), finite; the length
    is the number of bands b (and must equal ``bands`` when given).
    """
    try:
        c = np.asarray(coefficients, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ConfigurationError("coefficients", coefficients, "must be a sequence of numbers") from None
    if c.size == 0 or not np.all(np.isfinite(c)) or np.any(c < 0) or c[0] <= 0:
        raise ConfigurationError("coefficients", list(np.atleast_1d(coefficients)),
                                 "must be finite, non-negative, with c_0 > 0 (first column of a lower-triangular "
                                 "non-negative banded Toeplitz C)")
    if bands is not None and c.size != bands:
        raise ConfigurationError("coefficients", list(c), f"must have exactly bands={bands} entries")
    return c


def banded_sqrt_coefficients(bands: int) -> np.ndarray:
    """Default strategy: first ``bands`` entries of A^{1/2}'s first column, binom(2k, k)/4^k, scaled to unit L2 norm.

    A (all-ones lower-triangular) is the Toeplitz matrix of 1/(1 - x); its square root has generating function
    (1 - x)^{-1/2} = sum_k binom(2k, k) 4^{-k} x^k. Banding keeps k < b (banded square root factorisation); the
    column normalisation makes a participation's sensitivity ||c||_2 = 1. b = 1 gives C = I (DP-SGD).
    """
    if isinstance(bands, bool) or not isinstance(bands, (int, np.integer)) or bands < 1:
        raise ConfigurationError("bands", bands, "must be an integer >= 1")
    c = np.ones(int(bands))
    for k in range(1, int(bands)):
        c[k] = c[k - 1] * (2 * k - 1) / (2 * k)
    return c / np.linalg.norm(c)


# ---------------------------------------------------------------------------------------------------------------
# Theorem 5.1: the dynamic program
# ---------------------------------------------------------------------------------------------------------------
def _column_terms(yt: np.ndarray, c: np.ndarray, sigma: float, shift: float) -> np.ndarray:
    """L_i = ln N(s c_i, sigma^2 I)/N(0, sigma^2 I)(y_i..y_{i+b-1}) for every i, shape (n, m) from y^T (n, m).

    c_i is C's i-th column restricted to rows i..i+b-1, zero-padded past row n (Theorem 5.1). The sliding dot
    products are one ``scipy.ndimage.correlate1d`` pass along time (zero padding past n).
    """
    n = yt.shape[0]
    b = c.size
    dot = np.empty_like(yt)
    if b == 1:
        np.multiply(yt, c[0], out=dot)
    else:
        # correlate1d centres the filter at index b // 2; origin -(b // 2) aligns it at index 0 (forward window)
        ndimage.correlate1d(yt, c, axis=0, output=dot, mode="constant", cval=0.0, origin=-(b // 2))
    norm2 = np.zeros(n)
    for j in range(min(b, n)):
        norm2[: n - j] += c[j] ** 2
    dot *= shift / sigma**2
    dot -= (0.5 * shift**2 / sigma**2) * norm2[:, None]
    return dot


def log_likelihood_ratio(
    y: np.ndarray,
    coefficients: Sequence[float] | np.ndarray,
    sampling_prob: float,
    noise_multiplier: float,
    *,
    warm_start: bool = True,
    leak_probability: float = 1.0,
    sensitivity: float = 1.0,
) -> np.ndarray:
    """``ln P(y)/Q(y)`` for each row of ``y`` (shape (m, n)) by the recursion of Theorem 5.1.

    ``f_i = (1 - p) f_{i+1} + p g_i f_{i+b}``, ``f_i = 1`` for i > n, with ``g_i = exp(L_i)`` (Eq. 1) or, in the
    structured extension, ``g_i = (1 - r) + r exp(L_i)`` (docs/bandmf.md, Theorem B.1). Algorithm 1 (cold start)
    gives ``P/Q = f_1``; Algorithm 2 (warm start, the corollary after Theorem 5.1) gives
    ``(f_1 + p sum_{i=2}^{b} f_i) / (1 + (b - 1) p)``. O(n b) per row; see :func:`_linear_recursion`.

    Args:
        y: outputs, shape (m, n) or (n,).
        coefficients: (c_0, ..., c_{b-1}), the non-zero entries of C's first column (b = number of bands).
        sampling_prob: p, the Poisson rate applied to available examples (Algorithm 1 line 3), in (0, 1].
        noise_multiplier: sigma > 0.
        warm_start: Algorithm 2 (default) instead of Algorithm 1.
        leak_probability: r in (0, 1]; 1 is the paper's mechanism.
        sensitivity: s > 0, the shift of a (leaking) participation in units of the clipping norm.
    """
    mech = BandMFMechanism(int(np.shape(y)[-1]), tuple(check_coefficients(coefficients)), sampling_prob,
                           noise_multiplier, warm_start, leak_probability, sensitivity)
    y2 = np.atleast_2d(np.asarray(y, dtype=np.float64))
    out = _log_likelihood_ratio_time_major(np.ascontiguousarray(y2.T), mech)
    return out if np.ndim(y) == 2 else out[0]


def _log_likelihood_ratio_time_major(yt: np.ndarray, mech: BandMFMechanism) -> np.ndarray:
    """Core of :func:`log_likelihood_ratio` on y^T (n, m), parameters already validated.

    The recursion runs in linear space with a per-sample scale (renormalised every max(8, b) steps), which is exact up
    to floating-point rounding like the log-space form; samples whose values leave [1e-280, 1e280] between
    renormalisations (extreme privacy losses) are recomputed in log space (:func:`_log_space_recursion`).
    """
    c = np.asarray(mech.coefficients)
    log_g = _column_terms(yt, c, mech.noise_multiplier, mech.sensitivity)
    r = mech.leak_probability
    if r < 1.0:
        log_g = np.logaddexp(math.log1p(-r), math.log(r) + log_g)
    out, bad = _linear_recursion(log_g, mech.sampling_prob, c.size, mech.warm_start)
    if bad.any():
        out[bad] = _log_space_recursion(np.ascontiguousarray(log_g[:, bad]), mech.sampling_prob, c.size,
                                        mech.warm_start)
    return out


def _linear_recursion(log_g: np.ndarray, p: float, b: int, warm_start: bool) -> tuple[np.ndarray, np.ndarray]:
    """f_i = (1 - p) f_{i+1} + p g_i f_{i+b} with per-sample rescaling; returns (ln P/Q, samples to redo)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is detected below and redone in log space
        return _linear_recursion_unchecked(log_g, p, b, warm_start)


def _linear_recursion_unchecked(log_g: np.ndarray, p: float, b: int, warm_start: bool
                                ) -> tuple[np.ndarray, np.ndarray]:
    n, m = log_g.shape
    g = np.exp(log_g)
    g *= p
    q = 1.0 - p
    f = np.empty((n + b, m))
    f[n:] = 1.0
    log_scale = np.zeros(m)
    bad = np.zeros(m, dtype=bool)
    every = max(8, b)
    tmp = np.empty(m)
    for i in range(n - 1, -1, -1):
        np.multiply(g[i], f[i + b], out=tmp)
        np.multiply(f[i + 1], q, out=f[i])
        f[i] += tmp
        if i % every == 0 and i >= b:
            scale = f[i].copy()
            bad |= ~((scale > 1e-280) & (scale < 1e280))
            scale[bad] = 1.0
            f[i:i + b] /= scale
            log_scale += np.log(scale)
    if not warm_start or b == 1:
        total = f[0].copy()
    else:
        total = f[0] + p * f[1:b].sum(axis=0)
        total /= 1.0 + (b - 1) * p
    bad |= ~((total > 1e-280) & (total < 1e280))
    with np.errstate(divide="ignore"):
        return np.log(total) + log_scale, bad


def _log_space_recursion(log_g: np.ndarray, p: float, b: int, warm_start: bool) -> np.ndarray:
    """The same recursion in log space (``logaddexp``): slower, never overflows."""
    n, m = log_g.shape
    log_p = math.log(p)
    log_q = math.log1p(-p) if p < 1 else -np.inf
    log_f = np.zeros((n + b, m))  # boundary f_i = 1 (log 0) for i = n .. n+b-1
    for i in range(n - 1, -1, -1):
        np.logaddexp(log_q + log_f[i + 1], log_p + log_g[i] + log_f[i + b], out=log_f[i])
    if not warm_start or b == 1:
        return log_f[0].copy()
    terms = [log_f[0]] + [log_p + log_f[k] for k in range(1, b)]
    return np.logaddexp.reduce(np.stack(terms), axis=0) - math.log1p((b - 1) * p)


def hockey_stick_estimate(privacy_losses: np.ndarray, epsilon: float) -> float:
    """Monte Carlo estimate of H_{e^eps}(P||Q) = E_{y~P}[max(0, 1 - e^{eps - L(y)})], L = ln P/Q on y ~ P.

    Each term lies in [0, 1], which the tail bound of :func:`verification_failure_probability` needs.
    """
    losses = np.asarray(privacy_losses, dtype=np.float64)
    if losses.size == 0:
        raise ConfigurationError("privacy_losses", losses.size, "must hold at least one sample")
    terms = -np.expm1(np.minimum(float(epsilon) - losses, 0.0))
    return float(np.mean(terms))


# ---------------------------------------------------------------------------------------------------------------
# the mechanism: sampling from P and Q
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BandMFMechanism:
    """The one-dimensional worst case ``y = C x + z`` of b-banded BandMF with b-min-sep sampling (Section 5).

    Attributes:
        iterations: n, the number of optimizer steps of the whole run.
        coefficients: (c_0, ..., c_{b-1}), non-negative, c_0 > 0; b = len(coefficients) is the number of bands and
            the minimum separation of the sampler.
        sampling_prob: p in (0, 1], the rate applied to *available* examples (for a target expected batch fraction
            p0 use :func:`lightning_dpts.data.bminsep.sampling_prob_for_rate`: p = p0 / (1 - p0 (b - 1))).
        noise_multiplier: sigma > 0.
        warm_start: Algorithm 2 (default) or Algorithm 1.
        leak_probability: r; 1 is the paper's mechanism (see the module docstring for r < 1).
        sensitivity: s, the shift of a participation in units of the clipping norm (1 for add/remove).
    """

    iterations: int
    coefficients: tuple[float, ...]
    sampling_prob: float
    noise_multiplier: float
    warm_start: bool = True
    leak_probability: float = 1.0
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        _int_at_least("iterations", self.iterations, 1)
        c = check_coefficients(self.coefficients)
        object.__setattr__(self, "coefficients", tuple(float(v) for v in c))
        _probability("sampling_prob", self.sampling_prob)
        _positive("noise_multiplier", self.noise_multiplier)
        _probability("leak_probability", self.leak_probability)
        _positive("sensitivity", self.sensitivity)

    @property
    def bands(self) -> int:
        """b, the number of bands (= minimum separation of the sampler)."""
        return len(self.coefficients)

    def with_noise_multiplier(self, sigma: float) -> BandMFMechanism:
        """The same mechanism at another noise multiplier."""
        return BandMFMechanism(self.iterations, self.coefficients, self.sampling_prob, sigma, self.warm_start,
                               self.leak_probability, self.sensitivity)

    def sample_participation(self, rng: np.random.Generator, num_samples: int) -> np.ndarray:
        """``num_samples`` leak patterns x in {0, 1}^n of the protected example (bool array (m, n)).

        The availability Markov chain of Figure 1: countdown 0 = available (takes part with probability p), after a
        participation the countdown is b - 1 and falls by one per step. Warm start draws the countdown from the
        stationary law (Algorithm 2 line 2). With r < 1 each participation leaks independently with probability r.
        """
        return self._participation_time_major(rng, int(num_samples)).T

    def _participation_start(self, rng: np.random.Generator, m: int) -> np.ndarray:
        """First step at which each example is available: 0, or the warm-start countdown (Algorithm 2 line 2)."""
        b, p = self.bands, self.sampling_prob
        start = np.zeros(m, dtype=np.int64)
        if self.warm_start and b > 1:
            busy = rng.random(m) >= 1.0 / (1.0 + (b - 1) * p)
            start[busy] = rng.integers(1, b, size=int(busy.sum()))
        return start

    def _participation_events(self, rng: np.random.Generator, m: int) -> tuple[np.ndarray, np.ndarray]:
        """(steps, sample indices) of every (leaking) participation, drawn by geometric waiting times.

        An available example takes part at each step with probability p, so the number of available steps it skips
        is Geometric(p) - 1; after taking part at t it is next available at t + b. This is the chain of Figure 1.
        """
        n, b, p = self.iterations, self.bands, self.sampling_prob
        position = self._participation_start(rng, m) + rng.geometric(p, size=m) - 1
        owner = np.arange(m)
        steps, owners = [], []
        while position.size:
            keep = position < n
            position, owner = position[keep], owner[keep]
            if not position.size:
                break
            if self.leak_probability < 1.0:
                leak = rng.random(position.size) < self.leak_probability
                steps.append(position[leak])
                owners.append(owner[leak])
            else:
                steps.append(position)
                owners.append(owner)
            position = position + b + rng.geometric(p, size=position.size) - 1
        if not steps:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(steps), np.concatenate(owners)

    def _participation_time_major(self, rng: np.random.Generator, m: int) -> np.ndarray:
        x = np.zeros((self.iterations, m), dtype=bool)
        steps, owners = self._participation_events(rng, m)
        x[steps, owners] = True
        return x

    def _outputs_time_major(self, rng: np.random.Generator, m: int, distribution: str) -> np.ndarray:
        n = self.iterations
        yt = np.empty((n, m))
        rng.standard_normal(out=yt)
        yt *= self.noise_multiplier
        if distribution == "P":
            steps, owners = self._participation_events(rng, m)
            for j, cj in enumerate(self.coefficients):
                rows = steps + j
                inside = rows < n
                # participations of one sample are >= b apart, so (row, owner) pairs are distinct within a j
                yt[rows[inside], owners[inside]] += self.sensitivity * cj
        return yt

    def sample_outputs(self, rng: np.random.Generator, num_samples: int, distribution: str) -> np.ndarray:
        """``num_samples`` outputs y (float64 (m, n)) from ``"P"`` (y = s C x + z) or ``"Q"`` (y = z)."""
        if distribution not in ("P", "Q"):
            raise ConfigurationError("distribution", distribution, "must be 'P' or 'Q'")
        return self._outputs_time_major(rng, int(num_samples), distribution).T

    def log_likelihood_ratio(self, y: np.ndarray) -> np.ndarray:
        """``ln P(y)/Q(y)`` (Theorem 5.1), see :func:`log_likelihood_ratio`."""
        return log_likelihood_ratio(y, self.coefficients, self.sampling_prob, self.noise_multiplier,
                                    warm_start=self.warm_start, leak_probability=self.leak_probability,
                                    sensitivity=self.sensitivity)

    def privacy_loss_samples(self, rng: np.random.Generator, num_samples: int, direction: str) -> np.ndarray:
        """Privacy-loss samples of one direction, chunked to bound memory.

        ``"remove"``: ln P/Q on y ~ P (estimates H(P||Q)); ``"add"``: ln Q/P on y ~ Q (estimates H(Q||P)).
        """
        if direction not in ("remove", "add"):
            raise ConfigurationError("direction", direction, "must be 'remove' or 'add'")
        total = _int_at_least("num_samples", num_samples, 1)
        distribution = "P" if direction == "remove" else "Q"
        blocked = self.sampling_prob < 1.0
        if blocked:  # three (T + b) x m buffers, T = max(32, 2b): at most ~3 x 16 MB for large b
            chunk = max(64, min(_CHUNK_SAMPLES, _CHUNK_VALUES // (max(32, 2 * self.bands) + self.bands)))
        else:
            chunk = max(1, _CHUNK_VALUES // (self.iterations + self.bands))
        out = np.empty(total)
        workspace = np.empty(_workspace_values(self, chunk)) if blocked else None  # reused by every chunk
        done = 0
        while done < total:
            k = min(chunk, total - done)
            if blocked:
                llr = _blocked_log_likelihood_ratio(self, k, self._sampling_fill(rng, k, distribution), workspace)
            else:  # p = 1: the reference path (the blocked form needs q = 1 - p > 0)
                llr = _log_likelihood_ratio_time_major(self._outputs_time_major(rng, k, distribution), self)
            out[done:done + k] = llr if direction == "remove" else -llr
            done += k
        return out

    def _sampling_fill(self, rng: np.random.Generator, m: int, distribution: str
                       ) -> Callable[[np.ndarray, int, int], None]:
        """Row generator of y/sigma for :func:`_blocked_log_likelihood_ratio`: i.i.d. N(0, 1) rows, plus under P the
        shift (s/sigma) C x of the participations (drawn once for the m samples, Figure 1's chain, before any noise).

        The rows of one call are fresh standard normals from ``rng``; generating them in blocks backwards in time
        does not change their joint law (all n x m values are i.i.d.), and x is independent of them, as in P.
        The participations are sorted by step once (a linear-time radix sort of 16-bit keys when n < 2^15), so a
        block's shifts are found by one binary search and placed by one scatter.
        """
        b = self.bands
        shift = (self.sensitivity / self.noise_multiplier) * np.asarray(self.coefficients)
        if distribution == "P":
            steps, owners = self._participation_events(rng, m)
            keys = steps.astype(np.int16) if self.iterations <= np.iinfo(np.int16).max else steps
            order = np.argsort(keys, kind="stable")  # numpy sorts <= 16-bit integers by radix sort
            steps, owners = steps[order], owners[order]
        else:
            steps = owners = np.zeros(0, dtype=np.int64)
        offsets = np.arange(b)

        def fill(out: np.ndarray, t0: int, t1: int) -> None:
            rng.standard_normal(out=out)
            if steps.size:
                # participations at k in [t0 - b + 1, t1) reach rows k .. k + b - 1 of the block [t0, t1)
                first, last = np.searchsorted(steps, (t0 - b + 1, t1))
                if first < last:
                    rows = steps[first:last, None] + offsets
                    inside = (rows >= t0) & (rows < t1)
                    flat = out.reshape(-1)  # a view: the block rows are contiguous
                    # participations of one sample are >= b apart, so the (row, owner) pairs are distinct
                    index = ((rows - t0) * m + owners[first:last, None])[inside]
                    flat[index] += np.broadcast_to(shift, rows.shape)[inside]

        return fill

    def max_participations(self) -> int:
        """The most participations b-min-sep allows in n steps: ceil(n / b) (also with warm start)."""
        return -(-self.iterations // self.bands)

    def unamplified_sensitivity(self) -> float:
        """L2 sensitivity of C x over all b-min-sep patterns: s ||c||_2 sqrt(ceil(n/b)).

        Participations are >= b apart, so their columns of the b-banded C have disjoint supports; a column's norm is
        at most ||c||_2 (truncated at the end). Leaks can only remove participations, so r does not enter.
        """
        return self.sensitivity * float(np.linalg.norm(self.coefficients)) * math.sqrt(self.max_participations())


# ---------------------------------------------------------------------------------------------------------------
# the sampling pipeline: time-blocked generation and recursion (the fast path of privacy_loss_samples)
# ---------------------------------------------------------------------------------------------------------------
#: Samples processed side by side (the vector width of every step of the recursion: 64 KB rows of float64).
_CHUNK_SAMPLES = 8192
#: Rescaling bound: between two rescalings a column grows by at most exp(_GROWTH_LIMIT) (float64 overflows past 709).
_GROWTH_LIMIT = 600.0
#: Rows per sub-block of the exponent product (one small dense product per sub-block, batched).
_SUB_BLOCK = 8
#: Longest rescaling period (steps); shorter when the exponents are typically large (small sigma), see below.
_MAX_RESCALE_PERIOD = 32
#: log2(e): the blocked pipeline keeps exponents in bits and evaluates 2^x (numpy's exp2 is ~15% cheaper than exp).
_LOG2_E = 1.0 / math.log(2.0)


def _rescale_period(mech: BandMFMechanism) -> int:
    """K, the number of steps between two rescalings of h in :func:`_blocked_log_likelihood_ratio`.

    Correctness holds for every K >= 1 (a column whose per-step exponent could exceed 600/K - ln 2 in a block runs
    that block in log space); K only trades the cost of rescaling (b rows divided every K steps) against how often
    columns need the slow log-space pass. K = max(8, b, min(32, 600 / (ln 2 + B))), where B bounds the exponent
    ln g' = L_i + ln(p q^-b) of all but a vanishing fraction of steps: L_i = <a, y_window> - |a|^2/2 with
    a = (s/sigma) c_i, whose mean is at most 2|a|^2 (a window overlaps the shifts of at most two participations) and
    whose standard deviation is |a|; B = 2|a|^2 + 8|a| + ln(p q^-b), an 8-standard-deviation bound. For the usual
    sigma (>= ~0.5 per unit column norm) K = 32; for small sigma K falls back to max(8, b).
    """
    b, p = mech.bands, mech.sampling_prob
    a = (mech.sensitivity / mech.noise_multiplier) * float(np.linalg.norm(mech.coefficients))
    typical = 2.0 * a * a + 8.0 * a + math.log(p) - b * math.log1p(-p)
    period = int(_GROWTH_LIMIT / (math.log(2.0) + max(typical, 1.0)))
    return max(8, b, min(_MAX_RESCALE_PERIOD, period))


def _block_rows(bands: int) -> int:
    """T, the rows per block of :func:`_blocked_log_likelihood_ratio`: >= max(32, 2b), a multiple of 8."""
    return _SUB_BLOCK * -(-max(32, 2 * bands) // _SUB_BLOCK)


def _workspace_values(mech: BandMFMechanism, m: int) -> int:
    """float64 values of the buffers of :func:`_blocked_log_likelihood_ratio` for m samples: (3T + 2b - 1) m."""
    return (3 * _block_rows(mech.bands) + 2 * mech.bands - 1) * m


def _blocked_log_likelihood_ratio(mech: BandMFMechanism, m: int, fill: Callable[[np.ndarray, int, int], None],
                                  workspace: np.ndarray | None = None) -> np.ndarray:
    """``ln P/Q`` of m outputs whose standardised rows are produced block by block, backwards in time.

    ``fill(out, t0, t1)`` writes rows t0..t1-1 of y/sigma (shape (t1 - t0, m)) into ``out``. The recursion of
    Theorem 5.1 runs backwards, and row i of it needs only y_{i..i+b-1}; so the outputs are generated in blocks of
    T rows from the end (the b - 1 rows after a block are kept from the previous one), and nothing of size n x m is
    ever stored. Same algebra as :func:`log_likelihood_ratio` (which is the reference implementation), rearranged:

    * with q = 1 - p and f_i = q^{n-i} h_i the recursion becomes ``h_i = h_{i+1} + g'_i h_{i+b}`` with
      ``g'_i = p q^{-b} g_i`` and boundary ``h_{n+k} = q^k`` (k = 0..b-1): two vector operations per step;
    * ``ln g'_i`` (Eq. 1: the Gaussian log-ratio of the column, plus ln(p q^{-b})) is the banded block of C (scaled
      by s/sigma) times the block of y/sigma, plus a row constant; it is kept in bits (times log2 e, folded into the
      band and the constant) and g' evaluated as 2^x (``exp2``: the same value up to rounding, and cheaper). The
      block is cut into sub-blocks of 8 rows, each an 8 x (8 + b - 1) dense product with its (overlapping) window of
      y/sigma, all in one batched ``matmul`` (2 (8 + b - 1) flops per value instead of 2 (T + b - 1) for one dense
      T x (T + b - 1) product);
    * h is non-decreasing backwards (h_i >= h_{i+1} >= 1), so it can only overflow: each column is divided by its
      current value every K steps (:func:`_rescale_period`; scale kept in log); a block in which a column could grow
      by more than e^600 between two rescalings (some ln g'_i >= 600/K - ln 2) runs for that column in log space
      (logaddexp), so no value ever overflows and nothing is approximated.
    Requires p < 1 (q > 0); p = 1 is handled by the reference path.
    """
    n, b = mech.iterations, mech.bands
    c = np.asarray(mech.coefficients)
    p, sigma, s, r = mech.sampling_prob, mech.noise_multiplier, mech.sensitivity, mech.leak_probability
    log_q = math.log1p(-p)
    log_lead = math.log(p) - b * log_q  # ln(p q^{-b})
    # per-row constant of the exponent: -s^2 ||c_i||^2 / (2 sigma^2) + ln(p q^{-b}) (+ ln r for leaks)
    norm2 = np.zeros(n)
    for j in range(min(b, n)):
        norm2[: n - j] += c[j] ** 2
    const = -0.5 * (s / sigma) ** 2 * norm2 + log_lead + (math.log(r) if r < 1.0 else 0.0)
    const *= _LOG2_E  # exponents in bits: g' = 2^(exponent), exp2 being cheaper than exp
    full_rows = n - b + 1  # rows i < n - b + 1 have the whole column (||c_i|| = ||c||): a scalar constant
    base = (1.0 - r) * math.exp(log_lead) if r < 1.0 else 0.0  # g' = base + 2^(exponent in bits)
    log_base = math.log1p(-r) + log_lead if r < 1.0 else -math.inf
    every = _rescale_period(mech)
    # per-step bound on log2 g' that keeps K steps below e^600: (600/K - ln 2) nats
    limit = (_GROWTH_LIMIT / every - math.log(2.0)) * _LOG2_E
    sub = _SUB_BLOCK
    big_t = _block_rows(b)
    band = np.zeros((big_t, big_t + b - 1))
    for j in range(b):
        band[np.arange(big_t), np.arange(big_t) + j] = (s / sigma) * _LOG2_E * c[j]
    band_sub = np.ascontiguousarray(band[:sub, : sub + b - 1])
    # buffers (carved from ``workspace`` when given: reusing memory across calls avoids page faults, ~5% at n = 500)
    size = _workspace_values(mech, m)
    if workspace is None or workspace.size < size:
        workspace = np.empty(size)
    z, h, g = np.split(workspace[:size], np.cumsum([(big_t + b - 1) * m, (big_t + b) * m]))
    z = z.reshape(big_t + b - 1, m)  # y/sigma: block rows at [big_t - rows, big_t), then the b - 1 later rows
    z[big_t:] = 0.0  # zero padding past n (the first block in time order is the last one, t1 = n)
    # sub-block k's window: rows k*sub .. k*sub + sub + b - 2 of z (overlapping views, read only)
    windows = np.lib.stride_tricks.as_strided(z, shape=(big_t // sub, sub + b - 1, m),
                                              strides=(sub * z.strides[0], z.strides[0], z.strides[1]),
                                              writeable=False)
    h = h.reshape(big_t + b, m)  # h: block rows, then h_{t1 .. t1+b-1}
    h[big_t:] = np.exp(log_q * np.arange(b))[:, None]
    g = g.reshape(big_t, m)
    g_sub = g.reshape(big_t // sub, sub, m)
    log_scale = np.zeros(m)
    t1 = n
    while t1 > 0:
        rows = min(big_t, t1)
        t0 = t1 - rows
        lo = big_t - rows
        fill(z[lo:big_t], t0, t1)
        gb = g[lo:]
        if rows == big_t:
            np.matmul(band_sub, windows, out=g_sub)
        else:  # the first block in time (only one per call): one dense product
            np.matmul(band[:rows, : rows + b - 1], z[lo:], out=gb)
        if t1 <= full_rows:
            gb += const[0]
        else:
            gb += const[t0:t1, None]
        peak = gb.max(axis=0)
        if r < 1.0:
            peak = np.maximum(peak, log_base * _LOG2_E) + 1.0  # g' <= 2 max(base, 2^exponent)
        hard = np.flatnonzero(peak >= limit)
        hb = h[lo:]
        redo = _log_space_block(hb, gb, hard, rows, b, log_base) if hard.size else None
        with np.errstate(over="ignore", invalid="ignore"):  # only in the columns `hard`, replaced below
            np.exp2(gb, out=gb)
            if base:
                gb += base
            for k in range(rows - 1, -1, -1):
                row = hb[k]
                np.multiply(gb[k], hb[k + b], out=row)
                row += hb[k + 1]
                if (t0 + k) % every == 0:  # at most K steps since the last rescaling (or the boundary, h <= 1)
                    scale = row.copy()
                    scale[hard] = 1.0
                    hb[k:k + b] /= scale
                    log_scale += np.log(scale)
        if redo is not None:
            hb[:, hard] = redo[0]
            log_scale[hard] += redo[1]
        if t0 > 0:  # carry the first b rows of h and the first b - 1 rows of z to the tail
            h[big_t:] = hb[:b]
            if b > 1:
                z[big_t:] = z[lo:lo + b - 1]
        t1 = t0
    hb = h[lo:]
    if not mech.warm_start or b == 1:
        total = hb[0].copy()
    else:
        weights = p * np.exp(-log_q * np.arange(1, b))
        total = hb[0] + weights @ hb[1:b]
        log_scale -= math.log1p((b - 1) * p)
    return np.log(total) + log_scale + n * log_q


def _log_space_block(hb: np.ndarray, log2_gb: np.ndarray, cols: np.ndarray, rows: int, b: int,
                     log_base: float) -> tuple[np.ndarray, np.ndarray]:
    """One block of the h recursion in log space (``logaddexp``) for the columns ``cols`` whose ln g' is extreme.

    Reads the b tail rows ``hb[rows:]`` of those columns (h after the block, divided by the current scale) and the
    block's exponents (``log2_gb``, in bits; ``log_base`` in nats); returns (the rows of the block and its tail
    divided by the new block-start value, ln of that value), which the caller writes back after the linear pass (in
    which these columns are ignored).
    """
    lh = np.empty((rows + b, cols.size))
    with np.errstate(divide="ignore"):  # h can be 0 after an earlier log-space block (underflow of a ratio < e^-745)
        lh[rows:] = np.log(hb[rows:, cols])
    lg = log2_gb[:, cols] * math.log(2.0)
    if math.isfinite(log_base):
        lg = np.logaddexp(log_base, lg)
    for k in range(rows - 1, -1, -1):
        np.logaddexp(lh[k + 1], lg[k] + lh[k + b], out=lh[k])
    ref = lh[0].copy()
    return np.exp(lh - ref), ref


def gaussian_mechanism_delta(sensitivity_over_sigma: float, epsilon: float) -> float:
    """Exact delta(eps) of the Gaussian mechanism with sensitivity/noise ratio mu (Balle & Wang 2018, Theorem 8).

    ``delta = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)``, evaluated in log space.
    """
    mu = float(sensitivity_over_sigma)
    if mu <= 0:
        return 0.0
    a = log_ndtr(mu / 2 - epsilon / mu)
    b = epsilon + log_ndtr(-mu / 2 - epsilon / mu)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


# ---------------------------------------------------------------------------------------------------------------
# Estimate-Verify-Release (Appendix A)
# ---------------------------------------------------------------------------------------------------------------
def kl_bernoulli(a: float, b: float) -> float:
    """KL(Bernoulli(a) || Bernoulli(b)) in nats, for a, b in [0, 1] (log1p form for small values)."""
    if a == b:
        return 0.0
    if b <= 0.0 or b >= 1.0:
        return math.inf
    first = 0.0 if a == 0 else a * math.log(a / b)
    second = 0.0 if a == 1 else (1 - a) * (math.log1p(-a) - math.log1p(-b))
    return first + second


def verification_failure_probability(num_samples: int, threshold: float, delta: float) -> float:
    """q(delta, delta', s): probability that the mean of s i.i.d. [0, 1] terms is <= delta' when their mean is >= delta.

    Chernoff-Hoeffding for bounded variables (Hoeffding 1963, Theorem 1; Fact 4.2 of Chua et al. 2025):
    ``q <= exp(-s KL(delta' || delta))`` for delta' < delta. This is the verifier's false-acceptance probability in
    Theorem A.1 (the bound is monotone in the true mean, so it holds for every violating mechanism).
    """
    s = _int_at_least("num_samples", num_samples, 1)
    if not 0 <= threshold < delta <= 1:
        raise ConfigurationError("threshold", threshold, f"must satisfy 0 <= threshold < delta={delta} <= 1")
    return math.exp(-s * kl_bernoulli(threshold, delta))


def _kl_vec(a: float, b: np.ndarray) -> np.ndarray:
    """KL(Bernoulli(a) || Bernoulli(b)) for an array b in (a, 1)."""
    first = 0.0 if a == 0 else a * np.log(a / b)
    second = 0.0 if a == 1 else (1 - a) * (math.log1p(-a) - np.log1p(-b))
    return first + second


def overall_delta(num_samples: int, threshold: float) -> float:
    """Theorem A.1: the delta an EVR run guarantees when its verifier accepts estimates <= ``threshold``.

    ``min over delta in (threshold, 1) of delta + q(delta, threshold, s) (1 - delta)``: every delta gives a valid
    guarantee, so the minimum over a fine log-spaced grid of delta/threshold (refined once around the best point) is
    returned; it is within 1e-6 relative of the exact minimum and never below it.
    """
    s = _int_at_least("num_samples", num_samples, 1)
    if not 0 <= threshold < 1:
        raise ConfigurationError("threshold", threshold, "must lie in [0, 1)")
    base = threshold if threshold > 0 else 1e-300
    top = math.log(1.0 / base)

    def values(log_ratio: np.ndarray) -> np.ndarray:
        d = np.minimum(base * np.exp(log_ratio), 1.0 - 1e-16)
        with np.errstate(over="ignore", under="ignore"):
            q = np.exp(-s * _kl_vec(threshold, d))
        out = d + q * (1 - d)
        return np.where(d > threshold, out, 1.0)

    grid = np.linspace(0.0, top, 4001)[1:]
    v = values(grid)
    k = int(np.argmin(v))
    step = grid[1] - grid[0]
    fine = np.linspace(max(grid[k] - step, 1e-12), grid[k] + step, 2001)
    return float(min(1.0, v[k], float(np.min(values(fine)))))


def verification_threshold(num_samples: int, target_delta: float) -> float:
    """The largest verifier threshold delta' with :func:`overall_delta` (s, delta') <= ``target_delta`` (bisection).

    Raises:
        ConfigurationError: s samples cannot verify ``target_delta`` for any threshold (too few samples).
    """
    s = _int_at_least("num_samples", num_samples, 1)
    t = _probability("target_delta", target_delta)
    if overall_delta(s, 0.0) > t:
        raise ConfigurationError("num_samples", s, f"is too small to verify delta={t:g} (see samples_for_target_delta)")
    lo, hi = 0.0, t
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if overall_delta(s, mid) <= t:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * t:
            break
    return lo


def samples_for_target_delta(target_delta: float, threshold: float | None = None) -> int:
    """Smallest s with :func:`overall_delta` (s, threshold) <= ``target_delta``; default threshold target/2 (App. A)."""
    t = _probability("target_delta", target_delta)
    thr = t / 2 if threshold is None else float(threshold)
    if not 0 <= thr < t:
        raise ConfigurationError("threshold", threshold, f"must lie in [0, target_delta={t:g})")
    lo, hi = 1, max(2, int(1.0 / t))
    while overall_delta(hi, thr) > t:
        lo, hi = hi, hi * 2
        if hi > 10**13:
            raise ConfigurationError("target_delta", t, "needs more than 1e13 Monte Carlo samples")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if overall_delta(mid, thr) <= t:
            hi = mid
        else:
            lo = mid
    return hi


def verified_upper_bound(num_samples: int, estimate: float) -> float:
    """The smallest target delta that an EVR verification with these s samples would accept given ``estimate``.

    Equals :func:`overall_delta` (s, estimate): a verifier with threshold >= estimate accepts, and the smallest
    guarantee among those thresholds is at threshold = estimate (``overall_delta`` increases with the threshold).
    """
    return overall_delta(num_samples, min(max(estimate, 0.0), 1.0 - 1e-12))


# ---------------------------------------------------------------------------------------------------------------
# the accountant
# ---------------------------------------------------------------------------------------------------------------
@dataclass
class MonteCarloAccountant:
    """Monte Carlo accountant of b-min-sep BandMF for the whole planned run (Section 5 + Appendix A).

    The accountant draws ``samples`` privacy-loss samples per direction once (lazily) and answers every read-out from
    them. Two numbers per epsilon:

    * ``estimate``: the Monte Carlo estimate of max(H_{e^eps}(P||Q), H_{e^eps}(Q||P)) (not a guarantee);
    * ``upper``: the EVR-verified bound of Theorem A.1: the smallest target delta whose verification these samples pass
      in both directions (the verifier accepts when both estimates are <= the threshold derived from the target;
      its false-acceptance probability is folded into the bound). Read-outs (``delta``, ``epsilon``) use ``upper``.

    Interface used by :class:`~lightning_dpts.training.AccountantCallback`: ``is_monte_carlo`` (True),
    ``planned_steps``, ``delta(steps, epsilon)``, ``epsilon(steps, delta)``, ``report()``. The accounting is for the
    whole run of ``mechanism.iterations`` steps; any prefix of it is a post-processing of the whole run, so
    ``steps <= iterations`` is answered with the whole-run bound and ``steps > iterations`` is refused.

    Randomness: the Monte Carlo samples do not touch private data, so their seed is not secret; ``seed=None`` draws
    fresh OS entropy, an int makes read-outs reproducible.
    """

    mechanism: BandMFMechanism
    samples: int = 100_000
    seed: int | None = None
    fixed_direction: bool = False
    is_monte_carlo: bool = field(default=True, init=False)
    #: Metric name for loggers: the value is an EVR-verified Monte Carlo bound, not a closed-form accountant's.
    log_name: str = field(default="epsilon_monte_carlo_upper", init=False)
    _losses: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False)
    _sorted: dict[str, np.ndarray] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.mechanism, BandMFMechanism):
            raise ConfigurationError("mechanism", self.mechanism, "must be a BandMFMechanism")
        _int_at_least("samples", self.samples, 1)
        if self.seed is not None:
            _int_at_least("seed", self.seed, 0)
        if self.mechanism.leak_probability < 1.0 and not self.fixed_direction:
            raise ConfigurationError(
                "leak_probability", self.mechanism.leak_probability,
                "must be 1 for a guarantee: with r < 1 (substitution relations of structured subsampling) the "
                "worst case can switch direction between steps and max(H(P||Q), H(Q||P)) is not proven to bound it "
                "(docs/bandmf.md); pass fixed_direction=True only for analysis")

    @property
    def planned_steps(self) -> int:
        """n, the number of steps the accounting covers."""
        return self.mechanism.iterations

    def _rng(self, direction: str) -> np.random.Generator:
        key = 0 if direction == "remove" else 1
        # SFC64: fast, statistically strong; these samples protect nothing (no private data), see the class docstring
        seq = np.random.SeedSequence() if self.seed is None else np.random.SeedSequence(self.seed, spawn_key=(key,))
        return np.random.Generator(np.random.SFC64(seq))

    def losses(self, direction: str) -> np.ndarray:
        """The cached privacy-loss samples of ``"remove"`` (y ~ P) or ``"add"`` (y ~ Q)."""
        if direction not in self._losses:
            self._losses[direction] = self.mechanism.privacy_loss_samples(self._rng(direction), self.samples,
                                                                         direction)
        return self._losses[direction]

    def _sorted_losses(self, direction: str) -> np.ndarray:
        if direction not in self._sorted:
            self._sorted[direction] = np.sort(self.losses(direction))
        return self._sorted[direction]

    def estimates(self, epsilon: float) -> dict[str, float]:
        """``{"remove": H(P||Q), "add": H(Q||P)}`` Monte Carlo estimates at e^epsilon.

        Same value as :func:`hockey_stick_estimate` (the mean over all samples of max(0, 1 - e^{eps - L})): the
        losses are sorted once, and only the samples with L > eps (the non-zero terms) are summed, so the many
        read-outs of an epsilon search cost O(log s + #{L > eps}) each instead of O(s).
        """
        eps = float(epsilon)
        if not (eps >= 0 and math.isfinite(eps)):
            raise ConfigurationError("epsilon", epsilon, "must be a finite number >= 0")
        out = {}
        for d in ("remove", "add"):
            losses = self._sorted_losses(d)
            tail = losses[np.searchsorted(losses, eps, side="right"):]
            out[d] = float(-np.expm1(eps - tail).sum() / losses.size) + 0.0  # never -0.0
        return out

    def delta_estimate(self, epsilon: float) -> float:
        """Monte Carlo estimate of max(H(P||Q), H(Q||P)) at e^epsilon (not a guarantee)."""
        return max(self.estimates(epsilon).values())

    def delta_upper(self, epsilon: float) -> float:
        """EVR-verified delta(epsilon): :func:`verified_upper_bound` of the larger direction's estimate."""
        return verified_upper_bound(self.samples, self.delta_estimate(epsilon))

    def _check_steps(self, steps: int) -> None:
        s = _int_at_least("steps", steps, 0)
        if s > self.planned_steps:
            raise ConfigurationError("steps", s, f"must be <= the planned iterations={self.planned_steps} the "
                                                 "Monte Carlo accounting was done for")

    def delta(self, steps: int, epsilon: float) -> float:
        """EVR-verified delta after ``steps`` <= n steps (the whole-run bound; 0 for steps = 0)."""
        self._check_steps(steps)
        return 0.0 if steps == 0 else self.delta_upper(epsilon)

    def epsilon(self, steps: int, delta: float) -> float:
        """Smallest epsilon (within 1e-4 relative, rounded up) whose EVR-verified delta is <= ``delta``."""
        self._check_steps(steps)
        d = _probability("delta", delta)
        if steps == 0:
            return 0.0
        if self.delta_upper(0.0) <= d:
            return 0.0
        hi = 1.0
        while self.delta_upper(hi) > d:
            hi *= 2.0
            if hi > 1e4:
                return math.inf
        lo = 0.0 if hi == 1.0 else hi / 2
        while hi - lo > 1e-4 * hi:
            mid = 0.5 * (lo + hi)
            if self.delta_upper(mid) > d:
                lo = mid
            else:
                hi = mid
        return hi

    def substitution_epsilon(self, steps: int, delta: float) -> float:
        """Epsilon for *substitution* of one example (bounded DP) from the add/remove analysis, by group privacy.

        Substituting an example is removing it then adding the new one: an (eps, d)-DP mechanism under add/remove is
        (2 eps, (1 + e^eps) d)-DP under substitution. Returns 2 eps for an eps whose EVR-verified d(eps) satisfies
        (1 + e^eps) d(eps) <= ``delta``; every returned value satisfies it, ``inf`` if none does. The condition is not
        monotone in eps (d(eps) stops falling at the EVR floor of the sample size while 1 + e^eps keeps growing, so
        the satisfying eps form an interval that can be narrow): the search scans eps on a geometric grid (ratio
        1.1 from 1e-3) until the first satisfying point, stopping once both Monte Carlo estimates are 0 (past that
        point d(eps) is constant and no larger eps can satisfy it), then bisects between the last failing and the
        first satisfying grid point to 1e-4 relative, keeping a satisfying upper end. Sound for the package's
        substitution relations at series level (r = 1, sensitivity = windows per series), but loose: it does not
        reduce to the package's structured accountant at b = 1 (docs/bandmf.md).
        """
        self._check_steps(steps)
        d = _probability("delta", delta)
        if steps == 0:
            return 0.0

        def ok(eps: float) -> bool:
            upper = self.delta_upper(eps)
            return upper == 0.0 or math.log1p(math.exp(-eps)) + eps + math.log(upper) <= math.log(d)

        if ok(0.0):
            return 0.0
        lo, hi = 0.0, 1e-3
        while not ok(hi):
            if self.delta_estimate(hi) == 0.0 or hi > 1e4:
                return math.inf  # d(eps) is at its floor from here on and 1 + e^eps only grows
            lo, hi = hi, hi * 1.1
        while hi - lo > 1e-4 * hi:
            mid = 0.5 * (lo + hi)
            if ok(mid):
                hi = mid
            else:
                lo = mid
        return 2.0 * hi

    def check_budget(self, epsilon: float, delta: float) -> float:
        """Before training: the verified epsilon of the whole planned run; raises if it exceeds ``epsilon``.

        Raises:
            ConfigurationError: the planned run's EVR-verified epsilon at ``delta`` is above the budget (or cannot be
                verified with the accountant's samples).
        """
        budget = _positive("epsilon", epsilon)
        eps = self.epsilon(self.planned_steps, delta)
        if not eps <= budget:
            raise ConfigurationError(
                "epsilon", budget, f"is below the Monte Carlo-verified epsilon={eps:.4g} of the planned "
                f"{self.planned_steps} steps at delta={delta:g} (raise sigma, reduce steps, or add samples)")
        return eps

    def report(self, epsilons: Sequence[float] = ()) -> dict[str, Any]:
        """A JSON-ready summary: the mechanism, the samples, and per epsilon the estimate and EVR bound."""
        mech = self.mechanism
        return {
            "accountant": "monte_carlo",
            "is_monte_carlo": True,
            "method": "Monte Carlo estimate (Dong & Ganesh 2026, Theorem 5.1) verified by EVR (Theorem A.1)",
            "iterations": mech.iterations,
            "bands": mech.bands,
            "coefficients": list(mech.coefficients),
            "sampling_prob": mech.sampling_prob,
            "noise_multiplier": mech.noise_multiplier,
            "warm_start": mech.warm_start,
            "leak_probability": mech.leak_probability,
            "sensitivity": mech.sensitivity,
            "samples_per_direction": self.samples,
            "delta": {str(e): {"estimate": self.delta_estimate(e), "upper": self.delta_upper(e)} for e in epsilons},
        }


# ---------------------------------------------------------------------------------------------------------------
# Algorithm 5: calibration
# ---------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CalibrationResult:
    """Outcome of :func:`calibrate_noise_multiplier_monte_carlo`.

    Attributes:
        noise_multiplier: the selected sigma (the release of Algorithm 5 line 6).
        verified: True when a Monte Carlo-verified candidate was selected, False when the analytic top candidate was.
        candidates: the candidate grid sigma_1 < ... < sigma_k (sigma_k analytic).
        threshold: the verifier threshold delta' derived from the target.
        samples: samples per direction and per verified candidate.
        target_epsilon, target_delta: the guarantee of the selected run (Theorem A.1).
    """

    noise_multiplier: float
    verified: bool
    candidates: tuple[float, ...]
    threshold: float
    samples: int
    target_epsilon: float
    target_delta: float


def analytic_noise_multiplier(mechanism: BandMFMechanism, epsilon: float, delta: float) -> float:
    """Smallest sigma (within 1e-6 relative, rounded up) for which the unamplified Gaussian mechanism of
    :meth:`BandMFMechanism.unamplified_sensitivity` is (epsilon, delta)-DP: the analytic top candidate M_k."""
    sens = mechanism.unamplified_sensitivity()
    lo, hi = 1e-3, 1.0
    while gaussian_mechanism_delta(sens / hi, epsilon) > delta:
        hi *= 2.0
    while hi - lo > 1e-6 * hi:
        mid = 0.5 * (lo + hi)
        if gaussian_mechanism_delta(sens / mid, epsilon) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def calibrate_noise_multiplier_monte_carlo(
    mechanism: BandMFMechanism,
    target_epsilon: float,
    target_delta: float,
    *,
    samples: int | None = None,
    ratio: float = 1.01,
    grid_size: int = 12,
    pilot_samples: int = 20_000,
    seed: int | None = None,
    fixed_direction: bool = False,
) -> CalibrationResult:
    """Algorithm 5 (Appendix A): the smallest verified noise multiplier for (target_epsilon, target_delta).

    1. A pilot Monte Carlo search (its own samples, independent of the verification; no private data is involved)
       locates sigma_pilot whose estimated delta equals the verifier threshold.
    2. The candidate list is sigma_pilot * ratio^j for j = -2 .. grid_size - 3 (increasing), followed by sigma_k, the
       analytic noise multiplier of the unamplified Gaussian mechanism (:func:`analytic_noise_multiplier`) at
       (epsilon, threshold): Theorem A.1 needs M_k to satisfy (epsilon, delta) for the delta of the tail bound, which
       is > threshold, so this is sufficient (Theorem 8 of Balle & Wang 2018). Candidates >= sigma_k are dropped.
    3. Each candidate i < k is verified with fresh, independent samples (both directions, each estimate <=
       threshold); i* = min{i : v_j = 1 for all j >= i} (scanning from the top, stopping at the first rejection
       which suffices to determine i*).

    By Theorem A.1 the selected run is (epsilon, overall_delta(s, threshold))-DP, <= target_delta by construction of
    the threshold (:func:`verification_threshold`). ``samples`` defaults to :func:`samples_for_target_delta` with
    threshold target/2 (the paper's choice).
    """
    eps = float(target_epsilon)
    if not (eps >= 0 and math.isfinite(eps)):
        raise ConfigurationError("target_epsilon", target_epsilon, "must be a finite number >= 0")
    t = _probability("target_delta", target_delta)
    MonteCarloAccountant(mechanism, samples=1, fixed_direction=fixed_direction)  # refuses r < 1 for guarantees
    if not (ratio > 1 and math.isfinite(ratio)):
        raise ConfigurationError("ratio", ratio, "must be a finite number > 1")
    _int_at_least("grid_size", grid_size, 3)
    s = samples_for_target_delta(t) if samples is None else _int_at_least("samples", samples, 1)
    threshold = verification_threshold(s, t)
    sigma_k = analytic_noise_multiplier(mechanism, eps, threshold)

    def pilot_delta(sigma: float, key: int) -> float:
        acc = MonteCarloAccountant(mechanism.with_noise_multiplier(sigma), samples=pilot_samples,
                                   seed=None if seed is None else seed + 7919 * (key + 1),
                                   fixed_direction=fixed_direction)
        return acc.delta_estimate(eps)

    lo, hi = sigma_k / 64, sigma_k
    for it in range(30):
        mid = math.sqrt(lo * hi)
        if pilot_delta(mid, it) > threshold:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + (ratio - 1) / 2:
            break
    candidates = [hi * ratio**j for j in range(-2, grid_size - 2)]
    candidates = [c for c in candidates if c < sigma_k] + [sigma_k]
    chosen_index = len(candidates) - 1
    for i in range(len(candidates) - 2, -1, -1):
        acc = MonteCarloAccountant(mechanism.with_noise_multiplier(candidates[i]), samples=s,
                                   seed=None if seed is None else seed + 104729 * (i + 1),
                                   fixed_direction=fixed_direction)
        if acc.delta_estimate(eps) <= threshold:
            chosen_index = i
        else:
            break
    return CalibrationResult(candidates[chosen_index], chosen_index < len(candidates) - 1, tuple(candidates),
                             threshold, s, eps, t)

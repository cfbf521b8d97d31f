"""Private hyperparameter selection: the privacy cost of trying several settings and keeping the best.

Training K settings privately and releasing the one with the best *private* validation score is a privacy cost on
top of one training run: with a fixed number of runs the best of K tells the data apart up to K times more
(:func:`best_of_k_rdp`, composition). This module accounts the **random stopping** procedure of Papernot & Steinke
(2022), "Hyperparameter Tuning with Renyi Differential Privacy" (ICLR 2022), which improves Liu & Talwar (STOC 2019):

1. draw the number of runs K from the truncated negative binomial distribution D(eta, gamma) (Section 2,
   Eq. (1); eta = 1 is the geometric distribution of Liu & Talwar, eta = 0 the logarithmic distribution),
   with randomness the data never sees;
2. K times: draw a candidate setting uniformly from the (public) candidate list, train it privately and score it
   privately (each run is the same randomised algorithm Q);
3. release only the best run (its model, setting and noisy score) -- **not** K, not the other runs.

Theorem 2 of Papernot & Steinke: if Q is (lambda, eps)-RDP and (lambda_hat, eps_hat)-RDP, with lambda > 1,
lambda_hat >= 1, eta > -1 and 0 < gamma < 1, the procedure is (lambda, eps')-RDP with::

    eps' = eps + (1 + eta) (1 - 1/lambda_hat) eps_hat + (1 + eta) log(1/gamma) / lambda_hat + log(E[K]) / (lambda - 1)

and E[K] = eta (1 - gamma) / (gamma (1 - gamma^eta)) (eta != 0), (1/gamma - 1) / log(1/gamma) (eta = 0).
Q picks a candidate uniformly and runs it, so Q's Renyi divergence is at most the largest candidate's at every
order (exp((lambda - 1) D_lambda) is jointly convex in the pair of distributions). Each candidate's curve is its
training's RDP plus its score's (composition adds RDP at each order); the result is converted to (epsilon, delta)
with Canonne, Kamath & Steinke (2020), Proposition 12 (:func:`rdp_to_epsilon`).

**The RDP of one training run** (:func:`profile_rdp`). The accountant's bound for one composition unit is a
*symmetric* privacy profile delta(eps) of a dominating pair (P, Q) of Gaussian mixtures (the structured-subsampling
theorems, :mod:`~lightning_dpts.privacy.profiles`). The symmetric pair whose hockey-stick divergence at
alpha = e^eps >= 1 is rho H_alpha(P || Q) dominates the mechanism in both directions; integrating its hockey-stick
curve twice (H'' is the law of the likelihood ratio L = dP/dQ under Q) gives its Renyi moment in closed form::

    E[(dP~/dQ~)^lambda] = 1 + lambda (lambda - 1) int_1^inf (u^(lambda-2) + u^(-lambda-1)) H_u du
                        = 1 + rho E_Q[(L^lambda + L^(1-lambda) - L - 1) 1{L > 1}],

a one-dimensional integral over the Gaussian mixtures (composite Simpson with a Richardson error term added, so
the result is an upper bound up to floating point). Units compose additively. The PLD of the accountant cannot
serve here: its pessimistic tail truncation puts mass at infinite loss, which makes every Renyi divergence infinite.
Profiles the package builds as a pointwise maximum without one mixture pair (bottom-level Poisson with series of
different lengths), or with dropped mixture components, are refused.

**The score** of a run is a Gaussian mechanism on a mean of clipped per-window scores
(:func:`gaussian_rdp`: lambda Delta^2 / (2 s^2) for sensitivity Delta and noise std s; Mironov 2017, Prop. 7).

Everything here is numpy/scipy only (no torch); :mod:`lightning_dpts.tuning` runs the procedure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.special import logsumexp

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "ORDERS",
    "RandomStoppingAccountant",
    "TruncatedNegativeBinomial",
    "best_of_k_rdp",
    "gaussian_rdp",
    "pair_rdp",
    "profile_rdp",
    "random_stopping_rdp",
    "rdp_to_epsilon",
    "training_rdp",
]

#: Renyi orders lambda > 1 at which curves are evaluated (also the grid of lambda_hat in Theorem 2).
ORDERS = np.array([1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0, 20.0,
                   24.0, 28.0, 32.0, 40.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0])

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_CHUNK = 1 << 15  # points evaluated at once
_STEP = 0.01  # Simpson spacing in units of the noise std (the mixtures' components have unit variance)


def _check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(orders, dtype=np.float64).ravel()
    if a.size == 0 or not np.all(np.isfinite(a)) or np.any(a <= 1.0):
        raise ConfigurationError("orders", orders, "must be finite Renyi orders > 1")
    return a


# ----------------------------------------------------------------------------------------------------------------
# Renyi DP of the structured-subsampling dominating pairs
# ----------------------------------------------------------------------------------------------------------------
def _log_pq(x: np.ndarray, means: np.ndarray, log_w: np.ndarray, opposed: bool) -> tuple[np.ndarray, np.ndarray]:
    """log densities of P and Q at x: P = MoG(means) vs Q = N(0, 1), or P = MoG(-means) vs Q = MoG(means)."""
    z = x[:, None]
    if opposed:
        lp = logsumexp(log_w[None, :] - 0.5 * (z + means[None, :]) ** 2, axis=1)
        lq = logsumexp(log_w[None, :] - 0.5 * (z - means[None, :]) ** 2, axis=1)
    else:
        lp = logsumexp(log_w[None, :] - 0.5 * (z - means[None, :]) ** 2, axis=1)
        lq = -0.5 * x * x
    return lp - _LOG_SQRT_2PI, lq - _LOG_SQRT_2PI


def _log_h(t: np.ndarray, lam: float) -> np.ndarray:
    """log(e^(lam t) + e^((1-lam) t) - e^t - 1) for t > 0 (>= 0 there), without overflow or cancellation."""
    out = np.full_like(t, -np.inf)
    small = t * lam < 1.0
    ts = t[small]
    direct = np.expm1(lam * ts) + np.expm1((1.0 - lam) * ts) - np.expm1(ts)
    with np.errstate(divide="ignore"):
        out[small] = np.log(np.maximum(direct, 0.0))
    tl = t[~small]
    rest = np.exp((1.0 - 2.0 * lam) * tl) - np.exp((1.0 - lam) * tl) - np.exp(-lam * tl)
    with np.errstate(divide="ignore"):
        out[~small] = lam * tl + np.log1p(np.maximum(rest, -1.0))
    return out


def _zero_loss_point(means: np.ndarray, log_w: np.ndarray, opposed: bool) -> float:
    """x with log(dP/dQ)(x) = 0 (the loss is increasing in x for mixture-vs-Gaussian, decreasing if opposed)."""
    from scipy.optimize import brentq

    def loss(x: float) -> float:
        lp, lq = _log_pq(np.array([x]), means, log_w, opposed)
        return float(lp[0] - lq[0])

    span = 1.0 + float(means.max())
    while loss(-span) * loss(span) > 0 and span < 1e6:
        span *= 2.0
    return float(brentq(loss, -span, span, xtol=1e-13))


def pair_rdp(means: Sequence[float] | np.ndarray, weights: Sequence[float] | np.ndarray, *, opposed: bool,
             orders: Sequence[float] | np.ndarray = ORDERS, rho: float = 1.0) -> np.ndarray:
    """Renyi DP, at each order, of the symmetric pair whose privacy profile is rho H_alpha(P || Q) for alpha >= 1.

    (P, Q) is MoG(means, weights) vs N(0, 1) (``opposed=False``) or MoG(-means, weights) vs MoG(means, weights)
    (``opposed=True``), every component of unit variance (means in units of the noise std). The value is
    ``log(1 + rho E_Q[(L^lam + L^(1-lam) - L - 1) 1{L > 1}]) / (lam - 1)`` (module docstring), integrated by
    composite Simpson over the half-line {L > 1} up to (2 lam + 1) max(means) + 40 noise stds past the zero-loss
    point (beyond it the integrand is below e^-800 of its peak), with the Richardson error estimate added.

    Returns:
        eps(lambda) per order (nats); ``inf`` where the moment overflows.
    """
    lams = _check_orders(orders)
    means = np.asarray(means, dtype=np.float64).ravel()
    weights = np.asarray(weights, dtype=np.float64).ravel()
    keep = weights > 0
    means, weights = means[keep], weights[keep] / weights[keep].sum()
    if not 0.0 <= rho <= 1.0:
        raise ConfigurationError("rho", rho, "must lie in [0, 1]")
    if rho == 0.0 or np.all(means == 0.0):
        return np.zeros_like(lams)
    log_w = np.log(weights)
    x0 = _zero_loss_point(means, log_w, opposed)
    direction = -1.0 if opposed else 1.0
    top = float(means.max())
    out = np.empty_like(lams)
    for i, lam in enumerate(lams):
        length = (2.0 * lam + 1.0) * top * (2.0 if opposed else 1.0) + 40.0 + abs(x0)
        n = int(math.ceil(length / _STEP / 2.0)) * 2  # even number of Simpson intervals
        x = x0 + direction * np.linspace(0.0, length, n + 1)
        log_f = np.empty_like(x)
        for start in range(0, x.size, _CHUNK):  # bounded memory: points x components per chunk
            lp, lq = _log_pq(x[start:start + _CHUNK], means, log_w, opposed)
            log_f[start:start + _CHUNK] = lq + _log_h(np.maximum(lp - lq, 0.0), float(lam))
        c = float(np.max(log_f))
        if not np.isfinite(c):
            out[i] = 0.0
            continue
        f = np.exp(log_f - c)
        h = length / n
        fine = h / 3.0 * (f[0] + f[-1] + 4.0 * f[1:-1:2].sum() + 2.0 * f[2:-1:2].sum())
        coarse_f = f[::2]
        h2 = 2.0 * h
        m = len(coarse_f) - 1
        if m % 2:  # trapezoid for the coarse estimate when its interval count is odd
            coarse = h2 * (coarse_f.sum() - 0.5 * (coarse_f[0] + coarse_f[-1]))
        else:
            coarse = h2 / 3.0 * (coarse_f[0] + coarse_f[-1] + 4.0 * coarse_f[1:-1:2].sum()
                                 + 2.0 * coarse_f[2:-1:2].sum())
        integral = fine + abs(fine - coarse) + 1e-12 * fine
        if integral <= 0.0:
            out[i] = 0.0
            continue
        log_moment_minus_one = math.log(rho) + c + math.log(integral)
        out[i] = float(np.logaddexp(0.0, log_moment_minus_one)) / (lam - 1.0)
    return out


def profile_rdp(profile: Any, orders: Sequence[float] | np.ndarray = ORDERS) -> np.ndarray:
    """Renyi DP of one composition unit whose privacy profile is ``profile`` (a
    :class:`~lightning_dpts.privacy.profiles.PrivacyProfile` of the paper's theorems): :func:`pair_rdp` of its
    mixture pair and top-level weight rho (Lemma F.4).

    Raises:
        ConfigurationError: the profile has no single mixture pair (a pointwise maximum over series lengths with a
            bottom-level Poisson scheme) or dropped mixture components (their infinite-loss mass has no finite
            Renyi divergence), or is an optimistic lower bound.
    """
    pair = getattr(profile, "pair", None)
    if getattr(profile, "kind", "upper") == "lower":
        raise ConfigurationError("bound", "lower", "an optimistic lower bound is not a guarantee; use bound='upper'")
    if pair is None:
        raise ConfigurationError(
            "sampling_spec", getattr(profile, "theorem", profile),
            "private selection needs a per-step bound given by one Gaussian-mixture pair (bottom level with "
            "replacement, or series of one length); this profile is a pointwise maximum")
    if float(pair.dropped_mass) > 0.0:
        raise ConfigurationError(
            "sampling_spec", getattr(profile, "theorem", profile),
            f"its mixture pair dropped components of mass {pair.dropped_mass:.3g}, accounted as fully "
            "distinguishable: no finite Renyi bound; use fewer windows per series")
    return pair_rdp(pair.means, pair.weights, opposed=bool(pair.opposed), orders=orders, rho=float(profile.rho))


def training_rdp(spec: Any, noise_multiplier: float, steps: int,
                 orders: Sequence[float] | np.ndarray = ORDERS) -> np.ndarray:
    """Renyi DP of ``steps`` DP-SGD steps with ``noise_multiplier`` sampled as ``spec`` describes: the unit
    profile :func:`~lightning_dpts.privacy.select_profile` chooses (the same theorem as the PLD accountant)
    times the number of composition units ``spec.compositions(steps)``."""
    from lightning_dpts.privacy.bounds import select_profile

    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise ConfigurationError("steps", steps, "must be an integer >= 0")
    if steps == 0:
        return np.zeros_like(_check_orders(orders))
    units = spec.compositions(int(steps))
    return units * profile_rdp(select_profile(spec, noise_multiplier, "upper"), orders)


def gaussian_rdp(noise_multiplier: float, orders: Sequence[float] | np.ndarray = ORDERS) -> np.ndarray:
    """Renyi DP of the Gaussian mechanism with noise std ``noise_multiplier`` times the sensitivity:
    lambda / (2 z^2) (Mironov 2017, Proposition 7)."""
    if not (isinstance(noise_multiplier, (int, float)) and noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ConfigurationError("score_noise_multiplier", noise_multiplier, "must be a finite number > 0")
    return _check_orders(orders) / (2.0 * float(noise_multiplier) ** 2)


def rdp_to_epsilon(rdp: Sequence[float] | np.ndarray, delta: float,
                   orders: Sequence[float] | np.ndarray = ORDERS) -> tuple[float, float]:
    """(epsilon, best order) of the (epsilon, delta)-DP guarantee implied by an RDP curve:
    min over lambda of rdp(lambda) + log((lambda - 1)/lambda) - (log delta + log lambda)/(lambda - 1)
    (Canonne, Kamath & Steinke 2020, Proposition 12)."""
    lams = _check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape != lams.shape:
        raise ConfigurationError("rdp", r.shape, f"must have one value per order ({lams.size})")
    if not (isinstance(delta, float) and 0.0 < delta < 1.0):
        raise ConfigurationError("delta", delta, "must be a float in (0, 1)")
    eps = r + np.log((lams - 1.0) / lams) - (math.log(delta) + np.log(lams)) / (lams - 1.0)
    eps = np.where(np.isfinite(r), eps, np.inf)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(lams[i])


# ----------------------------------------------------------------------------------------------------------------
# The number of runs and Theorem 2
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TruncatedNegativeBinomial:
    """The distribution D(eta, gamma) of the number of runs K in {1, 2, ...} (Papernot & Steinke 2022, Eq. (1)):

    P[K = k] = (1 - gamma)^k / (gamma^-eta - 1) prod_{l=0}^{k-1} (l + eta)/(l + 1) for eta != 0, and
    (1 - gamma)^k / (k log(1/gamma)) for eta = 0 (logarithmic); eta = 1 is geometric, gamma (1 - gamma)^(k-1).

    Args:
        eta: shape, > -1.
        gamma: 0 < gamma < 1 (smaller: more runs).
    """

    eta: float
    gamma: float

    def __post_init__(self) -> None:
        if not (isinstance(self.eta, (int, float)) and math.isfinite(self.eta) and self.eta > -1.0):
            raise ConfigurationError("eta", self.eta, "must be a finite number > -1 (Papernot & Steinke, Theorem 2)")
        if not (isinstance(self.gamma, (int, float)) and 0.0 < self.gamma < 1.0):
            raise ConfigurationError("gamma", self.gamma, "must lie in (0, 1)")

    @classmethod
    def with_mean(cls, mean: float, eta: float = 0.0) -> TruncatedNegativeBinomial:
        """The distribution with E[K] = ``mean`` (> 1) for the given eta (gamma by bisection; E[K] falls in gamma)."""
        if not (isinstance(mean, (int, float)) and math.isfinite(mean) and mean > 1.0):
            raise ConfigurationError("mean_runs", mean, "must be a finite number > 1")
        cls(eta, 0.5)  # validates eta
        lo, hi = 1e-12, 1.0 - 1e-12
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if cls(eta, mid).mean > mean:
                lo = mid
            else:
                hi = mid
        return cls(eta, 0.5 * (lo + hi))

    @property
    def mean(self) -> float:
        """E[K]: eta (1 - gamma) / (gamma (1 - gamma^eta)), or (1/gamma - 1) / log(1/gamma) for eta = 0."""
        g, e = self.gamma, self.eta
        if e == 0.0:
            return (1.0 / g - 1.0) / math.log(1.0 / g)
        return e * (1.0 - g) / (g * -math.expm1(e * math.log(g)))

    def pmf(self, k: int | np.ndarray) -> np.ndarray:
        """P[K = k] (0 for k < 1), by the ratio P[k+1]/P[k] = (1 - gamma)(k + eta)/(k + 1) in log space."""
        ks = np.atleast_1d(np.asarray(k, dtype=np.int64))
        top = int(max(1, ks.max(initial=1)))
        j = np.arange(1, top, dtype=np.float64)
        log_ratio = math.log1p(-self.gamma) + np.log(np.abs(j + self.eta)) - np.log(j + 1.0)
        logs = np.concatenate([[self._log_first()], self._log_first() + np.cumsum(log_ratio)])
        out = np.where(ks >= 1, np.exp(logs[np.clip(ks, 1, top) - 1]), 0.0)
        return out

    def _log_first(self) -> float:
        g, e = self.gamma, self.eta
        if e == 0.0:
            return math.log1p(-g) - math.log(math.log(1.0 / g))
        return math.log1p(-g) + math.log(abs(e)) - math.log(abs(math.expm1(-e * math.log(g))))

    def sample(self, rng: np.random.Generator) -> int:
        """One draw of K by inversion of the CDF (``rng`` from :mod:`lightning_dpts.randomness`: secret, fresh)."""
        u = float(rng.random())
        k, log_p = 1, self._log_first()
        cumulative = math.exp(log_p)
        while cumulative <= u:
            log_p += math.log1p(-self.gamma) + math.log(abs(k + self.eta)) - math.log(k + 1.0)
            k += 1
            cumulative += math.exp(log_p)
            if k > 10**7:  # pragma: no cover - probability below (1 - gamma)^1e7
                break
        return k


def random_stopping_rdp(rdp: Sequence[float] | np.ndarray, distribution: TruncatedNegativeBinomial,
                        orders: Sequence[float] | np.ndarray = ORDERS) -> np.ndarray:
    """RDP of random stopping (Papernot & Steinke 2022, Theorem 2) at each order lambda of ``orders``, for one run
    Q with RDP curve ``rdp`` on the same orders, minimised over lambda_hat in ``orders``::

        rdp(lambda) + min_hat [(1 + eta)(1 - 1/hat) rdp(hat) + (1 + eta) log(1/gamma)/hat] + log(E[K])/(lambda - 1)
    """
    lams = _check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape != lams.shape or np.any(r < 0):
        raise ConfigurationError("rdp", rdp, f"must be {lams.size} non-negative values, one per order")
    e, g = distribution.eta, distribution.gamma
    hat = (1.0 + e) * (1.0 - 1.0 / lams) * r + (1.0 + e) * math.log(1.0 / g) / lams
    return r + float(np.min(hat)) + math.log(distribution.mean) / (lams - 1.0)


def best_of_k_rdp(rdps: Sequence[Sequence[float] | np.ndarray]) -> np.ndarray:
    """RDP of running each of a *fixed* list of candidates and releasing the best: the composition of all of them
    (the sum of their curves). This is what plain "train K, keep the best" costs without random stopping: the best
    of K can be K times as revealing as one run (tests/privacy/test_selection.py shows it exactly)."""
    if len(rdps) == 0:
        raise ConfigurationError("candidates", 0, "must hold at least one curve")
    return np.sum([np.asarray(r, dtype=np.float64) for r in rdps], axis=0)


@dataclass
class RandomStoppingAccountant:
    """The privacy of random stopping over candidate runs, each given by its RDP curve on :data:`ORDERS`.

    Args:
        candidate_rdps: per candidate, the RDP curve of one run (training plus its score).
        distribution: the law of the number of runs.
        orders: the orders of the curves.

    :meth:`epsilon` gives the (epsilon, delta) of the whole procedure (Theorem 2, then Proposition 12 of
    Canonne, Kamath & Steinke 2020); :meth:`single_run_epsilon` the one run's, for comparison.
    """

    candidate_rdps: list[np.ndarray]
    distribution: TruncatedNegativeBinomial
    orders: np.ndarray = field(default_factory=lambda: ORDERS.copy())

    def __post_init__(self) -> None:
        self.orders = _check_orders(self.orders)
        if not self.candidate_rdps:
            raise ConfigurationError("candidates", 0, "must hold at least one candidate")
        self.candidate_rdps = [np.asarray(r, dtype=np.float64) for r in self.candidate_rdps]

    @property
    def run_rdp(self) -> np.ndarray:
        """RDP of one run Q (a uniformly drawn candidate): the largest candidate curve at each order."""
        return np.max(np.stack(self.candidate_rdps), axis=0)

    def rdp(self) -> np.ndarray:
        """RDP of the whole procedure at each order."""
        return random_stopping_rdp(self.run_rdp, self.distribution, self.orders)

    def epsilon(self, delta: float) -> float:
        """epsilon of the whole procedure at ``delta``."""
        return rdp_to_epsilon(self.rdp(), delta, self.orders)[0]

    def single_run_epsilon(self, delta: float) -> float:
        """epsilon of one run (the most expensive candidate) at ``delta``, by the same RDP conversion."""
        return rdp_to_epsilon(self.run_rdp, delta, self.orders)[0]

    def fixed_runs_epsilon(self, delta: float) -> float:
        """epsilon of plain "train every candidate once, keep the best" (composition, :func:`best_of_k_rdp`)."""
        return rdp_to_epsilon(best_of_k_rdp(self.candidate_rdps), delta, self.orders)[0]

    def describe(self, delta: float) -> dict[str, Any]:
        """The public description of the procedure and its guarantee (no run count, no score)."""
        d = self.distribution
        return {
            "procedure": "random stopping (Papernot & Steinke 2022, Theorem 2; truncated negative binomial number "
                         "of runs)",
            "eta": d.eta, "gamma": d.gamma, "expected_runs": d.mean, "candidates": len(self.candidate_rdps),
            "epsilon": self.epsilon(delta), "delta": delta,
            "single_run_epsilon": self.single_run_epsilon(delta),
            "fixed_runs_epsilon": self.fixed_runs_epsilon(delta),
            "conversion": "Canonne, Kamath & Steinke 2020, Proposition 12",
        }

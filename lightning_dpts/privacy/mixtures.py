"""Hockey-stick divergences of the univariate Gaussian mixtures that dominate structured subsampling.

Every bound of the paper is (a convex combination with the identity profile of) one of two families, with
all means expressed in units of the noise standard deviation after dividing by the clipping norm C:

* **mixture vs Gaussian** ``H_alpha(MoG(mu, p, sigma) || N(0, sigma))`` with mu >= 0 (Theorems 4.2-4.5, F.7,
  G.1, Propositions C.1/C.2). Its likelihood ratio sum_i p_i exp((mu_i x - mu_i^2/2)/sigma^2) increases in x.
* **opposed mixtures** ``H_alpha(MoG(-mu, p, sigma) || MoG(mu, p, sigma))`` with mu >= 0 (Theorems E.1, E.8
  and the lower bound of F.8). Its likelihood ratio decreases in x (numerator decreasing, denominator
  increasing).

A monotone likelihood ratio makes the optimal set of H_alpha(P||Q) = sup_S P(S) - alpha Q(S) a half-line
{x : log(dP/dQ)(x) > log alpha}, so H_alpha is a sum of normal CDFs at the threshold x*(alpha). We find x*
for a whole vector of alphas at once (a monotone table, then clamped Newton steps). Only alpha >= 1 is
evaluated here; both families are *symmetric* (the switching profiles of Lemma D.10 and the reflection
symmetry of opposed mixtures), so alpha < 1 follows from H(alpha) = 1 - alpha + alpha * H(1/alpha), see
:mod:`lightning_dpts.privacy.profiles`.

Components whose total weight is below ``component_truncation`` are dropped and their mass eta is added
back as a perfectly distinguishable pair: by joint convexity H <= (1 - eta) H_truncated + eta, which keeps
every result an upper bound (and still a valid privacy profile).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr, logsumexp, ndtr

__all__ = ["MonotoneMixturePair"]

_NEWTON_STEPS = 6
_TABLE_SIZE = 4097
_MIN_TABLE_SIZE = 65
_CHUNK = 1 << 16


def _lse_rows(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise log-sum-exp and softmax weights of a 2-D array (leaner than scipy's for our shapes)."""
    top = a.max(axis=1, keepdims=True)
    e = np.exp(a - top)
    total = e.sum(axis=1)
    return np.log(total) + top[:, 0], e / total[:, None]


def _truncate_components(
    means: np.ndarray, weights: np.ndarray, component_truncation: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Drop the lightest components whose total mass stays <= ``component_truncation``.

    Returns the kept means, their *renormalised* weights and the dropped mass eta.
    """
    order = np.argsort(weights, kind="stable")
    cumulative = np.cumsum(weights[order])
    n_drop = int(np.searchsorted(cumulative, component_truncation, side="right"))
    n_drop = min(n_drop, len(weights) - 1)  # always keep at least one component
    keep = np.sort(order[n_drop:])
    eta = float(cumulative[n_drop - 1]) if n_drop > 0 else 0.0
    kept_means = means[keep]
    kept_weights = weights[keep] / weights[keep].sum()
    return kept_means, kept_weights, eta


@dataclass(frozen=True, eq=False)
class MonotoneMixturePair:
    """A pair (P, Q) of unit-variance Gaussian mixtures with a monotone likelihood ratio.

    Args:
        means: non-negative component means mu_i / sigma (already divided by the noise multiplier).
        weights: component weights p_i (non-negative, summing to 1 up to rounding).
        opposed: ``False`` for P = MoG(mu, p) vs Q = N(0, 1); ``True`` for P = MoG(-mu, p) vs Q = MoG(mu, p).
        component_truncation: total weight of negligible components that may be dropped (added back as a
            worst case; see module docstring).
    """

    means: np.ndarray
    weights: np.ndarray
    opposed: bool
    component_truncation: float = 1e-17

    def __post_init__(self) -> None:
        means = np.asarray(self.means, dtype=np.float64).ravel()
        weights = np.asarray(self.weights, dtype=np.float64).ravel()
        if means.shape != weights.shape or means.size == 0:
            raise ValueError("means and weights must be non-empty and of equal length")
        if np.any(means < 0) or not np.all(np.isfinite(means)):
            raise ValueError("means must be finite and non-negative")
        if np.any(weights < 0) or abs(weights.sum() - 1.0) > 1e-9:
            raise ValueError("weights must be non-negative and sum to 1")
        positive = weights > 0
        means, weights = means[positive], weights[positive] / weights[positive].sum()
        means, weights, eta = _truncate_components(means, weights, self.component_truncation)
        object.__setattr__(self, "means", means)
        object.__setattr__(self, "weights", weights)
        object.__setattr__(self, "_log_weights", np.log(weights))
        object.__setattr__(self, "dropped_mass", eta)
        object.__setattr__(self, "trivial", bool(np.all(means == 0)))

    # ------------------------------------------------------------------------------------------------
    # privacy loss l(x) = log dP/dQ (x) and its derivative
    # ------------------------------------------------------------------------------------------------
    def _loss_and_slope(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = self.means[None, :]
        base = self._log_weights[None, :] - 0.5 * m * m
        up = base + m * x[:, None]  # log p_i + m_i x - m_i^2/2   (P for mixture-vs-Gaussian, Q if opposed)
        lse_up, w_up = _lse_rows(up)
        soft_up = w_up @ self.means
        if not self.opposed:
            return lse_up, soft_up
        down = base - m * x[:, None]
        lse_down, w_down = _lse_rows(down)
        soft_down = w_down @ self.means
        return lse_down - lse_up, -(soft_up + soft_down)

    def loss(self, x: np.ndarray) -> np.ndarray:
        """Privacy loss log(dP/dQ)(x) at points x (in units of sigma)."""
        return self._loss_and_slope(np.atleast_1d(np.asarray(x, dtype=np.float64)))[0]

    def _bracket(self, target: float) -> tuple[float, float]:
        """An interval [lo, hi] whose losses enclose [0, target] (both families are unbounded above)."""
        increasing = not self.opposed
        m_max = float(self.means.max())
        step = max(1.0, m_max)
        lo, hi = -step, step
        for _ in range(200):
            l_lo, l_hi = self.loss(np.array([lo, hi]))
            low_ok = (l_lo <= 0.0) if increasing else (l_hi <= 0.0)
            high_ok = (l_hi >= target) if increasing else (l_lo >= target)
            if low_ok and high_ok:
                return lo, hi
            if increasing:
                lo = lo if low_ok else lo * 2.0
                hi = hi if high_ok else hi * 2.0
            else:
                hi = hi if low_ok else hi * 2.0
                lo = lo if high_ok else lo * 2.0
        raise RuntimeError("could not bracket the privacy-loss threshold")  # pragma: no cover

    def thresholds(self, log_alpha: np.ndarray) -> np.ndarray:
        """x*(alpha) solving log(dP/dQ)(x*) = log(alpha) for every entry (log_alpha >= 0)."""
        log_alpha = np.asarray(log_alpha, dtype=np.float64)
        target = float(log_alpha.max(initial=0.0))
        lo, hi = self._bracket(target)
        size = int(np.clip(log_alpha.size // 8, _MIN_TABLE_SIZE, _TABLE_SIZE))
        grid = np.linspace(lo, hi, size)
        table = self.loss(grid)
        if self.opposed:  # make the table increasing for interpolation
            grid, table = grid[::-1], table[::-1]
        table = np.maximum.accumulate(table)
        idx = np.clip(np.searchsorted(table, log_alpha, side="left"), 1, len(grid) - 1)
        left, right = grid[idx - 1], grid[idx]
        span = table[idx] - table[idx - 1]
        frac = np.where(span > 0, (log_alpha - table[idx - 1]) / np.where(span > 0, span, 1.0), 0.5)
        x = left + frac * (right - left)
        a, b = np.minimum(left, right), np.maximum(left, right)
        for _ in range(_NEWTON_STEPS):
            value, slope = self._loss_and_slope(x)
            safe = np.where(np.abs(slope) > 1e-300, slope, np.nan)
            x_new = x - (value - log_alpha) / safe
            x_new = np.where(np.isfinite(x_new), np.clip(x_new, a, b), x)
            step = np.max(np.abs(x_new - x), initial=0.0)
            x = x_new
            if step <= 1e-13 * max(1.0, float(np.max(np.abs(x), initial=0.0))):
                break
        return x

    def hockey_stick(self, log_alpha: np.ndarray) -> np.ndarray:
        """H_alpha(P || Q) for alpha = exp(log_alpha) >= 1, vectorised; includes the dropped mass eta."""
        log_alpha = np.atleast_1d(np.asarray(log_alpha, dtype=np.float64))
        if np.any(log_alpha < 0):
            raise ValueError("hockey_stick evaluates alpha >= 1 only (log_alpha >= 0)")
        out = np.empty_like(log_alpha)
        if self.trivial:
            out[:] = 0.0
        else:
            for start in range(0, log_alpha.size, _CHUNK):
                chunk = log_alpha[start : start + _CHUNK]
                out[start : start + _CHUNK] = self._hockey_stick_chunk(chunk)
        eta = self.dropped_mass
        return np.clip((1.0 - eta) * out + eta, 0.0, 1.0)

    def _hockey_stick_chunk(self, log_alpha: np.ndarray) -> np.ndarray:
        x = self.thresholds(log_alpha)[:, None]
        m = self.means[None, :]
        w = self.weights
        alpha = np.exp(log_alpha)
        if not self.opposed:
            # S = {x' > x*}:  sum_i p_i P(N(m_i,1) > x*) - alpha * P(N(0,1) > x*)
            p_mass = ndtr(m - x) @ w
            q_mass = ndtr(-x[:, 0])
        else:
            # S = {x' < x*}:  sum_i p_i P(N(-m_i,1) < x*) - alpha * sum_i p_i P(N(m_i,1) < x*)
            p_mass = ndtr(x + m) @ w
            q_mass = ndtr(x - m) @ w
        value = p_mass - alpha * q_mass
        # For large alpha, p_mass and alpha*q_mass are both tiny; recompute in log space where that is
        # more accurate than the direct difference.
        small = p_mass < 1e-8
        if np.any(small):
            xs = x[small]
            if not self.opposed:
                log_p = logsumexp(log_ndtr(m - xs) + self._log_weights[None, :], axis=1)
                log_q = log_ndtr(-xs[:, 0])
            else:
                log_p = logsumexp(log_ndtr(xs + m) + self._log_weights[None, :], axis=1)
                log_q = logsumexp(log_ndtr(xs - m) + self._log_weights[None, :], axis=1)
            log_ratio = np.minimum(log_alpha[small] + log_q - log_p, 0.0)  # log(alpha q / p) <= 0
            value[small] = np.exp(log_p) * -np.expm1(log_ratio)
        return np.maximum(value, 0.0)

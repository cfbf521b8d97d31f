"""Independent reference computations for the privacy tests.

Nothing here calls lightning_dpts: hockey-stick divergences come from adaptive quadrature of
max(p - alpha q, 0) (split at the sign changes found on a grid), and composed epsilons from a privacy-loss
distribution built in *x-space* ("privacy buckets": the P-mass of small x-intervals is put at the loss of
their midpoint, no threshold inversion, no profile, no connect-the-dots) and composed with numpy's FFT.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize
from scipy.special import logsumexp, ndtr
from scipy.stats import norm


def mixture_pdf(x: np.ndarray, means: np.ndarray, weights: np.ndarray, sigma: float) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    z = (x[..., None] - np.asarray(means, float)) / sigma
    return np.exp(-0.5 * z * z) @ np.asarray(weights, float) / (sigma * math.sqrt(2 * math.pi))


def mixture_logpdf(x: np.ndarray, means: np.ndarray, weights: np.ndarray, sigma: float) -> np.ndarray:
    x = np.asarray(x, dtype=float)[:, None]
    logs = np.log(np.asarray(weights, float))[None, :] + norm.logpdf(x, np.asarray(means, float)[None, :], sigma)
    return logsumexp(logs, axis=1)


def hockey_stick_quadrature(p_means, p_weights, q_means, q_weights, sigma: float, alpha: float) -> float:
    """H_alpha(P || Q) = int max(p(x) - alpha q(x), 0) dx by adaptive quadrature between sign changes."""
    p_means, q_means = np.asarray(p_means, float), np.asarray(q_means, float)
    lo = min(p_means.min(), q_means.min()) - 40 * sigma
    hi = max(p_means.max(), q_means.max()) + 40 * sigma

    def f(x):
        return mixture_pdf(x, p_means, p_weights, sigma) - alpha * mixture_pdf(x, q_means, q_weights, sigma)

    grid = np.linspace(lo, hi, 20001)
    values = f(grid)
    positive = values > 0
    roots = [optimize.brentq(f, grid[i], grid[i + 1], xtol=1e-14)
             for i in np.nonzero(positive[:-1] != positive[1:])[0]]
    edges = [lo, *roots, hi]
    total = 0.0
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        mid = 0.5 * (a + b)
        if f(mid) > 0:
            total += integrate.quad(f, a, b, limit=400, epsabs=1e-15, epsrel=1e-12)[0]
    return total


def switching_profile_quadrature(means, weights, sigma: float, alpha: float) -> float:
    """The switching profile: H_alpha(P||N(0,sigma)) for alpha >= 1, H_alpha(N(0,sigma)||P) below."""
    if alpha >= 1:
        return hockey_stick_quadrature(means, weights, [0.0], [1.0], sigma, alpha)
    return hockey_stick_quadrature([0.0], [1.0], means, weights, sigma, alpha)


def opposed_profile_quadrature(means, weights, sigma: float, alpha: float) -> float:
    """H_alpha(MoG(-mu, p) || MoG(mu, p)) for any alpha."""
    means = np.asarray(means, float)
    return hockey_stick_quadrature(-means, weights, means, weights, sigma, alpha)


# ----------------------------------------------------------------------------------------------------
# x-space privacy-loss distributions and FFT composition
# ----------------------------------------------------------------------------------------------------
class GridPLD:
    """A privacy-loss pmf on the grid ``offset + h * arange(n)`` plus a point mass at +infinity."""

    def __init__(self, h: float, offset: float, probs: np.ndarray, inf_mass: float = 0.0) -> None:
        self.h, self.offset, self.probs, self.inf_mass = h, offset, probs, inf_mass

    @property
    def losses(self) -> np.ndarray:
        return self.offset + self.h * np.arange(self.probs.size)

    def delta(self, eps: float) -> float:
        losses = self.losses
        sel = losses > eps
        return float(self.inf_mass + np.sum(-np.expm1(eps - losses[sel]) * self.probs[sel]))

    def epsilon(self, delta: float) -> float:
        if self.delta(0.0) <= delta:
            return 0.0
        hi = 1.0
        while self.delta(hi) > delta:
            hi *= 2
        return float(optimize.brentq(lambda e: self.delta(e) - delta, 0.0, hi, xtol=1e-10))

    def compose(self, n: int, width_sd: float = 60.0) -> GridPLD:
        """n-fold composition by FFT on a circular window centred on the composed mean."""
        p = self.probs / self.probs.sum()  # finite part, renormalised; infinite mass handled separately
        losses = self.losses
        mean = float(np.dot(p, losses))
        sd = math.sqrt(max(float(np.dot(p, (losses - mean) ** 2)), 1e-30))
        half = width_sd * math.sqrt(n) * sd + (losses[-1] - losses[0])
        size = int(2 ** math.ceil(math.log2(2 * half / self.h + p.size + 1)))
        shift = int(round(mean / self.h))  # recentre each step's pmf so the n-fold sum stays near 0
        centred_offset = self.offset - shift * self.h
        buf = np.zeros(size)
        start0 = int(round(centred_offset / self.h))  # index of the first loss in units of h
        idx = (start0 + np.arange(p.size)) % size
        np.add.at(buf, idx, p)
        composed = np.fft.irfft(np.fft.rfft(buf) ** n, size)
        composed = np.maximum(composed, 0.0)
        # Unwrap: index j corresponds to loss (j or j - size) * h; take the window [-size/2, size/2).
        j = np.arange(size)
        j = np.where(j >= size // 2, j - size, j)
        order = np.argsort(j)
        probs = composed[order]
        offset = j[order][0] * self.h + n * shift * self.h
        finite = 1.0 - self.inf_mass
        return GridPLD(self.h, offset, probs * finite**n, 1.0 - finite**n)


def _bucket(losses: np.ndarray, masses: np.ndarray, h: float) -> GridPLD:
    idx = np.rint(losses / h).astype(np.int64)
    lo = idx.min()
    probs = np.bincount(idx - lo, weights=masses)
    return GridPLD(h, lo * h, probs)


def _x_grid(means: np.ndarray, sigma: float, n: int = 2_000_001) -> np.ndarray:
    return np.linspace(-means.max() - 38 * sigma, means.max() + 38 * sigma, n)


def switching_pld(means, weights, sigma: float, h: float = 1e-4, n_x: int = 2_000_001) -> GridPLD:
    """PLD of the switching profile of MoG(means, weights, sigma) vs N(0, sigma).

    Positive losses are those of (P, N(0, sigma)) (they alone fix delta(eps) for eps >= 0); negative losses
    follow from the symmetry omega(-l) = e^{-l} omega(l) of a symmetric profile; the rest sits at 0.
    """
    means, weights = np.asarray(means, float), np.asarray(weights, float)
    x = _x_grid(means, sigma, n_x)
    edges_mass = sum(w * ndtr((x - m) / sigma) for m, w in zip(means, weights, strict=True))
    mass = np.diff(edges_mass)
    mid = 0.5 * (x[1:] + x[:-1])
    loss = mixture_logpdf(mid, means, weights, sigma) - norm.logpdf(mid, 0, sigma)
    pos = loss > 0
    grid = _bucket(loss[pos], mass[pos], h)
    keep = grid.losses > 0
    pos_losses, pos_probs = grid.losses[keep], grid.probs[keep]
    neg_probs = pos_probs * np.exp(-pos_losses)
    zero = max(0.0, 1.0 - pos_probs.sum() - neg_probs.sum())
    all_losses = np.concatenate([-pos_losses[::-1], [0.0], pos_losses])
    all_probs = np.concatenate([neg_probs[::-1], [zero], pos_probs])
    return _bucket(all_losses, all_probs, h)


def opposed_pld(means, weights, sigma: float, rho: float = 1.0, h: float = 1e-4,
                n_x: int = 2_000_001) -> GridPLD:
    """PLD of (1 - rho) * identity + rho * [MoG(-mu, p) vs MoG(mu, p)] (Theorems E.1/E.8/F.1/F.2)."""
    means, weights = np.asarray(means, float), np.asarray(weights, float)
    x = _x_grid(means, sigma, n_x)
    edges_mass = sum(w * ndtr((x + m) / sigma) for m, w in zip(means, weights, strict=True))
    mass = np.diff(edges_mass)
    mid = 0.5 * (x[1:] + x[:-1])
    loss = mixture_logpdf(mid, -means, weights, sigma) - mixture_logpdf(mid, means, weights, sigma)
    losses = np.concatenate([loss, [0.0]])
    masses = np.concatenate([rho * mass, [1.0 - rho]])
    return _bucket(losses, masses, h)


def gaussian_delta(eps: float, mu: float) -> float:
    """Closed-form delta(eps) of the Gaussian mechanism with sensitivity/sigma ratio mu."""
    return float(ndtr(-eps / mu + mu / 2) - math.exp(eps) * ndtr(-eps / mu - mu / 2))


def gaussian_epsilon(delta: float, mu: float) -> float:
    """Closed-form inverse of :func:`gaussian_delta`."""
    hi = 1.0
    while gaussian_delta(hi, mu) > delta:
        hi *= 2
    return float(optimize.brentq(lambda e: gaussian_delta(e, mu) - delta, 0.0, hi, xtol=1e-12))

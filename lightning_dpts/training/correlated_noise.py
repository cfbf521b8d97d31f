"""BandMF correlated noise: streaming rows of C^{-1} Z for a b-banded Toeplitz strategy C (Section 2.3).

DP-MF adds ``(C^{-1} Z)[i, :]`` to the summed clipped gradient of step i instead of the independent ``Z[i, :]``
(Dong & Ganesh 2026, Section 2.3; Choquette-Choo et al. 2024 for banded C). With C lower-triangular, b-banded and
Toeplitz with first column (c_0, ..., c_{b-1}), ``w = C^{-1} z`` is the solution of ``C w = z``, i.e.

    w_i = (z_i - sum_{j=1}^{b-1} c_j w_{i-j}) / c_0,

so the stream needs the b - 1 previous noise vectors: memory (b - 1) x (number of parameters) values of the noise
dtype (float32: 4 (b - 1) bytes per parameter), time O(b) per coordinate and step.

* :class:`BandMFNoise` has the interface of :class:`lightning_dpts.randomness.GaussianNoise` (``sample(numel, std,
  dtype)``, one call per optimizer step) and draws z from it (fresh OS entropy by default; ``secure=True`` draws from
  the OS CSPRNG). It has no ``state_dict`` and refuses pickling: nothing written reproduces the noise. A resumed run
  would build a new object, i.e. *restart the band* (and the b-min-sep sampler's history): that is a different
  mechanism than the one the Monte Carlo accountant analysed for the whole run, so BandMF runs are not resumable
  (documented in docs/bandmf.md; the strategy refuses to load a BandMF state).
* :func:`banded_sqrt_coefficients`: the default C: the first b coefficients of the square root of the prefix-sum
  matrix A (Toeplitz with entries binom(2k, k) / 4^k), column-normalised to unit L2 norm (Kalinin & Lampert 2024).
* :func:`prefix_sum_error` and :func:`optimize_coefficients`: the Section 2.3 utility measure ``||A C^{-1}||_F^2``
  per unit of sensitivity and its minimiser over non-negative banded Toeplitz C.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import optimize, signal

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import NOISE_SPECS, NoiseSpec
from lightning_dpts.privacy.montecarlo import banded_sqrt_coefficients, check_coefficients
from lightning_dpts.randomness import Entropy, GaussianNoise

if TYPE_CHECKING:
    import torch

__all__ = [
    "NOISE_KINDS",
    "BandMFNoise",
    "CoefficientOptimisation",
    "banded_sqrt_coefficients",
    "inverse_coefficients",
    "make_noise",
    "optimize_coefficients",
    "prefix_sum_error",
]


def inverse_coefficients(coefficients: Sequence[float] | np.ndarray, iterations: int) -> np.ndarray:
    """First column (d_0, ..., d_{n-1}) of C^{-1} for the lower-triangular Toeplitz C (C^{-1} is Toeplitz too)."""
    c = check_coefficients(coefficients)
    impulse = np.zeros(int(iterations))
    impulse[0] = 1.0
    return signal.lfilter([1.0], c, impulse)


def prefix_sum_error(coefficients: Sequence[float] | np.ndarray, iterations: int) -> float:
    """Section 2.3's prefix-sum error per unit noise and unit sensitivity: ||c||_2^2 ||A C^{-1}||_F^2 / n.

    A C^{-1} is lower-triangular Toeplitz with first column e = cumsum(d), so ||A C^{-1}||_F^2 = sum_k (n - k) e_k^2.
    Under b-min-sep every participation has its own columns, so sensitivity^2 = k ||c||^2 for k participations: the
    factor k is the same for every C and is left out; ||c||^2 makes the value invariant to scaling C. Divided by n
    it is the mean squared error of the n prefix sums (noise multiplier 1). C = I gives (n + 1) / 2.
    """
    c = check_coefficients(coefficients)
    n = int(iterations)
    e = np.cumsum(inverse_coefficients(c, n))
    return float(np.dot(c, c) * np.dot(n - np.arange(n), e * e) / n)


def _objective_and_gradient(c: np.ndarray, n: int) -> tuple[float, np.ndarray]:
    """prefix_sum_error and its exact gradient (adjoint of the triangular solve), O(n b)."""
    weights = (n - np.arange(n)) / n
    d = signal.lfilter([1.0], c, np.r_[1.0, np.zeros(n - 1)])
    e = np.cumsum(d)
    g = float(np.dot(weights, e * e))
    # dg/dd_m = sum_{k >= m} 2 w_k e_k (reverse cumulative sum); dd/dc_j = -C^{-1} S_j d (S_j: shift down by j)
    u = np.cumsum((2 * weights * e)[::-1])[::-1]
    lam = signal.lfilter([1.0], c, u[::-1])[::-1]  # C^{-T} u (C^T is upper-triangular Toeplitz)
    grad_g = np.array([-np.dot(lam[j:], d[: n - j]) for j in range(c.size)])
    norm2 = float(np.dot(c, c))
    return norm2 * g, norm2 * grad_g + 2 * c * g


@dataclass(frozen=True)
class CoefficientOptimisation:
    """Result of :func:`optimize_coefficients`: coefficients (unit L2 norm), the objective before/after, the cost."""

    coefficients: np.ndarray
    error: float
    initial_error: float
    seconds: float
    iterations: int


def optimize_coefficients(
    bands: int,
    iterations: int,
    participations: int = 1,
    *,
    participation_every: int | None = None,
    initial: Sequence[float] | None = None,
    max_iterations: int = 500,
) -> CoefficientOptimisation:
    """Minimise the Section 2.3 prefix-sum error over non-negative b-banded Toeplitz C (L-BFGS-B, exact gradient).

    Args:
        bands: b >= 1.
        iterations: n, the number of steps of the run (the objective depends on it).
        participations: k >= 1, the most participations of an example (e.g. ceil(n/b) under b-min-sep). Under the
            b-min-sep property the sensitivity is sqrt(k) ||c||_2 for every C, so k scales the objective and does not
            move the minimiser; it is accepted for completeness and reported in ``error``.
        participation_every: K >= b for cyclic Poisson sampling in K groups (amplified BandMF): an example takes
            part at most every K steps, ceil(n / K) times, in disjoint rows of C, so the multi-participation
            sensitivity is sqrt(ceil(n / K)) ||c||_2 for *every* b-banded C: the objective is the one above with
            ``participations = ceil(n / K)``, and its minimiser is the single-participation one (Choquette-Choo et
            al. 2023 optimise the same objective for b <= K). K < b is refused (participations would share rows).
        initial: starting point (default :func:`banded_sqrt_coefficients`).
        max_iterations: L-BFGS-B iteration cap.

    Returns:
        The minimiser scaled to unit L2 norm, its error (times k) and the start's, wall time in seconds (the cost:
        O(n b) per evaluation), and the optimiser's iteration count.
    """
    b = int(bands)
    if b < 1:
        raise ConfigurationError("bands", bands, "must be an integer >= 1")
    n = int(iterations)
    if n < 1:
        raise ConfigurationError("iterations", iterations, "must be an integer >= 1")
    k = int(participations)
    if k < 1:
        raise ConfigurationError("participations", participations, "must be an integer >= 1")
    if participation_every is not None:
        every = int(participation_every)
        if every < b:
            raise ConfigurationError("participation_every", participation_every, f"must be >= bands={b}: two "
                                     "participations fewer than b steps apart share rows of C (docs/bandmf.md)")
        k = -(-n // every)
    x0 = banded_sqrt_coefficients(b) if initial is None else check_coefficients(initial, b)
    start = time.perf_counter()
    initial_error = _objective_and_gradient(x0, n)[0]
    res = optimize.minimize(lambda x: _objective_and_gradient(x, n), x0, jac=True, method="L-BFGS-B",
                            bounds=[(1e-6, None)] + [(0.0, None)] * (b - 1),
                            options={"maxiter": int(max_iterations)})
    seconds = time.perf_counter() - start
    c = np.asarray(res.x, dtype=np.float64)
    c = c / np.linalg.norm(c)
    error = _objective_and_gradient(c, n)[0]
    if error > initial_error:  # never return something worse than the start
        c, error = x0 / np.linalg.norm(x0), initial_error
    return CoefficientOptimisation(c, k * error, k * initial_error, seconds, int(res.nit))


class BandMFNoise:
    """Streaming BandMF noise: the i-th call returns row i of C^{-1} Z (times ``std``), Z i.i.d. N(0, 1).

    Args:
        entropy: the run's :class:`~lightning_dpts.randomness.Entropy` (fresh OS entropy unless seeded).
        coefficients: (c_0, ..., c_{b-1}) of the b-banded Toeplitz C (default: ``banded_sqrt_coefficients``).
        secure: draw z from the OS CSPRNG (:class:`~lightning_dpts.randomness.GaussianNoise` secure mode).
        stream: stream key under ``entropy`` (distinct from the sampler's streams).

    The object keeps the b - 1 previous rows (the band's memory). It has no ``state_dict`` and cannot be pickled:
    nothing it writes reproduces the noise, and it cannot be resumed (a new object restarts the band).
    """

    def __init__(self, entropy: Entropy, coefficients: Sequence[float] | np.ndarray, *, secure: bool = False,
                 stream: tuple[int, ...] = (8,)) -> None:
        self.coefficients = check_coefficients(coefficients)
        self._gaussian = GaussianNoise(entropy, secure=secure, stream=stream)
        self.secure = self._gaussian.secure
        self.seeded = self._gaussian.seeded
        self._history: list[torch.Tensor] = []  # most recent first, at most b - 1 unit-variance rows
        self._numel: int | None = None
        self.steps = 0

    @property
    def bands(self) -> int:
        """b."""
        return int(self.coefficients.size)

    def memory_bytes(self) -> int:
        """Bytes held by the band's buffer now: (b - 1) rows of the last numel and dtype at most."""
        return int(sum(t.numel() * t.element_size() for t in self._history))

    def sample(self, numel: int, std: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Row ``self.steps`` of C^{-1} Z times ``std``: flat CPU tensor of ``numel`` values (one call per step)."""
        import torch

        dtype = torch.float32 if dtype is None else dtype
        if self._numel is None:
            self._numel = int(numel)
        elif int(numel) != self._numel:
            raise ConfigurationError("numel", numel, f"must stay {self._numel} for the whole run (one noise stream)")
        z = self._gaussian.sample(numel, 1.0, dtype)
        c = self.coefficients
        for j, past in enumerate(self._history, start=1):
            if c[j] != 0.0:
                z.sub_(past, alpha=float(c[j]))
        w = z.div_(float(c[0])) if c[0] != 1.0 else z
        if self.bands > 1:
            self._history.insert(0, w.clone())
            del self._history[self.bands - 1:]
        self.steps += 1
        return w * float(std) if std != 1.0 else w.clone()

    def prepare(self, numel: int, std: float, dtype: torch.dtype | None = None) -> None:
        """Start drawing the next step's z in the background (:meth:`GaussianNoise.prepare`; the band's arithmetic
        stays in :meth:`sample`)."""
        self._gaussian.prepare(numel, 1.0, dtype)

    def close(self) -> None:
        """End the background thread (:meth:`GaussianNoise.close`)."""
        self._gaussian.close()

    def __reduce__(self) -> Any:
        raise TypeError("lightning_dpts BandMFNoise must not be pickled (it would write the secret noise history)")

    def __repr__(self) -> str:
        return f"BandMFNoise(bands={self.bands}, secure={self.secure}, steps={self.steps})"


#: Noise kinds the strategy's noise seam accepts.
NOISE_KINDS: tuple[str, ...] = tuple(NOISE_SPECS)


def make_noise(
    kind: str | NoiseSpec,
    entropy: Entropy,
    *,
    secure: bool = False,
    bands: int | None = None,
    coefficients: Sequence[float] | np.ndarray | None = None,
) -> GaussianNoise | BandMFNoise:
    """The noise object of a DP run: the one call the strategy's noise seam needs.

    ``"gaussian"``: :class:`~lightning_dpts.randomness.GaussianNoise` (DP-SGD; ``bands``/``coefficients`` must be
    unset or b = 1). ``"bandmf"``: :class:`BandMFNoise` with ``coefficients`` (length b) or, if omitted, the default
    :func:`banded_sqrt_coefficients` of ``bands``. Both have ``sample(numel, std, dtype)``, called once per step.
    ``kind`` may be the noise object (:class:`~lightning_dpts.privacy.mechanisms.NoiseSpec`; its ``bands`` is the
    default of ``bands``): the generator is chosen by its ``correlated`` capability, not by its name.
    """
    if isinstance(kind, NoiseSpec):
        noise = kind
        if bands is None and coefficients is None:
            bands = noise.bands
    elif kind in NOISE_KINDS:
        noise = NOISE_SPECS[kind]()
    else:
        raise ConfigurationError("noise", kind, f"must be one of {NOISE_KINDS}")
    if not noise.correlated:
        if coefficients is not None or (bands is not None and bands != 1):
            raise ConfigurationError("bands", bands, "only noise='bandmf' takes bands/coefficients")
        return GaussianNoise(entropy, secure=secure)
    if coefficients is None:
        if bands is None:
            raise ConfigurationError("bands", bands, "noise='bandmf' needs bands (or coefficients)")
        coefficients = banded_sqrt_coefficients(bands)
    c = check_coefficients(coefficients, bands)
    return BandMFNoise(entropy, c, secure=secure)

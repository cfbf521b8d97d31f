"""The rule-based generator of PETS Eq. 2: trend + seasonality + local events + noise, vectorised.

    G(theta) = f_trend(theta_tr) + f_seasonal(theta_seas) + f_local(theta_loc) + eta        (PETS Eq. 2)

Every attribute theta is drawn at random per series: a linear or exponential trend of random slope, one or two
seasonal components of random shape (sine, square, triangle, sawtooth), period, amplitude and phase, a few
spikes and level shifts at random positions, and Gaussian noise of random scale. The output is public by
construction (it never reads data), which is why PETS may use it both as the initial population S_0 of
Algorithm 1 and as the default public pretraining set of the VAE and the encoders.
"""

from __future__ import annotations

import numpy as np

from lightning_dpts.errors import ConfigurationError

__all__ = ["SEASONAL_SHAPES", "generate_series", "standardize_windows"]

#: The seasonal shapes f_seasonal draws from (PETS Section 3, "sine/square/triangle"; sawtooth added).
SEASONAL_SHAPES: tuple[str, ...] = ("sine", "square", "triangle", "sawtooth")


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigurationError(name, value, "must be an integer >= 1")
    return int(value)


def _wave(phase: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Periodic waves of period 1 in ``phase`` (cycles), amplitude 1, one shape code per row."""
    frac = phase - np.floor(phase)
    sine = np.sin(2.0 * np.pi * phase)
    square = np.where(frac < 0.5, 1.0, -1.0)
    triangle = 4.0 * np.abs(frac - 0.5) - 1.0
    sawtooth = 2.0 * frac - 1.0
    waves = np.stack([sine, square, triangle, sawtooth])  # [4, n, L]
    return np.take_along_axis(waves, shape[None, :, None].repeat(phase.shape[1], axis=2), axis=0)[0]


def generate_series(num_series: int, length: int, rng: np.random.Generator,
                    standardize: bool = True) -> np.ndarray:
    """``num_series`` random series of ``length`` steps from Eq. 2, as an array ``[num_series, length]``.

    Args:
        num_series: how many series (>= 1).
        length: time steps per series (>= 2).
        rng: the numpy generator the attributes come from. Public randomness: the generator reads no data,
            so a fixed generator is fine for tests and for the public pretraining set.
        standardize: z-score every series over its own time steps (the scale PETS votes in).
    """
    n = _check_positive_int("num_series", num_series)
    length = _check_positive_int("length", length)
    if length < 2:
        raise ConfigurationError("length", length, "must be an integer >= 2")
    t = np.arange(length, dtype=np.float64)[None, :] / length  # [1, L], in units of the window

    # f_trend: linear (a t) or exponential (a (e^{b t} - 1) / b), random sign and strength.
    slope = rng.normal(0.0, 1.5, size=(n, 1))
    growth = rng.uniform(-3.0, 3.0, size=(n, 1))
    exponential = rng.random((n, 1)) < 0.3
    safe_growth = np.where(np.abs(growth) < 1e-3, 1e-3, growth)
    trend = np.where(exponential, slope * np.expm1(safe_growth * t) / safe_growth, slope * t)

    # f_seasonal: two components with random shape, period (2 .. L/2 steps), amplitude and phase.
    seasonal = np.zeros((n, length))
    for component in range(2):
        shape = rng.integers(0, len(SEASONAL_SHAPES), size=n)
        period = rng.uniform(2.0, max(2.0, length / 2.0), size=(n, 1))  # in steps
        amplitude = rng.gamma(2.0, 0.5, size=(n, 1)) * (1.0 if component == 0 else 0.5)
        present = (rng.random((n, 1)) < (0.9 if component == 0 else 0.4)).astype(np.float64)
        phase = np.arange(length)[None, :] / period + rng.random((n, 1))
        seasonal += present * amplitude * _wave(phase, shape)

    # f_local: up to 3 spikes (one step) and up to 2 level shifts (a step change from a random position on).
    local = np.zeros((n, length))
    rows = np.arange(n)
    for _ in range(3):
        present = rng.random(n) < 0.3
        where = rng.integers(0, length, size=n)
        height = rng.normal(0.0, 3.0, size=n)
        local[rows[present], where[present]] += height[present]
    for _ in range(2):
        present = (rng.random((n, 1)) < 0.25).astype(np.float64)
        where = rng.integers(1, length, size=(n, 1))
        size = rng.normal(0.0, 1.5, size=(n, 1))
        local += present * size * (np.arange(length)[None, :] >= where)

    # eta: Gaussian noise with a random scale per series.
    noise = rng.gamma(2.0, 0.1, size=(n, 1)) * rng.standard_normal((n, length))
    out = trend + seasonal + local + noise
    return standardize_windows(out) if standardize else out


def standardize_windows(x: np.ndarray, min_std: float = 1e-6) -> np.ndarray:
    """Z-score every row over its own time steps (no statistic crosses rows, so no unit affects another).

    Rows that are (numerically) constant become zeros.
    """
    x = np.asarray(x, dtype=np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, keepdims=True)
    return np.where(std > min_std, (x - mean) / np.maximum(std, min_std), 0.0)

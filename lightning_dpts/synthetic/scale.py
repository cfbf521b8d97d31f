"""The scale and time stamps of a ``dpts synth`` release: public or DP statistics only.

Private Evolution votes with windows z-scored per window, so the synthetic windows come out standardised
(mean 0, std 1). Writing them in the data's units needs a level and a spread, and both are statistics of the
private data: :func:`dp_scale` releases them with the Gaussian mechanism, given value bounds the user declares
public (``--value-range LO HI``), as one more round accounted with the vote rounds.

The scale round (one Gaussian mechanism, same noise multiplier sigma and noise std ``sigma * Delta(relation)``
as a vote round of Algorithm 2): every private window w of a unit adds ``weight_w * (a_w, b_w, 1) / sqrt(3)``
to a sum of 3 coordinates, where ``a_w = (clip(mean_w, LO, HI) - LO) / (HI - LO)`` in [0, 1] and
``b_w = clip(std_w, 0, (HI - LO) / 2) / (HI - LO)`` in [0, 1/2], with the vote weights (1/m per window for
series-level privacy, at most m windows; 1 for window-level). One unit moves the sum by at most
``sqrt(1 + 1/4 + 1) / sqrt(3) < 1`` in L2 under add/remove and ``sqrt(1 + 1/4) / sqrt(3) < 1`` under
substitution (the count coordinate cancels), at most the vote histogram's sensitivity Delta (1, resp. sqrt 2;
:func:`~lightning_dpts.synthetic.privacy.sensitivity`). Its privacy loss is therefore dominated by one vote
round's, and ``iterations + 1`` rounds of :class:`~lightning_dpts.synthetic.privacy.PETSAccountant` (PLD
composition; PETS Theorem 2 for the closed form) account the whole release. Level = LO + (HI - LO) * A / C and
spread = (HI - LO) * B / C from the noisy sums (post-processing, clipped to the declared bounds).

Without ``--value-range`` nothing about the scale is released: the values stay standardised and the terminal
and ``report.json`` say so and why. The time stamps start at ``--start`` (a date the user declares public) or at
the public placeholder 2000-01-01: the data's own dates are private (under add/remove, the first or last date
of the data can name a series) and are never written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import GaussianNoise
from lightning_dpts.synthetic.privacy import sensitivity

__all__ = ["DEFAULT_START", "STANDARDISED_WHY", "DPScale", "check_value_range", "dp_scale", "scale_sums"]

#: the public placeholder start of the synthetic windows' time stamps when ``--start`` is not given
DEFAULT_START = "2000-01-01"
#: why a release without ``--value-range`` stays standardised (terminal and report.json)
STANDARDISED_WHY = (
    "values are standardised (every window mean 0, std 1): the data's level and spread are statistics of the "
    "private data, released only with DP, which needs value bounds you declare public: pass --value-range LO HI "
    "(one more noisy round, accounted in epsilon)")
#: stream key of the scale round's noise under the run's Entropy (independent of the vote noise, key 14)
_STREAM_SCALE = 15


def check_value_range(value_range: object) -> tuple[float, float] | None:
    """``None``, or (LO, HI) as floats with LO < HI, both finite; anything else raises ConfigurationError."""
    if value_range is None:
        return None
    try:
        lo, hi = (float(v) for v in value_range)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ConfigurationError("value_range", value_range, "must be two numbers LO HI (declared public)") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigurationError("value_range", value_range, "must be two finite numbers LO < HI")
    return lo, hi


@dataclass(frozen=True)
class DPScale:
    """A DP level and spread [data units] and how they were released (public: written to report.json)."""

    level: float
    spread: float
    value_range: tuple[float, float]

    def apply(self, standardised: np.ndarray) -> np.ndarray:
        """The windows in the data's units: ``standardised * spread + level`` (post-processing)."""
        return np.asarray(standardised, dtype=np.float64) * self.spread + self.level


def scale_sums(means: np.ndarray, stds: np.ndarray, weights: np.ndarray,
               value_range: tuple[float, float]) -> np.ndarray:
    """The scale round's clean sum ``sum_w weight_w * (a_w, b_w, 1) / sqrt(3)`` (module docstring), shape ``[3]``."""
    lo, hi = value_range
    width = hi - lo
    a = (np.clip(np.asarray(means, dtype=np.float64), lo, hi) - lo) / width
    b = np.clip(np.asarray(stds, dtype=np.float64), 0.0, width / 2.0) / width
    w = np.asarray(weights, dtype=np.float64)
    return np.array([(w * a).sum(), (w * b).sum(), w.sum()]) / math.sqrt(3.0)


def dp_scale(means: np.ndarray, stds: np.ndarray, weights: np.ndarray, value_range: tuple[float, float], *,
             noise: GaussianNoise, noise_multiplier: float, relation: str) -> DPScale:
    """The scale round (module docstring): the noisy weighted sums of the clipped window means, stds and counts.

    Args:
        means, stds: ``[n]`` raw mean and std of every private window (private; never written).
        weights: ``[n]`` their vote weights (1/m or 1), as in Algorithm 2.
        value_range: (LO, HI), declared public.
        noise: the run's secret noise source (its own stream).
        noise_multiplier: sigma, the vote rounds' (noise std ``sigma * sensitivity(relation)``).
        relation: the neighbouring relation in force.
    """
    lo, hi = value_range
    width = hi - lo
    clean = scale_sums(means, stds, weights, value_range)
    std = float(noise_multiplier) * sensitivity(relation)
    noisy = (clean + noise.sample(3, std, torch.float64).numpy()) * math.sqrt(3.0)
    count = max(float(noisy[2]), 1.0)
    level = lo + width * float(np.clip(noisy[0] / count, 0.0, 1.0))
    spread = width * float(np.clip(noisy[1] / count, 1e-6, 0.5))
    return DPScale(level=level, spread=spread, value_range=(lo, hi))

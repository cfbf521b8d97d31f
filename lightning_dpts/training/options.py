"""The argument checks of :class:`~lightning_dpts.training.DPForecastStrategy`'s constructor.

Each function refuses a value outside its documented range with a :class:`~lightning_dpts.errors.ConfigurationError`
naming the argument, and returns the normalised value; the strategy calls them in the order of its arguments'
documentation, so that the first invalid argument is the one named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import NOISE_SPECS
from lightning_dpts.randomness import resolve_entropy
from lightning_dpts.training.correlated_noise import NOISE_KINDS, banded_sqrt_coefficients, check_coefficients

__all__ = [
    "PER_WINDOW_MODES", "calibrated_noise_multiplier", "check_independence_options", "check_noise",
    "check_sigma_or_target", "check_step_options", "lambda_from_spec", "positive",
]

#: ``per_window`` values: how each window's gradient is computed (see :class:`DPForecastStrategy`)
PER_WINDOW_MODES = ("auto", "fast", "isolated")


def positive(name: str, value: object) -> float:
    """``value`` as a float, if it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(name, value, "must be a finite number > 0")
    return float(value)


def check_noise(noise: str, bands: int | None, coefficients: Sequence[float] | None) -> tuple[float, ...] | None:
    """The BandMF coefficients (c_0, ..., c_{b-1}) for ``noise="bandmf"`` (the banded square root's for ``bands``
    unless given), ``None`` for ``noise="gaussian"`` (which takes no bands or coefficients)."""
    if noise not in NOISE_KINDS:
        raise ConfigurationError("noise", noise, f"must be one of {', '.join(repr(k) for k in NOISE_KINDS)}")
    if NOISE_SPECS[noise].correlated:
        if coefficients is None:
            if isinstance(bands, bool) or not isinstance(bands, int) or bands < 1:
                raise ConfigurationError("bands", bands, "noise='bandmf' needs bands: an integer >= 1")
            c = banded_sqrt_coefficients(bands)
        else:
            c = check_coefficients(coefficients, bands)
        return tuple(float(v) for v in c)
    if bands not in (None, 1) or coefficients is not None:
        raise ConfigurationError("bands", bands, "bands/coefficients are only for noise='bandmf'")
    return None


def check_sigma_or_target(
    noise_multiplier: float | None, target_epsilon: float | None, target_delta: float | None, epochs: int | None
) -> float | None:
    """Exactly one of ``noise_multiplier`` or the target triple; returns sigma (``None``: calibrated at setup)."""
    target = (target_epsilon, target_delta, epochs)
    if noise_multiplier is not None:
        if any(t is not None for t in target):
            raise ConfigurationError(
                "noise_multiplier", noise_multiplier,
                "give either noise_multiplier or (target_epsilon, target_delta, epochs), not both",
            )
        return positive("noise_multiplier", noise_multiplier)
    if any(t is None for t in target):
        raise ConfigurationError(
            "noise_multiplier", None,
            "give noise_multiplier, or all of target_epsilon, target_delta and epochs to calibrate it",
        )
    positive("target_epsilon", target_epsilon)
    if not (isinstance(target_delta, float) and 0 < target_delta < 1):
        raise ConfigurationError("target_delta", target_delta, "must lie strictly between 0 and 1")
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ConfigurationError("epochs", epochs, "must be an integer >= 1")
    return None


def check_independence_options(
    seed: int | None, secure_mode: bool, check_independence: bool, per_window: str, spot_check: float
) -> float:
    """The noise source's and the independence checks' switches; returns ``spot_check`` as a float."""
    if seed is not None:
        resolve_entropy(seed, "seed")  # validates; the entropy itself is drawn at every fit start
    if not isinstance(secure_mode, bool):
        raise ConfigurationError("secure_mode", secure_mode, "must be True or False")
    if secure_mode and seed is not None:
        raise ConfigurationError(
            "secure_mode", True, "draws from the operating system's CSPRNG and cannot be seeded; use seed=None"
        )
    if not isinstance(check_independence, bool):
        raise ConfigurationError("check_independence", check_independence, "must be True or False")
    if per_window not in PER_WINDOW_MODES:
        raise ConfigurationError(
            "per_window", per_window, f"must be one of {', '.join(repr(m) for m in PER_WINDOW_MODES)}"
        )
    if (isinstance(spot_check, bool) or not isinstance(spot_check, (int, float))
            or not 0.0 <= float(spot_check) <= 1.0):
        raise ConfigurationError("spot_check", spot_check, "must be a probability in [0, 1]")
    return float(spot_check)


def check_step_options(
    expected_batch_size: int | None, loss_reduction: str, scaler_default_scale: float, data_dependent_schedulers: str
) -> float:
    """Lambda (if given), the loss reduction, the scaler's default scale and the scheduler policy; returns the
    default scale as a float."""
    if expected_batch_size is not None and (
        isinstance(expected_batch_size, bool) or not isinstance(expected_batch_size, int) or expected_batch_size < 1
    ):
        raise ConfigurationError("expected_batch_size", expected_batch_size, "must be an integer >= 1")
    if loss_reduction not in ("mean", "sum"):
        raise ConfigurationError("loss_reduction", loss_reduction, "must be 'mean' or 'sum'")
    scale = positive("scaler_default_scale", scaler_default_scale)
    if data_dependent_schedulers not in ("disable", "error"):
        raise ConfigurationError("data_dependent_schedulers", data_dependent_schedulers,
                                 "must be 'disable' or 'error'")
    return scale


def lambda_from_spec(spec: Any, given: int | None) -> int:
    """Lambda, the expected batch size: the sampling spec's ``batch_size`` (``given`` must then be ``None`` or equal
    to it), else ``given`` (a datamodule without a ``sampling_spec``)."""
    if spec is not None:
        if given is not None and given != spec.batch_size:
            raise ConfigurationError(
                "expected_batch_size", given,
                f"must equal the datamodule's sampling_spec.batch_size={spec.batch_size} (or be omitted)",
            )
        return int(spec.batch_size)
    if given is not None:
        return given
    raise ConfigurationError(
        "expected_batch_size", None,
        "the datamodule has no sampling_spec; use a StructuredSubsamplingDataModule or give Lambda",
    )


def calibrated_noise_multiplier(spec: Any, target_epsilon: float | None, target_delta: float | None,
                                epochs: int | None, noise_spec: Any, coefficients: Sequence[float] | None) -> float:
    """sigma that reaches (``target_epsilon``, ``target_delta``) after ``epochs`` epochs of ``spec``
    (:func:`~lightning_dpts.privacy.calibrate_noise_multiplier`, PLD accounting; BandMF through its coefficients).
    b-min-sep sampling needs the Monte Carlo calibration, and no spec no calibration: both refused, naming the fix."""
    from lightning.pytorch.utilities import rank_zero_info

    from lightning_dpts.privacy.accountant import calibrate_noise_multiplier

    if spec is not None and spec.top_level_scheme.needs_monte_carlo:
        raise ConfigurationError(
            "target_epsilon", target_epsilon,
            "calibrating sigma for b_min_sep sampling needs the Monte Carlo accountant: compute sigma with "
            "lightning_dpts.privacy.montecarlo.calibrate_noise_multiplier_monte_carlo (Algorithm 5) and "
            "pass it as noise_multiplier",
        )
    if spec is None:
        raise ConfigurationError(
            "target_epsilon", target_epsilon,
            "calibrating sigma needs a datamodule with a sampling_spec; give noise_multiplier instead",
        )
    sigma = calibrate_noise_multiplier(
        spec, float(target_epsilon), float(target_delta), epochs=epochs,  # type: ignore[arg-type]
        coefficients=coefficients if noise_spec.correlated else None,
    )
    rank_zero_info(f"DPForecastStrategy: noise_multiplier={sigma:.4g} reaches epsilon={target_epsilon} at "
                   f"delta={target_delta} after {epochs} epochs")
    return sigma

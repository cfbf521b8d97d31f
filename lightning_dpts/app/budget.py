"""The privacy budget of a ``dpts fit`` run, settled before anything is written: the noise multiplier (given,
checked to allow a step, or calibrated), the cost of DeepAR's lags, and the BandMF (``--bands``) verification;
then the strategy and accountant callbacks that spend it."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from lightning_dpts.app.config import FitConfig
from lightning_dpts.errors import ConfigurationError

__all__ = ["bandmf_callbacks", "check_one_step", "cyclic_bandmf", "dp_callbacks", "lag_cost", "noise_multiplier"]


def lag_cost(spec: Any, context_length: int, epsilon: float, delta: float, epochs: int,
              sigma: float | None) -> str | None:
    """A warning when the lags make one window span every window start of the shortest series.

    Theorem 4.4's bottom-level rate (with replacement) is r = min(1, (L_C + L_F) / T) per protected step: once
    the window P + L_F (P = L_C + lags) reaches T, r = 1 and subsampling windows amplifies nothing. The cost is
    stated with the accountant: the noise multiplier needed for (epsilon, delta) in ``epochs`` epochs with and
    without the lags (or, for a given sigma, epsilon after those steps).
    """
    from dataclasses import replace

    from lightning_dpts.data.model_checks import lag_amplification_warning
    from lightning_dpts.privacy import StructuredSubsamplingAccountant, calibrate_noise_multiplier

    lead = lag_amplification_warning(spec, context_length)
    if lead is None:
        return None
    bare = replace(spec, context_length=context_length)
    fix = "; pass --max-lag (FitConfig.max_lag), e.g. the seasonal period, to cap the lags"
    try:
        if sigma is None:
            with_lags = calibrate_noise_multiplier(spec, epsilon, delta, epochs=epochs)
            without = calibrate_noise_multiplier(bare, epsilon, delta, epochs=epochs)
            return f"{lead}. Noise multiplier for epsilon={epsilon:g}: {with_lags:.3g} with, {without:.3g} without{fix}"
        steps = epochs * spec.steps_per_epoch
        e_with = StructuredSubsamplingAccountant(spec, sigma).epsilon(steps, delta)
        e_without = StructuredSubsamplingAccountant(bare, sigma).epsilon(steps, delta)
        return (f"{lead}. Epsilon after {steps} steps at sigma={sigma:g}: {e_with:.3g} with, {e_without:.3g} "
                f"without{fix}")
    except ConfigurationError:
        return f"{lead}{fix}"


def bandmf_callbacks(config: FitConfig, spec: Any, progress: Callable[[str], None]) -> tuple[Any, Any]:
    """Strategy and accountant of a ``bands`` run, after verifying the planned run's budget (nothing is written).

    The planned run is ``epochs`` x ``spec.steps_per_epoch`` optimizer steps. C: the coefficients that
    :func:`~lightning_dpts.training.correlated_noise.optimize_coefficients` gives for b bands and those steps (b = 1:
    Gaussian noise, C = I). The check is the one :class:`~lightning_dpts.training.AccountantCallback` repeats with
    its own fresh samples before the first step (series-level substitution epsilon, Monte Carlo + EVR); both use
    ``monte_carlo_samples`` samples per direction.
    """
    from lightning_dpts.privacy.montecarlo import overall_delta, samples_for_target_delta
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy
    from lightning_dpts.training.correlated_noise import optimize_coefficients

    b, sigma, samples = int(config.bands), float(config.noise_multiplier), config.monte_carlo_samples
    steps = config.epochs * spec.steps_per_epoch
    if 2.0 * overall_delta(samples, 0.0) > config.delta:  # (1 + e^eps') d(eps') >= 2 x the EVR floor for every eps'
        need = samples_for_target_delta(config.delta / (1.0 + math.exp(config.epsilon / 2)))
        raise ConfigurationError(
            "delta", config.delta,
            f"cannot be verified with --monte-carlo-samples={samples} (the Monte Carlo accountant's EVR bound is "
            f">= {overall_delta(samples, 0.0):.3g} per direction and series-level substitution doubles it at best): "
            f"raise --delta or raise --monte-carlo-samples (about {need} for this epsilon)")
    if b == 1:
        strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                      secure_mode=config.secure_mode)
    else:
        coefficients = tuple(float(v) for v in optimize_coefficients(b, steps).coefficients)
        strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                      secure_mode=config.secure_mode, noise="bandmf", coefficients=coefficients)
    accountant = AccountantCallback(epsilon=config.epsilon, delta=config.delta, monte_carlo_samples=samples)
    progress(f"Monte Carlo accounting of the planned {steps} steps (bands={b}, sigma={sigma:g}, {samples} samples "
             "per direction) ...")
    started = time.perf_counter()
    eps = accountant.build_monte_carlo(spec, strategy, sigma, steps).substitution_epsilon(steps, config.delta)
    if not eps <= config.epsilon:
        need = samples_for_target_delta(config.delta / (1.0 + math.exp(config.epsilon / 2)))
        raise ConfigurationError(
            "noise_multiplier", sigma,
            f"spends epsilon={eps:.4g} > the budget epsilon={config.epsilon:g} at delta={config.delta:g} in the "
            f"planned {steps} steps (Monte Carlo, EVR-verified, series-level substitution; inf: no epsilon verifies "
            f"with {samples} samples per direction): raise --noise-multiplier, lower --epochs or --batch-size, raise "
            f"--epsilon or --delta, or raise --monte-carlo-samples (about {need} samples let a run near the budget "
            "verify)")
    progress(f"verified: epsilon <= {eps:.4g} at delta={config.delta:g} ({time.perf_counter() - started:.1f} s; "
             "re-verified with fresh samples before the first step)")
    return strategy, accountant


def _round_up(x: float, digits: int = 4) -> str:
    """``x`` rounded *up* to ``digits`` significant digits (a threshold the user can type and that suffices)."""
    scale = 10.0 ** (math.floor(math.log10(abs(x))) - digits + 1)
    return f"{math.ceil(x / scale) * scale:.{digits}g}"


def check_one_step(spec: Any, sigma: float, epsilon: float, delta: float,
                   coefficients: tuple[float, ...] | None = None) -> None:
    """Refuse a given noise multiplier with which the budget allows no optimizer step, saying by how much to move.

    One step composes one unit (one step; one epoch for iteration/shuffling). If that unit alone exceeds
    (epsilon, delta), training would take no step: report the epsilon one unit costs and the smallest sigma
    that allows one unit (both from the accountant).
    """
    from lightning_dpts.privacy import StructuredSubsamplingAccountant, calibrate_noise_multiplier

    acc = StructuredSubsamplingAccountant(spec, sigma, coefficients=coefficients)
    first = acc.epsilon(1, delta)
    if first <= epsilon:
        return
    unit = {"epoch": "epoch", "opportunity": "participation opportunity"}.get(acc.unit, "optimizer step")
    try:
        need = "raise --noise-multiplier to >= " + _round_up(calibrate_noise_multiplier(
            spec, epsilon, delta, steps=1, coefficients=coefficients))
    except ConfigurationError:
        need = "no noise multiplier <= 1e4 allows it"
    raise ConfigurationError(
        "noise_multiplier", sigma,
        f"allows no training: one {unit} already spends epsilon={first:.6g} > the budget epsilon={epsilon:g} at "
        f"delta={delta:g}. Either raise --epsilon to >= {_round_up(first)}, or {need} (or omit it to calibrate it for "
        f"--epochs), or lower --batch-size / raise the number of series (smaller sampling rates amplify more)",
    )


def noise_multiplier(config: FitConfig, spec: Any, train_epsilon: float,
                     progress: Callable[[str], None]) -> tuple[float, tuple[Any, Any] | None]:
    """Sigma of the run and, with ``bands``, its (strategy, accountant); raises before anything is written.

    ``bands`` with b-min-sep: the given sigma, verified by :func:`bandmf_callbacks`; ``bands`` with cyclic Poisson
    (default): :func:`cyclic_bandmf`. Else a given sigma must allow one step
    (:func:`check_one_step`); an unset one is calibrated for (``train_epsilon``, delta) in ``epochs`` epochs.
    """

    sigma = config.noise_multiplier
    if config.monte_carlo:
        bandmf = bandmf_callbacks(config, spec, progress)
        assert sigma is not None
        return sigma, bandmf
    if config.bands is not None:
        return cyclic_bandmf(config, spec, train_epsilon, progress)
    if sigma is not None:
        check_one_step(spec, sigma, train_epsilon, config.delta)
        return sigma, None
    progress(f"calibrating the noise multiplier for epsilon={train_epsilon:g}, delta={config.delta:g} "
             f"in {config.epochs} epochs ({config.epochs * spec.steps_per_epoch} steps) ...")
    sigma = _calibrate(config, spec, train_epsilon)
    progress(f"noise multiplier {sigma:.4f}")
    return sigma, None


def _calibrate(config: FitConfig, spec: Any, train_epsilon: float, **kwargs: Any) -> float:
    """``calibrate_noise_multiplier`` for the run's epochs, its refusal re-worded in ``dpts fit``'s options."""
    from lightning_dpts.privacy import calibrate_noise_multiplier

    try:
        return calibrate_noise_multiplier(spec, train_epsilon, config.delta, epochs=config.epochs, **kwargs)
    except ConfigurationError as err:
        raise ConfigurationError(
            "epsilon", config.epsilon,
            f"{err.requirement}; raise --epsilon or --delta, lower --epochs or --batch-size, or give "
            "--noise-multiplier (training then stops when the budget is spent)",
        ) from err


def cyclic_bandmf(config: FitConfig, spec: Any, train_epsilon: float,
                  progress: Callable[[str], None]) -> tuple[float, tuple[Any, Any]]:
    """Sigma and (strategy, accountant) of a ``--bands b`` run with cyclic Poisson sampling in k = b groups
    (amplified BandMF, docs/bandmf.md Theorem B.2): C from
    :func:`~lightning_dpts.training.correlated_noise.optimize_coefficients` for the planned steps and participations
    every k steps; a given sigma must allow one opportunity, an omitted one is calibrated with the PLD accountant
    (exact at any delta). The :class:`~lightning_dpts.training.AccountantCallback` then stops training before the
    budget is exceeded, as for DP-SGD."""
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy
    from lightning_dpts.training.correlated_noise import optimize_coefficients

    b = int(config.bands)  # type: ignore[arg-type]
    steps = config.epochs * spec.steps_per_epoch
    coefficients = (1.0,) if b == 1 else tuple(
        float(v) for v in optimize_coefficients(b, max(steps, 1), participation_every=spec.bands).coefficients)
    sigma = config.noise_multiplier
    if sigma is not None:
        check_one_step(spec, sigma, train_epsilon, config.delta, coefficients)
    else:
        progress(f"calibrating the noise multiplier for epsilon={train_epsilon:g}, delta={config.delta:g} in "
                 f"{config.epochs} epochs ({steps} steps, BandMF b={b}, cyclic Poisson in {spec.bands} groups: "
                 f"{spec.compositions(steps)} participation opportunities per series) ...")
        sigma = _calibrate(config, spec, train_epsilon, coefficients=coefficients)
        progress(f"noise multiplier {sigma:.4f}")
    if b == 1:
        strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                      secure_mode=config.secure_mode)
    else:
        strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                      secure_mode=config.secure_mode, noise="bandmf", coefficients=coefficients)
    return float(sigma), (strategy, AccountantCallback(epsilon=train_epsilon, delta=config.delta))


def dp_callbacks(config: FitConfig, sigma: float, train_epsilon: float,
                 bandmf: tuple[Any, Any] | None) -> tuple[Any, Any]:
    """(strategy, accountant) of the run: the verified BandMF pair, or DP-SGD with the structured accountant."""
    if bandmf is not None:
        return bandmf
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm,
                                  seed=config.seed, secure_mode=config.secure_mode)
    return strategy, AccountantCallback(epsilon=train_epsilon, delta=config.delta)

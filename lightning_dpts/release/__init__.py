"""Inference-time privacy for releasing forecasts made from a private series (time-domain subsampling).

Koga et al. (AISTATS 2022) Algorithm 1 as used in Appendix H of *Privacy Amplification by Structured
Subsampling for Deep Differentially Private Time Series Forecasting*: Poisson-subsample the time steps of the
released window with rate p, add N(0, s^2) to the kept values, impute the rest, then forecast.

Example:
    >>> from lightning_dpts.privacy.spec import NeighbouringRelation
    >>> from lightning_dpts.release import ReleaseSpec, ReleaseAccountant, calibrate_release_noise
    >>> spec = ReleaseSpec(rate=0.5, relation=NeighbouringRelation("event", size=4, value_bound=0.1))
    >>> s = calibrate_release_noise(spec, epsilon=1.0, delta=1e-4)
    >>> ReleaseAccountant(spec, s).epsilon(1e-4) <= 1.0
    True

See ``docs/release.md`` for the bounds, their proofs and what is covered.
"""

from __future__ import annotations

from typing import Any

from lightning_dpts.release.accounting import (
    BOUNDS,
    ReleaseAccountant,
    ReleaseSpec,
    calibrate_release_noise,
    exact_release_delta,
    exact_release_profile,
    gaussian_delta,
    koga_epsilon,
    koga_filter_delta,
    koga_filter_failure_probability,
    koga_identity_delta,
    koga_identity_failure_probability,
)
from lightning_dpts.release.mechanism import (
    IMPUTATIONS,
    TimeDomainSubsampling,
    circulant_filter,
    gaussian_filter_kernel,
    impute,
    privatize_dataset,
    release_forecasts,
)

__all__ = [
    "BOUNDS",
    "IMPUTATIONS",
    "PrivateInputCallback",
    "ReleaseAccountant",
    "ReleaseSpec",
    "TimeDomainSubsampling",
    "calibrate_release_noise",
    "circulant_filter",
    "exact_release_delta",
    "exact_release_profile",
    "gaussian_delta",
    "gaussian_filter_kernel",
    "impute",
    "koga_epsilon",
    "koga_filter_delta",
    "koga_filter_failure_probability",
    "koga_identity_delta",
    "koga_identity_failure_probability",
    "privatize_dataset",
    "release_forecasts",
]


def __getattr__(name: str) -> Any:  # lazy: importing the callback pulls in torch and Lightning
    if name == "PrivateInputCallback":
        from lightning_dpts.release.callback import PrivateInputCallback

        return PrivateInputCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Privacy accounting for structured subsampling (pure numpy/scipy/dp-accounting; no torch or Lightning).

Start with :class:`SamplingSpec` (what the data pipeline does; its levels are the mechanism objects of
:mod:`~lightning_dpts.privacy.mechanisms`) and :class:`StructuredSubsamplingAccountant`
(what it costs), with membership-attack read-outs next to epsilon (:mod:`~lightning_dpts.privacy.risk`).
:class:`StructuredSubsamplingDpEvent` and :class:`StructuredPLDAccountant` (:mod:`~lightning_dpts.privacy.events`)
offer the mechanism to dp_accounting users. :mod:`~lightning_dpts.privacy.profiles` holds one function per theorem
of the paper and :func:`~lightning_dpts.privacy.bounds.select_profile` maps a configuration to its theorem.
"""

from lightning_dpts.privacy.accountant import (
    AmplifiedBandMFAccountant,
    PrivacyReport,
    ProfileAccountant,
    StructuredSubsamplingAccountant,
    calibrate_noise_multiplier,
)
from lightning_dpts.privacy.bounds import augmentation_leak_probability, naive_dpsgd_profile, select_profile
from lightning_dpts.privacy.events import StructuredPLDAccountant, StructuredSubsamplingDpEvent
from lightning_dpts.privacy.mechanisms import *  # noqa: F403  (the mechanism objects and their registry)
from lightning_dpts.privacy.mechanisms import __all__ as _MECHANISMS
from lightning_dpts.privacy.montecarlo import BandMFMechanism, MonteCarloAccountant
from lightning_dpts.privacy.pld import DEFAULT_DISCRETIZATION, DEFAULT_TAIL_MASS, pld_from_profile
from lightning_dpts.privacy.profiles import PrivacyProfile, gaussian_tvd
from lightning_dpts.privacy.risk import FPRS, RiskReadout
from lightning_dpts.privacy.spec import BOTTOM_LEVELS, LEVELS, TOP_LEVELS, NeighbouringRelation, SamplingSpec

__all__ = [
    "AmplifiedBandMFAccountant",
    "BOTTOM_LEVELS",
    "BandMFMechanism",
    "DEFAULT_DISCRETIZATION",
    "DEFAULT_TAIL_MASS",
    "FPRS",
    "LEVELS",
    "MonteCarloAccountant",
    "TOP_LEVELS",
    "NeighbouringRelation",
    "PrivacyProfile",
    "PrivacyReport",
    "ProfileAccountant",
    "RiskReadout",
    "SamplingSpec",
    "StructuredPLDAccountant",
    "StructuredSubsamplingAccountant",
    "StructuredSubsamplingDpEvent",
    "augmentation_leak_probability",
    "calibrate_noise_multiplier",
    "gaussian_tvd",
    "naive_dpsgd_profile",
    "pld_from_profile",
    "select_profile",
    *_MECHANISMS,
]

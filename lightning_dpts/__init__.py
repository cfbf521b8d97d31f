"""lightning-dpts: differentially private time-series forecasting for PyTorch Lightning.

The privacy layer (:mod:`lightning_dpts.privacy`) is pure numpy/scipy/dp-accounting and never imports torch
or Lightning, so ``import lightning_dpts.privacy`` stays fast for notebooks and the ``dpts`` command.
Components that need torch are imported lazily on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "ConfigurationError": "lightning_dpts.errors",
    "NeighbouringRelation": "lightning_dpts.privacy",
    "SamplingSpec": "lightning_dpts.privacy",
    "StructuredSubsamplingAccountant": "lightning_dpts.privacy",
    "StructuredSubsamplingDataModule": "lightning_dpts.data",
    "DPForecastStrategy": "lightning_dpts.training",
    "AccountantCallback": "lightning_dpts.training",
    "calibrate_noise_multiplier": "lightning_dpts.privacy",
    "PrivateEstimator": "lightning_dpts.gluonts",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dpts' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

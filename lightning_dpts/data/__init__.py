"""Data layer: bi-level structured subsampling of time series for DP training.

* :class:`StructuredSubsamplingDataModule` - the LightningDataModule users drop into their Trainer.
* :func:`load_dataset` - bundled datasets (``"us_employment"``).
* :class:`StructuredSampler`, :class:`WindowStore` - the vectorised sampler and window gatherer.
* :class:`SeriesStore`, :func:`write_store`, :func:`store_from_file` - the memory-mapped Arrow series store
  (:mod:`lightning_dpts.data.store`) for data at scale.

Names are imported on first use, so that the torch-free modules of this package (:mod:`~lightning_dpts.data.sources`,
:mod:`~lightning_dpts.data.loading`, :mod:`~lightning_dpts.data.columns`) load without torch (the ``dpts`` parser).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BUNDLED_DATASETS": "sources",
    "EvaluationWindow": "datamodule",
    "SeriesCollection": "sources",
    "SeriesStore": "store",
    "StructuredSampler": "sampler",
    "StructuredSubsamplingDataModule": "datamodule",
    "WindowStore": "sampler",
    "load_dataset": "sources",
    "store_from_file": "store",
    "to_collection": "sources",
    "write_store": "store",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dpts.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lightning_dpts.data.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

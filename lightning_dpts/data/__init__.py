"""Data layer: bi-level structured subsampling of time series for DP training.

* :class:`StructuredSubsamplingDataModule` - the LightningDataModule users drop into their Trainer.
* :func:`load_dataset` - bundled datasets (``"us_employment"``).
* :class:`StructuredSampler`, :class:`WindowStore` - the vectorised sampler and window gatherer.
"""

from __future__ import annotations

from lightning_dpts.data.datamodule import EvaluationWindow, StructuredSubsamplingDataModule
from lightning_dpts.data.sampler import StructuredSampler, WindowStore
from lightning_dpts.data.sources import BUNDLED_DATASETS, SeriesCollection, load_dataset, to_collection

__all__ = [
    "BUNDLED_DATASETS",
    "EvaluationWindow",
    "SeriesCollection",
    "StructuredSampler",
    "StructuredSubsamplingDataModule",
    "WindowStore",
    "load_dataset",
    "to_collection",
]

"""Data layer: bi-level structured subsampling of time series for DP training.

* :class:`StructuredSubsamplingDataModule` - the LightningDataModule users drop into their Trainer.
* :func:`load_dataset` - bundled datasets (``"us_employment"``).
* :class:`StructuredSampler`, :class:`WindowStore` - the vectorised sampler and window gatherer.
* :class:`SeriesStore`, :func:`write_store`, :func:`store_from_file` - the memory-mapped Arrow series store
  (:mod:`lightning_dpts.data.store`) for data at scale.
"""

from __future__ import annotations

from lightning_dpts.data.datamodule import EvaluationWindow, StructuredSubsamplingDataModule
from lightning_dpts.data.sampler import StructuredSampler, WindowStore
from lightning_dpts.data.sources import BUNDLED_DATASETS, SeriesCollection, load_dataset, to_collection
from lightning_dpts.data.store import SeriesStore, store_from_file, write_store

__all__ = [
    "BUNDLED_DATASETS",
    "EvaluationWindow",
    "SeriesCollection",
    "SeriesStore",
    "StructuredSampler",
    "StructuredSubsamplingDataModule",
    "WindowStore",
    "load_dataset",
    "store_from_file",
    "to_collection",
    "write_store",
]

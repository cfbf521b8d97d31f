"""Fixtures shared by the top-level tests (``dpts fit`` / ``dpts predict``)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

from lightning_dpts.data import load_dataset

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def tiny_csv(tmp_path_factory) -> Path:
    """24 bundled series, last 60 months each, as a long CSV with the default column names (item_id, timestamp,
    target; month starts written as dates, 2019-01-01)."""
    frame = load_dataset("us_employment")
    ids = sorted(frame["item_id"].unique())[:24]
    frame = frame[frame["item_id"].isin(ids)].groupby("item_id").tail(60)
    out = pd.DataFrame({"item_id": frame["item_id"], "timestamp": frame["timestamp"].dt.to_timestamp(),
                        "target": frame["target"]})
    path = tmp_path_factory.mktemp("data") / "tiny.csv"
    out.to_csv(path, index=False)
    return path


@pytest.fixture
def benchmark_script(monkeypatch) -> Iterator[Callable[[str], ModuleType]]:
    """Import a script of ``benchmarks/`` by module name, with its folder on ``sys.path`` for this test only; the
    modules imported from that folder are forgotten afterwards, also when the test fails."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield importlib.import_module
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]

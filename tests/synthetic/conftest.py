"""Shared tiny data for the synthetic-data tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.synth_pipeline import SynthConfig


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(6):
        stamps = pd.period_range("2001-01", periods=60, freq="M").to_timestamp()
        values = 100 + 10 * np.sin(np.arange(60) * 2 * np.pi / 12 + i) + rng.normal(size=60).cumsum()
        rows.append(pd.DataFrame({"id": f"s{i}", "timestamp": stamps, "value": values,
                                  "kind": "a" if i % 2 else "b"}))
    path = tmp_path_factory.mktemp("data") / "tiny.csv"
    pd.concat(rows).to_csv(path, index=False)
    return path


def tiny_config(data: Path, out: Path, **kw) -> SynthConfig:
    base = dict(data=str(data), length=12, num_samples=8, iterations=2, prediction_length=4,
                pretrain_epochs=(1, 1), num_public=64, lookahead=1, tstr=False, progress=False,
                output_dir=str(out), unit="window")
    base.update(kw)
    return SynthConfig(**base)

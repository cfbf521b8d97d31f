"""Issue 30 (behaviour unchanged): seeded training batches of every top x bottom level (and b-min-sep, and
augmentation) are exactly main's before the mechanism objects (table written by tests/data/make_before_batches.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

from tests.data.make_before_batches import batches

TABLE = json.loads((pathlib.Path(__file__).parent / "data" / "batches_before_i30.json").read_text())


def _name(config: dict) -> str:
    return "/".join(f"{k}={v}" for k, v in config.items())


@pytest.mark.parametrize("row", TABLE, ids=[_name(r["config"]) for r in TABLE])
def test_batches_identical_to_main(row: dict) -> None:
    assert batches(row["config"]) == row


@pytest.mark.parametrize("row", TABLE, ids=[_name(r["config"]) for r in TABLE])
def test_datamodule_takes_mechanism_objects(row: dict) -> None:
    """The same batches when the levels are given as objects (BMinSep carries ``bands``)."""
    from lightning_dpts.privacy import bottom_level_from_name, top_level_from_name

    config = dict(row["config"])
    config["top_level"] = top_level_from_name(config["top_level"], bands=config.pop("bands", 1))
    config["bottom_level"] = bottom_level_from_name(config.get("bottom_level", "with_replacement"))
    out = batches(config)
    assert out["steps"] == row["steps"]

"""Documentation that is generated from the code stays in sync with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_api_reference_is_up_to_date():
    spec = importlib.util.spec_from_file_location("gen_api", DOCS / "gen_api.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (DOCS / "api.md").read_text() == module.render(), "docs/api.md is stale: run python docs/gen_api.py"


def test_top_level_lazy_exports_resolve():
    import lightning_dpts

    for name in lightning_dpts.__all__:
        assert getattr(lightning_dpts, name) is not None, name

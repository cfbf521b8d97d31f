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


def test_cli_page_names_the_default_model():
    """docs/cli.md's sentence on the default run and the --model row name the recipe's model, and no other."""
    import re

    from lightning_dpts.config import MODELS
    from lightning_dpts.recipe import RECIPE_MODEL

    text = (DOCS / "cli.md").read_text()
    default_run = re.search(r"runs the documented default\s*\(([^)]*)\)", text)
    assert default_run, "docs/cli.md lost the sentence on what `dpts fit --output-dir DIR` alone runs"
    named = [m for m in MODELS if m in default_run.group(1)]
    assert named == [RECIPE_MODEL], (named, RECIPE_MODEL)
    assert not re.search(r"DLinear|PatchTST|DeepAR|SimpleFeedForward", default_run.group(1))
    fit_section = text.split("## `dpts fit`", 1)[1]
    row = next(line for line in fit_section.splitlines() if line.startswith("| `--model NAME`"))
    assert row.rstrip(" |").endswith(f"recipe: `{RECIPE_MODEL}`"), row


def test_data_page_names_the_window_length_arguments():
    text = (DOCS / "data.md").read_text()
    for name in ("context_length=", "prediction_length="):
        assert f"`{name}`" in text, name

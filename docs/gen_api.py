"""Generate docs/api.md from the public API's signatures and first docstring paragraphs.

Run ``python docs/gen_api.py`` after changing a public signature; tests/test_docs.py fails while api.md is stale.
"""

import importlib
import inspect
from pathlib import Path

MODULES = [
    ("lightning_dpts.privacy", None),
    ("lightning_dpts.data", ["StructuredSubsamplingDataModule", "EvaluationWindow", "load_dataset", "to_collection"]),
    ("lightning_dpts.training", None),
    ("lightning_dpts.metrics", None),
    ("lightning_dpts.release", None),
    ("lightning_dpts.data.loading", None),
    ("lightning_dpts.baselines", None),
    ("lightning_dpts.evaluation", None),
    ("lightning_dpts.recipe", ["Recipe", "choose_recipe", "rdp_noise_multiplier"]),
    ("lightning_dpts.models", None),
    ("lightning_dpts.gluonts", None),
    ("lightning_dpts.audit", None),
    ("lightning_dpts.data.columns", None),
    ("lightning_dpts.training.hparams", None),
    ("lightning_dpts.outputs", None),
    ("lightning_dpts.privacy.montecarlo", None),
    ("lightning_dpts.data.bminsep", None),
    ("lightning_dpts.data.store",
     ["SeriesStore", "SeriesStoreWriter", "StoreWindows", "store_from_file", "write_store"]),
    ("lightning_dpts.training.correlated_noise", None),
    ("lightning_dpts.distributed", None),
    ("lightning_dpts.synthetic", None),
    # the dpts application (lightning_dpts.app): imported by the command line only
    ("lightning_dpts.app.jobs.fit", ["run_fit"]),
    ("lightning_dpts.app.jobs.predict", None),
    ("lightning_dpts.app.jobs.synth", ["run_synth"]),
    ("lightning_dpts.app.config", ["FitConfig", "Option", "add_config_arguments", "add_option", "option_flags"]),
    ("lightning_dpts.app.geometry", None),
    ("lightning_dpts.app.forecasters", None),
    ("lightning_dpts.app.budget", None),
    ("lightning_dpts.app.scoring", None),
    ("lightning_dpts.app.reporting", ["public_report", "private_report", "write_run_files", "format_table"]),
    ("lightning_dpts.app.resume", None),
    ("lightning_dpts.app.export", None),
    ("lightning_dpts.app.planning", None),
    ("lightning_dpts.app.plots", None),
    ("lightning_dpts.tuning", ["tune", "Candidate", "default_candidates"]),
    ("lightning_dpts.privacy.selection", ["RandomStoppingAccountant", "profile_rdp"]),
]


def render() -> str:
    """The text of docs/api.md."""
    out = ["# API reference", "",
           "Generated from the code's signatures and docstrings (`python docs/gen_api.py`); the docstrings hold the",
           "details, units and theorem references.", ""]
    for modname, names in MODULES:
        mod = importlib.import_module(modname)
        names = names or [n for n in getattr(mod, "__all__", []) if not n.isupper()]
        out += [f"## `{modname}`", ""]
        doc = inspect.getdoc(mod) or ""
        if doc:
            out += [doc.split("\n\n")[0], ""]
        for n in names:
            obj = getattr(mod, n)
            try:
                sig = str(inspect.signature(obj))
            except (TypeError, ValueError):
                sig = ""
            kind = "class" if inspect.isclass(obj) else "def"
            first = (inspect.getdoc(obj) or "").split("\n\n")[0].replace("\n", " ")
            out += [f"### `{kind} {n}{sig}`", "", first, ""]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    Path(__file__).with_name("api.md").write_text(render())

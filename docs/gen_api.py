"""Generate docs/api.md from the plugin's public signatures and the first sentence of their docstrings.

Run ``python docs/gen_api.py`` after changing a public signature; tests/test_docs.py fails while api.md is stale.
"""

import importlib
import inspect
import re
from pathlib import Path

#: the plugin's public modules (the ``dpts`` application's helpers are not a library API: docs/cli.md); ``None``:
#: the module's ``__all__``; a list: the names a user starts from (``help(module)`` lists the rest)
MODULES = [
    ("lightning_dpts.privacy", None),
    ("lightning_dpts.data", ["StructuredSubsamplingDataModule", "EvaluationWindow", "load_dataset", "to_collection"]),
    ("lightning_dpts.training", ["DPForecastStrategy", "AccountantCallback", "HeldOutEvaluation", "IterateAveraging",
                                 "step_schedule", "PrivacyLedger", "ledger_of", "read_ledger", "attach_ledger",
                                 "NonFiniteGradientError", "PrivacyBudgetExhausted", "StructuredOpacusAccountant",
                                 "register_structured_accountant", "make_noise"]),
    ("lightning_dpts.metrics", None),
    ("lightning_dpts.recipe", ["Recipe", "choose_recipe", "make_private_with_epsilon", "rdp_noise_multiplier"]),
    ("lightning_dpts.models", None),
    ("lightning_dpts.gluonts", None),
    ("lightning_dpts.release", ["ReleaseSpec", "ReleaseAccountant", "TimeDomainSubsampling", "calibrate_release_noise",
                                "privatize_dataset", "release_forecasts", "PrivateInputCallback", "exact_release_delta",
                                "koga_epsilon", "circulant_filter", "gaussian_filter_kernel"]),
    ("lightning_dpts.synthetic", ["PETSAccountant", "calibrate_pets_noise", "theorem_2_epsilon", "sensitivity",
                                  "generate_series", "private_windows", "private_evolution", "pretrain_public_models",
                                  "ContextFID"]),
    ("lightning_dpts.app.jobs.synth", ["SynthConfig", "run_synth"]),
    ("lightning_dpts.audit", ["run_audit", "AuditResult", "AuditBound", "one_run_epsilon_lower_bound",
                              "one_run_fdp_lower_bound", "one_run_tradeoff_test", "clopper_pearson_epsilon_lower_bound",
                              "options_from_fit_config"]),
    ("lightning_dpts.privacy.montecarlo", ["MonteCarloAccountant", "BandMFMechanism",
                                           "calibrate_noise_multiplier_monte_carlo"]),
    ("lightning_dpts.data.store", ["SeriesStore", "SeriesStoreWriter", "store_from_file", "write_store"]),
    ("lightning_dpts.tuning", ["tune", "Candidate", "default_candidates"]),
    ("lightning_dpts.privacy.selection", ["RandomStoppingAccountant", "profile_rdp"]),
]

def _first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    first = " ".join(doc.split("\n\n")[0].split())
    for match in re.finditer(r"[.:](?=\s+[A-Z(`*]|$)", first):
        if not re.search(r"\b(Eq|e\.g|i\.e|Sec|Alg|Thm|cf|vs|al)\.$", first[:match.end()]):
            return first[:match.end()]
    return first


def _signature(obj: object) -> str:
    """``(name, name=default, *, ...)``: the parameters without their annotations (the docstrings give the types)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    text = str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty))
    if len(text) <= MAX_SIGNATURE:
        return text
    shown = []  # the leading parameters that fit, then "..." (help(name) shows them all)
    for p in params:
        if len(", ".join(shown + [str(p)])) > MAX_SIGNATURE - 7:
            break
        shown.append(str(p))
    return "(" + ", ".join(shown + ["..."]) + ")"


#: longer signatures are cut after the parameters that fit (characters)
MAX_SIGNATURE = 80


def render() -> str:
    """The text of docs/api.md: per module its first docstring sentence, per public name its signature and the
    first sentence of its docstring."""
    out = ["# API reference", "",
           "Generated from the code (`python docs/gen_api.py`): the plugin's public names, their signatures and the",
           "first sentence of their docstrings. The docstrings hold the details, units and theorem references",
           "(`help(name)`); the `dpts` application is documented in [cli.md](cli.md).", ""]
    for modname, names in MODULES:
        mod = importlib.import_module(modname)
        names = names or [n for n in getattr(mod, "__all__", []) if not n.isupper()]
        out += [f"## `{modname}`", ""]
        if doc := inspect.getdoc(mod):
            out += [_first_sentence(doc), ""]
        for n in names:
            obj = getattr(mod, n)
            sig = _signature(obj)
            kind = "class" if inspect.isclass(obj) else "def"
            out += [f"- `{kind} {n}{sig}`: {_first_sentence(inspect.getdoc(obj) or '')}"]
        out += [""]
    return "\n".join(out).rstrip() + "\n"

if __name__ == "__main__":
    Path(__file__).with_name("api.md").write_text(render())

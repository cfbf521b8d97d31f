"""The jobs layer stays a layer: nothing imports a job (another job included; only the command-line entry modules
compose jobs). The import graph is :func:`tests.test_architecture.import_graph` (every import statement at any
depth, and ``importlib.import_module`` of a literal name); no cycles anywhere is checked there.
"""

from __future__ import annotations

from tests.test_architecture import ROOT, import_graph

JOBS = "lightning_dpts.app.jobs"
#: Entry points allowed to import a job: the ``dpts`` command and its subcommand glue.
ENTRY_POINTS = {"lightning_dpts.app.cli", "lightning_dpts.app.synth_cli", "lightning_dpts.app.release_cli"}
#: The modules of the jobs layer and around it (issue 30, item 2).
OWNED = {
    "lightning_dpts.app.cli", "lightning_dpts.app.config", "lightning_dpts.data.loading",
    "lightning_dpts.app.geometry", "lightning_dpts.app.forecasters", "lightning_dpts.app.budget",
    "lightning_dpts.app.scoring", "lightning_dpts.app.reporting", "lightning_dpts.app.export",
    "lightning_dpts.app.planning", "lightning_dpts.recipe", "lightning_dpts.evaluation", "lightning_dpts.app.plots",
    "lightning_dpts.training.hparams", "lightning_dpts.outputs", "lightning_dpts.baselines",
    "lightning_dpts.app.synth_cli", "lightning_dpts.app.synth_pipeline", "lightning_dpts.app.release_cli",
}


def _graph() -> dict[str, set[str]]:
    graph = import_graph(ROOT / "lightning_dpts", "lightning_dpts")
    return {name: imports - {name} for name, imports in graph.items()}


def _is_job(name: str) -> bool:
    return name == JOBS or name.startswith(JOBS + ".")


def test_the_import_graph_is_read():
    graph = _graph()
    assert "lightning_dpts.app.jobs.fit" in graph["lightning_dpts.app.cli"]  # a function-level import is seen
    assert "lightning_dpts.app.config" in graph["lightning_dpts.app.jobs.fit"]
    assert OWNED <= set(graph), OWNED - set(graph)


def _job_importers(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """module -> the jobs it imports, for every module but the CLI entry modules (a job importing a job counts)."""
    return {name: sorted(filter(_is_job, imports)) for name, imports in graph.items()
            if name not in ENTRY_POINTS and any(map(_is_job, imports))}


def test_nothing_but_the_command_line_imports_a_job():
    offenders = _job_importers(_graph())
    assert not offenders, f"modules other than the CLI entry modules import a job: {offenders}"


def test_the_job_check_sees_a_job_importing_a_job():
    graph = _graph()
    graph["lightning_dpts.app.jobs.synth"] = graph["lightning_dpts.app.jobs.synth"] | {"lightning_dpts.app.jobs.fit"}
    assert _job_importers(graph) == {"lightning_dpts.app.jobs.synth": ["lightning_dpts.app.jobs.fit"]}


def test_the_jobs_package_imports_no_job():
    assert not _graph()[JOBS], "lightning_dpts/app/jobs/__init__.py must stay import-free (import a job's module)"

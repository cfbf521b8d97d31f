"""The jobs layer stays a layer: nothing imports a job (another job included; only the command-line entry modules
compose jobs), and the modules around the jobs have no import cycle.

The import graph is read with ``ast`` from the source (module-level and function-level imports, and
``importlib.import_module("...")`` with a literal name), so lazy imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_dpts"
JOBS = "lightning_dpts.jobs"
#: Entry points allowed to import a job: the ``dpts`` command and its subcommand glue.
ENTRY_POINTS = {"lightning_dpts.cli", "lightning_dpts.synthetic.cli", "lightning_dpts.release.cli"}
#: The modules of the jobs layer and around it (issue 30, item 2): no cycle may run through them.
OWNED = {
    "lightning_dpts.cli", "lightning_dpts.config", "lightning_dpts.loading", "lightning_dpts.geometry",
    "lightning_dpts.forecasters", "lightning_dpts.budget", "lightning_dpts.scoring", "lightning_dpts.reporting",
    "lightning_dpts.export", "lightning_dpts.planning", "lightning_dpts.recipe", "lightning_dpts.evaluation",
    "lightning_dpts.plots", "lightning_dpts.hparams", "lightning_dpts.outputs", "lightning_dpts.synthetic.cli",
    "lightning_dpts.synthetic.pipeline", "lightning_dpts.release.cli",
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that ``path`` imports anywhere (a ``from X import y`` of a submodule y counts both)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) ==
              "import_module" and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        for name in names:
            while name and name not in modules:  # `import a.b.c` of a package-level name: its module
                name = name.rpartition(".")[0]
            if name.startswith("lightning_dpts"):
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules) - {name} for name, path in modules.items()}


def _is_job(name: str) -> bool:
    return name == JOBS or name.startswith(JOBS + ".")


def test_the_import_graph_is_read():
    graph = _graph()
    assert "lightning_dpts.jobs.fit" in graph["lightning_dpts.cli"]  # a function-level import is seen
    assert "lightning_dpts.config" in graph["lightning_dpts.jobs.fit"]
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
    graph["lightning_dpts.jobs.synth"] = graph["lightning_dpts.jobs.synth"] | {"lightning_dpts.jobs.fit"}
    assert _job_importers(graph) == {"lightning_dpts.jobs.synth": ["lightning_dpts.jobs.fit"]}


def test_the_jobs_package_imports_no_job():
    assert not _graph()[JOBS], "lightning_dpts/jobs/__init__.py must stay import-free (import a job's module)"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_cycle_runs_through_the_jobs_layer_or_its_shared_modules():
    graph = _graph()
    # a package's __init__ re-exporting its submodules is not a cycle of responsibilities: drop package -> child
    edges = {name: {t for t in imports if not t.startswith(name + ".")} for name, imports in graph.items()}
    cycles = [c for c in _cycles(edges) if any(m in OWNED or _is_job(m) for m in c)]
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

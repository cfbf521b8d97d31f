"""Issue 39: the package root shows the plugin; the ``dpts`` application lives in ``lightning_dpts.app``, which no
plugin module imports; no class is over 400 lines (docs/architecture.md, "Layers").

The import graph is :func:`tests.test_architecture.import_graph` (an ``ast`` scan: function-level imports,
``if TYPE_CHECKING`` blocks and ``importlib.import_module`` of a literal name count too). The privacy layer's own
rule (no torch, no lightning) is checked by ``tests/test_architecture_privacy.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.test_architecture import ROOT, import_graph

PACKAGE = ROOT / "lightning_dpts"
APP = "lightning_dpts.app"
#: The modules the package root may hold: the plugin (docs/architecture.md lists each in its layer picture).
ROOT_MODULES = {"__init__", "baselines", "distributed", "errors", "evaluation", "gluonts", "metrics", "outputs",
                "randomness", "recipe", "tuning"}
ROOT_PACKAGES = {"app", "audit", "data", "models", "privacy", "release", "synthetic", "training"}
MAX_CLASS_LINES = 400


def _in_app(module: str) -> bool:
    return module == APP or module.startswith(APP + ".")


def plugin_imports_of_app(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """{plugin module: the app modules it imports} (empty when the rule holds)."""
    return {module: sorted(t for t in targets if _in_app(t))
            for module, targets in graph.items() if not _in_app(module) and any(_in_app(t) for t in targets)}


def long_classes(files: list[Path], limit: int = MAX_CLASS_LINES) -> list[str]:
    """'file:line Class (n lines)' for every class longer than ``limit`` lines (docstring and comments included)."""
    out = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return out


def test_no_plugin_module_imports_the_app():
    graph = import_graph(PACKAGE, "lightning_dpts")
    assert any(_in_app(m) for m in graph) and "lightning_dpts.training.strategy" in graph
    assert plugin_imports_of_app(graph) == {}


def test_the_check_sees_a_plugin_module_importing_the_app(tmp_path):
    """The attacker's move: a plugin module that imports the application lazily, inside a function."""
    pkg = tmp_path / "lightning_dpts"
    (pkg / "app").mkdir(parents=True)
    (pkg / "training").mkdir()
    for init in (pkg / "__init__.py", pkg / "app" / "__init__.py", pkg / "training" / "__init__.py"):
        init.write_text("")
    (pkg / "app" / "config.py").write_text("X = 1\n")
    (pkg / "training" / "step.py").write_text("def f():\n    from lightning_dpts.app.config import X\n    return X\n")
    graph = import_graph(pkg, "lightning_dpts")
    assert plugin_imports_of_app(graph) == {"lightning_dpts.training.step": ["lightning_dpts.app.config"]}


def test_the_root_holds_only_the_plugin():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert modules == ROOT_MODULES, "a new root module: the plugin's (add it here and to docs/architecture.md) or " \
                                    f"the application's (move it to lightning_dpts/app/): {modules ^ ROOT_MODULES}"
    assert packages == ROOT_PACKAGES, packages ^ ROOT_PACKAGES
    assert not any(name.startswith(APP) for name in _lazy_names(PACKAGE / "__init__.py"))


def _lazy_names(init: Path) -> list[str]:
    """The module strings of the package root's lazy attribute table."""
    return re.findall(r'"(lightning_dpts[\w.]*)"', init.read_text())


def test_the_dpts_command_is_the_app_cli():
    scripts = (ROOT / "pyproject.toml").read_text().split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    assert re.findall(r'^dpts\s*=\s*"([^"]+)"', scripts, re.M) == ["lightning_dpts.app.cli:main"]


def test_the_layer_picture_names_every_root_module_and_package():
    picture = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1].split("```")[1]
    missing = [name for name in sorted((ROOT_MODULES - {"__init__"}) | ROOT_PACKAGES)
               if not re.search(rf"\b{name}(\.py|/)", picture)]
    assert missing == []


def test_no_class_is_over_400_lines(tmp_path):
    assert long_classes(sorted(PACKAGE.rglob("*.py"))) == []
    big = tmp_path / "big.py"  # 401 lines: found; 400: not
    big.write_text("class Big:\n" + "    x = 1\n" * MAX_CLASS_LINES)
    assert len(long_classes([big])) == 1
    big.write_text("class Big:\n" + "    x = 1\n" * (MAX_CLASS_LINES - 1))
    assert long_classes([big]) == []

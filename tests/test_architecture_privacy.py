"""Issue 30: the privacy layer's import rules, checked on the source with ast.

(a) ``lightning_dpts.privacy`` never imports torch or lightning, at module level or inside a function, directly or
    through another ``lightning_dpts`` module that does (the package modules it imports are scanned too);
(b) only the adapter ``lightning_dpts/privacy/_dp_accounting.py`` touches dp_accounting's internals: imports of
    ``dp_accounting.pld.pld_pmf`` / ``dp_accounting.pld.common`` or of any ``_``-prefixed name from dp_accounting, and
    reads of ``_``-prefixed attributes of a dp_accounting module or of a name imported from it.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_dpts"
ADAPTER = PACKAGE / "privacy" / "_dp_accounting.py"
FORBIDDEN_IN_PRIVACY = ("torch", "lightning", "pytorch_lightning")
#: dp_accounting modules that are internals (everything the package needs of them goes through the adapter).
INTERNAL_MODULES = ("dp_accounting.pld.pld_pmf", "dp_accounting.pld.common")


def _module_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """The nodes that run on import: the module body, into if/try/with blocks, not into functions or classes."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for name in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(node, name, []))
        elif isinstance(node, ast.ExceptHandler):
            todo.extend(node.body)
    return out


def _imports(path: pathlib.Path, everywhere: bool = True) -> list[tuple[str, list[str], int]]:
    """(module, imported names, line) of the imports in ``path``: at any depth (functions, TYPE_CHECKING blocks), or
    with ``everywhere=False`` only those that run when the module is imported."""
    out = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if everywhere else _module_level_nodes(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = path.relative_to(ROOT).with_suffix("").parts[: -node.level]
                module = ".".join(base + ((node.module,) if node.module else ()))
            else:
                module = node.module or ""
            out.append((module, [alias.name for alias in node.names], node.lineno))
    return out


def _module_file(module: str) -> pathlib.Path | None:
    parts = module.split(".")
    for candidate in (ROOT.joinpath(*parts).with_suffix(".py"), ROOT.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking_only(path: pathlib.Path, line: int) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            if any(getattr(n, "lineno", -1) == line for body in node.body for n in ast.walk(body)):
                return True
    return False


def _closure(start: list[pathlib.Path]) -> dict[pathlib.Path, list[tuple[str, int]]]:
    """Every lightning_dpts file reachable by (runtime) imports from ``start``, with its external imports: every import
    of the ``start`` files (function-level ones included), the import-time ones of the package modules they reach."""
    seen: dict[pathlib.Path, list[tuple[str, int]]] = {}
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = []
        for module, names, line in _imports(path, everywhere=path in start):
            if _is_type_checking_only(path, line):
                continue
            if module.split(".")[0] != "lightning_dpts":
                seen[path].append((module, line))
                continue
            # the package __init__ of every parent runs too, then the module or the imported submodules
            parts = module.split(".")
            targets = [_module_file(".".join(parts[:i])) for i in range(1, len(parts) + 1)]
            targets += [_module_file(f"{module}.{name}") for name in names]
            todo.extend(t for t in targets if t is not None)
    return seen


def test_scan_finds_the_privacy_modules() -> None:
    files = sorted((PACKAGE / "privacy").glob("*.py"))
    assert {f.name for f in files} >= {"accountant.py", "spec.py", "mechanisms.py", "_dp_accounting.py", "pld.py"}
    assert any(module == "dp_accounting.pld.pld_pmf" or "pld_pmf" in names
               for module, names, _ in _imports(ADAPTER))


def test_privacy_never_imports_torch_or_lightning() -> None:
    closure = _closure(sorted((PACKAGE / "privacy").glob("*.py")))
    bad = [f"{path.relative_to(ROOT)}:{line} imports {module}"
           for path, imports in closure.items() for module, line in imports
           if module.split(".")[0] in FORBIDDEN_IN_PRIVACY]
    assert not bad, "lightning_dpts.privacy must stay torch- and Lightning-free:\n" + "\n".join(bad)


def test_importing_privacy_loads_no_torch() -> None:
    code = ("import sys, lightning_dpts.privacy, lightning_dpts.privacy.mechanisms, lightning_dpts.privacy.montecarlo; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN_IN_PRIVACY!r}))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def _dp_accounting_internals(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[str] = []
    dp_names: set[str] = set()  # local names bound to dp_accounting modules or objects imported from them
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "dp_accounting":
                    dp_names.add((alias.asname or alias.name).split(".")[0])
                    if alias.name in INTERNAL_MODULES:
                        found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dp_accounting":
            for alias in node.names:
                dp_names.add(alias.asname or alias.name)
                full = f"{node.module}.{alias.name}"
                if alias.name.startswith("_") or full in INTERNAL_MODULES or node.module in INTERNAL_MODULES:
                    found.append(f"{node.lineno}: from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in dp_names:
                found.append(f"{node.lineno}: .{node.attr} on {base.id}")
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_adapter_uses_dp_accounting_internals(path: pathlib.Path) -> None:
    if path == ADAPTER:
        assert _dp_accounting_internals(path)  # the adapter does (the scan sees them)
        return
    assert _dp_accounting_internals(path) == [], f"use lightning_dpts.privacy._dp_accounting in {path}"


def test_scan_detects_internal_use(tmp_path: pathlib.Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("from dp_accounting.pld import pld_pmf\nfrom dp_accounting.pld.x import _y\n"
                      "import dp_accounting\n\ndef f(p):\n    return dp_accounting.pld._z\n")
    assert len(_dp_accounting_internals(sample)) == 3

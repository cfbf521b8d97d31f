"""The import graph of lightning_dpts has no cycles, and no module branches on a scheme's name (issue 30's "no cycles"
and "no string dispatch on scheme kinds outside the scheme objects" evidence).

:func:`import_graph` reads every module of a package with :mod:`ast` (no import is executed) and records an edge
for each ``import`` and ``from ... import`` statement (and ``importlib.import_module`` of a literal name)
anywhere in the module: at the top level, inside functions
and methods, under ``if TYPE_CHECKING:`` and in ``try`` blocks alike, so that a lazy import cannot hide a cycle.
``from package import name`` points to ``package.name`` when that is a module of the package, else to
``package`` itself (its ``__init__``). Importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``; those
implicit parent edges are not recorded (every submodule would otherwise close a cycle with its package's
``__init__``), only the module named in the statement.

:func:`cycles` returns the strongly connected components with more than one module (or a module importing
itself) of the graph restricted to modules under the given prefixes. To check a wider area, add its prefix to
:data:`ACYCLIC` (e.g. ``"lightning_dpts"`` for the whole package).

:func:`scheme_name_comparisons` finds, with :mod:`ast`, every comparison ``x == "name"``, ``x != "name"`` (either
side) and ``x in ("name", ...)``/``not in`` a tuple, list or set literal where a string literal is the name of a
scheme of the registries of :mod:`lightning_dpts.privacy.mechanisms` (top levels, bottom levels, noise): such code
must read the objects' capability properties instead. The registry module itself is exempt, and so are the
comparisons listed in :data:`NOT_SCHEMES` (a name that only happens to equal a scheme's).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parents[1]

#: prefixes of the areas whose modules must not import one another in a cycle
ACYCLIC = ("lightning_dpts.training", "lightning_dpts")


def module_files(package_dir: Path, package: str) -> dict[str, Path]:
    """Every module of the package: dotted name -> file (a package's name maps to its ``__init__.py``)."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join([package, *parts])] = path
    return modules


def _imported(node: ast.AST, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules of ``known`` that one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in known]
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module":
        first = node.args[0] if node.args else None  # importlib.import_module("a.b") with a literal name
        literal = first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else ""
        return [literal] if literal in known else []
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: resolved against this module's package
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    found = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in known:
            found.append(sub)
        elif source in known:
            found.append(source)
    return found


def import_graph(package_dir: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (every import statement of the file, at any depth)."""
    files = module_files(package_dir, package)
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        graph[module] = {
            target for node in ast.walk(tree) for target in _imported(node, module, is_package, known)
        }
    return graph


def cycles(graph: dict[str, set[str]], prefixes: tuple[str, ...] = ("",)) -> list[list[str]]:
    """The import cycles among the modules under ``prefixes``: strongly connected components (scipy's
    ``connected_components(connection="strong")``) with more than one module, or a module that imports itself;
    each sorted, the list sorted."""

    def inside(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") or not p for p in prefixes)

    nodes = sorted(n for n in graph if inside(n))
    position = {n: i for i, n in enumerate(nodes)}
    pairs = [(position[n], position[t]) for n in nodes for t in graph[n] if t in position]
    rows, cols = zip(*pairs, strict=True) if pairs else ((), ())
    matrix = csr_matrix((np.ones(len(pairs)), (rows, cols)), shape=(len(nodes), len(nodes)))
    _, labels = connected_components(matrix, directed=True, connection="strong")
    members: dict[int, list[str]] = {}
    for node, label in zip(nodes, labels, strict=True):
        members.setdefault(int(label), []).append(node)
    return sorted(sorted(c) for c in members.values() if len(c) > 1 or c[0] in graph[c[0]])


def test_graph_builder_sees_lazy_relative_and_package_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("A = 1\ndef f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import a\n")
    (pkg / "c.py").write_text("import pkg.sub.b\nfrom pkg import A\n")
    (pkg / "d.py").write_text("import importlib\ndef g():\n    return importlib.import_module('pkg.d')\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {
        "pkg": {"pkg.a"}, "pkg.a": {"pkg.sub.b"}, "pkg.sub": set(), "pkg.sub.b": {"pkg.a"},
        "pkg.c": {"pkg.sub.b", "pkg"}, "pkg.d": {"pkg.d"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"], ["pkg.d"]]
    assert cycles(graph, ("pkg.sub",)) == []


@pytest.mark.parametrize("prefix", ACYCLIC)
def test_no_import_cycles(prefix: str) -> None:
    graph = import_graph(ROOT / "lightning_dpts", "lightning_dpts")
    assert prefix in graph or any(m.startswith(prefix + ".") for m in graph), prefix
    assert cycles(graph, (prefix,)) == []


# ----------------------------------------------------------------------------------------------------------------
# no string dispatch on scheme kinds
# ----------------------------------------------------------------------------------------------------------------
#: the modules that may compare scheme names: the mechanism objects and their registry
SCHEME_MODULES = ("lightning_dpts/privacy/mechanisms.py",)
#: (file, the other side of the comparison) pairs whose string is not a scheme name: ``dpts bandmf`` is a subcommand
NOT_SCHEMES = {("lightning_dpts/app/cli.py", "args.action")}


def scheme_names() -> set[str]:
    """The names of every top level, bottom level and noise of the registries."""
    from lightning_dpts.privacy.mechanisms import BOTTOM_LEVEL_SCHEMES, NOISE_SPECS, TOP_LEVEL_SCHEMES

    return set(TOP_LEVEL_SCHEMES) | set(BOTTOM_LEVEL_SCHEMES) | set(NOISE_SPECS)


def _literal_strings(node: ast.expr, op: ast.cmpop) -> set[str]:
    """The string literals that ``node`` contributes to a comparison by ``op``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and isinstance(op, (ast.Eq, ast.NotEq)):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and isinstance(op, (ast.In, ast.NotIn)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def scheme_name_comparisons(root: Path, files: Iterable[Path], names: set[str],
                            allowed: Iterable[tuple[str, str]] = ()) -> list[str]:
    """``file:line: comparison`` for each comparison in ``files`` of a value with a string literal in ``names``
    (``==``/``!=`` either way round, ``in``/``not in`` a tuple/list/set literal); ``allowed``: (file relative to
    ``root``, source of the other side) pairs to skip."""
    allowed = set(allowed)
    found = []
    for path in sorted(files):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides[:-1], sides[1:], strict=True):
                for literal, other in ((right, left), (left, right)):
                    if _literal_strings(literal, op) & names and (rel, ast.unparse(other)) not in allowed:
                        found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def test_the_scheme_name_scanner_sees_every_form(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "a = x == 'poisson'\nb = 'bandmf' != y\nc = z in ('iteration', 'other')\nd = z not in ['gaussian']\n"
        "e = z in {'b_min_sep'}\nf = x == 'other'\ng = 'poisson' in text\nh = action == 'bandmf'\n"
        "i = {'poisson': 1}\nj = x.y == 'with_replacement' or k\n"
    )
    found = scheme_name_comparisons(tmp_path, [tmp_path / "m.py"], scheme_names(), {("m.py", "action")})
    assert [line.split(":")[1] for line in found] == ["1", "2", "3", "4", "5", "10"], found


def test_no_string_dispatch_on_scheme_kinds() -> None:
    package = ROOT / "lightning_dpts"
    files = [p for p in package.rglob("*.py") if p.relative_to(ROOT).as_posix() not in SCHEME_MODULES]
    found = scheme_name_comparisons(ROOT, files, scheme_names(), NOT_SCHEMES)
    assert not found, "compare mechanism objects' capability properties, not scheme names:\n" + "\n".join(found)


if __name__ == "__main__":  # python tests/test_architecture.py: every cycle of the whole package
    for cycle in cycles(import_graph(ROOT / "lightning_dpts", "lightning_dpts"), ("lightning_dpts",)):
        print(" <-> ".join(cycle))

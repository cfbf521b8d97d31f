"""Documentation that is generated from the code stays in sync with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

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

    from lightning_dpts.app.config import MODELS
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


# --- every statement checkable from the code: links, Python names, dpts options, file paths ---------------------

import argparse  # noqa: E402
import ast  # noqa: E402
import importlib  # noqa: E402
import re  # noqa: E402

ROOT = DOCS.parent
#: the user pages and the README (api.md is generated from the code and checked above)
PAGES = [*sorted(p for p in DOCS.glob("*.md") if p.name != "api.md"), ROOT / "README.md"]
_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks."""
    return _FENCE.sub("", text)


def _blocks(text: str, *languages: str) -> list[str]:
    return [body for lang, body in _FENCE.findall(text) if lang in languages]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        if match := re.match(r"#{1,6}\s+(.*)", line):
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_slug_matches_githubs_rule():
    assert _slug("Cost (`python benchmarks/dp_training.py`)") == "cost-python-benchmarksdp_trainingpy"
    assert _slug("What a run writes, and who may see it") == "what-a-run-writes-and-who-may-see-it"


def _links(page: Path) -> list[str]:
    return re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", _prose(page.read_text()))


def test_every_docs_link_resolves():
    """Every relative link of the docs and the README names an existing file, and every #anchor a heading of it."""
    broken = []
    for page in PAGES:
        for target in _links(page):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_link_check_sees_a_broken_link(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n[x](b.md) [y](#title) [z](#nope)\n```\n[skipped](c.md)\n```\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert _links(page) == ["b.md", "#title", "#nope"]
    assert "nope" not in _anchors(page) and "title" in _anchors(page)


def _imports(code: str) -> list[ast.stmt]:
    try:
        tree = ast.parse(code)
    except SyntaxError:  # a fragment: its import lines alone
        lines = [line for line in code.splitlines() if re.match(r"(from \S+ )?import ", line)]
        tree = ast.parse("\n".join(lines))
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _check_import(node: ast.stmt) -> str | None:
    try:
        if isinstance(node, ast.Import):
            for alias in node.names:
                importlib.import_module(alias.name)
            return None
        module = importlib.import_module(node.module)
        for alias in node.names:
            if not hasattr(module, alias.name):
                importlib.import_module(f"{node.module}.{alias.name}")
    except (ImportError, AttributeError) as err:
        return f"{ast.unparse(node)}: {err}"
    return None


def test_every_import_in_a_python_block_works():
    """Every ``import``/``from ... import`` of a ```python block of the docs and the README resolves."""
    failures = []
    for page in PAGES:
        for block in _blocks(page.read_text(), "python"):
            for node in _imports(block):
                if (error := _check_import(node)) is not None:
                    failures.append(f"{page.name}: {error}")
    assert not failures, failures


def _resolve(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_dotted_package_name_in_the_docs_exists():
    """Every ``lightning_dpts.x.y`` the docs name in code (inline or in blocks) is a module or attribute."""
    missing = []
    for page in PAGES:
        for dotted in set(re.findall(r"\blightning_dpts(?:\.[A-Za-z_]\w*)+", page.read_text())):
            if not _resolve(dotted):
                missing.append(f"{page.name}: {dotted}")
    assert not missing, missing


def test_every_repository_file_the_docs_name_exists():
    """Paths like ``tests/x.py``, ``benchmarks/x.py``, ``examples/x.yaml``, ``lightning_dpts/x.py`` exist."""
    missing = []
    pattern = r"(?<![\w/.-])((?:tests|benchmarks|examples|lightning_dpts)/[\w/.-]*\w\.(?:py|yaml|md|csv\.gz))"
    for page in PAGES:
        for path in set(re.findall(pattern, page.read_text())):
            if not (ROOT / path).exists():
                missing.append(f"{page.name}: {path}")
    assert not missing, missing


def _dpts_options() -> dict[tuple[str, ...], set[str]]:
    """Every ``dpts`` command (as a tuple of words) -> its option strings."""
    from lightning_dpts.app.cli import build_parser

    found: dict[tuple[str, ...], set[str]] = {}

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        found[path] = {s for action in parser._actions for s in action.option_strings}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*path, name))

    walk(build_parser(), ())
    return found


#: spans quoted as examples of what dpts refuses (docs/cli.md's sentence on abbreviations)
REFUSED_EXAMPLES = ("dpts privacy bandmf --sampling-p 0.1",)


def _dpts_mentions(text: str) -> list[str]:
    """Inline code spans and code-block lines that run ``dpts``."""
    spans = [span for span in re.findall(r"`([^`\n]*\bdpts [^`\n]*)`", _prose(text)) if span not in REFUSED_EXAMPLES]
    lines = [line for block in _blocks(text, "console", "bash", "sh", "")
             for line in block.splitlines() if re.search(r"(^|\s|\$ )dpts ", line)]
    return spans + lines


def _unknown_options(mention: str, options: dict[tuple[str, ...], set[str]]) -> list[str]:
    words = re.search(r"\bdpts((?: [a-z]+)*)", mention).group(1).split()
    path: tuple[str, ...] = ()
    for word in words:
        if (*path, word) not in options:
            break
        path = (*path, word)
    if not path:
        return []  # "dpts" as a word in prose
    # "dpts privacy --data" names an option of the privacy subcommands: a command's words cover its subcommands'
    known = set().union(*(opts for cmd, opts in options.items() if cmd[: len(path)] == path)) | options[()]
    return [opt for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", mention) if opt not in known]


def test_every_dpts_option_in_the_docs_exists():
    """Every ``--option`` written after ``dpts <command>`` (inline code or a console block) is an option of that
    command (no abbreviations: dpts accepts none), and every option row of docs/cli.md is an option of dpts."""
    options = _dpts_options()
    every = set().union(*options.values())
    unknown = []
    for page in PAGES:
        for mention in _dpts_mentions(page.read_text()):
            unknown += [f"{page.name}: {opt} in {mention.strip()!r}" for opt in _unknown_options(mention, options)]
    for row in re.findall(r"^\| `(--[a-z][a-z0-9-]*)", (DOCS / "cli.md").read_text(), re.M):
        if row not in every:
            unknown.append(f"cli.md table row: {row}")
    assert not unknown, unknown


def test_the_option_check_sees_a_wrong_option():
    options = _dpts_options()
    assert _unknown_options("dpts fit --epsilon 1 --output-dir x", options) == []
    assert _unknown_options("dpts fit --epsilonn 1", options) == ["--epsilonn"]
    assert _unknown_options("dpts privacy epsilon --sampling cyclic", options) == ["--sampling"]
    assert _unknown_options("dpts privacy --data x --epochs 3", options) == []  # options of its subcommands
    assert _unknown_options("dpts privacy --data-file x", options) == ["--data-file"]


#: the option tables of docs/cli.md: section heading -> the dpts command whose parser holds the defaults
_TABLES = {"## `dpts privacy epsilon | steps | noise`": ("privacy", "epsilon"),
           "## `dpts release epsilon | noise`": ("release", "epsilon"),
           "## `dpts predict`": ("predict",)}


def _documented_defaults(section: str) -> list[tuple[str, str]]:
    """(option, default cell) of the table rows naming one option with a one-word default."""
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3:
            continue
        match = re.fullmatch(r"`(--[a-z][a-z0-9-]*)(?: [^`]*)?`", cells[0])
        if match and re.fullmatch(r"`[\w.]+`|[\d.e+-]+|off|required|none|unbounded", cells[2]):
            rows.append((match.group(1), cells[2].strip("`")))
    return rows


def _same_default(action: argparse.Action, documented: str) -> bool:
    if documented == "required":  # by argparse, or by the command's own check (test below)
        return action.required or action.default is None
    if documented in ("none", "unbounded"):
        return action.default is None
    if documented == "off":
        return action.default is False
    if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
        return float(documented) == float(action.default)
    if isinstance(action.default, list):
        return [str(v) for v in action.default] == [documented]
    return str(action.default) == documented


def test_cli_tables_state_the_parsers_defaults():
    """Each option row of docs/cli.md's tables with a one-word default (a number, a name, "off", "required")
    states what the parser does when the option is left out."""
    text = (DOCS / "cli.md").read_text()
    parsers: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    from lightning_dpts.app.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        parsers[path] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, (*path, name))

    walk(build_parser(), ())
    wrong, checked = [], 0
    for heading, command in _TABLES.items():
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        actions = {s: a for a in parsers[command]._actions for s in a.option_strings}
        for option, documented in _documented_defaults(section):
            if option in actions:  # an option of a sibling subcommand (e.g. --epsilon of `noise`) is skipped
                checked += 1
                if not _same_default(actions[option], documented):
                    wrong.append(f"{heading} {option}: documented {documented!r}, parser {actions[option].default!r}"
                                 f" (required={actions[option].required})")
    assert checked >= 10 and not wrong, (checked, wrong)


def test_privacy_options_documented_as_required_are_refused_when_missing(capsys):
    """The rows of `dpts privacy epsilon | steps | noise` documented "required": leaving one out exits 2 naming it."""
    from lightning_dpts.app.cli import main

    section = (DOCS / "cli.md").read_text().split("## `dpts privacy epsilon | steps | noise`", 1)[1].split("\n## ")[0]
    required = [option for option, default in _documented_defaults(section) if default == "required"]
    argv = ["privacy", "epsilon", "--num-series", "100", "--min-length", "50", "--context-length", "10",
            "--prediction-length", "5", "--batch-size", "10", "--noise-multiplier", "1", "--delta", "1e-6",
            "--steps", "10"]
    assert main(argv) == 0
    assert len(required) >= 6
    for option in required:
        i = argv.index(option)
        with pytest.raises(SystemExit) as exit_info:
            main(argv[:i] + argv[i + 2:])
        assert exit_info.value.code == 2 and option in capsys.readouterr().err, option

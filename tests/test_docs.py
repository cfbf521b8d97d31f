"""Documentation that is generated from the code stays in sync with it."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
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


# --- the word budget (issue 39) ----------------------------------------------------------------------------------

#: words over docs/*.md, api.md included (issue 39: <= 25,000), and per page (api.md excepted)
DOCS_WORD_BUDGET, PAGE_WORD_LIMIT = 25_000, 2_500


def _words(path: Path) -> int:
    """Words as ``wc -w`` counts them: runs of non-whitespace."""
    return len(path.read_text().split())


def test_docs_fit_the_word_budget_and_no_page_is_too_long():
    counts = {p.name: _words(p) for p in sorted(DOCS.glob("*.md"))}
    assert sum(counts.values()) <= DOCS_WORD_BUDGET, (sum(counts.values()), counts)
    long_pages = {name: n for name, n in counts.items() if n > PAGE_WORD_LIMIT and name != "api.md"}
    assert not long_pages, long_pages


def test_the_word_count_is_wc_s():
    assert _words(ROOT / "pyproject.toml") == len((ROOT / "pyproject.toml").read_text().split())
    page = ROOT / "README.md"
    assert _words(page) > 100


# --- every command and snippet of the docs and the README runs (issue 39) ----------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import shlex  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

SHELL_LANGUAGES = ("console", "bash", "sh", "shell")
#: extra options that make a long command quick in the fast suite (the slow suite runs it as written)
FAST_OPTIONS = {
    ("dpts", "fit"): ["--epochs", "1", "--no-baselines", "--no-non-dp", "--no-private-plots"],
    ("dpts", "synth"): ["--num-samples", "8", "--pretrain-epochs", "1,1", "--num-public", "64", "--no-tstr",
                        "--no-progress", "--no-private-plots"],
    ("dpts", "audit"): ["--canaries", "64", "--steps", "1", "--no-black-box"],
}
#: commands that run quickly as written (the fast suite runs them and compares their shown output)
QUICK = (("dpts", "privacy"), ("dpts", "release"), ("python", "examples/privacy_accounting.py"))
#: commands not run by this file, with the reason (every other command is run)
NOT_RUN = {"make test": "runs this test suite itself (and ruff); CI runs it",
           "make install": "installs packages: CI's environment step",
           "srun python train.py": "a SLURM job script (needs a cluster); the 2-process DDP test runs the same code"}
#: what a make target runs (the Makefile's recipe, without its install step)
MAKE_TARGETS = {"make demo": "dpts fit --output-dir runs/demo --overwrite"}


def _shell_commands(text: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) of every shell block: ``$ ``-prompted lines with the output below them, or
    (a block without prompts) every line. Comments are stripped; a trailing ``\\`` continues a command."""
    found: list[tuple[str, list[str]]] = []
    for block in _blocks(text, *SHELL_LANGUAGES):
        lines = block.splitlines()
        prompted = any(line.startswith("$ ") for line in lines)
        current: list[str] | None = None  # the parts of a command continued with a backslash
        for line in lines:
            if current is None and prompted and not line.startswith("$ "):
                if found:
                    found[-1][1].append(line)  # output of the last command
                continue
            if line.startswith("$ "):
                line = line[2:]
            code = "" if line.lstrip().startswith("#") else line.split(" #", 1)[0].rstrip()
            if current is None and not code.strip():
                continue
            parts = (current or []) + [code.rstrip("\\").strip()]
            if code.endswith("\\"):
                current = parts
            else:
                found.append((" ".join(parts), []))
                current = None
    return found


def test_shell_blocks_are_read_as_commands_and_outputs():
    text = "```console\n$ dpts a \\\n    --b 1   # note\nout 1\n...\n$ dpts c\n```\n```bash\nmake demo  # x\n```\n"
    assert _shell_commands(text) == [("dpts a --b 1", ["out 1", "..."]), ("dpts c", []), ("make demo", [])]


def _documented_commands() -> list[tuple[str, str, list[str]]]:
    """(page, command, shown output) of every shell block of the docs and the README."""
    return [(page.name, command, output) for page in PAGES for command, output in _shell_commands(page.read_text())]


def _kind(command: str) -> str:
    """``"quick"`` (the fast suite runs it as written), ``"long"`` (fast settings in the fast suite, as written in the
    slow suite), ``"slow"`` (the slow suite only) or ``"not run"``."""
    if command in NOT_RUN:
        return "not run"
    words = tuple(shlex.split(MAKE_TARGETS.get(command, command))[:2])
    if words in QUICK or words[:2] == ("dpts", "privacy") and "bandmf" not in command or "--sampling cyclic_poisson" \
            in command:
        return "quick"
    if words in FAST_OPTIONS or words == ("dpts", "predict"):
        return "long"
    return "slow"


def test_every_command_is_classified_and_make_targets_match_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    for target, command in MAKE_TARGETS.items():
        assert command in makefile.split(f"{target.split()[1]}:", 1)[1].split("\n\n", 1)[0], target
    kinds = {command: _kind(command) for _page, command, _output in _documented_commands()}
    assert {k for k in kinds.values()} <= {"quick", "long", "slow", "not run"}
    assert all(command in NOT_RUN for command, kind in kinds.items() if kind == "not run")
    assert "quick" in kinds.values() and "long" in kinds.values()


def _output_matches(shown: list[str], actual: str) -> bool:
    """The shown output matches the actual one: line by line, ``...`` inside a line matches any text, a line of
    ``...`` alone any number of lines, runs of spaces any run of spaces."""
    pattern = []
    for line in shown:
        if line.strip() == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
            continue
        parts = [re.sub(r"\\ +", r" +", re.escape(part.strip())) for part in line.split("...")]
        pattern.append(r" *" + r".*".join(parts) + r" *\n")
    return re.fullmatch("".join(pattern) + r"(?:[^\n]*\n)*", actual.rstrip("\n") + "\n") is not None if shown else True


def test_the_output_check_sees_a_wrong_number():
    actual = "head\n  steps   epsilon\n  1000   0.22\nfoot\n"
    assert _output_matches(["head", "steps epsilon", "1000 0.22", "..."], actual)
    assert _output_matches(["...epsilon", "1000 ..."], "  steps   epsilon\n  1000   0.22\n")
    assert not _output_matches(["head", "steps epsilon", "1000 0.23"], actual)


def _fixture_files(cwd: Path) -> None:
    """The input files the documented commands name (sales.csv, series.csv, new.csv, my.csv), made from the
    bundled data so that the commands run as written."""
    import numpy as np
    import pandas as pd

    from lightning_dpts.data import load_dataset

    table = load_dataset("us_employment")
    table.to_csv(cwd / "series.csv", index=False)
    table.to_csv(cwd / "new.csv", index=False)
    table.to_csv(cwd / "my.csv", index=False)
    rng = np.random.default_rng(0)
    rows = [pd.DataFrame({"store": f"s{i}", "week": pd.period_range("2015-01-05", periods=200, freq="W")
                          .to_timestamp(), "units": 50 + 10 * np.sin(np.arange(200) * 2 * np.pi / 52)
                          + rng.normal(0, 2, 200)}) for i in range(100)]
    pd.concat(rows).to_csv(cwd / "sales.csv", index=False)


def _argv(command: str, fast: bool) -> list[str]:
    words = shlex.split(MAKE_TARGETS.get(command, command))
    extra = FAST_OPTIONS.get(tuple(words[:2]), []) if fast else []
    if words[0] == "dpts":
        return [sys.executable, "-m", "lightning_dpts.app.cli", *words[1:], *extra]
    if words[0] == "python":
        return [sys.executable, *[str(ROOT / w) if w.startswith("examples/") else w for w in words[1:]], *extra]
    raise AssertionError(f"no way to run {command!r}: add it to MAKE_TARGETS or NOT_RUN")


def _run(argv: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _run_in_process(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """A quick ``dpts`` command through ``lightning_dpts.app.cli.main`` in this process (no interpreter start-up)."""
    import contextlib
    import io

    from lightning_dpts.app.cli import main

    out, err = io.StringIO(), io.StringIO()
    previous = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(shlex.split(command)[1:])
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(command, code, out.getvalue(), err.getvalue())


def _run_page_commands(page: str, kinds: set[str], fast: bool, tmp_path: Path,
                       skip: Callable[[str, list[str]], bool] = lambda command, output: False) -> dict[str, str]:
    """Run the page's commands of these kinds (except those ``skip(command, shown output)`` names), in order, in one
    working directory; returns the stdout of each command run."""
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    if kinds != {"quick"}:  # the quick commands read no files
        _fixture_files(cwd)
    ran: dict[str, str] = {}
    for name, command, output in _documented_commands():
        if name != page or _kind(command) not in kinds or skip(command, output):
            continue
        if "--model runs/demo" in command and not (cwd / "runs" / "demo").exists():  # the run it forecasts with
            done = _run(_argv("dpts fit --output-dir runs/demo", fast=True), cwd, 900)
            assert done.returncode == 0, done.stderr[-3000:]
        done = _run_in_process(command, cwd) if _kind(command) == "quick" and command.startswith("dpts ") \
            else _run(_argv(command, fast), cwd, 3000)
        assert done.returncode == 0, f"{page}: {command}\n{done.stderr[-3000:]}"
        assert _output_matches(output, done.stdout), f"{page}: {command}: shown\n" + "\n".join(output) + \
            f"\nactual\n{done.stdout}"
        ran[command] = done.stdout
    return ran


def _pages_with(kinds: set[str]) -> list[str]:
    return sorted({page for page, command, _ in _documented_commands() if _kind(command) in kinds})


@pytest.mark.parametrize("page", _pages_with({"quick"}))
def test_quick_commands_run_and_print_what_the_docs_show(page: str, tmp_path: Path):
    assert _run_page_commands(page, {"quick"}, fast=False, tmp_path=tmp_path)


#: pages whose long commands (with fast settings) the fast suite runs; the others' take minutes on 2 shared cores
#: even with fast settings (synth's public pretraining, audit's canaries, a fit before predict), so they run in the
#: slow suite, with fast settings here and as written in test_every_command_runs_as_written
FAST_SUITE_PAGES = ("README.md",)


@pytest.mark.parametrize("page", [p if p in FAST_SUITE_PAGES else pytest.param(p, marks=pytest.mark.slow)
                                  for p in _pages_with({"long"})])
def test_long_commands_run_with_fast_settings(page: str, tmp_path: Path):
    assert _run_page_commands(page, {"long"}, fast=True, tmp_path=tmp_path)


def _run_elsewhere(page: str) -> Callable[[str, list[str]], bool]:
    """Whether a command of ``page`` runs as written on an earlier page (in :data:`PAGES` order) and ``page`` shows
    no output for it: the same command on the same fixture files checks nothing new (``make demo``, minutes with
    AutoETS and AutoTheta, is on both the README and the quickstart)."""
    order = {p.name: i for i, p in enumerate(PAGES)}
    earlier = {command for name, command, _ in _documented_commands() if order[name] < order[page]}
    return lambda command, output: command in earlier and not output


def test_a_command_shown_on_two_pages_runs_as_written_once():
    """README.md and docs/quickstart.md both show ``make demo``: the docs page (first in page order) runs it."""
    assert _run_elsewhere("README.md")("make demo", [])
    assert not _run_elsewhere("README.md")("make demo", ["shown output"])
    assert not _run_elsewhere("quickstart.md")("make demo", [])
    assert "README.md" not in _pages_as_written()


def _pages_as_written() -> list[str]:
    """Pages with a long or slow command that no earlier page runs already."""
    commands = _documented_commands()
    skips = {page: _run_elsewhere(page) for page, _, _ in commands}
    return sorted({page for page, command, output in commands
                   if _kind(command) in {"long", "slow"} and not skips[page](command, output)})


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_as_written())
def test_every_command_runs_as_written(page: str, tmp_path: Path):
    """Every long or slow command as written, once (:func:`_run_elsewhere`); for the quickstart also its sample
    table, in what ``make demo``'s run printed."""
    ran = _run_page_commands(page, {"long", "slow"}, fast=False, tmp_path=tmp_path, skip=_run_elsewhere(page))
    assert ran
    if page == "quickstart.md":
        _check_quickstart_table(ran["make demo"])


def _python_blocks() -> list[tuple[str, int, str]]:
    return [(page.name, i, block) for page in PAGES
            for i, block in enumerate(_blocks(page.read_text(), "python"))]


def _trains(block: str) -> bool:
    """A snippet that trains a model (minutes: the slow suite runs it)."""
    return bool(re.search(r"\.(fit|train)\(|run_synth\(|run_audit\(|\btune\(", block)) and "tempfile" not in block


def _run_python(block: str, tmp_path: Path, timeout: int) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(block)
    done = _run([sys.executable, str(script)], tmp_path, timeout)
    assert done.returncode == 0, f"{block}\n{done.stderr[-3000:]}"


#: runs snippet files one after another in one interpreter, each as ``__main__`` with its own globals and in its own
#: directory; prints one JSON line: snippet name -> None or its traceback
_SNIPPET_RUNNER = """
import json, os, runpy, sys, traceback
failures = {}
for name, path in json.loads(sys.argv[1]):
    os.chdir(os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (None, 0):
            failures[name] = f"SystemExit({stop.code!r})"
    except BaseException:
        failures[name] = traceback.format_exc()[-3000:]
    sys.stdout.flush()
print("SNIPPETS " + json.dumps(failures))
"""


@pytest.fixture(scope="module")
def quick_snippet_failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every snippet that does not train, run once in one interpreter (an interpreter start with Lightning's imports
    costs seconds, ten of them a sizeable part of the fast suite); each in its own directory, with fresh globals."""
    jobs = []
    for page, index, block in _python_blocks():
        if _trains(block):
            continue
        folder = tmp_path_factory.mktemp(f"{page}-{index}")
        (folder / "snippet.py").write_text(block)
        jobs.append((f"{page}-{index}", str(folder / "snippet.py")))
    done = _run([sys.executable, "-c", _SNIPPET_RUNNER, json.dumps(jobs)], ROOT, 1200)
    line = next((line for line in reversed(done.stdout.splitlines()) if line.startswith("SNIPPETS ")), None)
    assert line is not None, f"the snippet runner did not finish:\n{done.stderr[-3000:]}"
    return json.loads(line.removeprefix("SNIPPETS "))


@pytest.mark.parametrize("page,index,block", [b for b in _python_blocks() if not _trains(b[2])],
                         ids=lambda v: v if isinstance(v, (str, int)) and not str(v).count("\n") else "")
def test_python_snippet_runs(page: str, index: int, block: str, quick_snippet_failures: dict[str, str]):
    failure = quick_snippet_failures.get(f"{page}-{index}")
    assert failure is None, f"{block}\n{failure}"


def test_the_snippet_runner_reports_a_failing_snippet(tmp_path: Path):
    """The shared-interpreter runner names a snippet that raises and goes on with the next one."""
    bad, good = tmp_path / "bad", tmp_path / "good"
    bad.mkdir(), good.mkdir()
    (bad / "s.py").write_text("raise ValueError('broken snippet')")
    (good / "s.py").write_text("open('here.txt', 'w').write('x')")
    jobs = [("bad", str(bad / "s.py")), ("good", str(good / "s.py"))]
    done = subprocess.run([sys.executable, "-c", _SNIPPET_RUNNER, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=60)
    failures = json.loads(done.stdout.splitlines()[-1].removeprefix("SNIPPETS "))
    assert list(failures) == ["bad"] and "broken snippet" in failures["bad"]
    assert (good / "here.txt").exists()


@pytest.mark.slow
@pytest.mark.parametrize("page,index,block", [b for b in _python_blocks() if _trains(b[2])],
                         ids=lambda v: v if isinstance(v, (str, int)) and not str(v).count("\n") else "")
def test_python_snippet_that_trains_runs(page: str, index: int, block: str, tmp_path: Path):
    _run_python(block, tmp_path, 3000)


def test_doctest_blocks_print_what_they_show():
    """```pycon blocks run as doctests (``...`` matches any text)."""
    import doctest

    ran = 0
    for page in PAGES:
        for block in _blocks(page.read_text(), "pycon"):
            test = doctest.DocTestParser().get_doctest(block, {}, page.name, str(page), 0)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            runner.run(test)
            assert runner.summarize(verbose=False).failed == 0, page.name
            ran += 1
    assert ran >= 1


def _check_quickstart_table(stdout: str) -> None:
    """The sample table of docs/quickstart.md: every row label and the privacy line (numbers left open, since no two
    runs are alike) appear in what `make demo`'s job printed (``stdout``; test_every_command_runs_as_written)."""
    block = next(b for lang, b in _FENCE.findall((DOCS / "quickstart.md").read_text()) if lang == ""
                 and "privacy spent" in b)
    for line in block.splitlines():
        assert re.search(_numbers_open(line), stdout), line


def test_the_quickstart_table_check_sees_a_missing_row():
    """The check of the quickstart's sample table fails on output without the table (and is run with make demo)."""
    block = next(b for lang, b in _FENCE.findall((DOCS / "quickstart.md").read_text()) if lang == ""
                 and "privacy spent" in b)
    _check_quickstart_table(block)
    with pytest.raises(AssertionError):
        _check_quickstart_table("\n".join(block.splitlines()[1:]))
    assert "quickstart.md" in _pages_as_written()


def _numbers_open(line: str) -> str:
    """A regular expression for ``line`` with its numbers left open: a ratio "0.63x, 37% lower" may come out as
    "1.02x" and the other way round, and the best baseline may be another one."""
    pattern = re.sub(r"\\ +", " +", re.escape(line.strip()))
    pattern = re.sub(r"\d+\\\.\d+x(?:,\ \+\d+%\ \+lower)?", "RATIO", pattern)
    pattern = re.sub(r"\d+(?:\\\.\d+)?(?:x)?", r"[\\d.]+x?", pattern)
    for name in (r"\(AutoETS", r"\(AutoTheta"):
        pattern = pattern.replace(name, r"\((?:AutoETS|AutoTheta|seasonal +naive)")
    return pattern.replace("RATIO", r"[\d.]+x(?:, +\d+% +lower)?")


def test_quickstart_lines_leave_numbers_open():
    """The quickstart table check tolerates what varies between runs (a ratio below or above 1, the best
    baseline's name) and nothing else."""
    within = "verdict: the private model is within 1.3x of the same model without DP (CRPS 0.0032 vs 0.0032, 1.01x)."
    assert re.search(_numbers_open(within), within.replace("1.01x", "0.99x, 1% lower"))
    assert not re.search(_numbers_open(within), within.replace("within", "outside"))
    beats = "verdict: the private model beats the best baseline: CRPS 0.0032 vs 0.0051 (AutoETS, 0.63x, 37% lower)."
    assert re.search(_numbers_open(beats), beats.replace("(AutoETS, 0.63x, 37% lower)", "(AutoTheta, 0.98x)"))
    assert not re.search(_numbers_open(beats), beats.replace("beats", "does not beat"))


def test_fit_default_yaml_is_the_default_job():
    """examples/fit_default.yaml spells out the default job: every key is a FitConfig field at its default."""
    import dataclasses

    import yaml

    from lightning_dpts.app.config import FitConfig

    values = yaml.safe_load((ROOT / "examples" / "fit_default.yaml").read_text())
    defaults = {f.name: f.default for f in dataclasses.fields(FitConfig)}
    assert set(values) <= set(defaults)
    assert {k: v for k, v in values.items() if v != defaults[k]} == {}
    text = (ROOT / "examples" / "fit_default.yaml").read_text()
    from lightning_dpts.recipe import RECIPE_MODEL

    assert f"recipe: {RECIPE_MODEL}" in text

"""Every example runs from an empty working directory and writes nothing outside the run directory it is given (or
a temporary one): not into the working directory, not into the repository. Those that write files run twice in a
row (the second run, into an existing directory, is the case that used to fail; :data:`WRITES_FILES`).

The fast suite runs the examples that write files and the quick ones, with small settings; the long ones (minutes)
run with their own settings under ``-m slow``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _repo_files() -> set[str]:
    """Untracked and modified files of the repository (git), or the top-level names without git."""
    done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True)
    if done.returncode != 0:
        return {p.name for p in ROOT.iterdir()}
    return set(done.stdout.splitlines())


def _run_twice(argv: list[str], cwd: Path, timeout: int = 900, runs: int = 2) -> list[str]:
    """Run ``python argv`` twice (``runs`` times) in a row from ``cwd``; returns the outputs; asserts every run
    succeeds and none writes anywhere else."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    before = _repo_files()
    outputs = []
    for attempt in range(1, runs + 1):
        done = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"run {attempt} of {argv}: {done.stderr[-3000:]}"
        outputs.append(done.stdout)
    assert sorted(p.name for p in cwd.iterdir()) == [], f"{argv} wrote into the working directory"
    assert _repo_files() == before, f"{argv} wrote into the repository"
    return outputs


#: example -> the arguments of a quick run (the fast suite; the others take a minute or more on 2 shared cores even
#: with small settings, so they run under -m slow)
FAST = {
    "privacy_accounting.py": [],
}
#: example -> its own settings (minutes: slow)
SLOW = {
    "bandmf_training.py": [],
    "datamodule_deepar.py": [],
    "gluonts_estimator.py": [],
    "gluonts_validation.py": [],
    "dp_deepar.py": [],
    "synthetic_pets.py": [],
    "privacy_accounting.py": [],
    "dp_accounting_event.py": [],
    "opacus_structured.py": [],
}


def test_every_example_is_run_by_this_file():
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(SLOW) | {"lightning_cli.py"}


@pytest.mark.parametrize("name", sorted(FAST))
def test_quick_example_runs_twice(name: str, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _run_twice([str(EXAMPLES / name), *FAST[name]], cwd)


#: examples that write files (a run directory; lightning_cli.py has tests of its own below): run twice in a row with
#: their own settings; the others write nothing, and a second run of minutes would check nothing new
WRITES_FILES = {"synthetic_pets.py"}
#: what an example that writes files calls (test_examples_that_write_files_are_the_ones_run_twice)
_WRITING = re.compile(r"output_dir|output-dir|to_csv|savefig|torch\.save|write_text|open\(|mkdir|mkdtemp")


def test_examples_that_write_files_are_the_ones_run_twice() -> None:
    writing = {p.name for p in EXAMPLES.glob("*.py") if _WRITING.search(p.read_text())}
    assert writing - {"lightning_cli.py"} == WRITES_FILES
    assert _WRITING.search("result.to_csv(path)") and not _WRITING.search("print(table)")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SLOW))
def test_example_with_its_own_settings_runs(name: str, tmp_path: Path) -> None:
    """Twice in a row if it writes files (:data:`WRITES_FILES`), else once; never writing outside its run directory."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _run_twice([str(EXAMPLES / name), *SLOW[name]], cwd, timeout=1800, runs=2 if name in WRITES_FILES else 1)


@pytest.mark.slow  # 18 s; the fast suite's rerun checks are privacy_accounting.py and the LightningCLI example
def test_synthetic_example_reruns_into_its_run_directory(tmp_path: Path) -> None:
    cwd, run = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    first, second = _run_twice([str(EXAMPLES / "synthetic_pets.py"), "--fast", "--output-dir", str(run)], cwd)
    assert (run / "synthetic.csv.gz").exists() and (run / "report.json").exists()
    assert str(run) in second


@pytest.mark.slow  # three runs of ~7 s; the fast suite fits the same YAML in tests/test_lightning_cli.py
def test_lightning_cli_example_reruns_into_the_same_directory_and_defaults_to_a_temporary_one(tmp_path: Path):
    """The LightningCLI example wrote config.yaml into the working directory and failed on the second run."""
    pytest.importorskip("jsonargparse")
    config = yaml.safe_load((EXAMPLES / "lightning_cli.yaml").read_text())
    config["trainer"]["max_epochs"] = 2
    config["trainer"]["callbacks"][0]["init_args"]["epochs"] = 2
    config["trainer"]["enable_progress_bar"] = False
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cwd, run = tmp_path / "cwd", tmp_path / "run"
    cwd.mkdir()
    script = str(EXAMPLES / "lightning_cli.py")
    _run_twice([script, "fit", "--config", str(tmp_path / "config.yaml"), "--trainer.default_root_dir", str(run)],
               cwd)
    assert (run / "config.yaml").exists()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    before = _repo_files()
    done = subprocess.run([sys.executable, script, "fit", "--config", str(tmp_path / "config.yaml")], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)  # once: the rerun is checked above
    assert done.returncode == 0, done.stderr[-3000:]
    assert "run directory: " in done.stdout
    assert sorted(p.name for p in cwd.iterdir()) == [] and _repo_files() == before

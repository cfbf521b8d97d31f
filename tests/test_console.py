"""Issue 32: ``dpts``'s quiet output (known third-party warnings filtered, package warnings once, no progress bar
in a log) and ``--verbose``."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from lightning_dpts.app import console as console_module
from lightning_dpts.app.console import KNOWN_THIRD_PARTY_WARNINGS, dpts_console

ROOT = Path(__file__).resolve().parents[1]
THIRD_PARTY = [
    "'M' is deprecated and will be removed in a future version, please use 'ME' instead.",
    "Using `json`-module for json-handling. Consider installing one of `orjson`, `ujson`",
    "Your `IterableDataset` has `__len__` defined. In combination with multi-process data loading",
    "`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)`",
    "You defined a `validation_step` but have no `val_dataloader`. Skipping val loop.",
    "The number of training batches (2) is smaller than the logging interval Trainer(log_every_n_steps=50).",
]


def test_known_third_party_warnings_are_filtered_unless_verbose(capsys, monkeypatch):
    monkeypatch.setattr(console_module, "_warnings_recorded", lambda: False)
    lines: list[str] = []
    with dpts_console(write=lines.append):
        for text in THIRD_PARTY:
            warnings.warn_explicit(text, UserWarning, "/site-packages/gluonts/x.py", 1)
    assert lines == [] and capsys.readouterr().err == ""
    with dpts_console(verbose=True, write=lines.append), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for text in THIRD_PARTY:
            warnings.warn_explicit(text, UserWarning, "/site-packages/gluonts/x.py", 1)
    assert len(seen) == len(THIRD_PARTY)
    assert len(KNOWN_THIRD_PARTY_WARNINGS) >= len(THIRD_PARTY)


def test_unknown_third_party_warnings_still_show(capsys, monkeypatch):
    monkeypatch.setattr(console_module, "_warnings_recorded", lambda: False)  # pytest records every warning
    with dpts_console(write=lambda _line: None):
        warnings.warn_explicit("something new", UserWarning, "/site-packages/torch/x.py", 3)
    assert "something new" in capsys.readouterr().err


def test_a_package_warning_is_printed_once_without_a_source_path(monkeypatch):
    monkeypatch.setattr(console_module, "_warnings_recorded", lambda: False)
    lines: list[str] = []
    with dpts_console(write=lines.append) as console:
        warnings.warn_explicit("dpts fit: a seeded run", UserWarning, "/x/lightning_dpts/app/jobs/fit.py", 10)
        console.say("WARNING: a seeded run")
        console.say("WARNING: another")
        warnings.warn_explicit("another", UserWarning, "/x/lightning_dpts/data/datamodule.py", 5)
        console.say("plain line")
    assert lines == ["WARNING: a seeded run", "WARNING: another", "plain line"]


def test_lightning_info_lines_are_quiet_until_the_command_ends():
    import lightning  # noqa: F401  (its import sets its loggers to INFO)

    log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    before = log.level
    log.setLevel(logging.INFO)
    try:
        with dpts_console(write=lambda _line: None):
            assert not log.isEnabledFor(logging.INFO)
        assert log.isEnabledFor(logging.INFO)
    finally:
        log.setLevel(before)


@pytest.mark.slow  # a 20-epoch fit in a fresh process
def test_dpts_fit_output_is_short_with_the_recipe_and_the_verdict(tiny_csv, tmp_path):
    argv = ["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--epochs", "20", "--seed", "1",
            "--output-dir", str(tmp_path / "run")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "lightning_dpts.app.cli", *argv], capture_output=True, text=True,
                         cwd=ROOT, env=env, stdin=subprocess.DEVNULL)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert len(text.encode()) < 10_000, text
    assert "recipe (" in text and "verdict:" in text and "privacy spent" in text
    assert "it/s" not in text and "\r" not in text and "site-packages" not in text  # no bar, no warning paths
    assert "GPU available" not in text and "litlogger" not in text
    assert "  step " in text  # the progress report of a log
    # what goes to a log names the private numbers as such, and the noise-free training loss is not among them
    from lightning_dpts.app.reporting import PRIVATE_TABLE_NOTE

    lines = text.splitlines()
    assert lines[lines.index(PRIVATE_TABLE_NOTE) + 1].startswith("model ")
    assert re.search(r"  step \d+, epoch \d+: epsilon=", text) and "train_loss" not in text, text
    seeded = [line for line in text.splitlines() if "does NOT hold" in line]
    assert len(seeded) == 1 and seeded[0].startswith("WARNING: "), seeded


def test_delta_at_least_one_over_n_is_warned_once(monkeypatch):
    monkeypatch.setattr(console_module, "_warnings_recorded", lambda: False)
    lines: list[str] = []
    with dpts_console(write=lines.append), warnings.catch_warnings():
        warnings.simplefilter("always")  # even when Python would show every occurrence, dpts shows it once
        for _ in range(3):
            assert console_module.warn_delta_above_one_over_n(0.01, 145, "series")
        assert not console_module.warn_delta_above_one_over_n(1e-7, 145, "series")
        assert not console_module.warn_delta_above_one_over_n(1 / 146, 145, "series")
        assert console_module.warn_delta_above_one_over_n(1 / 145, 145, "series")  # delta = 1/N warns too
    assert len(lines) == 2 and lines[0].startswith("WARNING: delta=0.01 is >= 1/N = 1/145"), lines


def test_the_step_lines_of_a_log_show_epsilon_but_never_the_training_loss():
    """The lines written instead of a progress bar (to a log, which may be shared) carry the accountant's public
    values only: the module's logged training loss is computed on private batches without noise."""
    import torch

    from lightning_dpts.app.console import step_lines

    written: list[str] = []
    callback = step_lines(every=5, write=written.append)

    class Accountant:
        last_logged = {"epsilon": 0.5, "mu_gdp": 0.1}

    class Trainer:
        global_step, current_epoch = 10, 2
        callback_metrics = {"train_loss": torch.tensor(0.123456), "val_loss": torch.tensor(0.5)}
        callbacks = [callback, Accountant()]

    callback.on_train_batch_end(Trainer())
    assert written == ["  step 10, epoch 2: epsilon=0.5, mu_gdp=0.1"]

"""Ctrl-C during ``dpts fit`` (issue 38): the run writes what ``--resume`` needs (``ledger.json`` and
``checkpoints/last.ckpt``, overwritten at the interrupt), says so with the ``--resume``
command and exits 130; the resumed run then accounts every step once. Before issue 38 Lightning's handler ended the
process with status 1, no message and, in the first epoch, no checkpoint to resume from.

The test runs ``dpts fit`` in a subprocess and sends it SIGINT once ``ledger.json`` has reserved a second block of steps
(its first reservation is written before the first step: the steps it covers have then been taken). No timing
is asserted: waiting is bounded by a number of polls, and the subprocess by a generous hang guard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_dpts.app.cli import main

ARGS = ["--prediction-length", "6", "--model", "simple_feedforward", "--epsilon", "8.0", "--delta", "1e-6",
        "--epochs", "20", "--batch-size", "8", "--no-non-dp", "--no-private-plots", "--test-windows", "1",
        "--learning-rate", "0.01", "--max-grad-norm", "1.0", "--context-length", "6", "--min-series-length", "1"]
POLLS = 3000  # at most this many polls of ledger.json, 0.1 s apart (a bound on the wait, not an assertion)


def _steps(run: Path) -> int:
    try:
        return int(json.loads((run / "ledger.json").read_text())["ledger"]["steps"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a subprocess")
def test_ctrl_c_writes_what_a_resume_needs_and_says_how(tiny_csv, tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "lightning_dpts.app.cli", "fit", "--data", str(tiny_csv), *ARGS,
                             "--output-dir", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        first = 0  # ledger.json reserves steps ahead of them (write-ahead, issue 44): once a second reservation
        for _ in range(POLLS):  # replaces the first, every step the first covered was taken
            now = _steps(run)
            first = first or now
            if (first and now > first) or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the fit ended before it could be interrupted"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=600)  # a hang guard
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and f"dpts fit --resume {run}" in err, err[-2000:]
    assert (run / "ledger.json").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    taken = _steps(run)
    assert taken >= 1 and not (run / "report.json").exists()

    import torch

    from lightning_dpts.training.ledger import read_ledger

    saved = read_ledger(torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False))
    assert saved is not None and saved.steps <= taken  # ledger.json never counts fewer steps than the checkpoint

    assert main(["fit", "--resume", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["privacy_ledger"]["steps"] >= taken  # the steps before the interrupt are accounted

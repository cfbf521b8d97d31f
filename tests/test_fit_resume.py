"""``dpts fit --resume RUN_DIR`` (issue 32): continues the run's last checkpoint through the privacy ledger; every
noisy step the run directory took is accounted once, and a directory whose ledger and checkpoint do not belong
together is refused. The attacker tests try to make a resume forget steps."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from lightning_dpts.app.cli import main

ARGS = ["--prediction-length", "6", "--model", "simple_feedforward", "--epsilon", "2.0", "--delta", "1e-6",
        "--epochs", "3", "--batch-size", "8", "--no-non-dp", "--no-private-plots", "--test-windows", "1",
        "--learning-rate", "0.01", "--max-grad-norm", "1.0", "--context-length", "6", "--min-series-length", "1"]


class Interrupted(RuntimeError):
    pass


def _interrupt_after(monkeypatch, epoch: int, batches: int | None = None) -> None:
    """Make the next fit crash after the checkpoint of ``epoch`` (0-based), or ``batches`` steps into it."""
    import lightning_dpts.app.resume as resume

    real = resume.make_run_ledger_callback

    def make(*args, **kwargs):
        callback = real(*args, **kwargs)
        cls = type(callback)

        class Crashing(cls):
            def on_train_batch_end(self, trainer, *a, **k):
                super().on_train_batch_end(trainer, *a, **k)
                if batches is not None and trainer.current_epoch == epoch and a[-1] + 1 == batches:
                    raise Interrupted("killed mid-epoch")

            def on_train_epoch_end(self, trainer, pl_module):
                super().on_train_epoch_end(trainer, pl_module)
                if batches is None and trainer.current_epoch == epoch:
                    raise Interrupted("killed after the checkpoint")

        callback.__class__ = Crashing
        return callback

    monkeypatch.setattr(resume, "make_run_ledger_callback", make)


def _fit(argv) -> int:
    return main(["fit", *argv])


def _report(out):
    return json.loads((out / "report.json").read_text())


def _ledger(out):
    return json.loads((out / "ledger.json").read_text())["ledger"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_csv, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    assert _fit(["--data", str(tiny_csv), *ARGS, "--output-dir", str(out)]) == 0
    return _report(out)


def _interrupted(tiny_csv, tmp_path, monkeypatch, epoch=0, batches=None):
    out = tmp_path / "run"
    _interrupt_after(monkeypatch, epoch, batches)
    assert _fit(["--data", str(tiny_csv), *ARGS, "--output-dir", str(out)]) == 1  # the job failed
    monkeypatch.undo()
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "report.json").exists()
    return out


def test_resume_accounts_the_steps_once_and_ends_where_one_run_ends(tiny_csv, tmp_path, monkeypatch, uninterrupted):
    from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant

    out = _interrupted(tiny_csv, tmp_path, monkeypatch)
    before = _ledger(out)["steps"]
    assert 0 < before < uninterrupted["steps"]
    assert _fit(["--resume", str(out)]) == 0
    report = _report(out)
    # the same total steps and epsilon as the uninterrupted run (same configuration, same sigma)
    assert report["noise_multiplier"] == pytest.approx(uninterrupted["noise_multiplier"], rel=1e-12)
    assert report["privacy_ledger"]["steps"] == uninterrupted["privacy_ledger"]["steps"] == report["steps"]
    assert report["epsilon"] == pytest.approx(uninterrupted["epsilon"], rel=1e-9)
    spec = SamplingSpec(**{k: v for k, v in report["privacy_configuration"]["sampling_spec"].items()
                           if k in SamplingSpec.__dataclass_fields__ and k != "relation"})
    eps = StructuredSubsamplingAccountant(spec, report["noise_multiplier"]).epsilon(report["steps"], 1e-6)
    assert report["epsilon_training"] == pytest.approx(eps, rel=1e-6)
    assert _ledger(out)["steps"] == report["steps"]
    assert report["files"]["ledger.json"].startswith("public: ")
    assert report["files"]["checkpoints/last.ckpt"].startswith("public: ")
    # resuming the finished run: Lightning has no epoch left to train; the steps are accounted, none is added
    assert _fit(["--resume", str(out)]) == 0
    again = _report(out)
    assert again["privacy_ledger"]["steps"] == report["privacy_ledger"]["steps"]
    assert again["epsilon"] == pytest.approx(report["epsilon"], rel=1e-12)


def test_steps_after_the_last_checkpoint_are_charged(tiny_csv, tmp_path, monkeypatch):
    out = _interrupted(tiny_csv, tmp_path, monkeypatch, epoch=1, batches=2)  # 2 steps into epoch 2, then killed
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["dpts_privacy_ledger"]["steps"]
    taken = _ledger(out)["steps"]
    assert taken == saved + 2
    assert _fit(["--resume", str(out)]) == 0
    report = _report(out)
    new = report["steps"] - saved  # the optimizer steps the resumed fit took on the checkpoint's weights
    assert report["privacy_ledger"]["steps"] == taken + new  # the 2 lost steps are accounted, once


def test_resuming_twice_from_the_same_checkpoint_is_accounted(tiny_csv, tmp_path, monkeypatch):
    """The attacker keeps a copy of the checkpoint, resumes, puts the copy back and resumes again."""
    out = _interrupted(tiny_csv, tmp_path, monkeypatch)
    copy = tmp_path / "copy.ckpt"
    shutil.copy(out / "checkpoints" / "last.ckpt", copy)
    assert _fit(["--resume", str(out)]) == 0
    first = _report(out)["privacy_ledger"]["steps"]
    shutil.copy(copy, out / "checkpoints" / "last.ckpt")
    assert _fit(["--resume", str(out)]) == 0
    second = _report(out)
    assert second["privacy_ledger"]["steps"] >= first  # never forgets the first continuation's steps
    assert second["epsilon"] <= 2.0
    assert _ledger(out)["steps"] == second["privacy_ledger"]["steps"]


@pytest.mark.parametrize("tamper, words", [
    (lambda out, other: (out / "ledger.json").unlink(), "ledger.json"),
    (lambda out, other: (out / "checkpoints" / "last.ckpt").unlink(), "last.ckpt"),
    (lambda out, other: (out / "ledger.json").write_text(json.dumps(
        {**json.loads((out / "ledger.json").read_text()),
         "ledger": {**json.loads((out / "ledger.json").read_text())["ledger"], "steps": 0, "epochs": 0}})),
     "rolled back"),
    (lambda out, other: shutil.copy(other / "checkpoints" / "last.ckpt", out / "checkpoints" / "last.ckpt"),
     "already took"),  # another run's checkpoint, one epoch further than this run's ledger
    (lambda out, other: (out / "ledger.json").write_text(json.dumps(
        {**json.loads((out / "ledger.json").read_text()),
         "ledger": {**json.loads((out / "ledger.json").read_text())["ledger"], "noise_multiplier": 99.0}})),
     "does not match"),
])
def test_a_ledger_that_does_not_match_its_checkpoint_is_refused(tiny_csv, tmp_path, monkeypatch, capsys, tamper,
                                                                words):
    out = _interrupted(tiny_csv, tmp_path, monkeypatch)
    other = tmp_path / "other"
    _interrupt_after(monkeypatch, 1)
    assert _fit(["--data", str(tiny_csv), *ARGS, "--output-dir", str(other)]) == 1
    monkeypatch.undo()
    tamper(out, other)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        _fit(["--resume", str(out)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--resume" in err and words in err, err
    assert not (out / "report.json").exists()


def test_another_runs_checkpoint_with_no_more_steps_is_continued_with_this_runs_count(tiny_csv, tmp_path,
                                                                                      monkeypatch):
    """A checkpoint swapped in from another run (same settings, same steps) is not refused, but the resumed model
    is charged with this run's count: its own steps are never undercounted."""
    out = _interrupted(tiny_csv, tmp_path, monkeypatch, epoch=1, batches=3)  # ledger: 1 epoch + 3 steps
    other = tmp_path / "other"
    _interrupt_after(monkeypatch, 0)
    assert _fit(["--data", str(tiny_csv), *ARGS, "--output-dir", str(other)]) == 1
    monkeypatch.undo()
    shutil.copy(other / "checkpoints" / "last.ckpt", out / "checkpoints" / "last.ckpt")
    taken = _ledger(out)["steps"]
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["dpts_privacy_ledger"]["steps"]
    assert taken > saved
    assert _fit(["--resume", str(out)]) == 0
    report = _report(out)
    assert report["privacy_ledger"]["steps"] == taken + (report["steps"] - saved)


def test_conflicting_options_are_refused_naming_them(tiny_csv, tmp_path, monkeypatch, capsys):
    out = _interrupted(tiny_csv, tmp_path, monkeypatch)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        _fit(["--resume", str(out), "--epsilon", "5", "--batch-size", "8", "--max-grad-norm", "2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--epsilon" in err and "--max-grad-norm" in err and "--batch-size," not in err
    assert not (out / "report.json").exists()


def test_a_seeded_run_is_not_resumed(tiny_csv, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    _interrupt_after(monkeypatch, 0)
    assert _fit(["--data", str(tiny_csv), *ARGS, "--seed", "3", "--output-dir", str(out)]) == 1
    monkeypatch.undo()
    assert "3" not in json.dumps(json.loads((out / "ledger.json").read_text())["config"]["seed"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        _fit(["--resume", str(out)])
    assert exit_.value.code == 2 and "seeded" in capsys.readouterr().err


def test_resume_of_a_missing_directory_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        _fit(["--resume", str(tmp_path / "nothing")])
    assert exit_.value.code == 2 and "--resume" in capsys.readouterr().err


# -- ledger.json written ahead of the steps (issue 44) ----------------------------------------------------------------

_KILLER = r'''
import json, os, signal, sys
import lightning_dpts.app.resume as resume
from lightning_dpts.app.cli import main

where, epoch, batch, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
real = resume.make_run_ledger_callback

def make(*args, **kwargs):
    callback = real(*args, **kwargs)

    class Killed(type(callback)):
        def _kill(self, trainer, batch_idx):
            if trainer.current_epoch == epoch and batch_idx == batch:
                steps = self._strategy(trainer).ledger.steps  # noisy steps applied to the weights so far
                with open(side, "w") as handle:
                    handle.write(json.dumps({"taken": steps}))
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_start(self, trainer, pl_module, b, batch_idx):  # before the step's reservation
            if where == "batch_start":
                self._kill(trainer, batch_idx)
            super().on_train_batch_start(trainer, pl_module, b, batch_idx)

        def on_train_batch_end(self, trainer, pl_module, outputs, b, batch_idx):  # right after the optimizer step
            if where == "batch_end":
                self._kill(trainer, batch_idx)
            super().on_train_batch_end(trainer, pl_module, outputs, b, batch_idx)

    callback.__class__ = Killed
    return callback

resume.make_run_ledger_callback = make
main(["fit", *sys.argv[5:]])
'''


@pytest.mark.parametrize("where", ["batch_end", pytest.param("batch_start", marks=pytest.mark.slow)])
def test_a_run_killed_between_any_two_steps_is_charged_every_step_it_took(tiny_csv, tmp_path, where):
    """Attacker: kill -9 the training process right after an optimizer step (where the per-step write used to come
    next: it then undercounted by one step) or right before a step's reservation; resume. ledger.json counts at
    least every step applied to the weights, and the resumed run is charged for them."""
    import os
    import signal
    import subprocess
    import sys

    out, side = tmp_path / "run", tmp_path / "taken.json"
    argv = [sys.executable, "-c", _KILLER, where, "1", "2", str(side), "--data", str(tiny_csv), *ARGS,
            "--output-dir", str(out)]
    done = subprocess.run(argv, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    taken = json.loads(side.read_text())["taken"]
    stored = json.loads((out / "ledger.json").read_text())
    saved = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["dpts_privacy_ledger"]["steps"]
    assert stored["counts"] == "reserved" and saved < taken <= stored["ledger"]["steps"]
    from lightning_dpts.app.resume import RESERVED_STEPS

    assert stored["ledger"]["steps"] - taken < RESERVED_STEPS + 1  # over-counted by fewer than one reservation
    assert _fit(["--resume", str(out)]) == 0
    report = _report(out)
    new = report["steps"] - saved  # the steps the resumed fit took from the checkpoint's weights
    assert report["privacy_ledger"]["steps"] == stored["ledger"]["steps"] + new >= taken + new
    assert _ledger(out)["steps"] == report["privacy_ledger"]["steps"]
    assert json.loads((out / "ledger.json").read_text())["counts"] == "exact"


def test_ledger_json_covers_every_step_before_it_touches_the_data(tiny_csv, tmp_path, monkeypatch):
    """At every step, when the batch is about to reach training_step and again when its noisy update is about to
    be applied, ledger.json on disk already counts that step; it is rewritten about once per RESERVED_STEPS steps
    and per epoch, not after every step."""
    import lightning as L

    import lightning_dpts.app.resume as resume

    out = tmp_path / "run"
    seen: list[tuple[int, int]] = []
    keepers = []
    real = resume.make_run_ledger_callback

    def make(*args, **kwargs):
        keeper = real(*args, **kwargs)
        keepers.append(keeper)

        class Check(L.Callback):
            def _on_disk(self) -> int:
                return json.loads((out / "ledger.json").read_text())["ledger"]["steps"]

            def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # after the keeper's
                steps, _ = keeper._strategy(trainer).counts_after_next_step()
                seen.append((steps, self._on_disk()))

            def on_before_optimizer_step(self, trainer, pl_module, optimizer):  # after the strategy counted it
                seen.append((keeper._strategy(trainer).ledger.steps, self._on_disk()))

        original = keeper.on_train_batch_start

        def start(trainer, *a):
            original(trainer, *a)
            Check().on_train_batch_start(trainer, *a)

        keeper.on_train_batch_start = start
        check = Check()
        keeper.on_before_optimizer_step = check.on_before_optimizer_step
        return keeper

    monkeypatch.setattr(resume, "make_run_ledger_callback", make)
    assert _fit(["--data", str(tiny_csv), *ARGS, "--output-dir", str(out)]) == 0
    monkeypatch.undo()
    report = _report(out)
    steps, epochs = report["privacy_ledger"]["steps"], report["privacy_ledger"]["epochs"]
    assert len(seen) == 2 * steps and all(disk >= step for step, disk in seen), seen
    assert _ledger(out)["steps"] == steps
    # train start, one reservation per epoch (its steps are fewer than RESERVED_STEPS), train end
    assert keepers[0].writes <= 2 + epochs + steps // resume.RESERVED_STEPS < 2 + steps


def test_a_reservation_covers_the_epochs_its_steps_may_start_and_stays_within_the_epoch_per_epoch():
    """10 batches per epoch, 3 into the epoch: per-step accounting reserves RESERVED_STEPS steps and the epochs they
    may start; per-epoch accounting (epsilon grows with the epochs) only the rest of this epoch; never beyond
    max_steps."""
    from types import SimpleNamespace

    from lightning_dpts.app.resume import RESERVED_STEPS, _reservation
    from lightning_dpts.privacy import SamplingSpec

    def trainer(top_level: str, max_steps: int = -1, batches: float = 10) -> SimpleNamespace:
        spec = SamplingSpec(num_series=80, min_length=40, context_length=4, prediction_length=4, batch_size=8,
                            top_level=top_level)
        return SimpleNamespace(max_steps=max_steps, global_step=100, num_training_batches=batches,
                               datamodule=SimpleNamespace(sampling_spec=spec))

    assert RESERVED_STEPS == 32
    # steps 101..132 from batch 3 of 10: 7 in this epoch, then 25 more: 3 more epochs started
    assert _reservation(trainer("without_replacement"), 3, 101, 11) == (132, 14)
    assert _reservation(trainer("shuffling"), 3, 101, 11) == (107, 11)
    assert _reservation(trainer("without_replacement", max_steps=105), 3, 101, 11) == (105, 11)
    assert _reservation(trainer("without_replacement", batches=float("inf")), 3, 101, 11) == (132, 42)

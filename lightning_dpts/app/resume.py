"""``dpts fit --resume RUN_DIR``: continue an interrupted run from its last checkpoint, through the privacy ledger.

A ``dpts fit`` run keeps two public files for this (counts and settings only, never a seed or randomness):

* ``checkpoints/last.ckpt``: a full Lightning checkpoint written at the end of every training epoch (weights,
  optimizer state, loop state, the strategy's :class:`~lightning_dpts.training.ledger.PrivacyLedger`), written
  atomically;
* :data:`RUN_LEDGER` (``ledger.json``): the run's configuration as given and its ledger. It counts every noisy step
  this run directory ever took, including steps taken after the last checkpoint (lost at an interruption) and the
  steps of an earlier continuation from an older checkpoint. It is written ahead of the steps
  (:data:`RESERVED_STEPS`): before a step whose count the file does not cover touches the data, the file is
  rewritten to cover it and the next steps of the fit, ``RESERVED_STEPS`` in all at most, with the epochs they may
  start (``"counts": "reserved"``; per-epoch accounting reserves within the current epoch), so a process killed at
  any point (``kill -9`` between any two instructions) leaves a file that over-counts by fewer than
  ``RESERVED_STEPS`` steps and never under-counts; the exact counts are written at the end of training and when
  training stops on an exception (``"counts": "exact"``). One write per ``RESERVED_STEPS`` steps (per epoch with
  per-epoch accounting) instead of one per step.

Resuming (:func:`check_resume`, :func:`make_run_ledger_callback`) continues ``last.ckpt`` with the stored
configuration and accounts ``max(ledger.json, checkpoint)`` noisy steps before any new one (docs/privacy.md rule
7: every noisy step that touched the data counted once), so the final epsilon is that of one uninterrupted run
of the same total steps. It refuses, before any work: a directory without either file; a checkpoint whose ledger
was accounted with other settings (sigma, C, sampling, noise) than ``ledger.json``; a ``ledger.json`` that counts
fewer steps than the checkpoint (a rolled-back or replaced ledger); a BandMF run (its noise band is never
stored); a seeded run (its seed is never stored, so it cannot continue as the reproducible run it was);
options that conflict with the stored configuration.

A checkpoint put there from another run is refused when it holds more steps than ``ledger.json`` counts, and
otherwise continued with this run's larger count (the model's steps are then over-, never under-counted). The
files carry no run identifier: the public files of a seeded run stay byte-identical on neighbouring datasets.

What the files cannot show: a user who restores *both* files from a backup (or copies the whole directory and
resumes each copy) releases two continuations of the same steps; each one's epsilon is true for its own model,
but the two together are not covered.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from lightning_dpts.errors import ConfigurationError

__all__ = ["LAST_CHECKPOINT", "RESERVED_STEPS", "RUN_LEDGER", "ResumeState", "check_resume", "resumed_config",
           "write_run_ledger"]

#: The run's ledger file (public: counts, settings and the configuration as given).
RUN_LEDGER = "ledger.json"
#: The checkpoint ``--resume`` continues (public: the DP model's state at the end of the last epoch).
LAST_CHECKPOINT = "checkpoints/last.ckpt"
#: Noisy steps one write of ``ledger.json`` reserves ahead (a crash over-counts by fewer; the per-step write it
#: replaces cost 0.06-0.36 ms, measured)
RESERVED_STEPS = 32
#: Options that may differ from the stored configuration on ``--resume`` (they change no training setting).
RESUME_MAY_CHANGE = ("verbose", "resume", "output_dir", "overwrite")


def _stored_config(config: Any) -> dict[str, Any]:
    """The configuration as given, for ``ledger.json`` (the seed is never written: only whether there was one)."""
    out = asdict(config)
    out["seed"] = "explicit (not recorded)" if config.seed is not None else None
    return out


def write_run_ledger(path: Path, config: Any, ledger: dict[str, Any]) -> None:
    """Write ``ledger.json`` with exact counts (tmp file and ``os.replace``: a kill leaves the old or the new file,
    never half)."""
    _write_ledger_text(path, _config_text(config), ledger)


def _config_text(config: Any) -> str:
    """The stored configuration as JSON text (serialised once per run: it does not change between steps)."""
    return json.dumps(_stored_config(config), indent=2)


def _write_ledger_text(path: Path, config_text: str, ledger: dict[str, Any], counts: str = "exact") -> None:
    """:func:`write_run_ledger` with the configuration already serialised (the write during training); ``counts``:
    ``"exact"``, or ``"reserved"`` for a write-ahead copy whose counts cover steps not taken yet."""
    text = (f'{{"written_by": "lightning_dpts", "counts": "{counts}", "config": {config_text}, '
            f'"ledger": {json.dumps(ledger, indent=2)}}}')
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_run_ledger(run_dir: Path) -> dict[str, Any]:
    path = run_dir / RUN_LEDGER
    if not path.is_file():
        raise ConfigurationError("resume", str(run_dir), f"has no {RUN_LEDGER}: it is not a dpts fit run directory "
                                 "(or its ledger was removed, which a resume cannot account around); start a new run")
    try:
        data = json.loads(path.read_text())
        ok = isinstance(data, dict) and isinstance(data.get("ledger"), dict) and isinstance(data.get("config"), dict)
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise ConfigurationError("resume", str(run_dir), f"{RUN_LEDGER} cannot be read as a dpts run ledger")
    return data


def resumed_config(run_dir: str | Path, given: dict[str, Any]) -> Any:
    """The configuration a resume runs with: the stored one, with ``given`` options checked against it.

    ``given``: the options the user set (on the command line, in YAML or in Python). Any of them other than
    :data:`RESUME_MAY_CHANGE` whose value differs from the stored one is refused (``ConfigurationError`` naming
    every such option), as is ``output_dir`` other than ``run_dir``.
    """
    from lightning_dpts.app.config import FitConfig

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigurationError("resume", str(run_dir), "no such run directory")
    stored = _read_run_ledger(run_dir)["config"]
    if stored.get("seed") is not None:
        raise ConfigurationError("resume", str(run_dir), "is a seeded run: its seed is never stored, so it cannot be "
                                 "continued as the reproducible run it was (and a seed given again could not be "
                                 "checked); seeded runs are for experiments: start it anew")
    if stored.get("bands") is not None:
        raise ConfigurationError("resume", str(run_dir), "is a BandMF run (--bands): its noise band and b-min-sep "
                                 "history are secret and never stored, so it cannot be continued (docs/bandmf.md); "
                                 "start it anew")
    known = {f.name for f in fields(FitConfig)}
    values = {k: v for k, v in stored.items() if k in known and k not in ("resume", "seed")}
    conflicts = []
    for key, value in given.items():
        if key in RESUME_MAY_CHANGE:
            continue
        if key not in values or values[key] != value:
            conflicts.append(f"{key}={value!r} (the run has {values.get(key)!r})")
    if given.get("output_dir") is not None and Path(given["output_dir"]).resolve() != run_dir.resolve() and \
            "output_dir" in given and given["output_dir"] != FitConfig.output_dir:
        conflicts.append(f"output_dir={given['output_dir']!r} (a resume writes into {str(run_dir)!r})")
    if conflicts:
        from lightning_dpts.app.config import option_flags

        flags = option_flags()
        names = ", ".join(flags.get(c.split("=")[0], c.split("=")[0]) for c in conflicts)
        raise ConfigurationError(
            "resume", str(run_dir), f"continues with the run's own configuration; these options differ from it: "
            f"{names} ({'; '.join(conflicts)}). Omit them (a resumed run must train exactly as it started)")
    values.update(resume=str(run_dir), output_dir=str(run_dir), overwrite=False,
                  verbose=bool(given.get("verbose", values.get("verbose", False))))
    return FitConfig.from_mapping(values, source=None)


class ResumeState:
    """What a checked run directory resumes from (:func:`check_resume`)."""

    def __init__(self, run_dir: Path, checkpoint: Path, steps: int, epochs: int,
                 ledger: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.steps = steps  # noisy steps the run directory ever took (ledger.json), >= the checkpoint's
        self.epochs = epochs
        self.ledger = ledger


def check_resume(run_dir: str | Path) -> ResumeState:
    """Refuse a run directory whose ledger and checkpoint do not belong together (see the module docstring)."""
    from lightning_dpts.training.ledger import read_ledger

    run_dir = Path(run_dir)
    data = _read_run_ledger(run_dir)
    checkpoint = run_dir / LAST_CHECKPOINT
    if not checkpoint.is_file():
        raise ConfigurationError("resume", str(run_dir), f"has no {LAST_CHECKPOINT}: the run stopped before the end "
                                 "of its first epoch (nothing to continue); start it again with --overwrite")
    import torch

    try:
        saved = torch.load(str(checkpoint), map_location="cpu", weights_only=False)
    except Exception as err:  # a truncated or foreign file
        raise ConfigurationError("resume", str(run_dir), f"{LAST_CHECKPOINT} cannot be loaded ({type(err).__name__}: "
                                 f"{err})") from err
    ckpt = read_ledger(saved) if isinstance(saved, dict) else None
    if ckpt is None:
        raise ConfigurationError("resume", str(run_dir), f"{LAST_CHECKPOINT} carries no privacy ledger")
    run_ledger = data["ledger"]
    for name in ("noise_multiplier", "max_grad_norm"):
        mine, theirs = run_ledger.get(name), getattr(ckpt, name)
        if mine is None or theirs is None or not math.isclose(float(mine), float(theirs), rel_tol=1e-9):
            raise ConfigurationError("resume", str(run_dir), f"{RUN_LEDGER} has {name}={mine} but {LAST_CHECKPOINT} "
                                     f"{theirs}: the ledger does not match the checkpoint")
    for name in ("sampling_spec", "noise", "bands"):
        if run_ledger.get(name) != getattr(ckpt, name):
            raise ConfigurationError("resume", str(run_dir), f"{RUN_LEDGER} and {LAST_CHECKPOINT} differ in {name}: "
                                     "the ledger does not match the checkpoint")
    steps, epochs = int(run_ledger.get("steps", -1)), int(run_ledger.get("epochs", -1))
    if steps < ckpt.steps or epochs < ckpt.epochs:
        raise ConfigurationError("resume", str(run_dir), f"{RUN_LEDGER} counts {steps} noisy steps ({epochs} epochs) "
                                 f"but {LAST_CHECKPOINT} already took {ckpt.steps} ({ckpt.epochs}): the ledger was "
                                 "rolled back or replaced and does not match the checkpoint")
    return ResumeState(run_dir, checkpoint, steps, epochs, run_ledger)


def _reservation(trainer: Any, batch_idx: int, steps: int, epochs: int) -> tuple[int, int]:
    """(steps, epochs) a write-ahead ``ledger.json`` covers from the step about to start (after which the ledger counts
    ``steps`` and ``epochs``): :data:`RESERVED_STEPS` steps at most, none beyond the Trainer's ``max_steps``. Per-epoch
    accounting (iteration/shuffling top levels: epsilon grows with the epochs) reserves within this epoch only;
    otherwise the epochs that the reserved steps may start are reserved too (they do not enter epsilon there)."""
    from lightning_dpts.training.guards import spec_or_none

    ahead = RESERVED_STEPS
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        ahead = min(ahead, trainer.max_steps - trainer.global_step)
    ahead = max(ahead, 1)
    per_epoch = trainer.num_training_batches
    finite = isinstance(per_epoch, int) or (isinstance(per_epoch, float) and math.isfinite(per_epoch))
    left = int(per_epoch) - batch_idx if finite else None  # steps left in this epoch, this one included
    spec = spec_or_none(trainer)
    if spec is not None and spec.accounts_per_epoch:
        return steps - 1 + (min(ahead, left) if left is not None and left > 0 else 1), epochs
    if left is None or left <= 0:
        return steps - 1 + ahead, epochs + ahead - 1  # every further step may start an epoch
    return steps - 1 + ahead, epochs + -(-max(0, ahead - left) // max(int(per_epoch), 1))


def make_run_ledger_callback(run_dir: Path, config: Any, resume: ResumeState | None) -> Any:
    """The callback that keeps ``ledger.json`` and ``checkpoints/last.ckpt`` (a Lightning ``Callback``)."""
    import lightning as L

    from lightning_dpts.outputs import atomic_path

    config_text = _config_text(config)  # written during training: serialised once here

    class RunLedgerCallback(L.Callback):
        """Keeps ``ledger.json`` ahead of the noisy steps (reserved counts, :data:`RESERVED_STEPS`), saves
        ``last.ckpt`` at every epoch's end and when Ctrl-C stops the fit, and on a resume charges the steps the run
        directory took beyond the checkpoint before the accountant plans.

        Attributes: ``started`` (training began: the strategy's and the accountant's train-start checks passed),
        ``interrupted`` (Ctrl-C stopped the fit), ``saved`` (``ledger.json`` and ``last.ckpt`` were written for a
        resume after it), ``reserved`` (the (steps, epochs) the file covers while training), ``writes`` (writes of
        ``ledger.json`` by this callback)."""

        def __init__(self) -> None:
            self.reserved: tuple[int, int] | None = None
            self.writes = 0
            self.started = False
            self.interrupted = False
            self.saved = False

        def _strategy(self, trainer: L.Trainer) -> Any:
            from lightning_dpts.training import DPForecastStrategy

            return next(c for c in trainer.callbacks if isinstance(c, DPForecastStrategy))

        def _write(self, trainer: L.Trainer, reserve: tuple[int, int] | None = None) -> None:
            if trainer.is_global_zero:
                ledger = self._strategy(trainer).ledger.to_dict()
                if reserve is not None:
                    ledger["steps"], ledger["epochs"] = max(ledger["steps"], reserve[0]), max(ledger["epochs"],
                                                                                          reserve[1])
                _write_ledger_text(run_dir / RUN_LEDGER, config_text, ledger,
                                   "exact" if reserve is None else "reserved")
                self.writes += 1

        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            if resume is not None:  # after Lightning restored the checkpoint, before the accountant plans
                self._strategy(trainer).charge_restored(resume.steps, resume.epochs)

        def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.reserved = None
            self._write(trainer)  # after the accountant's: the fit's ledger has begun (charged on a resume)
            self.started = True

        def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
            """Training stopped in this process: the exact counts replace the reservation. Ctrl-C also writes what
            ``--resume`` needs, the ledger first (it never counts fewer steps than the checkpoint). Lightning calls
            this after the strategy's own clean-up, before it exits the process."""
            if self.reserved is not None:
                self.reserved = None
                self._write(trainer)
            if not isinstance(exception, KeyboardInterrupt):
                return
            self.interrupted = True
            if not self.started:
                return
            try:
                self._write(trainer)
                with atomic_path(run_dir / LAST_CHECKPOINT) as tmp:
                    trainer.save_checkpoint(str(tmp))
            except Exception:  # noqa: BLE001 - the interrupt goes on; the message then says nothing was saved
                return
            self.saved = True

        def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                                 batch_idx: int) -> None:
            # before this batch reaches training_step (the strategy's hooks ran: it lists after the strategy), the
            # file covers the counts the ledger will have after this step: else reserve this step and the next ones
            steps, epochs = self._strategy(trainer).counts_after_next_step()
            if self.reserved is None or steps > self.reserved[0] or epochs > self.reserved[1]:
                self.reserved = _reservation(trainer, batch_idx, steps, epochs)
                self._write(trainer, self.reserved)

        def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            self.reserved = None
            self._write(trainer)

        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            # ledger.json covers at least this epoch's steps (reserved before each of them), so it never counts
            # fewer steps than the checkpoint
            with atomic_path(run_dir / LAST_CHECKPOINT) as tmp:
                trainer.save_checkpoint(str(tmp))

    return RunLedgerCallback()  # dpts fit lists it after the strategy and the AccountantCallback

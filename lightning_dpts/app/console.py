"""What the ``dpts`` command prints: quiet by default, everything with ``--verbose``.

Quiet (the default of every ``dpts`` command that trains or forecasts):

* known third-party warnings (:data:`KNOWN_THIRD_PARTY_WARNINGS`: GluonTS' frequency and json notices,
  Lightning's dataloader/validation/logging-interval/pytree notices) are filtered, and Lightning's info lines
  ("GPU available", the litlogger tip, "`weights_only` was not set", ...) are not shown;
* each of this package's warnings is printed once, as ``WARNING: text`` without a source path (a job that
  reports a warning itself and also raises it as a Python warning for Python callers shows it once);
* Lightning's progress bar is shown only when stdout is a terminal; otherwise :func:`step_lines` prints a line
  every N optimizer steps.

Python users of the library see everything unchanged: nothing here runs outside :func:`dpts_console`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["KNOWN_THIRD_PARTY_WARNINGS", "Console", "DeltaWarning", "dpts_console", "progress_bar_wanted", "step_lines",
           "to_stderr", "warn_delta_above_one_over_n"]

#: Message patterns (regular expressions, matched at the start) of third-party warnings ``dpts`` hides unless
#: ``--verbose``: none of them is actionable for a ``dpts`` user.
KNOWN_THIRD_PARTY_WARNINGS: tuple[str, ...] = (
    r"'M' is deprecated",  # GluonTS passes pandas' old monthly alias
    r"Using `json`-module",  # GluonTS without orjson/ujson
    r"Your `IterableDataset` has `__len__` defined",  # Lightning, about worker processes we do not use
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # Lightning vs torch's pytree
    r"You defined a `validation_step` but have no `val_dataloader`",  # GluonTS modules, no validation windows
    r"The number of training batches \(\d+\) is smaller than the logging interval",  # Lightning
    r"`weights_only` was not set",  # Lightning's checkpoint loading
    r".*litlogger",  # Lightning's tips
)
#: Loggers whose info lines (devices, tips, "Trainer.fit stopped") ``dpts`` hides unless ``--verbose``.
#: The named children too: importing Lightning resets its package loggers to INFO, not the children's own level.
_QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "gluonts",
                  "lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero",
                  "lightning.pytorch.trainer.connectors.checkpoint_connector")
#: Prefixes that do not change what a warning says: the severity, the command, the raising class (a capitalised word
#: with a lower-case letter, so that ``VERDICT:`` stays).
_PREFIXES = re.compile(r"^(?:WARNING: |warning: |dpts \w+: |[A-Z][A-Za-z]*[a-z][A-Za-z]*: )+")


class DeltaWarning(UserWarning):
    """delta >= 1/N: the guarantee allows a mechanism that publishes one unit's data in the clear."""


def warn_delta_above_one_over_n(delta: float | None, population: int | None, unit: str = "series") -> bool:
    """Warn (once per text, :class:`DeltaWarning`) when ``delta >= 1/population``; returns whether it warned.

    An (epsilon, delta) guarantee with delta >= 1/N is met by a mechanism that publishes the data of one randomly
    chosen of the N units (series, users) unchanged, whatever epsilon says; the usual advice is delta much smaller
    than 1/N (the package's examples use 1e-7). ``dpts`` prints it once as ``WARNING: ...``
    (:meth:`Console.showwarning`).
    """
    if delta is None or population is None or population < 1 or not delta >= 1.0 / population:
        return False
    warnings.warn(
        f"dpts privacy: delta={delta:g} is >= 1/N = 1/{population} (N = {population} {unit}): such a guarantee "
        f"also holds for a mechanism that publishes one randomly chosen unit's data in the clear; choose delta well "
        f"below 1/N (e.g. 1e-7)", DeltaWarning, stacklevel=2)
    return True


def progress_bar_wanted(verbose: bool = False) -> bool:
    """Lightning's progress bar only on a terminal (or with ``--verbose``): a log file gets :func:`step_lines`."""
    return verbose or sys.stdout.isatty()


class Console:
    """Prints job lines and this package's warnings, each warning text once."""

    def __init__(self, write: Callable[[str], None] = print) -> None:
        self._write = write
        self._warned: set[str] = set()

    @staticmethod
    def _key(text: str) -> str:
        return _PREFIXES.sub("", text.strip())

    def say(self, text: str) -> None:
        """A job's progress text; a ``WARNING: ...`` line whose warning was already shown is not repeated."""
        kept = []
        for line in text.split("\n"):
            if line.lower().startswith("warning: "):
                key = self._key(line)
                if key in self._warned:
                    continue
                self._warned.add(key)
            kept.append(line)
        if kept:
            self._write("\n".join(kept))

    def showwarning(self, message: Any, category: type[Warning], filename: str, lineno: int,
                    file: Any = None, line: str | None = None) -> None:
        """``warnings.showwarning`` for ``dpts``: this package's warnings as ``WARNING: text``, once each."""
        text = str(message)
        if "lightning_dpts" not in filename.replace("\\", "/") and not text.startswith(("dpts ", "lightning-dpts: ")):
            print(warnings.formatwarning(message, category, filename, lineno, line), file=sys.stderr, end="")
            return
        key = self._key(text)
        if key in self._warned:
            return
        self._warned.add(key)
        self._write(f"WARNING: {key}")


def step_lines(every: int | None = None, write: Callable[[str], None] = print) -> Any:
    """A Lightning callback printing one line every ``every`` optimizer steps (default: a tenth of the planned
    steps) and at the end of training: the progress report ``dpts`` gives when stdout is not a terminal.

    A line shows the step, the epoch and the :class:`~lightning_dpts.training.AccountantCallback`'s last logged
    values (epsilon and the membership read-outs: public functions of the configuration), never a metric the module
    logs: its training loss is computed on private batches without noise, and these lines go to a log file
    (``private/logs/`` keeps the loss, for the data owner)."""
    from lightning.pytorch.callbacks import Callback

    class StepLines(Callback):
        def __init__(self) -> None:
            self.every = every
            self._last = -1

        def on_train_start(self, trainer: Any, *args: Any) -> None:
            if self.every is None:
                planned = trainer.estimated_stepping_batches
                self.every = max(1, int(planned) // 10) if planned and planned != float("inf") else 50

        def _line(self, trainer: Any) -> None:
            step = int(trainer.global_step)
            if step == self._last:
                return
            self._last = step
            metrics: dict[str, Any] = {}
            for callback in trainer.callbacks:  # the AccountantCallback's last epsilon (it skips the metrics
                metrics.update(getattr(callback, "last_logged", {}))  # of a progress bar that is not there)
            shown = ", ".join(f"{k}={float(v):.4g}" for k, v in sorted(metrics.items()))
            write(f"  step {step}, epoch {trainer.current_epoch}" + (f": {shown}" if shown else ""))

        def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
            if trainer.global_step and trainer.global_step % max(1, self.every or 50) == 0:
                self._line(trainer)

        def on_train_end(self, trainer: Any, *args: Any) -> None:
            self._line(trainer)

    return StepLines()


def _warnings_recorded() -> bool:
    """Whether a ``catch_warnings(record=True)`` is active (it replaces the module's private display function)."""
    impl = getattr(warnings, "_showwarnmsg_impl", None)
    return impl is not None and getattr(impl, "__name__", "") != "_showwarnmsg_impl"


def to_stderr(text: str) -> None:
    """A console writer for commands whose stdout is their result (one JSON object with ``--json`` or
    ``--plan-only``): their warnings go to stderr."""
    print(text, file=sys.stderr)


@contextlib.contextmanager
def dpts_console(verbose: bool = False, write: Callable[[str], None] = print) -> Iterator[Console]:
    """The ``dpts`` command's output settings for the duration of one command (see the module docstring)."""
    console = Console(write)
    if verbose:
        with warnings.catch_warnings():
            warnings.filterwarnings("default", category=DeprecationWarning, message="lightning-dpts: ")
            yield console
        return
    levels = {name: logging.getLogger(name).level for name in _QUIET_LOGGERS}
    with warnings.catch_warnings():
        # this package's deprecations (old column names, lightning_dpts.data.columns): shown, once each
        warnings.filterwarnings("default", category=DeprecationWarning, message="lightning-dpts: ")
        for pattern in KNOWN_THIRD_PARTY_WARNINGS:
            warnings.filterwarnings("ignore", message=pattern)
        if not _warnings_recorded():  # a recorder (pytest.warns, catch_warnings(record=True)) keeps every warning
            warnings.showwarning = console.showwarning  # restored by catch_warnings
        for name in _QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
        try:
            yield console
        finally:
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)

"""Output directories of ``dpts fit`` and ``dpts synth``: atomic writes, a lock, overwrite only of our own files.

Every file a job writes goes through this module:

* :func:`atomic_path` yields a temporary path in the destination's directory; when the block ends without an
  error the file is flushed to disk (``fsync``) and renamed over the final path (``os.replace``, atomic on POSIX),
  so a failure (disk full, a crash, an exception while plotting) never leaves a truncated artifact at the final
  path. :func:`write_text` and :func:`write_json` are the common cases; a directory (the GluonTS predictor) is
  written the same way by :func:`atomic_directory`.
* :class:`OutputDirectory` owns one run directory. :func:`check_output_dir` (called before any heavy import or
  work) refuses a path that is a file, a non-empty directory (unless ``overwrite``) or a directory another run is
  writing; :meth:`OutputDirectory.open` then takes an exclusive ``fcntl.flock`` on ``DIR/.lock`` for the whole run
  (a second writer is refused), and with ``overwrite`` first removes the files the earlier run wrote. Which files
  those are is read from the run's journal ``DIR/.dpts-files.json``, which lists every path *before* it is
  written (so a run that failed half-way is covered too); a directory holding any file the journal does not list
  is refused rather than cleaned, so ``--overwrite`` never deletes a file this package did not write. A
  :class:`ConfigurationError` raised inside the ``with`` block (a refusal that only training can detect) removes
  what the run wrote and the directories it created, so a refused run leaves nothing behind.

Each path is registered with whether the (epsilon, delta) guarantee covers it: :meth:`OutputDirectory.manifest`
gives the ``"files"`` manifest that ``report.json`` carries (``"public: ..."`` or ``"private: ..."``; a private
directory is listed as one entry, since the names of the files in it may hold a host name, a process id or a time).
Everything computed from the private data without DP lives under :data:`PRIVATE_DIR`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightning_dpts.errors import ConfigurationError

__all__ = ["JOURNAL", "LOCK", "PRIVATE_DIR", "OutputDirectory", "atomic_directory", "atomic_path",
           "check_output_dir", "pyplot", "save_figure", "write_json", "write_text"]

#: Sub-directory for everything computed from the private data without DP (not covered by the guarantee).
PRIVATE_DIR = "private"
#: Lock file held (``fcntl.flock``) while a run writes the directory.
LOCK = ".lock"
#: The run's journal: every path it writes, listed before it is written (what ``--overwrite`` may remove).
JOURNAL = ".dpts-files.json"
_OWN = (LOCK, JOURNAL)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary file path next to ``path``; on success fsync it and rename it to ``path``.

    On an exception the temporary file is removed and ``path`` is left as it was (absent, or the old file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


@contextlib.contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary directory next to ``path``; on success rename it to ``path`` (an existing directory there
    is replaced only after the new one is complete)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        for child in tmp.rglob("*"):
            if child.is_file():
                with open(child, "rb+") as handle:
                    os.fsync(handle.fileno())
        old = None
        if path.is_dir():  # an earlier export: moved aside, then removed once the new one is in place
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(path.parent)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON to ``path`` atomically (non-JSON values as ``str``)."""
    return write_text(path, json.dumps(data, indent=2, default=str))


def _files(directory: Path) -> list[str]:
    """Relative paths of every file (and empty directory) under ``directory``, ours (lock, journal) excluded."""
    out = []
    for child in sorted(directory.rglob("*")):
        rel = child.relative_to(directory).as_posix()
        if rel in _OWN:
            continue
        if child.is_file() or child.is_symlink() or (child.is_dir() and not any(child.iterdir())):
            out.append(rel)
    return out


def _journal(directory: Path) -> list[str]:
    try:
        entries = json.loads((directory / JOURNAL).read_text())["paths"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [str(e) for e in entries  # only relative paths inside the directory
            if isinstance(e, str) and e and not e.startswith("/") and ".." not in Path(e).parts]


_LEFTOVER = re.compile(r"^\.(.+)\.[A-Za-z0-9_]+\.(tmp|old)$")


def _covered(rel: str, entries: list[str]) -> bool:
    """Whether the journal lists ``rel`` (or a directory above it, entries ending in ``/``).

    A temporary file or directory that :func:`atomic_path` / :func:`atomic_directory` left for a listed path when
    the process was killed mid-write (``.NAME.<random>.tmp`` or ``.old``, and anything inside it) counts as that
    path.
    """
    parts = Path(rel).parts
    for i, part in enumerate(parts):
        match = _LEFTOVER.match(part)
        if match:
            rel = Path(*parts[:i], match.group(1)).as_posix()
            break
    return any(rel == e.rstrip("/") or (e.endswith("/") and rel.startswith(e)) for e in entries)


def _held_by_another(directory: Path) -> bool:
    """Whether another process holds the directory's lock (without creating anything)."""
    import fcntl

    lock = directory / LOCK
    if not lock.is_file():
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the probe lock
    return False


def check_output_dir(path: str | Path, overwrite: bool, parameter: str = "output_dir", *,
                     probe_lock: bool = True) -> None:
    """Refuse an unusable output directory before any work, creating nothing.

    Raises :class:`ConfigurationError` (``parameter``) when ``path`` is a file (or under one), is a directory that
    another run is writing (its lock is held), or is a non-empty directory and ``overwrite`` is false; with
    ``overwrite``, when it holds any file that the earlier run's journal does not list (never deleted).
    """
    path = Path(path)
    for above in (path, *path.parents):
        if above.exists() and not above.is_dir():
            raise ConfigurationError(parameter, str(path), f"{above} is a file, not a directory; choose another "
                                     "--output-dir")
    if not path.is_dir():
        return
    if probe_lock and _held_by_another(path):
        raise ConfigurationError(parameter, str(path), "is being written by another dpts run (its lock "
                                 f"{LOCK} is held); wait for it or choose another --output-dir")
    present = _files(path)
    if not present:
        return
    if not overwrite:
        raise ConfigurationError(parameter, str(path), f"is not empty ({len(present)} files, e.g. "
                                 f"{present[0]!r}); choose an empty or new directory, or pass --overwrite to "
                                 "remove the earlier run's files first")
    journal = _journal(path)
    foreign = [rel for rel in present if not _covered(rel, journal)]
    if foreign:
        raise ConfigurationError(parameter, str(path), f"holds {len(foreign)} files that no earlier dpts run "
                                 f"listed in {JOURNAL} (e.g. {foreign[0]!r}); --overwrite removes only files this "
                                 "package wrote: move them or choose another --output-dir")


class OutputDirectory:
    """One run directory, locked while the run writes it; see the module docstring.

    Usage::

        check_output_dir(path, overwrite)          # first, before any work
        ...                                        # validate inputs, load data
        with OutputDirectory(path, overwrite) as out:
            out.register("report.json", "public: ...")
            write_json(out.path("report.json"), ...)
    """

    def __init__(self, directory: str | Path, overwrite: bool = False, parameter: str = "output_dir", *,
                 keep: dict[str, str] | None = None, resume: bool = False) -> None:
        """``keep``: file-name patterns (``fnmatch``, top level) -> description of the earlier run's files that
        ``overwrite`` keeps (public caches); they stay listed in the new journal. ``resume``: continue the run
        that wrote the directory (``dpts fit --resume``): its files stay (listed in the journal as before; a file
        the journal does not list is refused), and a refusal removes nothing."""
        self.root = Path(directory)
        self.resume = bool(resume)
        self._inherited: list[str] = []
        self.overwrite = bool(overwrite)
        self.parameter = parameter
        self.keep = dict(keep or {})
        self._created: list[Path] = []
        self._descriptions: dict[str, str] = {}
        self._lock_fd: int | None = None

    def open(self) -> OutputDirectory:
        """Create the directory, take the lock, then (``overwrite``) remove the earlier run's files."""
        import fcntl

        check_output_dir(self.root, self.overwrite or self.resume, self.parameter)
        self._created = [p for p in (self.root, *self.root.parents) if not p.exists()]
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigurationError(self.parameter, str(self.root), "is being written by another dpts run (its "
                                     f"lock {LOCK} is held); wait for it or choose another --output-dir") from None
        self._lock_fd = fd
        try:
            check_output_dir(self.root, self.overwrite or self.resume, self.parameter, probe_lock=False)  # again
            if self.resume:
                self._inherited = _journal(self.root)
            elif self.overwrite:
                self._remove_earlier()
            self._write_journal()
        except BaseException:
            self.close()
            raise
        return self

    def _kept(self, rel: str) -> str | None:
        import fnmatch

        return next((d for pattern, d in self.keep.items() if "/" not in rel and fnmatch.fnmatch(rel, pattern)),
                    None)

    def _remove_earlier(self) -> None:
        """Remove every file the earlier run's journal covers (leftover temporaries included), keeping the files
        that match ``keep``, then the directories left empty. :func:`check_output_dir` has refused any other file."""
        journal = _journal(self.root)
        for child in sorted(self.root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            rel = child.relative_to(self.root).as_posix()
            if rel in _OWN:
                continue
            if child.is_file() or child.is_symlink():
                kept = self._kept(rel) if rel in journal else None
                if kept is not None:
                    self._descriptions[rel] = kept
                elif _covered(rel, journal):
                    child.unlink()
            elif child.is_dir() and not any(child.iterdir()):
                child.rmdir()  # directories the earlier run left empty (e.g. private/)
        (self.root / JOURNAL).unlink(missing_ok=True)

    def close(self) -> None:
        """Release the lock (the empty lock file stays)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> OutputDirectory:
        return self.open()

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        if exc_type is not None and issubclass(exc_type, ConfigurationError) and not self.resume:
            self._discard()  # a refusal (e.g. a model buffer that changed) writes nothing
        self.close()

    def _discard(self) -> None:
        """Remove what this run wrote, and the directories it created, keeping kept caches of an earlier run."""
        for rel, description in self._descriptions.items():
            if description in self.keep.values():
                continue
            target = self.root / rel.rstrip("/")
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        self._descriptions = {rel: d for rel, d in self._descriptions.items() if d in self.keep.values()}
        if self._descriptions:
            self._write_journal()
        else:
            (self.root / JOURNAL).unlink(missing_ok=True)
        for child in sorted(self.root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if child.is_dir() and not any(child.iterdir()):
                child.rmdir()
        if self._created:
            (self.root / LOCK).unlink(missing_ok=True)
            for directory in self._created:  # deepest first
                try:
                    directory.rmdir()
                except OSError:
                    break

    def _write_journal(self) -> None:
        paths = sorted(set(self._descriptions) | set(self._inherited))
        write_json(self.root / JOURNAL, {"written_by": "lightning_dpts", "paths": paths})

    def register(self, rel: str, description: str) -> Path:
        """Record ``rel`` (relative path; a directory ends in ``/``) in the journal before it is written.

        ``description`` starts with ``"public: "`` (covered by the guarantee or public metadata) or
        ``"private: "`` (computed from the private data without DP; must lie under :data:`PRIVATE_DIR`).
        Returns the absolute path.
        """
        if not description.startswith(("public: ", "private: ")):
            raise ValueError(f"description of {rel!r} must start with 'public: ' or 'private: '")
        if description.startswith("private: ") != rel.startswith(f"{PRIVATE_DIR}/"):
            raise ValueError(f"{rel!r}: private files and only they belong under {PRIVATE_DIR}/")
        self._descriptions[rel] = description
        self._write_journal()
        return self.root / rel.rstrip("/")

    def path(self, rel: str) -> Path:
        """The absolute path of a registered entry."""
        if rel not in self._descriptions:
            raise KeyError(f"{rel!r} is not registered")
        return self.root / rel.rstrip("/")

    def manifest(self) -> dict[str, str]:
        """Every file written -> its description, plus the journal and lock files. Public directories are expanded
        file by file; a private directory is one entry (``"private/logs/"``): the names of the files in it are not
        public (a TensorBoard event file's name holds a time stamp, the host name and the process id)."""
        out: dict[str, str] = {}
        for rel, description in sorted(self._descriptions.items()):
            target = self.root / rel.rstrip("/")
            if rel.endswith("/") and rel.startswith(f"{PRIVATE_DIR}/"):
                if target.is_dir() and any(child.is_file() for child in target.rglob("*")):
                    out[rel] = description
            elif rel.endswith("/"):
                for child in sorted(target.rglob("*")) if target.is_dir() else []:
                    if child.is_file():
                        out[child.relative_to(self.root).as_posix()] = description
            elif target.exists() or rel == "report.json":
                out[rel] = description
        out[JOURNAL] = "public: the list of paths this run wrote (what --overwrite may remove)"
        out[LOCK] = "public: empty lock file (held while a run writes this directory)"
        return out


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only ``Agg`` backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as a PNG at ``path`` atomically (:func:`atomic_path`) and close it.

    No time stamp is written into the file (matplotlib's PNG metadata names only its version), so a plot of public
    numbers is the same bytes in every run.
    """
    plt = pyplot()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return Path(path)

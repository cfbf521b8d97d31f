"""One set of column names for long-format data, everywhere: ``item_id``, ``timestamp``, ``target``.

The parameters are ``id_column``, ``timestamp_column`` and ``value_column`` in Python (the datamodule,
:func:`~lightning_dpts.data.to_collection`, :class:`~lightning_dpts.app.config.FitConfig`,
:func:`~lightning_dpts.app.jobs.predict.predict_to_csv`), in YAML configs, and ``--id-column``,
``--timestamp-column``, ``--value-column`` on the command line; their defaults are GluonTS' field names
``item_id``, ``timestamp`` and ``target``.

The old names still work, with a ``DeprecationWarning`` (shown once): ``time_column`` / ``--time-column`` for the
time stamp column, and data whose columns are the old ``dpts`` defaults ``id`` and ``value`` when the column names
are left at their defaults (:func:`resolve_columns`).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterable
from typing import Any

__all__ = ["DEFAULT_ID_COLUMN", "DEFAULT_TIMESTAMP_COLUMN", "DEFAULT_VALUE_COLUMN", "OLD_DEFAULT_COLUMNS",
           "PREFIX", "accept_time_column_keyword", "add_deprecated_time_column", "deprecated", "renamed_parameter",
           "resolve_columns"]

DEFAULT_ID_COLUMN = "item_id"
DEFAULT_TIMESTAMP_COLUMN = "timestamp"
DEFAULT_VALUE_COLUMN = "target"
#: The defaults of ``dpts`` before the names were unified: new default -> old default.
OLD_DEFAULT_COLUMNS = {DEFAULT_ID_COLUMN: "id", DEFAULT_VALUE_COLUMN: "value"}


#: Start of every deprecation message of this module (``dpts`` shows them, once each).
PREFIX = "lightning-dpts: "


def _outside() -> int:
    """The ``stacklevel`` of the first frame outside this package: the warning names the user's line, so Python's
    default filters show it (once per line) when that line is in a script (``__main__``)."""
    frame, level = sys._getframe(2), 2  # 1: deprecated(), 2: its caller
    while frame is not None and frame.f_globals.get("__name__", "").startswith("lightning_dpts"):
        frame, level = frame.f_back, level + 1
    return level


def deprecated(message: str) -> None:
    """A ``DeprecationWarning`` with :data:`PREFIX`, attributed to the user's code."""
    warnings.warn(PREFIX + message, DeprecationWarning, stacklevel=_outside())


def renamed_parameter(old: str, new: str) -> None:
    """Warn (``DeprecationWarning``) that parameter ``old`` is now ``new``."""
    deprecated(f"{old} is deprecated: use {new} (the same column; one set of names across dpts, YAML and Python)")


def resolve_columns(available: Iterable[Any], id_column: Any, timestamp_column: Any, value_column: Any
                    ) -> tuple[Any, Any, Any]:
    """The columns to read: the given ones, except that a column left at its new default (``item_id``,
    ``target``) that the data lacks is read from the old ``dpts`` default (``id``, ``value``) if the data has
    that one, with a ``DeprecationWarning`` naming the fix. Anything else is returned unchanged (a missing column
    is then refused by the reader, naming it)."""
    present = set(available)
    chosen = {"id_column": id_column, "value_column": value_column}
    used = []
    for name, new in (("id_column", DEFAULT_ID_COLUMN), ("value_column", DEFAULT_VALUE_COLUMN)):
        old = OLD_DEFAULT_COLUMNS[new]
        if chosen[name] == new and new not in present and old in present:
            chosen[name] = old
            used.append((name, old, new))
    if used:
        read = ", ".join(f"{name}={old!r}" for name, old, _ in used)
        flags = " ".join(f"--{name.replace('_', '-')} {old}" for name, old, _ in used)
        deprecated(
            f"the data has no {' or '.join(repr(new) for _, _, new in used)} column: read {read} (the old dpts "
            f"defaults). The defaults are now item_id, timestamp, target; name the columns ({read}; dpts: "
            f"{flags}) or rename them. The fallback to the old names will be removed")
    return chosen["id_column"], timestamp_column, chosen["value_column"]


class _DeprecatedFlag(argparse.Action):
    """``--time-column``: sets ``timestamp_column`` and says once that the option is now ``--timestamp-column``."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"dpts: warning: {option_string} is deprecated; use --timestamp-column (the same column)",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_time_column(parser: Any) -> None:
    """Accept the old ``--time-column`` (hidden from the help) as ``--timestamp-column``."""
    parser.add_argument("--time-column", dest="timestamp_column", action=_DeprecatedFlag, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, metavar="COLUMN")


def _time_column(self: Any) -> str:
    """Deprecated name of ``timestamp_column``."""
    renamed_parameter(f"{type(self).__name__}.time_column", "timestamp_column")
    return self.timestamp_column


def accept_time_column_keyword(cls: type) -> None:
    """Let ``cls(time_column=...)`` (the old keyword) set ``timestamp_column`` with a ``DeprecationWarning``, and
    ``obj.time_column`` read it; the signature shown stays the dataclass's."""
    import functools

    init = cls.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, time_column: str | None = None, **kwargs: Any) -> None:
        if time_column is not None:
            renamed_parameter(f"{cls.__name__}(time_column=...)", "timestamp_column")
            kwargs.setdefault("timestamp_column", time_column)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    cls.time_column = property(_time_column)  # type: ignore[attr-defined]

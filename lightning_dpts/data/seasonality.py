"""Season lengths from the frequency: public metadata only, never the values.

The season length m is what seasonal naive repeats, what MASE scales by, and what a seasonal model reads. GluonTS's
``get_seasonality`` gives 1 for daily data (a weekly cycle ignored) and a single season for sub-daily data; this
module keeps GluonTS's table except where a second, longer cycle is the rule in the data our users hold (sensors,
meters, hospital occupancy follow the week):

==========================  ============================  ====================================
frequency                   seasons (primary first)       cycle
==========================  ============================  ====================================
daily ``D``                 (7,)                          the week
business daily ``B``        (5,)                          the working week
hourly ``h`` (``n`` hours)  (24/n, 168/n)                 the day, then the week
minutes ``min`` (n min)     (1440/n, 10080/n)             the day, then the week
anything else               GluonTS ``get_seasonality``   (monthly 12, quarterly 4, weekly 1, yearly 1)
==========================  ============================  ====================================

A season that the multiple ``n`` does not divide is dropped (GluonTS falls back to 1 likewise). An explicit
``season_length`` replaces the primary season and keeps the longer ones that it divides (1: no seasonality at
all). The choice uses the
frequency string alone, so it costs no privacy (PRIVACY-NOTES trap 5).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

from lightning_dpts.errors import ConfigurationError

__all__ = ["pandas_alias_notices_hidden", "season_lengths"]


@contextlib.contextmanager
def pandas_alias_notices_hidden() -> Iterator[None]:
    """Hide pandas' FutureWarning for GluonTS' period aliases (``M``, ``Q``, ``A``: pandas >= 2.2 prefers ``ME``, ...)
    while pandas or GluonTS parse a frequency string: the aliases are GluonTS' own and stay valid there."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield

#: base unit -> cycles in that unit, primary first (before dividing by the frequency's multiple n)
_CYCLES: dict[str, tuple[int, ...]] = {
    "D": (7,),
    "B": (5,),
    "h": (24, 168),
    "min": (1440, 10080),
}


def _base(freq: str) -> tuple[str, int]:
    """The frequency's base unit (pandas' offset name without anchors) and its multiple n."""
    import pandas as pd

    try:
        with pandas_alias_notices_hidden():
            offset = pd.tseries.frequencies.to_offset(freq)
    except (TypeError, ValueError) as err:
        raise ConfigurationError("freq", freq, f"not a pandas frequency string ({err})") from None
    name = offset.name.split("-")[0]
    return {"H": "h", "T": "min"}.get(name, name), int(offset.n)


def season_lengths(freq: str, season_length: int | None = None) -> tuple[int, ...]:
    """The season lengths of data at frequency ``freq``, primary first (see the module's table).

    Args:
        freq: pandas frequency string of the series (``"D"``, ``"h"``, ``"30min"``, ``"ME"``, ...).
        season_length: m >= 1 to use as the primary season instead of the default (``None``: from ``freq``).

    Returns:
        A tuple of distinct integers >= 1, primary first; ``(1,)`` means no seasonality.

    Raises:
        ConfigurationError: ``freq`` is not a frequency, or ``season_length`` is not an integer >= 1.
    """
    unit, n = _base(freq)
    if unit in _CYCLES:
        cycles = tuple(c // n for c in _CYCLES[unit] if c % n == 0 and c // n >= 1) or (1,)
    else:
        from gluonts.time_feature import get_seasonality

        with pandas_alias_notices_hidden():
            cycles = (int(get_seasonality(freq)),)
    if season_length is None:
        return cycles
    if isinstance(season_length, bool) or not isinstance(season_length, int) or season_length < 1:
        raise ConfigurationError("season_length", season_length, "must be an integer >= 1 (or None: from freq)")
    if season_length == 1:  # asked for no seasonality
        return (1,)
    longer = tuple(c for c in cycles if c > season_length and c % season_length == 0)
    return (season_length, *longer)

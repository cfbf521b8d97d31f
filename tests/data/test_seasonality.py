import pytest

from lightning_dpts.data.seasonality import season_lengths
from lightning_dpts.errors import ConfigurationError


@pytest.mark.parametrize(
    ("freq", "expected"),
    [("D", (7,)), ("B", (5,)), ("h", (24, 168)), ("H", (24, 168)), ("2h", (12, 84)), ("5h", (1,)),
     ("30min", (48, 336)), ("15min", (96, 672)), ("ME", (12,)), ("M", (12,)), ("MS", (12,)), ("QS", (4,)),
     ("W", (1,)), ("W-SUN", (1,)), ("YS", (1,))],
)
def test_defaults_from_frequency(freq: str, expected: tuple[int, ...]) -> None:
    assert season_lengths(freq) == expected


def test_explicit_season_replaces_the_primary_and_keeps_longer_multiples() -> None:
    assert season_lengths("h", 24) == (24, 168)
    assert season_lengths("h", 12) == (12, 24, 168)
    assert season_lengths("h", 7) == (7, 168)
    assert season_lengths("W", 52) == (52,)
    assert season_lengths("D", 1) == (1,)
    assert season_lengths("h", 1) == (1,)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "7"])
def test_bad_season_length_names_the_parameter(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="season_length"):
        season_lengths("D", bad)  # type: ignore[arg-type]


def test_bad_frequency_names_the_parameter() -> None:
    with pytest.raises(ConfigurationError, match="freq"):
        season_lengths("XYZ")


@pytest.mark.parametrize("freq", ["M", "Q", "A", "ME", "h"])
def test_period_aliases_do_not_warn(freq: str) -> None:
    """GluonTS' period aliases ("M": the bundled data's frequency) are accepted without pandas' FutureWarning
    about "ME", which every `dpts fit` / `dpts tune` on monthly data used to print."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        season_lengths(freq)

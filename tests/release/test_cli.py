"""``dpts release epsilon|noise`` through argparse with :func:`add_release_parser` (as the lead will wire it)."""

from __future__ import annotations

import argparse
import json

import pytest

from lightning_dpts.app.release_cli import RELEASE_OPTION_NAMES, add_release_parser, run_release
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation
from lightning_dpts.release import ReleaseAccountant, ReleaseSpec

BASE = "--rate 0.5 --size 4 --value-bound 0.1 --delta 1e-4"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpts")
    add_release_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def _run(argv: str, capsys) -> dict:
    assert run_release(_parser().parse_args(argv.split())) == 0
    return json.loads(capsys.readouterr().out)


def _main(argv: str) -> int:
    """What the wired ``dpts`` main does with a ConfigurationError (exit 2 naming the option)."""
    parser = _parser()
    args = parser.parse_args(argv.split())
    try:
        return run_release(args)
    except ConfigurationError as err:
        option = RELEASE_OPTION_NAMES.get(err.parameter, err.parameter)
        parser.exit(2, f"dpts: error: {option}: {err.requirement} (got {err.value!r})\n")
    return 0  # pragma: no cover


def test_epsilon_json_matches_api(capsys) -> None:
    out = _run(f"release epsilon {BASE} --noise-std 0.5 --json", capsys)
    spec = ReleaseSpec(0.5, NeighbouringRelation("event", 4, 0.1))
    assert out == {"epsilon": ReleaseAccountant(spec, 0.5).epsilon(1e-4)}
    koga = _run(f"release epsilon {BASE} --noise-std 0.5 --bound koga --json", capsys)
    assert koga["epsilon"] >= out["epsilon"]
    many = _run(f"release epsilon {BASE} --noise-std 0.5 --releases 6 --json", capsys)
    assert many["epsilon"] > out["epsilon"]


def test_noise_json_round_trips(capsys) -> None:
    s = _run(f"release noise {BASE} --epsilon 1 --releases 3 --json", capsys)["noise_std"]
    eps = _run(f"release epsilon {BASE} --noise-std {s!r} --releases 3 --json", capsys)["epsilon"]
    assert eps <= 1.0


def test_text_output(capsys) -> None:
    assert run_release(_parser().parse_args(f"release epsilon {BASE} --noise-std 0.5".split())) == 0
    assert "epsilon" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (f"release epsilon {BASE} --noise-std 0", "--noise-std"),
        ("release epsilon --rate 1.5 --size 4 --value-bound 0.1 --delta 1e-4 --noise-std 1", "--rate"),
        ("release epsilon --rate 0.5 --size 0 --value-bound 0.1 --delta 1e-4 --noise-std 1", "--size"),
        ("release epsilon --rate 0.5 --size 4 --value-bound -1 --delta 1e-4 --noise-std 1", "--value-bound"),
        ("release epsilon --rate 0.5 --size 4 --value-bound 0.1 --delta 2 --noise-std 1", "--delta"),
        (f"release epsilon {BASE} --noise-std 1 --releases 0", "--releases"),
        (f"release epsilon {BASE} --noise-std 1 --context-length 24 --filter-width 2", "--bound"),
        (f"release epsilon {BASE} --noise-std 1 --filter-width 2 --bound koga", "--context-length"),
        (f"release epsilon {BASE} --noise-std 1 --context-length 24 --filter-width -2 --bound koga",
         "--filter-width"),
        (f"release noise {BASE} --epsilon 0", "--epsilon"),
        (f"release noise {BASE} --epsilon -1", "--epsilon"),
        # the classical Gaussian step (proven for epsilon < 1) is the culprit, not the noise std
        (f"release epsilon {BASE} --noise-std 0.01 --bound koga --gaussian classical", "--gaussian"),
    ],
)
def test_invalid_values_exit_2_naming_the_option(argv: str, option: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        _main(argv)
    assert info.value.code == 2
    assert f"dpts: error: {option}:" in capsys.readouterr().err


def test_unparsable_value_exits_2() -> None:
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(f"release epsilon {BASE} --noise-std abc".split())
    assert info.value.code == 2

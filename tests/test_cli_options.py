"""One declaration per option, and no abbreviated options anywhere in ``dpts``."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from lightning_dpts.app.cli import build_parser, main
from lightning_dpts.app.config import FIT_RANGES, FitConfig, option_flags


def _parsers(parser: argparse.ArgumentParser, path: str = "dpts"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_parser_and_subparser_refuses_abbreviations():
    found = dict(_parsers(build_parser()))
    assert {"dpts fit", "dpts privacy bandmf", "dpts synth", "dpts release noise", "dpts predict"} <= set(found)
    assert not [path for path, parser in found.items() if parser.allow_abbrev], "allow_abbrev must be False"


@pytest.mark.parametrize("argv", [
    # --sampling-p would have been read as --sampling-prob
    ["privacy", "bandmf", "--iterations", "10", "--bands", "2", "--sampling-p", "0.1", "--noise-multiplier", "1",
     "--epsilon", "1"],
    ["fit", "--noise", "2"],  # --noise-multiplier
    ["fit", "--clip-count", "0"],  # --clip-count-epsilon
    ["privacy", "epsilon", "--num-series", "10", "--min-length", "100", "--context-length", "5",
     "--prediction-length", "5", "--batch-size", "2", "--noise", "1", "--delta", "1e-5", "--steps", "1"],
    ["release", "epsilon", "--noise", "1"],
])
def test_a_shortened_option_is_refused_not_read_as_another(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    shortened = next(a for a in argv if a in ("--sampling-p", "--noise", "--clip-count"))
    assert f"unrecognized arguments: {shortened}" in err or "required" in err


def test_the_fit_parser_the_yaml_keys_and_the_ranges_derive_from_fitconfig():
    fit = dict(_parsers(build_parser()))["dpts fit"]
    dests = {a.dest for a in fit._actions} - {"help", "config"}
    assert dests == {f.name for f in fields(FitConfig)}
    flags = {s for a in fit._actions for s in a.option_strings} - {"-h", "--help", "--config"}
    assert flags == set(option_flags().values()) | {"--time-column"}  # the deprecated alias of --timestamp-column
    assert option_flags()["non_dp"] == "--no-non-dp" and option_flags()["private_plots"] == "--no-private-plots"
    assert set(FIT_RANGES) == {f.name for f in fields(FitConfig) if f.metadata["option"].low is not None}
    assert FIT_RANGES["epsilon"] == (0.0, 100.0, "float", False)
    parsed = fit.parse_args(["--no-non-dp", "--epochs", "1e3"])
    assert vars(parsed) == {"config": None, "non_dp": False, "epochs": 1000}  # unset options stay absent
    with pytest.raises(Exception, match="unknown keys"):
        FitConfig.from_mapping({"no_such_option": 1})

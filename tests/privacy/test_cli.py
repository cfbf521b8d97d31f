"""The ``dpts privacy`` command: option names, JSON output, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant

COMMON = ["--num-series", "320", "--min-length", "400", "--context-length", "24", "--prediction-length", "12",
          "--batch-size", "32", "--delta", "1e-6"]


def run(capsys, *args: str) -> dict:
    assert main(["privacy", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_epsilon_json_matches_the_python_api(capsys):
    out = run(capsys, "epsilon", *COMMON, "--noise-multiplier", "1.1", "--steps", "10", "100")
    assert set(out) == {"epsilon", "risk"} and set(out["epsilon"]) == set(out["risk"]) == {"10", "100"}
    spec = SamplingSpec(num_series=320, min_length=400, context_length=24, prediction_length=12, batch_size=32)
    acc = StructuredSubsamplingAccountant(spec, 1.1)
    assert out["epsilon"]["100"] == pytest.approx(acc.epsilon(100, 1e-6), rel=1e-12)
    assert out["risk"]["100"] == acc.risk(100, 1e-6).to_dict()  # the read-outs next to epsilon (issue 43)


def test_steps_and_noise_json(capsys):
    steps = run(capsys, "steps", *COMMON, "--noise-multiplier", "3.0", "--epsilon", "1.0")["steps"]
    assert isinstance(steps, int) and steps > 0
    sigma = run(capsys, "noise", *COMMON, "--epsilon", "1.0", "--steps", str(steps))["noise_multiplier"]
    assert 2.5 < sigma <= 3.0 * 1.002


def test_all_documented_options_are_accepted(capsys):
    out = run(capsys, "epsilon", *COMMON, "--noise-multiplier", "1.0", "--instances-per-series", "1",
              "--top-level", "poisson", "--bottom-level", "with_replacement", "--level", "user", "--size", "2",
              "--value-bound", "1.0", "--context-noise", "0.5", "--forecast-noise", "0.5", "--num-dims", "2",
              "--bound", "upper", "--steps", "5")
    assert out["epsilon"]["5"] > 0


def test_human_readable_output_names_the_theorem(capsys):
    assert main(["privacy", "epsilon", *COMMON, "--noise-multiplier", "1.0", "--steps", "10"]) == 0
    assert "Theorem 4.4" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra,option",
    [
        (["epsilon", "--noise-multiplier", "0", "--steps", "3"], "--noise-multiplier"),
        (["epsilon", "--noise-multiplier", "1", "--steps", "3", "--instances-per-series", "5"], "--batch-size"),
        (["epsilon", "--noise-multiplier", "1", "--steps", "3", "--context-noise", "1"], "--value-bound"),
        (["epsilon", "--noise-multiplier", "1", "--steps", "3", "--top-level", "iteration", "--value-bound", "1",
          "--context-noise", "1", "--forecast-noise", "1"], "--top-level"),
        (["epsilon", "--noise-multiplier", "1", "--steps", "-3"], "--steps"),
        (["steps", "--noise-multiplier", "1", "--epsilon", "-1"], "--epsilon"),
        (["epsilon", "--noise-multiplier", "1", "--steps", "3", "--top-level", "poisson", "--bound", "lower"],
         "--bound"),
    ],
)
def test_invalid_values_exit_2_naming_the_option(capsys, extra, option):
    with pytest.raises(SystemExit) as exit_:
        main(["privacy", *extra[:1], *COMMON, *extra[1:]])
    assert exit_.value.code == 2
    assert option in capsys.readouterr().err


def test_delta_out_of_range_and_unknown_mode(capsys):
    args = ["privacy", "epsilon", *COMMON[:-2], "--delta", "1.5", "--noise-multiplier", "1", "--steps", "3"]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and "--delta" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["privacy", "epsilon", *COMMON, "--noise-multiplier", "1", "--steps", "3", "--top-level", "random"])
    assert exit_.value.code == 2 and "--top-level" in capsys.readouterr().err


def test_console_script_runs_without_torch():
    code = ("import sys; from lightning_dpts.app.cli import main; main(['privacy', 'epsilon', *sys.argv[1:]]); "
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code, *COMMON, "--noise-multiplier", "1", "--steps", "3", "--json"],
                          capture_output=True, text=True, check=True)
    assert "epsilon" in json.loads(proc.stdout)

"""dpts privacy bandmf: JSON shape, values against the accountant, exit code 2 naming the option."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.privacy.montecarlo import BandMFMechanism, MonteCarloAccountant
from lightning_dpts.training.correlated_noise import banded_sqrt_coefficients

BASE = ["privacy", "bandmf", "--iterations", "40", "--bands", "3", "--sampling-prob", "0.1",
        "--noise-multiplier", "1.0", "--samples", "4000", "--seed", "5"]


def test_json_shape_and_values(capsys):
    assert main(BASE + ["--epsilon", "0.5", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"delta"} and set(out["delta"]) == {"0.5", "2"}
    acc = MonteCarloAccountant(BandMFMechanism(40, tuple(banded_sqrt_coefficients(3)), 0.1, 1.0), samples=4000,
                               seed=5)
    for key, eps in (("0.5", 0.5), ("2", 2.0)):
        entry = out["delta"][key]
        assert set(entry) == {"estimate", "upper"}
        assert entry["estimate"] == pytest.approx(acc.delta_estimate(eps))
        assert entry["upper"] >= entry["estimate"]


def test_explicit_coefficients_and_text(capsys):
    assert main(BASE + ["--epsilon", "1", "--coefficients", "1", "0.5", "0.25"]) == 0
    assert "upper" in capsys.readouterr().out


@pytest.mark.parametrize("extra,option", [
    (["--epsilon", "1", "--coefficients", "1", "0.5"], "--coefficients"),
    (["--epsilon", "1", "--coefficients", "1", "-0.5", "0.1"], "--coefficients"),
    (["--epsilon", "-1"], "--epsilon"),
])
def test_bad_values_exit_2(extra, option, capsys):
    with pytest.raises(SystemExit) as err:
        main(BASE + extra)
    assert err.value.code == 2 and option in capsys.readouterr().err


@pytest.mark.parametrize("flag,value", [("--sampling-prob", "1.5"), ("--bands", "0"), ("--iterations", "0"),
                                        ("--noise-multiplier", "0"), ("--samples", "0")])
def test_bad_mechanism_exit_2(flag, value, capsys):
    argv = list(BASE) + ["--epsilon", "1"]
    argv[argv.index(flag) + 1] = value
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2 and flag in capsys.readouterr().err


def test_bandmf_command_does_not_import_torch():
    import os
    import subprocess
    import sys

    code = ("import sys; from lightning_dpts.app.cli import main; "
            "rc = main(['privacy', 'bandmf', '--iterations', '20', '--bands', '2', '--sampling-prob', '0.1', "
            "'--noise-multiplier', '1', '--epsilon', '1', '--samples', '200', '--json']); "
            "assert rc == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr


def _dpts(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.run([sys.executable, "-m", "lightning_dpts.app.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=120)


def test_cyclic_poisson_answers_at_delta_1e7_as_json(capsys):
    from lightning_dpts.privacy import AmplifiedBandMFAccountant

    argv = ["privacy", "bandmf", "--sampling", "cyclic_poisson", "--iterations", "2000", "--bands", "4",
            "--sampling-prob", "0.2", "--noise-multiplier", "3", "--epsilon", "1", "--delta", "1e-7", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    acc = AmplifiedBandMFAccountant(2000, tuple(banded_sqrt_coefficients(4)), 0.2, 3.0)
    assert out["epsilon"]["1e-07"] == pytest.approx(acc.epsilon(1e-7))
    assert out["delta"]["1"]["estimate"] == out["delta"]["1"]["upper"] == pytest.approx(acc.delta(1.0))
    assert out["accounting"]["compositions"] == 500 and out["accounting"]["groups"] == 4
    assert acc.compositions == 500 and 0 < acc.epsilon(1e-7) < math.inf


@pytest.mark.parametrize("extra,option", [
    (["--groups", "2"], "--groups"),  # k < b: two participations would share rows of C
    (["--leak-probability", "0"], "--leak-probability"),
    (["--delta", "1.5"], "--delta"),
])
def test_cyclic_poisson_bad_values_exit_2(extra, option, capsys):
    argv = ["privacy", "bandmf", "--sampling", "cyclic_poisson", "--iterations", "100", "--bands", "4",
            "--sampling-prob", "0.2", "--noise-multiplier", "3", "--epsilon", "1", *extra]
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2 and option in capsys.readouterr().err


def test_b_min_sep_refuses_cyclic_only_options(capsys):
    with pytest.raises(SystemExit) as err:
        main(BASE + ["--epsilon", "1", "--delta", "1e-7"])
    assert err.value.code == 2 and "--delta" in capsys.readouterr().err


@pytest.mark.slow  # three console-script processes; tests/test_console.py checks the warn-once in-process
def test_privacy_commands_warn_once_when_delta_is_at_least_one_over_n():
    done = _dpts("privacy", "epsilon", "--num-series", "50", "--min-length", "60", "--context-length", "6",
                 "--prediction-length", "6", "--batch-size", "8", "--noise-multiplier", "1", "--delta", "0.05",
                 "--steps", "10", "20", "--json")
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # the warning does not break the JSON on stdout
    assert done.stderr.count("WARNING: delta=0.05 is >= 1/N = 1/50") == 1, done.stderr
    quiet = _dpts("privacy", "epsilon", "--num-series", "50", "--min-length", "60", "--context-length", "6",
                  "--prediction-length", "6", "--batch-size", "8", "--noise-multiplier", "1", "--delta", "1e-7",
                  "--steps", "10")
    assert quiet.returncode == 0 and "WARNING" not in quiet.stderr
    cyclic = _dpts("privacy", "bandmf", "--sampling", "cyclic_poisson", "--iterations", "100", "--bands", "2",
                   "--sampling-prob", "0.2", "--noise-multiplier", "1", "--delta", "0.1", "0.2", "--num-examples",
                   "20", "--json")
    assert cyclic.returncode == 0 and cyclic.stderr.count("WARNING: delta=0.2 is >= 1/N = 1/20") == 1, cyclic.stderr

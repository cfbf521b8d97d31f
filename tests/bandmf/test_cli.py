"""dpts privacy bandmf: JSON shape, values against the accountant, exit code 2 naming the option."""

from __future__ import annotations

import json

import pytest

from lightning_dpts.cli import main
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

    code = ("import sys; from lightning_dpts.cli import main; "
            "rc = main(['privacy', 'bandmf', '--iterations', '20', '--bands', '2', '--sampling-prob', '0.1', "
            "'--noise-multiplier', '1', '--epsilon', '1', '--samples', '200', '--json']); "
            "assert rc == 0 and 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)[:3]")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr

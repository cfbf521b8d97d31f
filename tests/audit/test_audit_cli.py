"""``dpts audit`` end to end (reduced ``--quick``), its files and who may see them, and its refusals (exit 2)."""

from __future__ import annotations

import json
import warnings

import pytest

from lightning_dpts.app.cli import main

warnings.filterwarnings("ignore", message=".*explicit seed")


def test_quick_audit_writes_public_and_private_files(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "audit"
    code = main(["audit", "--quick", "--canaries", "64", "--steps", "2", "--epsilon", "4", "--seed", "1",
                 "--output-dir", str(out), "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["accountant_epsilon"] == pytest.approx(4.0, rel=1e-2)
    assert set(printed["bounds"]) == {"white_box_one_run", "white_box_fdp", "black_box_one_run", "black_box_fdp"}
    for bound in printed["bounds"].values():
        assert 0.0 <= bound["epsilon"] <= printed["accountant_epsilon"] and bound["confidence"] == 0.95
    public = json.loads((out / "report.json").read_text())
    assert "bounds" not in public and public["canaries"] == 64 and public["steps"] == 2
    for rel in ("private/audit.json", "private/audit.png", "private/scores.csv"):
        assert (out / rel).is_file()
    rows = (out / "private/scores.csv").read_text().splitlines()
    assert rows[0].startswith("canary,included") and len(rows) == 65
    journal = json.loads((out / ".dpts-files.json").read_text())
    assert set(journal["paths"]) == {"report.json", "private/audit.json", "private/audit.png", "private/scores.csv"}


@pytest.mark.parametrize("argv,option", [
    (["--canaries", "1"], "--canaries"),
    (["--epsilon", "0"], "--epsilon"),
    (["--epsilon", "101"], "--epsilon"),
    (["--delta", "0.5"], "--delta"),
    (["--steps", "0"], "--steps"),
    (["--size", "0"], "--size"),
    (["--value-bound", "1", "--magnitude", "2"], "--magnitude"),
])
def test_bad_options_exit_2_naming_the_option_before_writing(tmp_path, capsys, argv, option) -> None:  # noqa: ANN001
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as err:
        main(["audit", "--quick", "--output-dir", str(out), *argv])
    assert err.value.code == 2
    assert option in capsys.readouterr().err
    assert not out.exists()


def test_no_abbreviations(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit) as err:
        main(["audit", "--quic"])
    assert err.value.code == 2


def test_config_from_a_fit_yaml(tmp_path, capsys) -> None:  # noqa: ANN001
    """``--config`` audits a dpts fit YAML's epsilon, delta, relation and seed; options override it."""
    config = tmp_path / "fit.yaml"
    config.write_text("epsilon: 3.0\ndelta: 1.0e-6\nlevel: event\nsize: 2\nseed: 5\n")
    assert main(["audit", "--config", str(config), "--canaries", "32", "--steps", "2", "--no-black-box",
                 "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["accountant_epsilon"] == pytest.approx(3.0, rel=1e-2) and printed["delta"] == 1e-6
    assert printed["config"]["relation"]["size"] == 2 and printed["config"]["seeded"] is True
    assert set(printed["bounds"]) == {"white_box_one_run", "white_box_fdp"}

"""The release's scale and time stamps (lightning_dpts.synthetic.scale): DP or declared-public statistics only."""

from __future__ import annotations

import gzip
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from lightning_dpts.app.jobs.synth import run_synth
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import GaussianNoise
from lightning_dpts.synthetic.evolution import private_windows
from lightning_dpts.synthetic.privacy import PETSAccountant, sensitivity
from lightning_dpts.synthetic.scale import DEFAULT_START, check_value_range, scale_sums
from tests.synthetic.conftest import tiny_config

QUIET = {"log": lambda _m: None}


@pytest.mark.parametrize("m", [1, 2, 4])
def test_one_unit_moves_the_scale_sum_by_at_most_the_vote_sensitivity(m: int) -> None:
    """Independent check of the module's bound by enumeration: every corner of one unit's (clipped) window
    statistics, added/removed (a series of m windows of weight 1/m) or substituted (one window by another)."""
    lo, hi = 0.0, 10.0
    corners = [(mean, std) for mean in (-5.0, lo, hi, 20.0) for std in (0.0, 5.0, 50.0)]
    worst_add = worst_sub = 0.0
    for unit in itertools.product(corners, repeat=m):
        means, stds = np.array([u[0] for u in unit]), np.array([u[1] for u in unit])
        contribution = scale_sums(means, stds, np.full(m, 1.0 / m), (lo, hi))
        worst_add = max(worst_add, float(np.linalg.norm(contribution)))
    for a, b in itertools.product(corners, repeat=2):
        diff = scale_sums(np.array([a[0]]), np.array([a[1]]), np.ones(1), (lo, hi)) - \
            scale_sums(np.array([b[0]]), np.array([b[1]]), np.ones(1), (lo, hi))
        worst_sub = max(worst_sub, float(np.linalg.norm(diff)))
    assert worst_add == pytest.approx(math.sqrt(2.25 / 3.0)) and worst_add <= sensitivity("add_remove")
    assert worst_sub == pytest.approx(math.sqrt(1.25 / 3.0)) and worst_sub <= sensitivity("substitution")


def test_value_range_and_start_are_checked_before_any_work(tmp_path: Path) -> None:
    assert check_value_range(None) is None and check_value_range([1, 2]) == (1.0, 2.0)
    for bad in ([2, 1], [1, float("inf")], ["a", 1], [1]):
        with pytest.raises(ConfigurationError, match="value_range"):
            check_value_range(bad)
    with pytest.raises(ConfigurationError, match="start"):
        tiny_config(Path("x.csv"), tmp_path / "run", start="not a date").validate()
    assert not (tmp_path / "run").exists()


def test_release_in_the_data_scale_is_accounted_as_one_more_round(tiny_csv: Path, tmp_path: Path) -> None:
    """With --value-range: every window has the one DP level as mean; epsilon composes iterations + 1 rounds."""
    config = tiny_config(tiny_csv, tmp_path / "run", value_range=(0.0, 200.0), start="2015-01-01")
    report = run_synth(config, **QUIET)
    frame = pd.read_csv(tmp_path / "run" / "synthetic.csv.gz")
    level, spread = report["scale"]["level"], report["scale"]["spread"]
    assert 0.0 <= level <= 200.0 and 0.0 < spread <= 100.0
    means = frame.groupby("id")["value"].mean().to_numpy()
    assert np.allclose(means, level)
    assert report["rounds"] == config.iterations + 1
    assert report["epsilon"] == pytest.approx(PETSAccountant(report["noise_multiplier"]).epsilon(config.iterations + 1,
                                                                                                  config.delta))
    assert report["epsilon"] <= config.epsilon
    assert frame["timestamp"].min().startswith("2015-01-01")
    assert report["time_stamps"]["start"] == "2015-01-01"


def test_without_a_value_range_the_release_is_standardised_and_says_why(tiny_csv: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    report = run_synth(tiny_config(tiny_csv, tmp_path / "run"), log=lines.append)
    frame = pd.read_csv(tmp_path / "run" / "synthetic.csv.gz")
    assert np.allclose(frame.groupby("id")["value"].mean(), 0.0, atol=1e-6)
    assert report["scale"]["values"] == "standardised" and "--value-range" in report["scale"]["why"]
    assert any("standardised" in line and "--value-range" in line for line in lines)
    assert any(DEFAULT_START in line and "--start" in line for line in lines)
    assert report["rounds"] == 2  # no scale round spent
    assert frame["timestamp"].min().startswith(DEFAULT_START)


# --- the attacker: knows code and config, reads every public file, and looks for a raw private statistic ----------

def _private_csv(path: Path) -> Path:
    """Series at a distinctive level (about 4321.9) starting at a distinctive date (1987-03)."""
    rng = np.random.default_rng(5)
    rows = []
    for i in range(6):
        stamps = pd.period_range("1987-03", periods=60, freq="M").to_timestamp()
        values = 4321.9 + 37.3 * np.sin(np.arange(60) * 2 * np.pi / 12 + i) + rng.normal(size=60).cumsum()
        rows.append(pd.DataFrame({"id": f"s{i}", "timestamp": stamps, "value": values}))
    pd.concat(rows).to_csv(path, index=False)
    return path


def _raw_statistics(data: Path, length: int) -> dict[str, float]:
    """What a leaky release could write: the clean statistics the scale round protects."""
    table = pd.read_csv(data)
    series = [g["value"].to_numpy() for _, g in table.groupby("id", sort=False)]
    windows = private_windows(series, length, unit="window")
    w = windows.weights
    stats = {"mean of window means": float((w * windows.raw_means).sum() / w.sum()),
             "mean of window stds": float((w * windows.raw_stds).sum() / w.sum()),
             "data mean": float(table["value"].mean()), "data std": float(table["value"].std())}
    stats |= {f"series {k} mean": float(s.mean()) for k, s in enumerate(series)}
    return stats


def _public_numbers(out: Path) -> tuple[list[float], str, np.ndarray]:
    """Every number of report.json, the release's text, and its window means (the level a leak would show)."""
    report = (out / "report.json").read_text()
    release = gzip.decompress((out / "synthetic.csv.gz").read_bytes()).decode()
    numbers = [float(t) for t in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", report)]
    frame = pd.read_csv(out / "synthetic.csv.gz")
    return numbers, report + release, frame.groupby("id")["value"].mean().to_numpy()


def _leaks(out: Path, stats: dict[str, float]) -> list[str]:
    numbers, text, window_means = _public_numbers(out)
    found = [name for name, value in stats.items()
             if any(math.isclose(n, value, rel_tol=1e-9) for n in [*numbers, *window_means])]
    return found + (["the data's first date"] if "1987-03" in text else [])


def test_attacker_finds_no_raw_private_statistic_among_public_files(tmp_path: Path, monkeypatch) -> None:
    """The public files (report.json, synthetic.csv.gz) hold no raw mean/std of the private data and none of its
    dates. Positive control: with the scale round's noise removed (the protection gone), the same attacker finds
    the clean mean of window means in the release, so the test would fail if the level were computed without DP."""
    data = _private_csv(tmp_path / "private.csv")
    config = dict(value_range=(0.0, 10_000.0))
    stats = _raw_statistics(data, 12)
    run_synth(tiny_config(data, tmp_path / "dp", **config), **QUIET)
    assert _leaks(tmp_path / "dp", stats) == []
    assert json.loads((tmp_path / "dp" / "report.json").read_text())["scale"]["level"] != stats["mean of window means"]
    run_synth(tiny_config(data, tmp_path / "plain"), **QUIET)  # standardised: nothing of the scale at all
    assert _leaks(tmp_path / "plain", stats) == []

    def no_noise(self, numel, std, dtype=None):  # the protection removed: the clean sums are released
        return torch.zeros(numel, dtype=dtype or torch.float32)

    monkeypatch.setattr(GaussianNoise, "sample", no_noise)
    run_synth(tiny_config(data, tmp_path / "leaky", **config), **QUIET)
    assert "mean of window means" in _leaks(tmp_path / "leaky", stats)

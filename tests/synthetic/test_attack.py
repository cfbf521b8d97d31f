"""The attacker's view of the vote noise (docs/privacy.md, rule 7): two default runs differ and nothing written
reproduces the noise; a seeded run is attackable (positive control) and says so."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from lightning_dpts.app.jobs.synth import run_synth
from lightning_dpts.randomness import SEEDED_NOTICE, GaussianNoise, resolve_entropy
from lightning_dpts.synthetic.evolution import _STREAM_NOISE
from lightning_dpts.synthetic.pretrain import PUBLIC_PRETRAIN_SEED
from tests.synthetic.conftest import tiny_config as _tiny_config


def _noise_explains(noisy: np.ndarray, candidate_noise: np.ndarray, weight: float) -> bool:
    """The attacker's check: noisy - candidate must be a histogram of votes (non-negative multiples of weight)."""
    clean = (noisy - candidate_noise) / weight
    return bool(np.all(np.abs(clean - np.round(clean)) < 1e-6) and np.all(np.round(clean) >= 0))


def _attack(out: Path, noisy: np.ndarray, std: float) -> bool:
    """Try every integer written anywhere in the output directory, plus 0..200 and the public pretraining seeds,
    as the seed of the vote noise (the attacker knows the code, hence the stream key)."""
    candidates = set(range(201)) | {PUBLIC_PRETRAIN_SEED + k for k in range(4)}
    for path in out.rglob("*"):
        if path.is_file():
            raw = path.read_bytes()
            text = gzip.decompress(raw) if path.suffix == ".gz" else raw
            candidates |= {int(t) for t in re.findall(rb"\d{1,40}", text)[:20000]}
    for seed in sorted(candidates):
        noise = GaussianNoise(resolve_entropy(seed), stream=(_STREAM_NOISE,)).sample(noisy.size, std, torch.float64)
        if _noise_explains(noisy, noise.numpy(), 1.0):
            return True
    return False


def test_attacker_cannot_reproduce_the_vote_noise(tiny_csv: Path, tmp_path: Path) -> None:
    """Plays the attacker of docs/privacy.md, rule 7: knows code, config and every file written.

    Positive control: with a seed (which the attacker guesses) the attack recovers the clean histogram, so the
    test would fail if the default drew its noise from a fixed or stored seed.
    """
    quiet = {"log": lambda _m: None}
    first = run_synth(_tiny_config(tiny_csv, tmp_path / "a"), **quiet)
    second = run_synth(_tiny_config(tiny_csv, tmp_path / "b"), **quiet)
    a = pd.read_csv(tmp_path / "a" / "synthetic.csv.gz")["value"].to_numpy()
    b = pd.read_csv(tmp_path / "b" / "synthetic.csv.gz")["value"].to_numpy()
    assert not np.allclose(a, b)
    assert not np.allclose(first["_result"].noisy_histograms[0], second["_result"].noisy_histograms[0])
    std = first["noise_std_votes"]
    assert not _attack(tmp_path / "a", first["_result"].noisy_histograms[0], std)
    assert not _attack(tmp_path / "b", second["_result"].noisy_histograms[0], std)
    text = (tmp_path / "a" / "report.json").read_text().lower()
    assert "entropy" not in text and '"seed"' not in text

    seeded = run_synth(_tiny_config(tiny_csv, tmp_path / "s", seed=17), **quiet)
    assert _attack(tmp_path / "s", seeded["_result"].noisy_histograms[0], std)  # the attack works on a seed
    report = json.loads((tmp_path / "s" / "report.json").read_text())
    assert report["seeded_notice"] == SEEDED_NOTICE and report["config"]["seeded"] is True

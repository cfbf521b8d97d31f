"""The release API draws secret, fresh randomness by default (issue 9, item 7; docs/privacy.md, rule 7).

The attacker knows the code, the configuration and the released values, and tries the generators the old
default derived from ``seed=0``: ``numpy.random.default_rng([0, i, release])`` per series and
``default_rng([0, dataloader, batch])`` per predict batch. With rate 1 the released window is x + s * noise, so
a regenerated noise gives back x exactly; these tests fail if a default call is reproducible that way.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.randomness import SEEDED_NOTICE
from lightning_dpts.release import TimeDomainSubsampling, privatize_dataset


def _dataset(n: int = 4, length: int = 30) -> list[dict]:
    rng = np.random.default_rng(11)
    return [{"target": rng.normal(size=length) * 10, "start": pd.Period("2000-01", "M")} for _ in range(n)]


def _attack(released: np.ndarray, noise_std: float, series: int, release: int) -> np.ndarray:
    gen = np.random.default_rng([0, series, release])  # rate 1: the old code drew no mask, only the noise
    return released - noise_std * gen.standard_normal(released.shape)


def test_default_release_cannot_be_regenerated_from_the_old_seed():
    data = _dataset()
    mech = TimeDomainSubsampling(1.0, 2.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a default call must not warn
        out = privatize_dataset(data, mech, context_length=12)
    for i, (entry, released) in enumerate(zip(data, out, strict=True)):
        private = entry["target"][-12:]
        guess = _attack(np.asarray(released["target"], dtype=np.float64), 2.0, i, 0)
        # float32 output: an exact regeneration would agree to ~1e-5; fresh noise misses by ~2 per value
        assert np.max(np.abs(guess - private)) > 0.5


def test_the_attack_works_against_a_known_seed():
    # the same attacker against an explicit seed: shows the attack itself is sound (and why seeds warn)
    data = _dataset()
    mech = TimeDomainSubsampling(1.0, 2.0)
    with pytest.warns(UserWarning, match="does NOT hold"):
        out = privatize_dataset(data, mech, context_length=12, seed=5)
    with pytest.warns(UserWarning):
        again = privatize_dataset(data, mech, context_length=12, seed=5)
    assert all(np.array_equal(a["target"], b["target"]) for a, b in zip(out, again, strict=True))
    assert SEEDED_NOTICE.startswith("this run used an explicit seed")


def test_two_default_releases_share_neither_mask_nor_noise():
    data = _dataset(n=2, length=200)
    mech = TimeDomainSubsampling(0.5, 1.0, imputation="mean")
    first = privatize_dataset(data, mech, context_length=200)
    second = privatize_dataset(data, mech, context_length=200)
    for a, b in zip(first, second, strict=True):
        assert not np.array_equal(a["target"], b["target"])
    # masks: P(two independent rate-1/2 masks of 200 steps agree) = 2^-200
    x = np.zeros(200)
    _, m1 = mech.privatize(x, return_mask=True)
    _, m2 = mech.privatize(x, return_mask=True)
    assert not np.array_equal(m1, m2)


def test_callback_defaults_to_fresh_entropy_per_predict_run():
    import lightning as L
    import torch

    from lightning_dpts.release import PrivateInputCallback

    class Echo(L.LightningModule):
        def predict_step(self, batch, batch_idx):
            return batch["past_target"].clone()

    data = [{"past_target": torch.zeros(50)} for _ in range(2)]
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    callback = PrivateInputCallback(TimeDomainSubsampling(1.0, 1.0), observed_key=None)
    assert callback.state_dict() == {}

    def run():
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[callback])
        return trainer.predict(Echo(), loader)[0].numpy().astype(np.float64)

    first, second = run(), run()
    assert not np.array_equal(first, second)
    old = np.random.default_rng([0, 0, 0]).standard_normal((2, 50))  # old default: rate 1 draws no mask
    assert np.max(np.abs(first - old)) > 0.5

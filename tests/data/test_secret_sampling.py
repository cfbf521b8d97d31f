"""The training batches are secret and fresh (docs/privacy.md, rule 7), and out-of-range values are rejected.

These tests play the attacker: they know the code, the configuration and everything the datamodule writes
(its ``state_dict``, which goes into every checkpoint), and try to regenerate the batches. Each would pass on
a datamodule whose default is a public seed (``seed=0``) or whose state stores the seed.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import SEEDED_NOTICE

from .conftest import L_F, P_LEN, id_series
from .conftest import make_dm as _make_dm


def make_dm(series, **kw) -> StructuredSubsamplingDataModule:
    return _make_dm(series, quiet_seed=True, **kw)


def _first_batches(dm: StructuredSubsamplingDataModule, count: int = 3) -> torch.Tensor:
    loader = iter(dm.train_dataloader())
    return torch.cat([next(loader)["future_target"] for _ in range(count)])  # id_series: values name the windows


def test_default_batches_are_not_a_function_of_anything_public(ids):
    """Attacker: regenerate a default datamodule's batches from small seeds and from its state_dict.

    With 20 series and 4 per step, three steps' series (12 indices) collide by chance with probability
    (1/P(20,4))^3 ~ 1e-15 per candidate; 64 candidate seeds: false-failure rate < 1e-13.
    """
    dm = make_dm(ids)
    state = dm.state_dict()
    target = _first_batches(dm)
    for seed in range(64):
        guess = make_dm(ids, seed=seed)
        guess.load_state_dict(state)
        assert not torch.equal(_first_batches(guess), target), f"batches regenerated from seed {seed}"
    for blob in (state, dm.state_dict()):
        assert set(blob) == {"passes_started"}  # nothing but a count
        assert all(isinstance(v, int) for v in blob.values())
    assert not dm.seeded
    # two default datamodules on the same data sample differently
    assert not torch.equal(_first_batches(make_dm(ids)), _first_batches(make_dm(ids)))


def test_the_datamodule_refuses_to_be_pickled_with_its_secret(ids):
    dm = make_dm(ids)
    with pytest.raises(TypeError, match="must not be pickled"):
        pickle.dumps(dm)


def test_a_second_loader_or_trainer_never_replays_a_pass(ids):
    """train_dataloader() again (a second Trainer on the same datamodule) draws passes never used before."""
    dm = make_dm(ids, seed=4)  # seeded so that the passes are comparable by index
    first = [b["series_index"] for b in dm.train_dataloader()]
    again = [b["series_index"] for b in dm.train_dataloader()]
    assert dm.state_dict() == {"passes_started": 2}
    for got, want in zip(again, [dm.train_batch(1, s)["series_index"] for s in range(len(again))], strict=True):
        assert torch.equal(got, want)
    assert any(not torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_resuming_from_the_same_state_twice_draws_fresh_batches(ids):
    """Attacker: two runs resumed from one checkpoint must not share batches (their difference would leak)."""
    dm = make_dm(ids)
    list(dm.train_dataloader())
    state = dm.state_dict()
    runs = []
    for _ in range(2):
        resumed = make_dm(ids)
        resumed.load_state_dict(state)
        runs.append(_first_batches(resumed))
    assert not torch.equal(runs[0], runs[1])
    # restoring into the *same* object also draws new entropy: an older state does not rewind it
    def pass0() -> torch.Tensor:
        return torch.cat([dm.train_batch(0, s)["series_index"] for s in range(3)])

    before = pass0()
    dm.load_state_dict({"passes_started": 0})
    assert not torch.equal(pass0(), before)  # P(collision) = P(20,4)^-3 ~ 6e-16
    assert dm.state_dict() == {"passes_started": 1}  # the pass count never goes back


def test_an_explicit_seed_is_reproducible_and_says_so(ids):
    with pytest.warns(UserWarning, match="explicit seed"):
        a = StructuredSubsamplingDataModule(ids, context_length=P_LEN, prediction_length=L_F, batch_size=4,
                                            test_windows=0, seed=7)
    b = make_dm(ids, seed=7)
    assert a.seeded and "does NOT hold" in SEEDED_NOTICE
    assert torch.equal(a.train_batch(3, 1)["past_target"], b.train_batch(3, 1)["past_target"])


def test_secure_mode_batches_are_fresh_every_call_and_cannot_be_seeded(ids):
    dm = make_dm(ids, secure_mode=True)
    draws = torch.stack([dm.train_batch(0, 0)["series_index"] for _ in range(4)])
    assert len({tuple(row.tolist()) for row in draws}) > 1  # P(all 4 equal) = P(20,4)^-3 ~ 1e-14
    with pytest.raises(ConfigurationError) as info:
        make_dm(ids, seed=1, secure_mode=True)
    assert info.value.parameter == "secure_mode"


def test_batches_carry_the_series_index_of_every_window(ids):
    dm = make_dm(ids, seed=3)
    batch = dm.train_batch(0, 0)
    # id_series: the value at time j of series n is 1000 (n + 1) + j + 1
    series_from_values = (batch["future_target"][:, 0] // 1000 - 1).long()
    assert torch.equal(batch["series_index"], series_from_values)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, 1e39, -4e38])
def test_values_outside_the_float32_range_are_rejected_at_load(bad):
    series = id_series([40] * 4)
    series[2][7] = bad
    with pytest.raises(ConfigurationError, match="float32|infinite") as info:  # inf: refused by sources.py
        make_dm(series)
    assert info.value.parameter == "data"
    if np.isfinite(bad):
        assert "time step 7" in str(info.value) and "float32" in str(info.value)  # the series, the step, the range


def test_nan_is_still_a_missing_value():
    series = id_series([40] * 4)
    series[1][3] = np.nan
    dm = make_dm(series, seed=0)
    assert dm.num_series == 4

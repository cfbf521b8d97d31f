"""Canaries (issue 28): each is one protected unit, no window holds two, the coins are fair."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest

from lightning_dpts.audit.canaries import Canary, chunk_series, plan_canaries, window_starts
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import NeighbouringRelation


def _windows_by_enumeration(length: int, past: int, horizon: int) -> list[set[int]]:
    """The series steps each window start covers, from Algorithm 4's definition: P zeros of padding in front,
    windows of P + L_F steps whose forecast part lies inside the series (T = L - L_F + 1 starts)."""
    padded = [-1] * past + list(range(length))
    return [{t for t in padded[s : s + past + horizon] if t >= 0} for s in range(length - horizon + 1)]


@pytest.mark.parametrize("length,past,horizon,position,w", [(30, 5, 3, 0, 1), (30, 5, 3, 29, 1), (30, 5, 3, 12, 4),
                                                            (8, 1, 8, 3, 1), (50, 7, 1, 48, 2)])
def test_window_starts_match_enumeration(length: int, past: int, horizon: int, position: int, w: int) -> None:
    canary = Canary(0, position, w, 1.0)
    expected = [s for s, steps in enumerate(_windows_by_enumeration(length, past, horizon))
                if steps & set(range(position, position + w))]
    assert window_starts(canary, length, past, horizon).tolist() == expected


@pytest.mark.parametrize("w", [1, 3])
def test_no_window_holds_two_canaries_and_worlds_differ_in_the_unit_only(w: int) -> None:
    rng = np.random.default_rng(0)
    lengths = [40, 95, 13, 200]
    past, horizon = 6, 2
    plan = plan_canaries(lengths, count=20, relation=NeighbouringRelation(size=w), past_length=past,
                         prediction_length=horizon, magnitude=3.0, rng=rng)
    assert len(plan) == 20
    for n, length in enumerate(lengths):
        mine = [c for c in plan.canaries if c.series == n]
        for steps in _windows_by_enumeration(length, past, horizon):
            assert sum(bool(steps & set(range(c.position, c.position + c.length))) for c in mine) <= 1
    base = [rng.normal(size=n) for n in lengths]
    world_in, world_out, train = plan.world(base, "in"), plan.world(base, "out"), plan.world(base, "train")
    for n in range(len(lengths)):
        diff = world_in[n] - world_out[n]
        marked = np.zeros(lengths[n], bool)
        for c in plan.canaries:
            if c.series == n:
                marked[c.position : c.position + w] = True
                np.testing.assert_allclose(train[n][c.position : c.position + w],
                                           (world_in if plan.included[plan.canaries.index(c)] else world_out)[n][
                                               c.position : c.position + w])
        np.testing.assert_allclose(diff[marked], 3.0)
        np.testing.assert_allclose(diff[~marked], 0.0)
        np.testing.assert_allclose(train[n][~marked], base[n][~marked])


def test_coins_are_fair() -> None:
    """Two-sided binomial test at level 1e-6 on 20,000 coins (fixed seed; false-failure rate 1e-6)."""
    plan = plan_canaries([100] * 2000, count=20_000, relation=NeighbouringRelation(), past_length=4,
                         prediction_length=1, magnitude=1.0, rng=np.random.default_rng(7))
    assert binomtest(int(plan.included.sum()), 20_000, 0.5).pvalue > 1e-6


def test_refusals_name_the_parameter() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ConfigurationError, match="value_bound=2"):
        plan_canaries([50], count=1, relation=NeighbouringRelation(value_bound=2.0), past_length=2,
                      prediction_length=1, magnitude=3.0, rng=rng)
    with pytest.raises(ConfigurationError) as err:
        plan_canaries([10, 10], count=5, relation=NeighbouringRelation(), past_length=4, prediction_length=1,
                      magnitude=1.0, rng=rng)
    assert err.value.parameter == "canaries" and "<= 4" in err.value.requirement
    with pytest.raises(ConfigurationError) as err:
        plan_canaries([10], count=0, relation=NeighbouringRelation(), past_length=4, prediction_length=1,
                      magnitude=1.0, rng=rng)
    assert err.value.parameter == "canaries"


def test_chunks_are_consecutive_pieces_round_robin() -> None:
    a, b = np.arange(10.0), 100 + np.arange(5.0)
    pieces = chunk_series([a, b], 3)
    assert [p.tolist() for p in pieces] == [[0, 1, 2], [100, 101, 102], [3, 4, 5], [6, 7, 8]]
    assert len(chunk_series([a, b], 3, max_chunks=2)) == 2
    with pytest.raises(ConfigurationError):
        chunk_series([a], 11)


@pytest.mark.parametrize("shape, expected", [("shift", [1, 1, 1, 1]), ("spike", [1, 0, 0, 0]),
                                             ("zigzag", [1, -1, 1, -1])])
def test_event_shapes_differ_only_inside_the_unit(shape: str, expected: list[int]) -> None:
    """Each shape's two worlds differ by at most the magnitude at each of the unit's w steps and nowhere else (a
    neighbouring pair of the w-event relation with value bound = magnitude)."""
    base = [np.arange(40.0), np.zeros(40)]
    plan = plan_canaries([40, 40], count=2, relation=NeighbouringRelation(size=4, value_bound=2.0), past_length=3,
                         prediction_length=2, magnitude=2.0, rng=np.random.default_rng(0), shape=shape)
    inside, outside = plan.world(base, "in"), plan.world(base, "out")
    for c in plan.canaries:
        diff = inside[c.series] - outside[c.series]
        np.testing.assert_allclose(diff[c.position:c.position + 4], 2.0 * np.array(expected))
        assert np.count_nonzero(diff) == np.count_nonzero(expected)


def test_offset_places_every_canary_at_its_piece_start() -> None:
    plan = plan_canaries([14] * 5, count=5, relation=NeighbouringRelation(), past_length=13, prediction_length=1,
                         magnitude=1.0, rng=np.random.default_rng(0), offset=0)
    assert [c.position for c in plan.canaries] == [0] * 5
    with pytest.raises(ConfigurationError) as err:
        plan_canaries([14], count=1, relation=NeighbouringRelation(), past_length=1, prediction_length=1,
                      magnitude=1.0, rng=np.random.default_rng(0), shape="wave")
    assert err.value.parameter == "canary_shape"

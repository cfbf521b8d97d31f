"""Issue 43: StructuredSubsamplingDpEvent and StructuredPLDAccountant (dp_accounting) give the package's epsilon."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dp_accounting import (
    ComposedDpEvent,
    DpEvent,
    GaussianDpEvent,
    NeighboringRelation,
    NonPrivateDpEvent,
    NoOpDpEvent,
    PoissonSampledDpEvent,
    SelfComposedDpEvent,
    UnsupportedEventError,
)
from dp_accounting.pld import PLDAccountant

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import (
    NeighbouringRelation,
    SamplingSpec,
    StructuredPLDAccountant,
    StructuredSubsamplingAccountant,
    StructuredSubsamplingDpEvent,
)

ROOT = Path(__file__).resolve().parents[2]
DELTA = 1e-7
# the paper's configurations (Appendix B.2; tests/privacy/test_tightness.py), 10^4 steps, and the default job's
PAPER = {
    "traffic": (dict(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256), 4.0),
    "electricity": (dict(num_series=321, min_length=21000, context_length=24, prediction_length=24, batch_size=128),
                    2.0),
    "solar": (dict(num_series=137, min_length=50000, context_length=240, prediction_length=60, batch_size=128), 4.0),
}
DEMO = SamplingSpec(num_series=145, min_length=309, context_length=24, prediction_length=12, batch_size=64,
                    lengths=(309, 369, 477, 525, 621, 693, 729, 777, 825, 921))


@pytest.mark.parametrize("name", list(PAPER))
def test_the_event_reads_the_packages_epsilon_on_the_papers_configurations(name):
    kw, sigma = PAPER[name]
    spec = SamplingSpec(**kw)
    ours = StructuredSubsamplingAccountant(spec, sigma).epsilon(10_000, DELTA)
    event = StructuredSubsamplingDpEvent.from_spec(spec, sigma)
    got = StructuredPLDAccountant().compose(event.for_steps(10_000)).get_epsilon(DELTA)
    assert abs(got / ours - 1) <= 1e-3, (got, ours)


@pytest.mark.parametrize("spec, sigma, steps", [
    (DEMO, 10.76, 400),
    (SamplingSpec(**PAPER["traffic"][0], instances_per_series=4), 4.0, 2000),  # Theorem F.1
    (SamplingSpec(**PAPER["traffic"][0], bottom_level="poisson"), 4.0, 2000),  # Theorem F.2
    (SamplingSpec(**PAPER["traffic"][0], top_level="shuffling"), 4.0, 2000),  # per epoch, Theorem 4.2
    (SamplingSpec(num_series=148, min_length=213, context_length=36, prediction_length=12, batch_size=32,
                  relation=NeighbouringRelation(value_bound=1.0), context_noise=0.5, forecast_noise=0.5), 4.0, 1000),
])
def test_other_configurations_and_deltas(spec, sigma, steps):
    acc = StructuredSubsamplingAccountant(spec, sigma)
    event = StructuredSubsamplingDpEvent.from_spec(spec, sigma)
    dp = StructuredPLDAccountant().compose(event.for_steps(steps))
    for delta in (1e-5, 1e-7, 1e-10):
        ours, got = acc.epsilon(steps, delta), dp.get_epsilon(delta)
        assert abs(got / ours - 1) <= 1e-3, (delta, got, ours)
    eps = acc.epsilon(steps, 1e-7)
    assert dp.get_delta(eps) == pytest.approx(1e-7, rel=0.05)


def test_step_by_step_composition_equals_one_run_and_epoch_units():
    spec = SamplingSpec(**PAPER["traffic"][0])
    event = StructuredSubsamplingDpEvent.from_spec(spec, 4.0)
    assert event.unit == "step" and event.for_steps(1) is event and event.for_steps(0) == NoOpDpEvent()
    looped = StructuredPLDAccountant()
    for _ in range(50):
        looped.compose(event)
    assert looped.get_epsilon(DELTA) == StructuredPLDAccountant().compose(event, 50).get_epsilon(DELTA)
    assert looped.ledger == SelfComposedDpEvent(event, 50)
    # iteration/shuffling: one event is one epoch; 10 steps of a 3-step epoch start 4 epochs
    small = SamplingSpec(num_series=30, min_length=50, context_length=5, prediction_length=2, batch_size=10,
                         top_level="shuffling")
    epoch = StructuredSubsamplingDpEvent.from_spec(small, 2.0)
    assert epoch.unit == "epoch" and epoch.for_steps(10) == SelfComposedDpEvent(epoch, 4)


def test_composition_with_dp_accountings_events_costs_more_and_matches_plain_gaussians():
    spec = SamplingSpec(**PAPER["traffic"][0])
    training = StructuredSubsamplingDpEvent.from_spec(spec, 4.0).for_steps(10_000)
    alone = StructuredPLDAccountant().compose(training).get_epsilon(DELTA)
    release = GaussianDpEvent(noise_multiplier=50.0)
    both = StructuredPLDAccountant().compose(ComposedDpEvent([training, release])).get_epsilon(DELTA)
    assert both > alone
    subsampled = PoissonSampledDpEvent(0.01, GaussianDpEvent(2.0))
    three = StructuredPLDAccountant().compose(
        ComposedDpEvent([training, release, SelfComposedDpEvent(subsampled, 100)]))
    assert three.get_epsilon(DELTA) > both
    # without a structured event the accountant is dp_accounting's PLDAccountant
    plain = PLDAccountant(NeighboringRelation.REPLACE_ONE).compose(SelfComposedDpEvent(subsampled, 100))
    mine = StructuredPLDAccountant().compose(SelfComposedDpEvent(subsampled, 100))
    assert mine.get_epsilon(DELTA) == plain.get_epsilon(DELTA)
    # a non-private event makes everything unbounded
    assert StructuredPLDAccountant().compose(ComposedDpEvent([training, NonPrivateDpEvent()])).get_epsilon(
        DELTA) == math.inf


def test_what_is_refused():
    spec = SamplingSpec(**PAPER["traffic"][0])
    event = StructuredSubsamplingDpEvent.from_spec(spec, 4.0)
    # dp_accounting's own accountant does not know the event; ours refuses add/remove (a substitution relation)
    assert not PLDAccountant().supports(event)
    assert not StructuredPLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE).supports(event)
    with pytest.raises(UnsupportedEventError, match="REPLACE_ONE"):
        StructuredPLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE).compose(event)
    b_min_sep = StructuredSubsamplingDpEvent.from_spec(
        SamplingSpec(**{**PAPER["traffic"][0], "batch_size": 64}, top_level="b_min_sep", bands=4), 4.0)
    with pytest.raises(UnsupportedEventError, match="Monte Carlo"):
        StructuredPLDAccountant().compose(b_min_sep)
    # self-validating: the field is named, before any work
    with pytest.raises(ConfigurationError, match="noise_multiplier"):
        StructuredSubsamplingDpEvent.from_spec(spec, 0.0)
    with pytest.raises(ConfigurationError, match="batch_size"):
        StructuredSubsamplingDpEvent(noise_multiplier=1.0, num_series=10, min_length=50, context_length=5,
                                     prediction_length=2, batch_size=11)
    with pytest.raises(ConfigurationError, match="top_level"):
        StructuredSubsamplingDpEvent(noise_multiplier=1.0, num_series=10, min_length=50, context_length=5,
                                     prediction_length=2, batch_size=2, top_level="everything")
    with pytest.raises(ConfigurationError, match="value_discretization_interval"):
        StructuredPLDAccountant(value_discretization_interval=0.0)


def test_the_event_is_frozen_hashable_data_that_round_trips():
    spec = SamplingSpec(**PAPER["traffic"][0], lengths=[13916, 14000])
    event = StructuredSubsamplingDpEvent.from_spec(spec, 4.0)
    assert isinstance(event, DpEvent) and event.spec == spec and event.lengths == (13916, 14000)
    with pytest.raises(AttributeError):
        event.noise_multiplier = 1.0  # type: ignore[misc]
    assert hash(event) == hash(StructuredSubsamplingDpEvent.from_spec(spec, 4.0))
    assert DpEvent.from_named_tuple(event.to_named_tuple()) == event
    nested = SelfComposedDpEvent(event, 7)
    assert DpEvent.from_named_tuple(nested.to_named_tuple()) == nested


@pytest.mark.slow  # the whole example in a fresh process
def test_example_accounts_a_plain_loop():
    """examples/dp_accounting_event.py: a numpy DP-SGD loop composed step by step, then a Gaussian release."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "dp_accounting_event.py"), "--epochs", "3"],
                         capture_output=True, text=True, env=env, timeout=600, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 12
    assert abs(result["epsilon_event"] / result["epsilon_package"] - 1) <= 1e-3
    assert result["epsilon_with_release"] > result["epsilon_event"]

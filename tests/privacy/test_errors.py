"""Out-of-range inputs and configurations no theorem covers raise ConfigurationError naming the parameter."""

from __future__ import annotations

import math

import pytest

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import (
    NeighbouringRelation,
    SamplingSpec,
    StructuredSubsamplingAccountant,
    calibrate_noise_multiplier,
)

BASE = dict(num_series=100, min_length=200, context_length=24, prediction_length=12, batch_size=32)


def spec(**kw) -> SamplingSpec:
    return SamplingSpec(**{**BASE, **kw})


@pytest.mark.parametrize(
    "kw,parameter",
    [
        (dict(batch_size=30, instances_per_series=4), "batch_size"),  # not divisible
        (dict(batch_size=2, instances_per_series=4), "batch_size"),  # Lambda < lambda
        (dict(num_series=10), "batch_size"),  # floor(Lambda/lambda) > N
        (dict(min_length=11), "min_length"),  # L < L_F
        (dict(top_level="random"), "top_level"),
        (dict(bottom_level="uniform"), "bottom_level"),
        (dict(context_noise=-1.0, relation=NeighbouringRelation(value_bound=1.0)), "context_noise"),
        (dict(forecast_noise=math.nan, relation=NeighbouringRelation(value_bound=1.0)), "forecast_noise"),
        (dict(context_noise=1.0), "relation.value_bound"),  # augmentation needs v
        (dict(num_series=0), "num_series"),
        (dict(context_length=2.5), "context_length"),
    ],
)
def test_spec_rejects(kw, parameter):
    with pytest.raises(ConfigurationError) as err:
        spec(**kw)
    assert err.value.parameter == parameter


@pytest.mark.parametrize(
    "kw,parameter",
    [
        (dict(level="household"), "level"),
        (dict(size=0), "size"),
        (dict(value_bound=0.0), "value_bound"),
        (dict(value_bound=math.inf), "value_bound"),
        (dict(num_dims=0), "num_dims"),
    ],
)
def test_relation_rejects(kw, parameter):
    with pytest.raises(ConfigurationError) as err:
        NeighbouringRelation(**kw)
    assert err.value.parameter == parameter


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.nan, math.inf])
def test_noise_multiplier_must_be_positive(sigma):
    with pytest.raises(ConfigurationError, match="noise_multiplier"):
        StructuredSubsamplingAccountant(spec(), sigma)


@pytest.mark.parametrize("delta", [0.0, 1.0, -0.1, 2.0, math.nan])
def test_delta_must_be_in_open_unit_interval(delta):
    acc = StructuredSubsamplingAccountant(spec(), 1.0)
    with pytest.raises(ConfigurationError, match="delta"):
        acc.epsilon(10, delta)
    with pytest.raises(ConfigurationError, match="delta"):
        acc.max_steps(1.0, delta)


def test_bad_epsilon_steps_and_bound():
    acc = StructuredSubsamplingAccountant(spec(), 1.0)
    with pytest.raises(ConfigurationError, match="epsilon"):
        acc.delta(10, -1.0)
    with pytest.raises(ConfigurationError, match="steps"):
        acc.epsilon(-5, 1e-6)
    with pytest.raises(ConfigurationError, match="bound"):
        StructuredSubsamplingAccountant(spec(), 1.0, bound="median")
    with pytest.raises(ConfigurationError, match="steps"):
        calibrate_noise_multiplier(spec(), 1.0, 1e-6)  # neither steps nor epochs
    with pytest.raises(ConfigurationError, match="steps"):
        calibrate_noise_multiplier(spec(), 1.0, 1e-6, steps=10, epochs=1)


AUG = dict(relation=NeighbouringRelation(value_bound=1.0), context_noise=1.0, forecast_noise=1.0)


@pytest.mark.parametrize(
    "kw,parameter",
    [
        (dict(top_level="iteration", **AUG), "top_level"),
        (dict(top_level="shuffling", **AUG), "top_level"),
        (dict(bottom_level="poisson", **AUG), "bottom_level"),
        (dict(instances_per_series=2, **AUG), "instances_per_series"),
        # sigma_C != sigma_F is only proven for w = 1 (Appendix I.2)
        (dict(relation=NeighbouringRelation(size=3, value_bound=1.0), context_noise=0.5, forecast_noise=1.0),
         "forecast_noise"),
    ],
)
def test_augmentation_outside_theorem_g1_is_an_error(kw, parameter):
    with pytest.raises(ConfigurationError) as err:
        StructuredSubsamplingAccountant(spec(**kw), 1.0)
    assert err.value.parameter == parameter


def test_lower_bounds_only_where_the_paper_gives_them():
    with pytest.raises(ConfigurationError, match="bound"):
        StructuredSubsamplingAccountant(spec(top_level="poisson"), 1.0, bound="lower")
    with pytest.raises(ConfigurationError, match="bound"):
        StructuredSubsamplingAccountant(spec(**AUG), 1.0, bound="lower")


def test_accepted_augmentation_configurations():
    for kw in (AUG, dict(AUG, top_level="poisson"),
               dict(relation=NeighbouringRelation(level="user", size=3, value_bound=2.0), context_noise=0.7,
                    forecast_noise=0.7),
               dict(relation=NeighbouringRelation(value_bound=1.0), context_noise=0.0, forecast_noise=2.0)):
        acc = StructuredSubsamplingAccountant(spec(**kw), 1.0)
        assert acc.theorem.startswith(("Theorem 4.5", "Theorem G.1"))

"""Issue 30: the mechanism objects (privacy/mechanisms.py): self-validation, the registry, specs built from objects
(identical to specs built from names, down to the repr that privacy ledgers store), and the capability properties
the other layers read instead of comparing kind names."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import pytest

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import (
    BOTTOM_LEVELS,
    TOP_LEVELS,
    BandMFNoiseSpec,
    BMinSep,
    CyclicPoisson,
    GaussianNoiseSpec,
    Iteration,
    NeighbouringRelation,
    PoissonBottomLevel,
    PoissonTopLevel,
    SamplingSpec,
    Shuffling,
    StructuredSubsamplingAccountant,
    WithoutReplacement,
    WithReplacement,
    bottom_level_from_name,
    noise_from_name,
    top_level_from_name,
)
from lightning_dpts.privacy.mechanisms import (
    BOTTOM_LEVEL_SCHEMES,
    NOISE_SPECS,
    TOP_LEVEL_SCHEMES,
    Accounting,
    Mechanism,
)
from tests.privacy.make_before_table import build

LEDGERS = json.loads((pathlib.Path(__file__).parent / "data" / "ledgers_before_i30.json").read_text())
BASE = {"num_series": 40, "min_length": 60, "context_length": 12, "prediction_length": 4, "batch_size": 4}
ALL_CLASSES = [*TOP_LEVEL_SCHEMES.values(), *BOTTOM_LEVEL_SCHEMES.values(), *NOISE_SPECS.values()]


# -- registry ------------------------------------------------------------------------------------------------------
def test_registry_maps_every_name_to_one_object() -> None:
    assert tuple(TOP_LEVEL_SCHEMES) == TOP_LEVELS
    assert tuple(BOTTOM_LEVEL_SCHEMES) == BOTTOM_LEVELS
    assert set(NOISE_SPECS) == {"gaussian", "bandmf"}
    for name, cls in TOP_LEVEL_SCHEMES.items():
        obj = top_level_from_name(name)
        assert type(obj) is cls and obj.name == name
        assert top_level_from_name(name) == obj and top_level_from_name(obj) is obj
    for name, cls in BOTTOM_LEVEL_SCHEMES.items():
        obj = bottom_level_from_name(name)
        assert type(obj) is cls and obj.name == name and bottom_level_from_name(obj) is obj
    for name, cls in NOISE_SPECS.items():
        obj = noise_from_name(name)
        assert type(obj) is cls and obj.kind == name and noise_from_name(obj) is obj
    assert len({cls for cls in ALL_CLASSES}) == len(ALL_CLASSES)
    assert top_level_from_name("b_min_sep", bands=4) == BMinSep(bands=4)
    assert noise_from_name("bandmf", bands=3) == BandMFNoiseSpec(bands=3)


@pytest.mark.parametrize(("lookup", "parameter", "names"), [
    (top_level_from_name, "top_level", TOP_LEVELS),
    (bottom_level_from_name, "bottom_level", BOTTOM_LEVELS),
    (noise_from_name, "noise", ("gaussian", "bandmf")),
])
def test_registry_refuses_unknown_names_listing_the_accepted_ones(lookup, parameter, names) -> None:
    with pytest.raises(ConfigurationError) as info:
        lookup("cyclic")
    assert info.value.parameter == parameter
    for name in names:
        assert repr(name) in str(info.value)


def test_registry_refuses_bands_for_schemes_without_them() -> None:
    with pytest.raises(ConfigurationError, match="bands"):
        top_level_from_name("poisson", bands=2)
    with pytest.raises(ConfigurationError, match="bands"):
        noise_from_name("gaussian", bands=2)


# -- self-validation -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("cls", "field", "bad"), [
    (BMinSep, "bands", 0), (BMinSep, "bands", 1.5), (BMinSep, "bands", True), (BMinSep, "bands", "4"),
    (CyclicPoisson, "groups", 0), (CyclicPoisson, "groups", 2.5), (CyclicPoisson, "groups", True),
    (BandMFNoiseSpec, "bands", 0), (BandMFNoiseSpec, "bands", None),
])
def test_each_object_validates_its_fields(cls, field, bad) -> None:
    with pytest.raises(ConfigurationError) as info:
        cls(**{field: bad})
    assert info.value.parameter == field


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_objects_are_frozen_documented_and_name_their_accounting(cls) -> None:
    obj = cls()
    assert isinstance(obj, Mechanism)
    assert dataclasses.is_dataclass(obj)
    fields = [f.name for f in dataclasses.fields(obj)]
    assert set(cls.public_fields) <= set(fields)
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, fields[0], 2)
    doc = cls.__doc__ or ""
    assert "Guarantee" in doc and "Public" in doc
    accounting = obj.accounting
    assert isinstance(accounting, Accounting)
    assert accounting.method in ("pld", "monte_carlo")
    assert accounting.composition in ("step", "epoch", "run", "opportunity")
    assert accounting.theorems


# -- capability properties (what the other layers read instead of names) ----------------------------------------------
def test_capabilities() -> None:
    assert [c.accounts_per_epoch for c in TOP_LEVEL_SCHEMES.values()] == [True, True, False, False, False, False]
    assert [c.needs_monte_carlo for c in TOP_LEVEL_SCHEMES.values()] == [False, False, False, False, True, False]
    assert [c.separates_participations for c in TOP_LEVEL_SCHEMES.values()] == [False, False, False, False, True,
                                                                                 True]
    assert [c.supports_augmentation for c in TOP_LEVEL_SCHEMES.values()] == [False, False, True, True, False, False]
    assert [c.has_lower_bound for c in TOP_LEVEL_SCHEMES.values()] == [True, True, True, False, True, False]
    assert CyclicPoisson(4).min_separation == 4 and CyclicPoisson(4).composition_unit == "opportunity"
    assert BandMFNoiseSpec(4).compatible_top_level(CyclicPoisson(4))
    assert BandMFNoiseSpec(4).compatible_top_level(CyclicPoisson(6))  # k >= b (Theorem B.2)
    assert not BandMFNoiseSpec(4).compatible_top_level(CyclicPoisson(3))
    assert GaussianNoiseSpec().compatible_top_level(CyclicPoisson(3))
    assert BMinSep(bands=5).min_separation == 5 and WithoutReplacement().min_separation == 1
    assert Iteration().composition_unit == "epoch" and PoissonTopLevel().composition_unit == "step"
    assert BMinSep(3).composition_unit == "run"
    assert WithReplacement.shortest_series_decides and not PoissonBottomLevel.shortest_series_decides
    assert WithReplacement.supports_augmentation and not PoissonBottomLevel.supports_augmentation
    assert WithReplacement.bounded_windows_per_series and not PoissonBottomLevel.bounded_windows_per_series
    assert not GaussianNoiseSpec().correlated and BandMFNoiseSpec(4).correlated
    assert BandMFNoiseSpec(4).needs_monte_carlo and not GaussianNoiseSpec().needs_monte_carlo
    assert GaussianNoiseSpec().bands == 1 and BandMFNoiseSpec(4).bands == 4
    assert BandMFNoiseSpec(4).compatible_top_level(BMinSep(4))
    assert not BandMFNoiseSpec(4).compatible_top_level(BMinSep(3))
    assert not BandMFNoiseSpec(4).compatible_top_level(WithoutReplacement())
    assert GaussianNoiseSpec().compatible_top_level(Shuffling())


# -- specs from objects: identical to specs from names ----------------------------------------------------------------
@pytest.mark.parametrize("top", [n for n in TOP_LEVELS if n != "b_min_sep"])
@pytest.mark.parametrize("bottom", BOTTOM_LEVELS)
def test_spec_from_objects_equals_spec_from_names(top: str, bottom: str) -> None:
    by_name = SamplingSpec(**BASE, top_level=top, bottom_level=bottom)
    by_object = SamplingSpec(**BASE, top_level=top_level_from_name(top), bottom_level=bottom_level_from_name(bottom))
    assert by_object == by_name and repr(by_object) == repr(by_name) and hash(by_object) == hash(by_name)
    assert by_object.top_level == top and by_object.bottom_level == bottom  # the names, for compatibility
    assert by_object.top_level_scheme == top_level_from_name(top)
    assert by_object.bottom_level_scheme == bottom_level_from_name(bottom)
    assert dataclasses.replace(by_object, batch_size=8).top_level_scheme == by_object.top_level_scheme
    a = StructuredSubsamplingAccountant(by_object, 1.2)
    b = StructuredSubsamplingAccountant(by_name, 1.2)
    assert a.epsilon(30, 1e-5) == b.epsilon(30, 1e-5) and a.theorem == b.theorem


def test_b_min_sep_object_sets_bands() -> None:
    spec = SamplingSpec(**BASE, top_level=BMinSep(bands=4))
    assert spec == SamplingSpec(**BASE, top_level="b_min_sep", bands=4)
    assert spec.bands == 4 and spec.top_level_scheme == BMinSep(4) and spec.top_level_scheme.needs_monte_carlo
    assert SamplingSpec(**BASE, top_level=BMinSep(bands=4), bands=4) == spec
    with pytest.raises(ConfigurationError) as info:
        SamplingSpec(**BASE, top_level=BMinSep(bands=4), bands=3)
    assert info.value.parameter == "bands"
    with pytest.raises(ConfigurationError) as info:  # N'/N = 1/10 > 1/b
        SamplingSpec(**{**BASE, "num_series": 12}, top_level=BMinSep(bands=4))
    assert info.value.parameter == "batch_size"
    with pytest.raises(ConfigurationError) as info:
        StructuredSubsamplingAccountant(spec, 1.0)
    assert info.value.parameter == "spec.top_level"


def test_spec_refusals_unchanged() -> None:
    with pytest.raises(ConfigurationError) as info:
        SamplingSpec(**BASE, top_level="cyclic")
    assert info.value.parameter == "top_level" and "'b_min_sep'" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        SamplingSpec(**BASE, bottom_level="cyclic")
    assert info.value.parameter == "bottom_level"
    with pytest.raises(ConfigurationError, match="must be 1 unless top_level='b_min_sep'"):
        SamplingSpec(**BASE, top_level=WithoutReplacement(), bands=2)


# -- privacy ledgers of existing checkpoints still match --------------------------------------------------------------
@pytest.mark.parametrize("saved", LEDGERS, ids=[s["config"]["name"] for s in LEDGERS])
def test_ledgers_written_by_main_still_match(saved: dict) -> None:
    from lightning_dpts.training.ledger import PrivacyLedger

    config = saved["config"]
    ledger = PrivacyLedger.from_dict(saved["ledger"])
    by_name = build(config)
    objects = {"top_level": top_level_from_name(config["top_level"], bands=config.get("bands", 1)),
               "bottom_level": bottom_level_from_name(config.get("bottom_level", "with_replacement"))}
    by_object = dataclasses.replace(by_name, **objects, bands=1)  # bands comes from the BMinSep object
    for spec in (by_name, by_object):
        assert spec.matches_repr(ledger.sampling_spec)
        ledger.check_continuation(config["sigma"], 1.0, spec)  # no refusal: the same sampling
    other = dataclasses.replace(by_name, batch_size=by_name.batch_size * 2)
    with pytest.raises(ConfigurationError):
        ledger.check_continuation(config["sigma"], 1.0, other)


def test_relation_is_a_validated_mechanism_description() -> None:
    with pytest.raises(ConfigurationError) as info:
        NeighbouringRelation(level="series")
    assert info.value.parameter == "level"
    with pytest.raises(ConfigurationError) as info:
        NeighbouringRelation(size=0)
    assert info.value.parameter == "size"
    with pytest.raises(ConfigurationError) as info:
        NeighbouringRelation(value_bound=-1.0)
    assert info.value.parameter == "value_bound"

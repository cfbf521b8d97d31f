"""benchmarks/dp_gap.py changes module constants of the model and the recipe for its variants: it puts them back,
also when a variant fails (the script is imported by other experiments, which would otherwise train the changed
model)."""

from __future__ import annotations

import pytest


def test_a_failing_variant_leaves_the_module_constants_as_they_were(benchmark_script) -> None:
    dp_gap = benchmark_script("dp_gap")
    import lightning_dpts.recipe as recipe_module
    from lightning_dpts.models import combination as comb_module

    names = ("SPREAD_FEATURE_SCALE", "INITIAL_SELECTION", "INITIAL_HOLDOUT", "GATE_LR_FACTOR", "SPREAD_LR_FACTOR",
             "INITIAL_WEIGHTS", "INITIAL_SPREAD")
    before = {name: getattr(comb_module, name) for name in names}
    start = recipe_module.AVERAGING_START
    # the constants are set, then the learning rate fails to parse: before any training
    with pytest.raises(ValueError, match="abc"):
        dp_gap.main("us_employment", "last", 4.0, [0], ["initial_holdout=0.7,avg=0.9,spread0=-1,lr=abc"])
    assert {name: getattr(comb_module, name) for name in names} == before
    assert recipe_module.AVERAGING_START == start

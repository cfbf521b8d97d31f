"""The recipe: deterministic choices from public metadata only; its warnings; dpts fit applies it."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.app.cli import main
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import SamplingSpec, calibrate_noise_multiplier
from lightning_dpts.recipe import MAX_DROPPED_FRACTION, MAX_WINDOW_FRACTION, choose_recipe, rdp_noise_multiplier


def test_same_metadata_same_recipe_and_it_takes_no_values():
    lengths = [120] * 30 + [400] * 50
    a = choose_recipe(lengths, freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)
    b = choose_recipe(list(reversed(lengths)), freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)
    assert a == b
    import inspect

    assert "values" not in inspect.signature(choose_recipe).parameters


def test_fit_resolves_the_same_recipe_for_different_values(tmp_path):
    """Two datasets with the same metadata but different values get the same recipe (nothing reads values)."""
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.geometry import resolve_config
    from lightning_dpts.data.loading import load_long_table

    rng = np.random.default_rng(0)
    stamps = pd.period_range("2000-01", periods=90, freq="M").to_timestamp()
    configs = []
    for name, scale in (("a", 1.0), ("b", 1e4)):
        frame = pd.DataFrame({"id": np.repeat([f"s{i}" for i in range(20)], 90), "timestamp": np.tile(stamps, 20),
                              "value": scale * rng.lognormal(size=20 * 90)})
        path = tmp_path / f"{name}.csv"
        frame.to_csv(path, index=False)
        table, freq = load_long_table(path, "id", "timestamp", "value")
        lengths = table.groupby("item_id").size().to_numpy()
        configs.append(resolve_config(FitConfig(data=str(path)), lengths, freq)[1])
    assert configs[0] == configs[1]


def test_monthly_past_window_is_five_seasons_capped_and_counts_in_the_rate():
    r = choose_recipe([200] * 100, freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)
    starts = (200 - 12) - 12 + 1
    assert r.model == "combination" and r.season_length == 12
    assert r.context_length == int(MAX_WINDOW_FRACTION * starts) - 12 < 60  # 5 seasons, capped at 0.35
    assert r.bottom_level_rate == pytest.approx((r.context_length + 12) / starts)
    assert r.effective_dataset_size == pytest.approx(100 / r.bottom_level_rate)
    assert r.dropped_series == 0 and r.min_series_length is None
    long = choose_recipe([900] * 100, freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)
    assert long.context_length == 60
    linear = choose_recipe([300] * 100, freq="M", prediction_length=12, epsilon=1.0, delta=1e-7,
                           model="seasonal_linear")
    assert linear.model == "seasonal_linear" and linear.context_length == 24  # its own: 2 seasons
    with pytest.raises(ConfigurationError, match="model"):
        choose_recipe([300] * 100, freq="M", prediction_length=12, epsilon=1.0, delta=1e-7, model="deepar")


@pytest.mark.parametrize(("freq", "length", "horizon", "season", "wanted"), [
    ("W", 900, 13, 1, 65),  # no season: 5 horizons
    ("D", 1500, 14, 7, 35),  # 5 weeks
    ("h", 8000, 48, 24, 336),  # long hourly series: two weeks, the second season
    ("h", 1000, 48, 24, 268),  # M4-hourly-like lengths: capped below two weeks (0.35 of the starts)
])
def test_the_past_window_fits_the_seasons(freq, length, horizon, season, wanted):
    r = choose_recipe([length] * 200, freq=freq, prediction_length=horizon, epsilon=4.0, delta=1e-7)
    assert r.season_length == season and r.context_length == wanted
    starts = (length - horizon) - horizon + 1
    assert r.context_length + horizon <= MAX_WINDOW_FRACTION * starts


def test_past_window_shrinks_for_short_series():
    r = choose_recipe([90] * 60, freq="W", prediction_length=13, epsilon=1.0, delta=1e-7)
    starts = (90 - 13) - 13 + 1
    assert r.context_length + 13 <= MAX_WINDOW_FRACTION * starts or r.context_length == 3
    assert r.context_length < 65  # 5 x horizon did not fit


def test_short_series_threshold_drops_at_most_a_fifth():
    lengths = [93] * 15 + [900] * 85
    r = choose_recipe(lengths, freq="W", prediction_length=13, epsilon=1.0, delta=1e-7)
    assert r.dropped_series == 15 and r.num_series == 85 and r.min_series_length == 900 - 0
    assert "leave out the 15 series" in r.reasons["short_series"]
    many_short = [93] * 40 + [900] * 60  # dropping them would leave out 40% > MAX_DROPPED_FRACTION
    r2 = choose_recipe(many_short, freq="W", prediction_length=13, epsilon=1.0, delta=1e-7)
    assert r2.dropped_series <= MAX_DROPPED_FRACTION * 100 and r2.dropped_series == 0


def test_small_budget_is_said_plainly():
    small = choose_recipe([60] * 10, freq="M", prediction_length=12, epsilon=0.1, delta=1e-7)
    assert small.regime == "small" and any("budget is small for this data" in w for w in small.warnings)
    fine = choose_recipe([500] * 300, freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)
    assert not fine.warnings


def test_refuses_metadata_without_a_training_window():
    with pytest.raises(ConfigurationError, match="no series has a training part") as err:
        choose_recipe([20, 20], freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)
    assert err.value.parameter == "data"
    with pytest.raises(ConfigurationError, match="data"):
        choose_recipe([], freq="M", prediction_length=12, epsilon=1.0, delta=1e-7)


def test_rdp_proxy_is_close_to_the_pld_calibration():
    """The candidate proxy is within 25% of the PLD accountant's sigma on a Theorem 4.4 configuration."""
    spec = SamplingSpec(num_series=148, min_length=201, context_length=24, prediction_length=12, batch_size=64)
    exact = calibrate_noise_multiplier(spec, 1.0, 1e-7, steps=100, rtol=1e-2)
    proxy = rdp_noise_multiplier(spec.top_level_rate * spec.bottom_level_rate, 100, 1.0, 1e-7)
    assert math.isfinite(proxy) and 0.8 * exact <= proxy <= 1.25 * exact


@pytest.mark.slow
def test_fit_applies_the_recipe_and_explicit_options_win(tiny_csv, tmp_path):
    out = tmp_path / "r"
    assert main(["fit", "--data", str(tiny_csv), "--prediction-length", "6", "--epsilon", "8", "--batch-size", "8",
                 "--epochs", "2", "--no-non-dp", "--no-private-plots", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["model"] == "combination"
    recipe = report["recipe"]
    assert "batch_size" not in recipe["chosen_by_recipe"] and "model" in recipe["chosen_by_recipe"]
    assert "epochs" not in recipe["chosen_by_recipe"] and report["steps"] == 2 * (24 // 8)
    assert report["config"]["batch_size"] == 8 and report["config"]["context_length"] == recipe["context_length"]
    assert report["privacy_configuration"]["sampling_spec"]["context_length"] == recipe["context_length"]
    assert report["epsilon"] <= 8


def test_other_models_keep_their_defaults():
    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.geometry import resolve_config

    config, recipe, chosen = resolve_config(FitConfig(model="dlinear"), np.array([100] * 10), "M")
    assert recipe is None and chosen == []
    assert (config.epochs, config.batch_size, config.learning_rate, config.context_length) == (100, 64, 5e-3, None)


def test_min_series_length_option_is_validated():
    with pytest.raises(SystemExit) as err:
        main(["fit", "--min-series-length", "0"])
    assert err.value.code == 2


def test_a_given_threshold_is_used_and_the_rest_chosen_for_it():
    lengths = [93] * 15 + [900] * 85
    r = choose_recipe(lengths, freq="W", prediction_length=13, epsilon=1.0, delta=1e-7, min_series_length=1)
    assert r.dropped_series == 0 and r.num_series == 100 and r.min_series_length == 1
    assert r.min_training_length == 93 - 13 and r.context_length + 13 <= MAX_WINDOW_FRACTION * (93 - 26 + 1)


@pytest.mark.parametrize("short_length", [50, 59, 60], ids=["held-out-plus", "one-step-short", "just-long-enough"])
def test_plan_keep_and_the_datamodule_agree_on_what_is_too_short(short_length):
    """The README's Python path on real monthly data with one short series: before issue 38 ``plan.keep()`` kept a
    series whose training part is shorter than the horizon after the 4 held-out windows, and the datamodule then
    refused it with a ConfigurationError. One rule (``too_short``) now decides for both."""
    from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset
    from lightning_dpts.models import SeasonalLinearEstimator
    from lightning_dpts.recipe import make_private_with_epsilon

    table = load_dataset("us_employment")
    first = table[table.item_id == table.item_id.iloc[0]]
    table = pd.concat([table, first.tail(short_length).assign(item_id="short")], ignore_index=True)
    lengths = table.groupby("item_id").size()
    estimator = SeasonalLinearEstimator(prediction_length=12, context_length=24, season_length=12)
    module = estimator.create_lightning_module()
    plan = make_private_with_epsilon(lengths.to_numpy(), module, epsilon=1.0, delta=1e-7, freq="M",
                                     prediction_length=12, held_out_windows=4)
    kept = plan.keep(lengths)
    if short_length < 60:  # 4 x 12 held out + 12 for one training window (at 60 the recipe's threshold decides)
        assert not kept[list(lengths.index).index("short")]
    dm = StructuredSubsamplingDataModule(table[table.item_id.isin(lengths.index[kept])], freq="M", model=module,
                                         **plan.datamodule_kwargs)
    assert dm.sampling_spec.num_series == int(kept.sum()) and not dm.dropped_series
    from lightning_dpts.data.datamodule import too_short

    assert not (kept & too_short(lengths, 12, 4)).any()


def test_the_recipe_model_gets_iterate_averaging_and_others_do_not():
    from lightning_dpts.models import CombinationEstimator
    from lightning_dpts.recipe import make_private_with_epsilon
    from lightning_dpts.training import IterateAveraging

    module = CombinationEstimator(prediction_length=12, context_length=60, freq="M").create_lightning_module()
    plan = make_private_with_epsilon([600] * 100, module, epsilon=1.0, delta=1e-7, freq="M")
    assert len(plan.averaging) == 1 and isinstance(plan.averaging[0], IterateAveraging)
    assert plan.averaging[0] in plan.trainer_kwargs["callbacks"] and plan.settings["past_length"] == 60
    other = make_private_with_epsilon([600] * 100, epsilon=1.0, delta=1e-7, freq="M", prediction_length=12)
    assert other.averaging == [] and len(other.trainer_kwargs["callbacks"]) == 2

"""Input adapters, bundled data, splits, the sampling spec, and clear errors for bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.data import StructuredSubsamplingDataModule, load_dataset, to_collection
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation, SamplingSpec

from .conftest import id_series

BASE = dict(context_length=8, prediction_length=4, batch_size=4, test_windows=0)


def dm_of(data, **kw) -> StructuredSubsamplingDataModule:
    return StructuredSubsamplingDataModule(data, **{**BASE, **kw})


def test_bundled_us_employment():
    frame = load_dataset("us_employment")
    assert frame["item_id"].nunique() == 148 and len(frame) == 72_339
    assert {"item_id", "timestamp", "target"} <= set(frame.columns)
    dm = StructuredSubsamplingDataModule(
        "us_employment", context_length=24, prediction_length=12, batch_size=32, val_windows=1
    )
    spec = dm.sampling_spec
    assert spec.num_series == 148
    assert spec.min_length == 225 - 2 * 12  # shortest series minus the validation and test windows
    assert dm.freq == "M" and dm.collection.starts[0] == pd.Period("1939-01", freq="M")
    assert spec.steps_per_epoch == 148 // 32


def test_sampling_spec_is_read_only_and_complete():
    relation = NeighbouringRelation(level="event", size=2, value_bound=1.0)
    dm = dm_of(
        id_series([40, 50, 60, 70]),
        batch_size=4,
        instances_per_series=2,
        top_level="poisson",
        bottom_level="poisson",
        relation=relation,
        context_noise=0.5,
        forecast_noise=0.25,
        past_length=11,
        val_windows=1,
        test_windows=1,
    )
    assert dm.sampling_spec == SamplingSpec(
        num_series=4,
        min_length=40 - 8,
        lengths=(32, 42, 52, 62),  # every training length: the accountant takes the maximum over them
        context_length=11,
        prediction_length=4,
        batch_size=4,
        instances_per_series=2,
        top_level="poisson",
        bottom_level="poisson",
        relation=relation,
        context_noise=0.5,
        forecast_noise=0.25,
    )
    with pytest.raises(AttributeError):
        dm.sampling_spec = None  # type: ignore[misc]
    assert dm.train_batch()["past_target"].shape[1] == 11  # past_length (context + lags) is gathered


def test_numpy_multivariate_and_nan_handling():
    rng = np.random.default_rng(0)
    series = [rng.normal(size=(30, 3)), rng.normal(size=(25, 3))]
    series[0][3, 1] = np.nan
    dm = dm_of(series, batch_size=2, top_level="iteration")
    batch = dm.train_batch()
    assert batch["past_target"].shape == (2, 8, 3) and batch["future_target"].shape == (2, 4, 3)
    assert "past_time_feat" not in batch  # no time stamps, no freq
    store = dm._train_store
    out = store.gather(np.array([0]), np.array([0]))
    assert out["future_observed_values"][0, 3, 1] == 0 and out["future_target"][0, 3, 1] == 0
    assert out["future_observed_values"][0, 3, 0] == 1


def test_long_dataframe_with_gap_becomes_nan():
    stamps = pd.date_range("2020-01-01", periods=30, freq="D")
    rows = [("a", t, float(i)) for i, t in enumerate(stamps) if i != 10]
    rows += [("b", t, float(i)) for i, t in enumerate(stamps[:20])]
    frame = pd.DataFrame(rows, columns=["id", "ts", "y"])
    coll = to_collection(frame, id_column="id", timestamp_column="ts", value_column="y")
    assert coll.freq == "D" and [len(t) for t in coll.targets] == [30, 20]
    assert np.isnan(coll.targets[0][10, 0]) and coll.starts[1] == pd.Period("2020-01-01", freq="D")
    dm = dm_of(frame, id_column="id", timestamp_column="ts", value_column="y", batch_size=2)
    assert dm.train_batch()["past_time_feat"].shape[-1] > 1  # time features + age


def test_gluonts_dataset_input():
    from gluonts.dataset.common import ListDataset

    data = ListDataset(
        [
            {"target": np.arange(40.0), "start": "2020-01", "feat_static_cat": [3]},
            {"target": np.arange(50.0), "start": "2021-06", "feat_static_cat": [1]},
        ],
        freq="M",
    )
    dm = dm_of(data, batch_size=2, top_level="iteration")
    batch = dm.train_batch()
    assert batch["feat_static_cat"].tolist() == [[3], [1]]
    assert batch["feat_static_real"].tolist() == [[0.0], [0.0]]  # dummy, like GluonTS estimators


def test_short_series_error_names_series_or_drops_with_warning():
    series = id_series([40, 7, 40, 5])  # training parts 3 and 1 < prediction_length = 4
    with pytest.raises(ConfigurationError) as info:
        dm_of(series, batch_size=2, val_windows=1)
    assert info.value.parameter == "data" and "'1'" in str(info.value) and "drop_short_series" in str(info.value)
    with pytest.warns(UserWarning, match="dropped 2 of 4 series"):
        dm = dm_of(series, batch_size=2, val_windows=1, drop_short_series=True)
    assert dm.dropped_series == ["1", "3"] and dm.num_series == 2 and dm.item_ids == ["0", "2"]


@pytest.mark.parametrize(
    ("data", "kwargs", "parameter"),
    [
        ([], {}, "data"),
        (pd.DataFrame({"item_id": [], "timestamp": [], "target": []}), {"freq": "D"}, "data"),
        (id_series([40] * 4), {"batch_size": 2, "instances_per_series": 4}, "batch_size"),  # Lambda < lambda
        (id_series([40] * 4), {"batch_size": 5}, "batch_size"),  # floor(Lambda / lambda) > N
        (id_series([40] * 4), {"batch_size": 3, "instances_per_series": 2}, "batch_size"),  # not divisible
        (
            id_series([40] * 4),
            {"context_noise": -0.1, "relation": NeighbouringRelation(value_bound=1.0)},
            "context_noise",
        ),
        (
            id_series([40] * 4),
            {"forecast_noise": -1.0, "relation": NeighbouringRelation(value_bound=1.0)},
            "forecast_noise",
        ),
        (id_series([40] * 4), {"context_noise": 0.5}, "relation.value_bound"),  # noise needs v
        (id_series([40] * 4), {"top_level": "random"}, "top_level"),
        (id_series([40] * 4), {"bottom_level": "uniform"}, "bottom_level"),
        ([np.zeros((30, 2)), np.zeros((30, 3))], {"batch_size": 1}, "data"),  # mismatched widths
        ([np.zeros(30), np.zeros((30, 2))], {"batch_size": 1}, "data"),  # mixed layouts
        (id_series([40] * 4), {"seed": -1}, "seed"),
        (id_series([40] * 4), {"past_length": 4}, "past_length"),  # shorter than the context
        (id_series([40] * 4), {"prediction_length": 0}, "prediction_length"),
        (id_series([40] * 4), {"test_windows": -1}, "test_windows"),
        ("no_such_dataset", {}, "data"),
    ],
)
def test_bad_input_is_a_clear_error(data, kwargs, parameter):
    with pytest.raises(ConfigurationError) as info:
        dm_of(data, **kwargs)
    assert info.value.parameter == parameter
    assert str(info.value).startswith(f"{parameter}=")


def test_model_geometry_mismatch_is_an_error():
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    module = SimpleFeedForwardLightningModule(model_kwargs=dict(prediction_length=4, context_length=8))
    dm = StructuredSubsamplingDataModule(id_series([40] * 4), batch_size=2, model=module, test_windows=0)
    assert (dm.context_length, dm.prediction_length, dm.past_length) == (8, 4, 8)
    with pytest.raises(ConfigurationError) as info:
        StructuredSubsamplingDataModule(id_series([40] * 4), batch_size=2, model=module, prediction_length=5)
    assert info.value.parameter == "prediction_length"
    with pytest.raises(ConfigurationError) as info:
        StructuredSubsamplingDataModule(id_series([40] * 4), batch_size=2, model=object())
    assert info.value.parameter == "model"


def test_deepar_without_time_stamps_is_an_error():
    from gluonts.torch.model.deepar import DeepARLightningModule

    module = DeepARLightningModule(
        model_kwargs=dict(freq="M", context_length=8, prediction_length=4, num_feat_dynamic_real=2)
    )
    with pytest.raises(ConfigurationError) as info:
        StructuredSubsamplingDataModule(id_series([80] * 4), batch_size=2, model=module)
    assert info.value.parameter == "model" and "freq" in str(info.value)
    dm = StructuredSubsamplingDataModule(id_series([80] * 4), batch_size=2, model=module, freq="M")
    assert dm.train_batch()["past_time_feat"].shape == (2, dm.past_length, 2)


# --------------------------------------------------------------------------------------------------------------
# issue 10: every bad input is a clear error naming the column, the row and the fix
# --------------------------------------------------------------------------------------------------------------
def _frame(ids, stamps, values) -> pd.DataFrame:
    return pd.DataFrame({"item_id": ids, "timestamp": stamps, "target": values})


def _error(data, **kw) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        to_collection(data, **kw)
    return info.value


def test_integer_time_stamps_need_freq_and_are_step_numbers():
    frame = _frame(["a"] * 5 + ["b"] * 4, [0, 1, 2, 3, 4, 2, 3, 4, 5], np.arange(9.0))
    err = _error(frame)
    assert err.parameter == "timestamp_column" and "freq" in err.requirement and "nanosecond" not in err.requirement
    coll = to_collection(frame, freq="D")
    assert [len(t) for t in coll.targets] == [5, 4]  # consecutive steps, not nanoseconds
    assert coll.starts == [pd.Period(ordinal=0, freq="D"), pd.Period(ordinal=2, freq="D")]
    err = _error(_frame(["a"] * 3, [0.0, 1.5, 2.0], [1.0, 2.0, 3.0]), freq="D")
    assert "row 1" in err.requirement and "whole step numbers" in err.requirement


def test_day_first_dates_name_the_row_and_the_fix():
    days = [f"{d:02d}/02/2020" for d in range(1, 20)]  # day-first: row 12 (13/02/2020) is no month
    err = _error(_frame(["a"] * len(days), days, np.arange(len(days), dtype=float)))
    assert err.parameter == "timestamp_column" and "row 12" in err.requirement
    assert "13/02/2020" in err.requirement and "ISO 8601" in err.requirement


def test_a_wrong_freq_is_refused_not_nan_expanded():
    stamps = pd.date_range("2020-01-01", periods=40, freq="D")
    frame = _frame(["a"] * 40, stamps, np.arange(40.0))
    err = _error(frame, freq="h")  # daily data read hourly: 96% missing
    assert err.parameter == "timestamp_column" and "'a'" in err.requirement and "24 periods" in err.requirement
    err = _error(frame, freq="M")  # several days in one month
    assert "same period" in err.requirement and "row 0" in err.requirement and "row 1" in err.requirement
    sparse = _frame(["a", "a"], pd.to_datetime(["2020-01-01", "2024-01-01"]), [1.0, 2.0])
    err = _error(sparse, freq="h")  # two stamps four years of hours apart: not a 35,000-step array
    assert "35063 of its 35065 steps would be missing" in err.requirement


def test_a_weekly_series_among_daily_ones_is_named():
    daily = pd.date_range("2020-01-01", periods=30, freq="D")
    weekly = pd.date_range("2020-01-05", periods=10, freq="W")
    frame = _frame(["d1"] * 30 + ["w"] * 10 + ["d2"] * 30, [*daily, *weekly, *daily], np.arange(70.0))
    err = _error(frame)
    assert "'w'" in err.requirement and "7 periods" in err.requirement and "row 30" in err.requirement
    assert to_collection(frame[frame["item_id"] != "w"]).freq == "D"


def test_gluonts_starts_of_different_frequencies_are_refused():
    entries = [
        {"target": np.arange(30.0), "start": pd.Period("2020-01", freq="M")},
        {"target": np.arange(30.0), "start": pd.Period("2020-01-01", freq="D"), "item_id": "daily"},
    ]
    err = _error(entries)
    assert err.parameter == "data" and "entry 1" in str(err.value) and "'daily'" in str(err.value)
    assert "'D'" in err.requirement and "'M'" in err.requirement
    err = _error(entries[:1], freq="W")  # an explicit freq is not silently converted either
    assert "entry 0" in str(err.value)


def test_missing_time_stamp_and_missing_id_name_the_row():
    stamps = list(pd.date_range("2020-01-01", periods=6, freq="D").astype(str))
    stamps[4] = None
    err = _error(_frame(["a"] * 6, stamps, np.arange(6.0)))
    assert err.parameter == "timestamp_column" and "row 4" in err.requirement and "'a'" in err.requirement
    ids = ["a", "a", None, "a", "a", "a"]
    err = _error(_frame(ids, pd.date_range("2020-01-01", periods=6, freq="D"), np.arange(6.0)))
    assert err.parameter == "id_column" and "row 2" in err.requirement
    assert "nan" not in to_collection(_frame(["a"] * 6, pd.date_range("2020", periods=6, freq="D"),
                                             np.arange(6.0))).item_ids


@pytest.mark.parametrize("layout", ["frame", "array", "gluonts"])
def test_complex_values_are_refused(layout):
    values = np.arange(10.0) + 1j * np.r_[np.zeros(5), np.ones(5)]
    data = {
        "frame": _frame(["a"] * 10, pd.date_range("2020", periods=10, freq="D"), values),
        "array": [values],
        "gluonts": [{"target": values, "start": pd.Period("2020-01", freq="M")}],
    }[layout]
    err = _error(data)
    assert "complex" in err.requirement
    if layout == "frame":
        assert err.parameter == "value_column" and "row 5" in err.requirement


@pytest.mark.parametrize("layout", ["frame", "array", "gluonts"])
def test_values_outside_float32_are_refused(layout):
    def make(big: float):
        values = np.arange(10.0)
        values[7] = big
        return {
            "frame": _frame(["a"] * 10, pd.date_range("2020", periods=10, freq="D"), values),
            "array": [values],
            "gluonts": [{"target": values, "start": pd.Period("2020-01", freq="M")}],
        }[layout]

    err = _error(make(1e39))  # finite in float64, inf in float32 (training precision)
    assert "float32" in err.requirement and "1e+39" in err.requirement
    assert ("row 7" if layout == "frame" else "time step 7") in err.requirement
    assert to_collection(make(3e38)).targets[0][7, 0] == 3e38  # inside the float32 range: accepted


def test_text_values_name_the_row():
    frame = _frame(["a"] * 4, pd.date_range("2020", periods=4, freq="D"), ["1", "2", "x", "4"])
    err = _error(frame)
    assert err.parameter == "value_column" and "row 2" in err.requirement and "'x'" in err.requirement
    err = _error(_frame(["a"] * 4, pd.date_range("2020", periods=4, freq="D"), ["1", "2", "1+2j", "4"]))
    assert "complex" in err.requirement
    err = _error([np.array(["1", "x"])])
    assert err.parameter == "data" and "numbers" in err.requirement


def test_drop_short_series_is_linear_time(monkeypatch):
    """20,000 series, half too short: dropping took ~70 s for 100,000 series when each membership test scanned the
    list of short ones (quadratic). Work is counted, not timed: the indices of the short series are made by the
    module's ``int``, replaced here by an int that counts its equality comparisons; a hash set compares each kept
    index at most once (n), a list scan about n^2/8 times."""
    from lightning_dpts.data import layout as module
    from lightning_dpts.data.layout import drop_short
    from lightning_dpts.data.sources import SeriesCollection

    comparisons = [0]

    class CountingInt(int):
        def __eq__(self, other: object) -> bool:
            comparisons[0] += 1
            return int.__eq__(self, other)

        __hash__ = int.__hash__

    n = 20_000
    coll = SeriesCollection([np.zeros((40 if i % 2 else 5, 1)) for i in range(n)], [str(i) for i in range(n)],
                            None, None, True)
    monkeypatch.setattr(module, "int", CountingInt, raising=False)
    with pytest.warns(UserWarning, match=f"dropped {n // 2} of {n}"):
        kept, _ = drop_short(coll, True, prediction_length=4, held_out_windows=1)
    monkeypatch.undo()
    assert kept.num_series == n // 2 and kept.item_ids[:2] == ["1", "3"]
    assert 0 < comparisons[0] <= n, comparisons[0]  # measured: n // 2 (one per kept index found in the set)


def test_complex_objects_and_mixed_stamps_are_refused():
    days = pd.date_range("2020", periods=6, freq="D")
    objects = pd.Series([1, 2, 3 + 1j, 4, 5, 6], dtype=object)  # Python complex numbers in an object column
    err = _error(_frame(["a"] * 6, days, objects))
    assert err.parameter == "value_column" and "complex" in err.requirement and "row 2" in err.requirement
    err = _error(_frame(["a"] * 6, ["2020-01-01", 5, "x", "2020-01-04", "2020-01-05", "2020-01-06"], range(6)))
    assert err.parameter == "timestamp_column" and "row 1" in err.requirement and "day-first" not in err.requirement


@pytest.mark.parametrize("freq", ["15min", "2D", "h", "W", "MS", "QS-OCT"])
def test_regular_series_of_any_frequency_are_not_expanded(freq):
    """Multiple frequencies count base units in Period ordinals (15 per '15min' step): no NaN expansion."""
    stamps = pd.date_range("2020-01-01 00:07" if freq == "15min" else "2020-01-01", periods=8, freq=freq)
    coll = to_collection(_frame(["a"] * 8, stamps, np.arange(8.0)))
    assert len(coll.targets[0]) == 8 and not np.isnan(coll.targets[0]).any()
    assert coll.starts[0].start_time <= stamps[0] <= coll.starts[0].end_time
    assert to_collection(_frame(["a"] * 4, [0, 1, 2, 3], np.arange(4.0)), freq="2D").starts[0] == pd.Period(
        "1970-01-01", freq="2D")


def test_lags_that_remove_window_amplification_warn_in_the_python_api():
    """Trap 3 in the Python API: lags that make one window span every start of the shortest series warn, with r."""
    series = id_series([20] * 6)  # training part 18 (one test window of 2): T = 17 window starts
    with pytest.warns(UserWarning, match=r"amplifies \(almost\) nothing .*r = 1, 0\.353 without the lags.*lags_seq"):
        StructuredSubsamplingDataModule(series, context_length=4, past_length=40, prediction_length=2, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # short lags: no such warning
        StructuredSubsamplingDataModule(series, context_length=4, past_length=6, prediction_length=2, batch_size=4)

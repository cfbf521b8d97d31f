"""Input adapters, bundled data, splits, the sampling spec, and clear errors for bad input."""

from __future__ import annotations

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

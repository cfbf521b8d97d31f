"""GluonTS torch LightningModules train unmodified on the datamodule's batches, and DeepAR's batches equal
what GluonTS's own transformation + InstanceSplitter produce for the same windows."""

from __future__ import annotations

import logging
import warnings

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from gluonts.dataset.common import ListDataset
from gluonts.dataset.field_names import FieldName
from gluonts.torch.model.d_linear import DLinearLightningModule
from gluonts.torch.model.deepar import DeepAREstimator, DeepARLightningModule
from gluonts.torch.model.patch_tst import PatchTSTLightningModule
from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule
from gluonts.transform import InstanceSplitter
from gluonts.transform.sampler import InstanceSampler

from lightning_dpts.data import StructuredSubsamplingDataModule

H, C = 6, 12


def _modules() -> dict[str, L.LightningModule]:
    torch.manual_seed(0)
    return {
        "deepar": DeepARLightningModule(
            model_kwargs=dict(
                freq="M",
                context_length=C,
                prediction_length=H,
                num_feat_dynamic_real=2,
                hidden_size=8,
                num_layers=1,
            )
        ),
        "simple_feedforward": SimpleFeedForwardLightningModule(
            model_kwargs=dict(prediction_length=H, context_length=C, hidden_dimensions=[8])
        ),
        "dlinear": DLinearLightningModule(model_kwargs=dict(prediction_length=H, context_length=C, hidden_dimension=8)),
        "patchtst": PatchTSTLightningModule(
            model_kwargs=dict(
                prediction_length=H,
                context_length=C,
                patch_len=4,
                stride=4,
                padding_patch="end",
                d_model=8,
                nhead=2,
                dim_feedforward=8,
                num_feat_dynamic_real=0,
                dropout=0.0,
                activation="relu",
                norm_first=False,
                num_encoder_layers=1,
                scaling="mean",
            )
        ),
    }


@pytest.mark.parametrize("name", ["deepar", "simple_feedforward", "dlinear", "patchtst"])
def test_gluonts_module_trains_on_batches(name):
    module = _modules()[name]
    # batch_size 64: 148 // 64 = 2 steps per epoch, so max_steps=3 crosses an epoch boundary (DeepAR's
    # ReduceLROnPlateau then needs a monitored metric: val_loss with val_windows=1, train_loss without).
    val_windows = 0 if name in ("deepar", "dlinear") else 1
    dm = StructuredSubsamplingDataModule("us_employment", batch_size=64, model=module, seed=1, val_windows=val_windows)
    declared = module.model.describe_inputs(64)
    batch = dm.train_batch()
    for key in declared:
        assert tuple(batch[key].shape) == tuple(declared[key].shape), key
        assert batch[key].dtype == declared[key].dtype, key
    assert batch["future_target"].shape == (64, H)
    if name == "deepar":
        assert dm.past_length == module.model._past_length == C + max(module.model.lags_seq)
        assert dm.sampling_spec.context_length == dm.past_length  # lags are context (trap 3)
    else:
        assert dm.past_length == C
    before = [p.detach().clone() for p in module.parameters()]
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = L.Trainer(
            max_steps=3,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=1,
        )
        trainer.fit(module, datamodule=dm)
    assert trainer.global_step == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


class _FixedSampler(InstanceSampler):
    """Always splits at ``idx`` (GluonTS's split point = our start position s)."""

    idx: int = 0

    def __call__(self, ts: np.ndarray) -> np.ndarray:
        return np.array([self.idx])


def test_deepar_batches_equal_gluonts_instance_splitter():
    """For the same window, every field equals GluonTS's estimator transformation + InstanceSplitter."""
    rng = np.random.default_rng(0)
    lengths = [50, 80]
    starts = [pd.Period("2001-03", freq="M"), pd.Period("1999-11", freq="M")]
    targets = [rng.normal(10, 2, size=n) for n in lengths]
    targets[1][[5, 40]] = np.nan
    entries = [
        {"target": t, "start": s, "item_id": f"s{i}"} for i, (t, s) in enumerate(zip(targets, starts, strict=True))
    ]
    estimator = DeepAREstimator(freq="M", prediction_length=H, context_length=C, hidden_size=8, num_layers=1)
    module = estimator.create_lightning_module()
    dm = StructuredSubsamplingDataModule(entries, batch_size=2, model=module, test_windows=1)
    past = module.model._past_length
    train = ListDataset([{**e, "target": e["target"][: len(e["target"]) - H]} for e in entries], freq="M")
    transformed = list(estimator.create_transformation().apply(train, is_train=True))
    for row, s in [(0, 0), (0, 7), (1, 20), (1, len(targets[1]) - 2 * H)]:
        splitter = InstanceSplitter(
            target_field=FieldName.TARGET,
            is_pad_field=FieldName.IS_PAD,
            start_field=FieldName.START,
            forecast_start_field=FieldName.FORECAST_START,
            instance_sampler=_FixedSampler(idx=s),
            past_length=past,
            future_length=H,
            time_series_fields=[FieldName.FEAT_TIME, FieldName.OBSERVED_VALUES],
            dummy_value=0.0,
        )
        (want,) = list(splitter.apply([dict(transformed[row])], is_train=True))
        got = dm._sampler.store.gather(np.array([row]), np.array([s]))
        np.testing.assert_allclose(got["past_target"][0, :, 0], want["past_target"], rtol=1e-6)
        np.testing.assert_allclose(got["future_target"][0, :, 0], want["future_target"], rtol=1e-6)
        np.testing.assert_array_equal(got["past_observed_values"][0, :, 0], want["past_observed_values"])
        np.testing.assert_array_equal(got["future_observed_values"][0, :, 0], want["future_observed_values"])
        np.testing.assert_allclose(got["past_time_feat"][0], want["past_time_feat"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got["future_time_feat"][0], want["future_time_feat"], rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(dm.static_cat[row], want["feat_static_cat"])
        np.testing.assert_array_equal(dm.static_real[row], want["feat_static_real"])


def test_deepar_with_user_dynamic_and_static_features():
    """feat_dynamic_real is stacked after time features and age, as DeepAREstimator does."""
    rng = np.random.default_rng(1)
    entries = [
        {
            "target": rng.normal(size=60),
            "start": pd.Period("2015-01", freq="M"),
            "feat_dynamic_real": rng.normal(size=(2, 60)),
            "feat_static_cat": [i],
            "feat_static_real": [0.5 * i, 1.0],
        }
        for i in range(3)
    ]
    module = DeepARLightningModule(
        model_kwargs=dict(
            freq="M",
            context_length=C,
            prediction_length=H,
            num_feat_dynamic_real=1 + 1 + 2,  # month-of-year, age, two user features
            num_feat_static_cat=1,
            cardinality=[3],
            num_feat_static_real=2,
            lags_seq=[1, 2, 12],
        )
    )
    dm = StructuredSubsamplingDataModule(entries, batch_size=3, model=module, top_level="iteration")
    assert dm.past_length == module.model._past_length == C + 11  # GluonTS stores lags 1, 2, 12 as 0, 1, 11
    out = dm._train_store.gather(np.array([1]), np.array([30]))
    np.testing.assert_allclose(out["future_time_feat"][0, :, 2:], entries[1]["feat_dynamic_real"][:, 30 : 30 + H].T)
    np.testing.assert_allclose(out["future_time_feat"][0, :, 1], np.log10(2.0 + np.arange(30, 30 + H)), rtol=1e-6)
    batch = dm.train_batch()
    assert batch["feat_static_cat"].tolist() == [[0], [1], [2]]
    torch.testing.assert_close(batch["feat_static_real"][2], torch.tensor([1.0, 1.0]))
    loss = module.model.loss(
        **{k: batch[k] for k in module.model.describe_inputs()},
        future_target=batch["future_target"],
        future_observed_values=batch["future_observed_values"],
    )
    assert torch.isfinite(loss).all()

"""The four GluonTS models train privately on StructuredSubsamplingDataModule with both callbacks."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

from .conftest import MODEL_NAMES, make_module, trainer

data = pytest.importorskip("lightning_dpts.data")
DELTA = 1e-6


def _datamodule(module, **kwargs):
    return data.StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1, **kwargs)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_trains_privately_on_the_datamodule(name, tmp_path):
    module = make_module(name)
    dm = _datamodule(module, val_windows=1 if name == "patchtst" else 0)
    spec = dm.sampling_spec
    assert spec.context_length == (module.model._past_length if name == "deepar" else module.model.context_length)
    acc = StructuredSubsamplingAccountant(spec, 3.0)
    budget = acc.epsilon(5, DELTA)
    logger = CSVLogger(tmp_path, name="run")
    accountant = AccountantCallback(budget, DELTA)
    t = trainer(max_epochs=20, logger=logger, limit_val_batches=1,
                callbacks=[DPForecastStrategy(3.0, 0.5, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert t.global_step == accountant.report.steps == 5
    rows = [r for r in csv.DictReader(open(Path(logger.log_dir) / "metrics.csv")) if r.get("epsilon")]
    assert len(rows) == 5 and all(float(r["epsilon"]) <= budget for r in rows)


def test_mid_epoch_resume_counts_the_partial_epoch_as_a_new_epoch(tmp_path):
    """Issue 9 item 4a: a resumed partial epoch samples a fresh pass, so it is accounted as a whole new epoch."""
    def run(directory, ckpt=None):
        module = make_module("dlinear")
        dm = _datamodule(module, top_level="shuffling")  # accounted per epoch: 148 // 16 = 9 steps per epoch
        budget = StructuredSubsamplingAccountant(dm.sampling_spec, 3.0).epsilon(18, DELTA)
        accountant = AccountantCallback(budget, DELTA, max_overhead=None)
        cb = ModelCheckpoint(dirpath=directory, every_n_train_steps=5, save_top_k=-1, filename="{step}")
        t = trainer(max_epochs=20, enable_checkpointing=True,
                    callbacks=[DPForecastStrategy(3.0, 0.5, seed=0), accountant, cb])
        t.fit(module, datamodule=dm, ckpt_path=ckpt)
        return t, accountant

    full, acc = run(tmp_path)
    assert full.global_step == acc.steps == 18 and acc.report.compositions == 2
    resumed, acc2 = run(tmp_path / "b", ckpt=str(tmp_path / "step=5.ckpt"))
    # 5 steps of epoch 1 (checkpoint) + the 4 remaining steps of the resumed epoch = epoch 2: the budget is spent
    assert resumed.global_step == 9 and acc2.steps == 18 and acc2.report.compositions == 2
    ledger = resumed.lightning_module.dpts_privacy_ledger
    assert ledger.steps == 9 and ledger.epochs == 2
    assert acc2.report.epsilon == pytest.approx(acc.report.epsilon)
    assert torch.isfinite(torch.tensor(acc2.report.epsilon))

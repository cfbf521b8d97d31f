"""Issue 38, item 4: the README's Python path writes nothing private where the user does not expect it.

On the code before issue 38, ``L.Trainer(**plan.trainer_kwargs)`` got Lightning's default logger, which wrote the
noise-free training loss of private batches to ``./lightning_logs`` without a word. Now the plan has no logger, and a
DP fit that has one says where its files go.
"""

from __future__ import annotations

import logging

import lightning as L
import pandas as pd
import pytest

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.models import SeasonalLinearEstimator
from lightning_dpts.recipe import make_private_with_epsilon


def _plan_and_data(tiny_csv):
    table = pd.read_csv(tiny_csv, parse_dates=["timestamp"])
    lengths = table.groupby("item_id").size()
    estimator = SeasonalLinearEstimator(prediction_length=6, context_length=24, season_length=12)
    module = estimator.create_lightning_module()
    plan = make_private_with_epsilon(lengths.to_numpy(), module, epsilon=1.0, delta=1e-6, freq="MS",
                                     prediction_length=6, held_out_windows=1, epochs=1, seed=0)
    dm = StructuredSubsamplingDataModule(table[table.item_id.isin(lengths.index[plan.keep(lengths)])], freq="MS",
                                         model=module, seed=0, **plan.datamodule_kwargs)
    return plan, module, dm


def test_the_python_path_writes_no_training_log_by_default(tiny_csv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan, module, dm = _plan_and_data(tiny_csv)
    assert plan.trainer_kwargs["logger"] is False
    assert any(line.startswith("logger = False: ") and "private" in line for line in plan.describe())
    trainer = L.Trainer(**plan.trainer_kwargs, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(module, datamodule=dm)
    assert trainer.global_step > 0
    assert not (tmp_path / "lightning_logs").exists() and not list(tmp_path.rglob("*.csv"))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("kind", ["default", "csv"])
def test_a_dp_fit_with_a_logger_says_where_the_private_logs_go(tiny_csv, tmp_path, kind):
    plan, module, dm = _plan_and_data(tiny_csv)
    logger = True if kind == "default" else L.pytorch.loggers.CSVLogger(str(tmp_path / "mine"), name="logs")
    kwargs = {**plan.trainer_kwargs, "logger": logger, "default_root_dir": str(tmp_path), "max_steps": 1}
    lightning_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # Lightning does not propagate
    records, level = _Records(), lightning_logger.level
    lightning_logger.addHandler(records)
    lightning_logger.setLevel(logging.INFO)
    try:
        L.Trainer(**kwargs, enable_checkpointing=False, enable_progress_bar=False).fit(module, datamodule=dm)
    finally:
        lightning_logger.removeHandler(records)
        lightning_logger.setLevel(level)
    said = [m for m in records.messages if "DPForecastStrategy:" in m and "without noise" in m]
    assert said, records.messages
    assert str(tmp_path / ("lightning_logs" if kind == "default" else "mine")) in said[0]

"""Issue 43: the AccountantCallback logs the membership-attack read-outs next to epsilon, read back from the CSV log:
upper bounds on the accountant's own read-outs at every step, close to them, non-decreasing; off on request."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.privacy.risk import metric_names
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

from .conftest import FakeDataModule, make_module, trainer

DELTA, SIGMA = 1e-6, 2.0


def _rows(log_dir: str) -> list[dict[str, str]]:
    return [r for r in csv.DictReader(open(Path(log_dir) / "metrics.csv")) if r.get("epsilon")]


def _fit(tmp_path, **kwargs):
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    accountant = AccountantCallback(50.0, DELTA, **kwargs)
    logger = CSVLogger(tmp_path, name="run")
    t = trainer(max_steps=30, logger=logger, log_every_n_steps=1,
                callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    return dm, accountant, logger


def test_read_outs_are_logged_every_step_as_upper_bounds(tmp_path):
    dm, accountant, logger = _fit(tmp_path)
    rows = _rows(logger.log_dir)
    assert len(rows) == 30 and all(all(r.get(name) for name in metric_names()) for r in rows)
    exact = StructuredSubsamplingAccountant(dm.sampling_spec, SIGMA)
    previous = None
    for r in rows:
        steps = int(r["step"]) + 1
        want = exact.risk(steps, DELTA)
        got = [float(r[name]) for name in metric_names()]
        for value, bound in zip(got, (*want.tprs, want.mu), strict=True):
            assert bound * (1 - 1e-9) <= value <= bound * 1.02, (steps, value, bound)  # never below, close above
        if previous is not None:
            assert all(a >= b for a, b in zip(got, previous, strict=True))
        previous = got
    assert accountant.report.risk == exact.risk(30, DELTA)
    assert accountant.last_logged["mu_gdp"] == pytest.approx(float(rows[-1]["mu_gdp"]))


def test_read_outs_can_be_switched_off(tmp_path):
    _, accountant, logger = _fit(tmp_path, risk_readouts=False)
    rows = _rows(logger.log_dir)
    assert len(rows) == 30 and not any(r.get("mu_gdp") for r in rows)
    assert set(accountant.last_logged) == {"epsilon"}


def test_bad_flag_is_refused():
    from lightning_dpts.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="risk_readouts"):
        AccountantCallback(1.0, 1e-6, risk_readouts="yes")  # type: ignore[arg-type]

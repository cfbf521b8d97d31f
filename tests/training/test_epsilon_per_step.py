"""The epsilon AccountantCallback logs after every optimizer step: a sound upper bound within 1% of
``accountant.epsilon(step)`` (issue 26), on the default ``dpts fit`` job and on a 10^4-step run."""

from __future__ import annotations

import csv
import glob
import json
from pathlib import Path

import pytest
from lightning.pytorch.loggers import CSVLogger

from lightning_dpts.privacy import NeighbouringRelation, SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

from .conftest import FakeDataModule, make_module, trainer


def _logged(metrics_csv: str | Path) -> list[tuple[int, float]]:
    rows = list(csv.DictReader(open(metrics_csv)))
    return [(int(r["step"]) + 1, float(r["epsilon"])) for r in rows if r.get("epsilon")]  # after step + 1 steps


def _assert_within_one_percent(acc: StructuredSubsamplingAccountant, logged, delta: float, steps=None) -> None:
    for step, value in logged:
        if steps is None or step in steps:
            exact = acc.epsilon(step, delta)
            assert exact <= value <= 1.01 * exact, (step, value, exact)


@pytest.mark.slow
def test_default_job_logs_epsilon_within_one_percent_at_every_step(tmp_path):
    from lightning_dpts.app.cli import main

    out = tmp_path / "default"
    assert main(["fit", "--no-non-dp", "--output-dir", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    spec_dict = dict(report["privacy_configuration"]["sampling_spec"])
    relation = NeighbouringRelation(**spec_dict.pop("relation"))
    for derived in ("top_level_rate", "bottom_level_rate", "windows_per_unit", "steps_per_epoch"):
        spec_dict.pop(derived)
    spec_dict["lengths"] = tuple(spec_dict["lengths"]) if spec_dict["lengths"] else None
    spec = SamplingSpec(relation=relation, **spec_dict)
    acc = StructuredSubsamplingAccountant(spec, report["noise_multiplier"])
    logged = _logged(glob.glob(str(out / "private" / "logs" / "*" / "metrics.csv"))[0])  # private (issue 24)
    assert [s for s, _ in logged] == list(range(1, report["steps"] + 1))  # one value after every step
    assert len({v for _, v in logged}) > report["steps"] // 4  # no staircase
    _assert_within_one_percent(acc, logged, report["delta"])


@pytest.mark.slow
def test_ten_thousand_step_run_logs_epsilon_within_one_percent(tmp_path):
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=400, batch_size=8, min_length=400)
    delta, sigma = 1e-7, 3.0
    acc = StructuredSubsamplingAccountant(dm.sampling_spec, sigma)
    accountant = AccountantCallback(50.0, delta)
    logger = CSVLogger(tmp_path, name="run")
    t = trainer(max_steps=10_000, logger=logger, log_every_n_steps=1,
                callbacks=[DPForecastStrategy(sigma, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert t.global_step == 10_000
    logged = _logged(Path(logger.log_dir) / "metrics.csv")
    assert [s for s, _ in logged] == list(range(1, 10_001))
    steps = {*range(1, 50), *range(50, 10_001, 61), 10_000}
    _assert_within_one_percent(acc, logged, delta, steps)


def test_table_thread_failure_leaves_lookups_empty_not_raising():
    from lightning_dpts.errors import ConfigurationError
    from lightning_dpts.training.accountant_callback import EpsilonTable

    class Failing:
        def epsilon_curve(self, last, delta, *, rtol, start):
            yield 1, 0.1
            raise ConfigurationError("steps", last, "too many")

    table = EpsilonTable(Failing(), 1e-6, 10)  # type: ignore[arg-type]
    table.join(5.0)
    assert table.lookup(1, wait=True) == 0.1
    assert table.lookup(2, wait=True) is None and isinstance(table.error, ConfigurationError)


def test_public_epsilon_curve_reuses_the_training_table(tmp_path, monkeypatch):
    """report.json's epsilon_curve comes from the table the callback logged from (issue 26: no second computation
    after training), and its values are the same upper bounds as a fresh accountant's curve at the same counts."""
    from lightning_dpts.app.reporting import EPSILON_CURVE_RTOL, epsilon_curve

    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    delta, sigma, steps = 1e-6, 1.0, 25
    accountant = AccountantCallback(50.0, delta)
    t = trainer(max_steps=steps, callbacks=[DPForecastStrategy(sigma, 1.0, seed=0), accountant])
    t.fit(module, datamodule=dm)
    assert accountant.table is not None and accountant.table.start == 1
    table = accountant.epsilon_table(steps, delta, EPSILON_CURVE_RTOL)
    assert table is not None and table[-1][0] >= steps
    fresh = dict(StructuredSubsamplingAccountant(dm.sampling_spec, sigma).epsilon_curve(steps, delta))
    for count, value in table:
        if count in fresh:
            assert value == pytest.approx(fresh[count], rel=1e-12)

    def recompute(*args, **kwargs):  # the reuse must not recompute the curve
        raise AssertionError("epsilon_curve recomputed")

    monkeypatch.setattr(accountant.accountant, "epsilon_curve", recompute)
    curve = epsilon_curve(accountant, dm.sampling_spec, steps, accountant.report)
    assert curve["steps"][-1] == steps and curve["epsilon"][-1] == accountant.report.epsilon
    assert len(curve["steps"]) >= len([c for c, _ in table if c < steps])
    assert accountant.epsilon_table(steps, delta / 2, EPSILON_CURVE_RTOL) is None  # another delta: not reused


def test_background_table_option_is_checked_and_logs_the_same_bounds(tmp_path):
    with pytest.raises(Exception) as err:
        AccountantCallback(1.0, 1e-6, background_table="yes")  # type: ignore[arg-type]
    assert "background_table" in str(err.value)
    module = make_module("simple_feedforward")
    dm = FakeDataModule(module, num_series=48, batch_size=8)
    logged = {}
    for background in (False, True):
        logger = CSVLogger(tmp_path, name=f"bg{background}")
        accountant = AccountantCallback(50.0, 1e-6, background_table=background)
        t = trainer(max_steps=20, logger=logger, log_every_n_steps=1,
                    callbacks=[DPForecastStrategy(1.0, 1.0, seed=0), accountant])
        t.fit(make_module("simple_feedforward"), datamodule=dm)
        logged[background] = _logged(Path(logger.log_dir) / "metrics.csv")
    assert logged[False] == logged[True] and [s for s, _ in logged[False]] == list(range(1, 21))

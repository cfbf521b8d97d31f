"""Amplified BandMF wired into Lightning: cyclic Poisson batches, the PLD path of AccountantCallback, refusals."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy
from lightning_dpts.training.correlated_noise import banded_sqrt_coefficients
from tests.training.conftest import make_module, trainer


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _datamodule(module, groups=4, **kwargs):
    # us_employment: 148 series, batch 16 -> p = 16 k / 148, 9 steps per epoch (not a multiple of k)
    return StructuredSubsamplingDataModule("us_employment", batch_size=16, model=module, seed=1,
                                           top_level="cyclic_poisson", bands=groups, **kwargs)


def test_batches_follow_the_run_step_across_epochs():
    module = make_module("dlinear")
    dm = _datamodule(module)
    dm.setup("fit")
    dm.train_dataloader()
    sampler = dm.sampler
    spe = dm.sampling_spec.steps_per_epoch
    assert spe % 4 != 0  # the group must follow the run's step t = pass x spe + step, not the step in the pass
    seen = np.zeros(148, dtype=int)
    for t in range(3 * spe):
        rows, _, _ = sampler.sample_indices(t // spe, t % spe)
        assert np.all(rows % 4 == t % 4), t
        seen[np.unique(rows)] += 1
    assert seen.max() <= -(-3 * spe // 4)  # at most ceil(steps/k) participations per series


def test_bandmf_with_cyclic_poisson_is_accounted_by_the_pld_accountant():
    module = make_module("dlinear")
    c = tuple(banded_sqrt_coefficients(4) * 2.0)  # column norm 2: the accountant must use sigma / 2
    strategy = DPForecastStrategy(4.0, 0.5, seed=0, noise="bandmf", coefficients=c)
    acc = AccountantCallback(50.0, 1e-7)
    t = trainer(max_steps=10, callbacks=[strategy, acc])
    dm = _datamodule(module)
    t.fit(module, datamodule=dm)
    assert acc.monte_carlo is None and acc.report.unit == "opportunity" and acc.report.compositions == 3
    expected = StructuredSubsamplingAccountant(dm.sampling_spec, 2.0).epsilon(10, 1e-7)
    assert acc.report.epsilon == pytest.approx(expected, rel=1e-9)


def test_bandmf_with_fewer_groups_than_bands_is_refused():
    module = make_module("dlinear")
    with pytest.raises(ConfigurationError, match="k >= 4"):
        trainer(max_steps=2, callbacks=[DPForecastStrategy(1.0, noise="bandmf", bands=4), AccountantCallback(
            50.0, 1e-7)]).fit(module, datamodule=_datamodule(module, groups=2))


def test_cyclic_poisson_refuses_shortened_epochs_and_continuations(tmp_path):
    module = make_module("dlinear")
    t = trainer(max_steps=6, limit_train_batches=2,
                callbacks=[DPForecastStrategy(4.0, 0.5, seed=0, noise="bandmf", bands=2), AccountantCallback(
                    50.0, 1e-7)])
    with pytest.raises(ConfigurationError, match="limit_train_batches"):
        t.fit(module, datamodule=_datamodule(module, groups=2))
    assert t.global_step == 0
    # a continuation: the groups follow one run's step count
    module = make_module("dlinear")
    first = trainer(max_steps=3, callbacks=[DPForecastStrategy(4.0, 0.5, seed=0), AccountantCallback(50.0, 1e-7)])
    first.fit(module, datamodule=_datamodule(module, groups=2))
    again = trainer(max_steps=6, callbacks=[DPForecastStrategy(4.0, 0.5, seed=0), AccountantCallback(50.0, 1e-7)])
    with pytest.raises(ConfigurationError, match="ledger"):
        again.fit(module, datamodule=_datamodule(module, groups=2))


def test_every_trained_batch_is_from_the_group_of_its_optimizer_step():
    """What the accounting assumes (Theorem B.2): the i-th noisy step of the run trains only on group i mod k, across
    passes of the loader, so a series' two participations are at least k steps apart."""
    from lightning.pytorch.callbacks import Callback

    from lightning_dpts.data.sampler import SERIES_INDEX_KEY

    class Record(Callback):
        def __init__(self) -> None:
            self.seen: list[tuple[int, np.ndarray]] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.seen.append((trainer.global_step, batch[SERIES_INDEX_KEY].numpy().copy()))

    module = make_module("dlinear")
    record = Record()
    t = trainer(max_steps=22, callbacks=[DPForecastStrategy(4.0, 0.5, seed=0, noise="bandmf", bands=4),
                                         AccountantCallback(50.0, 1e-7), record])
    t.fit(module, datamodule=_datamodule(module))  # 9 steps per pass: 3 passes, not aligned with k = 4
    assert [step for step, _ in record.seen] == list(range(22))
    for step, series in record.seen:
        assert np.all(series % 4 == step % 4), (step, series)

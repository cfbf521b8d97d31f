"""No thread of a DP fit outlives it (issue 38): a process that trained with the plugin aborted at exit in 1 of 4
loaded runs (SIGABRT, "terminate called without an active exception") because the epsilon table's daemon thread
was still inside scipy's C++ FFT when the interpreter finalised. The table's thread and the noise's background
thread are joined at train end and on an exception; no timing: the tests count the live threads."""

from __future__ import annotations

import threading
import time

import lightning as L
import pytest

from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy, noisy_step

from .conftest import FakeDataModule, make_module, trainer


def _dpts_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dpts-") and t.is_alive()]


class StopAfter(L.Callback):
    """Ends the fit after ``steps`` optimizer steps (long before the Trainer's plan): the epsilon table's thread,
    which computes up to the plan, is then still running at train end."""

    def __init__(self, steps: int, error: bool = False) -> None:
        self.steps, self.error = steps, error
        self.alive_during: list[str] = []

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step >= self.steps:
            self.alive_during = _dpts_threads()
            self.background_noise = next(c for c in trainer.callbacks if isinstance(c, DPForecastStrategy)
                                         ).background_noise
            if self.error:
                raise RuntimeError("stopped by the test")
            trainer.should_stop = True


def _slow_curve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's thread takes 10 ms per count (400 counts: seconds), so that it is certainly still running when
    the fit ends after 2 steps (nothing below measures time)."""
    for name in ("epsilon_curve", "risk_curve"):
        original = getattr(StructuredSubsamplingAccountant, name, None)
        if original is None:
            continue

        def slow(self, *args, _original=original, **kwargs):
            for point in _original(self, *args, **kwargs):
                time.sleep(0.01)
                yield point

        monkeypatch.setattr(StructuredSubsamplingAccountant, name, slow)


def _fit(monkeypatch: pytest.MonkeyPatch, error: bool) -> tuple[StopAfter, AccountantCallback, DPForecastStrategy]:
    monkeypatch.setattr(noisy_step, "_spare_core", lambda: True)  # the noise is drawn by its background thread
    monkeypatch.setattr(noisy_step, "BACKGROUND_MIN_NUMEL", 0)  # (also this small model's)
    _slow_curve(monkeypatch)
    module = make_module("simple_feedforward")
    strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    accountant = AccountantCallback(epsilon=1e3, delta=1e-5)
    stop = StopAfter(2, error=error)
    t = trainer(max_epochs=50, callbacks=[strategy, accountant, stop])
    if error:
        with pytest.raises(RuntimeError, match="stopped by the test"):
            t.fit(module, datamodule=FakeDataModule(module))
    else:
        t.fit(module, datamodule=FakeDataModule(module))
    return stop, accountant, strategy


@pytest.mark.parametrize("error", [False, True], ids=["early_stop", "exception"])
def test_no_thread_of_the_fit_outlives_it(monkeypatch, error):
    assert not _dpts_threads()
    stop, accountant, strategy = _fit(monkeypatch, error)
    assert stop.background_noise is True
    assert "dpts-epsilon-table" in stop.alive_during and any(n.startswith("dpts-noise") for n in stop.alive_during)
    assert not _dpts_threads()  # fails before issue 38: the table's thread and the noise thread were alive
    assert accountant.table is None or not accountant.table.alive
    assert len(accountant.grid_points) >= 1 or error  # the points computed so far are kept for inspection


def test_a_table_left_running_is_stopped_at_interpreter_exit(monkeypatch):
    """The atexit hook stops and joins every table still running (here one nobody stopped)."""
    from lightning_dpts.privacy import SamplingSpec
    from lightning_dpts.training.accountant_callback import EpsilonTable, _stop_live_tables

    _slow_curve(monkeypatch)
    spec = SamplingSpec(num_series=64, min_length=40, context_length=8, prediction_length=4, batch_size=8)
    table = EpsilonTable(StructuredSubsamplingAccountant(spec, 1.0), 1e-5, 400)
    assert table.alive
    _stop_live_tables()
    assert not table.alive and not _dpts_threads()

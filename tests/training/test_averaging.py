"""IterateAveraging and step_schedule (issue 37, item 3): the average is the mean of the iterates it claims, it lives
in the callback's state (never in module buffers), it survives a resume, and - played as the attacker - every form
in which the averaged model is saved and loaded keeps the privacy ledger's count (never lost, never rolled back)."""

from __future__ import annotations

import math
from typing import ClassVar

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training import (
    AccountantCallback,
    DPForecastStrategy,
    IterateAveraging,
    ledger_of,
    read_ledger,
    step_schedule,
)

from .conftest import LinearModule, SpecDataModule, trainer
from .test_guarantee import BUDGET_8, DELTA, DIM, LAMBDA, SIGMA, SPEC


def _batches() -> list[dict[str, torch.Tensor]]:
    """Different batches each step (the iterates differ), deterministic."""
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(LAMBDA, DIM, generator=g)} for _ in range(SPEC.steps_per_epoch)]


class _Recorder(Callback):
    """The parameters after every optimizer step (a copy), to check the average against (a function of the noisy
    weights: post-processing, declared to the state guard like IterateAveraging)."""

    dp_post_processing: ClassVar[bool] = True

    def __init__(self) -> None:
        self.iterates: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.iterates.append(pl_module.lin.weight.detach().clone())


def _fit(module: L.LightningModule, callbacks: list[Callback], max_steps: int, **kwargs) -> L.Trainer:
    t = trainer(max_steps=max_steps, callbacks=callbacks, **kwargs)
    t.fit(module, datamodule=SpecDataModule(SPEC, _batches()))
    return t


@pytest.mark.parametrize(("start", "first"), [(0.5, 5), (0.0, 1), (0.75, 7), (3, 3)])
def test_the_model_ends_at_the_mean_of_the_iterates_from_the_start_step(start, first):
    module = LinearModule(DIM, lr=1.0)
    recorder, averaging = _Recorder(), IterateAveraging(start)
    _fit(module, [recorder, averaging], max_steps=8)
    assert averaging.first_step == first and averaging.count == 8 - first + 1
    expected = torch.stack(recorder.iterates[first - 1:]).mean(0)
    torch.testing.assert_close(module.lin.weight.detach(), expected)
    assert not torch.equal(module.lin.weight.detach(), recorder.iterates[-1])  # not the last iterate
    assert dict(module.named_buffers()) == {}  # kept in the callback, never in module buffers


def test_a_resumed_fit_continues_the_average(tmp_path):
    """A full checkpoint holds the current iterate as weights and the running mean in the callback state: the
    resumed fit ends at the mean of the iterates of both parts from the start step on."""
    first, before = LinearModule(DIM, lr=1.0), _Recorder()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    _fit(first, [before, IterateAveraging(0.5), checkpoint], max_steps=8, enable_checkpointing=True)
    state = torch.load(tmp_path / "step=6.ckpt", weights_only=False)
    saved = next(v for k, v in state["callbacks"].items() if k.startswith("IterateAveraging"))
    assert saved["count"] == 2 and saved["first_step"] == 5
    torch.testing.assert_close(saved["average"]["lin.weight"], torch.stack(before.iterates[4:6]).mean(0))
    resumed, after = LinearModule(DIM, lr=1.0), _Recorder()
    t = trainer(max_steps=8, callbacks=[after, IterateAveraging(0.5)])
    t.fit(resumed, datamodule=SpecDataModule(SPEC, _batches()), ckpt_path=tmp_path / "step=6.ckpt")
    assert len(after.iterates) == 2
    expected = torch.stack(before.iterates[4:6] + after.iterates).mean(0)
    torch.testing.assert_close(resumed.lin.weight.detach(), expected)


def test_the_averaged_dp_model_keeps_its_ledger_in_every_checkpoint_form(tmp_path):
    """The attacker saves and loads the averaged model every way Lightning and torch offer, then continues
    training it: the count never drops below the noisy steps its iterates took, and a continuation adds to it."""
    module = LinearModule(DIM, lr=1.0)
    strategy = DPForecastStrategy(SIGMA, 1.0)
    recorder, averaging = _Recorder(), IterateAveraging(0.5)
    t = _fit(module, [strategy, AccountantCallback(BUDGET_8, DELTA), recorder, averaging], max_steps=6)
    assert t.global_step == 6 and averaging.count == 3
    torch.testing.assert_close(module.lin.weight.detach(), torch.stack(recorder.iterates[3:]).mean(0))
    assert ledger_of(module) is strategy.ledger and ledger_of(module).steps == 6  # the same object, same count
    t.save_checkpoint(tmp_path / "full.ckpt")
    t.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    torch.save(module.state_dict(), tmp_path / "state.pt")
    for name in ("full.ckpt", "weights.ckpt"):
        assert read_ledger(tmp_path / name).steps == 6, name
        loaded = LinearModule.load_from_checkpoint(tmp_path / name, dim=DIM, lr=1.0)
        assert ledger_of(loaded).steps == 6, name
        torch.testing.assert_close(loaded.lin.weight.detach(), module.lin.weight.detach())
    fresh = LinearModule(DIM, lr=1.0)
    fresh.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert ledger_of(fresh).steps == 6
    # the averaged model continued with new callbacks: its steps are counted on top (not from zero)
    strategy2 = DPForecastStrategy(SIGMA, 1.0)
    accountant2 = AccountantCallback(BUDGET_8, DELTA)
    t2 = _fit(fresh, [strategy2, accountant2, IterateAveraging(0.5)], max_steps=2)
    assert t2.global_step == 2 and ledger_of(fresh).steps == 8 and accountant2.report.steps == 8
    # the callback's own state holds parameter means and counts only: no ledger to roll a model back with
    state = averaging.state_dict()
    assert set(state) == {"count", "first_step", "average"} and set(state["average"]) == {"lin.weight"}
    assert IterateAveraging.dp_post_processing is True


def test_apply_refuses_a_module_without_the_averaged_parameters():
    module = LinearModule(DIM, lr=1.0)
    averaging = IterateAveraging(0.0)
    _fit(module, [averaging], max_steps=2)
    other = torch.nn.Linear(2, 2)
    wrapper = L.LightningModule()
    wrapper.other = other
    with pytest.raises(ConfigurationError, match="pl_module"):
        averaging.apply(wrapper)
    assert IterateAveraging(0.5).apply(module) is False  # nothing averaged yet: the weights stay


@pytest.mark.parametrize("start", [1.0, -0.1, math.nan, True, "half", 0])
def test_bad_start_is_refused(start):
    if start == 0 and not isinstance(start, bool):
        assert IterateAveraging(start).start == 0.0  # 0: every step
        return
    with pytest.raises(ConfigurationError, match="start"):
        IterateAveraging(start)


def test_step_schedule_is_a_function_of_the_step_number_only():
    def factors(kind: str, total: int = 10, warmup: float = 0.2, final: float = 0.1, steps: int = 12) -> list[float]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = step_schedule(opt, total, kind, warmup=warmup, final=final)
        out = []
        for _ in range(steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out

    cos = factors("cosine")
    assert cos[:2] == pytest.approx([0.5, 1.0])  # two warm-up steps
    assert all(a >= b for a, b in zip(cos[1:], cos[2:], strict=False))
    assert cos[-1] == pytest.approx(0.1) and cos[10] == pytest.approx(0.1)  # stays at final past the plan
    assert cos[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    lin = factors("linear", warmup=0.0)
    assert lin[:3] == pytest.approx([1.0, 0.91, 0.82])
    assert factors("constant") == [1.0] * 12
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    assert step_schedule(opt, None).get_last_lr() == [1.0]
    for bad in ({"kind": "plateau"}, {"warmup": 1.0}, {"final": -0.1}, {"total_steps": 0}):
        kwargs = {"total_steps": 10, **bad}
        with pytest.raises(ConfigurationError):
            step_schedule(opt, **kwargs)


def test_the_combination_module_schedules_by_step_without_a_monitor(monkeypatch):
    from lightning_dpts.models import CombinationLightningModule
    from lightning_dpts.training import averaging

    module = CombinationLightningModule(model_kwargs={"prediction_length": 3, "context_length": 12, "seasons": [4]})
    assert isinstance(module.configure_optimizers(), torch.optim.Adam)  # no Trainer: no planned steps, constant
    monkeypatch.setattr(averaging, "planned_steps", lambda trainer: 10)
    module._trainer = object()  # stands for a Trainer planning 10 steps
    config = module.configure_optimizers()
    assert "monitor" not in config["lr_scheduler"] and config["lr_scheduler"]["interval"] == "step"
    assert config["lr_scheduler"]["scheduler"].lr_lambdas[0](10) == pytest.approx(0.1)  # cosine to 0.1 at the end

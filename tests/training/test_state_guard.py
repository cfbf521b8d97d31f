"""Issue 38, R4, L6 and the state around the noise, played as the attacker: every tensor a module or callback keeps
is constant during a DP fit or refused by name before it is written or used (lightning_dpts.training.state_guard).

On the code before issue 38 each attack below ran to the end and released what it computed:

* R4: a torchmetrics state saved with the weights (``metric.persistent(True)``) went raw into every checkpoint
  (the mean absolute error summed over the training windows: 22.04 on D against 1.0e7 on a neighbour);
* a tensor attribute written in ``on_train_batch_end`` (or in ``training_step``) and read by the next step's
  forward, and one carried from window to window under ``per_window="isolated"``, moved the update by more than
  2C (measured in the tests: :func:`_sensitivity`);
* a callback's tensor state (a stopping rule's best training loss) was kept and acted on;
* L6: ``EarlyStopping(monitor="train_loss")`` stopped at a step that is a noise-free function of the data and
  saved its best score raw; ``ModelCheckpoint(monitor="train_loss")`` chose checkpoints by it.

What must keep working: Lightning's ``ModelCheckpoint`` (``monitor=None``, or the released ``epsilon``), a metric
that is not saved (``persistent=False``, the torchmetrics default), a callback that declares
``dp_post_processing = True``, constant state.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

from .conftest import LinearModule, SpecDataModule, trainer
from .test_guarantee import BUDGET_8, DELTA, DIM, LAMBDA, SIGMA, SPEC


def _batches(value: float = 1.0, changed: float | None = None) -> list[dict[str, torch.Tensor]]:
    """Every batch all ``value``; with ``changed``, window 0 of the first batch is ``changed`` times the first unit
    vector instead (a neighbour whose window points elsewhere, so that its clipped gradient differs)."""
    out = [{"x": torch.full((LAMBDA, DIM), value)} for _ in range(SPEC.steps_per_epoch)]
    if changed is not None:
        out[0]["x"][0] = 0.0
        out[0]["x"][0, 0] = changed
    return out


def _fit(module: L.LightningModule, *callbacks: Callback, max_steps: int = 4, value: float = 1.0,
         changed: float | None = None, **strategy: object) -> L.Trainer:
    t = trainer(max_epochs=100, max_steps=max_steps, enable_checkpointing=any(
        isinstance(c, ModelCheckpoint) for c in callbacks),
        callbacks=[DPForecastStrategy(SIGMA, 1.0, seed=0, **strategy), AccountantCallback(BUDGET_8, DELTA),
                   *callbacks])
    t.fit(module, datamodule=SpecDataModule(SPEC, _batches(value, changed)))
    return t


# ----------------------------------------------------------------------------------------------------------------
# R4: metric states saved with the weights
# ----------------------------------------------------------------------------------------------------------------
class _Metered(LinearModule):
    """Tracks the mean absolute error of its training windows in a torchmetrics metric."""

    def __init__(self, persistent: bool) -> None:
        super().__init__(DIM, lr=1.0)
        import torchmetrics

        self.mae = torchmetrics.MeanAbsoluteError()
        self.mae.persistent(persistent)

    def training_step(self, batch, batch_idx):
        pred = self.lin(batch["x"]).squeeze(-1)
        self.mae.update(pred.detach(), batch["x"][:, 0])
        self.log("train_mae", self.mae, on_step=False, on_epoch=True)
        return pred.mean()


def test_r4_a_metric_state_saved_with_the_weights_is_refused_before_any_checkpoint(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    with pytest.raises(ConfigurationError) as info:
        _fit(_Metered(persistent=True), checkpoint, value=1e6)
    assert info.value.parameter == "model" and "metric state 'mae.sum_abs_error'" in str(info.value)
    assert not list(tmp_path.glob("*.ckpt"))


def test_a_metric_that_is_not_saved_keeps_working(tmp_path):
    module = _Metered(persistent=False)  # torchmetrics' default: the states are not in the state dict
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, filename="{step}")
    t = _fit(module, checkpoint, value=1e6)
    assert t.global_step == 4 and len(list(tmp_path.glob("*.ckpt"))) == 4
    saved = torch.load(tmp_path / "step=4.ckpt", weights_only=False)["state_dict"]
    assert set(saved) == {"lin.weight"}


# ----------------------------------------------------------------------------------------------------------------
# State carried between steps or windows
# ----------------------------------------------------------------------------------------------------------------
class _CarryAfterBatch(LinearModule):
    """Adds the previous batch's mean window to every input: written in on_train_batch_end."""

    def __init__(self) -> None:
        super().__init__(DIM, lr=1.0)
        self.prev = torch.zeros(DIM)

    def training_step(self, batch, batch_idx):
        return self.lin(batch["x"] * (1.0 + self.prev)).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.prev = batch["x"].mean(0)


class _CarryInPlace(_CarryAfterBatch):
    """The same, written in place in training_step (the tensor object stays, its version moves)."""

    def training_step(self, batch, batch_idx):
        loss = self.lin(batch["x"] * (1.0 + self.prev)).mean()
        self.prev.copy_(batch["x"].mean(0))
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        pass


class _CarryBetweenWindows(LinearModule):
    """Under per_window="isolated", each window's call reads what the previous window's call kept."""

    def __init__(self) -> None:
        super().__init__(DIM, lr=1.0)
        self.last = torch.zeros(DIM)

    def training_step(self, batch, batch_idx):
        loss = self.lin(batch["x"] * (1.0 + self.last)).mean()
        self.last = batch["x"].detach().mean(0)
        return loss


class _CarryBetweenWindowsLooped(_CarryBetweenWindows):
    """The same with a ``.item()`` that vmap cannot run: the isolated mode computes one window after the other."""

    def training_step(self, batch, batch_idx):
        if float(batch["x"].sum()) < 0:
            raise AssertionError
        return super().training_step(batch, batch_idx)


def _sensitivity(monkeypatch: pytest.MonkeyPatch, module_class: type, steps: int, **strategy: object) -> float:
    """Lambda * ||theta(D) - theta(D')|| after ``steps`` steps with the same seeded noise and the state guard switched
    off: at most 2C = 2 for a model whose windows are independent (D': window 0 of the first batch changed)."""
    import importlib

    thetas = []
    with monkeypatch.context() as patch:
        try:
            guard = importlib.import_module("lightning_dpts.training.state_guard").StateGuard
        except ImportError:  # the code before issue 38 had no state guard to switch off
            guard = None
        if guard is not None:
            patch.setattr(guard, "check_step", lambda self: None)
            patch.setattr(guard, "check", lambda self: None)
        for changed in (None, 100.0):
            module = module_class()
            _fit(module, max_steps=steps, changed=changed, spot_check=0.0, check_independence=False, **strategy)
            thetas.append(module.lin.weight.detach().clone())
    return float(LAMBDA * (thetas[0] - thetas[1]).norm())


@pytest.mark.parametrize("module_class, refused_at", [(_CarryAfterBatch, 1), (_CarryInPlace, 0)])
def test_state_carried_to_the_next_step_is_refused_before_that_step_is_released(monkeypatch, module_class,
                                                                                 refused_at):
    assert _sensitivity(monkeypatch, module_class, 2) > 2.0  # 2C: the attack works when nothing checks
    module = module_class()
    with pytest.raises(ConfigurationError, match="attribute 'prev'") as info:
        _fit(module, max_steps=4, changed=100.0)
    assert info.value.parameter == "model"
    assert module.trainer.global_step == refused_at  # no update from the step that used or wrote it


@pytest.mark.parametrize("module_class", [_CarryBetweenWindowsLooped, _CarryBetweenWindows], ids=["loop", "vmap"])
def test_state_carried_between_windows_in_isolated_mode_is_refused_before_the_next_window(monkeypatch,
                                                                                         module_class):
    if module_class is _CarryBetweenWindowsLooped:
        assert _sensitivity(monkeypatch, module_class, 1, per_window="isolated") > 2.0
    module = module_class()
    with pytest.raises(ConfigurationError, match="attribute 'last'"):
        _fit(module, per_window="isolated")
    assert module.trainer.global_step == 0


class _StopOnTrainingLoss(Callback):
    """A home-made stopping rule: keeps the best training loss (a tensor) and stops when it does not improve."""

    def __init__(self) -> None:
        self.best = torch.tensor(float("inf"))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"].detach()
        if loss < self.best:
            self.best = loss
        else:
            trainer.should_stop = True


def test_a_callbacks_tensor_state_is_refused():
    with pytest.raises(ConfigurationError, match="callback _StopOnTrainingLoss attribute 'best'") as info:
        _fit(LinearModule(DIM, lr=1.0), _StopOnTrainingLoss())
    assert info.value.parameter == "callbacks"


class _Averaging(Callback):
    """An iterate average: a function of the noisy weights only, declared so (docs/training.md)."""

    dp_post_processing = True

    def __init__(self) -> None:
        self.average: torch.Tensor | None = None
        self.count = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        w = pl_module.lin.weight.detach().clone()
        self.count += 1
        self.average = w if self.average is None else self.average + (w - self.average) / self.count


def test_a_post_processing_callback_and_constant_state_keep_working():
    class _Constant(LinearModule):
        def __init__(self) -> None:
            super().__init__(DIM, lr=1.0)
            self.offset = torch.full((DIM,), 0.5)  # a plain tensor attribute, constant during the fit
            self.calls = 0  # a Python counter: not a tensor

        def training_step(self, batch, batch_idx):
            self.calls += 1
            self.offset = torch.full((DIM,), 0.5)  # a new object with the same value
            return self.lin(batch["x"] - self.offset).mean()

    averaging = _Averaging()
    t = _fit(_Constant(), averaging)
    assert t.global_step == 4 and averaging.count == 4


class _Timer(Callback):
    """Keeps plain Python numbers that change every step (as a timer or a counter does)."""

    def __init__(self) -> None:
        self.last = 0.0
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.last = float(batch_idx) + 0.5
        self.steps += 1


def test_plain_values_that_change_every_step_cost_no_reindexing(monkeypatch):
    """Work, counted: a callback whose Python floats and ints change at every step costs the per-step check one
    identity test per value, not a re-examination and a rebuilt index (issue 44: a benchmark's step timer made the
    guard rebuild its index at every step). A tensor appearing in the same attribute is still refused."""
    from lightning_dpts.training.state_guard import StateGuard

    examined = []
    examine = StateGuard._examine

    def counted(self, o):
        examined.append(o.obj)
        return examine(self, o)

    monkeypatch.setattr(StateGuard, "_examine", counted)
    timer = _Timer()
    _fit(LinearModule(DIM, lr=1.0), timer, max_steps=8)
    assert timer.steps == 8
    assert not any(obj is timer for obj in examined)  # never re-examined (nor the index rebuilt for it)

    class _TensorTimer(_Timer):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            if self.steps == 3:
                self.last = outputs["loss"].detach()  # a noise-free function of the data, kept

    with pytest.raises(ConfigurationError, match="callback _TensorTimer attribute 'last'"):
        _fit(LinearModule(DIM, lr=1.0), _TensorTimer(), max_steps=8)


class _StepLog(Callback):
    """Appends a Python float to a list at every step (a benchmark's step timer)."""

    def __init__(self) -> None:
        self.times: list = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(float(batch_idx))


def test_a_list_that_grows_every_step_reindexes_that_callback_alone(monkeypatch):
    """Work, counted (issue 44): a callback whose list grows at every step is re-examined and re-indexed alone (one
    object per step), not the whole module and every callback, and only the list's new elements are scanned; a
    tensor appended to that list, or put in place of an earlier element, is still refused."""
    from lightning_dpts.training.state_guard import StateGuard

    guards = []
    start = StateGuard.start.__func__

    def recorded(cls, *args, **kwargs):
        guards.append(start(cls, *args, **kwargs))
        return guards[-1]

    checks = []
    check_step = StateGuard.check_step
    monkeypatch.setattr(StateGuard, "start", classmethod(recorded))
    monkeypatch.setattr(StateGuard, "check_step", lambda self: (checks.append(1), check_step(self))[1])
    log = _StepLog()
    idle = [_StepLog() for _ in range(6)]  # watched, never changed
    for callback in idle:
        callback.on_train_batch_end = lambda *args: None
    _fit(LinearModule(DIM, lr=1.0), log, *idle, max_steps=8)
    (guard,) = guards
    watched = len(guard._objects)
    assert watched >= 9 and len(log.times) == 8 and len(checks) >= 8
    # the growing list's new elements are type-checked once each (8), not the whole list at every check (36)
    assert guard.plain_scanned <= 2 * 8
    # all objects at the start, then about one per check (the step log; the module moves once), not all of them
    # (9 or more) at every check
    assert guard.indexed - watched <= 2 * len(checks) < 9 * len(checks)

    class _TensorLog(_StepLog):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            if len(self.times) == 3:
                self.times.append(outputs["loss"].detach())  # a noise-free function of the data, kept

    with pytest.raises(ConfigurationError, match="callback _TensorLog attribute 'times'"):
        _fit(LinearModule(DIM, lr=1.0), _TensorLog(), max_steps=8)

    class _ReplacingLog(_StepLog):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            if len(self.times) == 4:
                self.times[1] = outputs["loss"].detach()  # an earlier element replaced, while the list grows

    with pytest.raises(ConfigurationError, match="callback _ReplacingLog attribute 'times'"):
        _fit(LinearModule(DIM, lr=1.0), _ReplacingLog(), max_steps=8)


class _SwapInPlace(Callback):
    """Keeps two floats in a list and a dict, then puts the step's loss (a noise-free function of the data) in place
    of one of them: the container's size and identity stay the same."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.history = [0.0, 0.0]
        self.table = {"a": 0.0, "b": 0.0}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 1:
            if self.where == "list":
                self.history[0] = outputs["loss"].detach()
            else:
                self.table["a"] = outputs["loss"].detach()


@pytest.mark.parametrize("where", ["list", "dict"])
def test_a_plain_value_replaced_in_place_by_a_tensor_is_refused(where):
    """The attacker's pattern: a plain value of a list or dict attribute replaced in place by a tensor (no size
    change, same container) escaped the per-step check before (only tensor and None elements were tracked)."""
    attribute = "history" if where == "list" else "table"
    with pytest.raises(ConfigurationError, match=f"callback _SwapInPlace attribute '{attribute}'"):
        _fit(LinearModule(DIM, lr=1.0), _SwapInPlace(where), max_steps=4)


# ----------------------------------------------------------------------------------------------------------------
# L6: stopping and checkpoint rules on metrics computed without noise
# ----------------------------------------------------------------------------------------------------------------
class _Logging(LinearModule):
    def training_step(self, batch, batch_idx):
        loss = self.lin(batch["x"]).mean()
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss


@pytest.mark.parametrize("callback", [
    lambda _: EarlyStopping(monitor="train_loss", patience=1, check_on_train_epoch_end=True),
    lambda path: ModelCheckpoint(dirpath=path, monitor="train_loss", every_n_train_steps=1, filename="{step}"),
], ids=["EarlyStopping", "ModelCheckpoint"])
def test_l6_rules_on_noise_free_training_metrics_are_refused_before_the_first_step(tmp_path, callback):
    module = _Logging(DIM, lr=1.0)
    with pytest.raises(ConfigurationError, match="monitor='train_loss'") as info:
        _fit(module, callback(tmp_path))
    assert info.value.parameter == "callbacks" and "without noise" in str(info.value)
    assert module.trainer.global_step == 0 and not list(tmp_path.glob("*.ckpt"))


@pytest.mark.parametrize("monitor", [None, "epsilon"])
def test_modelcheckpoint_without_a_monitor_or_on_the_released_epsilon_keeps_working(tmp_path, monitor):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor=monitor, mode="max", every_n_train_steps=1,
                                 save_top_k=-1, filename="{step}")
    t = _fit(_Logging(DIM, lr=1.0), checkpoint)
    assert t.global_step == 4  # not refused (the accountant logs epsilon to the progress bar at most every 0.5 s,
    if monitor is None:  # so ModelCheckpoint may not find it at every step)
        assert len(list(tmp_path.glob("*.ckpt"))) == 4

"""Issue 38, L3-L5, played as the attacker: every way of saving and loading weights keeps the privacy ledger.

One rule: the ledger follows every parameter (lightning_dpts.training.ledger). Each test continues a DP fit from
weights saved one way and checks that the continuation is accounted from the steps the weights really took, with the
budget of :data:`BUDGET_8` (8 steps in all). On the code before issue 38:

* L3 ``torch.save(m.model.state_dict())`` + ``m2.model.load_state_dict(...)`` (a submodule, how GluonTS networks
  are saved) dropped the ledger: the continuation took 8 more steps, reporting epsilon(8) for 13 steps;
* L4 ``load_state_dict(older, strict=False)`` of one layer rolled the whole ledger back to the older count (3),
  though the other layer had taken 6 steps: the continuation took 5 more (11 on that layer, epsilon(8) reported);
* L5 ``load_from_checkpoint`` before ``lightning_dpts.training`` was imported attached no ledger at all.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.training import AccountantCallback, DPForecastStrategy, ledger_of, read_ledger
from lightning_dpts.training.ledger import LEDGER_KEY

from .conftest import FakeDataModule, SpecDataModule, make_module, trainer
from .test_guarantee import BUDGET_8, DELTA, DIM, SIGMA, SPEC

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTANT = StructuredSubsamplingAccountant(SPEC, SIGMA)


class _Network(torch.nn.Module):
    """A GluonTS-style network (the LightningModule's ``model``): two layers."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(DIM, DIM, bias=False)
        self.b = torch.nn.Linear(DIM, 1, bias=False)
        torch.nn.init.eye_(self.a.weight)
        torch.nn.init.zeros_(self.b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


class _Wrapped(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.model = _Network()

    def training_step(self, batch, batch_idx):
        return self.model(batch["x"]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def _fit(module: L.LightningModule, max_steps: int = -1) -> tuple[L.Trainer, AccountantCallback]:
    """A DP fit with a new Trainer, strategy and accountant (budget: 8 steps in all)."""
    acc = AccountantCallback(BUDGET_8, DELTA, max_overhead=None)
    t = trainer(max_epochs=100, max_steps=max_steps, callbacks=[DPForecastStrategy(SIGMA, 1.0), acc])
    t.fit(module, datamodule=SpecDataModule(SPEC, [{"x": torch.ones(SPEC.batch_size, DIM)}
                                                   for _ in range(SPEC.steps_per_epoch)]))
    return t, acc


def _accounted(acc: AccountantCallback, took: int) -> None:
    """The continuation's report accounts ``took`` steps, the count the weights really took."""
    true = ACCOUNTANT.epsilon(took, DELTA)
    assert acc.report.steps == took and acc.report.epsilon == pytest.approx(true, rel=1e-9), (
        f"reported {acc.report.steps} steps (epsilon {acc.report.epsilon:.3f}); the weights took {took} "
        f"(epsilon {true:.3f}, budget {BUDGET_8:.3f})")


def test_l3_a_submodule_state_dict_carries_the_ledger(tmp_path):
    first = _Wrapped()
    _fit(first, max_steps=5)
    torch.save(first.model.state_dict(), tmp_path / "network.pt")  # the network only, as GluonTS users save it
    assert read_ledger(tmp_path / "network.pt").steps == 5
    second = _Wrapped()
    second.model.load_state_dict(torch.load(tmp_path / "network.pt", weights_only=True))
    assert ledger_of(second) is not None and ledger_of(second).steps == 5
    t, acc = _fit(second)
    assert t.global_step == 3  # the budget held 8 steps in all
    _accounted(acc, 8)


def test_l3_a_gluonts_network_saved_alone_carries_the_ledger(tmp_path):
    module = make_module("simple_feedforward")
    t = trainer(max_steps=3, callbacks=[DPForecastStrategy(1.0, 1.0)])
    t.fit(module, datamodule=FakeDataModule(module))
    torch.save(module.model.state_dict(), tmp_path / "net.pt")
    fresh = make_module("simple_feedforward", seed=1)
    fresh.model.load_state_dict(torch.load(tmp_path / "net.pt", weights_only=True))
    assert ledger_of(fresh).steps == 3 and ledger_of(fresh.model).steps == 3
    # and it is written again by the next save of the whole module, or of any part of it
    assert read_ledger({"state_dict": fresh.state_dict()}).steps == 3


def test_l4_a_partial_non_strict_load_never_rolls_the_count_back(tmp_path):
    module = _Wrapped()
    _fit(module, max_steps=3)
    torch.save(module.state_dict(), tmp_path / "older.pt")
    _fit(module, max_steps=3)  # 6 steps in all
    older = torch.load(tmp_path / "older.pt", weights_only=True)
    del older["model.b.weight"]  # restore layer a only: layer b keeps its 6 steps
    module.load_state_dict(older, strict=False)
    assert ledger_of(module).steps == 6
    t, acc = _fit(module)
    assert t.global_step == 2
    _accounted(acc, 8)


def test_l4_loading_one_layer_of_an_older_checkpoint_into_the_layer_keeps_the_rest(tmp_path):
    module = _Wrapped()
    _fit(module, max_steps=3)
    torch.save(module.model.a.state_dict(), tmp_path / "a.pt")
    torch.save(module.state_dict(), tmp_path / "older.pt")
    _fit(module, max_steps=3)
    module.model.a.load_state_dict(torch.load(tmp_path / "a.pt", weights_only=True))
    assert ledger_of(module.model.a).steps == 3  # the layer holds its older weights ...
    assert ledger_of(module).steps == 6  # ... and the model still holds layer b's 6 steps
    # a full load of the older weights brings their own count: every parameter is the older one again
    module.load_state_dict(torch.load(tmp_path / "older.pt", weights_only=True))
    assert ledger_of(module).steps == 3


def test_l5_the_ledger_key_of_the_package_root_is_the_ledgers():
    import lightning_dpts

    assert lightning_dpts._LEDGER_KEY == LEDGER_KEY


@pytest.mark.parametrize("before, after", [("import lightning_dpts", ""),
                                           pytest.param("", "import lightning_dpts.privacy", marks=pytest.mark.slow)],
                         ids=["package-before-torch", "package-after-torch"])
def test_l5_loading_before_importing_the_training_package_attaches_the_ledger(tmp_path, before, after):
    module = _Wrapped()
    t, _ = _fit(module, max_steps=5)
    t.save_checkpoint(tmp_path / "dp.ckpt")
    torch.save(module.model.state_dict(), tmp_path / "net.pt")
    code = "\n".join([
        "import sys", before, "import lightning as L, torch", after,
        "assert 'lightning_dpts.training' not in sys.modules",
        "class Net(torch.nn.Module):",
        "    def __init__(self):",
        "        super().__init__()",
        f"        self.a, self.b = torch.nn.Linear({DIM}, {DIM}, bias=False), torch.nn.Linear({DIM}, 1, bias=False)",
        "class M(L.LightningModule):",
        "    def __init__(self):",
        "        super().__init__()",
        "        self.model = Net()",
        f"m = M.load_from_checkpoint({str(tmp_path / 'dp.ckpt')!r})",
        "n = M()",
        f"n.model.load_state_dict(torch.load({str(tmp_path / 'net.pt')!r}))",
        "from lightning_dpts.training import ledger_of",
        "print([None if ledger_of(x) is None else ledger_of(x).steps for x in (m, n)])",
    ])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[5, 5]"


class _Recurrent(L.LightningModule):
    """Only an LSTM owns parameters: the strategy swaps it for DPFastLSTM during the fit."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = torch.nn.Sequential()
        self.model.add_module("lstm", torch.nn.LSTM(2, 3, batch_first=True))

    def training_step(self, batch, batch_idx):
        out, _ = self.model.lstm(batch["x"])
        return out.mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_swapped_layer_keeps_the_ledger_it_was_loaded_with(tmp_path):
    def fit(module: L.LightningModule, steps: int) -> DPForecastStrategy:
        strategy = DPForecastStrategy(SIGMA, 1.0)
        t = trainer(max_steps=steps, callbacks=[strategy, AccountantCallback(50.0, DELTA, max_overhead=None)])
        t.fit(module, datamodule=SpecDataModule(SPEC, [{"x": torch.ones(SPEC.batch_size, 4, 2)}] * 8))
        return strategy

    first = _Recurrent()
    fit(first, 3)
    torch.save(first.model.state_dict(), tmp_path / "lstm.pt")
    second = _Recurrent()
    second.model.load_state_dict(torch.load(tmp_path / "lstm.pt", weights_only=True))
    assert ledger_of(second).steps == 3
    strategy = fit(second, 2)
    assert strategy.ledger.steps == 5 and ledger_of(second).steps == 5  # the original LSTM holds it again
    assert type(second.model.lstm) is torch.nn.LSTM and read_ledger({"state_dict": second.state_dict()}).steps == 5

"""issue 10, models: a module reading beyond the gathered past window, and bare nn.Parameters, are named."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from torch import nn

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training import AccountantCallback, DPForecastStrategy


def _trainer(dp: bool = True) -> L.Trainer:
    callbacks = [DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0),
                 AccountantCallback(epsilon=100.0, delta=1e-5)] if dp else []
    return L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu", callbacks=callbacks)


def _dm(**kw) -> StructuredSubsamplingDataModule:
    return StructuredSubsamplingDataModule([np.arange(80.0) + n for n in range(8)], batch_size=4, test_windows=0,
                                           **kw)


@pytest.mark.parametrize("dp", [True, False])
def test_deepar_without_model_argument_is_refused_at_setup(dp):
    from gluonts.torch.model.deepar import DeepARLightningModule

    module = DeepARLightningModule(model_kwargs=dict(freq="M", context_length=8, prediction_length=4,
                                                     lags_seq=[1, 2, 12], hidden_size=4, num_layers=1,
                                                     num_feat_dynamic_real=2))
    dm = _dm(context_length=8, prediction_length=4, freq="M")  # no model=: gathers 8 steps, DeepAR reads 19
    with pytest.raises(ConfigurationError) as info:
        _trainer(dp).fit(module, datamodule=dm)
    assert info.value.parameter == "model" and "model=" in info.value.requirement
    assert "19 steps" in info.value.requirement and "past_length=8" in info.value.requirement  # 8 + lag 12 - 1
    ok = _dm(model=module, freq="M")  # the fix the message gives
    assert ok.past_length == 19
    _trainer(dp).fit(module, datamodule=ok)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.gain


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class _Net(L.LightningModule):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "block":
            self.block = _Block()
        else:
            self.lin = nn.Linear(8, 4)
            if kind == "bare":
                self.gain = nn.Parameter(torch.ones(4))
            else:  # the fix: the parameter in a module whose forward uses it
                self.scale = _Scale()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        x = batch["past_target"].float()
        if self.kind == "block":
            out = self.block(x)
        elif self.kind == "bare":
            out = self.lin(x) * self.gain
        else:
            out = self.scale(self.lin(x))
        return ((out - batch["future_target"].float()) ** 2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize(("kind", "name"), [("block", "block.gain"), ("bare", "gain")])
def test_bare_parameter_is_named_with_the_fix(kind, name):
    with pytest.raises(ConfigurationError) as info:
        _trainer().fit(_Net(kind), datamodule=_dm(context_length=8, prediction_length=4))
    assert info.value.parameter == "model" and f"parameter {name!r}" in str(info.value.value)
    assert "nn.Module whose forward uses" in info.value.requirement


def test_the_suggested_fix_trains():
    net = _Net("wrapped")
    before = net.scale.weight.detach().clone()
    _trainer().fit(net, datamodule=_dm(context_length=8, prediction_length=4))
    assert not torch.equal(before, net.scale.weight.detach())


@pytest.mark.parametrize(
    "wrap",
    [
        nn.utils.parametrizations.weight_norm,
        nn.utils.parametrizations.spectral_norm,
        nn.utils.weight_norm,  # the older hook-based form: weight is a plain tensor recomputed before forward
    ],
)
def test_a_linear_layer_with_a_computed_weight_is_refused_by_name(wrap):
    """Its trainable parameters (e.g. weight_g, weight_v) get no per-window gradient through the linear shortcut:
    the hook-based form used to leave them with noise-only updates and the parametrized one failed with an error
    naming an internal parameter."""
    import warnings

    from lightning_dpts.training.engine import PerWindowClipper

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.nn.utils.weight_norm is deprecated
        net = nn.Sequential(nn.Linear(2, 3), wrap(nn.Linear(3, 4)), nn.Linear(4, 1))
    with pytest.raises(ConfigurationError, match=r"layer '1'.*computes its weight"):
        PerWindowClipper(net)
    net[1].requires_grad_(False)  # a frozen one is fine
    PerWindowClipper(net).remove()

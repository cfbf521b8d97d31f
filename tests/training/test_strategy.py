"""DPForecastStrategy: configuration errors, checkpoints that load into the unmodified model, prediction
without DP overhead."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training import DPForecastStrategy

from .conftest import FakeDataModule, LinearModule, SpecDataModule, make_module, trainer


def _fit(callbacks, module=None, dm=None, **kwargs):
    module = module or make_module("simple_feedforward")
    dm = dm or FakeDataModule(module, num_series=16, batch_size=4)
    t = trainer(max_steps=2, callbacks=callbacks, **kwargs)
    t.fit(module, datamodule=dm)
    return t, module


@pytest.mark.parametrize(
    "kwargs, parameter",
    [
        (dict(), "noise_multiplier"),
        (dict(noise_multiplier=1.0, target_epsilon=1.0, target_delta=1e-5, epochs=1), "noise_multiplier"),
        (dict(target_epsilon=1.0, target_delta=1e-5), "noise_multiplier"),
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(noise_multiplier=1.0, max_grad_norm=-1.0), "max_grad_norm"),
        (dict(target_epsilon=1.0, target_delta=2.0, epochs=1), "target_delta"),
        (dict(target_epsilon=1.0, target_delta=1e-5, epochs=0), "epochs"),
        (dict(noise_multiplier=1.0, seed=-3), "seed"),
        (dict(noise_multiplier=1.0, loss_reduction="none"), "loss_reduction"),
        (dict(noise_multiplier=1.0, expected_batch_size=0), "expected_batch_size"),
    ],
)
def test_invalid_arguments_name_the_parameter(kwargs, parameter):
    with pytest.raises(ConfigurationError) as info:
        DPForecastStrategy(**kwargs)
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    "trainer_kwargs, parameter",
    [
        (dict(gradient_clip_val=1.0), "gradient_clip_val"),
        (dict(accumulate_grad_batches=2), "accumulate_grad_batches"),
        (dict(precision="bf16-mixed"), "precision"),
    ],
)
def test_trainer_settings_that_break_the_guarantee_are_errors(trainer_kwargs, parameter):
    with pytest.raises(ConfigurationError) as info:
        _fit([DPForecastStrategy(1.0, 1.0, seed=0)], **trainer_kwargs)
    assert info.value.parameter == parameter


def test_batchnorm_is_an_error_and_leaves_the_model_unchanged():
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    module = SimpleFeedForwardLightningModule(
        model_kwargs=dict(prediction_length=4, context_length=8, hidden_dimensions=[8, 8], batch_norm=True)
    )
    with pytest.raises(ConfigurationError, match="BatchNorm"):
        _fit([DPForecastStrategy(1.0, 1.0, seed=0)], module=module)
    assert not any(m._forward_hooks for m in module.modules())


class _TwoOptimizers(LinearModule):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


class _Manual(LinearModule):
    def __init__(self) -> None:
        super().__init__(3)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = self.lin(batch["x"]).mean()
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad()


class _ForeignParameter(LinearModule):
    def configure_optimizers(self):
        self.outside = [nn.Parameter(torch.zeros(2))]  # a list: not registered in the module
        return torch.optim.SGD([*self.parameters(), *self.outside], lr=0.1)


@pytest.mark.parametrize(
    "module, parameter",
    [(_TwoOptimizers(3), "configure_optimizers"), (_Manual(), "automatic_optimization"),
     (_ForeignParameter(3), "configure_optimizers")],
)
def test_optimisation_setups_that_break_the_guarantee_are_errors(module, parameter):
    from lightning_dpts.privacy import SamplingSpec

    spec = SamplingSpec(num_series=8, min_length=10, context_length=3, prediction_length=2, batch_size=4)
    dm = SpecDataModule(spec, [{"x": torch.ones(4, 3)}])
    with pytest.raises((ConfigurationError, Exception)) as info:
        _fit([DPForecastStrategy(1.0, 1.0, seed=0)], module=module, dm=dm)
    if isinstance(info.value, ConfigurationError):
        assert info.value.parameter == parameter
    else:  # Lightning itself rejects several optimizers in automatic optimisation
        assert "optimizer" in str(info.value).lower()
    assert not any(m._forward_hooks for m in module.modules())  # hooks removed after the error


def test_expected_batch_size_must_match_the_datamodule():
    with pytest.raises(ConfigurationError) as info:
        _fit([DPForecastStrategy(1.0, 1.0, seed=0, expected_batch_size=5)])
    assert info.value.parameter == "expected_batch_size"


def test_works_without_sampling_spec_given_lambda():
    class Plain(L.LightningDataModule):
        def train_dataloader(self):
            return DataLoader([{"x": torch.ones(4, 3)}] * 3, batch_size=None)

    strategy = DPForecastStrategy(1.0, 1.0, seed=0, expected_batch_size=4)
    t, _ = _fit([strategy], module=LinearModule(3, lr=0.1), dm=Plain())
    assert t.global_step == 2 and strategy.steps == 2
    with pytest.raises(ConfigurationError):
        _fit([DPForecastStrategy(1.0, 1.0, seed=0)], module=LinearModule(3), dm=Plain())


@pytest.mark.parametrize("name", ["deepar", "patchtst"])
def test_checkpoint_loads_into_the_unmodified_model_and_prediction_has_no_dp_overhead(name, tmp_path):
    module = make_module(name)
    dm = FakeDataModule(module, num_series=16, batch_size=4)
    ckpt = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    t = trainer(max_steps=3, enable_checkpointing=True, callbacks=[DPForecastStrategy(1.0, 1.0, seed=0), ckpt])
    t.fit(module, datamodule=dm)
    # after fitting: original layers, no Opacus hooks or per-sample attributes
    assert not any(type(m).__module__.startswith(("opacus", "lightning_dpts")) for m in module.modules())
    assert not any(m._forward_hooks or m._backward_hooks for m in module.modules())
    assert not any(hasattr(p, "grad_sample") for p in module.parameters())
    plain = make_module(name, seed=1)  # a fresh, unmodified GluonTS module
    plain.load_state_dict(torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"])  # strict keys
    for (k1, v1), (k2, v2) in zip(module.state_dict().items(), plain.state_dict().items(), strict=True):
        assert k1 == k2 and torch.equal(v1, v2)
    batch = dm.batches[0]
    inputs = {k: batch[k] for k in module.model.describe_inputs()}
    module.eval()
    plain.eval()
    with torch.no_grad():
        if name == "deepar":
            torch.manual_seed(0)
            a = module.model(**inputs, num_parallel_samples=3)
            torch.manual_seed(0)
            b = plain.model(**inputs, num_parallel_samples=3)
        else:
            a, b = module.model(**inputs)[0][0], plain.model(**inputs)[0][0]
    torch.testing.assert_close(a, b)
    # prediction through a Trainer: no DP callback activity outside fit
    t.validate(module, dataloaders=FakeDataModule(module, with_val=True).val_dataloader())


@pytest.mark.parametrize(
    "net, match",
    [
        (nn.Sequential(nn.TransformerEncoderLayer(8, 2, 16)), "batch_first"),
        (nn.Sequential(nn.InstanceNorm1d(3, track_running_stats=True)), "running"),
    ],
)
def test_layers_that_mix_windows_are_errors(net, match):
    from lightning_dpts.training import make_private_compatible

    with pytest.raises(ConfigurationError, match=match):
        make_private_compatible(net)


def test_tied_weights_are_an_error():
    from lightning_dpts.training import PerWindowClipper

    emb = nn.Embedding(5, 4)
    head = nn.Linear(4, 5, bias=False)
    head.weight = emb.weight
    with pytest.raises(ConfigurationError, match="tied"):
        PerWindowClipper(nn.ModuleList([emb, head]))
    second = nn.Linear(4, 5, bias=False)
    second.weight = head.weight
    with pytest.raises(ConfigurationError, match="tied"):
        PerWindowClipper(nn.ModuleList([head, second, nn.Linear(2, 2)]))


class _PlateauModule(LinearModule):
    """GluonTS DeepAR's pattern: ReduceLROnPlateau monitoring the (private, noiseless) training loss."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss, on_epoch=True, on_step=False)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "train_loss"}}


def _plateau_setup(mode: str):
    from lightning_dpts.privacy import SamplingSpec

    spec = SamplingSpec(num_series=8, min_length=20, context_length=4, prediction_length=2, batch_size=4)
    batches = [{"x": torch.ones(4, 3)} for _ in range(spec.steps_per_epoch)]
    module = _PlateauModule(3)
    strategy = DPForecastStrategy(noise_multiplier=1.0, max_grad_norm=1.0, seed=0, data_dependent_schedulers=mode)
    return module, SpecDataModule(spec, batches), strategy


def test_data_dependent_lr_schedulers_are_disabled_with_a_warning():
    module, dm, strategy = _plateau_setup("disable")
    t = trainer(max_epochs=4, callbacks=[strategy])
    with pytest.warns(UserWarning, match="ReduceLROnPlateau monitoring 'train_loss'"):
        t.fit(module, datamodule=dm)
    assert t.lr_scheduler_configs == []
    # with the scheduler active (patience 0, constant loss) the rate would have halved every epoch
    assert t.optimizers[0].param_groups[0]["lr"] == 0.1


def test_data_dependent_lr_schedulers_can_be_an_error():
    module, dm, strategy = _plateau_setup("error")
    with pytest.raises(ConfigurationError, match="data_dependent_schedulers"):
        trainer(max_epochs=1, callbacks=[strategy]).fit(module, datamodule=dm)

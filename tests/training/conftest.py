"""Shared helpers for the training tests: tiny GluonTS modules and a fake structured-subsampling datamodule."""

from __future__ import annotations

import logging
import types
import warnings
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_dpts.privacy import SamplingSpec

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*does not have many workers.*")
warnings.filterwarnings("ignore", message=".*GPU available but not used.*")
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
logging.getLogger("lightning.fabric").setLevel(logging.ERROR)

H, CTX = 4, 8
MODEL_NAMES = ["simple_feedforward", "dlinear", "deepar", "patchtst"]


def make_module(name: str, seed: int = 0) -> L.LightningModule:
    """A small GluonTS torch LightningModule (fixed initialisation)."""
    from gluonts.torch.model.d_linear import DLinearLightningModule
    from gluonts.torch.model.deepar import DeepARLightningModule
    from gluonts.torch.model.patch_tst import PatchTSTLightningModule
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardLightningModule

    torch.manual_seed(seed)
    if name == "simple_feedforward":
        return SimpleFeedForwardLightningModule(
            model_kwargs=dict(prediction_length=H, context_length=CTX, hidden_dimensions=[8])
        )
    if name == "dlinear":
        return DLinearLightningModule(model_kwargs=dict(prediction_length=H, context_length=CTX, hidden_dimension=8))
    if name == "deepar":
        return DeepARLightningModule(
            model_kwargs=dict(
                freq="M", context_length=CTX, prediction_length=H, num_feat_dynamic_real=2, hidden_size=6,
                num_layers=2, dropout_rate=0.0, lags_seq=[1, 2, 3],
            )
        )
    if name == "patchtst":
        return PatchTSTLightningModule(
            model_kwargs=dict(
                prediction_length=H, context_length=CTX, patch_len=4, stride=4, padding_patch="end", d_model=8,
                nhead=2, dim_feedforward=8, num_feat_dynamic_real=0, dropout=0.0, activation="relu",
                norm_first=False, num_encoder_layers=1, scaling="mean",
            )
        )
    raise KeyError(name)


def past_length(module: L.LightningModule) -> int:
    inner = module.model
    return int(getattr(inner, "_past_length", inner.context_length))


def make_batch(module: L.LightningModule, size: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """A dict batch with the fields ``module.model.describe_inputs`` declares, plus the future fields."""
    batch: dict[str, torch.Tensor] = {}
    for key, spec in module.model.describe_inputs(size).items():
        if spec.dtype in (torch.long, torch.int64, torch.int32):
            batch[key] = torch.zeros(spec.shape, dtype=spec.dtype)
        elif "observed" in key:
            batch[key] = torch.ones(spec.shape, dtype=spec.dtype)
        else:
            batch[key] = (1.0 + torch.rand(spec.shape, generator=generator)).to(spec.dtype)
    batch["future_target"] = 1.0 + torch.rand(size, module.model.prediction_length, generator=generator)
    batch["future_observed_values"] = torch.ones(size, module.model.prediction_length)
    return batch


class _Batches(Dataset):
    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.batches[i]


class SpecDataModule(L.LightningDataModule):
    """A datamodule with a given ``sampling_spec`` whose every epoch yields the given list of dict batches."""

    def __init__(self, spec: SamplingSpec, batches: list[dict[str, torch.Tensor]]) -> None:
        super().__init__()
        self._spec = spec
        self.batches = batches

    @property
    def sampling_spec(self) -> SamplingSpec:
        return self._spec

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Batches(self.batches), batch_size=None, shuffle=False)


class LinearModule(L.LightningModule):
    """loss = mean_i w . x_i, so window i's gradient is exactly ``batch["x"][i]`` (controlled gradients)."""

    def __init__(self, dim: int, lr: float = 0.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, 1, bias=False)
        torch.nn.init.zeros_(self.lin.weight)
        self.lr = lr

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.lin(batch["x"]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class FakeDataModule(L.LightningDataModule):
    """Stands in for StructuredSubsamplingDataModule: a ``sampling_spec`` and deterministic dict batches.

    Each epoch yields ``spec.steps_per_epoch`` batches of ``batch_size`` windows (``batches`` overrides them).
    """

    def __init__(
        self,
        module: L.LightningModule,
        *,
        num_series: int = 64,
        batch_size: int = 8,
        top_level: str = "without_replacement",
        min_length: int = 40,
        seed: int = 0,
        batches: list[dict[str, torch.Tensor]] | None = None,
        with_val: bool = False,
    ) -> None:
        super().__init__()
        self._spec = SamplingSpec(
            num_series=num_series,
            min_length=min_length,
            context_length=past_length(module),
            prediction_length=module.model.prediction_length,
            batch_size=batch_size,
            top_level=top_level,  # type: ignore[arg-type]
        )
        g = torch.Generator().manual_seed(seed)
        self.batches = batches or [make_batch(module, batch_size, g) for _ in range(self._spec.steps_per_epoch)]
        self.val = [make_batch(module, batch_size, g)] if with_val else None
        if not with_val:  # no validation loop at all (GluonTS modules then monitor train_loss)
            self.val_dataloader = types.MethodType(L.LightningDataModule.val_dataloader, self)  # type: ignore

    @property
    def sampling_spec(self) -> SamplingSpec:
        return self._spec

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_Batches(self.batches), batch_size=None, shuffle=False)

    def val_dataloader(self) -> Any:
        return DataLoader(_Batches(self.val or []), batch_size=None)


def trainer(**kwargs: Any) -> L.Trainer:
    """A quiet CPU Trainer. A test that trains a DPForecastStrategy without an AccountantCallback tests the strategy
    alone: the strategy opts out of the accountant requirement here (``require_accountant=False``, as a user who
    accounts from the ledger would; the ledger still counts every step)."""
    from lightning_dpts.training import DPForecastStrategy
    from lightning_dpts.training.roles import StepAccountant

    callbacks = kwargs.get("callbacks") or []
    if not any(isinstance(c, StepAccountant) for c in callbacks):
        for c in callbacks:
            if isinstance(c, DPForecastStrategy):
                c.require_accountant = False
    opts: dict[str, Any] = dict(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    opts.update(kwargs)
    return L.Trainer(**opts)


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield

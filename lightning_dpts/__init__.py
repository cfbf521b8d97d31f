"""lightning-dpts: differentially private time-series forecasting for PyTorch Lightning.

The privacy layer (:mod:`lightning_dpts.privacy`) is pure numpy/scipy/dp-accounting and never imports torch
or Lightning, so ``import lightning_dpts.privacy`` stays fast for notebooks and the ``dpts`` command.
Components that need torch are imported lazily on first attribute access.

Importing this package (any of its modules) also makes loading weights attach the privacy ledger they carry
(docs/training.md, "The privacy ledger"): once torch is imported - before or after this package - every
``nn.Module.load_state_dict`` of a state dict that carries a ledger hands it to
:func:`lightning_dpts.training.ledger.load_with_ledgers`. Nothing else is imported until such a state dict is loaded.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "ConfigurationError": "lightning_dpts.errors",
    "NeighbouringRelation": "lightning_dpts.privacy",
    "SamplingSpec": "lightning_dpts.privacy",
    "StructuredSubsamplingAccountant": "lightning_dpts.privacy",
    "StructuredSubsamplingDataModule": "lightning_dpts.data",
    "DPForecastStrategy": "lightning_dpts.training",
    "AccountantCallback": "lightning_dpts.training",
    "calibrate_noise_multiplier": "lightning_dpts.privacy",
    "PrivateEstimator": "lightning_dpts.gluonts",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dpts' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


# ----------------------------------------------------------------------------------------------------------------
# The ledger's load hook (issue 38, L5): installed when torch is imported, whatever was imported first
# ----------------------------------------------------------------------------------------------------------------
#: ``lightning_dpts.training.ledger.LEDGER_KEY``, repeated here so that the check costs no import (a test compares them)
_LEDGER_KEY = "dpts_privacy_ledger"
#: where the ledger's load logic lives (imported on the first load of a state dict that carries a ledger)
_LEDGER_MODULE = "lightning_dpts.training.ledger"


def carries_ledger(state_dict: Any) -> bool:
    """Whether a state dict's metadata holds a privacy ledger (at any module)."""
    metadata = getattr(state_dict, "_metadata", None)
    return isinstance(metadata, dict) and any(isinstance(local, dict) and _LEDGER_KEY in local
                                              for local in metadata.values())


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``action(module)`` once, right after the module ``name`` has been imported (a post-import hook)."""

    def __init__(self, name: str, action: Callable[[Any], None]) -> None:
        self.name, self.action = name, action

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one-shot; also keeps the search below from finding this finder again
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute, action = loader.exec_module, self.action

        def exec_module(module: Any) -> None:
            execute(module)
            action(module)

        loader.exec_module = exec_module  # this module's own loader object (file loaders are made per module)
        return spec


def _when_imported(name: str, action: Callable[[Any], None]) -> None:
    """``action(module)`` now if ``name`` is imported, else right after it is."""
    if name in sys.modules:
        action(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, action))


def _patch_module_loading(torch: Any) -> None:
    """Wrap ``torch.nn.Module.load_state_dict``: a state dict with a ledger goes through the ledger's logic (which
    calls the original); any other is loaded by the original directly. Idempotent."""
    module_class = torch.nn.Module
    original = module_class.load_state_dict
    if getattr(original, "_dpts_ledger_hook", False):
        return

    @functools.wraps(original)
    def load_state_dict(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        if not carries_ledger(state_dict):
            return original(self, state_dict, *args, **kwargs)
        ledger = importlib.import_module(_LEDGER_MODULE)
        return ledger.load_with_ledgers(original, self, state_dict, *args, **kwargs)

    load_state_dict._dpts_ledger_hook = True  # type: ignore[attr-defined]
    module_class.load_state_dict = load_state_dict


def _patch_checkpoint_loading(saving: Any) -> None:
    """Wrap Lightning's ``_load_state`` (``load_from_checkpoint``): a checkpoint whose ledger is only at its top level
    or in the strategy's callback state (written before the state-dict copy) attaches it too. Idempotent."""
    original = saving._load_state
    if getattr(original, "_dpts_ledger_hook", False):
        return

    @functools.wraps(original)
    def _load_state(cls: Any, checkpoint: Any, *args: Any, **kwargs: Any) -> Any:
        obj = original(cls, checkpoint, *args, **kwargs)
        if isinstance(checkpoint, dict) and (_LEDGER_KEY in checkpoint or checkpoint.get("callbacks")):
            ledger = importlib.import_module(_LEDGER_MODULE)
            ledger.attach_checkpoint_ledger(obj, checkpoint)
        return obj

    _load_state._dpts_ledger_hook = True  # type: ignore[attr-defined]
    saving._load_state = _load_state


def install_load_hooks() -> None:
    """Install the ledger's load hooks now or when torch / Lightning get imported (idempotent)."""
    _when_imported("torch", _patch_module_loading)
    _when_imported("lightning.pytorch.core.saving", _patch_checkpoint_loading)


install_load_hooks()

"""The privacy ledger: every noisy optimizer step a model's weights ever took, travelling with the weights.

One :class:`PrivacyLedger` per model (docs/privacy.md, rule 7: "count every noisy step that ever touched the
private data"). :class:`~lightning_dpts.training.DPForecastStrategy` is the only writer - it is what takes the
noisy steps (Algorithm 2) - and :class:`~lightning_dpts.training.AccountantCallback` reads it. It is kept with
the weights, so that every continuation composes with it:

* on the LightningModule object itself (attribute ``dpts_privacy_ledger``): a second ``Trainer`` on the same
  module, in the same process, continues the count;
* in the module's ``state_dict()``, as metadata of the root module (``state_dict._metadata[""]`` under
  :data:`LEDGER_KEY`; a module with a ledger gets a state-dict hook for this). So every form that saves the
  weights carries it: full and weights-only checkpoints (``ModelCheckpoint(save_weights_only=True)``,
  ``trainer.save_checkpoint(path, weights_only=True)``), ``torch.save(module.state_dict())``, a serialized
  GluonTS predictor. It is metadata, not a key: a model loads with ``strict=True`` where lightning-dpts is not
  installed, and a state dict rebuilt key by key (``{k: v for ...}``) drops it (attach it with
  :func:`attach_ledger`);
* ``load_state_dict`` of any LightningModule (this module wraps ``LightningModule.load_state_dict`` when
  :mod:`lightning_dpts.training` is imported) attaches the ledger of the state dict it loads: after
  ``Model.load_from_checkpoint(path)`` or ``module.load_state_dict(torch.load(path))``, a new Trainer with new
  callbacks continues the count instead of starting at epsilon = 0;
* in full checkpoints also in the strategy's callback state (``trainer.fit(..., ckpt_path=...)`` restores it
  with the weights) and at the top level of the checkpoint dict under :data:`LEDGER_KEY` (read by
  :func:`read_ledger`, and by ``load_from_checkpoint`` for checkpoints written before the state-dict copy).

The ledger holds counts and the settings they were accounted with - never a seed, an entropy or a generator
state. Per-epoch accounting (``iteration``/``shuffling`` top levels) counts *epochs started*: a Trainer epoch
in which at least one noisy step was taken counts as one composition, so a resumed partial epoch is a new one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["LEDGER_ATTRIBUTE", "LEDGER_KEY", "PrivacyLedger", "attach_ledger", "ledger_of", "read_ledger"]

#: Key of the ledger at the top level of a checkpoint dict and in the root module's state-dict metadata.
LEDGER_KEY = "dpts_privacy_ledger"
#: Attribute of the LightningModule that holds its ledger in memory.
LEDGER_ATTRIBUTE = "dpts_privacy_ledger"
#: Attribute of the LightningModule that holds its state-dict guard (the
#: :class:`~lightning_dpts.training.buffers.BufferGuard` during a DP fit and after a refusal).
GUARD_ATTRIBUTE = "_dpts_buffer_guard"


@dataclass
class PrivacyLedger:
    """The noisy steps a model's weights took, and what they were accounted with.

    Attributes:
        steps: noisy optimizer steps (each one sampled batch, Algorithm 2).
        epochs: Trainer epochs in which at least one noisy step was taken (the compositions of per-epoch
            accounting; a resumed partial epoch counts as a new one).
        noise_multiplier: sigma of every step (``None`` before the first step).
        max_grad_norm: C of every step.
        sampling_spec: ``repr`` of the :class:`~lightning_dpts.privacy.SamplingSpec` the steps sampled with.
        budget: ``(epsilon, delta)`` of the last :class:`~lightning_dpts.training.AccountantCallback` that
            accounted the steps, or ``None``.
        seeded: ``True`` if any step used an explicit seed (the guarantee then does not hold against anyone
            who knows it; :data:`~lightning_dpts.randomness.SEEDED_NOTICE`).
        noise: the noise kind of the steps, ``"gaussian"`` (DP-SGD) or ``"bandmf"`` (never the noise itself).
        bands: b of BandMF noise (1 for DP-SGD).
    """

    steps: int = 0
    epochs: int = 0
    noise_multiplier: float | None = None
    max_grad_norm: float | None = None
    sampling_spec: str | None = None
    budget: tuple[float, float] | None = None
    seeded: bool = False
    noise: str = "gaussian"
    bands: int = 1

    @property
    def empty(self) -> bool:
        """No noisy step was taken yet."""
        return self.steps == 0

    def accounted_steps(self, spec: SamplingSpec) -> int:
        """The step count to give the accountant: ``epochs * steps_per_epoch`` for per-epoch accounting
        (so that its compositions are the epochs started), else ``steps``."""
        if spec.accounts_per_epoch:
            return self.epochs * spec.steps_per_epoch
        return self.steps

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (what goes into a checkpoint)."""
        out = dataclasses.asdict(self)
        out["budget"] = None if self.budget is None else list(self.budget)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        budget = data.get("budget")
        return cls(
            steps=int(data.get("steps", 0)),
            epochs=int(data.get("epochs", 0)),
            noise_multiplier=None if data.get("noise_multiplier") is None else float(data["noise_multiplier"]),
            max_grad_norm=None if data.get("max_grad_norm") is None else float(data["max_grad_norm"]),
            sampling_spec=data.get("sampling_spec"),
            budget=None if budget is None else (float(budget[0]), float(budget[1])),
            seeded=bool(data.get("seeded", False)),
            noise=str(data.get("noise", "gaussian")),
            bands=int(data.get("bands", 1)),
        )

    def check_continuation(self, noise_multiplier: float, max_grad_norm: float, spec: SamplingSpec | None) -> None:
        """Raise :class:`ConfigurationError` if a continuation's settings differ from those already accounted.

        The accountant composes identical steps; steps with another sigma, C or sampling cannot be added to
        this count.
        """
        if self.empty:
            return
        for name, saved, mine in (("noise_multiplier", self.noise_multiplier, noise_multiplier),
                                  ("max_grad_norm", self.max_grad_norm, max_grad_norm)):
            if saved is not None and not math.isclose(saved, mine, rel_tol=1e-9):
                raise ConfigurationError(
                    name, mine,
                    f"the model's privacy ledger has {self.steps} noisy steps taken with {name}={saved}; a "
                    f"continuation must use the same value (or start from freshly initialised weights)",
                )
        if spec is not None and self.sampling_spec is not None and not spec.matches_repr(self.sampling_spec):
            raise ConfigurationError(
                "datamodule.sampling_spec", spec,
                f"the model's privacy ledger accounted {self.steps} noisy steps with {self.sampling_spec}; a "
                "continuation must sample the same way (or start from freshly initialised weights)",
            )


def ledger_of(module: Any) -> PrivacyLedger | None:
    """The ledger attached to a LightningModule, or ``None``."""
    ledger = getattr(module, LEDGER_ATTRIBUTE, None)
    return ledger if isinstance(ledger, PrivacyLedger) else None


def read_ledger(checkpoint: str | Path | dict[str, Any]) -> PrivacyLedger | None:
    """The ledger stored in a checkpoint (a path or an already loaded dict), or ``None`` if it has none.

    Read from the weights' state-dict metadata (every checkpoint form, weights-only included), else from the
    top level of the checkpoint, else from the strategy's callback state (checkpoints written before the ledger
    existed: its ``steps``). Loading a path unpickles it (``torch.load(weights_only=False)``): only load
    checkpoints you trust.
    """
    if not isinstance(checkpoint, dict):
        import torch

        checkpoint = torch.load(str(checkpoint), map_location="cpu", weights_only=False)
    assert isinstance(checkpoint, dict)
    weights = checkpoint.get("state_dict")
    if isinstance(weights, dict):
        ledger = ledger_in_state_dict(weights)
        if ledger is not None:
            return ledger
    if isinstance(checkpoint.get(LEDGER_KEY), dict):
        return PrivacyLedger.from_dict(checkpoint[LEDGER_KEY])
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if "DPForecastStrategy" in str(key) and isinstance(state, dict):
            if isinstance(state.get("ledger"), dict):
                return PrivacyLedger.from_dict(state["ledger"])
            if "steps" in state:  # an older checkpoint: steps only (epochs derived at the next fit)
                return PrivacyLedger(steps=int(state["steps"]), epochs=-1,
                                     noise_multiplier=state.get("noise_multiplier"),
                                     max_grad_norm=state.get("max_grad_norm"))
    return None


def ledger_in_state_dict(state_dict: Any, prefix: str = "") -> PrivacyLedger | None:
    """The ledger in a module's state dict (the metadata of the module at ``prefix``), or ``None``."""
    metadata = getattr(state_dict, "_metadata", None)
    local = metadata.get(prefix[:-1] if prefix else "") if isinstance(metadata, dict) else None
    data = local.get(LEDGER_KEY) if isinstance(local, dict) else None
    return PrivacyLedger.from_dict(data) if isinstance(data, dict) else None


def attach_ledger(module: Any, source: str | Path | dict[str, Any] | PrivacyLedger) -> PrivacyLedger | None:
    """Attach the ledger of ``source`` (a checkpoint path or dict, or a ledger) to ``module``; returns it.

    From then on the module's ``state_dict()`` carries the ledger (:func:`_state_dict_hook`).
    """
    ledger = source if isinstance(source, PrivacyLedger) else read_ledger(source)
    if ledger is not None:
        object.__setattr__(module, LEDGER_ATTRIBUTE, ledger)
        hook_state_dict(module)
    return ledger


def hook_state_dict(module: Any) -> None:
    """Give ``module`` the state-dict hook that checks its buffers and writes its ledger (once; idempotent)."""
    if not any(hook is _state_dict_hook for hook in module._state_dict_hooks.values()):
        module.register_state_dict_post_hook(_state_dict_hook)


class StateDictGuard:
    """What every ``state_dict()`` of a module with the ledger hook runs first (:func:`_state_dict_hook`): ``check``
    raises to refuse the state dict. Implemented by :class:`~lightning_dpts.training.buffers.BufferGuard`; defined
    here so that this module does not import the buffers module (which imports this one)."""

    def check(self) -> None:
        raise NotImplementedError


def _attached_guard(module: Any) -> StateDictGuard | None:
    """The state-dict guard attached to a module (``GUARD_ATTRIBUTE``), or ``None``."""
    guard = getattr(module, GUARD_ATTRIBUTE, None)
    return guard if isinstance(guard, StateDictGuard) else None


def _state_dict_hook(module: Any, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any]) -> None:
    """Every ``state_dict()`` of a module with a ledger: refuse buffers changed by a DP fit, then add the ledger.

    The buffer check (:class:`~lightning_dpts.training.buffers.BufferGuard`, attached during a DP fit and after a
    refusal) runs before anything can be written: Lightning builds the whole checkpoint dict, this state dict
    included, before it saves the file.
    """
    guard = _attached_guard(module)
    if guard is not None:
        guard.check()
    ledger = ledger_of(module)
    if ledger is not None:
        local_metadata[LEDGER_KEY] = ledger.to_dict()


def _take_loaded_ledger(module: Any, loaded: PrivacyLedger) -> Any:
    """What loading weights that carry ``loaded`` does to ``module``'s ledger (returned as a function to call
    once the weights are loaded; raises before loading if it must refuse).

    Outside a DP fit the weights bring their ledger: it replaces the module's. During a DP fit (the module's
    buffers are guarded, :mod:`lightning_dpts.training.buffers`) the strategy keeps counting in the fit's ledger
    object, so that object stays and takes the larger of the two counts: weights swapped mid-fit (e.g. a callback
    restoring earlier weights) never lower the count, whose steps already touched the data. Weights whose ledger
    was accounted with other settings cannot join the fit's count and are refused.
    """
    current = ledger_of(module)
    if current is None or _attached_guard(module) is None:
        return functools.partial(attach_ledger, module, loaded)
    if not loaded.empty and not current.empty:
        for name in ("noise_multiplier", "max_grad_norm", "sampling_spec", "noise", "bands"):
            mine, theirs = getattr(current, name), getattr(loaded, name)
            if mine is not None and theirs is not None and mine != theirs:
                raise ConfigurationError(
                    "state_dict", f"{name}={theirs!r}",
                    f"weights loaded during a DP fit carry a privacy ledger accounted with {name}={theirs!r}, but "
                    f"the fit's ledger has {name}={mine!r}: their steps cannot join this fit's count. Load weights "
                    "before the fit starts",
                )

    def merge() -> None:
        current.steps = max(current.steps, loaded.steps)
        current.epochs = max(current.epochs, loaded.epochs)
        current.seeded = current.seeded or loaded.seeded

    return merge


def install_load_hook() -> None:
    """Make loading weights into a LightningModule attach the ledger they carry. Idempotent.

    * ``LightningModule.load_state_dict`` (every way of loading weights into a LightningModule: by hand,
      ``load_from_checkpoint``, ``trainer.fit(ckpt_path=...)``, GluonTS ``Predictor.deserialize``) attaches the
      ledger of the state dict's metadata, if it has one (:func:`_take_loaded_ledger`: during a DP fit the
      fit's count never goes down); a state dict without one leaves the module's ledger as it is.
    * ``lightning.pytorch.core.saving._load_state`` (``load_from_checkpoint``) also attaches the ledger at the
      checkpoint's top level or in its callback state (checkpoints written before the state-dict copy).

    Both wrappers call the original unchanged and only add the attribute.
    """
    import lightning as L
    from lightning.pytorch.core import saving

    loader = L.LightningModule.load_state_dict
    if not getattr(loader, "_dpts_ledger_hook", False):

        @functools.wraps(loader)
        def load_state_dict(self: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
            ledger = ledger_in_state_dict(state_dict)
            take = None if ledger is None else _take_loaded_ledger(self, ledger)  # may refuse before loading
            result = loader(self, state_dict, *args, **kwargs)
            if take is not None:
                take()
            return result

        load_state_dict._dpts_ledger_hook = True  # type: ignore[attr-defined]
        L.LightningModule.load_state_dict = load_state_dict  # type: ignore[method-assign]

    original = saving._load_state
    if getattr(original, "_dpts_ledger_hook", False):
        return

    @functools.wraps(original)
    def _load_state(cls: Any, checkpoint: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        obj = original(cls, checkpoint, *args, **kwargs)

        if isinstance(obj, L.LightningModule) and isinstance(checkpoint, dict):
            attach_ledger(obj, checkpoint)
        return obj

    _load_state._dpts_ledger_hook = True  # type: ignore[attr-defined]
    saving._load_state = _load_state

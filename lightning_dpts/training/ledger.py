"""The privacy ledger: every noisy optimizer step a model's weights ever took, travelling with the weights.

One :class:`PrivacyLedger` per model (PRIVACY-NOTES trap 7: "count every noisy step that ever touched the
private data"). :class:`~lightning_dpts.training.DPForecastStrategy` is the only writer - it is what takes the
noisy steps (Algorithm 2) - and :class:`~lightning_dpts.training.AccountantCallback` reads it. It is kept in
three places, so that every continuation composes with it:

* on the LightningModule object itself (attribute ``dpts_privacy_ledger``): a second ``Trainer`` on the same
  module, in the same process, continues the count;
* in every checkpoint, twice: in the strategy's callback state (``trainer.fit(..., ckpt_path=...)`` restores
  it with the weights, from any checkpoint, older ones included) and at the top level of the checkpoint dict
  under :data:`LEDGER_KEY`;
* ``Model.load_from_checkpoint(path)`` attaches the top-level copy to the loaded module (this module wraps
  Lightning's checkpoint loader when :mod:`lightning_dpts.training` is imported), so a new Trainer with new
  callbacks continues the count instead of starting at epsilon = 0. Weights copied by hand
  (``torch.load`` + ``load_state_dict``) carry no ledger: attach it with :func:`attach_ledger`.

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

#: Top-level key of the ledger in a checkpoint dict.
LEDGER_KEY = "dpts_privacy_ledger"
#: Attribute of the LightningModule that holds its ledger in memory.
LEDGER_ATTRIBUTE = "dpts_privacy_ledger"


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

    Checkpoints written before the ledger existed are read from the strategy's callback state (its ``steps``).
    Loading a path unpickles it (``torch.load(weights_only=False)``): only load checkpoints you trust.
    """
    if not isinstance(checkpoint, dict):
        import torch

        checkpoint = torch.load(str(checkpoint), map_location="cpu", weights_only=False)
    assert isinstance(checkpoint, dict)
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


def attach_ledger(module: Any, source: str | Path | dict[str, Any] | PrivacyLedger) -> PrivacyLedger | None:
    """Attach the ledger of ``source`` (a checkpoint path or dict, or a ledger) to ``module``; returns it."""
    ledger = source if isinstance(source, PrivacyLedger) else read_ledger(source)
    if ledger is not None:
        object.__setattr__(module, LEDGER_ATTRIBUTE, ledger)
    return ledger


def install_load_hook() -> None:
    """Make ``LightningModule.load_from_checkpoint`` attach the checkpoint's ledger to the loaded module.

    Lightning offers no hook that runs for every class on ``load_from_checkpoint`` (a module's own
    ``on_load_checkpoint`` is the user's code), so this wraps ``lightning.pytorch.core.saving._load_state``
    once; the wrapper calls the original unchanged and only adds the attribute. Idempotent.
    """
    from lightning.pytorch.core import saving

    original = saving._load_state
    if getattr(original, "_dpts_ledger_hook", False):
        return

    @functools.wraps(original)
    def _load_state(cls: Any, checkpoint: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        obj = original(cls, checkpoint, *args, **kwargs)
        import lightning as L

        if isinstance(obj, L.LightningModule) and isinstance(checkpoint, dict):
            attach_ledger(obj, checkpoint)
        return obj

    _load_state._dpts_ledger_hook = True  # type: ignore[attr-defined]
    saving._load_state = _load_state

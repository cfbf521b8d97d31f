"""The privacy ledger: every noisy optimizer step a model's weights ever took, travelling with the weights.

One :class:`PrivacyLedger` per model (docs/privacy.md, rule 7: "count every noisy step that ever touched the
private data"). :class:`~lightning_dpts.training.DPForecastStrategy` is the only writer - it is what takes the
noisy steps (Algorithm 2) - and :class:`~lightning_dpts.training.AccountantCallback` reads it.

**One rule: the ledger follows every parameter** (issue 38). Every module that owns parameters holds the ledger of
the weights it holds (attribute :data:`LEDGER_ATTRIBUTE`; during a fit all of them share the fit's ledger object),
and a model's ledger is the largest of them (:func:`ledger_of`). Saving and loading move it with the parameters:

* **saving**: ``state_dict()`` of any module of a model with a ledger writes it into the state dict's metadata
  (``state_dict._metadata[path][LEDGER_KEY]``) at every module that owns parameters and at the module it was called
  on. So every form that saves weights carries it: full and weights-only checkpoints, ``torch.save(module.
  state_dict())``, ``torch.save(module.model.state_dict())`` of a submodule (how GluonTS networks are usually
  saved), a serialized GluonTS predictor. It is metadata, not a key: the weights load with ``strict=True`` where
  lightning-dpts is not installed; a state dict rebuilt key by key (``{k: v for ...}``) drops it
  (:func:`attach_ledger` puts it back);
* **loading**: ``nn.Module.load_state_dict`` of any module (wrapped when torch or this package is imported,
  whichever comes second: :mod:`lightning_dpts`) hands a state dict that carries a ledger to
  :func:`load_with_ledgers`: every module whose parameters it loads takes the ledger saved for them (or for the
  nearest module above them in the state dict); modules it does not load keep theirs. A partial or non-strict load
  therefore never lowers the model's count below what its untouched layers took, a full load brings the loaded
  weights' own count, and during a DP fit the fit's count only goes up (the larger of the two is kept);
* **full checkpoints** also hold it in the strategy's callback state (``trainer.fit(..., ckpt_path=...)``) and at
  their top level under :data:`LEDGER_KEY` (:func:`read_ledger`; ``load_from_checkpoint`` of checkpoints written
  before the state-dict copy).

Two parts of one model trained by *separate* DP runs on the same data compose to more than the larger count; the
ledger cannot tell them from two checkpoints of one run (docs/privacy.md, "What the checks do not catch").

The ledger holds counts and the settings they were accounted with - never a seed, an entropy or a generator
state. Per-epoch accounting (``iteration``/``shuffling`` top levels) counts *epochs started*: a Trainer epoch
in which at least one noisy step was taken counts as one composition, so a resumed partial epoch is a new one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["LEDGER_ATTRIBUTE", "LEDGER_KEY", "PrivacyLedger", "attach_ledger", "ledger_of", "load_with_ledgers",
           "read_ledger"]

#: Key of the ledger at the top level of a checkpoint dict and in the state-dict metadata of a module.
LEDGER_KEY = "dpts_privacy_ledger"
#: Attribute of a module (every module that owns parameters, and the LightningModule) that holds its ledger.
LEDGER_ATTRIBUTE = "dpts_privacy_ledger"
#: Attribute of every module of a LightningModule under a DP fit that holds the fit's state guard
#: (:class:`~lightning_dpts.training.state_guard.StateGuard`; also after a refusal).
GUARD_ATTRIBUTE = "_dpts_state_guard"
#: The settings two ledgers must share to be one count (the accountant composes identical steps).
SETTINGS = ("noise_multiplier", "max_grad_norm", "sampling_spec", "noise", "bands")

_LIVE: set[int] = set()  # ids of the ledgers a running fit counts in (loading into them never lowers the count)


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
        selection: for a model released by private hyperparameter selection (:func:`lightning_dpts.tuning.tune`),
            the public record of the search (procedure, K candidates, the selected setting, the epsilon of the whole
            search, which ``budget`` then holds); ``None`` otherwise.
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
    selection: dict[str, Any] | None = None

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
            selection=data.get("selection"),
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


def _holders(module: Any) -> list[tuple[str, Any]]:
    """``(path, module)`` of ``module`` and every submodule that holds a ledger, in ``named_modules`` order."""
    named = module.named_modules() if hasattr(module, "named_modules") else [("", module)]
    return [(path, sub) for path, sub in named if isinstance(getattr(sub, "__dict__", {}).get(LEDGER_ATTRIBUTE),
                                                                  PrivacyLedger)]


def _owns_parameters(module: Any) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def merge(ledgers: Iterable[PrivacyLedger]) -> PrivacyLedger | None:
    """The ledger of weights whose parts carry ``ledgers``: the largest count (steps, then epochs), its settings and
    budget, ``seeded`` if any part is. The same object when every part holds one."""
    found = list(ledgers)
    if not found:
        return None
    if all(ledger is found[0] for ledger in found):
        return found[0]
    top = max(found, key=lambda ledger: (ledger.steps, ledger.epochs))
    out = PrivacyLedger(**{f.name: getattr(top, f.name) for f in dataclasses.fields(PrivacyLedger)})
    out.epochs = max(ledger.epochs for ledger in found)
    out.seeded = any(ledger.seeded for ledger in found)
    return out


def ledger_of(module: Any) -> PrivacyLedger | None:
    """The ledger of a module's weights: the largest of the ledgers its parameters' modules (and the module itself)
    hold, or ``None``. It is the fit's own ledger object while a DP fit runs, and after one."""
    return merge(sub.__dict__[LEDGER_ATTRIBUTE] for _, sub in _holders(module))


def conflicting_ledgers(module: Any) -> list[str]:
    """Modules of ``module`` whose non-empty ledgers were accounted with settings other than the largest one's
    (weights of runs with another sigma, C or sampling put together): such a model cannot be accounted as one run."""
    top = ledger_of(module)
    if top is None or top.empty:
        return []
    out = []
    for path, sub in _holders(module):
        ledger = sub.__dict__[LEDGER_ATTRIBUTE]
        if not ledger.empty and any(getattr(ledger, n) != getattr(top, n) for n in SETTINGS):
            out.append(f"'{path or type(module).__name__}' ({ledger.steps} steps, "
                       + ", ".join(f"{n}={getattr(ledger, n)!r}" for n in SETTINGS
                                   if getattr(ledger, n) != getattr(top, n)) + ")")
    return out


def ledgers_in_state_dict(state_dict: Any) -> dict[str, PrivacyLedger]:
    """Module path -> the ledger saved for it in a state dict's metadata (``{}`` if there is none)."""
    metadata = getattr(state_dict, "_metadata", None)
    if not isinstance(metadata, dict):
        return {}
    return {path: PrivacyLedger.from_dict(local[LEDGER_KEY]) for path, local in metadata.items()
            if isinstance(local, dict) and isinstance(local.get(LEDGER_KEY), dict)}


def ledger_in_state_dict(state_dict: Any, prefix: str = "") -> PrivacyLedger | None:
    """The ledger of the weights in a state dict (the largest of those saved in it), or ``None``. ``prefix``:
    only the modules under it."""
    path = prefix[:-1] if prefix.endswith(".") else prefix
    found = [ledger for at, ledger in ledgers_in_state_dict(state_dict).items()
             if not path or at == path or at.startswith(path + ".")]
    return merge(found)


def read_ledger(checkpoint: str | Path | dict[str, Any]) -> PrivacyLedger | None:
    """The ledger stored in a checkpoint or saved state dict (a path or an already loaded dict), or ``None``.

    Read from the weights' state-dict metadata (every checkpoint form, weights-only included, and a
    ``torch.save``-d ``state_dict()`` of the model or of a submodule), else from the top level of the checkpoint,
    else from the strategy's callback state (checkpoints written before the ledger existed: its ``steps``).
    Loading a path unpickles it (``torch.load(weights_only=False)``): only load checkpoints you trust.
    """
    if not isinstance(checkpoint, dict):
        import torch

        checkpoint = torch.load(str(checkpoint), map_location="cpu", weights_only=False)
    assert isinstance(checkpoint, dict)
    weights = checkpoint.get("state_dict")
    for candidate in (weights, checkpoint):
        ledger = ledger_in_state_dict(candidate) if isinstance(candidate, dict) else None
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


def attach_ledger(module: Any, source: str | Path | dict[str, Any] | PrivacyLedger) -> PrivacyLedger | None:
    """Attach the ledger of ``source`` (a checkpoint path or dict, a saved state dict, or a ledger) to ``module``
    and every module in it that owns parameters, replacing what they held; returns it.

    From then on every ``state_dict()`` of the module or of a submodule carries it (:func:`hook_state_dict`).
    """
    ledger = source if isinstance(source, PrivacyLedger) else read_ledger(source)
    if ledger is not None:
        for _, sub in module.named_modules():
            if sub is module or _owns_parameters(sub):
                object.__setattr__(sub, LEDGER_ATTRIBUTE, ledger)
                hook_state_dict(sub)
            elif LEDGER_ATTRIBUTE in sub.__dict__:
                object.__delattr__(sub, LEDGER_ATTRIBUTE)
    return ledger


def attach_checkpoint_ledger(module: Any, checkpoint: dict[str, Any]) -> None:
    """``load_from_checkpoint`` of a checkpoint whose weights carry no ledger in their metadata (written before the
    state-dict copy): attach the one at its top level or in the strategy's callback state, if any."""
    if ledger_in_state_dict(checkpoint.get("state_dict")) is None and hasattr(module, "named_modules"):
        ledger = read_ledger(checkpoint)
        if ledger is not None:
            _take(module, [(module, ledger, True)])


def begin_fit(module: Any, ledger: PrivacyLedger) -> None:
    """Attach the fit's ledger to ``module`` and mark it live: loads into the module during the fit keep the larger
    count (:func:`load_with_ledgers`)."""
    attach_ledger(module, ledger)
    _LIVE.add(id(ledger))


def end_fit(module: Any, ledger: PrivacyLedger) -> None:
    """Attach the fit's ledger again (to the original layers the strategy swapped back) and stop counting in it."""
    attach_ledger(module, ledger)
    _LIVE.discard(id(ledger))


def live(ledger: Any) -> bool:
    """Whether a running DP fit counts its steps in ``ledger``."""
    return isinstance(ledger, PrivacyLedger) and id(ledger) in _LIVE


def hook_state_dict(module: Any) -> None:
    """Give ``module`` the state-dict hook that checks its state and writes its ledger (once; idempotent)."""
    if not any(hook is _state_dict_hook for hook in module._state_dict_hooks.values()):
        module.register_state_dict_post_hook(_state_dict_hook)


class StateDictGuard:
    """What every ``state_dict()`` of a module with the hook runs first (:func:`_state_dict_hook`): ``check_saved``
    raises to refuse the module's own saved state. Implemented by
    :class:`~lightning_dpts.training.state_guard.StateGuard`; defined here so that this module does not import that
    one (which imports this one)."""

    def check_saved(self, module: Any) -> None:
        raise NotImplementedError


def _state_dict_hook(module: Any, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any]) -> None:
    """Every ``state_dict()`` of a hooked module: refuse its own state if a DP fit changed it, then add its ledger.

    The state check (:class:`~lightning_dpts.training.state_guard.StateGuard`, attached to every module during a DP
    fit and after a refusal) runs before anything can be written: torch builds the whole state dict, and Lightning
    the whole checkpoint dict, before a file is saved.
    """
    guard = module.__dict__.get(GUARD_ATTRIBUTE)
    if isinstance(guard, StateDictGuard):
        guard.check_saved(module)
    if isinstance(module.__dict__.get(LEDGER_ATTRIBUTE), PrivacyLedger):
        ledger = ledger_of(module)
        if ledger is not None:
            local_metadata[LEDGER_KEY] = ledger.to_dict()


def _take(module: Any, pairs: list[tuple[Any, PrivacyLedger, bool]]) -> None:
    """Give each module of ``pairs`` its loaded ledger: replaced where all of the module's parameters were loaded
    (``whole``), else (some of them, or a running fit's ledger) the larger count is kept."""
    for sub, loaded, whole in pairs:
        current = sub.__dict__.get(LEDGER_ATTRIBUTE)
        if isinstance(current, PrivacyLedger) and (live(current) or not whole):
            if not live(current):  # a part of the module keeps its own count: a ledger of its own from now on
                current = PrivacyLedger(**{f.name: getattr(current, f.name) for f in dataclasses.fields(current)})
                object.__setattr__(sub, LEDGER_ATTRIBUTE, current)
            current.steps = max(current.steps, loaded.steps)
            current.epochs = max(current.epochs, loaded.epochs)
            current.seeded = current.seeded or loaded.seeded
        else:
            object.__setattr__(sub, LEDGER_ATTRIBUTE, loaded)
            hook_state_dict(sub)


def load_with_ledgers(load: Callable[..., Any], module: Any, state_dict: Any, *args: Any, **kwargs: Any) -> Any:
    """``load(module, state_dict, ...)`` (torch's ``load_state_dict``) for a state dict that carries ledgers, then
    the ledger follows the parameters (module docstring): a module all of whose parameters are loaded takes the
    ledger saved for it or for the nearest module above it; one with only some of them loaded keeps the larger of
    that and its own; a module without parameters takes the ledger saved for it, if any; a module that holds a
    running fit's ledger keeps the larger count. Refuses, before loading, weights whose ledger cannot join a running
    fit's count (other sigma, C or sampling)."""
    saved = ledgers_in_state_dict(state_dict)
    keys = set(state_dict.keys())
    pairs: list[tuple[Any, PrivacyLedger, bool]] = []
    for path, sub in module.named_modules():
        prefix = f"{path}." if path else ""
        own = [prefix + name for name, _ in sub.named_parameters(recurse=False)]
        present = sum(key in keys for key in own)
        if not (present if own else path in saved):
            continue
        at = path
        while at not in saved and at:
            at = at.rpartition(".")[0]
        if at in saved:
            pairs.append((sub, saved[at], present == len(own)))
    for sub, loaded, _ in pairs:
        current = sub.__dict__.get(LEDGER_ATTRIBUTE)
        if live(current) and not loaded.empty and not current.empty:
            for name in SETTINGS:
                mine, theirs = getattr(current, name), getattr(loaded, name)
                if mine is not None and theirs is not None and mine != theirs:
                    raise ConfigurationError(
                        "state_dict", f"{name}={theirs!r}",
                        f"weights loaded during a DP fit carry a privacy ledger accounted with {name}={theirs!r}, but "
                        f"the fit's ledger has {name}={mine!r}: their steps cannot join this fit's count. Load weights "
                        "before the fit starts",
                    )
    result = load(module, state_dict, *args, **kwargs)
    _take(module, pairs)
    return result


def install_load_hook() -> None:
    """Make loading weights attach the ledger they carry (done on ``import lightning_dpts``; kept for callers of the
    earlier API). Idempotent."""
    import lightning_dpts

    lightning_dpts.install_load_hooks()

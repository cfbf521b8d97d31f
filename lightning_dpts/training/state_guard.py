"""State that changes during a DP fit is refused (docs/privacy.md, "State and checkpoints"; issue 38).

DP-SGD clips and noises *gradients*. Every other tensor a module or callback keeps is released with the model or
feeds later steps without noise: a buffer (``register_buffer``: running statistics, ``max(|x|)`` of the training
inputs), a torchmetrics state saved with the weights (``metric.persistent(True)``), a callback's state
(EarlyStopping's best score), a plain tensor attribute written in ``training_step`` or ``on_train_batch_end`` and
read by the next step, or one carried from one window's ``training_step`` call to the next under
``per_window="isolated"``. Computed from the private windows, such a tensor tells neighbouring datasets apart with
certainty (issue 38 measured 22.04 against 1.0e7 for a checkpointed metric state, and a cross-step sensitivity of
8.6-11.3 against 2C = 2). :class:`StateGuard` takes, at the start of a DP fit, every such tensor of the
LightningModule (all submodules) and of the watched callbacks, and refuses with a
:class:`~lightning_dpts.errors.ConfigurationError` naming the module or callback and the attribute any that
changes before the fit ends:

* at every optimizer step, before the step's update (:meth:`StateGuard.check_step`), and after every window's call
  of ``training_step`` in the isolated mode's loop: identities of every attribute, version counters of every
  tracked tensor, the number of attributes and buffers of every object, the length of list/dict attributes; an
  exact comparison with the fit-start copy only where something moved (an in-place write of the same value
  passes). No tensor is copied per step;
* in every ``state_dict()`` of any submodule (so before any checkpoint or ``torch.save`` of a submodule's weights
  exists): an exact comparison of what that module saves besides its parameters (buffers, ``get_extra_state``,
  persistent torchmetrics states), :meth:`StateGuard.check_saved`;
* when Lightning builds a checkpoint (the strategy's ``on_save_checkpoint``) and at the end of training (exact),
  which also catches writes that bypass version counters (``t.data.copy_``) and the last step's
  ``on_train_batch_end``.

Not watched: parameters (they are what DP training releases); attributes of ``nn.Module``, Lightning and Opacus
internals and of this package's per-window machinery; a torchmetrics metric's states that are not persistent (they
are not saved; what they log is private, like every Lightning log); callbacks of this package, callbacks that
declare ``dp_post_processing = True`` (their state is a function of the noisy weights and public settings only, a
promise the user makes; docs/training.md) and callbacks that ``monitor`` a metric the DP fit releases (epsilon).
Values that are not tensors (Python numbers, strings, objects) are not compared: a private value kept in a Python
float escapes the guard (docs/privacy.md lists it).

A module whose *saved* state changed stays *tainted*: its guard stays attached, so its ``state_dict`` and a later
DP fit are refused until that state holds its value from the start of the fit again.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.training.ledger import GUARD_ATTRIBUTE, LEDGER_ATTRIBUTE, StateDictGuard, hook_state_dict

__all__ = ["GUARD_ATTRIBUTE", "StateGuard", "guard_of", "post_processing"]

#: attribute names that the per-window machinery (Opacus' hooks) writes on the layers it hooks during a step
_MACHINERY = frozenset({"activations", "max_batch_len", "autograd_grad_sample_hooks", "grad_sample",
                        LEDGER_ATTRIBUTE})
_INTERNALS: frozenset[str] | None = None  # attributes of a bare nn.Module and LightningModule (filled on first use)


def _internals() -> frozenset[str]:
    global _INTERNALS
    if _INTERNALS is None:
        import lightning as L

        _INTERNALS = frozenset(vars(nn.Module())) | frozenset(vars(L.LightningModule())) | _MACHINERY
    return _INTERNALS


def _bookkeeping(callback: Any) -> bool:
    """Lightning's own bookkeeping callbacks (exactly these classes, not subclasses): progress bars, summaries, the
    learning-rate monitor, the timer and ``ModelCheckpoint`` without a ``monitor``. They keep paths, times and
    counters, never a tensor computed from the data; not watching them keeps the per-step check small."""
    from lightning.pytorch import callbacks as lc

    kinds = (lc.TQDMProgressBar, lc.RichProgressBar, lc.ModelSummary, lc.RichModelSummary, lc.LearningRateMonitor,
             lc.Timer, lc.ModelCheckpoint)
    return type(callback) in kinds and getattr(callback, "monitor", None) is None


def post_processing(callback: Any) -> bool:
    """Whether ``callback`` declares ``dp_post_processing = True``: its checkpointed state is a function of the
    model's parameters (the noisy iterates) and public settings only (docs/training.md)."""
    return getattr(type(callback), "dp_post_processing", False) is True


def _tensorish(value: Any, depth: int = 2, weights: frozenset[int] = frozenset()) -> bool:
    """A tensor that is not a parameter or a view of one (DP training releases those; ``weights``: the parameters'
    storage addresses), or a list/tuple/dict holding one (two levels deep)."""
    if isinstance(value, torch.Tensor):
        return not _weight(value, weights)
    if depth == 0:
        return False
    if isinstance(value, (list, tuple)):
        return any(_tensorish(v, depth - 1, weights) for v in value)
    if isinstance(value, dict):
        return any(_tensorish(v, depth - 1, weights) for v in value.values())
    return False


def _weight(tensor: torch.Tensor, weights: frozenset[int]) -> bool:
    """A parameter, or a tensor on a parameter's storage (``p.detach()``, a ``state_dict()`` entry)."""
    if isinstance(tensor, nn.Parameter):
        return True
    try:
        return tensor.untyped_storage().data_ptr() in weights
    except RuntimeError:  # no storage (a tensor that escaped from a vmap, a tensor subclass): state
        return False


def _is_metric(obj: Any) -> bool:
    defaults, persistent = getattr(obj, "_defaults", None), getattr(obj, "_persistent", None)
    return isinstance(obj, nn.Module) and isinstance(defaults, dict) and isinstance(persistent, dict)


def _copy(value: Any) -> Any:
    """A detached copy (tensors cloned) of a value taken at the fit's start, for exact comparisons."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value) if isinstance(value, list) else tuple(_copy(v) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - an object that cannot be copied is compared by identity
        return value


def _same(a: Any, b: Any) -> bool:
    """Exactly equal: tensors of the same shape, dtype and device with equal values (NaN equal to NaN), containers
    element by element, anything else by ``==`` (or identity where ``==`` fails). A tensor that cannot be read
    (one that escaped from a ``vmap``) is not the same."""
    try:
        return _equal(a, b)
    except RuntimeError:
        return False


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
            return False
        if torch.equal(a, b):
            return True
        if not (a.is_floating_point() or a.is_complex()):
            return False
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        return torch.equal(nan_a, nan_b) and torch.equal(a[~nan_a], b[~nan_b])
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001
        return a is b


def saved_state(module: nn.Module) -> dict[str, Any]:
    """What ``module`` itself (not its submodules) puts into a state dict besides its parameters: its persistent
    buffers, its ``get_extra_state()`` and, for a torchmetrics metric, its persistent states."""
    out: dict[str, Any] = {name: buf for name, buf in module._buffers.items()
                           if buf is not None and name not in module._non_persistent_buffers_set}
    if type(module).get_extra_state is not nn.Module.get_extra_state:
        out["_extra_state"] = module.get_extra_state()
    if _is_metric(module):
        out.update({name: getattr(module, name) for name, keep in module._persistent.items() if keep})
    return out


@dataclass(eq=False)
class _Object:
    """One watched module or callback: its name, the object and which of its attributes are watched; ``last``: the
    watched attributes' and buffers' values at the last check (identities)."""

    name: str
    obj: Any
    kind: str  # "module" or "callback"
    metric: bool
    last: dict[tuple[str, bool], Any] = field(default_factory=dict)  # (key, is a buffer) -> value

    def watches(self, key: str) -> bool:
        if self.metric:
            return bool(self.obj._persistent.get(key, False))
        if key.startswith("_dpts"):
            return False
        return self.kind == "callback" or key not in _internals()

    def state(self) -> dict[tuple[str, bool], Any]:
        """The watched attributes and the buffers, now."""
        out = {(key, False): value for key, value in vars(self.obj).items() if self.watches(key)}
        if self.kind == "module":
            out.update({(key, True): buf for key, buf in self.obj._buffers.items() if buf is not None})
        return out

    def what(self, key: str, buffer: bool) -> str:
        if buffer:
            return f"buffer '{self.name}.{key}'" if self.name else f"buffer '{key}'"
        if self.kind == "callback":
            return f"callback {self.name} attribute '{key}'"
        if self.metric:
            return f"metric state '{self.name}.{key}' ({type(self.obj).__name__}, persistent: saved in checkpoints)"
        return f"attribute '{self.name}.{key}'" if self.name else f"attribute '{key}'"


@dataclass
class _Tensor:
    """One tracked tensor (a buffer, a tensor attribute or a tensor in a list/dict attribute), its version at the last
    check and its value at the fit's start."""

    owner: _Object
    key: str  # the attribute or buffer
    buffer: bool
    tensor: torch.Tensor
    version: int
    value: torch.Tensor


class StateGuard(StateDictGuard):
    """The state of a module (every submodule) and of watched callbacks at the start of a DP fit; any tensor of it
    that changes during the fit is refused (module docstring).

    Args:
        module: the LightningModule being trained (after the strategy's layer swaps and any restored checkpoint).
        callbacks: the Trainer's callbacks; those of this package, ``dp_post_processing`` ones and those in
            ``exempt`` are not watched.
        exempt: callbacks not to watch (e.g. those that monitor a metric the fit releases with DP).
    """

    def __init__(self, module: nn.Module, callbacks: Iterable[Any] = (), exempt: Iterable[Any] = ()) -> None:
        self.module_name = type(module).__name__
        self._weights = frozenset(p.untyped_storage().data_ptr() for p in module.parameters())
        skip = {id(c) for c in exempt}
        self._objects: list[_Object] = [_Object(path, sub, "module", _is_metric(sub))
                                        for path, sub in module.named_modules()]
        for cb in callbacks:
            if (id(cb) in skip or post_processing(cb) or _bookkeeping(cb)
                    or type(cb).__module__.split(".")[0] == "lightning_dpts"):
                continue
            self._objects.append(_Object(type(cb).__name__, cb, "callback", False))
        #: (object id, key, is a buffer) -> a copy of the value at the fit's start, for values that hold tensors
        self._starts: dict[tuple[int, str, bool], Any] = {}
        self._saved: dict[int, dict[str, Any]] = {}  # module id -> copies of saved_state(module) at the start
        for o in self._objects:
            if o.kind == "module":
                self._saved[id(o.obj)] = {k: _copy(v) for k, v in saved_state(o.obj).items()}
            for (key, buffer), value in o.state().items():
                if self._tensorish(value):
                    self._starts[(id(o), key, buffer)] = _copy(value)
        self.indexed = 0  # objects (re)indexed for the per-step check: all at the start, then only those that moved
        #: (object id, key, is a buffer) -> (a list attribute, a copy of it) last found to hold plain values only
        self._plain_lists: dict[tuple[int, str, bool], tuple[list, list]] = {}
        self.plain_scanned = 0  # elements of such lists type-checked (new ones only, see _plain_list)
        self._index()

    def _tensorish(self, value: Any) -> bool:
        return _tensorish(value, weights=self._weights)

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        """A copy of a guarded module (``copy.deepcopy(module)`` by a callback during the fit) is not guarded: it is
        not the model being trained, and the guard holds the callbacks (and through them the Trainer)."""
        return None

    def __reduce__(self) -> tuple[Any, tuple]:
        """Pickling a guarded module (``torch.save(module)``) stores no guard (as for a copy)."""
        return (_no_guard, ())

    # -- the per-step index --------------------------------------------------------------------------------------
    def _index(self, moved: Iterable[_Object] | None = None) -> None:
        """Flat lists for :meth:`check_step`: every watched attribute and buffer with its current value, the sizes
        of every attribute dict, buffer dict and list/dict attribute, and every tracked tensor with its version.
        ``moved``: rebuild only these objects' parts (the others' entries still hold their current values, and their
        tensors' versions were brought up to date by the check), e.g. a callback that appends to a list every step;
        ``None``: everything. Counted in :attr:`indexed` (objects indexed since the start)."""
        if moved is None:
            objects = self._objects
            self._entries: list[tuple[Any, str, Any, _Object]] = []  # (the holder's bound get, key, value, owner)
            self._sizes: list[tuple[Any, int, _Object]] = []
            # (list or dict, its keys (dict) or None, its elements or values, owner): every element by identity
            self._contents: list[tuple[Any, list | None, list, _Object]] = []
            self._tensors: list[_Tensor] = []
        else:
            objects = list(moved)
            gone = {id(o) for o in objects}
            self._entries = [e for e in self._entries if id(e[3]) not in gone]
            self._sizes = [e for e in self._sizes if id(e[2]) not in gone]
            self._contents = [e for e in self._contents if id(e[3]) not in gone]
            self._tensors = [t for t in self._tensors if id(t.owner) not in gone]
        self.indexed += len(objects)
        for o in objects:
            o.last = o.state()
            d = vars(o.obj)
            self._sizes.append((d, len(d), o))
            if o.kind == "module":
                self._sizes.append((o.obj._buffers, len(o.obj._buffers), o))
            for (key, buffer), value in o.last.items():
                self._entries.append(((o.obj._buffers if buffer else d).get, key, value, o))
                if isinstance(value, (list, tuple, dict)):
                    self._sizes.append((value, len(value), o))
                    if isinstance(value, dict):
                        self._contents.append((value, list(value), list(value.values()), o))
                    elif isinstance(value, list):  # a plain value replaced in place by a tensor moves the owner
                        self._contents.append((value, None, list(value), o))
                    for v in value.values() if isinstance(value, dict) else value:
                        if isinstance(v, torch.Tensor):  # an element that is state (its replacement: _contents)
                            self._track(o, key, buffer, v)
                else:
                    self._track(o, key, buffer, value)

    def _track(self, o: _Object, key: str, buffer: bool, value: Any) -> None:
        if isinstance(value, torch.Tensor) and not _weight(value, self._weights):
            start = self._starts.get((id(o), key, buffer))
            copy_ = start if isinstance(start, torch.Tensor) else value.detach().clone()
            self._tensors.append(_Tensor(o, key, buffer, value, value._version, copy_))

    # -- attaching ---------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, module: nn.Module, callbacks: Iterable[Any] = (), exempt: Iterable[Any] = ()) -> StateGuard:
        """Refuse a module left tainted by an earlier fit, then guard ``module`` (and ``callbacks``) for this fit:
        every submodule's ``state_dict()`` checks what it saves from now on."""
        earlier = guard_of(module)
        if earlier is not None:
            earlier.check_saved_all()
        guard = cls(module, callbacks, exempt)
        for sub in module.modules():
            object.__setattr__(sub, GUARD_ATTRIBUTE, guard)
            hook_state_dict(sub)
        return guard

    def release(self, module: nn.Module) -> None:
        """Detach the guard at the end of a fit, unless a module's saved state changed (then it stays tainted)."""
        if guard_of(module) is self and not self.changed():
            for sub in module.modules():
                if sub.__dict__.get(GUARD_ATTRIBUTE) is self:
                    object.__delattr__(sub, GUARD_ATTRIBUTE)

    # -- checks ------------------------------------------------------------------------------------------------
    def check_step(self) -> None:
        """The per-step check: identities, sizes and version counters; an exact comparison only where one moved."""
        moved: list[_Object] = []
        entries = self._entries
        for i, (get, key, value, o) in enumerate(entries):
            now = get(key, _MISSING)
            if now is not value:
                if type(now) in _PLAIN and type(value) in _PLAIN:
                    # a plain Python value replaced another (a timer's float, a counter): it holds no tensor, so
                    # there is nothing to compare (as in _examine); track it without rebuilding the index
                    entries[i] = (get, key, now, o)
                else:
                    moved.append(o)
        for holder, size, o in self._sizes:
            if len(holder) != size:
                moved.append(o)
        for holder, keys, values, o in self._contents:  # (a size change is one of _sizes)
            if keys is None:
                if not all(map(operator.is_, holder, values)):
                    moved.append(o)
            elif not (all(map(operator.is_, holder, keys)) and all(map(operator.is_, holder.values(), values))):
                moved.append(o)
        for t in self._tensors:
            if t.tensor._version != t.version:
                if not _same(t.tensor, t.value):
                    self._refuse(t.owner, t.key, t.buffer)
                t.version = t.tensor._version  # the same value written in place
        if moved:
            changed = list(dict.fromkeys(moved))
            for o in changed:
                self._examine(o)
            self._index(changed)

    def check(self) -> None:
        """Everything, exactly: the per-step check, every tracked tensor against its start (also writes that bypass
        version counters) and every module's saved state."""
        self.check_step()
        for t in self._tensors:
            if not _same(t.tensor, t.value):
                self._refuse(t.owner, t.key, t.buffer)
        self.check_saved_all()

    def _examine(self, o: _Object) -> None:
        """Something of ``o`` moved: every watched value that holds a tensor and is not the object last seen (or is
        a list/dict) must equal its value at the fit's start; values without tensors are not compared."""
        for (key, buffer), value in o.state().items():
            if o.last.get((key, buffer), _MISSING) is value and not isinstance(value, (list, tuple, dict)):
                continue
            if type(value) is list and self._plain_list(o, key, buffer, value):
                continue
            if not self._tensorish(value):
                continue
            start = self._starts.get((id(o), key, buffer))
            if start is None or not _same(value, start):
                self._refuse(o, key, buffer, added=buffer and (key, True) not in o.last)

    def _plain_list(self, o: _Object, key: str, buffer: bool, value: list) -> bool:
        """Whether the list ``value`` holds plain Python values only (no tensor, nothing that may hold one), checking
        only what is new since it was last found so: its earlier elements must be the very objects seen then (one
        identity test each, in C), the rest plain. A list a callback appends to at every step (a step timer) then
        costs its new elements, not a scan of all of them per step. Counted in :attr:`plain_scanned`."""
        seen = self._plain_lists.get((id(o), key, buffer))
        start = 0
        if seen is not None and seen[0] is value and len(value) >= len(seen[1]) and all(
                map(operator.is_, value, seen[1])):
            start = len(seen[1])
        self.plain_scanned += len(value) - start
        if not all(type(v) in _PLAIN for v in value[start:]):
            self._plain_lists.pop((id(o), key, buffer), None)
            return False
        self._plain_lists[(id(o), key, buffer)] = (value, list(value))
        return True

    def check_saved(self, module: nn.Module) -> None:
        """What ``module`` itself saves besides its parameters must equal its value at the fit's start (exact);
        called by every ``state_dict()`` of the module (:func:`~lightning_dpts.training.ledger.hook_state_dict`)."""
        start = self._saved.get(id(module))
        if start is None:
            return
        for key, value in saved_state(module).items():
            if key not in start or not _same(value, start[key]):
                o = next(o for o in self._objects if o.obj is module)
                self._refuse(o, key, key in module._buffers, added=key not in start)

    def check_saved_all(self) -> None:
        for o in self._objects:
            if o.kind == "module":
                self.check_saved(o.obj)

    def changed(self) -> list[str]:
        """The saved state (buffers, extra state, persistent metric states) that differs from the fit's start."""
        names = []
        for o in self._objects:
            if o.kind != "module":
                continue
            start = self._saved[id(o.obj)]
            names += [f"{o.name}.{k}" if o.name else k for k, v in saved_state(o.obj).items()
                      if k not in start or not _same(v, start[k])]
        return names

    def _refuse(self, o: _Object, key: str, buffer: bool, added: bool = False) -> NoReturn:
        what = o.what(key, buffer) + (" (registered during the fit)" if added else "")
        where = "callbacks" if o.kind == "callback" else "model"
        subject = what if o.kind == "callback" else f"{self.module_name} {what}"
        if o.kind == "module" and not o.metric and o.name:
            subject += f" ({type(o.obj).__name__})"
        raise ConfigurationError(
            where, subject,
            "changed during DP training. DP-SGD clips and noises gradients only: a tensor that a module or callback "
            "keeps (a buffer, a metric state saved with the weights, a callback's best score, a plain tensor "
            "attribute written in training_step or on_train_batch_end) is computed from the private windows "
            "without noise; it is released raw in checkpoints or carried into the next step's (or window's) "
            "gradient, and can tell neighbouring datasets apart (docs/privacy.md, 'State and checkpoints'). "
            "Nothing that holds it was written: state_dict() and checkpoints refuse it too. Log such values with "
            "self.log (logs are private), compute them before the fit from public data, or make them parameters; "
            "a callback whose state depends only on the weights may declare dp_post_processing = True "
            "(docs/training.md); state that stays constant during the fit is allowed",
        )


_MISSING = object()
#: Values that never hold a tensor: one replacing another needs no re-examination (:meth:`StateGuard.check_step`).
_PLAIN = frozenset({int, float, bool, str, bytes, type(None)})


def _no_guard() -> None:
    return None


def guard_of(module: Any) -> StateGuard | None:
    """The :class:`StateGuard` attached to a module, or ``None``."""
    guard = getattr(module, GUARD_ATTRIBUTE, None)
    return guard if isinstance(guard, StateGuard) else None

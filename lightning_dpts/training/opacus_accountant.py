"""An Opacus accountant for structured subsampling: ``PrivacyEngine(accountant="structured")``.

Opacus accounts every optimizer step from ``step(noise_multiplier=..., sample_rate=...)``: an unstructured
Poisson-sampled Gaussian. Bi-level structured subsampling (series, then windows; Schuchardt et al., ICML 2025) is not
described by one sample rate, so **the accountant must be told the sampling spec**
(:class:`~lightning_dpts.privacy.SamplingSpec`: number of series, shortest length, window lengths with every lag,
batch size, windows per series, sampling levels, unit of privacy; ``datamodule.sampling_spec`` gives it):

* ``register_structured_accountant(spec)`` registers, under ``"structured"`` in Opacus' registry
  (``opacus.accountants.register_accountant``), an accountant class bound to ``spec``; then
  ``PrivacyEngine(accountant="structured")``, ``make_private_with_epsilon`` (Opacus' ``get_noise_multiplier``
  creates accountants by name) and ``privacy_engine.get_epsilon(delta)`` account the structure; or
* ``StructuredOpacusAccountant(spec)`` in a plain loop that calls ``accountant.step(noise_multiplier=sigma,
  sample_rate=spec.top_level_rate)`` after every noisy optimizer step (or attaches
  ``accountant.get_optimizer_hook_fn(spec.top_level_rate)`` to Opacus' ``DPOptimizer``).

Importing this module registers ``"structured"`` without a spec (``set_spec`` must then be called before
``get_epsilon``). ``get_epsilon(delta)`` is :meth:`StructuredSubsamplingAccountant.epsilon` of the steps taken;
``risk(delta)`` gives the membership-attack read-outs. What the accountant cannot see, the user must ensure: the
batches come from the spec's sampling with secret randomness (e.g. ``StructuredSubsamplingDataModule``'s loader,
*not* Opacus' Poisson ``DPDataLoader``: pass ``poisson_sampling=False`` to ``make_private``), each batch element is
one window whose gradient Opacus clips to ``max_grad_norm``, and the model treats windows independently.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from opacus.accountants import IAccountant, register_accountant

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import StructuredSubsamplingAccountant
from lightning_dpts.privacy.risk import RiskReadout
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["MECHANISM", "StructuredOpacusAccountant", "register_structured_accountant"]

#: The name the accountant is registered under in Opacus.
MECHANISM = "structured"
#: Relative tolerance of the check of Opacus' sample rate against the spec.
_RATE_RTOL = 1e-6


class StructuredOpacusAccountant(IAccountant):
    """Opacus ``IAccountant`` for DP-SGD with bi-level structured subsampling (one noise multiplier per run).

    Args:
        spec: the sampling spec (``datamodule.sampling_spec``); ``None``: the spec this class was bound to by
            :func:`register_structured_accountant`, else :meth:`set_spec` must be called before :meth:`get_epsilon`.

    ``history`` holds ``(noise_multiplier, sample_rate, steps)`` as Opacus' PRV accountant does. Every step's sample
    rate must be the spec's top-level rate N'/N or 1 / steps_per_epoch (what Opacus' ``make_private`` passes for a
    loader of the spec's epoch length); anything else means the spec does not describe the batches (another batch
    size, gradient accumulation) and :meth:`get_epsilon` refuses it.
    """

    #: The spec of :func:`register_structured_accountant` (``None`` for this base class).
    bound_spec: ClassVar[SamplingSpec | None] = None
    #: The Opacus registry name of the class.
    mechanism_name: ClassVar[str] = MECHANISM

    def __init__(self, spec: SamplingSpec | None = None) -> None:
        super().__init__()
        self.spec: SamplingSpec | None = None
        self._accountant: StructuredSubsamplingAccountant | None = None
        self.set_spec(spec if spec is not None else type(self).bound_spec)

    def set_spec(self, spec: SamplingSpec | None) -> None:
        """Tell the accountant the sampling of the batches (what Opacus' ``step`` does not carry)."""
        if spec is not None and not isinstance(spec, SamplingSpec):
            raise ConfigurationError("spec", spec, "must be a lightning_dpts.privacy.SamplingSpec")
        if self.spec is not None and spec != self.spec and len(self) > 0:
            raise ConfigurationError("spec", spec, f"steps were already accounted for {self.spec!r}; use a new "
                                     "accountant for another sampling")
        self.spec = spec
        self._accountant = None

    @classmethod
    def mechanism(cls) -> str:
        return cls.mechanism_name

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """Record one noisy optimizer step (as Opacus' hook does after ``optimizer.step()``)."""
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            sigma, rate, steps = self.history[-1]
            self.history[-1] = (sigma, rate, steps + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def __len__(self) -> int:
        """Noisy optimizer steps recorded."""
        return sum(int(steps) for _, _, steps in self.history)

    def _checked(self) -> tuple[StructuredSubsamplingAccountant | None, int]:
        """(the package's accountant for this history, steps); ``None`` with no step."""
        spec = self.spec
        if spec is None:
            raise ConfigurationError(
                "spec", None, "StructuredOpacusAccountant needs the sampling spec: Opacus' step(noise_multiplier, "
                "sample_rate) does not carry the structure (series, windows, lags, unit of privacy); call "
                "accountant.set_spec(datamodule.sampling_spec), or register_structured_accountant(spec) before "
                "creating the PrivacyEngine")
        steps = len(self)
        if steps == 0:
            return None, 0
        sigmas = {float(s) for s, _, _ in self.history}
        if len(sigmas) != 1:
            raise ConfigurationError("noise_multiplier", sorted(sigmas), "must be one value for the whole run (the "
                                     "structured accountant composes one per-step mechanism)")
        allowed = (spec.top_level_rate, 1.0 / spec.steps_per_epoch if spec.steps_per_epoch else math.inf)
        for _, rate, _ in self.history:
            if not any(math.isclose(float(rate), a, rel_tol=_RATE_RTOL) for a in allowed):
                raise ConfigurationError(
                    "sample_rate", rate, f"does not match the spec (top-level rate N'/N = {allowed[0]:.6g}, or 1 / "
                    f"steps_per_epoch = {allowed[1]:.6g}): the batches are not the spec's (another batch size, "
                    "gradient accumulation, Opacus' Poisson loader?)")
        sigma = sigmas.pop()
        acc = self._accountant
        if acc is None or acc.noise_multiplier != sigma:
            acc = self._accountant = StructuredSubsamplingAccountant(spec, sigma)
        return acc, steps

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """epsilon spent so far at ``delta`` (:meth:`StructuredSubsamplingAccountant.epsilon`; ``inf`` where sigma is
        too small to certify any epsilon, so that Opacus' noise calibration raises sigma)."""
        acc, steps = self._checked()
        if acc is None:
            return 0.0
        try:
            return acc.epsilon(steps, delta)
        except ConfigurationError as err:
            if err.parameter == "noise_multiplier":  # too little noise to compose in bounded memory
                return math.inf
            raise

    def risk(self, delta: float) -> RiskReadout:
        """TPR at FPR 1e-3/1e-2 and the mu-GDP equivalent of the steps so far (:mod:`lightning_dpts.privacy.risk`)."""
        acc, steps = self._checked()
        if acc is None:
            from lightning_dpts.privacy.risk import no_risk

            return no_risk(delta)
        return acc.risk(steps, delta)

    def state_dict(self, destination: Any = None) -> Any:
        out = super().state_dict(destination)
        out["spec"] = repr(self.spec)
        return out

    def load_state_dict(self, state_dict: Any) -> None:
        saved = state_dict.get("spec") if state_dict else None
        if saved is not None and self.spec is not None and not self.spec.matches_repr(saved):
            raise ConfigurationError("spec", self.spec, f"differs from the saved accountant's {saved}")
        super().load_state_dict(state_dict)


def register_structured_accountant(spec: SamplingSpec,
                                   name: str = MECHANISM) -> type[StructuredOpacusAccountant]:
    """Register under ``name`` in Opacus an accountant class bound to ``spec`` (replacing what was registered there):
    ``PrivacyEngine(accountant=name)`` then accounts structured subsampling with ``spec``."""
    if not isinstance(spec, SamplingSpec):
        raise ConfigurationError("spec", spec, "must be a lightning_dpts.privacy.SamplingSpec")
    if not isinstance(name, str) or not name or (name in ("rdp", "gdp", "prv")):
        raise ConfigurationError("name", name, "must be a new name (not one of Opacus' rdp, gdp, prv)")
    bound = type("BoundStructuredOpacusAccountant", (StructuredOpacusAccountant,),
                 {"bound_spec": spec, "mechanism_name": name, "__doc__": f"StructuredOpacusAccountant for {spec!r}."})
    register_accountant(name, bound, force=True)
    return bound


try:
    register_accountant(MECHANISM, StructuredOpacusAccountant)
except ValueError:  # already registered (e.g. by register_structured_accountant before a re-import): keep it
    pass

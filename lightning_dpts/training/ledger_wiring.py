"""Ledger wiring of :class:`~lightning_dpts.training.DPForecastStrategy`: which privacy ledger a fit continues, and
what the strategy writes into and reads from checkpoints.

:class:`FitLedger` (an object the strategy owns): :meth:`FitLedger.begin` starts a fit's
:class:`~lightning_dpts.training.ledger.PrivacyLedger` (the checkpoint's, else the one attached to the module, else
empty), refuses continuations the accounting does not cover, and draws the fit's fresh
:class:`~lightning_dpts.randomness.Entropy` (no replay); its ``state_dict``/``load_state_dict`` carry sigma, C and
the ledger, never anything that reproduces noise (:mod:`lightning_dpts.training.ledger`).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import NOISE_SPECS, NoiseSpec
from lightning_dpts.randomness import SEEDED_NOTICE, Entropy, resolve_entropy
from lightning_dpts.training.guards import (
    check_global_sample,
    check_same_on_all_ranks,
    has_accountant,
    spec_or_none,
)
from lightning_dpts.training.ledger import (
    PrivacyLedger,
    begin_fit,
    conflicting_ledgers,
    end_fit,
    ledger_of,
    merge,
)

__all__ = ["FitLedger", "PrivacyBudgetExhausted"]


class PrivacyBudgetExhausted(RuntimeError):
    """Raised instead of taking an optimizer step the privacy budget does not cover (a safety net)."""


class FitLedger:
    """The privacy ledger of a fit and the checkpoint state, owned by
    :class:`~lightning_dpts.training.DPForecastStrategy`.

    Its own state: the model's :attr:`ledger`, the accounted-step cap an
    :class:`~lightning_dpts.training.AccountantCallback` sets (:attr:`step_cap`), the ledger of a checkpoint this
    fit restores (until the fit begins) and the module's ledger at setup, before the layer swaps.
    """

    def __init__(self) -> None:
        self.ledger = PrivacyLedger()
        self.step_cap: int | None = None  # accounted-step cap set by AccountantCallback
        self.restored: PrivacyLedger | None = None
        self.before_swaps: PrivacyLedger | None = None  # the module's ledger at setup, before the layer swaps

    def begin(self, trainer: L.Trainer, pl_module: L.LightningModule, *, sigma: float, max_grad_norm: float,
              noise_spec: NoiseSpec, bands: int, seed: int | None, rank: int, world_size: int
              ) -> tuple[PrivacyLedger, Entropy]:
        """Start this fit's ledger: it continues the one of the checkpoint this fit resumed from, else the one
        attached to the module, else starts empty; continuations the accounting does not cover are refused. Returns
        the ledger and the fit's fresh :class:`~lightning_dpts.randomness.Entropy` (no replay)."""
        spec = spec_or_none(trainer)
        if self.restored is not None:
            ledger = self.restored
        else:
            mixed = conflicting_ledgers(pl_module)
            if mixed:
                raise ConfigurationError(
                    "model", ", ".join(mixed),
                    "carry privacy ledgers accounted with other settings than the rest of the model (weights of DP "
                    "runs with another sigma, C, sampling or noise put together): the accountant composes identical "
                    "steps only. Train the parts with one configuration, or start from freshly initialised weights",
                )
            # the layers the strategy swapped at setup hold their ledger on the originals (kept aside until the end)
            attached = merge(x for x in (ledger_of(pl_module), self.before_swaps) if x is not None)
            ledger = PrivacyLedger(**vars(attached)) if attached is not None else PrivacyLedger()
        self.restored = None
        self.step_cap = None  # a reused strategy forgets its previous fit's cap (AccountantCallback sets this fit's)
        if world_size > 1:  # before any check that could then fail on some ranks only
            check_same_on_all_ranks(trainer, ledger.to_dict())
            check_global_sample(trainer, rank, world_size)
        if ledger.epochs < 0:  # an older checkpoint without an epoch count: every started epoch, at least
            spe = spec.steps_per_epoch if spec is not None else 1
            ledger.epochs = -(-ledger.steps // spe)
        ledger_noise = NOISE_SPECS.get(ledger.noise)
        if not ledger.empty and (noise_spec.correlated or (ledger_noise is not None and ledger_noise.correlated)):
            raise ConfigurationError(
                "noise", noise_spec.name,
                f"the model's privacy ledger already holds {ledger.steps} noisy steps and a BandMF run cannot be "
                "resumed or continued: its noise band (the last b - 1 noise vectors) and the b-min-sep sampler's "
                "history are secret and never stored, so a continuation would restart both, a mechanism the Monte "
                "Carlo accounting of the planned run does not cover. Plan the whole run in one fit "
                "(Trainer max_steps), or start from freshly initialised weights",
            )
        ledger.check_continuation(sigma, max_grad_norm, spec)
        if not ledger.empty and not has_accountant(trainer):
            raise ConfigurationError(
                "callbacks", "no AccountantCallback",
                f"the model's privacy ledger already holds {ledger.steps} noisy steps"
                + (f" (budget epsilon={ledger.budget[0]:g}, delta={ledger.budget[1]:g})" if ledger.budget else "")
                + "; add an AccountantCallback with your total budget to continue training it, so that the "
                "continuation is accounted and stopped within the budget",
            )
        ledger.noise_multiplier = sigma
        ledger.max_grad_norm = max_grad_norm
        ledger.noise = noise_spec.name
        ledger.bands = bands
        if spec is not None:
            ledger.sampling_spec = repr(spec)
        self.ledger = ledger
        begin_fit(pl_module, ledger)  # every module that owns parameters holds it; loads during the fit never lower it
        entropy = resolve_entropy(seed, "seed")
        if entropy.seeded:
            ledger.seeded = True
            rank_zero_warn(f"DPForecastStrategy: {SEEDED_NOTICE}")
        if getattr(getattr(trainer, "datamodule", None), "seeded", False) is True:
            ledger.seeded = True  # seeded batch sampling: the checkpoint metadata must say so too
        return ledger, entropy

    def next_step(self, steps: int, epochs: int, spec: Any) -> PrivacyLedger:
        """The counts once the next noisy step is taken, checked against :attr:`step_cap` (raises
        :class:`PrivacyBudgetExhausted` before the step when the budget does not cover it)."""
        after = PrivacyLedger(steps=steps, epochs=epochs)
        if self.step_cap is not None and spec is not None and after.accounted_steps(spec) > self.step_cap:
            raise PrivacyBudgetExhausted(
                f"noisy step {after.steps} would bring the accounted steps to {after.accounted_steps(spec)}, beyond "
                f"the {self.step_cap} the privacy budget allows"
            )
        return after

    def count(self, after: PrivacyLedger) -> None:
        """A noisy step was taken: the ledger counts ``after``'s steps and epochs."""
        self.ledger.steps = after.steps
        self.ledger.epochs = after.epochs

    def remember(self, pl_module: L.LightningModule) -> None:
        """At ``setup``, before the layer swaps: the model's ledger (a swapped layer's new module holds none)."""
        self.before_swaps = ledger_of(pl_module)

    def end(self, pl_module: L.LightningModule) -> None:
        """At the end of a fit (after the layer swaps are undone): the module's layers, the original ones again,
        hold the fit's ledger, which no fit counts in any more."""
        end_fit(pl_module, self.ledger)

    def state_dict(self, noise_multiplier: float | None, max_grad_norm: float, seeded: bool) -> dict[str, Any]:
        """Sigma, C and the privacy ledger (with the noise kind and bands) - never a seed, a generator state or a
        BandMF band (nothing that reproduces noise). A seeded run adds ``"seeded": True`` and
        :data:`~lightning_dpts.randomness.SEEDED_NOTICE`."""
        state: dict[str, Any] = {
            "noise_multiplier": noise_multiplier,
            "max_grad_norm": max_grad_norm,
            "ledger": self.ledger.to_dict(),
            "seeded": self.ledger.seeded or seeded,
        }
        if state["seeded"]:
            state["seeded_notice"] = SEEDED_NOTICE
        return state

    def charge_restored(self, steps: int, epochs: int, begun: bool) -> None:
        """Account noisy steps the restored checkpoint does not hold (``dpts fit --resume``: the run directory's
        ``ledger.json`` also counts the steps taken after the last checkpoint, and those of an earlier continuation
        of it): the restored ledger counts at least ``steps`` steps and ``epochs`` epochs. Called after Lightning
        restored the checkpoint and before the fit's ledger begins; never lowers a count."""
        if self.restored is None or begun:
            raise ConfigurationError("ckpt_path", None, "charge_restored needs a checkpoint restored by this fit, "
                                     "before training starts")
        self.restored.steps = max(self.restored.steps, int(steps))
        self.restored.epochs = max(self.restored.epochs, int(epochs))

    def load_state_dict(self, state_dict: dict[str, Any], noise_multiplier: float | None,
                        max_grad_norm: float) -> None:
        """Continue the checkpoint's ledger (the fit's noise still comes from fresh entropy: no replay).

        Checkpoints of older versions (``steps`` and ``generator_state``) are accepted: their step count is
        kept, their generator state is ignored.
        """
        for key, mine in (("noise_multiplier", noise_multiplier), ("max_grad_norm", max_grad_norm)):
            saved = state_dict.get(key)
            if saved is not None and mine is not None and not math.isclose(saved, mine, rel_tol=1e-9):
                raise ConfigurationError(
                    key, mine, f"the checkpoint was trained with {key}={saved}; resume with the same value"
                )
        if isinstance(state_dict.get("ledger"), dict):
            self.restored = PrivacyLedger.from_dict(state_dict["ledger"])
        else:  # before the ledger: steps only; epochs derived when the fit starts
            self.restored = PrivacyLedger(
                steps=int(state_dict.get("steps", 0)), epochs=-1,
                noise_multiplier=state_dict.get("noise_multiplier"), max_grad_norm=state_dict.get("max_grad_norm"),
            )

"""Ledger wiring of :class:`~lightning_dpts.training.DPForecastStrategy`: which privacy ledger a fit continues, and
what the strategy writes into and reads from checkpoints.

:meth:`LedgerWiring.begin` starts a fit's :class:`~lightning_dpts.training.ledger.PrivacyLedger` (the checkpoint's,
else the one attached to the module, else empty), refuses continuations the accounting does not cover, and draws
the fit's fresh :class:`~lightning_dpts.randomness.Entropy` (no replay); ``state_dict``/``load_state_dict`` carry
sigma, C and the ledger, never anything that reproduces noise (:mod:`lightning_dpts.training.ledger`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import NOISE_SPECS, NoiseSpec
from lightning_dpts.randomness import SEEDED_NOTICE, Entropy, resolve_entropy
from lightning_dpts.training.engine import NoiseSource
from lightning_dpts.training.guards import (
    check_global_sample,
    check_same_on_all_ranks,
    has_accountant,
    spec_or_none,
)
from lightning_dpts.training.ledger import (
    LEDGER_KEY,
    PrivacyLedger,
    begin_fit,
    conflicting_ledgers,
    end_fit,
    ledger_of,
    merge,
)

__all__ = ["LedgerWiring"]


class LedgerWiring:
    """The ledger of a fit and the checkpoint state, as a part of :class:`~lightning_dpts.training.DPForecastStrategy`
    (which sets the attributes below; not used alone)."""

    noise_spec: NoiseSpec
    bands: int
    max_grad_norm: float
    per_window: str
    check_independence: bool
    isolated: bool
    ledger: PrivacyLedger
    step_cap: int | None
    noise: NoiseSource | None
    seeded: bool
    _seed: int | None
    _noise_multiplier: float | None
    _restored: PrivacyLedger | None
    _begun: bool
    _new_epoch: bool
    _batches_since_step: int
    _isolated_sums: Any
    _fit_steps: int
    _next_probe: int | None
    probes: int
    _probe_variant: tuple[bool, bool] | None
    probe_seconds: float
    _stochastic: bool | None
    _schedule: random.Random
    _rank: int
    _world_size: int
    resolve: Callable[[L.Trainer], float]
    _make_noise: Callable[[Entropy], NoiseSource]
    _buffer_guard: Any
    _before_swaps: PrivacyLedger | None

    def begin(self, trainer: L.Trainer, pl_module: L.LightningModule) -> PrivacyLedger:
        """Start this fit's ledger and noise (idempotent per fit; AccountantCallback calls it too).

        The ledger continues the one of the checkpoint this fit resumed from, else the one attached to the
        module, else starts empty; a fresh :class:`~lightning_dpts.randomness.Entropy` is drawn (no replay).
        """
        if self._begun:
            return self.ledger
        sigma = self.resolve(trainer)
        spec = spec_or_none(trainer)
        if self._restored is not None:
            ledger = self._restored
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
            attached = merge(x for x in (ledger_of(pl_module), self._before_swaps) if x is not None)
            ledger = PrivacyLedger(**vars(attached)) if attached is not None else PrivacyLedger()
        self._restored = None
        self.step_cap = None  # a reused strategy forgets its previous fit's cap (AccountantCallback sets this fit's)
        if self._world_size > 1:  # before any check that could then fail on some ranks only
            check_same_on_all_ranks(trainer, ledger.to_dict())
            check_global_sample(trainer, self._rank, self._world_size)
        if ledger.epochs < 0:  # an older checkpoint without an epoch count: every started epoch, at least
            spe = spec.steps_per_epoch if spec is not None else 1
            ledger.epochs = -(-ledger.steps // spe)
        ledger_noise = NOISE_SPECS.get(ledger.noise)
        if not ledger.empty and (self.noise_spec.correlated or (ledger_noise is not None and ledger_noise.correlated)):
            raise ConfigurationError(
                "noise", self.noise_spec.name,
                f"the model's privacy ledger already holds {ledger.steps} noisy steps and a BandMF run cannot be "
                "resumed or continued: its noise band (the last b - 1 noise vectors) and the b-min-sep sampler's "
                "history are secret and never stored, so a continuation would restart both, a mechanism the Monte "
                "Carlo accounting of the planned run does not cover. Plan the whole run in one fit "
                "(Trainer max_steps), or start from freshly initialised weights",
            )
        ledger.check_continuation(sigma, self.max_grad_norm, spec)
        if not ledger.empty and not has_accountant(trainer):
            raise ConfigurationError(
                "callbacks", "no AccountantCallback",
                f"the model's privacy ledger already holds {ledger.steps} noisy steps"
                + (f" (budget epsilon={ledger.budget[0]:g}, delta={ledger.budget[1]:g})" if ledger.budget else "")
                + "; add an AccountantCallback with your total budget to continue training it, so that the "
                "continuation is accounted and stopped within the budget",
            )
        ledger.noise_multiplier = sigma
        ledger.max_grad_norm = self.max_grad_norm
        ledger.noise = self.noise_spec.name
        ledger.bands = self.bands
        if spec is not None:
            ledger.sampling_spec = repr(spec)
        self.ledger = ledger
        begin_fit(pl_module, ledger)  # every module that owns parameters holds it; loads during the fit never lower it
        entropy = resolve_entropy(self._seed, "seed")
        if entropy.seeded:
            ledger.seeded = True
            rank_zero_warn(f"DPForecastStrategy: {SEEDED_NOTICE}")
        if getattr(getattr(trainer, "datamodule", None), "seeded", False) is True:
            ledger.seeded = True  # seeded batch sampling: the checkpoint metadata must say so too
        # one noise source, on rank 0 only: the one Gaussian draw of every step (other ranks add none)
        self.noise = self._make_noise(entropy) if self._rank == 0 else None
        self._new_epoch = True
        self._batches_since_step = 0
        self.isolated = self.per_window == "isolated"
        self._isolated_sums = None
        self._fit_steps = 0
        self._next_probe = 1 if self.check_independence and not self.isolated else None
        self.probes, self.probe_seconds, self._probe_variant = 0, 0.0, None
        self._stochastic = None
        if self._world_size > 1:  # the same probe steps on every rank (which steps are checked is not private)
            self._schedule = random.Random(25)
        self._begun = True
        return ledger

    def counts_after_next_step(self) -> tuple[int, int]:
        """(steps, epochs) the ledger counts once the next noisy step is taken: what a write-ahead copy of the
        ledger must cover before that step touches the data (``dpts fit``'s ``ledger.json``,
        :mod:`lightning_dpts.app.resume`)."""
        return self.ledger.steps + 1, self.ledger.epochs + int(self._new_epoch)

    def remember_ledger(self, pl_module: L.LightningModule) -> None:
        """At ``setup``, before the layer swaps: the model's ledger (a swapped layer's new module holds none)."""
        self._before_swaps = ledger_of(pl_module)

    def end_ledger(self, pl_module: L.LightningModule) -> None:
        """At the end of a fit (after the layer swaps are undone): the module's layers, the original ones again,
        hold the fit's ledger, which no fit counts in any more."""
        end_fit(pl_module, self.ledger)

    def state_dict(self) -> dict[str, Any]:
        """Sigma, C and the privacy ledger (with the noise kind and bands) - never a seed, a generator state or a
        BandMF band (nothing that reproduces noise).

        A seeded run adds ``"seeded": True`` and :data:`~lightning_dpts.randomness.SEEDED_NOTICE`.
        """
        state: dict[str, Any] = {
            "noise_multiplier": self._noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "ledger": self.ledger.to_dict(),
            "seeded": self.ledger.seeded or self.seeded,
        }
        if state["seeded"]:
            state["seeded_notice"] = SEEDED_NOTICE
        return state

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Refuse a checkpoint holding state that changed during the fit (the state guard, exactly: callbacks' state
        too, which no state-dict hook sees), then write the ledger at the top level of the checkpoint (read by
        ``load_from_checkpoint``). Lightning builds the whole checkpoint dict before it writes the file."""
        if self._buffer_guard is not None:
            self._buffer_guard.check()
        checkpoint[LEDGER_KEY] = self.ledger.to_dict()

    def charge_restored(self, steps: int, epochs: int) -> None:
        """Account noisy steps the restored checkpoint does not hold (``dpts fit --resume``: the run directory's
        ``ledger.json`` also counts the steps taken after the last checkpoint, and those of an earlier continuation
        of it): the restored ledger counts at least ``steps`` steps and ``epochs`` epochs. Called after Lightning
        restored the checkpoint and before the fit's ledger begins; never lowers a count."""
        if self._restored is None or self._begun:
            raise ConfigurationError("ckpt_path", None, "charge_restored needs a checkpoint restored by this fit, "
                                     "before training starts")
        self._restored.steps = max(self._restored.steps, int(steps))
        self._restored.epochs = max(self._restored.epochs, int(epochs))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the checkpoint's ledger; the noise of the resumed fit comes from fresh entropy (no replay).

        Checkpoints of older versions (``steps`` and ``generator_state``) are accepted: their step count is
        kept, their generator state is ignored.
        """
        for key, mine in (("noise_multiplier", self._noise_multiplier), ("max_grad_norm", self.max_grad_norm)):
            saved = state_dict.get(key)
            if saved is not None and mine is not None and not math.isclose(saved, mine, rel_tol=1e-9):
                raise ConfigurationError(
                    key, mine, f"the checkpoint was trained with {key}={saved}; resume with the same value"
                )
        if isinstance(state_dict.get("ledger"), dict):
            self._restored = PrivacyLedger.from_dict(state_dict["ledger"])
        else:  # before the ledger: steps only; epochs derived when the fit starts
            self._restored = PrivacyLedger(
                steps=int(state_dict.get("steps", 0)), epochs=-1,
                noise_multiplier=state_dict.get("noise_multiplier"), max_grad_norm=state_dict.get("max_grad_norm"),
            )
        self._begun = False


"""The Monte Carlo path of :class:`~lightning_dpts.training.AccountantCallback` (BandMF noise, b-min-sep sampling;
docs/bandmf.md): the planned run's accountant in the sound series-level reading, its budget check before any step,
and its report at the end. The whole-run bound holds for every prefix of the run (post-processing), so the callback
logs it at every step.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import PrivacyReport
from lightning_dpts.privacy.montecarlo import BandMFMechanism, MonteCarloAccountant
from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["build_monte_carlo", "finish_monte_carlo", "planned_steps", "start_monte_carlo"]


def planned_steps(trainer: L.Trainer) -> int:
    """n, the optimizer steps of the planned run: Trainer ``max_steps``, else ``max_epochs`` x batches/epoch
    (the smaller of the two when both are set)."""
    candidates = []
    if trainer.max_steps is not None and trainer.max_steps >= 0:
        candidates.append(int(trainer.max_steps))
    epochs = trainer.max_epochs
    if epochs is not None and epochs >= 0 and math.isfinite(trainer.num_training_batches):
        candidates.append(int(epochs) * int(trainer.num_training_batches))
    if not candidates:
        raise ConfigurationError(
            "max_steps", trainer.max_steps,
            "the Monte Carlo accountant accounts the whole planned run: set Trainer(max_steps=...) or max_epochs",
        )
    return min(candidates)


def build_monte_carlo(spec: SamplingSpec, strategy: Any, sigma: float, planned_steps: int,
                      samples: int) -> MonteCarloAccountant:
    """The Monte Carlo accountant of the planned run, in the sound series-level reading (docs/bandmf.md).

    The mechanism is y = C x + z of Dong & Ganesh (2026, Section 5): b-min-sep participations x of one *series*
    (warm start, p = p0 / (1 - p0 (b - 1)) with p0 = N'/N), add/remove of that series, whose contribution per
    participation is at most lambda clipped windows, i.e. sensitivity lambda in units of C (the noise std is
    sigma C). C is the strategy's BandMF matrix, or the identity column (1, 0, ..., 0) of length b for Gaussian
    noise with b-min-sep sampling (DP-SGD). Leak probability 1: the fixed-direction structured pair is never
    used (it is not a guarantee for substitution relations).
    """
    from lightning_dpts.data.bminsep import sampling_prob_for_rate

    if not spec.top_level_scheme.separates_participations:
        raise ConfigurationError(
            "datamodule.sampling_spec", f"top_level={spec.top_level!r}",
            "the Monte Carlo accountant covers b-min-sep sampling only: use top_level='b_min_sep' with the "
            "strategy's bands",
        )
    if not spec.bottom_level_scheme.bounded_windows_per_series:
        raise ConfigurationError(
            "datamodule.sampling_spec", f"bottom_level={spec.bottom_level!r}",
            "the Monte Carlo accountant's series-level sensitivity is instances_per_series windows, which only "
            "bottom_level='with_replacement' bounds (a Poisson bottom level may draw every start position)",
        )
    if strategy.noise_spec.correlated:
        coefficients = tuple(strategy.coefficients or ())
    else:
        coefficients = (1.0,) + (0.0,) * (spec.bands - 1)
    if len(coefficients) != spec.bands:
        raise ConfigurationError(
            "bands", len(coefficients), f"must equal the datamodule's b_min_sep bands={spec.bands}"
        )
    mechanism = BandMFMechanism(
        iterations=planned_steps, coefficients=coefficients,
        sampling_prob=sampling_prob_for_rate(spec.top_level_rate, spec.bands), noise_multiplier=sigma,
        warm_start=True, leak_probability=1.0, sensitivity=float(spec.instances_per_series),
    )
    return MonteCarloAccountant(mechanism, samples=samples)


def start_monte_carlo(callback: Any, trainer: L.Trainer, pl_module: L.LightningModule, spec: SamplingSpec,
                      strategy: Any, sigma: float) -> tuple[MonteCarloAccountant, float, dict[str, Any]]:
    """At train start of a fit the Monte Carlo accountant covers (BandMF noise, b-min-sep sampling): build it
    (``callback.build_monte_carlo``, the :class:`~lightning_dpts.training.AccountantCallback`'s), check the budget
    (``callback.epsilon``, ``callback.delta``) before any step, cap the strategy and the Trainer at the plan.
    Returns the accountant, the epsilon of the planned run and the DP settings to log."""
    if callback.bound != "upper":
        raise ConfigurationError(
            "bound", callback.bound, "the Monte Carlo accountant gives EVR-verified upper bounds only; use 'upper'"
        )
    ledger = strategy.begin(trainer, pl_module)  # refuses to continue a BandMF ledger
    if not ledger.empty:
        raise ConfigurationError(
            "datamodule.sampling_spec", "top_level='b_min_sep'",
            f"the model's privacy ledger already holds {ledger.steps} noisy steps; the Monte Carlo accountant "
            "accounts one planned run from its first step (a restarted b-min-sep sampler breaks the separation "
            "across the restart), so a continuation is not covered: start from freshly initialised weights",
        )
    if trainer.num_training_batches != spec.steps_per_epoch:
        raise ConfigurationError(
            "limit_train_batches", trainer.num_training_batches,
            f"b_min_sep sampling runs one chain over pass x spec.steps_per_epoch={spec.steps_per_epoch} steps; "
            "a shorter Trainer epoch would skip chain steps, so consecutive noisy steps could sample the same "
            "series (the separation the Monte Carlo accounting assumes): keep every batch of the epoch and "
            "limit the run with max_steps",
        )
    planned = planned_steps(trainer)
    acc = callback.build_monte_carlo(spec, strategy, sigma, planned)
    start = time.perf_counter()
    eps = acc.substitution_epsilon(planned, callback.delta)
    seconds = time.perf_counter() - start
    if not eps <= callback.epsilon:
        raise ConfigurationError(
            "epsilon", callback.epsilon,
            f"is below the Monte Carlo (EVR-verified) epsilon={eps:.4g} at delta={callback.delta:g} of the planned "
            f"{planned} steps (series-level substitution, sigma={sigma:.4g}, bands={spec.bands}, "
            f"{acc.samples} samples per direction): raise noise_multiplier, lower Trainer max_steps/max_epochs, "
            "lower batch_size (the sampling rate), raise the budget, or raise monte_carlo_samples (a tighter "
            "verified bound)",
        )
    ledger.budget = (callback.epsilon, callback.delta)
    strategy.step_cap = planned
    loop = trainer.fit_loop.epoch_loop
    allowed = trainer.global_step + planned
    if loop.max_steps < 0 or loop.max_steps > allowed:
        loop.max_steps = allowed
    rank_zero_info(
        f"AccountantCallback: Monte Carlo accountant (Dong & Ganesh 2026, Theorem 5.1 + EVR, Theorem A.1; "
        f"{acc.samples} samples per direction, {seconds:.2g} s): the planned {planned} steps spend at most "
        f"epsilon={eps:.4g} at delta={callback.delta:g} (series-level substitution via group privacy; "
        f"noise={strategy.noise_kind}, bands={spec.bands}, sigma={sigma:.4g}) within the budget "
        f"epsilon={callback.epsilon}; logged as {acc.log_name!r}"
    )
    from lightning_dpts.training.hparams import dp_hyperparameters, log_dp_hyperparameters

    hp = dp_hyperparameters(
        spec, noise_multiplier=sigma, epsilon_budget=callback.epsilon, delta=callback.delta, accountant=None,
        strategy=strategy, datamodule=getattr(trainer, "datamodule", None), bound=callback.bound, max_steps=planned,
    )
    hp.update({"theorem": "Monte Carlo (Dong & Ganesh 2026 Thm 5.1, EVR Thm A.1)", "bound_kind": "monte_carlo",
               "composition_unit": "run", "noise": strategy.noise_kind, "bands": spec.bands,
               "monte_carlo_samples": acc.samples})
    log_dp_hyperparameters(trainer.loggers, hp)
    return acc, eps, hp


def finish_monte_carlo(trainer: L.Trainer, acc: MonteCarloAccountant, eps: float, steps: int, delta: float
                       ) -> tuple[dict[str, Any], PrivacyReport]:
    """At train end: the Monte Carlo report of the run (``steps`` of the planned run, whose bound ``eps`` holds for
    every prefix: post-processing) and its :class:`~lightning_dpts.privacy.PrivacyReport`, logged."""
    report = acc.report()
    report.update({"steps": steps, "planned_steps": acc.planned_steps, "delta_budget": delta,
                   "epsilon": eps, "relation": "series-level substitution (group privacy from add/remove)",
                   "log_name": acc.log_name})
    privacy = PrivacyReport(epsilon=eps, delta=delta, steps=steps, compositions=acc.planned_steps, unit="run",
                            theorem="Monte Carlo (Dong & Ganesh 2026, Thm 5.1 + EVR Thm A.1)", kind="monte_carlo")
    for logger in trainer.loggers:
        logger.log_metrics({f"{acc.log_name}_spent": eps, "privacy_steps": float(steps)},
                           step=max(0, trainer.global_step - 1))
    rank_zero_info(
        f"AccountantCallback: spent epsilon<={eps:.4g} at delta={delta:g} after {steps} of the planned "
        f"{acc.planned_steps} optimizer steps (Monte Carlo, EVR-verified upper bound, {acc.samples} samples "
        "per direction; series-level substitution)"
    )
    return report, privacy

"""AccountantCallback: log epsilon every optimizer step and stop before the privacy budget is exceeded.

It reads the sampling description from ``trainer.datamodule.sampling_spec`` and sigma from the one
:class:`~lightning_dpts.training.DPForecastStrategy` among the Trainer's callbacks, builds a
:class:`~lightning_dpts.privacy.StructuredSubsamplingAccountant` (which picks the theorem of the paper for the
configuration) and

* computes once the largest number of optimizer steps whose composed epsilon stays within the budget, up to
  the Trainer's plan (``max_steps``, a whole number of epochs for iteration/shuffling top levels, which are
  accounted per epoch) and lowers the Trainer's ``max_steps`` to it, so no step beyond the budget is ever taken;
* logs ``epsilon`` after every optimizer step to every attached logger and to the progress bar, and next to it the
  membership-attack read-outs for the unit of privacy (:mod:`lightning_dpts.privacy.risk`: ``tpr_at_fpr_0.001``,
  ``tpr_at_fpr_0.01``, ``mu_gdp``), read from the same table (``risk_readouts=True``).

The step count is not kept here: the strategy's :class:`~lightning_dpts.training.ledger.PrivacyLedger` is the
single source of truth (it travels with the weights, through checkpoints, second Trainers and
``load_from_checkpoint``), and this callback accounts ``ledger.accounted_steps(spec)``: the noisy steps, or for
per-epoch accounting the epochs started (a resumed partial epoch is a new epoch). The budget is the *total*
for the model, over every fit. The strategy refuses to continue a non-empty ledger without this callback.

Per-step epsilon. Composing a privacy-loss distribution takes milliseconds, often more than a small training step,
so epsilon is not recomputed every step. At train start a table of epsilon at composition counts c_0 < c_1 < ... up
to the planned run (the Trainer's step limit, capped by the budget) is computed with
:meth:`~lightning_dpts.privacy.StructuredSubsamplingAccountant.epsilon_curve` (:mod:`lightning_dpts.privacy.curve`:
batched compositions on the coarsest grid within ``grid_rtol / 4`` of the accountant's; the default job's 400 steps
take about 0.03 s of CPU on their own and 0.06-0.08 s in this callback's thread, which composes the plan's last
count again beside the budget search; a 10^4-step traffic plan about 0.1 s; benchmarks/epsilon_logging.py). After
step n (n compositions, or the number of started epochs) the callback logs the table's value at the first count c_i
>= n, and at the budget's last count the accountant's exact epsilon. Epsilon is nondecreasing in the count, so that
value is a sound upper bound, and the table is built so that it exceeds the accountant's epsilon at n by at most a
factor 1 + ``grid_rtol`` (default 1%). The table's thread (with an accountant of its own that shares the unit PLDs,
:meth:`~lightning_dpts.privacy.StructuredSubsamplingAccountant.prepare`) runs while the budget's step count is
searched and, by default (``background_table=True``), on into the first steps; a step whose value is not computed
yet waits for it (``max_overhead`` limits the total wait; beyond it the budget's epsilon, also an upper bound, is
logged, and kept for the later steps: the logged curve never decreases). ``background_table=False`` makes train
start wait for the whole table. The per-step cost is a look-up plus the logger calls; the progress bar, where one
is attached, gets the value at most every :data:`BAR_INTERVAL` seconds (``self.log`` costs 0.5-2 ms; every logger
still gets every step). The final report is computed exactly,
and ``dpts fit``'s public epsilon curve reuses the table (:meth:`AccountantCallback.epsilon_table`).

Several processes (Lightning DDP, docs/distributed.md): rank 0 alone accounts - it computes ``max_steps`` and
broadcasts it, so every rank caps the Trainer at the same step and stops there; only rank 0 evaluates and logs
epsilon; the final report is computed on rank 0 and broadcast, so ``report`` is the same on every rank.
Lightning writes checkpoints from rank 0 only.
"""

from __future__ import annotations

import atexit
import bisect
import math
import threading
import time
import weakref
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_dpts.distributed import rank_and_world_size
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import PrivacyReport, StructuredSubsamplingAccountant
from lightning_dpts.privacy.montecarlo import MonteCarloAccountant
from lightning_dpts.privacy.risk import RiskReadout, metric_names, no_risk
from lightning_dpts.privacy.spec import SamplingSpec
from lightning_dpts.training.monte_carlo_run import (
    build_monte_carlo,
    finish_monte_carlo,
    planned_steps,
    start_monte_carlo,
)
from lightning_dpts.training.roles import StepAccountant
from lightning_dpts.training.strategy import DPForecastStrategy, PrivacyBudgetExhausted

__all__ = ["AccountantCallback", "EpsilonTable", "PrivacyBudgetExhausted"]

#: Shortest time in seconds between two updates of the progress bar's epsilon (the loggers get every step).
BAR_INTERVAL = 0.5


class AccountantCallback(StepAccountant):
    """Enforce a privacy budget (epsilon, delta) and log the epsilon spent at every optimizer step.

    Args:
        epsilon: the budget epsilon > 0 (0 allows no step and is refused).
        delta: the budget delta in (0, 1).
        bound: ``"upper"`` (default, the sound guarantee) or ``"lower"`` (the paper's optimistic lower bound;
            only for comparisons - training then stops at a count the guarantee does *not* cover).
        grid_rtol: the largest relative step (> 0, <= 0.5) between consecutive values of the epsilon table
            (default 0.01); every logged value is a sound upper bound within a factor 1 + grid_rtol of the epsilon
            spent at that step.
        background_table: ``True`` (default): the epsilon table is computed by a thread from train start, while
            the budget's step count is searched and during the first steps; a step whose value is not computed yet
            waits for it (``max_overhead``). ``False``: train start waits until the table is complete.
        max_overhead: with ``background_table=True``. ``None`` (default): when the table has not reached the
            current step, wait for it (every logged value is within ``grid_rtol``). A fraction (> 0): wait only
            while the total waiting stays below this fraction of the measured training time; otherwise log the
            budget's epsilon, a looser sound bound, and keep logging it (the logged values never decrease).
        log_name: metric name (default ``"epsilon"``) of the PLD path; the Monte Carlo path logs under
            ``MonteCarloAccountant.log_name`` (``"epsilon_monte_carlo_upper"``) so the value is never mistaken for
            a closed-form accountant's.
        risk_readouts: ``True`` (default): next to epsilon, log the membership-attack read-outs of
            :mod:`lightning_dpts.privacy.risk` for the unit of privacy (``tpr_at_fpr_0.001``, ``tpr_at_fpr_0.01``,
            ``mu_gdp``; upper bounds read from the same table as epsilon, TPR at FPR 1e-3 also on the progress bar).
            Not on the Monte Carlo path (no PLD), nor with ``bound="lower"`` (they would understate the risk).
        monte_carlo_samples: privacy-loss samples per direction of the Monte Carlo accountant (BandMF noise or a
            ``b_min_sep`` top level). More samples give a tighter EVR-verified bound and cost time before
            training (roughly 10^4 samples per second per 1,000 planned steps on one core); a small delta needs
            many (``samples_for_target_delta``: about 7.5e4 for delta = 1e-3, 1.1e7 for 1e-5).

    Attributes:
        max_steps: the largest accounted-step count the budget allows, searched only up to the Trainer's plan
            (``max_steps``, else ``max_epochs`` x batches; after ``on_train_start``).
        steps: noisy steps accounted for the model so far, over every fit (read from the strategy's ledger).
        report: the final :class:`~lightning_dpts.privacy.PrivacyReport` (after fitting).
        hyperparameters: the DP settings logged once per run through every logger's ``log_hyperparams`` under
            the key ``"dp"`` (sigma, C, delta, budget, Lambda, lambda, sampling levels and rates, relation,
            theorem; see :func:`lightning_dpts.training.hparams.dp_hyperparameters`), set in ``on_train_start``.
    """

    def __init__(
        self,
        epsilon: float,
        delta: float,
        *,
        bound: str = "upper",
        grid_rtol: float = 0.01,
        max_overhead: float | None = None,
        background_table: bool = True,
        log_name: str = "epsilon",
        risk_readouts: bool = True,
        monte_carlo_samples: int = 100_000,
    ) -> None:
        super().__init__()
        if not isinstance(risk_readouts, bool):
            raise ConfigurationError("risk_readouts", risk_readouts, "must be True or False")
        # read-outs of the optimistic lower bound would understate the risk: only with the sound bound
        self.risk_readouts = risk_readouts and bound == "upper"
        if isinstance(monte_carlo_samples, bool) or not isinstance(monte_carlo_samples, int) or monte_carlo_samples < 1:
            raise ConfigurationError("monte_carlo_samples", monte_carlo_samples, "must be an integer >= 1")
        self.monte_carlo_samples = monte_carlo_samples
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (
            math.isfinite(epsilon) and epsilon > 0
        ):  # epsilon = 0 allows no noisy step: refused, as dpts fit refuses it, instead of training nothing
            raise ConfigurationError("epsilon", epsilon, "must be a finite number > 0")
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ConfigurationError("delta", delta, "must lie strictly between 0 and 1")
        if bound not in ("upper", "lower"):
            raise ConfigurationError("bound", bound, "must be 'upper' or 'lower'")
        if not (isinstance(grid_rtol, (int, float)) and 0 < grid_rtol <= 0.5):
            raise ConfigurationError("grid_rtol", grid_rtol, "must lie in (0, 0.5]")
        self.epsilon, self.delta, self.bound, self.grid_rtol = float(epsilon), float(delta), bound, float(grid_rtol)
        if max_overhead is not None and not (isinstance(max_overhead, (int, float)) and max_overhead > 0):
            raise ConfigurationError("max_overhead", max_overhead, "must be a number > 0, or None")
        self.max_overhead = max_overhead
        if not isinstance(background_table, bool):
            raise ConfigurationError("background_table", background_table, "must be True or False")
        self.background_table = background_table
        self.log_name = log_name
        self._strategy_ref: DPForecastStrategy | None = None
        self._loaded: dict[str, Any] | None = None  # a restored checkpoint's state, checked at train start
        self.table: EpsilonTable | None = None
        self._rank = 0
        self._reset()

    @property
    def state_key(self) -> str:
        return "AccountantCallback"

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Hold back TensorBoard's HParams session until ``on_train_start`` adds the DP settings to it (one session
        with the module's ``save_hyperparameters()`` and ``dp/...``; :mod:`lightning_dpts.training.hparams`)."""
        if stage == "fit":
            from lightning_dpts.training.hparams import defer_tensorboard_hparams

            defer_tensorboard_hparams(trainer.loggers)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """A fit refused before ``on_train_start`` logged: write the held-back session as it is. The table's thread
        has ended (:meth:`EpsilonTable.stop` waits for it), whatever ended the fit."""
        from lightning_dpts.training.hparams import release_tensorboard_hparams

        if self.table is not None:
            self.table.stop()
        release_tensorboard_hparams(trainer.loggers)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        """An error or Ctrl-C ended the fit: the table's thread ends before the exception goes on."""
        if self.table is not None:
            self.table.stop()

    @property
    def steps(self) -> int:
        """Accounted steps of the model (``ledger.accounted_steps(spec)``; 0 before training starts)."""
        if self._strategy_ref is None:
            return 0
        spec = getattr(self, "spec", None)
        ledger = self._strategy_ref.ledger
        return ledger.steps if spec is None else ledger.accounted_steps(spec)

    # ------------------------------------------------------------------------------------------------
    def _strategy(self, trainer: L.Trainer) -> DPForecastStrategy:
        found = [cb for cb in trainer.callbacks if isinstance(cb, DPForecastStrategy)]
        if len(found) != 1:
            raise ConfigurationError(
                "callbacks", f"{len(found)} DPForecastStrategy",
                "AccountantCallback needs exactly one DPForecastStrategy in Trainer(callbacks=[...])",
            )
        return found[0]

    @staticmethod
    def _spec(trainer: L.Trainer) -> SamplingSpec:
        dm = getattr(trainer, "datamodule", None)
        spec = getattr(dm, "sampling_spec", None) if dm is not None else None
        if not isinstance(spec, SamplingSpec):
            raise ConfigurationError(
                "datamodule", type(dm).__name__,
                "AccountantCallback needs a datamodule with a sampling_spec (e.g. StructuredSubsamplingDataModule)",
            )
        return spec

    def _reset(self) -> None:
        """Start the per-fit state afresh (at construction and at every fit: a callback reused in a new Trainer
        keeps nothing of its previous fit but the budget; the step count is the model's ledger, which continues)."""
        self.max_steps: int | None = None
        self.report: PrivacyReport | None = None
        self.hyperparameters: dict[str, Any] | None = None
        self.accountant: StructuredSubsamplingAccountant | None = None
        self.monte_carlo: MonteCarloAccountant | None = None
        self.monte_carlo_epsilon: float | None = None
        self.monte_carlo_report: dict[str, Any] | None = None
        self._stop_table()  # a table of an earlier fit (kept for inspection) ends here
        self._last: tuple[int, float] = (0, 0.0)
        self._last_risk: RiskReadout | None = None  # the read-outs at the budget's last count (exact)
        self._wait_time, self._train_time, self._timed_steps = 0.0, 0.0, 0
        self._tick: float | None = None
        self._bar_value: float | None = None
        self._bar_time = -math.inf
        #: {metric name: value} logged after the last optimizer step (empty before the first)
        self.last_logged: dict[str, float] = {}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._reset()
        spec = self._spec(trainer)
        strategy = self._strategy(trainer)
        sigma = strategy.resolve(trainer)
        self.spec = spec
        self._strategy_ref = strategy
        top = spec.top_level_scheme
        if top.needs_monte_carlo or (strategy.noise_spec.needs_monte_carlo
                                     and not top.pld_bands_covered(strategy.noise_spec.bands)):
            self.monte_carlo, self.monte_carlo_epsilon, self.hyperparameters = start_monte_carlo(
                self, trainer, pl_module, spec, strategy, sigma)
            self.max_steps = self.monte_carlo.planned_steps
            return
        if self._loaded is not None:
            check_resumed(self._loaded, sigma, spec)
            self._loaded = None
        ledger = strategy.begin(trainer, pl_module)  # the model's ledger: checkpoint, attached, or empty
        set_budget(ledger, self.epsilon, self.delta)
        check_epochs(trainer, spec, ledger)
        coefficients = strategy.coefficients if strategy.noise_spec.correlated else None
        acc = StructuredSubsamplingAccountant(spec, sigma, bound=self.bound, coefficients=coefficients)
        self.accountant = acc
        self._rank = rank_and_world_size(trainer)[0]
        accounted = ledger.accounted_steps(spec)
        left = trainer_steps_left(trainer)
        plan = None if left is None else accounted + left  # the search stops at the Trainer's plan
        self._stop_table()
        if self._rank == 0 and plan is not None:
            # the units both need, once; then the table in a thread of its own while max_steps is searched here
            try:
                acc.prepare(self.delta)
            except ConfigurationError:
                pass  # (sigma far too small) max_steps raises it below, on every rank
            else:
                self._start_table(accounted, plan)
        try:
            self.max_steps = _from_rank_zero(trainer, lambda: acc.max_steps(self.epsilon, self.delta, stop_at=plan))
        except BaseException:
            self._stop_table()
            raise
        strategy.step_cap = self.max_steps
        remaining = cap_trainer(trainer, spec, self.max_steps, accounted)
        if remaining <= 0:
            rank_zero_warn(
                f"AccountantCallback: the budget epsilon={self.epsilon} at delta={self.delta} allows "
                f"{self.max_steps} accounted optimizer steps and the model's ledger already accounts {accounted} "
                f"({ledger.steps} noisy steps, {ledger.epochs} epochs); no step is taken"
            )
            trainer.should_stop = True
        rank_zero_info(
            f"AccountantCallback: budget epsilon={self.epsilon}, delta={self.delta} allows {self.max_steps} "
            f"optimizer steps ({acc.theorem}, {acc.kind} bound, per {acc.unit}, sigma={sigma:.4g}); "
            f"{accounted} already accounted"
        )
        self._log_hyperparameters(trainer, spec, strategy, sigma)
        if self._rank == 0:  # the other ranks neither evaluate nor log epsilon
            self._start_logging(accounted)

    # ------------------------------------------------------------------------------------------------
    # Monte Carlo path (BandMF noise / b-min-sep sampling; docs/bandmf.md)
    # ------------------------------------------------------------------------------------------------
    planned_steps = staticmethod(planned_steps)

    def build_monte_carlo(self, spec: SamplingSpec, strategy: DPForecastStrategy, sigma: float,
                          planned_steps: int) -> MonteCarloAccountant:
        """The Monte Carlo accountant of the planned run (:func:`~lightning_dpts.training.monte_carlo_run.
        build_monte_carlo`, with this callback's ``monte_carlo_samples``)."""
        return build_monte_carlo(spec, strategy, sigma, planned_steps, self.monte_carlo_samples)

    def _log_hyperparameters(self, trainer: L.Trainer, spec: SamplingSpec, strategy: DPForecastStrategy,
                             sigma: float) -> None:
        """Log the DP settings once per run to every logger (``log_hyperparams``, key ``"dp"``).

        The dict is :func:`lightning_dpts.training.hparams.dp_hyperparameters` (no seed or randomness in it); it is
        also kept as :attr:`hyperparameters` for reports.
        """
        from lightning_dpts.training.hparams import dp_hyperparameters, log_dp_hyperparameters

        self.hyperparameters = dp_hyperparameters(
            spec, noise_multiplier=sigma, epsilon_budget=self.epsilon, delta=self.delta, accountant=self.accountant,
            strategy=strategy, datamodule=getattr(trainer, "datamodule", None), bound=self.bound,
            max_steps=self.max_steps,
        )
        log_dp_hyperparameters(trainer.loggers, self.hyperparameters)


    def _start_table(self, accounted: int, planned: int, shared: bool = False) -> None:
        """Start the epsilon table over the compositions of steps (accounted, planned] in its thread, with an
        accountant of its own (its caches are not shared between threads), or with ``shared`` the callback's own
        (reusing the compositions ``max_steps`` just computed; the caller then waits for the table)."""
        assert self.accountant is not None
        acc = self.accountant
        first, last = acc.compositions(accounted + 1), acc.compositions(max(planned, accounted + 1))
        self.table = EpsilonTable(acc if shared else acc.clone(), self.delta, last, rtol=self.grid_rtol,
                                  start=first, readouts=self.risk_readouts)

    def _stop_table(self) -> None:
        if self.table is not None:
            self.table.stop()
        self.table = None

    def _start_logging(self, accounted: int) -> None:
        """Before the first step: epsilon at the budget's last count, the table up to it, the timers."""
        assert self.accountant is not None and self.max_steps is not None
        acc = self.accountant
        last = acc.compositions(self.max_steps)
        eps = acc.epsilon(self.max_steps, self.delta) if last else 0.0  # cached by max_steps
        self._last = (last, eps)
        # the same compositions: only the read-out arithmetic (a few ms)
        self._last_risk = acc.risk(self.max_steps, self.delta) if self.risk_readouts else None
        self._bar_value = None
        self._tick = None
        self._wait_time = self._train_time = 0.0
        self._timed_steps = 0
        if self.table is None:  # no Trainer plan: up to the budget's step count, reusing its compositions
            self._start_table(accounted, self.max_steps, shared=not self.background_table)
        else:
            self.table.limit(last)
        if not self.background_table and self.table is not None:
            self.table.join()  # complete before the first step: every step then costs a look-up

    def epsilon_table(self, last: int, delta: float, rtol: float) -> list[tuple[int, float]] | None:
        """The table's (compositions, epsilon) points from count 1 up to the first count >= ``last``, if this fit
        computed them at ``delta`` and ``rtol`` (then they equal ``accountant.epsilon_curve(last, delta, rtol=rtol)``
        up to the last point, which may lie beyond ``last``); ``None`` otherwise (a resumed model's table starts
        later, a stopped background table may end earlier)."""
        table = self.table
        if table is None or table.start != 1 or table.delta != delta or table.rtol != rtol or table.error is not None:
            return None
        points = table.points()
        if not points or points[-1][0] < last:
            return None
        return [(c, e) for c, e in points if c < last] + [next((c, e) for c, e in points if c >= last)]

    @property
    def grid_points(self) -> list[tuple[int, float]]:
        """(compositions, epsilon) of the table computed so far (see the module docstring)."""
        return [] if self.table is None else self.table.points()

    def epsilon_upper_bound(self, steps: int) -> float:
        """A sound upper bound on epsilon after ``steps`` optimizer steps, within a factor 1 + ``grid_rtol``
        of the exact one: the table's value at the first count >= the compositions of ``steps`` (waits for the
        background table as ``max_overhead`` allows; beyond the planned run: exact)."""
        return self._upper_bounds(steps)[0]

    def _upper_bounds(self, steps: int) -> tuple[float, RiskReadout | None]:
        """(:meth:`epsilon_upper_bound`, the risk read-outs read at the same count; ``None`` without them). Both grow
        with the count, so the values at a later count bound those at ``steps``."""
        assert self.accountant is not None
        c = self.accountant.compositions(steps)
        if c == 0:
            return 0.0, (no_risk(self.delta) if self.risk_readouts else None)
        table = self.table
        if table is not None and c <= table.last:
            point = table.lookup_point(c)
            if point is None:
                allowed = None if self.max_overhead is None else self.max_overhead * self._train_time
                if allowed is None or self._wait_time < allowed:
                    start = time.perf_counter()
                    point = table.lookup_point(c, wait=True)
                    self._wait_time += time.perf_counter() - start
            if point is not None:
                value, readout = point
                # the budget's last count is read exactly (the table's grid may overstate it by grid_rtol / 4),
                # so the logged epsilon never exceeds the one the run reports, nor the budget
                if c <= self._last[0]:
                    return min(value, self._last[1]), _smaller(readout, self._last_risk)
                return value, readout
            if c <= self._last[0]:  # the budget's: upper bounds for every count the budget allows
                return self._last[1], self._last_risk
        eps = self.accountant.epsilon(steps, self.delta)
        return eps, (self.accountant.risk(steps, self.delta) if self.risk_readouts else None)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monte_carlo is not None:  # the whole-run bound holds for every prefix (post-processing)
            self.last_logged, self._bar_value = log_monte_carlo(trainer, pl_module, self.monte_carlo.log_name,
                                                                float(self.monte_carlo_epsilon or 0.0), self._bar_value)
            return
        if self.accountant is None or self._rank != 0:
            return
        now = time.perf_counter()
        if self._tick is not None:  # training time per step, for the overhead cap
            self._train_time += now - self._tick
            self._timed_steps += 1
        value, readout = self._upper_bounds(self.steps)
        metrics = {self.log_name: value, **(readout.metrics() if readout is not None else {})}
        if value < self.last_logged.get(self.log_name, 0.0):  # a late table value logged the budget's epsilon (a
            metrics, value = self.last_logged, self.last_logged[self.log_name]  # looser bound): kept, never falling
        self.last_logged = metrics
        # the progress bar keeps the last value; self.log costs 0.5-2 ms, so at most every BAR_INTERVAL seconds,
        # and only where a progress bar shows it (the loggers get every step below)
        if trainer.progress_bar_callback is not None and value != self._bar_value and (
                now - self._bar_time >= BAR_INTERVAL or self._bar_value is None or _last_step(trainer)):
            _show_on_bar(pl_module, self.log_name, metrics, readout)
            self._bar_value, self._bar_time = value, now
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step - 1)
        self._tick = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.table is not None:
            self.table.stop()  # kept (grid_points) for inspection; waits for the thread (ends after its current count)
        if self.monte_carlo is not None:
            self.monte_carlo_report, self.report = finish_monte_carlo(
                trainer, self.monte_carlo, float(self.monte_carlo_epsilon or 0.0), self.steps, self.delta)
            return
        if self.accountant is None:
            return
        accountant, steps, delta = self.accountant, self.steps, self.delta
        self.report = _from_rank_zero(trainer, lambda: accountant.report(steps, delta))
        r = self.report
        for logger in trainer.loggers:
            logger.log_metrics({f"{self.log_name}_spent": r.epsilon, "privacy_steps": float(r.steps)},
                               step=max(0, trainer.global_step - 1))
        risk = f"; for the unit of privacy: {r.risk}" if r.risk is not None and self.risk_readouts else ""
        rank_zero_info(
            f"AccountantCallback: spent epsilon={r.epsilon:.4g} at delta={r.delta:g} after {r.steps} optimizer "
            f"steps ({r.compositions} {r.unit} compositions; {r.theorem}, {r.kind} bound){risk}"
        )

    # ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        sigma = self.accountant.noise_multiplier if self.accountant is not None else None
        return {
            "steps": self.steps,
            "epsilon": self.epsilon,
            "delta": self.delta,
            "bound": self.bound,
            "noise_multiplier": sigma,
            "spec": repr(self.spec) if self.accountant is not None else None,
            "monte_carlo_epsilon": self.monte_carlo_epsilon,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._loaded = dict(state_dict)  # the step count itself is restored from the strategy's ledger


def _smaller(a: RiskReadout | None, b: RiskReadout | None) -> RiskReadout | None:
    """The smaller of two upper-bounding read-outs of the same run, value by value (either one where the other is
    missing)."""
    if a is None or b is None:
        return a if b is None else b
    return RiskReadout(a.fprs, tuple(min(x, y) for x, y in zip(a.tprs, b.tprs, strict=True)), min(a.mu, b.mu),
                       a.delta)


def _last_step(trainer: L.Trainer) -> bool:
    """Whether the optimizer step just taken is the fit's last one that is known in advance (the step limit, the
    last batch of the last epoch, or a requested stop)."""
    loop = trainer.fit_loop.epoch_loop
    if trainer.should_stop or (loop.max_steps is not None and 0 <= loop.max_steps <= trainer.global_step):
        return True
    epochs = trainer.max_epochs
    return (epochs is not None and epochs >= 0 and trainer.current_epoch + 1 >= epochs
            and bool(loop.batch_progress.is_last_batch))


def _from_rank_zero(trainer: L.Trainer, compute: Any) -> Any:
    """``compute()`` on rank 0, broadcast to every rank (in memory); one process: just ``compute()``.

    If rank 0 fails, every rank raises (the others are not left waiting in a later collective).
    """
    rank, world = rank_and_world_size(trainer)
    if world == 1:
        return compute()
    value, error = None, None
    if rank == 0:
        try:
            value = compute()
        except Exception as err:  # re-raised below, after the other ranks were told
            error = err
    value, message = trainer.strategy.broadcast((value, None if error is None else repr(error)), src=0)
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"rank 0 failed while accounting: {message}")
    return value


class EpsilonTable:
    """Epsilon of a planned run at a grid of composition counts, computed by a background thread.

    The thread runs :meth:`~lightning_dpts.privacy.StructuredSubsamplingAccountant.epsilon_curve` from count
    ``start`` to ``last``; :meth:`lookup` returns the value at the first computed count >= c (a sound upper
    bound on epsilon after c compositions, within a factor 1 + ``rtol`` of the exact one).

    Args:
        accountant: the run's accountant.
        delta: the delta of every value.
        last: the largest composition count of the plan.
        rtol: the largest relative step between consecutive values (see ``epsilon_curve``).
        start: the first count (the run's first step; earlier steps of a resumed model are not looked up).
    """

    def __init__(self, accountant: StructuredSubsamplingAccountant, delta: float, last: int, *, rtol: float = 0.01,
                 start: int = 1, readouts: bool = False) -> None:
        self.last = int(last)
        self.start, self.delta, self.rtol = int(start), float(delta), float(rtol)
        self._limit = self.last
        self._counts: list[int] = []
        self._values: list[float] = []
        self._readouts: list[RiskReadout | None] = []
        self._done = False
        self._stop = False
        self.error: BaseException | None = None
        #: wall-clock and CPU seconds the thread took (``None`` until it ends; benchmarks/epsilon_logging.py)
        self.seconds: float | None = None
        self.cpu_seconds: float | None = None
        self._cond = threading.Condition()
        if readouts:  # the risk read-outs of every point, from the same compositions (lightning_dpts.privacy.risk)
            self._curve: Any = accountant.risk_curve(self.last, delta, rtol=rtol, start=start)
        else:
            self._curve = ((c, e, None) for c, e in accountant.epsilon_curve(self.last, delta, rtol=rtol, start=start))
        # a daemon thread, so that a process never waits for a table it no longer needs; it is stopped and joined at
        # train end, on an exception, and at interpreter exit (_stop_live_tables): a daemon thread still inside
        # scipy's C++ FFT when the interpreter finalises is ended by pthread_exit through C++ frames, and the
        # process aborts after it finished ("terminate called without an active exception", exit 134; issue 38)
        self._thread = threading.Thread(target=self._run, name="dpts-epsilon-table", daemon=True)
        _LIVE_TABLES.add(self)
        self._thread.start()

    def _run(self) -> None:
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            for count, value, readout in self._curve:
                with self._cond:
                    if self._stop:
                        break
                    self._counts.append(count)
                    self._values.append(value)
                    self._readouts.append(readout)
                    self._cond.notify_all()
                    if count >= self._limit:  # every count up to the limit is covered
                        break
        except Exception as err:  # kept in .error; the callback then logs the budget's epsilon (an upper bound)
            self.error = err
        finally:
            with self._cond:
                self.seconds = time.perf_counter() - began
                self.cpu_seconds = time.thread_time() - cpu
                self._done = True
                self._cond.notify_all()

    def lookup(self, count: int, wait: bool = False) -> float | None:
        """The value at the first computed count >= ``count``; ``None`` if none is computed yet (``wait``: block
        until it is, or until the thread ends; a thread that failed, see :attr:`error`, leaves ``None``)."""
        point = self.lookup_point(count, wait)
        return None if point is None else point[0]

    def lookup_point(self, count: int, wait: bool = False) -> tuple[float, RiskReadout | None] | None:
        """(epsilon, risk read-outs or ``None``) at the first computed count >= ``count``, as :meth:`lookup`."""
        with self._cond:
            while True:
                i = bisect.bisect_left(self._counts, count)
                if i < len(self._counts):
                    return self._values[i], self._readouts[i]
                if self._done or not wait:
                    return None
                self._cond.wait()

    def points(self) -> list[tuple[int, float]]:
        """The (count, epsilon) pairs computed so far."""
        with self._cond:
            return list(zip(self._counts, self._values, strict=True))

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to finish the table."""
        self._thread.join(timeout)

    def limit(self, last: int) -> None:
        """Stop once a count >= ``last`` is computed (the budget allows fewer steps than the plan)."""
        with self._cond:
            self._limit = min(self._limit, int(last))
            self.last = min(self.last, self._limit)

    def stop(self) -> None:
        """Stop the thread after its current count and wait for it to end (training ended before the plan, an
        exception, interpreter exit). The points computed so far are kept."""
        with self._cond:
            self._stop = True
        if self._thread is not threading.current_thread():
            self._thread.join()
        _LIVE_TABLES.discard(self)

    @property
    def alive(self) -> bool:
        """Whether the table's thread is still running."""
        return self._thread.is_alive()


#: every EpsilonTable whose thread may still run (weakly held: a table no one holds is not kept alive)
_LIVE_TABLES: weakref.WeakSet[EpsilonTable] = weakref.WeakSet()


@atexit.register
def _stop_live_tables() -> None:
    """At interpreter exit, before daemon threads are frozen: stop and join every table's thread (see
    :class:`EpsilonTable`)."""
    for table in list(_LIVE_TABLES):
        table.stop()


def check_resumed(loaded: dict[str, Any], sigma: float, spec: SamplingSpec) -> None:
    """A resumed checkpoint's steps were accounted with ``loaded``'s sigma and sampling spec: keep them."""
    saved_sigma, saved_spec = loaded.get("noise_multiplier"), loaded.get("spec")
    if saved_sigma is not None and not math.isclose(saved_sigma, sigma, rel_tol=1e-9):
        raise ConfigurationError(
            "noise_multiplier", sigma,
            f"the checkpoint's steps were accounted with noise_multiplier={saved_sigma}; keep it to resume",
        )
    if saved_spec is not None and not spec.matches_repr(saved_spec):
        raise ConfigurationError(
            "datamodule.sampling_spec", spec, f"differs from the checkpoint's {saved_spec}; keep it to resume"
        )


def set_budget(ledger: Any, epsilon: float, delta: float) -> None:
    """This fit's budget is the model's total: the ledger records it (a warning if earlier steps had another).

    Weights released by private selection (:func:`lightning_dpts.tuning.tune`) are refused: their epsilon covers a
    search of several runs (Papernot & Steinke 2022, Theorem 2), which this accountant, counting one run's steps,
    would silently drop. (The Monte Carlo path refuses every non-empty ledger.)"""
    selection = getattr(ledger, "selection", None)
    if selection:
        raise ConfigurationError(
            "model", f"selected by {selection.get('procedure', 'private selection')}",
            f"its epsilon={selection.get('epsilon')} covers a search over {selection.get('K')} candidates that "
            "a continuation cannot add to; train a fresh model, or include the continuation in the search")
    if ledger.budget is not None and ledger.budget != (epsilon, delta):
        rank_zero_warn(
            f"AccountantCallback: the model's earlier steps were accounted with the budget "
            f"epsilon={ledger.budget[0]:g}, delta={ledger.budget[1]:g}; this fit enforces "
            f"epsilon={epsilon:g}, delta={delta:g} for the total of "
            f"all {ledger.steps} earlier and the new steps"
        )
    ledger.budget = (epsilon, delta)


def check_epochs(trainer: L.Trainer, spec: SamplingSpec, ledger: Any) -> None:
    """Per-epoch accounting needs whole epochs of ``spec.steps_per_epoch`` batches; cyclic Poisson sampling too,
    and a run from its first step (Theorem B.2: group t mod k of the run's step t)."""
    if spec.accounts_per_epoch and trainer.num_training_batches != spec.steps_per_epoch:
        raise ConfigurationError(
            "limit_train_batches", trainer.num_training_batches,
            f"{spec.top_level!r} top level is accounted per epoch of spec.steps_per_epoch="
            f"{spec.steps_per_epoch} steps; the Trainer's epoch must have exactly that many batches",
        )
    if spec.top_level_scheme.separates_participations:  # cyclic Poisson: group t mod k of the run's step t
        if trainer.num_training_batches != spec.steps_per_epoch:
            raise ConfigurationError(
                "limit_train_batches", trainer.num_training_batches,
                f"{spec.top_level!r} sampling makes group (t mod {spec.bands}) eligible at the run's step t = pass "
                f"x spec.steps_per_epoch={spec.steps_per_epoch} + step; a shorter Trainer epoch would let one "
                "series take part in noisy steps fewer than k apart: keep every batch and limit with max_steps",
            )
        if not ledger.empty:
            raise ConfigurationError(
                "datamodule.sampling_spec", f"top_level={spec.top_level!r}",
                f"the model's privacy ledger already holds {ledger.steps} noisy steps; cyclic Poisson sampling is "
                "accounted from the run's first step (its groups follow the step count of one run), so a "
                "continuation is not covered: start from freshly initialised weights",
            )


def cap_trainer(trainer: L.Trainer, spec: SamplingSpec, max_steps: int, accounted: int) -> int:
    """Lower the Trainer's step limit to the ``max_steps`` accounted steps the budget allows (``accounted``
    already taken); returns the optimizer steps that remain."""
    if spec.accounts_per_epoch:
        # Whole epochs remain; a partially done Trainer epoch (mid-epoch resume) finishes as a *new* epoch.
        spe = spec.steps_per_epoch
        remaining_epochs = (max_steps - accounted) // spe
        done_in_epoch = trainer.global_step % spe
        remaining = max(0, remaining_epochs * spe - done_in_epoch) if remaining_epochs > 0 else 0
    else:
        remaining = max_steps - accounted
    loop = trainer.fit_loop.epoch_loop
    allowed = trainer.global_step + max(0, remaining)
    if loop.max_steps < 0 or loop.max_steps > allowed:
        loop.max_steps = allowed
    return remaining


def trainer_steps_left(trainer: L.Trainer) -> int | None:
    """Optimizer steps the Trainer will still take at most (its step limit, else max_epochs x batches);
    ``None`` when it has neither."""
    loop = trainer.fit_loop.epoch_loop
    left = []
    if loop.max_steps is not None and loop.max_steps >= 0:
        left.append(int(loop.max_steps) - trainer.global_step)
    epochs = trainer.max_epochs
    if epochs is not None and epochs >= 0 and math.isfinite(trainer.num_training_batches):
        left.append(int(epochs) * int(trainer.num_training_batches) - trainer.global_step)
    return max(0, min(left)) if left else None


def log_monte_carlo(trainer: L.Trainer, pl_module: L.LightningModule, name: str, value: float,
                    bar_value: float | None) -> tuple[dict[str, float], float | None]:
    """Log a Monte Carlo run's whole-run bound after a step, marked as such (it holds for every prefix of the run:
    post-processing); returns what was logged and the progress bar's value."""
    if value != bar_value:
        pl_module.log(name, value, on_step=True, on_epoch=False, prog_bar=True, logger=False, batch_size=1)
    for logger in trainer.loggers:
        logger.log_metrics({name: value}, step=trainer.global_step - 1)
    return {name: value}, value


def _show_on_bar(pl_module: L.LightningModule, log_name: str, metrics: dict[str, float],
                 readout: RiskReadout | None) -> None:
    """Epsilon on the progress bar, and the TPR at FPR 1e-3 of the unit of privacy next to it."""
    pl_module.log(log_name, metrics[log_name], on_step=True, on_epoch=False, prog_bar=True, logger=False,
                  batch_size=1)
    if readout is not None:
        name = metric_names(readout.fprs[:1])[0]
        pl_module.log(name, metrics[name], on_step=True, on_epoch=False, prog_bar=True, logger=False, batch_size=1)

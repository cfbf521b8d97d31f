"""Empirical privacy audit (issue 28): lower bounds on ε from canaries; docs/audit.md.

:func:`~lightning_dpts.audit.runner.run_audit` (and ``dpts audit``) trains once with DP-SGD on data holding
canaries (:mod:`~lightning_dpts.audit.canaries`, each a protected unit included with probability 1/2), scores them
white-box and black-box (:mod:`~lightning_dpts.audit.scores`) and reports the lower bounds next to the accountant's
ε. Importing this package imports no torch (the runner imports it when it trains).

:mod:`~lightning_dpts.audit.estimators` turns canary guesses into an ε lower bound with its confidence: one run
(Steinke, Nasr & Jagielski 2023), one run read through Gaussian DP (after Mahloujifar, Melis & Chaudhuri 2025) and
many runs (Clopper-Pearson; Jagielski et al. 2020, Nasr et al. 2021), and the canaries' scores read as Gaussian
(Agrawal et al. 2026; exact for the audit model's white-box scores, an assumption elsewhere);
:mod:`~lightning_dpts.audit.order_statistics` reads the most confident guesses through order statistics (Xiang et
al. 2025, Theorem 2; independent canaries with Gaussian tradeoff curves assumed).
"""

from lightning_dpts.audit.canaries import Canary, CanaryPlan, chunk_series, plan_canaries
from lightning_dpts.audit.estimators import (
    AuditBound,
    TradeoffTest,
    clopper_pearson_epsilon_lower_bound,
    default_guess_grid,
    gaussian_dp_delta,
    gaussian_dp_epsilon,
    gaussian_scores_lower_bound,
    inverse_power_from_privacy_profile,
    one_run_epsilon_lower_bound,
    one_run_fdp_lower_bound,
    one_run_tradeoff_test,
    pool_runs,
)
from lightning_dpts.audit.order_statistics import (
    default_releases,
    order_statistics_error_tail,
    order_statistics_lower_bound,
)
from lightning_dpts.audit.runner import AuditResult, options_from_fit_config, run_audit

__all__ = [
    "AuditBound",
    "AuditResult",
    "Canary",
    "CanaryPlan",
    "TradeoffTest",
    "chunk_series",
    "clopper_pearson_epsilon_lower_bound",
    "default_guess_grid",
    "default_releases",
    "gaussian_dp_delta",
    "gaussian_dp_epsilon",
    "gaussian_scores_lower_bound",
    "inverse_power_from_privacy_profile",
    "one_run_epsilon_lower_bound",
    "one_run_fdp_lower_bound",
    "one_run_tradeoff_test",
    "options_from_fit_config",
    "order_statistics_error_tail",
    "order_statistics_lower_bound",
    "plan_canaries",
    "pool_runs",
    "run_audit",
]

"""Empirical privacy audit (issue 28): lower bounds on ε from canaries (numpy/scipy only; no torch).

:mod:`~lightning_dpts.audit.estimators` turns canary guesses into an ε lower bound with its confidence: one run
(Steinke, Nasr & Jagielski 2023), one run read through Gaussian DP (after Mahloujifar, Melis & Chaudhuri 2025) and
many runs (Clopper-Pearson; Jagielski et al. 2020, Nasr et al. 2021).
"""

from lightning_dpts.audit.estimators import (
    AuditBound,
    TradeoffTest,
    clopper_pearson_epsilon_lower_bound,
    default_guess_grid,
    gaussian_dp_delta,
    gaussian_dp_epsilon,
    inverse_power_from_privacy_profile,
    one_run_epsilon_lower_bound,
    one_run_fdp_lower_bound,
    one_run_tradeoff_test,
)

__all__ = [
    "AuditBound",
    "TradeoffTest",
    "clopper_pearson_epsilon_lower_bound",
    "default_guess_grid",
    "gaussian_dp_delta",
    "gaussian_dp_epsilon",
    "inverse_power_from_privacy_profile",
    "one_run_epsilon_lower_bound",
    "one_run_fdp_lower_bound",
    "one_run_tradeoff_test",
]

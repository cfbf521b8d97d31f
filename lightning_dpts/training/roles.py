"""The roles the training callbacks find one another by, so that neither imports the other's module.

:class:`~lightning_dpts.training.AccountantCallback` finds the one
:class:`~lightning_dpts.training.DPForecastStrategy` among the Trainer's callbacks (it imports the strategy);
the strategy only needs to know whether a callback that accounts its steps is present (to refuse a fit without one,
unless ``require_accountant=False``, and continuing a non-empty privacy ledger without one), and asks for a
:class:`StepAccountant` instead of importing the accountant's module.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

__all__ = ["StepAccountant"]


class StepAccountant(Callback):
    """A callback that accounts every noisy step of the model's privacy ledger against a privacy budget and caps
    the strategy's steps within it (``DPForecastStrategy.step_cap``): :class:`~lightning_dpts.training.
    AccountantCallback`."""

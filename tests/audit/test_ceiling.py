"""The white-box audit's ceiling per model (docs/audit.md "Auditing your model", benchmarks/audit_ceiling.py).

With nothing sampled, one canary moves the summed update by D = a - b, its window's clipped gradients in its two
worlds; no score of it can show more than |D| / 2C of the accountant's mu. These tests compute D from the shipped
modules (independently of the audit's scorer and estimators) for the claims the docs make: ``combination`` at
``dpts fit``'s C (the recipe's, 0.001) stays below 5% of 2C in the audit's window (an epsilon ceiling of 0.2 of 8:
its audit showing almost nothing is the model, not the estimator), while ``seasonal_linear``'s spike canary reaches
2C (the clip binds and the gradient flips sign).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

P, H = 13, 1


def _shares(model: str, worlds: tuple[float, float], c: float) -> np.ndarray:
    """|a - b| / 2C of the audit's window (a piece of H = 1 step, the canary's, with a padded past) for 5 such pieces:
    the piece holds nothing but the canary's value in each world."""
    from lightning_dpts.app.audit_models import fit_model
    from lightning_dpts.audit.scores import window_batch
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.training.isolated import IsolatedGradients, silenced, training_loss

    pieces = range(5)
    torch.manual_seed(0)
    module = fit_model(model, season_length=12)(len(pieces), P, H)
    params = [p for p in module.parameters() if p.requires_grad]
    grads = []
    for value in worlds:
        data = [np.array([value], dtype=np.float32) for _ in pieces]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dm = StructuredSubsamplingDataModule(data, context_length=P, prediction_length=H, batch_size=len(data),
                                                 test_windows=0, freq="M", seed=0)
        batch = window_batch(dm, np.arange(len(pieces)), np.zeros(len(pieces), dtype=np.int64))
        rows = []
        with silenced(module):
            for i in range(len(pieces)):
                loss = training_loss(module.training_step(IsolatedGradients.window(batch, i), 0))
                g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(loss, params)]).double()
                rows.append(g * min(1.0, c / max(float(g.norm()), 1e-300)))
        grads.append(torch.stack(rows))
    return ((grads[0] - grads[1]).norm(dim=1) / (2 * c)).numpy()


@pytest.mark.parametrize("worlds", [(50.0, -50.0), (3.0, 0.0), (100.0, 0.0)])
def test_combination_canary_moves_the_update_by_under_five_percent_of_2c(worlds: tuple[float, float]) -> None:
    from lightning_dpts.recipe import MAX_GRAD_NORMS

    assert _shares("combination", worlds, MAX_GRAD_NORMS["combination"]).max() < 0.05  # 0.036 measured


def test_seasonal_linear_spike_reaches_2c() -> None:
    assert _shares("seasonal_linear", (50.0, -50.0), 0.1).min() > 0.99

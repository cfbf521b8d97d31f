"""Scores of canaries: how strongly what the adversary sees points to each canary being in the training data.

The one-run estimators (:mod:`lightning_dpts.audit.estimators`) are sound for *any* score computed from what the
adversary sees and from public knowledge (the code, the configuration, all data except the canaries' coins,
docs/privacy.md "Threat model"); the score only decides how much the audit can prove. Neither score below uses
the training's secret randomness (which windows were sampled, the noise).

* :class:`WhiteBoxScorer` (the adversary sees every noisy update, as the DP-SGD analysis assumes): at every noisy
  step s, for every canary j and each window w that can contain it, the clipped gradients ``a_w`` (canary
  included) and ``b_w`` (excluded) at the step's parameters theta_s, and the log-likelihood ratio of the two
  Gaussians they would centre the summed noisy gradient ``y_s = Lambda * g~_s`` on:

      score_j += mean_w <a_w - b_w, y_s - (a_w + b_w) / 2> / (sigma C)^2

  summed over the steps (the most powerful test of "a_w in the sum" against "b_w in the sum" under Gaussian noise
  of std sigma*C, with everything else in the update treated as noise; Neyman-Pearson). The gradients are those
  of the module's ``training_step`` on each window alone (as the accountant assumes; a forward that mixes windows
  makes the real update differ from it, which shows as a larger score).
* :func:`black_box_scores` (the adversary sees the final model only): ``loss(excluded version) - loss(included
  version)`` of the canary's windows under the final model, averaged over its windows: a model that trained on
  the included version fits it better.

Per-canary scores are computed from the training data without noise, so they are private to whoever owns it:
the runner writes them under ``private/`` (:mod:`lightning_dpts.audit.runner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import numpy as np
import torch

from lightning_dpts.audit.canaries import CanaryPlan, window_starts
from lightning_dpts.data.sampler import SERIES_INDEX_KEY, _to_tensors
from lightning_dpts.training.engine import clip_factors
from lightning_dpts.training.isolated import IsolatedGradients, silenced, training_loss

__all__ = ["CanaryWindows", "WhiteBoxScorer", "black_box_scores", "canary_windows", "window_batch"]

_CHUNK_ELEMENTS = 1 << 24  # per-window gradient coordinates held at once


def window_batch(datamodule: Any, rows: np.ndarray, starts: np.ndarray) -> dict[str, torch.Tensor]:
    """The training windows ``(rows[i], starts[i])`` of a :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`
    as one batch, built exactly as its sampler builds a training batch (same keys, padding, features), without
    augmentation noise."""
    sampler = datamodule.sampler
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    arrays = sampler.store.gather(rows, np.ascontiguousarray(starts, dtype=np.int64), sampler.keys)
    out = _to_tensors(arrays, rows, sampler.keys, sampler.static_cat, sampler.static_real, sampler.univariate)
    out[SERIES_INDEX_KEY] = torch.from_numpy(rows.copy())
    return out


class CanaryWindows:
    """The windows the scores look at: for canary j, ``starts[j]`` (window starts in its series).

    Attributes:
        rows: ``[n]`` series index of every scored window.
        starts: ``[n]`` its window start.
        owner: ``[n]`` the canary it belongs to.
        count: ``[m]`` windows per canary.
    """

    def __init__(self, rows: np.ndarray, starts: np.ndarray, owner: np.ndarray, m: int) -> None:
        self.rows, self.starts, self.owner = rows, starts, owner
        self.count = np.bincount(owner, minlength=m).astype(np.float64)


def canary_windows(plan: CanaryPlan, lengths: Sequence[int], past_length: int, prediction_length: int,
                   per_canary: int | None, rng: np.random.Generator) -> CanaryWindows:
    """For every canary, the windows that contain it (``per_canary`` of them drawn by the auditor's ``rng`` when it
    has more; ``None``: all)."""
    rows, starts, owner = [], [], []
    for j, c in enumerate(plan.canaries):
        s = window_starts(c, int(lengths[c.series]), past_length, prediction_length)
        if per_canary is not None and len(s) > per_canary:
            s = np.sort(rng.choice(s, size=per_canary, replace=False))
        rows.append(np.full(len(s), c.series, dtype=np.int64))
        starts.append(s)
        owner.append(np.full(len(s), j, dtype=np.int64))
    return CanaryWindows(np.concatenate(rows), np.concatenate(starts), np.concatenate(owner), len(plan))


def _per_window_grads(iso: IsolatedGradients, batch: dict[str, torch.Tensor], lo: int, hi: int,
                      leaves: list[Any], spec: Any, per_window: list[int]) -> torch.Tensor:
    """``[hi - lo, d]`` flat gradients of ``training_step`` on each window alone (vmapped where it runs)."""
    grads = iso._chunk(leaves, spec, per_window, lo, hi)
    return torch.cat([g.reshape(hi - lo, -1) for g in grads], dim=1)


class WhiteBoxScorer:
    """The white-box score of every canary, accumulated over the noisy steps (module docstring).

    Set it as ``strategy.audit_observer`` (the :class:`~lightning_dpts.training.DPForecastStrategy` seam that shows
    each step's noisy gradient before the update); :attr:`scores` then holds the scores.

    Args:
        plan: the canaries.
        windows: the windows scored per canary (:func:`canary_windows`).
        world_in: a datamodule over the data with every canary included (:meth:`CanaryPlan.world` ``"in"``).
        world_out: the same with every canary excluded.
        max_grad_norm: C.
        noise_std: sigma * C, the std the accountant assumes for the noise on the summed clipped gradient.
        batch_size: Lambda, the divisor of Algorithm 2.
        center: also subtract every *other* canary's expected contribution, sum_k (a_k + b_k) / 2 averaged over
            k's scored windows, from the update before scoring canary j (what the auditor knows of the rest of the
            batch when every series holds a canary): removes the other canaries' known offsets in shared
            parameters, leaving only their coins' +-(a_k - b_k) / 2 as interference. Holds every scored window's
            gradient at once (for small models; the audit model's orthogonal levels do not need it).
    """

    def __init__(self, plan: CanaryPlan, windows: CanaryWindows, world_in: Any, world_out: Any, *,
                 max_grad_norm: float, noise_std: float, batch_size: int, center: bool = False) -> None:
        self.plan = plan
        self.windows = windows
        self.batch_in = window_batch(world_in, windows.rows, windows.starts)
        self.batch_out = window_batch(world_out, windows.rows, windows.starts)
        self.max_grad_norm = float(max_grad_norm)
        self.noise_std = float(noise_std)
        self.batch_size = int(batch_size)
        self.scores = np.zeros(len(plan), dtype=np.float64)
        self.steps = 0
        self.center = bool(center)

    def __call__(self, module: L.LightningModule, strategy: Any, step: int, noisy: list[torch.Tensor]) -> None:
        iso: IsolatedGradients = strategy.noisy_step.isolated_gradients(module)
        y = torch.cat([g.reshape(-1) for g in noisy]).to(torch.float64) * self.batch_size
        numel = y.numel()
        leaves_in, spec_in, pw_in, n = iso.split(self.batch_in)
        leaves_out, spec_out, pw_out, _ = iso.split(self.batch_out)
        chunk = n if self.center else max(1, min(n, _CHUNK_ELEMENTS // max(1, numel)))
        per_window = np.zeros(n, dtype=np.float64)
        scale = self.noise_std ** 2
        with iso._context():
            for lo in range(0, n, chunk):
                hi = min(n, lo + chunk)
                a = _per_window_grads(iso, self.batch_in, lo, hi, leaves_in, spec_in, pw_in).to(torch.float64)
                b = _per_window_grads(iso, self.batch_out, lo, hi, leaves_out, spec_out, pw_out).to(torch.float64)
                a = a * clip_factors(a.pow(2).sum(1), self.max_grad_norm).to(a.dtype)[:, None]
                b = b * clip_factors(b.pow(2).sum(1), self.max_grad_norm).to(b.dtype)[:, None]
                target = y
                if self.center:  # y - sum_{k != owner} c_k, c_k = mean over k's windows of (a + b) / 2
                    owner = torch.from_numpy(self.windows.owner)
                    weight = torch.from_numpy(1.0 / np.maximum(self.windows.count, 1.0))[owner][:, None]
                    c = torch.zeros(len(self.plan), numel, dtype=torch.float64).index_add_(
                        0, owner, 0.5 * (a + b) * weight)
                    target = y[None, :] - c.sum(0)[None, :] + c[owner]
                    llr = ((a - b) * target).sum(1) - 0.5 * (a.pow(2).sum(1) - b.pow(2).sum(1))
                else:
                    llr = (a - b) @ y - 0.5 * (a.pow(2).sum(1) - b.pow(2).sum(1))
                llr = llr / scale
                per_window[lo:hi] = llr.cpu().numpy()
        self.scores += np.bincount(self.windows.owner, weights=per_window, minlength=len(self.plan)) / np.maximum(
            self.windows.count, 1.0)
        self.steps += 1


def _loss_differences(module: L.LightningModule, windows: CanaryWindows, world_in: Any, world_out: Any) -> np.ndarray:
    """``loss(excluded version) - loss(included version)`` of every scored window under ``module``."""
    step = module.training_step
    losses = []
    for dm in (world_in, world_out):
        batch = window_batch(dm, windows.rows, windows.starts)
        values = np.zeros(len(windows.rows), dtype=np.float64)
        with torch.no_grad(), silenced(module):
            for i in range(len(windows.rows)):
                loss = training_loss(step(IsolatedGradients.window(batch, i), 0))
                values[i] = float("nan") if loss is None else float(loss)
        losses.append(values)
    return losses[1] - losses[0]


def black_box_scores(module: L.LightningModule, windows: CanaryWindows, world_in: Any, world_out: Any, m: int,
                     reference: L.LightningModule | None = None) -> np.ndarray:
    """Per canary, ``mean_w [loss(excluded version of w) - loss(included version of w)]`` under ``module`` (the
    final model), each window's loss from ``training_step`` on that window alone, without gradients; minus the same
    under ``reference`` (the initial model, where given: the DP guarantee holds for every fixed initialisation, so
    an adversary may know it; subtracting it removes each canary's known offset, e.g. how far its base values lie
    from the initial forecast)."""
    diff = _loss_differences(module, windows, world_in, world_out)
    if reference is not None:
        diff = diff - _loss_differences(reference, windows, world_in, world_out)
    return np.bincount(windows.owner, weights=diff, minlength=m) / np.maximum(windows.count, 1.0)

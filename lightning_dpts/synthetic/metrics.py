"""Context-FID (Jeha et al., 2022) as a torchmetrics ``Metric``.

Context-FID is the Frechet distance between Gaussians fitted to the embeddings of real and of synthetic
windows in a contrastive encoder's space (PETS Section 3 and 4):

    C-FID = ||mu_r - mu_s||^2 + tr(S_r + S_s - 2 (S_r S_s)^{1/2})

with sample means mu and unbiased sample covariances S. The metric keeps running sums (count, sum, sum of
outer products, float64) per side, so its states reduce by summation across processes.

Evaluate with an encoder trained *separately* from the one PETS selects with (the paper scores with the same
encoder it votes with, which favours it): :func:`~lightning_dpts.synthetic.pretrain.pretrain_public_models`
trains a second one for this.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from scipy import linalg
from torchmetrics import Metric

__all__ = ["ContextFID", "frechet_distance"]


def frechet_distance(mu1: np.ndarray, cov1: np.ndarray, mu2: np.ndarray, cov2: np.ndarray) -> float:
    """Frechet distance between N(mu1, cov1) and N(mu2, cov2) (float64, matrix square root by scipy)."""
    diff = np.asarray(mu1, dtype=np.float64) - np.asarray(mu2, dtype=np.float64)
    covmean = linalg.sqrtm(np.asarray(cov1, dtype=np.float64) @ np.asarray(cov2, dtype=np.float64))
    if not np.all(np.isfinite(covmean)):  # singular product: regularise as the FID reference code does
        offset = np.eye(cov1.shape[0]) * 1e-6
        covmean = linalg.sqrtm((cov1 + offset) @ (cov2 + offset))
    covmean = np.real(covmean)
    return float(diff @ diff + np.trace(cov1) + np.trace(cov2) - 2.0 * np.trace(covmean))


class ContextFID(Metric):
    """Context-FID between real and synthetic windows (lower is closer).

    Args:
        encoder: maps windows ``[B, T]`` to embeddings ``[B, d]`` (e.g. ``ContrastiveEncoder.embed``); ``None``
            when :meth:`update` receives embeddings already.
        dim: the embedding dimension d.

    ``update(x, real)`` adds windows (or embeddings) to the real (``real=True``) or synthetic side; ``compute``
    needs at least two of each.
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    def __init__(self, dim: int, encoder: Callable[[torch.Tensor], torch.Tensor] | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.encoder = encoder
        self.dim = int(dim)
        for side in ("real", "fake"):
            self.add_state(f"{side}_n", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state(f"{side}_sum", torch.zeros(self.dim, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state(f"{side}_outer", torch.zeros(self.dim, self.dim, dtype=torch.float64),
                           dist_reduce_fx="sum")

    def update(self, x: torch.Tensor, real: bool) -> None:  # type: ignore[override]
        z = self.encoder(x) if self.encoder is not None else x
        z = torch.as_tensor(z).detach().to(torch.float64).reshape(-1, self.dim)
        side = "real" if real else "fake"
        setattr(self, f"{side}_n", getattr(self, f"{side}_n") + z.shape[0])
        setattr(self, f"{side}_sum", getattr(self, f"{side}_sum") + z.sum(0))
        setattr(self, f"{side}_outer", getattr(self, f"{side}_outer") + z.T @ z)

    def _moments(self, side: str) -> tuple[np.ndarray, np.ndarray]:
        n = float(getattr(self, f"{side}_n"))
        if n < 2:
            raise ValueError(f"ContextFID needs at least 2 {side} samples, got {int(n)}")
        s = getattr(self, f"{side}_sum").cpu().numpy()
        outer = getattr(self, f"{side}_outer").cpu().numpy()
        mu = s / n
        cov = (outer - n * np.outer(mu, mu)) / (n - 1.0)
        return mu, cov

    def compute(self) -> torch.Tensor:
        mu_r, cov_r = self._moments("real")
        mu_f, cov_f = self._moments("fake")
        return torch.tensor(frechet_distance(mu_r, cov_r, mu_f, cov_f), dtype=torch.float64)

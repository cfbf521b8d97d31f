"""The public models of PETS: the Conv1D variation VAE (Eq. 3, Eq. 4) and a TS2Vec-style contrastive encoder.

Both are LightningModules trained on *public* data only (by default the rule-based generator's output,
:func:`~lightning_dpts.synthetic.generator.generate_series`); PETS keeps them fixed while it touches private
data, so they carry no privacy cost. Inputs are windows ``[batch, length]`` z-scored per window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from lightning_dpts.errors import ConfigurationError

__all__ = ["ContrastiveEncoder", "VariationVAE", "DEFAULT_SCHEDULE", "variation_schedule"]

#: PETS Appendix D's schedule S3 (variation degrees per round, strong to weak), the default shape.
DEFAULT_SCHEDULE: tuple[float, ...] = (40, 35, 30, 25, 20, 15, 10, 5, 5, 5, 5)


def variation_schedule(rounds: int, schedule: Sequence[float] | None = None) -> list[float]:
    """``rounds`` variation degrees in [0, 100]: ``schedule`` (or S3) resampled to ``rounds`` entries.

    A schedule of length ``rounds`` is used as given; otherwise it is stretched or compressed over the rounds
    by nearest-position lookup, so the first round gets the first (strongest) degree and the last the last.
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigurationError("iterations", rounds, "must be an integer >= 1")
    base = list(DEFAULT_SCHEDULE if schedule is None else schedule)
    if not base:
        raise ConfigurationError("variation_schedule", schedule, "must hold at least one degree")
    for degree in base:
        if not (isinstance(degree, (int, float)) and 0 <= degree <= 100):
            raise ConfigurationError("variation_schedule", schedule, "degrees must lie in [0, 100]")
    if len(base) == rounds:
        return [float(d) for d in base]
    if rounds == 1:
        return [float(base[0])]
    return [float(base[round(i * (len(base) - 1) / (rounds - 1))]) for i in range(rounds)]


class VariationVAE(L.LightningModule):
    """Conv1D VAE for structure-preserving variation (PETS Section 3, Eq. 3 loss and Eq. 4 variation).

    Args:
        length: window length L (time steps).
        latent_dim: d_z.
        channels: Conv1D width.
        beta: weight of the KL term in Eq. 3.
        freq_weight: lambda_freq, weight of the FFT-magnitude term in Eq. 3.
        diff_weight, peak_weight: weights of L_aux's finite-difference and peak-matching terms.
        direction_scale: kappa of Eq. 4.
        learning_rate: Adam learning rate.
    """

    def __init__(self, length: int, latent_dim: int = 16, channels: int = 32, beta: float = 0.05,
                 freq_weight: float = 0.1, diff_weight: float = 0.5, peak_weight: float = 0.1,
                 direction_scale: float = 0.3, learning_rate: float = 3e-3) -> None:
        super().__init__()
        if isinstance(length, bool) or not isinstance(length, int) or length < 4:
            raise ConfigurationError("length", length, "must be an integer >= 4")
        self.save_hyperparameters()
        self.length = length
        half = math.ceil(length / 2)
        self.half = half
        self.encoder = nn.Sequential(
            nn.Conv1d(1, channels, 5, padding=2), nn.GELU(),
            nn.Conv1d(channels, channels, 5, stride=2, padding=2), nn.GELU(),
            nn.Conv1d(channels, channels, 3, padding=1), nn.GELU(),
        )
        self.to_stats = nn.Linear(channels * half, 2 * latent_dim)
        self.from_latent = nn.Linear(latent_dim, channels * half)
        self.decoder = nn.Sequential(
            nn.Conv1d(channels, channels, 3, padding=1), nn.GELU(),
            nn.Upsample(size=length, mode="linear", align_corners=False),
            nn.Conv1d(channels, channels, 5, padding=2), nn.GELU(),
            nn.Conv1d(channels, 1, 5, padding=2),
        )

    # -- Eq. 3 ------------------------------------------------------------------------------------------
    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Posterior mean and log-variance of q_phi(z | x) for standardised ``x`` ``[B, L]``."""
        h = self.encoder(x[:, None, :]).flatten(1)
        mu, logvar = self.to_stats(h).chunk(2, dim=-1)
        return mu, logvar.clamp(-10.0, 10.0)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """p_theta(x | z)'s mean, ``[B, L]``."""
        h = self.from_latent(z).view(z.shape[0], -1, self.half)
        return self.decoder(h)[:, 0, :]

    def loss(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """The terms of Eq. 3 (per-window sums, batch means) and their weighted total ``"loss"``."""
        mu, logvar = self.encode(x)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        x_hat = self.decode(z)
        hp = self.hparams
        recon = ((x - x_hat) ** 2).sum(-1).mean()
        kl = (-0.5 * (1 + logvar - mu**2 - logvar.exp())).sum(-1).mean()
        freq = ((torch.fft.rfft(x, dim=-1).abs() - torch.fft.rfft(x_hat, dim=-1).abs()) ** 2).sum(-1).mean()
        freq = freq / self.length
        diff = ((torch.diff(x, dim=-1) - torch.diff(x_hat, dim=-1)) ** 2).sum(-1).mean()
        peak = ((x.amax(-1) - x_hat.amax(-1)) ** 2 + (x.amin(-1) - x_hat.amin(-1)) ** 2).mean()
        total = recon + hp.beta * kl + hp.freq_weight * freq + hp.diff_weight * diff + hp.peak_weight * peak
        return {"loss": total, "recon": recon, "kl": kl, "freq": freq, "diff": diff, "peak": peak}

    def training_step(self, batch: torch.Tensor | Sequence[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        terms = self.loss(x)
        self.log_dict({f"vae_{k}": v for k, v in terms.items()}, prog_bar=False, on_step=False, on_epoch=True)
        return terms["loss"]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

    # -- Eq. 4 ------------------------------------------------------------------------------------------
    @staticmethod
    def degree_coefficients(degree: float) -> tuple[float, float, float]:
        """(s, rho, gamma) of Eq. 4 for ``variation_degree`` alpha in [0, 100].

        s = 2a (posterior noise scale) and rho = a^2 (prior mixing) increase, gamma = (1 - a)^2 (input blend)
        decreases with a = alpha / 100; alpha = 0 returns the input unchanged, alpha = 100 decodes a pure prior
        draw.
        """
        if isinstance(degree, bool) or not isinstance(degree, (int, float)) or not 0 <= degree <= 100:
            raise ConfigurationError("variation_degree", degree, "must lie in [0, 100]")
        a = float(degree) / 100.0
        return 2.0 * a, a * a, (1.0 - a) ** 2

    @torch.no_grad()
    def vary(self, x: torch.Tensor, degree: float, generator: torch.Generator | None = None) -> torch.Tensor:
        """Variations x' of windows ``x`` ``[B, L]`` (any scale) with ``variation_degree`` ``degree`` (Eq. 4).

        ``x`` is standardised per window before encoding, the decoded window is rescaled to the input's
        mean/std, then blended with the input: x' = (1 - gamma) x_dec + gamma x.
        """
        s, rho, gamma = self.degree_coefficients(degree)
        x = x.to(torch.float32)
        mean = x.mean(-1, keepdim=True)
        std = x.std(-1, keepdim=True, unbiased=False).clamp_min(1e-6)
        mu, logvar = self.encode((x - mean) / std)
        shape, kwargs = mu.shape, {"generator": generator, "dtype": mu.dtype}
        eps_post, eps_dir, eps_prior = (torch.randn(shape, **kwargs) for _ in range(3))
        z_tilde = mu + s * (0.5 * logvar).exp() * eps_post + self.hparams.direction_scale * s * eps_dir
        z_var = (1.0 - rho) * z_tilde + rho * eps_prior
        x_dec = self.decode(z_var)
        x_dec = (x_dec - x_dec.mean(-1, keepdim=True)) / x_dec.std(-1, keepdim=True, unbiased=False).clamp_min(1e-6)
        x_dec = x_dec * std + mean
        return (1.0 - gamma) * x_dec + gamma * x


class _DilatedBlock(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, channels, 3, padding=dilation, dilation=dilation)
        self.conv2 = nn.Conv1d(channels, channels, 3, padding=dilation, dilation=dilation)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.conv2(F.gelu(self.conv1(F.gelu(h))))


class ContrastiveEncoder(L.LightningModule):
    """A TS2Vec-style encoder (Yue et al., 2022): dilated convolutions, hierarchical contrastive loss.

    Training follows TS2Vec's recipe at a small size: two random overlapping crops of each window, random
    timestamp masking of the input projection, timestamp-level representations on the overlap, and the
    hierarchical loss (instance-wise + temporal contrast, repeated after max-pooling time by 2 until one step
    is left). :meth:`embed` max-pools the timestamp representations over time into one vector per window,
    the Phi of PETS Section 3 used for nearest-neighbour votes and for Context-FID.

    Args:
        hidden: channels of the dilated blocks; depth: number of blocks (dilations 1, 2, 4, ...).
        output_dim: embedding dimension d.
        learning_rate: Adam learning rate.
    """

    def __init__(self, hidden: int = 32, depth: int = 3, output_dim: int = 32, learning_rate: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.input_proj = nn.Linear(1, hidden)
        self.blocks = nn.Sequential(*[_DilatedBlock(hidden, 2**i) for i in range(depth)])
        self.output = nn.Conv1d(hidden, output_dim, 1)

    def timestamp_repr(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Timestamp-level representations ``[B, T, d]`` of windows ``x`` ``[B, T]``."""
        h = self.input_proj(x[..., None])
        if mask is not None:
            h = h * mask[..., None]
        h = self.blocks(h.transpose(1, 2))
        return self.output(h).transpose(1, 2)

    @torch.no_grad()
    def embed(self, x: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
        """One embedding per window, ``[B, d]`` (max-pool over time), for z-scored windows ``x`` ``[B, T]``."""
        was_training = self.training
        self.eval()
        out = [self.timestamp_repr(x[i:i + batch_size].to(torch.float32)).amax(1)
               for i in range(0, x.shape[0], batch_size)]
        self.train(was_training)
        return torch.cat(out) if out else torch.empty(0, self.hparams.output_dim)

    @staticmethod
    def _instance_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        b = z1.shape[0]
        if b == 1:
            return z1.new_zeros(())
        z = torch.cat([z1, z2], 0).transpose(0, 1)  # [T, 2B, d]
        sim = z @ z.transpose(1, 2)
        logits = torch.tril(sim, -1)[:, :, :-1] + torch.triu(sim, 1)[:, :, 1:]  # drop the diagonal
        logits = -F.log_softmax(logits, -1)
        i = torch.arange(b)
        return (logits[:, i, b + i - 1].mean() + logits[:, b + i, i].mean()) / 2

    @staticmethod
    def _temporal_loss(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        t = z1.shape[1]
        if t == 1:
            return z1.new_zeros(())
        z = torch.cat([z1, z2], 1)  # [B, 2T, d]
        sim = z @ z.transpose(1, 2)
        logits = torch.tril(sim, -1)[:, :, :-1] + torch.triu(sim, 1)[:, :, 1:]
        logits = -F.log_softmax(logits, -1)
        i = torch.arange(t)
        return (logits[:, i, t + i - 1].mean() + logits[:, t + i, i].mean()) / 2

    def hierarchical_loss(self, z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        """TS2Vec's hierarchical contrastive loss of two views ``[B, T, d]`` of the same time steps."""
        loss, levels = z1.new_zeros(()), 0
        while z1.shape[1] > 1:
            loss = loss + self._instance_loss(z1, z2) + self._temporal_loss(z1, z2)
            levels += 1
            z1 = F.max_pool1d(z1.transpose(1, 2), 2).transpose(1, 2)
            z2 = F.max_pool1d(z2.transpose(1, 2), 2).transpose(1, 2)
        if z1.shape[1] == 1:
            loss = loss + self._instance_loss(z1, z2)
            levels += 1
        return loss / max(levels, 1)

    def contrastive_loss(self, x: torch.Tensor) -> torch.Tensor:
        """The hierarchical loss of two random overlapping crops (with timestamp masking) of windows ``x``."""
        b, t = x.shape
        crop = int(torch.randint(max(2, t // 2), t + 1, (1,)))  # overlap length
        left = int(torch.randint(0, t - crop + 1, (1,)))
        a1 = int(torch.randint(0, left + 1, (1,)))
        b2 = int(torch.randint(left + crop, t + 1, (1,)))
        view1, view2 = x[:, a1:left + crop], x[:, left:b2]
        m1 = (torch.rand(view1.shape) > 0.1).to(x.dtype)
        m2 = (torch.rand(view2.shape) > 0.1).to(x.dtype)
        z1 = self.timestamp_repr(view1, m1)[:, left - a1:]
        z2 = self.timestamp_repr(view2, m2)[:, :crop]
        return self.hierarchical_loss(z1, z2)

    def training_step(self, batch: torch.Tensor | Sequence[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        loss = self.contrastive_loss(x)
        self.log("encoder_loss", loss, prog_bar=False, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.learning_rate)

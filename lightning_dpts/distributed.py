"""Process-group helpers for DP training on Lightning's DDP (``strategy="ddp"``; docs/distributed.md).

Algorithm 2 of *Privacy Amplification by Structured Subsampling for Deep Differentially Private Time Series
Forecasting* releases, per step, ``(sum_i clip_C(g_i) + N(0, sigma^2 C^2 I)) / Lambda`` over the windows i of
one structured sample. Run on W processes it must stay exactly that mechanism:

* **one global sample.** Every rank computes the same global batch from the same secret sampling entropy and
  keeps its share (:meth:`~lightning_dpts.data.sampler.StructuredSampler.shard`). The entropy is rank 0's fresh
  operating-system entropy, sent to the other ranks in memory over the process group
  (:func:`broadcast_sampling_state`); it is never written to any file and is not a seed. Identically seeded
  per-rank samplers would give every rank the same windows, independent per-rank samplers W independent
  samples: neither is the sampling the accountant assumes.
* **one noise draw.** Each rank clips its windows' gradients and sums them; the sums are added over the ranks by
  one ``all_reduce`` to which rank 0 alone adds one draw of N(0, sigma^2 C^2 I) from its own secret noise
  source (:func:`all_reduce_noisy_sum`). Per-rank noise averaged over ranks would be sqrt(W) too small; per-rank
  noise of std sigma C / sqrt(W) summed would have the right total variance, but an observer of one rank who
  knows its own share could subtract it.
* **one update.** All ranks divide the same reduced vector by the global Lambda and apply it;
  :func:`check_identical` compares a fingerprint of it across ranks at every step.

Only :mod:`torch.distributed` collectives are used, on the process group Lightning's DDP strategy created
(NCCL on GPUs, gloo on CPUs); tensors live on ``trainer.strategy.root_device``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from lightning_dpts.randomness import Entropy

if TYPE_CHECKING:
    import lightning as L

    from lightning_dpts.training.engine import NoiseSource

__all__ = [
    "all_reduce_noisy_sum",
    "broadcast_sampling_state",
    "check_identical",
    "distributed",
    "rank_and_world_size",
]

#: 32-bit words of the 128-bit sampling entropy sent by :func:`broadcast_sampling_state`.
_WORDS = 4


def rank_and_world_size(trainer: L.Trainer | None) -> tuple[int, int]:
    """(global rank, world size) of ``trainer``; (0, 1) without a trainer or without a process group."""
    if trainer is None:
        return 0, 1
    world = int(getattr(trainer, "world_size", 1) or 1)
    if world > 1 and not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return int(getattr(trainer, "global_rank", 0) or 0), world


def distributed(trainer: L.Trainer | None) -> bool:
    """``True`` when ``trainer`` runs more than one process in an initialised process group."""
    return rank_and_world_size(trainer)[1] > 1


def broadcast_sampling_state(entropy: Entropy, passes_started: int, device: torch.device) -> tuple[Entropy, int]:
    """Rank 0's sampling entropy and pass counter, on every rank (an in-memory ``broadcast``, never a file).

    Args:
        entropy: this rank's :class:`~lightning_dpts.randomness.Entropy` (only rank 0's is used; rank 0's is
            fresh operating-system entropy unless the user gave a seed).
        passes_started: this rank's pass counter (the largest over the ranks is kept, so no pass is reused).
        device: where the collective's tensor lives (``trainer.strategy.root_device``; CUDA for NCCL).

    Returns:
        ``(Entropy, passes_started)`` equal on every rank; the entropy is marked ``seeded`` iff rank 0's was.
    """
    value = entropy._value  # noqa: SLF001 - the one place the secret crosses a process boundary, in memory
    words = [(value >> (32 * k)) & 0xFFFFFFFF for k in range(_WORDS)]
    payload = torch.tensor([*words, int(entropy.seeded)], dtype=torch.int64, device=device)
    dist.broadcast(payload, src=0)
    counter = torch.tensor([int(passes_started)], dtype=torch.int64, device=device)
    dist.all_reduce(counter, op=dist.ReduceOp.MAX)
    received = [int(w) for w in payload.tolist()]
    payload.zero_()
    shared = sum(received[k] << (32 * k) for k in range(_WORDS))
    return Entropy(shared, seeded=bool(received[_WORDS])), int(counter.item())


def all_reduce_noisy_sum(
    sums: list[torch.Tensor | None],
    params: list[torch.Tensor],
    noise_std: float,
    expected_batch_size: int,
    noise: NoiseSource | None,
    *,
    failed: bool = False,
) -> tuple[list[torch.Tensor], int]:
    """Algorithm 2's last line over all ranks: (sum over ranks of the clipped sums + one Gaussian draw) / Lambda.

    Every rank passes its own clipped sums (``None`` for a parameter without windows on this rank, e.g. an empty
    local batch: it contributes zero but still joins the collective). Rank 0 passes its noise source and adds one
    draw of N(0, ``noise_std``^2 I) to its contribution; every other rank passes ``noise=None`` and adds nothing.
    One ``all_reduce(SUM)`` of one flat vector (all parameters, ``4 x numel`` bytes in float32) then gives every
    rank ``sum_ranks sum_i clip_C(g_i) + N(0, noise_std^2 I)``, which is divided by the global ``Lambda``.

    Args:
        failed: this rank cannot contribute (its clipping failed, e.g. a non-finite per-window gradient, or its
            step was refused before clipping; pass ``sums`` of ``None``). One extra element of the same all-reduce
            counts the failed ranks, so every rank learns it at once.

    Returns:
        The noisy averaged gradient of every parameter (views of one flat tensor), identical on every rank, and
        the number of ranks that passed ``failed=True``.
    """
    dtype, device = params[0].dtype, params[0].device
    numel = sum(p.numel() for p in params)
    flat = torch.zeros(numel + 1, dtype=dtype, device=device)
    if noise is not None:
        flat[:numel] = noise.sample(numel, noise_std, dtype).to(device=device, dtype=dtype)
    flat[numel] = float(failed)
    offset = 0
    for p, g in zip(params, sums, strict=True):
        if g is not None:
            flat[offset : offset + p.numel()].add_(g.reshape(-1).to(device=device, dtype=dtype))
        offset += p.numel()
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    failures = int(round(float(flat[numel])))
    grads = flat[:numel].div_(expected_batch_size)
    out = []
    offset = 0
    for p in params:
        out.append(grads[offset : offset + p.numel()].view(p.shape))
        offset += p.numel()
    return out, failures


def check_identical(grads: list[torch.Tensor], step: int) -> None:
    """Raise on every rank if the ranks' gradients differ (one ``all_reduce`` of 4 float64 numbers).

    The fingerprint is (sum, sum of squares) of the flat gradient in float64; its maximum and minimum over the
    ranks are compared, so every rank reaches the same verdict (no rank is left waiting in a later collective).
    """
    if not grads:
        return
    device = grads[0].device
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for g in grads:
        g64 = g.detach().to(torch.float64)
        total[0] += g64.sum()
        total[1] += g64.square().sum()
    both = torch.cat([total, -total])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    if not torch.equal(both[:2], -both[2:]):
        raise RuntimeError(
            f"noisy step {step}: the ranks' DP gradients differ (fingerprint max {both[:2].tolist()}, min "
            f"{(-both[2:]).tolist()}); the model replicas would diverge. Report this as a bug"
        )


"""Secret, fresh randomness for every draw that protects privacy (docs/privacy.md, rule 7).

Every bound this package reports assumes the adversary knows the code, the configuration and every artifact a
run writes (checkpoints, logs, reports, plots), but *not* the randomness of the batch sampling, the gradient
noise, the release masks and noise, or the synthetic-data votes (Kerckhoffs' principle; Opacus calls the
hardened variant ``secure_mode``). This module is the one place that randomness comes from:

* :func:`resolve_entropy` turns a user's ``seed`` argument into an :class:`Entropy`: ``None`` (the default
  everywhere) draws 128 bits from the operating system (:mod:`secrets`); an integer is accepted only for
  experiments and tests, and the returned object is marked ``seeded`` so that the run can say - in its log, its
  report and its checkpoint metadata - that its guarantee does not hold against anyone who knows the seed.
* :func:`numpy_generator` and :func:`torch_generator` derive independent streams from it with numpy's
  ``SeedSequence`` (a stream key such as ``(epoch, step)`` selects the stream; different keys give statistically
  independent streams).
* :class:`GaussianNoise` draws the DP noise: from a ``torch.Generator`` keyed by OS entropy (fast), or in
  ``secure`` mode from a cryptographically secure generator seeded by the operating system (OpenSSL's CTR-DRBG,
  else ``os.urandom``) with a floating-point mitigation against the attacks on the floating-point values of
  Gaussian samples (:func:`secure_standard_normal`).

Rules the rest of the package follows: an :class:`Entropy` is never written to any artifact (its ``repr`` hides
the value, and it refuses to be pickled into anything but a live DataLoader worker); a resumed or restarted run
draws a *fresh* :class:`Entropy`, so nothing is ever replayed by construction.
"""

from __future__ import annotations

import math
import os
import secrets
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_dpts.errors import ConfigurationError

if TYPE_CHECKING:  # torch stays optional for the privacy layer and the CLI's planning commands
    import torch

__all__ = [
    "SEEDED_NOTICE",
    "Entropy",
    "GaussianNoise",
    "numpy_generator",
    "resolve_entropy",
    "secure_standard_normal",
    "torch_generator",
]

#: What a seeded run says in its log, report and checkpoint metadata.
SEEDED_NOTICE = (
    "this run used an explicit seed: its sampling and noise are a public function of that seed, so the reported "
    "(epsilon, delta) guarantee does NOT hold against anyone who knows the seed (use seed=None, the default, "
    "for data you release)"
)

_ENTROPY_BITS = 128

try:  # OpenSSL's CSPRNG (ssl is part of the standard library; a Python built without it falls back to os.urandom)
    from ssl import RAND_bytes as _RAND_bytes
except ImportError:  # pragma: no cover - no OpenSSL
    _RAND_bytes = None
#: the low 53 bits of a 64-bit word: a uniform's mantissa (:func:`secure_standard_normal`)
_LOW_53 = (1 << 53) - 1


class Entropy:
    """The secret root of one run's privacy-protecting randomness.

    Attributes:
        seeded: ``True`` when the value came from a user's seed (experiments only: the guarantee does not hold
            against anyone who knows it); ``False`` when it came from the operating system.
    """

    __slots__ = ("_value", "seeded")

    def __init__(self, value: int, seeded: bool) -> None:
        self._value = int(value)
        self.seeded = bool(seeded)

    @classmethod
    def fresh(cls) -> Entropy:
        """128 bits from the operating system's CSPRNG (:func:`secrets.randbits`)."""
        return cls(secrets.randbits(_ENTROPY_BITS), seeded=False)

    def seed_sequence(self, *key: int) -> np.random.SeedSequence:
        """numpy ``SeedSequence`` of the stream ``key`` (non-negative integers)."""
        return np.random.SeedSequence(self._value, spawn_key=tuple(int(k) for k in key))

    def __repr__(self) -> str:  # never print the value
        return f"Entropy(seeded={self.seeded})" if self.seeded else "Entropy(<secret, from the operating system>)"

    def __reduce__(self) -> Any:
        # DataLoader worker processes receive the sampler by pickling over a pipe; that is in memory and dies with
        # the run. Anything else (torch.save of a checkpoint, a pickled datamodule on disk) would write the secret.
        # The sampler and strategy never put an Entropy in a state_dict; this guard catches accidental pickling
        # outside a worker start-up, which is the only pickling that happens inside DataLoader.__iter__.
        if not _PICKLE_ALLOWED:
            raise TypeError(
                "lightning_dpts.randomness.Entropy must not be pickled: it is the secret that protects privacy and "
                "would let anyone who reads the file regenerate the batches or the noise"
            )
        return (Entropy, (self._value, self.seeded))


_PICKLE_ALLOWED = False


class allow_worker_pickling:  # noqa: N801 - used as a context manager, reads like a statement
    """Context in which an :class:`Entropy` may be pickled (starting DataLoader worker processes)."""

    def __enter__(self) -> None:
        global _PICKLE_ALLOWED
        self._previous = _PICKLE_ALLOWED
        _PICKLE_ALLOWED = True

    def __exit__(self, *exc: object) -> None:
        global _PICKLE_ALLOWED
        _PICKLE_ALLOWED = self._previous


def resolve_entropy(seed: int | None, parameter: str = "seed") -> Entropy:
    """The run's :class:`Entropy`: fresh OS entropy for ``None``, else derived from an explicit seed.

    Args:
        seed: ``None`` (default everywhere; secret, fresh, the guarantee holds) or an integer >= 0 for
            reproducible experiments (the guarantee does not hold against anyone who knows it; see
            :data:`SEEDED_NOTICE`).
        parameter: the parameter's name for the error message.

    Raises:
        ConfigurationError: ``seed`` is not ``None`` nor an integer >= 0.
    """
    if seed is None:
        return Entropy.fresh()
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigurationError(parameter, seed, "must be None (secret OS entropy, the default) or an integer >= 0")
    return Entropy(int(seed), seeded=True)


def numpy_generator(entropy: Entropy, *key: int) -> np.random.Generator:
    """A numpy ``Generator`` (PCG64) for stream ``key`` of ``entropy`` (e.g. ``(epoch, step)``)."""
    return np.random.Generator(np.random.PCG64(entropy.seed_sequence(*key)))


def torch_generator(entropy: Entropy, *key: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with 64 bits of stream ``key`` of ``entropy``."""
    import torch

    seed = int(entropy.seed_sequence(*key).generate_state(1, np.uint64)[0])
    return torch.Generator(device=device).manual_seed(seed)


def _csprng_bytes(n: int) -> bytes:
    """``n`` bytes from a cryptographically secure generator that the operating system seeds: OpenSSL's
    ``RAND_bytes`` (``ssl.RAND_bytes``: its CTR-DRBG, AES-256 in counter mode per NIST SP 800-90A, seeded and
    reseeded from the OS's entropy, fork-safe; about 7 GB/s with AES instructions, measured 20-50x faster than
    ``os.urandom`` here), else ``os.urandom``. The generator's state lives in OpenSSL's (or the kernel's) memory
    only: this package never holds, writes or replays it."""
    if _RAND_bytes is not None:
        return _RAND_bytes(n)
    return os.urandom(n)


def secure_standard_normal(n: int) -> np.ndarray:
    """``n`` float64 draws of N(0, 1) from a CSPRNG seeded by the operating system, to be rounded once to float32.

    Each value takes 8 bytes of :func:`_csprng_bytes` (nothing is kept between calls, so nothing can be written or
    replayed): a 53-bit uniform in (0, 1) (offset by half a unit), paired with another through Box-Muller in
    float64 (one pair gives two values).

    The attack this stops (Mironov, CCS 2012; Holohan & Braghin 2021, arXiv:2107.10138; Jin et al., S&P 2022,
    arXiv:2112.05307, which broke Opacus' earlier sampler): the floating-point values a Gaussian sampler can output
    form a sparse, uneven subset of the floats, determined by its uniforms. Seeing y = x + z, the attacker asks for
    each candidate x (one per neighbouring dataset) whether y - x is a value the sampler can output, or how likely,
    and tells the datasets apart far better than the Gaussian's privacy loss allows. Opacus (``secure_mode``) makes
    that search expensive: it sums 4 float32 samples and halves (the search grows from 2^53 to 2^159 trials).
    Here the sample is computed in float64 from 53-bit uniforms and rounded once to the model's float32
    (:class:`GaussianNoise`): the float64 values are sparse only at float64 resolution, 29 bits finer than float32,
    so every float32 value z with 2^-20 <= |z| < 8.5 (in units of the std) is an output, each with the Gaussian mass
    of its float32 cell to within far less than 2^-20 of it. The test "is y - x an output, how likely" then gives
    what the continuous Gaussian gives: the attack has nothing to read, not merely a long search. The tail is cut
    at |z| = sqrt(2 ln 2^54) = 8.6, as in any sampler from 53-bit uniforms. A float64 model has no rounding step;
    :class:`GaussianNoise` then applies Opacus' sum of 4 (:func:`_secure_summed_normal`).
    """
    import torch

    if n < 0:
        raise ConfigurationError("n", n, "must be >= 0")
    pairs = (n + 1) // 2
    words = torch.frombuffer(bytearray(_csprng_bytes(16 * pairs)), dtype=torch.int64) if pairs else \
        torch.zeros(0, dtype=torch.int64)
    u = (words & _LOW_53).double().add_(0.5).mul_(2.0**-53)  # (torch: 10-30x faster than numpy here for
    radius, angle = u[:pairs], u[pairs:]  # the uint64 conversion and the cosine, measured)
    radius.log_().mul_(-2.0).sqrt_()
    angle.mul_(2.0 * math.pi)
    out = torch.empty(2 * pairs, dtype=torch.float64)
    torch.cos(angle, out=out[:pairs])
    torch.sin(angle, out=out[pairs:])
    out.view(2, pairs).mul_(radius)
    return out[:n].numpy()


def _secure_summed_normal(n: int) -> np.ndarray:
    """Opacus' floating-point mitigation for float64 noise (no rounding step follows): the sum of 4 independent
    :func:`secure_standard_normal` draws, halved (still N(0, 1))."""
    out = secure_standard_normal(n)
    for _ in range(3):
        out += secure_standard_normal(n)
    out *= 0.5
    return out


class GaussianNoise:
    """The Gaussian noise of DP training: N(0, std^2) per coordinate, secret and fresh.

    Args:
        entropy: the run's :class:`Entropy` (fresh OS entropy unless the user gave a seed).
        secure: ``False`` (default): a ``torch.Generator`` keyed by ``entropy`` (fast; the key is secret and
            never stored). ``True``: every draw comes from a CSPRNG that the OS seeds (OpenSSL's, else
            ``os.urandom``; :func:`secure_standard_normal`), computed in float64 and rounded once to ``dtype``
            (float32: the floating-point mitigation described there; float64: Opacus' sum of 4). Opacus
            ``secure_mode``'s threat model; ignores a seed, so a seeded secure run is refused. Its cost is measured
            by ``benchmarks/randomness.py`` (the draw) and ``benchmarks/dp_training.py`` (the fit).
        stream: stream key under ``entropy`` (keeps noise independent from the sampling streams).

    :meth:`prepare` starts the next draw in a background thread (the noise does not depend on the data, so DP
    training draws it while the step's forward and backward pass run); :meth:`close` ends that thread. The object
    has no ``state_dict``: a resumed run builds a new one from fresh entropy, so no noise is replayed.
    """

    def __init__(
        self, entropy: Entropy, *, secure: bool = False, stream: tuple[int, ...] = (7,)
    ) -> None:
        if secure and entropy.seeded:
            raise ConfigurationError(
                "secure_mode", True, "draws from the operating system's CSPRNG and cannot be seeded; use seed=None"
            )
        self.secure = bool(secure)
        self.seeded = entropy.seeded
        self._generator = None if secure else torch_generator(entropy, *stream)
        self._pending: _Draw | None = None
        self._worker: Any = None  # the thread that prepares draws (started by prepare, ended by close)
        self._worker_pid = 0  # the process that started it

    def _draw(self, numel: int, std: float, dtype: torch.dtype) -> torch.Tensor:
        import torch

        if self.secure:
            wide = dtype == torch.float64
            z = _secure_summed_normal(numel) if wide else secure_standard_normal(numel)
            z *= float(std)
            return torch.from_numpy(z) if wide else torch.from_numpy(z).to(dtype)  # one rounding, float64 -> dtype
        out = torch.empty(numel, dtype=dtype)
        return out.normal_(0.0, float(std), generator=self._generator)

    def sample(self, numel: int, std: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A flat CPU tensor of ``numel`` independent N(0, std^2) draws (``dtype`` default float32).

        Every call returns a new tensor that no other call returns or reads again (the caller may modify it).
        """
        import torch

        dtype = torch.float32 if dtype is None else dtype
        std = float(std)
        pending, self._pending = self._pending, None
        out = None
        if pending is not None:
            drawn = pending.result()  # waits for the background draw; the generator is then free again
            if drawn.numel() == numel and drawn.dtype == dtype:
                out = drawn if pending.std == std else drawn.mul_(std / pending.std)  # pending.std > 0
            del drawn  # a mismatching draw is dropped here, never handed out
        if out is None:
            out = self._draw(numel, std, dtype)
        return out

    def prepare(self, numel: int, std: float, dtype: torch.dtype | None = None) -> None:
        """Start drawing, in the background thread, the vector that the next :meth:`sample` call hands out (if no
        draw is pending already): DP training calls it when a step starts, once the previous step's noisy gradients
        are released, so that the draw overlaps the forward and backward pass while only one noise vector is alive.

        The sequence of vectors is that of calls to :meth:`sample` alone (same generator, same order): a prepared
        draw is handed out once, in its own buffer, rescaled if :meth:`sample` asks for another ``std``, and dropped
        (never handed out later) if it asks for another size or dtype.
        """
        import torch

        if self._pending is None and numel > 0 and std > 0:
            if self._worker is None or self._worker_pid != os.getpid():  # (a forked child has no copy of the thread)
                self._worker, self._worker_pid = _start_worker(), os.getpid()
            self._pending = _Draw(self._worker, self._draw, int(numel), float(std),
                                  torch.float32 if dtype is None else dtype)

    def close(self) -> None:
        """End the background thread (waits for a pending draw, which is dropped, never handed out). Idempotent;
        :meth:`sample` still works afterwards (in the caller's thread) and :meth:`prepare` starts a new thread. DP
        training calls it at train end and on an exception; at interpreter exit every worker is ended anyway."""
        pending, self._pending = self._pending, None
        if pending is not None:
            try:
                pending.result()
            except Exception:  # noqa: BLE001 - a failed draw is dropped with the rest
                pass
        worker, self._worker = self._worker, None
        if worker is not None and self._worker_pid == os.getpid():
            worker.shutdown(wait=True)

    def __reduce__(self) -> Any:
        raise TypeError("lightning_dpts.randomness.GaussianNoise must not be pickled (it would write the secret)")


def _start_worker() -> Any:
    """One worker thread that prepares one :class:`GaussianNoise`'s draws (:meth:`GaussianNoise.prepare`), ended by
    :meth:`GaussianNoise.close` (and, for one never closed, by ``concurrent.futures`` at interpreter exit, before
    any daemon thread is frozen). :meth:`GaussianNoise.sample` waits for the object's pending draw before touching its
    generator, so no generator is ever used by two threads at once."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpts-noise")


class _Draw:
    """One noise vector drawn by the worker thread (torch, numpy and os.urandom release the GIL)."""

    __slots__ = ("std", "_future")

    def __init__(self, worker: Any, draw: Any, numel: int, std: float, dtype: Any) -> None:
        self.std = std
        self._future = worker.submit(draw, numel, std, dtype)

    def result(self) -> Any:
        """The drawn vector (waits for it); an exception of the draw is raised here."""
        value = self._future.result()
        self._future = None
        return value

"""The private part of PETS: private windows, the DP nearest-neighbour histogram (Algorithm 2) and the
Private Evolution loop (Algorithm 1), with lookahead, thresholding and conditional generation.

Only :func:`dp_nn_histogram` touches private data, once per round: each private unit votes for the synthetic
candidate nearest to it in the selection encoder's space (weights 1, or 1/m for series-level privacy), and
N(0, (sigma * Delta)^2) noise from :mod:`lightning_dpts.randomness` is added to every bin (see
:mod:`lightning_dpts.synthetic.privacy` for the sensitivity Delta and the accounting). Everything after the
noise is post-processing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import Entropy, GaussianNoise, numpy_generator, torch_generator
from lightning_dpts.synthetic.generator import generate_series, standardize_windows
from lightning_dpts.synthetic.models import ContrastiveEncoder, VariationVAE
from lightning_dpts.synthetic.privacy import UNITS, sensitivity

__all__ = ["PrivateWindows", "EvolutionResult", "dp_nn_histogram", "private_evolution", "private_windows",
           "vote_histogram"]

# stream keys under the run's Entropy (independent streams)
_STREAM_INITIAL, _STREAM_RESAMPLE, _STREAM_VARY, _STREAM_NOISE = 11, 12, 13, 14


@dataclass(frozen=True)
class PrivateWindows:
    """The private units' windows as PETS votes with them.

    Attributes:
        windows: ``[n, T]`` windows z-scored per window (no statistic crosses windows).
        weights: ``[n]`` vote weights: 1 per window (unit ``"window"``) or 1/m (unit ``"series"``).
        classes: ``[n]`` class index of every window (0 without a class column).
        series: ``[n]`` index of the series each window comes from.
        unit: ``"window"`` or ``"series"``; max_windows: m (series unit) or ``None``.
        skipped_missing: windows left out because they contain missing values (they cast no vote).
        raw_means, raw_stds: ``[n]`` mean and std of every window before z-scoring [data units]: private, in
            memory only (the scale round of :mod:`lightning_dpts.synthetic.scale` releases them with DP).
    """

    windows: np.ndarray
    weights: np.ndarray
    classes: np.ndarray
    series: np.ndarray
    unit: str
    max_windows: int | None
    skipped_missing: int
    raw_means: np.ndarray | None = None
    raw_stds: np.ndarray | None = None


def private_windows(series: Sequence[np.ndarray], length: int, *, unit: str = "series", max_windows: int = 4,
                    classes: Sequence[int] | None = None) -> PrivateWindows:
    """Cut private series into non-overlapping windows of ``length`` steps, newest first.

    Window positions depend only on series lengths (data-independent): from the end of each series backwards
    with stride ``length``. With ``unit="series"`` at most ``max_windows`` (m) windows per series are used and
    each votes with weight 1/m, so a whole series moves the histogram by at most 1 in L2 (module
    :mod:`~lightning_dpts.synthetic.privacy`). With ``unit="window"`` every window is a unit with weight 1.
    A window with a missing value casts no vote (dropping depends only on that unit's own data) and is counted
    in ``skipped_missing``.
    """
    if unit not in UNITS:
        raise ConfigurationError("unit", unit, f"must be one of {', '.join(UNITS)}")
    if isinstance(length, bool) or not isinstance(length, int) or length < 4:
        raise ConfigurationError("length", length, "must be an integer >= 4")
    if isinstance(max_windows, bool) or not isinstance(max_windows, int) or max_windows < 1:
        raise ConfigurationError("max_windows_per_series", max_windows, "must be an integer >= 1")
    out, weights, cls, idx, skipped = [], [], [], [], 0
    for i, values in enumerate(series):
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        count = len(values) // length
        if unit == "series":
            count = min(count, max_windows)
        for j in range(count):
            end = len(values) - j * length
            window = values[end - length:end]
            if not np.isfinite(window).all():
                skipped += 1
                continue
            out.append(window)
            weights.append(1.0 / max_windows if unit == "series" else 1.0)
            cls.append(0 if classes is None else int(classes[i]))
            idx.append(i)
    if not out:
        raise ConfigurationError("length", length, "no private series holds a complete window of this length")
    raw = np.stack(out)
    return PrivateWindows(standardize_windows(raw), np.asarray(weights), np.asarray(cls, dtype=np.int64),
                          np.asarray(idx, dtype=np.int64), unit, max_windows if unit == "series" else None, skipped,
                          raw.mean(axis=1), raw.std(axis=1))


def vote_histogram(private_embeddings: torch.Tensor, candidate_embeddings: torch.Tensor,
                   weights: torch.Tensor | np.ndarray) -> np.ndarray:
    """Algorithm 2, lines 1-5: each private sample adds its weight to its nearest candidate (L2 distance)."""
    if len(candidate_embeddings) == 0:
        raise ConfigurationError("num_samples", 0, "must be >= 1 per class")
    hist = np.zeros(len(candidate_embeddings), dtype=np.float64)
    if len(private_embeddings) == 0:
        return hist
    nearest = torch.cdist(private_embeddings.to(torch.float64), candidate_embeddings.to(torch.float64)).argmin(1)
    np.add.at(hist, nearest.numpy(), np.asarray(weights, dtype=np.float64))
    return hist


def dp_nn_histogram(clean: np.ndarray, noise: GaussianNoise, noise_multiplier: float, relation: str,
                    threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 2, lines 6-7: add N(0, (sigma * Delta)^2) to every bin, then max(h - H, 0).

    Returns ``(thresholded, noisy)``; ``noisy`` (before thresholding) stays in memory, never in an artifact.
    """
    std = float(noise_multiplier) * sensitivity(relation)
    noisy = clean + noise.sample(clean.size, std, torch.float64).numpy().reshape(clean.shape)
    return np.maximum(noisy - float(threshold), 0.0), noisy


@dataclass
class EvolutionResult:
    """What :func:`private_evolution` returns.

    Attributes:
        synthetic: ``[M, T]`` synthetic windows (z-scored scale), grouped by class.
        classes: ``[M]`` class index of each synthetic window.
        initial: ``[M, T]`` the public initial population S_0 (for the ``c_fid_initial`` comparison).
        rounds: T, the number of noisy histograms released to the loop.
        empty_rounds: (round, class) pairs whose thresholded histogram was all zero (resampled uniformly).
        noisy_histograms: the noisy histograms per round (in memory only; tests use them, nothing writes them).
        vote_stats: per round, computed from the *clean* votes (private, in memory only, never written; the
            benchmark's diagnosis reads them): ``votes`` (total vote weight), ``voted`` (candidates with a clean
            vote), ``kept`` (candidates with a positive thresholded count) and ``noise_share`` (share of the
            thresholded mass on candidates without any clean vote).
    """

    synthetic: np.ndarray
    classes: np.ndarray
    initial: np.ndarray
    rounds: int
    empty_rounds: list[tuple[int, int]] = field(default_factory=list)
    noisy_histograms: list[np.ndarray] = field(default_factory=list, repr=False)
    vote_stats: list[dict[str, float]] = field(default_factory=list, repr=False)


def _lookahead_embeddings(candidates: torch.Tensor, vae: VariationVAE, encoder: ContrastiveEncoder, degree: float,
                          lookahead: int, generator: torch.Generator) -> torch.Tensor:
    """Average embedding of ``lookahead`` variations of each candidate (PETS Appendix B.2); 0 = the candidate."""
    if lookahead == 0:
        return encoder.embed(_zscore(candidates))
    total = None
    for _ in range(lookahead):
        varied = vae.vary(candidates, degree, generator)
        emb = encoder.embed(_zscore(varied))
        total = emb if total is None else total + emb
    assert total is not None
    return total / lookahead


def _zscore(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(-1, keepdim=True)) / x.std(-1, keepdim=True, unbiased=False).clamp_min(1e-6)


def private_evolution(
    private: PrivateWindows,
    *,
    num_samples: int,
    num_classes: int,
    iterations: int,
    noise_multiplier: float,
    relation: str,
    threshold: float,
    lookahead: int,
    schedule: Sequence[float],
    vae: VariationVAE,
    encoder: ContrastiveEncoder,
    entropy: Entropy,
    secure_noise: bool = False,
    round_callback: Callable[[int], None] | None = None,
    noise_free: bool = False,
) -> EvolutionResult:
    """Algorithm 1 of PETS (with Algorithm 2 inside), all classes of a round sharing one noisy histogram.

    Args:
        private: the private windows (:func:`private_windows`).
        num_samples: M, synthetic windows in total (a multiple of ``num_classes``).
        num_classes: |C| (1 for unconditional generation).
        iterations: T rounds; each releases one noisy histogram (accounted by the caller).
        noise_multiplier: sigma (noise std per bin = sigma * Delta(relation)).
        relation: ``"add_remove"`` or ``"substitution"``.
        threshold: H of Algorithm 2 (>= 0), in votes.
        lookahead: k variations averaged per candidate embedding (0 = no lookahead).
        schedule: variation degree of every round (length ``iterations``, values in [0, 100]).
        vae, encoder: the public models (fixed).
        entropy: the run's secret randomness (:func:`lightning_dpts.randomness.resolve_entropy`).
        secure_noise: draw the vote noise from the OS CSPRNG (:class:`~lightning_dpts.randomness.GaussianNoise`).
        round_callback: called with the round number after each round (progress bars).
        noise_free: **not differentially private**: skip the vote noise (sigma = 0). A seam for tests and for
            ``benchmarks/synthetic.py``'s ceiling (what the votes could do without noise); no ``dpts synth`` option
            and no :class:`~lightning_dpts.app.synth_pipeline.SynthConfig` field reaches it.
    """
    if num_samples % num_classes != 0:
        raise ConfigurationError("num_samples", num_samples, f"must be a multiple of the number of classes "
                                 f"({num_classes}) (Algorithm 1 generates M/|C| per class)")
    if not (isinstance(threshold, (int, float)) and threshold >= 0):
        raise ConfigurationError("threshold", threshold, "must be a number >= 0")
    if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
        raise ConfigurationError("lookahead", lookahead, "must be an integer >= 0")
    if len(schedule) != iterations:
        raise ConfigurationError("variation_schedule", list(schedule), f"must hold {iterations} degrees")
    per_class = num_samples // num_classes
    length = private.windows.shape[1]
    noise = GaussianNoise(entropy, secure=secure_noise, stream=(_STREAM_NOISE,))
    initial = generate_series(num_samples, length, numpy_generator(entropy, _STREAM_INITIAL))
    population = torch.as_tensor(initial, dtype=torch.float32)
    private_x = torch.as_tensor(private.windows, dtype=torch.float32)
    private_emb = encoder.embed(private_x)
    class_of = np.repeat(np.arange(num_classes), per_class)
    result = EvolutionResult(synthetic=initial, classes=class_of, initial=initial, rounds=iterations)
    for t in range(iterations):
        degree = float(schedule[t])
        vary_gen = torch_generator(entropy, _STREAM_VARY, t)
        clean = np.zeros(num_samples)
        for c in range(num_classes):
            rows = slice(c * per_class, (c + 1) * per_class)
            emb = _lookahead_embeddings(population[rows], vae, encoder, degree, lookahead, vary_gen)
            mine = private.classes == c
            clean[rows] = vote_histogram(private_emb[torch.as_tensor(mine)], emb, private.weights[mine])
        if noise_free:
            noisy = clean.copy()
            hist = np.maximum(noisy - float(threshold), 0.0)
        else:
            hist, noisy = dp_nn_histogram(clean, noise, noise_multiplier, relation, threshold)
        result.noisy_histograms.append(noisy)
        kept = hist > 0
        result.vote_stats.append({
            "votes": float(clean.sum()), "voted": int((clean > 0).sum()), "kept": int(kept.sum()),
            "noise_share": float(hist[clean <= 0].sum() / hist.sum()) if hist.sum() > 0 else float("nan")})
        # ---- post-processing of the noisy histogram only ----
        rng = numpy_generator(entropy, _STREAM_RESAMPLE, t)
        chosen = np.empty(num_samples, dtype=np.int64)
        for c in range(num_classes):
            h = hist[c * per_class:(c + 1) * per_class]
            if h.sum() <= 0:
                result.empty_rounds.append((t + 1, c))
                p = np.full(per_class, 1.0 / per_class)
            else:
                p = h / h.sum()
            chosen[c * per_class:(c + 1) * per_class] = c * per_class + rng.choice(per_class, per_class, p=p)
        population = vae.vary(population[torch.as_tensor(chosen)], degree, vary_gen)
        if round_callback is not None:
            round_callback(t + 1)
    result.synthetic = population.numpy().astype(np.float64)
    return result

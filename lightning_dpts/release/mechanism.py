"""The release mechanism: (filter) -> Poisson time subsampling -> Gaussian noise -> imputation.

Koga et al. (AISTATS 2022) Algorithm 1, as used for inference privacy in Appendix H of the structured
subsampling paper. Everything after the noise (imputation, the forecaster) is post-processing; the sampled
index set J is data-independent and treated as public.

Entry points:

* :class:`TimeDomainSubsampling` -- privatise numpy arrays (time on the last axis; rows are independent).
* :func:`privatize_dataset` / :func:`release_forecasts` -- a whole GluonTS-style dataset (iterable of dicts
  with ``"target"`` and ``"start"``), before a GluonTS predictor.

Randomness (issue 9; docs/privacy.md, rule 7): the sampled steps J may be published, but the Gaussian noise must
stay secret, and a mask or noise reused by two releases turns their difference into the noise-free difference
of the private series. Every draw therefore comes from :mod:`lightning_dpts.randomness`: by default fresh
operating-system entropy on every call (two default releases never share mask or noise); an explicit ``seed``
is for experiments only, and the call then warns with :data:`~lightning_dpts.randomness.SEEDED_NOTICE`.
* :class:`~lightning_dpts.release.callback.PrivateInputCallback` -- a Lightning callback that privatises
  ``batch["past_target"]`` (or other keys) before every ``predict_step``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import SEEDED_NOTICE, numpy_generator, resolve_entropy

__all__ = [
    "IMPUTATIONS",
    "TimeDomainSubsampling",
    "gaussian_filter_kernel",
    "circulant_filter",
    "impute",
    "privatize_dataset",
    "release_forecasts",
]

Imputation = Literal["linear", "mean"]
IMPUTATIONS: tuple[str, ...] = ("linear", "mean")

#: Keys of a dataset entry that :func:`privatize_dataset` carries over (others would bypass the mechanism).
_ENTRY_KEYS = frozenset({"target", "start", "item_id", "feat_static_cat", "feat_static_real"})


def gaussian_filter_kernel(length: int, width: float) -> np.ndarray:
    """Koga et al. Appendix B.1: h_t proportional to exp(-((T/2 - |t - T/2|)/sigma_g)^2 / 2), ||h||_1 = 1.

    Args:
        length: T, the window length in time steps.
        width: sigma_g > 0 in time steps (the paper uses 10).
    """
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ConfigurationError("length", length, "must be an integer >= 1")
    if not (isinstance(width, (int, float)) and math.isfinite(width) and width > 0):
        raise ConfigurationError("width", width, "must be a finite number > 0 (time steps)")
    t = np.arange(length, dtype=np.float64)
    d = length / 2 - np.abs(t - length / 2)
    h = np.exp(-0.5 * (d / width) ** 2)
    return h / h.sum()


def circulant_filter(x: np.ndarray, kernel: np.ndarray) -> np.ndarray:
    """y_t = sum_k x_k h_{(t - k) mod T} along the last axis (Koga et al. Section 2), via the FFT."""
    x = np.asarray(x, dtype=np.float64)
    h = np.asarray(kernel, dtype=np.float64)
    n = x.shape[-1]
    return np.fft.irfft(np.fft.rfft(x, axis=-1) * np.fft.rfft(h), n=n, axis=-1)


def impute(values: np.ndarray, mask: np.ndarray, method: Imputation = "linear", fill_value: float = 0.0) -> np.ndarray:
    """Fill the steps where ``mask`` is False, row by row along the last axis.

    ``"linear"``: linear interpolation between sampled steps, nearest sampled value before the first and
    after the last one (Koga et al. Appendix B.1). ``"mean"``: the mean of the row's sampled values
    (Appendix H). A row without any sampled step becomes ``fill_value`` (data-independent).
    """
    if method not in IMPUTATIONS:
        raise ConfigurationError("imputation", method, "must be 'linear' or 'mean'")
    values = np.asarray(values, dtype=np.float64)
    mask = np.broadcast_to(np.asarray(mask, dtype=bool), values.shape)
    n = values.shape[-1]
    any_kept = mask.any(axis=-1, keepdims=True)
    if method == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(mask, values, 0.0).sum(axis=-1, keepdims=True) / mask.sum(axis=-1, keepdims=True)
        out = np.where(mask, values, mean)
    else:
        t = np.arange(n)
        prev = np.maximum.accumulate(np.where(mask, t, -1), axis=-1)  # last kept index <= t, or -1
        nxt = np.flip(np.minimum.accumulate(np.flip(np.where(mask, t, n), axis=-1), axis=-1), axis=-1)
        has_prev, has_next = prev >= 0, nxt < n
        pv = np.take_along_axis(values, np.clip(prev, 0, n - 1), axis=-1)
        nv = np.take_along_axis(values, np.clip(nxt, 0, n - 1), axis=-1)
        span = np.where(has_prev & has_next & (nxt > prev), nxt - prev, 1)
        frac = np.where(has_prev & has_next, (t - prev) / span, 0.0)
        out = np.where(has_prev, pv + frac * (nv - pv), nv)  # before the first kept step: nearest (next)
        out = np.where(has_prev & ~has_next, pv, out)  # after the last kept step: nearest (previous)
    return np.where(any_kept, out, fill_value)


@dataclass(frozen=True, eq=False)
class TimeDomainSubsampling:
    """Koga et al. Algorithm 1 with a noise std instead of (eps, delta): the privatisation of one window.

    Args:
        rate: p in (0, 1], probability that a time step is kept (Poisson subsampling).
        noise_std: s >= 0, std of the Gaussian noise added to each kept value, in series units (0 only for
            utility experiments: no privacy).
        imputation: ``"linear"`` (default) or ``"mean"``.
        filter_kernel: ``None`` or the first column h of the circulant filter, applied before subsampling;
            its length must equal the window length T (see :func:`gaussian_filter_kernel`).
        fill_value: output of a window in which no step was kept.

    Use :meth:`privatize` for one array; the accounting lives in :class:`~lightning_dpts.release.ReleaseSpec`.
    """

    rate: float
    noise_std: float
    imputation: Imputation = "linear"
    filter_kernel: np.ndarray | None = field(default=None, repr=False)
    fill_value: float = 0.0

    def __post_init__(self) -> None:
        p = self.rate
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise ConfigurationError("rate", p, "must lie in (0, 1] (Poisson subsampling rate p)")
        s = self.noise_std
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (math.isfinite(s) and s >= 0):
            raise ConfigurationError("noise_std", s, "must be a finite number >= 0 (series units)")
        if self.imputation not in IMPUTATIONS:
            raise ConfigurationError("imputation", self.imputation, "must be 'linear' or 'mean'")
        if self.filter_kernel is not None:
            h = np.asarray(self.filter_kernel, dtype=np.float64)
            if h.ndim != 1 or np.any(h < 0) or abs(h.sum() - 1) > 1e-9:
                raise ConfigurationError("filter_kernel", "array", "must be 1-d, non-negative and sum to 1")
            object.__setattr__(self, "filter_kernel", h)

    def privatize(self, x: np.ndarray, rng: np.random.Generator | int | None = None, *,
                  return_mask: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Privatise ``x`` (time on the last axis; every leading index is an independent window).

        Args:
            x: finite values, shape (..., T).
            rng: ``None`` (default: fresh operating-system entropy, secret), a numpy Generator the caller
                keeps secret, or an integer seed (experiments only: warns that the guarantee does not hold
                against anyone who knows it).
            return_mask: also return the boolean sampled-steps mask J (public by assumption).
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 0 or x.shape[-1] == 0:
            raise ConfigurationError("x", f"array of shape {x.shape}", "needs at least one time step")
        if not np.all(np.isfinite(x)):
            raise ConfigurationError("x", "array with NaN/inf", "the released window must be finite (impute "
                                     "missing values with public information first)")
        if self.filter_kernel is not None:
            if self.filter_kernel.shape[0] != x.shape[-1]:
                raise ConfigurationError("filter_kernel", f"length {self.filter_kernel.shape[0]}",
                                         f"must equal the window length {x.shape[-1]}")
            x = circulant_filter(x, self.filter_kernel)
        gen = rng if isinstance(rng, np.random.Generator) else _generator(rng, "rng")
        mask = gen.random(x.shape) < self.rate if self.rate < 1 else np.ones(x.shape, dtype=bool)
        noisy = x + self.noise_std * gen.standard_normal(x.shape)
        out = impute(noisy, mask, self.imputation, self.fill_value)
        return (out, mask) if return_mask else out

    __call__ = privatize


def _generator(seed: int | None, parameter: str, *key: int) -> np.random.Generator:
    """A generator from fresh OS entropy (``seed=None``) or, for experiments, from ``seed`` (warns)."""
    entropy = resolve_entropy(seed, parameter)
    if entropy.seeded:
        warnings.warn(f"{parameter}={seed}: {SEEDED_NOTICE}", UserWarning, stacklevel=3)
    return numpy_generator(entropy, *key)


def privatize_dataset(dataset: Iterable[Mapping[str, Any]], mechanism: TimeDomainSubsampling, context_length: int,
                      *, seed: int | None = None, release: int = 0) -> list[dict[str, Any]]:
    """Privatise the last ``context_length`` steps of every series and drop everything before them.

    Each entry (a dict with ``"target"`` and ``"start"``, e.g. a GluonTS ``ListDataset`` item) becomes
    ``{"target": privatised window, "start": start + (len - context_length), ...static keys}``, so a
    predictor sees *only* the released window. Every call draws fresh operating-system entropy (the default),
    so repeated releases never reuse a mask or noise; series i of release r uses stream (i, r) of it.

    Args:
        dataset: iterable of entries; only keys ``target, start, item_id, feat_static_cat,
            feat_static_real`` are allowed (dynamic features would bypass the mechanism).
        mechanism: the privatisation.
        context_length: T, the released window (include the model's lags). Shorter series are released whole.
        seed: ``None`` (default: secret, fresh entropy) or an integer for reproducible experiments only (warns
            with :data:`~lightning_dpts.randomness.SEEDED_NOTICE`: the guarantee does not hold against anyone
            who knows the seed). Never write the seed next to a release.
        release: index of this release (rolling forecasts: 0, 1, ...); with a seed, each index gets its own
            streams.
    """
    if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1:
        raise ConfigurationError("context_length", context_length, "must be an integer >= 1")
    if isinstance(release, bool) or not isinstance(release, (int, np.integer)) or release < 0:
        raise ConfigurationError("release", release, "must be an integer >= 0")
    entropy = resolve_entropy(seed)
    if entropy.seeded:
        warnings.warn(f"seed={seed}: {SEEDED_NOTICE}", UserWarning, stacklevel=2)
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(dataset):
        extra = set(entry) - _ENTRY_KEYS
        if extra:
            raise ConfigurationError("dataset", sorted(extra), f"entries may only hold {sorted(_ENTRY_KEYS)}; "
                                     "time-varying features would reach the forecaster without privatisation")
        target = np.asarray(entry["target"], dtype=np.float64)
        if target.ndim != 1:
            raise ConfigurationError("dataset", f"target of shape {target.shape}", "must be univariate (1-d)")
        offset = max(0, target.shape[0] - context_length)
        window = target[offset:]
        new = {k: v for k, v in entry.items() if k not in ("target", "start")}
        new["target"] = mechanism.privatize(window, numpy_generator(entropy, i, int(release))).astype(np.float32)
        new["start"] = entry["start"] + offset
        out.append(new)
    return out


def release_forecasts(predictor: Any, dataset: Iterable[Mapping[str, Any]], mechanism: TimeDomainSubsampling,
                      context_length: int, *, seed: int | None = None, release: int = 0) -> list[Any]:
    """Privatise ``dataset`` (see :func:`privatize_dataset`) and return ``list(predictor.predict(...))``.

    ``seed=None`` (default) draws fresh operating-system entropy; an integer is for experiments only.
    ``predictor`` is anything with a GluonTS-style ``predict(dataset)`` (e.g. a trained
    ``PyTorchPredictor`` or ``SeasonalNaivePredictor``). Account the release with
    :class:`~lightning_dpts.release.ReleaseAccountant` (one release per call; rolling calls compose).
    """
    private = privatize_dataset(dataset, mechanism, context_length, seed=seed, release=release)
    return list(predictor.predict(private))

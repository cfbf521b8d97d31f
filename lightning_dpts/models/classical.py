"""Classical forecasts of one window as fixed linear maps: the candidates of :mod:`lightning_dpts.models.combination`.

Every method here forecasts from the window's own past values alone, with fixed constants (no fitting across
windows, no statistic of a batch; docs/privacy.md, rule 8), and every one of them is **linear in the window**: a
forecast of H steps from a past window of P values is ``W @ z`` for a fixed ``[H, P]`` matrix ``W``, and so is the
one-step-ahead in-sample fit ``V @ z`` (``[P, P]``, row t predicts z_t from z_0..z_{t-1}). The matrices are built
once (numpy, float64) by running each method's recursion on coefficient vectors instead of numbers; the model
then applies all of them to a batch with one matrix product.

Methods (Hyndman & Athanasopoulos, *Forecasting: Principles and Practice*, 3rd ed., chapters 5, 8 and 3.4;
Makridakis et al. 2020, the M4 benchmarks), in :data:`METHODS` order:

* ``naive``: the last value; ``drift``: the last value plus h times the window's mean step; ``drift_recent``: the
  same with the mean step of the window's last quarter;
* ``ses_a`` for alpha in :data:`SES_ALPHAS`: simple exponential smoothing, level initialised at the first value;
* ``holt_a_b`` for (alpha, beta) in :data:`HOLT`: Holt's linear trend, level at the first value, trend at the
  first difference; ``damped_a_b_phi`` for :data:`DAMPED`: the damped trend (Gardner & McKenzie);
* ``theta_a`` for alpha in :data:`THETA_ALPHAS`: the M4 Theta benchmark's forecast, SES plus half the window's
  least-squares slope, ``b/2 * (h - 1 + 1/alpha - (1 - alpha)^P / alpha)`` (Hyndman & Billah 2003, section 3);
* ``snaive``: the value one season back (per season m); ``smean``: the mean of the last (up to) three seasons'
  values at the same phase; ``sdrift`` and ``sdrift1``: seasonal naive plus (k + 1) times the mean m-step
  difference of the window or of its last season (seasonal random walk with drift; k whole seasons ahead).

Two more candidates, :data:`FITTED`, fit their smoothing constant to the window (so they are not linear in it):
``ses_fit`` and ``theta_fit`` use the alpha of :data:`FIT_ALPHAS` with the window's smallest in-sample one-step
squared error of SES (:func:`ses_grid`, :func:`theta_drift`; the model computes them).

Seasonal adjustment (the M4 benchmarks' classical decomposition, additive here because windows are scaled and
may hold values of either sign): a centred moving average of order m (2 x m for even m) is the trend; the mean
of the detrended values at each phase, centred to sum zero, is the seasonal index. For several seasons the longer
one is removed first. The non-seasonal methods run on the adjusted window and the indices are added back to their
forecasts (:func:`seasonal_component`); whether a window's forecasts use the adjusted or the raw versions is the
M4 seasonality test (:func:`seasonality_flags`), a function of that window alone.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "DAMPED",
    "FIT_ALPHAS",
    "FITTED",
    "HOLT",
    "SES_ALPHAS",
    "THETA_ALPHAS",
    "candidate_names",
    "method_names",
    "ses_grid",
    "slope",
    "theta_drift",
    "method_maps",
    "seasonal_component",
]

#: Smoothing constants of the simple exponential smoothing candidates (a grid, as AutoETS would search).
SES_ALPHAS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7)
#: (alpha, beta) of the Holt linear-trend candidates.
HOLT: tuple[tuple[float, float], ...] = ((0.2, 0.05), (0.5, 0.1), (0.8, 0.2))
#: (alpha, beta, phi) of the damped-trend candidates.
DAMPED: tuple[tuple[float, float, float], ...] = ((0.2, 0.05, 0.9), (0.5, 0.1, 0.9), (0.3, 0.1, 0.98))
#: alpha of the Theta candidates' SES part.
THETA_ALPHAS: tuple[float, ...] = (0.1, 0.3, 0.6)
#: The grid searched per window by the fitted candidates :data:`FITTED` (0.05, 0.10, ..., 1.00).
FIT_ALPHAS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))
#: Candidates whose smoothing constant is fitted per window (not linear maps; the model computes them from
#: :func:`ses_grid`): SES and Theta with the alpha of :data:`FIT_ALPHAS` that has the window's smallest in-sample
#: one-step squared error of SES, as ETS and the M4 Theta benchmark estimate it (by grid instead of an optimiser).
FITTED: tuple[str, ...] = ("ses_fit", "theta_fit")


def _ses(p: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(final level ``[P]``, one-step fits ``[P, P]``) of SES as coefficients of z_0..z_{P-1}."""
    level = np.zeros(p)
    level[0] = 1.0
    fits = np.zeros((p, p))
    fits[0, 0] = 1.0  # z_0 "predicts" itself (no error at the first step)
    for t in range(1, p):
        fits[t] = level
        level = (1.0 - alpha) * level
        level[t] += alpha
    return level, fits


def _holt(p: int, h: int, alpha: float, beta: float, phi: float) -> tuple[np.ndarray, np.ndarray]:
    """(forecast map ``[H, P]``, one-step fits ``[P, P]``) of (damped) Holt's method."""
    level = np.zeros(p)
    level[0] = 1.0
    trend = np.zeros(p)
    if p > 1:  # the mean step over the first (up to) 12 values, as coefficients
        q = min(p - 1, 12)
        trend[0], trend[q] = -1.0 / q, 1.0 / q
    fits = np.zeros((p, p))
    fits[0, 0] = 1.0
    for t in range(1, p):
        fit = level + phi * trend
        fits[t] = fit
        new_level = (1.0 - alpha) * fit
        new_level[t] += alpha
        trend = beta * (new_level - level) + (1.0 - beta) * phi * trend
        level = new_level
    damp = np.cumsum(phi ** np.arange(1, h + 1))
    return level[None, :] + damp[:, None] * trend[None, :], fits


def slope(p: int) -> np.ndarray:
    """Least-squares slope of z on time, as coefficients ``[P]``."""
    t = np.arange(p, dtype=float)
    c = t - t.mean()
    return c / max(float((c * c).sum()), 1e-12)


def candidate_names(seasons: tuple[int, ...]) -> list[str]:
    """Every candidate of the combination: :func:`method_names`' linear maps, then :data:`FITTED`."""
    return [*method_names(seasons), *FITTED]


def ses_grid(p: int) -> tuple[np.ndarray, np.ndarray]:
    """SES at every alpha of :data:`FIT_ALPHAS`: (final levels ``[G, P]``, one-step fits ``[G, P, P]``), as
    coefficients of z_0..z_{P-1} (level initialised at the first value)."""
    out = [_ses(p, a) for a in FIT_ALPHAS]
    return np.stack([level for level, _ in out]), np.stack([fit for _, fit in out])


def theta_drift(p: int, h: int, alphas: tuple[float, ...] = FIT_ALPHAS) -> np.ndarray:
    """The Theta forecast's multiple of the slope at every alpha of ``alphas`` (default :data:`FIT_ALPHAS`),
    ``[len(alphas), H]``: ``(h - 1 + 1/a - (1 - a)^P / a) / 2`` (Hyndman & Billah 2003, section 3)."""
    a = np.asarray(alphas, dtype=float)[:, None]
    steps = np.arange(1, h + 1, dtype=float)[None]
    return (steps - 1.0 + 1.0 / a - (1.0 - a) ** p / a) / 2.0


def method_names(seasons: tuple[int, ...]) -> list[str]:
    """Candidate names in the order of :func:`method_maps`' rows (``snaive``/``smean`` once per season)."""
    names = ["naive", "drift", "drift_recent", *[f"ses_{a:g}" for a in SES_ALPHAS],
             *[f"holt_{a:g}_{b:g}" for a, b in HOLT], *[f"damped_{a:g}_{b:g}_{f:g}" for a, b, f in DAMPED],
             *[f"theta_{a:g}" for a in THETA_ALPHAS]]
    for m in seasons:
        if m > 1:
            names += [f"snaive_{m}", f"smean_{m}", f"sdrift_{m}", f"sdrift1_{m}"]
    return names


def _seasonal_index(p: int, m: int) -> np.ndarray:
    """Classical additive decomposition: seasonal index of each phase as coefficients, ``[m, P]`` (phase of t is
    t mod m; the indices sum to zero). Needs P >= 2m (else zeros: no adjustment)."""
    out = np.zeros((m, p))
    if m <= 1 or p < 2 * m:
        return out
    # centred moving average of order m (2 x m for even m): the trend at t, for t where it is defined
    if m % 2 == 0:
        kernel = np.full(m + 1, 1.0 / m)
        kernel[0] = kernel[-1] = 0.5 / m
    else:
        kernel = np.full(m, 1.0 / m)
    half = len(kernel) // 2
    sums = np.zeros((m, p))
    counts = np.zeros(m)
    for t in range(half, p - half):
        row = np.zeros(p)
        row[t - half: t + half + 1] -= kernel
        row[t] += 1.0  # detrended value z_t - trend_t
        sums[t % m] += row
        counts[t % m] += 1
    index = sums / np.maximum(counts, 1.0)[:, None]
    return index - index.mean(axis=0, keepdims=True)


def seasonal_component(p: int, h: int, seasons: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(in-window seasonal component ``[P, P]``, future seasonal component ``[H, P]``) of the sequential additive
    decomposition over ``seasons`` (longest first; seasons with P < 2m are skipped), as coefficients of z."""
    comp_in = np.zeros((p, p))
    comp_out = np.zeros((h, p))
    residual = np.eye(p)  # the series left after removing the seasons done so far, as coefficients of z
    for m in sorted((s for s in seasons if s > 1 and p >= 2 * s), reverse=True):
        index = _seasonal_index(p, m) @ residual  # [m, P]
        s_in = index[np.arange(p) % m]
        comp_in += s_in
        comp_out += index[(p + np.arange(h)) % m]
        residual = residual - s_in
    return comp_in, comp_out


def method_maps(p: int, h: int, seasons: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Forecast maps ``[K, H, P]`` and one-step fit maps ``[K, P, P]`` of the methods of :func:`method_names`, on
    the window as it is (no seasonal adjustment; see :func:`adjusted_maps`)."""
    steps = np.arange(1, h + 1, dtype=float)
    forecasts, fits = [], []
    last = np.zeros(p)
    last[-1] = 1.0
    lag1 = np.zeros((p, p))
    lag1[0, 0] = 1.0
    lag1[np.arange(1, p), np.arange(p - 1)] = 1.0
    forecasts.append(np.repeat(last[None], h, 0))
    fits.append(lag1)
    mean_step = (last - np.eye(p)[0]) / max(p - 1, 1)
    forecasts.append(last[None] + steps[:, None] * mean_step[None])
    fit = lag1.copy()
    for t in range(2, p):  # causal: the mean step of the values before t
        fit[t, t - 1] += 1.0 / (t - 1)
        fit[t, 0] -= 1.0 / (t - 1)
    fits.append(fit)
    q = max(1, min(p - 1, p // 4))  # the mean step over the last quarter of the window
    recent = last.copy()
    recent[p - 1 - q] -= 1.0
    recent /= q
    forecasts.append(last[None] + steps[:, None] * recent[None])
    fit = lag1.copy()
    for t in range(2, p):  # causal: the mean step of the (up to) q steps before t
        n = min(q, t - 1)
        fit[t, t - 1] += 1.0 / n
        fit[t, t - 1 - n] -= 1.0 / n
    fits.append(fit)
    ses_levels = {}
    for alpha in SES_ALPHAS:
        level, fit = _ses(p, alpha)
        ses_levels[alpha] = (level, fit)
        forecasts.append(np.repeat(level[None], h, 0))
        fits.append(fit)
    for alpha, beta, phi in [(a, b, 1.0) for a, b in HOLT] + list(DAMPED):
        f, fit = _holt(p, h, alpha, beta, phi)
        forecasts.append(f)
        fits.append(fit)
    trend = slope(p)
    for a, drift in zip(THETA_ALPHAS, theta_drift(p, h, THETA_ALPHAS), strict=True):
        level, fit = ses_levels.get(a) or _ses(p, a)
        forecasts.append(level[None] + drift[:, None] * trend[None])
        fits.append(fit + np.where(np.arange(p)[:, None] > 0, trend[None] / (2.0 * a), 0.0))
    for m in seasons:
        if m <= 1:
            continue
        back = m if p >= m else p
        f = np.zeros((h, p))
        f[np.arange(h), p - back + np.arange(h) % back] = 1.0
        forecasts.append(f)
        fit = lag1.copy()  # before one season is seen: the last value
        t = np.arange(back, p)
        fit[t] = 0.0
        fit[t, t - back] = 1.0
        fits.append(fit)
        seasons_seen = max(1, min(3, p // m))
        f = np.zeros((h, p))
        fit = lag1.copy()
        for j in range(seasons_seen):
            cols = p - back + np.arange(h) % back - j * m
            f[np.arange(h), np.clip(cols, 0, p - 1)] += 1.0 / seasons_seen
        for t in range(m, p):
            k = min(seasons_seen, t // m)
            fit[t] = 0.0
            fit[t, [t - (j + 1) * m for j in range(k)]] = 1.0 / k
        forecasts.append(f)
        fits.append(fit)
        # seasonal naive with drift: plus (k + 1) times the mean m-step difference, over the window (sdrift) or the
        # last season (sdrift1); k whole seasons ahead
        ahead = (np.arange(h) // back + 1.0)[:, None]
        snaive = forecasts[-2]
        for span in (p - back, min(back, p - back)):
            step = np.zeros(p)
            if span > 0:
                step[p - span:] += 1.0 / span
                step[p - span - back: p - back] -= 1.0 / span
            forecasts.append(snaive + ahead * step[None])
            fit = fits[-2] if span <= 0 else lag1.copy()
            for t in range(back + 1, p) if span > 0 else ():
                n = min(span, t - back)  # the mean m-step difference of the values before t
                fit[t] = 0.0
                fit[t, t - back] = 1.0
                fit[t, t - n: t] += 1.0 / n
                fit[t, t - n - back: t - back] -= 1.0 / n
            fits.append(fit)
    return np.stack(forecasts), np.stack(fits)


def adjusted_maps(p: int, h: int, seasons: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Like :func:`method_maps`, but the non-seasonal methods run on the seasonally adjusted window and get the
    seasonal component back (the seasonal ``snaive``/``smean`` rows are the same as :func:`method_maps`')."""
    forecasts, fits = method_maps(p, h, seasons)
    comp_in, comp_out = seasonal_component(p, h, seasons)
    adjust = np.eye(p) - comp_in
    n_plain = len(method_names(()))
    forecasts = forecasts.copy()
    fits = fits.copy()
    forecasts[:n_plain] = forecasts[:n_plain] @ adjust + comp_out[None]
    fits[:n_plain] = fits[:n_plain] @ adjust + comp_in[None]
    return forecasts, fits

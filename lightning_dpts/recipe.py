"""The default recipe of ``dpts fit``: every training choice from public metadata only.

:func:`choose_recipe` reads the number of series and their lengths, the frequency (season length), the horizon,
the budget (epsilon, delta) and the unit of privacy - **never a value of the series and never a test window** -
and returns a :class:`Recipe`: the model, its past window, which short series to leave out, the batch size, the
number of epochs, the clipping norm and learning rate, an estimate of the noise multiplier, and the reason for
each choice. Because it reads no values, choosing it costs no privacy (the lengths are public: the neighbouring
relations of this package, Definitions 3.5-3.7 of the paper, change values of protected steps, never the
number of steps of a series). ``dpts fit`` applies it for every option the user does not give, and calibrates
the actual noise multiplier on the datamodule's sampling spec with the PLD accountant as before.

The choices (docs/recipe.md has the measurements behind the constants):

* **model**: ``combination`` (:mod:`lightning_dpts.models.combination`): a learned combination of classical
  forecasts with a few dozen weights, starting at a classical combination; DP noise grows with the number of
  parameters, the signal does not. ``seasonal_linear`` (ten weights, starting at seasonal naive) takes the same
  recipe with its own past window.
* **past window** for ``combination``: P = 5 m_1 for a primary season m_1 > 1 (enough seasons for the classical
  decomposition), else 5H, and at least 2 m_2 for a second season m_2 (hourly data: two weeks); for
  ``seasonal_linear`` P = 2m (m > 1), else 2H. Either is capped so that one window P + H is at most
  :data:`MAX_WINDOW_FRACTION` of the shortest kept training part (Theorem 4.4's bottom-level rate
  r = (P + H) / T; above ~1/3 window subsampling amplifies little): a second season the cap does not leave room
  for is not used.
  The model reads no lag beyond P, so P is the whole L_C the accountant counts (docs/privacy.md, rule 3).
* **short series**: the shortest training series decides the bound (Appendix I.1). Leaving out the shortest
  series raises T for all others; the recipe leaves out at most :data:`MAX_DROPPED_FRACTION` of the series,
  and only if that multiplies the effective dataset size N/r (N series over the fraction r of a series one
  unit reaches) by at least :data:`MIN_DROP_GAIN`.
* **batch size, steps, sigma**: candidates Lambda (powers of two up to N) x steps S are scored by the
  signal-to-noise proxy ``Lambda * sqrt(S) / sigma`` (the clipped mean gradient has norm <= C, the noise on the
  S averaged updates has std sigma * C / (Lambda * sqrt(S)) per coordinate), with sigma for (epsilon, delta) in S
  steps from a fast Renyi-DP proxy of Theorem 4.4's per-step mechanism (Poisson-subsampled Gaussian, rate
  rho * r, sensitivity 2; Mironov et al. 2019), evaluated in milliseconds. Under a compute cap of
  :data:`MAX_WINDOW_GRADIENTS` per-window gradients and at least :data:`MIN_STEPS` steps the recipe takes the
  best score; the noise multiplier actually used is calibrated by the PLD accountant on the real spec.
* **too small a budget**: when the best score is below :data:`MIN_SNR`, the recipe says so before training
  (``Recipe.warnings``): the private model is then unlikely to beat seasonal naive.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from lightning_dpts.errors import ConfigurationError

__all__ = [
    "MAX_DROPPED_FRACTION",
    "MAX_GRAD_NORMS",
    "MAX_WINDOW_FRACTION",
    "MAX_WINDOW_GRADIENTS",
    "MIN_DROP_GAIN",
    "MIN_SNR",
    "MIN_STEPS",
    "PrivateTraining",
    "Recipe",
    "choose_recipe",
    "make_private_with_epsilon",
    "rdp_noise_multiplier",
]

#: The recipe's model.
RECIPE_MODEL = "combination"
#: The models the recipe configures (another ``--model`` keeps the options' earlier defaults).
RECIPE_MODELS: tuple[str, ...] = ("combination", "seasonal_linear")
#: Largest share of series the short-series threshold may leave out.
MAX_DROPPED_FRACTION = 0.2
#: Leave series out only if N/r grows at least this much.
MIN_DROP_GAIN = 1.5
#: One window (P + H) may cover at most this share of the shortest training part's T window starts (0.25 until
#: issue 37's validation windows: on M4 weekly, rolling, P = 65 instead of 43 lowered the private MASE by 1.3-1.5% at
#: epsilon 1 and 4 although sigma grew from 11.0 to 15.0 at epsilon 4: the model, not the noise, was the limit).
MAX_WINDOW_FRACTION = 0.35
#: Compute cap: batch size x steps, per-window gradients of the private run (the non-DP reference costs as much).
MAX_WINDOW_GRADIENTS = 64_000
#: Fewest optimizer steps a candidate may have (Adam at the recipe's learning rate needs a few hundred).
MIN_STEPS = 200
#: Step counts the recipe considers.
STEP_CANDIDATES: tuple[int, ...] = (200, 300, 400, 600, 800, 1000, 1500, 2000)
#: Below this signal-to-noise proxy (per sqrt(parameter)) the recipe warns that the budget is too small.
MIN_SNR = 5.0
#: Clipping norm C of the recipe's models (clips most windows' CRPS gradients, which are O(1) in scaled units;
#: for seasonal_linear the best geometric mean of the validation ratios over C in {1, 0.3, 0.1}, docs/recipe.md).
MAX_GRAD_NORM = 0.1
#: C per recipe model where it differs from :data:`MAX_GRAD_NORM`: combination's per-window CRPS gradients have norm
#: ~0.003 at initialisation (bundled data, M4 weekly), so C = 0.1 clipped almost none and the noise, sigma*C per
#: coordinate, was ~30x the typical window's gradient; chosen on validation windows (docs/utility.md).
MAX_GRAD_NORMS: dict[str, float] = {"combination": 0.001}
#: Adam learning rate of the recipe's models.
LEARNING_RATE = 1e-2
#: Trainable parameters of seasonal_linear (for the per-parameter signal-to-noise proxy).
NUM_PARAMETERS = 10
_ORDERS = np.arange(2, 257, dtype=np.float64)


@dataclass(frozen=True)
class Recipe:
    """What :func:`choose_recipe` chose, with the reasons. Units: time steps, windows, optimizer steps.

    Attributes:
        model: the model name (an entry of :data:`lightning_dpts.app.config.MODELS`).
        season_length: m, given or from the frequency (:func:`~lightning_dpts.data.seasonality.season_lengths`).
        context_length: P, the past window the model reads (no lags beyond it: the whole L_C).
        min_series_length: series shorter than this (whole length, time steps) are left out; ``None``: none.
        num_series: N, series trained on (after the threshold).
        dropped_series: how many series the threshold leaves out.
        min_training_length: L, the shortest training part of the kept series (after the held-out windows).
        bottom_level_rate: r = k / T of Theorem 4.4 for the chosen window and L.
        effective_dataset_size: N / r.
        batch_size: Lambda (windows per step; one window per sampled series).
        epochs: epochs to calibrate sigma for (``steps = epochs * floor(N / Lambda)``).
        steps: optimizer steps.
        noise_multiplier_estimate: sigma from the Renyi-DP proxy (the run calibrates the exact one).
        max_grad_norm: C.
        learning_rate: Adam learning rate.
        signal_to_noise: ``Lambda * sqrt(steps) / (sigma * sqrt(parameters))`` (the proxy; larger is better).
        regime: ``"large"`` (N/r >= 1e4), ``"medium"`` (>= 1e3) or ``"small"``.
        warnings: plain statements to show before training (e.g. the budget is too small for the data).
        reasons: one sentence per choice.
    """

    model: str
    season_length: int
    context_length: int
    min_series_length: int | None
    num_series: int
    dropped_series: int
    min_training_length: int
    bottom_level_rate: float
    effective_dataset_size: float
    batch_size: int
    epochs: int
    steps: int
    noise_multiplier_estimate: float
    max_grad_norm: float
    learning_rate: float
    signal_to_noise: float
    regime: str
    warnings: tuple[str, ...] = ()
    reasons: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly dictionary (for ``report.json["recipe"]``)."""
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        return d

    def describe(self) -> list[str]:
        """Log lines: the choices, then the reasons."""
        lines = [f"recipe ({self.regime} regime, effective dataset size N/r = {self.effective_dataset_size:.4g}): "
                 f"model {self.model}, past window {self.context_length}, batch size {self.batch_size}, "
                 f"{self.epochs} epochs ({self.steps} steps), C = {self.max_grad_norm:g}, "
                 f"learning rate {self.learning_rate:g}, sigma ~ {self.noise_multiplier_estimate:.3g}"]
        lines += [f"  {name}: {why}" for name, why in self.reasons.items()]
        return lines


_LOG_BINOMIAL: np.ndarray | None = None


def _log_binomials() -> np.ndarray:
    """log C(a, k) for the orders a of :data:`_ORDERS` and k = 0..max order (-inf where k > a); built once."""
    global _LOG_BINOMIAL
    if _LOG_BINOMIAL is None:
        from scipy.special import gammaln

        a = _ORDERS[:, None]
        k = np.arange(0, int(_ORDERS[-1]) + 1, dtype=np.float64)[None, :]
        kk = np.minimum(k, a)
        _LOG_BINOMIAL = np.where(k <= a, gammaln(a + 1) - gammaln(kk + 1) - gammaln(a - kk + 1), -np.inf)
    return _LOG_BINOMIAL


def _rdp_per_step(rate: float, noise: float) -> np.ndarray:
    """Renyi DP of the Poisson-subsampled Gaussian at integer orders :data:`_ORDERS` (Mironov et al. 2019, Sec. 3.3).

    ``log(sum_k C(a,k) (1-q)^(a-k) q^k exp((k^2 - k) / (2 s^2))) / (a - 1)`` with s the noise multiplier over
    the sensitivity.
    """
    if rate >= 1.0:
        return _ORDERS / (2.0 * noise**2)
    a = _ORDERS[:, None]
    k = np.arange(0, int(_ORDERS[-1]) + 1, dtype=np.float64)[None, :]
    terms = _log_binomials() + (a - k) * math.log1p(-rate) + k * math.log(rate) + (k * k - k) / (2.0 * noise**2)
    top = terms.max(axis=1, keepdims=True)
    return (top[:, 0] + np.log(np.exp(terms - top).sum(axis=1))) / (_ORDERS - 1.0)


def _rdp_epsilon(rate: float, noise: float, steps: int, delta: float) -> float:
    rdp = steps * _rdp_per_step(rate, noise)
    return float(np.min(rdp + math.log(1.0 / delta) / (_ORDERS - 1.0)))


def rdp_noise_multiplier(rate: float, steps: int, epsilon: float, delta: float) -> float:
    """Proxy sigma for Theorem 4.4's per-step mechanism, to compare candidates in milliseconds.

    The dominating pair of Theorem 4.4 is a Gaussian of std sigma against the mixture MoG([0, 2], [1-p, p]),
    p = rho * r: a subsampled Gaussian mechanism with sensitivity 2. This bounds it by Renyi DP at integer orders
    2..256 (Mironov et al. 2019) and converts with Mironov 2017, Proposition 3, then bisects sigma to 1%.
    **Not** the guarantee: ``dpts fit`` calibrates sigma with the PLD accountant
    (:func:`~lightning_dpts.privacy.calibrate_noise_multiplier`). Returns ``inf`` above sigma = 1e4.

    Why not ``dp_accounting.rdp.RdpAccountant``: at these 255 orders it takes about 0.3 s per evaluation on this
    machine, and a recipe makes several hundred (34 candidates x a bisection); this vectorised sum over one
    precomputed table of log-binomials takes 2-3 ms. It is a little looser than dp_accounting's
    (its conversion to (epsilon, delta) is the simple one), which only matters for ranking candidates.
    """
    lo, hi = 0.05, 0.1
    while _rdp_epsilon(rate, hi / 2.0, steps, delta) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e4:
            return math.inf
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        if _rdp_epsilon(rate, mid / 2.0, steps, delta) > epsilon:
            lo = mid
        else:
            hi = mid
    return hi


def _windows_containing(level: str, size: int, window: int, starts: int) -> int:
    k = window + size - 1 if level == "event" else size * window
    return max(1, min(k, starts))


def wanted_past_window(model: str, seasons: tuple[int, ...], horizon: int) -> int:
    """The past window the recipe wants for ``model`` before the cap (module docstring)."""
    season = seasons[0]
    if model == "seasonal_linear":
        return max(2, season + 1, 2 * season if season > 1 else 2 * horizon)
    wanted = 5 * season if season > 1 else 5 * horizon
    if len(seasons) > 1:
        wanted = max(wanted, 2 * seasons[1])
    return max(3, season + 1, wanted)


def model_parameters(model: str, seasons: tuple[int, ...], context_length: int) -> int:
    """Trainable parameters of the recipe's ``model`` for these seasons and past window (public metadata)."""
    if model == "seasonal_linear":
        return NUM_PARAMETERS
    from lightning_dpts.models.classical import candidate_names
    from lightning_dpts.models.combination import num_parameters, usable_seasons

    return num_parameters(len(candidate_names(usable_seasons(seasons, context_length))))


def choose_recipe(
    lengths: Sequence[int],
    *,
    freq: str,
    prediction_length: int,
    epsilon: float,
    delta: float,
    level: str = "event",
    size: int = 1,
    held_out_windows: int = 1,
    min_series_length: int | None = None,
    past_length: int | None = None,
    groups: int = 1,
    season_length: int | None = None,
    model: str = RECIPE_MODEL,
) -> Recipe:
    """Choose the training recipe from public metadata only (see the module docstring).

    Args:
        lengths: the length of every series (time steps); their number is N. No values.
        freq: pandas frequency of the series (its season length m, unless ``season_length`` gives it).
        prediction_length: H, the horizon.
        epsilon, delta: the budget.
        level, size: the neighbouring relation (``"event"``/``"user"``, w).
        held_out_windows: windows of H steps held out at the end of every series (test plus validation).
        min_series_length: a threshold the user gave (series shorter than this many steps are left out; 1 keeps
            all): the recipe then makes its other choices for the series it keeps instead of choosing one.
        past_length: the past window a given model reads (context plus every lag, time steps): the recipe then
            keeps it instead of choosing one (:func:`make_private_with_epsilon` passes the user's model's).
        groups: k >= 1, cyclic Poisson sampling in k groups (``dpts fit --bands k``: amplified BandMF, k = b): the
            batch is at most N/k series (an eligible series is sampled with probability N' k / N <= 1) and the
            noise proxy composes ceil(S/k) steps at rate N' k r / N.
        season_length: m (``dpts fit --season-length``); ``None``: the primary season of ``freq``
            (:func:`~lightning_dpts.data.seasonality.season_lengths`: daily 7, hourly 24 and 168, monthly 12).
        model: one of :data:`RECIPE_MODELS` (its past window and parameter count; default the recipe's own).

    Returns:
        The :class:`Recipe` (deterministic: the same metadata gives the same recipe).

    Raises:
        ConfigurationError: no series or no series long enough for one training window (``data``), or a budget
            that no noise multiplier <= 1e4 reaches for any candidate.
    """
    from lightning_dpts.data.seasonality import season_lengths

    if model not in RECIPE_MODELS:
        raise ConfigurationError("model", model, f"must be one of {', '.join(RECIPE_MODELS)} for the recipe")
    sizes = np.asarray([int(n) for n in lengths], dtype=np.int64)
    if sizes.size == 0:
        raise ConfigurationError("data", 0, "has no series")
    if not (isinstance(prediction_length, int) and prediction_length >= 1):
        raise ConfigurationError("prediction_length", prediction_length, "must be an integer >= 1")
    from lightning_dpts.data.datamodule import too_short as short_mask

    horizon = prediction_length
    seasons = season_lengths(freq, season_length)
    season = seasons[0]
    train = sizes - held_out_windows * horizon
    usable = np.sort(train[~short_mask(sizes, horizon, held_out_windows)])  # the datamodule's rule
    if usable.size == 0:
        raise ConfigurationError("data", f"{sizes.size} series of at most {int(sizes.max())} steps",
                                 f"no series has a training part of >= prediction_length={horizon} steps after the "
                                 f"{held_out_windows} held-out window(s) of {horizon} steps; use longer series or a "
                                 "shorter --prediction-length")
    reasons: dict[str, str] = {}
    warn: list[str] = []
    fixed_past = past_length is not None
    if fixed_past and not (isinstance(past_length, int) and past_length >= 1):
        raise ConfigurationError("past_length", past_length, "must be an integer >= 1")
    past = int(past_length) if fixed_past else wanted_past_window(model, seasons, horizon)
    reasons["model"] = (
        f"{model}: ten weights starting at seasonal naive (season {season}); " if model == "seasonal_linear" else
        f"{model}: a learned combination of classical forecasts (seasons {', '.join(map(str, seasons))}), starting "
        "at a classical combination; ") + ("DP noise grows with the number of parameters, and a compact model is "
                                           "what a budget of this size can train")

    def effective(threshold_train: int, window: int) -> tuple[int, float, float]:
        n = int((usable >= threshold_train).sum())
        starts = threshold_train - horizon + 1
        r = _windows_containing(level, size, window, starts) / starts
        return n, r, n / r

    # short-series threshold: candidates are the distinct training lengths, dropping at most a fifth of series
    base_n, base_r, base_eff = effective(int(usable[0]), past + horizon)
    best = (int(usable[0]), base_n, base_r, base_eff)
    max_drop = int(math.floor(MAX_DROPPED_FRACTION * sizes.size))
    for candidate in np.unique(usable):
        n, r, eff = effective(int(candidate), past + horizon)
        if sizes.size - n > max_drop:
            break
        if eff > best[3]:
            best = (int(candidate), n, r, eff)
    threshold_train, num_series, rate, eff = best
    too_short = int(sizes.size - usable.size)
    if eff < MIN_DROP_GAIN * base_eff or too_short:
        threshold_train, num_series, rate, eff = int(usable[0]), base_n, base_r, base_eff
    if min_series_length is not None:  # the user's threshold: the smallest kept training length
        kept = usable[usable >= min_series_length - held_out_windows * horizon]
        if kept.size == 0:
            raise ConfigurationError("min_series_length", min_series_length, "leaves no series with a training "
                                     "window")
        threshold_train = int(kept[0])
        num_series, rate, eff = effective(threshold_train, past + horizon)
    dropped = int(usable.size - num_series)
    given = min_series_length is not None
    if not given:
        min_series_length = threshold_train + held_out_windows * horizon if dropped else None
    if given:
        reasons["short_series"] = (f"the given min_series_length={min_series_length} leaves out {dropped} of "
                                   f"{sizes.size} series")
    elif dropped:
        reasons["short_series"] = (
            f"leave out the {dropped} series shorter than {min_series_length} steps (of {sizes.size}): the shortest "
            f"training series decides the bound (Appendix I.1), and dropping them raises N/r from {base_eff:.4g} to "
            f"{eff:.4g} (at past window {past}); lengths are public (the relations change values, not lengths)")
    elif too_short:
        reasons["short_series"] = (f"{too_short} series are too short for one training window after the held-out "
                                   "windows: no threshold; plan.keep() leaves them out (dpts fit refuses them, or "
                                   "drops them with --drop-short-series)")
    else:
        reasons["short_series"] = (f"keep all {sizes.size} series (leaving out up to {MAX_DROPPED_FRACTION:.0%} of the "
                                   f"shortest would not raise N/r by {MIN_DROP_GAIN}x)")

    # past window: as wanted, shortened until one window is at most MAX_WINDOW_FRACTION of the starts
    starts = threshold_train - horizon + 1
    wanted = past
    floor = max(2 if model == "seasonal_linear" else 3, season + 1)
    while not fixed_past and past > floor and past + horizon > MAX_WINDOW_FRACTION * starts:
        past -= 1
    num_series, rate, eff = effective(threshold_train, past + horizon)
    reasons["context_length"] = (f"past window {past}: what the given model reads (context plus every lag), kept; "
                                 f"Theorem 4.4's r = {rate:.3g}") if fixed_past else (
        f"past window {past} = " + (f"the wanted {wanted} (seasons {', '.join(map(str, seasons))}, horizon "
                                    f"{horizon})" if past == wanted else
                                    f"shortened from {wanted} so that a window ({past}+{horizon}) stays within "
                                    f"{MAX_WINDOW_FRACTION:.0%} of the {starts} window starts of the shortest "
                                    "training part")
        + f"; no lags beyond it, so L_C = {past} and Theorem 4.4's r = {rate:.3g}")
    if past + horizon > MAX_WINDOW_FRACTION * starts:
        warn.append(f"the shortest training part ({threshold_train} steps) is short for this horizon: one window "
                    f"({past + horizon} steps) covers {past + horizon}/{starts} of its window starts (r = {rate:.3g}), "
                    "so window subsampling amplifies little")

    # batch size x steps: the best signal-to-noise proxy under the compute cap
    candidates = []
    batch = 8
    batches = []
    if isinstance(groups, bool) or not isinstance(groups, int) or not 1 <= groups <= num_series:
        raise ConfigurationError("bands", groups, f"must be an integer in [1, {num_series}] (the number of kept "
                                 "series): cyclic Poisson needs at least one series per group")
    largest = num_series // groups  # cyclic Poisson: N' k <= N
    while batch <= largest:
        batches.append(batch)
        batch *= 2
    if not batches:
        batches = [largest]
    elif batches[-1] < largest and largest * MIN_STEPS <= MAX_WINDOW_GRADIENTS:
        batches.append(largest)
    num_parameters = model_parameters(model, seasons, past)
    for batch in batches:
        per_epoch = num_series // batch
        for wanted_steps in STEP_CANDIDATES:
            epochs = max(1, round(wanted_steps / per_epoch))
            steps = epochs * per_epoch
            if steps < MIN_STEPS or batch * steps > MAX_WINDOW_GRADIENTS:
                continue
            sigma = rdp_noise_multiplier(min(1.0, batch * groups / num_series * rate), -(-steps // groups),
                                         epsilon, delta)
            if not math.isfinite(sigma):
                continue
            snr = batch * math.sqrt(steps) / (sigma * math.sqrt(num_parameters))
            candidates.append((snr, -batch * steps, batch, epochs, steps, sigma))
    if not candidates:
        raise ConfigurationError("epsilon", epsilon, f"is reachable by no batch size and step count the recipe "
                                 f"considers (sigma <= 1e4, at least {MIN_STEPS} steps); raise --epsilon or --delta")
    top = max(c[0] for c in candidates)
    # within 2% of the best score, the cheapest candidate (fewest window gradients)
    snr, _, batch, epochs, steps, sigma = max((c for c in candidates if c[0] >= 0.98 * top), key=lambda c: c[1])
    reasons["batch_size"] = (
        f"Lambda = {batch}, {steps} steps ({epochs} epochs of {num_series // batch}): the best signal-to-noise proxy "
        f"Lambda*sqrt(S)/(sigma*sqrt(d)) = {snr:.3g} among {len(candidates)} candidates with at most "
        f"{MAX_WINDOW_GRADIENTS} window gradients (the cheapest within 2% of the best, {top:.3g})"
        + (f"; cyclic Poisson in {groups} groups (--bands): at most N/k = {num_series // groups} series per step, "
           f"k = b groups because fewer opportunities at a higher rate amplify less (k >= b is needed)"
           if groups > 1 else ""))
    reasons["noise_multiplier"] = (f"~{sigma:.3g} for epsilon={epsilon:g}, delta={delta:g} by the Renyi-DP proxy; the "
                                   "run calibrates the exact value with the PLD accountant")
    clip = MAX_GRAD_NORMS.get(model, MAX_GRAD_NORM)
    reasons["max_grad_norm"] = (f"C = {clip:g} and learning rate {LEARNING_RATE:g}: C at or below {model}'s typical "
                                "per-window CRPS gradient norm, so C clips most windows (Adam's step does not "
                                "depend on C); chosen on validation windows (docs/recipe.md)")
    regime = "large" if eff >= 1e4 else "medium" if eff >= 1e3 else "small"
    if snr < MIN_SNR:
        warn.append(
            f"this budget is small for this data: the signal-to-noise proxy is {snr:.3g} (< {MIN_SNR:g}; N/r = "
            f"{eff:.4g}), so the private model may not beat seasonal naive. More series, longer series, a shorter "
            "horizon or a larger epsilon would help")
    return Recipe(
        model=model, season_length=season, context_length=past, min_series_length=min_series_length,
        num_series=num_series, dropped_series=dropped, min_training_length=threshold_train,
        bottom_level_rate=rate, effective_dataset_size=eff, batch_size=batch, epochs=epochs, steps=steps,
        noise_multiplier_estimate=sigma, max_grad_norm=clip, learning_rate=LEARNING_RATE,
        signal_to_noise=snr, regime=regime, warnings=tuple(warn), reasons=reasons,
    )


#: Why ``PrivateTraining.trainer_kwargs`` has no logger (issue 38).
NO_LOGGER = ("what a module logs during DP training (its training loss) is computed on private batches without "
             "noise, and Lightning's default logger would write it to ./lightning_logs; to keep logs, pass a logger "
             "that writes to a private folder, e.g. logger=CSVLogger('private/logs') (DPForecastStrategy says where "
             "logs go); epsilon is in the progress bar and the AccountantCallback's report")


#: Share of the planned steps after which the recipe's model averages its iterates (the last half).
AVERAGING_START = 0.5


def averaging_callbacks(model: str | None) -> list[Any]:
    """``[IterateAveraging(AVERAGING_START)]`` for the recipe's model (``None``: the default), else ``[]``: tail
    averaging of the noisy iterates, post-processing without privacy cost, measured better on validation windows
    (docs/recipe.md)."""
    if model not in (None, RECIPE_MODEL):
        return []
    from lightning_dpts.training.averaging import IterateAveraging

    return [IterateAveraging(AVERAGING_START)]


@dataclass
class PrivateTraining:
    """What :func:`make_private_with_epsilon` configured: the two callbacks, the Trainer and datamodule arguments,
    and every setting with its reason.

    Attributes:
        strategy: a :class:`~lightning_dpts.training.DPForecastStrategy` with C and the target (epsilon, delta)
            for ``epochs`` epochs: it calibrates sigma with the PLD accountant on the datamodule's real spec.
        accountant: an :class:`~lightning_dpts.training.AccountantCallback` (stops before the budget is spent).
        trainer_kwargs: ``{"max_epochs": ..., "callbacks": [strategy, accountant, *averaging], "logger": False}``
            for ``lightning.Trainer``: no logger by default (:data:`NO_LOGGER`); add one that writes to a private
            folder to keep the logs.
        datamodule_kwargs: ``{"batch_size": Lambda, "test_windows": ...}`` for
            :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`.
        settings: every choice by name (``max_grad_norm``, ``batch_size``, ``noise_multiplier_estimate``,
            ``epochs``, ``steps``, ``past_length``, ``min_series_length``, ``learning_rate``).
        reasons: one sentence per setting (``"given"`` for an explicit one).
        explicit: the names of the settings the caller gave (they win over the recipe).
        recipe: the underlying :class:`Recipe`.
        warnings: statements to show before training (the recipe's, e.g. a budget too small for the data).
        averaging: for the recipe's model (a
            :class:`~lightning_dpts.models.combination.CombinationLightningModule`), ``[IterateAveraging(0.5)]``:
            the module ends training at the mean of its last half of noisy iterates (post-processing); else ``[]``.
    """

    strategy: Any
    accountant: Any
    trainer_kwargs: dict[str, Any]
    datamodule_kwargs: dict[str, Any]
    settings: dict[str, Any]
    reasons: dict[str, str]
    explicit: tuple[str, ...]
    recipe: Recipe
    warnings: tuple[str, ...] = ()
    averaging: list[Any] = field(default_factory=list)
    prediction_length: int = 1  # the horizon the recipe was chosen for (keep() reads it)

    def describe(self) -> list[str]:
        """Log lines: every setting, then its reason (and the logger's, when there is none)."""
        lines = [f"{name} = {value!r}: {self.reasons.get(name, '')}" for name, value in self.settings.items()]
        if self.trainer_kwargs.get("logger") is False:
            lines.append(f"logger = False: {NO_LOGGER}")
        return lines

    def keep(self, lengths: Sequence[int]) -> np.ndarray:
        """Boolean mask of the series to train on, from their lengths only: length >= ``settings[
        "min_series_length"]`` and not too short for one training window after the held-out windows
        (:func:`~lightning_dpts.data.datamodule.too_short`, the rule the datamodule applies with
        ``datamodule_kwargs``), so that the datamodule built from the kept series accepts all of them."""
        from lightning_dpts.data.datamodule import too_short

        sizes = np.asarray([int(n) for n in lengths], dtype=np.int64)
        threshold = self.settings["min_series_length"] or 1
        kwargs = self.datamodule_kwargs
        held_out = int(kwargs.get("test_windows", 0)) + int(kwargs.get("val_windows", 0))
        return (sizes >= threshold) & ~too_short(sizes, self.prediction_length, held_out)


def _public_metadata(data: Any) -> tuple[list[int], str | None, int | None, int | None, int | None]:
    """(lengths, freq, prediction length, held-out windows, batch size) of ``data``: lengths, never values."""
    if hasattr(data, "collection") and hasattr(data, "sampling_spec"):  # a StructuredSubsamplingDataModule
        lengths = [len(t) for t in data.collection.targets]
        return (lengths, data.freq, data.prediction_length, data.test_windows + data.val_windows, data.batch_size)
    if hasattr(data, "targets") and hasattr(data, "freq"):  # a SeriesCollection
        return [len(t) for t in data.targets], data.freq, None, None, None
    if isinstance(data, (str, bytes)) or not all(isinstance(n, (int, np.integer)) for n in data):
        raise ConfigurationError("data", type(data).__name__, "must be the series' lengths (integers), a "
                                 "SeriesCollection or a StructuredSubsamplingDataModule")
    return [int(n) for n in data], None, None, None, None


def _model_geometry(module: Any) -> tuple[int | None, int | None]:
    """(past length incl. lags, prediction length) that ``module`` reads, from ``describe_inputs`` if it has one."""
    if module is None:
        return None, None
    inner = getattr(module, "model", module)
    prediction = getattr(inner, "prediction_length", None)
    if not hasattr(inner, "describe_inputs"):
        return None, prediction
    spec = inner.describe_inputs(1)
    past = int(spec["past_target"].shape[1]) if "past_target" in spec else None
    return past, prediction


def make_private_with_epsilon(
    data: Any,
    module: Any = None,
    *,
    epsilon: float,
    delta: float,
    freq: str | None = None,
    prediction_length: int | None = None,
    held_out_windows: int | None = None,
    level: str = "event",
    size: int = 1,
    batch_size: int | None = None,
    epochs: int | None = None,
    max_grad_norm: float | None = None,
    min_series_length: int | None = None,
    past_length: int | None = None,
    seed: int | None = None,
    secure_mode: bool = False,
) -> PrivateTraining:
    """The recipe of ``dpts fit`` for any model, from Python: one call in the style of Opacus'
    ``make_private_with_epsilon``.

    Reads **public metadata only** - the series' lengths, the frequency, the horizon, the past window the model
    reads, the budget and the unit of privacy, never a value - and returns the configured
    :class:`~lightning_dpts.training.DPForecastStrategy` and :class:`~lightning_dpts.training.AccountantCallback`,
    the Trainer arguments (``max_epochs``), the datamodule arguments (``batch_size``) and every setting with a
    reason (:class:`PrivateTraining`). Explicit arguments win over the recipe. The guarantee does not depend on
    the recipe: the strategy calibrates sigma with the PLD accountant on the datamodule it trains on.

    Args:
        data: the series' lengths (time steps), a :class:`~lightning_dpts.data.SeriesCollection` or a
            :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` (its lengths, frequency, horizon and
            held-out windows are read; build the datamodule you train on with ``datamodule_kwargs``).
        module: the model to train (optional): the past window it reads (context plus lags, from
            ``describe_inputs``) and its horizon are kept instead of the recipe's past window.
        epsilon, delta: the budget.
        freq, prediction_length, held_out_windows: needed when ``data`` is lengths (held-out windows default 1).
        level, size: the neighbouring relation (``"event"``/``"user"``, w).
        batch_size, epochs, max_grad_norm, min_series_length, past_length: explicit settings (they win).
        seed, secure_mode: passed to the strategy (a seed is for experiments only).

    Raises:
        ConfigurationError: missing metadata, or what :func:`choose_recipe` refuses.
    """
    lengths, dm_freq, dm_horizon, dm_held_out, _ = _public_metadata(data)
    model_past, model_horizon = _model_geometry(module)
    freq = freq or dm_freq
    if freq is None:
        raise ConfigurationError("freq", None, "give it when data is a list of lengths")
    horizon = prediction_length or dm_horizon or model_horizon
    if horizon is None:
        raise ConfigurationError("prediction_length", None, "give it, or a datamodule or model that knows it")
    if model_horizon is not None and model_horizon != horizon:
        raise ConfigurationError("prediction_length", horizon, f"must match the model's {model_horizon}")
    # 0 held-out windows is a valid choice (PrivateEstimator trains on the whole dataset it is given)
    held_out = held_out_windows if held_out_windows is not None else dm_held_out if dm_held_out is not None else 1
    given = {name: value for name, value in (("batch_size", batch_size), ("epochs", epochs),
                                             ("max_grad_norm", max_grad_norm),
                                             ("min_series_length", min_series_length),
                                             ("past_length", past_length)) if value is not None}
    past = past_length or model_past
    recipe = choose_recipe(lengths, freq=freq, prediction_length=horizon, epsilon=epsilon, delta=delta, level=level,
                           size=size, held_out_windows=held_out, min_series_length=min_series_length,
                           past_length=past)
    settings: dict[str, Any] = {
        "max_grad_norm": recipe.max_grad_norm, "batch_size": recipe.batch_size, "epochs": recipe.epochs,
        "steps": recipe.steps, "noise_multiplier_estimate": recipe.noise_multiplier_estimate,
        "past_length": recipe.context_length, "min_series_length": recipe.min_series_length,
        "learning_rate": recipe.learning_rate}
    reasons = {
        "max_grad_norm": recipe.reasons["max_grad_norm"], "batch_size": recipe.reasons["batch_size"],
        "epochs": recipe.reasons["batch_size"], "steps": recipe.reasons["batch_size"],
        "noise_multiplier_estimate": recipe.reasons["noise_multiplier"],
        "past_length": recipe.reasons["context_length"], "min_series_length": recipe.reasons["short_series"],
        "learning_rate": "the recipe's Adam learning rate for its models; set it on your module's optimiser "
                         "(not applied here)"}
    if batch_size is not None:
        settings["batch_size"] = int(batch_size)
        if epochs is None:  # keep the recipe's number of steps for the given batch size
            per_epoch = max(1, recipe.num_series // int(batch_size))
            settings["epochs"] = max(1, round(recipe.steps / per_epoch))
            reasons["epochs"] = f"the recipe's {recipe.steps} steps at the given batch size {batch_size}"
    if epochs is not None:
        settings["epochs"] = int(epochs)
    settings["steps"] = settings["epochs"] * max(1, recipe.num_series // settings["batch_size"])
    if max_grad_norm is not None:
        settings["max_grad_norm"] = float(max_grad_norm)
    for name in given:
        reasons[name] = "given"
    if set(given) & {"batch_size", "epochs"}:
        settings["noise_multiplier_estimate"] = rdp_noise_multiplier(
            settings["batch_size"] / recipe.num_series * recipe.bottom_level_rate, settings["steps"], epsilon,
            delta)
        reasons["noise_multiplier_estimate"] = ("Renyi-DP proxy for the given batch size and epochs; the strategy "
                                                "calibrates the exact value with the PLD accountant")
    from lightning_dpts.training.accountant_callback import AccountantCallback
    from lightning_dpts.training.strategy import DPForecastStrategy

    strategy = DPForecastStrategy(max_grad_norm=settings["max_grad_norm"], target_epsilon=epsilon,
                                  target_delta=delta, epochs=settings["epochs"], seed=seed, secure_mode=secure_mode)
    accountant = AccountantCallback(epsilon=epsilon, delta=delta)
    from lightning_dpts.models.combination import CombinationLightningModule

    averaging = averaging_callbacks(None) if isinstance(module, CombinationLightningModule) else []
    return PrivateTraining(
        strategy=strategy, accountant=accountant,
        trainer_kwargs={"max_epochs": settings["epochs"], "callbacks": [strategy, accountant, *averaging],
                        "logger": False},
        datamodule_kwargs={"batch_size": settings["batch_size"], "test_windows": held_out},
        settings=settings, reasons=reasons, explicit=tuple(given), recipe=recipe, warnings=recipe.warnings,
        averaging=averaging, prediction_length=horizon)

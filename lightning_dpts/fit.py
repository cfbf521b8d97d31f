"""The main job: train a private GluonTS forecaster to a target (epsilon, delta), evaluate it and report.

:func:`run_fit` is what ``dpts fit`` runs. Phases:

1. load and validate the data (the bundled ``us_employment`` by default, or a long-format CSV/Parquet file);
2. build the GluonTS torch LightningModule and the :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`;
3. take the noise multiplier as given or calibrate it for (epsilon, delta, epochs) with the accountant;
4. train with :class:`~lightning_dpts.training.DPForecastStrategy` and
   :class:`~lightning_dpts.training.AccountantCallback` (stops before the budget is exceeded);
5. optionally train the same model without DP for the same number of steps;
6. forecast the held-out test windows with GluonTS predictors and score them (mean weighted quantile loss
   as GluonTS reports it, and MAE of the median) next to seasonal naive (and optionally AutoETS);
7. write the run directory (:mod:`lightning_dpts.outputs`: refused if not empty unless ``overwrite``, locked,
   every file written atomically), split by what the (epsilon, delta) guarantee covers. At the top, public:
   ``report.json`` (configuration, epsilon, delta, sigma, C, sampling spec, ledger, recipe, the epsilon curve and
   the ``"files"`` manifest saying for each file whether the guarantee covers it), ``epsilon.png`` (from the
   accountant, no data), the DP model (``dp-model.ckpt``, ``predictor/``, ``model.json``;
   :mod:`lightning_dpts.export`). Under ``private/``, computed from the private data without DP and not
   covered: ``evaluation.json`` (metrics of every model on the held-out windows, baselines, verdict, levers),
   ``forecasts.png`` (``private_plots=False`` skips it) and the Lightning logs ``logs/`` (noise-free training
   loss; the DP settings as hyperparameters, :mod:`lightning_dpts.hparams`). ``private_outputs=False`` writes
   nothing under ``private/``; the terminal shows the evaluation either way.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.outputs import PRIVATE_DIR

__all__ = ["EVALUATION_FILE", "FIT_RANGES", "LEGACY_DEFAULTS", "MODELS", "PRIVATE_NOTICE", "PUBLIC_NOTICE",
           "RECIPE_FIELDS", "FitConfig", "drop_short_series", "format_table",
           "load_long_table", "resolve_config", "run_fit"]

#: The private evaluation of a run, under ``private/``.
EVALUATION_FILE = "evaluation.json"
#: What ``report.json`` says about itself and the other top-level files.
PUBLIC_NOTICE = (
    "report.json and every file the 'files' manifest marks 'public' are covered by the (epsilon, delta) guarantee "
    "or are public metadata (configuration, accounting, the DP model): they may be published. Files under "
    "private/ are computed from the private data without noise and are NOT covered."
)
#: What ``private/evaluation.json`` says about itself.
PRIVATE_NOTICE = (
    "computed from the private data without DP (metrics on the held-out private windows, baselines, the non-DP "
    "model, verdict, levers): NOT covered by the (epsilon, delta) guarantee - keep it with the data owner, do not "
    "publish it"
)
#: Most grid points of the public epsilon curve (report.json ``epsilon_curve``, epsilon.png); each costs one
#: accountant read-out (about 0.05 s), computed after training from the accountant alone.
EPSILON_CURVE_POINTS = 32

MODELS: tuple[str, ...] = ("seasonal_linear", "simple_feedforward", "deepar", "dlinear", "patch_tst")
#: Defaults of the options the recipe chooses, used when ``--model`` names a model other than the recipe's
#: (the recipe's constants are tuned for ``seasonal_linear``): context = horizon, as before the recipe.
LEGACY_DEFAULTS: dict[str, Any] = {"epochs": 100, "batch_size": 64, "max_grad_norm": 1.0, "learning_rate": 5e-3}
#: FitConfig fields the recipe fills when they are not given (lightning_dpts.recipe).
RECIPE_FIELDS: tuple[str, ...] = ("model", "context_length", "epochs", "batch_size", "max_grad_norm",
                                  "learning_rate", "min_series_length")

#: field -> (lowest, highest, "int" or "float", may be None). Bounds are inclusive except the open ends of
#: epsilon, noise levels > 0 noted in :func:`_check_range`. The caps keep every job's accounting and memory
#: bounded (beyond them the accountant's numerics are slow or unreliable, or the value is meaningless:
#: epsilon > 100 protects nothing, sigma > 100 learns nothing).
FIT_RANGES: dict[str, tuple[float, float, str, bool]] = {
    "prediction_length": (1, 100_000, "int", False),
    "context_length": (1, 100_000, "int", True),
    "epochs": (1, 100_000, "int", True),
    "batch_size": (1, 10_000_000, "int", True),
    "instances_per_series": (1, 1_000_000, "int", False),
    "size": (1, 1_000_000, "int", False),
    "max_lag": (1, 100_000, "int", True),
    "min_series_length": (1, 10**9, "int", True),
    "seed": (0, 2**64 - 1, "int", True),
    "epsilon": (0.0, 100.0, "float", False),
    "delta": (1e-15, 0.1, "float", False),
    "noise_multiplier": (0.1, 100.0, "float", True),
    "max_grad_norm": (0.0, 1e6, "float", True),
    "learning_rate": (0.0, 10.0, "float", True),
    "value_bound": (0.0, 1e30, "float", True),
    "context_noise": (0.0, 1e6, "float", False),
    "forecast_noise": (0.0, 1e6, "float", False),
    "test_windows": (1, 10_000, "int", True),
    "clip_low": (-1e30, 1e30, "float", True),
    "clip_high": (-1e30, 1e30, "float", True),
    "clip_count_epsilon": (0.0, 100.0, "float", True),
    "dp_metrics_epsilon": (0.0, 100.0, "float", True),
    "bands": (1, 1024, "int", True),
    "monte_carlo_samples": (1_000, 100_000_000, "int", False),
}
_OPEN_AT_ZERO = {"epsilon", "max_grad_norm", "learning_rate", "value_bound", "dp_metrics_epsilon"}
#: Pattern of the datamodule's seeded-run warning, silenced where ``run_fit`` already gave it once.
_SEEDED_WARNING = ".*explicit seed"
#: The datamodule's lag warning; ``run_fit`` states the same cause with the accountant's numbers instead.
_LAG_WARNING = "StructuredSubsamplingDataModule: the model's lags"
_BOOL_FIELDS = ("non_dp", "autoets", "drop_short_series", "private_plots", "private_outputs", "secure_mode",
                "overwrite")


def _check_range(name: str, value: Any, low: float, high: float, kind: str, optional: bool) -> None:
    if value is None and optional:
        return
    left = "(" if name in _OPEN_AT_ZERO else "["
    span = f"[{int(low)}, {int(high)}]" if kind == "int" else f"{left}{low:g}, {high:g}]"
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
            raise ConfigurationError(name, value, f"must be an integer in {span}" + (" or omitted" if optional else ""))
        return
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (v > low if name in _OPEN_AT_ZERO else v >= low) and v <= high
    if not ok:
        tail = " or omitted" if optional else ""
        raise ConfigurationError(name, value, f"must be a finite number in {span}{tail}")


_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def _coerce(key: str, value: Any, source: str | None) -> Any:
    """One mapping value converted to the field's type (see :meth:`FitConfig.from_mapping`)."""
    def bad(requirement: str) -> ConfigurationError:
        if source is None:
            return ConfigurationError(key, value, requirement)
        return ConfigurationError(source, f"{key}: {value!r}", f"key {key!r} {requirement}")

    if key in FIT_RANGES:
        low, high, kind, optional = FIT_RANGES[key]
        if value is None:
            if optional:
                return None
            raise bad("must be given a value (remove the key for the default)")
        if isinstance(value, bool):
            raise bad(f"must be a number, not {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip().replace("_", ""))
            except ValueError:
                raise bad("must be a number") from None
        if not isinstance(value, (int, float)):
            raise bad("must be a number")
        if kind == "int":
            if isinstance(value, float):
                if not (math.isfinite(value) and value == int(value)):
                    raise bad("must be a whole number")
                value = int(value)
            return value
        return float(value)
    if key in _BOOL_FIELDS:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise bad("must be true or false")
    if key in ("data", "freq", "model") and value is None:
        return None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise bad("must be text")




@dataclass
class FitConfig:
    """Everything ``dpts fit`` needs; the defaults are the documented default job.

    Attributes (units in brackets):
        data: path of a long-format CSV/Parquet file, or ``None`` for the bundled ``us_employment`` data.
        id_column, time_column, value_column: column names in ``data``.
        freq: pandas frequency of the series (inferred from the time stamps when ``None``).
        prediction_length: forecast horizon [time steps].
        model: one of :data:`MODELS`; ``None`` (default): the recipe's (:mod:`lightning_dpts.recipe`,
            ``seasonal_linear``). Every option marked *recipe* below is chosen by
            :func:`~lightning_dpts.recipe.choose_recipe` from public metadata (number and lengths of series,
            frequency, horizon, budget, relation) when it is ``None`` and the model is the recipe's; with
            another model they default to :data:`LEGACY_DEFAULTS` (context = horizon). A given value always wins.
        context_length: model context [time steps] (*recipe*: 2 seasons, or 2 horizons without a season,
            capped so that a window stays within a quarter of the shortest training part; Theorem 4.4's
            r = (L_C + L_F)/T).
        min_series_length: leave out series shorter than this [time steps] (*recipe*: drops at most a fifth of
            the series, only when that raises the effective dataset size N/r by 1.5x; lengths are public).
            ``1`` keeps every series.
        epsilon, delta: the privacy budget (1-event level unless ``level``/``size`` say otherwise).
        noise_multiplier: sigma; ``None`` calibrates it for (epsilon, delta) in ``epochs`` epochs.
        epochs: training horizon the noise is calibrated for (and the epoch cap without calibration) (*recipe*).
        batch_size: Lambda [windows] (*recipe*); instances_per_series: lambda; top_level, bottom_level: sampling
            modes.
        max_grad_norm: C, the per-window gradient clipping norm (*recipe*).
        learning_rate: Adam learning rate (*recipe*).
        level, size, value_bound, context_noise, forecast_noise: the neighbouring relation and Eq. 1
            augmentation (see docs/privacy.md).
        drop_short_series: drop (with a warning naming how many) the series too short for one training window
            plus the held-out test window, instead of refusing the data.
        max_lag: DeepAR only: keep only GluonTS's default lags <= max_lag [time steps]. The default lags for
            daily or hourly data reach back up to ~3 years; every lag lengthens the past window the accountant
            must count (Theorem 4.4's r = (L_C + L_F)/T), so a window longer than the shortest series destroys
            the amplification by subsampling. ``None`` keeps GluonTS's defaults (a warning states the cost).
        non_dp: also train the model without DP for the same number of steps (a utility reference).
        autoets: also score AutoETS (needs the optional ``statsforecast`` package).
        private_plots: write ``private/forecasts.png``, which shows private data (history, held-out truth,
            forecasts of the first test windows); ``False`` (``--no-private-plots``) skips it. ``epsilon.png`` has
            no data (it is computed from the accountant).
        private_outputs: write the files computed from the private data without DP under ``private/`` (the
            evaluation, baselines, verdict and levers in ``private/evaluation.json``, the Lightning training logs
            ``private/logs/``, ``private/forecasts.png``); ``False`` (``--no-private-outputs``) writes none of them:
            the run directory then holds only what the guarantee covers or public metadata (the terminal still
            shows the evaluation). ``report.json`` lists every file and whether the guarantee covers it.
        overwrite: allow a non-empty ``output_dir`` and first remove the files of the earlier run there (only the
            files that run listed in its journal; a directory holding other files is refused).
        seed: ``None`` (default): sampling, initialisation and noise come from fresh, secret operating-system
            entropy (PRIVACY-NOTES trap 7), so two runs differ. An integer >= 0 makes the run reproducible for
            experiments only: its guarantee does not hold against anyone who knows the seed, and the log, the
            report (``"seeded": true``) and the checkpoint say so; the seed itself is never written anywhere.
        secure_mode: draw the DP noise and the batch sampling from the operating system's CSPRNG (Opacus'
            ``secure_mode`` threat model; needs ``seed=None``).
        output_dir: where checkpoint, logs, report and plots go; must be new or empty unless ``overwrite``.
        test_windows: number of rolling test windows of ``prediction_length`` steps at the end of every series
            (GluonTS-style; never sampled for training). Metrics are pooled over all windows and series, and the
            CRPS of each window is reported. ``None`` (default): chosen from the public series lengths by
            :func:`~lightning_dpts.evaluation.choose_test_windows` (up to 4, as long as the held-out steps raise
            the shortest series' bottom-level rate r by at most 25%).
        clip_low, clip_high: a declared *public* value range [data units]: every value is clipped to it before
            training, which makes the value bound v = clip_high - clip_low of Theorem G.1's (w, v) relation true for
            any change of the data, so context/forecast noise augmentation amplifies soundly under the unbounded
            relation (:mod:`lightning_dpts.evaluation`). Needs ``context_noise`` or ``forecast_noise`` and no
            ``value_bound`` (it is set to the range). Choose the range without looking at the private values.
            Forecasts are scored against the unclipped truth; seasonal naive sees the unclipped history.
        clip_count_epsilon: with clipping, the part of ``epsilon`` spent to release how many values were clipped
            (Laplace mechanism, sensitivity w = ``size``; basic composition: training gets epsilon minus this).
            ``None`` (default): 2% of ``epsilon``; ``0``: the count is not released.
        bands: b; ``None`` (default) trains with DP-SGD and the structured (PLD) accountant. An integer b >= 1
            trains with BandMF (b-banded correlated noise, optimised Toeplitz coefficients for the planned steps;
            b = 1 is Gaussian noise), b-min-sep sampling of series (top level ``b_min_sep``, Algorithm 2) and the
            Monte Carlo accountant (Dong & Ganesh 2026, Theorem 5.1 + EVR Theorem A.1) in the series-level reading
            of docs/bandmf.md; needs an explicit ``noise_multiplier`` (docs/cli.md).
        monte_carlo_samples: privacy-loss samples per direction of that accountant (``bands`` only).
        dp_metrics_epsilon: the part of ``epsilon`` spent to release, in the public ``report.json``, how many held-out
            test windows the private model forecasts better than seasonal naive (``dp_metrics``; Laplace mechanism,
            sensitivity = the test windows per series, since every protected unit lies in one series; basic
            composition: training gets ``epsilon`` minus this and the clipped-count epsilon). ``None`` (default):
            nothing computed from the held-out data is published.
    """

    data: str | None = None
    id_column: str = "id"
    time_column: str = "timestamp"
    value_column: str = "value"
    freq: str | None = None
    prediction_length: int = 12
    context_length: int | None = None
    model: str | None = None
    epsilon: float = 1.0
    delta: float = 1e-7
    noise_multiplier: float | None = None
    epochs: int | None = None
    batch_size: int | None = None
    instances_per_series: int = 1
    top_level: str = "without_replacement"
    bottom_level: str = "with_replacement"
    max_grad_norm: float | None = None
    learning_rate: float | None = None
    min_series_length: int | None = None
    level: str = "event"
    size: int = 1
    value_bound: float | None = None
    context_noise: float = 0.0
    forecast_noise: float = 0.0
    drop_short_series: bool = False
    max_lag: int | None = None
    non_dp: bool = True
    autoets: bool = False
    private_plots: bool = True
    seed: int | None = None
    secure_mode: bool = False
    output_dir: str = "dpts-run"
    test_windows: int | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    clip_count_epsilon: float | None = None

    @property
    def clipping(self) -> bool:
        """``True`` when a public value range is declared (values are clipped to it before training)."""
        return self.clip_low is not None or self.clip_high is not None

    @property
    def effective_value_bound(self) -> float | None:
        """v of the relation: ``clip_high - clip_low`` with clipping, else ``value_bound``."""
        if self.clip_low is not None and self.clip_high is not None:
            return float(self.clip_high) - float(self.clip_low)
        return self.value_bound

    @property
    def count_epsilon(self) -> float:
        """The epsilon spent on the noisy clipped-value count (0 without clipping)."""
        if not self.clipping:
            return 0.0
        return 0.02 * self.epsilon if self.clip_count_epsilon is None else float(self.clip_count_epsilon)
    bands: int | None = None
    monte_carlo_samples: int = 100_000
    private_outputs: bool = True
    overwrite: bool = False
    dp_metrics_epsilon: float | None = None

    @property
    def reserved_epsilon(self) -> float:
        """The epsilon spent outside training: the noisy clipped count plus the DP metrics (basic composition)."""
        return self.count_epsilon + (self.dp_metrics_epsilon or 0.0)

    @classmethod
    def from_mapping(cls, values: dict[str, Any], source: str | None = "config") -> FitConfig:
        """A config from a mapping such as a parsed YAML file, converting text the way a user means it.

        PyYAML reads ``1e-7`` (no dot) as the string ``'1e-7'``; numeric fields accept such strings, integer
        fields accept whole floats (``1e3``), boolean fields accept ``true``/``false``/``yes``/``no``, column
        names may be numbers. Unknown keys and values that cannot be converted raise
        :class:`ConfigurationError` for parameter ``source`` naming the key (for the key itself when ``source``
        is ``None``, e.g. for command-line values).
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigurationError(source or "config", unknown, f"has unknown keys; known keys are {sorted(known)}")
        out: dict[str, Any] = {}
        for key, value in values.items():
            out[key] = _coerce(key, value, source)
        return cls(**out)

    def validate(self) -> None:
        """Range checks that do not need the data (the datamodule and accountant check the rest).

        Every numeric field must be a real number of the right kind inside its documented range
        (:data:`FIT_RANGES`): values outside are refused before anything is loaded, trained or written.
        """
        from lightning_dpts.privacy.spec import BOTTOM_LEVELS, LEVELS, TOP_LEVELS

        if self.model is not None and self.model not in MODELS:
            raise ConfigurationError("model", self.model, f"must be one of {', '.join(MODELS)}")
        fit_top_levels = TOP_LEVELS if self.bands is not None else tuple(t for t in TOP_LEVELS if t != "b_min_sep")
        for name, choices in (("top_level", fit_top_levels), ("bottom_level", BOTTOM_LEVELS), ("level", LEVELS)):
            if getattr(self, name) not in choices:
                raise ConfigurationError(name, getattr(self, name), f"must be one of {', '.join(choices)}")
        for name, (low, high, kind, optional) in FIT_RANGES.items():
            _check_range(name, getattr(self, name), low, high, kind, optional)
        for name in ("data", "freq"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(name, value, "must be a non-empty string")
        for name in ("id_column", "time_column", "value_column", "output_dir"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigurationError(name, value, "must be a non-empty string")
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, getattr(self, name), "must be true or false")
        if self.freq is not None:
            from lightning_dpts.data.sources import period_freq

            period_freq(self.freq)
        if self.max_lag is not None and self.model != "deepar":
            raise ConfigurationError("max_lag", self.max_lag, "applies only to model deepar (the other models read "
                                     "no lagged values); omit it")
        self._validate_clipping()
        if self.value_bound is not None and not (self.context_noise or self.forecast_noise):
            raise ConfigurationError("value_bound", self.value_bound, "has no effect without context_noise or "
                                     "forecast_noise (it only scales the augmentation noise, Theorem G.1); omit it "
                                     "or add the noise")
        if (self.context_noise or self.forecast_noise) and self.value_bound is None and not self.clipping:
            raise ConfigurationError("value_bound", None, "is needed with context_noise/forecast_noise (both are in "
                                     "units of the value bound v)")
        if self.secure_mode and self.seed is not None:
            raise ConfigurationError("secure_mode", True, "draws from the operating system's CSPRNG and cannot be "
                                     "combined with seed; leave seed unset")
        if self.dp_metrics_epsilon is not None and self.bands is not None:
            raise ConfigurationError("dp_metrics_epsilon", self.dp_metrics_epsilon, "cannot be combined with --bands "
                                     "(the Monte Carlo accountant verifies the whole budget for training); omit it")
        if self.dp_metrics_epsilon is not None and not self.reserved_epsilon < self.epsilon:
            raise ConfigurationError("dp_metrics_epsilon", self.dp_metrics_epsilon, f"must be smaller than epsilon="
                                     f"{self.epsilon:g} minus the clipped-count epsilon {self.count_epsilon:g} (the "
                                     "rest of the budget trains the model)")
        if self.bands is not None:
            _validate_bands(self)
        if self.autoets:
            import importlib.util

            if importlib.util.find_spec("statsforecast") is None:
                raise ConfigurationError("autoets", True, "needs the optional package statsforecast "
                                         "(pip install 'lightning-dpts[baselines]' or pip install statsforecast)")

    def _validate_clipping(self) -> None:
        """The public value range (clip_low, clip_high) and the count epsilon (:mod:`lightning_dpts.evaluation`)."""
        if not self.clipping:
            if self.clip_count_epsilon is not None:
                raise ConfigurationError("clip_count_epsilon", self.clip_count_epsilon, "applies only with "
                                         "clip_low/clip_high; omit it")
            return
        from lightning_dpts.evaluation import clip_bounds

        if self.clip_low is None or self.clip_high is None:
            given, missing = ("clip_high", "clip_low") if self.clip_low is None else ("clip_low", "clip_high")
            raise ConfigurationError(given, getattr(self, given), f"needs {missing} too: clipping is to a declared "
                                     "public range [clip_low, clip_high]")
        clip_bounds(self.clip_low, self.clip_high)
        if not (self.context_noise or self.forecast_noise):
            raise ConfigurationError("clip_low", self.clip_low, "clipping only serves noise augmentation (Theorem "
                                     "G.1 needs the value bound it makes true); add context_noise/forecast_noise or "
                                     "omit clip_low/clip_high")
        if self.value_bound is not None:
            raise ConfigurationError("value_bound", self.value_bound, "is set by clipping to clip_high - clip_low = "
                                     f"{float(self.clip_high) - float(self.clip_low):g}; omit it")
        if not self.count_epsilon < self.epsilon:
            raise ConfigurationError("clip_count_epsilon", self.clip_count_epsilon, f"must be smaller than epsilon="
                                     f"{self.epsilon:g} (the rest of the budget trains the model)")


# ---------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------
def load_long_table(path: str | Path, id_column: str, time_column: str, value_column: str,
                    freq: str | None = None) -> tuple[pd.DataFrame, str]:
    """Read a long-format CSV/Parquet file into columns ``item_id``, ``timestamp`` (Period), ``target``.

    Returns the table and its (period) frequency. Raises :class:`ConfigurationError` naming the parameter, the
    row (and CSV line) and the fix for a missing file, unknown format, missing columns, missing ids or time
    stamps, non-numeric, complex or out-of-float32-range values, integer time stamps without ``freq``, and
    time stamps whose spacing disagrees with ``freq`` (see :func:`lightning_dpts.data.sources.long_table`).
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigurationError("data", str(path), "no such file")
    name = path.name.lower()
    try:
        if name.endswith((".parquet", ".pq")):
            raw = pd.read_parquet(path)
        elif name.endswith((".csv", ".csv.gz", ".txt")):
            raw = pd.read_csv(path)
        else:
            raise ConfigurationError("data", str(path), "must be a .csv, .csv.gz or .parquet file")
    except ConfigurationError:
        raise
    except Exception as err:  # unreadable file: say which and why
        raise ConfigurationError("data", str(path), f"could not be read ({type(err).__name__}: {err})") from err
    from lightning_dpts.data.sources import long_table

    return long_table(raw, id_column=id_column, timestamp_column=time_column, value_column=value_column, freq=freq,
                      parameters=("id_column", "time_column", "value_column"),
                      first_line=2 if name.endswith((".csv", ".csv.gz", ".txt")) else None)


# ---------------------------------------------------------------------------------------------------------
# models and forecasting
# ---------------------------------------------------------------------------------------------------------
def resolve_config(config: FitConfig, lengths: Any, freq: str,
                   held_out_windows: int = 1) -> tuple[FitConfig, Any, list[str]]:
    """Fill the options the user left unset: by the recipe for the recipe's model, else :data:`LEGACY_DEFAULTS`.

    Args:
        config: a validated config (``None`` marks an unset option).
        lengths: the length of every series (time steps): public metadata, never values.
        freq: the series' frequency.
        held_out_windows: windows of H steps held out at the end of every series (the rolling test windows).

    Returns:
        ``(resolved config, recipe or None, names of the fields the recipe chose)``. The recipe is computed
        only when the model is unset or ``seasonal_linear``; explicit values are kept.
    """
    from dataclasses import replace

    from lightning_dpts.recipe import RECIPE_MODEL, choose_recipe

    if config.model not in (None, RECIPE_MODEL):
        fill = {k: v for k, v in LEGACY_DEFAULTS.items() if getattr(config, k) is None}
        return replace(config, **fill), None, []
    recipe = choose_recipe(lengths, freq=freq, prediction_length=config.prediction_length, epsilon=config.epsilon,
                           delta=config.delta, level=config.level, size=config.size,
                           held_out_windows=held_out_windows, min_series_length=config.min_series_length)
    choice = {"model": recipe.model, "context_length": recipe.context_length, "epochs": recipe.epochs,
              "batch_size": recipe.batch_size, "max_grad_norm": recipe.max_grad_norm,
              "learning_rate": recipe.learning_rate, "min_series_length": recipe.min_series_length or 1}
    chosen = [name for name in RECIPE_FIELDS if getattr(config, name) is None]
    if config.batch_size is not None and config.epochs is None:
        # the recipe's epochs assume its batch size: keep its number of steps for the given one
        per_epoch = max(1, recipe.num_series // config.batch_size)
        choice["epochs"] = max(1, round(recipe.steps / per_epoch))
    resolved = replace(config, **{name: choice[name] for name in chosen})
    resolved.validate()
    return resolved, recipe, chosen


def resolve_with_test_windows(config: FitConfig, lengths: Any,
                              freq: str) -> tuple[FitConfig, Any, list[str], tuple[int, str] | None]:
    """:func:`resolve_config` planned for the rolling test windows ``dpts fit`` will hold out.

    With ``test_windows`` unset and the recipe in charge, the windows are chosen from the kept lengths and the
    recipe's past window (its model reads no lag beyond it) by
    :func:`~lightning_dpts.evaluation.choose_test_windows`, and the recipe is recomputed for them. Returns
    ``(config, recipe, chosen, planned)`` with ``planned = (windows, explanation)`` or ``None`` (decided later by
    :func:`fit_test_windows`). Public metadata only.
    """
    resolved, recipe, chosen = resolve_config(config, lengths, freq, held_out_windows=config.test_windows or 1)
    if config.test_windows is not None or recipe is None:
        return resolved, recipe, chosen, None
    from lightning_dpts.evaluation import choose_test_windows

    kept = np.asarray(lengths)
    kept = kept[kept >= (resolved.min_series_length or 1)]
    planned = choose_test_windows(kept.tolist(), resolved.context_length, config.prediction_length)
    if planned[0] > 1:
        resolved, recipe, chosen = resolve_config(config, lengths, freq, held_out_windows=planned[0])
    return resolved, recipe, chosen, planned


def fit_test_windows(config: FitConfig, planned: tuple[int, str] | None, table: pd.DataFrame, freq: str,
                     module: Any) -> tuple[int, str]:
    """The number of rolling test windows ``dpts fit`` holds out, and why (given, planned with the recipe, or chosen
    from the lengths and the model's past length including lags)."""
    if config.test_windows is not None:
        return config.test_windows, "given (--test-windows)"
    if planned is not None:
        return planned
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.data.sources import to_collection
    from lightning_dpts.evaluation import choose_test_windows

    past = StructuredSubsamplingDataModule._inspect_model(module)[1] or (config.context_length
                                                                         or config.prediction_length)
    lengths = [len(t) for t in to_collection(table, freq=freq, id_column="item_id", timestamp_column="timestamp",
                                             value_column="target").targets]
    if config.drop_short_series:
        lengths = [n for n in lengths if n >= 2 * config.prediction_length] or lengths
    return choose_test_windows(lengths, past, config.prediction_length)


def drop_short_series(table: pd.DataFrame, min_series_length: int | None) -> tuple[pd.DataFrame, int]:
    """``table`` without the series (``item_id``) shorter than ``min_series_length`` rows, and how many went.

    Reads only the lengths (public under this package's relations). ``None`` or 1 keeps every series; a
    threshold that leaves none raises :class:`ConfigurationError` (``min_series_length``).
    """
    if min_series_length is None or min_series_length <= 1:
        return table, 0
    lengths = table.groupby("item_id", sort=False).size()
    short = lengths.index[lengths.to_numpy() < min_series_length]
    if len(short) == len(lengths):
        raise ConfigurationError("min_series_length", min_series_length,
                                 f"leaves no series (the longest has {int(lengths.max())} steps)")
    if len(short) == 0:
        return table, 0
    return table[~table["item_id"].isin(set(short))].reset_index(drop=True), len(short)


def _estimator(config: FitConfig, freq: str):
    """The estimator whose LightningModule and predictor we use (GluonTS defaults as in the paper, B.2).

    Options still unset (``None``, e.g. a config not passed through :func:`resolve_config`) take
    :data:`LEGACY_DEFAULTS`, or the recipe's constants for ``seasonal_linear``.
    """
    h = config.prediction_length
    ctx = config.context_length or h
    lr = config.learning_rate if config.learning_rate is not None else LEGACY_DEFAULTS["learning_rate"]
    if config.model in (None, "seasonal_linear"):  # None: the recipe's model
        from lightning_dpts.models import SeasonalLinearEstimator
        from lightning_dpts.recipe import LEARNING_RATE

        lr = config.learning_rate if config.learning_rate is not None else LEARNING_RATE
        if config.context_length is None:
            ctx = max(2 * h, _season_length(freq) + 1)

        return SeasonalLinearEstimator(prediction_length=h, context_length=ctx, season_length=_season_length(freq),
                                       lr=lr)
    if config.model == "simple_feedforward":
        from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

        return SimpleFeedForwardEstimator(prediction_length=h, context_length=ctx, hidden_dimensions=[64, 64], lr=lr)
    if config.model == "deepar":
        from gluonts.torch.model.deepar import DeepAREstimator

        return DeepAREstimator(freq=freq, prediction_length=h, context_length=ctx, num_layers=2, hidden_size=40,
                               dropout_rate=0.0, lr=lr, lags_seq=_lags(freq, config.max_lag))
    if config.model == "dlinear":
        from gluonts.torch.model.d_linear import DLinearEstimator

        return DLinearEstimator(prediction_length=h, context_length=ctx, hidden_dimension=20, lr=lr)
    from gluonts.torch.model.patch_tst import PatchTSTEstimator

    return PatchTSTEstimator(prediction_length=h, context_length=ctx, patch_len=max(1, min(ctx, h) // 2),
                             stride=max(1, min(ctx, h) // 4), dropout=0.0, lr=lr)


def _lags(freq: str, max_lag: int | None) -> list[int] | None:
    """GluonTS's default DeepAR lags for ``freq``, keeping only those <= ``max_lag`` (``None``: all of them)."""
    if max_lag is None:
        return None
    from gluonts.time_feature import get_lags_for_frequency

    return sorted({lag for lag in get_lags_for_frequency(freq) if lag <= max_lag} | {1})


def _lag_cost(spec: Any, context_length: int, epsilon: float, delta: float, epochs: int,
              sigma: float | None) -> str | None:
    """A warning when the lags make one window span every window start of the shortest series.

    Theorem 4.4's bottom-level rate (with replacement) is r = min(1, (L_C + L_F) / T) per protected step: once
    the window P + L_F (P = L_C + lags) reaches T, r = 1 and subsampling windows amplifies nothing. The cost is
    stated with the accountant: the noise multiplier needed for (epsilon, delta) in ``epochs`` epochs with and
    without the lags (or, for a given sigma, epsilon after those steps).
    """
    from dataclasses import replace

    from lightning_dpts.data.model_checks import lag_amplification_warning
    from lightning_dpts.privacy import StructuredSubsamplingAccountant, calibrate_noise_multiplier

    lead = lag_amplification_warning(spec, context_length)
    if lead is None:
        return None
    bare = replace(spec, context_length=context_length)
    fix = "; pass --max-lag (FitConfig.max_lag), e.g. the seasonal period, to cap the lags"
    try:
        if sigma is None:
            with_lags = calibrate_noise_multiplier(spec, epsilon, delta, epochs=epochs)
            without = calibrate_noise_multiplier(bare, epsilon, delta, epochs=epochs)
            return f"{lead}. Noise multiplier for epsilon={epsilon:g}: {with_lags:.3g} with, {without:.3g} without{fix}"
        steps = epochs * spec.steps_per_epoch
        e_with = StructuredSubsamplingAccountant(spec, sigma).epsilon(steps, delta)
        e_without = StructuredSubsamplingAccountant(bare, sigma).epsilon(steps, delta)
        return (f"{lead}. Epsilon after {steps} steps at sigma={sigma:g}: {e_with:.3g} with, {e_without:.3g} "
                f"without{fix}")
    except ConfigurationError:
        return f"{lead}{fix}"


# ---------------------------------------------------------------------------------------------------------
# --bands: BandMF, b-min-sep sampling, Monte Carlo accounting (docs/bandmf.md)
# ---------------------------------------------------------------------------------------------------------
def _validate_bands(config: FitConfig) -> None:
    """The checks of ``bands`` that need no data: what the Monte Carlo accountant's series-level reading covers."""
    if config.noise_multiplier is None:
        raise ConfigurationError(
            "noise_multiplier", None,
            "is required with --bands: calibrating sigma for (epsilon, delta) by Algorithm 5 verifies every "
            "candidate with Monte Carlo samples (about 4.9e5 per direction for delta 1e-2 at epsilon 8, 1.1e7 "
            "for delta 1e-5, each O(steps x bands)), too slow for a command-line run; calibrate it once in Python "
            "with lightning_dpts.privacy.montecarlo.calibrate_noise_multiplier_monte_carlo (docs/bandmf.md) and "
            "pass it as --noise-multiplier (the budget is then verified before training)")
    if config.top_level not in ("without_replacement", "b_min_sep"):
        raise ConfigurationError("top_level", config.top_level, "must be b_min_sep (or left at its default) with "
                                 "--bands: BandMF samples series by b-min-sep (Algorithm 2)")
    if config.bottom_level != "with_replacement":
        raise ConfigurationError("bottom_level", config.bottom_level, "must be with_replacement with --bands: the "
                                 "Monte Carlo accountant's series-level sensitivity is instances_per_series windows, "
                                 "which only a with-replacement bottom level bounds")
    for name in ("context_noise", "forecast_noise"):
        if getattr(config, name):
            raise ConfigurationError(name, getattr(config, name), "must be 0 with --bands: the Monte Carlo "
                                     "accountant (series level) does not credit augmentation noise; omit it")


def _bandmf_callbacks(config: FitConfig, spec: Any, progress: Callable[[str], None]) -> tuple[Any, Any]:
    """Strategy and accountant of a ``bands`` run, after verifying the planned run's budget (nothing is written).

    The planned run is ``epochs`` x ``spec.steps_per_epoch`` optimizer steps. C: the coefficients that
    :func:`~lightning_dpts.training.correlated_noise.optimize_coefficients` gives for b bands and those steps (b = 1:
    Gaussian noise, C = I). The check is the one :class:`~lightning_dpts.training.AccountantCallback` repeats with
    its own fresh samples before the first step (series-level substitution epsilon, Monte Carlo + EVR); both use
    ``monte_carlo_samples`` samples per direction.
    """
    from lightning_dpts.privacy.montecarlo import overall_delta, samples_for_target_delta
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy
    from lightning_dpts.training.correlated_noise import optimize_coefficients

    b, sigma, samples = int(config.bands), float(config.noise_multiplier), config.monte_carlo_samples
    steps = config.epochs * spec.steps_per_epoch
    if 2.0 * overall_delta(samples, 0.0) > config.delta:  # (1 + e^eps') d(eps') >= 2 x the EVR floor for every eps'
        need = samples_for_target_delta(config.delta / (1.0 + math.exp(config.epsilon / 2)))
        raise ConfigurationError(
            "delta", config.delta,
            f"cannot be verified with --monte-carlo-samples={samples} (the Monte Carlo accountant's EVR bound is "
            f">= {overall_delta(samples, 0.0):.3g} per direction and series-level substitution doubles it at best): "
            f"raise --delta or raise --monte-carlo-samples (about {need} for this epsilon)")
    if b == 1:
        strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                      secure_mode=config.secure_mode)
    else:
        coefficients = tuple(float(v) for v in optimize_coefficients(b, steps).coefficients)
        strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm, seed=config.seed,
                                      secure_mode=config.secure_mode, noise="bandmf", coefficients=coefficients)
    accountant = AccountantCallback(epsilon=config.epsilon, delta=config.delta, monte_carlo_samples=samples)
    progress(f"Monte Carlo accounting of the planned {steps} steps (bands={b}, sigma={sigma:g}, {samples} samples "
             "per direction) ...")
    started = time.perf_counter()
    eps = accountant.build_monte_carlo(spec, strategy, sigma, steps).substitution_epsilon(steps, config.delta)
    if not eps <= config.epsilon:
        need = samples_for_target_delta(config.delta / (1.0 + math.exp(config.epsilon / 2)))
        raise ConfigurationError(
            "noise_multiplier", sigma,
            f"spends epsilon={eps:.4g} > the budget epsilon={config.epsilon:g} at delta={config.delta:g} in the "
            f"planned {steps} steps (Monte Carlo, EVR-verified, series-level substitution; inf: no epsilon verifies "
            f"with {samples} samples per direction): raise --noise-multiplier, lower --epochs or --batch-size, raise "
            f"--epsilon or --delta, or raise --monte-carlo-samples (about {need} samples let a run near the budget "
            "verify)")
    progress(f"verified: epsilon <= {eps:.4g} at delta={config.delta:g} ({time.perf_counter() - started:.1f} s; "
             "re-verified with fresh samples before the first step)")
    return strategy, accountant


def _round_up(x: float, digits: int = 4) -> str:
    """``x`` rounded *up* to ``digits`` significant digits (a threshold the user can type and that suffices)."""
    scale = 10.0 ** (math.floor(math.log10(abs(x))) - digits + 1)
    return f"{math.ceil(x / scale) * scale:.{digits}g}"


def _check_one_step(spec: Any, sigma: float, epsilon: float, delta: float) -> None:
    """Refuse a given noise multiplier with which the budget allows no optimizer step, saying by how much to move.

    One step composes one unit (one step; one epoch for iteration/shuffling). If that unit alone exceeds
    (epsilon, delta), training would take no step: report the epsilon one unit costs and the smallest sigma
    that allows one unit (both from the accountant).
    """
    from lightning_dpts.privacy import StructuredSubsamplingAccountant, calibrate_noise_multiplier

    acc = StructuredSubsamplingAccountant(spec, sigma)
    first = acc.epsilon(1, delta)
    if first <= epsilon:
        return
    unit = "epoch" if acc.unit == "epoch" else "optimizer step"
    try:
        need = f"raise --noise-multiplier to >= {_round_up(calibrate_noise_multiplier(spec, epsilon, delta, steps=1))}"
    except ConfigurationError:
        need = "no noise multiplier <= 1e4 allows it"
    raise ConfigurationError(
        "noise_multiplier", sigma,
        f"allows no training: one {unit} already spends epsilon={first:.6g} > the budget epsilon={epsilon:g} at "
        f"delta={delta:g}. Either raise --epsilon to >= {_round_up(first)}, or {need} (or omit it to calibrate it for "
        f"--epochs), or lower --batch-size / raise the number of series (smaller sampling rates amplify more)",
    )


def _quantile_matrix(forecast: Any) -> np.ndarray:
    from lightning_dpts.metrics import DEFAULT_QUANTILES

    return np.stack([np.asarray(forecast.quantile(q), dtype=float) for q in DEFAULT_QUANTILES], axis=-1)


def score_forecasts(forecasts: list[Any], labels: list[np.ndarray]) -> dict[str, float]:
    """Mean weighted quantile loss (GluonTS ``mean_wQuantileLoss``, the paper's CRPS) and MAE of the median.

    One window per forecast, pooled: :func:`lightning_dpts.evaluation.score_windows` without histories.
    """
    from lightning_dpts.evaluation import score_windows

    n = len(forecasts)
    scores = score_windows([_quantile_matrix(f) for f in forecasts], labels, [np.empty(0)] * n, [0] * n, season=1)
    return {"crps": scores["crps"], "mae": scores["mae"]}


def _season_length(freq: str) -> int:
    from gluonts.time_feature import get_seasonality

    return int(get_seasonality(freq))


# ---------------------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------------------
def run_fit(config: FitConfig, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the main job (see the module docstring) and return the report that is written to report.json.

    Every check that can refuse the job (the config's ranges, the data, the model geometry, a budget that
    allows no step) runs before training and before anything is written: a :class:`ConfigurationError` leaves
    ``output_dir`` untouched.
    """
    config.validate()  # first, before the heavy imports: a bad option is refused at once
    from lightning_dpts.outputs import check_output_dir

    check_output_dir(config.output_dir, config.overwrite)  # a file, a non-empty or a locked directory: refused
    import lightning as L
    import torch
    from lightning.pytorch.loggers import CSVLogger

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.privacy import NeighbouringRelation, calibrate_noise_multiplier
    from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy
    from lightning_dpts.training import AccountantCallback, DPForecastStrategy

    out = Path(config.output_dir)
    started = time.perf_counter()
    entropy = resolve_entropy(config.seed)  # None: fresh OS entropy; never written anywhere
    if entropy.seeded:
        warnings.warn(f"dpts fit: {SEEDED_NOTICE}", UserWarning, stacklevel=2)
        progress(f"WARNING: {SEEDED_NOTICE}")

    def torch_seed(stream: int) -> int:
        """A torch seed from stream ``stream`` of the run's entropy (initialisation, forecast sampling)."""
        return int(entropy.seed_sequence(stream).generate_state(1, np.uint64)[0] >> np.uint64(1))

    if config.data is None:
        from lightning_dpts.data import load_dataset

        table, freq = load_dataset("us_employment"), config.freq or "M"
        data_name = "us_employment (bundled)"
    else:
        table, freq = load_long_table(config.data, config.id_column, config.time_column, config.value_column,
                                      config.freq)
        data_name = str(config.data)
    lengths = table.groupby("item_id", sort=False).size()
    config, recipe, chosen, planned_windows = resolve_with_test_windows(config, lengths.to_numpy(), freq)
    if recipe is not None:
        for line in recipe.describe():
            progress(line)
        if chosen:
            progress(f"chosen by the recipe: {', '.join(chosen)} (give an option to override it)")
        for text in recipe.warnings:
            warnings.warn(f"dpts fit: {text}", UserWarning, stacklevel=2)
            progress(f"WARNING: {text}")
    table, dropped_by_length = drop_short_series(table, config.min_series_length)
    if dropped_by_length:
        progress(f"left out {dropped_by_length} of {len(lengths)} series shorter than {config.min_series_length} "
                 "steps (min_series_length; not trained on and not evaluated)")
    raw_table = table
    clipped_count = None
    if config.clipping:  # a declared public range: the value bound of Theorem G.1 then holds for any change
        from lightning_dpts.evaluation import clip_values

        values, clipped_count = clip_values(table["target"].to_numpy(), config.clip_low, config.clip_high)
        table = table.assign(target=values)
    relation = NeighbouringRelation(level=config.level, size=config.size, value_bound=config.effective_value_bound)
    train_epsilon = config.epsilon - config.reserved_epsilon  # basic composition: noisy clipped count, DP metrics

    def datamodule(module: Any, test_windows: int) -> StructuredSubsamplingDataModule:
        sampling = {"top_level": config.top_level} if config.bands is None else {"top_level": "b_min_sep",
                                                                                  "bands": config.bands}
        return StructuredSubsamplingDataModule(
            table, batch_size=config.batch_size, instances_per_series=config.instances_per_series,
            **sampling, bottom_level=config.bottom_level, relation=relation,
            context_noise=config.context_noise, forecast_noise=config.forecast_noise, seed=config.seed,
            secure_mode=config.secure_mode, model=module, freq=freq, id_column="item_id", timestamp_column="timestamp",
            value_column="target", drop_short_series=config.drop_short_series, test_windows=test_windows,
        )

    init_seed = torch_seed(3)  # the initialisation is secret too (unless seeded); the non-DP reference reuses it
    torch.manual_seed(init_seed)
    estimator = _estimator(config, freq)
    module = estimator.create_lightning_module()
    from lightning_dpts.export import make_checkpoint_loadable

    make_checkpoint_loadable(module)  # GluonTS modules do not record their hyperparameters (load_from_checkpoint)
    test_windows, windows_note = fit_test_windows(config, planned_windows, table, freq, module)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SEEDED_WARNING)  # the seeded notice was given above
        warnings.filterwarnings("ignore", message=_LAG_WARNING)  # restated below with the accountant's numbers
        try:
            dm = datamodule(module, test_windows)
        except ConfigurationError as err:
            if "drop_short_series=True" not in err.requirement:
                raise
            raise ConfigurationError(err.parameter, err.value, err.requirement.replace(
                "drop_short_series=True", "--drop-short-series (YAML: drop_short_series: true)")) from err
    spec = dm.sampling_spec
    progress(f"data: {data_name}, {spec.num_series} series, shortest training part {spec.min_length} steps; "
             f"model {config.model}, past window {spec.context_length} (incl. lags), horizon {spec.prediction_length}")

    if dm.dropped_series:
        progress(f"dropped {len(dm.dropped_series)} series too short for training (--drop-short-series)")
    cost = None if config.bands is not None else _lag_cost(  # the series-level Monte Carlo reading has no lag cost
        spec, config.context_length or config.prediction_length, train_epsilon, config.delta, config.epochs,
        config.noise_multiplier)
    if cost is not None:
        warnings.warn(cost, UserWarning, stacklevel=2)
        progress(f"warning: {cost}")

    sigma = config.noise_multiplier
    bandmf = _bandmf_callbacks(config, spec, progress) if config.bands is not None else None  # checked before writing
    if bandmf is not None:
        assert sigma is not None
    elif sigma is None:
        progress(f"calibrating the noise multiplier for epsilon={train_epsilon:g}, delta={config.delta:g} "
                 f"in {config.epochs} epochs ({config.epochs * spec.steps_per_epoch} steps) ...")
        try:
            sigma = calibrate_noise_multiplier(spec, train_epsilon, config.delta, epochs=config.epochs)
        except ConfigurationError as err:
            raise ConfigurationError(
                "epsilon", config.epsilon,
                f"{err.requirement}; raise --epsilon or --delta, lower --epochs or --batch-size, or give "
                "--noise-multiplier (training then stops when the budget is spent)",
            ) from err
        progress(f"noise multiplier {sigma:.4f}")
    else:
        _check_one_step(spec, sigma, train_epsilon, config.delta)

    from lightning_dpts.outputs import OutputDirectory, write_json

    with OutputDirectory(out, config.overwrite) as run_dir:  # lock; --overwrite removes the earlier run's files
        if bandmf is not None:
            strategy, accountant = bandmf
        else:
            strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=config.max_grad_norm,
                                          seed=config.seed, secure_mode=config.secure_mode)
            accountant = AccountantCallback(epsilon=train_epsilon, delta=config.delta)
        logger: Any = False
        if config.private_outputs:  # the training loss of private batches is logged without noise: private
            run_dir.register("private/logs/", "private: Lightning CSV logs (noise-free training loss of private "
                             "batches, epsilon by step, the DP settings as hyperparameters)")
            logger = CSVLogger(str(out / PRIVATE_DIR), name="logs")
        trainer = L.Trainer(max_epochs=config.epochs, accelerator="cpu", devices=1, logger=logger,
                            callbacks=[strategy, accountant], enable_checkpointing=False, enable_model_summary=False,
                            log_every_n_steps=1)
        progress("training with DP-SGD (stops before the privacy budget is exceeded) ..." if bandmf is None else
                 f"training with BandMF (bands={config.bands}, b-min-sep sampling, {trainer.max_epochs} epochs) ...")
        trainer.fit(module, datamodule=dm)
        report_privacy = accountant.report
        assert report_privacy is not None
        steps = int(trainer.global_step)
        from lightning_dpts.export import MODEL_FILE, PREDICTOR_DIR, export_model
        from lightning_dpts.outputs import atomic_path

        run_dir.register("dp-model.ckpt", "public: the DP model's Lightning checkpoint (weights and optimizer state "
                         "are functions of the noisy gradients only; the privacy ledger travels with them)")
        with atomic_path(out / "dp-model.ckpt") as tmp:
            trainer.save_checkpoint(str(tmp))
        run_dir.register(f"{PREDICTOR_DIR}/", "public: the DP model as a GluonTS predictor (dpts predict)")
        run_dir.register(MODEL_FILE, "public: the model's class, constructor arguments and window geometry")
        export_model(estimator, module, out, freq=freq, checkpoint="dp-model.ckpt")

        predictions: dict[str, list[Any]] = {}
        pairs = dm.gluonts_test_pairs("test")
        inputs = [p[0] for p in pairs]
        raw_inputs, labels = _raw_evaluation(dm, pairs, raw_table, freq) if config.clipping else (
            inputs, [np.asarray(p[1]["target"], dtype=float) for p in pairs])
        windows = [w.window for w in dm.evaluation_windows("test")]
        predictor = estimator.create_predictor(estimator.create_transformation(), module)
        eval_seed = torch_seed(4)  # sample-based forecasts (reproducible when seeded)
        torch.manual_seed(eval_seed)
        predictions["dp"] = list(predictor.predict(inputs))

        if config.non_dp and steps > 0:
            progress(f"training the same model without DP for the same {steps} steps ...")
            torch.manual_seed(init_seed)
            plain_estimator = _estimator(config, freq)
            plain = plain_estimator.create_lightning_module()
            plain_trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, logger=False,
                                      enable_checkpointing=False, enable_model_summary=False,
                                      enable_progress_bar=False)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_SEEDED_WARNING)
                plain_dm = datamodule(plain, test_windows)
            plain_trainer.fit(plain, datamodule=plain_dm)
            plain_predictor = plain_estimator.create_predictor(plain_estimator.create_transformation(), plain)
            torch.manual_seed(eval_seed)
            predictions["non_dp"] = list(plain_predictor.predict(inputs))

        from gluonts.model.seasonal_naive import SeasonalNaivePredictor

        season = _season_length(freq)
        predictions["seasonal_naive"] = list(SeasonalNaivePredictor(
            prediction_length=config.prediction_length, season_length=season).predict(raw_inputs))
        if config.autoets:
            predictions["autoets"] = _autoets_forecasts(raw_inputs, config.prediction_length, season, freq)

        from lightning_dpts.evaluation import score_windows, verdict

        histories = [np.asarray(entry["target"], dtype=float) for entry in raw_inputs]
        metrics = {name: score_windows([_quantile_matrix(f) for f in fc], labels, histories, windows, season)
                   for name, fc in predictions.items()}
        curve = _epsilon_curve(accountant, spec, steps, report_privacy)
        report: dict[str, Any] = {
            "epsilon": report_privacy.epsilon + config.reserved_epsilon,
            "delta": report_privacy.delta,
            "epsilon_budget": config.epsilon,
            "epsilon_training": report_privacy.epsilon,
            "steps": steps,
            "compositions": report_privacy.compositions,
            "composition_unit": report_privacy.unit,
            "bound": {"theorem": report_privacy.theorem, "kind": report_privacy.kind},
            "noise_multiplier": sigma,
            "max_grad_norm": config.max_grad_norm,
            "epsilon_curve": curve,
            "test_windows": test_windows,
            "test_windows_choice": windows_note,
            "dp_hyperparameters": accountant.hyperparameters,
            "privacy_configuration": {
                "sampling_spec": _spec_dict(spec),
                "noise_multiplier": sigma,
                "calibrated": config.noise_multiplier is None,
            },
            "seeded": entropy.seeded,
            "secure_mode": config.secure_mode,
            "privacy_ledger": strategy.ledger.to_dict(),
            "data": data_name,
            "model": config.model,
            "config": _config_dict(config),
            "recipe": None if recipe is None else {**recipe.to_dict(), "chosen_by_recipe": chosen},
            "series_left_out_by_length": dropped_by_length,
            "covered_by_the_guarantee": PUBLIC_NOTICE,
        }
        if accountant.monte_carlo_report is not None:  # --bands: the Monte Carlo accountant's read-out
            report["monte_carlo"] = accountant.monte_carlo_report
        if entropy.seeded:
            report["seeded_notice"] = SEEDED_NOTICE
        if config.clipping:
            report["clipping"] = _clipping_report(config, clipped_count, relation, entropy)
        if config.dp_metrics_epsilon is not None:
            per_series = max(Counter(str(entry.get("item_id")) for entry in inputs).values())
            report["dp_metrics"] = _dp_metrics(config.dp_metrics_epsilon, predictions, labels, per_series, entropy)
        private: dict[str, Any] = {
            "notice": PRIVATE_NOTICE,
            "evaluation": {
                "test_windows": test_windows,
                "forecasts": len(labels),
                "series": spec.num_series,
                "metrics": "pooled over every rolling test window and series: crps = mean weighted quantile loss "
                           "(GluonTS mean_wQuantileLoss, the paper's CRPS), mae of the median, mase (seasonal error "
                           "of the history); crps_per_window = the same CRPS per window, earliest first",
                "season_length": season,
            },
            "metrics": metrics,
            "seconds": round(time.perf_counter() - started, 1),
        }
        if "non_dp" not in predictions or not (metrics["dp"]["crps"] < metrics["seasonal_naive"]["crps"]):
            private["levers"] = _levers(spec, config.epsilon, config.reserved_epsilon, config.delta, steps)
        private["verdict"] = verdict({**report, **private})
        for line in private["verdict"]:
            if line.startswith("VERDICT"):
                warnings.warn(f"dpts fit: {line}", UserWarning, stacklevel=2)
        from lightning_dpts.plots import plot_epsilon, plot_forecasts

        run_dir.register("epsilon.png", "public: epsilon against optimizer step, from the accountant (no data)")
        plot_epsilon(out / "epsilon.png", *_curve_by_step(curve, steps), budget=config.epsilon,
                     delta=report_privacy.delta, theorem=report_privacy.theorem, kind=report_privacy.kind,
                     spent=report_privacy.epsilon)
        if config.private_outputs:
            run_dir.register(f"{PRIVATE_DIR}/{EVALUATION_FILE}", "private: metrics of every model on the held-out "
                             "private windows, baselines, verdict and levers (noise-free functions of the data)")
            write_json(out / PRIVATE_DIR / EVALUATION_FILE, private)
            if config.private_plots:
                from lightning_dpts.plots import PRIVATE_PLOT_NOTICE

                run_dir.register(f"{PRIVATE_DIR}/forecasts.png", f"private: {PRIVATE_PLOT_NOTICE}")
                names = dict(zip(table["item_id"], table["title"], strict=True)) if "title" in table else None
                plot_forecasts(out / PRIVATE_DIR / "forecasts.png", inputs, labels, predictions, names=names)
        run_dir.register("report.json", "public: configuration, (epsilon, delta), sigma, C, sampling spec, ledger, "
                         "recipe and this manifest")
        report["files"] = run_dir.manifest()
        write_json(out / "report.json", report)
    progress(format_table({**report, "private": private}))
    return {**report, "private": private}


def _epsilon_curve(accountant: Any, spec: Any, steps: int, final: Any,
                   points: int = EPSILON_CURVE_POINTS) -> dict[str, list[Any]]:
    """Epsilon after every step, as upper bounds at up to ``points`` grid steps, from the accountant alone.

    Public: it depends only on the configuration (sampling spec, sigma, delta) and the number of steps, never on
    the data or on timings. ``{"steps": [s_1, ..., s_K = steps], "epsilon": [...]}``: epsilon after any step
    s <= s_k is at most ``epsilon[k]`` (the composition count is monotone). A Monte Carlo (``--bands``) run has
    one whole-run bound, valid for every prefix.
    """
    acc = getattr(accountant, "accountant", None)
    if steps <= 0:
        return {"steps": [], "epsilon": []}
    if acc is None or accountant.monte_carlo is not None:
        return {"steps": [steps], "epsilon": [float(final.epsilon)]}
    last = acc.compositions(steps)
    grid = sorted({math.ceil(k * last / min(points, last)) for k in range(1, min(points, last) + 1)})
    out_steps = [min(steps, spec.max_steps_for_compositions(c)) for c in grid]
    values = [float(final.epsilon) if s == steps else float(acc.epsilon(s, final.delta)) for s in out_steps]
    return {"steps": out_steps, "epsilon": values}


def _curve_by_step(curve: dict[str, list[Any]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps 1..n, epsilon bound after each) from :func:`_epsilon_curve`'s grid (each step takes the next point)."""
    grid = np.asarray(curve["steps"], dtype=int)
    if steps <= 0 or not len(grid):
        return np.zeros(0, dtype=int), np.zeros(0)
    every = np.arange(1, steps + 1)
    index = np.minimum(np.searchsorted(grid, every, side="left"), len(grid) - 1)
    return every, np.asarray(curve["epsilon"], dtype=float)[index]


def _config_dict(config: FitConfig) -> dict[str, Any]:
    """The configuration for the report, without the seed (never written: it would reproduce the randomness)."""
    d = asdict(config)
    d["seed"] = "explicit (not recorded)" if config.seed is not None else None
    return d


def _spec_dict(spec: Any) -> dict[str, Any]:
    d = asdict(spec)
    d.update(top_level_rate=spec.top_level_rate, bottom_level_rate=spec.bottom_level_rate,
             windows_per_unit=spec.windows_per_unit, steps_per_epoch=spec.steps_per_epoch)
    return d


def _autoets_forecasts(inputs: list[dict[str, Any]], horizon: int, season: int, freq: str) -> list[Any]:
    from gluonts.model.forecast import QuantileForecast
    from scipy.stats import norm
    from statsforecast.models import AutoETS

    from lightning_dpts.metrics import DEFAULT_QUANTILES

    out = []
    for entry in inputs:
        y = np.asarray(entry["target"], dtype=float)
        y = pd.Series(y).interpolate(limit_direction="both").to_numpy()
        fit = AutoETS(season_length=season).forecast(y=y, h=horizon, level=[80])
        mean = np.asarray(fit["mean"])
        sd = (np.asarray(fit["hi-80"]) - mean) / norm.ppf(0.9)
        arrays = np.stack([mean + norm.ppf(q) * sd for q in DEFAULT_QUANTILES])
        start = entry["start"] + len(y)
        out.append(QuantileForecast(arrays, start_date=start, forecast_keys=[str(q) for q in DEFAULT_QUANTILES]))
    return out


def _raw_evaluation(dm: Any, pairs: list[Any], raw_table: pd.DataFrame,
                    freq: str) -> tuple[list[dict[str, Any]], list[np.ndarray]]:
    """Unclipped inputs and labels of the test windows (clipping changes only what the private model is trained on).

    The raw table has the clipped table's geometry (clipping keeps every row), so the raw series are read at the
    same positions: history = the first ``len(history)`` values, label = the next ``prediction_length``.
    """
    from lightning_dpts.data.sources import to_collection

    raw = to_collection(raw_table, freq=freq, id_column="item_id", timestamp_column="timestamp", value_column="target")
    by_id = dict(zip(raw.item_ids, raw.targets, strict=True))
    inputs, labels = [], []
    for entry, _ in pairs:
        series = np.asarray(by_id[entry["item_id"]], dtype=float).reshape(len(by_id[entry["item_id"]]), -1)[:, 0]
        n = len(entry["target"])
        inputs.append({**entry, "target": np.asarray(series[:n], dtype=np.float32)})
        labels.append(series[n:n + dm.prediction_length])
    return inputs, labels


def _clipping_report(config: FitConfig, clipped: int | None, relation: Any, entropy: Any) -> dict[str, Any]:
    """What the report says about clipping: the public range, v, and only a DP estimate of the clipped count."""
    from lightning_dpts.evaluation import noisy_count

    out: dict[str, Any] = {
        "low": config.clip_low, "high": config.clip_high, "value_bound": config.effective_value_bound,
        "why": "every value was clipped to this declared public range before training, so the (w, v) relation "
               "of Theorem G.1 holds with v = high - low for any change of w steps; the guarantee is for the "
               "unbounded relation of the raw data",
    }
    eps = config.count_epsilon
    if eps > 0:
        released = noisy_count(int(clipped or 0), relation.size, eps, entropy)
        out["clipped_values_noisy"] = released["value"]
        out["count_privacy"] = (f"Laplace noise of scale {released['laplace_scale']:.4g} (sensitivity "
                                f"{relation.size}, epsilon {eps:g}, part of the budget); the exact count is private "
                                "and not written")
    else:
        out["clipped_values_noisy"] = None
        out["count_privacy"] = "not released (clip_count_epsilon=0): the exact count depends on the private data"
    return out


def _dp_metrics(epsilon: float, predictions: dict[str, list[Any]], labels: list[np.ndarray], per_series: int,
                entropy: Any) -> dict[str, Any]:
    """The public, DP release of the evaluation: a Laplace-noised count of the test windows on which the private
    model's quantile loss is below seasonal naive's (:func:`lightning_dpts.evaluation.window_wins`).

    Every protected unit lies in one series, and with the private model fixed (its release is accounted by the
    training epsilon; adaptive basic composition) only that series' ``per_series`` test windows can change, so
    the count's sensitivity is ``per_series``. The noise is stream (6, 1) of the run's entropy (the clipped count
    uses (6,)). The total number of windows is public (series lengths); the share is post-processing.
    """
    from lightning_dpts.evaluation import noisy_count, window_wins

    wins = window_wins([_quantile_matrix(f) for f in predictions["dp"]],
                       [_quantile_matrix(f) for f in predictions["seasonal_naive"]], labels)
    released = noisy_count(wins, per_series, epsilon, entropy, stream=(6, 1), parameter="dp_metrics_epsilon")
    total = len(labels)
    return {
        "windows_better_than_seasonal_naive_noisy": released["value"],
        "windows": total,
        "share_better_than_seasonal_naive": min(1.0, released["value"] / total) if total else None,
        "epsilon": float(epsilon),
        "privacy": f"Laplace noise of scale {released['laplace_scale']:.4g} (sensitivity {per_series}: the test "
                   f"windows of one series; epsilon {epsilon:g}, part of the budget); the exact count is private",
    }


def _levers(spec: Any, epsilon: float, count_epsilon: float, delta: float, steps: int) -> dict[str, Any]:
    """Numbers for the verdict's "what would help": sigma at 4x the budget epsilon for the same steps (the
    training part of it: minus ``count_epsilon``, the epsilon spent outside training, as for this run)."""
    from lightning_dpts.privacy import calibrate_noise_multiplier

    out: dict[str, Any] = {"effective_dataset_size": spec.num_series / spec.bottom_level_rate}
    larger = min(4 * epsilon, 100.0)
    if steps > 0 and larger > epsilon:
        try:
            sigma = calibrate_noise_multiplier(spec, larger - count_epsilon, delta, steps=steps)
            out["sigma_at_larger_epsilon"] = {"epsilon": larger, "noise_multiplier": sigma}
        except ConfigurationError:
            pass  # no sigma in the calibration range: the verdict then names epsilon without a number
    return out


def format_table(report: dict[str, Any]) -> str:
    """The printed result table: metrics per model plus the spent (epsilon, delta) and the bound used.

    ``report`` is what :func:`run_fit` returns: the public report with the private evaluation under ``"private"``
    (a flat dict with ``metrics`` at the top, as before the split, is read too).
    """
    report = {**report, **(report.get("private") or {})}
    bands = (report.get("config") or {}).get("bands")
    private = "private model (DP-SGD)" if bands is None else f"private model (BandMF b={bands})"
    names = {"dp": private, "non_dp": "same model, no DP", "seasonal_naive": "seasonal naive", "autoets": "AutoETS"}
    lines = [f"{'model':28} {'CRPS (mean wQL)':>16} {'CRPS per window':>24} {'MAE':>12} {'MASE':>8}"]
    for key, values in report["metrics"].items():
        per = values.get("crps_per_window", [])
        spread = f"{min(per):.4f}..{max(per):.4f}" if len(per) > 1 else ""
        mase = values.get("mase", float("nan"))
        lines.append(f"{names.get(key, key):28} {values['crps']:>16.4f} {spread:>24} {values['mae']:>12.3f} "
                     f"{mase:>8.3f}")
    evaluation = report.get("evaluation")
    if evaluation:
        lines.append(f"scored on {evaluation['test_windows']} rolling test windows x {evaluation['series']} series "
                     f"({evaluation['forecasts']} forecasts, never used for training)")
    bound = report["bound"]
    lines.append(f"privacy spent: epsilon={report['epsilon']:.4f} (budget {report['epsilon_budget']:g}), "
                 f"delta={report['delta']:g} after {report['steps']} steps; "
                 f"{bound['theorem']} ({bound['kind']} bound), "
                 f"noise multiplier {report['noise_multiplier']:.4f}")
    clipping = report.get("clipping")
    if clipping:
        count = clipping["clipped_values_noisy"]
        lines.append(f"values clipped to the public range [{clipping['low']:g}, {clipping['high']:g}] (v = "
                     f"{clipping['value_bound']:g}); clipped values: "
                     + (f"about {count} ({clipping['count_privacy']})" if count is not None else
                        clipping["count_privacy"]))
    dp_metrics = report.get("dp_metrics")
    if dp_metrics:
        wins = dp_metrics["windows_better_than_seasonal_naive_noisy"]
        lines.append(f"DP-released (public): the private model beats seasonal naive on about {wins} of "
                     f"{dp_metrics['windows']} test windows ({dp_metrics['privacy']})")
    if report.get("epsilon_training") is not None and report["epsilon_training"] != report["epsilon"]:
        metrics_eps = dp_metrics["epsilon"] if dp_metrics else 0.0
        parts = [f"{report['epsilon_training']:.4f} (training)"]
        count_eps = report["epsilon"] - report["epsilon_training"] - metrics_eps
        if clipping and count_eps > 0:
            parts.append(f"{count_eps:.4g} (clipped-value count)")
        if dp_metrics:
            parts.append(f"{metrics_eps:.4g} (DP metrics)")
        lines.append(f"epsilon = {' + '.join(parts)}, basic composition")
    lines.extend(report.get("verdict", []))
    if report.get("seeded"):
        lines.append(f"WARNING: {report.get('seeded_notice', 'this run used an explicit seed')}")
    return "\n".join(lines)


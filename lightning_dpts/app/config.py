"""The options of ``dpts fit``, declared once: :class:`FitConfig`'s fields.

Every option is one dataclass field whose metadata is an :class:`Option` (kind, range, command-line flag, help),
in the style of typed configs (jsonargparse/LightningCLI) without the dependency. From that one declaration derive

* the ``dpts fit`` argument parser (:func:`add_config_arguments`; ``dpts privacy --data`` reuses the data and
  model options through :func:`add_option`),
* the YAML config's conversion and key check (:meth:`FitConfig.from_mapping`),
* the range checks (:meth:`FitConfig.validate`, :data:`FIT_RANGES`) and the option names that error messages
  use (:func:`option_flags`).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from lightning_dpts.baselines import BASELINE_WINDOWS
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.evaluation import PROTOCOLS

__all__ = ["FIT_RANGES", "LEGACY_DEFAULTS", "LOGGERS", "MODELS", "RECIPE_FIELDS", "FitConfig", "Option",
           "add_config_arguments", "add_option", "default_of", "option_flags"]

#: ``dpts fit --logger`` choices -> the packages each needs (checked before any work): every group, one package
#: of each (MLflow's SQLite store needs SQLAlchemy, which mlflow-skinny lacks).
LOGGER_PACKAGES: dict[str, tuple[tuple[str, ...], ...]] = {
    "csv": (), "tensorboard": (("tensorboard", "tensorboardX"),), "mlflow": (("mlflow",), ("sqlalchemy",))}
LOGGERS: tuple[str, ...] = tuple(LOGGER_PACKAGES)
MODELS: tuple[str, ...] = ("combination", "seasonal_linear", "simple_feedforward", "deepar", "dlinear", "patch_tst")
#: Defaults of the options the recipe chooses, used when ``--model`` names a model other than the recipe's two
#: (``combination``, ``seasonal_linear``; its constants are tuned for them): context = horizon, as before the recipe.
LEGACY_DEFAULTS: dict[str, Any] = {"epochs": 100, "batch_size": 64, "max_grad_norm": 1.0, "learning_rate": 5e-3}
#: FitConfig fields the recipe fills when they are not given (lightning_dpts.recipe).
RECIPE_FIELDS: tuple[str, ...] = ("model", "context_length", "epochs", "batch_size", "max_grad_norm",
                                  "learning_rate", "min_series_length")
#: Fields whose names are checked against the privacy layer's lists (sampling levels, relation level).
_SCHEME_FIELDS = ("top_level", "bottom_level", "level")
_RECIPE = " (default: the recipe's, docs/recipe.md; 100 epochs, batch 64, C 1, learning rate 5e-3 for a --model " \
    "other than combination and seasonal_linear)"


@dataclass(frozen=True)
class Option:
    """How one :class:`FitConfig` field is typed, bounded and offered on the command line.

    Attributes:
        kind: ``"int"``, ``"float"``, ``"bool"`` or ``"str"``.
        low, high: the inclusive range of a number (``None``: not a ranged number). The caps keep every job's
            accounting and memory bounded (beyond them the accountant's numerics are slow or unreliable, or the
            value is meaningless: epsilon > 100 protects nothing, sigma > 100 learns nothing).
        optional: ``None`` is a valid value (unset: a default chosen later, e.g. by the recipe).
        open_low: the range is open at ``low`` (a value must be > low).
        choices: the allowed values of a text option (also the parser's choices).
        help, metavar: the command-line help.
        flag: the command-line option (default ``--`` + the name with dashes); ``negate``: the flag is a
            ``--no-...`` switch that sets the field to ``False``.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    optional: bool = False
    open_low: bool = False
    choices: tuple[str, ...] | None = None
    help: str = ""
    metavar: str | None = None
    flag: str | None = None
    negate: bool = False

    def cli_flag(self, name: str) -> str:
        return self.flag or "--" + name.replace("_", "-")


def _opt(default: Any, kind: str, help: str, **kw: Any) -> Any:  # noqa: A002 - argparse's word
    """A dataclass field declared with its :class:`Option`."""
    return field(default=default, metadata={"option": Option(kind, help=help, **kw)})


@dataclass
class FitConfig:
    """Everything ``dpts fit`` needs; the defaults are the documented default job.

    Attributes (units in brackets):
        data: path of a long-format CSV/Parquet file, or ``None`` for the bundled ``us_employment`` data.
        id_column, timestamp_column, value_column: column names in ``data`` (default ``item_id``, ``timestamp``,
            ``target``, as everywhere in lightning-dpts: :mod:`lightning_dpts.data.columns`). The old keyword
            ``time_column`` is accepted with a ``DeprecationWarning``; data with the old default columns ``id`` /
            ``value`` is read from them (with a ``DeprecationWarning``) when the names are left at their defaults.
        freq: pandas frequency of the series (inferred from the time stamps when ``None``).
        prediction_length: forecast horizon [time steps].
        model: one of :data:`MODELS`; ``None`` (default): the recipe's (:mod:`lightning_dpts.recipe`,
            ``combination``). Every option marked *recipe* below is chosen by
            :func:`~lightning_dpts.recipe.choose_recipe` from public metadata (number and lengths of series,
            frequency, horizon, budget, relation) when it is ``None`` and the model is one of the recipe's
            (``combination``, ``seasonal_linear``); with another model they default to :data:`LEGACY_DEFAULTS`
            (context = horizon). A given value always wins.
        context_length: model context [time steps] (*recipe*: for ``combination`` 5 primary seasons, or 4
            horizons without a season, and 2 second seasons (hourly: two weeks); for ``seasonal_linear`` 2 seasons
            or 2 horizons; capped so that a window stays within a quarter of the shortest training part;
            Theorem 4.4's r = (L_C + L_F)/T).
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
        season_length: m, the primary season of the model (``seasonal_linear`` and the recipe's past window),
            seasonal naive and MASE [time steps]; ``None`` (default): from the frequency
            (:func:`~lightning_dpts.data.seasonality.season_lengths`: daily 7, hourly 24 then 168, monthly 12,
            weekly 1). Public metadata; stated in ``report.json``. Must be shorter than the shortest series'
            training part (and than the past window of a model that reads it).
        non_dp: also train the model without DP for the same number of steps (the non-DP twin, part of the
            yardstick: it tells whether the model or the budget limits the accuracy).
        autoets: refuse to run when the statsforecast baselines cannot run (without it, they are skipped with a
            note when the package is missing).
        baselines: score AutoETS and AutoTheta (statsforecast, the optional extra ``lightning-dpts[baselines]``)
            next to seasonal naive with calibrated intervals (:mod:`lightning_dpts.baselines`); ``False``
            (``--no-baselines``) skips them (they cost up to about a second per held-out window of a long series).
        baseline_windows: fit AutoETS and AutoTheta to at most this many held-out windows (0: all): above it, a
            fixed subsample (:func:`~lightning_dpts.baselines.baseline_subset`) on which every model is scored for
            the table and the verdict; ``private/evaluation.json["metrics_all_windows"]`` keeps the scores of the
            other models over every window.
        evaluation: ``"rolling"`` (default): score ``test_windows`` rolling windows per series; ``"last"``: hold
            out and score only the last ``prediction_length`` steps of every series (the M4 protocol; the
            training part is then one window longer).
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
            entropy (docs/privacy.md, rule 7), so two runs differ. An integer >= 0 makes the run reproducible for
            experiments only: its guarantee does not hold against anyone who knows the seed, and the log, the
            report (``"seeded": true``) and the checkpoint say so; the seed itself is never written anywhere.
        secure_mode: draw the DP noise and the batch sampling from cryptographically secure generators the operating
            system seeds (Opacus' ``secure_mode`` threat model; needs ``seed=None``).
        logger: the Lightning logger of the training logs under ``private/logs/`` (they hold the noise-free
            training loss of private batches, so they are private): ``"csv"`` (default, ``CSVLogger``),
            ``"tensorboard"`` (``TensorBoardLogger``; the DP settings appear in the HParams dashboard) or
            ``"mlflow"`` (``MLFlowLogger`` with a SQLite store ``private/logs/mlflow.db``, artifacts in
            ``private/logs/artifacts``). A logger whose package is
            not installed is refused before any work. Nothing is logged with ``private_outputs=False``.
        verbose: print third-party warnings, Lightning's info lines and the progress bar (``dpts``'s quiet
            default filters known third-party warnings and shows a progress bar only on a terminal).
        resume: a ``dpts fit`` run directory to continue from its last checkpoint (``checkpoints/last.ckpt``) with
            its stored configuration (:mod:`lightning_dpts.app.resume`): the noisy steps it already took are accounted
            once (the final epsilon is that of one uninterrupted run of the same total steps); options that differ
            from the run's, a seeded run, and a directory whose ``ledger.json`` does not match its checkpoint are
            refused before any work. From Python (``run_fit``), fields left at their defaults take the run's
            values (a default cannot be told from an explicit value there; the command line can).
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
            b = 1 is Gaussian noise). Sampling: by default (``top_level`` left at its default, or
            ``"cyclic_poisson"``) cyclic Poisson sampling of series with k = b groups and the structured PLD
            accountant, exact at any delta (amplified BandMF, docs/bandmf.md Theorem B.2; the noise multiplier is
            calibrated when omitted, the recipe keeps the batch at most N/b series); with ``top_level="b_min_sep"``
            b-min-sep sampling (Algorithm 2) and the Monte Carlo accountant (Dong & Ganesh 2026, Theorem 5.1 + EVR
            Theorem A.1) in the series-level reading of docs/bandmf.md, which needs an explicit
            ``noise_multiplier`` (docs/cli.md).
        monte_carlo_samples: privacy-loss samples per direction of the Monte Carlo accountant (``bands`` with
            ``top_level="b_min_sep"`` only).
        dp_metrics_epsilon: the part of ``epsilon`` spent to release, in the public ``report.json``, how many held-out
            test windows the private model forecasts better than seasonal naive (``dp_metrics``; Laplace mechanism,
            sensitivity = the test windows per series, since every protected unit lies in one series; basic
            composition: training gets ``epsilon`` minus this and the clipped-count epsilon). ``None`` (default):
            nothing computed from the held-out data is published.
    """


    data: str | None = _opt(None, "str", "long-format CSV or Parquet file (default: the bundled us_employment data)",
                            optional=True, metavar="PATH")
    id_column: str = _opt("item_id", "str", "series id column (default item_id)", metavar="COLUMN")
    timestamp_column: str = _opt("timestamp", "str", "time stamp column (default timestamp; the old --time-column "
                                 "is accepted, deprecated)", metavar="COLUMN")
    value_column: str = _opt("target", "str", "value column (default target)", metavar="COLUMN")
    freq: str | None = _opt(None, "str", "pandas frequency (default: inferred from the time stamps)", optional=True)
    prediction_length: int = _opt(12, "int", "forecast horizon (default 12)", low=1, high=100_000, metavar="H")
    context_length: int | None = _opt(None, "int", "model context (default: the recipe's; the horizon for a --model "
                                      "other than combination and seasonal_linear)", low=1, high=100_000,
                                      optional=True)
    model: str | None = _opt(None, "str", "model (default: the recipe's, combination; docs/recipe.md)",
                             optional=True, choices=MODELS)
    season_length: int | None = _opt(None, "int", "primary season M of the model, seasonal naive and MASE (default: "
                                     "from the frequency: daily 7, hourly 24 then 168, monthly 12, weekly 1)",
                                     low=1, high=100_000, optional=True, metavar="M")
    epsilon: float = _opt(1.0, "float", "privacy budget epsilon (default 1)", low=0.0, high=100.0, open_low=True,
                          metavar="E")
    delta: float = _opt(1e-7, "float", "privacy budget delta (default 1e-7)", low=1e-15, high=0.1, metavar="D")
    noise_multiplier: float | None = _opt(None, "float", "sigma (default: calibrated for (epsilon, delta) in --epochs "
                                          "epochs)", low=0.1, high=100.0, optional=True)
    epochs: int | None = _opt(None, "int", f"training horizon to calibrate the noise for{_RECIPE}", low=1,
                              high=100_000, optional=True)
    batch_size: int | None = _opt(None, "int", f"windows per batch{_RECIPE}", low=1, high=10_000_000, optional=True)
    instances_per_series: int = _opt(1, "int", "windows per sampled series", low=1, high=1_000_000)
    top_level: str = _opt("without_replacement", "str", "series sampling (default without_replacement)")
    bottom_level: str = _opt("with_replacement", "str", "window sampling (default with_replacement)")
    max_grad_norm: float | None = _opt(None, "float", f"per-window clipping norm C{_RECIPE}", low=0.0, high=1e6,
                                       optional=True, open_low=True)
    learning_rate: float | None = _opt(None, "float", f"Adam learning rate{_RECIPE}", low=0.0, high=10.0,
                                       optional=True, open_low=True)
    min_series_length: int | None = _opt(None, "int", f"leave out series shorter than STEPS (1 keeps all){_RECIPE}",
                                         low=1, high=10**9, optional=True, metavar="STEPS")
    level: str = _opt("event", "str", "event or user level privacy (default event)")
    size: int = _opt(1, "int", "protected time steps w (default 1)", low=1, high=1_000_000)
    value_bound: float | None = _opt(None, "float", "per-step change bound v (for augmentation)", low=0.0, high=1e30,
                                     optional=True, open_low=True)
    context_noise: float = _opt(0.0, "float", "context augmentation std in units of v", low=0.0, high=1e6)
    forecast_noise: float = _opt(0.0, "float", "forecast augmentation std in units of v", low=0.0, high=1e6)
    drop_short_series: bool = _opt(False, "bool", "drop series too short for one training window plus the test "
                                   "window (default: refuse)")
    max_lag: int | None = _opt(None, "int", "deepar: keep only GluonTS's default lags <= LAG time steps (long lags "
                               "lengthen the past window and can destroy privacy amplification; default: all)",
                               low=1, high=100_000, optional=True, metavar="LAG")
    non_dp: bool = _opt(True, "bool", "skip training the same model without DP (on by default)", flag="--no-non-dp",
                        negate=True)
    autoets: bool = _opt(False, "bool", "refuse to run without the AutoETS and AutoTheta baselines (they run by "
                         "default when the optional statsforecast package is installed, and are skipped otherwise)")
    baselines: bool = _opt(True, "bool", "skip the AutoETS and AutoTheta baselines (statsforecast; seasonal naive "
                           "with intervals is always scored)", flag="--no-baselines", negate=True)
    baseline_windows: int = _opt(BASELINE_WINDOWS, "int", "fit AutoETS and AutoTheta to at most N held-out windows (a "
                                 f"fixed subsample every model is compared on; default {BASELINE_WINDOWS}; 0: all)",
                                 low=0, high=10**9, metavar="N")
    evaluation: str = _opt("rolling", "str", "evaluation protocol: rolling (default; several rolling test windows "
                           "per series) or last (the single last window: the last H points of every series, M4's)",
                           choices=PROTOCOLS)
    private_plots: bool = _opt(True, "bool", "do not write private/forecasts.png, which shows private data (history, "
                               "truth, forecasts)", flag="--no-private-plots", negate=True)
    private_outputs: bool = _opt(True, "bool", "write nothing computed from the private data without DP (no private/ "
                                 "folder: no evaluation.json, training logs or forecasts.png); the terminal still "
                                 "shows the evaluation", flag="--no-private-outputs", negate=True)
    dp_metrics_epsilon: float | None = _opt(None, "float", "spend E of --epsilon to publish in report.json a "
                                            "Laplace-noised count of the test windows the private model forecasts "
                                            "better than seasonal naive (default: publish no evaluation)", low=0.0,
                                            high=100.0, optional=True, open_low=True, metavar="E")
    overwrite: bool = _opt(False, "bool", "allow a non-empty --output-dir: first remove the files of the earlier dpts "
                           "run there (refused if it holds files no dpts run wrote)")
    seed: int | None = _opt(None, "int", "explicit seed for sampling, initialisation and DP noise, for experiments "
                            "only: the guarantee does not hold against anyone who knows it (default: secret OS "
                            "entropy)", low=0, high=2**64 - 1, optional=True)
    secure_mode: bool = _opt(False, "bool", "draw DP noise and sampling from the OS CSPRNG (Opacus secure_mode; no "
                             "--seed)")
    logger: str = _opt("csv", "str", "Lightning logger of the training logs under private/logs/ (noise-free "
                       "training loss, epsilon by step, the DP settings as hyperparameters): csv (default), "
                       "tensorboard or mlflow (needs its package)", choices=LOGGERS)
    verbose: bool = _opt(False, "bool", "show every third-party warning, Lightning's info lines and the progress bar "
                         "even when stdout is not a terminal (default: quiet, a line every tenth of training)")
    resume: str | None = _opt(None, "str", "continue the interrupted dpts fit run in RUN_DIR from its last checkpoint "
                              "with its own configuration, accounting every noisy step it already took (other "
                              "options must be omitted or equal the run's)", optional=True, metavar="RUN_DIR")
    output_dir: str = _opt("dpts-run", "str", "where results go, new or empty unless --overwrite (default dpts-run)",
                           metavar="DIR")
    test_windows: int | None = _opt(None, "int", "rolling test windows of the horizon at the end of every series, "
                                    "scored and never trained on (default 4)", low=1, high=10_000, optional=True,
                                    metavar="K")
    clip_low: float | None = _opt(None, "float", "declared public value range: clip every value to [LOW, HIGH] before "
                                  "training so that the value bound v = HIGH - LOW of noise augmentation (Theorem "
                                  "G.1) holds; needs --context-noise/--forecast-noise, not --value-bound",
                                  low=-1e30, high=1e30, optional=True, metavar="LOW")
    clip_high: float | None = _opt(None, "float", "upper end of the public range", low=-1e30, high=1e30,
                                   optional=True, metavar="HIGH")
    clip_count_epsilon: float | None = _opt(None, "float", "epsilon spent to release a Laplace-noised count of "
                                            "clipped values (default 2%% of --epsilon; 0: not released)", low=0.0,
                                            high=100.0, optional=True, metavar="E")
    bands: int | None = _opt(None, "int", "train with BandMF (B-banded correlated noise): cyclic Poisson sampling "
                             "of series in B groups, accounted exactly by the PLD accountant (default); with "
                             "--top-level b_min_sep: b-min-sep sampling and the Monte Carlo accountant (series level, "
                             "needs --noise-multiplier; docs/bandmf.md)", low=1, high=1024, optional=True, metavar="B")
    monte_carlo_samples: int = _opt(100_000, "int", "with --bands and --top-level b_min_sep: Monte Carlo samples per "
                                    "direction (default 100000)", low=1_000, high=100_000_000, metavar="M")

    @property
    def monte_carlo(self) -> bool:
        """``True`` for ``--bands`` with b-min-sep sampling: the Monte Carlo accountant's run (else PLD)."""
        from lightning_dpts.privacy.mechanisms import TOP_LEVEL_SCHEMES

        scheme = TOP_LEVEL_SCHEMES.get(self.top_level)
        return self.bands is not None and scheme is not None and scheme.needs_monte_carlo

    @property
    def bands_top_level(self) -> str:
        """The top level of a ``--bands`` run: ``b_min_sep`` when asked for, else ``cyclic_poisson``."""
        return "b_min_sep" if self.monte_carlo else "cyclic_poisson"

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
        if "time_column" in values:  # the old key (YAML, dpts privacy --data)
            from lightning_dpts.data.columns import renamed_parameter

            values = dict(values)
            old = values.pop("time_column")
            if "timestamp_column" not in values:
                renamed_parameter(f"{source or 'config'} key time_column", "timestamp_column")
                values["timestamp_column"] = old
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigurationError(source or "config", unknown, f"has unknown keys; known keys are {sorted(known)}")
        out: dict[str, Any] = {}
        for key, value in values.items():
            out[key] = _coerce(key, value, source)
        return cls(**out)

    def validate(self) -> None:
        """Range checks that do not need the data (the datamodule and accountant check the rest).

        Every numeric field must be a real number of the right kind inside its documented range (its
        :class:`Option`, :data:`FIT_RANGES`): values outside are refused before anything is loaded, trained or
        written.
        """
        from lightning_dpts.privacy.mechanisms import TOP_LEVEL_SCHEMES
        from lightning_dpts.privacy.spec import BOTTOM_LEVELS, LEVELS, TOP_LEVELS

        if self.model is not None and self.model not in MODELS:
            raise ConfigurationError("model", self.model, f"must be one of {', '.join(MODELS)}")
        if self.logger not in LOGGERS:
            raise ConfigurationError("logger", self.logger, f"must be one of {', '.join(LOGGERS)}")
        import importlib.util

        for group in LOGGER_PACKAGES[self.logger]:
            if not any(importlib.util.find_spec(name) is not None for name in group):
                raise ConfigurationError("logger", self.logger, f"needs the package {group[0]}, which is not "
                                         f"installed (pip install {group[0]}), or choose --logger csv")
        # without --bands only the structured PLD accountant runs: no top level that needs the Monte Carlo one
        fit_top_levels = TOP_LEVELS if self.bands is not None else tuple(
            name for name, scheme in TOP_LEVEL_SCHEMES.items() if not scheme.needs_monte_carlo)
        for name, choices in (("top_level", fit_top_levels), ("bottom_level", BOTTOM_LEVELS), ("level", LEVELS)):
            if getattr(self, name) not in choices:
                raise ConfigurationError(name, getattr(self, name), f"must be one of {', '.join(choices)}")
        for name, opt in _ranged():
            _check_range(name, getattr(self, name), opt)
        for name, opt in _options():
            value = getattr(self, name)
            if opt.kind == "str" and opt.choices is None and name not in _SCHEME_FIELDS:
                if not (value is None and opt.optional) and (not isinstance(value, str) or not value):
                    raise ConfigurationError(name, value, "must be a non-empty string")
        for name, opt in _options():
            if opt.kind == "bool" and not isinstance(getattr(self, name), bool):
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
        if self.dp_metrics_epsilon is not None and self.monte_carlo:
            raise ConfigurationError("dp_metrics_epsilon", self.dp_metrics_epsilon, "cannot be combined with --bands "
                                     "--top-level b_min_sep (the Monte Carlo accountant verifies the whole budget "
                                     "for training); omit it")
        if self.dp_metrics_epsilon is not None and not self.reserved_epsilon < self.epsilon:
            raise ConfigurationError("dp_metrics_epsilon", self.dp_metrics_epsilon, f"must be smaller than epsilon="
                                     f"{self.epsilon:g} minus the clipped-count epsilon {self.count_epsilon:g} (the "
                                     "rest of the budget trains the model)")
        if self.bands is not None:
            _validate_bands(self)
        if self.resume is not None:
            from pathlib import Path

            if not Path(self.resume).is_dir():
                raise ConfigurationError("resume", str(self.resume), "no such run directory")
        if self.data is not None:  # a missing file is refused here, before the heavy imports and the recipe
            from pathlib import Path

            if not Path(self.data).is_file():
                raise ConfigurationError("data", str(self.data), "no such file")
        if self.evaluation not in PROTOCOLS:
            raise ConfigurationError("evaluation", self.evaluation, f"must be one of {', '.join(PROTOCOLS)}")
        if self.evaluation == "last" and self.test_windows not in (None, 1):
            raise ConfigurationError("test_windows", self.test_windows, "must be 1 or unset with evaluation 'last' "
                                     "(the single last window of every series)")
        if self.autoets:
            from lightning_dpts.baselines import STATSFORECAST_HINT, statsforecast_available

            if not self.baselines:
                raise ConfigurationError("autoets", True, "asks for the AutoETS and AutoTheta baselines, which "
                                         "--no-baselines skips; omit one of them")
            if not statsforecast_available():
                raise ConfigurationError("autoets", True, f"needs the optional package statsforecast "
                                         f"({STATSFORECAST_HINT})")

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



from lightning_dpts.data.columns import accept_time_column_keyword  # noqa: E402 (after the class)

accept_time_column_keyword(FitConfig)


def default_of(name: str) -> Any:
    """The default of :class:`FitConfig` field ``name`` (what ``dpts fit`` uses when the option is not given)."""
    return next(f.default for f in fields(FitConfig) if f.name == name)


def _options() -> list[tuple[str, Option]]:
    """(field name, :class:`Option`) of every :class:`FitConfig` field, in declaration order."""
    return [(f.name, f.metadata["option"]) for f in fields(FitConfig)]


def _ranged() -> list[tuple[str, Option]]:
    return [(name, opt) for name, opt in _options() if opt.low is not None]


#: field -> (lowest, highest, "int" or "float", may be None), derived from the fields' :class:`Option`. Bounds are
#: inclusive except the open ends (``Option.open_low``: epsilon, noise levels > 0).
FIT_RANGES: dict[str, tuple[float, float, str, bool]] = {
    name: (opt.low, opt.high, opt.kind, opt.optional) for name, opt in _ranged()  # type: ignore[misc]
}


def _check_range(name: str, value: Any, opt: Option) -> None:
    low, high, kind, optional = opt.low, opt.high, opt.kind, opt.optional
    assert low is not None and high is not None
    if value is None and optional:
        return
    left = "(" if opt.open_low else "["
    span = f"[{int(low)}, {int(high)}]" if kind == "int" else f"{left}{low:g}, {high:g}]"
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
            raise ConfigurationError(name, value, f"must be an integer in {span}" + (" or omitted" if optional else ""))
        return
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = math.isfinite(v) and (v > low if opt.open_low else v >= low) and v <= high
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

    opt = dict(_options())[key]
    if opt.kind in ("int", "float"):
        if value is None:
            if opt.optional:
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
        if opt.kind == "int":
            if isinstance(value, float):
                if not (math.isfinite(value) and value == int(value)):
                    raise bad("must be a whole number")
                value = int(value)
            return value
        return float(value)
    if opt.kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise bad("must be true or false")
    if opt.optional and value is None:
        return None
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise bad("must be text")


def whole_number(text: str) -> int:
    """argparse type for ``dpts fit``'s integer options: ``100``, ``1e3`` and ``100.0`` mean the same."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number (got {text!r})") from None
    if not (value == value and abs(value) != float("inf") and value == int(value)):
        raise argparse.ArgumentTypeError(f"must be a whole number (got {text!r})")
    return int(value)


def add_option(parser: Any, name: str, *, default: Any, help: str | None = None) -> None:  # noqa: A002
    """Add the command-line option of :class:`FitConfig` field ``name`` to ``parser`` (a parser or group).

    Type, choices, flag and metavar come from the field's :class:`Option`; ``help`` replaces its help where a
    command reads the option differently (``dpts privacy --data``).
    """
    opt = dict(_options())[name]
    kwargs: dict[str, Any] = {"default": default, "help": opt.help if help is None else help}
    if opt.kind == "bool":
        kwargs.update(dest=name, action="store_false" if opt.negate else "store_true")
    else:
        if opt.metavar is not None:
            kwargs["metavar"] = opt.metavar
        if opt.choices is not None:
            kwargs["choices"] = opt.choices
        elif opt.kind == "int":
            kwargs["type"] = whole_number
        elif opt.kind == "float":
            kwargs["type"] = float
    parser.add_argument(opt.cli_flag(name), **kwargs)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every :class:`FitConfig` field as an option of ``parser`` with default ``argparse.SUPPRESS``: an unset
    option is absent from the parsed namespace, so it falls back to ``--config``, then to the field's default."""
    for name, _ in _options():
        add_option(parser, name, default=argparse.SUPPRESS)


def option_flags() -> dict[str, str]:
    """Field name -> command-line option, for error messages (``--no-non-dp`` for ``non_dp``)."""
    return {name: opt.cli_flag(name) for name, opt in _options()}


# ---------------------------------------------------------------------------------------------------------
# --bands: what the Monte Carlo accountant's series-level reading covers (docs/bandmf.md)
# ---------------------------------------------------------------------------------------------------------
def _validate_bands(config: FitConfig) -> None:
    """The checks of ``bands`` that need no data: what cyclic Poisson sampling (PLD accountant) or, with
    ``top_level="b_min_sep"``, the Monte Carlo accountant's series-level reading covers."""
    from lightning_dpts.privacy.mechanisms import BOTTOM_LEVEL_SCHEMES, TOP_LEVEL_SCHEMES

    default_top_level = default_of("top_level")
    if config.top_level != default_top_level and not TOP_LEVEL_SCHEMES[config.top_level].separates_participations:
        raise ConfigurationError("top_level", config.top_level, "must be cyclic_poisson (or left at its default) or "
                                 "b_min_sep with --bands: BandMF needs sampling that keeps two participations of a "
                                 "series at least B steps apart")
    if not config.monte_carlo:
        for name in ("context_noise", "forecast_noise"):
            if getattr(config, name):
                raise ConfigurationError(name, getattr(config, name), "must be 0 with --bands: amplification by "
                                         "augmentation noise (Theorem G.1) is not proven for cyclic Poisson sampling")
        return
    if config.noise_multiplier is None:
        raise ConfigurationError(
            "noise_multiplier", None,
            "is required with --bands: calibrating sigma for (epsilon, delta) by Algorithm 5 verifies every "
            "candidate with Monte Carlo samples (about 4.9e5 per direction for delta 1e-2 at epsilon 8, 1.1e7 "
            "for delta 1e-5, each O(steps x bands)), too slow for a command-line run; calibrate it once in Python "
            "with lightning_dpts.privacy.montecarlo.calibrate_noise_multiplier_monte_carlo (docs/bandmf.md) and "
            "pass it as --noise-multiplier (the budget is then verified before training)")
    if not BOTTOM_LEVEL_SCHEMES[config.bottom_level].bounded_windows_per_series:
        raise ConfigurationError("bottom_level", config.bottom_level, "must be with_replacement with --bands: the "
                                 "Monte Carlo accountant's series-level sensitivity is instances_per_series windows, "
                                 "which only a with-replacement bottom level bounds")
    for name in ("context_noise", "forecast_noise"):
        if getattr(config, name):
            raise ConfigurationError(name, getattr(config, name), "must be 0 with --bands: the Monte Carlo "
                                     "accountant (series level) does not credit augmentation noise; omit it")


"""The parts of ``dpts synth`` (:func:`lightning_dpts.app.jobs.synth.run_synth`): its configuration, reading the private
data, Train-on-Synthetic-Test-on-Real scoring and writing the release.

:class:`SynthConfig` validates the job's options; :func:`load_series` reads the private data (the bundled
``us_employment`` by default, or a long-format file read exactly as ``dpts fit --data`` reads it);
:func:`holdout_windows` cuts the held-out TSTR windows; :func:`tstr_scores` trains DLinear on synthetic windows and
scores it on real ones; :func:`write_synthetic` and :func:`plot_real_vs_synthetic` write the outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lightning_dpts.data.columns import accept_time_column_keyword
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.synthetic.privacy import RELATIONS, UNITS

__all__ = ["EVALUATION_NOTE", "KEEP_ON_OVERWRITE", "SynthConfig", "distinct_rows", "holdout_windows", "load_series",
           "plot_real_vs_synthetic", "synth_verdict", "tstr_scores", "write_synthetic"]

EVALUATION_NOTE = (
    "c_fid, c_fid_initial, tstr, private_windows, private_windows_skipped_missing, real_vs_synthetic.png and "
    "dp_sgd/ are computed from the private data itself (real windows, their count, held-out real values, a second "
    "private training); they are NOT covered by the (epsilon, delta) guarantee, which covers synthetic.csv.gz "
    "only. Keep them with the data owner."
)
#: Files of an earlier run that ``overwrite`` keeps: the public pretrained weights (public data only), for reuse.
KEEP_ON_OVERWRITE = {"pretrained-*.pt": "public: the VAE and encoders pretrained on public data only (cached for "
                                        "reuse; no private data)"}


@dataclass
class SynthConfig:
    """Everything ``dpts synth`` needs; the defaults are the documented default job.

    Attributes (units in brackets):
        data: long-format CSV/Parquet file, or ``None`` for the bundled ``us_employment`` data.
        id_column, timestamp_column, value_column, freq: as in ``dpts fit`` (default ``item_id``, ``timestamp``,
            ``target``; the old keyword ``time_column`` and data with the old default columns ``id`` / ``value``
            are accepted with a ``DeprecationWarning``: :mod:`lightning_dpts.data.columns`).
        class_column: optional column holding each series' class (conditional generation, Algorithm 1
            with |C| > 1); then ``classes`` must list the classes, which are treated as public.
        classes: the public list of class values (required with ``class_column``).
        length: window length T [time steps].
        num_samples: M, synthetic windows to release (a multiple of the number of classes).
        iterations: rounds of Algorithm 1 (each one noisy histogram). Default 1: on both real datasets more rounds
            gave a worse C-FID, even without noise (docs/synthetic.md, "Why the defaults are what they are").
        epsilon, delta: the privacy budget of the release.
        unit: ``"series"`` (default: one whole series, at most ``max_windows_per_series`` windows, vote weight
            1/m) or ``"window"`` (one window of ``length`` steps, vote weight 1; with the default relation
            ``substitution`` this covers any change inside one window, e.g. one time step's value).
        max_windows_per_series: m for ``unit="series"``.
        relation: ``"add_remove"`` (Delta = 1) or ``"substitution"`` (Delta = sqrt(2)); ``None`` (default) picks
            ``add_remove`` for ``unit="series"`` (a series joins or leaves) and ``substitution`` for
            ``unit="window"`` (a window's values change: that is what a changed time step does).
        threshold: H of Algorithm 2 [votes]; ``None`` (default) = one noise standard deviation (sigma * Delta,
            a function of epsilon, delta, the rounds and the relation only: public).
        lookahead: k variations averaged per candidate embedding.
        variation_schedule: degrees in [0, 100], resampled to ``iterations`` rounds (default PETS S3).
        prediction_length: TSTR horizon [time steps] (held out at the end of every series); < length.
        tstr: train a forecaster on the synthetic windows and score it on the held-out real values.
        tstr_steps: optimizer steps of that (non-private) training.
        compare_dp_sgd: also train the same forecaster with DP-SGD (``dpts fit``) at the same (epsilon, delta).
        public_data: a long-format file *declared public* to pretrain on (default: the generator's output).
        pretrain_epochs: (VAE epochs, encoder epochs) of public pretraining.
        num_public: generated public windows for pretraining.
        secure_noise: draw the vote noise from the OS CSPRNG.
        seed: ``None`` (default; fresh OS entropy) or an integer for experiments (the report then carries
            :data:`~lightning_dpts.randomness.SEEDED_NOTICE`).
        output_dir: where outputs go, new or empty unless ``overwrite``; the public pretrained weights are cached
            there and reused by a later run with ``overwrite``.
        progress: show progress bars.
        private_outputs: write the evaluation computed from the private data (``private/``); ``False``
            (``--no-private-outputs``) writes none of it (the terminal still shows it).
        private_plots: write ``private/real_vs_synthetic.png`` (real private windows); ``False``
            (``--no-private-plots``) skips it.
        value_range: (LO, HI) [data units], bounds of the values the user declares public: the release is written
            in the data's units, de-standardised with a DP level and spread (one more noisy round, accounted:
            :mod:`lightning_dpts.synthetic.scale`). ``None`` (default): the values stay standardised (mean 0, std 1
            per window) and the output says why.
        start: the first time stamp of every synthetic window, a date declared public (e.g. ``"2015-01-01"``);
            ``None``: the public placeholder 2000-01-01 (the data's own dates are private and never written).
        overwrite: allow a non-empty ``output_dir``: first remove the earlier run's files (those it listed; the
            public pretrained weights are kept for reuse); a directory holding other files is refused.
    """

    data: str | None = None
    id_column: str = "item_id"
    timestamp_column: str = "timestamp"
    value_column: str = "target"
    freq: str | None = None
    class_column: str | None = None
    classes: list[str] | None = None
    length: int = 36
    num_samples: int = 128
    iterations: int = 1
    epsilon: float = 1.0
    delta: float = 1e-5
    unit: str = "series"
    max_windows_per_series: int = 4
    relation: str | None = None
    threshold: float | None = None
    lookahead: int = 4
    variation_schedule: list[float] | None = None
    prediction_length: int = 12
    tstr: bool = True
    tstr_steps: int = 300
    compare_dp_sgd: bool = False
    public_data: str | None = None
    pretrain_epochs: tuple[int, int] = (12, 6)
    num_public: int = 2048
    secure_noise: bool = False
    seed: int | None = None
    output_dir: str = "dpts-synth"
    progress: bool = True
    private_outputs: bool = True
    private_plots: bool = True
    value_range: tuple[float, float] | None = None
    start: str | None = None
    overwrite: bool = False

    def validate(self) -> None:
        """Range checks that do not need the data."""
        for name in ("length", "num_samples", "iterations", "max_windows_per_series", "prediction_length",
                     "tstr_steps", "num_public"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(name, value, "must be an integer >= 1")
        if self.length < 4:
            raise ConfigurationError("length", self.length, "must be an integer >= 4")
        if self.num_samples < 2:
            raise ConfigurationError("num_samples", self.num_samples, "must be an integer >= 2")
        if self.tstr and not self.prediction_length < self.length:
            raise ConfigurationError("prediction_length", self.prediction_length,
                                     f"must be smaller than the window length {self.length} for TSTR")
        if isinstance(self.epsilon, bool) or not (isinstance(self.epsilon, (int, float)) and 0 < self.epsilon
                                                  and math.isfinite(self.epsilon)):
            raise ConfigurationError("epsilon", self.epsilon, "must be a finite number > 0")
        if isinstance(self.delta, bool) or not (isinstance(self.delta, (int, float)) and 0 < self.delta < 1):
            raise ConfigurationError("delta", self.delta, "must lie strictly between 0 and 1")
        if self.unit not in UNITS:
            raise ConfigurationError("unit", self.unit, f"must be one of {', '.join(UNITS)}")
        if self.relation is not None and self.relation not in RELATIONS:
            raise ConfigurationError("relation", self.relation, f"must be one of {', '.join(RELATIONS)}")
        if self.threshold is not None and (isinstance(self.threshold, bool) or not (
                isinstance(self.threshold, (int, float)) and self.threshold >= 0 and math.isfinite(self.threshold))):
            raise ConfigurationError("threshold", self.threshold, "must be a finite number >= 0 (votes)")
        if isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int) or self.lookahead < 0:
            raise ConfigurationError("lookahead", self.lookahead, "must be an integer >= 0")
        if (self.class_column is None) != (self.classes is None):
            raise ConfigurationError("classes", self.classes, "give the public list of classes exactly when "
                                     "class_column is given (the class set must not be read from private data)")
        if self.classes is not None and (len(self.classes) < 1 or len(set(self.classes)) != len(self.classes)):
            raise ConfigurationError("classes", self.classes, "must be a non-empty list of distinct values")
        if self.classes is not None and self.num_samples % len(self.classes) != 0:
            raise ConfigurationError("num_samples", self.num_samples, f"must be a multiple of the number of classes "
                                     f"({len(self.classes)}); Algorithm 1 generates M/|C| per class")
        for name in ("private_outputs", "private_plots", "overwrite", "tstr", "compare_dp_sgd"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, getattr(self, name), "must be true or false")
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ConfigurationError("output_dir", self.output_dir, "must be a non-empty string")
        epochs = tuple(self.pretrain_epochs)
        if len(epochs) != 2 or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in epochs):
            raise ConfigurationError("pretrain_epochs", self.pretrain_epochs, "must be two integers >= 1")
        from lightning_dpts.synthetic.scale import check_value_range

        self.value_range = check_value_range(self.value_range)
        if self.start is not None:
            try:
                pd.Timestamp(self.start)
            except (TypeError, ValueError):
                raise ConfigurationError("start", self.start, "must be a date, e.g. 2015-01-01 (declared public)") \
                    from None
        from lightning_dpts.randomness import resolve_entropy

        resolve_entropy(self.seed)  # validates the seed; the Entropy is drawn again in run_synth

    @property
    def rounds(self) -> int:
        """The noisy rounds the release composes: ``iterations`` votes, plus the scale round with ``value_range``."""
        return self.iterations + (self.value_range is not None)

    @property
    def resolved_relation(self) -> str:
        """The neighbouring relation in force: ``relation``, or the unit's default when it is ``None``."""
        if self.relation is not None:
            return self.relation
        return "add_remove" if self.unit == "series" else "substitution"

    def resolved_threshold(self, noise_std: float) -> float:
        """H in votes: ``threshold``, or one noise standard deviation (``noise_std`` = sigma * Delta) if ``None``."""
        return float(noise_std) if self.threshold is None else float(self.threshold)


accept_time_column_keyword(SynthConfig)


# ---------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------
def load_series(config: SynthConfig) -> tuple[list[np.ndarray], list[str], list[int] | None, str, str]:
    """(series values, ids, class index per series or None, freq, data name)."""
    if config.data is None:
        from lightning_dpts.data.sources import load_dataset

        table, freq, name = load_dataset("us_employment"), config.freq or "M", "us_employment (bundled)"
    else:
        from lightning_dpts.data.loading import load_long_table

        table, freq = load_long_table(config.data, config.id_column, config.timestamp_column, config.value_column,
                                      config.freq)
        # the columns read (the old default names, if the file has those): also the names synthetic.csv.gz uses
        config.id_column, config.timestamp_column, config.value_column = table.attrs["source_columns"]
        name = str(config.data)
    from lightning_dpts.data.sources import to_collection

    collection = to_collection(table, freq=freq)
    series = [t[:, 0] for t in collection.targets]
    classes = None
    if config.class_column is not None:
        classes = _class_index(config, collection.item_ids)
    return series, list(collection.item_ids), classes, freq, name


def _class_index(config: SynthConfig, item_ids: list[str]) -> list[int]:
    assert config.data is not None and config.classes is not None
    path = Path(config.data)
    raw = pd.read_parquet(path) if path.name.lower().endswith((".parquet", ".pq")) else pd.read_csv(path)
    if config.class_column not in raw.columns:
        raise ConfigurationError("class_column", config.class_column, f"is not a column of {path.name}")
    per_series = raw.groupby(raw[config.id_column].astype(str))[config.class_column].agg(lambda v: set(v.astype(str)))
    if (per_series.map(len) != 1).any():
        raise ConfigurationError("class_column", config.class_column, "must hold one class per series")
    lookup = {str(c): i for i, c in enumerate(config.classes)}
    out = []
    for item in item_ids:
        (value,) = per_series[item]
        if value not in lookup:
            raise ConfigurationError("classes", config.classes, f"does not list class {value!r} found in the data")
        out.append(lookup[value])
    return out


# ---------------------------------------------------------------------------------------------------------
# TSTR
# ---------------------------------------------------------------------------------------------------------
def _quantile_loss(quantiles: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    """(mean weighted quantile loss, MAE of the median) with :class:`lightning_dpts.metrics.WeightedQuantileLoss`."""
    import torch

    from lightning_dpts.metrics import DEFAULT_QUANTILES, WeightedQuantileLoss

    metric = WeightedQuantileLoss(DEFAULT_QUANTILES)
    metric.update(torch.from_numpy(quantiles), torch.from_numpy(truth))
    median = quantiles[..., DEFAULT_QUANTILES.index(0.5)]
    ok = np.isfinite(truth)
    return float(metric.compute()), float(np.abs(median - truth)[ok].mean())


def holdout_windows(series: list[np.ndarray], context: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """Contexts ``[n, context]`` and targets ``[n, horizon]``: the last ``horizon`` steps of every series long
    enough, with a complete context."""
    ctx, tgt = [], []
    for values in series:
        if len(values) < context + horizon:
            continue
        c, y = values[-(context + horizon):-horizon], values[-horizon:]
        if np.isfinite(c).all() and np.isfinite(y).any():
            ctx.append(c)
            tgt.append(y)
    if not ctx:
        raise ConfigurationError("prediction_length", horizon, "no series is long enough for a TSTR test window")
    return np.stack(ctx), np.stack(tgt)


def tstr_scores(synthetic: np.ndarray, series: list[np.ndarray], freq: str, horizon: int, *, steps: int = 300,
                progress: bool = False) -> dict[str, dict[str, float]]:
    """Train on Synthetic, Test on Real: DLinear (``dpts fit``'s default model) trained on the synthetic
    windows, scored on the last ``horizon`` real steps of every series, next to seasonal naive.

    Test contexts are z-scored with their own mean/std (the synthetic windows' scale), forecasts are mapped
    back, and both are scored in the data's units with the weighted quantile loss (CRPS) and the MAE.
    """
    import lightning as L
    import torch
    from gluonts.time_feature import get_seasonality

    from lightning_dpts.app.config import FitConfig
    from lightning_dpts.app.forecasters import make_estimator
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.evaluation import quantile_matrix

    length = synthetic.shape[1]
    context = length - horizon
    contexts, targets = holdout_windows(series, context, horizon)
    mean = contexts.mean(1, keepdims=True)
    std = np.maximum(contexts.std(1, keepdims=True), 1e-6)

    fit_config = FitConfig(model="dlinear", prediction_length=horizon, context_length=context)
    estimator = make_estimator(fit_config, freq)
    module = estimator.create_lightning_module()
    dm = StructuredSubsamplingDataModule([row.astype(np.float32) for row in synthetic], model=module,
                                         batch_size=min(64, len(synthetic)), freq=freq, test_windows=0)
    # seed=None: fresh OS entropy. The batches of this training on the released windows are post-processing and
    # need no secret, but an explicit seed would make the datamodule warn that the guarantee does not hold.
    with torch.random.fork_rng(devices=[]):
        trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=progress)
        trainer.fit(module, datamodule=dm)
        predictor = estimator.create_predictor(estimator.create_transformation(), module)
        start = pd.Period("2000-01-01", freq=freq)
        inputs = [{"start": start, "target": ((c - m) / s).astype(np.float32)}
                  for c, m, s in zip(contexts, mean[:, 0], std[:, 0], strict=True)]
        forecasts = list(predictor.predict(inputs))
    q = np.stack([quantile_matrix(f) for f in forecasts]) * std[:, :, None] + mean[:, :, None]
    crps, mae = _quantile_loss(q, targets)
    scores = {"tstr_dlinear": {"crps": crps, "mae": mae}}

    from gluonts.model.seasonal_naive import SeasonalNaivePredictor

    naive_predictor = SeasonalNaivePredictor(prediction_length=horizon, season_length=int(get_seasonality(freq)))
    naive = list(naive_predictor.predict([{"start": start, "target": c} for c in contexts]))
    crps, mae = _quantile_loss(np.stack([quantile_matrix(f) for f in naive]), targets)
    scores["seasonal_naive"] = {"crps": crps, "mae": mae}
    return scores


def synth_verdict(evaluation: dict, *, epsilon: float, noise_std: float, votes: float, unit: str,
                  iterations: int) -> list[str]:
    """Plain-language verdict lines on a release, like ``dpts fit``'s (computed from the private data: they go
    to the terminal and ``private/evaluation.json`` only).

    The first line starts with ``VERDICT:`` if and only if the release's C-FID is not below the initial public
    population's (ties and NaN lose: the public population spends no budget). ``votes`` is the total vote weight
    of the private units (series at series level, windows at window level) and ``noise_std`` the noise std per
    histogram bin, both in votes; a second line compares the release's TSTR CRPS with seasonal naive's.
    """
    c_fid, start = float(evaluation["c_fid"]), float(evaluation["c_fid_initial"])
    lines: list[str] = []
    if not (c_fid < start):
        levers = [f"a larger epsilon (noise std {noise_std:.3g} votes per candidate at epsilon = {epsilon:g}, "
                  f"against {votes:.0f} votes in total)"]
        if unit == "series":
            levers.append("--unit window, if one window is the unit you need to protect (every window votes with "
                          "weight 1 instead of every series)")
        if iterations > 1:
            levers.append(f"fewer --iterations ({iterations} rounds: the noise std grows like sqrt(rounds))")
        lines.append(f"VERDICT: this release is not closer to the private data than its public starting point: "
                     f"C-FID {c_fid:.3f} vs {start:.3f} for the initial public population; the votes did not help "
                     f"at this budget (the public population alone spends no privacy). What would help: "
                     f"{'; '.join(levers)}.")
    else:
        lines.append(f"verdict: the release is closer to the private data than its initial public population: "
                     f"C-FID {c_fid:.3f} vs {start:.3f}.")
    tstr = evaluation.get("tstr") or {}
    if "tstr_dlinear" in tstr and "seasonal_naive" in tstr:
        mine, naive = float(tstr["tstr_dlinear"]["crps"]), float(tstr["seasonal_naive"]["crps"])
        if mine < naive:
            lines.append(f"verdict: DLinear trained on the release beats seasonal naive on held-out real values: "
                         f"CRPS {mine:.4f} vs {naive:.4f}.")
        else:
            lines.append(f"verdict: DLinear trained on the release does not beat seasonal naive on held-out real "
                         f"values (CRPS {mine:.4f} vs {naive:.4f}): for forecasting, seasonal naive is better.")
    return lines


def write_synthetic(path: Path, synthetic: np.ndarray, classes: np.ndarray, config: SynthConfig, freq: str) -> None:
    """Long format (the data's id, time stamp and value columns [+ class column]); time stamps from
    ``config.start`` (declared public) or the public placeholder :data:`~lightning_dpts.synthetic.scale.DEFAULT_START`.
    """
    from lightning_dpts.synthetic.scale import DEFAULT_START

    m, length = synthetic.shape
    stamps = pd.period_range(config.start or DEFAULT_START, periods=length, freq=freq).to_timestamp()
    frame = pd.DataFrame({
        config.id_column: np.repeat([f"synthetic-{i:05d}" for i in range(m)], length),
        config.timestamp_column: np.tile(stamps, m),
        config.value_column: synthetic.reshape(-1),
    })
    if config.class_column is not None and config.classes is not None:
        frame[config.class_column] = np.repeat(np.asarray(config.classes, dtype=object)[classes], length)
    frame.to_csv(path, index=False, compression="gzip")


def distinct_rows(data: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of up to ``count`` rows of ``data`` ``[n, T]`` that are pairwise different, spread out: the first at
    random, each next one the row farthest (Euclidean) from those already chosen. Resampling with replacement
    leaves (near-)copies in a release; a random choice would often show the same window twice."""
    data = np.asarray(data, dtype=np.float64)
    _, first_of_each = np.unique(np.round(data, 9), axis=0, return_index=True)
    candidates = np.sort(first_of_each)
    chosen = [int(rng.choice(candidates))]
    nearest = np.linalg.norm(data[candidates] - data[chosen[0]], axis=1)
    while len(chosen) < min(count, len(candidates)):
        nxt = int(np.argmax(nearest))
        chosen.append(int(candidates[nxt]))
        nearest = np.minimum(nearest, np.linalg.norm(data[candidates] - data[candidates[nxt]], axis=1))
    return np.asarray(chosen, dtype=np.int64)


def plot_real_vs_synthetic(path: Path, real: np.ndarray, synthetic: np.ndarray, initial: np.ndarray,
                           count: int = 4) -> dict[str, np.ndarray]:
    """Plot ``count`` distinct windows of each set (:func:`distinct_rows`) side by side; returns the rows shown.

    ``real`` are private windows: the file belongs under ``private/`` (``--no-private-plots`` skips it).
    """
    from lightning_dpts.outputs import pyplot, save_figure

    plt = pyplot()

    rng = np.random.default_rng()  # which examples are shown is not privacy-relevant
    fig, axes = plt.subplots(count, 3, figsize=(10, 1.8 * count), sharex=True, squeeze=False)
    shown: dict[str, np.ndarray] = {}
    for col, (name, data) in enumerate((("real (private, z-scored)", real), ("PETS synthetic", synthetic),
                                        ("initial public population", initial))):
        rows = distinct_rows(data, count, rng)
        shown[name] = rows
        for ax, r in zip(axes[:, col], rows, strict=False):
            ax.plot(data[r], lw=1, color=f"C{col}")
        axes[0, col].set_title(name, fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("time step in window")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return shown

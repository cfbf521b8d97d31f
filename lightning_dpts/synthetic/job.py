"""``dpts synth``: release a DP synthetic dataset by Private Evolution, score it and report.

:func:`run_synth` runs:

1. load the private data (the bundled ``us_employment`` by default, or a long-format file read exactly as
   ``dpts fit --data`` reads it); hold out the last ``prediction_length`` steps of every series for TSTR;
2. cut the training part into private windows (series-level unit by default: at most m windows per series,
   vote weight 1/m);
3. pretrain (or reuse from the output directory) the VAE and the two encoders on public data only;
4. calibrate sigma for (epsilon, delta) over ``iterations`` rounds and run Algorithms 1-2 with secret noise;
5. write ``synthetic.csv.gz`` (long format), ``report.json`` and ``real_vs_synthetic.png``.

The release is ``synthetic.csv.gz`` (covered by the guarantee). ``report.json``'s evaluation section
(Context-FID, TSTR) and the plot are computed *from the private data* and are not covered by it: they are for the
data owner, not for publication (the report says so in ``evaluation_note``).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.synthetic.privacy import RELATIONS, UNITS

__all__ = ["SynthConfig", "run_synth", "tstr_scores"]

EVALUATION_NOTE = (
    "c_fid, c_fid_initial, tstr, private_windows, private_windows_skipped_missing and real_vs_synthetic.png are "
    "computed from the private data itself (real windows, their count, held-out real values); they are NOT "
    "covered by the (epsilon, delta) guarantee, which covers synthetic.csv.gz only. Keep them with the data owner."
)


@dataclass
class SynthConfig:
    """Everything ``dpts synth`` needs; the defaults are the documented default job.

    Attributes (units in brackets):
        data: long-format CSV/Parquet file, or ``None`` for the bundled ``us_employment`` data.
        id_column, time_column, value_column, freq: as in ``dpts fit``.
        class_column: optional column holding each series' class (conditional generation, Algorithm 1
            with |C| > 1); then ``classes`` must list the classes, which are treated as public.
        classes: the public list of class values (required with ``class_column``).
        length: window length T [time steps].
        num_samples: M, synthetic windows to release (a multiple of the number of classes).
        iterations: rounds of Algorithm 1 (each one noisy histogram).
        epsilon, delta: the privacy budget of the release.
        unit: ``"series"`` (default: one series, at most ``max_windows_per_series`` windows, vote weight 1/m)
            or ``"window"`` (the paper's unit: one window).
        max_windows_per_series: m for ``unit="series"``.
        relation: ``"add_remove"`` (Delta = 1, default) or ``"substitution"`` (Delta = sqrt(2)).
        threshold: H of Algorithm 2 [votes] (default 0: on the bundled data at series level a threshold of one
            noise std lowered diversity and gave a worse C-FID; see docs/synthetic.md).
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
        output_dir: where outputs go; the pretrained weights are cached there and reused.
        progress: show progress bars.
    """

    data: str | None = None
    id_column: str = "id"
    time_column: str = "timestamp"
    value_column: str = "value"
    freq: str | None = None
    class_column: str | None = None
    classes: list[str] | None = None
    length: int = 36
    num_samples: int = 128
    iterations: int = 5
    epsilon: float = 1.0
    delta: float = 1e-5
    unit: str = "series"
    max_windows_per_series: int = 4
    relation: str = "add_remove"
    threshold: float = 0.0
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
        if self.relation not in RELATIONS:
            raise ConfigurationError("relation", self.relation, f"must be one of {', '.join(RELATIONS)}")
        if isinstance(self.threshold, bool) or not (isinstance(self.threshold, (int, float)) and self.threshold >= 0
                                                    and math.isfinite(self.threshold)):
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
        epochs = tuple(self.pretrain_epochs)
        if len(epochs) != 2 or any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in epochs):
            raise ConfigurationError("pretrain_epochs", self.pretrain_epochs, "must be two integers >= 1")
        from lightning_dpts.randomness import resolve_entropy

        resolve_entropy(self.seed)  # validates the seed; the Entropy is drawn again in run_synth


# ---------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------
def _load(config: SynthConfig) -> tuple[list[np.ndarray], list[str], list[int] | None, str, str]:
    """(series values, ids, class index per series or None, freq, data name)."""
    if config.data is None:
        from lightning_dpts.data.sources import load_dataset

        table, freq, name = load_dataset("us_employment"), config.freq or "M", "us_employment (bundled)"
    else:
        from lightning_dpts.fit import load_long_table

        table, freq = load_long_table(config.data, config.id_column, config.time_column, config.value_column,
                                      config.freq)
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


def _test_windows(series: list[np.ndarray], context: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
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

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.fit import FitConfig, _estimator, _quantile_matrix

    length = synthetic.shape[1]
    context = length - horizon
    contexts, targets = _test_windows(series, context, horizon)
    mean = contexts.mean(1, keepdims=True)
    std = np.maximum(contexts.std(1, keepdims=True), 1e-6)

    fit_config = FitConfig(model="dlinear", prediction_length=horizon, context_length=context)
    estimator = _estimator(fit_config, freq)
    module = estimator.create_lightning_module()
    dm = StructuredSubsamplingDataModule([row.astype(np.float32) for row in synthetic], model=module,
                                         batch_size=min(64, len(synthetic)), freq=freq, test_windows=0,
                                         seed=int(np.random.default_rng().integers(2**31)))
    with torch.random.fork_rng(devices=[]):
        trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=progress)
        trainer.fit(module, datamodule=dm)
        predictor = estimator.create_predictor(estimator.create_transformation(), module)
        start = pd.Period("2000-01-01", freq=freq)
        inputs = [{"start": start, "target": ((c - m) / s).astype(np.float32)}
                  for c, m, s in zip(contexts, mean[:, 0], std[:, 0], strict=True)]
        forecasts = list(predictor.predict(inputs))
    q = np.stack([_quantile_matrix(f) for f in forecasts]) * std[:, :, None] + mean[:, :, None]
    crps, mae = _quantile_loss(q, targets)
    scores = {"tstr_dlinear": {"crps": crps, "mae": mae}}

    from gluonts.model.seasonal_naive import SeasonalNaivePredictor

    naive_predictor = SeasonalNaivePredictor(prediction_length=horizon, season_length=int(get_seasonality(freq)))
    naive = list(naive_predictor.predict([{"start": start, "target": c} for c in contexts]))
    crps, mae = _quantile_loss(np.stack([_quantile_matrix(f) for f in naive]), targets)
    scores["seasonal_naive"] = {"crps": crps, "mae": mae}
    return scores


# ---------------------------------------------------------------------------------------------------------
# the job
# ---------------------------------------------------------------------------------------------------------
def run_synth(config: SynthConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``dpts synth`` (see the module docstring); returns the report written to ``report.json``.

    The returned dict additionally holds the in-memory ``_result`` (an
    :class:`~lightning_dpts.synthetic.evolution.EvolutionResult`), which is never written.
    """
    import torch
    from tqdm.auto import tqdm

    from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy
    from lightning_dpts.synthetic.evolution import private_evolution, private_windows
    from lightning_dpts.synthetic.metrics import ContextFID
    from lightning_dpts.synthetic.models import variation_schedule
    from lightning_dpts.synthetic.pretrain import PretrainConfig, pretrain_public_models
    from lightning_dpts.synthetic.privacy import (
        PETSAccountant,
        calibrate_pets_noise,
        sensitivity,
        theorem_2_epsilon,
    )

    config.validate()
    started = time.perf_counter()
    entropy = resolve_entropy(config.seed)
    if entropy.seeded:
        log(f"WARNING: {SEEDED_NOTICE}")
    out = Path(config.output_dir)
    out.mkdir(parents=True, exist_ok=True)

    series, item_ids, classes, freq, data_name = _load(config)
    holdout = config.prediction_length if config.tstr else 0
    train_part = [s[:len(s) - holdout] for s in series]
    private = private_windows(train_part, config.length, unit=config.unit,
                              max_windows=config.max_windows_per_series, classes=classes)
    num_classes = 1 if config.classes is None else len(config.classes)
    log(f"private data: {data_name}, {len(series)} series -> {len(private.windows)} windows of {config.length} "
        f"steps (unit: {config.unit}" + (f", at most {config.max_windows_per_series} per series, weight 1/"
                                          f"{config.max_windows_per_series}" if config.unit == "series" else "")
        + (f"; last {holdout} steps of every series held out for TSTR)" if holdout else ")"))

    public_windows, public_name = None, "rule-based generator (PETS Eq. 2)"
    if config.public_data is not None:
        from lightning_dpts.fit import load_long_table

        table, _ = load_long_table(config.public_data, config.id_column, config.time_column, config.value_column,
                                   config.freq)
        values = [g.to_numpy(dtype=float) for _, g in table.groupby("item_id", sort=False)["target"]]
        pub = private_windows(values, config.length, unit="window")
        public_windows, public_name = pub.windows, f"{config.public_data} (declared public by the user)"
    pre = PretrainConfig(num_public=config.num_public, vae_epochs=config.pretrain_epochs[0],
                         encoder_epochs=config.pretrain_epochs[1])
    models = pretrain_public_models(config.length, out, public_windows=public_windows, public_name=public_name,
                                    config=pre, progress=config.progress, log=log)

    sigma = calibrate_pets_noise(config.epsilon, config.delta, config.iterations)
    delta_l2 = sensitivity(config.relation)
    noise_std = sigma * delta_l2
    threshold = float(config.threshold)
    epsilon = PETSAccountant(sigma).epsilon(config.iterations, config.delta)
    closed_form = theorem_2_epsilon(config.delta, sigma, config.iterations)
    schedule = variation_schedule(config.iterations, config.variation_schedule)
    log(f"noise multiplier {sigma:.4f} (std {noise_std:.4f} votes per bin, sensitivity {delta_l2:.4g}), "
        f"threshold {threshold:.3f}; {config.iterations} rounds give epsilon={epsilon:.4f} at delta={config.delta:g}")

    with tqdm(total=config.iterations, desc="private evolution rounds", disable=not config.progress) as bar:
        result = private_evolution(
            private, num_samples=config.num_samples, num_classes=num_classes, iterations=config.iterations,
            noise_multiplier=sigma, relation=config.relation, threshold=threshold, lookahead=config.lookahead,
            schedule=schedule, vae=models.vae, encoder=models.select_encoder, entropy=entropy,
            secure_noise=config.secure_noise, round_callback=lambda _t: bar.update(1),
        )

    # ---- evaluation (uses private data; not covered by the guarantee) ----
    def cfid(fake: np.ndarray, cls: int | None = None) -> float:
        metric = ContextFID(models.eval_encoder.hparams.output_dim, encoder=models.eval_encoder.embed)
        real = private.windows if cls is None else private.windows[private.classes == cls]
        metric.update(torch.as_tensor(real, dtype=torch.float32), real=True)
        metric.update(torch.as_tensor(fake, dtype=torch.float32), real=False)
        return float(metric.compute())

    from lightning_dpts.synthetic.generator import standardize_windows

    synthetic = standardize_windows(result.synthetic)
    c_fid, c_fid_initial = cfid(synthetic), cfid(result.initial)
    tstr: dict[str, Any] | None = None
    if config.tstr:
        log("TSTR: training DLinear on the synthetic windows, testing on the held-out real values ...")
        tstr = tstr_scores(synthetic, series, freq, config.prediction_length, steps=config.tstr_steps,
                           progress=config.progress)
        tstr["tstr_dlinear_initial"] = tstr_scores(result.initial, series, freq, config.prediction_length,
                                                   steps=config.tstr_steps, progress=False)["tstr_dlinear"]
        if config.compare_dp_sgd:
            tstr["dp_sgd_dlinear"] = _dp_sgd(config, out, log)

    _write_synthetic(out / "synthetic.csv.gz", synthetic, result.classes, config, freq)
    _plot(out / "real_vs_synthetic.png", private.windows, synthetic, result.initial)
    report: dict[str, Any] = {
        "epsilon": epsilon,
        "delta": config.delta,
        "epsilon_budget": config.epsilon,
        "epsilon_theorem_2": closed_form,
        "accounting": "PLD composition (connect-the-dots, pessimistic) of the Gaussian mechanism over "
                      f"{config.iterations} rounds; PETS Theorem 2 closed form in epsilon_theorem_2",
        "noise_multiplier": sigma,
        "noise_std_votes": noise_std,
        "sensitivity": delta_l2,
        "relation": config.relation,
        "unit": config.unit,
        "max_windows_per_series": private.max_windows,
        "threshold": threshold,
        "iterations": config.iterations,
        "variation_schedule": schedule,
        "num_samples": config.num_samples,
        "length": config.length,
        "private_windows": int(len(private.windows)),
        "private_windows_skipped_missing": private.skipped_missing,
        "empty_rounds": [list(e) for e in result.empty_rounds],
        "c_fid": c_fid,
        "c_fid_initial": c_fid_initial,
        "tstr": tstr,
        "evaluation_note": EVALUATION_NOTE,
        "public_models": {"source": models.source, "cache": str(models.cache_file) if models.cache_file else None,
                          "reused": models.reused},
        "data": data_name,
        "config": {k: v for k, v in asdict(config).items() if k != "seed"} | {"seeded": entropy.seeded},
        "seconds": round(time.perf_counter() - started, 1),
    }
    if entropy.seeded:
        report["seeded_notice"] = SEEDED_NOTICE
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    log(f"released {config.num_samples} synthetic windows: epsilon={epsilon:.4f}, delta={config.delta:g}; "
        f"C-FID {c_fid:.3f} (initial public population {c_fid_initial:.3f})")
    if tstr:
        log("TSTR CRPS: " + ", ".join(f"{k} {v['crps']:.4f}" for k, v in tstr.items() if isinstance(v, dict)
                                      and "crps" in v))
    report["_result"] = result
    return report


def _dp_sgd(config: SynthConfig, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """DLinear trained privately with DP-SGD (``dpts fit``) at the same (epsilon, delta), same test windows."""
    from lightning_dpts.fit import FitConfig, run_fit

    log(f"DP-SGD reference: dpts fit with DLinear at epsilon={config.epsilon:g}, delta={config.delta:g} ...")
    fit_config = FitConfig(data=config.data, id_column=config.id_column, time_column=config.time_column,
                           value_column=config.value_column, freq=config.freq,
                           prediction_length=config.prediction_length,
                           context_length=config.length - config.prediction_length, model="dlinear",
                           epsilon=config.epsilon, delta=config.delta, non_dp=False,
                           output_dir=str(out / "dp_sgd"))
    report = run_fit(fit_config, progress=lambda _m: None)
    metrics = dict(report["metrics"]["dp"])
    metrics["privacy_unit"] = f"dpts fit default ({fit_config.level}-level, size {fit_config.size})"
    metrics["epsilon"] = report["epsilon"]
    return metrics


def _write_synthetic(path: Path, synthetic: np.ndarray, classes: np.ndarray, config: SynthConfig, freq: str) -> None:
    """Long format (``id, timestamp, value`` [+ class column]); time stamps are an arbitrary public start."""
    m, length = synthetic.shape
    stamps = pd.period_range("2000-01-01", periods=length, freq=freq).to_timestamp()
    frame = pd.DataFrame({
        config.id_column: np.repeat([f"synthetic-{i:05d}" for i in range(m)], length),
        config.time_column: np.tile(stamps, m),
        config.value_column: synthetic.reshape(-1),
    })
    if config.class_column is not None and config.classes is not None:
        frame[config.class_column] = np.repeat(np.asarray(config.classes, dtype=object)[classes], length)
    frame.to_csv(path, index=False, compression="gzip")


def _plot(path: Path, real: np.ndarray, synthetic: np.ndarray, initial: np.ndarray, count: int = 4) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng()  # which examples are shown is not privacy-relevant
    fig, axes = plt.subplots(count, 3, figsize=(10, 1.8 * count), sharex=True, squeeze=False)
    for col, (name, data) in enumerate((("real (private, z-scored)", real), ("PETS synthetic", synthetic),
                                        ("initial public population", initial))):
        rows = rng.choice(len(data), size=min(count, len(data)), replace=False)
        for ax, r in zip(axes[:, col], rows, strict=False):
            ax.plot(data[r], lw=1, color=f"C{col}")
        axes[0, col].set_title(name, fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("time step in window")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

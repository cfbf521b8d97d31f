"""``dpts synth``: release a DP synthetic dataset by Private Evolution, score it and report.

:func:`run_synth` runs:

1. load the private data (the bundled ``us_employment`` by default, or a long-format file read exactly as
   ``dpts fit --data`` reads it); hold out the last ``prediction_length`` steps of every series for TSTR;
2. cut the training part into private windows (series-level unit by default: at most m windows per series,
   vote weight 1/m);
3. pretrain (or reuse from the output directory) the VAE and the two encoders on public data only;
4. calibrate sigma for (epsilon, delta) over ``iterations`` rounds and run Algorithms 1-2 with secret noise;
5. write the output directory (:mod:`lightning_dpts.outputs`: refused if not empty unless ``overwrite``, locked,
   every file written atomically; nothing is created before every input is validated), split by what the
   (epsilon, delta) guarantee covers. At the top, public: ``synthetic.csv.gz`` (the release), ``report.json``
   (configuration, epsilon, sigma, accounting and the ``"files"`` manifest) and the public pretrained weights
   ``pretrained-<key>.pt`` (public data only; kept by ``overwrite`` for reuse). Under ``private/``, computed from
   the private data without DP and NOT covered: ``evaluation.json`` (Context-FID, TSTR, counts of private
   windows), ``real_vs_synthetic.png`` (real private windows) and ``dp_sgd/`` (the optional DP-SGD comparison,
   which spends a second budget on the same data). ``private_outputs=False`` writes none of them,
   ``private_plots=False`` skips the plot; the terminal shows the evaluation either way.
"""

from __future__ import annotations

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
        output_dir: where outputs go, new or empty unless ``overwrite``; the public pretrained weights are cached
            there and reused by a later run with ``overwrite``.
        progress: show progress bars.
        private_outputs: write the evaluation computed from the private data (``private/``); ``False``
            (``--no-private-outputs``) writes none of it (the terminal still shows it).
        private_plots: write ``private/real_vs_synthetic.png`` (real private windows); ``False``
            (``--no-private-plots``) skips it.
        overwrite: allow a non-empty ``output_dir``: first remove the earlier run's files (those it listed; the
            public pretrained weights are kept for reuse); a directory holding other files is refused.
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
    private_outputs: bool = True
    private_plots: bool = True
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
        for name in ("private_outputs", "private_plots", "overwrite", "tstr", "compare_dp_sgd"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, getattr(self, name), "must be true or false")
        if not isinstance(self.output_dir, str) or not self.output_dir:
            raise ConfigurationError("output_dir", self.output_dir, "must be a non-empty string")
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
    """Run ``dpts synth`` (see the module docstring); returns the public report written to ``report.json``.

    The returned dict additionally holds ``"private"``: the evaluation computed from the private data (what
    ``private/evaluation.json`` holds; returned even with ``private_outputs=False``: the caller owns the data) and
    the in-memory ``_result`` (an :class:`~lightning_dpts.synthetic.evolution.EvolutionResult`), never written.
    """
    import torch
    from tqdm.auto import tqdm

    from lightning_dpts.outputs import PRIVATE_DIR, OutputDirectory, atomic_path, check_output_dir, write_json
    from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy
    from lightning_dpts.synthetic.evolution import private_evolution, private_windows
    from lightning_dpts.synthetic.metrics import ContextFID
    from lightning_dpts.synthetic.models import variation_schedule
    from lightning_dpts.synthetic.pretrain import PretrainConfig, check_public_windows, pretrain_public_models
    from lightning_dpts.synthetic.privacy import (
        PETSAccountant,
        calibrate_pets_noise,
        sensitivity,
        theorem_2_epsilon,
    )

    config.validate()
    check_output_dir(config.output_dir, config.overwrite)  # a file, a non-empty or a locked directory: refused
    started = time.perf_counter()
    entropy = resolve_entropy(config.seed)
    if entropy.seeded:
        log(f"WARNING: {SEEDED_NOTICE}")
    out = Path(config.output_dir)

    # ---- every input is validated before anything is created (item 8 of issue 24) ----
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
        check_public_windows(public_windows, config.length)
    pre = PretrainConfig(num_public=config.num_public, vae_epochs=config.pretrain_epochs[0],
                         encoder_epochs=config.pretrain_epochs[1])
    pre.validate()
    sigma = calibrate_pets_noise(config.epsilon, config.delta, config.iterations)
    delta_l2 = sensitivity(config.relation)
    noise_std = sigma * delta_l2
    threshold = float(config.threshold)
    epsilon = PETSAccountant(sigma).epsilon(config.iterations, config.delta)
    closed_form = theorem_2_epsilon(config.delta, sigma, config.iterations)
    schedule = variation_schedule(config.iterations, config.variation_schedule)
    if config.tstr:  # the held-out real test windows exist (checked again, with the same data, by tstr_scores)
        _test_windows(series, config.length - config.prediction_length, config.prediction_length)
        if config.compare_dp_sgd:
            _dp_sgd_config(config, out).validate()

    with OutputDirectory(out, config.overwrite, keep=KEEP_ON_OVERWRITE) as run_dir:
        def register_cache(path: Path) -> None:
            run_dir.register(path.name, KEEP_ON_OVERWRITE["pretrained-*.pt"])

        models = pretrain_public_models(config.length, out, public_windows=public_windows, public_name=public_name,
                                        config=pre, progress=config.progress, log=log, before_write=register_cache)
        if models.cache_file is not None:
            register_cache(models.cache_file)
        log(f"noise multiplier {sigma:.4f} (std {noise_std:.4f} votes per bin, sensitivity {delta_l2:.4g}), "
            f"threshold {threshold:.3f}; {config.iterations} rounds give epsilon={epsilon:.4f} at "
            f"delta={config.delta:g}")

        with tqdm(total=config.iterations, desc="private evolution rounds", disable=not config.progress) as bar:
            result = private_evolution(
                private, num_samples=config.num_samples, num_classes=num_classes, iterations=config.iterations,
                noise_multiplier=sigma, relation=config.relation, threshold=threshold, lookahead=config.lookahead,
                schedule=schedule, vae=models.vae, encoder=models.select_encoder, entropy=entropy,
                secure_noise=config.secure_noise, round_callback=lambda _t: bar.update(1),
            )

        from lightning_dpts.synthetic.generator import standardize_windows

        synthetic = standardize_windows(result.synthetic)
        run_dir.register("synthetic.csv.gz", "public: the DP synthetic dataset (the release the guarantee covers)")
        with atomic_path(out / "synthetic.csv.gz") as tmp:
            _write_synthetic(tmp, synthetic, result.classes, config, freq)

        # ---- evaluation (uses private data; not covered by the guarantee) ----
        def cfid(fake: np.ndarray, cls: int | None = None) -> float:
            metric = ContextFID(models.eval_encoder.hparams.output_dim, encoder=models.eval_encoder.embed)
            real = private.windows if cls is None else private.windows[private.classes == cls]
            metric.update(torch.as_tensor(real, dtype=torch.float32), real=True)
            metric.update(torch.as_tensor(fake, dtype=torch.float32), real=False)
            return float(metric.compute())

        c_fid, c_fid_initial = cfid(synthetic), cfid(result.initial)
        tstr: dict[str, Any] | None = None
        if config.tstr:
            log("TSTR: training DLinear on the synthetic windows, testing on the held-out real values ...")
            tstr = tstr_scores(synthetic, series, freq, config.prediction_length, steps=config.tstr_steps,
                               progress=config.progress)
            tstr["tstr_dlinear_initial"] = tstr_scores(result.initial, series, freq, config.prediction_length,
                                                       steps=config.tstr_steps, progress=False)["tstr_dlinear"]
            if config.compare_dp_sgd:
                dp_dir = None
                if config.private_outputs:
                    dp_dir = run_dir.register(f"{PRIVATE_DIR}/dp_sgd/", "private: the DP-SGD comparison run (a "
                                              "second private training on the same data, its own budget)")
                tstr["dp_sgd_dlinear"] = _dp_sgd(config, dp_dir, log)

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
            "empty_rounds": [list(e) for e in result.empty_rounds],
            "public_models": {"source": models.source, "cache": None if models.cache_file is None else
                              models.cache_file.name, "reused": models.reused},
            "data": data_name,
            "config": {k: v for k, v in asdict(config).items() if k != "seed"} | {"seeded": entropy.seeded},
        }
        if entropy.seeded:
            report["seeded_notice"] = SEEDED_NOTICE
        evaluation: dict[str, Any] = {
            "evaluation_note": EVALUATION_NOTE,
            "private_windows": int(len(private.windows)),
            "private_windows_skipped_missing": private.skipped_missing,
            "c_fid": c_fid,
            "c_fid_initial": c_fid_initial,
            "tstr": tstr,
            "seconds": round(time.perf_counter() - started, 1),
        }
        if config.private_outputs:
            run_dir.register(f"{PRIVATE_DIR}/evaluation.json", "private: Context-FID against the real windows, "
                             "TSTR on held-out real values, counts of private windows (not covered)")
            write_json(out / PRIVATE_DIR / "evaluation.json", evaluation)
            if config.private_plots:
                run_dir.register(f"{PRIVATE_DIR}/real_vs_synthetic.png", "private: real private windows next to "
                                 "synthetic ones (not covered)")
                _plot(out / PRIVATE_DIR / "real_vs_synthetic.png", private.windows, synthetic, result.initial)
        run_dir.register("report.json", "public: configuration, (epsilon, delta), sigma, accounting and this "
                         "manifest")
        report["files"] = run_dir.manifest()
        write_json(out / "report.json", report)
    log(f"released {config.num_samples} synthetic windows: epsilon={epsilon:.4f}, delta={config.delta:g}; "
        f"C-FID {c_fid:.3f} (initial public population {c_fid_initial:.3f}) [private: computed from the real data]")
    if tstr:
        log("TSTR CRPS: " + ", ".join(f"{k} {v['crps']:.4f}" for k, v in tstr.items() if isinstance(v, dict)
                                      and "crps" in v) + " [private]")
    return {**report, "private": evaluation, "_result": result}


def _dp_sgd(config: SynthConfig, out: Path | None, log: Callable[[str], None]) -> dict[str, Any]:
    """DLinear trained privately with DP-SGD (``dpts fit``) at the same (epsilon, delta), same test windows.

    Its run directory is ``out`` (under ``private/``: a second private training on the same data); ``None``
    (``private_outputs=False``) writes it to a temporary directory that is removed afterwards.
    """
    import tempfile

    from lightning_dpts.fit import run_fit

    if out is None:
        with tempfile.TemporaryDirectory(prefix="dpts-dp-sgd-") as scratch:
            return _dp_sgd(config, Path(scratch) / "run", log)

    log(f"DP-SGD reference: dpts fit with DLinear at epsilon={config.epsilon:g}, delta={config.delta:g} ...")
    fit_config = _dp_sgd_config(config, out)
    report = run_fit(fit_config, progress=lambda _m: None)
    metrics = dict(report["private"]["metrics"]["dp"])
    metrics["privacy_unit"] = f"dpts fit default ({fit_config.level}-level, size {fit_config.size})"
    metrics["epsilon"] = report["epsilon"]
    return metrics


def _dp_sgd_config(config: SynthConfig, out: Path) -> Any:
    """The :class:`~lightning_dpts.fit.FitConfig` of the DP-SGD comparison (DLinear, same budget and horizon)."""
    from lightning_dpts.fit import FitConfig

    return FitConfig(data=config.data, id_column=config.id_column, time_column=config.time_column,
                     value_column=config.value_column, freq=config.freq, prediction_length=config.prediction_length,
                     context_length=config.length - config.prediction_length, model="dlinear",
                     epsilon=config.epsilon, delta=config.delta, non_dp=False, output_dir=str(out))


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
    from lightning_dpts.plots import _pyplot, save_figure

    plt = _pyplot()

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
    save_figure(fig, path, dpi=110)

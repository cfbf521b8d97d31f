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

import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dpts.config import FitConfig
from lightning_dpts.synthetic.pipeline import (
    EVALUATION_NOTE,
    KEEP_ON_OVERWRITE,
    SynthConfig,
    holdout_windows,
    load_series,
    plot_real_vs_synthetic,
    tstr_scores,
    write_synthetic,
)

__all__ = ["SynthConfig", "run_synth"]


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
    series, item_ids, classes, freq, data_name = load_series(config)
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
        from lightning_dpts.loading import load_long_table

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
        holdout_windows(series, config.length - config.prediction_length, config.prediction_length)
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
            write_synthetic(tmp, synthetic, result.classes, config, freq)

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
                plot_real_vs_synthetic(out / PRIVATE_DIR / "real_vs_synthetic.png", private.windows, synthetic,
                                       result.initial)
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

    from lightning_dpts.jobs.fit import run_fit

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
    """The :class:`~lightning_dpts.config.FitConfig` of the DP-SGD comparison (DLinear, same budget and horizon)."""
    return FitConfig(data=config.data, id_column=config.id_column, time_column=config.time_column,
                     value_column=config.value_column, freq=config.freq, prediction_length=config.prediction_length,
                     context_length=config.length - config.prediction_length, model="dlinear",
                     epsilon=config.epsilon, delta=config.delta, non_dp=False, output_dir=str(out))

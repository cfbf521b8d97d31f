"""``dpts synth``: release a DP synthetic dataset by Private Evolution, score it and report.

:func:`run_synth` runs:

1. load the private data (the bundled ``us_employment`` by default, or a long-format file read exactly as
   ``dpts fit --data`` reads it); hold out the last ``prediction_length`` steps of every series for TSTR;
2. cut the training part into private windows (series-level unit by default: at most m windows per series,
   vote weight 1/m);
3. pretrain (or reuse from the output directory) the VAE and the two encoders on public data only;
4. calibrate sigma for (epsilon, delta) over ``iterations`` rounds (plus the scale round with ``value_range``) and
   run Algorithms 1-2 with secret noise; with ``value_range``, release a DP level and spread and write the
   release in the data's units (:mod:`lightning_dpts.synthetic.scale`), else standardised, saying why;
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

from lightning_dpts.app.config import FitConfig
from lightning_dpts.app.synth_pipeline import (
    EVALUATION_NOTE,
    KEEP_ON_OVERWRITE,
    SynthConfig,
    holdout_windows,
    load_series,
    plot_real_vs_synthetic,
    synth_verdict,
    tstr_scores,
    write_synthetic,
)
from lightning_dpts.errors import ConfigurationError

__all__ = ["SynthConfig", "run_synth"]


def run_synth(config: SynthConfig, log: Callable[[str], None] = print, *,
              compare: Callable[[FitConfig], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Run ``dpts synth`` (see the module docstring); returns the public report written to ``report.json``.

    ``compare``: with ``compare_dp_sgd`` (and ``tstr``), the job that trains the DP-SGD reference from its
    :class:`~lightning_dpts.app.config.FitConfig` and returns its report, e.g.
    ``lambda c: lightning_dpts.app.jobs.fit.run_fit(c, progress=lambda _m: None)`` (what ``dpts synth --compare-dp-sgd``
    passes; no job imports another).

    The returned dict additionally holds ``"private"``: the evaluation computed from the private data (what
    ``private/evaluation.json`` holds; returned even with ``private_outputs=False``: the caller owns the data) and
    the in-memory ``_result`` (an :class:`~lightning_dpts.synthetic.evolution.EvolutionResult`), never written.
    """
    from lightning_dpts.outputs import OutputDirectory, atomic_path, check_output_dir
    from lightning_dpts.randomness import SEEDED_NOTICE, resolve_entropy
    from lightning_dpts.synthetic.generator import standardize_windows

    config.validate()
    if config.tstr and config.compare_dp_sgd and compare is None:
        raise ConfigurationError(
            "compare_dp_sgd", True, "needs run_synth(..., compare=...): the dpts fit job that trains the DP-SGD "
            "reference, e.g. compare=lambda c: lightning_dpts.app.jobs.fit.run_fit(c, progress=lambda _m: None)")
    check_output_dir(config.output_dir, config.overwrite)  # a file, a non-empty or a locked directory: refused
    started = time.perf_counter()
    entropy = resolve_entropy(config.seed)
    if entropy.seeded:
        log(f"WARNING: {SEEDED_NOTICE}")
    out = Path(config.output_dir)
    # every input is validated before anything is created (item 8 of issue 24)
    data = _private_data(config, log)
    public = _public_windows(config)
    plan = _plan(config, data, out)

    with OutputDirectory(out, config.overwrite, keep=KEEP_ON_OVERWRITE) as run_dir:
        models = _pretrain(config, plan["pretrain"], public, out, run_dir, log)
        scale_round = " + 1 scale round" if config.value_range is not None else ""
        log(f"noise multiplier {plan['sigma']:.4f} (std {plan['noise_std']:.4f} votes per bin, sensitivity "
            f"{plan['sensitivity']:.4g}), threshold {plan['threshold']:.3f}; {config.iterations} round(s)"
            f"{scale_round} give epsilon={plan['epsilon']:.4f} at delta={config.delta:g}")
        result = _evolve(config, data, plan, models, entropy)
        synthetic = standardize_windows(result.synthetic)  # the scale PE, C-FID and TSTR work in
        scale = _scale(config, data, plan, entropy)
        for line in _scale_lines(config, scale):
            log(line)
        released = synthetic if scale is None else scale.apply(synthetic)
        run_dir.register("synthetic.csv.gz", "public: the DP synthetic dataset (the release the guarantee covers)")
        with atomic_path(out / "synthetic.csv.gz") as tmp:
            write_synthetic(tmp, released, result.classes, config, data["freq"])
        evaluation = _evaluate(config, data, models, result, synthetic, run_dir, log,  # private data: not covered
                               compare)
        evaluation["verdict"] = synth_verdict(
            evaluation, epsilon=plan["epsilon"], noise_std=plan["noise_std"],
            votes=float(data["private"].weights.sum()), unit=config.unit, iterations=config.iterations)
        evaluation["seconds"] = round(time.perf_counter() - started, 1)
        report = _report(config, data, plan, models, result, entropy)
        report |= _scale_report(config, scale)
        _write(config, report, evaluation, data, result, synthetic, run_dir, out)
    c_fid, c_fid_initial, tstr = evaluation["c_fid"], evaluation["c_fid_initial"], evaluation["tstr"]
    log(f"released {config.num_samples} synthetic windows: epsilon={plan['epsilon']:.4f}, delta={config.delta:g}; "
        f"C-FID {c_fid:.3f} (initial public population {c_fid_initial:.3f}) [private: computed from the real data]")
    if tstr:
        log("TSTR CRPS: " + ", ".join(f"{k} {v['crps']:.4f}" for k, v in tstr.items() if isinstance(v, dict)
                                      and "crps" in v) + " [private]")
    for line in evaluation["verdict"]:
        log(line + " [private]")
    return {**report, "private": evaluation, "_result": result}


# ---------------------------------------------------------------------------------------------------------
# the steps
# ---------------------------------------------------------------------------------------------------------
def _private_data(config: SynthConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """The private series, their windows (TSTR's held-out steps cut off first), frequency and name."""
    from lightning_dpts.synthetic.evolution import private_windows

    series, item_ids, classes, freq, data_name = load_series(config)
    holdout = config.prediction_length if config.tstr else 0
    train_part = [s[:len(s) - holdout] for s in series]
    private = private_windows(train_part, config.length, unit=config.unit,
                              max_windows=config.max_windows_per_series, classes=classes)
    log(f"private data: {data_name}, {len(series)} series -> {len(private.windows)} windows of {config.length} "
        f"steps (unit: {config.unit}" + (f", at most {config.max_windows_per_series} per series, weight 1/"
                                          f"{config.max_windows_per_series}" if config.unit == "series" else "")
        + (f"; last {holdout} steps of every series held out for TSTR)" if holdout else ")"))
    from lightning_dpts.app.console import warn_delta_above_one_over_n

    if config.unit == "series":
        warn_delta_above_one_over_n(config.delta, len(series), "series")
    else:
        warn_delta_above_one_over_n(config.delta, len(private.windows), "windows, the unit of --unit window")
    return {"series": series, "freq": freq, "name": data_name, "private": private}


def _public_windows(config: SynthConfig) -> tuple[np.ndarray | None, str]:
    """(windows of the file declared public, or ``None`` for the rule-based generator; the source's name)."""
    if config.public_data is None:
        return None, "rule-based generator (PETS Eq. 2)"
    from lightning_dpts.data.loading import load_long_table
    from lightning_dpts.synthetic.evolution import private_windows
    from lightning_dpts.synthetic.pretrain import check_public_windows

    table, _ = load_long_table(config.public_data, config.id_column, config.timestamp_column, config.value_column,
                               config.freq)
    values = [g.to_numpy(dtype=float) for _, g in table.groupby("item_id", sort=False)["target"]]
    windows = private_windows(values, config.length, unit="window").windows
    check_public_windows(windows, config.length)
    return windows, f"{config.public_data} (declared public by the user)"


def _plan(config: SynthConfig, data: dict[str, Any], out: Path) -> dict[str, Any]:
    """The noise (calibrated for the budget), its accounting and the variation schedule; checks TSTR's inputs."""
    from lightning_dpts.synthetic.models import variation_schedule
    from lightning_dpts.synthetic.pretrain import PretrainConfig
    from lightning_dpts.synthetic.privacy import (
        PETSAccountant,
        calibrate_pets_noise,
        sensitivity,
        theorem_2_epsilon,
    )

    pre = PretrainConfig(num_public=config.num_public, vae_epochs=config.pretrain_epochs[0],
                         encoder_epochs=config.pretrain_epochs[1])
    pre.validate()
    sigma = calibrate_pets_noise(config.epsilon, config.delta, config.rounds)  # + the scale round, if any
    delta_l2 = sensitivity(config.resolved_relation)
    plan = {
        "pretrain": pre, "sigma": sigma, "sensitivity": delta_l2, "noise_std": sigma * delta_l2,
        "threshold": config.resolved_threshold(sigma * delta_l2), "relation": config.resolved_relation,
        "epsilon": PETSAccountant(sigma).epsilon(config.rounds, config.delta),
        "closed_form": theorem_2_epsilon(config.delta, sigma, config.rounds),
        "schedule": variation_schedule(config.iterations, config.variation_schedule),
    }
    if config.tstr:  # the held-out real test windows exist (checked again, with the same data, by tstr_scores)
        holdout_windows(data["series"], config.length - config.prediction_length, config.prediction_length)
        if config.compare_dp_sgd:
            _dp_sgd_config(config, out).validate()
    return plan


def _pretrain(config: SynthConfig, pre: Any, public: tuple[np.ndarray | None, str], out: Path, run_dir: Any,
              log: Callable[[str], None]) -> Any:
    """The VAE and encoders pretrained on public data only (or reused from ``out``'s cache, kept by overwrite)."""
    from lightning_dpts.synthetic.pretrain import pretrain_public_models

    def register_cache(path: Path) -> None:
        run_dir.register(path.name, KEEP_ON_OVERWRITE["pretrained-*.pt"])

    models = pretrain_public_models(config.length, out, public_windows=public[0], public_name=public[1],
                                    config=pre, progress=config.progress, log=log, before_write=register_cache)
    if models.cache_file is not None:
        register_cache(models.cache_file)
    return models


def _evolve(config: SynthConfig, data: dict[str, Any], plan: dict[str, Any], models: Any, entropy: Any) -> Any:
    """Algorithms 1-2 of PETS with secret noise: the only step that touches the private windows."""
    from tqdm.auto import tqdm

    from lightning_dpts.synthetic.evolution import private_evolution

    num_classes = 1 if config.classes is None else len(config.classes)
    with tqdm(total=config.iterations, desc="private evolution rounds", disable=not config.progress) as bar:
        return private_evolution(
            data["private"], num_samples=config.num_samples, num_classes=num_classes, iterations=config.iterations,
            noise_multiplier=plan["sigma"], relation=plan["relation"], threshold=plan["threshold"],
            lookahead=config.lookahead, schedule=plan["schedule"], vae=models.vae, encoder=models.select_encoder,
            entropy=entropy, secure_noise=config.secure_noise, round_callback=lambda _t: bar.update(1),
        )


def _scale(config: SynthConfig, data: dict[str, Any], plan: dict[str, Any], entropy: Any) -> Any:
    """The DP level and spread (the scale round, :mod:`lightning_dpts.synthetic.scale`), or ``None`` without
    ``value_range`` (the release stays standardised)."""
    if config.value_range is None:
        return None
    from lightning_dpts.randomness import GaussianNoise
    from lightning_dpts.synthetic.scale import _STREAM_SCALE, dp_scale

    private = data["private"]
    noise = GaussianNoise(entropy, secure=config.secure_noise, stream=(_STREAM_SCALE,))
    try:
        return dp_scale(private.raw_means, private.raw_stds, private.weights, config.value_range, noise=noise,
                        noise_multiplier=plan["sigma"], relation=plan["relation"])
    finally:
        noise.close()


def _scale_lines(config: SynthConfig, scale: Any) -> list[str]:
    """What the terminal says about the release's scale and time stamps."""
    from lightning_dpts.synthetic.scale import DEFAULT_START, STANDARDISED_WHY

    if scale is None:
        lines = [f"NOTE: {STANDARDISED_WHY}."]
    else:
        lines = [f"values in the data's units: DP level {scale.level:.6g} and spread {scale.spread:.6g} within the "
                 f"declared public range [{scale.value_range[0]:g}, {scale.value_range[1]:g}] (scale round, "
                 "accounted in epsilon)"]
    if config.start is None:
        lines.append(f"NOTE: time stamps start at the placeholder {DEFAULT_START}: the data's own dates are private; "
                     "pass --start DATE to give a public one.")
    return lines


def _scale_report(config: SynthConfig, scale: Any) -> dict[str, Any]:
    """report.json's ``scale`` and ``time_stamps`` (public: DP or declared-public values only)."""
    from lightning_dpts.synthetic.scale import DEFAULT_START, STANDARDISED_WHY

    if scale is None:
        scale_entry: dict[str, Any] = {"values": "standardised", "why": STANDARDISED_WHY}
    else:
        scale_entry = {"values": "data units: standardised windows * spread + level",
                       "level": scale.level, "spread": scale.spread, "value_range": list(scale.value_range),
                       "released_by": "the scale round: Gaussian mechanism on clipped window means and stds, noise "
                                      "multiplier as the vote rounds, accounted in epsilon"}
    stamps = ({"start": config.start, "source": "--start, declared public"} if config.start is not None else
              {"start": DEFAULT_START, "source": "placeholder: the data's own dates are private, never written"})
    return {"scale": scale_entry, "time_stamps": stamps}


def _evaluate(config: SynthConfig, data: dict[str, Any], models: Any, result: Any, synthetic: np.ndarray,
              run_dir: Any, log: Callable[[str], None],
              compare: Callable[[FitConfig], dict[str, Any]] | None) -> dict[str, Any]:
    """Context-FID against the real windows and TSTR on held-out real values (private: not covered)."""
    import torch

    from lightning_dpts.outputs import PRIVATE_DIR
    from lightning_dpts.synthetic.metrics import ContextFID

    private, series, freq = data["private"], data["series"], data["freq"]

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
            assert compare is not None  # run_synth refuses compare_dp_sgd without it
            tstr["dp_sgd_dlinear"] = _dp_sgd(config, dp_dir, log, compare)
    return {
        "evaluation_note": EVALUATION_NOTE,
        "private_windows": int(len(private.windows)),
        "private_windows_skipped_missing": private.skipped_missing,
        "c_fid": c_fid,
        "c_fid_initial": c_fid_initial,
        "tstr": tstr,
    }


def _report(config: SynthConfig, data: dict[str, Any], plan: dict[str, Any], models: Any, result: Any,
            entropy: Any) -> dict[str, Any]:
    """``report.json`` without its manifest: the release's accounting and configuration (public)."""
    from lightning_dpts.randomness import SEEDED_NOTICE
    from lightning_dpts.synthetic.privacy import PROTECTS

    report: dict[str, Any] = {
        "epsilon": plan["epsilon"],
        "delta": config.delta,
        "epsilon_budget": config.epsilon,
        "epsilon_theorem_2": plan["closed_form"],
        "accounting": "PLD composition (connect-the-dots, pessimistic) of the Gaussian mechanism over "
                      f"{config.rounds} rounds ({config.iterations} vote round(s)"
                      + (" + the scale round" if config.value_range is not None else "")
                      + "); PETS Theorem 2 closed form in epsilon_theorem_2",
        "rounds": config.rounds,
        "noise_multiplier": plan["sigma"],
        "noise_std_votes": plan["noise_std"],
        "sensitivity": plan["sensitivity"],
        "relation": plan["relation"],
        "unit": config.unit,
        "protects": PROTECTS[config.unit],
        "max_windows_per_series": data["private"].max_windows,
        "threshold": plan["threshold"],
        "threshold_rule": "one noise std (default)" if config.threshold is None else "given (votes)",
        "iterations": config.iterations,
        "variation_schedule": plan["schedule"],
        "num_samples": config.num_samples,
        "length": config.length,
        "empty_rounds": [list(e) for e in result.empty_rounds],
        "public_models": {"source": models.source, "cache": None if models.cache_file is None else
                          models.cache_file.name, "reused": models.reused},
        "data": data["name"],
        "config": {k: v for k, v in asdict(config).items() if k != "seed"} | {"seeded": entropy.seeded},
    }
    if entropy.seeded:
        report["seeded_notice"] = SEEDED_NOTICE
    return report


def _write(config: SynthConfig, report: dict[str, Any], evaluation: dict[str, Any], data: dict[str, Any],
           result: Any, synthetic: np.ndarray, run_dir: Any, out: Path) -> None:
    """The private files (``private_outputs``) and last ``report.json`` with the manifest (``report`` gains it)."""
    from lightning_dpts.outputs import PRIVATE_DIR, write_json

    if config.private_outputs:
        run_dir.register(f"{PRIVATE_DIR}/evaluation.json", "private: Context-FID against the real windows, "
                         "TSTR on held-out real values, counts of private windows (not covered)")
        write_json(out / PRIVATE_DIR / "evaluation.json", evaluation)
        if config.private_plots:
            run_dir.register(f"{PRIVATE_DIR}/real_vs_synthetic.png", "private: real private windows next to "
                             "synthetic ones (not covered)")
            plot_real_vs_synthetic(out / PRIVATE_DIR / "real_vs_synthetic.png", data["private"].windows, synthetic,
                                   result.initial)
    run_dir.register("report.json", "public: configuration, (epsilon, delta), sigma, accounting and this manifest")
    report["files"] = run_dir.manifest()
    write_json(out / "report.json", report)


def _dp_sgd(config: SynthConfig, out: Path | None, log: Callable[[str], None],
            compare: Callable[[FitConfig], dict[str, Any]]) -> dict[str, Any]:
    """DLinear trained privately with DP-SGD (``dpts fit``) at the same (epsilon, delta), same test windows.

    Its run directory is ``out`` (under ``private/``: a second private training on the same data); ``None``
    (``private_outputs=False``) writes it to a temporary directory that is removed afterwards.
    """
    import tempfile

    if out is None:
        with tempfile.TemporaryDirectory(prefix="dpts-dp-sgd-") as scratch:
            return _dp_sgd(config, Path(scratch) / "run", log, compare)

    log(f"DP-SGD reference: dpts fit with DLinear at epsilon={config.epsilon:g}, delta={config.delta:g} ...")
    fit_config = _dp_sgd_config(config, out)
    report = compare(fit_config)
    metrics = dict(report["private"]["metrics"]["dp"])
    metrics["privacy_unit"] = f"dpts fit default ({fit_config.level}-level, size {fit_config.size})"
    metrics["epsilon"] = report["epsilon"]
    return metrics


def _dp_sgd_config(config: SynthConfig, out: Path) -> Any:
    """The :class:`~lightning_dpts.app.config.FitConfig` of the DP-SGD comparison (DLinear, same budget and horizon)."""
    return FitConfig(data=config.data, id_column=config.id_column, timestamp_column=config.timestamp_column,
                     value_column=config.value_column, freq=config.freq, prediction_length=config.prediction_length,
                     context_length=config.length - config.prediction_length, model="dlinear",
                     epsilon=config.epsilon, delta=config.delta, non_dp=False, output_dir=str(out))

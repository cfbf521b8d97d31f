"""The run directory's reports of ``dpts fit``, split by what the (epsilon, delta) guarantee covers.

``report.json`` (public: configuration, epsilon, delta, sigma, C, sampling spec, ledger, recipe, the epsilon curve
and the ``"files"`` manifest), ``epsilon.png`` (from the accountant, no data); under ``private/``:
``evaluation.json`` (metrics, baselines, verdict, levers; NOT covered) and ``forecasts.png``. The DP releases of
evaluation numbers (:func:`clipping_report`, :func:`dp_metrics`) spend part of the budget. :func:`format_table` is
the terminal's summary.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dpts.app.config import FitConfig
from lightning_dpts.errors import ConfigurationError
from lightning_dpts.evaluation import quantile_matrix
from lightning_dpts.outputs import PRIVATE_DIR

__all__ = ["EVALUATION_FILE", "PRIVATE_NOTICE", "PRIVATE_TABLE_NOTE", "PUBLIC_NOTICE", "clipping_report",
           "config_dict", "curve_by_step", "dp_metrics", "epsilon_curve", "format_table", "levers", "private_report",
           "public_report", "risk_report", "spec_dict", "write_run_files"]

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
#: The first line of :func:`format_table`: what is printed is read by whoever sees the terminal or the log it goes to.
PRIVATE_TABLE_NOTE = ("private (computed from the data without noise, NOT covered; keep with the data owner): "
                      "the table and the verdict lines below")
#: Largest relative step between consecutive values of the public epsilon curve (report.json ``epsilon_curve``,
#: epsilon.png): the AccountantCallback's per-step table (same rtol), else computed after training from the
#: accountant alone (the demo's curve: about 0.5 s).
EPSILON_CURVE_RTOL = 0.01


def public_report(config: FitConfig, *, privacy: Any, accountant: Any, strategy: Any, spec: Any, sigma: float,
                  steps: int, test_windows: int, windows_note: str, entropy: Any, data_name: str, recipe: Any,
                  chosen: list[str], dropped_by_length: int, clipped_count: int | None, relation: Any,
                  predictions: dict[str, Any], labels: list[np.ndarray],
                  inputs: list[dict[str, Any]], seasons: tuple[int, ...] = ()) -> dict[str, Any]:
    """``report.json`` without its ``"files"`` manifest: what the guarantee covers and public metadata.

    ``privacy`` is the accountant's final read-out; the DP releases (clipped count, ``dp_metrics``) draw from
    ``entropy``'s streams 6 and (6, 1). ``seasons``: the season lengths used (primary first; from the frequency or
    ``--season-length``: public metadata).
    """
    from lightning_dpts.randomness import SEEDED_NOTICE

    report: dict[str, Any] = {
        "epsilon": privacy.epsilon + config.reserved_epsilon,
        "delta": privacy.delta,
        "epsilon_budget": config.epsilon,
        "epsilon_training": privacy.epsilon,
        "steps": steps,
        "compositions": privacy.compositions,
        "composition_unit": privacy.unit,
        "bound": {"theorem": privacy.theorem, "kind": privacy.kind},
        "noise_multiplier": sigma,
        "max_grad_norm": config.max_grad_norm,
        "epsilon_curve": epsilon_curve(accountant, spec, steps, privacy),
        "risk": risk_report(accountant, steps, privacy, config),
        "test_windows": test_windows,
        "test_windows_choice": windows_note,
        "dp_hyperparameters": accountant.hyperparameters,
        "privacy_configuration": {
            "sampling_spec": spec_dict(spec),
            "noise_multiplier": sigma,
            "calibrated": config.noise_multiplier is None,
        },
        "seeded": entropy.seeded,
        "secure_mode": config.secure_mode,
        "privacy_ledger": strategy.ledger.to_dict(),
        "data": data_name,
        "model": config.model,
        "config": config_dict(config),
        "recipe": None if recipe is None else {**recipe.to_dict(), "chosen_by_recipe": chosen},
        "series_left_out_by_length": dropped_by_length,
        "seasons": {"season_lengths": list(seasons), "source": "given (--season-length)"
                    if config.season_length is not None else "from the frequency (lightning_dpts.data.seasonality)"},
        "evaluation_protocol": config.evaluation,
        "covered_by_the_guarantee": PUBLIC_NOTICE,
    }
    if accountant.monte_carlo_report is not None:  # --bands: the Monte Carlo accountant's read-out
        report["monte_carlo"] = accountant.monte_carlo_report
    if entropy.seeded:
        report["seeded_notice"] = SEEDED_NOTICE
    if config.clipping:
        report["clipping"] = clipping_report(config, clipped_count, relation, entropy)
    if config.dp_metrics_epsilon is not None:
        per_series = max(Counter(str(entry.get("item_id")) for entry in inputs).values())
        report["dp_metrics"] = dp_metrics(config.dp_metrics_epsilon, predictions, labels, per_series, entropy)
    return report


#: What report.json's ``"risk"`` says it means (issue 43).
RISK_MEANING = (
    "for the unit of privacy (the relation's w time steps of one series): tpr_at_fpr is the largest true-positive rate "
    "of any membership test that wrongly accuses at most that fraction (false-positive rate); mu_gdp is the mu of the "
    "Gaussian mechanism (mu-GDP) whose (epsilon, delta) statements hold for this run for every delta >= "
    "mu_gdp_delta. Upper bounds, from the same privacy-loss distribution as epsilon (lightning_dpts.privacy.risk)"
)


def risk_report(accountant: Any, steps: int, privacy: Any, config: FitConfig) -> dict[str, Any]:
    """report.json's ``"risk"``: TPR at FPR 1e-3/1e-2 and the mu-GDP equivalent of the whole run, training composed
    with the pure-DP releases of the report (clipped-value count, DP metrics) as randomized response."""
    acc = getattr(accountant, "accountant", None)
    if acc is None or accountant.monte_carlo is not None:
        return {"tpr_at_fpr": None, "mu_gdp": None,
                "note": "not available for the Monte Carlo accountant (it has no privacy-loss distribution)"}
    pure = [e for e in (config.count_epsilon, config.dp_metrics_epsilon or 0.0) if e > 0]
    readout = privacy.risk if (privacy.risk is not None and not pure) else acc.risk(steps, privacy.delta,
                                                                                    pure_epsilons=pure)
    covers = "training" + (f" and the pure-DP releases (epsilon {', '.join(format(e, 'g') for e in pure)})"
                           if pure else "")
    return {**readout.to_dict(), "covers": covers, "meaning": RISK_MEANING}


def private_report(config: FitConfig, report: dict[str, Any], *, metrics: dict[str, Any], spec: Any, steps: int,
                   test_windows: int, forecasts: int, season: int, started: float,
                   baselines: Any = None, metrics_all_windows: dict[str, Any] | None = None) -> dict[str, Any]:
    """``private/evaluation.json``: metrics of every model, baselines, levers and the verdict (NOT covered).

    ``started`` is the run's ``time.perf_counter()`` at its start (the run's seconds are private: they depend on
    the data). ``baselines``: the :class:`~lightning_dpts.baselines.Baselines` record (skip reason, fallbacks,
    subset). ``metrics_all_windows``: when the statsforecast baselines ran on a subsample of the windows (``metrics``
    then scores every model on that subsample), the other models' metrics over every window.
    """
    from lightning_dpts.baselines import best_baseline
    from lightning_dpts.evaluation import verdict

    seasons = (report.get("seasons") or {}).get("season_lengths") or [season]
    private: dict[str, Any] = {
        "notice": PRIVATE_NOTICE,
        "evaluation": {
            "protocol": config.evaluation,
            "test_windows": test_windows,
            "forecasts": forecasts,
            "series": spec.num_series,
            "metrics": evaluation_note(config.evaluation),
            "season_length": season,
            "season_lengths": seasons,
        },
        "metrics": metrics,
        **({"metrics_all_windows": metrics_all_windows} if metrics_all_windows is not None else {}),
        "baselines": baselines_note(baselines, forecasts),
        "seconds": round(time.perf_counter() - started, 1),
    }
    best = {metric: best_baseline(metrics, metric) for metric in ("crps", "mase")}
    private["best_baseline"] = {metric: None if b is None else {"model": b[0], "value": b[1]}
                                for metric, b in best.items()}
    private["verdict"] = verdict({**report, **private})
    if private["verdict"][0].startswith("VERDICT") and "model, not the budget" not in private["verdict"][0]:
        # the budget may be the limit: the levers carry sigma at a larger epsilon
        private["levers"] = levers(spec, config.epsilon, config.reserved_epsilon, config.delta, steps)
        private["verdict"] = verdict({**report, **private})
    return private


def evaluation_note(protocol: str) -> str:
    """What the evaluation's metrics are, for ``private/evaluation.json``."""
    where = ("every rolling test window and series" if protocol == "rolling" else
             "the last window of every series (its last H points)")
    return (f"pooled over {where}: crps = mean weighted quantile loss over the quantiles 0.1-0.9 (GluonTS "
            "mean_wQuantileLoss, the paper's CRPS), mase = mean over forecasts of MAE / the history's mean absolute "
            "seasonal difference at the primary season (M4), mae of the median, coverage = share of true values "
            "inside the 10-90% interval; crps_per_window = the CRPS per window, earliest first. Baselines: "
            "seasonal_naive (with Gaussian intervals from the history's seasonal differences), autoets, autotheta "
            "(statsforecast); non_dp = the same model trained without DP")


def baselines_note(baselines: Any, forecasts: int | None = None) -> dict[str, Any]:
    """The baselines' record for the evaluation: which ran, which were skipped and why, fallbacks per model, and
    the subsample of ``forecasts`` windows the statsforecast baselines were fitted to (``windows``: ``None`` = all)."""
    from lightning_dpts.baselines import BASELINES, SUBSAMPLE_SEED

    if baselines is None:
        return {"run": ["seasonal_naive"], "skipped": None, "fallbacks": {}, "windows": None}
    subset = getattr(baselines, "subset", None)
    windows = None if subset is None else {
        "fitted": len(subset), "of": forecasts,
        "rule": f"AutoETS and AutoTheta fitted to a subsample of the windows drawn uniformly without replacement "
                f"(numpy default_rng({SUBSAMPLE_SEED}), a function of the window count only; --baseline-windows); "
                "'metrics' scores every model on those windows, 'metrics_all_windows' the others on all"}
    return {"run": [name for name in BASELINES if name in baselines.forecasts], "skipped": baselines.skipped,
            "fallbacks": dict(baselines.fallbacks), "windows": windows}


def write_run_files(run_dir: Any, out: Path, config: FitConfig, report: dict[str, Any], private: dict[str, Any], *,
                    steps: int, table: Any, inputs: list[dict[str, Any]], labels: list[np.ndarray],
                    predictions: dict[str, Any]) -> None:
    """Write ``epsilon.png``, the private files (``private_outputs``) and last ``report.json`` with the manifest of
    every file ``run_dir`` registered (``report`` gains its ``"files"``)."""
    from lightning_dpts.app.plots import plot_epsilon, plot_forecasts
    from lightning_dpts.outputs import write_json

    privacy = report["bound"]
    run_dir.register("epsilon.png", "public: epsilon against optimizer step, from the accountant (no data)")
    plot_epsilon(out / "epsilon.png", *curve_by_step(report["epsilon_curve"], steps), budget=config.epsilon,
                 delta=report["delta"], theorem=privacy["theorem"], kind=privacy["kind"],
                 spent=report["epsilon_training"])
    if config.private_outputs:
        run_dir.register(f"{PRIVATE_DIR}/{EVALUATION_FILE}", "private: metrics of every model on the held-out "
                         "private windows, baselines, verdict and levers (noise-free functions of the data)")
        write_json(out / PRIVATE_DIR / EVALUATION_FILE, private)
        if config.private_plots:
            from lightning_dpts.app.plots import PRIVATE_PLOT_NOTICE

            run_dir.register(f"{PRIVATE_DIR}/forecasts.png", f"private: {PRIVATE_PLOT_NOTICE}")
            titled = "title" in getattr(table, "columns", ())  # a long table with titles (not a store)
            names = dict(zip(table["item_id"], table["title"], strict=True)) if titled else None
            plot_forecasts(out / PRIVATE_DIR / "forecasts.png", inputs, labels, predictions, names=names)
    run_dir.register("report.json", "public: configuration, (epsilon, delta), sigma, C, sampling spec, ledger, "
                     "recipe and this manifest")
    report["files"] = run_dir.manifest()
    write_json(out / "report.json", report)


def epsilon_curve(accountant: Any, spec: Any, steps: int, final: Any, rtol: float = EPSILON_CURVE_RTOL
                  ) -> dict[str, list[Any]]:
    """Epsilon after every step, as upper bounds within ``rtol`` of each other, from the accountant alone.

    Public: it depends only on the configuration (sampling spec, sigma, delta) and the number of steps, never on
    the data or on timings. ``{"steps": [s_1, ..., s_K = steps], "epsilon": [...]}``: epsilon after any step
    s <= s_k is at most ``epsilon[k]``; consecutive values differ by at most ``rtol`` (relative) unless one step
    apart (:meth:`~lightning_dpts.privacy.StructuredSubsamplingAccountant.epsilon_curve`, the table the
    AccountantCallback logs from, reused when it has it: :meth:`AccountantCallback.epsilon_table`), and the last
    is the run's own epsilon. A Monte Carlo (``--bands``) run has one
    whole-run bound, valid for every prefix.
    """
    acc = getattr(accountant, "accountant", None)
    if steps <= 0:
        return {"steps": [], "epsilon": []}
    if acc is None or accountant.monte_carlo is not None:
        return {"steps": [steps], "epsilon": [float(final.epsilon)]}
    last, total = acc.compositions(steps), float(final.epsilon)
    by_step: dict[int, float] = {}
    table = getattr(accountant, "epsilon_table", None)
    points = table(last, final.delta, rtol) if table is not None else None  # the training's table, if it has it
    for count, value in points if points is not None else acc.epsilon_curve(last, final.delta, rtol=rtol):
        step = min(steps, spec.max_steps_for_compositions(count))
        # epsilon is nondecreasing in the count, so the run's own epsilon bounds every earlier step too
        by_step[step] = total if step == steps else min(float(value), total)
    by_step[steps] = total
    ordered = sorted(by_step)
    return {"steps": ordered, "epsilon": [by_step[s] for s in ordered]}


def curve_by_step(curve: dict[str, list[Any]], steps: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps 1..n, epsilon bound after each) from :func:`epsilon_curve`'s grid (each step takes the next point)."""
    grid = np.asarray(curve["steps"], dtype=int)
    if steps <= 0 or not len(grid):
        return np.zeros(0, dtype=int), np.zeros(0)
    every = np.arange(1, steps + 1)
    index = np.minimum(np.searchsorted(grid, every, side="left"), len(grid) - 1)
    return every, np.asarray(curve["epsilon"], dtype=float)[index]


def config_dict(config: FitConfig) -> dict[str, Any]:
    """The configuration for the report, without the seed (never written: it would reproduce the randomness)."""
    d = asdict(config)
    d["seed"] = "explicit (not recorded)" if config.seed is not None else None
    return d


def spec_dict(spec: Any) -> dict[str, Any]:
    d = asdict(spec)
    d.update(top_level_rate=spec.top_level_rate, bottom_level_rate=spec.bottom_level_rate,
             windows_per_unit=spec.windows_per_unit, steps_per_epoch=spec.steps_per_epoch)
    return d


def clipping_report(config: FitConfig, clipped: int | None, relation: Any, entropy: Any) -> dict[str, Any]:
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


def dp_metrics(epsilon: float, predictions: dict[str, Any], labels: list[np.ndarray], per_series: int,
                entropy: Any) -> dict[str, Any]:
    """The public, DP release of the evaluation: a Laplace-noised count of the test windows on which the private
    model's quantile loss is below seasonal naive's (:func:`lightning_dpts.evaluation.window_wins`).

    Every protected unit lies in one series, and with the private model fixed (its release is accounted by the
    training epsilon; adaptive basic composition) only that series' ``per_series`` test windows can change, so
    the count's sensitivity is ``per_series``. The noise is stream (6, 1) of the run's entropy (the clipped count
    uses (6,)). The total number of windows is public (series lengths); the share is post-processing.
    """
    from lightning_dpts.evaluation import noisy_count, window_wins

    wins = window_wins([quantile_matrix(f) for f in predictions["dp"]],
                       [quantile_matrix(f) for f in predictions["seasonal_naive"]], labels)
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


def levers(spec: Any, epsilon: float, count_epsilon: float, delta: float, steps: int) -> dict[str, Any]:
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

    Its first line, :data:`PRIVATE_TABLE_NOTE`, says that the table and the verdict are private (they are
    ``private/evaluation.json``'s numbers); the privacy, membership and ``DP-released (public)`` lines are public.

    ``report`` is what :func:`run_fit` returns: the public report with the private evaluation under ``"private"``
    (a flat dict with ``metrics`` at the top, as before the split, is read too).
    """
    report = {**report, **(report.get("private") or {})}
    bands = (report.get("config") or {}).get("bands")
    private = "private model (DP-SGD)" if bands is None else f"private model (BandMF b={bands})"
    names = {"dp": private, "non_dp": "same model, no DP", "seasonal_naive": "seasonal naive (intervals)",
             "autoets": "AutoETS", "autotheta": "AutoTheta"}
    lines = [PRIVATE_TABLE_NOTE,
             f"{'model':28} {'CRPS (mean wQL)':>16} {'CRPS per window':>20} {'MAE':>12} {'MASE':>8} "
             f"{'10-90% cov.':>11}"]
    for key, values in report["metrics"].items():
        per = values.get("crps_per_window", [])
        spread = f"{min(per):.4f}..{max(per):.4f}" if len(per) > 1 else ""
        mase = values.get("mase", float("nan"))
        coverage = values.get("coverage", float("nan"))
        lines.append(f"{names.get(key, key):28} {values['crps']:>16.4f} {spread:>20} {values['mae']:>12.3f} "
                     f"{mase:>8.3f} {coverage:>11.2f}")
    evaluation = report.get("evaluation")
    if evaluation:
        seasons = evaluation.get("season_lengths") or [evaluation.get("season_length")]
        how = (f"{evaluation['test_windows']} rolling test windows" if evaluation.get("protocol", "rolling")
               == "rolling" else "the last window (the last H steps)")
        lines.append(f"scored on {how} x {evaluation['series']} series ({evaluation['forecasts']} forecasts, never "
                     f"used for training); season {', '.join(str(m) for m in seasons)} (MASE scales by "
                     f"{seasons[0]})")
        sub = (report.get("baselines") or {}).get("windows")
        if sub:
            every = report.get("metrics_all_windows") or {}
            parts = [f"{names.get(k, k)} CRPS {v['crps']:.4f} MASE {v.get('mase', float('nan')):.3f}"
                     for k, v in every.items()]
            lines.append(f"AutoETS and AutoTheta were fitted to a fixed subsample of {sub['fitted']} of the "
                         f"{sub['of']} forecasts (--baseline-windows; 0 fits all): the rows above score every model on "
                         f"those; over all {sub['of']}: " + "; ".join(parts))
    bound = report["bound"]
    lines.append(f"privacy spent: epsilon={report['epsilon']:.4f} (budget {report['epsilon_budget']:g}), "
                 f"delta={report['delta']:g} after {report['steps']} steps; "
                 f"{bound['theorem']} ({bound['kind']} bound), "
                 f"noise multiplier {report['noise_multiplier']:.4f}")
    risk = report.get("risk") or {}
    if risk.get("tpr_at_fpr"):
        tprs = ", ".join(f"{t:.3g} at FPR {a}" for a, t in risk["tpr_at_fpr"].items())
        mu = "" if risk.get("mu_gdp") is None else f"; {risk['mu_gdp']:.3g}-GDP"
        lines.append(f"membership-attack TPR for the unit of privacy: {tprs}{mu} (upper bounds)")
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

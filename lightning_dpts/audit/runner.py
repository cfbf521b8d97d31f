"""``run_audit``: one DP training run with canaries, scored and turned into empirical epsilon lower bounds.

What it does, in order (every check that can refuse the audit runs first, before any training and before
anything is written):

1. takes the base series (the bundled ``us_employment`` by default, or the ``data`` given), each divided by its
   mean absolute value, and by default cuts them into pieces of ``prediction_length`` steps
   (:func:`~lightning_dpts.audit.canaries.chunk_series`): each window then covers a whole piece, so the accountant
   credits no subsampling (r = rho = 1 with every piece in every batch), and a correct mechanism is exactly
   the Gaussian mechanism the accountant composes. Other geometries (``chunk_length=None`` keeps whole series,
   ``batch_size`` below the number of series) audit subsampled training, for which one run proves much less;
2. places ``canaries`` canaries of the relation's unit, each included with probability 1/2 by the auditor's
   coins (:mod:`~lightning_dpts.audit.canaries`);
3. calibrates sigma for (``epsilon``, ``delta``) in ``steps`` steps with the accountant, and trains the module
   (default :class:`~lightning_dpts.audit.models.AuditForecaster`) on the data with the included canaries through
   :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` and
   :class:`~lightning_dpts.training.DPForecastStrategy`, whose ``audit_observer`` seam hands each step's noisy
   gradient to the white-box scorer (:mod:`~lightning_dpts.audit.scores`);
4. scores the canaries white-box (every noisy update) and black-box (the final model), and turns the scores and
   coins into lower bounds with their confidence (:mod:`lightning_dpts.audit.estimators`: one-run, Steinke et
   al. 2023; one-run f-DP, Mahloujifar et al. 2025), next to the accountant's epsilon for the same configuration.

Outputs (``output_dir``): ``report.json`` (public: the configuration, sigma, steps and the accountant's epsilon,
functions of the configuration only) and, under ``private/``, ``audit.json`` (the bounds), ``audit.png`` (the
bounds against the accountant's epsilon) and ``scores.csv`` (score and coin of every canary): the scores use the
training windows' values without noise, so they and everything computed from them are private to the data's
owner by docs/privacy.md, rule 9, even though with the bundled (public) data nothing in them is secret.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.spec import NeighbouringRelation

__all__ = ["CHECK_OPTIONS", "PRIMARY", "PRIMARY_GAUSSIAN", "AuditResult", "options_from_fit_config", "plot_audit",
           "relation_from", "run_audit", "write_audit"]

#: The bound the verdict reads, chosen from the configuration before any run (the maximum over several bounds would
#: hold only at a lower confidence): where nothing is sampled (one window per series, every series in every batch:
#: the audit's default geometry) the white-box scores are sums of Gaussian likelihood ratios and
#: :data:`PRIMARY_GAUSSIAN` (Agrawal et al. 2026) is used; anywhere else :data:`PRIMARY` (Mahloujifar et al.'s
#: assumption-free f-DP analysis).
PRIMARY = "white_box_fdp"
PRIMARY_GAUSSIAN = "white_box_gauss"
#: Defaults of the full audit and of ``quick=True`` (canaries, steps).
DEFAULT_SIZE = (32768, 5)
QUICK_SIZE = (1024, 5)
#: the CI regression check, ``dpts audit --check`` (docs/audit.md): about 1-2 CPU-seconds a run; it fails when the
#: primary bound exceeds the accountant's epsilon (false alarms and power measured by benchmarks/audit.py)
CHECK_OPTIONS: dict[str, Any] = {"canaries": 512, "steps": 5, "black_box": False}
_ENTROPY_INIT, _ENTROPY_DATA, _ENTROPY_NOISE, _ENTROPY_PLACES = 102, 103, 104, 105


@dataclass
class AuditResult:
    """What an audit found.

    Attributes:
        accountant_epsilon: the accountant's epsilon for the configuration trained (at ``delta``, after ``steps``).
        delta: the delta of every number here.
        noise_multiplier: sigma the training was calibrated with (the accountant's; ``noise_scale`` says what the
            run actually used).
        steps: noisy optimizer steps taken.
        canaries: m, and ``included``: the auditor's coins.
        bounds: name -> estimator result (``AuditBound.as_dict()``): ``"{kind}_one_run"``, ``"{kind}_fdp"``,
            ``"{kind}_gauss"`` and ``"{kind}_order"`` (order statistics) for kind ``white_box`` and ``black_box``.
        white_box_scores, black_box_scores: per canary (private: computed from the training data).
        config: the audit's settings (public).
        seconds: wall-clock time of the whole audit.
    """

    accountant_epsilon: float
    delta: float
    noise_multiplier: float
    steps: int
    canaries: int
    included: np.ndarray
    bounds: dict[str, dict[str, Any]]
    white_box_scores: np.ndarray
    black_box_scores: np.ndarray | None
    config: dict[str, Any]
    seconds: float = 0.0
    noise_scale: float = 1.0
    notes: list[str] = field(default_factory=list)
    primary: str = PRIMARY
    runs: int = 1

    @property
    def white_box_epsilon(self) -> float:
        """The primary bound (:attr:`primary`, fixed by the configuration before the run): the one number the
        verdict compares with the accountant's epsilon at the stated confidence. Each other bound holds at its own
        confidence too, but their maximum only at 1 - (sum of the failure probabilities) (docs/audit.md)."""
        return float(self.bounds[self.primary]["epsilon"])

    def public_dict(self) -> dict[str, Any]:
        """The configuration, sigma, steps and the accountant's epsilon: functions of the configuration only."""
        return {"audit": "lightning_dpts.audit", "accountant_epsilon": self.accountant_epsilon, "delta": self.delta,
                "noise_multiplier": self.noise_multiplier, "steps": self.steps, "canaries": self.canaries,
                "config": self.config}

    def as_dict(self) -> dict[str, Any]:
        """Everything but the per-canary scores (private: the bounds are computed from the training data)."""
        return {**self.public_dict(), "bounds": self.bounds, "primary": self.primary, "runs": self.runs,
                "included": int(self.included.sum()),
                "noise_scale": self.noise_scale, "seconds": round(self.seconds, 1), "notes": self.notes}

    def table(self) -> str:
        """A terminal table: each lower bound with its confidence next to the accountant's epsilon."""
        runs = f"{self.runs} run{'s' if self.runs > 1 else ''}"
        lines = [f"empirical privacy audit: {self.canaries} canaries ({int(self.included.sum())} included), "
                 f"{runs} of {self.steps} steps, sigma={self.noise_multiplier:.4g}, delta={self.delta:g}",
                 f"{'':24s}{'epsilon':>10s}{'confidence':>12s}{'guesses':>9s}{'correct':>9s}",
                 f"{'accountant (upper)':24s}{self.accountant_epsilon:>10.3f}{'':>12s}"]
        for name, b in self.bounds.items():
            guesses = b.get("guesses")
            correct = b.get("correct")
            lines.append(f"{name.replace('_', ' ') + ' (lower)':24s}{float(b['epsilon']):>10.3f}"
                         f"{float(b['confidence']):>12.2f}{'' if guesses is None else guesses:>9}"
                         f"{'' if correct is None else correct:>9}")
        primary = self.white_box_epsilon
        confidence = float(self.bounds[self.primary]["confidence"])
        name = self.primary.replace('_', ' ')
        lines.append(f"VERDICT: the primary bound ({name}) {primary:.3f} EXCEEDS the "
                     f"accountant's epsilon {self.accountant_epsilon:.3f} (confidence {confidence:.2f}): the training "
                     "leaks more than it reports" if primary > self.accountant_epsilon else
                     f"verdict: the primary bound ({name}) is at or below the accountant's "
                     "epsilon (consistent; this does not show the accountant is tight)")
        return "\n".join(lines)


def _positive_int(name: str, value: Any, low: int = 1, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low or (
            high is not None and value > high):
        rng = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise ConfigurationError(name, value, f"must be {rng}")
    return int(value)


def _is_finite_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(
        value)


def _positive_float(name: str, value: Any, high: float | None = None) -> float:
    if not _is_finite_number(value) or value <= 0 or (high is not None and value > high):
        raise ConfigurationError(name, value, "must be a number > 0" + ("" if high is None else f" and <= {high}"))
    return float(value)


def _base_series(data: Any, scale: bool = True) -> list[np.ndarray]:
    """Every series of ``data`` as float arrays ``[L]`` (univariate), divided by its mean absolute value if
    ``scale``."""
    from lightning_dpts.data.sources import to_collection

    collection = to_collection(data)
    out = []
    for t in collection.targets:
        arr = np.asarray(t, dtype=np.float64)
        arr = arr[:, 0] if arr.ndim == 2 and arr.shape[1] == 1 else arr
        size = np.nanmean(np.abs(arr)) if scale else 1.0
        out.append(arr / (size if np.isfinite(size) and size > 0 else 1.0))
    return out


class _ScaledNoise:
    """Test seam (``_noise_scale``): the strategy's noise source with every std multiplied by ``scale``."""

    def __init__(self, inner: Any, scale: float) -> None:
        self.inner, self.scale = inner, scale

    def sample(self, numel: int, std: float, dtype: Any = None) -> Any:
        return self.inner.sample(numel, std * self.scale, dtype)


def relation_from(level: str | None, size: int | None, value_bound: float | None,
                  base: NeighbouringRelation | None = None) -> NeighbouringRelation:
    """``base`` (default: one event) with the given fields replaced; validated by
    :class:`~lightning_dpts.privacy.NeighbouringRelation` (a :class:`ConfigurationError` naming the field)."""
    base = NeighbouringRelation() if base is None else base
    return NeighbouringRelation(level=base.level if level is None else level,  # type: ignore[arg-type]
                                size=base.size if size is None else size,
                                value_bound=base.value_bound if value_bound is None else value_bound)


def options_from_fit_config(config: Any) -> dict[str, Any]:
    """The :func:`run_audit` arguments a ``dpts fit`` configuration (:class:`~lightning_dpts.app.config.FitConfig`)
    decides: ``epsilon``, ``delta``, the ``relation`` (level, size, value bound), ``max_grad_norm`` (when set),
    ``seed`` and the ``data`` (its file, or the bundled data). The audit keeps its own model and window geometry
    (docs/audit.md: what an audit of a configuration measures)."""
    config.validate()
    from lightning_dpts.data.loading import load_fit_table

    options: dict[str, Any] = {
        "epsilon": float(config.epsilon), "delta": float(config.delta),
        "relation": NeighbouringRelation(level=config.level, size=config.size, value_bound=config.value_bound),
        "seed": config.seed,
    }
    if config.value_bound is not None:  # the bound is in the data's units: audit the data unscaled
        options["scale_series"] = False
    if config.max_grad_norm is not None:
        options["max_grad_norm"] = float(config.max_grad_norm)
    if config.data is not None:
        table, _freq, _name = load_fit_table(config)
        options["data"] = table
    return options


def run_audit(
    *,
    epsilon: float = 8.0,
    delta: float = 1e-5,
    canaries: int | None = None,
    steps: int | None = None,
    quick: bool = False,
    data: Any = "us_employment",
    context_length: int = 4,
    prediction_length: int | None = None,
    chunk_length: int | None | str = "auto",
    batch_size: int | None = None,
    relation: NeighbouringRelation | None = None,
    magnitude: float | None = None,
    max_grad_norm: float = 1.0,
    scale_series: bool = True,
    module: Callable[[int, int, int], Any] | None = None,
    strategy_options: dict[str, Any] | None = None,
    windows_per_canary: int | None = 4,
    black_box: bool = True,
    confidence: float = 0.999,
    seed: int | None = None,
    output_dir: str | Path | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = print,
    runs: int = 1,
    canary_shape: str = "shift",
    canary_offset: int | None = None,
    canary_level: float | None = None,
    _noise_scale: float = 1.0,
    _pooled: bool = False,
) -> AuditResult:
    """Audit DP-SGD training empirically: train once with canaries, return lower bounds on epsilon.

    See the module docstring for the steps and docs/audit.md for what the numbers prove.

    Args:
        epsilon: the accountant's target epsilon (sigma is calibrated for it), in (0, 100].
        delta: delta in (0, 0.1] for the accountant and the estimators.
        canaries: m >= 2, the number of canaries (default 32768; 1024 with ``quick``); with ``runs`` > 1, m >= 1
            per run (one canary a run: no interference, for models whose canaries' gradients coincide).
        steps: noisy optimizer steps >= 1 (default 5, also with ``quick``).
        quick: the smaller default size (for a first look; proves less).
        data: the base series: the bundled dataset's name, a long-format DataFrame, a list of arrays (see
            :mod:`lightning_dpts.data.sources`). Each series is divided by its mean absolute value.
        context_length: P, the past window the model reads, in steps.
        prediction_length: L_F, in steps (default: the relation's w, so that a canary fits in one piece).
        chunk_length: ``"auto"`` (default): pieces of ``prediction_length`` steps (T = 1); an integer: pieces of that
            many steps; ``None``: whole series.
        batch_size: Lambda (one window per series); default: every series in every batch (rho = 1).
        relation: the neighbouring relation whose unit a canary is (default one event); its ``value_bound``
            caps ``magnitude`` (in the units ``scale_series`` says).
        magnitude: the difference between a canary's two worlds per step (default: the value bound, else 100).
        max_grad_norm: C > 0.
        scale_series: divide each base series by its mean absolute value (default); the value bound and
            ``magnitude`` are then in those units. ``False`` keeps the data's units (what ``--config`` does when its
            relation has a value bound, which is in the data's units).
        module: ``factory(num_series, past_length, prediction_length) -> LightningModule`` training on the
            datamodule's dict batches (default :class:`~lightning_dpts.audit.models.AuditForecaster`).
        strategy_options: extra keyword arguments of :class:`~lightning_dpts.training.DPForecastStrategy` (with the
            default module, ``per_window="isolated"`` unless given: its per-window gradients are computed in chunks,
            so memory stays bounded at tens of thousands of canaries).
        windows_per_canary: windows scored per canary (drawn by the auditor among those that contain it); ``None``:
            all.
        black_box: also score the final model (one pass of ``training_step`` per canary window and world).
        confidence: confidence level of the lower bounds, in (0, 1). The default 0.999 keeps false alarms rare: the
            primary (Gaussian) bound is tight, so a correct run with an exact accountant exceeds its epsilon with
            probability up to 1 - confidence.
        seed: ``None``: the auditor's coins and the training's sampling and noise come from fresh entropy (the
            training's stay secret, docs/privacy.md rule 7). An integer makes the whole audit reproducible (the
            training then is a seeded run, for experiments only, as with ``dpts fit --seed``).
        output_dir: where to write (``None``: nothing is written); refused if not empty unless ``overwrite``.
        progress: where progress lines go (``None``: silent).
        runs: independent trainings, each with ``canaries`` fresh coins; their canaries are pooled into one game
            (:func:`~lightning_dpts.audit.estimators.pool_runs`), so R runs prove what one run with R times the
            canaries would. The result's ``steps`` are per run; ``included`` and the scores are concatenated.
        canary_shape: the event each canary is inside its w steps (:data:`~lightning_dpts.audit.canaries.SHAPES`:
            ``"shift"``, ``"spike"``, ``"zigzag"``).
        canary_offset: each canary's position in its piece (default random); 0 puts it where every window of a
            piece of ``context_length + prediction_length`` steps contains it (no window sampling to hide it).
        canary_level: the value of the series at each canary's changed steps before the canary is added (default:
            the series' own values), so the two worlds hold ``canary_level +- magnitude / 2`` there. A public choice
            per model: ``magnitude = 2 * canary_level`` makes the excluded world 0, where a scaled model's loss
            changes most between the worlds (DLinear's, docs/audit.md "Auditing your model").
        _noise_scale: **test seam, not an option**: multiplies the std of the noise the training actually adds,
            while sigma and the accountant's epsilon stay those of the configuration (the sharpness tests use 1/4).

    Raises:
        ConfigurationError: an argument out of range (named, with the range), before any work.
    """
    started = time.perf_counter()
    say = progress or (lambda _line: None)
    epsilon = _positive_float("epsilon", epsilon, 100.0)
    delta = _positive_float("delta", delta, 0.1)
    default_m, default_steps = QUICK_SIZE if quick else DEFAULT_SIZE
    runs = _positive_int("runs", runs, 1, 1000)
    m = _positive_int("canaries", default_m if canaries is None else canaries, 1 if runs > 1 or _pooled else 2,
                      1_000_000)
    steps = _positive_int("steps", default_steps if steps is None else steps, 1, 1_000_000)
    context_length = _positive_int("context_length", context_length)
    relation = NeighbouringRelation() if relation is None else relation
    if not isinstance(relation, NeighbouringRelation):
        raise ConfigurationError("relation", relation, "must be a NeighbouringRelation")
    prediction_length = _positive_int("prediction_length", relation.size if prediction_length is None
                                      else prediction_length)
    max_grad_norm = _positive_float("max_grad_norm", max_grad_norm)
    if not (isinstance(confidence, float) and 0.0 < confidence < 1.0):
        raise ConfigurationError("confidence", confidence, "must be a float in (0, 1)")
    if windows_per_canary is not None:
        windows_per_canary = _positive_int("windows_per_canary", windows_per_canary)
    if chunk_length == "auto":
        chunk_length = prediction_length
    elif chunk_length is not None:
        chunk_length = _positive_int("chunk_length", chunk_length, prediction_length)
    if magnitude is None:
        magnitude = relation.value_bound if relation.value_bound is not None else 100.0
    magnitude = _positive_float("magnitude", magnitude)
    if relation.value_bound is not None and magnitude > relation.value_bound:
        raise ConfigurationError("magnitude", magnitude,
                                 f"must be <= the relation's value_bound={relation.value_bound}")
    if seed is not None:
        _positive_int("seed", seed, 0)
    if _noise_scale != 1.0:
        _positive_float("_noise_scale", _noise_scale)
    from lightning_dpts.audit.canaries import SHAPES

    if canary_shape not in SHAPES:
        raise ConfigurationError("canary_shape", canary_shape, f"must be one of {', '.join(SHAPES)}")
    if canary_offset is not None:
        _positive_int("canary_offset", canary_offset, 0)
    if canary_level is not None and not _is_finite_number(canary_level):
        raise ConfigurationError("canary_level", canary_level, "must be a finite number or None")
    if output_dir is not None:
        from lightning_dpts.outputs import check_output_dir

        check_output_dir(output_dir, overwrite)
    if runs > 1:
        return _pooled_runs(runs, started, output_dir, overwrite, progress, dict(
            epsilon=epsilon, delta=delta, canaries=m, steps=steps, data=data, context_length=context_length,
            prediction_length=prediction_length, chunk_length=chunk_length, batch_size=batch_size,
            relation=relation, magnitude=magnitude, max_grad_norm=max_grad_norm, scale_series=scale_series,
            module=module, strategy_options=strategy_options, windows_per_canary=windows_per_canary,
            black_box=black_box, confidence=confidence, seed=seed, canary_shape=canary_shape,
            canary_offset=canary_offset, canary_level=canary_level, _noise_scale=_noise_scale))

    from lightning_dpts.randomness import numpy_generator, resolve_entropy

    entropy = resolve_entropy(seed)
    if entropy.seeded:
        from lightning_dpts.randomness import SEEDED_NOTICE

        warnings.warn(f"dpts audit: {SEEDED_NOTICE}", UserWarning, stacklevel=2)
        say(f"WARNING: {SEEDED_NOTICE}")
    base = _base_series(data, scale_series)
    if chunk_length is not None:
        base = [s for s in base if len(s) >= chunk_length]
        from lightning_dpts.audit.canaries import chunk_series

        base = chunk_series(base, chunk_length, max_chunks=m)  # one canary per piece: no more pieces than that
    lengths = [len(s) for s in base]
    if min(lengths) < prediction_length:
        raise ConfigurationError("prediction_length", prediction_length,
                                 f"must be <= the shortest series ({min(lengths)} steps)")
    num_series = len(base)
    if batch_size is None:
        batch_size = num_series
    batch_size = _positive_int("batch_size", batch_size, 1, num_series)
    from lightning_dpts.audit.canaries import plan_canaries

    plan = plan_canaries(lengths, count=m, relation=relation, past_length=context_length,
                         prediction_length=prediction_length, magnitude=magnitude,
                         rng=numpy_generator(entropy, _ENTROPY_PLACES), shape=canary_shape, offset=canary_offset)
    coins = plan.included
    if canary_level is not None:  # the base value under every canary's changed steps (public: the auditor's choice)
        for c in plan.canaries:
            base[c.series][c.position: c.position + c.length][c.profile() != 0] = float(canary_level)

    import lightning as L
    import torch

    from lightning_dpts.audit.models import AuditForecaster
    from lightning_dpts.audit.scores import WhiteBoxScorer, black_box_scores, canary_windows
    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.privacy.accountant import StructuredSubsamplingAccountant, calibrate_noise_multiplier
    from lightning_dpts.training import DPForecastStrategy

    def datamodule(values: list[np.ndarray], seeded: int | None) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*explicit seed")
            return StructuredSubsamplingDataModule(
                [v.astype(np.float32) for v in values], context_length=context_length,
                prediction_length=prediction_length, batch_size=batch_size, relation=relation, test_windows=0,
                freq="M", seed=seeded)

    train_seed = None if seed is None else int(entropy.seed_sequence(_ENTROPY_DATA).generate_state(1)[0])
    noise_seed = None if seed is None else int(entropy.seed_sequence(_ENTROPY_NOISE).generate_state(1)[0])
    dm = datamodule(plan.world(base, "train"), train_seed)
    world_in, world_out = datamodule(plan.world(base, "in"), None), datamodule(plan.world(base, "out"), None)
    spec = dm.sampling_spec
    say(f"audit: {num_series} series of {min(lengths)}-{max(lengths)} steps, {m} canaries of "
        f"{relation.level}-level size {relation.size} (magnitude {magnitude:g}), Lambda={batch_size}, {steps} steps")
    sigma = calibrate_noise_multiplier(spec, epsilon, delta, steps=steps)
    accountant_epsilon = float(StructuredSubsamplingAccountant(spec, sigma).epsilon(steps, delta))
    say(f"audit: sigma={sigma:.4g} gives epsilon={accountant_epsilon:.4g} at delta={delta:g} (the accountant)")

    torch.manual_seed(int(entropy.seed_sequence(_ENTROPY_INIT).generate_state(1)[0]))
    factory = module or (lambda n, p, h: AuditForecaster(n, p, h))
    model = factory(num_series, dm.past_length, prediction_length)
    import copy

    initial = copy.deepcopy(model) if black_box else None  # the black-box score's reference (module docstring)
    options = dict(strategy_options or {})
    if module is None:  # one level per canary: dense per-window gradients of m numbers each, computed in chunks
        options.setdefault("per_window", "isolated")
    options.setdefault("require_accountant", False)  # the audit accounts its fixed number of steps itself (above)
    strategy = DPForecastStrategy(noise_multiplier=sigma, max_grad_norm=max_grad_norm, seed=noise_seed, **options)
    if _noise_scale != 1.0:  # test seam: the noise actually added differs from what the accountant assumes
        make = strategy._make_noise
        strategy._make_noise = lambda ent: _ScaledNoise(make(ent), _noise_scale)  # type: ignore[method-assign]
    windows = canary_windows(plan, lengths, dm.past_length, prediction_length, windows_per_canary,
                             numpy_generator(entropy, _ENTROPY_PLACES, 1))
    scorer = WhiteBoxScorer(plan, windows, world_in, world_out, max_grad_norm=max_grad_norm,
                            noise_std=sigma * max_grad_norm, batch_size=batch_size, center=module is not None)
    strategy.audit_observer = scorer
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
                        callbacks=[strategy])
    say(f"audit: training with DP-SGD and scoring {len(windows.rows)} canary windows at every step ...")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*explicit seed")
        warnings.filterwarnings("ignore", message=".*does not have many workers")
        warnings.filterwarnings("ignore", message="Full backward hook is firing")  # Opacus' hooks, harmless here
        trainer.fit(model, datamodule=dm)
    if scorer.steps != steps:
        raise RuntimeError(f"the audit observed {scorer.steps} noisy steps, expected {steps}")
    black = black_box_scores(model, windows, world_in, world_out, m, initial) if black_box else None

    bounds = _bounds(scorer.scores, black, coins, delta, confidence)
    config = {"epsilon": epsilon, "delta": delta, "canaries": m, "steps": steps, "data": data if isinstance(
        data, str) else "given", "num_series": num_series, "context_length": context_length,
        "prediction_length": prediction_length, "chunk_length": chunk_length, "batch_size": batch_size,
        "relation": {"level": relation.level, "size": relation.size, "value_bound": relation.value_bound},
        "magnitude": magnitude, "scale_series": scale_series, "max_grad_norm": max_grad_norm,
        "windows_per_canary": windows_per_canary, "canary_shape": canary_shape, "canary_offset": canary_offset,
        "canary_level": canary_level, "confidence": confidence,
        "model": type(model).__name__, "seeded": seed is not None,
        "sampling_spec": {"top_level_rate": spec.top_level_rate, "bottom_level_rate": spec.bottom_level_rate,
                          "num_start_positions": spec.num_start_positions}}
    # fixed by the configuration, before any score is seen: with one window per series and every series in every
    # batch (no sampling at all, hidden or credited) the training is exactly the Gaussian mechanism the accountant
    # composes, whatever the module, and the white-box scores are sums of Gaussian likelihood ratios
    exact = spec.top_level_rate == 1.0 and spec.num_start_positions == 1
    result = AuditResult(accountant_epsilon, delta, float(sigma), steps, m, coins, bounds, scorer.scores, black,
                         config, noise_scale=float(_noise_scale), primary=PRIMARY_GAUSSIAN if exact else PRIMARY)
    result.seconds = time.perf_counter() - started
    if output_dir is not None:
        write_audit(result, output_dir, overwrite)
    say(result.table())
    return result


def _bounds(white: np.ndarray, black: np.ndarray | None, coins: np.ndarray, delta: float, confidence: float,
            runs: int = 1) -> dict[str, dict[str, Any]]:
    """Every bound of the audit from its scores and coins (each at ``confidence``)."""
    from lightning_dpts.audit.estimators import (
        gaussian_scores_lower_bound,
        one_run_epsilon_lower_bound,
        one_run_fdp_lower_bound,
    )
    from lightning_dpts.audit.order_statistics import order_statistics_lower_bound

    bounds: dict[str, dict[str, Any]] = {}
    for kind, scores in (("white_box", white), ("black_box", black)):
        if scores is None:
            continue
        bounds[f"{kind}_one_run"] = one_run_epsilon_lower_bound(scores, coins, delta=delta,
                                                                confidence=confidence).as_dict()
        bounds[f"{kind}_fdp"] = one_run_fdp_lower_bound(scores, coins, delta=delta, confidence=confidence).as_dict()
        bounds[f"{kind}_gauss"] = gaussian_scores_lower_bound(scores, coins, delta=delta, confidence=confidence,
                                                              runs=runs).as_dict()
        # white-box scores are log-likelihood ratios (0 is the MAP threshold); black-box ones split at their median
        bounds[f"{kind}_order"] = order_statistics_lower_bound(
            scores, coins, delta=delta, confidence=confidence, threshold=0.0 if kind == "white_box" else None,
            runs=runs).as_dict()
        for name in ("one_run", "fdp"):
            bounds[f"{kind}_{name}"]["runs"] = runs
    return bounds


def _pooled_runs(runs: int, started: float, output_dir: str | Path | None, overwrite: bool,
                 progress: Callable[[str], None] | None, options: dict[str, Any]) -> AuditResult:
    """``runs`` independent audits of one configuration, their canaries pooled into one game."""
    say = progress or (lambda _line: None)
    seed = options.pop("seed")
    results = []
    for r in range(runs):
        run_seed = None if seed is None else int(np.random.SeedSequence([seed, r]).generate_state(1)[0])
        say(f"audit: run {r + 1} of {runs}")
        results.append(run_audit(seed=run_seed, progress=None, _pooled=True, **options))
    from lightning_dpts.audit.estimators import pool_runs

    white, coins = pool_runs([x.white_box_scores for x in results], [x.included for x in results])
    black = None
    if all(x.black_box_scores is not None for x in results):
        black, _ = pool_runs([x.black_box_scores for x in results], [x.included for x in results])
    first = results[0]
    bounds = _bounds(white, black, coins, first.delta, float(options["confidence"]), runs)
    config = {**first.config, "runs": runs, "seeded": seed is not None}
    result = AuditResult(first.accountant_epsilon, first.delta, first.noise_multiplier, first.steps,
                         int(coins.size), coins, bounds, white, black, config, noise_scale=first.noise_scale,
                         primary=first.primary, runs=runs)
    result.seconds = time.perf_counter() - started
    if output_dir is not None:
        write_audit(result, output_dir, overwrite)
    say(result.table())
    return result


def write_audit(result: AuditResult, output_dir: str | Path, overwrite: bool = False) -> None:
    """Write ``report.json`` (public) and ``private/audit.json``, ``private/audit.png``, ``private/scores.csv``."""
    from lightning_dpts.outputs import OutputDirectory, atomic_path, write_json, write_text

    with OutputDirectory(output_dir, overwrite) as out:
        out.register("report.json", "public: the audit's configuration, sigma, steps and the accountant's epsilon "
                     "(functions of the configuration only)")
        write_json(out.path("report.json"), result.public_dict())
        out.register("private/audit.json", "private: the empirical lower bounds, computed from the canary scores "
                     "(training windows' values without noise)")
        write_json(out.path("private/audit.json"), result.as_dict())
        out.register("private/scores.csv", "private: score and coin of every canary")
        rows = ["canary,included,white_box_score,black_box_score"]
        for j in range(result.canaries):
            bb = "" if result.black_box_scores is None else repr(float(result.black_box_scores[j]))
            rows.append(f"{j},{int(result.included[j])},{float(result.white_box_scores[j])!r},{bb}")
        write_text(out.path("private/scores.csv"), "\n".join(rows) + "\n")
        out.register("private/audit.png", "private: the lower bounds against the accountant's epsilon")
        with atomic_path(out.path("private/audit.png")) as tmp:
            plot_audit(result, tmp)


def plot_audit(result: AuditResult, path: str | Path) -> None:
    """Bar chart of every lower bound (with its confidence in the label; the primary one in colour) and the
    accountant's epsilon as a line."""
    from lightning_dpts.outputs import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = list(result.bounds)
    values = [float(result.bounds[n]["epsilon"]) for n in names]
    ax.barh(range(len(names)), values, color=["tab:blue" if n == result.primary else "tab:gray" for n in names])
    ax.set_yticks(range(len(names)), [f"{n.replace('_', ' ')}{' (primary)' if n == result.primary else ''} "
                                      f"({float(result.bounds[n]['confidence']):.0%})" for n in names])
    ax.axvline(result.accountant_epsilon, color="tab:red", label=f"accountant: {result.accountant_epsilon:.3g}")
    ax.set_xlabel(f"epsilon at delta={result.delta:g}")
    ax.set_title(f"empirical lower bounds: {result.canaries} canaries, {result.steps} steps")
    ax.legend(loc="lower right")
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def dumps(result: AuditResult) -> str:
    """The full result (``as_dict``) as one JSON line (``dpts audit --json``)."""
    return json.dumps(result.as_dict(), sort_keys=True)

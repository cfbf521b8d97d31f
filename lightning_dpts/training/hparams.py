"""The DP settings of a run as one flat dictionary, for ``log_hyperparams`` and ``report.json``.

A logged epsilon means nothing without the settings that produced it: the noise multiplier sigma and clipping
norm C (Algorithm 2), the budget (epsilon, delta), the sampling geometry Lambda, lambda, N, L, L_C, L_F with its
rates rho = N'/N and r (Theorems 4.2/4.4), the neighbouring relation (Definitions 3.5-3.7), the Eq. 1
augmentation, and the theorem the accountant composed. :func:`dp_hyperparameters` collects them from the objects
that hold them (the sampling spec, the accountant, the strategy) - nothing is typed twice - and
:class:`~lightning_dpts.training.AccountantCallback` logs the result once per run to every logger under the key
``"dp"`` (TensorBoard and MLflow flatten it to ``dp/noise_multiplier`` etc.; CSVLogger writes it to
``hparams.yaml``).

TensorBoard's HParams dashboard shows only the *first* session an event file holds (its event accumulator keeps
the first metadata of a tag), and Lightning writes the module's ``save_hyperparameters()`` as a session before any
callback runs. :func:`defer_tensorboard_hparams` (called from the callback's ``setup``) holds that first write
back, and :func:`log_dp_hyperparameters` then writes one session with the module's hyperparameters and the
``dp/...`` settings together.

Only settings are recorded, never randomness: no seed, generator state or entropy value ever appears (docs/privacy.md,
rule 7). Whether the run was seeded (its guarantee then does not hold against anyone who knows the seed) and
whether secure-mode noise was used are recorded when the strategy exposes them.
"""

from __future__ import annotations

from typing import Any

from lightning_dpts.privacy.spec import SamplingSpec

__all__ = ["HPARAMS_KEY", "defer_tensorboard_hparams", "dp_hyperparameters", "log_dp_hyperparameters",
           "release_tensorboard_hparams"]

#: The key under which :class:`~lightning_dpts.training.AccountantCallback` logs the dictionary.
HPARAMS_KEY = "dp"

Scalar = int | float | str | bool | None


def _seeded_flag(*holders: Any) -> bool | None:
    """Whether any holder drew its privacy randomness from an explicit seed (``None`` when none says)."""
    flags = []
    for holder in holders:
        if holder is None:
            continue
        entropy = getattr(holder, "entropy", None)
        seeded = getattr(entropy, "seeded", None) if entropy is not None else getattr(holder, "seeded", None)
        if isinstance(seeded, bool):
            flags.append(seeded)
    return any(flags) if flags else None


def _secure_flag(strategy: Any) -> bool | None:
    for name in ("secure_mode", "secure"):
        value = getattr(strategy, name, None)
        if isinstance(value, bool):
            return value
    return None


def dp_hyperparameters(
    spec: SamplingSpec,
    *,
    noise_multiplier: float,
    epsilon_budget: float,
    delta: float,
    accountant: Any = None,
    strategy: Any = None,
    datamodule: Any = None,
    bound: str = "upper",
    max_steps: int | None = None,
) -> dict[str, Scalar]:
    """The DP settings of one training run, flat and JSON/YAML/TensorBoard friendly.

    Args:
        spec: the sampling description the accountant used (``datamodule.sampling_spec``).
        noise_multiplier: sigma; the noise std on the summed clipped gradient is sigma * C (Algorithm 2).
        epsilon_budget: the epsilon the run may spend.
        delta: the delta of the budget and of every reported epsilon.
        accountant: the :class:`~lightning_dpts.privacy.StructuredSubsamplingAccountant` (theorem, bound kind,
            composition unit); optional.
        strategy: the :class:`~lightning_dpts.training.DPForecastStrategy` (C, secure mode, seeded flag); optional.
        datamodule: the datamodule (its seeded flag, if it has one); optional.
        bound: ``"upper"`` (the sound guarantee) or ``"lower"`` (the paper's optimistic lower bound).
        max_steps: the optimizer steps the budget allows, if known.

    Returns:
        A dict of scalars. Keys (units): ``noise_multiplier`` (sigma), ``max_grad_norm`` (C, loss-gradient units),
        ``noise_std`` (sigma*C), ``epsilon_budget``, ``delta``, ``bound``, ``theorem``, ``bound_kind``,
        ``composition_unit`` (step/epoch), ``max_steps``, ``num_series`` (N), ``min_length`` (L, time steps),
        ``context_length`` (L_C incl. lags), ``prediction_length`` (L_F), ``batch_size`` (Lambda, windows),
        ``instances_per_series`` (lambda), ``top_sample_size`` (N'), ``top_level``, ``bottom_level``,
        ``top_level_rate`` (rho), ``bottom_level_rate`` (r), ``windows_per_unit`` (k), ``steps_per_epoch``,
        ``relation_level``, ``relation_size`` (w), ``relation_value_bound`` (v, or ``None``), ``relation_num_dims``
        (D), ``context_noise`` (sigma_C), ``forecast_noise`` (sigma_F), and, when known, ``secure_mode`` and
        ``seeded``.
    """
    relation = spec.relation
    out: dict[str, Scalar] = {
        "noise_multiplier": float(noise_multiplier),
        "max_grad_norm": None,
        "noise_std": None,
        "epsilon_budget": float(epsilon_budget),
        "delta": float(delta),
        "bound": bound,
        "theorem": getattr(accountant, "theorem", None),
        "bound_kind": getattr(accountant, "kind", None),
        "composition_unit": getattr(accountant, "unit", None),
        "max_steps": None if max_steps is None else int(max_steps),
        "num_series": spec.num_series,
        "min_length": spec.min_length,
        "context_length": spec.context_length,
        "prediction_length": spec.prediction_length,
        "batch_size": spec.batch_size,
        "instances_per_series": spec.instances_per_series,
        "top_sample_size": spec.top_sample_size,
        "top_level": spec.top_level,
        "bottom_level": spec.bottom_level,
        "top_level_rate": spec.top_level_rate,
        "bottom_level_rate": spec.bottom_level_rate,
        "windows_per_unit": spec.windows_per_unit,
        "steps_per_epoch": spec.steps_per_epoch,
        "relation_level": relation.level,
        "relation_size": relation.size,
        "relation_value_bound": relation.value_bound,
        "relation_num_dims": relation.num_dims,
        "context_noise": spec.context_noise,
        "forecast_noise": spec.forecast_noise,
    }
    clip = getattr(strategy, "max_grad_norm", None)
    if isinstance(clip, (int, float)) and not isinstance(clip, bool):
        out["max_grad_norm"] = float(clip)
        out["noise_std"] = float(noise_multiplier) * float(clip)
    secure = _secure_flag(strategy)
    if secure is not None:
        out["secure_mode"] = secure
    seeded = _seeded_flag(strategy, datamodule)
    if seeded is not None:
        out["seeded"] = seeded
    return out


#: Attribute of a TensorBoard logger that holds the hyperparameters whose session is held back.
_PENDING = "_dpts_pending_hparams"


def _is_tensorboard(logger: Any) -> bool:
    try:
        from lightning.pytorch.loggers import TensorBoardLogger
    except ImportError:  # pragma: no cover - lightning always has the class
        return False
    return isinstance(logger, TensorBoardLogger)


def defer_tensorboard_hparams(loggers: Any) -> None:
    """Hold back the HParams session of every TensorBoard logger until :func:`log_dp_hyperparameters` writes one
    session with everything (idempotent).

    Lightning logs the module's (and datamodule's) ``hparams_initial`` after the callbacks' ``setup`` and before
    ``on_train_start``; TensorBoard would show that session and ignore a later one with the DP settings. Held
    back here: the parameters still reach ``logger.hparams`` (and so ``hparams.yaml``) at once; only the event
    file's session waits.
    """
    for logger in loggers:
        if not _is_tensorboard(logger) or hasattr(logger, _PENDING):
            continue
        pending: dict[str, Any] = {}
        object.__setattr__(logger, _PENDING, pending)

        def hold(params: Any, metrics: Any = None, step: Any = None, *, _logger: Any = logger,
                 _pending: dict[str, Any] = pending) -> None:
            from lightning.fabric.utilities.logger import _convert_params

            params = dict(_convert_params(params) or {})
            _pending.update(params)
            _logger.hparams.update(params)  # hparams.yaml, written by the logger's save()

        object.__setattr__(logger, "log_hyperparams", hold)


def release_tensorboard_hparams(loggers: Any, extra: dict[str, Any] | None = None) -> None:
    """Write the held-back session of every TensorBoard logger, with ``extra`` added (one session each)."""
    for logger in loggers:
        pending = getattr(logger, _PENDING, None)
        if pending is None:
            continue
        del logger.log_hyperparams  # the class's method again
        delattr(logger, _PENDING)
        params = {**pending, **(extra or {})}
        if params:
            logger.log_hyperparams(params)
            _rewrite_hparams_yaml(logger)


def _rewrite_hparams_yaml(logger: Any) -> None:
    """TensorBoardLogger writes ``hparams.yaml`` once, at its first ``save()``, which may have come before the DP
    settings: write it again with everything (rank 0 only, like the logger)."""
    from lightning.pytorch.core.saving import save_hparams_to_yaml
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:
        return
    from pathlib import Path

    log_dir = Path(logger.log_dir)
    if log_dir.is_dir():
        save_hparams_to_yaml(str(log_dir / logger.NAME_HPARAMS_FILE), logger.hparams)


def log_dp_hyperparameters(loggers: Any, hyperparameters: dict[str, Scalar]) -> None:
    """Log the DP settings once to every logger under :data:`HPARAMS_KEY`; a TensorBoard logger whose session
    was held back (:func:`defer_tensorboard_hparams`) writes it now with the module's hyperparameters."""
    extra = {HPARAMS_KEY: dict(hyperparameters)}
    for logger in loggers:
        if hasattr(logger, _PENDING):
            release_tensorboard_hparams([logger], extra)
        else:
            logger.log_hyperparams(extra)

"""Checks that a model reads only what the datamodule gathers (and the accountant counts).

The accountant's bottom-level rate (Theorem 4.4, r = (L_C + L_F) / T) is computed from the past window the
datamodule gathers, ``past_length`` = context plus every lag (docs/privacy.md, rule 3). A model that reads
further back than that cannot run on the batches (GluonTS fails deep inside with "lags cannot go further
than prior sequence length"), and the fix is always the same: build the datamodule with ``model=`` so that it
gathers, and accounts for, the window the model reads.
"""

from __future__ import annotations

from typing import Any

from lightning_dpts.errors import ConfigurationError

__all__ = ["model_window", "check_model_window", "lag_amplification_warning"]


def model_window(module: Any) -> tuple[int | None, int | None]:
    """(past length, prediction length) a GluonTS-style module reads, or ``None`` where it does not say.

    The past length is ``describe_inputs()["past_target"]``'s time axis (DeepAR: ``context_length`` +
    ``max(lags_seq)``), the prediction length the module's ``prediction_length`` attribute.
    """
    inner = getattr(module, "model", module)
    describe = getattr(inner, "describe_inputs", None)
    past = None
    if callable(describe):
        try:
            spec = describe(1)
            past = int(spec["past_target"].shape[1]) if "past_target" in spec else None
        except Exception:  # a module whose description cannot be built here is checked by its own forward
            past = None
    prediction = getattr(inner, "prediction_length", None)
    return past, (int(prediction) if isinstance(prediction, int) else None)


def check_model_window(datamodule: Any, module: Any) -> None:
    """Refuse a module that reads a longer past window (or another horizon) than ``datamodule`` gathers.

    Args:
        datamodule: a :class:`~lightning_dpts.data.StructuredSubsamplingDataModule` (``past_length``,
            ``prediction_length``).
        module: the LightningModule being trained (or its inner network).

    Raises:
        ConfigurationError: for parameter ``model``, saying how far the module reads and to pass ``model=``.
    """
    past, prediction = model_window(module)
    name = type(module).__name__
    if past is not None and past > datamodule.past_length:
        raise ConfigurationError(
            "model", name,
            f"reads a past window of {past} steps (its context plus its longest lag) but the datamodule gathers "
            f"past_length={datamodule.past_length}; build the datamodule with model=<this module> (or "
            f"past_length={past}) so that it gathers, and the accountant counts, the whole window the model reads",
        )
    if prediction is not None and prediction != datamodule.prediction_length:
        raise ConfigurationError(
            "model", name,
            f"forecasts prediction_length={prediction} steps but the datamodule's windows have "
            f"{datamodule.prediction_length}; build the datamodule with model=<this module>",
        )


def lag_amplification_warning(spec: Any, context_length: int) -> str | None:
    """Why the lags cost privacy, when they make one window span every window start of the shortest series.

    Theorem 4.4's bottom-level rate (with replacement) is r = min(1, (L_C + L_F) / T), with L_C the past window
    *including* every lag (docs/privacy.md, rule 3). Once that window reaches the T window starts of the shortest
    training series, r = 1: every window holds the protected step and window subsampling amplifies (almost)
    nothing. Returns ``None`` when the past window ``spec.context_length`` adds no lags to ``context_length`` or
    the lags are not what makes r = 1.
    """
    from dataclasses import replace

    if spec.context_length <= context_length or spec.window_length < spec.num_start_positions:
        return None
    bare = replace(spec, context_length=context_length)
    if bare.window_length >= bare.num_start_positions:
        return None  # the lags are not what makes every window hold the protected step
    return (f"the model's lags make its past window {spec.context_length} steps (context {context_length} + lags "
            f"up to {spec.context_length - context_length}), so a window ({spec.window_length} steps) spans all "
            f"{spec.num_start_positions} window starts of the shortest training series ({spec.min_length} steps): "
            f"every window holds the protected step and window subsampling amplifies (almost) nothing "
            f"(bottom-level rate r = {spec.bottom_level_rate:.3g}, {bare.bottom_level_rate:.3g} without the lags)")

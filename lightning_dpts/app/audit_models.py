"""Audit the module ``dpts fit`` trains (docs/audit.md, "Auditing your model"): :func:`fit_model` builds it for
:func:`lightning_dpts.audit.run_audit` (``module=``). It lives in the application layer because it reads the
application's model choices (:mod:`lightning_dpts.app.forecasters`); the audit itself is plugin code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning as L

from lightning_dpts.errors import ConfigurationError

__all__ = ["fit_model"]


def fit_model(model: str, freq: str = "M", **options: Any) -> Callable[[int, int, int], L.LightningModule]:
    """``factory(num_series, past_length, prediction_length)`` for :func:`~lightning_dpts.audit.run_audit`
    (``module=``): the LightningModule ``dpts fit --model model`` trains (its estimator from
    :func:`lightning_dpts.app.forecasters.make_estimator`: the same architecture, loss, optimizer and learning
    rate), with ``context_length`` = the audit's past window. ``options``: further
    :class:`~lightning_dpts.app.config.FitConfig` fields (e.g. ``season_length``, ``learning_rate``)."""
    from lightning_dpts.app.config import MODELS, FitConfig

    if model not in MODELS:
        raise ConfigurationError("model", model, f"one of {', '.join(MODELS)}")

    def factory(num_series: int, past_length: int, prediction_length: int) -> L.LightningModule:
        from lightning_dpts.app.forecasters import make_estimator

        config = FitConfig(model=model, prediction_length=prediction_length, context_length=past_length, **options)
        return make_estimator(config, freq).create_lightning_module()

    return factory

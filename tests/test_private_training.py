"""make_private_with_epsilon: the recipe of dpts fit for any model, from public metadata only."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.recipe import make_private_with_epsilon


def _table(lengths, rng):
    rows = []
    for i, n in enumerate(lengths):
        stamps = pd.period_range("2000-01", periods=n, freq="M").to_timestamp()
        rows.append(pd.DataFrame({"item_id": f"s{i}", "timestamp": stamps, "target": rng.gamma(2.0, 50.0, n)}))
    return pd.concat(rows, ignore_index=True)


def _comparable(plan):
    return plan.settings, plan.reasons, plan.trainer_kwargs["max_epochs"], plan.datamodule_kwargs, plan.warnings


def test_same_lengths_different_values_same_settings():
    """Attacker-style: two datamodules whose series have the same lengths and unrelated values (one scaled by
    1e6, one negated noise) must get identical settings; reading any value would make them differ."""
    from lightning_dpts.data import StructuredSubsamplingDataModule

    lengths = [60] * 6 + [200] * 40
    a = _table(lengths, np.random.default_rng(0))
    b = _table(lengths, np.random.default_rng(1)).assign(target=lambda d: -1e6 * d["target"] + 3.0)
    plans = []
    for table in (a, b):
        dm = StructuredSubsamplingDataModule(table, context_length=24, prediction_length=12, batch_size=8)
        plans.append(make_private_with_epsilon(dm, epsilon=1.0, delta=1e-7))
    assert _comparable(plans[0]) == _comparable(plans[1])
    from lightning_dpts.data import to_collection

    for table, plan in zip((a, b), plans, strict=True):
        by_collection = make_private_with_epsilon(to_collection(table, freq="M"), epsilon=1.0, delta=1e-7,
                                                  prediction_length=12)
        by_lengths = make_private_with_epsilon(lengths, epsilon=1.0, delta=1e-7, freq="M", prediction_length=12)
        assert _comparable(by_collection) == _comparable(by_lengths) == _comparable(plan)


def test_settings_have_reasons_and_explicit_settings_win():
    lengths = [150] * 60
    plan = make_private_with_epsilon(lengths, epsilon=1.0, delta=1e-7, freq="M", prediction_length=12)
    for name in ("max_grad_norm", "batch_size", "noise_multiplier_estimate", "epochs", "steps", "past_length",
                 "min_series_length"):
        assert name in plan.settings and plan.reasons[name]
    assert plan.trainer_kwargs["callbacks"] == [plan.strategy, plan.accountant]
    assert plan.strategy.max_grad_norm == plan.settings["max_grad_norm"]
    assert plan.datamodule_kwargs["batch_size"] == plan.settings["batch_size"]
    mine = make_private_with_epsilon(lengths, epsilon=1.0, delta=1e-7, freq="M", prediction_length=12,
                                     batch_size=16, max_grad_norm=0.5, past_length=30)
    assert mine.settings["batch_size"] == 16 and mine.settings["max_grad_norm"] == 0.5
    assert mine.settings["past_length"] == 30
    assert mine.reasons["batch_size"] == "given" and set(mine.explicit) == {"batch_size", "max_grad_norm",
                                                                           "past_length"}
    assert mine.settings["steps"] == mine.settings["epochs"] * (60 // 16)


def test_module_past_window_is_kept_and_metadata_is_required():
    from gluonts.torch.model.simple_feedforward import SimpleFeedForwardEstimator

    module = SimpleFeedForwardEstimator(prediction_length=12, context_length=36).create_lightning_module()
    plan = make_private_with_epsilon([200] * 50, module, epsilon=1.0, delta=1e-7, freq="M")
    assert plan.settings["past_length"] == 36
    with pytest.raises(ConfigurationError, match="freq"):
        make_private_with_epsilon([200] * 50, epsilon=1.0, delta=1e-7, prediction_length=12)
    with pytest.raises(ConfigurationError, match="data"):
        make_private_with_epsilon("us_employment", epsilon=1.0, delta=1e-7, freq="M", prediction_length=12)


def test_wrapped_gluonts_module_same_lengths_different_values_same_settings():
    """The seasonal residual wrapper reads no lag beyond the model's own (L_C unchanged): the recipe gives a wrapped
    DeepAR the settings of the unwrapped one, and two datasets with the same lengths and unrelated values the
    same settings."""
    from gluonts.torch.model.deepar import DeepAREstimator

    from lightning_dpts.data import StructuredSubsamplingDataModule
    from lightning_dpts.models import seasonal_residual

    def deepar():
        return DeepAREstimator(freq="M", prediction_length=12, context_length=12, num_layers=1,
                               hidden_size=8).create_lightning_module()

    lengths = [80] * 6 + [200] * 40
    plain = make_private_with_epsilon(lengths, deepar(), epsilon=1.0, delta=1e-7, freq="M")
    wrapped = seasonal_residual(deepar(), freq="M")
    plans = []
    for rng, sign in ((np.random.default_rng(0), 1.0), (np.random.default_rng(1), -1e6)):
        table = _table(lengths, rng).assign(target=lambda d, s=sign: s * d["target"])
        dm = StructuredSubsamplingDataModule(table, model=wrapped, batch_size=8)
        plans.append(make_private_with_epsilon(dm, wrapped, epsilon=1.0, delta=1e-7))
    assert _comparable(plans[0]) == _comparable(plans[1])
    assert plans[0].settings == plain.settings

"""The privatisation itself: subsampling rate, noise, imputation, filter, datasets, Lightning.

Statistical checks accept 5 standard errors (false-failure rate ~6e-7 each by the CLT); seeds are fixed.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.release import (
    TimeDomainSubsampling,
    circulant_filter,
    gaussian_filter_kernel,
    impute,
    privatize_dataset,
    release_forecasts,
)


def test_rate_one_without_noise_is_identity() -> None:
    x = np.random.default_rng(0).normal(size=(3, 20))
    assert np.array_equal(TimeDomainSubsampling(1.0, 0.0).privatize(x, 1), x)


def test_sampling_rate_and_noise_std() -> None:
    p, s = 0.3, 2.0
    out, mask = TimeDomainSubsampling(p, s).privatize(np.zeros((2000, 50)), 3, return_mask=True)
    n = mask.size
    assert abs(mask.mean() - p) <= 5 * math.sqrt(p * (1 - p) / n)
    kept = out[mask]
    var_se = s**2 * math.sqrt(2 / kept.size)
    assert abs(kept.var() - s**2) <= 5 * var_se
    assert abs(kept.mean()) <= 5 * s / math.sqrt(kept.size)


def test_seeded_reproducibility() -> None:
    mech = TimeDomainSubsampling(0.5, 1.0)
    x = np.arange(30.0)
    assert np.array_equal(mech.privatize(x, 42), mech.privatize(x, 42))
    assert not np.array_equal(mech.privatize(x, 42), mech.privatize(x, 43))


def test_imputation_matches_numpy_interp_and_mean() -> None:
    rng = np.random.default_rng(5)
    v = rng.normal(size=(300, 17))
    m = rng.random((300, 17)) < 0.3
    t = np.arange(17)
    lin, mean = impute(v, m, "linear"), impute(v, m, "mean", fill_value=-1.0)
    for i in range(300):
        if m[i].any():
            assert np.allclose(lin[i], np.interp(t, t[m[i]], v[i][m[i]]))  # nearest value at both ends
            assert np.allclose(mean[i], np.where(m[i], v[i], v[i][m[i]].mean()))
        else:
            assert np.all(lin[i] == 0.0) and np.all(mean[i] == -1.0)


def test_circulant_filter_is_the_matrix_of_koga_section_2() -> None:
    h = gaussian_filter_kernel(16, 2.0)
    assert h.sum() == pytest.approx(1.0) and np.all(h >= 0)
    a = np.array([[h[(i - j) % 16] for j in range(16)] for i in range(16)])
    x = np.random.default_rng(1).normal(size=16)
    assert np.allclose(circulant_filter(x, h), a @ x)
    assert np.linalg.norm(a, 2) == pytest.approx(1.0)  # sigma_max(A) = 1 (used by Theorem 4)


def test_filter_length_must_match_window() -> None:
    mech = TimeDomainSubsampling(0.5, 1.0, filter_kernel=gaussian_filter_kernel(8, 2.0))
    with pytest.raises(ConfigurationError) as info:
        mech.privatize(np.zeros(9), 0)
    assert info.value.parameter == "filter_kernel"


@pytest.mark.parametrize(("kwargs", "parameter"), [({"rate": 0.0, "noise_std": 1.0}, "rate"),
                                                    ({"rate": 0.5, "noise_std": -1.0}, "noise_std"),
                                                    ({"rate": 0.5, "noise_std": 1.0, "imputation": "x"},
                                                     "imputation")])
def test_mechanism_errors(kwargs, parameter: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        TimeDomainSubsampling(**kwargs)
    assert info.value.parameter == parameter


def test_non_finite_input_is_rejected() -> None:
    with pytest.raises(ConfigurationError) as info:
        TimeDomainSubsampling(0.5, 1.0).privatize(np.array([1.0, np.nan]), 0)
    assert info.value.parameter == "x"


def _dataset(n: int = 3, length: int = 40) -> list[dict]:
    return [{"target": np.arange(length, dtype=float) + 100 * i, "start": pd.Period("2000-01", "M"),
             "item_id": f"s{i}"} for i in range(n)]


def test_privatize_dataset_releases_only_the_window() -> None:
    mech = TimeDomainSubsampling(0.5, 0.0)
    out = privatize_dataset(_dataset(), mech, context_length=12, seed=3)
    assert all(len(e["target"]) == 12 for e in out)
    assert out[0]["start"] == pd.Period("2000-01", "M") + 28
    assert out[1]["item_id"] == "s1"
    again = privatize_dataset(_dataset(), mech, context_length=12, seed=3)
    assert all(np.array_equal(a["target"], b["target"]) for a, b in zip(out, again, strict=True))
    other = privatize_dataset(_dataset(), mech, context_length=12, seed=3, release=1)
    assert not all(np.array_equal(a["target"], b["target"]) for a, b in zip(out, other, strict=True))
    with pytest.raises(ConfigurationError) as info:
        privatize_dataset([{**_dataset(1)[0], "feat_dynamic_real": np.zeros((1, 40))}], mech, 12)
    assert info.value.parameter == "dataset"


def test_release_forecasts_with_gluonts_predictor() -> None:
    from gluonts.model.seasonal_naive import SeasonalNaivePredictor

    predictor = SeasonalNaivePredictor(prediction_length=6, season_length=12)
    mech = TimeDomainSubsampling(1.0, 0.0)
    forecasts = release_forecasts(predictor, _dataset(), mech, context_length=24, seed=0)
    assert len(forecasts) == 3
    # no noise, no subsampling: seasonal naive of the last 12 values
    assert np.allclose(forecasts[1].mean, (np.arange(40.0) + 100)[28:34])


def test_lightning_callback_privatises_predict_batches() -> None:
    import lightning as L
    import torch

    from lightning_dpts.release import PrivateInputCallback

    class Echo(L.LightningModule):
        def predict_step(self, batch, batch_idx):
            return batch["past_target"].clone(), batch["past_observed_values"].clone()

    data = [{"past_target": torch.arange(10.0) + i, "past_observed_values": torch.zeros(10)} for i in range(4)]
    loader = torch.utils.data.DataLoader(data, batch_size=2)

    def run(seed: int):
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[PrivateInputCallback(TimeDomainSubsampling(0.5, 1.0), seed=seed)])
        return trainer.predict(Echo(), loader)

    first, second = run(0), run(0)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, second, strict=True))
    assert not torch.equal(first[0][0], torch.stack([data[0]["past_target"], data[1]["past_target"]]))
    assert torch.all(first[0][1] == 1)

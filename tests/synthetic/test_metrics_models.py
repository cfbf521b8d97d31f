"""Context-FID against a direct numpy/scipy computation; generator; VAE variation degree; encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import linalg

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.synthetic.generator import generate_series
from lightning_dpts.synthetic.metrics import ContextFID
from lightning_dpts.synthetic.models import ContrastiveEncoder, VariationVAE, variation_schedule
from lightning_dpts.synthetic.pretrain import _train


def _direct_fid(a: np.ndarray, b: np.ndarray) -> float:
    mu_a, mu_b = a.mean(0), b.mean(0)
    cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    root = np.real(linalg.sqrtm(cov_a @ cov_b))
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(cov_a + cov_b - 2 * root))


def test_context_fid_matches_direct_computation() -> None:
    rng = np.random.default_rng(3)
    real = rng.normal(size=(300, 6)) @ rng.normal(size=(6, 6))
    fake = rng.normal(loc=0.5, size=(200, 6)) @ rng.normal(size=(6, 6))
    metric = ContextFID(dim=6)
    for chunk in np.array_split(real, 4):
        metric.update(torch.as_tensor(chunk), real=True)
    for chunk in np.array_split(fake, 3):
        metric.update(torch.as_tensor(chunk), real=False)
    assert float(metric.compute()) == pytest.approx(_direct_fid(real, fake), rel=1e-8, abs=1e-8)
    same = ContextFID(dim=6)
    same.update(torch.as_tensor(real), real=True)
    same.update(torch.as_tensor(real), real=False)
    assert abs(float(same.compute())) < 1e-6
    metric.reset()
    with pytest.raises(ValueError):
        metric.compute()


def test_context_fid_with_encoder() -> None:
    torch.manual_seed(0)
    encoder = ContrastiveEncoder(hidden=8, depth=2, output_dim=4)
    x_real = torch.as_tensor(generate_series(50, 16, np.random.default_rng(0)), dtype=torch.float32)
    x_fake = torch.as_tensor(generate_series(40, 16, np.random.default_rng(1)), dtype=torch.float32)
    metric = ContextFID(dim=4, encoder=encoder.embed)
    metric.update(x_real, real=True)
    metric.update(x_fake, real=False)
    direct = _direct_fid(encoder.embed(x_real).double().numpy(), encoder.embed(x_fake).double().numpy())
    assert float(metric.compute()) == pytest.approx(direct, rel=1e-5)


def test_generator_is_vectorised_standardised_and_varied() -> None:
    x = generate_series(500, 40, np.random.default_rng(0))
    assert x.shape == (500, 40) and np.isfinite(x).all()
    np.testing.assert_allclose(x.mean(1), 0.0, atol=1e-9)
    np.testing.assert_allclose(x.std(1), 1.0, atol=1e-6)
    raw = generate_series(500, 40, np.random.default_rng(0), standardize=False)
    assert raw.std(1).std() > 0.1  # amplitudes differ between series
    with pytest.raises(ConfigurationError):
        generate_series(0, 40, np.random.default_rng(0))


def test_vae_variation_degree_is_monotone_in_distance() -> None:
    """Mean L2 distance of the variation from its input grows with variation_degree; degree 0 is the identity.

    Fixed seeds; the smallest gap between neighbouring degrees is many standard errors of the mean over 400
    windows, so the test fails only if the monotone schedule of Eq. 4 is broken.
    """
    torch.manual_seed(0)
    train = generate_series(256, 24, np.random.default_rng(5))
    vae = VariationVAE(24, latent_dim=8, channels=8)
    _train(vae, train, epochs=2, batch_size=64, progress=False, seed=1)
    x = torch.as_tensor(generate_series(400, 24, np.random.default_rng(6)), dtype=torch.float32)
    distances = []
    for degree in (0, 10, 25, 40, 60, 80, 100):
        varied = vae.vary(x, degree, torch.Generator().manual_seed(9))
        distances.append((varied - x).norm(dim=-1))
    means = [float(d.mean()) for d in distances]
    assert means[0] == 0.0
    for lower, higher, d_lo, d_hi in zip(means, means[1:], distances, distances[1:], strict=False):
        standard_error = float(torch.sqrt(d_lo.var() / len(d_lo) + d_hi.var() / len(d_hi)))
        assert higher - lower > 3 * standard_error, means
    with pytest.raises(ConfigurationError):
        vae.vary(x, 101.0)


def test_vae_loss_has_every_term_of_eq_3() -> None:
    vae = VariationVAE(16, latent_dim=4, channels=4)
    terms = vae.loss(torch.randn(8, 16))
    assert set(terms) == {"loss", "recon", "kl", "freq", "diff", "peak"}
    assert all(torch.isfinite(v) for v in terms.values())


def test_variation_schedule() -> None:
    assert variation_schedule(11) == [40, 35, 30, 25, 20, 15, 10, 5, 5, 5, 5]
    assert variation_schedule(3, [30, 20, 10]) == [30, 20, 10]
    s = variation_schedule(5)
    assert s[0] == 40 and s[-1] == 5 and all(a >= b for a, b in zip(s, s[1:], strict=False))
    with pytest.raises(ConfigurationError):
        variation_schedule(3, [120])


def test_encoder_contrastive_training_lowers_loss() -> None:
    torch.manual_seed(0)
    data = torch.as_tensor(generate_series(128, 24, np.random.default_rng(2)), dtype=torch.float32)
    enc = ContrastiveEncoder(hidden=16, depth=2, output_dim=8)

    def loss() -> float:
        torch.manual_seed(1)
        with torch.no_grad():
            return float(torch.stack([enc.contrastive_loss(data) for _ in range(16)]).mean())

    before = loss()
    _train(enc, data.numpy(), epochs=10, batch_size=32, progress=False, seed=2)
    assert loss() < before
    assert enc.embed(data).shape == (128, 8)


def test_every_lazy_export_resolves() -> None:
    import lightning_dpts.synthetic as synthetic

    for name in synthetic.__all__:
        assert getattr(synthetic, name) is not None, name

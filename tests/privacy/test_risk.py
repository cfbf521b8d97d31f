"""Issue 43: the membership-attack read-outs (TPR at FPR, mu-GDP) against closed forms, an attacker, and the accountant.

The PLDs of the closed-form tests are dp_accounting's own (``from_gaussian_mechanism``), not the package's, so the
read-out is checked independently of the package's PLD construction.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl
from scipy.stats import norm

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy import FPRS, SamplingSpec, StructuredSubsamplingAccountant
from lightning_dpts.privacy._dp_accounting import direction_pmfs, symmetric_pld
from lightning_dpts.privacy.risk import (
    compose_randomized_response,
    gaussian_delta,
    gaussian_tpr,
    gdp_mu_from_pmfs,
    metric_names,
    risk_from_plds,
    tpr_from_pmfs,
)

TRAFFIC = SamplingSpec(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256)


def _gaussian(sigma: float, n: int = 1):
    pld = dpl.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4)
    return pld.self_compose(n) if n > 1 else pld


def test_closed_forms_themselves():
    """gaussian_tpr and gaussian_delta against scipy's normal distribution written out directly."""
    for mu, alpha in [(0.5, 1e-3), (1.0, 1e-2), (3.0, 0.2)]:
        assert gaussian_tpr(mu, alpha) == pytest.approx(norm.cdf(norm.ppf(alpha) + mu), rel=1e-12)
    for mu, eps in [(0.5, 0.1), (1.0, 2.0), (2.0, 5.0), (0.2, 1.5)]:
        direct = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert gaussian_delta(mu, eps) == pytest.approx(direct, rel=1e-9)


@pytest.mark.parametrize("sigma, n", [(0.5, 1), (1.0, 1), (2.0, 1), (20.0, 1), (4.0, 100)])
def test_gaussian_mechanism_tpr_and_mu_match_the_closed_forms_from_above(sigma, n):
    """mu-GDP with mu = sqrt(n) / sigma: TPR(alpha) = Phi(Phi^-1(alpha) + mu); mu from delta(eps). Never below (the
    PLD is pessimistic), and within 1e-6 (TPR) and 1e-4 (mu, 2048-point check) above."""
    mu = math.sqrt(n) / sigma
    readout = risk_from_plds([_gaussian(sigma, n)], 1e-7)
    for alpha, tpr in zip(readout.fprs, readout.tprs, strict=True):
        exact = float(gaussian_tpr(mu, alpha))
        assert exact * (1 - 1e-9) <= tpr <= exact * (1 + 1e-6), (alpha, tpr, exact)
    assert mu <= readout.mu <= mu * (1 + 1e-4)
    assert readout.delta == 1e-7 and readout.fprs == FPRS


@pytest.mark.parametrize("points, bound", [(128, 2e-3), (256, 5e-4)])
def test_the_coarser_mu_check_errs_upwards_by_a_bounded_amount(points, bound):
    h, lower, probs, inf = direction_pmfs(_gaussian(1.0, 4))[0]
    mu = float(gdp_mu_from_pmfs(h, lower, probs[None, :], np.array([inf]), 1e-7, points)[0])
    assert 2.0 <= mu <= 2.0 * (1 + bound)


def test_poisson_subsampled_gaussian_tpr_matches_its_neyman_pearson_closed_form():
    """dp_accounting's REMOVE direction of the Poisson-subsampled Gaussian: P = (1-p) N(0,1) + p N(mu,1) against
    Q = N(0,1), monotone likelihood ratio, so TPR(alpha) = (1 - p) alpha + p Phi(Phi^-1(alpha) + mu)."""
    p, sigma = 0.1, 1.0
    pld = dpl.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4, sampling_prob=p)
    h, lower, probs, inf = direction_pmfs(pld)[0]
    got = tpr_from_pmfs(h, lower, probs[None, :], np.array([inf]))[0]
    for alpha, tpr in zip(FPRS, got, strict=True):
        exact = (1 - p) * alpha + p * float(gaussian_tpr(1 / sigma, alpha))
        assert exact * (1 - 1e-9) <= tpr <= exact * (1 + 1e-5)
    # risk_from_plds of the two-direction PLD takes the worse direction
    both = risk_from_plds([pld], 1e-7)
    assert both.tprs == pytest.approx(tuple(got), rel=1e-12)


def test_randomized_response_closed_form():
    """An (eps, 0)-DP mechanism at worst: TPR(alpha) = e^eps alpha for alpha <= 1 / (1 + e^eps) (Kairouz et al.)."""
    eps = 0.7
    nothing = symmetric_pld(1e-4, 0, np.ones(1), 0.0)
    readout = risk_from_plds([compose_randomized_response(nothing, eps)], 1e-7)
    for alpha, tpr in zip(readout.fprs, readout.tprs, strict=True):
        assert math.exp(eps) * alpha * (1 - 1e-9) <= tpr <= math.exp(eps) * alpha * (1 + 1e-3)
    assert readout.tprs == pytest.approx(tuple(math.exp(eps) * a for a in FPRS), rel=1e-3)


def test_an_attacker_does_no_better_than_the_read_out():
    """Monte Carlo attacker on the Poisson-subsampled Gaussian (p = 0.1, sigma = 1): the Neyman-Pearson test
    (threshold at Q's 1 - alpha quantile) on 10^6 samples of P. Its TPR must not exceed the read-out by more than 5
    standard errors (false-failure rate < 3e-7 per check, fixed seed); with the noise removed (sigma = 0.05) the
    attack beats the read-out of the noisy mechanism, so the check can fail."""
    p, n = 0.1, 1_000_000
    pld = dpl.from_gaussian_mechanism(1.0, value_discretization_interval=1e-4, sampling_prob=p)
    readout = risk_from_plds([pld], 1e-7)
    rng = np.random.default_rng(1234)

    def attack(sigma: float, alpha: float) -> float:
        threshold = norm.ppf(1 - alpha) * sigma
        sampled = rng.random(n) < p
        x = rng.normal(0.0, sigma, n) + sampled * 1.0  # P: the protected record is in with probability p
        return float(np.mean(x > threshold))

    for alpha, bound in zip(readout.fprs, readout.tprs, strict=True):
        se = math.sqrt(bound * (1 - bound) / n)
        assert attack(1.0, alpha) <= bound + 5 * se
        assert attack(0.05, alpha) > bound + 5 * se  # no protection: the read-out would be exceeded


def test_accountant_read_outs_on_the_traffic_configuration():
    """Consistent with the accountant's own epsilon ((eps, delta)-DP implies TPR <= delta + e^eps alpha), growing with
    the steps, TPR = FPR and mu = 0 before any step, and pure-DP releases composed on top only add risk."""
    acc = StructuredSubsamplingAccountant(TRAFFIC, 4.0)
    delta = 1e-7
    before = acc.risk(0, delta)
    assert before.tprs == FPRS and before.mu == 0.0
    previous = before
    for steps in (1, 100, 10_000):
        readout = acc.risk(steps, delta)
        eps = acc.epsilon(steps, delta)
        for alpha, tpr in zip(readout.fprs, readout.tprs, strict=True):
            assert alpha <= tpr <= delta + math.exp(eps) * alpha
        assert all(t >= u for t, u in zip(readout.tprs, previous.tprs, strict=True)) and readout.mu >= previous.mu
        previous = readout
    # mu-GDP dominates the mechanism down to delta: its epsilon at delta is >= the accountant's
    mu = previous.mu
    assert float(gaussian_delta(mu, acc.epsilon(10_000, delta))) >= delta * (1 - 1e-6)
    more = acc.risk(10_000, delta, pure_epsilons=(0.1,))
    assert all(t > u for t, u in zip(more.tprs, previous.tprs, strict=True)) and more.mu > mu
    assert acc.report(10_000, delta).risk == previous


def test_readout_dict_and_metric_names():
    readout = StructuredSubsamplingAccountant(TRAFFIC, 4.0).risk(100, 1e-7)
    assert metric_names() == ("tpr_at_fpr_0.001", "tpr_at_fpr_0.01", "mu_gdp")
    assert list(readout.metrics()) == list(metric_names())
    d = readout.to_dict()
    assert set(d["tpr_at_fpr"]) == {"0.001", "0.01"} and d["mu_gdp"] == readout.mu and d["mu_gdp_delta"] == 1e-7
    assert "GDP" in str(readout) and readout.tpr(1e-3) == readout.tprs[0]


def test_bad_delta_is_refused():
    with pytest.raises(ConfigurationError, match="delta"):
        StructuredSubsamplingAccountant(TRAFFIC, 4.0).risk(10, 0.0)

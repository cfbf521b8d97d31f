"""Privacy of PETS: noise std, sensitivity (incl. series-level weights), accounting vs Theorem 2."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import optimize
from scipy.stats import norm

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.randomness import GaussianNoise, resolve_entropy
from lightning_dpts.synthetic.evolution import dp_nn_histogram, private_windows, vote_histogram
from lightning_dpts.synthetic.privacy import (
    PETSAccountant,
    calibrate_pets_noise,
    sensitivity,
)


def _closed_form_epsilon(sigma: float, rounds: int, delta: float) -> float:
    """PETS Theorem 2 written out independently with scipy's normal cdf (not the package's helper)."""
    mu = math.sqrt(rounds) / sigma

    def d(eps: float) -> float:
        return norm.cdf(mu / 2 - eps / mu) - math.exp(eps) * norm.cdf(-mu / 2 - eps / mu) - delta

    return optimize.brentq(d, 0.0, 200.0, xtol=1e-13)


@pytest.mark.parametrize("relation, factor", [("add_remove", 1.0), ("substitution", math.sqrt(2.0))])
def test_histogram_noise_std(relation: str, factor: float) -> None:
    # 200,000 bins: the sample std has relative sd 1/sqrt(2n) = 0.16%; the 1% band is > 6 sd away
    # (false-failure rate < 1e-9); the mean has sd std/sqrt(n) = 0.0022 std, band 0.02 std (> 9 sd).
    sigma = 2.5
    clean = np.zeros(200_000)
    noise = GaussianNoise(resolve_entropy(1234), stream=(14,))
    thresholded, noisy = dp_nn_histogram(clean, noise, sigma, relation, threshold=0.0)
    std = sigma * factor
    assert abs(noisy.std() / std - 1.0) < 0.01
    assert abs(noisy.mean()) < 0.02 * std
    assert np.array_equal(thresholded, np.maximum(noisy, 0.0))
    thresholded, _ = dp_nn_histogram(clean + 3.0, noise, sigma, relation, threshold=3.0)
    assert (thresholded >= 0).all() and (thresholded > 0).mean() == pytest.approx(0.5, abs=0.01)


def _votes(windows_emb: torch.Tensor, candidates: torch.Tensor, weights: np.ndarray) -> np.ndarray:
    return vote_histogram(windows_emb, candidates, weights)


@pytest.mark.parametrize("unit", ["series", "window"])
def test_histogram_sensitivity_by_enumeration(unit: str) -> None:
    """Remove (add/remove) or replace (substitution) every unit in turn; the histogram moves by <= Delta in L2."""
    rng = np.random.default_rng(7)
    length, m = 6, 3
    # series of 1..6 windows; constant-trend windows so some series put all their votes on one candidate
    series = [np.cumsum(rng.normal(size=length * k)) for k in (1, 2, 3, 4, 5, 6)]
    series.append(np.tile(np.arange(length, dtype=float), 5))  # 5 identical windows: all vote for one bin
    pw = private_windows(series, length, unit=unit, max_windows=m)
    if unit == "series":
        per_series = np.bincount(pw.series, weights=pw.weights)
        assert per_series.max() == pytest.approx(1.0) and (per_series <= 1.0 + 1e-12).all()
        assert np.bincount(pw.series).max() == m
    emb = torch.as_tensor(pw.windows, dtype=torch.float64)
    candidates = torch.as_tensor(rng.normal(size=(5, length)))
    full = _votes(emb, candidates, pw.weights)
    units = pw.series if unit == "series" else np.arange(len(pw.windows))
    worst_remove, worst_sub = 0.0, 0.0
    for u in np.unique(units):
        keep = units != u
        without = _votes(emb[torch.as_tensor(keep)], candidates, pw.weights[keep])
        worst_remove = max(worst_remove, float(np.linalg.norm(full - without)))
        for v in np.unique(units):  # substitute unit u by a copy of unit v (a different record)
            if v == u:
                continue
            add = units == v
            replaced = without + _votes(emb[torch.as_tensor(add)], candidates, pw.weights[add])
            worst_sub = max(worst_sub, float(np.linalg.norm(full - replaced)))
    assert worst_remove <= sensitivity("add_remove") + 1e-12
    assert worst_remove == pytest.approx(1.0)  # attained: a unit whose votes all land in one bin
    assert worst_sub <= sensitivity("substitution") + 1e-12


def test_series_weights_are_what_bounds_the_sensitivity() -> None:
    """Without the 1/m weights a series with m windows in one bin would move the histogram by m, not 1."""
    length, m = 5, 4
    series = [np.tile(np.arange(length, dtype=float), m)]
    pw = private_windows(series, length, unit="series", max_windows=m)
    candidates = torch.as_tensor(np.random.default_rng(0).normal(size=(3, length)))
    emb = torch.as_tensor(pw.windows)
    assert np.linalg.norm(_votes(emb, candidates, pw.weights)) == pytest.approx(1.0)
    assert np.linalg.norm(_votes(emb, candidates, np.ones(m))) == pytest.approx(m)


def test_window_positions_do_not_depend_on_values() -> None:
    a = private_windows([np.arange(23.0)], 5, unit="series", max_windows=2)
    b = private_windows([np.random.default_rng(1).normal(size=23)], 5, unit="series", max_windows=2)
    assert len(a.windows) == len(b.windows) == 2
    c = private_windows([np.r_[np.arange(18.0), np.nan, np.arange(4.0)]], 5, unit="window")
    assert c.skipped_missing == 1 and len(c.windows) == 3


@pytest.mark.parametrize("sigma, rounds, delta", [(1.0, 1, 1e-5), (3.0, 10, 1e-5), (11.8, 10, 1e-5),
                                                  (20.0, 61, 1e-6), (5.0, 21, 1e-3)])
def test_pld_accounting_matches_theorem_2(sigma: float, rounds: int, delta: float) -> None:
    exact = _closed_form_epsilon(sigma, rounds, delta)
    accounted = PETSAccountant(sigma).epsilon(rounds, delta)
    assert accounted >= exact - 1e-9  # pessimistic PLD: never below the exact value
    assert accounted <= exact + 2e-3  # only the discretisation separates them


def test_pld_accounting_agrees_with_dp_accounting_gaussian() -> None:
    from dp_accounting.pld.privacy_loss_distribution import from_gaussian_mechanism

    sigma, rounds, delta = 4.0, 15, 1e-5
    reference = from_gaussian_mechanism(sigma, value_discretization_interval=1e-4).self_compose(rounds)
    assert PETSAccountant(sigma).epsilon(rounds, delta) == pytest.approx(
        reference.get_epsilon_for_delta(delta), abs=2e-3)


@pytest.mark.parametrize("epsilon, rounds", [(0.5, 10), (1.0, 10), (4.0, 20)])
def test_calibration_reaches_target(epsilon: float, rounds: int) -> None:
    delta = 1e-5
    sigma = calibrate_pets_noise(epsilon, delta, rounds)
    assert PETSAccountant(sigma).epsilon(rounds, delta) <= epsilon
    assert PETSAccountant(sigma * 0.995).epsilon(rounds, delta) > epsilon
    assert _closed_form_epsilon(sigma, rounds, delta) <= epsilon


def test_bad_privacy_parameters_are_refused() -> None:
    for call, parameter in ((lambda: sensitivity("group"), "relation"),
                            (lambda: PETSAccountant(0.0), "noise_multiplier"),
                            (lambda: PETSAccountant(2.0).epsilon(0, 1e-5), "iterations"),
                            (lambda: calibrate_pets_noise(1.0, 1.5, 10), "delta"),
                            (lambda: calibrate_pets_noise(-1.0, 1e-5, 10), "epsilon")):
        with pytest.raises(ConfigurationError) as err:
            call()
        assert err.value.parameter == parameter

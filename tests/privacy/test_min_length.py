"""``lengths=None`` (``dpts privacy --min-length L`` alone) means "every series has at least L steps" (issue 26):
the bound is the worst case over all lengths >= L. Checked against enumeration of exact lengths over a range
far beyond the one the package evaluates, with references independent of the package (quadrature of the
member profiles, window-by-window enumeration of Theorem G.1's p2)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from lightning_dpts.app.cli import main
from lightning_dpts.privacy import NeighbouringRelation, SamplingSpec, StructuredSubsamplingAccountant

from . import reference as R
from .test_mixed_lengths import _leak_probability_by_enumeration

POISSON = dict(num_series=400, context_length=6, prediction_length=3, batch_size=80, instances_per_series=2,
               top_level="iteration", bottom_level="poisson")


def _opposed(k: int, r: float, sigma: float, alpha: float) -> float:
    return R.opposed_profile_quadrature(np.arange(k + 1), stats.binom.pmf(np.arange(k + 1), k, r), sigma, alpha)


def test_poisson_worst_case_over_longer_series_matches_enumeration():
    # L = 3: T = 1. Longer series have more windows holding the step (k = min(9, T)) at a lower rate
    # (r = min(1, 2/T)): the shortest series does not decide (T = 2 has k = 2 at r = 1).
    spec = SamplingSpec(min_length=3, **POISSON)
    profile = StructuredSubsamplingAccountant(spec, 2.0).profile
    enumerated = range(1, 61)  # T = 1 .. 60 (lengths 3 .. 62), far beyond k_max = 9
    for alpha in (0.5, 2.0, 10.0):
        want = max(_opposed(min(9, T), min(1.0, 2 / T), 2.0, alpha) for T in enumerated)
        shortest = _opposed(1, 1.0, 2.0, alpha)
        got = float(profile(alpha)[0])
        assert abs(got - want) <= 1e-7 + 1e-5 * want, (alpha, got, want)
        if alpha > 1:
            assert want > shortest * 1.01  # "shortest decides" would understate it
    exact = StructuredSubsamplingAccountant(SamplingSpec(min_length=3, lengths=(3,), **POISSON), 2.0)
    enum = StructuredSubsamplingAccountant(SamplingSpec(min_length=3, lengths=tuple(range(3, 63)), **POISSON), 2.0)
    at_least = StructuredSubsamplingAccountant(spec, 2.0)
    assert at_least.epsilon(50, 1e-5) == enum.epsilon(50, 1e-5) > exact.epsilon(50, 1e-5)
    assert "worst case over lengths >= 3" in at_least.theorem


def test_augmentation_worst_case_over_longer_series_matches_enumeration():
    rel = NeighbouringRelation(value_bound=1.0)
    geometry = dict(num_series=400, context_length=20, prediction_length=5, batch_size=32, relation=rel,
                    context_noise=0.0, forecast_noise=10.0)
    spec = SamplingSpec(min_length=5, **geometry)
    p2 = max(_leak_probability_by_enumeration(L, 20, 5, 0.0, 10.0, 32 / 400) for L in range(5, 120))
    shortest = _leak_probability_by_enumeration(5, 20, 5, 0.0, 10.0, 32 / 400)
    assert p2 > 10 * shortest
    profile = StructuredSubsamplingAccountant(spec, 1.0).profile
    for alpha in (0.5, 3.0, 30.0):
        want = R.switching_profile_quadrature([0, 2], [1 - p2, p2], 1.0, alpha)
        got = float(profile(alpha)[0])
        assert abs(got - want) <= 1e-7 + 1e-5 * want, (alpha, got, want)


@pytest.mark.parametrize("top,bottom,lam,lc,level,size", [
    ("without_replacement", "poisson", 1, 4, "event", 1),
    ("iteration", "poisson", 3, 3, "event", 2),
    ("without_replacement", "poisson", 4, 2, "user", 2),
    ("without_replacement", "with_replacement", 2, 4, "event", 1),
])
def test_range_evaluated_holds_the_maximum_over_a_much_longer_enumeration(top, bottom, lam, lc, level, size):
    geometry = dict(num_series=100, context_length=lc, prediction_length=2, batch_size=4 * lam,
                    instances_per_series=lam, top_level=top, bottom_level=bottom,
                    relation=NeighbouringRelation(level=level, size=size))
    spec = SamplingSpec(min_length=3, **geometry)
    assert max(spec.at_least_lengths()) < 60
    alphas = np.array([0.3, 1.5, 4.0, 40.0])
    got = StructuredSubsamplingAccountant(spec, 1.5).profile(alphas)
    members = [StructuredSubsamplingAccountant(SamplingSpec(min_length=L, lengths=(L,), **geometry), 1.5)
               .profile(alphas) for L in range(3, 200)]
    assert np.allclose(got, np.max(members, axis=0), rtol=1e-12, atol=1e-15)


def test_cli_min_length_alone_is_at_least_and_lengths_is_exact(capsys):
    import json

    args = ["privacy", "epsilon", "--num-series", "400", "--min-length", "4", "--context-length", "6",
            "--prediction-length", "3", "--batch-size", "80", "--instances-per-series", "2", "--top-level",
            "iteration", "--bottom-level", "poisson", "--noise-multiplier", "2", "--steps", "50", "--delta",
            "1e-5", "--json"]
    assert main(args) == 0
    alone = json.loads(capsys.readouterr().out)
    assert main([*args, "--lengths", "4"]) == 0
    exact = json.loads(capsys.readouterr().out)
    at_least = StructuredSubsamplingAccountant(SamplingSpec(min_length=4, **POISSON), 2.0).epsilon(50, 1e-5)
    assert alone["epsilon"]["50"] == pytest.approx(at_least, rel=1e-12)
    assert alone["epsilon"]["50"] > exact["epsilon"]["50"]

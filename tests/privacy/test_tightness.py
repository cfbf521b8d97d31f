"""Tightness of the accountant (issue 26) against independent computations, never against the package itself.

* the paper's long-series configurations (Appendix B.2) against an x-space privacy-loss distribution of the
  switching profile (tests/privacy/reference.py: midpoint buckets, no profile, no connect-the-dots) composed by
  numpy's FFT on a fine grid;
* the epsilon curve the training callback logs from, against :meth:`StructuredSubsamplingAccountant.epsilon` at
  every step.
"""

from __future__ import annotations

import bisect

import pytest

from lightning_dpts.privacy import SamplingSpec, StructuredSubsamplingAccountant

from . import reference as R

# (spec, sigma) of the paper's experiments (Appendix B.2): traffic, electricity and a solar_10_minutes-like
# series length; delta = 1e-7, 10^4 steps.
PAPER = {
    "traffic": (dict(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256), 4.0),
    "electricity": (dict(num_series=321, min_length=21000, context_length=24, prediction_length=24, batch_size=128),
                    2.0),
    "solar": (dict(num_series=137, min_length=50000, context_length=240, prediction_length=60, batch_size=128), 4.0),
}


def _reference(name: str, h: float) -> float:
    kw, sigma = PAPER[name]
    spec = SamplingSpec(**kw)
    q = spec.top_level_rate * spec.bottom_level_rate  # Theorem 4.4: MoG([0, 2], [1 - q, q]) vs N(0, sigma)
    return R.switching_pld([0, 2], [1 - q, q], sigma, h=h).compose(10_000, width_sd=30.0).epsilon(1e-7)


def _ours(name: str) -> float:
    kw, sigma = PAPER[name]
    return StructuredSubsamplingAccountant(SamplingSpec(**kw), sigma).epsilon(10_000, 1e-7)


@pytest.mark.parametrize("name", list(PAPER))
def test_paper_configurations_within_half_a_percent_by_default(name):
    """Default settings, no tuning: within 0.5% of a reference on a 1e-4 grid (itself within 0.01% of 1e-5)."""
    got, want = _ours(name), _reference(name, 1e-4)
    assert want * (1 - 1e-4) <= got <= want * 1.005, (got, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PAPER))
def test_paper_configurations_against_the_fine_reference(name):
    """Against the 1e-5 grid (the issue's electricity figure: 0.7193 from the published code at 1e-5)."""
    got, want = _ours(name), _reference(name, 1e-5)
    assert want * (1 - 1e-4) <= got <= want * 1.005, (got, want)


DEMO = SamplingSpec(num_series=145, min_length=309, context_length=24, prediction_length=12, batch_size=64,
                    lengths=(309, 369, 477, 525, 621, 693, 729, 777, 825, 921))  # `dpts fit`'s default job
DEMO_SIGMA = 10.760956208429903


def _check_curve(acc: StructuredSubsamplingAccountant, last: int, delta: float, steps) -> None:
    curve = list(acc.epsilon_curve(last, delta))
    counts = [c for c, _ in curve]
    values = [e for _, e in curve]
    assert counts[0] == 1 and counts[-1] == last and counts == sorted(set(counts))
    for (a, ea), (b, eb) in zip(curve, curve[1:], strict=False):
        assert b == a + 1 or eb <= 1.01 * ea
    exact = StructuredSubsamplingAccountant(acc.spec, acc.noise_multiplier)  # a fresh one: no shared cache
    for step in steps:
        logged = values[bisect.bisect_left(counts, step)]
        want = exact.epsilon(step, delta)
        assert want <= logged <= 1.01 * want, (step, logged, want)


@pytest.mark.slow  # every step of the default job; tests/privacy/test_epsilon_curve.py checks the curve's paths
def test_curve_of_the_default_job_is_within_one_percent_at_every_step():
    acc = StructuredSubsamplingAccountant(DEMO, DEMO_SIGMA)
    _check_curve(acc, 400, 1e-7, range(1, 401))


@pytest.mark.slow
def test_curve_of_a_ten_thousand_step_run():
    acc = StructuredSubsamplingAccountant(SamplingSpec(**PAPER["traffic"][0]), 4.0)
    steps = sorted({*range(1, 60), *range(60, 10_001, 97), 10_000})
    _check_curve(acc, 10_000, 1e-7, steps)

"""How many canaries does an audit need? The estimators on a plain Gaussian mechanism with known ε (issue 28).

Each canary is included with probability 1/2; its score is N(μ, 1) if included and N(0, 1) if not, which is the
Gaussian mechanism with sensitivity/σ = μ, so its exact (ε, δ) is known (μ solved from the closed form
δ(ε) = Φ(-ε/μ + μ/2) - e^ε Φ(-ε/μ - μ/2), Balle & Wang 2018). This is the best case for an auditor: every canary's
score is the mechanism's full output for it, with no interference between canaries. A training run's scores are
noisier, so these fractions are upper limits for what `dpts audit` can reach with the same number of canaries.

For ε in {1, 2, 4, 8} at δ = 1e-5 and m in {10^3, 10^4, 10^5} canaries, prints the median (min-max over seeds) of
lower bound / true ε at confidence 0.95 for

* ``one_run``: :func:`~lightning_dpts.audit.one_run_epsilon_lower_bound` (Steinke et al. 2023, (ε, δ) statement),
* ``one_run_fdp``: :func:`~lightning_dpts.audit.one_run_fdp_lower_bound` (Mahloujifar et al. 2025, the (ε, δ)
  curve family: no assumption),
* ``one_run_gdp``: the same with ``curve="gaussian"`` (assumes a Gaussian tradeoff curve, true here),
* ``one_run_gdp_profile``: ``curve="gaussian_profile"``,
* ``gaussian_scores``: :func:`~lightning_dpts.audit.gaussian_scores_lower_bound` (the scores read as Gaussian,
  after Agrawal et al. 2026; true here), with the share of seeds whose bound exceeds the true ε (at most 5% for a
  valid 95% bound),
* ``clopper_pearson``: for comparison, m independent runs (m/2 with the canary, m/2 without) judged by the
  likelihood-ratio threshold that maximises the bound on the *expected* counts (an oracle choice), with
  :func:`~lightning_dpts.audit.clopper_pearson_epsilon_lower_bound`. It costs m trainings, not one.

Run:  python benchmarks/audit_estimators.py [--seeds 5] [--quick]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from lightning_dpts.audit import (
    clopper_pearson_epsilon_lower_bound,
    gaussian_dp_epsilon,
    gaussian_scores_lower_bound,
    one_run_epsilon_lower_bound,
    one_run_fdp_lower_bound,
)

EPSILONS = (1.0, 2.0, 4.0, 8.0)
CANARIES = (1_000, 10_000, 100_000)
DELTA = 1e-5
ESTIMATORS = ("one_run", "one_run_fdp", "one_run_gdp", "one_run_gdp_profile", "clopper_pearson", "gaussian_scores")


def mu_for(epsilon: float, delta: float) -> float:
    return brentq(lambda mu: gaussian_dp_epsilon(mu, delta) - epsilon, 1e-3, 30.0, xtol=1e-12)


def clopper_pearson_oracle(rng: np.random.Generator, mu: float, runs: int, delta: float) -> float:
    """m runs, half with the canary; the threshold is the best of a grid on the expected counts (an oracle)."""
    n = runs // 2
    thresholds = np.linspace(0.0, mu + 6.0, 400)

    def expected(t: float) -> float:
        fp, fn = int(round(n * norm.sf(t))), int(round(n * norm.cdf(t - mu)))
        return clopper_pearson_epsilon_lower_bound(fp, n, fn, n, delta=delta).epsilon

    t = max(thresholds, key=expected)
    fp = int(rng.binomial(n, norm.sf(t)))
    fn = int(rng.binomial(n, norm.cdf(t - mu)))
    return clopper_pearson_epsilon_lower_bound(fp, n, fn, n, delta=delta).epsilon


def one_cell(epsilon: float, m: int, seeds: int, estimators: tuple[str, ...] = ESTIMATORS) -> dict[str, list[float]]:
    mu = mu_for(epsilon, DELTA)
    out: dict[str, list[float]] = {name: [] for name in ESTIMATORS}
    for seed in range(seeds):
        rng = np.random.default_rng([int(epsilon * 10), m, seed])
        included = rng.random(m) < 0.5
        scores = rng.normal(size=m) + mu * included
        if "gaussian_scores" in estimators:
            out["gaussian_scores"].append(gaussian_scores_lower_bound(scores, included, delta=DELTA).epsilon / epsilon)
        if "one_run" in estimators:
            out["one_run"].append(one_run_epsilon_lower_bound(scores, included, delta=DELTA).epsilon / epsilon)
        for name, curve in (("one_run_fdp", "epsilon_delta"), ("one_run_gdp", "gaussian"),
                            ("one_run_gdp_profile", "gaussian_profile")):
            if name in estimators:
                bound = one_run_fdp_lower_bound(scores, included, delta=DELTA, curve=curve)
                out[name].append(bound.epsilon / epsilon)
        if "clopper_pearson" in estimators:
            out["clopper_pearson"].append(clopper_pearson_oracle(rng, mu, m, DELTA) / epsilon)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="m = 1000 and 10000 only, 2 seeds")
    parser.add_argument("--estimators", nargs="*", default=list(ESTIMATORS), choices=ESTIMATORS)
    args = parser.parse_args()
    names = tuple(args.estimators)
    canaries = CANARIES[:2] if args.quick else CANARIES
    seeds = 2 if args.quick else args.seeds
    print(f"lower bound / true epsilon at delta = {DELTA}, confidence 0.95: median (min-max) over {seeds} seeds")
    print("| ε | μ | canaries | " + " | ".join(names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for epsilon in EPSILONS:
        for m in canaries:
            start = time.perf_counter()
            cell = one_cell(epsilon, m, seeds, names)
            cols = [f"{np.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" for v in (cell[k] for k in names)]
            if "gaussian_scores" in names:
                above = sum(v > 1.0 for v in cell["gaussian_scores"])
                cols[names.index("gaussian_scores")] += f", {above}/{seeds} above"
            print(f"| {epsilon:g} | {mu_for(epsilon, DELTA):.3f} | {m:,} | " + " | ".join(cols)
                  + f" |  <!-- {time.perf_counter() - start:.1f} s -->", flush=True)


if __name__ == "__main__":
    main()

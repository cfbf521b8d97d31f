"""What does private training cost on the bundled us_employment data? (runs in seconds, no torch needed)

The geometry is that of the embedded default dataset as `StructuredSubsamplingDataModule("us_employment",
prediction_length=12)` splits it: 148 monthly series, the shortest with 225 observed months, the last 12 held
out for test, leaving L = 213 training months. A model reads 36 months of context and forecasts 12; a batch
has 32 windows. We protect any single month of any series (1-event level) at delta = 1e-7.

    python examples/privacy_accounting.py
"""

from __future__ import annotations

from lightning_dpts.privacy import (
    NeighbouringRelation,
    SamplingSpec,
    StructuredSubsamplingAccountant,
    calibrate_noise_multiplier,
)

DELTA = 1e-7
SIGMA = 4.0
STEPS = (4, 100, 1000)  # 4 steps = one epoch at N=148, Lambda=32


def geometry(**kw) -> SamplingSpec:
    base = dict(num_series=148, min_length=213, context_length=36, prediction_length=12, batch_size=32)
    return SamplingSpec(**{**base, **kw})


def row(label: str, acc: StructuredSubsamplingAccountant) -> None:
    eps = "".join(f"{acc.epsilon(s, DELTA):>10.3f}" for s in STEPS)
    print(f"{label:46} {acc.theorem:24} {acc.kind:6} {eps}")


def main() -> None:
    spec = geometry()
    print(f"us_employment geometry: N={spec.num_series}, L={spec.min_length}, L_C={spec.context_length}, "
          f"L_F={spec.prediction_length}, Lambda={spec.batch_size}; rho={spec.top_level_rate:.3f}, "
          f"r={spec.bottom_level_rate:.3f}, {spec.steps_per_epoch} steps/epoch")
    print(f"noise multiplier sigma={SIGMA}, delta={DELTA:g}\n")
    print(f"{'configuration':46} {'bound':24} {'kind':6}" + "".join(f"{'eps@' + str(s):>10}" for s in STEPS))
    row("without replacement / with replacement, l=1", StructuredSubsamplingAccountant(spec, SIGMA))
    row("iteration (per epoch) / with replacement, l=1",
        StructuredSubsamplingAccountant(geometry(top_level="iteration"), SIGMA))
    row("without replacement / Poisson, l=1",
        StructuredSubsamplingAccountant(geometry(bottom_level="poisson"), SIGMA))
    row("without replacement / with replacement, l=4",
        StructuredSubsamplingAccountant(geometry(instances_per_series=4), SIGMA))
    row("  same, optimistic lower bound",
        StructuredSubsamplingAccountant(geometry(instances_per_series=4), SIGMA, bound="lower"))
    augmented = geometry(relation=NeighbouringRelation(value_bound=1.0), context_noise=0.5, forecast_noise=0.5)
    row("+ context/forecast noise 0.5 v (Eq. 1)", StructuredSubsamplingAccountant(augmented, SIGMA))
    row("3-event level (3 consecutive months)",
        StructuredSubsamplingAccountant(geometry(relation=NeighbouringRelation(size=3)), SIGMA))
    print()
    row("naive DP-SGD over all windows: what it claims", StructuredSubsamplingAccountant(spec, SIGMA, naive=True))
    row("naive DP-SGD over all windows: its true leak >=",
        StructuredSubsamplingAccountant(spec, SIGMA, naive=True, bound="lower"))
    print()
    acc = StructuredSubsamplingAccountant(spec, SIGMA)
    print(f"steps within (epsilon=1, delta={DELTA:g}) at sigma={SIGMA}: {acc.max_steps(1.0, DELTA)}")
    sigma = calibrate_noise_multiplier(spec, 1.0, DELTA, steps=1000)
    print(f"noise multiplier for epsilon=1 in 1000 steps: {sigma:.3f}")


if __name__ == "__main__":
    main()

"""Account a plain (non-Lightning) DP-SGD loop with dp_accounting: our mechanism as a DpEvent, composed with others.

The loop is numpy: a linear forecaster (24 scaled past months -> 12 future months) trained with DP-SGD on the
bundled us_employment data. Its batches come from ``StructuredSubsamplingDataModule``'s sampler (bi-level
structured subsampling with secret OS randomness), each window's gradient is clipped to C, Gaussian noise of std
sigma C is added to the sum. Nothing here is specific to Lightning: the same accounting serves a JAX or a
hand-written loop.

* Every optimizer step composes one ``StructuredSubsamplingDpEvent`` (its unit is one step for this top level) into
  ``StructuredPLDAccountant``, dp_accounting's ``PLDAccountant`` extended to the structured mechanism.
* After training, a noisy sum of every series' clipped last value is released: a ``GaussianDpEvent`` composed
  into the same accountant (substitution relation, REPLACE_ONE), so one epsilon covers both.

    python examples/dp_accounting_event.py [--epochs 25]

The last line printed is JSON (read by tests/privacy/test_events.py).
"""

from __future__ import annotations

import argparse
import json
import warnings

import numpy as np
from dp_accounting import GaussianDpEvent

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.privacy import (
    StructuredPLDAccountant,
    StructuredSubsamplingAccountant,
    StructuredSubsamplingDpEvent,
)

DELTA = 1e-7
SIGMA = 4.0  # noise multiplier of the training steps
CLIP = 1.0  # C, per-window gradient norm
LEARNING_RATE = 0.5
RELEASE_SIGMA = 20.0  # noise multiplier of the released sum (in units of the clipping bound B)
RELEASE_BOUND = 1e4  # B: every last value is clipped to [-B, B]


def per_window_gradients(weights: np.ndarray, past: np.ndarray, future: np.ndarray) -> np.ndarray:
    """Gradients of the mean absolute error of a linear forecast on windows scaled by their own past mean (no
    statistic across windows: each gradient depends on its window alone). (B, 25, 12)."""
    scale = np.maximum(np.abs(past).mean(axis=1, keepdims=True), 1.0)
    x = np.concatenate([past / scale, np.ones((past.shape[0], 1))], axis=1)  # (B, 25), with a bias input
    error = x @ weights - future / scale  # (B, 12)
    return x[:, :, None] * (np.sign(error)[:, None, :] / error.shape[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25)
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the data module's notices (delta vs 1/N is checked below)
        dm = StructuredSubsamplingDataModule("us_employment", context_length=24, prediction_length=12,
                                             batch_size=32, test_windows=1)
    spec = dm.sampling_spec
    event = StructuredSubsamplingDpEvent.from_spec(spec, noise_multiplier=SIGMA)
    accountant = StructuredPLDAccountant()  # NeighboringRelation.REPLACE_ONE: substitution of the protected unit
    rng = np.random.default_rng()  # noise from fresh OS entropy, never seeded, never written
    weights = np.zeros((25, 12))
    steps = 0
    for _ in range(args.epochs):
        for batch in dm.train_dataloader():  # every pass samples afresh with the data module's secret entropy
            grads = per_window_gradients(weights, batch["past_target"].numpy().astype(float),
                                         batch["future_target"].numpy().astype(float))
            norms = np.sqrt((grads ** 2).sum(axis=(1, 2)))
            clipped = grads * np.minimum(1.0, CLIP / np.maximum(norms, 1e-12))[:, None, None]
            noisy = clipped.sum(axis=0) + rng.normal(0.0, SIGMA * CLIP, size=weights.shape)
            weights -= LEARNING_RATE * noisy / spec.batch_size
            accountant.compose(event)  # one optimizer step = one unit of this spec (event.unit == "step")
            steps += 1
    training = accountant.get_epsilon(DELTA)
    package = StructuredSubsamplingAccountant(spec, SIGMA).epsilon(steps, DELTA)

    # a second release about the same data: the noisy sum of every series' clipped last training value; one event
    # changes one value, so the sum moves by at most 2B (dp_accounting's REPLACE_ONE convention, norm bound B)
    last = np.array([t[n - 1] for t, n in zip(dm.collection.targets, dm.train_lengths, strict=True)], dtype=float)
    released = np.clip(last, -RELEASE_BOUND, RELEASE_BOUND).sum() + rng.normal(0.0, RELEASE_SIGMA * RELEASE_BOUND)
    accountant.compose(GaussianDpEvent(noise_multiplier=RELEASE_SIGMA))
    total = accountant.get_epsilon(DELTA)

    print(f"{steps} DP-SGD steps on {spec.num_series} series (sigma={SIGMA}, C={CLIP}), delta={DELTA:g}")
    print(f"  epsilon of the training, StructuredPLDAccountant:         {training:.6f}")
    print(f"  epsilon of the training, StructuredSubsamplingAccountant: {package:.6f}")
    print(f"  epsilon of training + the released sum ({released:.4g}):     {total:.6f}")
    print(json.dumps({"steps": steps, "epsilon_event": training, "epsilon_package": package,
                      "epsilon_with_release": total}))


if __name__ == "__main__":
    main()

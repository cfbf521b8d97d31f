"""Account a plain PyTorch + Opacus training loop with the structured accountant: ``PrivacyEngine(accountant=
"structured")``.

Opacus' ``step(noise_multiplier, sample_rate)`` describes an unstructured Poisson-sampled Gaussian; bi-level
structured subsampling (series, then windows) needs the sampling spec, so the script tells Opacus' registry the
spec first (``register_structured_accountant(dm.sampling_spec)``). Then Opacus does what it always does: per-window
gradients (``GradSampleModule``), clipping to ``max_grad_norm``, Gaussian noise, and one accountant step per
optimizer step. The batches are the data module's (structured subsampling with secret OS randomness):
``poisson_sampling=False`` keeps Opacus from replacing them with its Poisson loader, which would sample windows,
not series. The noise multiplier comes from Opacus' own ``make_private_with_epsilon``, whose calibration creates
accountants by name and so uses ours.

    python examples/opacus_structured.py [--epochs 25] [--epsilon 1.0]

The last line printed is JSON (read by tests/training/test_opacus_accountant.py).
"""

from __future__ import annotations

import argparse
import json
import warnings

import torch
from opacus import PrivacyEngine

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.privacy import StructuredSubsamplingAccountant
from lightning_dpts.randomness import Entropy, torch_generator
from lightning_dpts.training import register_structured_accountant

DELTA = 1e-7
CLIP = 1.0


class ScaledLinear(torch.nn.Module):
    """A linear forecast of the next 12 months from the last 24, on windows scaled by their own past mean (no
    statistic across windows: Opacus' per-window gradients are then each window's alone)."""

    def __init__(self, context: int, horizon: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(context, horizon)

    def forward(self, past: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scale = past.abs().mean(dim=1, keepdim=True).clamp_min(1.0)
        return self.linear(past / scale), scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the data module's and Opacus' notices
        dm = StructuredSubsamplingDataModule("us_employment", context_length=24, prediction_length=12,
                                             batch_size=32, test_windows=1)
        register_structured_accountant(dm.sampling_spec)  # what Opacus' step() cannot tell the accountant
        engine = PrivacyEngine(accountant="structured")
        model = ScaledLinear(24, 12)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5 / dm.batch_size)  # loss is a sum over windows
        model, optimizer, loader = engine.make_private_with_epsilon(
            module=model, optimizer=optimizer, data_loader=dm.train_dataloader(), target_epsilon=args.epsilon,
            target_delta=DELTA, epochs=args.epochs, max_grad_norm=CLIP, poisson_sampling=False,
            loss_reduction="sum", noise_generator=torch_generator(Entropy.fresh(), 0))  # noise: fresh OS entropy
        for _ in range(args.epochs):
            for batch in loader:  # each pass is a fresh structured sample (the data module's secret entropy)
                forecast, scale = model(batch["past_target"])
                loss = (forecast - batch["future_target"] / scale).abs().mean(dim=1).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()  # clip per window, add noise, and (Opacus' hook) accountant.step(...)
    sigma = optimizer.noise_multiplier
    steps = len(engine.accountant)
    spent = engine.get_epsilon(DELTA)
    package = StructuredSubsamplingAccountant(dm.sampling_spec, sigma).epsilon(steps, DELTA)
    risk = engine.accountant.risk(DELTA)
    print(f"{steps} Opacus DP-SGD steps, noise multiplier {sigma:.4f} (Opacus' calibration for epsilon "
          f"{args.epsilon:g} with our accountant), delta={DELTA:g}")
    print(f"  PrivacyEngine.get_epsilon:                {spent:.6f}")
    print(f"  StructuredSubsamplingAccountant.epsilon:  {package:.6f}")
    print(f"  for one month of one series: {risk}")
    print(json.dumps({"steps": steps, "noise_multiplier": sigma, "epsilon_opacus": spent, "epsilon_package": package,
                      "risk": risk.to_dict()}))


if __name__ == "__main__":
    main()

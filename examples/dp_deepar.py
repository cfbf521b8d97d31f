"""Differentially private DeepAR on the bundled data with the three lightning-dpts components.

Your model and Trainer stay as they are; you add a datamodule and two callbacks:

* ``StructuredSubsamplingDataModule`` samples series, then one window per series (the scheme the theorems
  analyse) and reads the window geometry -- context plus every DeepAR lag -- from the model;
* ``DPForecastStrategy`` clips every window's gradient and adds calibrated Gaussian noise (here the noise
  multiplier is calibrated for (epsilon, delta) in a planned number of epochs);
* ``AccountantCallback`` logs epsilon at every step and stops before the budget is exceeded.

Run: ``python examples/dp_deepar.py`` (a couple of minutes on 2 CPU cores).
"""

from __future__ import annotations

import lightning as L
import numpy as np
import torch
from gluonts.torch.model.deepar import DeepAREstimator
from lightning.pytorch.loggers import CSVLogger

from lightning_dpts.data import StructuredSubsamplingDataModule
from lightning_dpts.metrics import DEFAULT_QUANTILES, WeightedQuantileLoss
from lightning_dpts.training import AccountantCallback, DPForecastStrategy

EPSILON, DELTA, EPOCHS = 1.0, 1e-7, 40


def main() -> None:
    # No seeds: sampling, noise and initialisation come from secret OS entropy (the guarantee assumes they are
    # secret). Pass seed=... to the datamodule and the strategy only for reproducible experiments.
    estimator = DeepAREstimator(freq="M", prediction_length=12, context_length=12, num_layers=2, hidden_size=40,
                                dropout_rate=0.0, lr=5e-3)
    module = estimator.create_lightning_module()  # an unchanged GluonTS LightningModule

    dm = StructuredSubsamplingDataModule("us_employment", batch_size=64, model=module)
    print(dm.describe())

    accountant = AccountantCallback(epsilon=EPSILON, delta=DELTA)
    trainer = L.Trainer(
        max_epochs=EPOCHS,
        accelerator="cpu",
        logger=CSVLogger("runs", name="dp_deepar"),  # "epsilon" appears in every logger and the progress bar
        enable_checkpointing=False,
        callbacks=[
            DPForecastStrategy(max_grad_norm=1.0, target_epsilon=EPSILON, target_delta=DELTA, epochs=EPOCHS),
            accountant,
        ],
    )
    trainer.fit(module, datamodule=dm)
    print(accountant.report)

    # Forecast the held-out last 12 months of every series with GluonTS's own predictor and score them.
    predictor = estimator.create_predictor(estimator.create_transformation(), module)
    pairs = dm.gluonts_test_pairs("test")
    metric = WeightedQuantileLoss()
    for forecast, (_, label) in zip(predictor.predict([entry for entry, _ in pairs]), pairs, strict=True):
        quantiles = np.stack([forecast.quantile(q) for q in DEFAULT_QUANTILES], axis=-1)
        metric.update(torch.from_numpy(quantiles)[None], torch.from_numpy(np.asarray(label["target"]))[None])
    print(f"test CRPS (mean weighted quantile loss) of the private DeepAR: {float(metric.compute()):.4f}")


if __name__ == "__main__":
    main()

"""Train GluonTS's DeepAR LightningModule a few steps on the bundled data with structured subsampling.

No differential privacy yet: this shows the data layer alone. The datamodule reads DeepAR's geometry
(context_length + max(lags_seq)) from the module, builds the same time/age/static features as
``DeepAREstimator`` and prints the sampling description the privacy accountant consumes.

Run: ``python examples/datamodule_deepar.py``
"""

from __future__ import annotations

import lightning as L
from gluonts.torch.model.deepar import DeepAREstimator

from lightning_dpts.data import StructuredSubsamplingDataModule


def main() -> None:
    # The estimator is only used to build a LightningModule with GluonTS's defaults for monthly data.
    estimator = DeepAREstimator(freq="M", prediction_length=12, context_length=24, hidden_size=16, num_layers=1)
    module = estimator.create_lightning_module()

    dm = StructuredSubsamplingDataModule(
        "us_employment",  # 148 monthly series bundled with the package
        batch_size=32,
        instances_per_series=1,
        top_level="without_replacement",
        bottom_level="with_replacement",
        model=module,  # context_length, prediction_length and past_length come from the model
        # seed=None (default): secret OS entropy; an explicit seed is for experiments (the guarantee then does
        # not hold against anyone who knows it)
    )
    print(dm.describe())
    print(dm.sampling_spec)

    trainer = L.Trainer(max_steps=20, accelerator="cpu", logger=False, enable_checkpointing=False)
    trainer.fit(module, datamodule=dm)
    print(f"trained {trainer.global_step} steps; test windows to score: {len(dm.evaluation_windows('test'))}")


if __name__ == "__main__":
    main()

"""Differentially private training from a LightningCLI YAML file: ``python examples/lightning_cli.py fit --config
examples/lightning_cli.yaml``.

The YAML (``examples/lightning_cli.yaml``) names the model,
:class:`~lightning_dpts.data.StructuredSubsamplingDataModule`
and the two callbacks, :class:`~lightning_dpts.training.DPForecastStrategy` and
:class:`~lightning_dpts.training.AccountantCallback`, with their arguments. The one line of Python below links the
model to the datamodule (``data.model``), so the datamodule reads the model's window (context plus lags) and
batch fields, as it does when you pass ``model=`` yourself. Any YAML value can be overridden on the command line,
e.g. ``--trainer.max_epochs 4`` (then also ``--trainer.callbacks.epochs``; see docs/lightning-cli.md).

It writes only under ``--trainer.default_root_dir DIR`` (default: a new temporary directory, whose path it
prints): the checkpoint and LightningCLI's ``config.yaml``, which a second run into the same directory replaces.
"""

from __future__ import annotations

import sys
import tempfile

from lightning.pytorch.cli import LightningCLI

from lightning_dpts.data import StructuredSubsamplingDataModule


class PrivateCLI(LightningCLI):
    """LightningCLI whose datamodule gets the instantiated model (``data.model``)."""

    def add_arguments_to_parser(self, parser) -> None:  # noqa: ANN001 (jsonargparse's LightningArgumentParser)
        parser.link_arguments("model", "data.model", apply_on="instantiate")


def main() -> None:
    if not any(arg.startswith("--trainer.default_root_dir") for arg in sys.argv[1:]):
        run_dir = tempfile.mkdtemp(prefix="dpts-lightning-cli-")
        sys.argv += ["--trainer.default_root_dir", run_dir]
        print(f"run directory: {run_dir}")
    # overwrite: a second run into the same directory replaces the config.yaml LightningCLI saves there
    PrivateCLI(datamodule_class=StructuredSubsamplingDataModule,  # the model class comes from the YAML
               save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()

"""DP training for Lightning: :class:`DPForecastStrategy` (Algorithm 2) and :class:`AccountantCallback`.

* :class:`DPForecastStrategy` - per-window clipping + Gaussian noise for an unchanged LightningModule.
* :class:`AccountantCallback` - logs epsilon every step and stops training within the privacy budget.
* :class:`HeldOutEvaluation` - at the end of a fit, scores the model on held-out windows next to seasonal naive
  (private numbers, for the data owner).
* :func:`make_private_compatible` - the layer surgery (LSTM/GRU/RNN, multi-head attention) behind the strategy.
* :class:`PrivacyLedger` - the noisy steps a model took, carried by the module and every checkpoint.
* :class:`PerWindowClipper` - per-window norms and clipped sums (ghost norms for linear layers, Opacus otherwise).
* :class:`StructuredOpacusAccountant` - the structured accountant for Opacus (``PrivacyEngine(accountant="structured")``
  after :func:`register_structured_accountant`).
"""

from lightning_dpts.training.accountant_callback import AccountantCallback
from lightning_dpts.training.correlated_noise import (
    BandMFNoise,
    banded_sqrt_coefficients,
    make_noise,
    optimize_coefficients,
)
from lightning_dpts.training.engine import NonFiniteGradientError, PerWindowClipper
from lightning_dpts.training.held_out import HeldOutEvaluation
from lightning_dpts.training.ledger import PrivacyLedger, attach_ledger, install_load_hook, ledger_of, read_ledger
from lightning_dpts.training.opacus_accountant import StructuredOpacusAccountant, register_structured_accountant
from lightning_dpts.training.strategy import DPForecastStrategy, PrivacyBudgetExhausted, clip_and_noise
from lightning_dpts.training.surgery import (
    DPCompatibleMultiheadAttention,
    DPFastLSTM,
    Surgery,
    check_per_window_layers,
    make_private_compatible,
)

__all__ = [
    "AccountantCallback",
    "BandMFNoise",
    "DPCompatibleMultiheadAttention",
    "DPFastLSTM",
    "DPForecastStrategy",
    "HeldOutEvaluation",
    "NonFiniteGradientError",
    "PerWindowClipper",
    "PrivacyBudgetExhausted",
    "PrivacyLedger",
    "StructuredOpacusAccountant",
    "Surgery",
    "attach_ledger",
    "banded_sqrt_coefficients",
    "check_per_window_layers",
    "clip_and_noise",
    "ledger_of",
    "make_noise",
    "make_private_compatible",
    "optimize_coefficients",
    "read_ledger",
    "register_structured_accountant",
]

install_load_hook()  # load_from_checkpoint attaches a checkpoint's privacy ledger to the loaded module

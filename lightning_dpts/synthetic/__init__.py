"""DP synthetic time series by Private Evolution (PETS, Luo et al.): generator, VAE variation, contrastive
encoders, DP nearest-neighbour voting, Context-FID, TSTR and the ``dpts synth`` job.

Only the noisy vote histogram (Algorithm 2) touches private data; the models are trained on public data. See
``docs/synthetic.md``.
"""

from lightning_dpts.synthetic.evolution import (
    EvolutionResult,
    PrivateWindows,
    dp_nn_histogram,
    private_evolution,
    private_windows,
    vote_histogram,
)
from lightning_dpts.synthetic.generator import generate_series, standardize_windows
from lightning_dpts.synthetic.job import SynthConfig, run_synth, tstr_scores
from lightning_dpts.synthetic.metrics import ContextFID, frechet_distance
from lightning_dpts.synthetic.models import ContrastiveEncoder, VariationVAE, variation_schedule
from lightning_dpts.synthetic.pretrain import PretrainConfig, PublicModels, pretrain_public_models
from lightning_dpts.synthetic.privacy import (
    PETSAccountant,
    calibrate_pets_noise,
    gaussian_mechanism_profile,
    sensitivity,
    theorem_2_delta,
    theorem_2_epsilon,
)

__all__ = [
    "ContextFID",
    "ContrastiveEncoder",
    "EvolutionResult",
    "PETSAccountant",
    "PretrainConfig",
    "PrivateWindows",
    "PublicModels",
    "SynthConfig",
    "VariationVAE",
    "calibrate_pets_noise",
    "dp_nn_histogram",
    "frechet_distance",
    "gaussian_mechanism_profile",
    "generate_series",
    "pretrain_public_models",
    "private_evolution",
    "private_windows",
    "run_synth",
    "sensitivity",
    "standardize_windows",
    "theorem_2_delta",
    "theorem_2_epsilon",
    "tstr_scores",
    "variation_schedule",
    "vote_histogram",
]

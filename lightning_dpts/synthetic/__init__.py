"""DP synthetic time series by Private Evolution (PETS, Luo et al.): generator, VAE variation, contrastive
encoders, DP nearest-neighbour voting and Context-FID. The ``dpts synth`` job is
:func:`lightning_dpts.app.jobs.synth.run_synth`; its configuration and TSTR scoring are in
:mod:`lightning_dpts.app.synth_pipeline`.

Only the noisy vote histogram (Algorithm 2) touches private data; the models are trained on public data. See
``docs/synthetic.md``. Names are imported lazily, so ``dpts`` builds its parser without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ContextFID": "metrics",
    "ContrastiveEncoder": "models",
    "EvolutionResult": "evolution",
    "PETSAccountant": "privacy",
    "PretrainConfig": "pretrain",
    "PrivateWindows": "evolution",
    "PublicModels": "pretrain",
    "VariationVAE": "models",
    "calibrate_pets_noise": "privacy",
    "dp_nn_histogram": "evolution",
    "frechet_distance": "metrics",
    "gaussian_mechanism_profile": "privacy",
    "generate_series": "generator",
    "pretrain_public_models": "pretrain",
    "private_evolution": "evolution",
    "private_windows": "evolution",
    "sensitivity": "privacy",
    "standardize_windows": "generator",
    "theorem_2_delta": "privacy",
    "theorem_2_epsilon": "privacy",
    "variation_schedule": "models",
    "vote_histogram": "evolution",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_dpts.synthetic' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lightning_dpts.synthetic.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

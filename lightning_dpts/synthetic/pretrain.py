"""Public pretraining of the PETS models (VAE, selection encoder, evaluation encoder), cached on disk.

Nothing here reads private data. The training set is the rule-based generator's output by default (public by
construction) or windows of a dataset the *user declares public*. The randomness of pretraining is public too:
it is a fixed function of :data:`PUBLIC_PRETRAIN_SEED` and has nothing to do with the secret vote noise, which
only :mod:`lightning_dpts.randomness` draws. Weights are cached as ``pretrained-<key>.pt`` in the output
directory (the key hashes everything that determines them) and reused by later runs with the same settings.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.synthetic.generator import generate_series, standardize_windows
from lightning_dpts.synthetic.models import ContrastiveEncoder, VariationVAE

__all__ = ["PUBLIC_PRETRAIN_SEED", "PretrainConfig", "PublicModels", "pretrain_public_models"]

#: Seed of the *public* pretraining randomness (generator output, initialisation, minibatches). Publishing it
#: reveals nothing about private data: the models never see any.
PUBLIC_PRETRAIN_SEED = 20240607


@dataclass(frozen=True)
class PretrainConfig:
    """Sizes of the public models and of their training (defaults sized for 2 CPU cores).

    Attributes:
        num_public: public windows generated when no public data is given.
        vae_epochs, encoder_epochs: passes over the public windows.
        batch_size: windows per minibatch.
        latent_dim, vae_channels: VAE size; encoder_hidden, encoder_depth, embedding_dim: encoder size.
    """

    num_public: int = 2048
    vae_epochs: int = 12
    encoder_epochs: int = 6
    batch_size: int = 64
    latent_dim: int = 16
    vae_channels: int = 32
    encoder_hidden: int = 32
    encoder_depth: int = 3
    embedding_dim: int = 32

    def validate(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(name, value, "must be an integer >= 1")


@dataclass
class PublicModels:
    """The three public models PETS uses: VAE (variation), selection encoder (votes), evaluation encoder."""

    vae: VariationVAE
    select_encoder: ContrastiveEncoder
    eval_encoder: ContrastiveEncoder
    source: str
    cache_file: Path | None
    reused: bool


def _train(module: Any, windows: np.ndarray, epochs: int, batch_size: int, progress: bool, seed: int) -> None:
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        loader = DataLoader(TensorDataset(torch.as_tensor(windows, dtype=torch.float32)), batch_size=batch_size,
                            shuffle=True, drop_last=len(windows) > batch_size)
        trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                            enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=progress)
        trainer.fit(module, train_dataloaders=loader)
    module.eval()


def check_public_windows(public_windows: Any, length: int) -> np.ndarray:
    """``public_windows`` as a float array, or :class:`ConfigurationError` (``public_data``) unless it holds at
    least 2 finite windows of ``length`` steps."""
    windows = np.asarray(public_windows, dtype=np.float64)
    if windows.ndim != 2 or windows.shape[1] != length or len(windows) < 2:
        raise ConfigurationError("public_data", f"windows of shape {windows.shape}",
                                 f"must give at least 2 windows of length {length}")
    if not np.isfinite(windows).all():
        raise ConfigurationError("public_data", "windows with missing values", "must be finite")
    return windows


def pretrain_public_models(
    length: int,
    cache_dir: str | Path | None,
    *,
    public_windows: np.ndarray | None = None,
    public_name: str = "rule-based generator (PETS Eq. 2)",
    config: PretrainConfig | None = None,
    progress: bool = True,
    log: Any = print,
    before_write: Any = None,
) -> PublicModels:
    """Train (or load from ``cache_dir``) the VAE and the two encoders on public windows of ``length`` steps.

    Args:
        length: window length T.
        cache_dir: directory for ``pretrained-<key>.pt``; ``None`` disables caching.
        public_windows: ``[n, length]`` windows declared public (z-scored per window here); ``None`` uses the
            rule-based generator's output.
        public_name: how the report names the public source.
        config: model and training sizes.
        progress: show Lightning's progress bars.
        log: where one-line status messages go.
        before_write: called with the cache file's path before it is written (an output directory's journal);
            the file itself is written atomically.
    """
    config = config or PretrainConfig()
    config.validate()
    if public_windows is None:
        rng = np.random.default_rng(PUBLIC_PRETRAIN_SEED)
        windows_vae = generate_series(config.num_public, length, rng)
        windows_enc = generate_series(config.num_public, length, rng)
        windows_eval = generate_series(config.num_public, length, rng)  # independent public draws
        digest = "generator"
    else:
        public_windows = check_public_windows(public_windows, length)
        windows_vae = windows_enc = standardize_windows(public_windows)
        half = len(windows_vae) // 2
        windows_eval = windows_vae[half:] if half >= 2 else windows_vae
        windows_enc = windows_vae[:half] if half >= 2 else windows_vae
        digest = hashlib.sha256(np.ascontiguousarray(public_windows).tobytes()).hexdigest()[:16]
    meta = {"length": length, "public": digest, "config": asdict(config), "format": 1}
    key = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:12]

    vae = VariationVAE(length, latent_dim=config.latent_dim, channels=config.vae_channels)
    enc_kwargs = {"hidden": config.encoder_hidden, "depth": config.encoder_depth, "output_dim": config.embedding_dim}
    select_encoder = ContrastiveEncoder(**enc_kwargs)
    eval_encoder = ContrastiveEncoder(**enc_kwargs)
    cache_file = None if cache_dir is None else Path(cache_dir) / f"pretrained-{key}.pt"
    if cache_file is not None and cache_file.is_file():
        state = torch.load(cache_file, map_location="cpu", weights_only=True)
        vae.load_state_dict(state["vae"])
        select_encoder.load_state_dict(state["select_encoder"])
        eval_encoder.load_state_dict(state["eval_encoder"])
        for module in (vae, select_encoder, eval_encoder):
            module.eval()
        log(f"public models: reusing {cache_file}")
        return PublicModels(vae, select_encoder, eval_encoder, public_name, cache_file, True)

    log(f"public pretraining on {public_name}: VAE ({config.vae_epochs} epochs) ...")
    _train(vae, windows_vae, config.vae_epochs, config.batch_size, progress, PUBLIC_PRETRAIN_SEED + 1)
    log(f"public pretraining: selection encoder ({config.encoder_epochs} epochs) ...")
    _train(select_encoder, windows_enc, config.encoder_epochs, config.batch_size, progress, PUBLIC_PRETRAIN_SEED + 2)
    log(f"public pretraining: evaluation encoder, trained separately ({config.encoder_epochs} epochs) ...")
    _train(eval_encoder, windows_eval, config.encoder_epochs, config.batch_size, progress, PUBLIC_PRETRAIN_SEED + 3)
    if cache_file is not None:
        from lightning_dpts.outputs import atomic_path

        if before_write is not None:
            before_write(cache_file)
        with atomic_path(cache_file) as tmp:  # a failure leaves no truncated cache to be reused
            torch.save({"vae": vae.state_dict(), "select_encoder": select_encoder.state_dict(),
                        "eval_encoder": eval_encoder.state_dict(), "meta": meta}, tmp)
    return PublicModels(vae, select_encoder, eval_encoder, public_name, cache_file, False)

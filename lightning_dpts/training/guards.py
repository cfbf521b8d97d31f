"""Run-time guards of :class:`~lightning_dpts.training.DPForecastStrategy`: settings and changes during a fit
that would break the guarantee are refused with a :class:`~lightning_dpts.errors.ConfigurationError`.

At ``setup``: the Trainer's settings (:func:`check_trainer`: the tuner's finders, ``gradient_clip_val``,
accumulation, precision), where the loggers write (:func:`say_where_logs_go`) and, on several processes, the
distributed settings (:func:`check_distributed`); at ``on_fit_start``: layers created after ``setup``
(:func:`check_layers_after_setup`), the optimizer's parameters (:func:`check_optimizer`), data-dependent
learning-rate schedulers (:func:`check_schedulers`), callbacks that stop or choose checkpoints on metrics computed
without noise (:func:`check_monitors`), DDP's own gradient averaging switched off (:func:`detach_ddp_averaging`); at
every noisy step: the trainable set (:func:`check_trainable`). The one-batch-per-step (accumulation) check is the
strategy's, as it counts batches.
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.mechanisms import NoiseSpec
from lightning_dpts.privacy.spec import SamplingSpec
from lightning_dpts.training.roles import StepAccountant

__all__ = [
    "check_accountant", "check_distributed", "check_global_sample", "check_layers_after_setup", "check_monitors",
    "check_noise_spec", "check_optimizer", "check_optimizer_params", "check_same_on_all_ranks", "check_schedulers",
    "check_trainable", "check_trainer", "detach_ddp_averaging", "has_accountant", "released_metrics",
    "say_where_logs_go", "spec_or_none",
]


def spec_or_none(trainer: L.Trainer) -> SamplingSpec | None:
    """The datamodule's ``sampling_spec`` (``None`` without one; anything else than a SamplingSpec is refused)."""
    dm = getattr(trainer, "datamodule", None)
    spec = getattr(dm, "sampling_spec", None) if dm is not None else None
    if spec is not None and not isinstance(spec, SamplingSpec):
        raise ConfigurationError("datamodule.sampling_spec", type(spec).__name__, "must be a SamplingSpec")
    return spec


def check_trainer(trainer: L.Trainer) -> None:
    """Trainer settings refused at ``setup``: the tuner's finders, ``gradient_clip_val``, gradient accumulation,
    mixed precision."""
    from lightning.pytorch.callbacks import BatchSizeFinder, LearningRateFinder

    for cb in trainer.callbacks:
        if isinstance(cb, (LearningRateFinder, BatchSizeFinder)):
            raise ConfigurationError(
                "callbacks", type(cb).__name__,
                "must not be used with DPForecastStrategy (Tuner.lr_find / Tuner.scale_batch_size add it): its "
                "trial steps run with every other callback removed, so they train on the private data without "
                "per-window clipping or noise and are not accounted, and it then restores a checkpoint that "
                "rewinds the privacy ledger; the learning rate it suggests is chosen from those noiseless "
                "training losses (docs/privacy.md, rule 5). Tune on public or synthetic data without "
                "DPForecastStrategy, then pass the values to the DP fit",
            )
    if trainer.gradient_clip_val not in (None, 0, 0.0):
        raise ConfigurationError(
            "gradient_clip_val", trainer.gradient_clip_val,
            "must be None: DPForecastStrategy clips each window's gradient to max_grad_norm; clipping the "
            "noisy average again is not what Algorithm 2 does",
        )
    if trainer.accumulate_grad_batches != 1:
        raise ConfigurationError(
            "accumulate_grad_batches", trainer.accumulate_grad_batches,
            "must be 1: raise the datamodule's batch_size instead (noise is added once per optimizer step and "
            "the accountant counts optimizer steps of one sampled batch)",
        )
    if str(trainer.precision) not in ("32-true", "64-true", "32", "64"):
        raise ConfigurationError(
            "precision", trainer.precision, "must be '32-true' or '64-true' (loss scaling interferes with clipping)"
        )


def check_same_on_all_ranks(trainer: L.Trainer, ledger: dict[str, Any]) -> None:
    """Refuse a fit whose ranks start from different privacy ledgers (every rank reaches the same verdict)."""
    reference = trainer.strategy.broadcast(ledger, src=0)
    if not trainer.strategy.reduce_boolean_decision(reference == ledger, all=True):
        raise ConfigurationError(
            "ledger", ledger,
            f"the ranks start from different privacy ledgers (rank 0: {reference}); every rank must continue the "
            "same model (the same checkpoint, or the same weights with the same attached ledger)",
        )


def released_metrics(trainer: L.Trainer) -> set[str]:
    """Names of the metrics a DP fit releases with its guarantee: what the accountant logs (epsilon after every step,
    the spent epsilon and the step count at the end), functions of the step count and public settings only."""
    from lightning_dpts.privacy.montecarlo import MonteCarloAccountant

    names = {"privacy_steps", MonteCarloAccountant.log_name}
    for cb in trainer.callbacks:
        if isinstance(cb, StepAccountant):
            name = str(getattr(cb, "log_name", "epsilon"))
            names |= {name, f"{name}_spent"}
    return names


def check_monitors(trainer: L.Trainer) -> list[Any]:
    """Refuse, before the fit's first step, a callback that stops training or chooses a checkpoint by a metric computed
    on private data without noise; returns the callbacks that monitor a released metric (their state is then a
    function of released values).

    Any callback with a ``monitor`` (Lightning's ``EarlyStopping``, ``ModelCheckpoint`` and those following their
    convention) other than a metric the fit releases (:func:`released_metrics`): ``EarlyStopping(monitor=
    "train_loss")`` publishes a noise-free function of the data in the step count where it stops and checkpoints its
    best score raw; ``ModelCheckpoint(monitor="val_loss")`` chooses the checkpoint on private windows (docs/privacy.md,
    rule 5). ``monitor=None`` and the package's own callbacks are fine.
    """
    released = released_metrics(trainer)
    exempt = []
    for cb in trainer.callbacks:
        monitor = getattr(cb, "monitor", None)
        if monitor is None or type(cb).__module__.split(".")[0] == "lightning_dpts":
            continue
        if monitor in released:
            exempt.append(cb)
            continue
        name = type(cb).__name__
        stops = ("stops training" if "Stopping" in name else "chooses which checkpoints to keep" if "Checkpoint" in name
                 else "acts")
        raise ConfigurationError(
            "callbacks", f"{type(cb).__name__}(monitor={monitor!r})",
            f"{stops} on a metric computed on private data without noise: the step where it stops, the checkpoint "
            "it chooses and the best score it saves are functions of the data that the (epsilon, delta) guarantee "
            "does not cover (docs/privacy.md, rule 5). Use monitor=None (ModelCheckpoint then keeps the last or every "
            "n-th checkpoint), let AccountantCallback stop the fit at the budget or set max_steps/max_epochs, and "
            f"choose among checkpoints on public data after the fit; metrics released with DP here: {sorted(released)}",
        )
    return exempt


def say_where_logs_go(trainer: L.Trainer) -> None:
    """Say where the Trainer's loggers write: what ``training_step`` logs (the training loss) is computed on private
    batches without noise, so those files are private (docs/privacy.md, "What a run writes")."""
    places = []
    for logger in trainer.loggers:
        place = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
        places.append(f"{type(logger).__name__} ({place})" if place else type(logger).__name__)
    if places:
        rank_zero_info(
            f"DPForecastStrategy: {', '.join(places)} will hold what the module logs, e.g. its training loss, "
            "computed on private batches without noise: keep it with the private data, it is not covered by the "
            "(epsilon, delta) guarantee (only 'epsilon' is). Trainer(logger=False) writes no logs"
        )


def check_accountant(trainer: Any, required: bool) -> None:
    """A fit without an :class:`~lightning_dpts.training.AccountantCallback` is refused when one is ``required``
    (``DPForecastStrategy(require_accountant=True)``, the default), at setup, before any step."""
    if required and not has_accountant(trainer):
        raise ConfigurationError(
            "callbacks", "DPForecastStrategy without an AccountantCallback",
            "DP training needs an AccountantCallback(epsilon=..., delta=...) in the same Trainer(callbacks=[...]): "
            "without it no epsilon is computed, logged or enforced and training does not stop at a budget. Add "
            "one with your budget; if you account the steps yourself from strategy.ledger (which counts every "
            "noisy step either way), pass DPForecastStrategy(..., require_accountant=False)",
        )


def has_accountant(trainer: L.Trainer) -> bool:
    """Whether a callback accounts the steps (a :class:`~lightning_dpts.training.roles.StepAccountant`)."""
    return any(isinstance(cb, StepAccountant) for cb in trainer.callbacks)


def check_distributed(trainer: L.Trainer, noise: NoiseSpec, world_size: int) -> None:
    """Settings that DP training on several processes refuses (at ``setup``, before any step)."""
    from lightning.pytorch.strategies import DDPStrategy

    strategy = trainer.strategy
    where = "(DP training on several processes; see docs/distributed.md)"
    if not isinstance(strategy, DDPStrategy):
        raise ConfigurationError(
            "strategy", type(strategy).__name__,
            f"must be Lightning's DDP (strategy='ddp', launched by Lightning, torchrun or SLURM) {where}",
        )
    if getattr(strategy, "_ddp_comm_hook", None) is not None:
        raise ConfigurationError(
            "ddp_comm_hook", strategy._ddp_comm_hook,
            f"must be None: DDP's gradient communication is switched off, the DP step all-reduces the clipped "
            f"sums itself {where}",
        )
    if getattr(strategy, "_ddp_kwargs", {}).get("static_graph"):
        raise ConfigurationError("static_graph", True, f"must be False {where}")
    if getattr(trainer._accelerator_connector, "sync_batchnorm", False):
        raise ConfigurationError(
            "sync_batchnorm", True,
            f"must be False: SyncBatchNorm normalises with statistics of every rank's windows, so one window "
            f"changes every other window's gradient (docs/privacy.md, rule 8) {where}",
        )
    module = getattr(trainer, "lightning_module", None)
    own = [name for name, p in module.named_parameters(recurse=False) if p.requires_grad] if module is not None else []
    if own:  # Lightning's DDP calls the LightningModule itself with the batch (forward redirected to training_step):
        # the per-window hooks on a module owning a parameter would see the batch dict as its input
        raise ConfigurationError(
            "model", f"parameter {own[0]!r} of {type(module).__name__}",
            f"is a bare nn.Parameter of the LightningModule itself, which per-window gradients do not support on "
            f"{world_size} processes (Lightning's DDP calls the LightningModule with the whole batch); move it into "
            f"a small nn.Module whose forward uses it (e.g. class Scale(nn.Module) with forward(x) = x @ "
            f"self.weight), use a supported layer such as nn.Linear, or freeze it {where}",
        )
    if noise.correlated:
        raise ConfigurationError(
            "noise", noise.name,
            f"BandMF is not supported on {world_size} processes yet (its noise band and the b-min-sep "
            f"chain would have to live on rank 0 alone); train it on one process {where}",
        )
    from lightning_dpts.data.datamodule import StructuredSubsamplingDataModule

    dm = getattr(trainer, "datamodule", None)
    if not isinstance(dm, StructuredSubsamplingDataModule):
        raise ConfigurationError(
            "datamodule", type(dm).__name__,
            f"must be a StructuredSubsamplingDataModule: it makes the {world_size} processes' batches "
            f"one global structured sample (other loaders give every rank its own sample or the same one, "
            f"which the accountant does not cover) {where}",
        )
    spec = spec_or_none(trainer)
    if spec is not None and spec.top_level_scheme.needs_monte_carlo:
        raise ConfigurationError(
            "datamodule.sampling_spec", f"top_level={spec.top_level!r}",
            f"is not supported on {world_size} processes yet (its Monte Carlo accountant samples on every "
            f"rank); train it on one process {where}",
        )

def check_global_sample(trainer: L.Trainer, rank: int, world_size: int) -> None:
    """The datamodule's sampler must yield this rank's share of the global batch (its train_dataloader ran)."""
    sampler = trainer.datamodule.sampler
    if (sampler.rank, sampler.world_size) != (rank, world_size):
        raise ConfigurationError(
            "datamodule", f"sampler share {sampler.rank}/{sampler.world_size}",
            f"must be this rank's share {rank}/{world_size} of the global batch: use the "
            "datamodule's own train_dataloader (it broadcasts rank 0's sampling entropy and shards the batch; "
            "docs/distributed.md)",
        )

def detach_ddp_averaging(trainer: L.Trainer) -> Any:
    """Switch off DDP's gradient all-reduce and per-forward buffer broadcast (the DP step communicates); returns
    the ``DistributedDataParallel`` wrapper.

    DDP would average the *unclipped* local gradients (then overwritten: wasted traffic), and its reducer
    and buffer broadcast are collectives inside forward/backward, which a rank with an empty local batch
    skips. Buffers are broadcast once, when DDP wraps the module; a buffer that changes in training would
    differ between ranks (BatchNorm running statistics are refused anyway).
    """
    from torch.nn.parallel import DistributedDataParallel

    model = trainer.strategy.model
    if not isinstance(model, DistributedDataParallel):
        raise ConfigurationError(
            "strategy", type(model).__name__, "Lightning's DDP strategy must wrap the module in "
            "DistributedDataParallel (DP training on several processes; docs/distributed.md)",
        )
    for name, sub in model.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm):
            raise ConfigurationError(
                "model", f"{type(sub).__name__} at '{name}'",
                "batch normalisation (SyncBatchNorm included) mixes windows across the batch and the ranks "
                "(docs/privacy.md, rule 8); use LayerNorm/GroupNorm",
            )
    model.require_backward_grad_sync = False
    model.require_forward_param_sync = False
    return model


def check_noise_spec(spec: SamplingSpec | None, noise: NoiseSpec) -> None:
    """The sampling must be one the guarantee of ``noise`` covers (``noise.compatible_top_level``): BandMF noise is
    accounted only with b-min-sep sampling of the same b (Theorem 5.1's setting) or cyclic Poisson sampling with k >= b
    groups (Theorem B.2); i.i.d. Gaussian noise with any."""
    covered = noise.compatible_top_level(spec.top_level_scheme) if spec is not None else not noise.needs_monte_carlo
    if covered:
        return
    bands = noise.bands
    got = None if spec is None else f"top_level={spec.top_level!r}, bands={spec.bands}"
    raise ConfigurationError(
        "datamodule.sampling_spec", got,
        f"noise={noise.name!r} with bands={bands} needs sampling that separates two participations of a series "
        f"by at least b steps: StructuredSubsamplingDataModule(top_level='cyclic_poisson', bands=k) with k >= {bands} "
        f"groups (PLD accountant, docs/bandmf.md Theorem B.2), or top_level='b_min_sep' with bands={bands} (Dong & "
        "Ganesh 2026, Theorem 5.1, Monte Carlo accountant); other samplings are not accounted",
    )

def check_schedulers(trainer: L.Trainer, policy: str) -> None:
    """Schedulers that adapt to a monitored (private, noiseless) metric are outside the guarantee: ``policy`` is
    ``data_dependent_schedulers`` (``"disable"`` removes them with a warning, ``"error"`` refuses them)."""
    monitored = [c for c in trainer.lr_scheduler_configs if c.monitor is not None]
    if not monitored:
        return
    names = ", ".join(f"{type(c.scheduler).__name__} monitoring {c.monitor!r}" for c in monitored)
    if policy == "error":
        raise ConfigurationError(
            "data_dependent_schedulers", "error",
            f"configure_optimizers returns {names}; the monitored metric is computed on private data without "
            "noise, which the DP guarantee does not cover. Use a fixed schedule or "
            "data_dependent_schedulers='disable'",
        )
    trainer.strategy.lr_scheduler_configs = [c for c in trainer.lr_scheduler_configs if c.monitor is None]
    rank_zero_warn(
        f"DPForecastStrategy disabled {names}: it adapts the learning rate to a metric computed on private "
        "data without noise, which the DP guarantee does not cover. The learning rate stays at the "
        "optimizer's value (pass data_dependent_schedulers='error' to fail instead)."
    )


def check_trainable(trainer: L.Trainer, pl_module: L.LightningModule, hooked: set[int]) -> None:
    """The trainable parameters must stay those of the fit's start: ``hooked``, the ids of those with per-window
    hooks.

    A parameter unfrozen during the fit (e.g. by a fine-tuning callback) would get its plain autograd gradient,
    with no per-window bound and no noise, and the optimizer would apply it: a release the guarantee does not
    cover. A hooked parameter frozen during the fit would keep receiving noisy updates. Both are refused just
    before the noisy step, after every hook that could change them and before any update; a gradient on a
    parameter without hooks is refused too.
    """
    params = [*pl_module.parameters(), *(q for g in trainer.optimizers[0].param_groups for q in g["params"])]
    for p in params:
        if p.requires_grad == (id(p) in hooked) and (p.grad is None or p.requires_grad):
            continue
        name = next((n for n, q in pl_module.named_parameters() if q is p), f"of shape {tuple(p.shape)}")
        if p.requires_grad or id(p) not in hooked:
            raise ConfigurationError(
                "requires_grad", f"parameter {name!r}",
                "is not one of the parameters DP training started with but became trainable or got a gradient "
                "during the fit (e.g. a fine-tuning callback unfroze it): its gradient would have no per-window "
                "bound and no noise. Unfreeze it before the fit starts, or start a new fit after unfreezing "
                "(the privacy ledger continues)",
            )
        raise ConfigurationError(
            "requires_grad", f"parameter {name!r}",
            "was frozen during DP training: it would keep receiving noisy updates. Freeze it before the fit "
            "starts, or start a new fit after freezing (the privacy ledger continues)",
        )


def check_optimizer(trainer: L.Trainer, pl_module: L.LightningModule) -> None:
    """Automatic optimisation and exactly one optimizer."""
    if not pl_module.automatic_optimization:
        raise ConfigurationError(
            "automatic_optimization", False,
            "DPForecastStrategy needs automatic optimisation (one backward and one step per batch)",
        )
    if len(trainer.optimizers) != 1:
        raise ConfigurationError(
            "configure_optimizers", f"{len(trainer.optimizers)} optimizers",
            "DP training supports exactly one optimizer (each step releases one noisy gradient)",
        )


def check_optimizer_params(trainer: L.Trainer, hooked: set[int]) -> None:
    """Every trainable parameter the optimizer updates has per-window hooks (its id is in ``hooked``)."""
    for group in trainer.optimizers[0].param_groups:
        for p in group["params"]:
            if p.requires_grad and id(p) not in hooked:
                raise ConfigurationError(
                    "configure_optimizers", f"parameter of shape {tuple(p.shape)}",
                    "every trainable parameter the optimizer updates must belong to the LightningModule "
                    "(create the optimizer from self.parameters() or submodules)",
                )


def check_layers_after_setup(pl_module: L.LightningModule, module_ids: list[int], param_ids: list[int]) -> None:
    """No module with parameters or buffers, and no parameter, created after the strategy's ``setup``
    (``module_ids``, ``param_ids``: those of the module then): they missed the layer swaps and the model checks.
    A new module without parameters or buffers (an activation, a torchmetrics metric built in ``setup``) is
    harmless."""
    known = set(module_ids)
    added = [
        f"{name or type(pl_module).__name__} ({type(m).__name__})" for name, m in pl_module.named_modules()
        if id(m) not in known and (any(True for _ in m.parameters(recurse=False))
                                   or any(True for _ in m.buffers(recurse=False)))
    ]
    if added or [id(p) for p in pl_module.parameters()] != param_ids:
        raise ConfigurationError(
            "model", ", ".join(added) or "parameters replaced after setup",
            "were created after DPForecastStrategy's setup (in the LightningModule's setup or configure_model "
            "hook, or by a callback listed after it): they missed the layer swaps, the BatchNorm refusal and the "
            "per-window hooks. Build every layer in __init__ (or before trainer.fit)",
        )

"""DPForecastStrategy: a Lightning callback that turns ordinary training into DP-SGD (Algorithm 2).

Algorithm 2 (*Noisy Training Step*) of *Privacy Amplification by Structured Subsampling for Deep
Differentially Private Time Series Forecasting* (Schuchardt et al., ICML 2025): for every window y_i of the
batch, g_i = grad L(f(y_C,i), y_F,i); the update direction is

    g~ = ( sum_i g_i / max(1, ||g_i||_2 / C)  +  N(0, sigma^2 C^2 I) ) / Lambda

with Lambda the *expected* batch size (also for Poisson sampling). The callback obtains per-window norms and
the clipped sum from :class:`~lightning_dpts.training.engine.PerWindowClipper` (ghost norms for linear layers,
Opacus ``GradSampleModule`` hooks for every other layer), adds the noise once per optimizer step and writes
g~ into ``p.grad`` in ``on_before_optimizer_step``; the user's optimizer (from their ``configure_optimizers``)
then takes its step as usual. The clipping factor min(1, C / (||g_i|| + 1e-6)) is Opacus'.
"""

from __future__ import annotations

import math
import secrets
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import nn

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy.accountant import calibrate_noise_multiplier
from lightning_dpts.privacy.spec import SamplingSpec
from lightning_dpts.training.engine import PerWindowClipper, add_noise_and_average, clip_factors
from lightning_dpts.training.surgery import Surgery, make_private_compatible

__all__ = ["DPForecastStrategy", "clip_and_noise"]


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigurationError(name, value, "must be a finite number > 0")
    return float(value)


def clip_and_noise(
    grad_samples: list[torch.Tensor | None],
    params: list[torch.Tensor],
    max_grad_norm: float,
    noise_std: float,
    expected_batch_size: int,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """Algorithm 2's aggregation: (sum_i clip_C(g_i) + N(0, noise_std^2 I)) / Lambda, per parameter.

    Args:
        grad_samples: per-window gradients, one ``[B, *p.shape]`` tensor per parameter (``None`` if the
            parameter received no gradient; it then gets noise only).
        params: the parameters, in the same order (for shapes, dtype and device).
        max_grad_norm: C, the l2 bound of each window's gradient over *all* parameters jointly.
        noise_std: sigma * C, the std of the Gaussian noise added to the summed clipped gradient.
        expected_batch_size: Lambda, the divisor (the expected, not the realised, batch size).
        generator: the CPU ``torch.Generator`` that draws the noise.

    Returns:
        The noisy averaged gradient for each parameter.
    """
    present = [g for g in grad_samples if g is not None]
    sums: list[torch.Tensor | None] = [None] * len(grad_samples)
    if present:
        b = present[0].shape[0]
        sq = sum(g.reshape(b, -1).pow(2).sum(dim=1) for g in present)
        factor = clip_factors(sq, max_grad_norm)
        sums = [None if g is None else torch.einsum("i,i...->...", factor.to(g.dtype), g) for g in grad_samples]
    return add_noise_and_average(sums, params, noise_std, expected_batch_size, generator)


class DPForecastStrategy(Callback):
    """Differentially private training of an unchanged LightningModule (DP-SGD, Algorithm 2).

    Add it to ``Trainer(callbacks=[...])`` together with a datamodule that has a ``sampling_spec`` (e.g.
    :class:`~lightning_dpts.data.StructuredSubsamplingDataModule`) and, usually, an
    :class:`~lightning_dpts.training.AccountantCallback`.

    At ``setup("fit")`` it swaps layers Opacus cannot handle (``nn.LSTM``/``GRU``/``RNN``,
    ``nn.MultiheadAttention``) for DP-compatible equivalents with the weights copied
    (:func:`~lightning_dpts.training.surgery.make_private_compatible`) and attaches per-window gradient hooks
    (:class:`~lightning_dpts.training.engine.PerWindowClipper`); at the end of fitting the original layers come
    back with the trained weights, so validation and prediction afterwards carry no DP overhead and checkpoints
    load into the unmodified model.

    Exactly one of ``noise_multiplier`` or the target triple (``target_epsilon``, ``target_delta``,
    ``epochs``) must be given. With the target, sigma is calibrated at setup with
    :func:`~lightning_dpts.privacy.calibrate_noise_multiplier` on ``trainer.datamodule.sampling_spec``.

    Settings that would break the guarantee raise :class:`~lightning_dpts.errors.ConfigurationError`:
    Trainer ``gradient_clip_val``, ``accumulate_grad_batches != 1``, more than one optimizer, manual
    optimisation, more than one device/process, mixed precision, BatchNorm, and trainable parameters in the
    optimizer that the hooks do not cover.

    Args:
        noise_multiplier: sigma > 0; the noise std on the summed clipped gradient is ``sigma * C``.
        max_grad_norm: C > 0, the l2 clipping bound of one window's gradient (all parameters jointly), in
            units of the loss gradient.
        target_epsilon: epsilon > 0 to calibrate sigma for (instead of ``noise_multiplier``).
        target_delta: delta in (0, 1) to calibrate sigma for.
        epochs: number of epochs (each ``spec.steps_per_epoch`` optimizer steps) to calibrate sigma for.
        seed: seed of the noise generator, for reproducible experiments. ``None`` (default) draws a fresh seed
            from the operating system. **Anyone who knows the seed can subtract the noise**: a fixed seed is
            for tests and benchmarks, not for releasing a model.
        expected_batch_size: Lambda, only for datamodules without a ``sampling_spec``; otherwise Lambda is read
            from ``sampling_spec.batch_size`` and giving a different value is an error.
        loss_reduction: ``"mean"`` (default; GluonTS modules average their loss over the windows of a batch)
            or ``"sum"``: how the module's training loss combines the per-window losses. Per-window gradients
            are those of each window's own loss either way.
        scaler_default_scale: fixed scale for GluonTS ``MeanScaler(default_scale=None)`` on windows without
            observed values (see :mod:`~lightning_dpts.training.surgery`). > 0.
        data_dependent_schedulers: what to do with learning-rate schedulers that ``monitor`` a logged metric
            (e.g. GluonTS DeepAR's ``ReduceLROnPlateau`` on ``train_loss``): such a metric is computed on private
            data without noise, so adapting the learning rate to it leaks information the DP guarantee does not
            cover. ``"disable"`` (default) removes them for the run with a warning (the learning rate stays at
            the optimizer's value); ``"error"`` raises :class:`~lightning_dpts.errors.ConfigurationError`.
            Schedulers without ``monitor`` (fixed schedules) are data-independent and kept.
    """

    def __init__(
        self,
        noise_multiplier: float | None = None,
        max_grad_norm: float = 1.0,
        *,
        target_epsilon: float | None = None,
        target_delta: float | None = None,
        epochs: int | None = None,
        seed: int | None = None,
        expected_batch_size: int | None = None,
        loss_reduction: str = "mean",
        scaler_default_scale: float = 1.0,
        data_dependent_schedulers: str = "disable",
    ) -> None:
        super().__init__()
        self.max_grad_norm = _positive("max_grad_norm", max_grad_norm)
        target = (target_epsilon, target_delta, epochs)
        if noise_multiplier is not None:
            if any(t is not None for t in target):
                raise ConfigurationError(
                    "noise_multiplier", noise_multiplier,
                    "give either noise_multiplier or (target_epsilon, target_delta, epochs), not both",
                )
            noise_multiplier = _positive("noise_multiplier", noise_multiplier)
        elif any(t is None for t in target):
            raise ConfigurationError(
                "noise_multiplier", None,
                "give noise_multiplier, or all of target_epsilon, target_delta and epochs to calibrate it",
            )
        else:
            _positive("target_epsilon", target_epsilon)
            if not (isinstance(target_delta, float) and 0 < target_delta < 1):
                raise ConfigurationError("target_delta", target_delta, "must lie strictly between 0 and 1")
            if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
                raise ConfigurationError("epochs", epochs, "must be an integer >= 1")
        self._noise_multiplier: float | None = noise_multiplier
        self.target_epsilon = target_epsilon
        self.target_delta = target_delta
        self.epochs = epochs
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigurationError("seed", seed, "must be an integer >= 0 or None")
        self.seed = secrets.randbits(63) if seed is None else seed
        if expected_batch_size is not None and (
            isinstance(expected_batch_size, bool) or not isinstance(expected_batch_size, int) or expected_batch_size < 1
        ):
            raise ConfigurationError("expected_batch_size", expected_batch_size, "must be an integer >= 1")
        self._given_batch_size = expected_batch_size
        if loss_reduction not in ("mean", "sum"):
            raise ConfigurationError("loss_reduction", loss_reduction, "must be 'mean' or 'sum'")
        self.loss_reduction = loss_reduction
        self.scaler_default_scale = _positive("scaler_default_scale", scaler_default_scale)
        if data_dependent_schedulers not in ("disable", "error"):
            raise ConfigurationError("data_dependent_schedulers", data_dependent_schedulers,
                                     "must be 'disable' or 'error'")
        self.data_dependent_schedulers = data_dependent_schedulers
        self.generator = torch.Generator(device="cpu").manual_seed(self.seed)
        self.expected_batch_size: int | None = None
        self.steps = 0
        self.surgery: Surgery | None = None
        self._clipper: PerWindowClipper | None = None
        self._params: list[nn.Parameter] = []

    # ------------------------------------------------------------------------------------------------
    @property
    def state_key(self) -> str:
        return "DPForecastStrategy"

    @property
    def noise_multiplier(self) -> float:
        """sigma, given or calibrated (available after ``setup`` when calibrated from a target)."""
        if self._noise_multiplier is None:
            raise RuntimeError("noise_multiplier is calibrated at Trainer setup; call trainer.fit first")
        return self._noise_multiplier

    @property
    def noise_std(self) -> float:
        """sigma * C, the std of the noise added to the summed clipped gradient."""
        return self.noise_multiplier * self.max_grad_norm

    def resolve(self, trainer: L.Trainer) -> float:
        """Read Lambda from the datamodule and calibrate sigma if needed (idempotent); returns sigma."""
        spec = _spec_or_none(trainer)
        if spec is not None:
            if self._given_batch_size is not None and self._given_batch_size != spec.batch_size:
                raise ConfigurationError(
                    "expected_batch_size", self._given_batch_size,
                    f"must equal the datamodule's sampling_spec.batch_size={spec.batch_size} (or be omitted)",
                )
            self.expected_batch_size = spec.batch_size
        elif self._given_batch_size is not None:
            self.expected_batch_size = self._given_batch_size
        else:
            raise ConfigurationError(
                "expected_batch_size", None,
                "the datamodule has no sampling_spec; use a StructuredSubsamplingDataModule or give Lambda",
            )
        if self._noise_multiplier is None:
            if spec is None:
                raise ConfigurationError(
                    "target_epsilon", self.target_epsilon,
                    "calibrating sigma needs a datamodule with a sampling_spec; give noise_multiplier instead",
                )
            self._noise_multiplier = calibrate_noise_multiplier(
                spec, float(self.target_epsilon), float(self.target_delta), epochs=self.epochs  # type: ignore[arg-type]
            )
            rank_zero_info(
                f"DPForecastStrategy: noise_multiplier={self._noise_multiplier:.4g} reaches "
                f"epsilon={self.target_epsilon} at delta={self.target_delta} after {self.epochs} epochs"
            )
        return self._noise_multiplier

    # ------------------------------------------------------------------------------------------------
    # Lightning hooks
    # ------------------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        _check_trainer(trainer)
        self.resolve(trainer)
        if self.surgery is not None:  # setup twice without teardown
            return
        self.surgery = make_private_compatible(pl_module, scaler_default_scale=self.scaler_default_scale)
        if self.surgery.swaps:
            rank_zero_info(f"DPForecastStrategy: swapped {', '.join(self.surgery.swapped)} (weights copied)")
        self._params = [p for p in pl_module.parameters() if p.requires_grad]
        self._clipper = PerWindowClipper(pl_module, loss_reduction=self.loss_reduction)
        if not self._params:
            raise ConfigurationError("model", type(pl_module).__name__, "has no trainable parameters")

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
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
        hooked = {id(p) for p in self._params}
        for group in trainer.optimizers[0].param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in hooked:
                    raise ConfigurationError(
                        "configure_optimizers", f"parameter of shape {tuple(p.shape)}",
                        "every trainable parameter the optimizer updates must belong to the LightningModule "
                        "(create the optimizer from self.parameters() or submodules)",
                    )
        self._check_schedulers(trainer)

    def _check_schedulers(self, trainer: L.Trainer) -> None:
        """Schedulers that adapt to a monitored (private, noiseless) metric are outside the guarantee."""
        monitored = [c for c in trainer.lr_scheduler_configs if c.monitor is not None]
        if not monitored:
            return
        names = ", ".join(f"{type(c.scheduler).__name__} monitoring {c.monitor!r}" for c in monitored)
        if self.data_dependent_schedulers == "error":
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

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._clear()
        if self._clipper is not None:
            self._clipper.enable()

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        assert self.expected_batch_size is not None and self._clipper is not None
        noisy = self._clipper.noisy_gradients(
            self._params, self.max_grad_norm, self.noise_std, self.expected_batch_size, self.generator
        )
        for p, g in zip(self._params, noisy, strict=True):
            p.grad = g
        self._clear()
        self.steps += 1

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._clipper is not None:
            self._clipper.disable()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._clipper is not None and trainer.training:
            self._clipper.enable()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._undo(pl_module)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._undo(pl_module)

    def _undo(self, pl_module: L.LightningModule) -> None:
        """Remove the Opacus hooks and per-sample state, and put the original layers back (idempotent)."""
        self._clear()
        if self._clipper is not None:
            self._clipper.remove()
            self._clipper = None
        if self.surgery is not None:
            self.surgery.restore()
            self.surgery = None
        self._params = []

    def _clear(self) -> None:
        """Drop per-window state left from a previous step (also after a forward pass without backward)."""
        if self._clipper is not None:
            self._clipper.clear(self._params)

    # ------------------------------------------------------------------------------------------------
    # Checkpointing
    # ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self._noise_multiplier,
            "max_grad_norm": self.max_grad_norm,
            "steps": self.steps,
            "generator_state": self.generator.get_state(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key, mine in (("noise_multiplier", self._noise_multiplier), ("max_grad_norm", self.max_grad_norm)):
            saved = state_dict.get(key)
            if saved is not None and mine is not None and not math.isclose(saved, mine, rel_tol=1e-9):
                raise ConfigurationError(
                    key, mine, f"the checkpoint was trained with {key}={saved}; resume with the same value"
                )
        # Continue the noise stream: replaying noise already used would correlate steps and void the guarantee.
        self.generator.set_state(state_dict["generator_state"])
        self.steps = int(state_dict.get("steps", 0))


def _spec_or_none(trainer: L.Trainer) -> SamplingSpec | None:
    dm = getattr(trainer, "datamodule", None)
    spec = getattr(dm, "sampling_spec", None) if dm is not None else None
    if spec is not None and not isinstance(spec, SamplingSpec):
        raise ConfigurationError("datamodule.sampling_spec", type(spec).__name__, "must be a SamplingSpec")
    return spec


def _check_trainer(trainer: L.Trainer) -> None:
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
    if trainer.world_size != 1:
        raise ConfigurationError("devices", trainer.world_size, "DP training supports a single process/device")
    if str(trainer.precision) not in ("32-true", "64-true", "32", "64"):
        raise ConfigurationError(
            "precision", trainer.precision, "must be '32-true' or '64-true' (loss scaling interferes with clipping)"
        )

"""The structured-subsampling mechanism as a dp_accounting ``DpEvent``, and a ``PLDAccountant`` that accounts it.

Users of dp_accounting (and of libraries built on it, such as jax_privacy) describe their training as events and
compose them in one accountant. :class:`StructuredSubsamplingDpEvent` describes one composition unit of DP-SGD with
bi-level structured subsampling (the paper's Algorithms 1-6); :class:`StructuredPLDAccountant` is dp_accounting's
``PLDAccountant`` extended by subclassing: dp_accounting's own events (Gaussian, Poisson-sampled Gaussian, Laplace,
randomized response, ...) are composed by the base class as usual, and the structured events by this package's
tight accountant (:class:`~lightning_dpts.privacy.StructuredSubsamplingAccountant`: the single switching profile of
Theorems 4.2/4.4/G.1 or the bounds of Appendices E/F, a pessimistic connect-the-dots PLD composed on its own grid,
never dp_accounting's mixture-of-Gaussians constructor: trap 1 of the privacy notes). When epsilon or delta is read,
the structured part is moved onto the accountant's grid (:func:`~lightning_dpts.privacy.pld.regrid_atoms`, a
pessimistic split of every atom) and composed with the rest in one PLD.

Example::

    from dp_accounting import ComposedDpEvent, GaussianDpEvent, SelfComposedDpEvent
    from lightning_dpts.privacy import SamplingSpec, StructuredPLDAccountant, StructuredSubsamplingDpEvent

    spec = SamplingSpec(num_series=862, min_length=13916, context_length=96, prediction_length=24, batch_size=256)
    training = StructuredSubsamplingDpEvent.from_spec(spec, noise_multiplier=4.0).for_steps(10_000)
    release = GaussianDpEvent(noise_multiplier=50.0)  # e.g. a noisy statistic of the same data
    eps = StructuredPLDAccountant().compose(ComposedDpEvent([training, release])).get_epsilon(1e-7)

Counts of one structured event are added up and composed once (so a loop may compose the event step by step at no
cost); different structured events (another spec or sigma) are composed with each other.
"""

from __future__ import annotations

import math
from typing import Any

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation

from lightning_dpts.errors import ConfigurationError
from lightning_dpts.privacy._dp_accounting import (
    PrivacyLossDistribution,
    dense_pmf,
    pld_accountant_state,
    symmetric_pld,
)
from lightning_dpts.privacy.accountant import FINE_DELTA, MIN_DELTA, StructuredSubsamplingAccountant
from lightning_dpts.privacy.pld import MAX_COMPOSED_POINTS, epsilon_from_pld, regrid_atoms
from lightning_dpts.privacy.spec import NeighbouringRelation, SamplingSpec

__all__ = ["StructuredPLDAccountant", "StructuredSubsamplingDpEvent"]


def _lengths(value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigurationError("lengths", value, "must be a sequence of integers (series lengths), or None") from None


def _name(value: Any) -> Any:
    """A name field: a str, or the tuple of its characters that :meth:`StructuredSubsamplingDpEvent.to_named_tuple`
    writes (dp_accounting 0.6 turns a str field into the text of a list of its characters on the way to and from a
    named tuple, because a str is a Sequence; a tuple of characters survives both ways)."""
    if isinstance(value, (tuple, list)) and all(isinstance(c, str) and len(c) == 1 for c in value):
        return "".join(value)
    return value


_NAME_FIELDS = ("top_level", "bottom_level", "relation_level")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class StructuredSubsamplingDpEvent(dp_event.DpEvent):
    """One composition unit of DP-SGD with bi-level structured subsampling over a dataset of time series.

    The dataset holds ``num_series`` series; the record protected (the unit of privacy) is a change of
    ``relation_size`` time steps of one series: consecutive ones (``relation_level="event"``, Definition 3.5 of
    Schuchardt et al., ICML 2025) or anywhere in the series (``"user"``, Definition 3.6), each by at most
    ``value_bound`` (Definition 3.7; ``None``: unbounded). Neighbouring datasets have the same shape: this is a
    substitution relation (dp_accounting's ``REPLACE_ONE`` with the record being the protected unit).

    Each optimizer step draws ``batch_size / instances_per_series`` series (the top level: ``"without_replacement"``
    every step, ``"poisson"`` at that expected rate, ``"iteration"``/``"shuffling"`` in turn over an epoch,
    ``"cyclic_poisson"`` from group t mod ``bands``) and from each sampled series ``instances_per_series`` windows of
    ``context_length + prediction_length`` steps (the bottom level: ``"with_replacement"`` uniform start positions
    among the ``min_length - prediction_length + 1`` after zero-padding, or ``"poisson"``); ``context_length``
    counts every lag the model reads. The past (future) part of every window gets Gaussian noise of std
    ``context_noise * value_bound`` (``forecast_noise * value_bound``; Eq. 1). Each window's gradient is clipped to
    norm C; the step releases their sum plus N(0, (noise_multiplier C)^2 I). The model must treat windows
    independently (no batch statistics). ``lengths`` lists the training series' distinct lengths (``None``: every
    series has at least ``min_length`` steps).

    **One event is one composition unit**, :attr:`unit`: one optimizer step for the top levels that sample every
    step, one epoch (``steps_per_epoch`` steps; a started epoch counts whole) for ``"iteration"``/``"shuffling"``,
    one participation opportunity of a series (``bands`` steps) for ``"cyclic_poisson"``. :meth:`for_steps` gives
    the event of a run of n optimizer steps. The fields are those of :class:`~lightning_dpts.privacy.SamplingSpec`
    (validated by it on construction, with :class:`~lightning_dpts.errors.ConfigurationError` naming the field)
    plus ``noise_multiplier``.
    """

    noise_multiplier: float
    num_series: int
    min_length: int
    context_length: int
    prediction_length: int
    batch_size: int
    instances_per_series: int = 1
    top_level: str = attr.ib(default="without_replacement", converter=_name)
    bottom_level: str = attr.ib(default="with_replacement", converter=_name)
    relation_level: str = attr.ib(default="event", converter=_name)
    relation_size: int = 1
    value_bound: float | None = None
    num_dims: int = 1
    context_noise: float = 0.0
    forecast_noise: float = 0.0
    lengths: tuple[int, ...] | None = attr.ib(default=None, converter=_lengths)
    bands: int = 1

    def __attrs_post_init__(self) -> None:
        sigma = self.noise_multiplier
        if isinstance(sigma, bool) or not isinstance(sigma, (int, float)) or not (math.isfinite(sigma) and sigma > 0):
            raise ConfigurationError("noise_multiplier", sigma, "must be a finite number > 0")
        self.spec  # noqa: B018  (validates every field; the spec is rebuilt on demand, the event stays plain data)

    def to_named_tuple(self) -> dp_event.DpEventNamedTuple:
        """dp_accounting's NamedTuple form (for serialisation); ``DpEvent.from_named_tuple`` restores the event."""
        plain = super().to_named_tuple()
        return plain._replace(**{name: tuple(getattr(self, name)) for name in _NAME_FIELDS})  # type: ignore[attr-defined]

    @classmethod
    def from_spec(cls, spec: SamplingSpec, noise_multiplier: float) -> StructuredSubsamplingDpEvent:
        """The event of ``spec`` (e.g. ``datamodule.sampling_spec``) under noise multiplier sigma."""
        if not isinstance(spec, SamplingSpec):
            raise ConfigurationError("spec", spec, "must be a lightning_dpts.privacy.SamplingSpec")
        r = spec.relation
        return cls(
            noise_multiplier=noise_multiplier, num_series=spec.num_series, min_length=spec.min_length,
            context_length=spec.context_length, prediction_length=spec.prediction_length,
            batch_size=spec.batch_size, instances_per_series=spec.instances_per_series, top_level=spec.top_level,
            bottom_level=spec.bottom_level, relation_level=r.level, relation_size=r.size, value_bound=r.value_bound,
            num_dims=r.num_dims, context_noise=spec.context_noise, forecast_noise=spec.forecast_noise,
            lengths=spec.lengths, bands=spec.bands)

    @property
    def spec(self) -> SamplingSpec:
        """The :class:`~lightning_dpts.privacy.SamplingSpec` this event describes."""
        relation = NeighbouringRelation(level=self.relation_level, size=self.relation_size,  # type: ignore[arg-type]
                                        value_bound=self.value_bound, num_dims=self.num_dims)
        return SamplingSpec(
            num_series=self.num_series, min_length=self.min_length, context_length=self.context_length,
            prediction_length=self.prediction_length, batch_size=self.batch_size,
            instances_per_series=self.instances_per_series, top_level=self.top_level,  # type: ignore[arg-type]
            bottom_level=self.bottom_level, relation=relation,  # type: ignore[arg-type]
            context_noise=self.context_noise, forecast_noise=self.forecast_noise, lengths=self.lengths,
            bands=self.bands)

    @property
    def unit(self) -> str:
        """What one event is: ``"step"``, ``"epoch"`` or ``"opportunity"``."""
        return self.spec.top_level_scheme.composition_unit

    def for_steps(self, steps: int) -> dp_event.DpEvent:
        """The event of one run of ``steps`` optimizer steps: this event composed ``spec.compositions(steps)``
        times (a started epoch counts whole)."""
        count = self.spec.compositions(steps)
        if count == 0:
            return dp_event.NoOpDpEvent()
        return self if count == 1 else dp_event.SelfComposedDpEvent(self, count)


class StructuredPLDAccountant(pld_privacy_accountant.PLDAccountant):
    """dp_accounting's ``PLDAccountant`` that also accounts :class:`StructuredSubsamplingDpEvent`.

    Every other event is composed by the base class (its PLDs on the grid ``value_discretization_interval``). The
    structured events' counts are kept and composed when epsilon or delta is read: for each distinct event, the
    :class:`~lightning_dpts.privacy.StructuredSubsamplingAccountant` PLD of its total count (its own grid, tails and
    round-off bounds for that count and delta; the best of its pessimistic PLDs at the delta read, or at
    :data:`~lightning_dpts.privacy.accountant.FINE_DELTA` for delta), moved onto this accountant's grid by splitting
    every atom between its two neighbouring grid losses (pessimistic), then composed with the base class's PLD by
    dp_accounting. Alone, an event reads the same epsilon as the package's accountant within 0.1% on the paper's
    configurations (tests/privacy/test_events.py), and never less than the composition of the pessimistic PLDs.

    Args:
        neighboring_relation: must be ``REPLACE_ONE`` when structured events are composed (the default here): they
            are accounted for substitution of the protected unit (the dataset's shape is public); dp_accounting's
            events are then read under the same relation (a Poisson-sampled Gaussian event, e.g., with sensitivity
            doubled for substitution).
        value_discretization_interval: the grid of the composed PLD (dp_accounting's default 1e-4).
    """

    def __init__(self, neighboring_relation: NeighboringRelation = NeighboringRelation.REPLACE_ONE,
                 value_discretization_interval: float = 1e-4) -> None:
        if not (isinstance(value_discretization_interval, (int, float)) and 0 < value_discretization_interval <= 1):
            raise ConfigurationError("value_discretization_interval", value_discretization_interval,
                                     "must lie in (0, 1]")
        super().__init__(neighboring_relation, value_discretization_interval)
        self._structured: dict[StructuredSubsamplingDpEvent, int] = {}
        self._accountants: dict[StructuredSubsamplingDpEvent, StructuredSubsamplingAccountant] = {}
        self._combined: dict[float, PrivacyLossDistribution] = {}

    def _maybe_compose(self, event: dp_event.DpEvent, count: int,
                       do_compose: bool) -> pld_privacy_accountant.CompositionErrorDetails | None:
        if not isinstance(event, StructuredSubsamplingDpEvent):
            if do_compose:
                self._combined.clear()
            return super()._maybe_compose(event, count, do_compose)
        if self.neighboring_relation != NeighboringRelation.REPLACE_ONE:
            return pld_privacy_accountant.CompositionErrorDetails(
                invalid_event=event,
                error_message="StructuredSubsamplingDpEvent is accounted for substitution of the protected unit "
                              "(Definitions 3.5-3.7): use NeighboringRelation.REPLACE_ONE, found "
                              f"{self.neighboring_relation}.")
        if event.spec.top_level_scheme.needs_monte_carlo:
            return pld_privacy_accountant.CompositionErrorDetails(
                invalid_event=event,
                error_message=f"top_level={event.top_level!r} has no PLD accountant (its Monte Carlo accountant is "
                              "lightning_dpts.privacy.MonteCarloAccountant).")
        if do_compose and count > 0:
            self._structured[event] = self._structured.get(event, 0) + int(count)
            self._combined.clear()
        return None

    # ------------------------------------------------------------------------------------------------------
    def _structured_pld(self, event: StructuredSubsamplingDpEvent, count: int, delta: float | None,
                        spacing: float) -> PrivacyLossDistribution:
        """The PLD of ``count`` units of ``event`` on the grid ``spacing`` (pessimistic)."""
        acc = self._accountants.get(event)
        if acc is None:
            acc = self._accountants[event] = StructuredSubsamplingAccountant(event.spec, event.noise_multiplier)
        read_at = FINE_DELTA if delta is None else min(max(delta, MIN_DELTA), 0.5)
        best = min(acc.plds(count, read_at), key=lambda p: epsilon_from_pld(p, read_at))
        h, lower, probs, inf_mass = dense_pmf(best)
        keep = np.nonzero(probs > 0)[0]
        if not keep.size:
            return symmetric_pld(spacing, 0, np.zeros(1), min(1.0, inf_mass))
        losses = (lower + keep) * h
        if (losses[-1] - losses[0]) / spacing + 2 > MAX_COMPOSED_POINTS:
            raise ConfigurationError(
                "value_discretization_interval", spacing,
                f"is too fine for the structured event's privacy losses in [{losses[0]:.3g}, {losses[-1]:.3g}] "
                f"(more than {MAX_COMPOSED_POINTS} grid points); use a coarser interval")
        first, moved = regrid_atoms(losses, probs[keep], spacing)
        return symmetric_pld(spacing, first, moved, inf_mass)

    def _pld_for(self, delta: float | None) -> tuple[PrivacyLossDistribution, bool]:
        """(the PLD of everything composed, whether a non-private event was), for a read-out at ``delta``."""
        base, non_dp, spacing = pld_accountant_state(self)
        if non_dp or not self._structured:
            return base, non_dp
        key = -1.0 if delta is None else float(delta)
        if key not in self._combined:
            combined = base
            for event, count in self._structured.items():
                combined = combined.compose(self._structured_pld(event, count, delta, spacing))
            self._combined = {key: combined}  # one delta at a time (calibration loops read one delta)
        return self._combined[key], False

    def get_epsilon(self, target_delta: float) -> float:
        """The smallest epsilon such that everything composed is (epsilon, ``target_delta``)-DP."""
        pld, non_dp = self._pld_for(target_delta)
        if non_dp:
            return math.inf
        return float(pld.get_epsilon_for_delta(target_delta))

    def get_delta(self, target_epsilon: float) -> float:
        """The smallest delta such that everything composed is (``target_epsilon``, delta)-DP."""
        pld, non_dp = self._pld_for(None)
        if non_dp:
            return 1.0
        return float(pld.get_delta_for_epsilon(target_epsilon))

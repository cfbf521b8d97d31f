"""The one adapter for what the package takes from dp_accounting's internals.

Checked against **dp-accounting 0.6.0** (``dp_accounting.pld``). No other module of the package imports
``dp_accounting.pld.pld_pmf`` or ``dp_accounting.pld.common`` or reads an ``_``-prefixed attribute of a dp_accounting
object (tests/test_architecture_privacy.py enforces it); the public ``PrivacyLossDistribution`` type is re-exported
from here so that the privacy layer names dp_accounting in one place. If an upgrade changes one of the internals
below, this module is the only one to adapt (the exact before/after tables of tests/privacy pin the results).

What is used, and why:

* ``PrivacyLossDistribution._pmf_remove`` and the pmf attributes ``_discretization``, ``_lower_loss``, ``_probs``,
  ``_infinity_mass`` (``DensePLDPmf``) and ``_loss_probs`` (``SparsePLDPmf``), in :func:`dense_pmf`: the package's
  own composition (:class:`~lightning_dpts.privacy.pld.Composition`: tilted FFT with an explicit round-off bound) and
  its (eps, delta) read-outs work on the dense probability vector of a *symmetric* PLD, which dp_accounting exposes
  no public accessor for.
* ``pld_pmf.DensePLDPmf(discretization, lower_loss, probs, infinity_mass, pessimistic_estimate)``, in
  :func:`symmetric_pld`: wraps the pmfs the package computes (its connect-the-dots with a sound round-off repair,
  and its compositions) as a PrivacyLossDistribution (one pmf for both directions: trap 1 of the privacy notes).
* ``pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap``, in :func:`connect_dots_pld`: dp_accounting's
  connect-the-dots for the degenerate one-point grid.
* ``common.compute_self_convolve_bounds``, in :func:`self_convolve_bounds`: the Chernoff range dp_accounting's
  ``self_compose`` would allocate (to size a composition without composing).
* ``PrivacyLossDistribution._symmetric`` and ``._pmf_add``, in :func:`direction_pmfs`: the risk read-outs
  (:mod:`lightning_dpts.privacy.risk`) of a PLD that dp_accounting composed from asymmetric events (add and remove
  directions differ) take the worse of the two directions.
* ``PLDAccountant._pld``, ``._contains_non_dp_event`` and ``._value_discretization_interval``, in
  :func:`pld_accountant_state`: :class:`~lightning_dpts.privacy.events.StructuredPLDAccountant` extends dp_accounting's
  ``PLDAccountant`` by subclassing; it composes the PLD of dp_accounting's own events (kept by the base class) with
  the structured mechanism's PLD when epsilon or delta is read.
"""

from __future__ import annotations

import numpy as np
from dp_accounting.pld import common, pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

__all__ = ["PrivacyLossDistribution", "connect_dots_pld", "dense_pmf", "direction_pmfs", "pld_accountant_state",
           "self_convolve_bounds", "symmetric_pld"]

#: The dp-accounting version this adapter was checked against.
CHECKED_VERSION = "0.6.0"


def dense_pmf(pld: PrivacyLossDistribution) -> tuple[float, int, np.ndarray, float]:
    """(grid spacing h, index of the lowest loss, probabilities, mass at +infinity) of a symmetric PLD."""
    return _pmf_arrays(pld._pmf_remove)


def direction_pmfs(pld: PrivacyLossDistribution) -> list[tuple[float, int, np.ndarray, float]]:
    """:func:`dense_pmf` of each direction of ``pld``: one for a symmetric PLD, (remove, add) otherwise."""
    if pld._symmetric:
        return [_pmf_arrays(pld._pmf_remove)]
    return [_pmf_arrays(pld._pmf_remove), _pmf_arrays(pld._pmf_add)]


def pld_accountant_state(accountant: object) -> tuple[PrivacyLossDistribution, bool, float]:
    """(PLD of the events composed so far, whether a non-private event was composed, grid spacing) of a
    dp_accounting ``PLDAccountant``."""
    return (accountant._pld, bool(accountant._contains_non_dp_event),  # type: ignore[attr-defined]
            float(accountant._value_discretization_interval))  # type: ignore[attr-defined]


def _pmf_arrays(pmf: object) -> tuple[float, int, np.ndarray, float]:
    if isinstance(pmf, pld_pmf.SparsePLDPmf):  # small pmfs: {loss index: probability}
        items = pmf._loss_probs
        lower = min(items) if items else 0
        probs = np.zeros((max(items) - lower + 1) if items else 1)
        for index, prob in items.items():
            probs[index - lower] += prob
        return float(pmf._discretization), int(lower), probs, float(pmf._infinity_mass)
    return float(pmf._discretization), int(pmf._lower_loss), np.asarray(pmf._probs, dtype=np.float64), float(
        pmf._infinity_mass)


def symmetric_pld(spacing: float, lower: int, probs: np.ndarray, infinity_mass: float) -> PrivacyLossDistribution:
    """The symmetric, pessimistic PLD with probabilities ``probs`` at losses (``lower`` + i) * ``spacing`` and
    ``infinity_mass`` at +infinity."""
    return PrivacyLossDistribution(pld_pmf.DensePLDPmf(spacing, lower, probs, infinity_mass, True))


def connect_dots_pld(spacing: float, lower: int, upper: int, deltas: np.ndarray) -> PrivacyLossDistribution:
    """dp_accounting's pessimistic connect-the-dots PLD of the profile values ``deltas`` at eps = j * ``spacing``,
    j = ``lower`` .. ``upper``."""
    return PrivacyLossDistribution(
        pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(spacing, lower, upper, deltas))


def self_convolve_bounds(probs: np.ndarray, num_times: int, tail_mass_truncation: float) -> tuple[int, int]:
    """(lower, upper) loss index of dp_accounting's ``num_times``-fold self-convolution of ``probs``."""
    lower, upper = common.compute_self_convolve_bounds(probs, num_times, tail_mass_truncation)
    return int(lower), int(upper)

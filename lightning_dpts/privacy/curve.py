"""The epsilon curve of a run: epsilon after every composition count, cheap enough to log after every step.

:meth:`~lightning_dpts.privacy.StructuredSubsamplingAccountant.epsilon_curve` (the AccountantCallback's per-step
table, ``dpts fit``'s public ``epsilon_curve``) returns values e_i at counts c_0 < c_1 < ...; the value after any
count c in (c_i, c_{i+1}] is read as e_{i+1}. Each e_i is epsilon of a pessimistic connect-the-dots PLD (Lemma
D.16) composed c_i times by the package's one composition (:class:`~lightning_dpts.privacy.pld.Composition`), so
it is an upper bound on the true epsilon after c_i units, and, the true epsilon being nondecreasing in the count,
on every count it stands for.

What makes it cheap (issue 26: the table of the default job's 400 steps used to cost 0.4 s, about a fifth of its
training steps; benchmarks/epsilon_logging.py has the figures):

* **The table's grid.** The accountant refines its grid far below 1% of epsilon (about 0.03%). The curve composes
  on the coarsest grid of the ladder h_0 2^-g (g < 0: coarser than the unit's grid 0, onto which grid 0's unit is
  split exactly, :func:`~lightning_dpts.privacy.pld.split_to_grid`) whose epsilon at the last count exceeds the
  accountant's own there by at most ``rtol`` x :data:`CURVE_EXCESS_SHARE` (measured, not estimated). Grids are
  nested (a coarser grid's points are points of the finer one), so the coarse connect-the-dots PLD dominates the
  fine one and every value is >= the accountant's up to round-off; the curve's spacing is never finer than the
  accountant's for the same count. The relative excess grows slowly with the count (on the default job 0.03% at
  2 steps, 0.08% at 400), so the last count bounds it (tests/privacy/test_epsilon_curve.py checks every count).
* **Batches.** Counts whose composed ranges are within 1.5x of each other share one FFT length, one spectrum and
  one batched inverse FFT (:meth:`~lightning_dpts.privacy.pld.Composition.power_rows`), read without building PLD
  objects (:func:`~lightning_dpts.privacy.pld.epsilons_from_pmfs`). The counts come from a pilot ladder refined
  where consecutive values are too far apart (:func:`curve_counts`); the first :data:`FIRST_COUNTS` come first.
* **Read-out levels.** Below :data:`~lightning_dpts.privacy.accountant.FINE_DELTA` the accountant's epsilon is
  the larger of the fine level at delta and the coarse level at FINE_DELTA (monotone in delta). The curve compares
  the two at a few probe counts (:data:`PROBES`) on a grid coarser than the accountant's (an upper bound on the
  coarse level); where the coarse level stays :data:`LEVEL_MARGIN` below the fine one at all of them (delta well
  below FINE_DELTA, the usual case) it composes the fine level alone, itself a sound bound at delta. Where the
  untilted FFT's round-off bound matters (a tiny delta), it also composes with an exponential tilt, as the
  accountant does (:meth:`_Level._tilted_values`).

Consecutive values differ by at most a factor (1 + rtol) / (1 + x), x the measured excess, wherever one count does
not step further, so the value read for any count c is within a factor 1 + rtol of the accountant's epsilon at c.
Counts the accountant composes by squaring (beyond about 10^6 compositions, or where the memory bound limits its
FFT grid) are read as the accountant reads them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lightning_dpts.privacy._dp_accounting import symmetric_pld
from lightning_dpts.privacy.pld import (
    Composition,
    epsilon_from_pld,
    epsilons_from_pmfs,
    saddlepoint_tilt,
    split_to_grid,
)
from lightning_dpts.privacy.risk import (
    FPRS,
    TABLE_MU_POINTS,
    TABLE_MU_RTOL,
    RiskReadout,
    gdp_mu_from_pmfs,
    tpr_from_pmfs,
)

__all__ = ["CURVE_EXCESS_SHARE", "PROBES", "curve_counts", "epsilon_curve", "risk_curve"]

#: The table's grid may overstate the accountant's epsilon by at most this share of ``rtol`` (measured).
CURVE_EXCESS_SHARE = 0.25
#: How many coarser grids than the unit's own (grid 0) the table tries: spacing up to 2^this h_0.
MAX_COARSENING = 8
#: Counts (fractions of the last count, and count 2) at which the two read-out levels are compared.
PROBES = (1.0, 1 / 16)
#: Mass the curve's coarse compositions may leave out of their range (put at +infinity), at most this share of
#: delta and at most :data:`CURVE_TAIL` (the accountant's own: 1e-15 or 1e-22): narrower FFTs, a larger epsilon.
CURVE_TAIL_SHARE = 1e-5
CURVE_TAIL = 1e-12
#: The curve's first counts, computed and returned before the rest (a run's first steps look them up at once).
FIRST_COUNTS = 8
#: Largest number of grid points (rows x FFT length) composed in one batch (about 16 MiB per complex array).
BATCH_POINTS = 1 << 21
#: The coarse level is skipped when it stays below this fraction of the fine level at every probe.
LEVEL_MARGIN = 0.98


class _Level:
    """Compositions of one read-out level of an accountant on the curve's grid, read at one delta.

    Args:
        acc: the accountant (its unit PLDs, grids and compositions are shared through its caches).
        level: the read-out level (0: ``delta >= FINE_DELTA``; 1: below).
        delta: the delta every value is read at.
        last: the largest count of the curve (the grid is chosen there).
        max_excess: the largest relative excess of the table's grid over the accountant at ``last``.
    """

    def __init__(self, acc: Any, level: int, delta: float, last: int, max_excess: float,
                 grid: int | None = None) -> None:
        self.acc, self.level, self.delta = acc, level, delta
        #: {count: risk read-outs} of the counts composed here, where the curve is asked for them (else ``None``)
        self.readouts: dict[int, RiskReadout] | None = None
        self._coarse: dict[int, Composition] = {}
        self.tilted = False  # also compose tilted (the FFT round-off decides: tiny delta, many counts)
        if grid is None:
            self.grid, self.excess = self._choose(last, max_excess)
        else:  # a given grid <= 0 (coarser than every count's own): an upper bound on the accountant's values
            self.grid, self.excess = min(grid, 0), math.inf

    # ---------------------------------------------------------------------------------------------------
    def exact(self, c: int) -> float:
        """The accountant's own value of this level at count c (its grid for c, its tilted composition where it
        adds one, or its composition by squaring)."""
        return self.acc._eps(c, self.level, self.delta)

    def _untilted_exact(self, c: int) -> float:
        """The accountant's untilted value at count c (its grid for c; the compositions :meth:`exact` read)."""
        return min(epsilon_from_pld(p, self.delta) for p in self.acc._composed_parts(c, self.level)[0])

    def _composition(self, grid: int) -> Composition:
        """The untilted composition on spacing h_0 2^-grid (grid >= 0: the accountant's own ladder)."""
        if grid >= 0:
            return self.acc._composition(self.level, grid)
        if grid not in self._coarse:  # grid 0's unit split onto the coarser grid (dominates it; no profile calls)
            base = self.acc._composition(self.level, 0)
            h, lower, probs = split_to_grid(base.h, base.lower, base.probs, 2 ** -grid)
            unit = symmetric_pld(h, lower, probs, base.inf_mass)
            # the range kept needs only lose mass negligible against delta (it goes to +infinity: pessimistic)
            tail = max(self.acc._tails(self.level)[1], min(CURVE_TAIL, CURVE_TAIL_SHARE * self.delta))
            self._coarse[grid] = Composition(unit, tail, 0.0)
        return self._coarse[grid]

    def _direct(self, c: int) -> bool:
        """Whether count c is read as the accountant's own composition (squaring: huge or memory-limited)."""
        acc = self.acc
        return acc._squares(c, acc._grid_and_limit(c, self.level)[1])

    def _on(self, grid: int, counts: list[int]) -> dict[int, float]:
        """epsilon at ``counts`` (>= 2) on ``grid``, batched by FFT length (counts whose ranges are within 1.5x of
        each other share one, rows capped at :data:`BATCH_POINTS` points); counts whose range exceeds the memory
        bound are left out."""
        from scipy import fft as sfft

        comp = self._composition(grid)
        classes: dict[int, list[tuple[int, int]]] = {}  # widths within 1.5x of each other share an FFT length
        for c, (lo, hi) in zip(counts, comp.windows(counts), strict=True):
            width = max(hi - lo + 1, comp.probs.size)
            classes.setdefault(math.ceil(math.log(width / comp.probs.size, 1.5)), []).append((c, width))
        out: dict[int, float] = {}
        for _, members in sorted(classes.items()):
            size = int(sfft.next_fast_len(max(width for _, width in members), real=True))
            group = [c for c, _ in members]
            rows_at_once = max(1, BATCH_POINTS // (2 * size))
            for i in range(0, len(group), rows_at_once):
                batch = group[i:i + rows_at_once]
                try:
                    lower, rows, inf_masses = comp.power_rows(np.array(batch), size=size)
                except OverflowError:
                    continue
                values = epsilons_from_pmfs(comp.h, lower, rows, inf_masses, self.delta)
                if self.readouts is not None:  # from the same rows: no composition of their own
                    self._read_risk(comp.h, lower, rows, inf_masses, batch)
                if self.tilted:
                    values = np.minimum(values, self._tilted_values(comp, batch, values))
                out.update(zip(batch, (float(v) for v in values), strict=True))
        return out

    def _read_risk(self, h: float, lower: int, rows: np.ndarray, inf_masses: np.ndarray, batch: list[int]) -> None:
        """TPR at FPR and mu-GDP of each row (:mod:`lightning_dpts.privacy.risk`; upper bounds: the rows are
        pessimistic PLDs), into :attr:`readouts`."""
        assert self.readouts is not None
        tprs = tpr_from_pmfs(h, lower, rows, inf_masses, FPRS)
        mus = gdp_mu_from_pmfs(h, lower, rows, inf_masses, self.delta, TABLE_MU_POINTS, TABLE_MU_RTOL)
        for r, c in enumerate(batch):
            self.readouts[c] = RiskReadout(FPRS, tuple(float(t) for t in tprs[r]), float(mus[r]), self.delta)

    def _exact_risk(self, c: int) -> None:
        """The accountant's own read-outs at count c, into :attr:`readouts` (counts read as the accountant reads
        them)."""
        if self.readouts is not None and c not in self.readouts:
            self.readouts[c] = self.acc.risk_after(c, self.delta)

    def _tilted_values(self, comp: Composition, batch: list[int], untilted: np.ndarray) -> np.ndarray:
        """epsilon of ``batch`` composed with one exponential tilt, aimed (:func:`~lightning_dpts.privacy.pld.
        saddlepoint_tilt`) at the untilted epsilon of its middle count: below FINE_DELTA the untilted FFT's
        round-off bound can dominate delta (a Gaussian at delta = 1e-12 and 2,000 counts: 10% high), and the
        accountant adds the same kind of composition there. Any tilt gives an upper bound; ``inf`` where the
        tilted range exceeds the memory bound."""
        from scipy import fft as sfft

        middle = len(batch) // 2
        theta = saddlepoint_tilt(comp.pld, batch[middle], float(untilted[middle]))
        if theta == 0.0:
            return np.full(len(batch), np.inf)
        tilted = Composition(comp.pld, comp.tail, theta)
        widths = [hi - lo + 1 for lo, hi in tilted.windows(batch)]
        size = int(sfft.next_fast_len(max(max(widths), comp.probs.size), real=True))
        try:
            lower, rows, inf_masses = tilted.power_rows(np.array(batch), size=size)
        except OverflowError:
            return np.full(len(batch), np.inf)
        return epsilons_from_pmfs(comp.h, lower, rows, inf_masses, self.delta)

    def _choose(self, last: int, max_excess: float) -> tuple[int | None, float]:
        """(grid, measured excess): the coarsest grid whose epsilon at ``last`` is within ``max_excess`` of the
        accountant's own value there (:meth:`exact`); ``None`` (and 0) where ``last`` is read directly.

        Where the accountant's untilted value itself is more than ``max_excess / 2`` above its own (the FFT's
        round-off bound at a tiny delta), the curve composes tilted as well (:meth:`_tilted_values`). The
        connect-the-dots excess scales with h^2 (about 4x per coarser grid): measured two grids below the
        accountant's, it predicts the coarsest grid that fits, which is then measured (and refined while it does
        not fit). Smaller counts have a smaller relative excess (tests/privacy/test_epsilon_curve.py)."""
        if last <= 1 or self._direct(last):
            return None, 0.0
        exact = self.exact(last)
        finest = self.acc._grid(last, self.level)
        if not (math.isfinite(exact) and exact > 0):
            return finest, 0.0
        self.tilted = self._untilted_exact(last) > exact * (1.0 + 0.5 * max_excess)

        def excess_on(grid: int) -> float:
            value = self._on(grid, [last]).get(last, math.inf)  # absent: beyond the memory bound
            return value / exact - 1.0 if math.isfinite(value) else math.inf

        probe = max(finest - 2, -MAX_COARSENING)
        measured = excess_on(probe)
        if measured <= max_excess:
            grid = probe - int(math.log(max_excess / max(measured, 1e-12), 4.0))  # predicted by h^2
            grid = max(grid, -MAX_COARSENING)
        else:
            grid = probe + 1
        while grid < finest:
            value = measured if grid == probe else excess_on(grid)
            if value <= max_excess:
                return grid, max(value, 0.0)
            grid += 1
        return finest, max(excess_on(finest), 0.0)

    def values(self, counts: list[int]) -> dict[int, float]:
        """Upper bounds on epsilon after each of ``counts`` (>= 2) compositions: >= the accountant's value of this
        level up to round-off, within about ``1 + excess`` of it."""
        if self.grid is None:
            for c in counts:
                self._exact_risk(c)
            return {c: self.exact(c) for c in counts}
        by_grid: dict[int, list[int]] = {}
        out: dict[int, float] = {}
        for c in counts:
            grid = self.grid
            if grid > 0:  # never finer than the accountant's own grid for c; its composition by squaring as it is
                if self._direct(c):
                    out[c] = self.exact(c)
                    self._exact_risk(c)
                    continue
                grid = min(grid, self.acc._grid(c, self.level))
            by_grid.setdefault(grid, []).append(c)
        for grid, group in by_grid.items():
            out.update(self._on(grid, group))
        for c in counts:
            if c not in out:  # beyond the memory bound on the curve's grid: the accountant's own composition
                out[c] = self.exact(c)
                self._exact_risk(c)
        return out


def curve_counts(values: Callable[[list[int]], dict[int, float]], start: int, last: int,
                 ratio: float) -> Iterator[tuple[int, float]]:
    """(c, value) at counts ``start = c_0 < c_1 < ... = last`` with value(c_{i+1}) <= ``ratio`` value(c_i)
    wherever c_{i+1} > c_i + 1, lazily.

    ``values`` is called with batches of counts. The first :data:`FIRST_COUNTS` counts come first, as they are
    (a run's first steps need them at once; consecutive counts always qualify). Then a pilot (a ladder 1.25x
    apart) and, in every gap that breaks the condition, counts spaced by the gap's own growth exponent, until none
    does; of those, each point keeps the farthest count that still meets the condition.
    """
    head = list(range(start, min(last, start + FIRST_COUNTS - 1) + 1))
    known: dict[int, float] = dict(values(head))
    yield from ((c, known[c]) for c in head)
    begin = head[-1]
    if begin >= last:
        return

    def evaluate(counts: set[int]) -> None:
        new = sorted(c for c in counts if c not in known and begin < c <= last)
        if new:
            known.update(values(new))

    pilot = {last}
    c = float(begin)
    while c < last:
        pilot.add(int(c))
        c *= 1.25
    evaluate(pilot)
    for _ in range(64):  # each pass at least halves every failing gap; 64 passes cover any count below 2^64
        counts = sorted(k for k in known if k >= begin)
        wanted: set[int] = set()
        for a, b in zip(counts, counts[1:], strict=False):
            ea, eb = known[a], known[b]
            if b == a + 1 or eb <= ratio * ea:
                continue
            exponent = math.log(eb / ea) / math.log(b / a) if ea > 0 and math.isfinite(eb) else 1.0
            step = 1.0 + 0.9 * (ratio ** (1.0 / min(1.0, max(exponent, 0.05))) - 1.0)  # count ratio per point
            new = {min(b - 1, max(a + 1, int(a * step ** k))) for k in range(1, 1 + math.ceil(
                math.log(b / a) / math.log(step)))}
            new.add((a + b) // 2)
            wanted |= new
        if not wanted:
            break
        evaluate(wanted)
    counts = sorted(k for k in known if k >= begin)
    i = 0
    while counts[i] < last:
        j = i + 1
        limit = ratio * known[counts[i]]
        while j + 1 < len(counts) and known[counts[j + 1]] <= limit:
            j += 1
        yield counts[j], known[counts[j]]
        i = j


def epsilon_curve(acc: Any, compositions: int, delta: float, rtol: float, start: int = 1, *,
                  fine_delta: float) -> Iterator[tuple[int, float]]:
    """The curve of :meth:`~lightning_dpts.privacy.StructuredSubsamplingAccountant.epsilon_curve` (arguments
    checked there) for the accountant ``acc`` (a :class:`~lightning_dpts.privacy.ProfileAccountant`, whose read-out
    levels split at ``fine_delta``); see the module docstring."""
    for count, value, _ in _curve(acc, compositions, delta, rtol, start, fine_delta, False):
        yield count, value


def risk_curve(acc: Any, compositions: int, delta: float, rtol: float, start: int = 1, *,
               fine_delta: float) -> Iterator[tuple[int, float, RiskReadout]]:
    """:func:`epsilon_curve` with the risk read-outs of every point (TPR at FPR, mu-GDP down to ``delta``), read from
    the same composed rows (:mod:`lightning_dpts.privacy.risk`). Like epsilon they grow with the count, so each
    point's read-outs bound those of every count it stands for; they are upper bounds (pessimistic PLDs)."""
    for count, value, readout in _curve(acc, compositions, delta, rtol, start, fine_delta, True):
        assert readout is not None
        yield count, value, readout


def _curve(acc: Any, compositions: int, delta: float, rtol: float, start: int, fine_delta: float,
           with_risk: bool) -> Iterator[tuple[int, float, RiskReadout | None]]:
    start = max(start, 1)
    if compositions < start:
        return
    max_excess = CURVE_EXCESS_SHARE * rtol
    last = compositions
    # the largest count below the fine-only threshold (the coarse level serves only counts up to it)
    coarse_last = min(last, max(1, int(1e-3 * fine_delta / acc.tail_mass_truncation)))
    while coarse_last > 1 and acc._fine_only(coarse_last):
        coarse_last -= 1
    fine = coarse = None
    if delta >= fine_delta:
        coarse = _Level(acc, 0, delta, coarse_last, max_excess)
    if delta < fine_delta or acc._fine_only(last):
        fine = _Level(acc, 1, delta, last, max_excess)
    boundary = None  # the coarse level at fine_delta, where it may decide (delta just below fine_delta)
    if delta < fine_delta and coarse_last >= 2:
        assert fine is not None
        # probed on a grid coarser than the accountant's (an upper bound on its values): most runs end here
        probe = _Level(acc, 0, fine_delta, coarse_last, max_excess, grid=min(fine.grid or 0, 0))
        probes = sorted({max(start, 2)} | {max(start, 2, min(coarse_last, int(f * coarse_last))) for f in PROBES})
        probes = [c for c in probes if c <= coarse_last]
        upper, own = probe.values(probes), fine.values(probes)
        if any(upper[c] > LEVEL_MARGIN * own[c] for c in probes):
            boundary = _Level(acc, 0, fine_delta, coarse_last, max_excess)
    excess = max(level.excess for level in (fine, coarse, boundary) if level is not None)
    readouts: dict[int, RiskReadout] | None = {} if with_risk else None
    for level in (fine, coarse):  # not the boundary level: its read-outs would be at fine_delta
        if level is not None:
            level.readouts = readouts

    def values(counts: list[int]) -> dict[int, float]:
        """As the accountant's epsilon (``_epsilon_units``) at each count, on the curve's grids."""
        out: dict[int, float] = {}
        if 1 in counts:
            out[1] = acc._epsilon_units(1, delta)  # one unit: the profile itself
            if readouts is not None:
                readouts[1] = acc.risk_after(1, delta)
        rest = [c for c in counts if c > 1]
        high = [c for c in rest if acc._fine_only(c) or coarse is None]
        low = [c for c in rest if not (acc._fine_only(c) or coarse is None)]
        if high:
            assert fine is not None
            out.update(fine.values(high))
            near = [c for c in high if not acc._fine_only(c)]
            if boundary is not None and near:
                for c, v in boundary.values(near).items():
                    out[c] = max(out[c], v)
        if low:
            assert coarse is not None
            out.update(coarse.values(low))
        return out

    for count, value in curve_counts(values, start, last, (1.0 + rtol) / (1.0 + excess)):
        yield count, value, None if readouts is None else readouts[count]

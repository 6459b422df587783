"""A stage's distribution in at most 64 bins, from the buckets its percentiles already use.

Every statistics path counts finite values in relative buckets (the sketch format,
:mod:`advmon.stats.sketch_format`): 128 per power of two, about 16,000 for a window
of 63 octaves of each sign. :func:`coarsened` merges such fine bins into at most
``max_bins`` bins whose edges are fine-bin edges, so the counts stay exact (no value
is re-binned by estimate) and every edge is an exact float. Where the fine bins fit,
they are kept as they are. Otherwise the bins go where the values are: the widest
empty stretches (the gap between a run's bulk and its outliers) become one empty
bin each, and each stretch of values gets bins in proportion to its share of the
values, as power-of-two runs of fine bins (the bulk stays sharp, a lone outlier gets
one bin); few distinct values (GRPO's of binary rewards) keep a fine bin each. NaN
and Inf are not in a histogram: the record counts them (``nan_count``, ``inf_count``).

Example:
    >>> h = coarsened([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0], [1, 0, 2, 5, 0, 0, 1, 1], max_bins=4)
    >>> h.edges, h.counts
    ((-1.0, 0.0, 0.5, 2.0, 8.0), (1.0, 7.0, 0.0, 2.0))
    >>> far = coarsened(list(range(1006)), [3, 4, 5] + [0] * 1000 + [1] + [0], max_bins=5)
    >>> far.edges, far.counts  # the bulk, the gap, the outlier
    ((0.0, 1.0, 2.0, 3.0, 1003.0, 1004.0), (3.0, 4.0, 5.0, 0.0, 1.0))
    >>> Histogram.from_dict(far.to_dict()) == far
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from advmon.record import Histogram

__all__ = ["MAX_BINS", "Histogram", "coarsened"]

#: Bins a record's histogram has at most.
MAX_BINS = 64
#: At most this share of the bins are empty stretches (the rest hold values).
_GAP_SHARE = 4


def coarsened(
    edges: Sequence[float] | np.ndarray, counts: Sequence[float] | np.ndarray, max_bins: int = MAX_BINS
) -> Histogram | None:
    """Fine bins ``[edges[k], edges[k + 1])`` holding ``counts[k]`` merged into at most ``max_bins`` bins.

    ``None`` when every count is 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    occupied = np.flatnonzero(counts)
    if occupied.size == 0:
        return None
    counts = counts[occupied[0] : occupied[-1] + 1]  # the empty ends are dropped
    start = int(occupied[0])  # fine bin of counts[0]
    offsets = occupied - occupied[0]
    if counts.size <= max_bins:
        cuts = np.arange(counts.size + 1)
    elif 2 * offsets.size - 1 <= max_bins:  # few distinct values (binary rewards' advantages): each its fine bin
        cuts = np.unique(np.concatenate([offsets, offsets + 1]))  # the empty stretches between them: one bin each
    else:
        cuts = _cuts(counts, offsets, max_bins, start)
    merged = np.add.reduceat(counts, cuts[:-1])
    return Histogram(edges=tuple(edges[start + cuts].tolist()), counts=tuple(merged.tolist()))


def _cuts(counts: np.ndarray, occupied: np.ndarray, max_bins: int, origin: int) -> np.ndarray:
    """Bin boundaries (fine-bin offsets, first 0, last ``len(counts)``) of at most ``max_bins`` bins;
    ``occupied`` are the non-empty offsets, ``origin`` the absolute fine bin of offset 0."""
    gap_lengths = np.diff(occupied) - 1
    # An empty stretch is worth a bin of its own where equal bins would be wider than it: 64 equal bins
    # of a unit-scale bulk and an outlier at 7000 put the whole bulk in one or two bins. Shorter gaps,
    # the widest first, stay inside the bins of the values around them.
    uniform = 1 << max(0, math.ceil(math.log2(counts.size / max_bins)))  # fine bins per equal bin
    wide = np.flatnonzero(gap_lengths >= 2 * uniform)
    kept = min(wide.size, max_bins // _GAP_SHARE)
    widest = np.sort(wide[np.argsort(-gap_lengths[wide], kind="stable")[:kept]])
    # Stretches of values: [begin, end) between the kept gaps.
    begins = np.concatenate([[0], occupied[widest + 1]])
    ends = np.concatenate([occupied[widest] + 1, [counts.size]])
    if widest.size == 0:  # one stretch: equal power-of-two bins
        return np.array([0, *(c - origin for c in _power_of_two_cuts(origin, origin + counts.size, max_bins))])
    cumulative = np.concatenate([[0.0], np.cumsum(counts)])
    mass = cumulative[ends] - cumulative[begins]
    budget = max_bins - len(widest)  # one bin per kept gap
    shares = _apportioned(budget, mass.tolist(), (ends - begins).tolist())
    cuts = [origin]  # absolute fine bins here, in plain Python: a few per stretch, up to 17 stretches
    for begin, end, bins in zip(begins.tolist(), ends.tolist(), shares):
        if begin > cuts[-1] - origin:
            cuts.append(origin + begin)  # a kept gap ends where this stretch begins
        cuts += _power_of_two_cuts(origin + begin, origin + end, bins)
    return np.array(cuts) - origin


def _apportioned(budget: int, mass: list[float], widths: list[int]) -> list[int]:
    """Bins per stretch: at least one each, the rest by share of the values, never more than its fine bins.

    The next bin always goes to the stretch with the most values per bin that has room (at most
    ``budget`` small steps over at most ``max_bins // 4 + 1`` stretches: plain Python is quickest).
    """
    total = sum(mass)
    bins = [min(w, max(1, int(budget * m / total))) for m, w in zip(mass, widths)]  # the proportional share
    while sum(bins) > budget:  # the ones lifted to a single bin took more than their share: take it back
        index = max((i for i, b in enumerate(bins) if b > 1), key=lambda i: bins[i] / max(mass[i], 1e-300))
        bins[index] -= 1
    for _ in range(budget - sum(bins)):  # what rounding down (or a stretch without room) left over
        best, best_load = -1, -1.0
        for i, (m, b, w) in enumerate(zip(mass, bins, widths)):
            if b < w and m / b > best_load:
                best, best_load = i, m / b
        if best < 0:
            break  # every stretch has one bin per fine bin already
        bins[best] += 1
    return bins


def _power_of_two_cuts(begin: int, end: int, bins: int) -> list[int]:
    """Interior and end cuts of absolute fine bins ``[begin, end)`` in at most ``bins`` bins, each a
    power-of-two number of fine bins aligned to that power (steps at one level share their bins), ``end`` included."""
    if bins <= 1:
        return [end]  # one bin: no aligned power of two holds a stretch that crosses zero
    shift = 0
    while ((end - 1) >> shift) - (begin >> shift) + 1 > bins:  # ends: two aligned bins hold any stretch
        shift += 1
    step = 1 << shift
    interior = range(((begin >> shift) + 1) * step, end, step)
    return [*interior, end]

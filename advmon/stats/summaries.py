"""The host half's statistics of one stage: its parts merged and finished, in NumPy.

:func:`summarize` merges any number of parts (several calls of one training step,
from any path) and finishes the statistics; :func:`summarize_with_histogram` also
keeps the histogram the percentiles were read from (:mod:`advmon.stats.histograms`).
Merging only ever adds counts and sums and takes minima, maxima and histogram bins;
it never averages averages.

Example:
    >>> import torch
    >>> from advmon.stats.parts import value_part
    >>> stats = summarize([value_part(torch.tensor([1.0, 2.0, float("nan"), 4.0]))])
    >>> stats["mean"], stats["count"], stats["nan_count"], stats["p50"]
    (2.3333333333333335, 4.0, 1.0, 2.0)
"""

from __future__ import annotations

import functools
import math
from typing import Iterable

import numpy as np

from advmon.record import PERCENTILES, VALUE_KEYS, Histogram
from advmon.stats.histograms import MAX_BINS, coarsened
from advmon.stats.sketch_format import (
    _ABSSUM,
    _ADDITIVE,
    _BIAS,
    _CENTER,
    _CSUM,
    _CSUMSQ,
    _MAX,
    _MIN,
    _N_FINITE,
    _N_INF,
    _N_NAN,
    _N_SCALARS,
    _N_VALID,
    _NEGATIVE_TINY,
    _PAD,
    _PER_OCTAVE,
    _POSITIVE_TINY,
    _SIGN,
    _SCALE,
    _TOP,
    _ZERO,
    HIST_LEN,
    REPRESENTATIVES,
    WINDOW,
    HostPart,
    Part,
    bucket_bounds,
    canonical_top,
    host_positions,
    lower_edges,
    recentered_sums,
    representatives,
    scale_exponent,
    shifted_histogram,
    top_position,
)
from advmon.stats.transfer import to_host

__all__ = ["PERCENTILES", "VALUE_KEYS", "summarize", "summarize_with_histogram"]

def summarize(parts: Iterable[Part | HostPart]) -> dict[str, float]:
    """Finish the statistics of one stage from all its parts (see module docstring).

    Device parts are transferred here; the monitor instead transfers a whole
    record at once with :func:`pack` and passes :class:`HostPart` objects.

    Returns:
        A dict with every key of :data:`VALUE_KEYS`; unavailable values are ``nan``.
    """
    host_parts = [p if isinstance(p, HostPart) else to_host(p) for p in parts]
    if host_parts and all(p.kind == "exact" for p in host_parts):
        values = np.concatenate([p.arrays[0] for p in host_parts])
        weights = np.concatenate([p.arrays[1] for p in host_parts])
        return _exact_summary(values, weights)
    return _sketch_summary(host_parts)


def summarize_with_histogram(parts: Iterable[Part | HostPart]) -> tuple[dict[str, float], Histogram | None]:
    """:func:`summarize`, and the finite values' distribution in at most 64 bins (:mod:`advmon.stats.histograms`).

    The histogram is the one the percentiles are read from, merged over the parts and
    coarsened (exact parts, small, are binned the same way); ``None`` without a finite value.

    Example:
        >>> import torch
        >>> from advmon.stats.parts import value_part
        >>> summary, histogram = summarize_with_histogram([value_part(torch.tensor([0.0, 1.0, 1.0, 3.0]))])
        >>> summary["mean"], histogram.total, histogram.edges[0] <= 0.0, histogram.edges[-1] > 3.0
        (1.25, 4.0, True, True)
    """
    host_parts = [p if isinstance(p, HostPart) else to_host(p) for p in parts]
    if host_parts and all(p.kind == "exact" for p in host_parts):
        values = np.concatenate([p.arrays[0] for p in host_parts])
        weights = np.concatenate([p.arrays[1] for p in host_parts])
        summary = _exact_summary(values, weights)
        if not summary["count"] > summary["nan_count"] + summary["inf_count"]:
            return summary, None
        return summary, _display_histogram(*_merged_histogram(host_parts, summary["min"], summary["max"]))
    summary, merged = _sketch_summary_and_histogram(host_parts)
    return summary, None if merged is None else _display_histogram(*merged)


def _empty_summary(count: float = 0.0, nan_count: float = 0.0, inf_count: float = 0.0) -> dict[str, float]:
    summary = dict.fromkeys(VALUE_KEYS, math.nan)
    summary.update(count=count, nan_count=nan_count, inf_count=inf_count)
    return summary


def _exact_summary(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    if np.all(weights == 1):  # rewards and pre_norm: every value counts once
        return _unweighted_summary(values)
    valid = weights > 0
    nan = valid & np.isnan(values)
    finite = valid & np.isfinite(values)
    count = float(weights[valid].sum())
    nan_count = float(weights[nan].sum())
    inf_count = float(weights[valid & np.isinf(values)].sum())
    kept, kept_weights = values[finite], weights[finite]
    n = float(kept_weights.sum())
    summary = _empty_summary(count, nan_count, inf_count)
    if n == 0:
        return summary
    order = np.argsort(kept)  # ties are equal values: their order cannot change an order statistic
    ordered, cumulative = kept[order], np.cumsum(kept_weights[order])
    low, high = float(ordered[0]), float(ordered[-1])
    mean, variance = _centered_moments(kept, kept_weights, n, low, high)

    def order_statistic(rank: int) -> float:
        return float(ordered[np.searchsorted(cumulative, rank, side="right")])

    summary.update(
        mean=mean,
        std=math.sqrt(variance),
        min=low,
        max=high,
        abs_mean=float(np.dot(kept_weights, np.abs(kept)) / n),
    )
    summary.update(_percentiles(n, order_statistic))
    return summary


def _unweighted_summary(values: np.ndarray) -> dict[str, float]:
    """:func:`_exact_summary` when every weight is 1: a plain sort, no weighted ranks (3x faster at 4096 values)."""
    kept = values[np.isfinite(values)]
    n = kept.size
    nan_count = float(np.count_nonzero(np.isnan(values)))
    summary = _empty_summary(float(values.size), nan_count, float(values.size - n) - nan_count)
    if n == 0:
        return summary
    ordered = np.sort(kept)
    low, high = float(ordered[0]), float(ordered[-1])
    mean, variance = _centered_moments(kept, None, n, low, high)
    summary.update(
        mean=mean,
        std=math.sqrt(variance),
        min=low,
        max=high,
        abs_mean=float(np.abs(kept).mean()),
    )
    summary.update(_percentiles(float(n), lambda rank: float(ordered[rank])))
    return summary


def _centered_moments(
    values: np.ndarray, weights: np.ndarray | None, n: float, low: float, high: float
) -> tuple[float, float]:
    """Mean and variance of finite values in ``[low, high]``, summed as deviations from the range's midpoint.

    The sketches' rule (:func:`~advmon.stats.sketch_format.binning`): with ``d = x - center``, the mean is
    ``center + sum(d) / n`` and the variance ``sum(d^2) / n - (sum(d) / n)^2``. Every deviation is
    within the range, so the rounding errors scale with the range, never with the data's offset,
    and a constant input has a std of exactly 0. Deviations from a rounded mean instead keep that
    mean's error squared in the variance: 1e-4 of the std of three values at -1e8 with a spread of
    1e-6, 4e-6 of that of 60,000 at 1e12 with a spread of 1e-3.
    """
    center = low / 2 + high / 2  # halves first: no overflow near the float64 limits
    deviation = values - center
    weighted = deviation if weights is None else weights * deviation
    first = float(weighted.sum()) / n
    second = float(np.dot(weighted, deviation)) / n
    return min(max(center + first, low), high), max(second - first * first, 0.0)


def _percentiles(n: float, order_statistic) -> dict[str, float]:
    """NumPy's linear percentiles from a function giving the r-th smallest value."""
    result = {}
    for name, q in PERCENTILES:
        virtual = (n - 1) * q
        below = math.floor(virtual)
        above = min(below + 1, int(n) - 1)
        result[name] = _lerp(order_statistic(below), order_statistic(above), virtual - below)
    return result


def _lerp(a: float, b: float, t: float) -> float:
    """Interpolate exactly as ``numpy.quantile`` does (stable at both ends)."""
    if a == b:
        return a
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def _sketch_summary(parts: list[HostPart]) -> dict[str, float]:
    return _sketch_summary_and_histogram(parts)[0]


def _sketch_summary_and_histogram(
    parts: list[HostPart],
) -> tuple[dict[str, float], tuple[int, np.ndarray] | None]:
    """The summary, and the merged histogram it read its percentiles from (``None``: no finite value)."""
    moments = [_moments(part) for part in parts]
    totals = np.sum([m[_ADDITIVE] for m in moments], axis=0) if moments else np.zeros(_ABSSUM + 1)
    summary = _empty_summary(float(totals[_N_VALID]), float(totals[_N_NAN]), float(totals[_N_INF]))
    n = float(totals[_N_FINITE])
    if n == 0:
        return summary, None
    with_values = [m for m in moments if m[_N_FINITE] > 0]
    low = min(m[_MIN] for m in with_values)
    high = max(m[_MAX] for m in with_values)
    center = low / 2 + high / 2
    first_sum, second_sum = recentered_sums(
        ((m[_N_FINITE], m[_CENTER], m[_CSUM], m[_CSUMSQ]) for m in with_values), center
    )
    mean_deviation = first_sum / n
    variance = max(second_sum / n - mean_deviation * mean_deviation, 0.0)
    summary.update(
        mean=float(min(max(center + mean_deviation, low), high)),
        std=math.sqrt(variance),
        min=float(low),
        max=float(high),
        abs_mean=float(totals[_ABSSUM] / n),
    )
    top, counts = _merged_histogram(parts, low, high)
    summary.update(_histogram_percentiles(n, counts, top, low, high, _merged_representatives(parts, top, low, high)))
    return summary, (top, counts)


def _moments(part: HostPart) -> np.ndarray:
    """The sketch scalars of a part (computed on the host for exact parts)."""
    if part.kind == "sketch":
        return part.arrays[0]
    values, weights = part.arrays
    valid = weights > 0
    finite = valid & np.isfinite(values)
    kept, w = values[finite], weights[finite]
    scalars = np.zeros(_N_SCALARS)
    scalars[_N_VALID] = weights[valid].sum()
    scalars[_N_NAN] = weights[valid & np.isnan(values)].sum()
    scalars[_N_FINITE] = w.sum()
    scalars[_N_INF] = scalars[_N_VALID] - scalars[_N_NAN] - scalars[_N_FINITE]
    scalars[_ABSSUM] = np.dot(w, np.abs(kept))
    if kept.size:
        scalars[_MIN], scalars[_MAX] = kept.min(), kept.max()
        scalars[_CENTER] = scalars[_MIN] / 2 + scalars[_MAX] / 2
        deviation = kept - scalars[_CENTER]
        scalars[_CSUM] = np.dot(w, deviation)
        scalars[_CSUMSQ] = np.dot(w, deviation * deviation)
    return scalars


def _merged_histogram(parts: list[HostPart], low: float, high: float) -> tuple[int, np.ndarray]:
    """All parts' finite values in the buckets of one window, at the largest magnitude's: (top, counts).

    A sketch's buckets shift to the common top (the ones below its window join the tiny buckets, as they
    would in one call on all the values); exact parts' values are bucketed here by the same rule.
    """
    largest = max(-low, high)
    top = top_position(largest, scale_exponent(largest))
    counts = np.zeros(HIST_LEN)
    for part in parts:
        if part.kind == "sketch":
            scalars, histogram = part.arrays[:2]
            if scalars[_N_FINITE] > 0:
                counts += shifted_histogram(histogram, top - canonical_top(int(scalars[_TOP]), int(scalars[_SCALE])))
        else:
            values, weights = part.arrays
            finite = (weights > 0) & np.isfinite(values)
            counts += np.bincount(_bucket_indices(values[finite], top, scale_exponent(largest)),
                                  weights=weights[finite], minlength=HIST_LEN)
    return top, counts


def _merged_representatives(parts: list[HostPart], top: int, low: float, high: float) -> np.ndarray | None:
    """Each regular bucket's representative (its value of largest magnitude; NaN where empty) in the merged window,
    or ``None`` where a part kept none or more than :data:`REPRESENTATIVES` buckets hold values.

    Parts merge as the counts do: each bucket's representative is the largest magnitude any part has for it,
    and what falls below the merged window (its tiny buckets) has none, as in one call on all the values.
    """
    candidates = []
    for part in parts:
        if part.kind == "sketch":
            scalars, _, table = part.arrays
            if scalars[_N_FINITE] == 0:
                continue
            values = representatives(table, int(scalars[_SCALE]))
            if values is None:
                return None
        else:
            values, weights = part.arrays
            values = values[(weights > 0) & np.isfinite(values) & (values != 0)]
        candidates.append(values)
    if not candidates:
        return None
    values = np.concatenate(candidates)
    index = _bucket_indices(values, top, scale_exponent(max(-low, high)))
    regular = (index < _NEGATIVE_TINY) | ((index > _POSITIVE_TINY) & (index < _PAD))
    values, index = values[regular], index[regular]
    if values.size == 0 or np.unique(index).size > REPRESENTATIVES:
        return None  # nothing but zero and tiny values, or too many buckets
    order = np.lexsort((np.abs(values), index))  # by bucket, then magnitude: each bucket's last is its largest
    values, index = values[order], index[order]
    last = np.append(index[1:] != index[:-1], True)
    merged = np.full(HIST_LEN, np.nan)
    merged[index[last]] = values[last]
    return merged


def _bucket_indices(values: np.ndarray, top: int, scale: int) -> np.ndarray:
    """Every finite value's index in the histogram of a window whose top position is ``top``."""
    biased = host_positions(values, scale)
    negative = biased >= _SIGN
    position = (biased & (_SIGN - 1)) - _BIAS - scale * _PER_OCTAVE  # canonical
    below_top = top - position  # 0 for the top bucket
    in_window = below_top < WINDOW
    index = np.where(negative, np.where(in_window, below_top, _NEGATIVE_TINY),
                     np.where(in_window, _PAD - 1 - below_top, _POSITIVE_TINY))
    return np.where((biased & (_SIGN - 1)) == 0, _ZERO, index)


def _histogram_percentiles(n: float, counts: np.ndarray, top: int, low: float, high: float,
                           representative: np.ndarray | None = None) -> dict[str, float]:
    """NumPy's linear percentiles with each order statistic read inside its bucket.

    The rank's bucket, narrowed to ``[min, max]``, holds the order statistic; the estimate is interpolated
    by rank inside it, so it is within the bucket's width (at most 1/128 of its lower edge) of the true
    value. Zero's bucket gives exactly 0. The ten order statistics are read at once.

    With ``representative`` (few buckets hold values), a bucket's value of largest magnitude bounds it on
    that side; where the bucket's other side is unknown (the data's extreme is not in it) the estimate is
    that value itself: exact for a bucket holding one value, still within the bucket for more.
    """
    cumulative = np.cumsum(counts)
    lower, upper = bucket_bounds(top)
    virtual = (n - 1) * np.array([q for _, q in PERCENTILES])
    below = np.floor(virtual)
    ranks = np.concatenate([below, np.minimum(below + 1, n - 1)])
    b = np.searchsorted(cumulative, ranks, side="right")
    before = np.where(b > 0, cumulative[np.maximum(b - 1, 0)], 0.0)
    left, right = np.maximum(lower[b], low), np.minimum(upper[b], high)
    if representative is not None:
        held = representative[b]
        kept = ~np.isnan(held)
        positive = b > _ZERO
        right = np.where(kept & positive, np.minimum(right, held), right)  # the largest in a positive bucket
        left = np.where(kept & ~positive, np.maximum(left, held), left)  # the most negative in a negative one
        snap = kept & np.where(positive, low < lower[b], high > upper[b])  # its side toward zero is unknown
    estimate = np.minimum(np.maximum(left + (ranks - before + 0.5) / counts[b] * (right - left), left), right)
    if representative is not None:
        estimate = np.where(snap, held, estimate)
    estimate = np.where(b == _ZERO, 0.0, estimate)
    estimate = np.where(ranks <= 0, low, np.where(ranks >= n - 1, high, estimate))
    statistics = estimate.tolist()
    count = len(PERCENTILES)
    return {name: _lerp(statistics[i], statistics[count + i], float(virtual[i] - below[i]))
            for i, (name, _) in enumerate(PERCENTILES)}


def _display_histogram(top: int, counts: np.ndarray) -> Histogram | None:
    """The merged buckets coarsened for display: zero and the tiny buckets as one bin around 0.

    A negative bucket holds ``(-upper, -lower]``; its display bin, half-open like every bin, starts one
    float above ``-upper`` and ends one above ``-lower``.
    """
    fine = np.concatenate([counts[:_NEGATIVE_TINY], [counts[_NEGATIVE_TINY : _POSITIVE_TINY + 1].sum()],
                           counts[_POSITIVE_TINY + 1 : _PAD]])
    edges = _display_edges(top)
    if np.count_nonzero(fine) > 2 * MAX_BINS:
        # Many distinct buckets: runs of _DISPLAY_RUN fine buckets first (what the 64 bins would merge anyway), so
        # that coarsening reads 2,017 bins, not 16,129; the run holding 0 starts there (WINDOW is a multiple).
        padded = np.concatenate([fine, np.zeros(-fine.size % _DISPLAY_RUN)])
        fine = padded.reshape(-1, _DISPLAY_RUN).sum(axis=1)
        edges = np.append(edges[:-1:_DISPLAY_RUN], edges[-1])
    return coarsened(edges, fine)


#: Fine buckets merged before coarsening a histogram of many distinct buckets (a sixteenth of an octave).
_DISPLAY_RUN = 8


@functools.lru_cache(maxsize=32)
def _display_edges(top: int) -> np.ndarray:
    """The display bins' edges for a window whose top position is ``top`` (kept for the tops seen last)."""
    magnitudes = lower_edges(np.arange(top - WINDOW + 1, top + 2))
    edges = np.concatenate([np.nextafter(-magnitudes[::-1], np.inf), magnitudes])
    edges.setflags(write=False)
    return edges

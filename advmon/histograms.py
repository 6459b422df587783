"""A stage's distribution in at most 64 bins, from the histogram its percentiles already use.

Every statistics path bins finite values at ``floor(x / 2**level)`` (the sketch
format, :mod:`advmon.sketch_format`); bins at one level nest exactly in the bins
of any coarser level. :func:`coarsened` merges neighbouring bins ``2**j`` at a
time until at most ``max_bins`` remain: the counts stay exact (no value is
re-binned by estimate), the edges are ``start + i * width`` with ``width`` a power
of two, and the empty bins at both ends are dropped. NaN and Inf are not in a
histogram: the record counts them (``nan_count``, ``inf_count``).

Example:
    >>> h = coarsened(level=-3, counts=[1, 0, 2, 5, 0, 0, 1, 1], first=-4, max_bins=4)
    >>> h.start, h.width, h.counts, h.edges()
    (-0.5, 0.25, (1.0, 7.0, 0.0, 2.0), [-0.5, -0.25, 0.0, 0.25, 0.5])
    >>> Histogram.from_dict(h.to_dict()) == h
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MAX_BINS", "Histogram", "coarsened"]

#: Bins a record's histogram has at most.
MAX_BINS = 64


@dataclass(frozen=True)
class Histogram:
    """Counts of finite values in equal bins ``[start + i * width, start + (i + 1) * width)``."""

    start: float
    width: float
    counts: tuple[float, ...]

    def edges(self) -> list[float]:
        """``len(counts) + 1`` edges, exact (``width`` is a power of two)."""
        return [self.start + i * self.width for i in range(len(self.counts) + 1)]

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    def to_dict(self) -> dict[str, Any]:
        """Compact JSON: the first edge, the width and whole counts as integers."""
        return {"start": self.start, "width": self.width,
                "counts": [int(c) if float(c).is_integer() else c for c in self.counts]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Histogram:
        return cls(float(data["start"]), float(data["width"]), tuple(float(c) for c in data["counts"]))


def coarsened(level: int, counts: Sequence[float] | np.ndarray, first: int, max_bins: int = MAX_BINS) -> Histogram | None:
    """Bin ``first + k`` of width ``2**level`` (holding ``counts[k]``) merged into at most ``max_bins`` bins.

    ``None`` when every count is 0.
    """
    counts = np.asarray(counts, dtype=np.float64)
    occupied = np.flatnonzero(counts)
    if occupied.size == 0:
        return None
    low, high = first + int(occupied[0]), first + int(occupied[-1])  # absolute bin numbers
    shift = 0
    while (high >> shift) - (low >> shift) + 1 > max_bins:
        shift += 1
    base = low >> shift
    merged = np.zeros((high >> shift) - base + 1)
    absolute = np.arange(low, high + 1, dtype=np.int64)
    np.add.at(merged, (absolute >> shift) - base, counts[low - first : high - first + 1])
    width = math.ldexp(1.0, level + shift)
    return Histogram(start=base * width, width=width, counts=tuple(float(c) for c in merged))

"""The sketch format every statistics path writes and the host merges.

A sketch :class:`Part` holds a scalar tensor (counts, sums, extrema, the
histogram's level and first bin, in the layout below) and a histogram whose bins
are ``floor(x / 2**level) - first``. Floor bins nest, so parts with different
levels merge exactly at the coarsest one. :mod:`advmon.stats` (the general
paths) and :mod:`advmon.prefix_sketch` (the prefix-mask fast path) both write it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

__all__ = ["SKETCH_BINS", "HostPart", "Part", "host_level", "recentered_sums"]

#: A histogram bin is at most ``(max - min) / SKETCH_BINS`` wide (a power of two).
SKETCH_BINS = 512
_SKETCH_LEVEL_SHIFT = SKETCH_BINS.bit_length() - 1  # log2(SKETCH_BINS)
_HIST_LEN = 2 * SKETCH_BINS + 2  # bins needed to span [min, max] at the chosen level
_TRASH_BIN = _HIST_LEN  # invalid entries are counted here and dropped

# Layout of a sketch part's scalar tensor.
# Counts and the absolute sum add up across parts; the centered sums are taken
# around the part's own center (the midpoint of its range) and shifted to merge.
_N_VALID, _N_NAN, _N_INF, _N_FINITE, _ABSSUM, _MIN, _MAX, _CENTER, _CSUM, _CSUMSQ, _LEVEL, _OFFSET = range(12)
_N_SCALARS = 12
_ADDITIVE = slice(_N_VALID, _ABSSUM + 1)


@dataclass(frozen=True)
class Part:
    """Statistics of one tensor from one call, still on the tensor's device.

    ``kind == "exact"``: ``tensors == (values, weights)``, float64 copies; an entry
    with weight 0 is not valid, weight ``w`` counts it ``w`` times (a row of a
    zero-stride expand view stands for its valid tokens).

    ``kind == "sketch"``: ``tensors == (scalars, histogram)``, see :func:`dense_part`.
    """

    kind: Literal["exact", "sketch"]
    tensors: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class HostPart:
    """A :class:`Part` after the transfer: the same layout as NumPy arrays."""

    kind: Literal["exact", "sketch"]
    arrays: tuple[np.ndarray, ...]


def host_level(low: float, high: float) -> int:
    """Host twin of the device's level rule (see ``_histogram_level``)."""
    spread = high - low
    largest_exp = math.frexp(max(abs(low), abs(high)))[1]
    level = math.frexp(spread)[1] - 1 - _SKETCH_LEVEL_SHIFT if spread > 0 else largest_exp - 62
    return max(level, largest_exp - 62)


def recentered_sums(pieces, center: float) -> tuple[float, float]:
    """Sums of ``x - center`` and ``(x - center)**2`` over pieces summed around their own centers.

    ``pieces`` yields ``(count, own center, sum of x - own center, sum of its squares)``:
    the parts of one stage as they merge, or the blocks of one part. Each piece's
    sums are shifted to ``center`` before they are added; centering every piece
    on its own range keeps the squares free of cancellation.
    """
    first_sum = second_sum = 0.0
    for count, own_center, first, second in pieces:
        shift = own_center - center
        first_sum += first + count * shift
        second_sum += second + 2 * shift * first + count * shift * shift
    return first_sum, second_sum

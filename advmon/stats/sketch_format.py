"""The sketch format every statistics path writes and the host merges.

A sketch :class:`Part` holds a scalar tensor (counts, sums, extrema, the
histogram's level and first bin, in the layout below) and a histogram whose bins
are ``floor(x / 2**level) - first``. Floor bins nest, so parts with different
levels merge exactly at the coarsest one. :mod:`advmon.stats.cpu_sketch` (the CPU's
general sketch), :mod:`advmon.stats.prefix_sketch` (the CPU's prefix-mask fast path),
:mod:`advmon.stats.device_sketch` and :mod:`advmon.stats.triton_sketch` all write it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import torch

__all__ = ["SKETCH_BINS", "Binning", "HostPart", "Part", "binning", "host_level", "recentered_sums", "scale_factors"]

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
    """Host twin of the device's level rule (see :func:`binning`)."""
    spread = high - low
    largest_exp = math.frexp(max(abs(low), abs(high)))[1]
    level = math.frexp(spread)[1] - 1 - _SKETCH_LEVEL_SHIFT if spread > 0 else largest_exp - 62
    return max(level, largest_exp - 62)


class Binning(NamedTuple):
    """How a part's values are binned, as device tensors (see :func:`binning`)."""

    level: torch.Tensor  #: int64: bins are ``2**level`` wide
    offset: torch.Tensor  #: float64: ``floor(low / 2**level)``, the first bin
    factors: tuple[torch.Tensor, torch.Tensor]  #: float64 powers of two whose product is ``2**-level``
    center: torch.Tensor  #: float64: ``low / 2 + high / 2``, around which moments are summed


def binning(low: torch.Tensor, high: torch.Tensor) -> Binning:
    """The bin width, first bin and moment center for finite values in ``[low, high]``.

    ``low`` and ``high`` are the finite values' extrema (``inf`` and ``-inf``
    when there are none). The width ``2**level`` is the largest power of two with
    ``width <= range / SKETCH_BINS``, found with ``frexp`` so that the host can
    recompute it bit for bit (:func:`host_level`). It is raised where needed so
    that ``|value| / width < 2**62`` (exact in int64); an empty range gets level
    0. Written in few ops: on a GPU each is a kernel launch.
    """
    center = torch.add(low / 2, high, alpha=0.5)  # low / 2 + high / 2: no overflow near the float64 limit
    spread = high - low
    _, exponents = torch.frexp(torch.stack([spread, torch.maximum(-low, high)]))  # low <= high: the largest |x|
    floor_level = exponents[1] - 62
    level = torch.maximum(torch.where(spread > 0, exponents[0] - (1 + _SKETCH_LEVEL_SHIFT), floor_level), floor_level)
    empty = spread < 0  # no finite value: inf - -inf is -inf
    level = level.masked_fill(empty, 0)  # masked_fill, not where: a where(..., 0) makes a tensor of the 0
    factors = scale_factors(level)
    offset = torch.floor(low * factors[0] * factors[1]).masked_fill_(empty, 0.0)  # exact: powers of two
    return Binning(level, offset, factors, center)


def scale_factors(level: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors whose product is ``2**-level`` (two: one could overflow)."""
    one = torch.ones((), dtype=torch.float64, device=level.device)
    minus = torch.neg(level)
    first = torch.div(minus, 2, rounding_mode="floor")
    return torch.ldexp(one, first), torch.ldexp(one, minus - first)


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

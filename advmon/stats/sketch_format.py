"""The sketch format every statistics path writes and the host merges.

A sketch :class:`Part` holds a scalar tensor (counts, sums, extrema, and where its
histogram's buckets start, in the layout below) and a histogram of *relative*
buckets fixed in advance, whatever the data: a finite value's bucket is read
straight from its float32 bits, the exponent and the top :data:`MANTISSA_BITS`
mantissa bits (one 16-bit shift, no ``log``), so a bucket ``[lo, hi)`` is at most
``lo / 128`` wide (0.78%). Every value inside a bucket is then within 0.78% of any
estimate inside it, which is what bounds a percentile: one exploding advantage, heavy
tails or eight decades of spread move no bucket edge (HDR histograms' buckets;
DDSketch's relative-error guarantee).

A part keeps :data:`WINDOW` buckets of each sign below its largest magnitude's
(63 powers of two, down to ``2**-63`` of the largest ``|x|``), one bucket for the
magnitudes below that ("tiny") on each side, one for zero and an always-empty one that
pads the length to an even number: :data:`HIST_LEN` int32 counts, 64,528 bytes, which
cross to the host as their bits, two to a float64 (:mod:`advmon.stats.transfer`).
Buckets are positions ``exponent * 128 + mantissa bits``; the part's :data:`_TOP` and :data:`_SCALE` say which position its last bucket
holds (:func:`canonical_top`), so parts merge exactly by shifting to the largest top
(a bucket that falls below the merged window joins "tiny", as it would have in one
call on all the values).

Where few buckets hold values, a part also keeps each one's *representative*, the
value of largest magnitude in it (:data:`REPRESENTATIVES` at most; the table,
:data:`TABLE_LEN` int32 float32 bits, 912 bytes: the sketch's weight up to 64 KiB): a bucket holding one value then
gives that value exactly, not a point interpolated inside the bucket, so a discrete
set of values (GRPO's group-normalized advantages, clipped or binary rewards) gives
those values. The table lists the float32 bits of the first buckets with values in
any order, :data:`EMPTY` after them; a part with more such buckets than
:data:`REPRESENTATIVES` fills it, which says "none kept" (:func:`representatives`).

Values are scaled by ``2**s`` before the float32 conversion only where their
magnitudes leave float32's normal range (:func:`scale_exponent`): scaling by a power
of two moves no value across a bucket edge, so ``s`` changes no bucket.

Layout of the histogram, by value ascending::

    [0, WINDOW)          negative buckets, position _TOP - i at index i
    WINDOW               negative tiny: (-2**floor, 0)
    WINDOW + 1           zero (either sign)
    WINDOW + 2           positive tiny: (0, 2**floor)
    [WINDOW + 3, _PAD)   positive buckets, position _TOP - WINDOW + 1 + j at index WINDOW + 3 + j
    _PAD = HIST_LEN - 1  always 0

:mod:`advmon.stats.cpu_sketch` (the CPU's general sketch), :mod:`advmon.stats.prefix_sketch`
(the CPU's prefix-mask fast path), :mod:`advmon.stats.device_sketch` and
:mod:`advmon.stats.triton_sketch` all write it; :mod:`advmon.stats.summaries` reads it.

Example:
    >>> bucket_edges(0, 0)   # 1.0's bucket: the lower edge of the one below, its own edges
    (0.99609375, 1.0, 1.0078125)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

__all__ = [
    "EMPTY",
    "HIST_LEN",
    "MANTISSA_BITS",
    "RELATIVE_BUCKET_WIDTH",
    "REPRESENTATIVES",
    "TABLE_LEN",
    "WINDOW",
    "HostPart",
    "Part",
    "PositionMaxima",
    "bucket_edges",
    "canonical_top",
    "fold_positions",
    "highest_position",
    "host_positions",
    "recentered_sums",
    "representatives",
    "scale_exponent",
    "top_position",
    "window_slices",
]

#: Mantissa bits that choose a bucket inside a power of two: 128 buckets per octave.
MANTISSA_BITS = 7
_PER_OCTAVE = 1 << MANTISSA_BITS
#: A bucket ``[lo, hi)`` is at most this share of ``lo`` wide (at the start of an octave).
RELATIVE_BUCKET_WIDTH = 1.0 / _PER_OCTAVE
#: Powers of two a part keeps buckets for, down from its largest magnitude's.
WINDOW_OCTAVES = 63
#: Buckets of each sign a part keeps.
WINDOW = WINDOW_OCTAVES * _PER_OCTAVE
#: The histogram's length: both signs' windows, their tiny buckets, zero, and a padding bucket (always 0).
HIST_LEN = 2 * WINDOW + 4
_NEGATIVE_TINY, _ZERO, _POSITIVE_TINY, _PAD = WINDOW, WINDOW + 1, WINDOW + 2, HIST_LEN - 1

#: Buckets whose representative (the value of largest magnitude in it) a part keeps, where no more hold values.
REPRESENTATIVES = 227  # GRPO's binary rewards in groups of up to 114: 2 (G - 1) values, and 0
#: The representatives' table: their float32 bits as int32, then :data:`EMPTY`; full (no EMPTY) = none kept.
TABLE_LEN = REPRESENTATIVES + 1
#: An unused table entry: int32's least value, the bits of -0.0, which no bucket but zero's holds.
EMPTY = -(1 << 31)

#: A float32's bits shifted right by 16: sign, exponent and top 7 mantissa bits, 0 to 65535.
FULL_POSITIONS = 1 << 16
#: Where negative values' positions start among those (the sign bit).
_SIGN = 1 << 15
#: The biased position of 1.0 (float32's exponent bias times 128): canonical positions are biased less this.
_BIAS = 127 * _PER_OCTAVE
#: Biased positions from here on are Inf and NaN (exponent field 255).
_NONFINITE = 255 * _PER_OCTAVE
#: Below this largest magnitude the window would reach float32's subnormals; above the other bound a float64
#: value would overflow float32 (``frexp`` exponents: ``2**(e - 1) <= |x| < 2**e``).
_SMALLEST_UNSCALED_EXPONENT = -62
_LARGEST_UNSCALED_EXPONENT = 127

# Layout of a sketch part's scalar tensor.
# Counts and the absolute sum add up across parts; the centered sums are taken
# around the part's own center (the midpoint of its range) and shifted to merge.
# _TOP is the top bucket's biased float32 position after scaling by 2**_SCALE (what
# a device reads off the bits); canonical_top gives the scale-free position.
_N_VALID, _N_NAN, _N_INF, _N_FINITE, _ABSSUM, _MIN, _MAX, _CENTER, _CSUM, _CSUMSQ, _TOP, _SCALE = range(12)
_N_SCALARS = 12
_ADDITIVE = slice(_N_VALID, _ABSSUM + 1)


@dataclass(frozen=True)
class Part:
    """Statistics of one tensor from one call, still on the tensor's device.

    ``kind == "exact"``: ``tensors == (values, weights)``, float64 copies; an entry
    with weight 0 is not valid, weight ``w`` counts it ``w`` times (a row of a
    zero-stride expand view stands for its valid tokens).

    ``kind == "sketch"``: ``tensors == (scalars, histogram, table)`` in the layout above.
    """

    kind: Literal["exact", "sketch"]
    tensors: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class HostPart:
    """A :class:`Part` after the transfer: the same layout as NumPy arrays."""

    kind: Literal["exact", "sketch"]
    arrays: tuple[np.ndarray, ...]


def scale_exponent(largest_magnitude: float) -> int:
    """The power of two finite values are scaled by before their float32 conversion: 0 unless they leave float32.

    ``0`` while the largest ``|x|`` is within ``[2**-63, 2**127)``: its window of 63
    octaves stays in float32's normal range and nothing overflows. Outside, the
    values are scaled so that the largest lands at the nearer end of that range.

    Example:
        >>> scale_exponent(3.0), scale_exponent(1e-30), scale_exponent(1e300)
        (0, 37, -870)
    """
    exponent = math.frexp(largest_magnitude)[1]
    return min(max(exponent, _SMALLEST_UNSCALED_EXPONENT), _LARGEST_UNSCALED_EXPONENT) - exponent


def highest_position(largest_magnitude: float, scale: int) -> int:
    """The largest magnitude's biased float32 position after scaling by ``2**scale`` (the scalars' ``_TOP``).

    When every value is zero any window does: the lowest whose tiny buckets are empty.

    Example:
        >>> highest_position(1.0, 0), highest_position(0.0, 0)
        (16256, 8064)
    """
    scaled = np.float32(math.ldexp(abs(largest_magnitude), scale))
    return max(int(scaled.view(np.uint32) >> 16), WINDOW)


def canonical_top(highest: int, scale: int) -> int:
    """The scale-free position of a part's top bucket from its scalars' ``_TOP`` and ``_SCALE``."""
    return highest - _BIAS - scale * _PER_OCTAVE


def top_position(largest_magnitude: float, scale: int) -> int:
    """The canonical position (``exponent * 128 + mantissa bits``) of the largest magnitude's bucket.

    Read from the same float32 conversion the values get, so the largest value is in it. When every
    value is zero any window does: the lowest whose tiny buckets are empty.

    Example:
        >>> top_position(1.0, 0), top_position(1.5, 0), top_position(0.5, 0), top_position(0.0, 0)
        (0, 64, -128, -8192)
    """
    return canonical_top(highest_position(largest_magnitude, scale), scale)


def host_positions(values: np.ndarray, scale: int) -> np.ndarray:
    """Biased float32 positions (0 to 65535, negatives from 32768) of float64 values scaled by ``2**scale``."""
    scaled = np.ldexp(values, scale).astype(np.float32)
    return (scaled.view(np.uint32) >> 16).astype(np.int64)


def cpu_positions(values: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Biased float32 positions of a contiguous CPU tensor's values (unscaled), as int32 for ``bincount``.

    The position is the high half of each float32: a strided int16 view of the bits,
    read as uint16, in one conversion to int32 (not int64: half the memory, and
    bincount reads it as it is; ``scratch``, float32 of the same size, takes the
    conversion of other dtypes).

    Example:
        >>> cpu_positions(torch.tensor([0.0, 1.0, -1.0, 1.5])).tolist()
        [0, 16256, 49024, 16320]
    """
    if values.dtype != torch.float32:
        values = (torch.empty(values.shape, dtype=torch.float32) if scratch is None else scratch).copy_(values)
    high_halves = values.reshape(-1).view(torch.int16).view(-1, 2)[:, 1]  # little-endian: the sign's half
    return high_halves.view(torch.uint16).to(torch.int32)


def fold_positions(counts: torch.Tensor, highest: int, zeros_to_drop: int = 0) -> torch.Tensor:
    """A part's histogram (:data:`HIST_LEN` counts) from counts per biased float32 position.

    ``counts`` has :data:`FULL_POSITIONS` entries; ``highest`` is the top bucket's biased
    position (:func:`highest_position`, the same scale). ``zeros_to_drop`` excluded entries
    were counted as zeros (a mask's zeroed entries).
    """
    counts = counts.to(torch.int64)
    lowest = highest - WINDOW + 1
    positive, negative = counts[:_SIGN], counts[_SIGN:]
    out = torch.zeros(HIST_LEN, dtype=torch.int64)
    out[:WINDOW] = negative[lowest : highest + 1].flip(0)
    out[_NEGATIVE_TINY] = negative[1:lowest].sum()
    out[_ZERO] = positive[0] + negative[0] - zeros_to_drop
    out[_POSITIVE_TINY] = positive[1:lowest].sum()
    out[_POSITIVE_TINY + 1 : _PAD] = positive[lowest : highest + 1]
    return out.to(torch.int32)


#: Values a CPU block's sample holds (:class:`PositionMaxima`).
_SAMPLE = 2048


def window_slices(highest: int) -> tuple[slice, slice]:
    """The biased positions of a part's negative and positive window buckets (``highest``: its top's)."""
    lowest = highest - WINDOW + 1
    return slice(_SIGN + lowest, _SIGN + highest + 1), slice(lowest, highest + 1)


class PositionMaxima:
    """The largest float32 bits (the value of largest magnitude) at each biased position, on the CPU paths.

    Kept only while few positions hold values: once more than :data:`REPRESENTATIVES` do (besides zero's
    two), no table can be made and :meth:`add` stops scattering (continuous data pays one check). If the
    part's window then holds few after all (the rest fell below it), :meth:`table` has the values added
    again through ``redo``.

    Example:
        >>> maxima = PositionMaxima()
        >>> values = torch.tensor([1.5, 1.5, -2.0, 3.0])
        >>> maxima.add(cpu_positions(values), values.view(torch.int32))
        >>> counts = torch.bincount(cpu_positions(values).long(), minlength=FULL_POSITIONS)
        >>> sorted(representatives(maxima.table(counts, highest_position(3.0, 0)).numpy(), 0).tolist())
        [-2.0, 1.5, 3.0]
    """

    def __init__(self) -> None:
        self.bits = torch.full((FULL_POSITIONS,), EMPTY, dtype=torch.int32)
        self.gave_up = False
        self._redoing = False  # adding everything again: never give up
        self._index: torch.Tensor | None = None

    def add(self, positions: torch.Tensor, bits: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Values' positions (any int dtype) and float32 bits (int32); ``counts`` per position so far, if known,
        lets a part with many positions give up before scattering."""
        if self.gave_up or (counts is not None and not self._redoing and self._too_many(counts)):
            self.gave_up = True
            return
        positions, bits = positions.reshape(-1), bits.reshape(-1)
        if counts is None and not self._redoing:
            # Without counts, a sample first: if a 64th of the values holds too many positions, so do they all
            # (a continuous block costs a scatter of 2,048 values, not of 131,072).
            stride = max(1, positions.numel() // _SAMPLE)
            self._scatter(positions[::stride], bits[::stride])
            if self._too_many(self.bits != EMPTY):
                self.gave_up = True
                return
        self._scatter(positions, bits)
        if counts is None and not self._redoing and self._too_many(self.bits != EMPTY):
            self.gave_up = True

    def _scatter(self, positions: torch.Tensor, bits: torch.Tensor) -> None:
        size = positions.numel()
        if self._index is None or self._index.numel() < size:
            self._index = torch.empty(size, dtype=torch.int64)  # reused: scatter wants int64, once per block
        index = self._index[:size].copy_(positions)
        self.bits.scatter_reduce_(0, index, bits, "amax")

    @staticmethod
    def _too_many(held: torch.Tensor) -> bool:
        return int(torch.count_nonzero(held)) > REPRESENTATIVES + 2  # +-0 may be two of them

    def table(self, counts: torch.Tensor, highest: int, redo=None) -> torch.Tensor:
        """The part's table (:data:`TABLE_LEN` int32) for its final ``counts`` per position and top.

        ``redo(maxima)`` adds every value again (scaled as counted) where :meth:`add` gave up too early.
        """
        negative, positive = window_slices(highest)
        held = torch.count_nonzero(counts[negative]) + torch.count_nonzero(counts[positive])
        if int(held) > REPRESENTATIVES:
            return torch.zeros(TABLE_LEN, dtype=torch.int32)  # full: none kept
        if self.gave_up:
            self.bits.fill_(EMPTY)
            self.gave_up, self._redoing = False, True
            redo(self)
            self._redoing = False
        bits = torch.cat([self.bits[negative].flip(0), self.bits[positive]])
        kept = bits[bits != EMPTY]
        table = torch.full((TABLE_LEN,), EMPTY, dtype=torch.int32)
        table[: kept.numel()] = kept
        return table


def representatives(table: np.ndarray, scale: int) -> np.ndarray | None:
    """A part's representatives as float64 values (unscaled), or ``None`` if it kept none (a full table)."""
    table = np.asarray(table, dtype=np.int32)
    if table[-1] != EMPTY:
        return None
    bits = table[table != EMPTY]
    return np.ldexp(bits.view(np.float32).astype(np.float64), -scale)


def bucket_edges(top: int, index: int) -> tuple[float, float, float]:
    """``(lower edge of the bucket below, lower edge, upper edge)`` of canonical position ``top - index``.

    Example:
        >>> bucket_edges(64, 0)  # 1.5's bucket
        (1.4921875, 1.5, 1.5078125)
    """
    position = top - index
    return _lower_edge(position - 1), _lower_edge(position), _lower_edge(position + 1)


def _lower_edge(position: int) -> float:
    return math.ldexp(1.0 + (position & (_PER_OCTAVE - 1)) / _PER_OCTAVE, position >> MANTISSA_BITS)


def lower_edges(positions: np.ndarray) -> np.ndarray:
    """Lower edges of canonical positions (NumPy): ``2**(p >> 7) * (1 + (p & 127) / 128)``, exact."""
    positions = np.asarray(positions, dtype=np.int64)
    mantissas = 1.0 + (positions & (_PER_OCTAVE - 1)) / _PER_OCTAVE
    return np.ldexp(mantissas, (positions >> MANTISSA_BITS).astype(np.int32))


@functools.lru_cache(maxsize=32)
def bucket_bounds(top: int) -> tuple[np.ndarray, np.ndarray]:
    """Every histogram index's ``(lower, upper)`` value bounds for a part with top position ``top``.

    Zero's bucket is ``[0, 0]``; the tiny buckets reach from zero to the window's edge. Kept for the
    tops seen last (a run's steps share a few): read-only arrays.
    """
    lowest = top - WINDOW + 1
    magnitudes = lower_edges(np.arange(lowest, top + 2))  # W + 1 edges, ascending
    lower = np.empty(HIST_LEN)
    upper = np.empty(HIST_LEN)
    lower[:WINDOW], upper[:WINDOW] = -magnitudes[:0:-1], -magnitudes[-2::-1]
    lower[_NEGATIVE_TINY], upper[_NEGATIVE_TINY] = -magnitudes[0], 0.0
    lower[_ZERO] = upper[_ZERO] = 0.0
    lower[_POSITIVE_TINY], upper[_POSITIVE_TINY] = 0.0, magnitudes[0]
    lower[_POSITIVE_TINY + 1 : _PAD], upper[_POSITIVE_TINY + 1 : _PAD] = magnitudes[:-1], magnitudes[1:]
    lower[_PAD] = upper[_PAD] = magnitudes[-1]  # never holds a value
    lower.setflags(write=False)
    upper.setflags(write=False)
    return lower, upper


def shifted_histogram(histogram: np.ndarray, shift: int) -> np.ndarray:
    """A part's histogram re-windowed ``shift >= 0`` positions higher (a larger top): what falls out joins tiny."""
    if shift == 0:
        return histogram
    histogram = np.asarray(histogram, dtype=np.float64)
    out = np.zeros(HIST_LEN)
    shift = min(shift, WINDOW)
    out[shift:WINDOW] = histogram[: WINDOW - shift]  # negative index i becomes i + shift
    out[_NEGATIVE_TINY] = histogram[_NEGATIVE_TINY] + histogram[WINDOW - shift : WINDOW].sum()
    out[_ZERO] = histogram[_ZERO]
    out[_POSITIVE_TINY] = histogram[_POSITIVE_TINY] + histogram[_POSITIVE_TINY + 1 : _POSITIVE_TINY + 1 + shift].sum()
    out[_POSITIVE_TINY + 1 : _PAD - shift] = histogram[_POSITIVE_TINY + 1 + shift : _PAD]
    return out


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

"""The sketch of a large tensor on any device, in a fixed number of whole-tensor torch ops.

On a GPU every torch op is a kernel launch that costs the CPU 10-25 us, and any
value read back to the host waits for the device. So this path, unlike the CPU's
cache-sized row chunks and data-dependent shortcuts, works on the whole tensor at
once and never looks at a value:

1. **Range.** One pass gives the counts (valid, NaN, finite: sums of bool masks,
   exact), the finite valid minimum and maximum, and the sum of ``|x|``.
2. **Window.** :func:`device_window` turns the largest magnitude into the scale
   that keeps values in float32's range and the position of the top bucket, as
   device tensors (:mod:`~advmon.stats.sketch_format`'s rule).
3. **Moments and buckets.** A second pass sums the deviations from the range's
   midpoint and their squares in float64 and reads every usable value's bucket
   position from the high half of its float32 bits. Positions are counted by
   ``torch.histc`` (exact: a chunk holds at most ``2**24`` values), or, where torch
   is asked for deterministic algorithms, by sorting them and ``searchsorted``; no
   float64 atomics either way. The 65,536 counts are folded into the part's window
   with a few small ops (:func:`_folded`). Each position's largest float32 bits (its value
   of largest magnitude) are kept by one ``scatter_reduce_``; the window's are the
   part's representatives' table (:func:`_table`: a gather and a ``topk``).

Tensors of more than :data:`CHUNK_ELEMENTS` values go in row chunks of about that
size (the float64 temporaries would be too large otherwise), so a call costs
the same few dozen ops up to 16M values and that many per chunk beyond.

The result is a :class:`~advmon.stats.sketch_format.Part` with the CPU paths' layout
and buckets: parts of any path merge.

Example:
    >>> from advmon.stats import summarize
    >>> x = torch.arange(12.0).reshape(3, 4)
    >>> s = summarize([device_part(x, x < 6)])
    >>> s["count"], s["mean"], s["max"]
    (6.0, 2.5, 5.0)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from advmon.stats.sketch_format import (
    _LARGEST_UNSCALED_EXPONENT,
    _SIGN,
    _SMALLEST_UNSCALED_EXPONENT,
    FULL_POSITIONS,
    EMPTY,
    TABLE_LEN,
    WINDOW,
    Part,
)

__all__ = ["CHUNK_ELEMENTS", "device_part"]

#: Values per chunk: ``torch.histc``'s float32 counts stay exact up to ``2**24``.
CHUNK_ELEMENTS = 1 << 24
_HISTC_EXACT = 1 << 24  # the most values histc may count in float32


def device_part(values: torch.Tensor, valid: torch.Tensor | None = None, weights: torch.Tensor | None = None) -> Part:
    """Sketch of a 2-D tensor's entries where ``valid > 0`` (every entry without a mask).

    ``weights`` (same shape, whole numbers, 0 = not valid) counts each entry that
    many times instead: the rows of an expand view stand for their valid tokens.
    """
    values = values.detach()
    if not values.is_floating_point():
        values = values.to(torch.float64)  # int and bool values: exact in float64 up to 2**53
    chunks = [_Chunk(*piece) for piece in _row_chunks(values, valid, weights)]
    firsts = _stacked([chunk.range_pass() for chunk in chunks])  # [n_valid, n_nan, n_finite, abssum, low, high]
    if firsts.dim() == 2:
        firsts = torch.cat([firsts[:, :4].sum(dim=0), firsts[:, 4].amin()[None], firsts[:, 5].amax()[None]])
    n_valid, n_nan, n_finite, abssum, low, high = firsts.unbind()
    window = device_window(low, high)
    maxima = torch.full((FULL_POSITIONS,), EMPTY, dtype=torch.int32, device=values.device)
    seconds = [chunk.moments_and_positions(window, maxima) for chunk in chunks]
    sums = _summed([s for s, _ in seconds])
    histogram = _folded(_summed([h for _, h in seconds]), window)
    table = _table(maxima, window)
    scalars = torch.cat(  # one dtype promotion to float64 instead of a conversion per piece
        [firsts[:2], (n_valid - n_nan - n_finite)[None], firsts[2:], window.center[None], sums, window.highest,
         window.scale]
    )
    return Part("sketch", (scalars, histogram, table))


class Window(NamedTuple):
    """Where a part's buckets are, as device tensors (see :func:`device_window`)."""

    factor: torch.Tensor  #: float64 ``2**scale``: values times this fit float32
    highest: torch.Tensor  #: int64 ``[1]``: the top bucket's biased float32 position, after scaling
    scale: torch.Tensor  #: int32 ``[1]``: the power of two values are scaled by
    center: torch.Tensor  #: float64 ``low / 2 + high / 2``, around which moments are summed


def device_window(low: torch.Tensor, high: torch.Tensor) -> Window:
    """The scale and top bucket for finite values in ``[low, high]`` (``inf, -inf`` when there are none).

    :func:`~advmon.stats.sketch_format.scale_exponent` and
    :func:`~advmon.stats.sketch_format.highest_position` on the device, in a few ops.
    """
    largest = torch.maximum(-low, high)[None]  # -inf without a finite value
    exponent = torch.frexp(largest)[1]  # 0 for -inf: no scale
    scale = exponent.clamp(_SMALLEST_UNSCALED_EXPONENT, _LARGEST_UNSCALED_EXPONENT).sub_(exponent)
    factor = torch.ldexp(torch.ones_like(largest), scale)
    highest = (largest * factor).to(torch.float32).view(torch.int32).bitwise_right_shift(16)
    highest = highest.clamp_(min=WINDOW).to(torch.int64)  # zero or -inf's bits: the lowest window
    center = torch.add(low / 2, high, alpha=0.5)  # low / 2 + high / 2: no overflow near the float64 limit
    return Window(factor, highest, scale, center)


def _folded(counts: torch.Tensor, window: Window) -> torch.Tensor:
    """The part's histogram from the counts per biased float32 position (see ``sketch_format.fold_positions``).

    In value order (negative positions reversed, then positive ones) every bucket of the part is a run of
    positions, and ``-0`` and ``+0`` are neighbours: each bucket is a difference of the running count at
    two boundaries, a fixed pattern shifted by the top bucket's position (one gather for all).
    """
    running = torch.cat([counts[_SIGN:].flip(0), counts[:_SIGN]]).cumsum_(0)  # counts up to each position
    offsets, shifts = _fold_pattern(counts.device)
    at = running[torch.addcmul(offsets, shifts, window.highest)]
    return at[1:] - at[:-1]


def _fold_pattern(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offsets, shifts)``: the running count just before bucket ``k`` is at ``offsets[k] + shifts[k] * highest``.

    In value order (``v``; -0 at ``SIGN - 1``, +0 at ``SIGN``), with ``lowest = highest - WINDOW + 1``,
    the buckets start at: ``SIGN - 1 - highest + k`` for the negative window's ``k``, ``SIGN - lowest``
    (negative tiny), ``SIGN - 1`` (zero), ``SIGN + 1`` (positive tiny), ``SIGN + lowest + k`` (the
    positive window), the last ends at ``SIGN + highest + 1`` and the padding bucket ends there too; the
    running count is inclusive, so each index is one less. Made once per device (from NumPy on the CPU: no op dispatched).
    """
    pattern = _FOLD_PATTERNS.get(device)
    if pattern is None:
        steps = np.arange(WINDOW + 1)
        offsets = np.concatenate([_SIGN - 2 + steps, [_SIGN - 2, _SIGN], _SIGN - WINDOW + steps, [_SIGN]])
        shifts = np.concatenate([np.full(WINDOW + 1, -1), [0, 0], np.ones(WINDOW + 2)])  # the padding: empty
        pattern = tuple(torch.from_numpy(a.astype(np.int64)).to(device) for a in (offsets, shifts))
        _FOLD_PATTERNS[device] = pattern
    return pattern


#: Each device's fold pattern (two int64 vectors of HIST_LEN + 1 entries).
_FOLD_PATTERNS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.stack(tensors)


def _summed(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.stack(tensors).sum(dim=0, dtype=tensors[0].dtype)


def _row_chunks(values: torch.Tensor, valid: torch.Tensor | None, weights: torch.Tensor | None):
    """Yield (values, valid, weights) for row chunks of about :data:`CHUNK_ELEMENTS` values."""
    rows, cols = values.shape
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        stop = start + step
        yield (
            values[start:stop],
            None if valid is None else valid[start:stop],
            None if weights is None else weights[start:stop],
        )


class _Chunk:
    """One chunk's two passes; ``usable`` (valid and finite) and its complement are kept between them.

    Entries are set aside with ``masked_fill`` and the complement, not ``where``:
    ``where`` turns a Python number into a tensor on the device (one more kernel)
    and moves a CPU scalar tensor there (a synchronizing copy).
    """

    def __init__(self, values: torch.Tensor, valid: torch.Tensor | None, weights: torch.Tensor | None) -> None:
        self.values = values
        self.weights = None if weights is None else weights.to(torch.float64)
        if self.weights is not None:
            valid = self.weights
        self.keep = None if valid is None else (valid if valid.dtype == torch.bool else valid > 0)
        self.magnitudes = values.abs()  # |x|: whether it is finite, and its share of sum |x|
        self.usable = self.magnitudes < math.inf  # NaN and Inf are not below Inf
        if self.keep is not None:
            self.usable &= self.keep
        self.unusable = ~self.usable

    def range_pass(self) -> torch.Tensor:
        """[n_valid, n_nan, n_finite, sum |x|, min, max] over the chunk, float64 on the device."""
        x, keep, usable = self.values, self.keep, self.usable
        nan = torch.isnan(x)
        if keep is not None:
            nan &= keep
        # Counts are int64 sums of bool masks (times whole-number weights); cat below promotes them exactly.
        if self.weights is not None:
            counts = (torch.stack([keep, nan, usable]) * self.weights.to(torch.int64)).sum(dim=(1, 2))
        elif keep is not None:
            counts = torch.stack([keep, nan, usable]).sum(dim=(1, 2))
        else:
            counts = torch.stack([nan, usable]).sum(dim=(1, 2))
            counts = torch.cat([counts.new_full((1,), x.numel()), counts])
        magnitudes, self.magnitudes = self.magnitudes.masked_fill_(self.unusable, 0.0), None  # freed after this pass
        if self.weights is not None:
            magnitudes = magnitudes * self.weights
        low = x.masked_fill(self.unusable, math.inf).amin()
        high = x.masked_fill(self.unusable, -math.inf).amax()
        return torch.cat([counts, magnitudes.sum(dtype=torch.float64)[None], low[None], high[None]])

    def moments_and_positions(self, window: Window, maxima: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([sum(x - center), sum((x - center)^2)] over usable values, int32 counts of their float32 positions);
        each position's largest float32 bits go into ``maxima`` (the part's, shared by its chunks)."""
        unusable = self.unusable
        deviation = self.values.to(torch.float64, copy=True).sub_(window.center).masked_fill_(unusable, 0.0)
        deviation = deviation.reshape(-1)
        weighted = deviation if self.weights is None else deviation * self.weights.reshape(-1)
        sums = torch.cat([weighted.sum()[None], torch.dot(weighted, deviation)[None]])
        # Scaling by a power of two is exact in the values' own dtype (the scale keeps float32's range), and
        # an unusable entry becomes +Inf: position 32640, above every finite bucket, counted and never read.
        narrow = (self.values * window.factor).to(torch.float32).masked_fill_(unusable, math.inf)
        bits = narrow.reshape(-1).view(torch.int32)
        high_halves = bits.view(torch.int16).view(-1, 2)[:, 1].view(torch.uint16)  # the sign's half
        maxima.scatter_reduce_(0, high_halves.to(torch.int64), bits, "amax")  # the bits order |x| at a position
        weights = None if self.weights is None else self.weights.reshape(-1)
        return sums, _bin_counts(high_halves.to(torch.float32), weights)


def _table(maxima: torch.Tensor, window: Window) -> torch.Tensor:
    """The part's representatives' table from each position's largest bits: the window's buckets in order (the
    others read a position no value takes, whose entry stays EMPTY), and their largest :data:`TABLE_LEN`
    entries, which are every bucket's with a value, then EMPTY, unless more hold values (see ``sketch_format``).
    """
    offsets, shifts = _window_positions(maxima.device)
    in_window = maxima[torch.addcmul(offsets, shifts, window.highest)]
    return torch.topk(in_window, TABLE_LEN, sorted=True).values


def _window_positions(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offsets, shifts)``: histogram index ``k``'s biased position is ``offsets[k] + shifts[k] * highest``.

    Negative bucket ``k`` is ``SIGN + highest - k``, positive bucket ``j`` (index ``POSITIVE_TINY + 1 + j``) is
    ``highest - WINDOW + 1 + j``; tiny, zero and padding read position 65535, a NaN's (never scattered: an
    unusable entry is +Inf). Made once per device.
    """
    pattern = _WINDOW_POSITIONS.get(device)
    if pattern is None:
        steps = np.arange(WINDOW)
        unused = FULL_POSITIONS - 1
        offsets = np.concatenate([_SIGN - steps, [unused] * 3, 1 - WINDOW + steps, [unused]])
        shifts = np.concatenate([np.ones(WINDOW), np.zeros(3), np.ones(WINDOW), [0]])
        pattern = tuple(torch.from_numpy(a.astype(np.int64)).to(device) for a in (offsets, shifts))
        _WINDOW_POSITIONS[device] = pattern
    return pattern


#: Each device's window positions pattern (two int64 vectors of HIST_LEN entries).
_WINDOW_POSITIONS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _bin_counts(index: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """int32 counts of whole-number bin indices in ``[0, FULL_POSITIONS)`` (a sketch's counts: see ``_folded``).

    ``histc``'s float32 counts are exact for a chunk of at most ``2**24`` values.
    For longer chunks, for weights, and under ``torch.use_deterministic_algorithms``
    (``histc`` has no deterministic CUDA kernel), the indices are sorted and counted
    by ``searchsorted`` at the bin edges instead.
    """
    exact_in_float32 = index.numel() <= _HISTC_EXACT  # a chunk can be longer: one row of more values than that
    if weights is None and exact_in_float32 and not torch.are_deterministic_algorithms_enabled():
        return torch.histc(index, bins=FULL_POSITIONS, min=0, max=FULL_POSITIONS).to(torch.int32)
    ordered, order = torch.sort(index)
    edges = torch.arange(FULL_POSITIONS + 1, dtype=torch.float32, device=index.device).sub_(0.5)
    below = torch.searchsorted(ordered, edges)
    if weights is None:
        return below.diff().to(torch.int32)
    # Whole-number weights summed as integers: exact, and deterministic on CUDA (a float cumsum is not).
    cumulative = torch.cat([order.new_zeros(1), torch.cumsum(weights[order].to(torch.int64), 0)])
    return cumulative[below].diff().to(torch.int32)


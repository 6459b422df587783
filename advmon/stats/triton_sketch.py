"""The sketch of a large tensor on a CUDA or ROCm device, in four Triton kernels.

The pure-torch device path (:mod:`advmon.stats.device_sketch`) needs a few dozen ops,
each a kernel launch that costs the CPU 10-25 us. Here the same two passes are
two kernels over blocks of :data:`BLOCK` values, each followed by a one-program
kernel that reduces the blocks' results in a fixed order:

1. ``_range_kernel``: per block, the counts (valid, NaN, finite), ``sum |x|``
   and the finite valid minimum and maximum.
2. ``_finalize_range_kernel``: the totals, the moment center, and the scale and
   top bucket by the rule of :func:`~advmon.stats.sketch_format.scale_exponent` and
   :func:`~advmon.stats.sketch_format.top_position` (``frexp`` done on the float64
   bits); it also zeroes the histogram and empties the buckets' maxima and the table.
3. ``_moments_bins_kernel``: per block, the float64 sums of ``x - center`` and
   its square, and each value's bucket (read from the high half of its float32
   bits, then placed in the part's window) added to the global int32 histogram
   with an atomic add (integer atomics: the counts do not depend on their order),
   and its float32 bits to the bucket's maximum with an atomic max (the bucket's
   value of largest magnitude, its representative).
   A per-block ``tl.histogram`` of the part's 16,131 buckets would need 16,384
   bins: AMD's compiler took more than five minutes over it.
4. ``_finalize_moments_kernel``: the moments' totals, and the representatives'
   table: the first :data:`~advmon.stats.sketch_format.TABLE_LEN` buckets' maxima.

Values are read where they lie (any strides, an expand view included), in any
float dtype, and computed in float64; masks of any dtype count where ``> 0``.
Nothing is read back to the host, the counts are integers, and every sum has a
fixed order, so the result does not depend on scheduling. It is the
:class:`~advmon.stats.sketch_format.Part` the other paths write, bin for bin.

Without a GPU, ``TRITON_INTERPRET=1`` (set before ``triton`` is imported) runs
these kernels on CPU tensors with NumPy: that is how ``make test`` checks them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from advmon.stats.sketch_format import (
    _BIAS,
    _LARGEST_UNSCALED_EXPONENT,
    _NEGATIVE_TINY,
    _PER_OCTAVE,
    _POSITIVE_TINY,
    _SMALLEST_UNSCALED_EXPONENT,
    _ZERO,
    EMPTY,
    HIST_LEN,
    TABLE_LEN,
    WINDOW,
    Part,
)

__all__ = ["BLOCK", "triton_part"]

#: Values per program of the two passes.
BLOCK = 8192
#: Programs' partial results reduced per step by the one-program kernels.
_REDUCE = 1024
#: No fused multiply-adds: every product rounds as torch and NumPy round it (and Triton 3.10 changes the default).
_OPTIONS = {"num_warps": 8, "enable_fp_fusion": False}
#: The sketch format's constants the kernels need.
_WINDOW_CONSTANTS = dict(
    WINDOW=WINDOW, BIAS=_BIAS, PER_OCTAVE=_PER_OCTAVE, LOWEST_EXPONENT=_SMALLEST_UNSCALED_EXPONENT,
    HIGHEST_EXPONENT=_LARGEST_UNSCALED_EXPONENT, NEGATIVE_TINY=_NEGATIVE_TINY, ZERO=_ZERO,
    POSITIVE_TINY=_POSITIVE_TINY,
)
#: The int32 histogram counts at most this many values.
_MAX_VALUES = (1 << 31) - 1


def triton_part(values: torch.Tensor, valid: torch.Tensor | None = None) -> Part | None:
    """Sketch of a 2-D tensor's entries where ``valid > 0`` (every entry without a mask).

    ``None`` for more than ``2**31 - 1`` values (the int32 histogram's limit): the
    torch path takes those.
    """
    values = values.detach()
    if values.numel() > _MAX_VALUES:
        return None
    if not values.is_floating_point():
        values = values.to(torch.float64)
    if valid is not None:
        valid = valid.detach()
        if valid.dtype == torch.bool:
            valid = valid.view(torch.uint8)  # Triton loads bytes; the test is the same (> 0)
    count = values.numel()
    programs = triton.cdiv(count, BLOCK)
    device = values.device
    partials = torch.empty((programs, 6), dtype=torch.float64, device=device)
    moments = torch.empty((programs, 2), dtype=torch.float64, device=device)
    scalars = torch.empty(12, dtype=torch.float64, device=device)
    histogram = torch.empty(HIST_LEN, dtype=torch.int32, device=device)
    maxima = torch.empty(HIST_LEN, dtype=torch.int32, device=device)  # each bucket's largest float32 bits
    table = torch.empty(TABLE_LEN, dtype=torch.int32, device=device)
    mask = valid if valid is not None else values
    reading = dict(
        count=count,
        cols=max(values.shape[1], 1),
        v_row=values.stride(0),
        v_col=values.stride(1),
        m_row=mask.stride(0),
        m_col=mask.stride(1),
        HAS_MASK=valid is not None,
        FLAT=values.is_contiguous() and mask.is_contiguous(),
        BLOCK=BLOCK,
    )
    _range_kernel[(programs,)](values, mask, partials, **reading, **_OPTIONS)
    _finalize_range_kernel[(1,)](
        partials, programs, scalars, histogram, maxima, table, HIST_LEN=HIST_LEN, TABLE_LEN=TABLE_LEN, EMPTY=EMPTY,
        REDUCE=_REDUCE, **_WINDOW_CONSTANTS, **_OPTIONS,
    )
    _moments_bins_kernel[(programs,)](
        values, mask, scalars, moments, histogram, maxima, **reading, HIST_LEN=HIST_LEN, **_WINDOW_CONSTANTS,
        **_OPTIONS,
    )
    _finalize_moments_kernel[(1,)](moments, programs, scalars, maxima, table, HIST_LEN=HIST_LEN, TABLE_LEN=TABLE_LEN,
                                   EMPTY=EMPTY, REDUCE=_REDUCE, **_OPTIONS)
    return Part("sketch", (scalars, histogram, table))


@triton.jit
def _load_block(values, mask, count, cols, v_row, v_col, m_row, m_col,
                HAS_MASK: tl.constexpr, FLAT: tl.constexpr, BLOCK: tl.constexpr):
    """This program's values as float64, and which are valid and which usable (valid and finite)."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < count
    if FLAT:
        value_at = offsets
        mask_at = offsets
    else:
        row = offsets // cols
        col = offsets - row * cols
        value_at = row * v_row + col * v_col
        mask_at = row * m_row + col * m_col
    x = tl.load(values + value_at, mask=inside, other=0.0).to(tl.float64)
    keep = inside
    if HAS_MASK:
        keep = keep & (tl.load(mask + mask_at, mask=inside, other=0) > 0)  # a NaN mask entry is not > 0
    usable = keep & (tl.abs(x) < float("inf"))  # NaN and Inf are not below Inf
    return x, keep, usable


@triton.jit
def _range_kernel(values, mask, partials, count, cols, v_row, v_col, m_row, m_col,
                  HAS_MASK: tl.constexpr, FLAT: tl.constexpr, BLOCK: tl.constexpr):
    x, keep, usable = _load_block(values, mask, count, cols, v_row, v_col, m_row, m_col, HAS_MASK, FLAT, BLOCK)
    out = partials + tl.program_id(0).to(tl.int64) * 6
    tl.store(out + 0, tl.sum(keep.to(tl.int32), axis=0).to(tl.float64))
    tl.store(out + 1, tl.sum((keep & (x != x)).to(tl.int32), axis=0).to(tl.float64))
    tl.store(out + 2, tl.sum(usable.to(tl.int32), axis=0).to(tl.float64))
    tl.store(out + 3, tl.sum(tl.where(usable, tl.abs(x), 0.0), axis=0))
    tl.store(out + 4, tl.min(tl.where(usable, x, float("inf")), axis=0))
    tl.store(out + 5, tl.max(tl.where(usable, x, float("-inf")), axis=0))


@triton.jit
def _finalize_range_kernel(partials, programs, scalars, histogram, maxima, table, HIST_LEN: tl.constexpr,
                           TABLE_LEN: tl.constexpr, EMPTY: tl.constexpr, REDUCE: tl.constexpr,
                           WINDOW: tl.constexpr, BIAS: tl.constexpr, PER_OCTAVE: tl.constexpr,
                           LOWEST_EXPONENT: tl.constexpr, HIGHEST_EXPONENT: tl.constexpr,
                           NEGATIVE_TINY: tl.constexpr, ZERO: tl.constexpr, POSITIVE_TINY: tl.constexpr):
    lanes = tl.arange(0, REDUCE)
    n_valid = tl.zeros([REDUCE], dtype=tl.float64)
    n_nan = tl.zeros([REDUCE], dtype=tl.float64)
    n_finite = tl.zeros([REDUCE], dtype=tl.float64)
    abssum = tl.zeros([REDUCE], dtype=tl.float64)
    low = tl.full([REDUCE], float("inf"), dtype=tl.float64)
    high = tl.full([REDUCE], float("-inf"), dtype=tl.float64)
    for start in range(0, programs, REDUCE):
        at = start + lanes
        live = at < programs
        row = partials + at.to(tl.int64) * 6
        n_valid += tl.load(row + 0, mask=live, other=0.0)
        n_nan += tl.load(row + 1, mask=live, other=0.0)
        n_finite += tl.load(row + 2, mask=live, other=0.0)
        abssum += tl.load(row + 3, mask=live, other=0.0)
        low = tl.minimum(low, tl.load(row + 4, mask=live, other=float("inf")))
        high = tl.maximum(high, tl.load(row + 5, mask=live, other=float("-inf")))
    valid_total = tl.sum(n_valid, axis=0)
    nan_total = tl.sum(n_nan, axis=0)
    finite_total = tl.sum(n_finite, axis=0)
    least = tl.min(low, axis=0)
    most = tl.max(high, axis=0)
    # sketch_format.scale_exponent and top_position, on scalars.
    largest = tl.maximum(-least, most)  # -inf without a finite value
    exponent = _frexp_exponent(largest)  # 0 for -inf
    scale = tl.minimum(tl.maximum(exponent, LOWEST_EXPONENT), HIGHEST_EXPONENT) - exponent
    scaled = (largest * _power_of_two(scale)).to(tl.float32)
    highest = tl.maximum(scaled.to(tl.int32, bitcast=True) >> 16, WINDOW)  # -inf's bits: any window
    tl.store(scalars + 0, valid_total)
    tl.store(scalars + 1, nan_total)
    tl.store(scalars + 2, valid_total - nan_total - finite_total)
    tl.store(scalars + 3, finite_total)
    tl.store(scalars + 4, tl.sum(abssum, axis=0))
    tl.store(scalars + 5, least)
    tl.store(scalars + 6, most)
    tl.store(scalars + 7, least / 2 + most * 0.5)
    tl.store(scalars + 10, highest.to(tl.float64))
    tl.store(scalars + 11, scale.to(tl.float64))
    for start in range(0, HIST_LEN, REDUCE):
        at = start + lanes
        tl.store(histogram + at, tl.zeros([REDUCE], dtype=tl.int32), mask=at < HIST_LEN)
        tl.store(maxima + at, tl.full([REDUCE], EMPTY, dtype=tl.int32), mask=at < HIST_LEN)
    tl.store(table + lanes, tl.full([REDUCE], EMPTY, dtype=tl.int32), mask=lanes < TABLE_LEN)


@triton.jit
def _moments_bins_kernel(values, mask, scalars, moments, histogram, maxima, count, cols, v_row, v_col, m_row, m_col,
                         HAS_MASK: tl.constexpr, FLAT: tl.constexpr, BLOCK: tl.constexpr, HIST_LEN: tl.constexpr,
                         WINDOW: tl.constexpr, BIAS: tl.constexpr, PER_OCTAVE: tl.constexpr,
                         LOWEST_EXPONENT: tl.constexpr, HIGHEST_EXPONENT: tl.constexpr,
                         NEGATIVE_TINY: tl.constexpr, ZERO: tl.constexpr, POSITIVE_TINY: tl.constexpr):
    x, keep, usable = _load_block(values, mask, count, cols, v_row, v_col, m_row, m_col, HAS_MASK, FLAT, BLOCK)
    center = tl.load(scalars + 7)
    scale = tl.load(scalars + 11).to(tl.int32)
    highest = tl.load(scalars + 10).to(tl.int32)
    deviation = tl.where(usable, x - center, 0.0)
    out = moments + tl.program_id(0).to(tl.int64) * 2
    tl.store(out + 0, tl.sum(deviation, axis=0))
    tl.store(out + 1, tl.sum(deviation * deviation, axis=0))
    # The bucket: the high half of the scaled value's float32 bits, placed in the part's window.
    bits = (tl.where(usable, x, 0.0) * _power_of_two(scale)).to(tl.float32).to(tl.int32, bitcast=True)
    magnitude = (bits >> 16) & 0x7FFF
    below_top = highest - magnitude  # 0 for the top bucket
    in_window = below_top < WINDOW
    negative_index = tl.where(in_window, below_top, NEGATIVE_TINY)
    positive_index = tl.where(in_window, HIST_LEN - 2 - below_top, POSITIVE_TINY)  # HIST_LEN - 1: the padding
    index = tl.where(bits < 0, negative_index, positive_index)
    index = tl.where(magnitude == 0, ZERO, index)
    tl.atomic_add(histogram + index, tl.full([BLOCK], 1, dtype=tl.int32), mask=usable)
    # Each window bucket's largest bits (its value of largest magnitude), for the representatives' table.
    tl.atomic_max(maxima + index, bits, mask=usable & in_window & (magnitude != 0))


@triton.jit
def _finalize_moments_kernel(moments, programs, scalars, maxima, table, HIST_LEN: tl.constexpr,
                             TABLE_LEN: tl.constexpr, EMPTY: tl.constexpr, REDUCE: tl.constexpr):
    lanes = tl.arange(0, REDUCE)
    first = tl.zeros([REDUCE], dtype=tl.float64)
    second = tl.zeros([REDUCE], dtype=tl.float64)
    for start in range(0, programs, REDUCE):
        at = start + lanes
        live = at < programs
        row = moments + at.to(tl.int64) * 2
        first += tl.load(row + 0, mask=live, other=0.0)
        second += tl.load(row + 1, mask=live, other=0.0)
    tl.store(scalars + 8, tl.sum(first, axis=0))
    tl.store(scalars + 9, tl.sum(second, axis=0))
    # The table: the first TABLE_LEN buckets with a value, in the histogram's order (EMPTY after them).
    taken = 0
    for start in range(0, HIST_LEN, REDUCE):
        at = start + lanes
        bits = tl.load(maxima + at, mask=at < HIST_LEN, other=EMPTY)
        held = bits != EMPTY
        rank = taken + tl.cumsum(held.to(tl.int32), axis=0) - 1
        tl.store(table + rank, bits, mask=held & (rank < TABLE_LEN))
        taken += tl.sum(held.to(tl.int32), axis=0)


@triton.jit
def _frexp_exponent(v):
    """``frexp``'s exponent of a float64 (``v = m * 2**e``, ``0.5 <= |m| < 1``); 0 for 0, Inf and NaN, as torch gives."""
    magnitude = tl.abs(v)
    field = (magnitude.to(tl.int64, bitcast=True) >> 52) & 0x7FF
    # A subnormal's exponent field is 0: scale it by 2**54 into the normal range first.
    scaled_field = ((magnitude * 18014398509481984.0).to(tl.int64, bitcast=True) >> 52) & 0x7FF
    exponent = tl.where(field == 0, scaled_field - 54, field) - 1022
    return tl.where((magnitude == 0) | (field == 0x7FF), 0, exponent).to(tl.int32)


@triton.jit
def _power_of_two(k):
    """``2.0 ** k`` as a float64, exactly, for whole ``k`` in ``[-1022, 1023]`` (built from its bits)."""
    return ((k.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)

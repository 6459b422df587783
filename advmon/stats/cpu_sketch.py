"""The general sketch of a large CPU tensor: moments and a histogram, in row chunks that stay in cache.

:func:`cpu_part` takes, in order: the prefix-mask fast path where the mask is one
(:mod:`advmon.stats.prefix_sketch`); else, for a finite tensor whose valid range is
about its whole range (padding holds zeros or copies of valid values) and whose
values fit float32's normal range unscaled (nearly all), one pass; else two passes. Values are
on the host already, so these passes may look at them (a shortcut here costs no
sync). Masks are applied by multiplying with 0/1 float weights: on the CPU that is
many times faster than ``where``/``masked_fill`` with a bool mask. Excluded entries
become zeros, counted in zero's bucket and taken out of it at the end.

Buckets need no range: each value's is the high half of its float32 bits
(:func:`~advmon.stats.sketch_format.cpu_positions`), counted over all 65,536
positions and folded once into the part's window
(:func:`~advmon.stats.sketch_format.fold_positions`).

Example:
    >>> from advmon.stats.summaries import summarize
    >>> x = torch.arange(200_000.0).reshape(400, 500)
    >>> s = summarize([cpu_part(x, x < 1000)])
    >>> s["count"], s["mean"], s["max"]
    (1000.0, 499.5, 999.0)
"""

from __future__ import annotations

import math

import torch

from advmon.stats.prefix_sketch import RowExtremes, prefix_lengths, prefix_part
from advmon.stats.sketch_format import (
    _MAX,
    _MIN,
    FULL_POSITIONS,
    Part,
    PositionMaxima,
    cpu_positions,
    fold_positions,
    scale_exponent,
    highest_position,
)

__all__ = ["cpu_part"]

#: Row-chunks of about this many elements stay in L2 cache, which avoids the page
#: faults of full-size temporaries (each costs more than the arithmetic).
_CHUNK_ELEMENTS = 1 << 17


def cpu_part(values: torch.Tensor, valid: torch.Tensor | None, extremes: RowExtremes | None = None) -> Part:
    """Moments and histogram of a large 2-D CPU tensor where ``valid > 0`` (every entry without a mask).

    ``extremes`` (prefix masks) also collects each row's extremes on the way
    (:class:`~advmon.stats.prefix_sketch.RowExtremes`; ``complete`` says whether it did).
    """
    part = _sketch_prefix(values, valid, extremes)
    if part is not None:
        return part
    if extremes is not None:
        extremes.complete = False  # the general sketch's passes take none
    part = _sketch_one_pass(values, valid)
    if part is not None:
        return part
    return _sketch_two_passes(values, valid)


def _sketch_prefix(values: torch.Tensor, valid: torch.Tensor | None, extremes: RowExtremes | None = None) -> Part | None:
    """The fast path for prefix masks (see :mod:`advmon.stats.prefix_sketch`); ``None`` where it does not apply."""
    if valid is None:
        lengths = torch.full((values.shape[0],), values.shape[1], dtype=torch.int64)
    else:
        lengths = prefix_lengths(valid)
    return None if lengths is None else prefix_part(values, lengths, extremes)


def _row_chunks(values: torch.Tensor, valid: torch.Tensor | None, buffers: int):
    """Yield (float64 copy of a row chunk, its 0/1 keep weights or None, spare buffers, a float32 scratch)."""
    rows, cols = values.shape
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    shape = (min(step, rows), cols)
    space = [torch.empty(shape, dtype=torch.float64, device=values.device) for _ in range(buffers + 2)]
    narrow = torch.empty(shape, dtype=torch.float32, device=values.device)
    for start in range(0, rows, step):
        height = min(step, rows - start)
        x, weight, *spare = (b[:height] for b in space)
        x.copy_(values[start : start + step])
        keep = None if valid is None else _keep_weights(valid[start : start + step], weight)
        yield x, keep, spare, narrow[:height]


def _finished(first: torch.Tensor, center: torch.Tensor, sums: torch.Tensor, counts: torch.Tensor,
              zeros_to_drop: int, scale: int, maxima: PositionMaxima, redo) -> Part:
    """The part from its scalars' pieces, its counts per float32 position and their largest values.

    ``first``: [n_valid, n_nan, n_inf, n_finite, abssum, low, high]; ``sums``: the two sums around ``center``;
    ``redo(maxima)``: adds the values to ``maxima`` again (see :meth:`PositionMaxima.table`).
    """
    finite = float(first[3]) > 0
    largest = max(-float(first[5]), float(first[6])) if finite else 0.0
    scale = scale if finite else 0
    top = highest_position(largest, scale)
    histogram = fold_positions(counts, top, zeros_to_drop)
    where = torch.tensor([top, scale], dtype=torch.float64)
    scalars = torch.cat([first.to(torch.float64), center.reshape(1).to(torch.float64), sums, where])
    return Part("sketch", (scalars, histogram.to(torch.float64), maxima.table(counts, top, redo)))


def _center(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    """The midpoint of a range, around which moments are summed (halves first: no overflow near float64's limit)."""
    return low / 2 + high / 2


def _sketch_one_pass(values: torch.Tensor, valid: torch.Tensor | None) -> Part | None:
    """Single pass, moments around the whole tensor's midpoint; ``None`` if a value is not finite, the valid
    range is much narrower than the whole (the midpoint would be far from the values) or the values need
    scaling: the two passes do those."""
    whole_low, whole_high = (v.to(torch.float64) for v in torch.aminmax(values))
    if not (torch.isfinite(whole_low) and torch.isfinite(whole_high)):
        return None  # NaN or Inf somewhere: the two-pass sketch masks them
    center = _center(whole_low, whole_high)  # the part's sums are around the whole tensor's midpoint
    counts = torch.zeros(FULL_POSITIONS, dtype=torch.int64)
    maxima = PositionMaxima()
    rows = []
    for x, keep, (spare, other), narrow in _row_chunks(values, valid, 2):
        # x is finite, so multiplying by the 0/1 weights zeroes excluded entries.
        if keep is not None:
            x.mul_(keep)
            n_valid = keep.sum()
        else:
            n_valid = x.new_tensor(float(x.numel()))
        low, high = torch.aminmax(x)
        if keep is not None and (low == 0 or high == 0) and n_valid < x.numel():
            # The zeros may be excluded entries: take the extrema the careful way.
            low, high = _kept_extrema(x, keep, spare, other)
        abssum = torch.abs(x, out=spare).sum()
        if keep is None:
            deviation = torch.sub(x, center, out=spare)
        else:
            deviation = torch.addcmul(x, keep, -center, out=spare)
        flat = deviation.reshape(-1)
        rows.append(torch.stack([n_valid, abssum, low, high, flat.sum(), torch.dot(flat, flat)]))
        positions = cpu_positions(x, narrow)
        counts += torch.bincount(positions, minlength=FULL_POSITIONS)
        maxima.add(positions, narrow.view(torch.int32), counts)
    table = torch.stack(rows)
    n_valid = table[:, 0].sum()
    with_values = table[:, 0] > 0
    low = torch.where(with_values, table[:, 2], math.inf).amin()
    high = torch.where(with_values, table[:, 3], -math.inf).amax()
    if n_valid == 0 or scale_exponent(max(-float(low), float(high))) != 0:
        return None
    if math.frexp(float(high - low))[1] != math.frexp(float(whole_high - whole_low))[1]:
        return None  # excluded entries widened the range: its midpoint would cost the moments their precision
    zero = n_valid.new_zeros(())
    first = torch.stack([n_valid, zero, zero, n_valid, table[:, 1].sum(), low, high])

    def redo(maxima: PositionMaxima) -> None:
        for x, keep, _, narrow in _row_chunks(values, valid, 2):
            if keep is not None:
                x.mul_(keep)
            maxima.add(cpu_positions(x, narrow), narrow.view(torch.int32))

    return _finished(first, center, table[:, 4:].sum(dim=0), counts, values.numel() - int(n_valid), 0, maxima, redo)


def _sketch_two_passes(values: torch.Tensor, valid: torch.Tensor | None) -> Part:
    """Moments and histogram of a large 2-D CPU tensor, in two passes over row chunks.

    Pass 1 counts and finds the range; pass 2 sums deviations from the range's
    midpoint (so a constant tensor has a std of exactly 0) and counts the buckets,
    of values scaled into float32's range where they need it.
    """

    def chunks():
        for x, keep, (spare, other), narrow in _row_chunks(values, valid, 2):
            yield _Chunk(x, keep, spare, other), narrow

    first = torch.stack([chunk.counts() for chunk, _ in chunks()])
    totals = first[:, :_MIN].sum(dim=0)
    low, high = first[:, _MIN].amin(), first[:, _MAX].amax()
    n_finite = int(totals[3])
    scale = scale_exponent(max(-float(low), float(high))) if n_finite > 0 else 0
    center = _center(low, high) if n_finite > 0 else low.new_zeros(())
    counts = torch.zeros(FULL_POSITIONS, dtype=torch.int64)
    maxima = PositionMaxima()
    centered_sums = []
    for chunk, narrow in chunks():
        centered_sums.append(chunk.centered_sums(center))
        positions = cpu_positions(chunk.scaled(scale), narrow)
        counts += torch.bincount(positions, minlength=FULL_POSITIONS)
        maxima.add(positions, narrow.view(torch.int32), counts)
    first = torch.cat([totals, low[None], high[None]])

    def redo(maxima: PositionMaxima) -> None:
        for chunk, narrow in chunks():
            maxima.add(cpu_positions(chunk.scaled(scale), narrow), narrow.view(torch.int32))

    return _finished(first, center, torch.stack(centered_sums).sum(dim=0), counts, values.numel() - n_finite, scale,
                     maxima, redo)


class _Chunk:
    """One row chunk, cleaned: ``kept`` is finite everywhere and 0 where excluded."""

    def __init__(
        self, x: torch.Tensor, keep: torch.Tensor | None, spare: torch.Tensor, other: torch.Tensor
    ) -> None:
        self.nan = None
        if torch.isfinite(x.sum()):
            usable = keep  # every entry is finite: no finiteness mask needed
        else:
            finite = torch.isfinite(x)
            self.nan = torch.isnan(x).to(torch.float64)
            if keep is not None:
                self.nan.mul_(keep)
            x.masked_fill_(~finite, 0.0)
            usable = finite.to(torch.float64) if keep is None else keep * finite
        if usable is not None:
            x.mul_(usable)
        self.kept, self.keep, self.usable, self.spare, self.other = x, keep, usable, spare, other

    def counts(self) -> torch.Tensor:
        """[n_valid, n_nan, n_inf, n_finite, abssum, min, max]."""
        kept, usable = self.kept, self.usable
        n_valid = self.keep.sum() if self.keep is not None else kept.new_tensor(float(kept.numel()))
        n_finite = usable.sum() if usable is not None else n_valid
        n_nan = self.nan.sum() if self.nan is not None else kept.new_zeros(())
        abssum = torch.abs(kept, out=self.spare).sum()
        if usable is None:
            low, high = torch.aminmax(kept)
        else:
            low, high = _kept_extrema(kept, usable, self.spare, self.other)
            nothing = n_finite == 0
            low = torch.where(nothing, math.inf, low)
            high = torch.where(nothing, -math.inf, high)
        return torch.stack([n_valid, n_nan, n_valid - n_nan - n_finite, n_finite, abssum, low, high])

    def centered_sums(self, center: torch.Tensor) -> torch.Tensor:
        """[sum(x - center), sum((x - center)^2)] over usable entries."""
        if self.usable is None:
            deviation = torch.sub(self.kept, center, out=self.spare)
        else:
            deviation = torch.addcmul(self.kept, self.usable, -center, out=self.spare)
        flat = deviation.reshape(-1)
        return torch.stack([flat.sum(), torch.dot(flat, flat)])

    def scaled(self, scale: int) -> torch.Tensor:
        """The kept values (excluded ones 0) times ``2**scale`` (in place: the last use of the chunk)."""
        if scale:
            self.kept.mul_(math.ldexp(1.0, scale))
        return self.kept


_FLOAT64_MAX = torch.tensor(torch.finfo(torch.float64).max, dtype=torch.float64)


def _kept_extrema(
    kept: torch.Tensor, weights: torch.Tensor, spare: torch.Tensor, other: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Min and max over entries with weight 1 of ``kept``, whose excluded entries are 0.

    The excluded zeros are lifted above every value for the minimum and below
    every value for the maximum (float multiplies: no bool ``where`` on CPU).
    """
    excluded = _complement(weights, other)
    low = torch.addcmul(kept, excluded, _FLOAT64_MAX, out=spare).amin()
    high = torch.addcmul(kept, excluded, -_FLOAT64_MAX, out=spare).amax()
    return low, high


def _complement(weights: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``1 - weights`` into ``out``."""
    return torch.neg(weights, out=out).add_(1.0)


def _keep_weights(valid: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``valid > 0`` as 0/1 float64 weights written into ``out``."""
    out.copy_(valid)
    if valid.dtype != torch.bool:
        if valid.is_floating_point():
            out.nan_to_num_(0.0)  # a NaN mask entry is not > 0
        # ceil(clamp(m, 0, 1)) is 1 exactly where m > 0.
        out.clamp_(0.0, 1.0).ceil_()
    return out

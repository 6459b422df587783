"""The general sketch of a large CPU tensor: moments and a histogram, in row chunks that stay in cache.

:func:`cpu_part` takes, in order: the prefix-mask fast path where the mask is one
(:mod:`advmon.stats.prefix_sketch`); else, for a finite tensor whose valid range needs
the same bin width as its whole range, one pass (the common case: padding holds zeros
or copies of valid values); else two passes. Values are on the host already, so these
passes may look at them (a shortcut here costs no sync). Masks are applied by
multiplying with 0/1 float weights: on the CPU that is many times faster than
``where``/``masked_fill`` with a bool mask.

The result is a :class:`~advmon.stats.sketch_format.Part` with the layout, level rule
and bins every path writes.

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
from advmon.stats.sketch_format import _HIST_LEN, _MAX, _MIN, _TRASH_BIN, Part, binning

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
    """Yield (float64 copy of a row chunk, its 0/1 keep weights or None, spare buffers)."""
    rows, cols = values.shape
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    shape = (min(step, rows), cols)
    space = [torch.empty(shape, dtype=torch.float64, device=values.device) for _ in range(buffers + 2)]
    for start in range(0, rows, step):
        height = min(step, rows - start)
        x, weight, *spare = (b[:height] for b in space)
        x.copy_(values[start : start + step])
        keep = None if valid is None else _keep_weights(valid[start : start + step], weight)
        yield x, keep, spare


def _sketch_one_pass(values: torch.Tensor, valid: torch.Tensor | None) -> Part | None:
    """Single pass with the bin width of the whole tensor's range; ``None`` if that is not exact."""
    whole_low, whole_high = (v.to(torch.float64) for v in torch.aminmax(values))
    if not (torch.isfinite(whole_low) and torch.isfinite(whole_high)):
        return None  # NaN or Inf somewhere: the two-pass sketch masks them
    level, offset, factors, center = binning(whole_low, whole_high)
    # Excluded entries are zeroed; when 0 lies in the range their bin is in range too.
    zero_in_range = bool(whole_low <= 0 <= whole_high)
    histogram = torch.zeros(_HIST_LEN + 1, dtype=torch.float64)
    rows = []
    for x, keep, (spare, other) in _row_chunks(values, valid, 2):
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
        # Excluded entries (0 in x) all land in one bin, clamped into range; they
        # are taken out of it below.
        for factor in factors:
            x.mul_(factor)
        x.floor_().sub_(offset)
        if not zero_in_range and keep is not None:
            x.clamp_(0, _HIST_LEN)
        _count_bins(histogram, x)
    table = torch.stack(rows)
    n_valid = table[:, 0].sum()
    with_values = table[:, 0] > 0
    low = torch.where(with_values, table[:, 2], math.inf).amin()
    high = torch.where(with_values, table[:, 3], -math.inf).amax()
    if n_valid == 0 or not torch.equal(binning(low, high).level, level):
        return None
    excluded_bin = torch.clamp(-offset, 0, _HIST_LEN).to(torch.int64)
    histogram[excluded_bin] -= values.numel() - n_valid
    zero = n_valid.new_zeros(())
    scalars = torch.stack(
        [n_valid, zero, zero, n_valid, table[:, 1].sum(), low, high, center, table[:, 4].sum(), table[:, 5].sum(),
         level.to(torch.float64), offset]
    )
    return Part("sketch", (scalars, histogram[:_HIST_LEN]))


def _sketch_two_passes(values: torch.Tensor, valid: torch.Tensor | None) -> Part:
    """Moments and histogram of a large 2-D CPU tensor, in two passes over row chunks.

    Pass 1 counts and finds the range; pass 2 sums deviations from the range's
    midpoint (so a constant tensor has a std of exactly 0) and fills the histogram.
    Masks are applied by multiplying with 0/1 float weights: on CPU that is many
    times faster than ``where``/``masked_fill`` with a bool mask.
    """

    def chunks():
        for x, keep, (spare, other) in _row_chunks(values, valid, 2):
            yield _Chunk(x, keep, spare, other)

    first = torch.stack([chunk.counts() for chunk in chunks()])
    counts = first[:, :_MIN].sum(dim=0)
    low, high = first[:, _MIN].amin(), first[:, _MAX].amax()
    level, offset, factors, center = binning(low, high)

    histogram = torch.zeros(_HIST_LEN + 1, dtype=torch.float64, device=values.device)
    centered_sums = []
    for chunk in chunks():
        centered_sums.append(chunk.centered_sums(center))
        _count_bins(histogram, chunk.bins(factors, offset))
    scalars = torch.cat(
        [
            counts,
            torch.stack([low, high, center]),
            torch.stack(centered_sums).sum(dim=0),
            torch.stack([level.to(torch.float64), offset]),
        ]
    )
    return Part("sketch", (scalars, histogram[:_HIST_LEN]))


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

    def bins(self, factors: list[torch.Tensor], offset: torch.Tensor) -> torch.Tensor:
        """Histogram bin of every entry; excluded entries go to the trash bin."""
        x = self.kept
        for factor in factors:
            x.mul_(factor)
        x.floor_().sub_(offset)
        if self.usable is not None:
            x.mul_(self.usable).addcmul_(_complement(self.usable, self.other), _TRASH)
        return x


_FLOAT64_MAX = torch.tensor(torch.finfo(torch.float64).max, dtype=torch.float64)
_TRASH = torch.tensor(float(_TRASH_BIN), dtype=torch.float64)


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


def _count_bins(histogram: torch.Tensor, bins: torch.Tensor) -> None:
    """Add the bins (whole numbers in ``[0, len(histogram))``, any dtype) to a CPU histogram."""
    histogram += torch.bincount(bins.reshape(-1).to(torch.int64), minlength=histogram.numel())

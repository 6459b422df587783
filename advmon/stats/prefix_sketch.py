"""The fast sketch of a large CPU tensor under a prefix mask (ones, then zeros, per row).

Most token masks are prefix masks: a response's tokens, then padding. For them
the valid entries of each row are one contiguous run, ``values[r, :length[r]]``,
so the statistics never need to read the padding or multiply by the mask:

1. **Proof.** One pass over the mask gives each row's indicator ``mask > 0`` as
   0/1 floats, its row sum ``c`` and its index sum ``sum(j * indicator[j])``.
   The ``c`` ones sit at positions ``0..c-1`` exactly when the index sum is
   ``c (c - 1) / 2``, the smallest sum of ``c`` distinct positions. The sums
   are of whole numbers below ``2**24`` (float32) or ``2**53`` (float64), so
   they are exact. Any row that fails sends the whole tensor to the general
   sketch in :mod:`advmon.stats.cpu_sketch`.
2. **Gather.** Rows sorted by length are taken in groups of ``G`` rows; a
   group's rectangle (its rows up to its shortest length) is copied with one
   ``index_select``, and the ragged rest of every group is gathered at the end.
   Sorted lengths telescope, so the ragged rest holds at most ``G * T``
   entries; ``G = min(BLOCK_ELEMENTS // T, B // 32, GROUP_ROWS)`` keeps that,
   and every buffer, within one block and a small share of the batch. Blocks of about
   ``BLOCK_ELEMENTS`` dense valid values are then processed in cache.
3. **Statistics.** Moments are float64 sums around each block's midpoint,
   shifted to the whole range's midpoint as parts merge; extrema come from
   ``aminmax``. Buckets need no range: every value's is the high half of its
   float32 bits, counted over all 65,536 positions in one ``bincount`` per few
   blocks and folded into the part's window at the end; only values that leave
   float32's normal range (``sketch_format.scale_exponent``) are counted again,
   scaled, in a second pass. A block holding NaN or Inf has them counted and its
   finite values selected (a boolean index, only there).

The result is a :class:`~advmon.stats.sketch_format.Part` with the same layout and
buckets as the general sketch, so the two merge, and every statistic stays what
the general path computes (``tests/test_prefix_sketch.py`` checks them against
NumPy and against the general sketch, bucket for bucket).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from advmon.stats.sketch_format import (
    FULL_POSITIONS,
    Part,
    PositionMaxima,
    cpu_positions,
    fold_positions,
    recentered_sums,
    scale_exponent,
    highest_position,
)

__all__ = ["RowExtremes", "indicator_chunks", "prefix_lengths", "prefix_part"]

#: At most this many sorted rows are gathered per ``index_select`` (fewer for long rows).
GROUP_ROWS = 64
#: Dense valid values processed at once. 256K measured 3-5% faster (fewer torch calls)
#: but took peak memory to 0.50-0.51x a 4096 x 2048 float32 tensor (128K: 0.43-0.45x).
BLOCK_ELEMENTS = 1 << 17
#: Bucket positions of this many values are counted by one ``bincount`` (int32, which it reads as they are: 2 MiB).
_PENDING_BINS = 4 * BLOCK_ELEMENTS


def indicator_chunks(mask: torch.Tensor, dtype: torch.dtype = torch.float32, chunk_elements: int = 1 << 19):
    """Yield ``(first row, 0/1 indicator of mask > 0)`` for row chunks of a 2-D mask.

    ``torch.gt`` writes the indicator straight into a reused float buffer: exact for
    any mask dtype (a NaN entry is not ``> 0``), one op, and float sums over it are
    several times faster than sums over bool, uint8 or int tensors on CPU (measured).
    Chunks of about ``chunk_elements`` stay in cache.
    """
    rows, cols = mask.shape
    step = max(1, chunk_elements // max(cols, 1))
    buffer = torch.empty((min(step, rows), cols), dtype=dtype, device=mask.device)
    for start in range(0, rows, step):
        chunk = mask[start : start + step]
        yield start, torch.gt(chunk, 0, out=buffer[: chunk.shape[0]])


def prefix_lengths(valid: torch.Tensor) -> torch.Tensor | None:
    """Valid length of every row of a 2-D CPU mask, or ``None`` if a row is not a prefix.

    Entries count as valid where ``valid > 0`` (NaN is not), as everywhere in advmon.

    Example:
        >>> prefix_lengths(torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])).tolist()
        [2, 0]
        >>> prefix_lengths(torch.tensor([[1.0, 0.0, 1.0]])) is None
        True
    """
    rows, cols = valid.shape
    if cols >= 1 << 26:
        return None
    dtype = torch.float32 if cols <= 4096 else torch.float64  # c (c - 1) exact below 2**24
    positions = torch.arange(cols, dtype=dtype)
    counts = torch.empty(rows, dtype=dtype)
    index_sums = torch.empty(rows, dtype=dtype)
    for start, ones in indicator_chunks(valid, dtype, chunk_elements=1 << 20):  # 4 MiB: peak memory under 0.5x
        torch.sum(ones, dim=1, out=counts[start : start + ones.shape[0]])
        torch.mv(ones, positions, out=index_sums[start : start + ones.shape[0]])
    if not torch.equal(index_sums, counts * (counts - 1) / 2):
        return None
    return counts.to(torch.int64)


class RowExtremes:
    """Each row's largest and smallest valid value and their sum, taken in the sketch's own pass.

    The drill-down needs per-row peaks (:mod:`advmon.stats.rows`); a second pass
    over a large tensor would cost the CPU as much again, while the sketch copies
    every valid value into cache anyway, a row rectangle at a time. ``complete`` is
    set once every row was covered; a NaN or Inf shows as a non-finite extreme
    (the caller does that row again exactly).
    """

    def __init__(self, rows: int, dtype: torch.dtype, sums: bool = True) -> None:
        self.high = torch.full((rows,), -math.inf, dtype=dtype)
        self.low = torch.full((rows,), math.inf, dtype=dtype)
        #: Rows' sums, in float64 (only with ``sums``: slices need them, exemplars do not).
        self.total = torch.zeros(rows, dtype=torch.float64) if sums else None
        self.lengths: torch.Tensor | None = None
        self.complete = False
        # The rectangles' rows in the order the sketch takes them (:meth:`follow`): written in place
        # span by span (no list of small tensors to join), put back in row order once, by :meth:`_flush`.
        self._order: torch.Tensor | None = None
        self._in_order: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        self._high_view = self._low_view = None  #: NumPy views of the in-order highs and lows
        self._covered = 0

    @property
    def wants_sums(self) -> bool:
        return self.total is not None

    def follow(self, order: torch.Tensor) -> None:
        """The sketch takes the rows in ``order``; each rectangle is then a span of it (a ``slice``)."""
        rows = order.shape[0]
        self._order = order
        self._in_order = (torch.empty(rows, dtype=self.high.dtype), torch.empty(rows, dtype=self.low.dtype),
                          torch.zeros(rows, dtype=torch.float64) if self.wants_sums else None)
        self._high_view, self._low_view = self._in_order[0].numpy(), self._in_order[1].numpy()  # (CPU only)
        self._covered = 0

    def add_rectangle(self, span: slice, block: torch.Tensor) -> None:
        """A rectangle of whole rows' leading values: the rows ``order[span]`` (each row is in one rectangle)."""
        high, low, _ = self._in_order
        torch.amax(block, dim=1, out=high[span])
        torch.amin(block, dim=1, out=low[span])
        self._covered = max(self._covered, span.stop)

    def add_rectangle_sums(self, span: slice, block: torch.Tensor) -> None:
        """The same rectangle's row sums, from its float64 copy where the sketch made one (no conversion here)."""
        torch.sum(block, dim=1, dtype=torch.float64, out=self._in_order[2][span])

    def span_extrema(self, span: slice) -> tuple[float, float]:
        """(min, max) of the rows ``order[span]`` so far: NaN if one holds a NaN (NumPy's reductions propagate it).

        A block's worth of rows: two NumPy reductions cost less than two torch ops.
        """
        return float(np.minimum.reduce(self._low_view[span])), float(np.maximum.reduce(self._high_view[span]))

    def span_sums(self, spans: list[slice]) -> list[float]:
        """The float64 sums of the rows ``order[span]`` for rising spans, in one NumPy call.

        Each span's start and stop are cut points of ``reduceat``; the sums between them (a
        block the sketch summed itself, or nothing) are dropped, the last span runs to the end.
        """
        if not spans:
            return []
        base = spans[0].start
        totals = self._in_order[2].numpy()[base : spans[-1].stop]
        cuts = [cut - base for span in spans for cut in (span.start, span.stop)][:-1]
        return np.add.reduceat(totals, cuts)[::2].tolist()

    def _flush(self) -> None:
        if self._covered:
            rows, covered = self._order[: self._covered], self._covered
            high, low, total = self._in_order
            self.high[rows], self.low[rows] = high[:covered], low[:covered]
            if total is not None:
                self.total[rows] = total[:covered]
            self._covered = 0

    def add_segments(self, rows: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> None:
        """Rows' ragged tails: ``values`` holds each row's ``lengths[i]`` values in turn."""
        self._flush()
        high = torch.segment_reduce(values, "max", lengths=lengths)
        low = torch.segment_reduce(values, "min", lengths=lengths)
        self.high[rows] = torch.maximum(self.high[rows], high)
        self.low[rows] = torch.minimum(self.low[rows], low)
        if self.total is not None:
            self.total[rows] += torch.segment_reduce(values.to(torch.float64), "sum", lengths=lengths)


def prefix_part(values: torch.Tensor, lengths: torch.Tensor, extremes: RowExtremes | None = None) -> Part | None:
    """Sketch of ``values[r, :lengths[r]]`` over all rows; ``None`` where the general sketch must do it.

    ``values`` is a 2-D CPU tensor (float32 or float64, rows contiguous).
    ``None`` comes back when nothing is valid, or every sampled value is NaN or Inf.
    With ``extremes``, each row's extremes and sum are taken on the way.

    Example:
        >>> from advmon.stats import summarize
        >>> x = torch.arange(12.0).reshape(3, 4)
        >>> part = prefix_part(x, torch.tensor([4, 2, 0]))
        >>> s = summarize([part])
        >>> s["count"], s["mean"], s["max"]
        (6.0, 2.5, 5.0)
    """
    if values.dtype not in (torch.float32, torch.float64) or values.stride(1) != 1:
        return None
    total = int(lengths.sum())
    if total == 0:
        return None
    layout = _Layout(values, lengths, extremes)
    sums = _BlockSums(values.dtype, extremes)
    for block in layout.blocks():
        sums.add(block, layout if extremes is not None else None)
    if extremes is not None:
        layout.ragged_extremes()
        extremes.lengths = lengths
        extremes.complete = True
    if not sums.lows:
        return None  # every valid value is NaN or Inf: the general sketch counts them
    layout.extremes = None  # a second counting pass reads the same values again: not twice
    low, high = sums.extrema()
    scale = scale_exponent(max(-low, high))
    maxima = sums.maxima
    if scale == 0:
        counts = sums.position_counts()
    else:
        maxima = PositionMaxima()
        counts = _scaled_counts(layout, scale, maxima)
    top = highest_position(max(-low, high), scale)
    histogram = fold_positions(counts, top).to(torch.float64)
    table = maxima.table(counts, top, lambda again: _scaled_counts(layout, scale, again))
    finite = float(total - sums.nan - sums.inf)
    scalars = torch.tensor(
        [float(total), float(sums.nan), float(sums.inf), finite, sums.abs_sum(), low, high, *sums.centered(),
         float(top), float(scale)],
        dtype=torch.float64,
    )
    return Part("sketch", (scalars, histogram, table))


class _Layout:
    """Where the valid entries are: sorted row groups, their rectangles and the ragged rest."""

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor, extremes: RowExtremes | None = None) -> None:
        self.values = values
        self.lengths = lengths
        self.extremes = extremes
        #: (span of the sorted rows, start, width) of each rectangle in the block last yielded
        self.rectangles: list[tuple[slice, int, int]] = []
        # The ragged rest is at most group * T entries: a block, and a small share of a small batch.
        rows, cols = values.shape
        group = self.group_rows = max(1, min(GROUP_ROWS, BLOCK_ELEMENTS // max(cols, 1), rows // 32))
        order = torch.argsort(lengths, descending=True, stable=True)
        sorted_lengths = lengths[order]
        # Sorted descending, a group's shortest row is its last one.
        group_width = sorted_lengths[min(group, len(order)) - 1 :: group]
        if len(order) % group:
            group_width = torch.cat([group_width, sorted_lengths[-1:]])
        # Each group is a span of ``order``, the next one's start where it ends; empty rows (width 0) come last.
        self.groups = [(rows, width) for rows, width in zip(order.split(group), group_width.tolist()) if width > 0]
        if extremes is not None:
            extremes.follow(order)
        # The ragged rest: each row past its group's width.
        first = torch.repeat_interleave(group_width, group)[: len(order)]
        extra = sorted_lengths - first
        self.ragged = None
        self.ragged_rows = self.ragged_lengths = None
        if bool((extra > 0).any()):
            keep = extra > 0
            rows, first, extra = order[keep], first[keep], extra[keep]
            self.ragged_rows, self.ragged_lengths = rows, extra
            before = torch.cumsum(extra, 0) - extra  # ragged entries of the rows before each row
            # Entry k of the ragged rest sits at its row's first ragged offset plus k - before.
            shift = self.offsets(rows, first) - before
            self.ragged = torch.arange(int(before[-1] + extra[-1])) + torch.repeat_interleave(shift, extra)

    def offsets(self, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """Positions of ``values[rows, columns]`` in :meth:`flat` (rows are contiguous)."""
        return rows * self.values.stride(0) + columns

    def flat(self) -> torch.Tensor:
        """A 1-D view of the memory ``values`` spans: ``index_select`` on it is ~4x faster than 2-D indexing."""
        rows, cols = self.values.shape
        span = (rows - 1) * self.values.stride(0) + cols if rows else 0
        return self.values.as_strided((span,), (1,))

    def blocks(self):
        """Yield 1-D tensors of valid values, about ``BLOCK_ELEMENTS`` each (a reused buffer)."""
        values = self.values
        widest = max((width for _, width in self.groups), default=0)
        buffer = torch.empty(max(BLOCK_ELEMENTS, self.group_rows * widest), dtype=values.dtype)
        filled = position = 0
        self.rectangles = []
        for rows, width in self.groups:
            size = rows.numel() * width
            if filled and filled + size > buffer.numel():
                yield buffer[:filled]
                filled = 0
                self.rectangles = []
            rectangle = buffer[filled : filled + size].view(rows.numel(), width)
            torch.index_select(values[:, :width], 0, rows, out=rectangle)
            span = slice(position, position + rows.numel())
            if self.extremes is not None:
                self.extremes.add_rectangle(span, rectangle)  # in cache, just copied
            self.rectangles.append((span, filled, width))
            filled += size
            position = span.stop
        if filled:
            yield buffer[:filled]
        self.rectangles = []
        if self.ragged is not None:
            flat = self.flat()
            if self.extremes is not None:
                # The rows' tails (at most a block: see __init__), gathered once for the rows' extremes and
                # the sketch, before the sketch may centre a float64 block in place.
                tails = flat.index_select(0, self.ragged)
                self.extremes.add_segments(self.ragged_rows, tails, self.ragged_lengths)
                for start in range(0, tails.numel(), BLOCK_ELEMENTS):
                    yield tails[start : start + BLOCK_ELEMENTS]
                return
            for start in range(0, self.ragged.numel(), BLOCK_ELEMENTS):
                yield flat.index_select(0, self.ragged[start : start + BLOCK_ELEMENTS])

    def _block_span(self) -> slice | None:
        """The sorted rows of the block just yielded (its rectangles' spans follow each other)."""
        if self.extremes is None or not self.rectangles:
            return None  # no extremes wanted, or a ragged block
        return slice(self.rectangles[0][0].start, self.rectangles[-1][0].stop)

    def block_extrema(self) -> tuple[float, float] | None:
        """The block just yielded's (min, max) from its rows' extremes (NaN if it holds one); ``None``: not known."""
        span = self._block_span()
        return None if span is None else self.extremes.span_extrema(span)

    def rectangle_sums(self, block: torch.Tensor) -> slice | None:
        """Add the row sums of the block just yielded to ``extremes``, from ``block`` or a copy laid out alike.

        Returns the block's span of sorted rows, whose sums add up to the block's (``None`` when no row
        sums are wanted or the block is not made of rectangles: a ragged block).
        """
        span = self._block_span()
        if span is None or not self.extremes.wants_sums:
            return None
        for rows, start, width in self.rectangles:
            size = (rows.stop - rows.start) * width
            self.extremes.add_rectangle_sums(rows, block[start : start + size].view(-1, width))
        return span

    def ragged_extremes(self) -> None:
        """Put the rows' extremes in row order (:meth:`blocks` took the rectangles and the ragged tails)."""
        if self.extremes is not None:
            self.extremes._flush()


def _finite(block: torch.Tensor) -> torch.Tensor:
    """The finite values of a 1-D block (the block itself when all are)."""
    if bool(torch.isfinite(block.sum())):
        return block  # a sum of finite values can overflow to Inf, never the other way
    return block[torch.isfinite(block)]


class _BlockSums:
    """Running moments, extrema and bucket counts over blocks of valid values.

    A block costs a dozen torch calls of a few microseconds each, so per-block
    bookkeeping is kept off torch: the sums stay 0-d tensors in lists, stacked
    once at the end, and the bucket positions of several blocks wait in one uint16
    buffer for a single ``bincount``.
    """

    def __init__(self, dtype: torch.dtype, rows: RowExtremes | None = None) -> None:
        self.sizes: list[int] = []
        self.nan = self.inf = 0
        self._counts = torch.zeros(FULL_POSITIONS, dtype=torch.int64)
        self._pending = 0  # positions waiting in the "positions" buffer
        self._sums: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] = ([], [], [])
        self.lows: list[float] = []
        self.highs: list[float] = []
        self._buffers: dict[str, torch.Tensor] = {}
        #: Blocks whose centred sum comes from their rows' sums: (index in the sums, rows' span, size * centre).
        self._from_rows: list[tuple[int, slice, float]] = []
        self._rows = rows  #: the rows' extremes and sums the layout takes, if any
        #: Each position's value of largest magnitude, while few positions hold values
        self.maxima = PositionMaxima()

    def add(self, block: torch.Tensor, layout: _Layout | None = None) -> None:
        """Add a block's values; with the ``layout`` that yielded it, its rows' summaries are shared.

        The rows' extremes (taken as the block was copied) give the block's, and the rows' float64
        sums (wanted by slices) give the block's sum: one pass over the block fewer for each.
        """
        extrema = None if layout is None else layout.block_extrema()
        low, high = extrema if extrema is not None else (float(v) for v in torch.aminmax(block))
        if not (math.isfinite(low) and math.isfinite(high)):
            if layout is not None:
                layout.rectangle_sums(block)  # before its NaN and Inf are dropped: the rows' layout holds only now
                layout = None
            # NaN or Inf among the valid values (rare, and what a monitor is for):
            # count them and go on with the block's finite values, selected once.
            nan = int(torch.isnan(block).sum())
            kept = block[torch.isfinite(block)]
            self.nan += nan
            self.inf += block.numel() - kept.numel() - nan
            if kept.numel() == 0:
                return
            block = kept
            low, high = (float(v) for v in torch.aminmax(block))
        self.lows.append(low)
        self.highs.append(high)
        copy = block if block.dtype == torch.float64 else self._buffer("float64", block.numel(), torch.float64).copy_(block)
        rows = None if layout is None else layout.rectangle_sums(copy)  # before it is centred below
        self._count_positions(block)
        abs_sums, first_sums, second_sums = self._sums
        abs_sums.append(torch.abs(copy, out=self._scratch(copy.numel(), torch.float64)).sum())
        center = low / 2 + high / 2  # halves first: no overflow near the float limits
        copy.sub_(center)
        self.sizes.append(block.numel())
        if rows is None or abs(center) > high - low:
            first_sums.append(copy.sum())
        else:
            # From the rows' sums when slices took them, added up once at the end: a pass fewer. Their
            # rounding grows with the values' magnitude, which reaches the std through the shifts of the
            # blocks' sums: only where the magnitude is within the block's range (0.8% of the std at 1e12
            # with a spread of 1e-3 came from them before).
            self._from_rows.append((len(first_sums), rows, block.numel() * center))
            first_sums.append(_NOT_YET)
        second_sums.append(torch.dot(copy, copy))

    def _count_positions(self, block: torch.Tensor) -> None:
        """Queue the float32 bucket position of every value (see ``sketch_format.cpu_positions``)."""
        size = block.numel()
        if self._pending + size > _PENDING_BINS:
            self._count_pending()
        narrow = block if block.dtype == torch.float32 else self._scratch(size, torch.float32).copy_(block)
        high_halves = narrow.view(torch.int16).view(-1, 2)[:, 1]  # little-endian: the sign's half
        # int32, which bincount reads as it is: converting the pending positions to int64 took a fresh 4 MiB
        # per flush, returned to the system and faulted in again (7 ms a 4096 x 2048 call, in sys time).
        positions = self._buffer("positions", max(_PENDING_BINS, size), torch.int32)
        block_positions = positions[self._pending : self._pending + size].copy_(high_halves.view(torch.uint16))
        self.maxima.add(block_positions, narrow.view(torch.int32))  # nothing once many positions hold values
        self._pending += size

    def _count_pending(self) -> None:
        if self._pending:
            pending = self._buffers["positions"][: self._pending]
            self._counts += torch.bincount(pending, minlength=FULL_POSITIONS)
            self._pending = 0

    def position_counts(self) -> torch.Tensor:
        """Counts per float32 position of every value added."""
        self._count_pending()
        return self._counts

    def _buffer(self, name: str, size: int, dtype: torch.dtype) -> torch.Tensor:
        """A buffer of at least ``size`` elements, made once and reused for the blocks of one call."""
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < size:
            buffer = self._buffers[name] = torch.empty(max(size, BLOCK_ELEMENTS), dtype=dtype)
        return buffer[:size]

    def _scratch(self, size: int, dtype: torch.dtype) -> torch.Tensor:
        """``size`` elements of one scratch buffer: a block's scaled values, then its magnitudes."""
        return self._buffer("scratch", size, torch.float64).view(dtype)[:size]  # float64 holds either dtype

    def extrema(self) -> tuple[float, float]:
        return min(self.lows), max(self.highs)

    def abs_sum(self) -> float:
        return float(torch.stack(self._sums[0]).sum())

    def centered(self) -> tuple[float, float, float]:
        """(center, sum of x - center, sum of (x - center)**2) at the midpoint of the whole range.

        Each block's sums are around its own midpoint; they are shifted as the
        general sketch's parts are when they merge (``recentered_sums``).
        """
        low, high = self.extrema()
        center = low / 2 + high / 2
        block_centers = [block_low / 2 + block_high / 2 for block_low, block_high in zip(self.lows, self.highs)]
        firsts, seconds = torch.stack([torch.stack(self._sums[1]), torch.stack(self._sums[2])]).tolist()
        if self._from_rows:
            totals = self._rows.span_sums([span for _, span, _ in self._from_rows])
            for (index, _, shift), total in zip(self._from_rows, totals):
                firsts[index] = total - shift
        return center, *recentered_sums(zip(self.sizes, block_centers, firsts, seconds), center)


#: A block's place in the list of centred sums until its rows' sums are added up (see ``_from_rows``).
_NOT_YET = torch.zeros((), dtype=torch.float64)


def _scaled_counts(layout: _Layout, scale: int, maxima: PositionMaxima) -> torch.Tensor:
    """Counts per float32 position of the finite values times ``2**scale``, in a second pass (values that leave
    float32's normal range: rare), and their largest values into ``maxima``."""
    counts = torch.zeros(FULL_POSITIONS, dtype=torch.int64)
    factor = math.ldexp(1.0, scale)
    for block in layout.blocks():
        narrow = _finite(block).to(torch.float64).mul_(factor).to(torch.float32)
        positions = cpu_positions(narrow)
        counts += torch.bincount(positions, minlength=FULL_POSITIONS)
        maxima.add(positions, narrow.view(torch.int32), counts)
    return counts

"""The sketch of a large tensor on any device, in a fixed number of whole-tensor torch ops.

On a GPU every torch op is a kernel launch that costs the CPU 10-25 us, and any
value read back to the host waits for the device. So this path, unlike the CPU's
cache-sized row chunks and data-dependent shortcuts, works on the whole tensor at
once and never looks at a value:

1. **Range.** One pass gives the counts (valid, NaN, finite: sums of bool masks,
   exact), the finite valid minimum and maximum, and the sum of ``|x|``.
2. **Level.** :func:`~advmon.stats.sketch_format.binning` turns the range into
   the histogram's bin width and first bin as device tensors.
3. **Moments and histogram.** A second pass sums the deviations from the range's
   midpoint and their squares in float64 and bins every usable value. Bins are
   counted by ``torch.histc`` on their float32 indices (exact: a chunk holds at
   most ``2**24`` values), or, where torch is asked for deterministic algorithms,
   by sorting them and ``searchsorted``; no float64 atomics either way.

Tensors of more than :data:`CHUNK_ELEMENTS` values go in row chunks of about that
size (the float64 temporaries would be too large otherwise), so a call costs
the same few dozen ops up to 16M values and that many per chunk beyond.

The result is a :class:`~advmon.stats.sketch_format.Part` with the CPU paths' layout,
level rule and bins: parts of any path merge.

Example:
    >>> from advmon.stats import summarize
    >>> x = torch.arange(12.0).reshape(3, 4)
    >>> s = summarize([device_part(x, x < 6)])
    >>> s["count"], s["mean"], s["max"]
    (6.0, 2.5, 5.0)
"""

from __future__ import annotations

import math

import torch

from advmon.stats.sketch_format import _HIST_LEN, Binning, Part, binning

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
    bins = binning(low, high)
    seconds = [chunk.moments_and_bins(bins) for chunk in chunks]
    sums = _summed([s for s, _ in seconds])
    histogram = _summed([h for _, h in seconds])
    scalars = torch.cat(  # one dtype promotion to float64 instead of a conversion per piece
        [firsts[:2], (n_valid - n_nan - n_finite)[None], firsts[2:], bins.center[None], sums,
         bins.level[None], bins.offset[None]]
    )
    return Part("sketch", (scalars, histogram))


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.stack(tensors)


def _summed(tensors: list[torch.Tensor]) -> torch.Tensor:
    return tensors[0] if len(tensors) == 1 else torch.stack(tensors).sum(dim=0)


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

    def moments_and_bins(self, bins: Binning) -> tuple[torch.Tensor, torch.Tensor]:
        """([sum(x - center), sum((x - center)^2)] over usable values, int64 histogram of their bins)."""
        unusable = self.unusable
        scratch = self.values.to(torch.float64, copy=True)
        deviation = scratch.sub_(bins.center).masked_fill_(unusable, 0.0).reshape(-1)
        weighted = deviation if self.weights is None else deviation * self.weights.reshape(-1)
        sums = torch.cat([weighted.sum()[None], torch.dot(weighted, deviation)[None]])
        index = scratch.copy_(self.values).mul_(bins.factors[0]).mul_(bins.factors[1]).floor_().sub_(bins.offset)
        index = index.masked_fill_(unusable, -1.0)  # -1: outside every bin
        weights = None if self.weights is None else self.weights.reshape(-1)
        return sums, _bin_counts(index.reshape(-1), weights)


def _bin_counts(index: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """int64 counts of whole-number bin indices in ``[0, _HIST_LEN)`` (``-1`` counts nowhere).

    ``histc``'s float32 counts are exact for a chunk of at most ``2**24`` values.
    For longer chunks, for weights, and under ``torch.use_deterministic_algorithms``
    (``histc`` has no deterministic CUDA kernel), the indices are sorted and counted
    by ``searchsorted`` at the bin edges instead.
    """
    exact_in_float32 = index.numel() <= _HISTC_EXACT  # a chunk can be longer: one row of more values than that
    if weights is None and exact_in_float32 and not torch.are_deterministic_algorithms_enabled():
        return torch.histc(index.to(torch.float32), bins=_HIST_LEN, min=0, max=_HIST_LEN).to(torch.int64)
    ordered, order = torch.sort(index)
    edges = torch.arange(_HIST_LEN + 1, dtype=torch.float64, device=index.device).sub_(0.5)
    below = torch.searchsorted(ordered, edges)
    if weights is None:
        return below.diff()
    # Whole-number weights summed as integers: exact, and deterministic on CUDA (a float cumsum is not).
    cumulative = torch.cat([order.new_zeros(1), torch.cumsum(weights[order].to(torch.int64), 0)])
    return cumulative[below].diff()

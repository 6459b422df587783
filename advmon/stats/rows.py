"""Per-sample summaries of a call's advantages, for the drill-down: each sample's peak, and optionally its sum.

The record's statistics summarise all valid positions together; the drill-down
needs them per sample (then per group, per slice). One pass over a dense
``[B, T]`` tensor, in row chunks that stay in cache on the CPU (and bound the
temporaries elsewhere), with a fixed number of ops per chunk and nothing read
back to the host. An expand view or a ``[B]`` tensor costs ``B`` values.

Example:
    >>> rows = row_summaries(torch.tensor([[1.0, -3.0, 9.0], [float("nan"), 2.0, 0.0]]),
    ...                      torch.tensor([[1, 1, 0], [1, 1, 1]]), sums=True)
    >>> rows.abs_max.tolist(), rows.nonfinite.tolist(), rows.total.tolist(), rows.count.tolist()
    ([3.0, 2.0], [0.0, 1.0], [-2.0, 2.0], [2.0, 2.0])
    >>> rows.peak().tolist()  # a broken sample has no peak
    [3.0, -inf]
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from advmon.stats.devices import attempt_triton, host_float64, path_for, sync_free
from advmon.stats.prefix_sketch import indicator_chunks

__all__ = ["RowSummary", "row_summaries", "row_valid_counts", "value_summaries"]

#: Dense values reduced per row at once, off the CPU (bounds a chunk's temporaries as the sketch does).
_DEVICE_CHUNK = 1 << 24
#: On the CPU: rows a chunk holds stay in cache.
_CPU_CHUNK = 1 << 16


class RowSummary(NamedTuple):
    """Float64 ``[B]`` tensors (NumPy arrays from the CPU's per-value path: no tensor made only to be
    read back); ``total`` and ``count`` only with ``sums=True``."""

    abs_max: torch.Tensor | np.ndarray  #: the largest finite |value| at a valid position (``-inf`` without one)
    nonfinite: torch.Tensor | np.ndarray  #: 1.0 where a valid position holds NaN or Inf
    total: torch.Tensor | np.ndarray | None = None  #: sum of the finite valid values
    count: torch.Tensor | np.ndarray | None = None  #: number of finite valid values

    def peak(self) -> torch.Tensor | np.ndarray:
        """``abs_max`` where the sample has no non-finite valid value, else ``-inf``."""
        if isinstance(self.nonfinite, np.ndarray):
            return _host_peak(self)
        if not sync_free(self.nonfinite) and not bool(self.nonfinite.any()):
            return self.abs_max  # on the CPU, nothing broken (the common case): one op, not two
        return self.abs_max.masked_fill(self.nonfinite > 0, -math.inf)


def _host_peak(rows: RowSummary) -> np.ndarray:
    abs_max = host_float64(rows.abs_max)
    if not np.count_nonzero(rows.nonfinite):
        return abs_max  # nothing broken (the common case): one op
    return np.where(rows.nonfinite > 0, -math.inf, abs_max)


def row_summaries(
    values: torch.Tensor, mask: torch.Tensor | None, row_counts: torch.Tensor | None = None, *, sums: bool = False
) -> RowSummary:
    """Each sample's summary of ``values`` at valid positions.

    ``values`` is ``[B]``, ``[B, 1]`` (per sequence: the mask does not apply) or
    ``[B, T]`` under ``mask > 0`` (every position without one). For an expand
    view, ``row_counts`` (the mask's :func:`~advmon.stats.row_valid_counts`)
    saves a pass over the mask. Without ``sums``, a dense row with a non-finite
    value gets ``abs_max = -inf`` (one ``aminmax`` pass cannot see past it); with
    them, the finite values are kept apart first, at a few more ops per chunk.
    Dense rows are reduced where they are; one value a row (``[B]``, an expand view) is
    ``[B]``-sized work, done in NumPy (:func:`value_summaries`): host data.
    """
    if values.dim() == 1 or (values.dim() == 2 and values.shape[1] == 1):
        return _host_per_value(values.reshape(-1), None, sums)
    if values.stride(1) == 0:  # an expand view: one value per row, counted at its row's valid positions
        if mask is None:
            weights = torch.full((values.shape[0],), float(values.shape[1]), dtype=torch.float64, device=values.device)
        else:
            weights = row_valid_counts(mask) if row_counts is None else row_counts
        return _host_per_value(values[:, 0], weights, sums)
    return _dense(values.reshape(values.shape[0], -1), None if mask is None else mask.reshape(values.shape[0], -1), sums)


def value_summaries(values: torch.Tensor, weights: torch.Tensor | None = None, *, sums: bool = False) -> RowSummary:
    """:func:`row_summaries` of samples that are one value each (``[B]``), counted ``weights`` times where given
    (an expand view's rows: their valid counts, 0 = not valid); host data, in NumPy.

    Example:
        >>> rows = value_summaries(torch.tensor([2.0, -3.0, float("nan")]), torch.tensor([4.0, 0.0, 1.0]), sums=True)
        >>> rows.abs_max.tolist(), rows.nonfinite.tolist(), rows.total.tolist()
        ([2.0, -inf, -inf], [0.0, 0.0, 1.0], [8.0, 0.0, 0.0])
    """
    return _host_per_value(values.reshape(-1), weights, sums)


def _host_per_value(values: torch.Tensor, weights: torch.Tensor | None, sums: bool) -> RowSummary:
    """:func:`value_summaries` in NumPy: a few thousand values cost torch's per-op overhead, not arithmetic.

    Device tensors are read back (a CPU call's advantages on a GPU: the monitor's device calls send theirs in
    the record's transfer instead).
    """
    v = host_float64(values.cpu())
    magnitude = np.abs(v)
    w = None if weights is None else host_float64(weights.cpu())
    # A NaN or Inf makes the sum non-finite (so does an overflow of finite values: the general branch is exact too).
    if math.isfinite(np.add.reduce(magnitude)):  # the common case, in fewer ops: nothing is broken
        bad = np.zeros(v.shape[0])
        usable = None if w is None or np.minimum.reduce(w, initial=math.inf) > 0 else w > 0
    else:
        usable = magnitude < math.inf  # NaN and Inf fail it
        bad = (~usable if w is None else (w > 0) & ~usable).astype(np.float64)
        if w is not None:
            usable &= w > 0
    abs_max = magnitude if usable is None else np.where(usable, magnitude, -math.inf)
    if not sums:
        return RowSummary(abs_max, bad)
    if usable is None:  # every sample valid and finite: v and w may be the caller's own memory
        count = np.ones(v.shape[0]) if w is None else w.copy()
        total = v.copy() if w is None else v * w
    else:
        count = usable.astype(np.float64) if w is None else np.where(usable, w, 0.0)
        total = np.where(usable, v, 0.0) * count
    return RowSummary(abs_max, bad, total, count)


def _dense(flat: torch.Tensor, mask: torch.Tensor | None, sums: bool) -> RowSummary:
    if mask is not None and not sync_free(flat) and _binary_float_mask(flat, mask):
        return _dense_binary(flat, mask, sums)
    return _dense_exact(flat, mask, sums)


def _binary_float_mask(flat: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether a CPU float mask holds only 0 and 1 (then ``values * mask`` keeps exactly the valid values).

    With ``0 <= m <= 1``, ``m * m <= m`` and equality everywhere means every ``m`` is 0 or 1:
    three reductions, no boolean temporary (comparisons cost the CPU several times more).
    """
    if mask.dtype != flat.dtype or not mask.is_floating_point() or mask.numel() == 0:
        return False
    low, high = float(mask.amin()), float(mask.amax())
    if not (low >= 0 and high <= 1):
        return False
    line = mask.reshape(-1)
    return float(torch.dot(line, line)) == float(line.sum())


def _dense_binary(flat: torch.Tensor, mask: torch.Tensor, sums: bool) -> RowSummary:
    """:func:`_dense_exact` for a 0/1 mask on the CPU: ``values * mask``, then plain row reductions.

    A row whose peak comes out NaN or infinite holds a NaN or Inf somewhere (padding
    included: ``NaN * 0`` is NaN); those rows, rare, are done again exactly.
    """
    rows, cols = flat.shape
    peak = torch.empty(rows, dtype=flat.dtype)
    # Summed in the mask's own dtype: a float64 result would copy the whole mask to float64 first.
    # 0/1 values: the partial sums are whole numbers, exact in float32 below 2**24 columns.
    counts = (mask.sum(dim=1) if cols < (1 << 24) else mask.sum(dim=1, dtype=torch.float64)).to(torch.float64)
    total = torch.empty(rows, dtype=torch.float64) if sums else None
    step = max(1, _CPU_CHUNK // max(cols, 1))
    buffer = torch.empty(min(step, rows), cols, dtype=flat.dtype)
    for start in range(0, rows, step):
        at = slice(start, start + step)
        kept = torch.mul(flat[at], mask[at], out=buffer[: flat[at].shape[0]])
        torch.maximum(kept.amax(dim=1), kept.amin(dim=1).neg_(), out=peak[at])
        if sums:
            total[at] = kept.sum(dim=1, dtype=torch.float64)
    peak = peak.to(torch.float64)
    has_valid = counts > 0
    abs_max = peak.masked_fill(~has_valid, -math.inf)
    summary = RowSummary(abs_max, torch.zeros(rows, dtype=torch.float64), total, counts if sums else None)
    suspect = torch.nonzero(~torch.isfinite(peak)).reshape(-1)  # on the CPU: reading it back costs nothing
    if suspect.numel():
        exact = _dense_exact(flat[suspect], mask[suspect], sums)
        for mine, theirs in zip(summary, exact):
            if mine is not None:
                mine[suspect] = theirs
    return summary


def _dense_exact(flat: torch.Tensor, mask: torch.Tensor | None, sums: bool) -> RowSummary:
    rows, cols = flat.shape
    device = flat.device
    dtype = flat.dtype if flat.is_floating_point() else torch.float64
    abs_max = torch.full((rows,), -math.inf, dtype=dtype, device=device)
    nonfinite = torch.zeros(rows, dtype=torch.bool, device=device)
    total = torch.zeros(rows, dtype=torch.float64, device=device) if sums else None
    count = torch.zeros(rows, dtype=torch.float64, device=device) if sums else None
    step = max(1, (_DEVICE_CHUNK if sync_free(flat) else _CPU_CHUNK) // max(cols, 1))
    for start in range(0, rows if cols else 0, step):
        at = slice(start, start + step)
        block = flat[at].to(dtype)
        valid = None if mask is None else mask[at] > 0
        if sums:
            finite = torch.isfinite(block)
            usable = finite if valid is None else finite & valid
            nonfinite[at] = (~finite if valid is None else valid & ~finite).any(dim=1)
            kept = torch.where(usable, block, 0)
            total[at] = kept.sum(dim=1, dtype=torch.float64)
            count[at] = usable.sum(dim=1, dtype=torch.float64)
            low, high = torch.aminmax(kept, dim=1)
            # A row without usable values has only zeros: not a peak.
            abs_max[at] = torch.maximum(high, -low).masked_fill(~usable.any(dim=1), -math.inf)
        else:
            kept = block if valid is None else torch.where(valid, block, 0)
            # One pass: a NaN or an infinity in a row makes its extremes, so its peak, non-finite.
            low, high = torch.aminmax(kept, dim=1)
            peak = torch.maximum(high, -low)
            broken = ~torch.isfinite(peak)
            has_valid = valid.any(dim=1) if valid is not None else torch.ones_like(broken)
            nonfinite[at] = broken & has_valid
            abs_max[at] = peak.masked_fill(broken | ~has_valid, -math.inf)
    return RowSummary(abs_max.to(torch.float64), nonfinite.to(torch.float64), total, count)


def row_valid_counts(mask: torch.Tensor) -> torch.Tensor:
    """Number of entries ``> 0`` in each row of a 2-D mask, as float64.

    On the CPU the mask is read once, in row chunks that stay in cache, as a 0/1
    float indicator (see :func:`advmon.stats.prefix_sketch.indicator_chunks`) whose row
    sums are exact counts: whole numbers below ``2**24`` in float32, and float64
    for longer rows. Elsewhere it is a fixed handful of whole-tensor ops (see
    :func:`_counts_without_copies`); no value is read back, so device masks do
    not sync.

    Example:
        >>> row_valid_counts(torch.tensor([[1.0, 0.5, 0.0], [0.0, 0.0, 0.0]])).tolist()
        [2.0, 0.0]
        >>> row_valid_counts(torch.tensor([[float("nan"), -1.0, 2.0]])).tolist()
        [1.0]
    """
    mask = mask.detach()
    if path_for(mask.device) == "triton":  # one kernel where the torch path takes five ops
        counts = attempt_triton(lambda: _triton_row_counts(mask), mask.device)
        if counts is not None:
            return counts
    if sync_free(mask):
        # gt(bool, 0) would widen a bool mask to int64 first: a bool mask already says which count.
        return _counts_without_copies(mask if mask.dtype == torch.bool else torch.gt(mask, 0))
    rows, cols = mask.shape
    dtype = torch.float32 if cols < (1 << 24) else torch.float64
    counts = torch.empty(rows, dtype=dtype, device=mask.device)
    # 4 MiB chunks (in L3): measured faster than 1-2 MiB, the per-op overhead then counts.
    for start, ones in indicator_chunks(mask, dtype, chunk_elements=1 << 20):
        torch.sum(ones, dim=1, out=counts[start : start + ones.shape[0]])
    return counts.to(torch.float64)


#: Most entries a uint8 sum can count without overflowing.
_BYTE_SPAN = 255


def _triton_row_counts(mask: torch.Tensor) -> torch.Tensor:
    from advmon.stats.triton_rows import triton_row_counts  # imports triton: only where it is used

    return triton_row_counts(mask)


def _counts_without_copies(valid: torch.Tensor) -> torch.Tensor:
    """Row counts of a 2-D bool tensor as float64, with no temporary of its size.

    A reduction whose result dtype differs from its input's first copies the whole
    input to that dtype: ``valid.sum(1, dtype=float64)`` made 8 bytes an entry (2x
    a float32 tensor, measured on an H200). Summed as bytes, spans of 255 columns
    cannot overflow; only those partial counts (1/255 of the size) are widened.

    Example:
        >>> _counts_without_copies(torch.ones(2, 600, dtype=torch.bool)).tolist()
        [600.0, 600.0]
    """
    rows, cols = valid.shape
    whole = cols - cols % _BYTE_SPAN
    as_bytes = valid.view(torch.uint8)
    spans = as_bytes[:, :whole].reshape(rows, whole // _BYTE_SPAN, _BYTE_SPAN).sum(dim=2, dtype=torch.uint8)
    tail = as_bytes[:, whole:].sum(dim=1, dtype=torch.uint8)
    return spans.sum(dim=1, dtype=torch.float64) + tail

"""The worst prompt groups of a call: which groups an on-call engineer should look at first.

Pure functions over tensors, on any device, with a fixed number of ops and nothing
read back to the host: every group's values come from segments of samples sorted
by group (``searchsorted`` for the bounds, ``segment_reduce`` for each segment on
its own), the ranking is three stable sorts, and the ``k`` worst groups leave the
device as one small ``[k, len(FIELDS)]`` float64 table inside the record's one
transfer.

Groups are ranked by why they were chosen, then by how bad they are:

0. **non-finite**: a NaN or Inf reward, a reward function's NaN or Inf score
   (it returned ``None``) although the summed reward is finite, or a sample
   with a non-finite valid advantage (most non-finite values first);
1. **beyond the bound**: the group's largest finite |post-norm advantage| is more
   than ``bound_factor`` times what the call's normalization allows it
   (:func:`advmon.group_bounds.group_ratios`: ``G / sqrt(G - 1)`` for a group-std
   normalization of ``G`` samples, the group's reward spread for a group-mean baseline);
2. the largest finite |post-norm advantage|.

A group with none of these (no advantages known, nothing non-finite) is not an
exemplar.

Example:
    >>> import torch
    >>> from advmon.group_bounds import group_peaks
    >>> rewards = torch.tensor([1.0, float("nan"), 0.5, 0.5, 2.0, 0.0])
    >>> segments = reward_segments(rewards, torch.tensor([0, 0, 1, 1, 2, 2]))
    >>> peaks = group_peaks(segments, torch.tensor([1.0, 0.0, 0.0, 0.0, 0.7, 0.7]), torch.zeros(6))
    >>> table = worst_groups(segments, peaks, None, k=2, bound_factor=3.0)
    >>> [REASONS[int(row[FIELDS.index("reason")])] for row in table.tolist()]
    ['nonfinite_rewards', 'largest_abs_advantage']
    >>> [int(row[FIELDS.index("first_sample")]) for row in table.tolist()]
    [0, 4]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from advmon.devices import host_float64, sync_free
from advmon.group_bounds import GroupPeaks
from advmon.groups import HostGroups, host_group_values

__all__ = ["FIELDS", "REASONS", "HostSegments", "RewardSegments", "reward_segments", "worst_groups"]

#: Why a group was chosen, by its ``reason`` code; ``NOT_CHOSEN`` rows are dropped on the host.
REASONS = ("nonfinite_rewards", "nonfinite_reward_functions", "nonfinite_advantages", "beyond_bound",
           "largest_abs_advantage")
NOT_CHOSEN = len(REASONS)
#: Columns of :func:`worst_groups`' table.
FIELDS = (
    "reason",
    "first_sample",  #: the group's first sample in the batch: where its key is read
    "size",
    "reward_finite_count",
    "reward_nan_count",
    "reward_inf_count",
    "reward_function_nonfinite_count",  #: NaN or Inf scores of the reward functions (a function returned None)
    "reward_min",
    "reward_max",
    "reward_mean",
    "advantage_abs_max",
    "advantage_nonfinite_samples",
    "advantage_bound_ratio",
)
_COLUMN = {name: i for i, name in enumerate(FIELDS)}
_REASON = {name: i for i, name in enumerate(REASONS)}


class RewardSegments(NamedTuple):
    """A call's groups as segments of samples sorted by group, with their reward values (one slot each)."""

    order: torch.Tensor  #: sample indices sorted by group (stable: the first of a segment is its first sample)
    bounds: torch.Tensor  #: slot ``s`` is ``order[bounds[s]:bounds[s + 1]]``; empty past the last group
    slot: torch.Tensor  #: each sorted sample's slot (``ids[order]``)
    size: torch.Tensor
    finite: torch.Tensor
    nan: torch.Tensor
    inf: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    mean: torch.Tensor
    function_nonfinite: torch.Tensor  #: the reward functions' NaN and Inf scores in the group


class HostSegments(NamedTuple):
    """:class:`RewardSegments` on the CPU, in NumPy, one slot per group: what the host's worst groups and
    slices read (no tensors to make and read back: each conversion costs microseconds in a watched call)."""

    groups: HostGroups
    function_nonfinite: np.ndarray
    first: np.ndarray  #: each group's first sample


def reward_segments(
    rewards: torch.Tensor, ids: torch.Tensor, function_nonfinite: torch.Tensor | None = None, rising: bool = False
) -> RewardSegments | HostSegments:
    """Every group's reward values, taken before the estimator runs (it may change rewards in place).

    ``ids`` are dense group ids in ``[0, B)`` (:func:`advmon.groups.group_ids`);
    ``function_nonfinite`` counts, per sample, the reward functions whose score is
    NaN or Inf; ``rising`` says the ids are known not to decrease (else the CPU looks).
    On the CPU they are :class:`HostSegments`.
    """
    if not sync_free(rewards):
        return _host_reward_segments(rewards, ids, function_nonfinite, rising)
    rewards = rewards.to(torch.float64)
    count = rewards.shape[0]
    order = torch.argsort(ids, stable=True)
    group_of = ids[order]
    slots = torch.arange(count + 1, device=ids.device)
    bounds = torch.searchsorted(group_of, slots)  # ids are dense: slot s holds group s
    ordered = rewards[order]
    finite = torch.isfinite(ordered)
    nan = torch.isnan(ordered)

    def per_slot(values: torch.Tensor, reduce: str, initial: float) -> torch.Tensor:
        # unsafe=True skips segment_reduce's argument checks, which read values back to the host.
        return torch.segment_reduce(values, reduce, offsets=bounds, unsafe=True, initial=initial)

    finite_count = per_slot(finite.to(torch.float64), "sum", 0.0)
    low = per_slot(ordered.masked_fill(~finite, math.inf), "min", math.inf)
    high = per_slot(ordered.masked_fill(~finite, -math.inf), "max", -math.inf)
    # Sums of reward - group minimum: a group of equal rewards has its value as its mean, exactly.
    above = per_slot((ordered - low[group_of]).masked_fill(~finite, 0.0), "sum", 0.0)
    size = bounds.diff().to(torch.float64)
    nan_count = per_slot(nan.to(torch.float64), "sum", 0.0)
    functions = torch.zeros_like(nan_count) if function_nonfinite is None else per_slot(
        function_nonfinite.to(torch.float64)[order], "sum", 0.0)
    return RewardSegments(
        order=order,
        bounds=bounds,
        slot=group_of,
        size=size,
        finite=finite_count,
        nan=nan_count,
        inf=size - finite_count - nan_count,
        min=low,
        max=high,
        mean=low + above / finite_count,
        function_nonfinite=functions,
    )


def worst_groups(
    segments: RewardSegments | HostSegments,
    peaks: GroupPeaks | None,
    ratio: torch.Tensor | np.ndarray | None,
    k: int,
    bound_factor: float,
    key_column: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The ``k`` worst groups as a ``[min(k, B), len(FIELDS)]`` float64 table, worst first.

    ``peaks`` are :func:`~advmon.group_bounds.group_peaks` of the call's post-norm
    advantages (``None`` without them), ``ratio`` each group's peak over its bound
    (:func:`~advmon.group_bounds.group_ratios`; ``None``: no bound known). Rows whose
    ``reason`` is ``NOT_CHOSEN`` are empty slots or groups with nothing to show. With
    ``key_column`` (given the chosen groups' first samples, the numbers that name them)
    the table has one more column, last.
    """
    if isinstance(segments, HostSegments):
        return _host_worst_groups(segments, peaks, ratio, k, bound_factor, key_column)
    order, bounds = segments.order, segments.bounds
    slots = segments.size.shape[0]
    if peaks is None:
        peak = torch.full((slots,), math.nan, dtype=torch.float64, device=order.device)
        bad = torch.zeros(slots, dtype=torch.float64, device=order.device)
    else:
        peak, bad = peaks
    size = segments.size
    if ratio is None:
        ratio = torch.full((slots,), math.nan, dtype=torch.float64, device=order.device)
    reward_bad = segments.nan + segments.inf
    function_bad = segments.function_nonfinite
    reason = torch.full((slots,), float(NOT_CHOSEN), dtype=torch.float64, device=order.device)
    reason = reason.masked_fill(peak >= 0, float(REASONS.index("largest_abs_advantage")))
    reason = reason.masked_fill(ratio > bound_factor, float(REASONS.index("beyond_bound")))
    reason = reason.masked_fill(bad > 0, float(REASONS.index("nonfinite_advantages")))
    reason = reason.masked_fill(function_bad > 0, float(REASONS.index("nonfinite_reward_functions")))
    reason = reason.masked_fill(reward_bad > 0, float(REASONS.index("nonfinite_rewards")))
    reason = reason.masked_fill(size == 0, float(NOT_CHOSEN))
    # Worst first: by the largest |A|, then (one whole-number key, exact in int64) by reason and most
    # non-finite values; stable sorts, the last key first.
    ranked = torch.argsort(torch.nan_to_num(peak, nan=-1.0), descending=True, stable=True)
    nonfinite = (reward_bad + function_bad + bad).to(torch.int64)
    span = nonfinite.max() + 1 if slots else 1  # a tensor on the device: no sync
    primary = reason.to(torch.int64) * span - nonfinite
    ranked = ranked[torch.argsort(primary[ranked], stable=True)][: min(k, slots)]
    first = order[bounds[:-1].clamp(max=max(order.shape[0] - 1, 0))].to(torch.float64)
    columns = {
        "reason": reason,
        "first_sample": first,
        "size": size,
        "reward_finite_count": segments.finite,
        "reward_nan_count": segments.nan,
        "reward_inf_count": segments.inf,
        "reward_function_nonfinite_count": function_bad,
        "reward_min": segments.min.masked_fill(segments.finite == 0, math.nan),
        "reward_max": segments.max.masked_fill(segments.finite == 0, math.nan),
        "reward_mean": segments.mean,
        "advantage_abs_max": peak,
        "advantage_nonfinite_samples": bad,
        "advantage_bound_ratio": ratio,
    }
    table = torch.stack([columns[name][ranked] for name in FIELDS], dim=1)
    if key_column is None:
        return table
    return torch.cat([table, key_column(first[ranked].to(torch.long)).unsqueeze(1)], dim=1)


# --------------------------------------------------------------------------- the CPU's


# On the CPU a call's few thousand samples cost torch's per-op overhead more than their
# arithmetic: the same values in NumPy, with bincount and reduceat over one slot per
# group (ids are dense, so groups 0..n-1 each have samples), take a fraction of the time.


def _host_reward_segments(
    rewards: torch.Tensor, ids: torch.Tensor, function_nonfinite: torch.Tensor | None, rising: bool = False
) -> HostSegments:
    """:func:`reward_segments` in NumPy, with one slot per group (no empty slots: shapes need not be fixed here)."""
    groups = host_group_values(rewards, ids, rising)
    used = groups.size.shape[0]
    functions = (np.zeros(used) if function_nonfinite is None
                 else np.bincount(ids.numpy(), host_float64(function_nonfinite), used))
    starts = groups.bounds[:used]
    return HostSegments(groups, functions, starts if groups.in_order else groups.order[starts])


def _host_worst_groups(
    segments: HostSegments,
    peaks: GroupPeaks | None,
    ratio: np.ndarray | None,
    k: int,
    bound_factor: float,
    key_column: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    # A call's fixed cost here is its number of NumPy calls (each a few microseconds, several more once
    # the mask's pass emptied the caches): few of them, over the groups, and the common case's only.
    groups = segments.groups
    size = groups.size
    slots = size.shape[0]
    peak = np.full(slots, np.nan) if peaks is None else peaks.peak
    bad = np.zeros(slots) if peaks is None else peaks.bad
    ratio = np.full(slots, np.nan) if ratio is None else ratio
    reward_bad = groups.nan + groups.inf
    function_bad = segments.function_nonfinite
    # Reason codes rank by priority (the smallest that applies): a group with a peak is a largest |A|,
    # beyond the bound if its ratio is (a NaN ratio is neither).
    reason = NOT_CHOSEN - (peak >= 0) - (ratio > bound_factor)
    nonfinite_total = reward_bad + function_bad + bad
    if nonfinite_total.any():  # rare: a NaN or Inf somewhere
        reason = np.minimum(reason, np.where(bad > 0, _REASON["nonfinite_advantages"], NOT_CHOSEN))
        reason = np.minimum(reason, np.where(function_bad > 0, _REASON["nonfinite_reward_functions"], NOT_CHOSEN))
        reason = np.minimum(reason, np.where(reward_bad > 0, _REASON["nonfinite_rewards"], NOT_CHOSEN))
        keys = (-np.fmax(peak, -1.0), -nonfinite_total, reason)  # fmax: NaN -> -1
    else:
        keys = (-np.fmax(peak, -1.0), reason)
    # Worst first (np.lexsort: last key first, stable): reason, most non-finite values, largest |A|.
    ranked = np.lexsort(keys)[: min(k, slots)]
    columns = {
        "reason": reason,
        "first_sample": segments.first,
        "size": size,
        "reward_finite_count": groups.finite,
        "reward_nan_count": groups.nan,
        "reward_inf_count": groups.inf,
        "reward_function_nonfinite_count": function_bad,
        "reward_min": groups.low,
        "reward_max": groups.high,
        "reward_mean": groups.mean,
        "advantage_abs_max": peak,
        "advantage_nonfinite_samples": bad,
        "advantage_bound_ratio": ratio,
    }
    # Only the k chosen rows are taken, column by column (measured faster than one stack of every group).
    table = np.empty((ranked.shape[0], len(FIELDS) + (key_column is not None)))
    for index, name in enumerate(FIELDS):
        table[:, index] = columns[name][ranked]
    if key_column is not None:
        table[:, -1] = host_float64(key_column(torch.from_numpy(segments.first[ranked])))
    unknown = groups.finite[ranked] == 0  # a group without a finite reward has no reward range
    if unknown.any():
        table[unknown, _COLUMN["reward_min"]] = np.nan
        table[unknown, _COLUMN["reward_max"]] = np.nan
    return torch.from_numpy(table)

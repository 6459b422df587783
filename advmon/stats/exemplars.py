"""The worst prompt groups of a call: which groups an on-call engineer should look at first.

Pure functions over host data, in NumPy: a call's few thousand groups cost per-call
overhead, which NumPy keeps lower than torch. On a device the call's ``[B]``-sized
vectors (rewards, group ids, the advantages' row summaries) cross in the record's
one transfer and the same functions run on the host
(:func:`advmon.observation.finish_on_host`). The ``k`` worst groups are one small
``[k, len(FIELDS)]`` float64 table.

Groups are ranked by why they were chosen, then by how bad they are:

0. **non-finite**: a NaN or Inf reward, a reward function's NaN or Inf score
   (it returned ``None``) although the summed reward is finite, or a sample
   with a non-finite valid advantage (most non-finite values first);
1. **beyond the bound**: the group's largest finite |post-norm advantage| is more
   than ``bound_factor`` times what the call's normalization allows it
   (:func:`advmon.stats.group_bounds.group_ratios`: ``G / sqrt(G - 1)`` for a group-std
   normalization of ``G`` samples, the group's reward spread for a group-mean baseline);
2. the largest finite |post-norm advantage|.

A group with none of these (no advantages known, nothing non-finite) is not an
exemplar.

Example:
    >>> import torch
    >>> from advmon.stats.group_bounds import group_peaks
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

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

from advmon.stats.devices import host_float64
from advmon.stats.group_bounds import GroupPeaks
from advmon.stats.groups import HostGroups, host_group_values

__all__ = ["FIELDS", "REASONS", "HostSegments", "reward_segments", "worst_groups"]

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


class HostSegments(NamedTuple):
    """A call's groups in NumPy, one slot per group, with their reward values: what the worst groups and the
    slices read (no tensors to make and read back: each conversion costs microseconds in a watched call)."""

    groups: HostGroups
    function_nonfinite: np.ndarray
    first: np.ndarray  #: each group's first sample


def reward_segments(
    rewards: torch.Tensor, ids: torch.Tensor, function_nonfinite: torch.Tensor | None = None, rising: bool = False
) -> HostSegments:
    """Every group's reward values (on the CPU, taken before the estimator runs: it may change rewards in place).

    ``ids`` are dense group ids in ``[0, B)`` (:func:`advmon.stats.groups.group_ids`), CPU
    tensors as the rewards; ``function_nonfinite`` counts, per sample, the reward
    functions whose score is NaN or Inf; ``rising`` says the ids are known not to
    decrease (else they are looked at). One slot per group (no empty slots: shapes
    need not be fixed on the host).
    """
    groups = host_group_values(rewards, ids, rising)
    used = groups.size.shape[0]
    functions = (np.zeros(used) if function_nonfinite is None
                 else np.bincount(ids.numpy(), host_float64(function_nonfinite), used))
    starts = groups.bounds[:used]
    return HostSegments(groups, functions, starts if groups.in_order else groups.order[starts])


def worst_groups(
    segments: HostSegments,
    peaks: GroupPeaks | None,
    ratio: np.ndarray | None,
    k: int,
    bound_factor: float,
    key_column: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The ``k`` worst groups as a ``[min(k, B), len(FIELDS)]`` float64 table, worst first.

    ``peaks`` are :func:`~advmon.stats.group_bounds.group_peaks` of the call's post-norm
    advantages (``None`` without them), ``ratio`` each group's peak over its bound
    (:func:`~advmon.stats.group_bounds.group_ratios`; ``None``: no bound known). Rows whose
    ``reason`` is ``NOT_CHOSEN`` are empty slots or groups with nothing to show. With
    ``key_column`` (given the chosen groups' first samples, the numbers that name them)
    the table has one more column, last.
    """
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

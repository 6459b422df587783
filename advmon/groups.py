"""Prompt groups: which samples were generated for the same prompt, and what that says.

A group-relative estimator (GRPO, RLOO, DAPO...) learns nothing from a group whose
rewards are all equal: its advantages are all zero (or undefined). These pure
functions find the groups and count such groups, per call and on the device.

Groups come from, in order of preference:

* ``group_size=G``: contiguous blocks of ``G`` samples (the last may be shorter);
* a 2-D tensor of prompt token ids ``[B, S]``: identical rows;
* a 1-D tensor: identical values;
* any other sequence of hashables (verl's NumPy array of uid strings): equal items.

Example:
    >>> import torch
    >>> ids = group_ids(torch.tensor([[7, 7], [7, 7], [5, 1]]), 3)
    >>> ids.tolist()
    [1, 1, 0]
    >>> counts = group_counts(torch.tensor([1.0, 1.0, 0.0]), ids, None)
    >>> dict(zip(GROUP_COUNT_FIELDS, counts.tolist()))["zero_std"]
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = [
    "GROUP_COUNT_FIELDS",
    "GroupsError",
    "derived_pre_norm",
    "group_counts",
    "group_ids",
    "merge_group_counts",
]

#: Layout of the tensor returned by :func:`group_counts`.
GROUP_COUNT_FIELDS = (
    "groups",
    "singletons",
    "with_two_finite",
    "zero_std",
    "nonfinite",
    "all_low",
    "all_high",
    "max_size",
)
#: Fields merged across calls by ``max`` instead of a sum.
_MAX_FIELDS = (GROUP_COUNT_FIELDS.index("max_size"),)


class GroupsError(ValueError):
    """Group information that cannot be used (wrong length or type)."""


def group_ids(
    groups: Any, batch_size: int, group_size: int | None = None, device: torch.device | None = None
) -> torch.Tensor | None:
    """Dense group index in ``[0, number of groups)`` for each of ``batch_size`` samples.

    Returns ``None`` when there is no group information.

    Raises:
        GroupsError: when the groups do not describe ``batch_size`` samples.
    """
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise GroupsError(f"group_size must be a positive int, got {group_size!r}")
        return torch.arange(batch_size, device=device) // group_size
    if groups is None:
        return None
    if isinstance(groups, np.ndarray) and groups.dtype.kind in "biuf":
        groups = torch.from_numpy(groups)
    if isinstance(groups, torch.Tensor):
        ids = _tensor_group_ids(groups.detach(), batch_size)
    elif isinstance(groups, (Sequence, np.ndarray)) and not isinstance(groups, (str, bytes)):
        ids = _hashable_group_ids(groups, batch_size)
    else:
        raise GroupsError(f"groups must be a tensor, an array or a sequence, got {type(groups).__name__}")
    return ids if device is None else ids.to(device)


def _tensor_group_ids(groups: torch.Tensor, batch_size: int) -> torch.Tensor:
    if groups.dim() == 0 or groups.shape[0] != batch_size or groups.dim() > 2:
        raise GroupsError(
            f"expected group ids of shape [{batch_size}] or [{batch_size}, S], got {list(groups.shape)}"
        )
    if groups.dim() == 2:
        return _row_group_ids(groups)
    ordered, order = torch.sort(groups, stable=True)
    starts = torch.ones(batch_size, dtype=torch.long, device=groups.device)
    if batch_size > 1:
        starts[1:] = ordered[1:] != ordered[:-1]
    ids = torch.empty_like(starts)
    ids[order] = torch.cumsum(starts, 0) - 1
    return ids


def _row_group_ids(rows: torch.Tensor) -> torch.Tensor:
    """Identical rows share a group, wherever they are in the batch."""
    if rows.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=rows.device)
    # Groups are usually contiguous (repeat_interleave): compare only one row per
    # run instead of sorting every row of the batch.
    starts = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
    starts[1:] = (rows[1:] != rows[:-1]).any(dim=1)
    run_of_row = torch.cumsum(starts, 0) - 1
    representatives = rows[starts]
    _, group_of_run = torch.unique(representatives, dim=0, return_inverse=True)
    return group_of_run[run_of_row]


def _hashable_group_ids(groups: Sequence[Any] | np.ndarray, batch_size: int) -> torch.Tensor:
    if len(groups) != batch_size:
        raise GroupsError(f"expected {batch_size} group ids, got {len(groups)}")
    index: dict[Any, int] = {}
    try:
        ids = [index.setdefault(_hashable(item), len(index)) for item in groups]
    except TypeError as exc:
        raise GroupsError(f"group ids must be hashable: {exc}") from None
    return torch.tensor(ids, dtype=torch.long)


def _hashable(item: Any) -> Any:
    if isinstance(item, np.ndarray):
        return item.tobytes()
    if isinstance(item, np.generic):
        return item.item()
    return item


def _per_group(rewards: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Size, finite count, finite sum, finite min and max of each group (slot = id)."""
    size = rewards.shape[0]
    finite = torch.isfinite(rewards)
    zeros = torch.zeros(size, dtype=torch.float64, device=rewards.device)
    kept = torch.where(finite, rewards, 0.0)
    return {
        "size": zeros.index_add(0, ids, torch.ones_like(kept)),
        "finite": zeros.index_add(0, ids, finite.to(torch.float64)),
        "sum": zeros.index_add(0, ids, kept),
        "min": torch.full_like(zeros, math.inf).scatter_reduce(
            0, ids, torch.where(finite, rewards, math.inf), "amin"
        ),
        "max": torch.full_like(zeros, -math.inf).scatter_reduce(
            0, ids, torch.where(finite, rewards, -math.inf), "amax"
        ),
    }


def group_counts(
    rewards: torch.Tensor | None,
    ids: torch.Tensor | None,
    reward_range: tuple[float, float] | None,
) -> torch.Tensor:
    """Counts of :data:`GROUP_COUNT_FIELDS` for one call, as a float64 tensor.

    A group is zero-std when it has at least two finite rewards and they are all
    exactly equal; ``with_two_finite`` counts the groups that could be (the
    denominator of the zero-std fraction). ``all_low``/``all_high`` count those
    of them whose finite rewards are all ``<= lo`` / ``>= hi``. ``max_size`` is
    the largest group's size (what bounds a normalized advantage). Reward-dependent
    fields are ``nan`` without rewards; everything is 0 without groups.
    """
    device = rewards.device if rewards is not None else (ids.device if ids is not None else None)
    if ids is None:
        return torch.zeros(len(GROUP_COUNT_FIELDS), dtype=torch.float64, device=device)
    if rewards is None:
        size = torch.zeros(ids.shape[0], dtype=torch.float64, device=ids.device)
        size.index_add_(0, ids, torch.ones_like(size))
        counts = torch.full((len(GROUP_COUNT_FIELDS),), math.nan, dtype=torch.float64, device=ids.device)
        counts[0] = torch.count_nonzero(size > 0)
        counts[1] = torch.count_nonzero(size == 1)
        counts[-1] = _largest(size)
        return counts
    group = _per_group(rewards.to(torch.float64), ids)
    exists = group["size"] > 0
    comparable = group["finite"] >= 2
    low, high = reward_range if reward_range is not None else (math.nan, math.nan)
    fields = [
        exists,
        group["size"] == 1,
        comparable,
        comparable & (group["min"] == group["max"]),
        exists & (group["finite"] < group["size"]),
        comparable & (group["max"] <= low),
        comparable & (group["min"] >= high),
    ]
    counts = torch.stack([*(torch.count_nonzero(f) for f in fields), _largest(group["size"])]).to(torch.float64)
    if reward_range is None:
        counts[5:7] = math.nan
    return counts


def _largest(sizes: torch.Tensor) -> torch.Tensor:
    return sizes.max().to(torch.int64) if sizes.numel() else torch.zeros((), dtype=torch.int64, device=sizes.device)


def merge_group_counts(totals: Any, counts: Any) -> Any:
    """Merge two calls' :func:`group_counts` (NumPy arrays): sums, and ``max`` for ``max_size``.

    Example:
        >>> import numpy as np
        >>> a = np.array([2, 0, 2, 1, 0, 0, 0, 8.0]); b = np.array([1, 0, 1, 0, 0, 0, 0, 4.0])
        >>> merge_group_counts(a, b).tolist()
        [3.0, 0.0, 3.0, 1.0, 0.0, 0.0, 0.0, 8.0]
    """
    merged = totals + counts
    for index in _MAX_FIELDS:
        merged[index] = max(totals[index], counts[index])
    return merged


def derived_pre_norm(rewards: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    """Each reward minus the mean of the finite rewards of its group (the batch without groups).

    This is what a group-relative estimator computes before it divides by a std;
    a non-finite reward stays non-finite.

    Example:
        >>> derived_pre_norm(torch.tensor([1.0, 3.0, 10.0]), torch.tensor([0, 0, 1])).tolist()
        [-1.0, 1.0, 0.0]
    """
    rewards = rewards.to(torch.float64)
    if ids is None:
        ids = torch.zeros(rewards.shape[0], dtype=torch.long, device=rewards.device)
    group = _per_group(rewards, ids)
    mean = group["sum"] / group["finite"]
    return rewards - mean[ids]

"""Prompt groups: which samples were generated for the same prompt, and what that says.

A group-relative estimator (GRPO, RLOO, DAPO...) learns nothing from a group whose
rewards are all equal: its advantages are all zero (or undefined). These pure
functions find the groups and count such groups, per call and on the device.

On the CPU they may read values (``torch.unique`` where identical prompt rows are
apart), and the groups' values are NumPy (:func:`host_group_values`: a call's few
thousand samples cost per-call overhead, which NumPy keeps lower than torch). Off it
(:func:`advmon.devices.sync_free`) nothing is read back to the host: prompt rows
are grouped by sorting a row hash, per-group values come from (group, reward)
sorted segments, and on CUDA with Triton one tiled kernel does the groups' work
(:mod:`advmon.triton_groups`). Group ids are dense on every path; their numbering
may differ (the CPU numbers contiguous prompt rows as they appear, so they rise
along the batch and the drill-down needs no sort).

Groups come from, in order of preference:

* ``group_size=G``: contiguous blocks of ``G`` samples (the last may be shorter);
* a 2-D tensor of prompt token ids ``[B, S]``: identical rows;
* a 1-D tensor: identical values;
* any other sequence of hashables (verl's NumPy array of uid strings): equal items.

Example:
    >>> import torch
    >>> ids = group_ids(torch.tensor([[7, 7], [7, 7], [5, 1]]), 3)
    >>> ids.tolist()  # on the CPU, runs of rows that all differ are numbered as they appear
    [0, 0, 1]
    >>> counts = group_counts(torch.tensor([1.0, 1.0, 0.0]), ids, None)
    >>> dict(zip(GROUP_COUNT_FIELDS, counts.tolist()))["zero_std"]
    1.0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from advmon.devices import attempt_triton, host_float64, path_for, sync_free, to_device

__all__ = [
    "GROUP_COUNT_FIELDS",
    "Grouping",
    "GroupsError",
    "HostGroups",
    "PerGroup",
    "RowKeys",
    "derived_pre_norm",
    "group_counts",
    "group_ids",
    "group_ids_and_row_keys",
    "group_statistics",
    "host_group_values",
    "merge_group_counts",
    "row_keys",
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
    return group_ids_and_row_keys(groups, batch_size, group_size, device).ids


class Grouping(NamedTuple):
    """:func:`group_ids`, with what finding them showed on the way."""

    ids: torch.Tensor | None
    row_keys: RowKeys | None = None  #: prompt rows' hashes, to name their groups (:class:`RowKeys`)
    rising: bool = False  #: the ids are known not to decrease along the batch (else: not known)


def group_ids_and_row_keys(
    groups: Any, batch_size: int, group_size: int | None = None, device: torch.device | None = None
) -> Grouping:
    """:func:`group_ids`, and for prompt rows the :class:`RowKeys` their grouping hashed on the way."""
    if group_size is not None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise GroupsError(f"group_size must be a positive int, got {group_size!r}")
        return Grouping(torch.arange(batch_size, device=device) // group_size, rising=True)
    if groups is None:
        return Grouping(None)
    if isinstance(groups, np.ndarray) and groups.dtype.kind in "biuf":
        groups = torch.from_numpy(groups)
    if isinstance(groups, torch.Tensor):
        found = _tensor_group_ids(groups.detach(), batch_size)
    elif isinstance(groups, (Sequence, np.ndarray)) and not isinstance(groups, (str, bytes)):
        found = Grouping(_hashable_group_ids(groups, batch_size))
    else:
        raise GroupsError(f"groups must be a tensor, an array or a sequence, got {type(groups).__name__}")
    return found if device is None else found._replace(ids=to_device(found.ids, device))


class RowKeys(NamedTuple):
    """The row hashes a batch's grouping took: :func:`row_keys` of any of its rows, without hashing again.

    ``run_of_row`` maps each row to its entry of ``hashes`` (``None``: one entry per row).

    Example:
        >>> rows = torch.tensor([[5, 6], [5, 6], [7, 8]])
        >>> keys = group_ids_and_row_keys(rows, 3).row_keys
        >>> torch.equal(keys.of(torch.tensor([2, 0])), row_keys(rows[[2, 0]]))
        True
    """

    hashes: torch.Tensor
    run_of_row: torch.Tensor | None = None

    def of(self, rows: torch.Tensor) -> torch.Tensor:
        """The keys of the batch's rows ``rows`` (indices on the hashes' device), as :func:`row_keys` makes them."""
        if not sync_free(self.hashes):
            return _host_keys_of(self, rows)
        hashes = self.hashes[rows if self.run_of_row is None else self.run_of_row[rows]]
        return (hashes & _KEY_BITS).to(torch.float64)


def _host_keys_of(keys: RowKeys, rows: torch.Tensor) -> torch.Tensor:
    """:meth:`RowKeys.of` in NumPy: a few values, fewer microseconds than torch's ops."""
    index = rows.numpy()
    hashes = keys.hashes.numpy()[index if keys.run_of_row is None else keys.run_of_row.numpy()[index]]
    return torch.from_numpy((hashes & _KEY_BITS).astype(np.float64))


def _tensor_group_ids(groups: torch.Tensor, batch_size: int) -> Grouping:
    if groups.dim() == 0 or groups.shape[0] != batch_size or groups.dim() > 2:
        raise GroupsError(
            f"expected group ids of shape [{batch_size}] or [{batch_size}, S], got {list(groups.shape)}"
        )
    if groups.dim() == 2:
        return _hashed_row_group_ids(groups) if sync_free(groups) else _row_group_ids(groups)
    if batch_size == 0:
        return Grouping(torch.zeros(0, dtype=torch.long, device=groups.device), rising=True)
    ordered, order = torch.sort(groups, stable=True)
    return Grouping(_in_original_order(order, _run_numbers(ordered[1:] != ordered[:-1])))


def _run_numbers(changes: torch.Tensor) -> torch.Tensor:
    """Which run each of ``n`` sorted items is in (0, 1, ...); ``changes[i]``: item ``i + 1`` differs from item ``i``.

    Example:
        >>> _run_numbers(torch.tensor([False, True, True])).tolist()
        [0, 0, 1, 2]
    """
    starts = torch.ones(changes.shape[0] + 1, dtype=torch.long, device=changes.device)
    starts[1:] = changes
    return torch.cumsum(starts, 0) - 1


def _in_original_order(order: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``values`` of the items ``order`` sorted, put back where each item came from (no host read)."""
    return torch.empty_like(values).index_copy_(0, order, values)


def _row_group_ids(rows: torch.Tensor) -> Grouping:
    """Identical rows share a group, wherever they are in the batch (and the runs' hashes, to name them)."""
    if rows.shape[0] == 0:
        return Grouping(torch.zeros(0, dtype=torch.long, device=rows.device), rising=True)
    # Groups are usually contiguous (repeat_interleave): compare only one row per
    # run instead of sorting every row of the batch.
    starts = torch.ones(rows.shape[0], dtype=torch.bool, device=rows.device)
    starts[1:] = (rows[1:] != rows[:-1]).any(dim=1)
    run_of_row = torch.cumsum(starts, 0) - 1
    representatives = rows[starts]
    hashes = _row_hashes(representatives)
    keys = RowKeys(hashes, run_of_row)
    if torch.unique(hashes).shape[0] == representatives.shape[0]:
        # Every run is a different group (different hashes: different rows): the runs are the groups,
        # numbered in order of appearance, so ids rise along the batch and need no sort downstream.
        return Grouping(run_of_row, keys, rising=True)
    _, group_of_run = torch.unique(representatives, dim=0, return_inverse=True)
    return Grouping(group_of_run[run_of_row], keys)


def _hashed_row_group_ids(rows: torch.Tensor) -> Grouping:
    """Identical rows share a group, found without ``torch.unique`` (which reads sizes back to the host).

    Rows are sorted by a 64-bit hash, so identical rows are neighbours; a group
    starts wherever a row differs from the one before it (compared in full: two
    different rows are never merged), and ``cumsum`` numbers the groups. Only a
    hash collision between different rows, at odds of about ``B**2 / 2**64``,
    could split a group.
    """
    if rows.shape[0] == 0:
        return Grouping(torch.zeros(0, dtype=torch.long, device=rows.device), rising=True)
    hashes = _row_hashes(rows)
    order = torch.argsort(hashes, stable=True)
    ordered = rows[order]
    ids = _in_original_order(order, _run_numbers((ordered[1:] != ordered[:-1]).any(dim=1)))
    return Grouping(ids, RowKeys(hashes))


#: A row key is its hash's low 48 bits: exact in float64, which the record's transfer carries.
_KEY_BITS = 0xFFFFFFFFFFFF
#: Multipliers of the row hash (odd 64-bit constants, as signed int64).
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15
_MIX = -4658895280553007687  # 0xBF58476D1CE4E5B9
_COLUMN_WEIGHTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _row_hashes(rows: torch.Tensor) -> torch.Tensor:
    """A 64-bit hash of every row: each entry times an odd weight of its column, mixed, then summed.

    Arithmetic wraps modulo ``2**64``; the xor-shift between the two multiplies
    makes the hash non-linear, so rows that differ by a permutation or by
    structured differences do not cancel.
    """
    if rows.is_floating_point():
        values = (rows.to(torch.float64) + 0.0).view(torch.int64)  # + 0.0: -0.0 and 0.0 are equal ids
    else:
        values = rows.to(torch.int64)
    mixed = values * _column_weights(rows.shape[1], rows.device)
    mixed ^= (mixed >> 31) & 0x1FFFFFFFF  # a logical shift: torch shifts int64 arithmetically
    mixed *= _MIX
    return mixed.sum(dim=1)


def _column_weights(columns: int, device: torch.device) -> torch.Tensor:
    """Odd pseudo-random int64 weights, one per column, made on the device once per shape."""
    key = (columns, device)
    if key not in _COLUMN_WEIGHTS:
        weights = torch.arange(1, columns + 1, dtype=torch.int64, device=device) * _GOLDEN
        _COLUMN_WEIGHTS[key] = (weights ^ (weights >> 29)) * _MIX | 1
    return _COLUMN_WEIGHTS[key]


def row_keys(rows: torch.Tensor) -> torch.Tensor:
    """A 48-bit key of each row of prompt token ids, as float64 (exact): its row hash's low bits.

    Equal rows have equal keys on every device and path, so a group's key is stable
    across steps and runs (for the same tokenizer).

    Example:
        >>> keys = row_keys(torch.tensor([[5, 6, 7], [5, 6, 7], [5, 7, 6]]))
        >>> keys[0] == keys[1], keys[0] == keys[2], bool(keys.max() < 2 ** 48)
        (tensor(True), tensor(False), True)
    """
    if not sync_free(rows) and rows.dtype != torch.bfloat16:
        return _host_row_keys(rows)
    return (_row_hashes(rows) & _KEY_BITS).to(torch.float64)


def _host_row_keys(chosen: torch.Tensor) -> torch.Tensor:
    """:func:`row_keys` of a few chosen rows in NumPy (the same wrapping int64 arithmetic, fewer microseconds)."""
    rows = chosen.numpy()
    if rows.dtype.kind == "f":
        values = (rows.astype(np.float64) + 0.0).view(np.int64)
    else:
        values = rows.astype(np.int64)
    weights = _column_weights(rows.shape[1], torch.device("cpu")).numpy()
    with np.errstate(over="ignore"):
        mixed = values * weights
        mixed ^= (mixed >> 31) & 0x1FFFFFFFF
        mixed *= np.int64(_MIX)
        hashes = mixed.sum(axis=1, dtype=np.int64)
    return torch.from_numpy((hashes & _KEY_BITS).astype(np.float64))


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


class PerGroup(NamedTuple):
    """Each group's size and finite rewards' count, mean, min and max (one slot per group, unused slots empty)."""

    size: torch.Tensor
    finite: torch.Tensor
    mean: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor
    slot: torch.Tensor  #: each sample's group slot


class HostGroups(NamedTuple):
    """A call's groups in NumPy (:func:`host_group_values`): one slot per group, in id order."""

    order: np.ndarray  #: samples sorted by group (stable), the identity when ``in_order``
    bounds: np.ndarray  #: group ``s`` is ``order[bounds[s]:bounds[s + 1]]``
    in_order: bool
    size: np.ndarray
    finite: np.ndarray
    nan: np.ndarray
    inf: np.ndarray
    low: np.ndarray  #: the smallest finite reward (``inf`` without one)
    high: np.ndarray  #: the largest finite reward (``-inf`` without one)
    mean: np.ndarray  #: of the finite rewards, as ``low`` + the mean of ``reward - low`` (``nan`` without one)


def host_group_values(rewards: torch.Tensor, ids: torch.Tensor, rising: bool = False) -> HostGroups:
    """Every group's reward values on the CPU, in NumPy; ``ids`` dense, ``rising`` if known not to fall.

    The mean sums ``reward - group minimum`` as the device path does: a group of equal
    rewards has its value as its mean exactly (its derived pre_norm is exactly 0). Counted
    in NumPy calls (each costs several microseconds once a mask's pass emptied the caches):
    the common case (rising ids, finite rewards) takes about fifteen.

    Example:
        >>> rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, float("nan")], dtype=torch.float64)
        >>> groups = host_group_values(rewards, torch.tensor([0, 0, 0, 1, 1]))
        >>> groups.mean.tolist(), groups.size.tolist(), groups.nan.tolist()
        ([0.1, 1.0], [3.0, 2.0], [0.0, 1.0])
    """
    r = host_float64(rewards)
    g = ids.numpy()
    count = r.shape[0]
    # Groups of consecutive samples (group_size blocks, verl's repeated uids, prompt rows numbered
    # by appearance) are sorted already: then sample order is group order, with no copy.
    in_order = rising or count == 0 or bool((g[1:] >= g[:-1]).all())
    used = (int(g[-1]) if in_order else int(g.max())) + 1 if count else 0  # dense ids: the largest is the last
    order = np.arange(count) if in_order else np.argsort(g, kind="stable")
    bounds = np.searchsorted(g if in_order else g[order], np.arange(used + 1))
    starts = bounds[:used]
    size = np.subtract(bounds[1:], bounds[:-1], dtype=np.float64)
    # A NaN or Inf makes the sum non-finite (so does an overflow of finite rewards: the general branch is exact too).
    all_finite = math.isfinite(r.sum())

    def summed(weights: np.ndarray) -> np.ndarray:
        return np.bincount(g, weights, used)

    if all_finite:
        finite_count = size
        nan_count, inf_count = np.zeros(used), np.zeros(used)
        low_values = high_values = r if in_order else r[order]
    else:
        finite = np.isfinite(r)
        finite_count = summed(finite.astype(np.float64))
        nan_count = summed(np.isnan(r).astype(np.float64))
        inf_count = size - finite_count - nan_count
        ordered, ordered_finite = (r, finite) if in_order else (r[order], finite[order])
        low_values = np.where(ordered_finite, ordered, np.inf)
        high_values = np.where(ordered_finite, ordered, -np.inf)
    if used:
        low = np.minimum.reduceat(low_values, starts)
        high = np.maximum.reduceat(high_values, starts)
    else:
        low = high = np.zeros(0)
    # Sums of reward - group minimum, in sample order as the device path sums them.
    if all_finite:  # every group has a finite reward: no 0 / 0
        mean = summed(r - low[g]) / finite_count + low
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = low + summed(np.where(finite, r - low[g], 0.0)) / finite_count
    return HostGroups(order, bounds, in_order, size, finite_count, nan_count, inf_count, low, high, mean)


def _sorted_per_group(rewards: torch.Tensor, ids: torch.Tensor) -> PerGroup:
    """Per-group values of float64 rewards off the CPU: no atomics, no host reads, deterministic on every device.

    Samples are sorted by group, then by reward (non-finite rewards last), so each
    group is a segment whose first and last finite entries are its minimum and
    maximum; ``searchsorted`` finds the segments' bounds, and ``segment_reduce``
    sums each segment on its own (a running ``cumsum`` would carry other groups'
    magnitudes into its differences, and is not deterministic on CUDA for floats).
    What is summed is ``reward - group minimum``: a zero-std group sums exact zeros,
    so its mean is its value exactly. Slot ``s`` holds the ``s``-th group.
    """
    count = rewards.shape[0]
    key = torch.where(rewards.abs() < math.inf, rewards, math.inf)  # NaN and -inf sort with inf, last
    by_reward = torch.argsort(key, stable=True)
    order = by_reward[torch.argsort(ids[by_reward], stable=True)]
    group_of = ids[order]
    ordered = key[order]
    segment = _run_numbers(group_of[1:] != group_of[:-1])
    # Slot s is ordered[bounds[s]:bounds[s + 1]] (empty past the last group).
    bounds = torch.searchsorted(segment, torch.arange(count + 1, device=rewards.device))
    first, after = bounds[:-1], bounds[1:]
    usable = ordered < math.inf
    running = torch.cat([bounds.new_zeros(1), torch.cumsum(usable, 0)])  # integers: exact and deterministic
    finite = running[after] - running[first]
    low = ordered[first.clamp(max=count - 1)]  # inf where a group has no finite reward
    high = ordered[(first + finite - 1).clamp(min=0, max=count - 1)]  # meaningful where finite >= 1
    above = torch.where(usable, ordered - low[segment], 0.0)
    # unsafe=True skips segment_reduce's argument checks, which read values back to the host.
    total_above = torch.segment_reduce(above, "sum", offsets=bounds, unsafe=True, initial=0.0)
    return PerGroup(
        size=after - first,
        finite=finite,
        mean=low + total_above / finite,
        min=low,
        max=torch.where(finite > 0, high, -math.inf),
        slot=_in_original_order(order, segment),
    )


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
        size = _group_sizes(ids)
        counts = torch.full((len(GROUP_COUNT_FIELDS),), math.nan, dtype=torch.float64, device=ids.device)
        counts[0] = torch.count_nonzero(size > 0)
        counts[1] = torch.count_nonzero(size == 1)
        counts[-1] = _largest(size)
        return counts
    return group_statistics(rewards, ids, reward_range)[0]


def group_statistics(
    rewards: torch.Tensor,
    ids: torch.Tensor | None,
    reward_range: tuple[float, float] | None,
    per_group: HostGroups | None = None,
    rising: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`group_counts` and :func:`derived_pre_norm` of one call, from one pass over its groups.

    On the CPU ``per_group`` are the groups' values when the caller has them already
    (the drill-down's, :func:`host_group_values` of the same ids); ``rising`` says the
    ids are known not to fall.

    Example:
        >>> counts, pre_norm = group_statistics(torch.tensor([1.0, 3.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1]), None)
        >>> dict(zip(GROUP_COUNT_FIELDS, counts.tolist()))["zero_std"], pre_norm.tolist()
        (1.0, [-1.0, 1.0, 0.0, 0.0])
    """
    rewards = rewards.to(torch.float64)
    if ids is None:
        return group_counts(rewards, None, reward_range), derived_pre_norm(rewards, None)
    if not sync_free(rewards):
        host = per_group if per_group is not None else host_group_values(rewards, ids, rising)
        return _host_counts(host, reward_range), _host_minus_group_means(rewards, host, ids)
    if path_for(rewards.device) == "triton":
        found = attempt_triton(lambda: _triton_group_statistics(rewards, ids, reward_range), rewards.device)
        if found is not None:
            return found
    group = _sorted_per_group(rewards, ids)
    return _counts(group, reward_range), _minus_group_means(rewards, group)


def _triton_group_statistics(rewards, ids, reward_range):
    from advmon.triton_groups import triton_group_statistics  # imports triton: only where it is used

    return triton_group_statistics(rewards, ids, reward_range)


def _counts(group: PerGroup, reward_range: tuple[float, float] | None) -> torch.Tensor:
    exists = group.size > 0
    comparable = group.finite >= 2
    low, high = reward_range if reward_range is not None else (math.nan, math.nan)
    fields = [
        exists,
        group.size == 1,
        comparable,
        comparable & (group.min == group.max),
        exists & (group.finite < group.size),
        comparable & (group.max <= low),
        comparable & (group.min >= high),
    ]
    counts = torch.cat([torch.stack(fields).sum(dim=1), _largest(group.size)[None]]).to(torch.float64)
    if reward_range is None:
        counts[5:7] = math.nan
    return counts


def _group_sizes(ids: torch.Tensor) -> torch.Tensor:
    """Samples per group slot of dense ids (sorted and counted by ``searchsorted`` off the CPU: no atomics)."""
    slots = torch.arange(ids.shape[0], device=ids.device)
    if not sync_free(ids):
        return torch.zeros_like(slots).index_add_(0, ids, torch.ones_like(slots))
    ordered = torch.sort(ids).values
    return torch.searchsorted(ordered, slots, right=True) - torch.searchsorted(ordered, slots)


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
    if ids is None:
        ids = torch.zeros(rewards.shape[0], dtype=torch.long, device=rewards.device)
    return group_statistics(rewards, ids, None)[1]


def _minus_group_means(rewards: torch.Tensor, group: PerGroup) -> torch.Tensor:
    return rewards - group.mean[group.slot]


def _host_counts(group: HostGroups, reward_range: tuple[float, float] | None) -> torch.Tensor:
    """:func:`_counts` of the CPU's groups, in NumPy (every slot is a group there)."""
    size, finite = group.size, group.finite
    comparable = finite >= 2
    counts = [
        float(size.shape[0]),
        np.count_nonzero(size == 1),
        np.count_nonzero(comparable),
        np.count_nonzero(comparable & (group.low == group.high)),
        0 if finite is size else np.count_nonzero(finite < size),  # the same array: every reward is finite
        math.nan,
        math.nan,
        np.maximum.reduce(size) if size.shape[0] else 0,
    ]
    if reward_range is not None:
        low, high = reward_range
        counts[5] = np.count_nonzero(comparable & (group.high <= low))
        counts[6] = np.count_nonzero(comparable & (group.low >= high))
    return torch.tensor(counts, dtype=torch.float64)


def _host_minus_group_means(rewards: torch.Tensor, group: HostGroups, ids: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(host_float64(rewards) - group.mean[ids.numpy()])

"""Prompt groups: which samples were generated for the same prompt, and what that says.

A group-relative estimator (GRPO, RLOO, DAPO...) learns nothing from a group whose
rewards are all equal: its advantages are all zero (or undefined). These pure
functions find the groups and count such groups, per call.

These are host functions. On the CPU they read values (``torch.unique`` where identical
prompt rows are apart), and the groups' values are NumPy (:func:`host_group_values`: a
call's few thousand samples cost per-call overhead, which NumPy keeps lower than torch).
A device (:func:`advmon.stats.devices.sync_free`) only reduces what is ``[B, S]``: prompt rows
become a 64-bit row hash each (:func:`device_group_vector`), which crosses to the host in
the record's one transfer and is numbered there (:func:`host_grouping`), as the CPU
numbers its rows. Group ids are dense; the CPU and the hashes number contiguous prompt
rows as they appear, so they rise along the batch and the drill-down needs no sort.

Groups come from, in order of preference:

* ``group_size=G``: contiguous blocks of ``G`` samples (the last may be shorter; a watched call or
  ``observe`` asks for blocks only where no groups were given and ``G`` divides the batch,
  ``advmon.observation``);
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

from advmon.record import GROUP_COUNT_FIELDS
from advmon.stats.devices import attempt_triton, host_float64, path_for, sync_free, to_device

__all__ = [
    "GROUP_COUNT_FIELDS",
    "Grouping",
    "GroupsError",
    "HostGroups",
    "RowKeys",
    "check_group_tensor",
    "derived_pre_norm",
    "device_group_vector",
    "group_counts",
    "group_ids",
    "group_ids_and_row_keys",
    "group_statistics",
    "host_group_values",
    "host_grouping",
    "merge_group_counts",
    "row_keys",
]

#: Layout of the tensor returned by :func:`group_counts`: :data:`advmon.record.GROUP_COUNT_FIELDS`.
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
        """The keys of the batch's rows ``rows`` (CPU indices), as :func:`row_keys` makes them."""
        return _host_keys_of(self, rows)


def _host_keys_of(keys: RowKeys, rows: torch.Tensor) -> torch.Tensor:
    """:meth:`RowKeys.of` in NumPy: a few values, fewer microseconds than torch's ops."""
    index = rows.numpy()
    hashes = keys.hashes.numpy()[index if keys.run_of_row is None else keys.run_of_row.numpy()[index]]
    return torch.from_numpy((hashes & _KEY_BITS).astype(np.float64))


def check_group_tensor(groups: torch.Tensor, batch_size: int) -> None:
    """Raise :class:`GroupsError` unless ``groups`` is ``[batch_size]`` ids or ``[batch_size, S]`` prompt rows."""
    if groups.dim() == 0 or groups.shape[0] != batch_size or groups.dim() > 2:
        raise GroupsError(
            f"expected group ids of shape [{batch_size}] or [{batch_size}, S], got {list(groups.shape)}"
        )


def _tensor_group_ids(groups: torch.Tensor, batch_size: int) -> Grouping:
    check_group_tensor(groups, batch_size)
    if sync_free(groups):  # a device's tensor: reduced there to [B], read back once, numbered here
        return host_grouping(device_group_vector(groups).cpu().numpy(), rows=groups.dim() == 2,
                             integer=not groups.is_floating_point())
    if groups.dim() == 2:
        return _row_group_ids(groups)
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


def device_group_vector(groups: torch.Tensor) -> torch.Tensor:
    """A device's group tensor reduced to what the host numbers its groups from: ``[B]`` float64, a copy.

    Prompt rows ``[B, S]`` become their 64-bit row hashes and integer ids are widened to
    int64, both carried as their bits viewed as float64 (exact through the record's
    float64 transfer: :func:`host_grouping` views them back); float ids become float64
    values. A copy in every case: the estimator may change its inputs in place.

    Example:
        >>> rows = torch.tensor([[5, 6], [5, 6], [7, 8]])
        >>> hashes = device_group_vector(rows).numpy().view(np.int64)
        >>> bool(hashes[0] == hashes[1] != hashes[2])
        True
    """
    if groups.dim() == 2:
        hashes = None
        if path_for(groups.device) == "triton":
            hashes = attempt_triton(lambda: _triton_row_hashes(groups), groups.device)
        return (_row_hashes(groups) if hashes is None else hashes).view(torch.float64)
    if groups.is_floating_point():
        return groups.to(torch.float64, copy=True)
    return groups.to(torch.int64, copy=True).view(torch.float64)


def host_grouping(vector: np.ndarray, rows: bool, integer: bool) -> Grouping:
    """Dense group ids, on the host, from a :func:`device_group_vector` (``rows``: of prompt rows; ``integer``:
    of integer ids).

    Ids are numbered as the CPU numbers the same groups: a 1-D tensor's by value (sorted),
    prompt rows' runs of equal hashes in order of appearance when every run is another
    prompt (else by hash). Rows are one group when their hashes are: a collision between
    different rows, at odds of about ``B**2 / 2**64``, would merge their groups.

    Example:
        >>> rows = torch.tensor([[5, 6], [5, 6], [7, 8], [7, 8]])
        >>> found = host_grouping(device_group_vector(rows).numpy(), rows=True, integer=True)
        >>> found.ids.tolist(), found.rising
        ([0, 0, 1, 1], True)
    """
    if rows:
        return _hash_group_ids(vector.view(np.int64))
    values = torch.from_numpy(vector.view(np.int64) if integer else vector)
    if values.shape[0] == 0:
        return Grouping(torch.zeros(0, dtype=torch.long), rising=True)
    ordered, order = torch.sort(values, stable=True)
    return Grouping(_in_original_order(order, _run_numbers(ordered[1:] != ordered[:-1])))


def _hash_group_ids(hashes: np.ndarray) -> Grouping:
    """:func:`_row_group_ids` from the rows' hashes, in NumPy: runs of equal hashes, numbered as they appear
    when every run is another prompt."""
    count = hashes.shape[0]
    if count == 0:
        return Grouping(torch.zeros(0, dtype=torch.long), RowKeys(torch.from_numpy(hashes)), rising=True)
    starts = np.ones(count, dtype=bool)
    np.not_equal(hashes[1:], hashes[:-1], out=starts[1:])
    run_of_row = np.cumsum(starts, dtype=np.int64) - 1
    representatives = hashes[starts]
    keys = RowKeys(torch.from_numpy(representatives), torch.from_numpy(run_of_row))
    distinct, group_of_run = np.unique(representatives, return_inverse=True)
    if distinct.shape[0] == representatives.shape[0]:
        return Grouping(torch.from_numpy(run_of_row), keys, rising=True)
    return Grouping(torch.from_numpy(group_of_run.reshape(-1)[run_of_row]), keys)


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


def _triton_row_hashes(rows: torch.Tensor) -> torch.Tensor:
    """:func:`_row_hashes` in one kernel (:mod:`advmon.stats.triton_rows`), bit for bit."""
    from advmon.stats.triton_rows import triton_row_hashes  # imports triton: only where it is used

    return triton_row_hashes(rows.detach(), _column_weights(rows.shape[1], rows.device), _MIX)


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
    """Every group's reward values on the host, in NumPy; ``ids`` dense, ``rising`` if known not to fall.

    The mean sums ``reward - group minimum``: a group of equal
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
    # Sums of reward - group minimum, in sample order.
    if all_finite:  # every group has a finite reward: no 0 / 0
        mean = summed(r - low[g]) / finite_count + low
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = low + summed(np.where(finite, r - low[g], 0.0)) / finite_count
    return HostGroups(order, bounds, in_order, size, finite_count, nan_count, inf_count, low, high, mean)


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

    Host data (CPU tensors): ``per_group`` are the groups' values when the caller has them
    already (the drill-down's, :func:`host_group_values` of the same ids); ``rising`` says
    the ids are known not to fall.

    Example:
        >>> counts, pre_norm = group_statistics(torch.tensor([1.0, 3.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1]), None)
        >>> dict(zip(GROUP_COUNT_FIELDS, counts.tolist()))["zero_std"], pre_norm.tolist()
        (1.0, [-1.0, 1.0, 0.0, 0.0])
    """
    rewards = rewards.to(torch.float64)
    if ids is None:
        return group_counts(rewards, None, reward_range), derived_pre_norm(rewards, None)
    host = per_group if per_group is not None else host_group_values(rewards, ids, rising)
    return _host_counts(host, reward_range), _host_minus_group_means(rewards, host, ids)


def _group_sizes(ids: torch.Tensor) -> torch.Tensor:
    """Samples per group slot of dense ids."""
    slots = torch.arange(ids.shape[0], device=ids.device)
    return torch.zeros_like(slots).index_add_(0, ids, torch.ones_like(slots))


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


def _host_counts(group: HostGroups, reward_range: tuple[float, float] | None) -> torch.Tensor:
    """:func:`group_counts` of host groups, in NumPy (every slot is a group there)."""
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
    return torch.from_numpy(np.array(counts, dtype=np.float64))  # no torch op: a host value, not a device's


def _host_minus_group_means(rewards: torch.Tensor, group: HostGroups, ids: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(host_float64(rewards) - group.mean[ids.numpy()])

"""From one estimator call (its inputs and what it returned) to device parts.

Pure functions over tensors: nothing here warns, counts or emits. What cannot be
used is reported as a :class:`Problem` and the rest is still observed, so a
monitor can record what it can and say what it could not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from advmon.devices import host_float64, sync_free, to_device, where_float64_works
from advmon.exemplars import HostSegments, RewardSegments, reward_segments, worst_groups
from advmon.group_bounds import call_bounds, group_peaks
from advmon.groups import (
    Grouping,
    GroupsError,
    HostGroups,
    RowKeys,
    group_counts,
    group_ids_and_row_keys,
    group_statistics,
    row_keys,
)
from advmon.prefix_sketch import RowExtremes
from advmon.row_summaries import RowSummary, row_summaries
from advmon.slices import SliceIndex, slice_name, slice_table
from advmon.stats import EXACT_LIMIT, Part, dense_part, row_valid_counts, value_part

__all__ = [
    "CallParts",
    "Problem",
    "advantages_of",
    "estimator_metrics_of",
    "InputObservation",
    "observe_call",
    "observe_inputs",
    "observe_output",
    "tensor_part",
]


@dataclass(frozen=True)
class Problem:
    """Something advmon could not use; ``kind`` groups problems for warnings."""

    kind: str
    message: str


class ObservationError(Exception):
    """Raised inside this module and turned into a :class:`Problem`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.problem = Problem(kind, message)


@dataclass
class CallParts:
    """Everything one call contributes to a record, still on the device."""

    estimator: str
    stages: dict[str, list[Part]] = field(default_factory=dict)
    pre_norm_source: str | None = None
    groups: torch.Tensor | None = None
    #: The normalization the estimator declared (:data:`advmon.normalization.KINDS`), ``None`` to infer it.
    normalization: str | None = None
    #: What the groups' peaks show of it (:func:`advmon.group_bounds.call_bounds`), with groups and rewards.
    bound_evidence: torch.Tensor | np.ndarray | None = None
    estimator_metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)
    #: The worst groups (:func:`advmon.exemplars.worst_groups`, plus a ``key`` column), and how to name them.
    exemplars: torch.Tensor | None = None
    exemplar_keys: GroupKeys | None = None
    #: Per-slice sums (:func:`advmon.slices.slice_table`), the slices' names by slot, and each sample's slice.
    slices: torch.Tensor | None = None
    slice_names: list[str | None] | None = None
    sample_slices: np.ndarray | None = None


@dataclass(frozen=True)
class GroupKeys:
    """How an exemplar's group is named on the host, from the table's ``first_sample`` and ``key`` columns.

    ``kind`` is ``items`` (the user's own keys, verl's uids: ``source`` holds them),
    ``rows`` (a 48-bit hash of the prompt's token ids), ``ids`` (the group id
    tensor's value) or ``blocks`` (``group_size`` samples in a row: ``source``
    is ``(group_size, batch)``).

    Example:
        >>> GroupKeys("blocks", (8, 20)).name(16, float("nan")), GroupKeys("rows").name(0, 255.0)
        ('samples 16-19', 'prompt-0000000000ff')
    """

    kind: str
    source: Any = None

    def name(self, first_sample: int, key: float) -> str:
        if self.kind == "items":
            return str(_item(self.source[first_sample]))
        if self.kind == "rows":
            return f"prompt-{int(key):012x}"
        if self.kind == "ids":
            return str(int(key)) if float(key).is_integer() else repr(float(key))
        size, batch = self.source
        return f"samples {first_sample}-{min(first_sample + size, batch) - 1}"


def _item(item: Any) -> Any:
    if isinstance(item, bytes):
        return item.decode(errors="replace")
    return item.item() if isinstance(item, np.generic) else item


def as_tensor(value: Any, name: str) -> torch.Tensor | None:
    """A detached tensor view of ``value`` (tensor, NumPy array or list of numbers)."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return where_float64_works(value.detach())
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return _from_numpy(value)
    if isinstance(value, (list, tuple)):
        # Through NumPy: Python floats stay float64 (torch.as_tensor would make them float32).
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            array = None
        if array is not None and array.dtype.kind in "biuf":
            return _from_numpy(array)
    dtype = getattr(value, "dtype", None)
    raise ObservationError(
        f"{name}_type", f"expected {name} as a tensor or numeric array, got {type(value).__name__}"
        + (f" of {dtype}" if dtype is not None else "")
    )


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor with the array's values, for any real NumPy array.

    torch refuses negative strides (``a[::-1]``), byte-swapped and ``longdouble``
    arrays and warns on read-only ones; those are copied first (long double to
    float64, the widest torch has).
    """
    if array.dtype.kind == "f" and array.dtype.itemsize > 8:
        array = array.astype(np.float64)
    if not array.flags.writeable or not array.dtype.isnative or any(stride < 0 for stride in array.strides):
        array = np.array(array, dtype=array.dtype.newbyteorder("=") if not array.dtype.isnative else array.dtype)
    return torch.from_numpy(array)


def advantages_of(result: Any) -> Any:
    """The advantages in what an estimator returned.

    A tensor (or array) itself, the first element of a tuple or list, the
    ``advantages`` attribute (NeMo-RL's ``AdvantageResult``), or the
    ``"advantages"`` key of a mapping.
    """
    if isinstance(result, (torch.Tensor, np.ndarray)):
        return result
    if isinstance(result, (tuple, list)) and result:
        return result[0]
    if isinstance(result, Mapping):
        if "advantages" in result:
            return result["advantages"]
    elif hasattr(result, "advantages"):
        return result.advantages
    raise ObservationError(
        "output",
        "the estimator returned "
        f"{type(result).__name__}; expected a tensor, a tuple starting with one, an object "
        "with .advantages or a mapping with 'advantages'",
    )


def estimator_metrics_of(result: Any, estimator: Any) -> dict[str, Any]:
    """Metrics the estimator reports itself: its ``last_metrics``, then ``result.metrics``."""
    metrics: dict[str, Any] = {}
    for source in (getattr(estimator, "last_metrics", None), _result_metrics(result)):
        if isinstance(source, Mapping):
            metrics.update(source)
    return metrics


def _result_metrics(result: Any) -> Any:
    if isinstance(result, Mapping):
        return result.get("metrics")
    if isinstance(result, (torch.Tensor, np.ndarray, tuple, list)):
        return None
    return getattr(result, "metrics", None)


def tensor_part(
    values: torch.Tensor,
    mask: torch.Tensor | None,
    row_counts: torch.Tensor | None = None,
    extremes: RowExtremes | None = None,
) -> Part:
    """Statistics part of an advantages-like tensor under the call's mask.

    ``[B]`` and ``[B, 1]`` tensors are per sequence (the mask does not apply).
    Otherwise positions where ``mask > 0`` count, or every position without a
    mask; a zero-stride ``expand`` view is summarised from its ``B`` distinct
    values weighted by each row's number of valid positions (``row_counts``, when
    the caller has them already: :func:`row_valid_counts` of the mask). A dense
    tensor's rows' extremes go to ``extremes`` where the sketch can take them.
    """
    if values.dim() == 0:
        raise ObservationError("advantages_shape", "advantages are a scalar; expected [B] or [B, T]")
    if values.is_complex():
        raise ObservationError("advantages_dtype", f"advantages have complex dtype {values.dtype}")
    if values.dim() == 1 or (values.dim() == 2 and values.shape[1] == 1):
        return value_part(values.reshape(-1))
    if mask is not None and tuple(mask.shape) != tuple(values.shape):
        raise ObservationError(
            "mask_shape",
            f"mask of shape {list(mask.shape)} does not match advantages of shape "
            f"{list(values.shape)}; post-normalization statistics skipped",
        )
    if mask is not None:
        mask = to_device(mask, values.device)
    rows = values.shape[0]
    if values.dim() == 2 and values.stride(1) == 0 and rows <= EXACT_LIMIT:
        per_row = values[:, 0]
        if mask is None:
            weights = torch.full((rows,), float(values.shape[1]), dtype=torch.float64, device=values.device)
        else:
            weights = row_valid_counts(mask) if row_counts is None else row_counts
        return value_part(per_row, weights)
    width = values[0].numel() if rows else 0  # reshape(0, -1) is ambiguous for an empty batch
    flat = values.reshape(rows, width)
    return dense_part(flat, None if mask is None else mask.reshape(rows, width), extremes)


def _sequence_rewards(rewards: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Per-sequence rewards: ``[B]``, ``[B, 1]``, or token-level ``[B, T]`` summed over tokens."""
    if rewards.dim() == 1:
        return rewards
    if rewards.dim() == 2 and rewards.shape[1] == 1:
        return rewards[:, 0]
    if rewards.dim() == 2 and (mask is None or tuple(mask.shape) == tuple(rewards.shape)):
        # Token-level rewards (verl's token_level_rewards): the sequence's score is
        # their sum, exactly as verl's outcome estimators compute it.
        return rewards.sum(dim=-1, dtype=torch.float64)
    raise ObservationError(
        "rewards_shape", f"expected rewards of shape [B], [B, 1] or [B, T], got {list(rewards.shape)}"
    )


@dataclass
class InputObservation:
    """What a call's inputs say, taken before the estimator runs (it may change them in place)."""

    parts: CallParts
    rewards: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    group_ids: torch.Tensor | None = None
    groups: Any = None
    row_keys: RowKeys | None = None  #: prompt rows' hashes, taken by the grouping: the exemplars' keys
    group_size: int | None = None
    #: Exemplars wanted per call, and the multiple of its bound that makes a group "beyond" it.
    exemplars: int = 0
    bound_factor: float = math.inf
    segments: RewardSegments | HostSegments | None = None
    row_counts: torch.Tensor | None = None  #: the mask's, once an expand view needed them
    slice_slots: torch.Tensor | None = None  #: each sample's slice slot, on the rewards' device
    sample_slices: np.ndarray | None = None  #: the same, on the host
    slice_index: SliceIndex | None = None
    pending_slices: tuple[Any, SliceIndex] | None = None  #: labels not yet numbered (no batch size yet)
    function_nonfinite: torch.Tensor | None = None  #: per sample: reward functions that scored it NaN or Inf
    extremes: RowExtremes | None = None  #: dense advantages' row extremes, from the CPU sketch's pass
    mask_unusable: bool = False  #: a mask was passed that is not one (its problem is reported)


def observe_inputs(
    *,
    estimator: str,
    rewards: Any,
    mask: Any,
    groups: Any,
    group_size: int | None,
    reward_range: tuple[float, float] | None,
    problems: list[Problem],
    rewards_expected: bool = True,
    exemplars: int = 0,
    bound_factor: float = math.inf,
    slices: Any = None,
    slice_index: SliceIndex | None = None,
    reward_functions: Mapping[str, Any] | None = None,
    normalization: str | None = None,
) -> InputObservation:
    """Rewards, groups and the derived pre_norm of one call, from its inputs alone.

    Missing rewards are a problem for a watched estimator (its rewards argument
    was not found or was None), not for ``rewards_expected=False`` observations.
    With ``exemplars`` > 0 the groups' reward values are kept for
    :func:`observe_output`'s worst groups; with ``slices`` (one label per
    sample) and a run's ``slice_index``, for its per-slice sums too.
    ``reward_functions`` maps each reward function's (or component's) name to its
    per-sample rewards: stages ``rewards/<name>`` with the rewards' statistics.
    ``normalization`` is the kind the estimator declared (``None``: inferred from
    the data); with groups, each call's groups are compared with its bound.
    """
    seen = InputObservation(CallParts(estimator=estimator, normalization=normalization), groups=groups,
                            group_size=group_size, exemplars=exemplars, bound_factor=bound_factor)
    seen.mask = _attempt(problems, lambda: as_tensor(mask, "mask"))
    seen.mask_unusable = mask is not None and seen.mask is None  # said already: no statistic from it
    functions = []
    for name, values in (reward_functions or {}).items():
        function = _attempt(problems, lambda values=values: as_tensor(values, "reward function values"))
        if function is not None:
            seen.parts.stages[f"rewards/{slice_name(name)}"] = [value_part(function.reshape(-1))]
            functions.append(function.reshape(-1))
    if rewards is not None or rewards_expected:
        seen.rewards = _attempt(problems, lambda: _rewards(rewards, seen.mask))
    if slices is not None and slice_index is not None:
        seen.pending_slices = (slices, slice_index)
    if seen.rewards is None:
        return seen  # slices, if any, are taken with the advantages' batch
    parts = seen.parts
    parts.stages["rewards"] = [value_part(seen.rewards)]
    # Every consumer below (group values, worst groups, slices) works in float64: converted once here, into
    # a copy of its own (the slices read it after the estimator, which may change its input in place).
    seen.rewards = seen.rewards.to(torch.float64, copy=True)
    batch = seen.rewards.shape[0]
    grouped = _attempt(problems, lambda: _group_ids(groups, group_size, batch, seen.rewards))
    rising = False
    if grouped is not None:
        seen.group_ids, seen.row_keys, rising = grouped
    if seen.pending_slices is not None:
        _attempt(problems, lambda: _slice_slots(seen, batch, seen.rewards.device))
    seen.function_nonfinite = _function_nonfinite(functions, seen.rewards)
    if seen.group_ids is not None:  # the groups' values serve their bounds, the exemplars and the slices
        try:
            seen.segments = reward_segments(seen.rewards, seen.group_ids, seen.function_nonfinite, rising=rising)
        except Exception as exc:  # noqa: BLE001 - the record's statistics must not be lost with them
            problems.append(Problem("drilldown", f"worst groups and slices skipped: {type(exc).__name__}: {exc}"))
    parts.groups, pre_norm = group_statistics(seen.rewards, seen.group_ids, reward_range, _shared_groups(seen),
                                              rising=rising)
    parts.stages["pre_norm"] = [value_part(pre_norm)]
    parts.pre_norm_source = "derived"
    return seen


def _shared_groups(seen: InputObservation) -> HostGroups | None:
    """On the CPU, the drill-down's group values serve the record's group counts too (one pass, not two)."""
    if isinstance(seen.segments, HostSegments):
        return seen.segments.groups
    return None  # elsewhere the group statistics keep their own kernels (Triton where it runs)


def _function_nonfinite(functions: list[torch.Tensor], rewards: torch.Tensor) -> torch.Tensor | None:
    """Per sample, how many reward functions scored it NaN or Inf (those of the batch's length)."""
    counts = None
    for values in functions:
        if values.shape[0] != rewards.shape[0]:
            continue
        bad = (~torch.isfinite(to_device(values, rewards.device))).to(torch.float64)
        counts = bad if counts is None else counts + bad
    return counts


def _slice_slots(seen: InputObservation, batch: int, device: torch.device) -> None:
    """Each sample's slice slot, from labels on the host (a device tensor of labels is read back once)."""
    labels, index = seen.pending_slices
    seen.pending_slices = None
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().reshape(-1).tolist()
    if isinstance(labels, (str, bytes)) or not isinstance(labels, (Sequence, np.ndarray)):
        raise ObservationError("slices", f"slice labels must be a sequence with one label per sample, got "
                                         f"{type(labels).__name__}; slices skipped")
    if len(labels) != batch:
        raise ObservationError("slices", f"{len(labels)} slice labels for {batch} samples; slices skipped")
    ids = index.ids(labels)
    seen.slice_index = index
    seen.sample_slices = ids
    seen.slice_slots = to_device(torch.from_numpy(ids), device)


def observe_output(
    seen: InputObservation,
    *,
    advantages: Any,
    taps: Mapping[str, list[Part]],
    reward_range: tuple[float, float] | None,
    problems: list[Problem],
) -> CallParts:
    """Complete an :class:`InputObservation` with what the estimator returned and tapped."""
    parts = seen.parts
    if taps.get("pre_norm"):
        parts.pre_norm_source = "tap"
    parts.stages.update({stage: list(found) for stage, found in taps.items() if found})
    advantages_t = _attempt(problems, lambda: as_tensor(advantages, "advantages"))
    per_token = advantages_t is not None and advantages_t.dim() == 2 and advantages_t.shape[1] > 1
    if seen.mask_unusable and per_token:
        advantages_t = None  # counting every position would be a wrong statistic, silently
    if advantages_t is not None and "post_norm" not in parts.stages:
        seen.extremes = _wanted_extremes(seen, advantages_t)
        post = _attempt(problems, lambda: tensor_part(advantages_t, seen.mask, _expand_row_counts(seen, advantages_t),
                                                      seen.extremes))
        if post is not None:
            parts.stages["post_norm"] = [post]
    batch = _batch_size(seen.rewards, advantages_t, problems)
    if seen.pending_slices is not None and batch is not None and advantages_t is not None:
        _attempt(problems, lambda: _slice_slots(seen, batch, advantages_t.device))
    if seen.segments is not None or seen.slice_slots is not None:
        try:
            _add_group_views(seen, advantages_t)
        except Exception as exc:  # noqa: BLE001 - the record's statistics must not be lost with them
            problems.append(Problem("drilldown", f"worst groups and slices skipped: {type(exc).__name__}: {exc}"))
    if parts.groups is None and batch is not None:
        # Without rewards, groups can still be counted from the advantages' batch.
        grouped = _attempt(problems, lambda: _group_ids(seen.groups, seen.group_size, batch, None))
        parts.groups = group_counts(None, None if grouped is None else grouped.ids, reward_range)
    return parts


def observe_call(
    *,
    estimator: str,
    rewards: Any,
    advantages: Any,
    mask: Any,
    groups: Any,
    group_size: int | None,
    taps: Mapping[str, list[Part]],
    reward_range: tuple[float, float] | None,
    problems: list[Problem],
    rewards_expected: bool = True,
    exemplars: int = 0,
    bound_factor: float = math.inf,
    slices: Any = None,
    slice_index: SliceIndex | None = None,
    reward_functions: Mapping[str, Any] | None = None,
    normalization: str | None = None,
) -> CallParts:
    """Observe one call at once (inputs and output); see :func:`observe_inputs`."""
    seen = observe_inputs(
        estimator=estimator,
        rewards=rewards,
        mask=mask,
        groups=groups,
        group_size=group_size,
        reward_range=reward_range,
        problems=problems,
        rewards_expected=rewards_expected,
        exemplars=exemplars,
        bound_factor=bound_factor,
        slices=slices,
        slice_index=slice_index,
        reward_functions=reward_functions,
        normalization=normalization,
    )
    return observe_output(seen, advantages=advantages, taps=taps, reward_range=reward_range, problems=problems)


def _wanted_extremes(seen: InputObservation, advantages: torch.Tensor) -> RowExtremes | None:
    """Row extremes for the drill-down, taken by the CPU sketch's own pass over dense advantages."""
    wanted = seen.segments is not None or seen.pending_slices is not None or seen.slice_slots is not None
    dense = advantages.dim() == 2 and advantages.shape[1] > 1 and advantages.stride(1) != 0
    if not wanted or not dense or sync_free(advantages) or advantages.dtype not in (torch.float32, torch.float64):
        return None
    slices = seen.pending_slices is not None or seen.slice_slots is not None
    return RowExtremes(advantages.shape[0], advantages.dtype, sums=slices)


def _expand_row_counts(seen: InputObservation, advantages: torch.Tensor) -> torch.Tensor | None:
    """The mask's row counts when the advantages are an expand view: one mask pass for the statistics and exemplars."""
    mask = seen.mask
    if mask is None or advantages.dim() != 2 or advantages.stride(1) != 0 or advantages.shape[1] == 1:
        return None
    if tuple(mask.shape) != tuple(advantages.shape):
        return None  # tensor_part reports it
    if seen.row_counts is None:
        seen.row_counts = row_valid_counts(to_device(mask, advantages.device))
    return seen.row_counts


def _add_group_views(seen: InputObservation, advantages: torch.Tensor | None) -> None:
    """The call's groups against their bound, its worst groups (and a ``key`` column to name them by) and
    per-slice sums: more parts of the transfer."""
    rows = _row_summaries(seen, advantages, sums=seen.slice_slots is not None)
    parts = seen.parts
    evidence = exemplars = slices = None
    if seen.segments is not None:
        peaks = None if rows is None else group_peaks(seen.segments, rows.peak(), rows.nonfinite)
        evidence, ratios = call_bounds(seen.segments, peaks, seen.rewards, parts.normalization)
        if seen.exemplars > 0:
            named: list[GroupKeys] = []

            def key_column(first: torch.Tensor) -> torch.Tensor:
                keys, column = _group_keys(seen, first)
                named.append(keys)
                return column

            exemplars = worst_groups(seen.segments, peaks, ratios, k=seen.exemplars, bound_factor=seen.bound_factor,
                                     key_column=key_column)
            keys = named[0]
    if seen.slice_slots is not None:
        slices = slice_table(seen.slice_slots, seen.slice_index.slots, seen.rewards, seen.segments, rows,
                             seen.function_nonfinite)
    # Only whole results join the record: a failure above leaves the call's parts as they were.
    parts.bound_evidence = evidence
    if exemplars is not None:
        parts.exemplars, parts.exemplar_keys = exemplars, keys
    if slices is not None:
        parts.slices, parts.slice_names, parts.sample_slices = slices, seen.slice_index.slot_names(), seen.sample_slices


def _row_summaries(seen: InputObservation, advantages: torch.Tensor | None, sums: bool) -> RowSummary | None:
    """Per-sample post-norm summaries on the rewards' device, when the advantages describe the call's samples."""
    batch = seen.rewards.shape[0] if seen.rewards is not None else seen.slice_slots.shape[0]
    if advantages is None or advantages.dim() not in (1, 2) or advantages.shape[0] != batch:
        return None
    mask = seen.mask
    per_sequence = advantages.dim() == 1 or advantages.shape[1] == 1
    if not (per_sequence or mask is None or tuple(mask.shape) == tuple(advantages.shape)):
        return None  # a mask of another shape was reported with the post-norm statistics
    extremes = seen.extremes
    if extremes is not None and extremes.complete:
        rows = _from_extremes(extremes, advantages, mask)
    else:
        rows = row_summaries(advantages, None if per_sequence or mask is None else to_device(mask, advantages.device),
                             _expand_row_counts(seen, advantages), sums=sums)
    device = seen.rewards.device if seen.rewards is not None else seen.slice_slots.device
    if device.type == "cpu":
        return rows  # tensors on the CPU already, or the CPU path's NumPy arrays
    return RowSummary(*(None if t is None else to_device(torch.as_tensor(t), device) for t in rows))


#: Where :func:`advmon.exemplars.worst_groups` puts each group's first sample.
FIRST_SAMPLE = 1


def _from_extremes(extremes: RowExtremes, advantages: torch.Tensor, mask: torch.Tensor | None) -> RowSummary:
    """Per-row summaries from the sketch's row extremes; rows holding a NaN or Inf are done again exactly."""
    summary, suspect = _host_from_extremes(extremes)
    if suspect.size:
        rows = torch.from_numpy(suspect)
        flat = advantages.reshape(advantages.shape[0], -1)
        exact = row_summaries(flat[rows], None if mask is None else mask.reshape(flat.shape)[rows], sums=True)
        for mine, theirs in zip(summary, exact):
            mine[suspect] = host_float64(theirs)
    return summary


def _host_from_extremes(extremes: RowExtremes) -> tuple[RowSummary, np.ndarray]:
    """The summaries in NumPy (a few ops over the rows: cheaper than torch's), and the rows to redo."""
    peak = np.maximum(extremes.high.numpy(), np.negative(extremes.low.numpy()), dtype=np.float64)
    counts = extremes.lengths.numpy().astype(np.float64)
    if not counts.min(initial=1.0) > 0:
        peak[counts == 0] = -math.inf  # a row without a valid value has no peak
    finite = np.isfinite(peak)
    suspect = np.zeros(0, dtype=np.int64) if finite.all() else np.flatnonzero(~finite & (counts > 0))
    total = np.zeros(peak.shape[0]) if extremes.total is None else extremes.total.numpy().copy()
    return RowSummary(peak, np.zeros(peak.shape[0]), total, counts), suspect


def _group_keys(seen: InputObservation, first: torch.Tensor) -> tuple[GroupKeys, torch.Tensor]:
    """How to name the chosen groups, and the numbers that name them (read on the device: no sync)."""
    groups = seen.groups
    if seen.group_size is not None:
        return GroupKeys("blocks", (seen.group_size, seen.rewards.shape[0])), _no_keys(first)
    if isinstance(groups, np.ndarray) and groups.dtype.kind in "biuf":
        groups = torch.from_numpy(groups)
    if isinstance(groups, torch.Tensor):
        if groups.dim() == 2 and seen.row_keys is not None and seen.row_keys.hashes.device == first.device:
            return GroupKeys("rows"), seen.row_keys.of(first)  # hashed already, when the rows were grouped
        chosen = to_device(groups.detach(), first.device)[first]
        if chosen.dim() == 2:
            return GroupKeys("rows"), row_keys(chosen)
        return GroupKeys("ids"), chosen.to(torch.float64)
    return GroupKeys("items", groups), _no_keys(first)


def _no_keys(first: torch.Tensor) -> torch.Tensor:
    """The key column of groups named on the host from their first sample alone."""
    return torch.full(first.shape, math.nan, dtype=torch.float64, device=first.device)


def _attempt(problems: list[Problem], compute):
    try:
        return compute()
    except ObservationError as error:
        problems.append(error.problem)
    except GroupsError as error:
        problems.append(Problem("groups", f"groups ignored: {error}"))
    return None


def _rewards(rewards: Any, mask: torch.Tensor | None) -> torch.Tensor | None:
    tensor = as_tensor(rewards, "rewards")
    if tensor is None:
        raise ObservationError(
            "no_rewards",
            "no rewards were passed (None or missing); reward statistics, zero-std groups and "
            "the derived pre_norm are unavailable. Map the argument with watch(rewards=...) or "
            "tap 'pre_norm' inside the estimator",
        )
    if tensor.is_complex():
        raise ObservationError("rewards_dtype", f"rewards have complex dtype {tensor.dtype}")
    return _sequence_rewards(tensor, mask)


def _batch_size(
    rewards: torch.Tensor | None, advantages: torch.Tensor | None, problems: list[Problem]
) -> int | None:
    adv_batch = advantages.shape[0] if advantages is not None and advantages.dim() > 0 else None
    if rewards is not None and adv_batch is not None and adv_batch != rewards.shape[0]:
        problems.append(
            Problem(
                "length_mismatch",
                f"{rewards.shape[0]} rewards but advantages for {adv_batch} sequences",
            )
        )
    batch = rewards.shape[0] if rewards is not None else adv_batch
    if batch == 0:
        problems.append(Problem("empty_batch", "the batch is empty"))
    return batch


def _group_ids(
    groups: Any, group_size: int | None, batch: int | None, rewards: torch.Tensor | None
) -> Grouping | None:
    if batch is None or (groups is None and group_size is None):
        return None
    device = rewards.device if rewards is not None else None
    return group_ids_and_row_keys(groups, batch, group_size=group_size, device=device)

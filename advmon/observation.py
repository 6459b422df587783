"""From one estimator call (its inputs and what it returned) to device parts.

Pure functions over tensors: nothing here warns, counts or emits. What cannot be
used is reported as a :class:`Problem` and the rest is still observed, so a
monitor can record what it can and say what it could not.

A call reduces only what is ``[B, T]`` or ``[B, S]`` (the advantages' sketch and row
summaries; a device's prompt rows become their hashes, the CPU numbers its rows at
once, exactly) and keeps its ``[B]``-sized vectors in a :class:`HostWork`. They
cross to the host in the record's one transfer (on the CPU, a copy), and
:func:`finish_on_host` makes the call's groups, derived pre_norm, bounds, worst
groups and slices from them in NumPy, off the training thread: one implementation
for every path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from advmon.stats import (
    EXACT_LIMIT,
    Grouping,
    GroupsError,
    HostGroups,
    HostPart,
    HostSegments,
    Part,
    RowExtremes,
    RowKeys,
    RowSummary,
    SliceIndex,
    call_bounds,
    check_group_tensor,
    dense_part,
    device_group_vector,
    group_counts,
    group_ids_and_row_keys,
    group_peaks,
    group_statistics,
    host_float64,
    host_grouping,
    reward_segments,
    row_keys,
    row_summaries,
    row_valid_counts,
    slice_name,
    slice_table,
    statistics_path,
    sync_free,
    to_device,
    to_host,
    value_part,
    value_summaries,
    where_float64_works,
    worst_groups,
)

__all__ = [
    "CallParts",
    "HostWork",
    "Problem",
    "advantages_of",
    "estimator_metrics_of",
    "finish_on_host",
    "lost_on_host",
    "InputObservation",
    "ObserveSettings",
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
    #: What the groups' peaks show of it (:func:`advmon.stats.group_bounds.call_bounds`), with groups and rewards.
    bound_evidence: torch.Tensor | np.ndarray | None = None
    estimator_metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)
    #: The worst groups (:func:`advmon.stats.exemplars.worst_groups`, plus a ``key`` column), and how to name them.
    exemplars: torch.Tensor | None = None
    exemplar_keys: GroupKeys | None = None
    #: Per-slice sums (:func:`advmon.stats.slices.slice_table`), the slices' names by slot, and each sample's slice.
    slices: torch.Tensor | None = None
    slice_names: list[str | None] | None = None
    sample_slices: np.ndarray | None = None
    #: The call's ``[B]``-sized work, finished on the host after the transfer (then ``groups``,
    #: ``bound_evidence``, ``exemplars``, ``slices`` and a derived pre_norm come from :func:`finish_on_host`).
    host_work: HostWork | None = None


@dataclass(frozen=True)
class ObserveSettings:
    """What a monitor asks of every call it observes, the same for all of them: one object, passed as one.

    ``reward_range`` bounds the reward (all-fail and all-pass groups); ``exemplars`` is how many
    worst groups a call keeps and ``bound_factor`` the multiple of its bound that makes a group
    "beyond" it; ``slice_index`` numbers the run's slice labels (``None``: no slices).
    """

    reward_range: tuple[float, float] | None = None
    exemplars: int = 0
    bound_factor: float = math.inf
    slice_index: SliceIndex | None = None


#: No reward range, no exemplars, no slices: what an observation asks when its caller says nothing.
NO_SETTINGS = ObserveSettings()


@dataclass
class HostWork:
    """A call's ``[B]``-sized work, done on the host, off the training thread (:func:`finish_on_host`).

    ``vectors`` are what the call computed for it, ``[B]`` each, that travel in the
    record's one transfer: ``rewards`` (a float64 copy), ``function <i>`` (each reward
    function's, a float64 copy), ``groups`` (the groups'
    :func:`~advmon.stats.groups.device_group_vector`) and the advantages' row summaries
    (dense rows: ``abs_max``, ``nonfinite``, and ``total`` and ``count`` for slices; one
    value a row: ``row values`` and an expand view's ``row weights``, unless the
    post_norm part holds them). The rest is host data taken during the call.
    """

    batch: int
    #: The monitor's settings as the call saw them, without the run's live slice index (see ``slices``).
    settings: ObserveSettings
    vectors: dict[str, torch.Tensor] = field(default_factory=dict)
    #: Each reward function's stage and the name of its values among ``vectors``.
    functions: list[tuple[str, str]] = field(default_factory=list)
    #: Groups numbered during the call (blocks of ``group_size``, CPU prompt rows); ``None``: see ``shipped``.
    grouping: Grouping | None = None
    #: Of the ``groups`` vector, if one travels: (made of prompt rows, of integer ids).
    shipped: tuple[bool, bool] | None = None
    #: The groups are a sequence of items (verl's uids), numbered on the host from ``groups``.
    items: bool = False
    groups: Any = None  #: the caller's groups (a sequence of items names its exemplars)
    group_size: int | None = None
    size_check: int | None = None  #: :class:`InputObservation`'s: a ``group_size`` the groups must agree with
    sample_slices: np.ndarray | None = None
    slices: SliceSnapshot | None = None
    #: The row summaries come from the post_norm stage's exact part: ``"values"`` (one value a sample) or
    #: ``"weighted"`` (an expand view's rows, weighted by their valid counts); ``None``: from ``vectors``.
    rows_of_post_norm: str | None = None
    #: An expand view's width, where its rows' values cross without a mask (each counts at every position).
    row_width: int | None = None



@dataclass(frozen=True)
class SliceSnapshot:
    """A run's :class:`~advmon.stats.slices.SliceIndex` as a call saw it: later calls may name more slots."""

    slots: int
    names: tuple[str | None, ...]

    def slot_names(self) -> list[str | None]:
        return list(self.names)


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
    the caller has them already: :func:`row_valid_counts` of the mask, which the part
    keeps as they are). A dense
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
        return value_part(per_row, weights, own_weights=True)  # row counts: float64, >= 0, made for this call
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
    #: The groups' dense ids (numbered during the call), or the vector the host half numbers them from.
    group_ids: torch.Tensor | None = None
    groups: Any = None
    row_keys: RowKeys | None = None  #: prompt rows' hashes, taken by the grouping: the exemplars' keys
    group_size: int | None = None
    #: A ``group_size`` given beside the estimator's own groups: checked against them on the host, never used.
    size_check: int | None = None
    #: The monitor's settings: exemplars wanted per call, the multiple of its bound that makes a group "beyond"
    #: it, the reward range (on the host: its :class:`HostWork`'s, without the run's live slice index).
    settings: ObserveSettings = NO_SETTINGS
    segments: HostSegments | None = None
    row_counts: torch.Tensor | None = None  #: the mask's, once an expand view needed them
    #: Each sample's slice slot (the host half's).
    slice_slots: torch.Tensor | None = None
    sample_slices: np.ndarray | None = None  #: the same, on the host
    slice_index: SliceIndex | SliceSnapshot | None = None
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
    problems: list[Problem],
    settings: ObserveSettings = NO_SETTINGS,
    rewards_expected: bool = True,
    slices: Any = None,
    reward_functions: Mapping[str, Any] | None = None,
    normalization: str | None = None,
) -> InputObservation:
    """Rewards, groups and the derived pre_norm of one call, from its inputs alone.

    Missing rewards are a problem for a watched estimator (its rewards argument
    was not found or was None), not for ``rewards_expected=False`` observations.
    ``settings`` are the monitor's (:class:`ObserveSettings`). With its ``exemplars``
    > 0 the groups' reward values are kept for :func:`observe_output`'s worst groups;
    with ``slices`` (one label per sample) and its ``slice_index``, for the per-slice sums too.
    ``reward_functions`` maps each reward function's (or component's) name to its
    per-sample rewards: stages ``rewards/<name>`` with the rewards' statistics.
    ``normalization`` is the kind the estimator declared (``None``: inferred from
    the data); with groups, each call's groups are compared with its bound.
    """
    seen = InputObservation(CallParts(estimator=estimator, normalization=normalization), groups=groups,
                            group_size=group_size, settings=settings)
    seen.mask = _attempt(problems, lambda: as_tensor(mask, "mask"))
    seen.mask_unusable = mask is not None and seen.mask is None  # said already: no statistic from it
    functions: list[tuple[str, torch.Tensor]] = []  #: each reward function's stage and values
    for name, values in (reward_functions or {}).items():
        values = _missing_as_nan(values, f"reward function {name!r}", problems)
        function = _attempt(problems, lambda values=values: as_tensor(values, "reward function values"))
        if function is not None:
            functions.append((f"rewards/{slice_name(name)}", function.reshape(-1)))
    if rewards is not None or rewards_expected:
        given = _missing_as_nan(rewards, "rewards", problems)
        seen.rewards = _attempt(problems, lambda: _rewards(given, seen.mask))
    if slices is not None and settings.slice_index is not None:
        seen.pending_slices = (slices, settings.slice_index)
    parts = seen.parts
    # The host half makes [B]-sized exact parts from the float64 copies that cross for it (rewards, reward
    # functions, with rewards): an empty stage is one :func:`finish_on_host` fills. Larger ones are sketched here.
    for stage, values in functions:
        parts.stages[stage] = [] if seen.rewards is not None and values.numel() <= EXACT_LIMIT \
            else [value_part(values)]
    if seen.rewards is None:
        return seen  # slices, if any, are taken with the advantages' batch
    parts.stages["rewards"] = [] if seen.rewards.numel() <= EXACT_LIMIT else [value_part(seen.rewards)]
    # Every consumer on the host (group values, worst groups, slices) works in float64: converted once here,
    # into a copy of its own (the caller may change its tensors once the call returned).
    seen.rewards = seen.rewards.to(torch.float64, copy=True)
    _settle_group_size(seen, seen.rewards.shape[0], problems)
    _defer_to_host(seen, seen.rewards.shape[0], problems, functions)
    return seen


def _settle_group_size(seen: InputObservation, batch: int, problems: list[Problem]) -> None:
    """A ``group_size`` never overrides the groups the estimator was given, nor makes a group it does not fill.

    Beside groups, the groups are used and the size is only checked against them (on the host, where they are
    numbered: :func:`_check_group_size`). Alone, it makes blocks only where it divides the batch; otherwise the
    call has no group statistics (a short last group would be a wrong one), and that is a problem.
    """
    size = seen.group_size
    if size is None:
        return
    if seen.groups is not None:
        seen.group_size, seen.size_check = None, size
    elif batch % size:
        seen.group_size = None
        problems.append(Problem("group_size_indivisible", (
            f"group_size={size} does not divide the batch of {batch} samples (a last group of {batch % size} "
            "would be a wrong one): this call has no group statistics. Give the groups themselves "
            "(watch(groups='...'), observe(groups=...)) or a size that divides every batch")))


def _blocks_match(ids: np.ndarray, size: int) -> bool:
    """Whether dense group ids are the batch's blocks of ``size`` (however they are numbered).

    Example:
        >>> _blocks_match(np.array([3, 3, 1, 1]), 2), _blocks_match(np.array([0, 0, 1, 1]), 4)
        (True, False)
    """
    if ids.shape[0] % size:
        return False
    blocks = ids.reshape(-1, size)
    return bool((blocks == blocks[:, :1]).all()) and len(np.unique(blocks[:, 0])) == blocks.shape[0]


def _check_group_size(work: HostWork, ids: torch.Tensor | None, problems: list[Problem]) -> None:
    """The estimator's groups are the call's; a ``group_size`` given beside them that disagrees is a problem."""
    size = work.size_check
    if size is None or ids is None or _blocks_match(ids.numpy(), size):
        return
    count = len(np.unique(ids.numpy()))
    problems.append(Problem("group_size_disagrees", (
        f"group_size={size} disagrees with the {count} groups the estimator was given over {work.batch} samples: "
        "the given groups are used. Drop group_size, or give watch(groups=None) if the blocks are meant")))


def _groups_and_pre_norm(seen: InputObservation, problems: list[Problem], rising: bool) -> torch.Tensor:
    """The call's group values (for the drill-down) and counts, and its derived pre_norm: host data, NumPy."""
    if seen.group_ids is not None:  # the groups' values serve their bounds, the exemplars and the slices
        try:
            seen.segments = reward_segments(seen.rewards, seen.group_ids, seen.function_nonfinite, rising=rising)
        except Exception as exc:  # noqa: BLE001 - the record's statistics must not be lost with them
            problems.append(Problem("drilldown", f"worst groups and slices skipped: {type(exc).__name__}: {exc}"))
    seen.parts.groups, pre_norm = group_statistics(seen.rewards, seen.group_ids, seen.settings.reward_range,
                                                   _shared_groups(seen), rising=rising)
    return pre_norm


def _defer_to_host(seen: InputObservation, batch: int, problems: list[Problem],
                   functions: list[tuple[str, torch.Tensor]]) -> None:
    """:func:`observe_inputs`' share of the host half: the ``[B]`` vectors it finishes the call from
    (:class:`HostWork`), on every path (on the CPU the transfer is a copy of them).

    The derived pre_norm keeps its place among the stages, empty until :func:`finish_on_host` fills it.
    """
    parts = seen.parts
    work = parts.host_work = _host_work(seen, batch)
    work.vectors["rewards"] = seen.rewards
    for index, (stage, values) in enumerate(functions):  # a copy: the estimator may change its inputs in place
        work.functions.append((stage, f"function {index}"))
        work.vectors[f"function {index}"] = values.to(torch.float64, copy=True)
    _attempt(problems, lambda: _plan_grouping(seen, work, seen.rewards.device))
    if seen.pending_slices is not None:
        _attempt(problems, lambda: _slice_slots(seen, batch))
    parts.stages["pre_norm"] = []
    parts.pre_norm_source = "derived"


def _host_work(seen: InputObservation, batch: int) -> HostWork:
    # The run's slice index stays on the training thread: the host half gets this call's snapshot of it.
    return HostWork(batch, replace(seen.settings, slice_index=None), groups=_own_copy(seen.groups),
                    group_size=seen.group_size, size_check=seen.size_check)


def _own_copy(groups: Any) -> Any:
    """The caller's group items as the host half will read them (to number them and name exemplars, off the
    training thread): a copy, since a trainer may refill its arrays and lists once the call returned. Tensors and
    numeric arrays are none of the host half's business (they cross as vectors, or are numbered during the call),
    and no reference to the batch may outlive the call."""
    if isinstance(groups, torch.Tensor) or (isinstance(groups, np.ndarray) and groups.dtype.kind in "biuf"):
        return None
    if isinstance(groups, np.ndarray):
        return groups.copy()
    if isinstance(groups, list):
        return list(groups)
    return groups


def _plan_grouping(seen: InputObservation, work: HostWork, device: torch.device) -> None:
    """How the host finds the call's groups: what reads a ``[B, S]`` or ``[B]`` tensor is done now, the rest
    on the host.

    A device's group tensor and a CPU tensor of ids are reduced to a ``[B]`` vector that
    travels (a copy); CPU prompt rows are numbered now, exactly (reading ``[B, S]`` is the
    device half's work on the CPU); blocks of ``group_size`` are numbered now (nothing to
    read); a sequence of items is numbered on the host from advmon's own copy.
    """
    groups, batch = seen.groups, work.batch
    if seen.group_size is None and groups is None:
        return
    if isinstance(groups, np.ndarray) and groups.dtype.kind in "biuf":
        groups = torch.from_numpy(groups)
    if seen.group_size is None and isinstance(groups, torch.Tensor):
        groups = groups.detach()
        check_group_tensor(groups, batch)
        if sync_free(groups) or groups.dim() == 1:
            vector = device_group_vector(groups)
            seen.group_ids = work.vectors["groups"] = to_device(vector, device) if sync_free(groups) else vector
            work.shipped = (groups.dim() == 2, not groups.is_floating_point())
            return
    elif seen.group_size is None and isinstance(groups, (Sequence, np.ndarray)) and not isinstance(groups, (str, bytes)):
        if len(groups) != batch:  # said at the call; what only numbering finds (an unhashable item) the host says
            raise GroupsError(f"expected {batch} group ids, got {len(groups)}")
        work.items = True
        return
    with statistics_path("cpu"):  # host data: read it
        work.grouping = group_ids_and_row_keys(groups, batch, group_size=seen.group_size)
    seen.group_ids = work.grouping.ids


def _shared_groups(seen: InputObservation) -> HostGroups | None:
    """The drill-down's group values serve the record's group counts too (one pass, not two)."""
    return seen.segments.groups if isinstance(seen.segments, HostSegments) else None


def _host_function_nonfinite(functions: list[np.ndarray], batch: int) -> np.ndarray | None:
    """Per sample, how many reward functions scored it NaN or Inf (those of the batch's length), from the float64
    values that crossed."""
    counts = None
    for values in functions:
        if values.shape[0] != batch:
            continue
        bad = (~np.isfinite(values)).astype(np.float64)
        counts = bad if counts is None else counts + bad
    return counts


def _slice_slots(seen: InputObservation, batch: int) -> None:
    """Each sample's slice slot, from labels on the host (a device tensor of labels is read back once), for the host
    half to sum the slices by. Numbered during the call: the run's slots are given in call order."""
    labels, index = seen.pending_slices
    seen.pending_slices = None
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().reshape(-1).tolist()
    if isinstance(labels, (str, bytes)) or not isinstance(labels, (Sequence, np.ndarray)):
        raise ObservationError("slices", f"slice labels must be a sequence with one label per sample, got "
                                         f"{type(labels).__name__}; slices skipped")
    if len(labels) != batch:
        raise ObservationError("slices", f"{len(labels)} slice labels for {batch} samples; slices skipped")
    work = seen.parts.host_work
    work.sample_slices = index.ids(labels)
    work.slices = SliceSnapshot(index.slots, tuple(index.slot_names()))


def observe_output(
    seen: InputObservation,
    *,
    advantages: Any,
    taps: Mapping[str, list[Part]],
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
    post_made = advantages_t is not None and "post_norm" not in parts.stages
    if post_made:
        seen.extremes = _wanted_extremes(seen, advantages_t)
        post = _attempt(problems, lambda: tensor_part(advantages_t, seen.mask, _expand_row_counts(seen, advantages_t),
                                                      seen.extremes))
        if post is not None:
            parts.stages["post_norm"] = [post]
    batch = _batch_size(seen.rewards, advantages_t, problems)
    if parts.host_work is None and batch is not None and advantages_t is not None:
        # Without rewards, groups can still be counted (and slices summed) from the advantages' batch.
        parts.host_work = _host_work(seen, batch)
        _attempt(problems, lambda: _plan_grouping(seen, parts.host_work, advantages_t.device))
    if parts.host_work is not None:
        made = parts.stages.get("post_norm") if post_made else None
        _defer_outputs_to_host(seen, parts.host_work, advantages_t, problems, None if made is None else made[0])
    return parts


def observe_call(
    *,
    advantages: Any,
    taps: Mapping[str, list[Part]],
    problems: list[Problem],
    **inputs: Any,
) -> CallParts:
    """Observe one call at once: its ``inputs`` as :func:`observe_inputs` takes them (``settings`` included),
    then what it returned and tapped, as :func:`observe_output` does."""
    seen = observe_inputs(problems=problems, **inputs)
    return observe_output(seen, advantages=advantages, taps=taps, problems=problems)


def _wanted_extremes(seen: InputObservation, advantages: torch.Tensor) -> RowExtremes | None:
    """Row extremes for the drill-down, taken by the CPU sketch's own pass over dense advantages."""
    dense = advantages.dim() == 2 and advantages.shape[1] > 1 and advantages.stride(1) != 0
    if not _rows_wanted(seen) or not dense or sync_free(advantages) \
            or advantages.dtype not in (torch.float32, torch.float64):
        return None
    return RowExtremes(advantages.shape[0], advantages.dtype, sums=_sliced(seen))


def _rows_wanted(seen: InputObservation) -> bool:
    """Whether the host half needs the advantages' row summaries: groups with rewards (bounds, worst groups),
    or slices."""
    work = seen.parts.host_work
    if work is None:
        return seen.pending_slices is not None  # no rewards: the host work comes with the advantages' batch
    numbered = work.grouping is not None or work.shipped is not None or work.items
    return (numbered and seen.rewards is not None) or _sliced(seen)


def _sliced(seen: InputObservation) -> bool:
    """Whether the call has slice labels (numbered, or waiting for the advantages' batch)."""
    work = seen.parts.host_work
    return seen.pending_slices is not None or (work is not None and work.sample_slices is not None)


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


def _defer_outputs_to_host(seen: InputObservation, work: HostWork, advantages: torch.Tensor | None,
                           problems: list[Problem], post: Part | None) -> None:
    """:func:`observe_output`'s share of the host half: the advantages' row summaries join the vectors it finishes
    from.

    Advantages of one value a sample (``[B]``, ``[B, 1]``, an expand view) whose post_norm part
    is exact need none: that part's values and weights (each row's valid count) cross
    anyway, and the host summarises them (``post``: the part made of these advantages).
    """
    if seen.pending_slices is not None and advantages is not None:
        _attempt(problems, lambda: _slice_slots(seen, work.batch))
    if advantages is None or work.batch == 0:
        return  # an empty batch is its own problem (empty_batch): no rows to summarise
    if not _rows_wanted(seen):
        return
    per_sequence = advantages.dim() == 1 or (advantages.dim() == 2 and advantages.shape[1] == 1)
    one_value_a_row = per_sequence or (advantages.dim() == 2 and advantages.stride(1) == 0)
    if one_value_a_row and advantages.shape[0] == work.batch:
        if post is not None and post.kind == "exact" and post.tensors[0].shape[0] == work.batch:  # a value a row
            work.rows_of_post_norm = "values" if per_sequence else "weighted"
        else:
            _attempt(problems, lambda: _ship_row_values(seen, work, advantages, per_sequence))
        return
    try:
        rows = _advantage_rows(seen, advantages, work.sample_slices is not None, work.batch)
    except Exception as exc:  # noqa: BLE001 - the record's statistics must not be lost with them
        problems.append(Problem("drilldown", f"worst groups and slices skipped: {type(exc).__name__}: {exc}"))
        return
    if rows is not None:
        work.vectors.update((name, torch.as_tensor(vector)) for name, vector in zip(RowSummary._fields, rows)
                            if vector is not None)  # the CPU's summaries may be NumPy already


def _ship_row_values(seen: InputObservation, work: HostWork, advantages: torch.Tensor, per_sequence: bool) -> None:
    """One value a sample, without an exact post_norm part to read it from: the values (and an expand view's row
    counts) cross for the host's row summaries, as a float64 copy."""
    values = advantages.reshape(-1) if per_sequence else advantages[:, 0]
    if not per_sequence:
        mask = seen.mask
        if mask is not None and tuple(mask.shape) != tuple(advantages.shape):
            return  # reported with the post-norm statistics
        if mask is None:
            work.row_width = advantages.shape[1]
        else:
            work.vectors["row weights"] = _expand_row_counts(seen, advantages)
    work.vectors["row values"] = values.to(torch.float64, copy=True)


def finish_on_host(parts: CallParts, vectors: Mapping[str, np.ndarray], stages: Mapping[str, list[HostPart]],
                   problems: list[Problem]) -> CallParts:
    """A call's groups and their counts, rewards and derived pre_norm parts, bound evidence, worst groups
    and slices, on the host from its :class:`HostWork`, the ``vectors`` that crossed (as NumPy arrays, by name)
    and its ``stages`` as they crossed.

    The same code runs for every path, so a record is the same on every path. Returns a
    :class:`CallParts` of host values (CPU tensors and NumPy arrays; its ``stages`` hold
    :class:`~advmon.stats.HostPart` s for the call's empty stages); what fails is a problem
    and the rest is still finished.
    """
    work = parts.host_work
    done = CallParts(estimator=parts.estimator, normalization=parts.normalization)
    seen = InputObservation(done, groups=work.groups, group_size=work.group_size, settings=work.settings)
    with statistics_path("cpu"):  # host data, whichever path the call's device took
        rewards = vectors.get("rewards")
        seen.rewards = None if rewards is None else torch.from_numpy(rewards)
        made_here = [(stage, vectors[key]) for stage, key in work.functions]
        if seen.rewards is not None:
            made_here.append(("rewards", rewards))
        for stage, values in made_here:
            if not stages.get(stage):  # left for the host (a large batch's parts are sketched on the device)
                done.stages[stage] = [_host_part(torch.from_numpy(values))]
        try:
            _finish_groups(seen, work, vectors, stages, problems)
        except Exception as exc:  # noqa: BLE001 - the record keeps the call's other statistics
            problems.append(lost_on_host(exc))
    return done


def lost_on_host(exc: BaseException) -> Problem:
    """The problem of a call whose host half failed."""
    return Problem("internal", f"a call's groups, exemplars and slices were lost: {type(exc).__name__}: {exc}")


def _finish_groups(seen: InputObservation, work: HostWork, vectors: Mapping[str, np.ndarray],
                   stages: Mapping[str, list[HostPart]], problems: list[Problem]) -> None:
    """:func:`finish_on_host` from the groups on: counts, derived pre_norm, bounds, worst groups, slices."""
    done = seen.parts
    rising = False
    grouping = _attempt(problems, lambda: _host_groups(work, vectors, seen))
    if grouping is not None:
        seen.group_ids, seen.row_keys, rising = grouping
        _check_group_size(work, seen.group_ids, problems)
    functions = _host_function_nonfinite([vectors[key] for _, key in work.functions], work.batch)
    seen.function_nonfinite = None if functions is None else torch.from_numpy(functions)
    if work.sample_slices is not None:
        seen.sample_slices, seen.slice_index = work.sample_slices, work.slices
        seen.slice_slots = torch.from_numpy(work.sample_slices)
    if seen.rewards is None:
        done.groups = group_counts(None, seen.group_ids, work.settings.reward_range)
    else:
        pre_norm = _groups_and_pre_norm(seen, problems, rising)
        if not stages.get("pre_norm"):  # derived here (a tap's would have replaced it)
            done.stages["pre_norm"] = [_host_part(pre_norm)]
    if seen.segments is not None or seen.slice_slots is not None:
        try:
            _group_views(seen, _host_rows(work, vectors, stages))
        except Exception as exc:  # noqa: BLE001 - the record's statistics must not be lost with them
            problems.append(Problem("drilldown", f"worst groups and slices skipped: {type(exc).__name__}: {exc}"))


def _host_groups(work: HostWork, vectors: Mapping[str, np.ndarray], seen: InputObservation) -> Grouping | None:
    """The call's groups on the host: numbered during the call, or now from the vector that crossed or the items."""
    if work.items:
        return group_ids_and_row_keys(work.groups, work.batch)
    if work.shipped is None:
        return work.grouping
    rows, integer = work.shipped
    vector = vectors["groups"]
    if not rows:  # ids name their groups by value: the values, as the caller's tensor held them
        seen.groups = torch.from_numpy(vector.view(np.int64) if integer else vector)
    return host_grouping(vector, rows=rows, integer=integer)


def _host_part(values: torch.Tensor) -> HostPart:
    """:func:`~advmon.stats.value_part` of host values, as the record's transfer would leave it."""
    if values.numel() <= EXACT_LIMIT:  # no torch op for what is NumPy already: the exact part's two arrays
        return HostPart("exact", (host_float64(values), np.ones(values.shape[0])))
    return to_host(value_part(values))


def _host_rows(work: HostWork, vectors: Mapping[str, np.ndarray],
               stages: Mapping[str, list[HostPart]]) -> RowSummary | None:
    """The advantages' row summaries: made here from the post_norm part's values, or crossed, or ``None``."""
    if work.rows_of_post_norm is not None:
        values, weights = stages["post_norm"][0].arrays
        weighted = work.rows_of_post_norm == "weighted"
        return value_summaries(torch.from_numpy(values), torch.from_numpy(weights) if weighted else None,
                               sums=work.sample_slices is not None)
    if "row values" in vectors:
        weights = vectors.get("row weights")
        if weights is None and work.row_width is not None:  # an expand view without a mask: every position
            weights = np.full(vectors["row values"].shape[0], float(work.row_width))
        return value_summaries(torch.from_numpy(vectors["row values"]),
                               None if weights is None else torch.from_numpy(weights),
                               sums=work.sample_slices is not None)
    if "abs_max" not in vectors:
        return None
    return RowSummary(*(vectors.get(name) for name in RowSummary._fields))


def _group_views(seen: InputObservation, rows: RowSummary | None) -> None:
    """The call's groups against their bound, its worst groups (and a ``key`` column to name them by) and
    per-slice sums, from its group values and the advantages' row summaries (``None``: not known)."""
    parts = seen.parts
    evidence = exemplars = slices = None
    if seen.segments is not None:
        peaks = None if rows is None else group_peaks(seen.segments, rows.peak(), rows.nonfinite)
        evidence, ratios = call_bounds(seen.segments, peaks, seen.rewards, parts.normalization)
        if seen.settings.exemplars > 0:
            named: list[GroupKeys] = []

            def key_column(first: torch.Tensor) -> torch.Tensor:
                keys, column = _group_keys(seen, first)
                named.append(keys)
                return column

            exemplars = worst_groups(seen.segments, peaks, ratios, k=seen.settings.exemplars,
                                     bound_factor=seen.settings.bound_factor, key_column=key_column)
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


def _advantage_rows(seen: InputObservation, advantages: torch.Tensor | None, sums: bool,
                    batch: int) -> RowSummary | None:
    """Per-sample post-norm summaries on the advantages' device, when they describe the call's ``batch`` samples."""
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
    return rows


#: Where :func:`advmon.stats.exemplars.worst_groups` puts each group's first sample.
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
    """How to name the chosen groups, and the numbers that name them (host data: the drill-down runs on the host)."""
    groups = seen.groups
    if seen.group_size is not None:
        return GroupKeys("blocks", (seen.group_size, seen.rewards.shape[0])), _no_keys(first)
    if seen.row_keys is not None:
        return GroupKeys("rows"), seen.row_keys.of(first)  # prompt rows, hashed already when they were grouped
    if isinstance(groups, np.ndarray) and groups.dtype.kind in "biuf":
        groups = torch.from_numpy(groups)
    if isinstance(groups, torch.Tensor):
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


def _missing_as_nan(values: Any, name: str, problems: list[Problem]) -> Any:
    """A list (or object array) of numbers with ``None`` among them: ``None`` is a missing reward, NaN.

    A reward function that could not score a sample returns ``None`` (TRL's, docs/drilldown.md's): that is a
    missing value, counted in ``nan_count``, and the other values' statistics are taken without it. Said once
    (a problem naming ``None``). Anything else is returned as it came (a string stays a type problem).

    Example:
        >>> problems = []
        >>> _missing_as_nan([1.0, None, 0.0], "rewards", problems).tolist(), problems[0].kind
        ([1.0, nan, 0.0], 'missing_rewards')
    """
    if not isinstance(values, (list, tuple)) and not (isinstance(values, np.ndarray) and values.dtype == object):
        return values
    try:
        items = np.asarray(values, dtype=object)
    except (TypeError, ValueError):  # ragged: as_tensor says what it is
        return values
    flat = items.ravel().tolist()
    missing = sum(item is None for item in flat)
    if not missing or not all(item is None or _is_real(item) for item in flat):
        return values
    problems.append(Problem("missing_rewards", (
        f"{missing} of {len(flat)} {name} {'was' if missing == 1 else 'were'} None: each counts as a missing reward (NaN, in its nan_count); "
        "the other values' statistics are taken without them")))
    return np.array([math.nan if item is None else float(item) for item in flat], dtype=np.float64).reshape(items.shape)


def _is_real(item: Any) -> bool:
    return isinstance(item, (int, float, np.integer, np.floating)) and not isinstance(item, str)


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

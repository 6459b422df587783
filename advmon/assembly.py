"""A step's record, assembled: its calls' parts cross to the host once and are merged.

:class:`StepParts` holds what one process recorded for a step after the transfer;
:func:`collect` builds it from the calls, :func:`gather_ranks` merges every rank's
on rank 0 (``Monitor(reduce="ranks")``), and :func:`assemble` finishes the record's
metrics. The monitor owns when this happens; this module owns how.

Example:
    >>> parts = StepParts()
    >>> parts.is_empty, combined_source(["tap", "derived"])
    (True, 'mixed')
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from advmon.normalization import Verdict, judge
from advmon.observation import FIRST_SAMPLE, CallParts, GroupKeys, Problem, finish_on_host, lost_on_host
from advmon.record import REWARD_KEYS, group_metrics, slice_metrics, stage_metrics
from advmon.stats import EXEMPLAR_FIELDS
from advmon.stats import EXEMPLAR_NOT_CHOSEN as NOT_CHOSEN
from advmon.stats import EXEMPLAR_REASONS as REASONS
from advmon.stats import (
    GROUP_COUNT_FIELDS,
    SLICE_FIELDS,
    Histogram,
    HostPart,
    Transfer,
    host_float64,
    merge_evidence,
    merge_group_counts,
    start_transfer,
    summarize,
    summarize_with_histogram,
)

__all__ = [
    "CORE_STAGES",
    "StepParts",
    "assemble",
    "collect",
    "cross",
    "combined_source",
    "exemplar_entries",
    "gather_ranks",
    "judged_exemplars",
    "record_problems",
    "worst_first",
]

_ABS_MAX = SLICE_FIELDS.index("advantage_abs_max")
MAX_SIZE = GROUP_COUNT_FIELDS.index("max_size")
#: Stages whose keys every record carries, in this order.
CORE_STAGES = ("pre_norm", "post_norm")


@dataclass
class StepParts:
    """One step's parts on the host: per-stage value parts, group counts, estimator metrics."""

    stages: dict[str, list[HostPart]] = field(default_factory=dict)
    group_totals: np.ndarray | None = None
    #: Each call's declared normalization (``None``: not declared), and the calls' groups against their bounds
    #: (:func:`advmon.stats.group_bounds.call_bounds`, merged).
    normalizations: list[str | None] = field(default_factory=list)
    bound_evidence: np.ndarray | None = None
    estimator_metrics: dict[str, float] = field(default_factory=dict)
    estimators: list[str] = field(default_factory=list)
    sources: list[str | None] = field(default_factory=list)
    #: Every call's worst groups (:func:`exemplar_entries`), ranked and cut to ``k`` by :func:`worst_first`.
    exemplars: list[dict[str, Any]] = field(default_factory=list)
    #: Per-slice sums (:data:`advmon.stats.slices.SLICE_FIELDS`) by slice name, merged over calls and ranks.
    slices: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not self.stages and self.group_totals is None

    def merge(self, other: StepParts) -> None:
        """Add another process's (or chunk's) parts, as the chunks of one step are merged."""
        for stage, parts in other.stages.items():
            self.stages.setdefault(stage, []).extend(parts)
        if other.group_totals is not None:
            self.group_totals = (
                other.group_totals.copy() if self.group_totals is None
                else merge_group_counts(self.group_totals, other.group_totals)
            )
        self.normalizations += other.normalizations
        if other.bound_evidence is not None:
            self.add_evidence(other.bound_evidence)
        for key, value in other.estimator_metrics.items():
            self.estimator_metrics.setdefault(key, value)  # the first (rank 0's) value wins
        self.estimators += other.estimators
        self.sources += other.sources
        self.exemplars += other.exemplars
        for name, row in other.slices.items():
            self.add_slice(name, row)

    def add_evidence(self, evidence: np.ndarray) -> None:
        """Add one call's evidence of its normalization, as one call on both batches would give it."""
        if self.bound_evidence is None:
            self.bound_evidence = evidence.copy()
        else:
            self.bound_evidence = merge_evidence(self.bound_evidence, evidence)

    def add_slice(self, name: str, row: np.ndarray) -> None:
        """Add one call's sums of a slice: counts and sums add up, the largest |advantage| is a maximum."""
        if name not in self.slices:
            self.slices[name] = row.copy()
            return
        merged = self.slices[name] + row
        merged[_ABS_MAX] = np.fmax(self.slices[name][_ABS_MAX], row[_ABS_MAX])
        self.slices[name] = merged


def cross(calls: Sequence[CallParts], timeout: float | None = None) -> Transfer:
    """Start a step's one crossing: every call's device parts and ``[B]``-sized vectors, packed.

    This is the training thread's share of a record; it never waits for a device
    (:func:`~advmon.stats.start_transfer`). What crosses is advmon's own copy, so the
    caller may change its tensors once the call returned. ``timeout``: how long the
    host half waits for a device's copy (the monitor's ``close_timeout``).
    """
    tensors = [t for call in calls for t in (*_device_tensors(call), *_vectors(call))]
    return start_transfer(tensors) if timeout is None else start_transfer(tensors, timeout)


def collect(calls: Sequence[CallParts], problems: list[Problem] | None = None,
            crossing: Transfer | None = None) -> StepParts:
    """This process's parts of a step, on the host after one transfer (``crossing``, started now if ``None``).

    A device call's ``[B]``-sized vectors cross in the same transfer and are finished
    here (:func:`~advmon.observation.finish_on_host`); what that cannot finish is added
    to ``problems``.
    """
    problems = [] if problems is None else problems
    arrays = iter((cross(calls) if crossing is None else crossing).arrays())

    step = StepParts()
    for call in calls:
        own_arrays = iter([next(arrays) for _ in _device_tensors(call)])
        stages = {stage: [HostPart(part.kind, tuple(next(own_arrays) for _ in part.tensors)) for part in parts]
                  for stage, parts in call.stages.items()}
        done = None
        if call.host_work is not None:
            crossed = {name: next(arrays) for name in call.host_work.vectors}
            try:
                done = finish_on_host(call, crossed, stages, problems)
            except Exception as exc:  # noqa: BLE001 - the step's record is still made, with what was known
                problems.append(lost_on_host(exc))
        _add_call(step, call, stages, own_arrays, done)
    return step


def _vectors(call: CallParts) -> list[torch.Tensor]:
    """A device call's ``[B]``-sized vectors, in the order :func:`collect` names them."""
    return list(call.host_work.vectors.values()) if call.host_work is not None else []


def _device_tensors(call: CallParts) -> list[torch.Tensor]:
    """What a call's parts send in the transfer, in the order :func:`_add_call` reads it back."""
    tensors: list[torch.Tensor] = []
    for parts in call.stages.values():
        for part in parts:
            tensors.extend(part.tensors)
    if call.groups is not None:
        tensors.append(call.groups)
    if call.bound_evidence is not None:
        tensors.append(torch.from_numpy(call.bound_evidence))
    tensors.extend(v for v in call.estimator_metrics.values() if isinstance(v, torch.Tensor))
    if call.exemplars is not None:
        tensors.append(call.exemplars)
    if call.slices is not None:
        tensors.append(call.slices)
    return tensors


def _add_call(step: StepParts, call: CallParts, stages: dict[str, list[HostPart]], arrays: Iterator[np.ndarray],
              done: CallParts | None) -> None:
    """Add one call's parts to the step: its ``stages`` and the rest of the transfer's ``arrays``, and a device
    call's host half ``done`` (which fills the stages the call left empty: its rewards, a derived pre_norm)."""
    for stage, parts in stages.items():
        if not parts and done is not None:
            parts = done.stages.get(stage, [])
        if parts:
            step.stages.setdefault(stage, []).extend(parts)
    views = call if done is None else done  # the groups and their views: the transfer's, or the host half's
    if views.groups is not None:
        counts = next(arrays) if done is None else host_float64(done.groups)
        totals = step.group_totals
        step.group_totals = counts.copy() if totals is None else merge_group_counts(totals, counts)
    if views.bound_evidence is not None:
        step.add_evidence(next(arrays) if done is None else done.bound_evidence)
    for key, value in call.estimator_metrics.items():
        number = float(next(arrays)[0]) if isinstance(value, torch.Tensor) else float(value)
        step.estimator_metrics[f"estimator/{key}"] = number
    if views.exemplars is not None:
        table = next(arrays) if done is None else host_float64(done.exemplars)
        table = table.reshape(-1, views.exemplars.shape[1])
        slice_of = None
        if views.sample_slices is not None:  # only the chosen groups' first samples are looked up
            firsts = {int(first) for first in table[:, FIRST_SAMPLE]}
            slice_of = {first: views.slice_names[views.sample_slices[first]] for first in firsts}
        step.exemplars += exemplar_entries(table, views.exemplar_keys, slice_of)
    if views.slices is not None:
        table = (next(arrays) if done is None else host_float64(done.slices)).reshape(-1, len(SLICE_FIELDS))
        for slot in np.flatnonzero(table[:, 0] > 0).tolist():  # the slices with samples in this call
            if views.slice_names[slot] is not None:
                step.add_slice(views.slice_names[slot], table[slot])
    step.estimators.append(call.estimator)
    step.sources.append(call.pre_norm_source)
    step.normalizations.append(call.normalization)


def exemplar_entries(
    table: np.ndarray, keys: GroupKeys, slice_of: Mapping[int, str] | Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The record's exemplars from a call's worst-groups table (its last column names the group).

    Example:
        >>> row = [4, 16, 8, 8, 0, 0, 0, 0.0, 1.0, 0.5, 2.5, 0, 0.94, float("nan")]
        >>> entry = exemplar_entries(np.array([row]), GroupKeys("blocks", (8, 64)))[0]
        >>> entry["group"], entry["reason"], entry["size"], entry["advantage_abs_max"]
        ('samples 16-23', 'largest_abs_advantage', 8, 2.5)
    """
    entries = []
    for values in table.tolist():  # one conversion for the table: a few rows of plain floats
        reason = int(values[0])
        if reason == NOT_CHOSEN:
            continue
        first = int(values[1])
        entry: dict[str, Any] = {"group": keys.name(first, values[-1]), "reason": REASONS[reason]}
        if slice_of is not None:
            entry["slice"] = slice_of[first]  # the slice of the group's first sample
        for (name, whole), value in zip(_ENTRY_FIELDS, values[2:]):
            entry[name] = int(value) if whole else value
        entries.append(entry)
    return entries


#: The table's columns after ``reason`` and ``first_sample``, and whether each is a whole number.
_ENTRY_FIELDS = tuple((name, name == "size" or name.endswith(("_count", "_samples"))) for name in EXEMPLAR_FIELDS[2:])
assert EXEMPLAR_FIELDS[:2] == ("reason", "first_sample")


def worst_first(entries: Sequence[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """The ``k`` worst of a step's exemplars (calls and ranks merged), ranked as each call ranked its own."""

    def badness(entry: dict[str, Any]) -> tuple[float, float, float]:
        nonfinite = (entry["reward_nan_count"] + entry["reward_inf_count"] + entry["reward_function_nonfinite_count"]
                     + entry["advantage_nonfinite_samples"])
        peak = entry["advantage_abs_max"]
        return REASONS.index(entry["reason"]), -nonfinite, -(peak if peak == peak else -1.0)

    return sorted(entries, key=badness)[:k]


def gather_ranks(local: StepParts) -> StepParts | None:
    """Every rank's parts merged on rank 0 (``None`` on the others); ``local`` without torch.distributed.

    One ``gather_object`` per step (a size exchange, then the gather).
    """
    distributed = torch.distributed
    if not (distributed.is_available() and distributed.is_initialized()):
        return local
    gathered = [None] * distributed.get_world_size() if distributed.get_rank() == 0 else None
    distributed.gather_object(local, gathered, dst=0)
    if gathered is None:
        return None
    merged = StepParts()
    for parts in gathered:
        merged.merge(parts)  # ranks in order
    return merged


def summaries_of(
    step: StepParts, histogram_stages: Sequence[str] = ()
) -> tuple[dict[str, dict[str, float]], dict[str, Histogram]]:
    """Each stage's statistics, and the histograms of ``histogram_stages`` (read from the same sketches)."""
    summaries, histograms = {}, {}
    for stage, parts in step.stages.items():
        if stage in histogram_stages:
            summaries[stage], histogram = summarize_with_histogram(parts)
            if histogram is not None:
                histograms[stage] = histogram
        else:
            summaries[stage] = summarize(parts)
    return summaries, histograms


def record_problems(summaries: dict[str, dict[str, float]], step: StepParts) -> list[Problem]:
    """Problems only the whole step shows (a mask that selected nothing)."""
    post = summaries.get("post_norm")
    if post is None or post["count"] > 0:
        return []
    entries = sum(p.arrays[0].size if p.kind == "exact" else 1 for p in step.stages["post_norm"])
    if entries == 0:
        return []
    return [Problem("empty_mask", "the mask selects no position: post-normalization statistics are empty")]


def assemble(summaries: dict[str, dict[str, float]], step: StepParts,
             reward_range: tuple[float, float] | None, verdict: Verdict | None = None) -> dict[str, float]:
    """The record's metrics, in their documented order (advmon's own counters are added by the monitor).

    ``verdict`` is the step's normalization (:func:`advmon.normalization.judge`, by default judged here).
    """
    if verdict is None:
        verdict = judge(step.normalizations, step.bound_evidence, summaries, reward_range)
    metrics = stage_metrics("rewards", summaries.get("rewards", {}), REWARD_KEYS)
    functions = sorted(stage for stage in summaries if stage.startswith("rewards/"))
    for stage in functions:  # per reward function (component): rewards/<name>/...
        metrics.update(stage_metrics(stage, summaries[stage], REWARD_KEYS))
    extra_stages = sorted(set(summaries) - set(CORE_STAGES) - {"rewards", *functions})
    for stage in (*CORE_STAGES, *extra_stages):
        metrics.update(stage_metrics(f"advantages/{stage}", summaries.get(stage, {})))
    metrics["advantages/bound_ratio"] = verdict.ratio
    totals = None if step.group_totals is None else step.group_totals.tolist()
    # The G of the group bound G/sqrt(G-1), where the step was judged by it.
    bound_size = totals[MAX_SIZE] if totals is not None and verdict.bound_kind in _GROUP_STD_KINDS else 0.0
    metrics.update(group_metrics(totals, reward_range, bound_size))
    metrics.update(step.estimator_metrics)
    for name in sorted(step.slices):
        metrics.update(slice_metrics(name, step.slices[name]))
    return metrics


_GROUP_STD_KINDS = ("group_std", "group_loo_std")
_GROUP_KINDS = ("group_std", "group_loo_std", "group_mean", "gpg")


def judged_exemplars(entries: Sequence[dict[str, Any]], verdict: Verdict, factor: float) -> list[dict[str, Any]]:
    """The step's exemplars with each group's ``advantage_bound_ratio`` (and whether it is ``beyond_bound``) under
    the step's kind, where its calls could not rank them so: the kind was inferred, or its bound is the
    step's (``batch``, ``none``). A declared group kind's calls ranked them already (only they saw which of
    NeMo-RL's leave-one-out samples were left undivided)."""
    if not entries or verdict.source == "declared" and verdict.kind in _GROUP_KINDS:
        return list(entries)  # every call ranked its groups under this kind already
    columns = ("advantage_abs_max", "size", "reward_finite_count", "reward_min", "reward_max")
    values = np.array([[entry[column] for column in columns] for entry in entries], dtype=np.float64)
    ratios = verdict.group_ratios(*values.T).tolist()  # one NumPy pass for the step's few exemplars
    judged = []
    for entry, ratio in zip(entries, ratios):
        entry = {**entry, "advantage_bound_ratio": ratio}
        if entry["reason"] in ("beyond_bound", "largest_abs_advantage"):
            entry["reason"] = "beyond_bound" if ratio > factor else "largest_abs_advantage"
        judged.append(entry)
    return judged


def combined_source(pre_norm_sources: Sequence[str | None]) -> str | None:
    """``tap``/``derived`` when the step's calls agree, ``mixed`` when not, ``None`` without any."""
    sources = set(pre_norm_sources) - {None}
    if not sources:
        return None
    return sources.pop() if len(sources) == 1 else "mixed"

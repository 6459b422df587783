"""Per-slice statistics: the same record, split by a per-sample label (data source, task, language...).

:class:`SliceIndex` turns labels into slot numbers on the host, a run at a time,
with bounded cardinality: the first ``max_slices`` distinct labels keep their
name, later ones are folded into ``other`` and counted. :func:`slice_table` sums
a call's rewards, groups and advantages per slot in NumPy, on the host: on a
device the call's ``[B]``-sized vectors (rewards, the advantages' row sums) cross
in the record's one transfer first (:func:`advmon.observation.finish_on_host`).

Example:
    >>> index = SliceIndex(max_slices=2)
    >>> index.ids(["gsm8k", "math", "gsm8k", "code"]).tolist(), index.names, index.folded
    ([0, 1, 0, 2], ['gsm8k', 'math', 'other'], 1)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from advmon.stats.devices import host_float64
from advmon.stats.exemplars import HostSegments
from advmon.stats.rows import RowSummary

__all__ = ["OTHER", "SLICE_FIELDS", "SliceIndex", "slice_name", "slice_table"]

#: The slice that labels beyond ``max_slices`` are folded into.
OTHER = "other"
#: Columns of :func:`slice_table`.
SLICE_FIELDS = (
    "samples",
    "reward_finite_count",
    "reward_sum",
    "reward_nan_count",
    "reward_inf_count",
    "reward_function_nonfinite",
    "groups_comparable",
    "groups_zero_std",
    "advantage_count",
    "advantage_sum",
    "advantage_abs_max",
)
_SLICE_COLUMN = {name: i for i, name in enumerate(SLICE_FIELDS)}


def slice_name(label: Any) -> str:
    """A label as a record key's path element: text, with ``/`` and whitespace made ``_``.

    Example:
        >>> slice_name(b"openai/gsm8k"), slice_name(np.str_("math lvl5")), slice_name(3)
        ('openai_gsm8k', 'math_lvl5', '3')
    """
    if isinstance(label, bytes):
        label = label.decode(errors="replace")
    elif isinstance(label, np.generic):
        label = label.item()
    text = "_".join(str(label).replace("/", "_").split())
    return text or "_"


class SliceIndex:
    """A run's slice names and their slots; the last slot is :data:`OTHER`.

    Args:
        max_slices: distinct labels that keep their own name (>= 1).
    """

    def __init__(self, max_slices: int = 16) -> None:
        self.max_slices = max_slices
        self._slots: dict[str, int] = {}
        self._folded: set[str] = set()
        self._known: dict[str, int] = {}  #: text labels already given a slot (below 256: one byte each)

    @property
    def slots(self) -> int:
        """Slot count of every table: ``max_slices`` names and :data:`OTHER`."""
        return self.max_slices + 1

    @property
    def names(self) -> list[str]:
        """The named slices in slot order, then :data:`OTHER` once a label was folded."""
        return [*self._slots, *([OTHER] if self._folded else [])]

    @property
    def folded(self) -> int:
        """Distinct labels folded into :data:`OTHER` so far in this run."""
        return len(self._folded)

    def ids(self, labels: Sequence[Any]) -> np.ndarray:
        """Each sample's slot (int64); new labels take a name while there is room (in order of first appearance)."""
        if isinstance(labels, np.ndarray):
            labels = labels.tolist()
        try:
            # Labels seen before (text, the common case) are looked up in C, without a Python loop, and
            # their slots made one byte each by bytes() (np.array of 4,096 Python ints costs twice as much).
            if len(labels) > 1:
                found = operator.itemgetter(*labels)(self._known)
            else:  # itemgetter of one key returns the value, not a tuple
                found = tuple(map(self._known.__getitem__, labels))
            return np.frombuffer(bytes(found), dtype=np.uint8).astype(np.int64)
        except (KeyError, TypeError):
            pass
        try:
            slot_of = {label: self._slot(label) for label in dict.fromkeys(labels)}  # each distinct label once
        except TypeError:  # unhashable labels: named one by one
            return np.array([self._slot(label) for label in labels], dtype=np.int64)
        return np.array([slot_of[label] for label in labels], dtype=np.int64)

    def _slot(self, label: Any) -> int:
        name = slice_name(label)
        slot = self._slots.get(name)
        if slot is None:
            if len(self._slots) < self.max_slices:
                slot = self._slots[name] = len(self._slots)
            else:
                self._folded.add(name)
                slot = self.max_slices
        if isinstance(label, str) and self.slots <= 256:
            # Only text is remembered as given: 1, 1.0 and True are equal keys with different names.
            self._known[label] = slot
        return slot

    def slot_names(self) -> list[str | None]:
        """The slice each slot stands for (``None``: no label has taken it yet)."""
        named: list[str | None] = [*self._slots]
        return named + [None] * (self.max_slices - len(named)) + [OTHER]


def slice_table(
    slots: torch.Tensor,
    count: int,
    rewards: torch.Tensor | None,
    segments: HostSegments | None,
    rows: RowSummary | None,
    function_nonfinite: torch.Tensor | None = None,
) -> torch.Tensor:
    """A call's sums per slice as a ``[count, len(SLICE_FIELDS)]`` float64 table, from host data (CPU tensors).

    ``slots`` holds each sample's slot in ``[0, count)``; ``rewards`` are
    per sequence; ``segments`` are the call's groups (a group counts in the slice
    of its first sample); ``rows`` the post-norm advantages' per-sample sums
    (:func:`~advmon.stats.rows.row_summaries` with ``sums=True``);
    ``function_nonfinite`` the reward functions' NaN and Inf scores per sample.
    What is missing is ``nan`` (no function scores: 0).

    Example:
        >>> table = slice_table(torch.tensor([0, 1, 0]), 2, torch.tensor([1.0, float("nan"), 3.0]), None, None)
        >>> table[:, SLICE_FIELDS.index("reward_sum")].tolist(), table[:, SLICE_FIELDS.index("reward_nan_count")].tolist()
        ([4.0, 0.0], [0.0, 1.0])
    """
    # The table is filled in place, column by column, with as few NumPy calls as the common case allows (no
    # NaN or Inf reward: the finite count is the sample count): each costs several microseconds once the
    # mask's pass has emptied the caches; torch's per-op overhead would outweigh a few thousand samples.
    slot = slots.numpy()
    table = np.empty((count, len(SLICE_FIELDS)))
    column = _SLICE_COLUMN

    def summed(weights: np.ndarray | None = None) -> np.ndarray:
        return np.bincount(slot, weights, count)  # slots are below count: exactly count sums

    samples = table[:, column["samples"]] = summed()
    table[:, column["reward_function_nonfinite"]] = (
        0.0 if function_nonfinite is None else summed(host_float64(function_nonfinite)))
    if rewards is None:
        table[:, column["reward_finite_count"] : column["reward_inf_count"] + 1] = np.nan
    else:
        r = host_float64(rewards)
        # The group values found every reward finite (their finite counts are their sizes), or a NaN
        # or Inf makes the sum non-finite (an overflow too: then exactly below).
        known = segments is not None and segments.groups.finite is segments.groups.size
        if known or math.isfinite(np.add.reduce(r)):
            table[:, column["reward_finite_count"]] = samples
            table[:, column["reward_sum"]] = summed(r)
            table[:, column["reward_nan_count"] : column["reward_inf_count"] + 1] = 0.0
        else:
            finite, nan = np.isfinite(r), np.isnan(r)
            table[:, column["reward_finite_count"]] = summed(finite.astype(np.float64))
            table[:, column["reward_sum"]] = summed(np.where(finite, r, 0.0))
            table[:, column["reward_nan_count"]] = summed(nan.astype(np.float64))
            table[:, column["reward_inf_count"]] = summed((~finite & ~nan).astype(np.float64))
    if segments is None:
        table[:, column["groups_comparable"] : column["groups_zero_std"] + 1] = np.nan
    else:
        groups = segments.groups  # every slot is a group on the host
        finite_count, low, high = groups.finite, groups.low, groups.high
        group_slot = slot[segments.first]
        comparable = finite_count >= 2
        table[:, column["groups_comparable"]] = np.bincount(group_slot, comparable, count)
        table[:, column["groups_zero_std"]] = np.bincount(group_slot, comparable & (low == high), count)
    if rows is None or rows.total is None:
        table[:, column["advantage_count"] : column["advantage_abs_max"] + 1] = np.nan
    else:
        peak = table[:, column["advantage_abs_max"]]
        peak.fill(-np.inf)
        np.maximum.at(peak, slot, host_float64(rows.abs_max))
        peak[peak == -np.inf] = np.nan  # no finite advantage in the slice
        table[:, column["advantage_count"]] = summed(host_float64(rows.count))
        table[:, column["advantage_sum"]] = summed(host_float64(rows.total))
    return torch.from_numpy(table)

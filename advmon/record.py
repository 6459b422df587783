"""The record: what advmon knows about one training step, and its metric keys.

A record is plain data (floats, no tensors) that every sink receives. Its keys
are the contract that sinks, dashboards and alerts rely on:

* ``rewards/{mean,std,min,max,count,nan_count,inf_count}`` (per sequence);
* ``advantages/pre_norm/{...}`` and ``advantages/post_norm/{...}`` with
  :data:`VALUE_KEYS`, and ``advantages/bound_ratio``: the step's
  |A| over what its normalization allows (:mod:`advmon.normalization`);
* ``groups/{count,singleton_count,comparable_count,zero_std_count,zero_std_fraction,nonfinite_count,max_size,bound_size}``
  and, with a reward range, ``groups/{all_low_fraction,all_high_fraction}``;
* ``estimator/<name>`` for metrics the estimator reports itself;
* ``advmon/internal_errors``: problems advmon met so far in this run;
* with slice labels, ``slices/<label>/...`` (:data:`SLICE_KEYS`) for each slice
  seen in the step, and ``slices/folded_labels``.

Beside the metrics, ``exemplars`` lists the step's worst prompt groups
(``Monitor(exemplars=k)``; docs/drilldown.md), worst first, and ``histograms``
holds the pre- and post-norm advantages' distributions (``Monitor(histograms=...)``;
:class:`Histogram`, made by :mod:`advmon.stats.histograms`).

Unavailable values are ``nan`` in memory and ``null`` in JSON. What a record holds
(its keys, its histogram type) is defined here, in plain Python: the statistics
engine imports it to write records, and every reader (``advmon report``,
``compare``, ``summary``, :mod:`advmon.runs`) reads records without the engine or torch.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EXEMPLAR_COLUMNS",
    "GROUP_COUNT_FIELDS",
    "PERCENTILES",
    "REWARD_KEYS",
    "SLICE_KEYS",
    "TROUBLE_REASONS",
    "VALUE_KEYS",
    "ExemplarSchedule",
    "Histogram",
    "Record",
    "abs_max",
    "exemplar_rows",
    "group_metrics",
    "slice_metrics",
    "stage_metrics",
]

#: The percentiles a stage reports: (key, quantile), NumPy's linear definition.
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p01", 0.01),
    ("p10", 0.10),
    ("p50", 0.50),
    ("p90", 0.90),
    ("p99", 0.99),
)
#: A stage's statistics (``advantages/pre_norm/<key>``, ``advantages/post_norm/<key>``, slices').
VALUE_KEYS: tuple[str, ...] = (
    "mean",
    "std",
    "min",
    "max",
    "abs_mean",
    "count",
    "nan_count",
    "inf_count",
) + tuple(name for name, _ in PERCENTILES)
REWARD_KEYS = ("mean", "std", "min", "max", "count", "nan_count", "inf_count")
#: A call's group counts, in the order the engine sums them across calls (``max_size`` by ``max``).
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
_FIELD = {name: i for i, name in enumerate(GROUP_COUNT_FIELDS)}


@dataclass(frozen=True)
class Histogram:
    """Counts of finite values in bins ``[edges[i], edges[i + 1])``, ``edges`` increasing.

    Example:
        >>> h = Histogram((0.0, 0.5, 1.0), (3.0, 1.0))
        >>> h.total, h.to_dict(), Histogram.from_dict(h.to_dict()) == h
        (4.0, {'edges': [0.0, 0.5, 1.0], 'counts': [3, 1]}, True)
    """

    edges: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    def to_dict(self) -> dict[str, Any]:
        """Compact JSON: the edges, and whole counts as integers."""
        return {"edges": list(self.edges), "counts": [int(c) if float(c).is_integer() else c for c in self.counts]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Histogram:
        return cls(tuple(float(e) for e in data["edges"]), tuple(float(c) for c in data["counts"]))


@dataclass(frozen=True)
class Record:
    """One step's metrics, as sinks receive it.

    Example:
        >>> r = Record("run-a", 3, 1700000000.0, "my.estimator", "derived", {"rewards/mean": float("nan")})
        >>> r.to_json()
        '{"run": "run-a", "step": 3, "time": 1700000000.0, "estimator": "my.estimator", "pre_norm_source": "derived", "metrics": {"rewards/mean": null}}'
        >>> Record.from_json(r.to_json()).step
        3
    """

    run: str
    step: int
    time: float
    estimator: str
    pre_norm_source: str | None
    metrics: dict[str, float] = field(default_factory=dict)
    #: The step's worst groups, worst first: plain dicts (``group``, ``reason``, ``size``, rewards', advantages' values).
    exemplars: list[dict[str, Any]] = field(default_factory=list)
    #: The distribution of each stage's finite values (``pre_norm``, ``post_norm``), at most 64 bins.
    histograms: dict[str, Histogram] = field(default_factory=dict)
    #: How the step's advantages were normalized (:mod:`advmon.normalization`): a kind, ``unknown`` or ``mixed``;
    #: whether it was ``declared`` or ``inferred``; and what the data look like. ``None`` without advantages.
    normalization: str | None = None
    normalization_source: str | None = None
    normalization_observed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; NaN and infinities become ``None``. ``exemplars``, ``histograms`` and the
        ``normalization`` fields appear when there are any (a histogram as its edges and counts)."""
        data = {
            "run": self.run,
            "step": self.step,
            "time": self.time,
            "estimator": self.estimator,
            "pre_norm_source": self.pre_norm_source,
            "metrics": {key: _json_number(value) for key, value in self.metrics.items()},
        }
        if self.normalization is not None:
            data["normalization"] = self.normalization
            data["normalization_source"] = self.normalization_source
            data["normalization_observed"] = self.normalization_observed
        if self.exemplars:
            data["exemplars"] = [
                {key: _json_number(value) if isinstance(value, float) else value for key, value in entry.items()}
                for entry in self.exemplars
            ]
        if self.histograms:
            data["histograms"] = {stage: histogram.to_dict() for stage, histogram in self.histograms.items()}
        return data

    def to_json(self) -> str:
        """One line of JSON (strict: no NaN literals)."""
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, line: str | Mapping[str, Any]) -> Record:
        """Parse what :meth:`to_json` wrote; ``null`` metrics come back as ``nan``."""
        data = json.loads(line) if isinstance(line, str) else line
        metrics = {
            key: value if type(value) is float else math.nan if value is None else float(value)
            for key, value in data["metrics"].items()
        }
        return cls(
            run=str(data["run"]),
            step=int(data["step"]),
            time=float(data["time"]),
            estimator=str(data.get("estimator", "")),
            pre_norm_source=data.get("pre_norm_source"),
            metrics=metrics,
            exemplars=[
                {key: math.nan if value is None else value for key, value in entry.items()}
                for entry in data.get("exemplars") or []
            ],
            histograms={stage: Histogram.from_dict(h) for stage, h in (data.get("histograms") or {}).items()},
            normalization=data.get("normalization"),
            normalization_source=data.get("normalization_source"),
            normalization_observed=data.get("normalization_observed"),
        )


def _json_number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def stage_metrics(prefix: str, summary: Mapping[str, float], keys: tuple[str, ...] = VALUE_KEYS) -> dict[str, float]:
    """``{prefix/key: value}`` for the given statistics (``nan`` where missing)."""
    return {f"{prefix}/{key}": float(summary.get(key, math.nan)) for key in keys}


#: Stages whose distributions a record carries (``Monitor(histograms=True)``).
HISTOGRAM_STAGES = ("pre_norm", "post_norm")


def histogram_key(stage: str) -> str:
    """Where sinks that draw distributions (TensorBoard, W&B) put a stage's histogram.

    Example:
        >>> histogram_key("post_norm")
        'histograms/advantages/post_norm'
    """
    return f"histograms/advantages/{stage}"


def group_metrics(
    totals: list[float] | None, reward_range: tuple[float, float] | None, bound_size: float = math.nan
) -> dict[str, float]:
    """Group metrics from :data:`GROUP_COUNT_FIELDS` totals summed over a step's calls.

    ``bound_size`` is the ``G`` of the group bound ``G / sqrt(G - 1)`` where the step was judged by it
    (its largest group; 0 when the step's normalization has another bound).
    """
    if totals is None:
        totals = [math.nan] * len(GROUP_COUNT_FIELDS)
        bound_size = math.nan
    comparable = totals[_FIELD["with_two_finite"]]
    metrics = {
        "groups/count": totals[_FIELD["groups"]],
        "groups/singleton_count": totals[_FIELD["singletons"]],
        # The fractions' denominator: a fleet's ratio is a sum of counts over a sum of these, not a mean of ratios.
        "groups/comparable_count": comparable,
        "groups/zero_std_count": totals[_FIELD["zero_std"]],
        "groups/zero_std_fraction": _ratio(totals[_FIELD["zero_std"]], comparable),
        "groups/nonfinite_count": totals[_FIELD["nonfinite"]],
        "groups/max_size": totals[_FIELD["max_size"]],
        "groups/bound_size": bound_size,
    }
    if reward_range is not None:
        metrics["groups/all_low_fraction"] = _ratio(totals[_FIELD["all_low"]], comparable)
        metrics["groups/all_high_fraction"] = _ratio(totals[_FIELD["all_high"]], comparable)
    return metrics


#: Columns of an exemplar table (W&B) and their order, from ``Record.exemplars`` entries.
EXEMPLAR_COLUMNS = (
    "step", "group", "reason", "slice", "size",
    "reward_min", "reward_max", "reward_mean", "reward_finite_count", "reward_nan_count", "reward_inf_count",
    "reward_function_nonfinite_count", "advantage_abs_max", "advantage_bound_ratio", "advantage_nonfinite_samples",
)
#: Exemplar reasons that mean trouble (the rest only rank the largest |advantage|).
TROUBLE_REASONS = ("nonfinite_rewards", "nonfinite_reward_functions", "nonfinite_advantages", "beyond_bound")


class ExemplarSchedule:
    """When a sink stores a record's exemplars: at every step that names a troubled group, and every ``every`` steps.

    A step's exemplars are up to ``k`` small dicts; a W&B table or an MLflow artifact
    per step would still grow without bound over a long run, so quiet steps are
    sampled.

    Example:
        >>> schedule = ExemplarSchedule(every=10)
        >>> quiet = [{"reason": "largest_abs_advantage"}]
        >>> [schedule.due(Record("r", s, 0.0, "e", None, {}, quiet)) for s in (0, 1, 10, 11)]
        [True, False, True, False]
        >>> schedule.due(Record("r", 12, 0.0, "e", None, {}, [{"reason": "nonfinite_rewards"}]))
        True
    """

    def __init__(self, every: int = 100) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"exemplars_every must be an int >= 1, got {every!r}")
        self.every = every
        self._next_quiet: int | None = None

    def due(self, record: Record) -> bool:
        if not record.exemplars:
            return False
        if any(entry.get("reason") in TROUBLE_REASONS for entry in record.exemplars):
            return True
        if self._next_quiet is None or record.step >= self._next_quiet:
            self._next_quiet = record.step + self.every
            return True
        return False


def exemplar_rows(record: Record) -> list[list[Any]]:
    """The record's exemplars as table rows in :data:`EXEMPLAR_COLUMNS` order (``None`` for what is not a number)."""
    rows = []
    for entry in record.exemplars:
        row = [record.step] + [entry.get(column) for column in EXEMPLAR_COLUMNS[1:]]
        rows.append([None if isinstance(v, float) and not math.isfinite(v) else v for v in row])
    return rows


#: A slice's keys under ``slices/<label>/``.
SLICE_KEYS = (
    "rewards/count",
    "rewards/mean",
    "rewards/nan_count",
    "rewards/inf_count",
    "rewards/function_nonfinite_count",
    "groups/comparable_count",
    "groups/zero_std_count",
    "groups/zero_std_fraction",
    "advantages/post_norm/count",
    "advantages/post_norm/mean",
    "advantages/post_norm/abs_max",
)


def slice_metrics(name: str, sums: Any) -> dict[str, float]:
    """A slice's keys from its merged sums (in :data:`advmon.stats.slices.SLICE_FIELDS` order).

    Example:
        >>> sums = [4, 3, 1.5, 1, 0, 0, 2, 1, 40, 8.0, 2.5]
        >>> m = slice_metrics("gsm8k", sums)
        >>> m["slices/gsm8k/rewards/mean"], m["slices/gsm8k/groups/zero_std_fraction"], m["slices/gsm8k/advantages/post_norm/mean"]
        (0.5, 0.5, 0.2)
    """
    (samples, finite, reward_sum, nan, inf, functions, comparable, zero_std, count, total, abs_max) = (
        sums.tolist() if hasattr(sums, "tolist") else [float(v) for v in sums])
    values = (
        samples,
        _ratio(reward_sum, finite),
        nan,
        inf,
        functions,
        comparable,
        zero_std,
        _ratio(zero_std, comparable),
        count,
        _ratio(total, count),
        abs_max,
    )
    return dict(zip(_slice_keys(name), values))


@functools.lru_cache(maxsize=1024)
def _slice_keys(name: str) -> tuple[str, ...]:
    """A slice's record keys (a run has few slices, and each step names them again)."""
    return tuple(f"slices/{name}/{key}" for key in SLICE_KEYS)


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else math.nan


def abs_max(metrics: Mapping[str, float], stage: str) -> float:
    """``max(|min|, |max|)`` of a stage's advantages; ``nan`` when neither is known.

    Example:
        >>> abs_max({"advantages/post_norm/min": -3.0, "advantages/post_norm/max": 2.0}, "post_norm")
        3.0
    """
    ends = [abs(metrics.get(f"advantages/{stage}/{end}", math.nan)) for end in ("min", "max")]
    finite = [e for e in ends if not math.isnan(e)]
    return max(finite) if finite else math.nan

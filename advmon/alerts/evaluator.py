"""The catalog evaluated over a stream of records, as Prometheus would over scrapes.

:class:`AlertEvaluator` keeps, per run, the trailing window of records the rules
need and, per series (rule, run, extra labels), how many consecutive records its
condition has held. A rule fires on the ``for_records``-th consecutive record and
resolves on the first record where the condition no longer holds (or where the
series is gone), as a Prometheus alert with ``for: (k-1) x interval`` does when
one record arrives per interval.

Example:
    >>> from advmon.record import Record
    >>> evaluator = AlertEvaluator()
    >>> events = []
    >>> for step, nan in enumerate([0, 2, 0]):
    ...     events += evaluator.observe(Record("r", step, 0.0, "e", None, {"rewards/nan_count": float(nan)}))
    >>> [(e.kind, e.alert, e.step, e.value) for e in events]
    [('firing', 'AdvmonNonFiniteRewards', 1, 2.0), ('resolved', 'AdvmonNonFiniteRewards', 2, 2.0)]
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from advmon.rules import CATALOG, RecordLike, Rule, Thresholds, Window, where

__all__ = ["AlertEvaluator", "AlertEvent", "Occurrence", "evaluate_records"]


@dataclass(frozen=True)
class AlertEvent:
    """An alert changing state: ``firing`` or ``resolved`` at a step."""

    kind: Literal["firing", "resolved"]
    alert: str
    severity: str
    run: str
    step: int
    value: float  # at firing (also carried by the resolved event)
    labels: tuple[tuple[str, str], ...]
    summary: str
    description: str  # as worded at firing
    where: str = ""  # the groups and slices the firing step points at (advmon.rules.where)
    time: float = 0.0  # Unix time of the record it fired on

    @property
    def key(self) -> tuple[str, str, tuple[tuple[str, str], ...]]:
        return (self.alert, self.run, self.labels)


@dataclass
class Occurrence:
    """One alert from firing to resolving (``resolved_step`` ``None`` while it fires)."""

    run: str
    alert: str
    severity: str
    fired_step: int
    resolved_step: int | None
    value: float
    labels: tuple[tuple[str, str], ...] = ()
    description: str = ""
    where: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form ``advmon alerts check --format json`` prints."""
        value = self.value if self.value == self.value and abs(self.value) != float("inf") else None
        return {
            "run": self.run,
            "alert": self.alert,
            "severity": self.severity,
            "fired_step": self.fired_step,
            "resolved_step": self.resolved_step,
            "value": value,
            "labels": dict(self.labels),
            "where": self.where,
        }


@dataclass
class _SeriesState:
    held: int = 0
    firing: AlertEvent | None = None


@dataclass
class _RunState:
    window: deque[RecordLike]
    # rule name -> labels -> state
    series: dict[str, dict[tuple[tuple[str, str], ...], _SeriesState]] = field(default_factory=dict)
    columns: dict[str, deque[float]] = field(default_factory=dict)  # key -> recent values, for medians


class AlertEvaluator:
    """Evaluates the catalog over records of any number of runs.

    Args:
        thresholds: the catalog's thresholds (defaults, or ``Thresholds.with_overrides``).
        rules: the rules to evaluate (default: every rule that can run in-process).
    """

    def __init__(self, thresholds: Thresholds | None = None, rules: Iterable[Rule] | None = None) -> None:
        self.thresholds = thresholds if thresholds is not None else Thresholds.with_overrides()
        chosen = CATALOG if rules is None else tuple(rules)
        self.rules = tuple(rule for rule in chosen if rule.evaluate is not None)
        # The longest history any rule reads: the trailing window, and one record back for counters.
        self._depth = max(2, self.thresholds.records("trailing_records"))
        self._runs: dict[str, _RunState] = {}

    def observe(self, record: RecordLike) -> list[AlertEvent]:
        """Add one record (in emission order); return the alerts that fired or resolved on it."""
        state = self._runs.get(record.run)
        if state is None:
            state = self._runs[record.run] = _RunState(deque(maxlen=self._depth))
        state.window.append(record)
        for key, column in state.columns.items():
            if isinstance(key, str):  # (the window also caches key lists there)
                column.append(_value(record, key))
        window = Window(state.window, state.columns)  # one copy per record, shared by every rule
        events: list[AlertEvent] = []
        for rule in self.rules:
            events.extend(self._apply(rule, state, record, window))
        return events

    def _apply(self, rule: Rule, state: _RunState, record: RecordLike, window: Window) -> list[AlertEvent]:
        findings = rule.evaluate(window, self.thresholds)  # type: ignore[misc]
        events = []
        seen = set()
        mine = state.series.setdefault(rule.name, {})
        for finding in findings:
            seen.add(finding.labels)
            series = mine.get(finding.labels)
            if series is None:
                series = mine[finding.labels] = _SeriesState()
            if finding.active:
                series.held += 1
                if series.firing is None and series.held >= rule.for_records:
                    series.firing = self._event("firing", rule, record, finding.value, finding.labels)
                    events.append(series.firing)
            else:
                series.held = 0
                events.extend(self._resolve(series, record))
        if len(mine) > len(seen):
            for labels, series in mine.items():
                if labels not in seen:  # the series is gone: Prometheus resolves it
                    series.held = 0
                    events.extend(self._resolve(series, record))
        return events

    def _resolve(self, series: _SeriesState, record: RecordLike) -> list[AlertEvent]:
        if series.firing is None:
            return []
        fired, series.firing = series.firing, None
        return [
            AlertEvent(
                "resolved", fired.alert, fired.severity, fired.run, record.step, fired.value,
                fired.labels, fired.summary, fired.description, fired.where, fired.time,
            )
        ]

    def _event(self, kind: Literal["firing", "resolved"], rule: Rule, record: RecordLike, value: float,
               labels: tuple[tuple[str, str], ...]) -> AlertEvent:
        description = rule.render_description(record.run, value, record.step, dict(labels), self.thresholds)
        return AlertEvent(kind, rule.name, rule.severity, record.run, record.step, value, labels, rule.summary, description,
                          where(rule.name, record, dict(labels)), float(getattr(record, "time", 0.0) or 0.0))


def _value(record: RecordLike, key: str) -> float:
    value = record.metrics.get(key)
    return math.nan if value is None else float(value)


def evaluate_records(records: Iterable[RecordLike], thresholds: Thresholds | None = None) -> list[Occurrence]:
    """Every alert occurrence over recorded runs, in the order they fired.

    Records are taken in the order given (the order they were emitted), each run
    on its own.
    """
    evaluator = AlertEvaluator(thresholds)
    open_occurrences: dict[Any, Occurrence] = {}
    occurrences: list[Occurrence] = []
    for record in records:
        for event in evaluator.observe(record):
            if event.kind == "firing":
                occurrence = Occurrence(
                    event.run, event.alert, event.severity, event.step, None, event.value, event.labels,
                    event.description, event.where,
                )
                open_occurrences[event.key] = occurrence
                occurrences.append(occurrence)
            else:
                open_occurrences.pop(event.key).resolved_step = event.step
    return occurrences


def firing_by_step(
    records: Sequence[RecordLike], thresholds: Thresholds | None = None, rules: Iterable[Rule] | None = None
) -> list[set[tuple[str, tuple]]]:
    """For each record, the set of ``(alert, labels)`` firing after it (for agreement tests)."""
    evaluator = AlertEvaluator(thresholds, rules)
    active: set[tuple[str, tuple]] = set()
    states = []
    for record in records:
        for event in evaluator.observe(record):
            key = (event.alert, event.labels)
            if event.kind == "firing":
                active.add(key)
            else:
                active.discard(key)
        states.append(set(active))
    return states

"""Stopping a run on an alert, opt-in: ``Monitor(..., stop_on="critical")``.

``stop_on`` names the alerts that stop a run: ``"critical"`` (every critical rule of
the catalog) or a list of alert names. The monitor evaluates just those rules over
each record right after the record is written, on the thread that ended the step
(about ten microseconds a record for the critical rules; no notifier is needed). When
one fires, the monitor first waits for its notifiers to have been handed the alert (at
most ``close_timeout`` seconds), then turns ``should_stop`` true. So whoever sees
``should_stop`` true, on any thread, finds the record in the JSONL file (written and
flushed with the record, before anything else) and the alert sent. With
``reduce="ranks"`` rank 0 decides and every rank learns it at the same step
(:func:`shared_reason`). :func:`until_stop` ends a framework's loop over its dataloader.

Example:
    >>> from advmon.record import Record
    >>> watch = StopWatch(stop_rules("critical"))
    >>> [watch.check(Record("r", step, 0.0, "e", None, {"rewards/nan_count": n})) for step, n in enumerate([0.0, 0.0])]
    [None, None]
    >>> watch.check(Record("r", 2, 0.0, "e", None, {"rewards/nan_count": 3.0})).alert
    'AdvmonNonFiniteRewards'
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal, Union

from advmon.alerts.evaluator import AlertEvaluator, AlertEvent
from advmon.errors import AdvmonConfigError
from advmon.record import Record
from advmon.rules import CATALOG, Rule, Thresholds

__all__ = ["StopOn", "StopWatch", "StoppingLoader", "stop_rules", "until_stop"]

#: What ``Monitor(stop_on=...)`` takes: ``None`` (never stop), ``"critical"``, or alert names.
StopOn = Union[None, Literal["critical"], Iterable[str]]


def stop_rules(stop_on: Any) -> tuple[Rule, ...]:
    """The catalog rules ``stop_on`` names (empty for ``None``).

    Raises:
        AdvmonConfigError: anything but ``None``, ``"critical"`` or a collection of alert names
            the monitor can evaluate in-process.

    Example:
        >>> [rule.name for rule in stop_rules(["AdvmonZeroStdGroupsHigh"])]
        ['AdvmonZeroStdGroupsHigh']
        >>> stop_rules("AdvmonZeroStdGroupsHigh")
        Traceback (most recent call last):
        ...
        advmon.errors.AdvmonConfigError: stop_on must be None, 'critical' or a list of alert names, got 'AdvmonZeroStdGroupsHigh' (one alert: stop_on=['AdvmonZeroStdGroupsHigh'])
    """
    if stop_on is None:
        return ()
    if stop_on == "critical":
        return tuple(rule for rule in CATALOG if rule.severity == "critical" and rule.evaluate is not None)
    if isinstance(stop_on, (str, bytes)) or not isinstance(stop_on, Iterable):
        hint = f" (one alert: stop_on=[{stop_on!r}])" if isinstance(stop_on, str) and _rule(stop_on) else ""
        raise AdvmonConfigError(f"stop_on must be None, 'critical' or a list of alert names, got {stop_on!r}{hint}")
    names = list(stop_on)
    if not names:
        raise AdvmonConfigError("stop_on is an empty list: name at least one alert, or pass None to never stop")
    rules: dict[str, Rule] = {}
    for name in names:
        rule = _rule(name)
        if rule is None:
            raise AdvmonConfigError(f"stop_on: unknown alert {name!r}; known: {', '.join(r.name for r in CATALOG)}")
        if rule.evaluate is None:
            raise AdvmonConfigError(f"stop_on: {name} is evaluated by Prometheus only (it watches for records that do "
                                    "not come), not in the training process")
        rules[rule.name] = rule
    return tuple(rules.values())


def _rule(name: Any) -> Rule | None:
    return next((rule for rule in CATALOG if rule.name == name), None)


class StopWatch:
    """The stopping rules evaluated over a monitor's records; the first firing is the reason to stop."""

    def __init__(self, rules: Iterable[Rule], thresholds: Thresholds | None = None) -> None:
        self.evaluator = AlertEvaluator(thresholds, rules)
        self.names = tuple(rule.name for rule in self.evaluator.rules)
        #: The alert that stops the run, once the monitor has delivered it (``None`` until then).
        self.reason: AlertEvent | None = None
        self._decided = False
        self._lock = threading.Lock()  # records of one monitor may end on several threads

    def check(self, record: Record) -> AlertEvent | None:
        """The stopping alert that fires on ``record``; ``None`` if none does, or a stop was decided already."""
        with self._lock:
            if self._decided:
                return None
            firing = next((e for e in self.evaluator.observe(record) if e.kind == "firing"), None)
            self._decided = firing is not None
            return firing


def notifies(sink: Any) -> bool:
    """Whether a sink sends alerts to people (the in-process :class:`~advmon.alerts.AlertSink`)."""
    from advmon.alerts.sink import AlertSink

    return isinstance(sink, AlertSink)


def shared_reason(reason: AlertEvent | None) -> AlertEvent | None:
    """Rank 0's reason to stop, on every rank (one broadcast; ``reason`` as it is without torch.distributed).

    With ``reduce="ranks"`` only rank 0 sees records: every rank must learn its decision at the
    same step, or the ranks that carry on wait forever in their next collective.
    """
    import torch.distributed as distributed

    if not (distributed.is_available() and distributed.is_initialized()):
        return reason
    box = [reason]
    distributed.broadcast_object_list(box, src=0)
    return box[0]


def until_stop(loader: Any, monitor: Any) -> StoppingLoader:
    """``loader``, ending once ``monitor.should_stop``: a framework's loop over it ends after the step that fired.

    For trainers that take one batch per step from their dataloader inside ``for epoch in
    range(...)`` (verl's ``RayPPOTrainer.fit``, SkyRL's ``RayPPOTrainer.train``): the next
    batch is asked for after the step that fired, is not taken, and every later epoch is
    empty. Before each batch the monitor emits the step that ended (``flush(timeout=0)``:
    a ``step_source`` monitor, verl's, would hold it until the next step's first call).
    Everything else (``len``, ``state_dict``, ``sampler``) is the loader's own.
    Not for loops that cycle their data without end (AReaL's ``cycle_dataloader``): an
    empty loader would make them spin.

    Example:
        >>> from advmon import Monitor
        >>> import torch
        >>> monitor = Monitor("doc", sinks=[], stop_on="critical")
        >>> for batch in until_stop([torch.tensor([1.0, 0.0]), torch.tensor([float("nan"), 1.0]),
        ...                          torch.tensor([1.0, 1.0])], monitor):
        ...     monitor.observe(rewards=batch)
        >>> monitor.last_record.step, monitor.stop_reason.step
        (1, 1)
    """
    return StoppingLoader(loader, monitor)


class StoppingLoader:
    """A dataloader that ends once its monitor asks to stop (:func:`until_stop`); the rest is the loader's."""

    def __init__(self, loader: Any, monitor: Any) -> None:
        self.loader = loader
        self.monitor = monitor

    def __iter__(self) -> Iterator[Any]:
        if self._stopping():
            return  # no new pass: it would reset a stateful loader's position, which a checkpoint saves
        batches = iter(self.loader)
        while not self._stopping():  # asked before a batch is taken, so none is lost to a checkpoint
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield batch

    def _stopping(self) -> bool:
        # The step that just ended is emitted first: a step_source monitor (verl's) would hold its
        # record until the next step's first call, and stop one step late. No wait for the sinks.
        self.monitor.flush(timeout=0)
        return bool(self.monitor.should_stop)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "monitor"):  # not set yet (a copy being made): no loop through __getattr__
            raise AttributeError(name)
        return getattr(self.loader, name)

"""The alert catalog inside the training process: a sink that evaluates and notifies.

:class:`AlertSink` is an ordinary asynchronous sink: the monitor hands it records
on a delivery thread (never the training thread), it runs the in-process
evaluator over them and sends firing and resolved messages to its notifiers.
Per rule and run it sends at most one firing message per ``min_interval``
seconds (a flapping alert does not flood the channel); a resolved message follows
every firing message that was sent. A notifier that fails keeps its messages for
the next attempt (the delivery retries with backoff) and counts as the sink's
error, like any sink.

Example:
    >>> from advmon.record import Record
    >>> class Print:
    ...     name = "print"
    ...     def send(self, message):
    ...         print(message.status, message.alert, message.step)
    >>> sink = AlertSink([Print()])
    >>> for step, nan in enumerate([0, 1, 0]):
    ...     sink.write(Record("r", step, 0.0, "e", None, {"rewards/nan_count": float(nan)}))
    firing AdvmonNonFiniteRewards 1
    resolved AdvmonNonFiniteRewards 2
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from advmon.alerts.evaluator import AlertEvaluator, AlertEvent
from advmon.alerts.notifiers import AlertMessage, Notifier
from advmon.alerts.runbooks import check_first
from advmon.rules import Thresholds, rule_named, runbook_link
from advmon.sinks.base import Sink

__all__ = ["AlertSink"]

_MAX_PENDING = 1000


class AlertSink(Sink):
    """Evaluate the catalog over a monitor's records and notify.

    Args:
        notifiers: objects with ``send(AlertMessage)`` (:class:`~advmon.alerts.notifiers.SlackNotifier`,
            :class:`~advmon.alerts.notifiers.WandbAlertNotifier`).
        thresholds: overrides of the catalog's thresholds, by name.
        min_interval: seconds between two firing messages of one rule and run.
        runbook_base, dashboard_url: where the runbooks page and the on-call board are hosted: links in every
            message (each message carries its runbook's "Check first" either way).
    """

    name = "alerts"
    synchronous = False
    #: Alerts are about now: a record this sink missed is not worth replaying later.
    replayable = False

    def __init__(
        self,
        notifiers: Sequence[Notifier],
        thresholds: Mapping[str, float] | Thresholds | None = None,
        *,
        min_interval: float = 600.0,
        runbook_base: str = "",
        dashboard_url: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifiers = list(notifiers)
        if isinstance(thresholds, Thresholds):
            self.thresholds = thresholds
        else:
            self.thresholds = Thresholds.with_overrides(thresholds)
        self.min_interval = float(min_interval)
        self.runbook_base = runbook_base
        self.dashboard_url = dashboard_url
        self.evaluator = AlertEvaluator(self.thresholds)
        self.suppressed = 0  # firing messages held back by the rate limit
        self._clock = clock
        self._last_sent: dict[Any, float] = {}
        self._announced: set[Any] = set()  # firing messages sent, awaiting their resolution
        self._pending: deque[tuple[Notifier, AlertMessage]] = deque(maxlen=_MAX_PENDING)
        self._last_record: Any = None
        self._lock = threading.Lock()
        if self.notifiers:
            self.name = "alerts-" + "-".join(getattr(n, "name", type(n).__name__.lower()) for n in self.notifiers)

    def write(self, record: Any) -> None:
        with self._lock:
            if record is not self._last_record:  # a retried write must not evaluate a record twice
                self._last_record = record
                for event in self.evaluator.observe(record):
                    self._queue(event)
            self._deliver()

    def _queue(self, event: AlertEvent) -> None:
        key = event.key
        if event.kind == "firing":
            now = self._clock()
            last = self._last_sent.get(key)
            if last is not None and now - last < self.min_interval:
                self.suppressed += 1
                return
            self._last_sent[key] = now
            self._announced.add(key)
        elif key in self._announced:
            self._announced.discard(key)
        else:
            return  # its firing message was held back: so is its resolution
        message = self._message(event)
        self._pending.extend((notifier, message) for notifier in self.notifiers)

    def _message(self, event: AlertEvent) -> AlertMessage:
        rule = rule_named(event.alert)
        return AlertMessage(
            status=event.kind,
            alert=event.alert,
            severity=event.severity,
            run=event.run,
            step=event.step,
            value=event.value,
            summary=event.summary,
            description=event.description,
            runbook_url=runbook_link(self.runbook_base, rule.name),
            dashboard_url=self.dashboard_url,
            where=event.where,
            time=event.time,
            check_first=check_first(rule.name),
        )

    def _deliver(self) -> None:
        failures: list[BaseException] = []
        for _ in range(len(self._pending)):
            notifier, message = self._pending.popleft()
            try:
                notifier.send(message)
            except Exception as exc:  # noqa: BLE001 - kept for the next attempt, reported below
                self._pending.append((notifier, message))
                failures.append(exc)
        if failures:
            raise failures[0]

    def __repr__(self) -> str:
        return f"AlertSink({self.notifiers!r})"

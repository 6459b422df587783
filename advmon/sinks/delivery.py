"""Deliver records to slow sinks off the training thread, losing nothing silently.

Each asynchronous sink gets a :class:`SinkWorker`: a bounded queue and a daemon
thread. The training thread only appends to the queue. A write that raises is
retried with exponential backoff; a record still not delivered is counted as a
sink error. When a queue is full the oldest record is dropped for that sink only
and counted. Nothing is lost for good: the JSONL file holds every record and
``advmon replay`` sends it anywhere later.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from advmon.record import Record
from advmon.sinks.base import SinkLike

__all__ = ["Delivery", "DeliveryPolicy", "SinkWorker", "attach_sink", "write_with_retries"]


@dataclass(frozen=True)
class DeliveryPolicy:
    """How hard to try: queue size per sink, retries, and backoff between them."""

    capacity: int = 1000
    retries: int = 3
    backoff_seconds: float = 0.2
    max_backoff_seconds: float = 5.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_seconds * 2**attempt, self.max_backoff_seconds)


#: Most records handed at once to a sink with ``write_batch`` (a backlog drains in few calls).
MAX_BATCH = 100


def write_with_retries(
    sink: SinkLike, record: Record, policy: DeliveryPolicy, stopping: Callable[[], bool] = lambda: False
) -> Exception | None:
    """Write one record, retrying with backoff; the last error, or ``None`` once written."""
    return _with_retries(lambda: sink.write(record), policy, stopping)


def _with_retries(write: Callable[[], None], policy: DeliveryPolicy, stopping: Callable[[], bool]) -> Exception | None:
    error: Exception | None = None
    for attempt in range(policy.retries + 1):
        try:
            write()
            return None
        except Exception as exc:  # noqa: BLE001 - any sink failure is retried, then reported
            error = exc
        if attempt < policy.retries and not stopping():
            time.sleep(policy.delay(attempt))
    return error


def attach_sink(sink: SinkLike, run: str, sink_names: list[str]) -> None:
    """Tell a sink its run id and its siblings' names, if it wants to know."""
    attach = getattr(sink, "attach", None)
    if callable(attach):
        attach(run=run, sink_names=sink_names)


class SinkWorker:
    """Feeds one sink from a bounded queue on its own daemon thread."""

    def __init__(
        self,
        sink: SinkLike,
        name: str,
        policy: DeliveryPolicy,
        on_failure: Callable[[str, str], None],
    ) -> None:
        self.sink = sink
        self.name = name
        self.policy = policy
        self._on_failure = on_failure  # (kind, message): the monitor warns and counts
        self._queue: deque[Record] = deque()
        self._condition = threading.Condition()
        self._in_flight = 0  # records handed to the sink and not finished yet
        self._stopping = False
        # A sink whose work is heavy Python (W&B's run.log) takes the GIL from the
        # training thread at every record; delivered in bursts, at most once per
        # ``delivery_interval`` seconds, it contends once per burst instead.
        self._interval = float(getattr(sink, "delivery_interval", 0.0) or 0.0)
        self._hurry = 0  # drains in progress: deliver now, do not wait for the interval
        self.errors = 0
        self.dropped = 0
        self.delivered = 0
        self._thread = threading.Thread(target=self._run, name=f"advmon-sink-{name}", daemon=True)
        self._thread.start()

    def put(self, record: Record) -> None:
        """Queue a record; never blocks. A full queue drops its oldest record."""
        self.make_room()
        self.append(record)

    def make_room(self) -> None:
        """Drop the oldest record if the queue is full, so the next one fits (and count it now)."""
        dropped = False
        with self._condition:
            if len(self._queue) >= self.policy.capacity:
                self._queue.popleft()
                self.dropped += 1
                dropped = True
        if dropped:
            self._on_failure(
                f"dropped:{self.name}",
                f"sink {self.name} is too slow: its queue of {self.policy.capacity} records is full, "
                "the oldest are dropped for it (counted in advmon/dropped_records/"
                f"{self.name}; the JSONL file keeps them for advmon replay)",
            )

    def append(self, record: Record) -> None:
        with self._condition:
            if len(self._queue) >= self.policy.capacity:  # another sender filled it meanwhile
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(record)
            self._condition.notify()

    def drain(self, timeout: float) -> int:
        """Wait until the queue is delivered or ``timeout`` passes; return what is left."""
        deadline = time.monotonic() + timeout
        with self._condition:
            self._hurry += 1
            self._condition.notify_all()
            try:
                while self._queue or self._in_flight:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._condition.wait(remaining)
                return len(self._queue) + self._in_flight
            finally:
                self._hurry -= 1

    def stop(self, timeout: float) -> int:
        """Drain, then end the thread; return the number of records not delivered."""
        left = self.drain(timeout)
        with self._condition:
            self._stopping = True
            undelivered = len(self._queue) + self._in_flight
            self._queue.clear()
            self._condition.notify_all()
        self._thread.join(timeout=0.1)
        return max(left, undelivered)

    def _report_safely(self, kind: str, message: str) -> None:
        # Warnings turned into errors (-W error) must not kill the delivery thread.
        try:
            self._on_failure(kind, message)
        except Exception:  # noqa: BLE001, S110 - the failure is counted either way
            pass

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._queue and not self._stopping:
                    self._condition.wait()
                if self._stopping:
                    return
                if self._interval:
                    self._gather_burst()
                # A sink that takes batches (MLflow) gets the whole backlog at once;
                # a sink delivered in bursts gets the burst, written record by record.
                size = MAX_BATCH if self._batches or self._interval else 1
                batch = [self._queue.popleft() for _ in range(min(size, len(self._queue)))]
                self._in_flight = len(batch)
            try:
                self._deliver(batch)
            finally:
                with self._condition:
                    self._in_flight = 0
                    self._condition.notify_all()

    def _gather_burst(self) -> None:
        """Wait (holding the condition) until a burst is due: the interval passed, a full
        batch is queued, or someone drains."""
        due = time.monotonic() + self._interval
        while len(self._queue) < MAX_BATCH and not self._hurry and not self._stopping:
            remaining = due - time.monotonic()
            if remaining <= 0:
                return
            self._condition.wait(remaining)

    @property
    def _batches(self) -> bool:
        return callable(getattr(self.sink, "write_batch", None))

    def _deliver(self, batch: list[Record]) -> None:
        if not self._batches and len(batch) > 1:
            for record in batch:
                self._deliver([record])
            return
        if self._batches:
            error = _with_retries(lambda: self.sink.write_batch(batch), self.policy, lambda: self._stopping)
        else:
            error = write_with_retries(self.sink, batch[0], self.policy, lambda: self._stopping)
        if error is None:
            self.delivered += len(batch)
            return
        self.errors += len(batch)
        steps = f"step {batch[0].step}" if len(batch) == 1 else f"steps {batch[0].step}-{batch[-1].step}"
        self._report_safely(
            f"sink:{self.name}",
            f"sink {self.name} failed to write {steps} after {self.policy.retries + 1} attempts: "
            f"{type(error).__name__}: {error} (counted in advmon/sink_errors/{self.name}; "
            "the JSONL file keeps the records for advmon replay)",
        )


class Delivery:
    """All of a monitor's sinks: synchronous ones written in place, the rest through workers.

    Sink failures never raise: they go to ``warn(kind, message)`` and are counted
    per sink in :meth:`counters` (``advmon/sink_errors/<sink>``,
    ``advmon/dropped_records/<sink>``).
    """

    def __init__(
        self, sinks: list[SinkLike], run: str, policy: DeliveryPolicy, warn: Callable[[str, str], None]
    ) -> None:
        self.sinks = list(sinks)
        self.names = _unique_names(sinks)
        self._warn = warn
        self._sync: list[tuple[SinkLike, str]] = []
        self._sync_errors: dict[str, int] = {}
        self.workers: list[SinkWorker] = []
        for sink, name in zip(sinks, self.names):
            attach_sink(sink, run, self.names)
            if getattr(sink, "synchronous", False):
                self._sync.append((sink, name))
                self._sync_errors[name] = 0
            else:
                self.workers.append(SinkWorker(sink, name, policy, warn))

    def send(self, record: Record) -> None:
        # Make room first, so the record carries the drops its own arrival causes.
        for worker in self.workers:
            worker.make_room()
        if self.workers:
            record.metrics.update({f"advmon/dropped_records/{w.name}": float(w.dropped) for w in self.workers})
        for worker in self.workers:
            # Cheap in-memory bookkeeping a queued sink does for every record, even one
            # its queue later drops (the Pushgateway's counters count every record).
            accept = getattr(worker.sink, "accept", None)
            if callable(accept):
                try:
                    accept(record)
                except Exception as exc:  # noqa: BLE001 - a broken sink must not break training
                    self._warn(f"sink:{worker.name}", f"sink {worker.name} failed to take step {record.step}: {exc}")
        for sink, name in self._sync:
            try:
                sink.write(record)
            except Exception as exc:  # noqa: BLE001 - a broken sink must not break training
                self._sync_errors[name] += 1
                self._warn(f"sink:{name}", f"sink {name} failed to write step {record.step}: {type(exc).__name__}: {exc}")
        for worker in self.workers:
            worker.append(record)

    def counters(self) -> dict[str, float]:
        errors = dict(self._sync_errors)
        dropped = dict.fromkeys(errors, 0)
        for worker in self.workers:
            errors[worker.name] = worker.errors
            dropped[worker.name] = worker.dropped
        metrics = {f"advmon/sink_errors/{name}": float(errors[name]) for name in self.names}
        metrics.update({f"advmon/dropped_records/{name}": float(dropped[name]) for name in self.names})
        return metrics

    def flush(self, timeout: float, only: Callable[[SinkLike], bool] | None = None) -> dict[str, int]:
        """Wait for queued records to be delivered (to the sinks ``only`` picks, default all); what is left per sink."""
        deadline = time.monotonic() + timeout
        for sink, name in self._sync:
            if only is None or only(sink):
                _call_quietly(sink, "flush", name, self._warn)
        return {w.name: w.drain(max(deadline - time.monotonic(), 0.0)) for w in self.workers
                if only is None or only(w.sink)}

    def tell(self, action: str) -> None:
        """Call every sink's optional hook ``action`` (``run_failed``) now, on this thread; a failure is warned."""
        for sink, name in zip(self.sinks, self.names):
            _call_quietly(sink, action, name, self._warn)

    def close(self, timeout: float) -> dict[str, int]:
        """Deliver what can be delivered within ``timeout``, close every sink; undelivered per sink."""
        deadline = time.monotonic() + timeout
        left = {w.name: w.stop(max(deadline - time.monotonic(), 0.0)) for w in self.workers}
        for sink, name in self._sync:
            for action in ("flush", "close"):
                _call_quietly(sink, action, name, self._warn)
        for worker in self.workers:
            # A backend that hangs on close (a dead server) must not hang the process.
            closer = threading.Thread(
                target=_call_quietly, args=(worker.sink, "close", worker.name, self._warn), daemon=True
            )
            closer.start()
            closer.join(max(deadline - time.monotonic(), 0.01))
        return left


def _call_quietly(sink: object, action: str, name: str, warn: Callable[[str, str], None]) -> None:
    method = getattr(sink, action, None)
    if not callable(method):
        return
    try:
        method()
    except Exception as exc:  # noqa: BLE001 - shutdown goes on
        warn(f"sink:{name}", f"sink {name} failed to {action}: {type(exc).__name__}: {exc}")


def _unique_names(sinks: list[SinkLike]) -> list[str]:
    from advmon.sinks.base import sink_name

    names: list[str] = []
    for sink in sinks:
        base = sink_name(sink)
        name, n = base, 2
        while name in names:
            name, n = f"{base}-{n}", n + 1
        names.append(name)
    return names

"""Which step a call belongs to, and when a step is complete.

A call belongs to, in order: the ``monitor.step(n)`` block open in its context
(thread or asyncio task, through ``contextvars``); else the step ``step_source``
gives (calls gather per step value; a step is complete when a call for another
one arrives); else a step of its own, counted up from 0 after the last explicit
step. :class:`StepTracker` keeps this state for one monitor and hands back the
``(step, calls)`` pairs that are complete; the monitor turns them into records.

Example:
    >>> tracker = StepTracker(owner=object())
    >>> tracker.place("call-a")
    [(0, ['call-a'])]
    >>> with tracker.block(5) as opened:
    ...     tracker.place("call-b"), tracker.place("call-c")
    ([], [])
    >>> opened.calls, tracker.place("call-d")
    (['call-b', 'call-c'], [(6, ['call-d'])])
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from advmon.errors import AdvmonError

__all__ = ["OpenStep", "StepTracker"]


@dataclass(eq=False)
class OpenStep:
    """A ``monitor.step(n)`` block in flight, and the calls it gathered (read them after the block)."""

    step: int
    calls: list[Any] = field(default_factory=list)
    closed: bool = False


#: The steps open in this context, as (owner, step) pairs.
_OPEN_STEPS: ContextVar[tuple[tuple[Any, OpenStep], ...]] = ContextVar("advmon_open_steps", default=())


class StepTracker:
    """One monitor's steps: open blocks, ``step_source`` aggregation, the running counter."""

    def __init__(self, owner: Any, step_source: Callable[[], int] | None = None) -> None:
        self.owner = owner  # whose blocks these are, in the shared context variable
        self.step_source = step_source
        self._lock = threading.Lock()
        self._next_step = 0
        self._open: set[OpenStep] = set()
        self._followed: tuple[int, list[Any]] | None = None

    def in_context(self) -> OpenStep | None:
        """The block open for this owner in the calling context, if any."""
        for owner, opened in _OPEN_STEPS.get():
            if owner is self.owner and not opened.closed:
                return opened
        return None

    @contextmanager
    def block(self, step: int) -> Iterator[OpenStep]:
        """Open ``step`` in this context; after the block, ``calls`` holds what it gathered."""
        current = self.in_context()
        if current is not None:
            raise AdvmonError(f"monitor.step({step}) inside monitor.step({current.step}): steps do not nest")
        opened = OpenStep(int(step))
        token = _OPEN_STEPS.set((*_OPEN_STEPS.get(), (self.owner, opened)))
        with self._lock:
            self._open.add(opened)
        try:
            yield opened
        finally:
            _OPEN_STEPS.reset(token)
            with self._lock:
                self._open.discard(opened)
                opened.closed = True
                self._next_step = max(self._next_step, int(step) + 1)

    def place(self, call: Any) -> list[tuple[int, list[Any]]]:
        """Put a call where it belongs; return the steps that are complete now.

        Raises:
            Exception: whatever ``step_source`` raised (the monitor reports it).
        """
        opened = self.in_context()
        if opened is None and self.step_source is not None:
            return self._follow(call)
        with self._lock:
            if opened is not None and not opened.closed:
                opened.calls.append(call)
                return []
            step = self._next_step
            self._next_step += 1
        return [(step, [call])]

    def _follow(self, call: Any) -> list[tuple[int, list[Any]]]:
        step = int(self.step_source())  # type: ignore[misc]
        with self._lock:
            finished = None
            if self._followed is not None and self._followed[0] != step:
                finished, self._followed = self._followed, None
            if self._followed is None:
                self._followed = (step, [])
            self._followed[1].append(call)
        return [finished] if finished is not None else []

    def take_followed(self) -> list[tuple[int, list[Any]]]:
        """The step ``step_source`` aggregation is still collecting, as complete (flush, close)."""
        with self._lock:
            followed, self._followed = self._followed, None
        return [followed] if followed is not None else []

    def close_all(self) -> list[tuple[int, list[Any]]]:
        """Close every block still open anywhere and return what they gathered, by step."""
        with self._lock:
            still_open = sorted(self._open, key=lambda o: o.step)
            taken = []
            for opened in still_open:
                opened.closed = True
                taken.append((opened.step, opened.calls))
                opened.calls = []
        return [(step, calls) for step, calls in taken if calls]

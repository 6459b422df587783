"""Progress on stderr for commands that take longer than a second.

Nothing is printed for work that finishes within ``delay`` seconds. After that, on a
terminal, a bar is redrawn in place and replaced by the closing line. Off a terminal
(a log, a CI job) a few lines only: one when the work is found to take a while
(without a percentage: the part done before it was not shown), one at each quarter
reached after that, and the closing line.

Example:
    >>> with Progress("quick", total=3) as progress:
    ...     for _ in range(3):
    ...         progress.advance()
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

#: Fractions of the work at which a log (not a terminal) gets a line.
LOG_MARKS = (0.25, 0.5, 0.75)
_BAR = 30


class Progress:
    """``total`` units of work named ``label``; :meth:`advance` as they are done."""

    def __init__(self, label: str, total: int, delay: float = 1.0, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(1, int(total))
        self.delay = delay
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._started = time.monotonic()
        self._shown = False
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._marks = list(LOG_MARKS)  # the log lines still to come
        self._drawn = 0  # the width of the bar line on a terminal

    def __enter__(self) -> Progress:
        return self

    def advance(self, count: int = 1) -> None:
        self.done = min(self.total, self.done + count)
        if time.monotonic() - self._started < self.delay:
            return
        fraction = self.done / self.total
        if self._tty:
            bar = "#" * int(fraction * _BAR)
            line = f"{self.label} [{bar:<{_BAR}}] {fraction:4.0%} ({self.done}/{self.total})"
            self._write("\r" + line.ljust(self._drawn))
            self._drawn = len(line)
        elif not self._shown:
            self._write(f"{self.label}: taking a while...\n")
            self._marks = [mark for mark in self._marks if mark > fraction]
        elif self._marks and fraction >= self._marks[0]:
            self._marks = [mark for mark in self._marks if mark > fraction]
            self._write(f"{self.label}: {fraction:.0%} ({self.done}/{self.total})\n")
        self._shown = True

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if not self._shown:
            return
        elapsed = time.monotonic() - self._started
        outcome = f"done in {elapsed:.1f} s" if exc_type is None else f"stopped after {elapsed:.1f} s"
        line = f"{self.label}: {outcome}"
        self._write(("\r" + line.ljust(self._drawn) if self._tty else line) + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

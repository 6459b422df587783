"""A progress bar on stderr for commands that take longer than a second.

Nothing is printed for work that finishes within ``delay`` seconds; after that a
bar is redrawn in place on a terminal, or printed every 10% otherwise (logs).

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


class Progress:
    def __init__(self, label: str, total: int, delay: float = 1.0, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(1, int(total))
        self.delay = delay
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self._started = time.monotonic()
        self._shown = False
        self._last_decile = -1

    def __enter__(self) -> Progress:
        return self

    def advance(self, count: int = 1) -> None:
        self.done = min(self.total, self.done + count)
        if time.monotonic() - self._started < self.delay:
            return
        fraction = self.done / self.total
        tty = getattr(self.stream, "isatty", lambda: False)()
        decile = int(fraction * 10)
        if not tty and decile == self._last_decile:
            return
        self._last_decile = decile
        bar = "#" * int(fraction * 30)
        end = "\r" if tty else "\n"
        self.stream.write(f"{self.label} [{bar:<30}] {fraction:4.0%} ({self.done}/{self.total}){end}")
        self.stream.flush()
        self._shown = True

    def __exit__(self, *exc: object) -> None:
        if self._shown:
            elapsed = time.monotonic() - self._started
            self.stream.write(f"{self.label} done in {elapsed:.1f} s\n")
            self.stream.flush()

"""The embedded default sink: one JSON object per line, appended and flushed.

Every record goes here first, so the file is the run's complete history even when
a remote backend was down; ``advmon replay`` can send it anywhere later.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import IO

from advmon.errors import AdvmonConfigError, warn
from advmon.record import Record
from advmon.sinks.base import Sink

__all__ = ["JsonlSink", "read_jsonl"]


class JsonlSink(Sink):
    """Append records to ``path`` as JSON lines, flushing each line.

    The file (and its directory) is created on the first record.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
        >>> sink = JsonlSink(path)
        >>> sink.write(Record("r", 0, 0.0, "est", None, {"rewards/mean": 0.5}))
        >>> sink.close()
        >>> [r.metrics for r in read_jsonl(path)]
        [{'rewards/mean': 0.5}]
    """

    name = "jsonl"
    #: Records carry their advantages' histograms for it: the report draws them (a few hundred bytes a line).
    histograms = True
    synchronous = True  # written first, on the training thread: the record of record

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._lock = threading.Lock()

    def write(self, record: Record) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            if self._file is None:
                self._file = self._open()
            self._file.write(line)
            self._file.flush()

    def _open(self) -> IO[str]:
        """Open for appending; after a process killed mid-line, start on a fresh line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cut_short = False
        if self.path.exists() and self.path.stat().st_size > 0:
            with open(self.path, "rb") as existing:
                existing.seek(-1, os.SEEK_END)
                cut_short = existing.read(1) != b"\n"
        file = open(self.path, "a", encoding="utf-8")
        if cut_short:
            file.write("\n")
        return file

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"


def read_jsonl(path: str | os.PathLike[str], progress_label: str | None = None) -> list[Record]:
    """Read back the records of a JSONL file written by :class:`JsonlSink`.

    A damaged line (cut short by a process killed while writing it, then perhaps
    followed by a resumed run's lines) is skipped: one warning names the file,
    the line numbers and how many were skipped.

    Raises:
        AdvmonConfigError: the file is missing, or no line of it is an advmon record.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise AdvmonConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    lines = text.split("\n")
    records = []
    damaged: list[tuple[int, str]] = []
    progress = None
    if progress_label is not None:
        from advmon.progress import Progress

        progress = Progress(progress_label, total=len(lines))
    for number, line in enumerate(lines, start=1):
        if progress is not None and number % 5000 == 0:
            progress.advance(5000)
        if not line.strip():
            continue
        try:
            records.append(Record.from_json(line))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            detail = exc.msg if isinstance(exc, json.JSONDecodeError) else f"{type(exc).__name__}: {exc}"
            damaged.append((number, detail))
    if progress is not None:
        progress.advance(len(lines))
        progress.__exit__(None, None, None)
    if damaged and not records:
        number, detail = damaged[0]
        raise AdvmonConfigError(f"{path}:{number}: not an advmon record ({detail})")
    if damaged:
        numbers = ", ".join(str(n) for n, _ in damaged[:10]) + (" ..." if len(damaged) > 10 else "")
        warn(f"advmon: {path}: skipped {len(damaged)} damaged line(s): {numbers}", stacklevel=2)
    return records

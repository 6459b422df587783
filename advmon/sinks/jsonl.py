"""The embedded default sink: one JSON object per line, appended and flushed.

Every record goes here first, so the file is the run's complete history even when
a remote backend was down; ``advmon replay`` can send it anywhere later.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import IO, Any

from advmon.errors import AdvmonConfigError, warn
from advmon.record import Record
from advmon.sinks.base import Sink

__all__ = ["JsonlSink", "one_history", "one_sink_per_file", "read_jsonl"]


class JsonlSink(Sink):
    """Write records to ``path`` as JSON lines, flushing each line.

    The file (and its directory) is created on the first record. A file already there
    holds another run's records (a script run again): it is moved aside, to
    ``<name>.<its time>.jsonl``, said once, and this run starts its own file, so readers
    never mix two runs. With ``resume=True`` (``Monitor(resume=True)``, ``ADVMON_RESUME=1``)
    records are appended to it instead: a run continued from a checkpoint. In a process forked
    from the one that made the sink, it writes ``<name>.<host>-<pid>.jsonl`` instead, said once:
    a child never writes, moves or renames its parent's file.

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
    synchronous = True  # written first, before any queued sink takes the record: the record of record

    #: Sinks of this process with a file open: a second sink on one of their files joins it (monitors of several
    #: runs writing one file on purpose, read back as FILE#RUN), rather than moving it aside. Two monitors of one
    #: run never get here: the newer one closes the earlier (advmon.monitor).
    _writing: weakref.WeakSet[JsonlSink] = weakref.WeakSet()
    _writing_lock = threading.Lock()

    def __init__(self, path: str | os.PathLike[str], resume: bool = False) -> None:
        self.path = Path(path)
        self.resume = bool(resume)
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        self._started = False
        self._given = self.path  # the path it was given: a forked child's file is named from it
        self._forked_from: tuple[int, Path] | None = None  # (parent process, its file) until the child says so
        #: How the one who made this sink continues a run in its file (the CLI names its own flag).
        self.resume_hint = "Monitor(resume=True) (ADVMON_RESUME=1)"
        _sinks.add(self)

    def write(self, record: Record) -> None:
        line = record.to_json() + "\n"
        with self._lock:
            if self._file is None:
                self._file = self._open()
            self._file.write(line)
            self._file.flush()
        if self._forked_from is not None:
            parent, theirs = self._forked_from
            self._forked_from = None
            warn(f"advmon: process {os.getpid()} is a fork of process {parent}, whose run {record.run} writes "
                 f"{theirs}: this process's records go to a file of its own, {self.path}, and never into its "
                 "parent's (said once)")

    def _forked(self) -> None:
        """In a forked child: leave the parent's file alone (never written, moved or renamed from here) and write
        a file named for this process, ``<name>.<host>-<pid>.jsonl``, as ``ADVMON_PER_PROCESS`` names them."""
        if self._file is not None:
            try:
                self._file.close()  # the child's copy of the descriptor; forking waited for the line being written
            except OSError:
                pass
            self._file = None
        theirs = self.path
        self.path = self._given.with_name(f"{self._given.stem}.{socket.gethostname()}-{os.getpid()}{self._given.suffix}")
        self._started = False
        self._forked_from = (os.getppid(), theirs)

    def _open(self) -> IO[str]:
        """Open for appending; after a process killed mid-line, start on a fresh line."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with JsonlSink._writing_lock:
            if not self._started:
                self._started = True
                shared = any(other.path.resolve() == self.path.resolve() for other in JsonlSink._writing)
                if not self.resume and not shared and self.path.exists() and self.path.stat().st_size > 0:
                    self._move_aside()
            JsonlSink._writing.add(self)
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
                with JsonlSink._writing_lock:
                    JsonlSink._writing.discard(self)

    def _move_aside(self) -> None:
        """Keep an earlier run's file under the time it was last written, and say so once."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.path.stat().st_mtime))
        aside = self.path.with_name(f"{self.path.stem}.{stamp}{self.path.suffix}")
        number = 1
        while aside.exists():
            number += 1
            aside = self.path.with_name(f"{self.path.stem}.{stamp}-{number}{self.path.suffix}")
        self.path.rename(aside)
        warn(f"advmon: {self.path} held the records of an earlier run of the same name; they are now in {aside}, "
             f"and this run writes a file of its own. {self.resume_hint} continues a run in its file instead")

    def __repr__(self) -> str:
        return f"JsonlSink({str(self.path)!r})"


def one_sink_per_file(sinks: list[Any]) -> list[Any]:
    """``sinks`` less each one that repeats an earlier one: the same object, or a :class:`JsonlSink` of a file an
    earlier one writes (``ADVMON_SINKS=jsonl`` beside the monitor's default, ``sinks=["jsonl", "jsonl"]``). Two
    writers of one file are one sink, which resumes if either was asked to; otherwise every record would be
    written twice, and readers would take the run for one restarted at every step.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "run.jsonl")
        >>> first = JsonlSink(path)
        >>> one_sink_per_file([first, JsonlSink(path, resume=True), first]) == [first], first.resume
        (True, True)
    """
    kept: list[Any] = []
    files: dict[str, JsonlSink] = {}
    for sink in sinks:
        if any(sink is earlier for earlier in kept):
            continue
        if isinstance(sink, JsonlSink):
            first = files.setdefault(os.path.abspath(sink.path), sink)
            if first is not sink:
                first.resume = first.resume or sink.resume
                continue
        kept.append(sink)
    return kept


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
        reason = exc.strerror or str(exc)
        raise AdvmonConfigError(f"{path}: {reason[:1].lower()}{reason[1:]}") from None
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
        warn(f"advmon: {path}: skipped {len(damaged)} damaged line(s): {numbers}")
    return records


def one_history(records: list[Record], source: str) -> list[Record]:
    """Each run's one history: where a run's steps start again in a file (a run continued from a checkpoint,
    or records appended before advmon moved earlier runs aside), the later record of each step is kept, and
    that is said once per run, never mixed silently.

    Example:
        >>> import warnings
        >>> records = [Record("r", step, 0.0, "e", None, {"k": float(n)}) for n, step in enumerate([0, 1, 2, 1, 2, 3])]
        >>> with warnings.catch_warnings(record=True) as said:
        ...     warnings.simplefilter("always")
        ...     kept = one_history(records, "run.jsonl")
        >>> [(r.step, r.metrics["k"]) for r in kept], len(said)
        ([(0, 0.0), (1, 3.0), (2, 4.0), (3, 5.0)], 1)
    """
    latest: dict[tuple[str, int], int] = {}
    restarts: dict[str, list[int]] = {}
    previous: dict[str, int] = {}
    for index, record in enumerate(records):
        if record.run in previous and record.step <= previous[record.run]:
            restarts.setdefault(record.run, []).append(record.step)
        previous[record.run] = record.step
        latest[(record.run, record.step)] = index
    if not restarts:
        return records
    for run, steps in restarts.items():
        again = sum(1 for r in records if r.run == run) - sum(1 for key in latest if key[0] == run)
        warn(f"advmon: {source}: run {run} {_restarted(steps, again)}")
    kept = set(latest.values())
    return [record for index, record in enumerate(records) if index in kept]


def _restarted(steps: list[int], again: int) -> str:
    """What happened to a run whose steps start again at ``steps``, in order, with ``again`` records repeating a step.

    Example:
        >>> _restarted([0], 2)
        'starts again at step 0, so 2 of its steps were recorded twice; the later record of each is used'
        >>> _restarted([5, 3], 4)
        'starts again 2 times, at step 5 then at step 3, so 4 of its records repeat a step recorded before; the latest record of each step is used'
    """
    if len(steps) == 1:
        return f"starts again at step {steps[0]}, so {again} of its steps were recorded twice; the later record of " \
               "each is used"
    more = f" and {len(steps) - 5} more" if len(steps) > 5 else ""
    shown = " then ".join(f"at step {step}" for step in steps[:5]) + more
    return f"starts again {len(steps)} times, {shown}, so {again} of its records repeat a step recorded before; " \
           "the latest record of each step is used"


# A record's line is written on the monitor's own thread (advmon.host_half). A process that forks while a line is
# half in the file object's buffer would give its child a copy of that half to flush again at the child's exit,
# tearing the parent's file, and a copy of a lock nobody releases. Forking waits for the line being written.
_sinks: weakref.WeakSet[JsonlSink] = weakref.WeakSet()
_held: list[threading.Lock] = []


def _hold_lines() -> None:
    _held[:] = [sink._lock for sink in list(_sinks)]
    for lock in _held:
        lock.acquire()


def _release_lines() -> None:
    for lock in reversed(_held):
        lock.release()
    _held.clear()


def _own_files_in_child() -> None:
    """A forked child (a DataLoader or multiprocessing worker) never writes, moves or renames its parent's files:
    which process opened a file first must not decide whose run it holds. Every sink writes a file of the
    child's own from here (:meth:`JsonlSink._forked`), and the parent's open files are not the child's."""
    _release_lines()
    JsonlSink._writing_lock = threading.Lock()  # another thread of the parent may have held it at the fork
    JsonlSink._writing = weakref.WeakSet()
    for sink in list(_sinks):
        sink._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_hold_lines, after_in_parent=_release_lines, after_in_child=_own_files_in_child)

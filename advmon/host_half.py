"""A record's host half, off the training thread: one worker thread per monitor, in the order handed over.

The training thread does a watched call's device half and starts the record's one
transfer (:func:`advmon.assembly.cross`); everything after it (groups, exemplars,
slices, summaries, the record, its JSONL line and the hand-over to the other sinks)
is work handed to :class:`HostHalf`, which runs it on its own thread, one item at
a time, first in first out: records reach the sinks in the order their steps were
emitted, whatever each costs.

Three things keep it from hurting the training run:

* **No second OpenMP team.** The host half is NumPy and small CPU tensor ops; the
  worker caps its own OpenMP team at one thread (:func:`single_openmp_thread`, a
  per-thread setting: the trainer's threads keep theirs).
* **A bounded backlog.** At most ``capacity`` records wait; a training thread that
  outruns the host half waits for room rather than growing memory without bound.
* **Fork.** Threads do not survive ``fork``: a child (a DataLoader worker) gets an
  empty worker that starts on its own first record; the parent's pending records
  are the parent's to write.

Example:
    >>> done = []
    >>> half = HostHalf("doc", report=print)
    >>> for step in range(3):
    ...     half.submit(lambda step=step: done.append(step))
    >>> half.wait(5.0), done
    (True, [0, 1, 2])
    >>> half.stop(5.0)
    True
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

__all__ = ["HostHalf", "single_openmp_thread"]

#: Records that may wait for the host half before a watched call waits for room.
DEFAULT_CAPACITY = 64

_halves: weakref.WeakSet[HostHalf] = weakref.WeakSet()


class HostHalf:
    """Run handed-over work on one daemon thread, in order; ``report`` gets what the work raised."""

    def __init__(self, name: str, report: Callable[[BaseException], None],
                 capacity: int = DEFAULT_CAPACITY) -> None:
        self.name = name
        self.capacity = capacity
        self._report = report
        self._reset()
        _halves.add(self)

    def _reset(self) -> None:
        self._condition = threading.Condition(threading.Lock())
        self._pending: deque[Callable[[], None]] = deque()
        self._busy = False
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the training thread's side

    def submit(self, work: Callable[[], None]) -> None:
        """Hand ``work`` over; returns at once unless ``capacity`` items already wait."""
        with self._condition:
            while len(self._pending) >= self.capacity and self._thread is not None:
                self._condition.wait(0.5)
            self._pending.append(work)
            self._stopping = False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"advmon-host-{self.name}", daemon=True)
                self._thread.start()
            self._condition.notify_all()

    def on_worker(self) -> bool:
        """Whether the caller is this host half's own thread (work that waits for itself would never return)."""
        return threading.current_thread() is self._thread

    def wait(self, timeout: float) -> bool:
        """Wait until everything handed over is done (at most ``timeout`` seconds); whether it is."""
        if self.on_worker():
            return not self._pending
        deadline = time.monotonic() + timeout
        with self._condition:
            while self._pending or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None:
                    return False
                self._condition.wait(left)
        return True

    @property
    def idle(self) -> bool:
        """Nothing waits and nothing runs (a cheap check before :meth:`wait`)."""
        return not self._pending and not self._busy

    def stop(self, timeout: float) -> bool:
        """Finish what was handed over (at most ``timeout`` seconds), then end the thread; whether all was done."""
        done = self.wait(timeout)
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
            thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            thread.join(0.5 if done else 0.0)
        return done

    # ------------------------------------------------------------------ the worker

    def _run(self) -> None:
        single_openmp_thread()
        while True:
            with self._condition:
                while not self._pending:
                    if self._stopping:
                        self._thread = None  # under the lock: the next submit starts a thread of its own
                        return
                    self._condition.wait()
                work = self._pending.popleft()
                self._busy = True
                self._condition.notify_all()  # room for a waiting submit
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - the worker outlives any one record
                try:
                    self._report(exc)
                except BaseException:  # noqa: BLE001 - nowhere left to say it; the next record still runs
                    pass
            finally:
                del work  # the record's arrays go now, not when the next item arrives
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()


def _forget_in_child() -> None:
    """A forked child starts with empty host halves: the parent's thread is not there, its records are its own."""
    for half in list(_halves):
        half._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# --------------------------------------------------------------------------- OpenMP

_omp_set_num_threads: Callable[[int], None] | None | bool = False
_mkl_set_num_threads_local: Callable[[int], None] | None | bool = False


def single_openmp_thread() -> None:
    """Cap the calling thread's OpenMP team, and its MKL calls' team, at one thread, leaving every other
    thread's as it is.

    ``torch.set_num_threads`` would also resize torch's process-wide MKL and
    thread pools, the trainer's included; ``omp_set_num_threads`` from the OpenMP
    runtime torch loaded is a per-thread setting, and so is MKL's
    ``mkl_set_num_threads_local``. torch sets each new thread's team size from its
    own the first time the thread asks (``torch.get_num_threads`` does), so that
    comes first. A build without OpenMP or MKL has nothing to cap.
    """
    setter = _openmp_setter()
    if setter is not None:
        import torch

        torch.get_num_threads()
        setter(1)
    blas = _mkl_local_setter()
    if blas is not None:
        blas(1)


def _mkl_local_setter() -> Callable[[int], None] | None:
    """MKL's per-thread thread count, where torch's MKL exports it (``None`` elsewhere).

    MKL takes its team size from the calling thread's OpenMP setting only until someone
    sets MKL's own, and ``torch.set_num_threads`` does (advmon's
    :func:`~advmon.stats.statistics_threads` on the training thread, a trainer's own
    call): from then on every thread's BLAS call (``torch.dot``, ``mv``) starts a team of
    that size, a second team beside the trainer's, and its sums follow the team's
    size. ``mkl_set_num_threads_local`` is MKL's per-thread override. Its Fortran
    spelling (trailing underscore: the count by reference) is the one whose signature
    is the same in every MKL build.
    """
    global _mkl_set_num_threads_local
    if _mkl_set_num_threads_local is False:
        _mkl_set_num_threads_local = _find_mkl_setter()
    return _mkl_set_num_threads_local  # type: ignore[return-value]


def _find_mkl_setter() -> Callable[[int], None] | None:
    for library in _loaded_libraries(("libmkl", "libtorch_cpu")):
        try:
            fortran = ctypes.CDLL(library).mkl_set_num_threads_local_
        except (OSError, AttributeError):
            continue
        fortran.restype = ctypes.c_int
        return lambda count: fortran(ctypes.byref(ctypes.c_int(count)))
    return None


def _loaded_libraries(names: tuple[str, ...]) -> list[str]:
    """The shared libraries this process has loaded whose paths contain any of ``names``."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return sorted({line.split()[-1] for line in maps if any(name in line for name in names)})
    except OSError:
        return []


def _openmp_setter() -> Callable[[int], None] | None:
    global _omp_set_num_threads
    if _omp_set_num_threads is False:
        _omp_set_num_threads = _find_openmp_setter()
    return _omp_set_num_threads  # type: ignore[return-value]


def _find_openmp_setter() -> Callable[[int], None] | None:
    for library in _loaded_libraries(("libgomp", "libiomp5", "libomp.")):
        try:
            return ctypes.CDLL(library).omp_set_num_threads
        except (OSError, AttributeError):
            continue
    return None

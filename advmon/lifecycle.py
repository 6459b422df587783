"""The edges of a process: which monitors are alive, the process-wide default, and exit.

Both the monitor and the sinks use this module (a W&B run must be finished after
advmon delivered to it, so the W&B sink re-registers :func:`close_all` at exit);
it imports neither, so the house has no circle.

Example:
    >>> class Closable:
    ...     closed = False
    ...     def close(self, timeout=None):
    ...         self.closed = True
    >>> thing = Closable()
    >>> track(thing)
    >>> close_all(budget=1.0)
    >>> thing.closed
    True
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

__all__ = [
    "DEFAULT_EXIT_TIMEOUT",
    "EXIT_TIMEOUT_VARIABLE",
    "close_all",
    "close_all_again_at_exit",
    "close_in_background",
    "current_default",
    "default_monitor",
    "exit_budget",
    "flush_all",
    "install_sigterm_flush",
    "monitor_of_run",
    "register_run",
    "set_default",
    "set_default_factory",
    "track",
    "wait_all",
    "untrack",
]

#: Seconds interpreter exit may spend delivering queued records, over all monitors together.
EXIT_TIMEOUT_VARIABLE = "ADVMON_EXIT_TIMEOUT"
DEFAULT_EXIT_TIMEOUT = 5.0

_live: weakref.WeakSet[Any] = weakref.WeakSet()
_default: Any = None
_default_factory: Callable[..., Any] | None = None
_by_run: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_lock = threading.RLock()  # the factory runs under it, and a new monitor registers its run
_closing: set[threading.Thread] = set()  # closes started by close_in_background, not finished yet


def track(closable: Any) -> None:
    """Close ``closable`` (anything with ``close(timeout)``) at exit unless it is closed first."""
    _live.add(closable)


def untrack(closable: Any) -> None:
    _live.discard(closable)


def live() -> list[Any]:
    """What is tracked and still alive."""
    return list(_live)


@atexit.register
def close_all(budget: float | None = None) -> None:
    """Close everything tracked, within one total budget (``ADVMON_EXIT_TIMEOUT`` s, default 5).

    The budget is shared by every monitor still open, whatever their number and
    their sinks' state; each reports what it could not deliver.
    """
    if budget is None:
        budget = exit_budget()
    deadline = time.monotonic() + max(budget, 0.0)
    for closable in list(_live):
        try:
            closable.close(timeout=max(deadline - time.monotonic(), 0.0))
        except Exception:  # noqa: BLE001, S110 - never fail the interpreter's exit
            pass
    with _lock:
        closing = list(_closing)
    for thread in closing:  # collected monitors still delivering: within the same budget
        thread.join(max(deadline - time.monotonic(), 0.0))


def close_in_background(close: Callable[[float], Any], timeout: float, name: str) -> None:
    """Run ``close(timeout)`` on a daemon thread; :func:`close_all` waits for it at exit, within its budget.

    This is how a monitor nobody closed is closed when it is garbage-collected. The
    collection runs on whichever thread allocated last (the training loop's, as likely
    as not), which must not wait for deliveries there; and while one thread's
    collection runs finalizers, ``gc.collect()`` on every other thread returns at once
    without collecting anything (CPython collects one thread at a time), so a finalizer
    that blocked would keep other unreachable monitors, their threads and files alive.

    Example:
        >>> closed = threading.Event()
        >>> close_in_background(lambda timeout: closed.set(), 1.0, "advmon-close-doc")
        >>> closed.wait(5)
        True
    """

    def run() -> None:
        try:
            close(timeout)
        except Exception:  # noqa: BLE001, S110 - a daemon thread has no one to raise to; close() warns itself
            pass
        finally:
            with _lock:
                _closing.discard(thread)

    thread = threading.Thread(target=run, name=name, daemon=True)
    with _lock:
        _closing.add(thread)
    thread.start()


def exit_budget() -> float:
    """Seconds exit (or SIGTERM) may spend delivering: ``ADVMON_EXIT_TIMEOUT``, default 5."""
    try:
        return float(os.environ.get(EXIT_TIMEOUT_VARIABLE, DEFAULT_EXIT_TIMEOUT))
    except ValueError:
        return DEFAULT_EXIT_TIMEOUT


def close_all_again_at_exit() -> None:
    """Run :func:`close_all` before exit hooks registered so far (they run last-registered first)."""
    atexit.register(close_all)


def set_default_factory(factory: Callable[..., Any]) -> None:
    """How :func:`default_monitor` makes the process-wide monitor (the package's face sets it: every
    ``import advmon.<anything>`` runs it first, and it imports the monitor only when the factory runs).

    ``factory(run)`` builds it; ``run`` is a hint (the run a wrapper that crossed
    processes came from), used when the environment names none.
    """
    global _default_factory
    _default_factory = factory


def default_monitor(run: str | None = None) -> Any:
    """The process-wide default monitor, created on first use (``run``: the name to give it then).

    Raises:
        AdvmonConfigError: the ``ADVMON_*`` variables it is built from are wrong.
    """
    global _default
    with _lock:
        if _default is None or getattr(_default, "closed", False):
            if _default_factory is None:
                raise RuntimeError("no process-wide monitor factory: advmon's package was not initialised")
            _default = _default_factory(run)
        return _default


def register_run(monitor: Any) -> None:
    """Let wrappers that arrive from another process find ``monitor`` by its run name."""
    with _lock:
        _by_run[monitor.run] = monitor


def monitor_of_run(run: str) -> Any:
    """The open monitor of ``run`` in this process, if any (the latest one made)."""
    with _lock:
        found = _by_run.get(run)
    return found if found is not None and not getattr(found, "closed", False) else None


def flush_all(timeout: float | None = None) -> None:
    """Flush every open monitor: emit steps a ``step_source`` holds, wait for queued records."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for monitor in list(_live):
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            monitor.flush(remaining)
        except Exception:  # noqa: BLE001, S110 - flushing is best effort, like exit
            pass


def wait_all(timeout: float | None = None) -> None:
    """Wait until every open monitor's records are finished and given to its sinks (no step is emitted)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for monitor in list(_live):
        remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        monitor.wait(remaining)


def current_default() -> Any:
    """The process-wide default monitor if one is open, without creating one."""
    with _lock:
        return _default if _default is not None and not getattr(_default, "closed", False) else None


def set_default(monitor: Any) -> Any:
    """Make ``monitor`` the process-wide default; returns the previous one."""
    global _default
    with _lock:
        previous, _default = _default, monitor
    return previous


# --------------------------------------------------------------------------- SIGTERM

_sigterm_installed = False


def install_sigterm_flush() -> bool:
    """On SIGTERM, finish the records monitors hold and deliver what is queued, then do what the signal did
    before: the handler that was there (a framework's, such as Ray's) is called, the default terminates.

    A monitor finishes its records off the training thread, so a job preempted right after
    a watched call would otherwise lose that call's record; every monitor installs this on
    first use. Only the main thread may set a handler (elsewhere this returns ``False`` and a
    later call from the main thread installs it). A handler installed from C (``getsignal``
    gives ``None``) is never replaced. SIGKILL cannot be caught: call ``advmon.flush()`` first.
    """
    global _sigterm_installed
    if _sigterm_installed:
        return True
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM)
    _sigterm_installed = True
    if previous is None:  # not Python's to chain: leave it alone
        return False

    def flush_then_continue(signum: int, frame: Any) -> None:
        # In a thread: the interrupted main thread may hold a monitor's lock.
        budget = exit_budget()
        flusher = threading.Thread(target=flush_all, args=(budget,), daemon=True, name="advmon-sigterm-flush")
        flusher.start()
        flusher.join(budget + 1.0)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, flush_then_continue)
    return True

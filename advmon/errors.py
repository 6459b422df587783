"""advmon's small exception family.

Everything advmon raises on purpose is an :class:`AdvmonError`. Where the
problem is a bad value handed to advmon directly (a config, a CLI argument) it is
also a :class:`ValueError`, so callers can catch either.

Failures inside a watched call never raise into the training loop unless the
monitor was created with ``strict=True``; they become one
:class:`AdvmonWarning` per kind of problem and a count in
``advmon/internal_errors``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
import types
import warnings
from collections.abc import Callable, Iterator

__all__ = ["AdvmonError", "AdvmonConfigError", "AdvmonWarning", "closing_on_error", "on_users_path",
           "user_stacklevel", "warn", "warnings_kept"]


class AdvmonError(Exception):
    """An error raised by advmon itself (never one of the estimator's)."""


class AdvmonConfigError(AdvmonError, ValueError):
    """A bad value given to advmon directly: a sink spec, a step, a CLI flag."""


class AdvmonWarning(UserWarning):
    """advmon could not record part of a call; training carries on."""


def warn(message: str) -> None:
    """Emit an :class:`AdvmonWarning` that can never raise, pointing at the user's line.

    The warning's file and line are those of the nearest caller outside advmon (see :func:`user_stacklevel`):
    the training loop's ``estimator(...)`` or ``with monitor.step(...)``, the ``Monitor(...)`` or
    ``read_jsonl(...)`` call, whichever path inside advmon led to the warning.

    Under ``python -W error`` or pytest's ``filterwarnings = error`` a warning
    becomes an exception; raised from a watched call, it would cost the training
    loop the estimator's result. Then the message goes to the ``advmon`` logger
    instead.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error")
        ...     warn("advmon: something could not be recorded")  # no exception
    """
    from advmon.redact import scrub

    message = scrub(message)  # a sink's error can quote a URL with a password in it
    keep = getattr(_kept_for_later, "keep", None)
    if keep is not None:
        keep(message)
        return
    try:
        warnings.warn(message, AdvmonWarning, stacklevel=user_stacklevel())
    except Warning:
        logging.getLogger("advmon").warning(message)


_kept_for_later = threading.local()


@contextlib.contextmanager
def warnings_kept(keep: Callable[[str], None]) -> Iterator[None]:
    """On this thread, for the block, :func:`warn` hands its messages to ``keep`` instead of warning: a monitor's
    own thread has no line of the user's to point at, so the monitor says them at the training thread's next call.

    Example:
        >>> kept = []
        >>> with warnings_kept(kept.append):
        ...     warn("advmon: found off the training thread")
        >>> kept
        ['advmon: found off the training thread']
    """
    before = getattr(_kept_for_later, "keep", None)
    _kept_for_later.keep = keep
    try:
        yield
    finally:
        _kept_for_later.keep = before


#: Where advmon's own code lives, and the standard library's wrappers a user's call passes through on its way in
#: (``with monitor.step(...)`` is a generator context manager): a warning skips their frames.
_PASSED_THROUGH = (os.path.dirname(os.path.abspath(__file__)) + os.sep, os.path.abspath(contextlib.__file__),
                   os.path.abspath(functools.__file__))


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called by the function that calls this one, name the
    nearest frame outside advmon (Python 3.12's ``skip_file_prefixes``, for every supported Python).

    A frame is advmon's when its file lies in the package; on a thread of advmon's own (a sink's worker) no frame
    is the user's, and the warning names the thread's first frame.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as said:
        ...     warnings.simplefilter("always")
        ...     warn("advmon: pointed at this line")
        >>> said[0].filename.endswith("errors.py")  # the doctest's line, not advmon's
        False
    """
    frame = sys._getframe(2)  # the caller of warnings.warn's caller: stacklevel 2
    level = 2
    while frame.f_back is not None and _passed_through(frame):
        frame = frame.f_back
        level += 1
    return level


def on_users_path() -> bool:
    """Whether the calling thread runs the user's code: a frame outside advmon and the thread machinery (a sink's
    worker thread has none, so a warning raised there would point at no line of the user's; the monitor keeps
    such a warning for the training thread's next call)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not _passed_through(frame) and frame.f_code.co_filename != threading.__file__:
            return True
        frame = frame.f_back
    return False


def _passed_through(frame: types.FrameType) -> bool:
    return frame.f_code.co_filename.startswith(_PASSED_THROUGH)


def closing_on_error() -> bool:
    """Whether the calling thread is closing a run because of an exception: ``with Monitor(...)`` unwinding
    on it, or the interpreter exiting on an uncaught one (then the run did not finish: sinks leave it unfinished,
    and Prometheus takes it for crashed).

    Example:
        >>> closing_on_error()
        False
        >>> try:
        ...     raise RuntimeError("the loss went NaN")
        ... except RuntimeError:
        ...     closing_on_error()
        True
    """
    exiting = not threading.main_thread().is_alive()  # sys.last_type alone may be an interactive session's old error
    if exiting and getattr(sys, "last_type", None) is not None and not issubclass(sys.last_type, SystemExit):
        return True
    error = sys.exc_info()[1]
    if error is None:
        return False
    if isinstance(error, SystemExit):
        return error.code not in (None, 0)
    return True

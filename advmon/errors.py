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

import logging
import sys
import threading
import warnings

__all__ = ["AdvmonError", "AdvmonConfigError", "AdvmonWarning", "closing_on_error", "warn"]


class AdvmonError(Exception):
    """An error raised by advmon itself (never one of the estimator's)."""


class AdvmonConfigError(AdvmonError, ValueError):
    """A bad value given to advmon directly: a sink spec, a step, a CLI flag."""


class AdvmonWarning(UserWarning):
    """advmon could not record part of a call; training carries on."""


def warn(message: str, stacklevel: int = 2) -> None:
    """Emit an :class:`AdvmonWarning` that can never raise.

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
    try:
        warnings.warn(message, AdvmonWarning, stacklevel=stacklevel + 1)
    except Warning:
        logging.getLogger("advmon").warning(message)


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

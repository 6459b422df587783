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

__all__ = ["AdvmonError", "AdvmonConfigError", "AdvmonWarning"]


class AdvmonError(Exception):
    """An error raised by advmon itself (never one of the estimator's)."""


class AdvmonConfigError(AdvmonError, ValueError):
    """A bad value given to advmon directly: a sink spec, a step, a CLI flag."""


class AdvmonWarning(UserWarning):
    """advmon could not record part of a call; training carries on."""

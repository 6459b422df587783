"""What the integrations share: the process-wide monitor made on first use, and their patches put back.

Example:
    >>> class Owner:
    ...     value = 1
    >>> patched = [(Owner, "value", 1), (Owner, "added", MISSING)]
    >>> Owner.value, Owner.added = 2, 3
    >>> restore(patched)
    >>> Owner.value, hasattr(Owner, "added")
    (1, False)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from advmon.monitor import Monitor, get_monitor, set_monitor

__all__ = ["MISSING", "process_monitor", "restore"]

#: The original of a patch that added an attribute the owner did not have of its own.
MISSING = object()


def process_monitor(step_source: Callable[[], int | None]) -> Monitor:
    """The process-wide monitor, made with the framework's ``step_source`` if there is none yet."""
    from advmon.lifecycle import current_default

    if current_default() is not None:
        return get_monitor()
    monitor = Monitor(step_source=step_source)
    set_monitor(monitor)
    return monitor


def restore(patched: Sequence[tuple[Any, str, Any]]) -> None:
    """Undo ``(owner, attribute, original)`` patches, the last first (an attribute patched twice ends as it began)."""
    for owner, attribute, original in reversed(patched):
        if original is MISSING:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, original)

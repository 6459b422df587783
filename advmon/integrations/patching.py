"""What the integrations share: the process-wide monitor made on first use, their patches put back, and what
instrumenting again for another monitor does (it moves there, said once: :func:`switches`).

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

from advmon.hooks import say_switched
from advmon.monitor import Monitor, get_monitor, set_monitor

__all__ = ["MISSING", "process_monitor", "restore", "switches"]

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


def switches(framework: str, installed: Monitor | None, wanted: Monitor | None) -> bool:
    """Whether ``instrument(wanted)`` must move an instrumentation made for ``installed``; if so, says it once.

    Every integration does the same: ``None`` (no monitor named) or the same monitor keeps what is
    installed; another monitor takes over, with one warning, so a notebook cell run again with a new monitor
    records there, never silently into the first (which, once closed, would drop every call).
    """
    from advmon.lifecycle import current_default

    if wanted is None or wanted is installed or (installed is None and wanted is current_default()):
        return False
    say_switched(f"advmon.integrations.{framework}", installed, wanted,
                 f"advmon.integrations.{framework}.uninstrument()")
    return True


def restore(patched: Sequence[tuple[Any, str, Any]]) -> None:
    """Undo ``(owner, attribute, original)`` patches, the last first (an attribute patched twice ends as it began)."""
    for owner, attribute, original in reversed(patched):
        if original is MISSING:
            delattr(owner, attribute)
        else:
            setattr(owner, attribute, original)

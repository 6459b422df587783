"""The sink interface: anything with ``write(record)`` is a sink.

Sinks receive :class:`advmon.record.Record` objects holding plain floats; they
never see tensors. ``flush()`` and ``close()`` are optional. Subclassing
:class:`Sink` gives no-op defaults and a ``name`` used in warnings and metrics.

Example:
    >>> class PrintSink(Sink):
    ...     def write(self, record):
    ...         print(record.step, record.metrics["rewards/mean"])
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Protocol, runtime_checkable

from advmon.record import Record

__all__ = ["Sink", "SinkLike", "require", "sink_name"]


@runtime_checkable
class SinkLike(Protocol):
    """What a monitor needs from a sink."""

    def write(self, record: Record) -> None: ...


class Sink:
    """Convenience base class: implement :meth:`write`; the rest are no-ops."""

    #: Short name used in warnings and in ``advmon/sink_errors/<name>``.
    name: str = "sink"
    #: ``True``: written on the training thread (cheap, local). ``False``: handed
    #: to a background thread through a bounded queue, retried with backoff.
    synchronous: bool = False

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        """Called once by the monitor with its run id and the names of all its sinks."""

    def write(self, record: Record) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Push buffered records out; called by ``Monitor.close()``."""

    def close(self) -> None:
        """Release resources; called once by ``Monitor.close()``."""


def require(module: str, extra: str) -> ModuleType:
    """Import an optional backend, or fail at construction with the install hint."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"this advmon sink needs {module}: pip install 'advmon[{extra}]'", name=exc.name
        ) from None


def sink_name(sink: object) -> str:
    """The sink's ``name`` attribute, or its class name in lower case."""
    name = getattr(sink, "name", None)
    return name if isinstance(name, str) and name else type(sink).__name__.lower()

"""advmon: advantage and reward monitoring for RL training of language models.

Put one decorator on any advantage estimator, or instrument an existing estimator
object, and every training step yields exact pre/post-normalization advantage
statistics, reward statistics, zero-std group fractions and NaN/Inf counts.

Example:
    >>> import torch, advmon
    >>> monitor = advmon.Monitor("quickstart", sinks=[])
    >>> @monitor.watch
    ... def compute_advantage(prompt_ids, rewards, mask):
    ...     return (rewards - rewards.mean()).unsqueeze(-1).expand(mask.shape)
    >>> _ = compute_advantage(torch.tensor([0, 0]), torch.tensor([1.0, 0.0]), torch.ones(2, 4))
    >>> monitor.last_metrics["advantages/post_norm/max"]
    0.5
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import advmon.lifecycle as _lifecycle
from advmon.errors import AdvmonConfigError, AdvmonError, AdvmonWarning

# The names below load on first use (``__getattr__`` at the end of this file): they import torch,
# and ``import advmon`` must not, so that the alert and dashboard generators, the catalog
# (advmon.rules) and the CLI start without it. Type checkers read them from here.
if TYPE_CHECKING:
    from advmon.hooks import ArgumentNames, scored_by, sliced_by, tap, watch
    from advmon.monitor import Monitor, get_monitor, set_monitor
    from advmon.normalization import KINDS as NORMALIZATION_KINDS
    from advmon.normalization import Normalization
    from advmon.record import Record
    from advmon.sinks import JsonlSink, Sink, read_jsonl


def _instrument(target: Any, monitor: Monitor | None, method: str, names: ArgumentNames) -> Any:
    """:func:`advmon.hooks.instrument`, imported when first called."""
    from advmon.hooks import instrument

    return instrument(target, monitor, method, names)


def _argument_names(argument_names: dict[str, Any]) -> ArgumentNames:
    """:func:`advmon.hooks.checked_argument_names`, imported when first called."""
    from advmon.hooks import checked_argument_names

    return checked_argument_names(argument_names)


def _process_wide_monitor(run: str | None) -> Monitor:
    """:func:`advmon.monitor.monitor_from_environment`, imported when a watched call first needs the process-wide
    monitor. Every ``import advmon.<anything>`` runs this file first, so a process that only imported the capture
    layer (activation in a Ray worker) still gets its monitor; the lifecycle module cannot import the monitor,
    which stands above it."""
    from advmon.monitor import monitor_from_environment

    return monitor_from_environment(run)


_lifecycle.set_default_factory(_process_wide_monitor)


__all__ = [
    "AdvmonConfigError",
    "AdvmonError",
    "AdvmonWarning",
    "JsonlSink",
    "Monitor",
    "NORMALIZATION_KINDS",
    "Record",
    "Sink",
    "flush",
    "get_monitor",
    "instrument",
    "read_jsonl",
    "scored_by",
    "set_monitor",
    "sliced_by",
    "tap",
    "watch",
]

#: The one version: pyproject.toml reads it from here (``[tool.setuptools.dynamic]``), ``advmon --version`` prints it,
#: and CHANGELOG.md's latest section names it (tests/test_contracts.py).
__version__ = "0.2.0"


def instrument(
    target: Any,
    monitor: Monitor | None = None,
    method: str = "compute_advantage",
    **argument_names: Any,
) -> Any:
    """Wrap ``target.<method>`` of an existing estimator instance or class, in place.

    Returns ``target``. Instrumenting twice does not wrap twice. ``argument_names``
    are ``rewards=``, ``mask=``, ``groups=``, ``group_size=``, ``slices=``,
    ``reward_functions=`` and ``normalization=`` as for :meth:`Monitor.watch`. Without ``monitor``, the process-wide one is used.

    Example:
        >>> import torch, advmon
        >>> class Estimator:
        ...     def compute_advantage(self, prompt_ids, rewards, mask):
        ...         return rewards - rewards.mean()
        >>> monitor = advmon.Monitor("doc", sinks=[])
        >>> estimator = advmon.instrument(Estimator(), monitor)
        >>> _ = estimator.compute_advantage(None, torch.tensor([1.0, 3.0]), None)
        >>> monitor.last_metrics["advantages/post_norm/abs_mean"]
        1.0
    """
    return _instrument(target, monitor, method, _argument_names(argument_names))


def flush(timeout: float | None = None) -> None:
    """Flush every open monitor of this process: emit the step a ``step_source`` holds, and
    wait (at most ``timeout`` seconds in all) for queued records to be delivered.

    Call it before a process can be killed without warning (``ray.kill`` sends
    SIGKILL, which no handler sees). SIGTERM and a normal exit flush by themselves.
    """
    _lifecycle.flush_all(timeout)


#: The public names that load on first use, and where each comes from (module, name there).
_LAZY: dict[str, tuple[str, str]] = {
    "ArgumentNames": ("advmon.hooks", "ArgumentNames"),
    "scored_by": ("advmon.hooks", "scored_by"),
    "sliced_by": ("advmon.hooks", "sliced_by"),
    "tap": ("advmon.hooks", "tap"),
    "watch": ("advmon.hooks", "watch"),
    "Monitor": ("advmon.monitor", "Monitor"),
    "get_monitor": ("advmon.monitor", "get_monitor"),
    "set_monitor": ("advmon.monitor", "set_monitor"),
    "NORMALIZATION_KINDS": ("advmon.normalization", "KINDS"),
    "Normalization": ("advmon.normalization", "Normalization"),
    "Record": ("advmon.record", "Record"),
    "JsonlSink": ("advmon.sinks", "JsonlSink"),
    "Sink": ("advmon.sinks", "Sink"),
    "read_jsonl": ("advmon.sinks", "read_jsonl"),
}


def __getattr__(name: str) -> Any:
    """Load a public name of ``_LAZY`` on first use (PEP 562), and keep it, so the next use is a plain lookup."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

"""Activate advmon in a process from its ``ADVMON_*`` variables, lazily.

:func:`activate` is what a worker runs at start (Ray's ``worker_process_setup_hook``,
see :mod:`advmon.integrations.ray`): it watches the ``ADVMON_INSTRUMENT`` targets
as soon as their modules are imported, and flushes on SIGTERM. It creates no
monitor, file, thread or port: the process-wide monitor is built from the
variables on the first recorded call, so the many workers Ray starts that never
compute an advantage cost nothing and cannot collide on a port.

Example:
    >>> import advmon.integrations.activation as activation
    >>> activation.activate({"ADVMON_INSTRUMENT": "my_rl.not_imported_yet:Estimator(groups=uid)"})
    ['my_rl.not_imported_yet:Estimator(groups=uid)']
    >>> activation.deactivate()  # forget it again
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import advmon.lifecycle as lifecycle
from advmon.config.environment import Target, parse_targets
from advmon.errors import AdvmonConfigError, warn
from advmon.hooks import instrument, is_watched, watch_in_place
from advmon.lifecycle import install_sigterm_flush

__all__ = ["activate", "deactivate", "install_sigterm_flush", "watch_target"]

VERL_STEP_SOURCE = "advmon.integrations.verl:current_step"


def activate(environ: Mapping[str, str] | None = None) -> list[str]:
    """Watch ``ADVMON_INSTRUMENT``'s targets (now if imported, else on import); flush on SIGTERM.

    Returns the targets, as text. Creates no monitor. Safe to call again.

    Raises:
        AdvmonConfigError: ``ADVMON_INSTRUMENT`` cannot be read (the setup hook
            turns this into one warning).
    """
    environ = os.environ if environ is None else environ
    targets = parse_targets(environ.get("ADVMON_INSTRUMENT", ""))
    if any(t.module == "verl" and t.attribute is None for t in targets) and not environ.get("ADVMON_STEP_SOURCE"):
        # verl's own counter, in the process that computes advantages.
        os.environ["ADVMON_STEP_SOURCE"] = VERL_STEP_SOURCE
    for target in targets:
        _when_imported(_module_of(target), lambda module, target=target: watch_target(target, module))
    install_sigterm_flush()
    return [t.spec for t in targets]


def _module_of(target: Target) -> str:
    return "verl.trainer.ppo.core_algos" if target.module == "verl" and target.attribute is None else target.module


def watch_target(target: Target, module: ModuleType) -> None:
    """Watch one target of the just-imported ``module`` for the process-wide monitor."""
    if target.module == "verl" and target.attribute is None:
        from advmon.integrations.verl import install

        install(None)
        return
    owner: Any = module
    *outer, name = (target.attribute or "").split(".")  # module:Outer.Inner.method names a nested class
    for part in outer:
        owner = getattr(owner, part, None)
    value = getattr(owner, name, None) if name else None
    if value is None:
        raise AdvmonConfigError(f"ADVMON_INSTRUMENT: {target.module} has no attribute {target.attribute!r}")
    if isinstance(value, type):
        instrument(value, None, target.method, target.names)
    elif callable(value):
        if not is_watched(value):  # what stood there stays equal to it (a framework's table may hold the function)
            setattr(owner, name, watch_in_place(value, None, target.names))
    else:
        raise AdvmonConfigError(f"ADVMON_INSTRUMENT: {target.module}:{target.attribute} is not a class or function")


# ---------------------------------------------------------------- patch on import


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the callbacks waiting for this module."""

    def __init__(self, loader: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self._loader, self._callbacks = loader, callbacks

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader  # leave no trace of advmon in the module
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        _run_callbacks(self._callbacks, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.pending: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._lock = threading.Lock()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        with self._lock:
            if name not in self.pending:
                return None
            callbacks = self.pending.pop(name)
        spec = None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            with self._lock:
                self.pending.setdefault(name, []).extend(callbacks)
            return spec
        spec.loader = _PatchingLoader(spec.loader, callbacks)
        return spec


_finder = _PatchOnImport()


def _when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        _run_callbacks([callback], module)
        return
    with _finder._lock:
        _finder.pending.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _run_callbacks(callbacks: list[Callable[[ModuleType], None]], module: ModuleType) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # noqa: BLE001 - an import must never fail because of advmon
            warn(f"advmon: could not instrument {module.__name__}: {exc}")


def deactivate() -> None:
    """Forget targets not imported yet (tests; what is already watched stays watched)."""
    with _finder._lock:
        _finder.pending.clear()
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)

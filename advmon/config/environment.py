"""``ADVMON_*`` variables: configure and activate advmon in processes you do not start.

Ray actors, worker pools and ``torchrun`` children inherit their environment and
little else. These variables describe the process-wide monitor there, and what to
instrument, so nothing in the worker's code has to change.

Every variable advmon reads is in :data:`VARIABLES`, the one list (docs/integrations.md's table is held
to it, and it to the variables advmon's code names, by tests/test_contracts.py).

Example:
    >>> settings = monitor_settings({"ADVMON_RUN": "grpo", "ADVMON_REWARD_RANGE": "0,1"})
    >>> settings["run"], settings["reward_range"]
    ('grpo', (0.0, 1.0))
    >>> parse_targets("my_rl.estimators:GRPO(rewards=scores,group_size=4); verl")[0]
    Target(module='my_rl.estimators', attribute='GRPO', method='compute_advantage', names=ArgumentNames(rewards='scores', mask='mask', groups='prompt_ids', group_size=4, slices=None, reward_functions=None, normalization=None))
"""

from __future__ import annotations

import importlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from advmon.errors import AdvmonConfigError
from advmon.hooks import ARGUMENT_NAME_OPTIONS, ArgumentNames
from advmon.normalization import checked_normalization

__all__ = [
    "INTERNAL_VARIABLES",
    "VARIABLES",
    "Target",
    "jsonl_path",
    "monitor_settings",
    "parse_targets",
    "resolve_attribute",
    "step_source_from",
]

#: Every ``ADVMON_*`` variable advmon reads -> what it means. The one list.
VARIABLES: dict[str, str] = {
    "ADVMON_RUN": "run id (default: the run the pickled wrapper came from, else a generated one)",
    "ADVMON_SINKS": "comma-separated sink specs besides the JSONL file (a bare jsonl names that file)",
    "ADVMON_DIR": "directory of the default JSONL file (default advmon-runs)",
    "ADVMON_PER_PROCESS": "1: name that file <run>.<host>-<pid>.jsonl, as several workers may record the same run",
    "ADVMON_REWARD_RANGE": "lo,hi (all-fail and all-pass groups)",
    "ADVMON_STEP_SOURCE": "module:attribute.path of the training step: an int, or a callable returning one",
    "ADVMON_INSTRUMENT": ";-separated targets to watch (module:Class, module:Class.method, module:function, "
                         "each with optional argument names), or verl",
    "ADVMON_EXEMPLARS": "worst groups per record (default 5; 0: none)",
    "ADVMON_HISTOGRAMS": "0: records carry no advantage histograms (default: when a sink takes them)",
    "ADVMON_RESUME": "1: continue the run in the JSONL file it wrote before",
    "ADVMON_STRICT": "1: raise advmon's own errors (tests)",
    "ADVMON_ALL_RANKS": "1: record on every rank, not only rank 0",
    "ADVMON_FINISH_ON_CALLER": "1: finish each record before the watched call returns (Ray workers)",
    "ADVMON_EXIT_TIMEOUT": "seconds interpreter exit may spend delivering (default 5)",
    "ADVMON_STATISTICS_PATH": "torch or triton: the device path for every tensor (default: by device)",
    "ADVMON_PUSHGATEWAY_USERNAME": "the Pushgateway's basic-auth user",
    "ADVMON_PUSHGATEWAY_PASSWORD": "its password (or ADVMON_PUSHGATEWAY_PASSWORD_FILE: a file holding it)",
    "ADVMON_PUSHGATEWAY_PASSWORD_FILE": "a file holding the Pushgateway's password",
    "ADVMON_PUSHGATEWAY_TOKEN": "a bearer token for the Pushgateway (or ADVMON_PUSHGATEWAY_TOKEN_FILE)",
    "ADVMON_PUSHGATEWAY_TOKEN_FILE": "a file holding the Pushgateway's bearer token",
}
#: Set by advmon itself, never by a user: Ray's setup hook that advmon's hook chains to.
INTERNAL_VARIABLES: tuple[str, ...] = ("ADVMON_NEXT_SETUP_HOOK",)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}
_TARGET = re.compile(r"^\s*(?P<module>[\w.]+)(?::(?P<attribute>[\w.]+))?\s*(?:\((?P<names>[^)]*)\))?\s*$")


@dataclass(frozen=True)
class Target:
    """What ``ADVMON_INSTRUMENT`` asks to watch: ``module:attribute[.method]``."""

    module: str
    attribute: str | None
    method: str
    names: ArgumentNames

    @property
    def spec(self) -> str:
        """The entry back as text (what :func:`parse_targets` reads)."""
        defaults = ArgumentNames()
        changed = [f"{k}={_option_text(getattr(self.names, k))}" for k in ARGUMENT_NAME_OPTIONS
                   if getattr(self.names, k) != getattr(defaults, k)]
        # A nested class (Outer.Inner) needs its method spelled out, or Inner would read as the method.
        spelled = self.method != "compute_advantage" or "." in (self.attribute or "")
        method = f".{self.method}" if spelled else ""
        names = f"({','.join(changed)})" if changed else ""
        return f"{self.module}:{self.attribute}{method}{names}" if self.attribute else self.module


def _option_text(value: Any) -> str:
    """An argument-name option as ADVMON_INSTRUMENT spells it: a normalization function as ``module:qualname``."""
    if not callable(value):
        return str(value)
    module, name = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
    if not module or "<" in name:  # a lambda or a local function: nothing another process can import
        raise AdvmonConfigError(
            f"the normalization function {value!r} cannot reach other processes (ADVMON_INSTRUMENT, Ray workers): "
            "define it at module level, or declare a kind")
    return f"{module}:{name}"


def flag(environ: Mapping[str, str], name: str) -> bool:
    value = environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise AdvmonConfigError(f"{name} must be 1 or 0, got {value!r}")


def monitor_settings(environ: Mapping[str, str] | None = None, run: str | None = None) -> dict[str, Any]:
    """The process-wide monitor's arguments, from ``ADVMON_*`` (``run`` if ``ADVMON_RUN`` is unset).

    Raises:
        AdvmonConfigError: a variable that cannot be read, naming it.
    """
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {"run": environ.get("ADVMON_RUN") or run}
    text = environ.get("ADVMON_REWARD_RANGE", "").strip()
    if text:
        low, comma, high = text.partition(",")
        try:
            settings["reward_range"] = (float(low), float(high))
        except ValueError:
            raise AdvmonConfigError(f"ADVMON_REWARD_RANGE must be 'lo,hi', got {text!r}") from None
        if not comma:
            raise AdvmonConfigError(f"ADVMON_REWARD_RANGE must be 'lo,hi', got {text!r}")
    source = environ.get("ADVMON_STEP_SOURCE", "").strip()
    if source:
        settings["step_source"] = step_source_from(source)
    text = environ.get("ADVMON_EXEMPLARS", "").strip()
    if text:
        try:
            settings["exemplars"] = int(text)
        except ValueError:
            raise AdvmonConfigError(f"ADVMON_EXEMPLARS must be a whole number (0 turns them off), got {text!r}") from None
    text = environ.get("ADVMON_HISTOGRAMS", "").strip()
    if text:
        if text not in ("0", "1"):
            raise AdvmonConfigError(f"ADVMON_HISTOGRAMS must be 0 or 1, got {text!r}")
        settings["histograms"] = text == "1"
    settings["strict"] = flag(environ, "ADVMON_STRICT")
    settings["all_ranks"] = flag(environ, "ADVMON_ALL_RANKS")
    settings["per_process"] = flag(environ, "ADVMON_PER_PROCESS")
    settings["resume"] = flag(environ, "ADVMON_RESUME")
    settings["finish_on_caller"] = flag(environ, "ADVMON_FINISH_ON_CALLER")
    settings["directory"] = Path(environ.get("ADVMON_DIR") or "advmon-runs")
    return settings


def jsonl_path(directory: Path, run: str, rank: int, per_process: bool) -> Path:
    """The default JSONL file: ``<run>.jsonl``, ``.rank<N>`` off rank 0, ``.<host>-<pid>`` per process."""
    name = run if rank == 0 else f"{run}.rank{rank}"
    if per_process:
        name = f"{name}.{socket.gethostname()}-{os.getpid()}"
    return directory / f"{name}.jsonl"


def resolve_attribute(spec: str) -> Any:
    """The object ``module:attribute.path`` names (``module`` alone: the module)."""
    module_name, _, path = spec.partition(":")
    try:
        value: Any = importlib.import_module(module_name.strip())
    except ImportError as exc:
        raise AdvmonConfigError(f"cannot import {module_name!r} (from {spec!r}): {exc}") from None
    for part in filter(None, path.strip().split(".")):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise AdvmonConfigError(f"{spec!r}: {type(value).__name__} {getattr(value, '__name__', value)!r} "
                                    f"has no attribute {part!r}") from None
    return value


def step_source_from(spec: str) -> Callable[[], int]:
    """A step source for ``module:attribute.path``: called if callable, else read as an int, at each call.

    The path is looked up at each call, not once: a controller's counter that is
    rebound (``self.step += 1`` on a module-level object) is read fresh.
    """
    if ":" not in spec:
        raise AdvmonConfigError(f"ADVMON_STEP_SOURCE must be 'module:attribute', got {spec!r}")
    resolve_attribute(spec)  # fails now, with the name, rather than at every call

    def current_step() -> int:
        value = resolve_attribute(spec)
        return int(value() if callable(value) else value)

    current_step.__qualname__ = f"step_source({spec})"
    return current_step


def parse_targets(text: str) -> list[Target]:
    """``ADVMON_INSTRUMENT`` entries, checked for form (not imported).

    ``module:Class`` watches ``Class.compute_advantage``; ``module:Class.method``
    another method; ``module:function`` a module-level function; ``verl`` every
    verl estimator (:mod:`advmon.integrations.verl`).
    """
    targets = []
    for entry in filter(str.strip, text.replace("\n", ";").split(";")):
        match = _TARGET.match(entry)
        if match is None:
            raise AdvmonConfigError(
                f"ADVMON_INSTRUMENT entry {entry.strip()!r} is not module:Class[.method][(rewards=...,mask=...)]"
            )
        attribute, method = match["attribute"], "compute_advantage"
        if attribute and "." in attribute:
            attribute, _, method = attribute.rpartition(".")
        if attribute is None and match["module"] != "verl":
            raise AdvmonConfigError(f"ADVMON_INSTRUMENT entry {entry.strip()!r} needs module:Class or module:function")
        targets.append(Target(match["module"], attribute, method, _names(match["names"], entry)))
    return targets


def _names(text: str | None, entry: str) -> ArgumentNames:
    values: dict[str, Any] = {}
    for pair in filter(str.strip, (text or "").split(",")):
        key, equals, value = (s.strip() for s in pair.partition("="))
        if not equals or key not in ARGUMENT_NAME_OPTIONS:
            *options, last = (f"{option}=" for option in ARGUMENT_NAME_OPTIONS)
            raise AdvmonConfigError(f"ADVMON_INSTRUMENT entry {entry.strip()!r}: expected {', '.join(options)} or "
                                    f"{last}, got {pair.strip()!r}")
        if key == "group_size":
            try:
                values[key] = int(value)
            except ValueError:
                raise AdvmonConfigError(f"ADVMON_INSTRUMENT entry {entry.strip()!r}: group_size must be an int") from None
        elif key == "normalization":  # a kind ("none" too: reward units), module:function, or "" to infer it
            try:
                values[key] = checked_normalization(resolve_attribute(value) if ":" in value else value or None)
            except AdvmonConfigError as error:
                raise AdvmonConfigError(f"ADVMON_INSTRUMENT entry {entry.strip()!r}: {error}") from None
        else:
            values[key] = None if value in ("", "None", "none") else value
    return ArgumentNames(**values)

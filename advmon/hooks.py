"""Hooks: wrap any advantage estimator without changing what it does.

:func:`watch_with` builds the wrapper behind ``@monitor.watch`` and
``advmon.watch``; :func:`instrument` applies it to an existing estimator object
or class; :func:`tap` lets an estimator hand over an intermediate tensor.

The wrapper is a plain function (so it binds as a method), keeps the wrapped
function's name, docstring and signature, and keeps no per-call state on itself:
the call in flight lives in a context variable.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from advmon.errors import AdvmonConfigError
from advmon.observation import InputObservation, Problem
from advmon.stats import Part

if TYPE_CHECKING:
    from advmon.monitor import Monitor

__all__ = ["ArgumentNames", "instrument", "is_watched", "tap", "watch_with"]

F = TypeVar("F", bound=Callable[..., Any])
_WATCHED = "__advmon_watched__"


@dataclass(frozen=True)
class ArgumentNames:
    """Which of the estimator's parameters hold rewards, mask and groups.

    The defaults match NeMo-RL's ``compute_advantage(prompt_ids, rewards, mask)``;
    verl's ``compute_grpo_outcome_advantage`` needs
    ``ArgumentNames(rewards="token_level_rewards", mask="response_mask", groups="index")``.
    ``None`` means the estimator has no such input: nothing is read, and for
    rewards their absence is not a problem (GDPO reads its rewards elsewhere).
    """

    rewards: str | None = "rewards"
    mask: str | None = "mask"
    groups: str | None = "prompt_ids"
    group_size: int | None = None

    def __post_init__(self) -> None:
        for name in ("rewards", "mask", "groups"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.isidentifier()):
                raise AdvmonConfigError(f"argument name for {name} must be an identifier or None, got {value!r}")
        size = self.group_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise AdvmonConfigError(f"group_size must be a positive int or None, got {size!r}")


@dataclass
class ActiveCall:
    """The watched call in flight: what taps need and what they recorded."""

    monitor: Monitor
    estimator: str
    inputs: dict[str, Any]
    owner: Any
    seen: InputObservation | None = None
    taps: dict[str, list[Part]] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


_ACTIVE: ContextVar[ActiveCall | None] = ContextVar("advmon_active_call", default=None)


def active_call() -> ActiveCall | None:
    """The watched call running in this context, if any."""
    return _ACTIVE.get()


def _resolver(monitor: Monitor | None) -> Callable[[], Monitor | None]:
    if monitor is not None:
        return lambda: monitor
    from advmon.lifecycle import default_monitor as get_monitor  # the process-wide one, looked up per call

    return get_monitor


def watch_with(fn: F, monitor: Monitor | None, names: ArgumentNames) -> F:
    """Wrap ``fn`` so each call is recorded by ``monitor`` (``None``: the process-wide one)."""
    resolve_monitor = _resolver(monitor)
    try:
        signature: inspect.Signature | None = inspect.signature(fn)
    except (TypeError, ValueError):
        signature = None
    estimator = f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__qualname__', repr(fn))}".lstrip(".")

    def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActiveCall | None:
        if _ACTIVE.get() is not None:
            # A watched estimator calling another one (or super()): the outer call
            # is the record, the inner one would count the same batch twice.
            return None
        monitor = resolve_monitor()
        if monitor is None:
            return None
        inputs, owner = _bind(signature, names, args, kwargs, fn)
        return monitor.start_call(estimator, inputs, owner, names)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def watched_async(*args: Any, **kwargs: Any) -> Any:
            call = start(args, kwargs)
            if call is None:
                return await fn(*args, **kwargs)
            token = _ACTIVE.set(call)
            try:
                result = await fn(*args, **kwargs)
            finally:
                _ACTIVE.reset(token)
            call.monitor.finish_call(call, result)
            return result

        setattr(watched_async, _WATCHED, _target_key(monitor))
        return watched_async  # type: ignore[return-value]

    @functools.wraps(fn)
    def watched(*args: Any, **kwargs: Any) -> Any:
        call = start(args, kwargs)
        if call is None:
            return fn(*args, **kwargs)
        token = _ACTIVE.set(call)
        try:
            result = fn(*args, **kwargs)
        finally:
            _ACTIVE.reset(token)
        call.monitor.finish_call(call, result)
        return result

    setattr(watched, _WATCHED, _target_key(monitor))
    return watched  # type: ignore[return-value]


def _target_key(monitor: Monitor | None) -> object:
    return "default" if monitor is None else monitor


def _bind(
    signature: inspect.Signature | None,
    names: ArgumentNames,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    fn: Callable[..., Any],
) -> tuple[dict[str, Any] | None, Any]:
    """The arguments advmon reads, by name, or ``None`` when they cannot be bound."""
    owner = getattr(fn, "__self__", None)
    if signature is None:
        return None, owner
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None, owner  # the call itself will raise the same TypeError
    bound.apply_defaults()
    extra: dict[str, Any] = {}
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extra = bound.arguments.get(parameter.name, {})
    arguments = bound.arguments

    def lookup(name: str | None) -> Any:
        if name is None:
            return None
        return arguments[name] if name in arguments else extra.get(name)

    owner = arguments.get("self", owner)
    inputs = {"rewards": lookup(names.rewards), "mask": lookup(names.mask), "groups": lookup(names.groups)}
    return inputs, owner


def is_watched(fn: Any, monitor: Monitor | None | object = ...) -> bool:
    """Whether ``fn`` (or a bound method's function) is an advmon wrapper, for ``monitor`` if given."""
    keys = [getattr(fn, _WATCHED, None), getattr(getattr(fn, "__func__", None), _WATCHED, None)]
    keys = [k for k in keys if k is not None]
    return bool(keys) if monitor is ... else _target_key(monitor) in keys


def instrument(target: Any, monitor: Monitor | None, method: str, names: ArgumentNames) -> Any:
    """Wrap ``target.method`` in place (an instance or a class); idempotent per monitor.

    An instance whose class is watched by another monitor is wrapped again: the
    instance's wrapper is the outer call, so its monitor records and the class's
    wrapper lets the call through.
    """
    if isinstance(target, type):
        try:
            raw = inspect.getattr_static(target, method)
        except AttributeError:
            raise AdvmonConfigError(f"{target.__qualname__} has no method {method!r}") from None
        if isinstance(raw, (staticmethod, classmethod)):
            if not is_watched(raw.__func__, monitor):
                setattr(target, method, type(raw)(watch_with(raw.__func__, monitor, names)))
        elif callable(raw):
            if not is_watched(raw, monitor):
                setattr(target, method, watch_with(raw, monitor, names))
        else:
            raise AdvmonConfigError(f"{target.__qualname__}.{method} is not callable")
        return target
    bound = getattr(target, method, None)
    if bound is None or not callable(bound):
        raise AdvmonConfigError(f"{type(target).__qualname__} object has no method {method!r}")
    if not is_watched(bound, monitor):
        setattr(target, method, watch_with(bound, monitor, names))
    return target


def tap(stage: str, tensor: Any, mask: Any = None) -> Any:
    """Record ``tensor`` for ``stage`` of the watched call in flight, and return it.

    Use it inside an estimator for a tensor the estimator never returns, most
    usefully ``"pre_norm"`` just before it divides by the std. Statistics are taken
    at once (the estimator may then change the tensor in place). Without ``mask``,
    the call's mask is used when its shape matches. Outside a watched call this
    does nothing.

    Example:
        >>> import torch, advmon
        >>> advmon.tap("pre_norm", torch.ones(2)).tolist()  # no watched call: a no-op
        [1.0, 1.0]
    """
    call = _ACTIVE.get()
    if call is not None:
        call.monitor._record_tap(call, stage, tensor, mask)
    return tensor

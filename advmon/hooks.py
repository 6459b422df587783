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
import sys
import types
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, TypeVar, overload

from advmon.errors import AdvmonConfigError
from advmon.normalization import Normalization, checked_normalization
from advmon.observation import InputObservation, Problem
from advmon.stats import Part

__all__ = [
    "ARGUMENT_NAME_OPTIONS",
    "PARAMETER_NAMES",
    "ArgumentNames",
    "Recorder",
    "checked_argument_names",
    "current_reward_functions",
    "current_slice_labels",
    "grouped_by",
    "instrument",
    "is_watched",
    "say_switched",
    "scored_by",
    "sliced_by",
    "takes_argument_names",
    "tap",
    "unmapped_inputs",
    "watch",
    "watch_in_place",
    "watch_names",
    "watch_with",
]

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
    #: The parameter holding per-sample slice labels (``data_source``), or ``parameter.key`` for a
    #: key or attribute of one (NeMo-RL's ``repeated_batch.task_name``); ``None``: no slices.
    slices: str | None = None
    #: The parameter holding per-function rewards: a mapping of name to per-sample values, or
    #: ``parameter:prefix`` for its keys that start with ``prefix`` (NeMo-RL's GDPO components,
    #: ``repeated_batch:reward/``); ``None``: none (or :func:`scored_by`'s).
    reward_functions: str | None = None
    #: How the estimator normalizes its advantages, which decides how large they may be
    #: (:mod:`advmon.normalization`): a kind (``"group_std"``, ``"group_loo_std"``, ``"group_mean"``,
    #: ``"gpg"``, ``"batch"``, ``"none"``), a function of the call's arguments (a mapping by parameter
    #: name, ``self`` included) returning one, or ``None``: inferred from each call's data.
    normalization: Normalization = None

    def __post_init__(self) -> None:
        for name in ("rewards", "mask", "groups"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.isidentifier()):
                raise AdvmonConfigError(f"argument name for {name} must be an identifier or None, got {value!r}")
        path = self.slices
        if path is not None and (not isinstance(path, str) or not all(p.isidentifier() for p in path.split("."))):
            raise AdvmonConfigError(f"argument name for slices must be an identifier or 'parameter.key', got {path!r}")
        spec = self.reward_functions
        if spec is not None and (not isinstance(spec, str) or not spec.partition(":")[0].isidentifier()):
            raise AdvmonConfigError(
                f"argument name for reward_functions must be an identifier or 'parameter:prefix', got {spec!r}")
        checked_normalization(self.normalization)
        size = self.group_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise AdvmonConfigError(f"group_size must be a positive int or None, got {size!r}")


#: The options :class:`ArgumentNames` takes, as ``watch``, ``instrument`` and ``ADVMON_INSTRUMENT`` name them.
ARGUMENT_NAME_OPTIONS = tuple(option.name for option in fields(ArgumentNames))


def _unknown_options(names: Mapping[str, Any]) -> list[str]:
    """The keywords among ``names`` that are no :class:`ArgumentNames` option, in the order given."""
    return [name for name in names if name not in ARGUMENT_NAME_OPTIONS]


def checked_argument_names(options: Mapping[str, Any]) -> ArgumentNames:
    """:class:`ArgumentNames` from ``instrument``'s keywords; an unknown one is a configuration error.

    Example:
        >>> checked_argument_names({"rewards": "scores"}).rewards
        'scores'
        >>> checked_argument_names({"reward": "scores"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        advmon.errors.AdvmonConfigError: unknown argument name option(s) ['reward']; expected rewards=, mask=, ...
    """
    unknown = _unknown_options(options)
    if unknown:
        raise AdvmonConfigError(f"unknown argument name option(s) {sorted(unknown)}; expected "
                                f"{', '.join(f'{option}=' for option in ARGUMENT_NAME_OPTIONS)}")
    return ArgumentNames(**options)


def takes_argument_names(function: F) -> F:
    """Give a ``watch(fn=None, **names)`` the signature its callers see: its own parameters, then one
    keyword-only parameter per field of :class:`ArgumentNames`, with the field's default and annotation.

    ``advmon.watch`` and ``Monitor.watch`` take their argument names this way, so the options are
    written once, in :class:`ArgumentNames`, and ``help()``, :func:`inspect.signature` and
    documentation tools still list each of them (their ``@overload`` declarations spell them out for type
    checkers; tests/test_settings_once.py holds those to :class:`ArgumentNames`).

    Example:
        >>> @takes_argument_names
        ... def watch(fn=None, **names):
        ...     return watch_names("watch", names)
        >>> str(inspect.signature(watch)).startswith("(fn=None, *, rewards: 'str | None' = 'rewards', mask:")
        True
    """
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=option.default,
                                 annotation=option.type) for option in fields(ArgumentNames)]
    function.__signature__ = signature.replace(parameters=[*own, *options])  # type: ignore[attr-defined]
    return function


def watch_names(caller: str, names: Mapping[str, Any]) -> ArgumentNames:
    """The :class:`ArgumentNames` a ``watch`` was given; an unknown keyword is the ``TypeError`` Python raises
    for a function that does not take it (``caller`` names the function, as Python would).

    Example:
        >>> watch_names("watch", {"reward": "scores"})
        Traceback (most recent call last):
        TypeError: watch() got an unexpected keyword argument 'reward'
    """
    unknown = _unknown_options(names)
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    return ArgumentNames(**names)


#: The names frameworks give the inputs advmon reads (docs/api.md, "Parameter names"), first found wins, where
#: ``watch`` keeps its default name for the input: NeMo-RL's, verl's and SkyRL's, TRL's, AReaL's, OpenRLHF's.
PARAMETER_NAMES: dict[str, tuple[str, ...]] = {
    "rewards": ("rewards", "token_level_rewards", "reward", "token_level_scores", "scores"),
    "mask": ("mask", "response_mask", "completion_mask", "loss_mask", "action_mask", "eos_mask"),
    "groups": ("prompt_ids", "index", "uids", "uid", "group_ids", "prompt_index"),
}
_DEFAULT_NAMES = {field: ArgumentNames.__dataclass_fields__[field].default for field in PARAMETER_NAMES}


class Recorder(Protocol):
    """What a wrapper hands its calls to: start a call, finish it, record a tap.

    :class:`advmon.Monitor` implements it; this module knows no more of a monitor
    than this, so the capture layer does not import the monitor (the dependency points
    down: the monitor imports hooks). A wrapper finds the process-wide recorder, or
    the one of its run, through :mod:`advmon.lifecycle`, where the monitor registers.
    """

    #: The run the recorder writes; a wrapper that crosses processes carries it.
    run: str

    def start_call(
        self, estimator: str, inputs: dict[str, Any] | None, owner: Any, names: ArgumentNames
    ) -> ActiveCall | None:
        """Begin recording a call of ``estimator`` (``None``: just run it); ``inputs`` as :func:`_bind` found
        them (``None``: the arguments could not be bound)."""
        ...

    def finish_call(self, call: ActiveCall, result: Any) -> None:
        """The call returned ``result``: record it (never raises into the caller unless asked to be strict)."""
        ...

    def record_tap(self, call: ActiveCall, stage: str, tensor: Any, mask: Any) -> None:
        """:func:`tap` inside ``call``: take ``tensor``'s statistics for ``stage`` now."""
        ...


@dataclass
class ActiveCall:
    """The watched call in flight: what taps need and what they recorded."""

    monitor: Recorder
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


class Binding:
    """Which monitor a wrapper records to; pickles as the run name, never as the monitor.

    ``monitor=None`` means the process-wide monitor. A wrapper that crossed to
    another process (a Ray actor, a worker pool) resolves its monitor there, at
    each call: the open monitor of the same run in that process, else the
    process-wide one (built from ``ADVMON_*`` variables on first use).
    """

    __slots__ = ("monitor", "run")

    def __init__(self, monitor: Recorder | None, run: str | None = None) -> None:
        self.monitor = monitor
        self.run = monitor.run if monitor is not None else run

    def resolve(self) -> Recorder | None:
        if self.monitor is not None:
            return self.monitor
        from advmon.lifecycle import default_monitor, monitor_of_run

        found = monitor_of_run(self.run) if self.run is not None else None
        return found if found is not None else default_monitor(self.run)

    def covers(self, other: Binding) -> bool:
        """Whether a wrapper bound here already records where ``other`` would."""
        if other.monitor is None:
            return self.run == other.run
        return self.monitor is other.monitor or (self.monitor is None and self.run == other.run)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Binding, (None, self.run))

    def __repr__(self) -> str:
        return f"Binding(run={self.run!r})" if self.run is not None else "Binding(process-wide)"


class WatchState:
    """What a wrapper needs at each call; pickles as ``(fn, binding, names)``."""

    __slots__ = ("binding", "estimator", "fn", "names", "_signature")

    def __init__(self, fn: Callable[..., Any], binding: Binding, names: ArgumentNames) -> None:
        self.fn, self.binding, self.names = fn, binding, names
        self.estimator = f"{getattr(fn, '__module__', None) or ''}.{getattr(fn, '__qualname__', repr(fn))}".lstrip(".")
        self._signature: inspect.Signature | None | bool = False  # False: not looked up yet

    @property
    def signature(self) -> inspect.Signature | None:
        if self._signature is False:
            try:
                self._signature = inspect.signature(self.fn)
            except (TypeError, ValueError):
                self._signature = None
        return self._signature  # type: ignore[return-value]

    def start(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActiveCall | None:
        if _ACTIVE.get() is not None:
            # A watched estimator calling another one (or super()): the outer call
            # is the record, the inner one would count the same batch twice.
            return None
        try:
            monitor = self.binding.resolve()
        except Exception as exc:  # noqa: BLE001 - e.g. bad ADVMON_* variables in a worker
            _warn_unresolved(exc)
            return None
        if monitor is None:
            return None
        inputs, owner = _bind(self.signature, self.names, args, kwargs, self.fn)
        return monitor.start_call(self.estimator, inputs, owner, self.names)

    def __reduce__(self) -> tuple[Any, ...]:
        return (WatchState, (self.fn, self.binding, self.names))


_unresolved_warned: set[str] = set()


def _warn_unresolved(exc: Exception) -> None:
    """Once per kind of failure: the call runs unrecorded, the training loop never sees it."""
    message = f"{type(exc).__name__}: {exc}"
    if message not in _unresolved_warned:
        _unresolved_warned.add(message)
        from advmon.errors import warn

        warn(f"advmon: no monitor for watched calls in this process, they run unrecorded: {message}")


def run_watched(state: WatchState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One call of a synchronous wrapper."""
    call = state.start(args, kwargs)
    if call is None:
        return state.fn(*args, **kwargs)
    token = _ACTIVE.set(call)
    try:
        result = state.fn(*args, **kwargs)
    finally:
        _ACTIVE.reset(token)
    call.monitor.finish_call(call, result)
    return result


async def run_watched_async(state: WatchState, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """One call of an ``async def`` wrapper."""
    call = state.start(args, kwargs)
    if call is None:
        return await state.fn(*args, **kwargs)
    token = _ACTIVE.set(call)
    try:
        result = await state.fn(*args, **kwargs)
    finally:
        _ACTIVE.reset(token)
    call.monitor.finish_call(call, result)
    return result


def watch_with(fn: F, monitor: Recorder | None, names: ArgumentNames) -> F:
    """Wrap ``fn`` so each call is recorded by ``monitor`` (``None``: the process-wide one).

    The wrapper is a plain function (it binds as a method and stays a coroutine
    function for ``async def``) whose closure holds only a :class:`WatchState`,
    and whose globals are this module's importable functions: cloudpickle sends
    it by value without the monitor, plain pickle by reference where it is the
    module's attribute.
    """
    return _wrapper(WatchState(fn, Binding(monitor), names))  # type: ignore[return-value]


@overload
def watch(fn: F) -> F: ...


@overload
def watch(
    fn: None = None,
    *,
    rewards: str | None = "rewards",
    mask: str | None = "mask",
    groups: str | None = "prompt_ids",
    group_size: int | None = None,
    slices: str | None = None,
    reward_functions: str | None = None,
    normalization: Normalization = None,
) -> Callable[[F], F]: ...


@takes_argument_names
def watch(fn: F | None = None, **names: Any) -> F | Callable[[F], F]:
    """Like :meth:`advmon.Monitor.watch`, on the process-wide monitor :func:`advmon.get_monitor`.

    The monitor is looked up at each call, so :func:`advmon.set_monitor` after
    decoration still takes effect. This is ``advmon.watch``; its keywords are
    :class:`ArgumentNames`' fields.
    """
    argument_names = watch_names("watch", names)

    def decorate(function: F) -> F:
        return watch_with(function, None, argument_names)

    return decorate(fn) if fn is not None else decorate


def _wrapper(state: WatchState) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(state.fn):

        async def watched_async(*args: Any, **kwargs: Any) -> Any:
            return await run_watched_async(state, args, kwargs)

        wrapper: Callable[..., Any] = watched_async
    else:

        def watched(*args: Any, **kwargs: Any) -> Any:
            return run_watched(state, args, kwargs)

        wrapper = watched
    functools.update_wrapper(wrapper, state.fn)
    setattr(wrapper, _WATCHED, state)
    return wrapper


def watch_in_place(fn: F, monitor: Recorder | None, names: ArgumentNames) -> F:
    """:func:`watch_with` for a function that stays where a framework keeps it (a registry, a module attribute).

    What a framework's lookups give back must still be what was registered: the result
    (:class:`WatchedFunction`) compares equal to and hashes like ``fn``, has its name, module, qualified
    name, docstring and signature, binds as a method, and pickles by reference where it stands in for ``fn``
    at ``fn``'s own module attribute. An ``async def`` gets :func:`watch_with`'s wrapper (a coroutine function).

    Example:
        >>> def estimate(rewards):
        ...     return rewards
        >>> watched = watch_in_place(estimate, None, ArgumentNames())
        >>> watched == estimate, estimate == watched, hash(watched) == hash(estimate), {estimate: 1}[watched]
        (True, True, True, 1)
        >>> watched.__name__, str(inspect.signature(watched)), is_watched(watched)
        ('estimate', '(rewards)', True)
    """
    if inspect.iscoroutinefunction(fn):
        return watch_with(fn, monitor, names)
    return WatchedFunction(WatchState(fn, Binding(monitor), names))  # type: ignore[return-value]


class WatchedFunction:
    """A watched function that looks like the function it watches to whoever compares, hashes or pickles it.

    Made by :func:`watch_in_place`. A plain wrapper function is a new object: ``registry.get(name) == fn``
    is ``False`` (SkyRL's and verl's registries compare), a set or dict keyed by the function misses it, and
    plain pickle refuses the function once its module attribute is the wrapper. This one is equal to and
    hashes like the function, and anything else it is asked (``__code__``, ``__defaults__``, ...) is the
    function's. It keeps no per-call state (the call in flight is a context variable's).
    """

    def __init__(self, state: WatchState) -> None:
        functools.update_wrapper(self, state.fn)  # name, module, qualname, doc, annotations, __wrapped__
        self.__dict__[_WATCHED] = state
        self.__dict__["_advmon_call"] = _wrapper(state)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._advmon_call(*args, **kwargs)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __eq__(self, other: object) -> bool:
        return self.__wrapped__ == (other.__wrapped__ if isinstance(other, WatchedFunction) else other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __getattr__(self, name: str) -> Any:
        # Only reached for what the instance lacks: the function's own attributes (__code__, __globals__, ...).
        wrapped = self.__dict__.get("__wrapped__")
        if wrapped is None or name.startswith("_advmon") or name == _WATCHED:
            raise AttributeError(name)
        return getattr(wrapped, name)

    def __reduce__(self) -> Any:
        state: WatchState = self.__dict__[_WATCHED]
        module = sys.modules.get(getattr(state.fn, "__module__", None) or "")
        owner: Any = module
        for part in (getattr(state.fn, "__qualname__", "") or "<>").split("."):
            owner = getattr(owner, part, None)
        if owner is self:  # it stands at the function's own name: by reference, as the function would
            return self.__qualname__
        return (WatchedFunction, (state,))  # the state pickles as (function, binding, names)

    def __repr__(self) -> str:
        return f"<advmon-watched function {self.__qualname__}>"


class BoundWatched:
    """An instance's watched method: pickles with its instance, as ``(function, binding, names)``.

    A bound method in the instance's ``__dict__`` would pickle as
    ``getattr(instance, name)``, which runs before the instance's state is restored
    and so finds the class's plain method: the copy would record nothing, silently.
    This object pickles the class's function instead and wraps it again on arrival.
    It looks like a function to :mod:`inspect` (signature, ``async def``).
    """

    def __init__(self, function: Callable[..., Any], instance: Any, binding: Binding, names: ArgumentNames) -> None:
        self.__func__ = _wrapper(WatchState(function, binding, names))
        self.__self__ = instance
        self._function = function
        self.__wrapped__ = types.MethodType(function, instance)
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(self, attribute, getattr(function, attribute, None))
        # inspect.iscoroutinefunction reads these on a "function-like" object.
        code = getattr(function, "__code__", None)
        if code is not None:
            self.__code__ = code
            self.__defaults__ = getattr(function, "__defaults__", None)
            self.__kwdefaults__ = getattr(function, "__kwdefaults__", None)
            self.__annotations__ = getattr(function, "__annotations__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(self.__self__, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        state: WatchState = getattr(self.__func__, _WATCHED)
        return (BoundWatched, (self._function, self.__self__, state.binding, state.names))

    def __repr__(self) -> str:
        return f"<advmon-watched method {self.__qualname__} of {self.__self__!r}>"


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
    found = {field: _parameter(field, getattr(names, field), arguments, extra) for field in PARAMETER_NAMES}
    groups = lookup(found["groups"])
    inputs = {"rewards": lookup(found["rewards"]), "mask": lookup(found["mask"]),
              "groups": groups if groups is not None else _GROUP_KEYS.get(),
              "slices": _slice_labels(lookup, names.slices),
              "reward_functions": _reward_functions(lookup, names.reward_functions)}
    if callable(names.normalization):  # it reads the call's own arguments (verl's norm_adv_by_std_in_grpo)
        inputs["arguments"] = {**extra, **arguments}
    # Inputs watch() kept its default for and no parameter of the estimator holds: said once by the monitor.
    inputs["unfound"] = tuple(field for field, name in found.items() if name is _UNFOUND)
    if inputs["unfound"]:
        inputs["parameters"] = tuple(name for name in signature.parameters if name != "self")
    return inputs, owner


_UNFOUND = "<not among the estimator's parameters>"


def unmapped_inputs(call: ActiveCall, advantages: Any) -> list[Problem]:
    """What a watched call's statistics miss because ``watch`` kept a default name its estimator does not use.

    Per-token advantages without a mask count every position, padding included; rewards without
    groups leave the groups' statistics and the zero-std alert off. Each is a problem (said once,
    counted), naming the estimator's parameters and the ``watch`` argument that maps them.

    Example:
        >>> import torch
        >>> call = ActiveCall(None, "grpo", {"unfound": ("mask",), "parameters": ("rewards", "resp_mask")}, None)
        >>> print(unmapped_inputs(call, torch.zeros(4, 16))[0].message)  # doctest: +ELLIPSIS
        grpo returned per-token advantages [4, 16] but advmon found no mask: ... Name it with watch(mask='...')...
    """
    unfound, parameters = call.inputs.get("unfound", ()), ", ".join(call.inputs.get("parameters", ()))
    problems = []
    shape = getattr(advantages, "shape", ())
    if "mask" in unfound and len(shape) == 2 and shape[1] > 1:
        problems.append(Problem("no_mask", (
            f"{call.estimator} returned per-token advantages {list(shape)} but advmon found no mask: none of its "
            f"parameters ({parameters}) has a name it knows ({', '.join(PARAMETER_NAMES['mask'])}), so every "
            "position counts, padding included. Name it with watch(mask='...'), or watch(mask=None) if every "
            "position is valid")))
    seen = call.seen
    grouped = seen is not None and (seen.group_ids is not None or seen.group_size is not None)
    if "groups" in unfound and seen is not None and seen.rewards is not None and not grouped:
        problems.append(Problem("no_groups", (
            f"{call.estimator} takes rewards but advmon found no group ids: none of its parameters ({parameters}) "
            f"has a name it knows ({', '.join(PARAMETER_NAMES['groups'])}), so the groups' statistics and the "
            "zero-std alert are off. Name them with watch(groups='...') or watch(group_size=G), or "
            "watch(groups=None) if the estimator has none")))
    return problems


def _parameter(field: str, name: str | None, arguments: Mapping[str, Any], extra: Mapping[str, Any]) -> str | None:
    """The parameter holding ``field``: the name given to ``watch``, or with its default the first of
    :data:`PARAMETER_NAMES` the call has (``_UNFOUND`` if none; ``None``: the estimator has no such input)."""
    if name is None or name != _DEFAULT_NAMES[field] or name in arguments or name in extra:
        return name
    return next((alias for alias in PARAMETER_NAMES[field] if alias in arguments or alias in extra), _UNFOUND)


def _slice_labels(lookup: Callable[[str | None], Any], path: str | None) -> Any:
    """The labels ``parameter`` or ``parameter.key`` names (a mapping's key or an attribute); else :func:`sliced_by`'s."""
    if path is None:
        return _SLICE_LABELS.get()
    first, *rest = path.split(".")
    value = lookup(first)
    for key in rest:
        if value is None:
            break
        value = value.get(key) if isinstance(value, Mapping) else getattr(value, key, None)
    return _SLICE_LABELS.get() if value is None else value


_SLICE_LABELS: ContextVar[Any] = ContextVar("advmon_slice_labels", default=None)
_GROUP_KEYS: ContextVar[Any] = ContextVar("advmon_group_keys", default=None)
_REWARD_FUNCTIONS: ContextVar[Any] = ContextVar("advmon_reward_functions", default=None)


def _reward_functions(lookup: Callable[[str | None], Any], spec: str | None) -> Any:
    """``{name: per-sample rewards}`` from ``parameter`` or ``parameter:prefix``; else :func:`scored_by`'s."""
    if spec is None:
        return _REWARD_FUNCTIONS.get()
    parameter, colon, prefix = spec.partition(":")
    value = lookup(parameter)
    if not isinstance(value, Mapping):
        return _REWARD_FUNCTIONS.get()
    if not colon:
        return dict(value)
    return {key[len(prefix):]: v for key, v in value.items() if isinstance(key, str) and key.startswith(prefix)} or None


@contextmanager
def scored_by(reward_functions: Mapping[str, Any] | None) -> Iterator[None]:
    """Per-function rewards (``{name: per-sample values}``) for the watched calls inside the block.

    For a caller that has each reward function's scores when the estimator only
    gets their sum (verl's trainer holds GDPO's reward keys). ``None`` changes nothing.

    Example:
        >>> with scored_by({"format": [1.0, 0.0]}):
        ...     current_reward_functions()
        {'format': [1.0, 0.0]}
    """
    token = _REWARD_FUNCTIONS.set(reward_functions if reward_functions is not None else _REWARD_FUNCTIONS.get())
    try:
        yield
    finally:
        _REWARD_FUNCTIONS.reset(token)


def current_reward_functions() -> Any:
    """The per-function rewards of the innermost :func:`scored_by` block (``None`` outside one)."""
    return _REWARD_FUNCTIONS.get()


@contextmanager
def sliced_by(labels: Any) -> Iterator[None]:
    """Slice labels for the watched calls inside the block whose estimators do not take them.

    For a caller that has the labels but calls an estimator that does not (verl's
    ``ray_trainer.compute_advantage`` holds ``data_source``; its estimators get
    only the uids). ``None`` changes nothing.

    Example:
        >>> with sliced_by(["gsm8k", "math"]):
        ...     _SLICE_LABELS.get()
        ['gsm8k', 'math']
    """
    token = _SLICE_LABELS.set(labels if labels is not None else _SLICE_LABELS.get())
    try:
        yield
    finally:
        _SLICE_LABELS.reset(token)


@contextmanager
def grouped_by(keys: Any) -> Iterator[None]:
    """Group keys (one per sample: verl's uids) for the watched calls inside the block whose estimators do not
    get their groups (verl's GAE gets values, not uids). ``None`` changes nothing.

    Example:
        >>> with grouped_by(["uid-0", "uid-0", "uid-1"]):
        ...     _GROUP_KEYS.get()
        ['uid-0', 'uid-0', 'uid-1']
    """
    token = _GROUP_KEYS.set(keys if keys is not None else _GROUP_KEYS.get())
    try:
        yield
    finally:
        _GROUP_KEYS.reset(token)


def current_slice_labels() -> Any:
    """The labels of the innermost :func:`sliced_by` block (``None`` outside one)."""
    return _SLICE_LABELS.get()


def is_watched(fn: Any, monitor: Recorder | None | object = ...) -> bool:
    """Whether ``fn`` (or a bound method's function) is an advmon wrapper, for ``monitor`` if given."""
    states = [getattr(fn, _WATCHED, None), getattr(getattr(fn, "__func__", None), _WATCHED, None)]
    states = [s for s in states if isinstance(s, WatchState)]
    if monitor is ...:
        return bool(states)
    wanted = Binding(monitor)  # type: ignore[arg-type]
    return any(s.binding.covers(wanted) for s in states)


def instrument(target: Any, monitor: Recorder | None, method: str, names: ArgumentNames) -> Any:
    """Wrap ``target.method`` in place (an instance or a class); idempotent per monitor.

    An instance whose class is watched by another monitor is wrapped again: the
    instance's wrapper is the outer call, so its monitor records and the class's
    wrapper lets the call through. The same target instrumented again for another
    monitor moves to it, with one warning (:func:`say_switched`): a notebook cell run
    again with a new monitor records there, never silently into the first. ``None``
    (the process-wide monitor) keeps an existing instrumentation as it is. An
    instrumented instance pickles with its
    instrumentation; a class instrumented here reaches other processes through
    ``advmon.integrations.ray.runtime_env()`` (see :func:`instrumented_classes`).
    """
    _refuse_remote_class(target)
    if isinstance(target, type):
        return _instrument_class(target, Binding(monitor), method, names)
    bound = getattr(target, method, None)
    if bound is None or not callable(bound):
        raise AdvmonConfigError(f"{type(target).__qualname__} object has no method {method!r}")
    if is_watched(bound, monitor):
        return target
    earlier = _watch_state(getattr(target, "__dict__", {}).get(method))
    if earlier is not None:  # this instance's own wrapper, for another monitor
        if monitor is None:
            return target
        say_switched(f"{type(target).__qualname__}.{method} of {target!r}", earlier.binding, monitor)
        _unwrap_instance(target, method)
        bound = getattr(target, method)
    try:
        raw = inspect.getattr_static(type(target), method)
    except AttributeError:
        raw = None
    owned = method in getattr(target, "__dict__", {})
    if inspect.isfunction(raw) and not owned and getattr(bound, "__self__", None) is target:
        setattr(target, method, BoundWatched(raw, target, Binding(monitor), names))
    else:  # a callable attribute, a staticmethod, a builtin: wrap what the instance gives
        setattr(target, method, watch_with(bound, monitor, names))
    return target


#: Classes instrumented in this process, for carrying to workers: class -> method -> (names, run).
_instrumented_classes: weakref.WeakKeyDictionary[type, dict[str, tuple[ArgumentNames, str | None]]] = (
    weakref.WeakKeyDictionary())


def _instrument_class(target: type, binding: Binding, method: str, names: ArgumentNames) -> type:
    try:
        raw = inspect.getattr_static(target, method)
    except AttributeError:
        raise AdvmonConfigError(f"{target.__qualname__} has no method {method!r}") from None
    wrapped = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
    if not callable(wrapped):
        raise AdvmonConfigError(f"{target.__qualname__}.{method} is not callable")
    state = getattr(wrapped, _WATCHED, None)
    if isinstance(state, WatchState) and getattr(wrapped, "__wrapped__", None) is not state.fn:
        # Not advmon's wrapper but a function that copied one's attributes (``functools.wraps(Base.method)`` in a
        # subclass of an instrumented class): the subclass's own code, to be wrapped as it is, never dropped.
        state = None
    if isinstance(state, WatchState) and not state.binding.covers(binding):
        if binding.monitor is None:  # the process-wide monitor (or a run's, arriving in a worker): kept as it is
            return target
        say_switched(f"{target.__qualname__}.{method}", state.binding, binding.monitor)
        wrapped, state = state.fn, None  # re-wrapped below, around the class's own function
    if not isinstance(state, WatchState):
        wrapper = _wrapper(WatchState(wrapped, binding, names))
        setattr(target, method, type(raw)(wrapper) if isinstance(raw, (staticmethod, classmethod)) else wrapper)
    _instrumented_classes.setdefault(target, {})[method] = (names, binding.run)
    _carry_instances(target)
    return target


def _watch_state(value: Any) -> WatchState | None:
    """The :class:`WatchState` of an advmon wrapper (a function, a :class:`BoundWatched`), else ``None``."""
    for candidate in (value, getattr(value, "__func__", None)):
        state = getattr(candidate, _WATCHED, None)
        if isinstance(state, WatchState):
            return state
    return None


def _unwrap_instance(target: Any, method: str) -> None:
    """Take an instance's own wrapper off: the class's method shows again, or what the wrapper wrapped."""
    own = target.__dict__[method]
    if isinstance(own, BoundWatched):
        delattr(target, method)
    else:
        setattr(target, method, _watch_state(own).fn)  # type: ignore[union-attr]


def say_switched(target: str, before: Binding | Recorder | None, after: Recorder, undo: str | None = None) -> None:
    """One warning: ``target``, instrumented for one monitor, now records to ``after`` (instrumented again).

    Nothing is said when the earlier monitor is closed (a run finished, the next one instrumented: nothing of
    the earlier run is lost).

    Example:
        >>> import warnings
        >>> class Run:
        ...     run = "grpo-2"
        >>> with warnings.catch_warnings(record=True) as said:
        ...     warnings.simplefilter("always")
        ...     say_switched("verl's estimators", None, Run(), "advmon.integrations.verl.uninstrument()")
        >>> print(said[0].message)  # doctest: +ELLIPSIS
        advmon: instrumenting verl's estimators again, for another monitor (run 'grpo-2'): its calls go to ...
    """
    from advmon.errors import warn

    earlier = before.monitor if isinstance(before, Binding) and before.monitor is not None else before
    if getattr(earlier, "closed", False):
        return  # the earlier monitor is closed: it records nothing any more, so moving loses nothing to say
    run = before.run if isinstance(before, Binding) else getattr(before, "run", None)
    described = "the process-wide monitor" if earlier is None and run is None else f"a monitor of run {run!r}"
    warn(f"advmon: instrumenting {target} again, for another monitor (run {after.run!r}): its calls go to that "
         f"one now, and {described}, which it was instrumented for, records no more of them"
         + (f". To switch without this warning, call {undo} first" if undo else ""))


def _carry_instances(cls: type) -> None:
    """Make instances of ``cls`` re-instrument their class where they are unpickled.

    A class pickles by name, so a worker that unpickles an instance would find the
    plain class there and record nothing (NeMo-RL builds its estimator in the driver
    and sends it to the single controller's actor). The instance's reduce gains one
    step: instrument the class as here, then build the instance as before.
    """
    if "__advmon_own_reduce_ex__" in cls.__dict__:
        return
    own = cls.__dict__.get("__reduce_ex__")

    def __reduce_ex__(self: Any, protocol: int) -> Any:
        return carrying_reduce(cls, own, self, protocol)

    cls.__advmon_own_reduce_ex__ = own  # type: ignore[attr-defined]
    cls.__reduce_ex__ = __reduce_ex__  # type: ignore[method-assign]


def carrying_reduce(cls: type, own: Any, instance: Any, protocol: int) -> Any:
    """``instance.__reduce_ex__`` for an instrumented class (see :func:`_carry_instances`)."""
    reduced = own(instance, protocol) if own is not None else super(cls, instance).__reduce_ex__(protocol)
    entries = tuple((method, names, run) for method, (names, run) in _instrumented_classes.get(cls, {}).items())
    if isinstance(reduced, str) or not entries:
        return reduced
    return (arrive_instrumented, (cls, entries, reduced[0], reduced[1]), *reduced[2:])


def arrive_instrumented(cls: type, entries: tuple[Any, ...], constructor: Any, arguments: tuple[Any, ...]) -> Any:
    """Unpickling an instance of an instrumented class: instrument the class here, then build it."""
    for method, names, run in entries:
        _instrument_class(cls, Binding(None, run), method, names)
    return constructor(*arguments)


def instrumented_classes() -> list[tuple[type, str, ArgumentNames, str | None]]:
    """Classes instrumented in this process: ``(class, method, names, run)``, run ``None`` for the process-wide monitor."""
    return [(cls, method, names, run) for cls, methods in list(_instrumented_classes.items())
            for method, (names, run) in methods.items() if is_watched(inspect.getattr_static(cls, method, None))]


def _refuse_remote_class(target: Any) -> None:
    """A Ray actor class's instances live in worker processes: wrapping it here records nothing."""
    ray_kinds = [k for k in type(target).__mro__
                 if k.__module__.startswith("ray.") and k.__name__ in {"ActorClass", "ActorHandle", "RemoteFunction"}]
    if ray_kinds:
        raise AdvmonConfigError(
            f"{target!r} is a Ray {ray_kinds[0].__name__}: its estimator runs in a worker process, where an "
            "instrumentation made here cannot reach. Instrument the plain class before ray.remote(...), "
            "and start the workers with advmon.integrations.ray.runtime_env(...), which carries it "
            "(docs/integrations.md, Ray)"
        )


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
        call.monitor.record_tap(call, stage, tensor, mask)
    return tensor

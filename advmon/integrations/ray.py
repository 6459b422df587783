"""Ray: record estimators that run inside Ray actors (NeMo-RL's async controller, verl's TaskRunner).

:func:`runtime_env` returns a Ray ``runtime_env`` that carries advmon's ``ADVMON_*``
variables to every worker and runs :func:`setup_worker` there at start. The hook
never raises and creates nothing: it watches the targets when their modules are
imported, and the worker's monitor (with its file, threads and ports) is built
on the first recorded call. Classes instrumented in the driver with
:func:`advmon.instrument` are carried too (their importable names go into
``ADVMON_INSTRUMENT``); instrumented instances and watched functions pickle with
their instrumentation by themselves.

Example:
    >>> env = runtime_env({"env_vars": {"HF_HOME": "/data/hf"}}, run="grpo-7b", verl=True,
    ...                   reward_range=(0, 1), carry_instrumented=False)
    >>> env["worker_process_setup_hook"], env["env_vars"]["HF_HOME"], env["env_vars"]["ADVMON_INSTRUMENT"]
    ('advmon.integrations.ray.setup_worker', '/data/hf', 'verl')

Then ``ray.init(runtime_env=env)`` (or per actor: ``Actor.options(runtime_env=env)``).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from advmon.config.environment import Target, parse_targets
from advmon.config.specs import parse_spec
from advmon.errors import AdvmonConfigError, warn
from advmon.hooks import ArgumentNames, instrumented_classes

__all__ = ["NEXT_HOOK_VARIABLE", "SETUP_HOOK", "runtime_env", "setup_worker"]

SETUP_HOOK = "advmon.integrations.ray.setup_worker"
#: A setup hook of the user's (``module.function``) that advmon's hook calls after its own.
NEXT_HOOK_VARIABLE = "ADVMON_NEXT_SETUP_HOOK"


def runtime_env(
    base: Mapping[str, Any] | None = None,
    *,
    run: str | None = None,
    sinks: Sequence[str] = (),
    directory: str | os.PathLike[str] | None = None,
    reward_range: tuple[float, float] | None = None,
    step_source: str | None = None,
    instrument: Sequence[str] = (),
    verl: bool = False,
    carry_instrumented: bool = True,
    per_process: bool = True,
    finish_on_caller: bool = True,
) -> dict[str, Any]:
    """A Ray ``runtime_env`` that activates advmon in every worker, merged into ``base``.

    Args:
        base: the user's own runtime_env; its other keys and ``env_vars`` are kept,
            and a ``worker_process_setup_hook`` it has runs after advmon's.
        run: the run id in every worker (default: the process-wide monitor's run
            here, else a new id, so every worker records the same run).
        sinks: sink specs for the workers (``ray-metrics`` exports through Ray's
            own metrics agent; ``pushgateway:URL``; ``mlflow:URI``; ...). The JSONL
            file is always written.
        directory: where workers write JSONL (default ``advmon-runs`` in the
            worker's directory); an absolute path is safest.
        reward_range: ``(lo, hi)`` of the reward.
        step_source: ``module:attribute`` giving the step inside the worker
            (``ADVMON_STEP_SOURCE``); ``verl=True`` defaults it to verl's counter.
        instrument: ``module:Class[.method][(names)]`` targets (``ADVMON_INSTRUMENT``).
        verl: watch every verl estimator (:mod:`advmon.integrations.verl`).
        carry_instrumented: add the classes instrumented in this process.
        per_process: one JSONL file per worker process (``<run>.<host>-<pid>.jsonl``).
        finish_on_caller: workers finish each record, and write its JSONL line, before
            the watched call or step returns (``ADVMON_FINISH_ON_CALLER``). Ray ends a
            worker without running its exit handlers when the driver shuts down, so a
            record left to the monitor's own thread could be lost; ``False`` trades that
            for the worker's time (docs/performance.md).

    Raises:
        AdvmonConfigError: a value the workers could not use (checked here, once,
            rather than as a warning in every worker).
    """
    from advmon.config.checks import checked_range, checked_run, default_run_id
    from advmon.config.environment import step_source_from
    from advmon.lifecycle import current_default

    merged: dict[str, Any] = dict(base or {})
    variables = {str(k): str(v) for k, v in dict(merged.get("env_vars") or {}).items()}
    targets = parse_targets(";".join(instrument))
    if verl:
        targets.append(Target("verl", None, "compute_advantage", ArgumentNames()))
    if carry_instrumented:
        targets.extend(t for t in _carried() if t not in targets)
    if run is None:
        default = current_default()
        run = default.run if default is not None else default_run_id()
    variables["ADVMON_RUN"] = checked_run(run)
    variables["ADVMON_PER_PROCESS"] = "1" if per_process else "0"
    variables["ADVMON_FINISH_ON_CALLER"] = "1" if finish_on_caller else "0"
    if targets:
        variables["ADVMON_INSTRUMENT"] = ";".join(t.spec for t in targets)
    if sinks:
        for spec in sinks:
            parse_spec(spec)
        variables["ADVMON_SINKS"] = ",".join(sinks)
    if directory is not None:
        variables["ADVMON_DIR"] = str(Path(directory))
    if reward_range is not None:
        low, high = checked_range(reward_range)  # type: ignore[misc]
        variables["ADVMON_REWARD_RANGE"] = f"{low!r},{high!r}"
    if step_source is not None:
        step_source_from(step_source)  # importable here, or a clear error now
        variables["ADVMON_STEP_SOURCE"] = step_source
    merged["env_vars"] = variables
    merged["worker_process_setup_hook"] = _chained_hook(merged.get("worker_process_setup_hook"), variables)
    return merged


def _carried() -> list[Target]:
    """Classes instrumented here that a worker can import by name (the others travel by value)."""
    targets = []
    for cls, method, names, _run in instrumented_classes():
        module = getattr(cls, "__module__", "")
        if module == "__main__" or "<locals>" in cls.__qualname__:
            # cloudpickle sends these by value, their watched methods with them.
            continue
        targets.append(Target(module, cls.__qualname__, method, names))
    return targets


def _chained_hook(existing: Any, variables: dict[str, str]) -> Any:
    if existing is None or existing == SETUP_HOOK:
        return SETUP_HOOK
    if isinstance(existing, str):
        variables[NEXT_HOOK_VARIABLE] = existing
        return SETUP_HOOK
    if callable(existing):
        return functools.partial(setup_worker, then=existing)
    raise AdvmonConfigError(f"worker_process_setup_hook must be a 'module.function' string or a callable, got {existing!r}")


def setup_worker(then: Callable[[], Any] | None = None) -> None:
    """Ray's ``worker_process_setup_hook``: activate advmon from ``ADVMON_*``; never raises.

    Then runs the user's own hook (``then``, or the one named in
    ``ADVMON_NEXT_SETUP_HOOK``), whose errors are Ray's to report, as without advmon.
    """
    try:
        from advmon.integrations.activation import activate

        activate()
    except Exception as exc:  # noqa: BLE001 - a worker must start whatever advmon thinks
        warn(f"advmon: not recording in this worker (pid {os.getpid()}): {exc}")
    if then is None:
        name = os.environ.get(NEXT_HOOK_VARIABLE, "")
        if name:
            module, _, function = name.rpartition(".")
            then = getattr(importlib.import_module(module), function)
    if then is not None:
        then()

"""verl: watch every advantage estimator verl can call, on every path it calls them by.

verl 0.9's ``ray_trainer.compute_advantage`` calls GAE and GRPO as attributes of
``core_algos`` and every other estimator through ``get_adv_estimator_fn(name)``
(the ``ADV_ESTIMATOR_REGISTRY``); GDPO calls the module's GRPO once per reward key.
:func:`instrument` points every attribute of a loaded ``verl`` module that holds a
registered estimator at its watched version, and makes ``get_adv_estimator_fn`` give
back the watched version of what it finds (so an estimator registered later is watched
when it is looked up), with verl's argument names. The registry itself keeps what was
registered, and each watched version is equal to and hashes like its function
(:func:`advmon.hooks.watch_in_place`): verl's re-registration check and any comparison
see the function. :func:`uninstrument` puts everything back.

Nested calls record once: GDPO's inner GRPO calls belong to the GDPO record.
The batch's ``data_source`` (``non_tensor_batch``) slices every record, and GDPO's
reward keys (``gdpo_reward_keys``) give ``rewards/<key>/...``: the trainer's
``compute_advantage`` is wrapped to pass them on (:func:`advmon.sliced_by`,
:func:`advmon.scored_by`).
GAE gets no uids (its rewards are token-level, summed per sequence): its groups are
the batch's ``uid`` all the same (:func:`advmon.hooks.grouped_by`), so its zero-std
groups show; what it whitens at the end (the raw GAE advantages) is tapped as its
pre_norm stage. Each
estimator's records say how it normalizes (:data:`NORMALIZATION`: GRPO's follows
``norm_adv_by_std_in_grpo``), so the bound alert judges each by its own bound. The step
is verl's own counter (``SkipManager.set_step(global_steps)``, set by both
trainers in the process that computes advantages) via :func:`current_step`, or
an explicit ``monitor.step(n)``.

Example (with verl installed)::

    import advmon.integrations.verl as advmon_verl
    monitor = advmon_verl.instrument()          # Monitor(step_source=current_step), process-wide
    ...                                         # verl's trainer runs as usual
    advmon_verl.uninstrument()
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

from advmon.hooks import (ArgumentNames, active_call, grouped_by, is_watched, scored_by, sliced_by, tap,
                          watch_in_place)
from advmon.integrations.patching import process_monitor, restore, switches
from advmon.monitor import Monitor, get_monitor

__all__ = ["NORMALIZATION", "current_step", "install", "instrument", "is_instrumented", "uninstrument"]

def grpo_normalization(arguments: Mapping[str, Any]) -> str:
    """verl's GRPO divides by the group's std unless ``norm_adv_by_std_in_grpo`` is false (Dr. GRPO)."""
    return "group_std" if arguments.get("norm_adv_by_std_in_grpo", True) else "group_mean"


def passk_normalization(arguments: Mapping[str, Any]) -> str:
    """GRPO pass@k reads ``norm_adv_by_std_in_grpo`` from its config."""
    config = arguments.get("config")
    divided = config.get("norm_adv_by_std_in_grpo", True) if hasattr(config, "get") else True
    return "group_std" if divided else "group_mean"


#: How each of verl's estimators normalizes (advmon.normalization); one registered later is inferred.
NORMALIZATION: dict[str, Any] = {
    "gae": "batch",  # masked_whiten at its end
    "grpo": grpo_normalization,
    "grpo_vectorized": grpo_normalization,
    "grpo_passk": passk_normalization,
    "gdpo": "batch",  # per-component GRPO, summed, then masked_whiten
    "reinforce_plus_plus": "batch",
    "reinforce_plus_plus_baseline": "batch",  # group mean subtracted, then masked_whiten
    "rloo": "group_mean",
    "rloo_vectorized": "group_mean",
    "opo": "group_mean",  # a length-weighted group mean
    "gpg": "gpg",
    "remax": "none",  # returns minus the greedy response's reward
    "optimal_token_baseline": "none",  # returns minus a per-token group baseline, undivided
    "tir_optimal_token_baseline": "none",
}
_UNGROUPED_ESTIMATORS = {"gae"}  # verl calls GAE with values, not uids


_lock = threading.Lock()
_installed: dict[str, Any] | None = None


def current_step() -> int:
    """verl's global step in this process (``SkipManager.step``; -1 before training starts)."""
    from verl.utils.skip.skip_manager import SkipManager

    return int(SkipManager.step)


def _names_for(name: str) -> ArgumentNames:
    """verl's names for the inputs advmon reads, and the estimator's normalization."""
    groups = None if name in _UNGROUPED_ESTIMATORS else "index"
    return ArgumentNames(rewards="token_level_rewards", mask="response_mask", groups=groups,
                         normalization=NORMALIZATION.get(name))


def instrument(monitor: Monitor | None = None) -> Monitor:
    """Watch every verl advantage estimator; return the monitor records go to.

    Args:
        monitor: where records go. Default: the process-wide monitor, created as
            ``Monitor(step_source=current_step)`` if there is none yet.

    Instrumenting again is harmless (nothing is wrapped twice); again with another monitor moves every watched
    call to it, with one warning (:func:`~advmon.integrations.patching.switches`; :func:`uninstrument` first
    switches without it).
    """
    with _lock:
        installed = _installed
    if installed is not None:
        if not switches("verl", installed["monitor"], monitor):
            return installed["monitor"] or get_monitor()  # installed for the process-wide monitor
        uninstrument()
    return install(process_monitor(current_step) if monitor is None else monitor)  # type: ignore[return-value]


def install(monitor: Monitor | None) -> Monitor | None:
    """:func:`instrument` without creating anything: ``None`` records to the process-wide
    monitor, built from ``ADVMON_*`` on the first recorded call (what a Ray worker's
    setup hook uses, see :mod:`advmon.integrations.ray`).

    The registry keeps what was registered. ``get_adv_estimator_fn`` and the module attributes that
    hold an estimator give back its watched version (:func:`advmon.hooks.watch_in_place`), one per
    function, equal to and hashing like it: verl's ``register_adv_est`` check (``registry[name] != fn``)
    and anyone comparing with the registered function see the same function as without advmon.
    """
    global _installed
    from verl.trainer.ppo import core_algos

    with _lock:
        if _installed is not None:
            return _installed["monitor"]
        watched: dict[int, tuple[Any, Any]] = {}  # id(function) -> (function, its watched version)

        def watched_version(fn: Any, name: str) -> Any:
            if is_watched(fn):
                return fn
            entry = watched.get(id(fn))
            if entry is None or entry[0] is not fn:
                entry = watched[id(fn)] = (fn, watch_in_place(fn, monitor, _names_for(name)))
            return entry[1]

        for name, fn in core_algos.ADV_ESTIMATOR_REGISTRY.items():
            watched_version(fn, name)
        patched = _patch_module_attributes(watched)
        original_lookup = core_algos.get_adv_estimator_fn

        def get_adv_estimator_fn(name_or_enum):
            fn = original_lookup(name_or_enum)
            name = getattr(name_or_enum, "value", name_or_enum)
            with _lock:
                return watched_version(fn, str(name))

        get_adv_estimator_fn.__wrapped__ = original_lookup  # type: ignore[attr-defined]
        core_algos.get_adv_estimator_fn = get_adv_estimator_fn
        patched.append((core_algos, "get_adv_estimator_fn", original_lookup))
        patched.append(_tap_gae_pre_whitening())
        patched += _pass_batch_context()
        _installed = {"monitor": monitor, "patched": patched, "watched": watched}
        return monitor


def _tap_gae_pre_whitening() -> tuple[Any, str, Any]:
    """GAE whitens its advantages over the batch at the end: record what it whitens as pre_norm."""
    import verl.utils.torch_functional as verl_functional

    original = verl_functional.masked_whiten

    def masked_whiten(values, mask, *args, **kwargs):
        call = active_call()
        if call is not None and call.estimator.endswith("compute_gae_advantage_return"):
            tap("pre_norm", values, mask)
        return original(values, mask, *args, **kwargs)

    masked_whiten.__wrapped__ = original  # type: ignore[attr-defined]
    verl_functional.masked_whiten = masked_whiten
    return (verl_functional, "masked_whiten", original)


def _pass_batch_context() -> list[tuple[Any, str, Any]]:
    """verl's estimators get the uids but not ``data_source``: the trainer's ``compute_advantage`` has it.

    Its calls run inside :func:`advmon.hooks.sliced_by` with the batch's
    ``non_tensor_batch["data_source"]``, so records carry ``slices/<source>/...``.
    """
    try:
        from verl.trainer.ppo import ray_trainer
    except ImportError:  # a verl build without the Ray trainer: no slices, nothing else changes
        return []
    original = ray_trainer.compute_advantage

    def compute_advantage(data, *args, **kwargs):
        batch = getattr(data, "non_tensor_batch", None)
        batch = batch if isinstance(batch, dict) else {}
        config = kwargs.get("config", args[5] if len(args) > 5 else None)
        # GDPO's reward components: the non-tensor keys its config names.
        keys = [key for key in (getattr(config, "gdpo_reward_keys", None) or []) if key in batch]
        with sliced_by(batch.get("data_source")), scored_by({key: batch[key] for key in keys} or None), \
                grouped_by(batch.get("uid")):
            return original(data, *args, **kwargs)

    compute_advantage.__wrapped__ = original  # type: ignore[attr-defined]
    ray_trainer.compute_advantage = compute_advantage
    return [(ray_trainer, "compute_advantage", original)]


def _patch_module_attributes(watched: dict[int, tuple[Any, Any]]) -> list[tuple[Any, str, Any]]:
    """Point every attribute of a loaded verl module that holds an estimator at its watched version."""
    patched = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "verl" or module_name.startswith("verl.")):
            continue
        for attribute, value in list(vars(module).items()):
            entry = watched.get(id(value))
            if entry is not None and entry[0] is value:
                setattr(module, attribute, entry[1])
                patched.append((module, attribute, value))
    return patched


def uninstrument() -> None:
    """Undo :func:`instrument`: module attributes and lookup are verl's own again, and a watched version
    registered meanwhile (``register_adv_est(name)(core_algos.compute_grpo_outcome_advantage)``) is its function."""
    global _installed
    from verl.trainer.ppo import core_algos

    with _lock:
        if _installed is None:
            return
        restore(_installed["patched"])
        registry = core_algos.ADV_ESTIMATOR_REGISTRY
        ours = {id(version): fn for fn, version in _installed["watched"].values()}
        for name, fn in list(registry.items()):
            if id(fn) in ours:
                registry[name] = ours[id(fn)]
        _installed = None


def is_instrumented() -> bool:
    return _installed is not None

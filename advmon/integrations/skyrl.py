"""SkyRL: watch every advantage estimator where SkyRL's trainer calls it, leaving SkyRL's registry as it is.

SkyRL's trainer computes advantages with
``ppo_utils.compute_advantages_and_returns(token_level_rewards, response_mask, index,
adv_estimator, config, values, grpo_norm_by_std, gamma, lambd)``, which looks the
estimator up in ``AdvantageEstimatorRegistry`` (grpo, rloo, gae, reinforce++, maxrl, and
any registered later) and calls it by keyword. :func:`instrument` watches that entry point,
the one place the trainer calls: each call is recorded under the name of the estimator it
looks up (so one registered or re-registered later is watched too), with SkyRL's argument
names: ``token_level_rewards`` (summed per sequence), ``response_mask``, and ``index``, the
batch's uids, as groups (SkyRL passes them to every estimator, REINFORCE++ and GAE
included). Nothing SkyRL's public lookups give back changes: ``AdvantageEstimatorRegistry.get``,
its ``_functions`` (which, with Ray running, SkyRL copies to a named actor other processes
read) and the module's estimator functions stay the very objects registered, so they
compare, hash and pickle as without advmon, and SkyRL's own registry tests pass
instrumented. An estimator called directly (``ppo_utils.compute_grpo_outcome_advantage(...)``,
``AdvantageEstimatorRegistry.get("grpo")(...)``) rather than through the entry point is not
recorded: watch it with ``monitor.watch`` where you call it. :func:`uninstrument` puts
everything back.

What each estimator divides by (:data:`NORMALIZATION`, :mod:`advmon.normalization`)
travels in its records, so the bound alert judges each by its own bound. GAE and
REINFORCE++ whiten over the batch at their end (``masked_whiten``): what they whiten
(the raw GAE advantages, the returns) is tapped as their pre_norm stage.

Supported: SkyRL 0.3.0 (tested here) and 0.4.0 (its estimators, registry and
``masked_whiten`` are 0.3.0's, docstrings and annotations aside). On Python 3.11,
``skyrl/backends/__init__.py`` cannot be imported (its Tinker backend's pydantic models
use ``typing.TypedDict``, which pydantic refuses before Python 3.12): see
:func:`load_ppo_utils`.

Example (with SkyRL installed)::

    import advmon
    import advmon.integrations.skyrl as advmon_skyrl
    monitor = advmon.Monitor("skyrl-grpo", step_source=lambda: trainer.global_step)
    advmon_skyrl.instrument(monitor)        # in the process that runs SkyRL's trainer
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import sys
import threading
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from advmon.hooks import ArgumentNames, active_call, tap, watch_with
from advmon.integrations.patching import restore, switches
from advmon.monitor import Monitor

__all__ = ["NORMALIZATION", "PPO_UTILS", "grpo_normalization", "instrument", "is_instrumented", "load_ppo_utils",
           "uninstrument"]

PPO_UTILS = "skyrl.backends.skyrl_train.utils.ppo_utils"


def grpo_normalization(arguments: Mapping[str, Any]) -> str:
    """SkyRL's GRPO divides by the group's std unless ``grpo_norm_by_std`` is false (Dr. GRPO)."""
    return "group_std" if arguments.get("grpo_norm_by_std", True) else "group_mean"


#: How each of SkyRL's estimators normalizes (advmon.normalization). MaxRL divides each group's
#: rewards minus their mean by that mean: |A| reaches G - 1 for non-negative rewards, a bound no
#: kind states, so its kind is inferred from the data (an unknown step is judged by the loosest
#: bound). One registered later is inferred too.
NORMALIZATION: dict[str, Any] = {
    "grpo": grpo_normalization,
    "rloo": "group_mean",  # (r - the mean of the others): within the group's spread
    "reinforce++": "batch",  # discounted returns, masked_whiten over the batch
    "gae": "batch",  # masked_whiten at its end
    "maxrl": None,
}
#: The estimators that whiten at their end: what they hand ``masked_whiten`` is their pre_norm.
_WHITENING = ("compute_gae_advantage_return", "compute_reinforce_plus_plus_outcome_advantage")

_lock = threading.Lock()
_installed: dict[str, Any] | None = None


def load_ppo_utils() -> ModuleType:
    """SkyRL's ``ppo_utils``, importable on Python 3.11 too.

    ``skyrl/backends/__init__.py`` only re-exports the Tinker engine's ``AbstractBackend``,
    whose pydantic models fail to build before Python 3.12 (``typing.TypedDict``). Where that
    import fails, ``skyrl.backends`` is registered as the package the import system would
    make of that folder, without running its ``__init__``; everything below it
    (``skyrl_train.utils.ppo_utils`` and what it imports) is SkyRL's own code, imported as
    usual. Nothing is done where the real import works (Python 3.12+, SkyRL 0.4).
    """
    try:
        return importlib.import_module(PPO_UTILS)
    except Exception:
        if sys.version_info >= (3, 12) or "skyrl.backends" in sys.modules:
            raise
    spec = importlib.util.find_spec("skyrl.backends")
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError("skyrl is not installed: pip install --no-deps skyrl==0.3.0 (docs/integrations.md)")
    sys.modules["skyrl.backends"] = importlib.util.module_from_spec(spec)  # its folder, its __init__ not run
    return importlib.import_module(PPO_UTILS)


def _names_for(name: Any) -> ArgumentNames:
    """SkyRL's names for the inputs advmon reads, and the estimator's normalization."""
    key = str(getattr(name, "value", name))
    return ArgumentNames(rewards="token_level_rewards", mask="response_mask", groups="index",
                         normalization=NORMALIZATION.get(key))


def instrument(monitor: Monitor | None = None) -> Monitor | None:
    """Watch every SkyRL advantage estimator where the trainer calls it; return the monitor records go to.

    Args:
        monitor: where records go. Default ``None``: the process-wide monitor, looked up at
            each call (in a Ray worker, built from ``ADVMON_*`` on the first recorded call).

    Instrumenting again is harmless (nothing is wrapped twice); again with another monitor moves every
    watched call to it, with one warning (:func:`~advmon.integrations.patching.switches`;
    :func:`uninstrument` first switches without it).
    """
    global _installed
    ppo_utils = load_ppo_utils()
    with _lock:
        installed = _installed
    if installed is not None:
        if not switches("skyrl", installed["monitor"], monitor):
            return installed["monitor"]
        uninstrument()
    with _lock:
        if _installed is not None:
            return _installed["monitor"]
        original = ppo_utils.compute_advantages_and_returns
        entry = _watched_entry(ppo_utils.AdvantageEstimatorRegistry, original, monitor)
        patched = _point_module_attributes(original, entry)
        patched.append(_tap_pre_whitening(ppo_utils))
        _installed = {"monitor": monitor, "patched": patched}
        return monitor


def _watched_entry(registry: type, original: Any, monitor: Monitor | None) -> Any:
    """``compute_advantages_and_returns``, recording each call under the estimator it looks up.

    SkyRL's own function runs, with its own lookup: advmon only names the record after the estimator the
    registry holds for ``adv_estimator`` (read from the registry's table, without a second Ray sync where
    the name is known here) and reads SkyRL's arguments by name.
    """
    signature = inspect.signature(original)
    steps: dict[tuple[int, str], tuple[Any, Any]] = {}  # (id(estimator), name) -> (estimator, watched step)

    def step_for(name: Any) -> Any:
        key = str(getattr(name, "value", name))
        estimator = registry._functions.get(key)
        if estimator is None:
            estimator = registry.get(name)  # registered in another process: SkyRL syncs it here
        with _lock:
            entry = steps.get((id(estimator), key))
            if entry is None or entry[0] is not estimator:
                step = watch_with(_named_after(estimator, original, signature), monitor, _names_for(key))
                entry = steps[(id(estimator), key)] = (estimator, step)
            return entry[1]

    @functools.wraps(original)
    def compute_advantages_and_returns(*args: Any, **kwargs: Any) -> Any:
        try:
            step = step_for(signature.bind(*args, **kwargs).arguments["adv_estimator"])
        except Exception:  # noqa: BLE001 - an unknown estimator, bad arguments: SkyRL's own call says so
            return original(*args, **kwargs)
        return step(*args, **kwargs)

    return compute_advantages_and_returns


def _named_after(estimator: Any, original: Any, signature: inspect.Signature) -> Any:
    """SkyRL's entry point, as advmon watches it: its own call, named after the estimator it runs."""

    def advantage_step(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(advantage_step, attribute, getattr(estimator, attribute, getattr(original, attribute)))
    advantage_step.__signature__ = signature  # type: ignore[attr-defined]  # the entry point's parameters
    return advantage_step


def _tap_pre_whitening(ppo_utils: ModuleType) -> tuple[Any, str, Any]:
    """GAE and REINFORCE++ whiten over the batch at their end: record what they whiten as pre_norm."""
    original = ppo_utils.masked_whiten

    def masked_whiten(values, mask, *args, **kwargs):
        call = active_call()
        if call is not None and call.estimator.endswith(_WHITENING):
            tap("pre_norm", values, mask)
        return original(values, mask, *args, **kwargs)

    masked_whiten.__wrapped__ = original  # type: ignore[attr-defined]
    ppo_utils.masked_whiten = masked_whiten
    return (ppo_utils, "masked_whiten", original)


def _point_module_attributes(original: Any, entry: Any) -> list[tuple[Any, str, Any]]:
    """Point every attribute of a loaded skyrl module that holds the entry point at its watched version."""
    patched = []
    for module_name, module in list(sys.modules.items()):
        if module is None or not (module_name == "skyrl" or module_name.startswith("skyrl.")):
            continue
        for attribute, value in list(vars(module).items()):
            if value is original:
                setattr(module, attribute, entry)
                patched.append((module, attribute, value))
    return patched


def uninstrument() -> None:
    """Undo :func:`instrument`: ``compute_advantages_and_returns`` and ``masked_whiten`` are SkyRL's again."""
    global _installed
    with _lock:
        if _installed is None:
            return
        restore(_installed["patched"])
        _installed = None


def is_instrumented() -> bool:
    return _installed is not None

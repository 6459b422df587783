"""NeMo-RL: its estimators, in its synchronous loop and inside its asynchronous single controller.

NeMo-RL's estimators (``nemo_rl.algorithms.advantage_estimator``) are classes with
``compute_advantage(prompt_ids, rewards, mask, ...)``: advmon's default argument
names. Both loops build the estimator once, with ``_create_advantage_estimator``:

* **``grpo_train``** (synchronous) builds it in the driver and calls it there:
  :func:`instrument` the classes before ``grpo_train`` runs.
* **The single controller** (``SingleControllerActor``, a Ray actor) receives the
  estimator built in the driver by ``setup_single_controller`` and calls it inside
  the actor, once per streaming chunk of a step. Instrument the classes in the
  driver as well: an instance of an instrumented class arrives instrumented in the
  actor (:func:`advmon.instrument` makes it so), and records there to the
  process-wide monitor built from ``ADVMON_*`` variables (NeMo-RL's ``init_ray``
  passes the driver's whole environment to its workers). The step comes from the
  controller in that actor: ``ADVMON_STEP_SOURCE`` =
  ``advmon.integrations.nemo_rl:single_controller_step``.

Example::

    import advmon.integrations.nemo_rl as advmon_nemo
    advmon_nemo.instrument()                  # before grpo_train / setup_single_controller
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from advmon.hooks import ArgumentNames
from advmon.hooks import instrument as _instrument
from advmon.monitor import Monitor

__all__ = ["ESTIMATORS", "STEP_SOURCE", "grpo_normalization", "instrument", "single_controller_step", "whitened_or_raw"]

MODULE = "nemo_rl.algorithms.advantage_estimator"
_TASKS = "repeated_batch.task_name"


def grpo_normalization(arguments: Mapping[str, Any]) -> str:
    """NeMo-RL's GRPO, from its flags: with ``normalize_rewards`` it divides by the std of each sample's peers
    (``use_leave_one_out_baseline``, the default) or of its group; without, it subtracts a baseline only."""
    estimator = arguments.get("self")
    if not getattr(estimator, "normalize_rewards", True):
        return "group_mean"
    return "group_loo_std" if getattr(estimator, "use_leave_one_out_baseline", True) else "group_std"


def whitened_or_raw(arguments: Mapping[str, Any]) -> str:
    """RawReward and GAE whiten over the batch's valid tokens with ``normalize_advantages``, else stay in reward units."""
    return "batch" if getattr(arguments.get("self"), "normalize_advantages", False) else "none"


#: NeMo-RL's estimator classes and what advmon reads from them. OPD ignores ``rewards``
#: (its advantages are teacher minus student log-probabilities), so it has none.
#: Slices come from the batch NeMo-RL passes along (``repeated_batch``), whose ``task_name``
#: its collate function fills per sample; a batch without one has no slices.
ESTIMATORS: dict[str, ArgumentNames] = {
    "GRPOAdvantageEstimator": ArgumentNames(slices=_TASKS, normalization=grpo_normalization),
    # GDPO's reward components are the batch's reward/<name> keys; their sum is whitened over the batch.
    "GDPOAdvantageEstimator": ArgumentNames(slices=_TASKS, reward_functions="repeated_batch:reward/",
                                            normalization="batch"),
    # Reinforce++ normalizes over the whole batch: its groups are recorded, not held to a group bound.
    "ReinforcePlusPlusAdvantageEstimator": ArgumentNames(slices=_TASKS, normalization="batch"),
    "RawRewardAdvantageEstimator": ArgumentNames(slices=_TASKS, normalization=whitened_or_raw),
    "GeneralizedAdvantageEstimator": ArgumentNames(slices=_TASKS, normalization=whitened_or_raw),
    # Teacher minus student log-probabilities: no rewards, so nothing bounds them.
    "OPDAdvantageEstimator": ArgumentNames(rewards=None, slices=_TASKS, normalization="none"),
}
#: ``ADVMON_STEP_SOURCE`` for the single controller's actor.
STEP_SOURCE = "advmon.integrations.nemo_rl:single_controller_step"


def instrument(monitor: Monitor | None = None, module: Any = None) -> list[type]:
    """Instrument every NeMo-RL estimator class; returns the classes.

    Args:
        monitor: where records go (default: the process-wide monitor, looked up
            at each call; in a worker, built from ``ADVMON_*``).
        module: the module holding the classes (default: NeMo-RL's own).
    """
    if module is None:
        import importlib

        module = importlib.import_module(MODULE)
    classes = []
    for name, names in ESTIMATORS.items():
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            _instrument(cls, monitor, "compute_advantage", names)
            classes.append(cls)
    return classes


_controller: weakref.ref[Any] | None = None


def single_controller_step() -> int:
    """The step NeMo-RL will log for the advantages being computed, inside the controller's actor.

    The controller computes a step's advantages before it increments
    ``_train_steps`` and logs the step under the incremented value, so this is
    ``_train_steps + 1``. The controller is this Ray worker's actor.

    Raises:
        LookupError: no ``SingleControllerActor`` in this process (the monitor
            reports it once and records the call as its own step).
    """
    global _controller
    controller = _controller() if _controller is not None else None
    if controller is None:
        controller = _find_controller()
        _controller = weakref.ref(controller)
    return int(controller._train_steps) + 1


def _find_controller() -> Any:
    try:
        from ray._private import worker
    except ImportError:
        raise LookupError("single_controller_step needs Ray: it reads the controller actor of this worker") from None
    for actor in list(getattr(worker.global_worker, "actors", {}).values()):
        if type(actor).__name__ == "SingleControllerActor" and hasattr(actor, "_train_steps"):
            return actor
    raise LookupError("no SingleControllerActor in this process: single_controller_step works inside its actor")

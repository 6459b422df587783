"""AReaL: record ``PPOActor._compute_advantages``, AReaL's advantage step, as AReaL computes it.

AReaL (1.0) computes advantages in one method, ``PPOActor._compute_advantages(data)``:
it scales and clips the batch's ``rewards`` (``reward_bias``, ``reward_scaling``,
``reward_clip``), optionally normalizes them (``reward_norm``, a ``Normalization`` from
``areal/utils/data.py``), adds the KL penalty, runs GAE over the response tokens, and
optionally normalizes the advantages (``adv_norm``). :func:`instrument` wraps that method
on the class (every actor, whichever engine holds it) and records each call:

* **rewards**: ``data["rewards"]``, the task rewards as the step receives them (what AReaL
  logs as ``task_reward``), before its overlong penalty, scaling, bias and clip;
* **groups**: contiguous blocks of ``group_size`` rows, the ``group_size`` of the actor's
  ``Normalization`` that normalizes at group level (``reward_norm`` in AReaL's GRPO
  examples), or the ``group_size`` given to :func:`instrument`; none otherwise;
* **pre_norm**: what the step's first ``Normalization`` receives: the scaled, clipped
  rewards where AReaL normalizes rewards (``reward_norm``), else the GAE advantages
  ``adv_norm`` whitens. The scale alerts watch this spread, and a normalized reward would
  hide a reward model's collapse. Without any normalization, pre_norm is derived
  (reward minus its group's mean);
* **post_norm**: the advantages the step returns, under the loss mask AReaL computes them with:
  ``loss_mask`` rolled by one token (advantage ``t`` belongs to token ``t + 1``), as the step
  rolls it and returns it;
* **normalization**: read at each call from what the step itself reads, the actor's own
  attributes (``self.adv_norm``, ``self.reward_norm``, ``self.kl_ctl``, ``self.discount``, ...,
  which ``PPOActor.__init__`` copies from its config), never from ``actor.config``, which the
  step does not read for them and which may be another object (:func:`normalization_of`).

The step is AReaL's ``global_step``: the trainer sets the engine's version to
``global_step + 1`` after each step, so during a step's advantages the version is the step
AReaL logs; :func:`current_step` reads it (the default ``step_source`` when
:func:`instrument` creates the monitor).

Example (with AReaL installed)::

    import advmon.integrations.areal as advmon_areal
    monitor = advmon_areal.instrument()     # Monitor(step_source=current_step), process-wide
    ...                                     # AReaL's trainer runs as usual
    advmon_areal.uninstrument()
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from advmon.errors import AdvmonConfigError
from advmon.hooks import ArgumentNames, active_call, tap, watch_with
from advmon.integrations.patching import process_monitor, restore, switches
from advmon.monitor import Monitor
from advmon.observation import Problem

__all__ = ["ESTIMATOR", "current_step", "group_size_of", "instrument", "is_instrumented", "normalization_of",
           "uninstrument"]

#: The method advmon watches, as records name it.
ESTIMATOR = "areal.trainer.ppo.actor.PPOActor._compute_advantages"

_lock = threading.Lock()
_installed: dict[str, Any] | None = None
_version: dict[str, int] = {}


def group_size_of(settings: Any) -> int | None:
    """The group size of the normalization at group level (``reward_norm`` first), if any.

    ``settings`` is a ``PPOActor`` (its ``Normalization`` objects, what the step uses) or a ``PPOActorConfig``
    (its ``NormConfig`` s): both name them ``reward_norm`` and ``adv_norm``, with the same fields.
    """
    for norm in (getattr(settings, "reward_norm", None), getattr(settings, "adv_norm", None)):
        if norm is not None and "group" in (norm.mean_level, norm.std_level):
            return int(norm.group_size)
    return None


def normalization_of(settings: Any, critic: bool = False) -> str | None:
    """How an AReaL actor's advantages are normalized (:mod:`advmon.normalization`), from its settings.

    ``settings`` is the ``PPOActor`` itself (what the instrumented step reads: the attributes its advantage step
    uses, ``adv_norm``, ``reward_norm``, ``kl_ctl``, ``discount``, ``gae_lambda``, ``reward_scaling``,
    ``reward_bias``) or a ``PPOActorConfig`` (the same names, before an actor is built).

    ``adv_norm`` with a batch-level std whitens over the batch's tokens: ``batch`` (AReaL's GRPO, Dr. GRPO,
    RLOO, REINFORCE and PPO examples). Without ``adv_norm``, and without KL penalty, discount, GAE lambda
    or critic (``kl_ctl`` 0, ``discount`` and ``gae_lambda`` 1, no ``values``), every token's advantage is
    its sequence's shaped reward, so ``reward_norm`` decides: group mean and std (not leave-one-out) is
    ``group_std`` (GRPO), batch mean and std ``batch``, a group mean alone ``group_mean`` (Dr. GRPO, RLOO;
    only where ``|reward_scaling| <= 1``, since advmon's rewards are the unscaled ones), and no
    normalization ``none`` (only with ``reward_scaling`` 1 and ``reward_bias`` 0). Anything else (a
    group-level ``adv_norm`` over tokens, GAE returns with KL terms) fits no kind: ``None``, inferred from
    the data, and judged by the loosest bound where it fits none.
    """
    adv = getattr(settings, "adv_norm", None)
    if adv is not None:
        return "batch" if adv.std_level == "batch" else None
    if critic or settings.kl_ctl != 0 or settings.discount != 1 or settings.gae_lambda != 1:
        return None
    reward = getattr(settings, "reward_norm", None)
    scaling, bias = float(settings.reward_scaling), float(settings.reward_bias)
    if reward is None:
        return "none" if scaling == 1 and bias == 0 else None
    levels = (reward.mean_level, reward.std_level)
    if levels == ("group", "group") and not reward.mean_leave1out:
        return "group_std"
    if levels == ("batch", "batch") and not reward.mean_leave1out:
        return "batch"
    if levels == ("group", None) and abs(scaling) <= 1:
        return "group_mean"
    return None


def _step_normalization(arguments: Mapping[str, Any]) -> str | None:
    data = arguments.get("data")
    # The actor's own attributes, as the step reads them (its config may be another object, or lack them).
    return normalization_of(arguments["actor"], critic=isinstance(data, Mapping) and "values" in data)


def current_step() -> int:
    """AReaL's ``global_step`` of the advantage step running (or last run) in this process.

    Raises:
        LookupError: no instrumented advantage step has run here yet, or its engine has no version
            (the monitor reports it once and records the call as its own step).
    """
    try:
        return _version["step"]
    except KeyError:
        raise LookupError("no AReaL advantage step with an engine version has run in this process yet") from None


def instrument(monitor: Monitor | None = None, *, group_size: int | None = None) -> Monitor:
    """Watch AReaL's advantage step; return the monitor records go to.

    Args:
        monitor: where records go. Default: the process-wide monitor, created as
            ``Monitor(step_source=current_step)`` if there is none yet.
        group_size: the rows per prompt, where no ``NormConfig`` of the actor normalizes at group level
            (``None``: from the config, else no groups).

    Instrumenting again is harmless (nothing is wrapped twice); again with another monitor moves every call to
    it, with one warning (:func:`~advmon.integrations.patching.switches`; :func:`uninstrument` first switches
    without it), and a ``group_size`` given again replaces the one installed.
    """
    global _installed
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1):
        raise AdvmonConfigError(f"group_size must be a positive int or None, got {group_size!r}")
    from areal.trainer.ppo.actor import PPOActor
    from areal.utils.data import Normalization

    with _lock:
        installed = _installed
    if installed is not None:
        moved = switches("areal", installed["monitor"], monitor)
        if not moved and (group_size is None or group_size == installed["group_size"]):
            return installed["monitor"]
        monitor = monitor if moved else installed["monitor"]
        uninstrument()
    with _lock:
        monitor = process_monitor(current_step) if monitor is None else monitor
        original = PPOActor.__dict__["_compute_advantages"]
        watched = watch_with(_advantage_step(original), monitor,
                             ArgumentNames(rewards="rewards", mask="loss_mask", groups="groups",
                                           normalization=_step_normalization))

        @functools.wraps(original)
        def _compute_advantages(self: Any, data: dict[str, Any]) -> dict[str, Any]:
            _remember_step(self)
            return watched(self, data, *_inputs(self, data, group_size))

        PPOActor._compute_advantages = _compute_advantages
        original_call = Normalization.__call__
        Normalization.__call__ = _tapping_call(original_call)
        patched = [(PPOActor, "_compute_advantages", original), (Normalization, "__call__", original_call)]
        _installed = {"monitor": monitor, "group_size": group_size, "patched": patched}
        return monitor


def _advantage_step(original: Any) -> Any:
    """What advmon watches: AReaL's own method, with the inputs advmon reads as named parameters."""

    def advantage_step(actor: Any, data: dict[str, Any], rewards: Any, loss_mask: Any, groups: Any,
                       unusable_groups: str | None = None) -> dict[str, Any]:
        call = active_call()
        if unusable_groups is not None and call is not None:  # said once and counted by the monitor
            call.problems.append(Problem("group_size_indivisible", unusable_groups))
        return original(actor, data)

    # Records name AReaL's method, not this adapter.
    advantage_step.__module__, advantage_step.__qualname__ = original.__module__, original.__qualname__
    advantage_step.__name__, advantage_step.__doc__ = original.__name__, original.__doc__
    return advantage_step


def _tapping_call(original: Any) -> Any:
    """``Normalization.__call__`` that hands the step's first normalization input to advmon as pre_norm."""

    @functools.wraps(original)
    def __call__(self: Any, x: Any, loss_mask: Any = None, *args: Any, **kwargs: Any) -> Any:
        call = active_call()
        if call is not None and call.estimator == ESTIMATOR and not call.taps.get("pre_norm"):
            tap("pre_norm", x, loss_mask)
        return original(self, x, loss_mask, *args, **kwargs)

    return __call__


def _inputs(actor: Any, data: Any, group_size: int | None) -> tuple[Any, Any, np.ndarray | None, str | None]:
    """The step's rewards, the loss mask its advantages belong to, the group of each row, and why there are no
    groups where a size was given (one that does not divide the batch makes none: a short last group is wrong)."""
    if not isinstance(data, Mapping):
        return None, None, None, None
    rewards, loss_mask = data.get("rewards"), data.get("loss_mask")
    if loss_mask is not None:  # as the step rolls it: advantage t is token t + 1's
        loss_mask = torch.roll(loss_mask.float(), shifts=-1, dims=-1)
    size = group_size if group_size is not None else group_size_of(actor)
    if size is None or rewards is None:
        return rewards, loss_mask, None, None
    if len(rewards) % size:
        return rewards, loss_mask, None, (
            f"AReaL's group size {size} does not divide the batch of {len(rewards)} rows (a last group of "
            f"{len(rewards) % size} would be a wrong one): this call has no group statistics")
    return rewards, loss_mask, np.arange(len(rewards)) // size, None


def _remember_step(actor: Any) -> None:
    version = getattr(getattr(actor, "engine", None), "get_version", None)
    if callable(version):
        try:
            _version["step"] = int(version())
        except Exception:  # noqa: BLE001 - an engine without a version yet: the step stays unknown
            _version.pop("step", None)


def uninstrument() -> None:
    """Undo :func:`instrument`: ``PPOActor._compute_advantages`` and ``Normalization.__call__`` are AReaL's again."""
    global _installed
    with _lock:
        if _installed is None:
            return
        restore(_installed["patched"])
        _installed = None
        _version.clear()


def is_instrumented() -> bool:
    return _installed is not None

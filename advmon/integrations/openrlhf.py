"""OpenRLHF: record ``RemoteExperienceMaker.compute_advantages_and_returns``, where OpenRLHF shapes rewards
and computes every estimator's advantages.

OpenRLHF (0.11) has no estimator functions: ``compute_advantages_and_returns(experiences)``
takes the step's list of ``Experience`` micro-batches, reshapes the rewards by
``n_samples_per_prompt`` (in the original prompt order, ``experience.index``), subtracts a
baseline or normalizes per group (``rloo``, ``dr_grpo``, ``reinforce_baseline``,
``group_norm``, ``flash_reinforce``), turns the rewards into per-token advantages (GAE,
``get_advantages_and_returns``, or cumulative returns, ``get_cumulative_returns``) and, for
``gae``, ``reinforce`` and ``reinforce_baseline``, whitens them over the whole step's
action tokens. :func:`instrument` wraps that method on the class and records each call
as one record:

* **rewards**: each experience's ``rewards``, as the step receives them (before OpenRLHF's
  length penalties and ``reward.clip_range``);
* **groups**: the prompt of each sample, ``index // n_samples_per_prompt`` (none when
  ``n_samples_per_prompt`` is 1);
* **post_norm**: the advantages the step leaves on the experiences, under their
  ``action_mask`` (micro-batches of different widths are padded into one batch for the
  statistics; the experiences themselves are untouched);
* **pre_norm**: for the estimators that whiten at the end, what they whiten (the GAE
  advantages, the cumulative returns); for the others it is derived (reward minus its
  group's mean, which is what ``group_norm`` divides);
* **normalization**: from ``args.algo.advantage`` (:func:`normalization_of`).

OpenRLHF calls this method once per training step, inside its ``PPOTrainer`` Ray actor:
:func:`instrument` has to run in that process (docs/integrations.md, OpenRLHF). A monitor
without a step numbers its records 0, 1, ...: OpenRLHF logs step ``n + 1`` for record ``n``.

Example (with OpenRLHF installed)::

    import advmon
    import advmon.integrations.openrlhf as advmon_openrlhf
    advmon_openrlhf.instrument(advmon.Monitor("openrlhf-grpo"))
"""

from __future__ import annotations

import functools
import inspect
import itertools
import threading
from typing import Any

import numpy as np
import torch

from advmon.hooks import ArgumentNames, active_call, tap, watch_with
from advmon.integrations.patching import restore, switches
from advmon.monitor import Monitor

__all__ = ["ESTIMATOR", "MAKER", "NORMALIZATION", "instrument", "is_instrumented", "normalization_of", "uninstrument"]

MAKER = "openrlhf.trainer.ppo_utils.experience_maker"
#: The method advmon watches, as records name it.
ESTIMATOR = f"{MAKER}.RemoteExperienceMaker.compute_advantages_and_returns"
#: The estimators whose advantages OpenRLHF whitens over the step's action tokens at the end.
WHITENED = ("gae", "reinforce", "reinforce_baseline")
#: How each ``--algo.advantage.estimator`` normalizes (advmon.normalization).
NORMALIZATION: dict[str, str] = {
    "gae": "batch",
    "reinforce": "batch",
    "reinforce_baseline": "batch",  # group mean subtracted, then whitened
    "rloo": "group_mean",  # r minus the mean of the others
    "dr_grpo": "group_mean",
    "group_norm": "group_std",  # (r - group mean) / (group std + 1e-9)
    "flash_reinforce": "none",  # r minus the batch's mean reward, not whitened
}

_lock = threading.Lock()
_installed: dict[str, Any] | None = None


def normalization_of(args: Any, kl_in_rewards: bool = False) -> str | None:
    """The kind of OpenRLHF's ``args.algo.advantage`` settings, or ``None`` (inferred from the data) where
    no kind's bound holds: a whitening estimator with ``no_std_norm`` only centres (its advantages stay in
    reward units, GAE's with a critic's), and with the KL penalty in the token rewards (OpenRLHF's default,
    ``--algo.kl.init_coef 0.01``) RLOO's and Dr. GRPO's advantages carry KL returns beyond their group's
    reward spread (a group of equal rewards has advantages that are not 0). ``group_norm``'s bound,
    ``G / sqrt(G - 1)``, does not depend on the rewards' spread: small KL returns stay within it."""
    advantage = args.algo.advantage
    if advantage.estimator in WHITENED and getattr(advantage, "no_std_norm", False):
        return None
    kind = NORMALIZATION.get(advantage.estimator)
    return None if kind == "group_mean" and kl_in_rewards else kind


def _step_normalization(arguments: Any) -> str | None:
    maker = arguments["maker"]
    kl_in_rewards = maker.kl_ctl.value > 0 and any(
        getattr(e, "kl", None) is not None and bool(torch.any(e.kl != 0)) for e in arguments["experiences"])
    return normalization_of(maker.strategy.args, kl_in_rewards)


def instrument(monitor: Monitor | None = None) -> Monitor | None:
    """Watch OpenRLHF's advantage step; return the monitor records go to.

    Args:
        monitor: where records go. Default ``None``: the process-wide monitor, looked up at each call
            (in a Ray worker, built from ``ADVMON_*`` on the first recorded call).

    Instrumenting again is harmless (nothing is wrapped twice); again with another monitor moves every call to
    it, with one warning (:func:`~advmon.integrations.patching.switches`; :func:`uninstrument` first switches
    without it).
    """
    global _installed
    from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker

    with _lock:
        installed = _installed
    if installed is not None:
        if not switches("openrlhf", installed["monitor"], monitor):
            return installed["monitor"]
        uninstrument()
    with _lock:
        methods = {name: RemoteExperienceMaker.__dict__[name]
                   for name in ("compute_advantages_and_returns", "get_advantages_and_returns", "get_cumulative_returns")}
        original = methods["compute_advantages_and_returns"]
        watched = watch_with(_advantage_step(original), monitor,
                             ArgumentNames(rewards="rewards", mask="action_mask", groups="groups",
                                           normalization=_step_normalization))

        @functools.wraps(original)
        def compute_advantages_and_returns(self: Any, experiences: Any) -> Any:
            inputs = _inputs(self, experiences)
            if inputs is None:  # not the batch advmon knows how to read: OpenRLHF's step, unrecorded
                return original(self, experiences)
            return watched(self, experiences, *inputs)[1]

        RemoteExperienceMaker.compute_advantages_and_returns = compute_advantages_and_returns
        RemoteExperienceMaker.get_advantages_and_returns = _tapping(methods["get_advantages_and_returns"])
        RemoteExperienceMaker.get_cumulative_returns = _tapping(methods["get_cumulative_returns"])
        _installed = {"monitor": monitor, "patched": [(RemoteExperienceMaker, name, fn) for name, fn in methods.items()]}
        return monitor


def _advantage_step(original: Any) -> Any:
    """What advmon watches: OpenRLHF's own method, with the inputs advmon reads as named parameters.

    It returns ``(the step's advantages as one padded [B, T] batch, what OpenRLHF returned)``: advmon reads
    the first, the caller gets the second.
    """

    def advantage_step(maker: Any, experiences: Any, rewards: Any, action_mask: Any, groups: Any) -> Any:
        result = original(maker, experiences)
        return _padded([e.advantages for e in result], action_mask.shape[1]), result

    # Records name OpenRLHF's method, not this adapter.
    advantage_step.__module__, advantage_step.__qualname__ = original.__module__, original.__qualname__
    advantage_step.__name__, advantage_step.__doc__ = original.__name__, original.__doc__
    return advantage_step


def _tapping(original: Any) -> Any:
    """GAE's advantages or the cumulative returns of an estimator OpenRLHF whitens afterwards: its pre_norm."""

    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        call = active_call()
        if call is not None and call.estimator == ESTIMATOR and self.strategy.args.algo.advantage.estimator in WHITENED:
            mask = signature.bind(self, *args, **kwargs).arguments.get("action_mask")
            tap("pre_norm", result[0] if isinstance(result, tuple) else result, mask)
        return result

    return method


def _inputs(maker: Any, experiences: Any) -> tuple[Any, Any, Any] | None:
    """The step's rewards, action mask (padded to the widest micro-batch) and each sample's prompt."""
    try:
        rewards = torch.cat([e.rewards.reshape(-1) for e in experiences])
        mask = _padded([e.action_mask for e in experiences], max(e.action_mask.shape[1] for e in experiences))
        per_prompt = int(maker.strategy.args.rollout.n_samples_per_prompt)
        index = list(itertools.chain.from_iterable(e.index for e in experiences))
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    groups = np.asarray(index) // per_prompt if per_prompt > 1 and len(index) == len(rewards) else None
    return rewards, mask, groups


def _padded(tensors: list[Any], width: int) -> torch.Tensor:
    """Rows of ``[b, t]`` tensors (``t <= width``), stacked into one ``[B, width]`` tensor, zero beyond ``t``."""
    first = tensors[0]
    dtype = torch.float32 if first.dtype == torch.bool else first.dtype
    out = torch.zeros(sum(t.shape[0] for t in tensors), width, dtype=dtype, device=first.device)
    row = 0
    for t in tensors:
        out[row:row + t.shape[0], : t.shape[1]] = t
        row += t.shape[0]
    return out


def uninstrument() -> None:
    """Undo :func:`instrument`: ``RemoteExperienceMaker``'s methods are OpenRLHF's again."""
    global _installed
    with _lock:
        if _installed is None:
            return
        restore(_installed["patched"])
        _installed = None


def is_instrumented() -> bool:
    return _installed is not None

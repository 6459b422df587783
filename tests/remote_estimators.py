"""Estimators for the cross-process tests: importable by name in a worker (pickle by reference).

``watched_grpo`` is watched at import, for the process-wide monitor; ``PlainGRPO`` is
left alone so a worker's ``ADVMON_INSTRUMENT`` can watch it when this module is imported.
"""

from __future__ import annotations

import torch

import advmon


def _grpo(prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Group-normalized outcome advantages, broadcast over the tokens."""
    _, inverse = torch.unique(prompt_ids, return_inverse=True)
    count = torch.zeros(int(inverse.max()) + 1).index_add_(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros_like(count).index_add_(0, inverse, rewards) / count
    centered = rewards - mean[inverse]
    var = torch.zeros_like(count).index_add_(0, inverse, centered * centered) / count
    return (centered / (var[inverse].sqrt() + 1e-6)).unsqueeze(-1) * mask


@advmon.watch
def watched_grpo(prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return _grpo(prompt_ids, rewards, mask)


class PlainGRPO:
    """An estimator class nobody instrumented in its module."""

    def compute_advantage(self, prompt_ids: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return _grpo(prompt_ids, rewards, mask)


class OtherGRPO(PlainGRPO):
    """A second class, instrumented in the driver of the Ray test and carried to its workers."""


class GRPOAdvantageEstimator:
    """NeMo-RL's GRPO estimator's signature and return shape (a zero-stride expand view)."""

    def __init__(self, estimator_config: dict, loss_config: dict) -> None:
        self.estimator_config, self.loss_config = estimator_config, loss_config

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        per_sample = _grpo(prompt_ids.reshape(len(rewards), -1)[:, 0], rewards, torch.ones(len(rewards), 1))
        return per_sample.expand(mask.shape)


class SingleControllerActor:
    """What NeMo-RL's asynchronous single controller does around the estimator, in its actor.

    It receives the estimator built in the driver (``actor_args.advantage_estimator``),
    computes each step's advantages chunk by chunk, and only then increments
    ``_train_steps``; it logs the step under the incremented value.
    """

    def __init__(self, master_config: dict, actor_args: dict, setup_timing_metrics: dict) -> None:
        self._advantage_estimator = actor_args["advantage_estimator"]
        self._train_steps = actor_args["current_step"]

    def run(self, batches: list) -> list:
        results = []
        for chunks in batches:
            for prompt_ids, rewards, mask in chunks:
                results.append(self._advantage_estimator.compute_advantage(
                    prompt_ids=prompt_ids, rewards=rewards, mask=mask, repeated_batch={}))
            self._train_steps += 1
        return results

    def pid(self) -> int:
        import os

        return os.getpid()


#: How often :func:`users_own_setup_hook` ran (the Ray tests' stand-in for a user's hook).
HOOK_CALLS: list[int] = []


def users_own_setup_hook() -> None:
    HOOK_CALLS.append(1)


class Holder:
    """A class nested in another, as an ``ADVMON_INSTRUMENT`` target (``module:Holder.Nested.method``)."""

    class Nested(PlainGRPO):
        pass

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

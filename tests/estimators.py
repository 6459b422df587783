"""Estimators that behave like the public frameworks' (see shared research notes).

Independent re-implementations, written for these tests, of the shapes and
calling conventions advmon must wrap unchanged: NeMo-RL's six estimators (GRPO
and GDPO return a zero-stride expand view, Reinforce++ takes keyword-only
extras, RawReward and GAE return tuples, OPD writes ``self.last_metrics``),
NeMo-RL's ``AdvantageResult`` and verl's plain GRPO function grouped by a NumPy
array of uid strings.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch


def peer_sums(values: torch.Tensor) -> torch.Tensor:
    """Each sample's sum over its peers (the other samples), adding one peer at a time.

    Elementwise float32 adds round the same on every CPU and GPU; a matmul's
    accumulation order (and so its cancellation) changes with the vector width.
    """
    n = values.shape[0]
    position = torch.arange(n, device=values.device)
    total = torch.zeros_like(values)
    for j in range(n):
        total = total + torch.where(position == j, 0.0, values[j])
    return total


def loo_baseline_and_std(prompt_ids: torch.Tensor, rewards: torch.Tensor):
    """Leave-one-out mean and unbiased std over each sample's peers (identical prompt rows)."""
    baseline = torch.zeros_like(rewards)
    std = torch.zeros_like(rewards)
    for prompt in torch.unique(prompt_ids, dim=0):
        idx = torch.nonzero((prompt_ids == prompt).reshape(len(prompt_ids), -1).all(1)).flatten()
        n = len(idx)
        if n <= 1:
            baseline[idx] = rewards[idx]
            continue
        r = rewards[idx]
        mean = peer_sums(r) / (n - 1)
        sq = peer_sums(r * r) / (n - 1)
        baseline[idx] = mean
        if n > 2:
            # E[x^2] - E[x]^2 in float32, as NeMo-RL computes it (and cancels): rewards
            # [0.0] + [0.3] * 7 give a peer std of ~9e-5 and an advantage of ~-3184.
            std[idx] = ((sq - mean * mean) * ((n - 1) / (n - 2))).sqrt().nan_to_num(0.0)
    return baseline, std


class GRPOLikeEstimator:
    def compute_advantage(self, prompt_ids, rewards, mask, valid_mask=None, **kwargs):
        baseline, std = loo_baseline_and_std(prompt_ids, rewards)
        advantages = (rewards - baseline).unsqueeze(-1)
        nonzero = std > 0
        advantages[nonzero] = advantages[nonzero] / (std.unsqueeze(-1)[nonzero] + 1e-6)
        return advantages.expand(mask.shape)


class GDPOLikeEstimator:
    def compute_advantage(self, prompt_ids, rewards, mask, repeated_batch, valid_mask=None, **kwargs):
        parts = []
        for key in sorted(k for k in repeated_batch if k.startswith("reward")):
            r = repeated_batch[key]
            baseline, std = loo_baseline_and_std(prompt_ids, r)
            adv = (r - baseline).unsqueeze(-1)
            nonzero = std > 0
            adv[nonzero] = adv[nonzero] / (std.unsqueeze(-1)[nonzero] + 1e-6)
            parts.append(adv)
        advantages = sum(parts)
        advantages = (advantages - advantages.mean()) / advantages.std()
        return advantages.expand(mask.shape)


class ReinforcePPLikeEstimator:
    def compute_advantage(self, prompt_ids, rewards, mask, *, logprobs_policy=None, logprobs_reference=None, **kwargs):
        adv = rewards.unsqueeze(-1).expand(mask.shape)
        if logprobs_policy is not None and logprobs_reference is not None:
            adv = adv - 0.1 * (logprobs_policy - logprobs_reference)
        mean = (adv * mask).sum() / mask.sum()
        var = ((adv - mean).pow(2) * mask).sum() / mask.sum()
        return (adv - mean) * var.clamp(min=1e-8).rsqrt()


class RawRewardLikeEstimator:
    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        return rewards.unsqueeze(-1).expand(mask.shape), None


class GAELikeEstimator:
    def compute_advantage(self, prompt_ids, rewards, mask, values, *, logprobs_policy=None, **kwargs):
        token_rewards = torch.zeros_like(values)
        last = mask.shape[1] - 1 - mask.fliplr().argmax(dim=1)
        token_rewards[torch.arange(len(rewards)), last] = rewards
        returns = (token_rewards * mask).flip(-1).cumsum(-1).flip(-1)
        advantages = returns - values
        mean = (advantages * mask).sum() / mask.sum()
        var = ((advantages - mean) ** 2 * mask).sum() / mask.sum()
        advantages = (advantages - mean) * torch.rsqrt(var + 1e-8)
        return torch.masked_fill(advantages, ~mask.bool(), 0), returns


class OPDLikeEstimator:
    def __init__(self):
        self.last_metrics: dict[str, float] = {}

    def compute_advantage(self, prompt_ids, rewards, mask, teacher_logprobs=None, prev_logprobs=None, **kwargs):
        advantages = (teacher_logprobs - prev_logprobs).detach() * mask
        valid = advantages[mask.bool()]
        self.last_metrics = {
            "on_policy_distillation/adv_mean": valid.mean().item() if valid.numel() else 0.0,
            "on_policy_distillation/adv_std": valid.std().item() if valid.numel() > 1 else 0.0,
        }
        return advantages


@dataclass
class AdvantageResult:
    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


class ResultEstimator:
    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        adv = (rewards - rewards.mean()).unsqueeze(-1).expand(mask.shape)
        return AdvantageResult(adv, metrics={"baseline": rewards.mean().item(), "clip_fraction": torch.tensor(0.25)})


def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl-style GRPO: token-level rewards summed per sequence, groups from a uid array."""
    scores = token_level_rewards.sum(dim=-1)
    by_uid = defaultdict(list)
    for i in range(scores.shape[0]):
        by_uid[index[i]].append(scores[i])
    mean, std = {}, {}
    for uid, items in by_uid.items():
        stacked = torch.stack(items)
        mean[uid] = stacked.mean() if len(items) > 1 else torch.tensor(0.0)
        std[uid] = stacked.std() if len(items) > 1 else torch.tensor(1.0)
    normalized = torch.stack(
        [
            (scores[i] - mean[index[i]]) / (std[index[i]] + epsilon if norm_adv_by_std_in_grpo else 1.0)
            for i in range(scores.shape[0])
        ]
    )
    advantages = normalized.unsqueeze(-1) * response_mask
    return advantages, advantages


def uid_index(batch: int, group: int) -> np.ndarray:
    return np.array([f"uid-{i // group:04d}" for i in range(batch)], dtype=object)

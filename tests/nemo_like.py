"""NeMo-RL's advantage estimators, for the zoo: the real ones from a checkout, or re-implementations.

NeMo-RL is not on PyPI and its code is not committed here. :func:`load_real` imports the
real ``nemo_rl/algorithms/advantage_estimator.py`` from a checkout of NVIDIA-NeMo/RL
(``ADVMON_NEMO_RL=PATH``), with the few helpers it imports from ``nemo_rl.algorithms.utils``
taken from that checkout's own source (the rest of that module needs a GPU stack).
Without one, the classes below stand in: written for these tests from NeMo-RL's
documented behaviour (shared research notes, section 1), with its class names, flags,
signatures and return shapes:

* ``GRPOAdvantageEstimator``: a leave-one-out baseline (``use_leave_one_out_baseline``);
  with ``normalize_rewards`` each sample is divided by the std of the same samples
  (Bessel), only where that std is > 0; returns a zero-stride expand view;
* ``GDPOAdvantageEstimator``: the same per ``reward/<name>`` component, summed, then
  standardized over the batch;
* ``ReinforcePlusPlusAdvantageEstimator``: rewards minus the group mean (``minus_baseline``),
  standardized over the valid tokens;
* ``RawRewardAdvantageEstimator`` / ``GeneralizedAdvantageEstimator``: rewards (the
  terminal reward on the last valid token, for GAE with the critic's values), standardized
  over the valid tokens with ``normalize_advantages``; both return ``(advantages, returns)``.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import torch


class AdvEstimatorConfig:
    """NeMo-RL's pydantic configuration, as a plain object (extra keys allowed)."""

    def __init__(self, name: str = "grpo", normalize_rewards: bool = True, use_leave_one_out_baseline: bool = True,
                 reward_weights: list[float] | None = None, minus_baseline: bool = True, **extra: Any) -> None:
        self.name, self.normalize_rewards = name, normalize_rewards
        self.use_leave_one_out_baseline, self.reward_weights = use_leave_one_out_baseline, reward_weights
        self.minus_baseline = minus_baseline
        for key, value in extra.items():
            setattr(self, key, value)


def _groups(prompt_ids: torch.Tensor) -> torch.Tensor:
    return torch.unique(prompt_ids, dim=0, return_inverse=True)[1]


def baseline_and_std(prompt_ids: torch.Tensor, rewards: torch.Tensor, leave_one_out: bool):
    """Per sample: the mean of its group (its peers only, when leaving one out) and the Bessel std of the same."""
    group = _groups(prompt_ids)
    baseline, std = torch.zeros_like(rewards), torch.zeros_like(rewards)
    # The groups of one size at once, each sample's pool a row (float64, as one sample at a time had it: the
    # same values bit for bit, at a tenth of the zoo's time, where this was most of the NeMo-RL cases').
    order = torch.argsort(group, stable=True)  # each group's members together, in their order
    sizes = torch.bincount(group)
    starts = torch.cumsum(sizes, 0) - sizes
    for size in sizes[sizes > 0].unique().tolist():
        members = order[starts[sizes == size, None] + torch.arange(size)]  # [groups of this size, size]
        values = rewards[members].double()
        if leave_one_out:
            if size == 1:  # no peers: the sample is its own baseline
                baseline[members] = rewards[members]
                continue
            peers = torch.arange(size).expand(size, size)[~torch.eye(size, dtype=torch.bool)].view(size, size - 1)
            pools = values[:, peers]  # [groups, size, size - 1]
        else:
            pools = values[:, None, :].expand(-1, size, -1)  # [groups, size, size]: the whole group, each
        baseline[members] = pools.mean(-1).to(rewards.dtype)
        if pools.shape[-1] > 1:
            std[members] = pools.std(-1).to(rewards.dtype)
    return baseline, std


def _normalized(prompt_ids, rewards, leave_one_out: bool, normalize: bool) -> torch.Tensor:
    baseline, std = baseline_and_std(prompt_ids, rewards, leave_one_out)
    advantages = (rewards - baseline).unsqueeze(-1)
    if normalize:
        divided = std > 0
        advantages[divided] = advantages[divided] / (std.unsqueeze(-1)[divided] + 1e-6)
    return advantages


def _token_standardized(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    count = mask.sum().clamp(min=1)
    mean = (values * mask).sum() / count
    variance = ((values - mean).pow(2) * mask).sum() / count
    return (values - mean) * variance.clamp(min=1e-8).rsqrt()


class GRPOAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.use_leave_one_out_baseline = estimator_config.use_leave_one_out_baseline
        self.normalize_rewards = estimator_config.normalize_rewards

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        advantages = _normalized(prompt_ids, rewards, self.use_leave_one_out_baseline, self.normalize_rewards)
        return advantages.expand(mask.shape)


class GDPOAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.use_leave_one_out_baseline = estimator_config.use_leave_one_out_baseline
        self.normalize_rewards = estimator_config.normalize_rewards

    def compute_advantage(self, prompt_ids, rewards, mask, repeated_batch, **kwargs):
        keys = sorted(k for k in repeated_batch if isinstance(k, str) and k.startswith("reward/"))
        total = sum(_normalized(prompt_ids, repeated_batch[k], self.use_leave_one_out_baseline,
                                self.normalize_rewards) for k in keys)
        spread = total.std()
        total = (total - total.mean()) / spread if spread > 0 else total - total.mean()
        return total.expand(mask.shape)


class ReinforcePlusPlusAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.minus_baseline = estimator_config.minus_baseline

    def compute_advantage(self, prompt_ids, rewards, mask, logprobs_policy=None, logprobs_reference=None, **kwargs):
        advantages = rewards
        if self.minus_baseline:
            advantages = rewards - baseline_and_std(prompt_ids, rewards, leave_one_out=False)[0]
        return _token_standardized(advantages.unsqueeze(-1).expand(mask.shape), mask)


class RawRewardAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.normalize_advantages = estimator_config["normalize_advantages"]

    def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
        advantages = rewards.unsqueeze(-1).expand(mask.shape)
        if self.normalize_advantages:
            advantages = _token_standardized(advantages, mask)
        return advantages, None


class GeneralizedAdvantageEstimator:
    def __init__(self, estimator_config, loss_config):
        self.gae_lambda, self.gae_gamma = estimator_config["gae_lambda"], estimator_config["gae_gamma"]
        self.normalize_advantages = estimator_config["normalize_advantages"]

    def compute_advantage(self, prompt_ids, rewards, mask, values, reference_logprobs=None, logprobs=None, **kwargs):
        last = mask.shape[1] - 1 - mask.fliplr().argmax(dim=1)
        token_rewards = torch.zeros_like(values)
        token_rewards[torch.arange(mask.shape[0]), last] = rewards.to(values.dtype)
        next_value = torch.zeros(values.shape[0], dtype=values.dtype)
        running = torch.zeros_like(next_value)
        reversed_advantages = []
        for t in reversed(range(mask.shape[1])):
            delta = token_rewards[:, t] + self.gae_gamma * next_value - values[:, t]
            update = delta + self.gae_gamma * self.gae_lambda * running
            m = mask[:, t]
            next_value = values[:, t] * m + (1 - m) * next_value
            running = update * m + (1 - m) * running
            reversed_advantages.append(running)
        advantages = torch.stack(reversed_advantages[::-1], dim=1)
        returns = advantages + values
        if self.normalize_advantages:
            advantages = _token_standardized(advantages, mask)
        return advantages * mask, returns


#: The helpers advantage_estimator.py imports from nemo_rl.algorithms.utils (the rest needs a GPU stack).
_HELPERS = ("calculate_baseline_and_std_per_prompt", "calculate_kl", "get_gdpo_reward_component_keys", "masked_mean",
            "masked_var")


def load_real(checkout: Path) -> types.ModuleType:
    """``nemo_rl.algorithms.advantage_estimator`` from a checkout of NVIDIA-NeMo/RL, run as it is.

    Its own source is imported; ``nemo_rl.algorithms.utils`` is replaced by a module holding only
    the helpers it uses, compiled from that checkout's ``utils.py``; the loss configuration is a
    type annotation there, given as ``dict``.
    """
    algorithms = Path(checkout) / "nemo_rl" / "algorithms"
    if not (algorithms / "advantage_estimator.py").is_file():
        raise FileNotFoundError(f"{checkout} is not a NeMo-RL checkout (no nemo_rl/algorithms/advantage_estimator.py)")
    package = types.ModuleType("nemo_rl")
    package.__path__ = [str(algorithms.parent)]
    subpackage = types.ModuleType("nemo_rl.algorithms")
    subpackage.__path__ = [str(algorithms)]
    utils = types.ModuleType("nemo_rl.algorithms.utils")
    source = (algorithms / "utils.py").read_text()
    tree = ast.parse(source)
    wanted = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in _HELPERS]
    utils.__dict__.update({"torch": torch, "Optional": __import__("typing").Optional})
    exec(compile(ast.Module(body=wanted, type_ignores=[]), str(algorithms / "utils.py"), "exec"), utils.__dict__)
    loss = types.ModuleType("nemo_rl.algorithms.loss")
    loss.ClippedPGLossConfig = dict
    saved = {name: sys.modules.get(name) for name in ("nemo_rl", "nemo_rl.algorithms", "nemo_rl.algorithms.utils",
                                                       "nemo_rl.algorithms.loss")}
    sys.modules.update({"nemo_rl": package, "nemo_rl.algorithms": subpackage, "nemo_rl.algorithms.utils": utils,
                        "nemo_rl.algorithms.loss": loss})
    try:
        spec = importlib.util.spec_from_file_location("nemo_rl.algorithms.advantage_estimator",
                                                      algorithms / "advantage_estimator.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
    return module

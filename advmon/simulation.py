"""Simulated RL runs, healthy and failing, recorded through a real :class:`~advmon.Monitor`.

The alert catalog is tuned and scored on these runs (``docs/alerts.md``,
``benchmarks/alert_corpus.py``): each failure has a known onset step, so one can
say how many steps after onset a rule catches it, and the healthy runs say how
many false alarms it raises. They follow what real runs show (research.md):

* GRPO on binary math rewards: 25-45% zero-std groups early, more as the model
  improves; wrong answers are longer, so the token-weighted post-norm mean sits
  below 0 (about -0.1);
* NeMo-RL's estimator: leave-one-out baseline *and* leave-one-out std (the std of
  the other samples), divide only where that std is > 0;
* PPO: whitened token advantages with Gaussian tails, no groups.

Example:
    >>> records = simulate(RunSpec("grpo_binary", seed=0, steps=3, prompts=4))
    >>> len(records), records[0].metrics["groups/max_size"]
    (3, 8.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from advmon.hooks import scored_by, sliced_by
from advmon.monitor import Monitor
from advmon.record import Record

__all__ = ["FAILURES", "HEALTHY", "RunSpec", "corpus", "simulate"]

#: Healthy kinds of run.
HEALTHY = ("grpo_binary", "grpo_binary_g16", "grpo_small_batch", "grpo_graded_loo", "ppo_whitened")
#: Failure kinds, each with the alert meant to catch it.
FAILURES = {
    "nan_rewards": "AdvmonNonFiniteRewards",
    "loo_float32_cancellation": "AdvmonAdvantageBeyondBound",
    "ppo_advantage_explosion": "AdvmonAdvantageBeyondBound",
    "zero_std_collapse": "AdvmonZeroStdGroupsHigh",
    "reward_model_collapse": "AdvmonAdvantageScaleCollapse",
    "reward_scale_spike": "AdvmonAdvantageScaleSpike",
    "post_norm_mean_drift": "AdvmonPostNormMeanDrift",
    "reward_collapse": "AdvmonRewardCollapse",
    "slice_zero_std": "AdvmonSliceZeroStdHigh",
    "reward_function_none": "AdvmonRewardFunctionNonFinite",
}
#: Kinds whose runs are sliced by data source and scored by two reward functions.
_DRILLDOWN = ("slice_zero_std", "reward_function_none")


@dataclass(frozen=True)
class RunSpec:
    """One simulated run: its kind (healthy or failure), seed, size and onset."""

    kind: str
    seed: int = 0
    steps: int = 150
    onset: int = 60
    prompts: int = 32
    group_size: int = 8
    max_tokens: int = 48

    @property
    def name(self) -> str:
        return f"{self.kind}-s{self.seed}"

    @property
    def failing(self) -> bool:
        return self.kind in FAILURES


def _loo(rewards: torch.Tensor, group_size: int, one_pass: bool) -> torch.Tensor:
    """NeMo-RL's leave-one-out baseline and std per sample (float32); divide where std > 0."""
    groups = rewards.view(-1, group_size)
    others = groups.unsqueeze(1).expand(-1, group_size, -1)[:, ~torch.eye(group_size, dtype=torch.bool)]
    others = others.view(-1, group_size, group_size - 1)
    baseline = others.mean(-1)
    if one_pass:  # E[x^2] - E[x]^2 in float32: cancels when the others are (nearly) equal
        n = group_size - 1
        std = ((others.square().mean(-1) - baseline.square()) * n / (n - 1)).sqrt().nan_to_num(0.0)
    else:
        std = others.std(-1)
    advantages = groups - baseline
    spread = std > 0
    advantages = torch.where(spread, advantages / std.where(spread, torch.ones_like(std)), advantages)
    return advantages.reshape(-1)


def _group_std(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Standard GRPO (TRL, verl): group mean baseline, sample std, epsilon 1e-6."""
    groups = rewards.view(-1, group_size)
    advantages = (groups - groups.mean(-1, keepdim=True)) / (groups.std(-1, keepdim=True) + 1e-6)
    return advantages.reshape(-1)


class _Simulator:
    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.generator = torch.Generator().manual_seed(1000 * spec.seed + sum(map(ord, spec.kind)))
        g = self.generator
        self.difficulty = torch.randn(4096, generator=g) * 2.2  # a dataset of prompts
        self.mean_shift = 0.0

    def progress(self, step: int) -> float:
        return step / max(self.spec.steps - 1, 1)

    def after(self, step: int) -> int:
        """Steps since onset (negative before), 0 for healthy runs."""
        return step - self.spec.onset if self.spec.failing else -1

    def skill(self, step: int) -> float:
        skill = -0.8 + 3.0 * self.progress(step)
        if self.spec.kind == "reward_collapse" and self.after(step) >= 0:
            skill -= min(1.0, (self.after(step) + 1) / 8) * 6.0
        return skill

    def rewards(self, step: int) -> torch.Tensor:
        s, g = self.spec, self.generator
        prompts = torch.randint(0, self.difficulty.numel(), (s.prompts,), generator=g)
        p = torch.sigmoid(self.skill(step) - self.difficulty[prompts]).repeat_interleave(s.group_size)
        correct = (torch.rand(p.shape, generator=g) < p).float()
        rewards = correct
        after = self.after(step)
        if s.kind == "grpo_graded_loo" or s.kind == "loo_float32_cancellation":
            formatted = (torch.rand(p.shape, generator=g) < 0.75).float()
            rewards = torch.where(correct > 0, 1.0, 0.3 * formatted)
        if s.kind == "zero_std_collapse" and after >= 0:
            share = min(0.97, 0.3 + 0.04 * (after + 1))
            groups = rewards.view(s.prompts, s.group_size)
            collapsed = torch.rand(s.prompts, generator=g) < share
            groups[collapsed] = groups[collapsed, :1]
        if s.kind == "reward_model_collapse":
            # A learned reward model: continuous scores; after onset their spread decays.
            rewards = rewards + 0.1 * torch.randn(p.shape, generator=g)
            if after >= 0:
                rewards = 0.5 + (rewards - 0.5) * 0.5 ** (after + 1)
        if s.kind == "reward_scale_spike" and 0 <= after < 6:
            rewards = rewards * 40.0  # a reward function returning another unit for a while
        if s.kind == "nan_rewards" and after >= 0:
            rewards[torch.rand(p.shape, generator=g) < 0.01] = math.nan
        if s.kind == "slice_zero_std" and after >= 0:
            groups = rewards.view(s.prompts, s.group_size)
            math_groups = self.sources() == "math"
            groups[math_groups] = 0.0  # the math source's reward parser stopped matching: every answer fails
        return rewards

    def sources(self) -> np.ndarray:
        """Each prompt's data source: one prompt in four is ``math``, the rest ``gsm8k``."""
        return np.array(["math" if i % 4 == 0 else "gsm8k" for i in range(self.spec.prompts)])

    def functions(self, step: int, rewards: torch.Tensor) -> dict[str, torch.Tensor]:
        """Two reward functions whose sum (TRL's nansum) is the reward: correctness and a format bonus."""
        s = self.spec
        format_score = torch.full(rewards.shape, 0.0)
        if s.kind == "reward_function_none" and self.after(step) >= 0:
            math_samples = torch.from_numpy(self.sources() == "math").repeat_interleave(s.group_size)
            format_score[math_samples] = math.nan  # the format checker returns None for math answers
        return {"correctness": rewards, "format": format_score}

    def lengths(self, rewards: torch.Tensor) -> torch.Tensor:
        """Wrong answers are longer than right ones."""
        s, g = self.spec, self.generator
        base = torch.where(rewards >= 1.0, 0.45, 0.7) * s.max_tokens
        noise = torch.randn(rewards.shape, generator=g) * 0.15 * s.max_tokens
        return (base + noise).round().clamp(4, s.max_tokens).long()

    def estimator(self, step: int):
        s = self.spec
        after = self.after(step)

        def compute_advantage(prompt_ids, rewards, mask):
            if s.kind == "loo_float32_cancellation":
                flat = _loo(rewards, s.group_size, one_pass=after >= 0)  # TP=2 from the resumed checkpoint on
            elif s.kind in ("grpo_binary_g16", "grpo_small_batch", "reward_model_collapse"):
                flat = _group_std(rewards, s.group_size)
            else:
                flat = _loo(rewards, s.group_size, one_pass=False)
            if s.kind == "post_norm_mean_drift" and after >= 0:
                flat = flat + min(1.5, 0.1 * (after + 1))  # a KL term folded in with the wrong sign
            return flat.unsqueeze(-1).expand(mask.shape)

        return compute_advantage

    def ppo_advantages(self, step: int, mask: torch.Tensor) -> torch.Tensor:
        g = self.generator
        raw = torch.randn(mask.shape, generator=g) * (1 + 0.3 * torch.rand(mask.shape[0], 1, generator=g))
        valid = mask > 0
        values = raw[valid]
        whitened = (raw - values.mean()) / values.std()
        after = self.after(step)
        if self.spec.kind == "ppo_advantage_explosion" and after >= 0:
            # The critic diverges and whitening is skipped: advantages grow step by step.
            whitened = raw * (3.0 * 1.6 ** (after + 1))
        return whitened * mask


def simulate(spec: RunSpec, out: Path | None = None) -> list[Record]:
    """Run the simulation through a real Monitor and return its records (also written to ``out`` as JSONL)."""
    from advmon.sinks.jsonl import JsonlSink

    sim = _Simulator(spec)
    records: list[Record] = []

    class Keep:
        name = "keep"
        synchronous = True

        def write(self, record: Record) -> None:
            records.append(record)

    sinks: list = [Keep()]
    if out is not None:
        path = Path(out) / f"{spec.name}.jsonl"
        path.unlink(missing_ok=True)
        sinks.append(JsonlSink(path))
    ppo = spec.kind.startswith("ppo")
    with Monitor(spec.name, sinks=sinks, reward_range=(0.0, 1.0)) as monitor:
        for step in range(spec.steps):
            with monitor.step(step):
                if ppo:
                    batch, tokens = spec.prompts * spec.group_size * 4, spec.max_tokens * 4
                    lengths = torch.randint(tokens // 4, tokens + 1, (batch,), generator=sim.generator)
                    mask = (torch.arange(tokens) < lengths.unsqueeze(-1)).float()
                    rewards = sim.rewards(step)
                    monitor.observe(rewards=rewards.repeat(4), advantages=sim.ppo_advantages(step, mask), mask=mask)
                    continue
                rewards = sim.rewards(step)
                lengths = sim.lengths(rewards)
                mask = (torch.arange(spec.max_tokens) < lengths.unsqueeze(-1)).float()
                prompt_ids = torch.arange(spec.prompts).repeat_interleave(spec.group_size)
                labels = functions = None
                if spec.kind in _DRILLDOWN:
                    labels = sim.sources().repeat(spec.group_size)
                    functions = sim.functions(step, rewards)
                with sliced_by(labels), scored_by(functions):
                    monitor.watch(sim.estimator(step))(prompt_ids, rewards, mask)
    return records


def corpus(seeds: int = 3, steps: int = 150, onset: int = 60) -> list[RunSpec]:
    """The healthy and failing runs the catalog is scored on."""
    specs = []
    for kind in (*HEALTHY, *FAILURES):
        for seed in range(seeds):
            spec = RunSpec(kind, seed=seed, steps=steps, onset=onset)
            if kind == "grpo_binary_g16":
                spec = replace(spec, prompts=16, group_size=16)
            elif kind == "grpo_small_batch":
                spec = replace(spec, prompts=8)
            specs.append(spec)
    return specs

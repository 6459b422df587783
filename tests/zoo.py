"""The estimator zoo (issue 25): real estimators on simulated runs, healthy and faulty, at every reward scale.

Each run is a slowly learning policy's rollouts (binary or continuous rewards, variable
response lengths, a critic's values for GAE) fed to a real estimator through advmon's
own integration, and the alerts the in-process evaluator raises on its records:

* **verl 0.9.1**: every estimator of its registry, through verl's own
  ``ray_trainer.compute_advantage`` with :func:`advmon.integrations.verl.instrument`;
* **TRL**: ``GRPOTrainer._generate_and_score_completions`` (generation by a tiny Llama, once
  per prompt batch in a process and replayed after; the rewards and advantages TRL's own)
  with ``scale_rewards`` group / batch / none and ``multi_objective_aggregation``
  normalize_then_sum, through ``AdvmonGRPOMixin``;
* **SkyRL 0.3.0**: every estimator of its registry (GRPO both ways, RLOO, REINFORCE++, GAE,
  MaxRL) through its own ``compute_advantages_and_returns``;
* **AReaL 1.0.4**: ``PPOActor._compute_advantages`` with AReaL's example configurations;
* **OpenRLHF 0.11.2**: ``RemoteExperienceMaker.compute_advantages_and_returns`` for each
  ``--algo.advantage.estimator`` (flash-attn and vLLM stand-ins: tests/openrlhf_standins.py);
* **NeMo-RL**: its six estimator classes with their flags, through
  :func:`advmon.integrations.nemo_rl.instrument`. NeMo-RL is not on PyPI, and its code
  is not committed here: with ``ADVMON_NEMO_RL`` naming a checkout of
  NVIDIA-NeMo/RL the real classes are loaded from it, else
  :mod:`tests.nemo_like`'s re-implementations of their documented behaviour.

Faults start at ``onset``: NaN rewards, a few prompts' rewards x1000, a group divided
by a std 1000x too small (the std-normalized kinds), advantages x100 (every kind), and
most groups' rewards all equal.

    from tests.zoo import ESTIMATORS, Case, run_case
    outcome = run_case(Case("verl/rloo", scale=20.0))
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import advmon
from advmon.alerts.evaluator import Occurrence, evaluate_records
from advmon.errors import AdvmonWarning
from advmon.record import Record

SCALES = (0.01, 1.0, 5.0, 20.0, 100.0)
REWARDS = ("binary", "continuous")
SIZES = ((16, 8), (64, 16))
#: Each fault, and the least severity that must flag it within ``WITHIN`` steps of its onset.
FAULTS = {
    "nan_rewards": "critical",
    "reward_blowup": "warning",
    "cancelled_std": "warning",
    "x100": "warning",
    "zero_std_saturation": "warning",
}
WITHIN = 10
_SEVERITY = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Case:
    """One run of the zoo: an estimator, its rewards, its size, and a fault from ``onset`` on (or none)."""

    estimator: str
    rewards: str = "binary"
    scale: float = 1.0
    prompts: int = 16
    group: int = 8
    steps: int = 50
    fault: str | None = None
    onset: int = 25
    seed: int = 0

    @property
    def name(self) -> str:
        fault = f"-{self.fault}" if self.fault else ""
        return (f"{self.estimator.replace('/', '-')}-{self.rewards}-x{self.scale:g}-{self.prompts}x{self.group}"
                f"{fault}-s{self.seed}")


@dataclass
class Outcome:
    """What a run recorded and raised."""

    case: Case
    records: list[Record]
    alerts: list[Occurrence]
    warnings: list[str] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return self.case.fault is None

    def serious(self, least: str = "warning") -> list[Occurrence]:
        return [o for o in self.alerts if _SEVERITY[o.severity] >= _SEVERITY[least]]

    def caught_after(self) -> int | None:
        """Steps from onset to the first alert of the fault's least severity (``None``: not caught)."""
        least = FAULTS[self.case.fault]
        steps = [o.fired_step - self.case.onset for o in self.serious(least) if o.fired_step >= self.case.onset]
        return min(steps) if steps else None

    def false_alarms(self) -> list[Occurrence]:
        """Warning and critical alerts of a healthy run, or of a faulty one before its onset."""
        if self.healthy:
            return self.serious()
        return [o for o in self.serious() if o.fired_step < self.case.onset]

    @property
    def kinds(self) -> set[str | None]:
        return {r.normalization for r in self.records}

    def worst_ratio(self) -> float:
        ratios = [r.metrics["advantages/bound_ratio"] for r in self.records]
        return max((x for x in ratios if x == x), default=math.nan)


# --------------------------------------------------------------------------- the simulated policy


@dataclass
class Batch:
    """One step's rollouts: per sample its prompt, reward components (their sum is the reward), length."""

    prompt: np.ndarray
    components: dict[str, np.ndarray]
    lengths: np.ndarray
    width: int
    values: np.ndarray  #: a critic's per-token values [B, T] (0 at padding)
    greedy: np.ndarray  #: the greedy response's reward per sample (ReMax's baseline)
    pass_rate: np.ndarray

    def copy(self) -> Batch:
        """A copy whose arrays the caller may change (``copy.deepcopy`` cost 0.45 ms a step, 17 s over the zoo):
        every array field, and every array of a dict field, copied; the rest shared."""

        def copied(value: Any) -> Any:
            if isinstance(value, np.ndarray):
                return value.copy()
            return {key: copied(each) for key, each in value.items()} if isinstance(value, dict) else value

        return dataclasses.replace(self, **{f.name: copied(getattr(self, f.name)) for f in dataclasses.fields(self)})

    @property
    def rewards(self) -> np.ndarray:
        return sum(self.components.values())

    @property
    def mask(self) -> np.ndarray:
        return (np.arange(self.width)[None, :] < self.lengths[:, None]).astype(np.float32)

    @property
    def size(self) -> int:
        return self.prompt.shape[0]


class Policy:
    """A slowly learning policy: each prompt's pass rate rises with its skill; wrong answers run longer."""

    WIDTH = 16

    def __init__(self, case: Case, components: int = 1) -> None:
        self.case = case
        self.components = components
        self.rng = np.random.default_rng([case.seed, int(case.scale * 100), case.prompts, sum(map(ord, case.rewards))])
        self.difficulty = self.rng.normal(0.0, 1.5, 4 * case.prompts)

    def rollouts(self, step: int) -> Batch:
        """Step ``step``'s rollouts, a copy of the run's own. The draws depend on the case and never on the
        estimator, so a run's steps are drawn once per process, in step order as a run draws them, and every
        estimator fed that run gets the same batches (made anew for each, they cost as much as some estimators)."""
        key = (dataclasses.replace(self.case, estimator=""), self.components)
        if key not in _ROLLOUTS:
            policy = Policy(self.case, self.components)
            _ROLLOUTS[key] = [policy._draw(each) for each in range(self.case.steps)]
        return _ROLLOUTS[key][step].copy()

    def _draw(self, step: int) -> Batch:
        case, rng = self.case, self.rng
        prompts = rng.choice(self.difficulty.size, case.prompts, replace=False)
        skill = -0.6 + 1.2 * step / max(case.steps - 1, 1)
        pass_rate = 1.0 / (1.0 + np.exp(self.difficulty[prompts] - skill))
        rate = np.repeat(pass_rate, case.group)
        correct = (rng.random(rate.size) < rate).astype(np.float64)
        if case.rewards == "binary":
            score = correct
            greedy = (rate > 0.5).astype(np.float64)
        else:  # a reward model's score: right answers higher, no two alike
            score = 0.6 * correct + 0.4 * rng.random(rate.size)
            greedy = 0.6 * (rate > 0.5) + 0.2
        components = {"correctness": case.scale * score}
        if self.components > 1:  # a format bonus worth a fifth of the scale, earned 90% of the time
            components["format"] = case.scale * 0.2 * (rng.random(rate.size) < 0.9)
        lengths = np.clip(np.round(rng.normal(np.where(correct > 0, 0.4, 0.65) * self.WIDTH, 0.15 * self.WIDTH)),
                          2, self.WIDTH).astype(np.int64)
        tokens = np.arange(self.WIDTH)[None, :] < lengths[:, None]
        values = case.scale * (rate[:, None] + 0.3 * rng.normal(size=(rate.size, self.WIDTH))) * tokens
        batch = Batch(np.repeat(np.arange(case.prompts), case.group), components, lengths, self.WIDTH,
                      values.astype(np.float32), case.scale * greedy, pass_rate)
        if case.fault is not None and step >= case.onset:
            self._break(batch)
        return batch

    def _break(self, batch: Batch) -> None:
        case, rng = self.case, self.rng
        groups = {name: values.reshape(case.prompts, case.group) for name, values in batch.components.items()}
        if case.fault == "nan_rewards":  # a reward function that crashed returns NaN for two samples
            batch.components["correctness"][rng.choice(batch.size, 2, replace=False)] = math.nan
        elif case.fault == "reward_blowup":  # two prompts scored in another unit (x1000)
            total = sum(groups.values())
            lively = np.flatnonzero(total.max(1) > total.min(1))
            chosen = (lively if lively.size else np.arange(case.prompts))[:2]
            for values in groups.values():
                values[chosen] *= 1000.0
        elif case.fault == "zero_std_saturation":  # 95% of the prompts: every sample scores alike
            chosen = rng.random(case.prompts) < 0.95
            for values in groups.values():
                values[chosen] = values[chosen, :1]


#: Each run's batches, step by step, keyed by the case less its estimator and the reward components drawn.
_ROLLOUTS: dict[tuple[Case, int], list[Batch]] = {}


def break_advantages(case: Case, step: int, advantages: torch.Tensor) -> torch.Tensor:
    """The output faults: advantages x100, or one group divided by a std 1000x too small (a new tensor)."""
    if case.fault not in ("x100", "cancelled_std") or step < case.onset:
        return advantages
    if case.fault == "x100":
        return advantages * 100.0
    # The first group with an advantage to scale (pass@k gives all but a group's best sample 0, ties 0 too).
    peaks = advantages.detach().abs().reshape(advantages.shape[0], -1).amax(1).reshape(case.prompts, case.group)
    lively = np.flatnonzero(peaks.amax(1).numpy() > 0)
    if not lively.size:
        return advantages
    rows = torch.zeros(advantages.shape[0], dtype=torch.bool)
    rows[lively[0] * case.group : (lively[0] + 1) * case.group] = True
    factor = torch.where(rows, 1000.0, 1.0).to(advantages.dtype)
    return advantages * (factor[:, None] if advantages.dim() == 2 else factor)


# --------------------------------------------------------------------------- the estimators


@dataclass(frozen=True)
class Estimator:
    """How to run one zoo estimator: its framework's runner, its declared kind and whether it takes components."""

    framework: str
    kind: str | None  #: the normalization advmon should record for it (None: none declared, inferred from the data)
    run: Callable[[Case, advmon.Monitor], None]
    components: int = 1
    std_normalized: bool = False

    @property
    def faults(self) -> tuple[str, ...]:
        return tuple(f for f in FAULTS if f != "cancelled_std" or self.std_normalized)


def _verl(name: str, **flags: Any) -> Callable[[Case, advmon.Monitor], None]:
    def run(case: Case, monitor: advmon.Monitor) -> None:
        _run_verl(name, case, monitor, flags)

    return run


def _run_verl(name: str, case: Case, monitor: advmon.Monitor, flags: dict[str, Any]) -> None:
    from verl import DataProto
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos, ray_trainer

    import advmon.integrations.verl as advmon_verl

    policy = Policy(case, components=2 if name == "gdpo" else 1)
    current = {"step": 0}
    original = core_algos.ADV_ESTIMATOR_REGISTRY[name]
    attributes = [a for a, v in vars(core_algos).items() if v is original]

    @functools.wraps(original)  # advmon reads the arguments by the estimator's own names
    def faulty(*args, **kwargs):
        advantages, returns = original(*args, **kwargs)
        return break_advantages(case, current["step"], advantages), returns

    if case.fault in ("x100", "cancelled_std"):  # the estimator itself is broken: advmon watches what verl calls
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = faulty
        for attribute in attributes:
            setattr(core_algos, attribute, faulty)
    config = AlgoConfig(gamma=1.0, lam=0.95, adv_estimator=name, gdpo_reward_keys=["correctness", "format"], **flags)
    advmon_verl.instrument(monitor)
    try:
        for step in range(case.steps):
            batch = policy.rollouts(step)
            current["step"] = step
            with monitor.step(step):
                ray_trainer.compute_advantage(_verl_data(DataProto, batch, name), adv_estimator=name, gamma=1.0,
                                              lam=0.95, norm_adv_by_std_in_grpo=flags.get("norm_adv_by_std_in_grpo", True),
                                              config=config)
    finally:
        advmon_verl.uninstrument()
        core_algos.ADV_ESTIMATOR_REGISTRY[name] = original
        for attribute in attributes:
            setattr(core_algos, attribute, original)


def _verl_data(data_proto: Any, batch: Batch, name: str) -> Any:
    mask = batch.mask
    rewards = np.zeros(mask.shape, np.float32)
    rewards[np.arange(batch.size), batch.lengths - 1] = batch.rewards  # the outcome on the last response token
    prompt_length = 4
    tensors = {
        "token_level_rewards": torch.from_numpy(rewards),
        "response_mask": torch.from_numpy(mask),
        "values": torch.from_numpy(batch.values),
        # GDPO reads its reward components at the last response token.
        "prompts": torch.ones(batch.size, prompt_length, dtype=torch.long),
        "attention_mask": torch.from_numpy(np.concatenate([np.ones((batch.size, prompt_length)), mask], 1).astype(np.int64)),
    }
    if name == "remax":  # the greedy rollouts' rewards, which verl's trainer puts in the batch
        tensors["reward_baselines"] = torch.from_numpy(batch.greedy.astype(np.float32))
    if "optimal_token_baseline" in name:  # the actor's log-probs and sum of squared probabilities
        rng = np.random.default_rng(batch.size)
        probability = rng.uniform(0.2, 0.95, mask.shape)
        tensors["old_log_probs"] = torch.from_numpy(np.log(probability).astype(np.float32))
        tensors["sum_pi_squared"] = torch.from_numpy(
            (probability**2 + rng.uniform(0.0, 0.3, mask.shape) * (1 - probability) ** 2).astype(np.float32))
    non_tensors = {"uid": np.array([f"prompt-{p}" for p in batch.prompt], dtype=object)}
    non_tensors.update({key: values.astype(np.float64) for key, values in batch.components.items()})
    return data_proto.from_dict(tensors=tensors, non_tensors=non_tensors)


def _trl(**settings: Any) -> Callable[[Case, advmon.Monitor], None]:
    def run(case: Case, monitor: advmon.Monitor) -> None:
        _run_trl(case, monitor, settings)

    return run


#: (prompts, generations per prompt, completion length, mode) -> what TRL's ``_generate`` returned for them first,
#: pickled.
_TRL_ROLLOUTS: dict[tuple, bytes] = {}


def _run_trl(case: Case, monitor: advmon.Monitor, settings: dict[str, Any]) -> None:
    import tempfile

    from datasets import Dataset
    from trl import GRPOTrainer

    from advmon.integrations.trl import AdvmonGRPOMixin
    from tests import trl_run

    settings = dict(settings)
    multi = settings.get("multi_objective_aggregation") == "normalize_then_sum" or settings.pop("components", 1) > 1
    policy = Policy(case, components=2 if multi else 1)
    scores: dict[str, dict[tuple[int, int], float]] = {"correctness": {}, "format": {}}

    def scorer(component: str) -> Callable[..., list[float]]:
        def score(completions: list[str], pid: list[int], slot: list[int], **_: Any) -> list[float]:
            return [scores[component][(p, s)] for p, s in zip(pid, slot)]

        score.__name__ = component
        return score

    current = {"step": 0}

    class Broken(GRPOTrainer):  # the advantages TRL computes, broken before the mixin records them
        def _generate(self, prompts):
            # The tiny Llama's rollouts (prompts tokenized, completions generated and decoded) made once per prompt
            # list in a process and replayed after: the rewards come from the simulated policy (scores above), never
            # from the text, and the model never trains here. TRL's own code from the token ids on (padding, the
            # rewards, their groups, the advantages: what advmon watches) runs at every step; replaying only saves
            # generating (half of a TRL zoo case) and tokenizing (half of what was left).
            key = (tuple(prompts), self.num_generations, self.max_completion_length, self.model.training)
            if key not in _TRL_ROLLOUTS:
                _TRL_ROLLOUTS[key] = pickle.dumps(super()._generate(prompts))
            return pickle.loads(_TRL_ROLLOUTS[key])  # a fresh copy (deepcopy of these lists: 4x the time)

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            output["advantages"] = break_advantages(case, current["step"], output["advantages"])
            return output

    class Zoo(AdvmonGRPOMixin, Broken):
        pass

    functions = [scorer("correctness"), scorer("format")] if multi else [scorer("correctness")]
    size = case.prompts * case.group
    dataset = Dataset.from_dict({"prompt": ["1+1="] * case.prompts, "pid": list(range(case.prompts)),
                                 "slot": [0] * case.prompts})
    with tempfile.TemporaryDirectory() as directory:
        trainer = Zoo(model=trl_run.tiny_llama(), reward_funcs=functions, processing_class=trl_run.tokenizer(),
                      args=trl_run.config(Path(directory), num_generations=case.group, per_device_train_batch_size=size,
                                          max_completion_length=4, **settings),
                      train_dataset=dataset, monitor=monitor)
        for step in range(case.steps):
            batch = policy.rollouts(step)
            for name, values in batch.components.items():
                scores[name] = {(p, s): float(values[p * case.group + s])
                                for p in range(case.prompts) for s in range(case.group)}
            current["step"] = step
            trainer.state.global_step = step - 1  # the mixin records at TRL's logged step, global_step + 1
            trainer._generate_and_score_completions(
                [{"prompt": f"{p}+{p}=", "pid": p, "slot": s} for p in range(case.prompts) for s in range(case.group)])


def _nemo(name: str, **flags: Any) -> Callable[[Case, advmon.Monitor], None]:
    def run(case: Case, monitor: advmon.Monitor) -> None:
        _run_nemo(name, case, monitor, flags)

    return run


def nemo_classes() -> Any:
    """NeMo-RL's estimator module: the real one from ``ADVMON_NEMO_RL`` (a checkout), else tests.nemo_like."""
    from tests import nemo_like

    checkout = os.environ.get("ADVMON_NEMO_RL")
    return nemo_like.load_real(Path(checkout)) if checkout else nemo_like


def _run_nemo(name: str, case: Case, monitor: advmon.Monitor, flags: dict[str, Any]) -> None:
    import types

    import advmon.integrations.nemo_rl as advmon_nemo

    module = nemo_classes()
    real = getattr(module, name)
    current = {"step": 0}

    class Broken(real):  # the estimator itself is broken: advmon watches the class NeMo-RL would call
        @functools.wraps(real.compute_advantage)  # advmon reads the arguments by the estimator's own names
        def compute_advantage(self, *args, **kwargs):
            result = real.compute_advantage(self, *args, **kwargs)
            advantages = result[0] if isinstance(result, tuple) else result
            broken = break_advantages(case, current["step"], advantages)
            return (broken, *result[1:]) if isinstance(result, tuple) else broken

    Broken.__name__ = Broken.__qualname__ = name
    estimator_config = {"name": "grpo", "normalize_rewards": True, "use_leave_one_out_baseline": True,
                        "minus_baseline": True, "normalize_advantages": False, "gae_lambda": 0.95, "gae_gamma": 1.0,
                        "gae_lambda_value": None, "gae_lambda_policy": None, "length_adaptive_alpha": 0,
                        "reward_weights": None}
    estimator_config.update(flags)
    if name in ("GRPOAdvantageEstimator", "GDPOAdvantageEstimator", "ReinforcePlusPlusAdvantageEstimator"):
        estimator_config = module.AdvEstimatorConfig(**estimator_config)
    loss_config = types.SimpleNamespace(use_kl_in_reward=False, reference_policy_kl_penalty=0.0,
                                        reference_policy_kl_type="k3")
    cls = Broken if case.fault in ("x100", "cancelled_std") else real
    advmon_nemo.instrument(monitor, module=types.SimpleNamespace(**{name: cls}))
    estimator = cls(estimator_config, loss_config)
    policy = Policy(case, components=2 if name == "GDPOAdvantageEstimator" else 1)
    for step in range(case.steps):
        batch = policy.rollouts(step)
        current["step"] = step
        prompt_ids = torch.from_numpy(np.stack([batch.prompt, batch.prompt * 7 + 3], 1))  # [B, S] prompt tokens
        rewards = torch.from_numpy(batch.rewards.astype(np.float32))
        mask = torch.from_numpy(batch.mask)
        repeated = {f"reward/{key}": torch.from_numpy(v.astype(np.float32)) for key, v in batch.components.items()}
        with monitor.step(step):
            if name == "GDPOAdvantageEstimator":
                estimator.compute_advantage(prompt_ids, rewards, mask, repeated_batch=repeated)
            elif name == "GeneralizedAdvantageEstimator":
                estimator.compute_advantage(prompt_ids, rewards, mask, values=torch.from_numpy(batch.values))
            else:
                estimator.compute_advantage(prompt_ids, rewards, mask)


def _skyrl(name: str, **flags: Any) -> Callable[[Case, advmon.Monitor], None]:
    def run(case: Case, monitor: advmon.Monitor) -> None:
        _run_skyrl(name, case, monitor, flags)

    return run


def _run_skyrl(name: str, case: Case, monitor: advmon.Monitor, flags: dict[str, Any]) -> None:
    """SkyRL 0.3.0's own ``compute_advantages_and_returns``, as its trainer calls it, instrumented by advmon."""
    import advmon.integrations.skyrl as advmon_skyrl

    ppo_utils = advmon_skyrl.load_ppo_utils()
    registry = ppo_utils.AdvantageEstimatorRegistry
    original = registry._functions[name]
    current = {"step": 0}

    @functools.wraps(original)  # advmon reads the arguments by the estimator's own names
    def faulty(*args, **kwargs):
        advantages, returns = original(*args, **kwargs)
        return break_advantages(case, current["step"], advantages), returns

    if case.fault in ("x100", "cancelled_std"):  # the estimator itself is broken: advmon watches what SkyRL calls
        registry._functions[name] = faulty
    advmon_skyrl.instrument(monitor)
    policy = Policy(case)
    try:
        for step in range(case.steps):
            batch = policy.rollouts(step)
            current["step"] = step
            mask = batch.mask
            rewards = np.zeros(mask.shape, np.float32)
            rewards[np.arange(batch.size), batch.lengths - 1] = batch.rewards  # the outcome on the last token
            with monitor.step(step):
                ppo_utils.compute_advantages_and_returns(
                    token_level_rewards=torch.from_numpy(rewards), response_mask=torch.from_numpy(mask),
                    index=[f"prompt-{p}" for p in batch.prompt], adv_estimator=name, config=None,
                    values=torch.from_numpy(batch.values), gamma=1.0, lambd=0.95,
                    grpo_norm_by_std=flags.get("grpo_norm_by_std", True))
    finally:
        advmon_skyrl.uninstrument()
        registry._functions[name] = original


#: AReaL's example configurations (examples/math/gsm8k_*.yaml), the reward clip raised out of the way of the
#: zoo's reward scales (AReaL's default clips scaled rewards at 20: a run at scale 100 sets its own).
def _areal_configs() -> dict[str, dict[str, Any]]:
    from areal.api.cli_args import NormConfig

    def group(**levels: Any) -> Any:
        return NormConfig(group_size=8, **levels)  # replaced by the case's group size

    whiten = dict(adv_norm=NormConfig(mean_level="batch", std_level="batch"))
    return {
        "grpo": dict(kl_ctl=0.0, reward_norm=group(mean_level="group", std_level="group"), **whiten),
        "drgrpo": dict(kl_ctl=0.0, reward_norm=group(mean_level="group", std_level=None), **whiten),
        "rloo": dict(kl_ctl=0.0, reward_norm=group(mean_level="group", mean_leave1out=True, std_level=None), **whiten),
        "reinforce": dict(kl_ctl=0.001, **whiten),
        "ppo": dict(kl_ctl=0.0, **whiten),
        "grpo_no_adv_norm": dict(kl_ctl=0.0, reward_norm=group(mean_level="group", std_level="group")),
    }


def _areal(name: str) -> Callable[[Case, advmon.Monitor], None]:
    def run(case: Case, monitor: advmon.Monitor) -> None:
        _run_areal(name, case, monitor)

    return run


def _run_areal(name: str, case: Case, monitor: advmon.Monitor) -> None:
    """AReaL 1.0.4's own ``PPOActor._compute_advantages`` on the batch its trainer hands over, instrumented."""
    import dataclasses

    from areal.api.cli_args import PPOActorConfig
    from areal.trainer.ppo.actor import PPOActor

    import advmon.integrations.areal as advmon_areal

    settings = _areal_configs()[name]
    if settings.get("reward_norm") is not None:
        settings["reward_norm"] = dataclasses.replace(settings["reward_norm"], group_size=case.group)
    config = PPOActorConfig(experiment_name="zoo", trial_name=case.name, reward_scaling=10.0, reward_bias=-0.5,
                            reward_clip=1e9, **settings)
    original = PPOActor.__dict__["_compute_advantages"]
    current = {"step": 0}

    @functools.wraps(original)
    def faulty(self, data):
        out = original(self, data)
        out["advantages"] = break_advantages(case, current["step"], out["advantages"])
        return out

    if case.fault in ("x100", "cancelled_std"):  # the step itself is broken: advmon watches what AReaL calls
        PPOActor._compute_advantages = faulty
    advmon_areal.instrument(monitor, group_size=case.group)
    policy, prompt = Policy(case), 3
    try:
        actor = PPOActor(config, engine=None)
        for step in range(case.steps):
            batch = policy.rollouts(step)
            current["step"] = step
            length = prompt + batch.width
            attention = (np.arange(length)[None, :] < (prompt + batch.lengths)[:, None]).astype(np.int64)
            loss_mask = ((np.arange(length)[None, :] >= prompt) & (attention > 0)).astype(np.int64)
            rng = np.random.default_rng(step)
            data = {"input_ids": torch.ones(batch.size, length, dtype=torch.long),
                    "attention_mask": torch.from_numpy(attention), "loss_mask": torch.from_numpy(loss_mask),
                    "logprobs": torch.from_numpy(rng.normal(-1.0, 0.3, (batch.size, length)).astype(np.float32)),
                    "ref_logp": torch.from_numpy(rng.normal(-1.0, 0.3, (batch.size, length)).astype(np.float32)),
                    "rewards": torch.from_numpy(batch.rewards.astype(np.float32))}
            if name == "ppo":  # a critic's values over the whole sequence
                values = np.zeros((batch.size, length), np.float32)
                values[:, prompt:] = batch.values
                data["values"] = torch.from_numpy(values)
            with monitor.step(step):
                actor._compute_advantages(data)
    finally:
        advmon_areal.uninstrument()
        PPOActor._compute_advantages = original


def _openrlhf(name: str) -> Callable[[Case, advmon.Monitor], None]:
    def run(case: Case, monitor: advmon.Monitor) -> None:
        _run_openrlhf(name, case, monitor)

    return run


def _run_openrlhf(name: str, case: Case, monitor: advmon.Monitor) -> None:
    """OpenRLHF 0.11.2's own ``compute_advantages_and_returns`` over a step's micro-batches, instrumented
    (flash-attn and vLLM, which its module imports, are tests/openrlhf_standins.py's)."""
    import argparse
    from types import SimpleNamespace

    from tests import openrlhf_standins

    with openrlhf_standins.importing():  # gone from sys.modules after: TRL looks for a real vLLM
        from openrlhf.trainer.ppo_utils.experience import Experience
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
        from openrlhf.utils.config import hierarchize

    import advmon.integrations.openrlhf as advmon_openrlhf

    flat = {"rollout.n_samples_per_prompt": case.group, "algo.advantage.estimator": name,
            "algo.advantage.gamma": 1.0, "algo.advantage.lambd": 0.95, "algo.advantage.no_std_norm": False,
            "algo.kl.init_coef": 0.0, "reward.clip_range": (-1e9, 1e9), "reward.overlong_buffer_len": None,
            "reward.overlong_penalty_factor": 1, "reward.stop_properly_penalty_coef": None}
    args = hierarchize(argparse.Namespace(**flat))
    maker = RemoteExperienceMaker(None, None, None, None, FixedKLController(0.0), SimpleNamespace(args=args),
                                  tokenizer=None)
    original = RemoteExperienceMaker.__dict__["compute_advantages_and_returns"]
    current = {"step": 0}

    @functools.wraps(original)
    def faulty(self, experiences, **kwargs):
        out = original(self, experiences, **kwargs)
        for experience in experiences:  # one micro-batch in prompt order: the whole batch
            experience.advantages = break_advantages(case, current["step"], experience.advantages)
        return out

    if case.fault in ("x100", "cancelled_std"):
        RemoteExperienceMaker.compute_advantages_and_returns = faulty
    advmon_openrlhf.instrument(monitor)
    policy = Policy(case)
    try:
        for step in range(case.steps):
            batch = policy.rollouts(step)
            current["step"] = step
            mask = torch.from_numpy(batch.mask > 0)
            experience = Experience(action_mask=mask, rewards=torch.from_numpy(batch.rewards.astype(np.float32)),
                                    kl=torch.zeros(mask.shape), values=torch.from_numpy(batch.values),
                                    index=list(range(batch.size)), info={})
            with monitor.step(step):
                maker.compute_advantages_and_returns([experience])
    finally:
        advmon_openrlhf.uninstrument()
        RemoteExperienceMaker.compute_advantages_and_returns = original


def _estimators() -> dict[str, Estimator]:
    verl_kinds = {
        "gae": "batch", "grpo": "group_std", "grpo_vectorized": "group_std", "grpo_passk": "group_std",
        "gdpo": "batch", "reinforce_plus_plus": "batch", "reinforce_plus_plus_baseline": "batch", "rloo": "group_mean",
        "rloo_vectorized": "group_mean", "opo": "group_mean", "gpg": "gpg", "remax": "none",
        "optimal_token_baseline": "none", "tir_optimal_token_baseline": "none",
    }
    zoo = {f"verl/{name}": Estimator("verl", kind, _verl(name), components=2 if name == "gdpo" else 1,
                                     std_normalized=kind == "group_std")
           for name, kind in verl_kinds.items()}
    zoo["verl/grpo(norm_adv_by_std_in_grpo=False)"] = Estimator("verl", "group_mean",
                                                                _verl("grpo", norm_adv_by_std_in_grpo=False))
    zoo.update({
        "trl/scale_rewards=group": Estimator("trl", "group_std", _trl(scale_rewards="group"), std_normalized=True),
        "trl/scale_rewards=batch": Estimator("trl", "batch", _trl(scale_rewards="batch")),
        "trl/scale_rewards=none": Estimator("trl", "group_mean", _trl(scale_rewards="none")),
        "trl/scale_rewards=none,two functions": Estimator("trl", "group_mean", _trl(scale_rewards="none", components=2),
                                                          components=2),
        "trl/normalize_then_sum": Estimator("trl", "batch", _trl(multi_objective_aggregation="normalize_then_sum"),
                                            components=2),
    })
    zoo.update({
        "nemo/GRPO": Estimator("nemo", "group_loo_std", _nemo("GRPOAdvantageEstimator"), std_normalized=True),
        "nemo/GRPO(use_leave_one_out_baseline=False)": Estimator(
            "nemo", "group_std", _nemo("GRPOAdvantageEstimator", use_leave_one_out_baseline=False), std_normalized=True),
        "nemo/GRPO(normalize_rewards=False)": Estimator(
            "nemo", "group_mean", _nemo("GRPOAdvantageEstimator", normalize_rewards=False)),
        "nemo/GDPO": Estimator("nemo", "batch", _nemo("GDPOAdvantageEstimator"), components=2),
        "nemo/ReinforcePlusPlus": Estimator("nemo", "batch", _nemo("ReinforcePlusPlusAdvantageEstimator")),
        "nemo/ReinforcePlusPlus(minus_baseline=False)": Estimator(
            "nemo", "batch", _nemo("ReinforcePlusPlusAdvantageEstimator", minus_baseline=False)),
        "nemo/RawReward": Estimator("nemo", "none", _nemo("RawRewardAdvantageEstimator")),
        "nemo/RawReward(normalize_advantages=True)": Estimator(
            "nemo", "batch", _nemo("RawRewardAdvantageEstimator", normalize_advantages=True)),
        "nemo/GAE": Estimator("nemo", "none", _nemo("GeneralizedAdvantageEstimator")),
        "nemo/GAE(normalize_advantages=True)": Estimator(
            "nemo", "batch", _nemo("GeneralizedAdvantageEstimator", normalize_advantages=True)),
    })
    skyrl_kinds = {"grpo": "group_std", "rloo": "group_mean", "reinforce++": "batch", "gae": "batch"}
    zoo.update({f"skyrl/{name}": Estimator("skyrl", kind, _skyrl(name), std_normalized=kind == "group_std")
                for name, kind in skyrl_kinds.items()})
    # MaxRL divides by the group's mean: no kind states its bound, advmon infers one from the data.
    zoo["skyrl/maxrl"] = Estimator("skyrl", None, _skyrl("maxrl"))
    zoo["skyrl/grpo(grpo_norm_by_std=False)"] = Estimator("skyrl", "group_mean", _skyrl("grpo", grpo_norm_by_std=False))
    areal_kinds = {"grpo": "batch", "drgrpo": "batch", "rloo": "batch", "reinforce": "batch", "ppo": "batch",
                   "grpo_no_adv_norm": "group_std"}
    zoo.update({f"areal/{name}": Estimator("areal", kind, _areal(name), std_normalized=kind == "group_std")
                for name, kind in areal_kinds.items()})
    zoo.update({f"openrlhf/{name}": Estimator("openrlhf", kind, _openrlhf(name), std_normalized=kind == "group_std")
                for name, kind in advmon_openrlhf_kinds().items()})
    return zoo


def advmon_openrlhf_kinds() -> dict[str, str]:
    """OpenRLHF's estimators and their kinds, from advmon's own table (importing it needs no OpenRLHF)."""
    import advmon.integrations.openrlhf as advmon_openrlhf

    return dict(advmon_openrlhf.NORMALIZATION)


ESTIMATORS = _estimators()


def healthy_cases(estimator: str, sizes=SIZES, scales=SCALES, rewards=REWARDS, steps: int = 50) -> list[Case]:
    return [Case(estimator, kind, scale, prompts, group, steps) for prompts, group in sizes for scale in scales
            for kind in rewards]


def fault_cases(estimator: str, scale: float = 20.0, rewards: str = "binary", onset: int = 25) -> list[Case]:
    steps = onset + WITHIN + 1
    return [Case(estimator, rewards, scale, steps=steps, fault=fault, onset=onset)
            for fault in ESTIMATORS[estimator].faults]


#: make test's fault runs: each fault at its own reward scale and kind, so the faults cover every scale.
_QUICK_FAULTS = dict(zip(FAULTS, ((0.01, "binary"), (1.0, "continuous"), (5.0, "binary"), (100.0, "continuous"),
                                  (20.0, "binary"))))


def quick_cases(estimator: str) -> tuple[list[Case], list[Case]]:
    """make test's grid: healthy at 16 x 8 for every scale and reward kind, and two runs of 64 x 16; each fault once."""
    healthy = healthy_cases(estimator, sizes=SIZES[:1])
    healthy += [Case(estimator, "binary", 1.0, *SIZES[1]), Case(estimator, "continuous", 20.0, *SIZES[1])]
    faulty = [case for fault, (scale, rewards) in _QUICK_FAULTS.items()
              for case in fault_cases(estimator, scale, rewards) if case.fault == fault]
    return healthy, faulty


class _Keep:
    name = "keep"
    synchronous = True

    def __init__(self) -> None:
        self.records: list[Record] = []

    def write(self, record: Record) -> None:
        self.records.append(record)


def run_case(case: Case) -> Outcome:
    """One run through a real Monitor; its records, the alerts they raise, and advmon's own warnings."""
    sink = _Keep()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdvmonWarning)
        with advmon.Monitor(case.name, sinks=[sink]) as monitor:
            ESTIMATORS[case.estimator].run(case, monitor)
    said = [str(w.message) for w in caught if issubclass(w.category, AdvmonWarning)]
    return Outcome(case, sink.records, evaluate_records(sink.records), said)



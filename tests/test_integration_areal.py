"""advmon inside the real AReaL 1.0.4: ``PPOActor._compute_advantages`` with AReaL's own example configurations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import advmon
from tests.conftest import ListSink
from tests.reference import assert_stats_close, bound_ratio, derived_pre_norm, group_stats, value_stats
from tests.services import require_module


def import_areal() -> None:
    """AReaL's names in this module, imported when a test first needs them, not when pytest collects the module:
    the import costs 6 s of CPU, which every test process collecting the suite paid, whether or not it ran one of
    these tests (tests/test_edges_frameworks.py borrows ``step`` and ``config``, which call this first)."""
    global NormConfig, PPOActorConfig, PPOActor, Normalization, advmon_areal
    if "advmon_areal" in globals():
        return
    require_module("areal")  # in CI a missing AReaL fails, never skips
    from areal.api.cli_args import NormConfig, PPOActorConfig
    from areal.trainer.ppo.actor import PPOActor
    from areal.utils.data import Normalization

    import advmon.integrations.areal as advmon_areal


@pytest.fixture(scope="module", autouse=True)
def _areal() -> None:
    import_areal()

GROUP = 4
PROMPT = 3
RANGE = (0.0, 1.25)


def group_norm(**levels) -> NormConfig:
    return NormConfig(group_size=GROUP, **levels)


#: AReaL's example configurations (examples/math/gsm8k_*.yaml: reward_scaling 10, reward_bias -0.5; made when a
#: test asks, once AReaL is imported), and the kind each declares. "grpo" is gsm8k_grpo.yaml; "reinforce" and "ppo" have no group-level normalization,
#: so their groups come from instrument(group_size=...).
CONFIGS = {
    "grpo": (lambda: dict(kl_ctl=0.0, reward_norm=group_norm(mean_level="group", std_level="group"),
                  adv_norm=NormConfig(mean_level="batch", std_level="batch")), "batch"),
    "drgrpo": (lambda: dict(kl_ctl=0.0, reward_norm=group_norm(mean_level="group", std_level=None),
                    adv_norm=NormConfig(mean_level="batch", std_level="batch")), "batch"),
    "rloo": (lambda: dict(kl_ctl=0.0, reward_norm=group_norm(mean_level="group", mean_leave1out=True, std_level=None),
                  adv_norm=NormConfig(mean_level="batch", std_level="batch")), "batch"),
    "reinforce": (lambda: dict(kl_ctl=0.001, adv_norm=NormConfig(mean_level="batch", std_level="batch")), "batch"),
    "ppo": (lambda: dict(kl_ctl=0.0, adv_norm=NormConfig(mean_level="batch", std_level="batch")), "batch"),
    # Without adv_norm, each token's advantage is its sequence's shaped reward: reward_norm decides.
    "grpo_no_adv_norm": (lambda: dict(kl_ctl=0.0, reward_norm=group_norm(mean_level="group", std_level="group")),
                         "group_std"),
    "drgrpo_unscaled": (lambda: dict(kl_ctl=0.0, reward_scaling=1.0, reward_bias=0.0,
                                     reward_norm=group_norm(mean_level="group", std_level=None)), "group_mean"),
    "raw": (lambda: dict(kl_ctl=0.0, reward_scaling=1.0, reward_bias=0.0), "none"),
}
CRITIC = {"ppo"}


def config(name: str, **changes) -> PPOActorConfig:
    import_areal()
    settings = {"experiment_name": "advmon", "trial_name": "test", "reward_scaling": 10.0, "reward_bias": -0.5,
                **CONFIGS[name][0](), **changes}
    return PPOActorConfig(**settings)


class Engine:
    """The one thing the advantage step's caller reads from AReaL's train engine: its weight version."""

    def __init__(self, version: int = 0) -> None:
        self.version = version

    def get_version(self) -> int:
        return self.version


def batch(seed: int = 0, prompts: int = 5, length: int = 14, values: bool = False) -> dict:
    """A padded batch as AReaL's trainer hands it over: prompt then response tokens, the response's loss mask,
    the inference engine's log-probs, one task reward per sequence."""
    rng = np.random.default_rng(seed)
    size = prompts * GROUP
    responses = rng.integers(2, length - PROMPT, size)
    attention = (np.arange(length)[None, :] < (PROMPT + responses)[:, None]).astype(np.int64)
    loss_mask = ((np.arange(length)[None, :] >= PROMPT) & (attention > 0)).astype(np.int64)
    rewards = (rng.random(size) < 0.5) + 0.25 * rng.random(size)
    rewards[:GROUP] = 1.0  # one zero-std group
    data = {"input_ids": torch.ones(size, length, dtype=torch.long), "attention_mask": torch.from_numpy(attention),
            "loss_mask": torch.from_numpy(loss_mask),
            "logprobs": torch.from_numpy(rng.normal(-1.0, 0.3, (size, length)).astype(np.float32)),
            "ref_logp": torch.from_numpy(rng.normal(-1.0, 0.3, (size, length)).astype(np.float32)),
            "rewards": torch.from_numpy(rewards.astype(np.float32))}
    if values:
        data["values"] = torch.from_numpy(rng.normal(0.5, 0.2, (size, length)).astype(np.float32))
    return data


def step(name: str, seed: int = 0, engine: Engine | None = None, **changes) -> tuple[dict, dict]:
    """AReaL's own advantage step on a fresh batch; returns (what it returned, the batch as it came in)."""
    import_areal()
    given = batch(seed, values=name in CRITIC)
    before = {key: value.clone() for key, value in given.items()}
    return PPOActor(config(name, **changes), engine=engine)._compute_advantages(given), before


@pytest.fixture
def sink():
    sink = ListSink()
    sink.monitor = advmon.Monitor("areal", sinks=[sink], reward_range=RANGE)
    yield sink
    advmon_areal.uninstrument()
    sink.monitor.close()


def expected_pre_norm(name: str, before: dict) -> tuple[np.ndarray, np.ndarray | None] | None:
    """What the step's first Normalization receives: the scaled, clipped rewards (reward_norm), else the GAE
    advantages adv_norm would whiten (AReaL's own step run without adv_norm), under the rolled loss mask."""
    cfg = config(name)
    if cfg.reward_norm is not None:
        r = before["rewards"].numpy()  # float32, as AReaL computes it
        scaled = (r + np.float32(cfg.reward_bias)) * np.float32(cfg.reward_scaling)
        return np.clip(scaled, -cfg.reward_clip, cfg.reward_clip).astype(np.float64), None
    if cfg.adv_norm is not None:
        raw = PPOActor(config(name, adv_norm=None), engine=None)._compute_advantages(
            {key: value.clone() for key, value in before.items()})
        return raw["advantages"].numpy().astype(np.float64), raw["loss_mask"].numpy()
    return None


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_outputs_unchanged_one_record_per_call_statistics_equal_numpy(name, sink):
    plain, _ = step(name)
    advmon_areal.instrument(sink.monitor, group_size=GROUP)
    given = batch(0, values=name in CRITIC)
    before = {key: value.clone() for key, value in given.items()}
    watched = PPOActor(config(name), engine=None)._compute_advantages(given)
    assert watched is given  # AReaL returns the batch it was given, and still does
    assert watched.keys() == plain.keys()
    for key, value in plain.items():
        assert torch.equal(watched[key], value), key
    (record,) = sink.records
    assert record.estimator == advmon_areal.ESTIMATOR
    rewards = before["rewards"].numpy().astype(np.float64)
    keys = list(np.arange(rewards.size) // GROUP)
    # AReaL's advantages belong to its loss mask rolled by one token (advantage t is token t + 1's).
    mask = np.roll(before["loss_mask"].numpy(), -1, axis=-1)
    assert np.array_equal(watched["loss_mask"].numpy(), mask)
    advantages = watched["advantages"].numpy()
    assert_stats_close(record.metrics, value_stats(advantages, mask), "advantages/post_norm/")
    assert_stats_close(record.metrics, {k: v for k, v in value_stats(rewards).items()
                                        if k in ("mean", "std", "min", "max", "count")}, "rewards/")
    for key, value in group_stats(rewards, keys, RANGE).items():
        assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
    pre = expected_pre_norm(name, before)
    if pre is None:
        assert record.pre_norm_source == "derived"
        assert_stats_close(record.metrics, value_stats(derived_pre_norm(rewards, keys)), "advantages/pre_norm/")
    else:
        assert record.pre_norm_source == "tap"
        assert_stats_close(record.metrics, value_stats(*pre), "advantages/pre_norm/")
    kind = CONFIGS[name][1]
    assert (record.normalization, record.normalization_source) == (kind, "declared")
    expected = bound_ratio(kind, rewards, keys, advantages, mask, reward_range=RANGE)
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9)
    assert record.metrics["advantages/bound_ratio"] <= 1.0 + 1e-6  # a healthy call is within its own bound


@pytest.mark.parametrize("name", ["grpo", "reinforce", "raw"])
def test_records_equal_observing_the_same_step_by_hand(name, sink):
    """What a user would record by hand around AReaL's step, with monitor.observe, is what instrument() records."""
    advmon_areal.instrument(sink.monitor, group_size=GROUP)
    out, before = step(name)
    advmon_areal.uninstrument()
    by_hand = ListSink()
    with advmon.Monitor("by-hand", sinks=[by_hand], reward_range=RANGE) as monitor:
        pre = expected_pre_norm(name, before)
        monitor.observe(rewards=before["rewards"], advantages=out["advantages"], mask=out["loss_mask"],
                        group_size=GROUP, pre_norm=None if pre is None else torch.from_numpy(pre[0]),
                        normalization=CONFIGS[name][1])
    (integrated,), (hand,) = sink.records, by_hand.records
    assert integrated.metrics.keys() == hand.metrics.keys()
    for key, value in hand.metrics.items():
        have = integrated.metrics[key]
        assert have == pytest.approx(value, rel=1e-12, abs=1e-12) or math.isnan(value) and math.isnan(have), key


def test_groups_come_from_the_group_level_norm_config(sink):
    advmon_areal.instrument(sink.monitor)  # no group_size: GRPO's reward_norm has it
    step("grpo")
    step("reinforce")  # no group-level normalization and none given: no groups
    grpo, reinforce = sink.records
    assert grpo.metrics["groups/count"] == 5 and grpo.metrics["groups/max_size"] == GROUP
    assert math.isnan(reinforce.metrics.get("groups/count", math.nan)) or reinforce.metrics["groups/count"] == 0


def test_applying_twice_is_harmless_and_undo_restores_areal(sink):
    method, call = PPOActor.__dict__["_compute_advantages"], Normalization.__dict__["__call__"]
    assert advmon_areal.instrument(sink.monitor) is sink.monitor
    assert advmon_areal.instrument(sink.monitor) is sink.monitor  # again: nothing wrapped twice
    step("grpo")
    assert len(sink.records) == 1 and sink.records[0].pre_norm_source == "tap"
    advmon_areal.uninstrument()
    advmon_areal.uninstrument()
    assert PPOActor.__dict__["_compute_advantages"] is method and Normalization.__dict__["__call__"] is call
    step("grpo")
    assert len(sink.records) == 1 and not advmon_areal.is_instrumented()


def test_the_step_is_the_engine_version_areal_logs_it_under(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monitor = advmon_areal.instrument()  # no monitor: the process-wide one, following AReaL's step
    try:
        assert monitor is advmon.get_monitor() and monitor.step_source is advmon_areal.current_step
        for version in (3, 4):
            step("grpo", seed=version, engine=Engine(version))
            step("grpo", seed=version + 100, engine=Engine(version))  # two calls, one step
        monitor.flush()
        records = advmon.read_jsonl(f"advmon-runs/{monitor.run}.jsonl")
        assert [r.step for r in records] == [3, 4]
        assert records[0].metrics["rewards/count"] == 2 * 5 * GROUP
    finally:
        advmon_areal.uninstrument()
        advmon.set_monitor(None)
        monitor.close()


@pytest.mark.parametrize("changes,kind", [
    (lambda: dict(adv_norm=group_norm(mean_level="group", std_level="group")), None),  # per-group std over tokens
    (lambda: dict(adv_norm=NormConfig(mean_level="batch", std_level=None)), None),  # centred, still in reward units
    (lambda: dict(reward_norm=group_norm(mean_level="group", mean_leave1out=True, std_level="group")), None),
    (lambda: dict(reward_norm=group_norm(mean_level="group", std_level=None)), None),  # x10: beyond the spread's bound
    (lambda: dict(reward_norm=NormConfig(mean_level="batch", std_level="batch")), "batch"),
    (lambda: dict(kl_ctl=0.1, reward_norm=group_norm(mean_level="group", std_level="group")), None),
    (lambda: dict(discount=0.99, reward_norm=group_norm(mean_level="group", std_level="group")), None),
], ids=["adv_norm=group std", "adv_norm=batch mean", "reward_norm=leave-one-out std",
      "reward_norm=group mean", "reward_norm=batch", "kl_ctl", "discount"])
def test_configurations_no_kind_describes_are_inferred(changes, kind):
    cfg = PPOActorConfig(**{"experiment_name": "advmon", "trial_name": "test", "kl_ctl": 0.0, "reward_scaling": 10.0,
                            **changes()})
    assert advmon_areal.normalization_of(cfg) == kind
    assert advmon_areal.normalization_of(config("grpo_no_adv_norm"), critic=True) is None  # GAE with a critic

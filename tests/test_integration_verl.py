"""advmon inside the real verl 0.9.1: every estimator its ray_trainer.compute_advantage calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import advmon
import advmon.lifecycle
from tests.reference import assert_stats_close, bound_ratio, derived_pre_norm, group_stats, slice_stats, value_stats
from tests.conftest import ListSink
from tests.services import require_module

verl = require_module("verl")
from verl import DataProto  # noqa: E402
from verl.trainer.config import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos, ray_trainer  # noqa: E402

import advmon.integrations.verl as advmon_verl  # noqa: E402

ESTIMATORS = ["grpo", "gae", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "grpo_vectorized",
              "opo", "gpg", "gdpo"]
GROUP = 4


def batch(seed: int = 0, prompts: int = 6, length: int = 12) -> DataProto:
    rng = np.random.default_rng(seed)
    size = prompts * GROUP
    lengths = rng.integers(3, length + 1, size)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    scores = (rng.random(size) < 0.5).astype(np.float32)
    scores[:GROUP] = 1.0  # one zero-std group
    rewards = np.zeros((size, length), np.float32)
    rewards[np.arange(size), lengths - 1] = scores  # outcome reward on the last token
    uid = np.array([f"prompt-{i // GROUP}" for i in range(size)], dtype=object)
    prompt_length = 5
    format_scores = (rng.random(size) < 0.8).astype(np.float64)
    return DataProto.from_dict(
        tensors={
            "token_level_rewards": torch.from_numpy(rewards),
            "response_mask": torch.from_numpy(mask),
            "values": torch.from_numpy(rng.normal(size=(size, length)).astype(np.float32)),
            # GDPO reads its reward components at the last response token:
            "prompts": torch.ones(size, prompt_length, dtype=torch.long),
            "attention_mask": torch.from_numpy(np.concatenate([np.ones((size, prompt_length), np.int64), mask.astype(np.int64)], 1)),
        },
        non_tensors={
            "uid": uid,
            "accuracy": scores.astype(np.float64),
            "format": format_scores,
        },
    )


def run_estimator(name: str, seed: int = 0) -> DataProto:
    config = AlgoConfig(gamma=1.0, lam=1.0, adv_estimator=name, gdpo_reward_keys=["accuracy", "format"])
    data = batch(seed)
    if name == "remax":  # its baselines, the greedy rollouts' rewards (verl passes them to every estimator)
        data.batch["reward_baselines"] = torch.from_numpy(np.random.default_rng(seed + 100).random(len(data)).astype(np.float32))
    return ray_trainer.compute_advantage(data, adv_estimator=name, config=config)


@pytest.fixture
def instrumented(tmp_path):
    sink = ListSink()
    monitor = advmon.Monitor("verl", sinks=[sink], reward_range=(0.0, 1.0))
    advmon_verl.instrument(monitor)
    sink.monitor = monitor  # for tests that instrument again
    yield sink.records
    advmon_verl.uninstrument()
    monitor.close()


@pytest.mark.parametrize("name", ESTIMATORS)
def test_outputs_unchanged_one_record_per_call_statistics_equal_numpy(name, instrumented):
    advmon_verl.uninstrument()
    plain = run_estimator(name)
    advmon_verl.instrument(instrumented_monitor(instrumented))
    watched = run_estimator(name)
    for key in ("advantages", "returns"):
        assert torch.equal(plain.batch[key], watched.batch[key]), key
    assert len(instrumented) == 1, [r.estimator for r in instrumented]
    record = instrumented[0]
    assert name.split("_")[0] in record.estimator.lower() or name == "gae" and "gae" in record.estimator
    data = batch(0)
    rewards = data.batch["token_level_rewards"].sum(-1).numpy().astype(np.float64)
    mask = data.batch["response_mask"].numpy()
    advantages = watched.batch["advantages"].numpy()
    assert_stats_close(record.metrics, value_stats(advantages, mask), "advantages/post_norm/")
    assert_stats_close(record.metrics, {k: v for k, v in value_stats(rewards).items() if k in ("mean", "std", "min", "max", "count")}, "rewards/")
    keys = list(data.non_tensor_batch["uid"])
    # Each estimator is judged by its own normalization's bound (issue 25): GRPO's G/sqrt(G-1), RLOO's and OPO's
    # group spread, GPG's spread times its batch factor, the whitened ones' Gaussian tail, ReMax's reward scale.
    kind = {"grpo": "group_std", "grpo_vectorized": "group_std", "gae": "batch", "rloo": "group_mean",
            "opo": "group_mean", "gpg": "gpg", "reinforce_plus_plus": "batch", "reinforce_plus_plus_baseline": "batch",
            "gdpo": "batch", "remax": "none"}[name]
    assert (record.normalization, record.normalization_source) == (kind, "declared")
    for key, value in group_stats(rewards, keys, (0.0, 1.0)).items():  # every estimator: the batch's uids
        assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
    assert record.metrics["groups/zero_std_count"] >= 1
    if name in advmon_verl._UNGROUPED_ESTIMATORS:  # GAE gets no uids: they come from the trainer's batch
        assert record.metrics["groups/bound_size"] == 0
        # GAE taps what it whitens, the raw GAE advantages, as its pre_norm.
        assert_stats_close(record.metrics, value_stats(raw_gae_advantages(data), mask), "advantages/pre_norm/")
        expected = bound_ratio("batch", rewards, None, advantages, mask)
        assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9)
    else:
        assert_stats_close(record.metrics, value_stats(derived_pre_norm(rewards, keys)), "advantages/pre_norm/")
        expected = bound_ratio(kind, rewards, keys, advantages, mask, reward_range=(0.0, 1.0))
        assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9), kind
        assert record.metrics["groups/bound_size"] == (record.metrics["groups/max_size"] if kind == "group_std" else 0)
    assert record.metrics["advantages/bound_ratio"] <= 1.0 + 1e-6  # a healthy call is within its own bound


def raw_gae_advantages(data: DataProto) -> np.ndarray:
    """verl's GAE advantages before its final masked_whiten (verl's own loop, whitening left out)."""
    import verl.utils.torch_functional as verl_functional

    whiten = verl_functional.masked_whiten
    verl_functional.masked_whiten = lambda values, mask, *args, **kwargs: values
    try:
        raw, _ = core_algos.compute_gae_advantage_return(
            data.batch["token_level_rewards"], data.batch["values"], data.batch["response_mask"], 1.0, 1.0)
    finally:
        verl_functional.masked_whiten = whiten
    return raw.numpy().astype(np.float64)


def instrumented_monitor(records):
    # The fixture's monitor: the one whose sink fills ``records``.
    for monitor in advmon.lifecycle.live():
        if any(getattr(s, "records", None) is records for s in monitor.sinks) and not monitor.closed:
            return monitor
    raise AssertionError("no monitor")


def test_every_path_is_watched_and_undo_restores_verl(instrumented):
    from advmon.hooks import is_watched

    # The registry keeps what was registered; its lookup and the module's attributes give the watched versions.
    assert not any(is_watched(fn) for fn in core_algos.ADV_ESTIMATOR_REGISTRY.values())
    assert all(is_watched(core_algos.get_adv_estimator_fn(name)) for name in core_algos.ADV_ESTIMATOR_REGISTRY)
    assert is_watched(core_algos.compute_grpo_outcome_advantage)
    assert is_watched(core_algos.compute_gae_advantage_return)
    # GDPO calls the module-level GRPO per reward key: one record, the outer one.
    run_estimator("gdpo")
    assert len(instrumented) == 1 and "gdpo" in instrumented[0].estimator
    advmon_verl.uninstrument()
    assert not any(is_watched(fn) for fn in core_algos.ADV_ESTIMATOR_REGISTRY.values())
    assert not is_watched(core_algos.compute_grpo_outcome_advantage)
    assert core_algos.get_adv_estimator_fn.__module__ == "verl.trainer.ppo.core_algos"


def test_estimators_registered_later_and_reregistration(instrumented):
    from advmon.hooks import is_watched

    @core_algos.register_adv_est("advmon_test_centered")
    def centered(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        scores = token_level_rewards.sum(-1)
        advantages = (scores - scores.mean()).unsqueeze(-1) * response_mask
        return advantages, advantages

    try:
        run_estimator("advmon_test_centered")
        assert len(instrumented) == 1 and "centered" in instrumented[0].estimator
        # Registering the watched version (the module's attribute) again is harmless: verl's check finds it equal
        # to what is registered, and a call is recorded once.
        wrapper = core_algos.compute_grpo_outcome_advantage
        assert core_algos.register_adv_est("grpo")(wrapper) is wrapper
        assert core_algos.ADV_ESTIMATOR_REGISTRY["grpo"] is wrapper
        run_estimator("grpo")
        assert len(instrumented) == 2 and "grpo" in instrumented[1].estimator
        advmon_verl.uninstrument()  # and undone: the registry holds verl's function again
        assert core_algos.ADV_ESTIMATOR_REGISTRY["grpo"] is core_algos.compute_grpo_outcome_advantage
        assert not is_watched(core_algos.ADV_ESTIMATOR_REGISTRY["grpo"])
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.pop("advmon_test_centered", None)


def test_step_comes_from_verls_counter():
    from verl.utils.skip.skip_manager import SkipManager

    sink = ListSink()
    records = sink.records
    monitor = advmon.Monitor("verl-steps", sinks=[sink], step_source=advmon_verl.current_step)
    advmon_verl.instrument(monitor)
    try:
        for step in (7, 8):
            SkipManager.set_step(step)
            run_estimator("grpo", seed=step)
            run_estimator("grpo", seed=step + 100)  # two calls, one step
        monitor.flush()
    finally:
        advmon_verl.uninstrument()
        monitor.close()
        SkipManager.set_step(-1)
    assert [r.step for r in records] == [7, 8]
    assert records[0].metrics["rewards/count"] == 2 * 6 * GROUP


def test_gae_pre_whitening_values_are_its_pre_norm(instrumented, monkeypatch):
    import verl.utils.torch_functional as verl_functional

    seen = []
    advmon_verl.uninstrument()
    original = verl_functional.masked_whiten

    def spy(values, mask, *args, **kwargs):
        seen.append((values.clone(), mask.clone()))
        return original(values, mask, *args, **kwargs)

    monkeypatch.setattr(verl_functional, "masked_whiten", spy)
    advmon_verl.instrument(instrumented_monitor(instrumented))
    run_estimator("gae")
    (record,) = instrumented
    (values, mask), = seen
    assert record.pre_norm_source == "tap"
    assert_stats_close(record.metrics, value_stats(values.numpy(), mask.numpy()), "advantages/pre_norm/")
    advmon_verl.uninstrument()
    assert verl_functional.masked_whiten is spy  # undo restores what was there


@pytest.mark.parametrize("name", ["grpo", "rloo", "reinforce_plus_plus", "gdpo"])
def test_data_source_slices_every_record(name, instrumented):
    """verl passes its estimators the uids, not data_source: advmon takes it from the trainer's batch."""
    data = batch(3)
    sources = np.array(["openai/gsm8k", "math"], dtype=object)[np.arange(len(data)) // GROUP % 2]
    data.non_tensor_batch["data_source"] = sources
    config = AlgoConfig(gamma=1.0, lam=1.0, adv_estimator=name, gdpo_reward_keys=["accuracy", "format"])
    out = ray_trainer.compute_advantage(data, adv_estimator=name, config=config)
    record = instrumented[-1]
    rewards = data.batch["token_level_rewards"].sum(-1).numpy().astype(np.float64)
    grouped = name not in advmon_verl._UNGROUPED_ESTIMATORS  # REINFORCE++ included: verl passes it the uids
    keys = list(data.non_tensor_batch["uid"]) if grouped else None
    expected = slice_stats([s.replace("/", "_") for s in sources], rewards, keys,
                           out.batch["advantages"].numpy(), data.batch["response_mask"].numpy())
    if name == "gdpo":  # GDPO's own rewards are its reward keys, read elsewhere: its record has no rewards
        for values in expected.values():
            for key in [k for k in values if k.startswith(("rewards/", "groups/")) and k != "rewards/count"]:
                values.pop(key)
    for label, values in expected.items():
        for key, want in values.items():
            have = record.metrics[f"slices/{label}/{key}"]
            assert have == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True), (name, label, key)
    assert {e.get("slice") for e in record.exemplars} <= {"openai_gsm8k", "math"}
    assert ray_trainer.compute_advantage.__wrapped__ is not None


def test_gdpo_reward_keys_get_the_rewards_statistics(instrumented):
    data = batch(4)
    data.non_tensor_batch["format"][3] = np.nan
    config = AlgoConfig(gamma=1.0, lam=1.0, adv_estimator="gdpo", gdpo_reward_keys=["accuracy", "format"])
    ray_trainer.compute_advantage(data, adv_estimator="gdpo", config=config)
    metrics = instrumented[-1].metrics
    for key in ("accuracy", "format"):
        expected = value_stats(data.non_tensor_batch[key].astype(np.float64))
        for name in ("mean", "count", "nan_count", "min", "max"):
            assert metrics[f"rewards/{key}/{name}"] == pytest.approx(expected[name], rel=1e-12, nan_ok=True), (key, name)
    assert metrics["rewards/format/nan_count"] == 1.0

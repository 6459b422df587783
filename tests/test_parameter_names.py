"""Issue 30, item 1: the names frameworks give masks, groups and rewards are recognised, and what advmon cannot
find is said once, never a silently wrong statistic."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import advmon
from advmon.errors import AdvmonWarning
from advmon.hooks import PARAMETER_NAMES

from .conftest import ListSink
from .reference import assert_stats_close, group_stats, value_stats


def batch(groups: int = 4, size: int = 4, width: int = 100, valid: int = 5, seed: int = 0):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 2, groups * size).astype(np.float32)
    rewards[:size] = 1.0  # one zero-std group
    mask = np.zeros((groups * size, width), np.float32)
    mask[:, :valid] = 1.0  # 5 of 100 tokens valid per row
    advantages = rng.normal(size=(groups * size, width)).astype(np.float32)
    keys = [f"uid-{i // size}" for i in range(groups * size)]
    return torch.from_numpy(rewards), torch.from_numpy(mask), torch.from_numpy(advantages), keys


def recorded(estimator, *args, **names):
    sink = ListSink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdvmonWarning)
        with advmon.Monitor("names", sinks=[sink]) as monitor:
            watched = monitor.watch(**names)(estimator) if names else monitor.watch(estimator)
            for step in range(2):
                with monitor.step(step):
                    watched(*args)
    return sink.records[-1], [str(w.message) for w in caught if issubclass(w.category, AdvmonWarning)]


@pytest.mark.parametrize("mask_name", PARAMETER_NAMES["mask"][1:])
def test_every_frameworks_mask_name_is_read_as_the_mask(mask_name):
    rewards, mask, advantages, keys = batch()
    namespace: dict = {}
    exec(f"def grpo(prompt_ids, rewards, {mask_name}):\n    return ADVANTAGES * {mask_name}\n",
         {"ADVANTAGES": advantages}, namespace)
    record, said = recorded(namespace["grpo"], torch.arange(16) // 4, rewards, mask)
    assert said == []
    assert record.metrics["advantages/post_norm/count"] == 16 * 5  # the padding is not counted
    assert_stats_close(record.metrics, value_stats((advantages * mask).numpy(), mask.numpy()), "advantages/post_norm/")


@pytest.mark.parametrize("groups_name", PARAMETER_NAMES["groups"][1:])
def test_every_frameworks_group_name_is_read_as_the_groups(groups_name):
    rewards, mask, advantages, keys = batch()
    namespace: dict = {}
    exec(f"def rloo(rewards, {groups_name}, response_mask):\n    return ADVANTAGES * response_mask\n",
         {"ADVANTAGES": advantages}, namespace)
    record, said = recorded(namespace["rloo"], rewards, keys, mask)
    assert said == []
    for key, value in group_stats(rewards.numpy(), keys).items():
        assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
    assert record.metrics["groups/zero_std_count"] >= 1


def test_verls_token_level_rewards_and_kwargs_estimators_are_read_too():
    rewards, mask, advantages, keys = batch()

    def estimator(**kwargs):  # the names arrive as keywords only
        return advantages * kwargs["response_mask"]

    token_rewards = torch.zeros(mask.shape)
    token_rewards[:, 4] = rewards  # the outcome on the last valid token
    sink = ListSink()
    with advmon.Monitor("kwargs", sinks=[sink]) as monitor:
        monitor.watch(estimator)(token_level_rewards=token_rewards, response_mask=mask, index=np.array(keys))
    metrics = sink.records[-1].metrics
    assert metrics["rewards/mean"] == pytest.approx(float(rewards.mean()))
    assert metrics["advantages/post_norm/count"] == 80 and metrics["groups/count"] == 4


def test_a_name_given_to_watch_wins_over_the_known_ones():
    rewards, mask, advantages, keys = batch()

    def estimator(prompt_ids, rewards, response_mask, mine):
        return advantages * mine

    everything = torch.ones_like(mask)
    record, said = recorded(estimator, torch.arange(16) // 4, rewards, everything, mask, mask="mine")
    assert record.metrics["advantages/post_norm/count"] == 80 and said == []


def test_per_token_advantages_without_a_mask_are_said_once_and_counted():
    rewards, mask, advantages, keys = batch()

    def estimator(prompt_ids, rewards, valid_tokens):
        return advantages * valid_tokens

    record, said = recorded(estimator, torch.arange(16) // 4, rewards, mask)
    assert len(said) == 1, said
    assert "no mask" in said[0] and "(prompt_ids, rewards, valid_tokens)" in said[0] and "watch(mask='...')" in said[0]
    assert record.metrics["advmon/internal_errors"] == 2.0  # counted at each call, said once
    assert record.metrics["advantages/post_norm/count"] == 1600  # what advmon could do: every position
    # Mapped, or declared absent, it is quiet and right.
    mapped, quiet = recorded(estimator, torch.arange(16) // 4, rewards, mask, mask="valid_tokens")
    assert quiet == [] and mapped.metrics["advantages/post_norm/count"] == 80
    _, quiet = recorded(estimator, torch.arange(16) // 4, rewards, mask, mask=None)
    assert quiet == []


def test_rewards_without_groups_are_said_once_and_counted():
    rewards, mask, advantages, keys = batch()

    def rloo(rewards, prompt_keys, response_mask):
        return advantages * response_mask

    record, said = recorded(rloo, rewards, keys, mask)
    assert len(said) == 1 and "no group ids" in said[0] and "watch(groups='...')" in said[0], said
    assert record.metrics["groups/count"] == 0 and record.metrics["advmon/internal_errors"] == 2.0
    for names in (dict(groups="prompt_keys"), dict(group_size=4), dict(groups=None)):
        record, quiet = recorded(rloo, rewards, keys, mask, **names)
        assert quiet == [], names
        if names.get("groups") is not None or "group_size" in names:
            assert record.metrics["groups/count"] == 4


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_a_mask_of_the_wrong_shape_or_dtype_is_said_once_never_a_wrong_statistic(bad):
    rewards, mask, advantages, keys = batch()

    def grpo(prompt_ids, rewards, mask):
        return advantages

    wrong = mask[:, :50] if bad == "shape" else np.array([["yes"] * 100] * 16)
    record, said = recorded(grpo, torch.arange(16) // 4, rewards, wrong)
    assert len(said) == 1, said
    assert ("does not match advantages of shape" if bad == "shape" else "expected mask as a tensor") in said[0]
    # No post-norm statistic rather than one over every position, padding included; the rest is recorded.
    assert np.isnan(record.metrics["advantages/post_norm/mean"]) and record.metrics["rewards/count"] == 16

"""At the edges real deployments reach first (issue 38): frameworks' lookups unchanged, a second monitor,
AReaL's own attributes, group sizes that disagree or do not divide, missing rewards.

Every statistic is checked against NumPy (tests/reference.py); every advmon warning a test causes is expected.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import advmon
from tests.conftest import ListSink
from tests.reference import assert_stats_close, group_stats, value_stats
from tests.services import require_module


@pytest.fixture
def sink():
    sink = ListSink()
    sink.monitor = advmon.Monitor("edges", sinks=[sink], reward_range=(0.0, 1.0))
    yield sink
    sink.monitor.close()


# --------------------------------------------------------------- missing rewards (item 13)


def test_a_none_reward_is_a_missing_reward_and_the_others_statistics_stay_right(sink):
    """Regression: observe(rewards=[1.0, None, 0.0, 1.0]) warned "expected rewards as a tensor or numeric array,
    got list" and every reward statistic, nan_count included, was NaN."""
    rewards = [1.0, None, 0.0, 1.0]
    advantages = torch.tensor([0.5, 0.0, -0.5, 0.5])
    with pytest.warns(advmon.AdvmonWarning, match=r"1 of 4 rewards was None.*missing reward"):
        sink.monitor.observe(rewards=rewards, advantages=advantages, group_size=2)
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    as_nan = np.array([math.nan if r is None else r for r in rewards])
    expected = value_stats(as_nan)
    assert expected["nan_count"] == 1.0
    assert_stats_close(metrics, {k: v for k, v in expected.items()
                                 if k in ("mean", "std", "min", "max", "count", "nan_count", "inf_count")}, "rewards/")
    for key, value in group_stats(as_nan, [0, 0, 1, 1], (0.0, 1.0)).items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key
    assert metrics["advmon/internal_errors"] == 1.0
    # Said once: the next call with a None is counted, not warned again (the suite turns warnings into errors).
    sink.monitor.observe(rewards=[None, 1.0], advantages=torch.zeros(2))
    sink.monitor.flush()
    assert sink.records[-1].metrics["rewards/nan_count"] == 1.0
    assert sink.records[-1].metrics["advmon/internal_errors"] == 2.0


def test_none_in_a_reward_functions_scores_is_missing_too(sink):
    scores = {"graded": [1.0, None, None, 0.0]}
    with pytest.warns(advmon.AdvmonWarning, match=r"2 of 4 reward function 'graded' were None"):
        sink.monitor.observe(rewards=[1.0, 0.5, 0.5, 0.0], advantages=torch.zeros(4), reward_functions=scores)
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    expected = value_stats(np.array([1.0, math.nan, math.nan, 0.0]))
    assert_stats_close(metrics, {k: v for k, v in expected.items() if k in ("mean", "std", "min", "max", "count", "nan_count")},
                       "rewards/graded/")
    assert metrics["rewards/nan_count"] == 0.0


def test_strings_among_rewards_stay_a_type_problem(sink):
    with pytest.warns(advmon.AdvmonWarning, match="expected rewards as a tensor or numeric array"):
        sink.monitor.observe(rewards=[1.0, None, "0.5"], advantages=torch.zeros(3))


# --------------------------------------------------------------- group_size (item 7)


def grpo(prompt_ids, rewards, mask):
    groups = rewards.view(-1, 4)
    advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
    return advantages.reshape(-1, 1) * mask


def test_group_size_never_overrides_the_groups_the_estimator_was_given(sink):
    """Regression: @watch(group_size=8) on est(prompt_ids, rewards, mask) with 4 real groups of 4 recorded
    groups/count 2 and zero_std_fraction 0.0 (true: 4 and 0.5)."""
    estimator = sink.monitor.watch(group_size=8)(grpo)
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1])
    prompt_ids = torch.arange(4).repeat_interleave(4)
    with pytest.warns(advmon.AdvmonWarning, match="group_size=8 disagrees with the 4 groups"):
        estimator(prompt_ids, rewards, torch.ones(16, 3))
        sink.monitor.flush()
    metrics = sink.records[-1].metrics
    expected = group_stats(rewards.numpy(), prompt_ids.tolist(), (0.0, 1.0))
    assert expected["groups/count"] == 4 and expected["groups/zero_std_fraction"] == 0.5
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key
    assert metrics["advmon/internal_errors"] == 1.0


def test_a_group_size_that_agrees_with_the_groups_is_silent(sink):
    estimator = sink.monitor.watch(group_size=4)(grpo)
    rewards = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 0])
    estimator(torch.tensor([7, 7, 7, 7, 3, 3, 3, 3]), rewards, torch.ones(8, 2))
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    for key, value in group_stats(rewards.numpy(), [0] * 4 + [1] * 4, (0.0, 1.0)).items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key
    assert metrics["advmon/internal_errors"] == 0.0


def test_a_group_size_that_does_not_divide_the_batch_makes_no_groups(sink):
    """Regression: observe(group_size=3) with 16 rewards made 6 groups (the last of 1) without a word."""
    rewards = np.random.default_rng(0).random(16)
    with pytest.warns(advmon.AdvmonWarning, match="group_size=3 does not divide the batch of 16"):
        sink.monitor.observe(rewards=torch.from_numpy(rewards), advantages=torch.zeros(16), group_size=3)
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    assert metrics["groups/count"] == 0.0 and math.isnan(metrics["groups/zero_std_fraction"])
    expected = value_stats(rewards)
    assert_stats_close(metrics, {k: expected[k] for k in ("mean", "std", "min", "max", "count")}, "rewards/")
    assert metrics["advmon/internal_errors"] == 1.0
    # One that divides the next batch is used as before.
    sink.monitor.observe(rewards=torch.from_numpy(rewards[:15]), advantages=torch.zeros(15), group_size=3)
    sink.monitor.flush()
    for key, value in group_stats(rewards[:15], [i // 3 for i in range(15)], (0.0, 1.0)).items():
        assert sink.records[-1].metrics[key] == pytest.approx(value, nan_ok=True), key


# --------------------------------------------------------------- AReaL's own attributes (item 3)


def test_areal_reads_what_its_step_reads_not_a_config_without_kl_ctl(sink):
    """Regression: an actor whose ``config`` lacks ``kl_ctl`` (a config object the actor does not read) warned and
    inferred the kind at every call, and lost its groups: the step reads the actor's own attributes."""
    from types import SimpleNamespace

    require_module("areal")
    import advmon.integrations.areal as advmon_areal
    from areal.api.cli_args import NormConfig, PPOActorConfig
    from areal.trainer.ppo.actor import PPOActor
    from tests.test_integration_areal import GROUP, batch

    settings = PPOActorConfig(experiment_name="advmon", trial_name="edges", kl_ctl=0.0, reward_scaling=1.0,
                              reward_bias=0.0, reward_norm=NormConfig(mean_level="group", std_level="group",
                                                                      group_size=GROUP))
    actor = PPOActor(settings, engine=None)
    # What the step reads of self.config: nothing about normalization, KL, discount or groups.
    actor.config = SimpleNamespace(overlong_reward_penalty=False, use_decoupled_loss=False, recompute_logprob=False)
    advmon_areal.instrument(sink.monitor)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            given = batch(0)
            rewards = given["rewards"].numpy().astype(np.float64)
            for _ in range(2):
                actor._compute_advantages({key: value.clone() for key, value in given.items()})
            sink.monitor.flush()
    finally:
        advmon_areal.uninstrument()
    assert [str(w.message) for w in caught if "advmon" in str(w.message)] == []
    assert len(sink.records) == 2 and sink.monitor.internal_errors == 0
    for record in sink.records:
        assert (record.normalization, record.normalization_source) == ("group_std", "declared")
        for key, value in group_stats(rewards, list(np.arange(rewards.size) // GROUP), (0.0, 1.0)).items():
            assert record.metrics[key] == pytest.approx(value, nan_ok=True), key

"""Normalization kinds: each step's |A| against its own estimator's bound, declared or inferred (issue 25).

Every ratio is checked against tests/reference.py's loops (``bound_ratio``), on the CPU, torch and Triton
paths; inference, declaration errors and the contradiction warning are checked on estimators written here.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import advmon
from advmon.stats import statistics_path
from advmon.errors import AdvmonWarning

from .conftest import ListSink
from .dispatch import Dispatched
from .reference import bound_ratio, group_bound_ratios
from .sketches import prefix_mask

KINDS = ("group_std", "group_loo_std", "group_mean", "gpg", "batch", "none")


def binary_batch(seed: int, prompts: int = 16, size: int = 8, scale: float = 1.0, p: float = 0.3):
    rng = np.random.default_rng(seed)
    rewards = (rng.random(prompts * size) < p).astype(np.float64) * scale
    return rewards, [i // size for i in range(prompts * size)]


def grpo(rewards: np.ndarray, size: int, ddof: int = 1) -> np.ndarray:
    grouped = rewards.reshape(-1, size)
    std = grouped.std(1, ddof=ddof, keepdims=True)
    return ((grouped - grouped.mean(1, keepdims=True)) / np.where(std > 0, std, 1.0)).reshape(-1)


def dr_grpo(rewards: np.ndarray, size: int) -> np.ndarray:
    grouped = rewards.reshape(-1, size)
    return (grouped - grouped.mean(1, keepdims=True)).reshape(-1)


def observe(advantages, rewards, keys, mask=None, path="cpu", **kwargs) -> advmon.Record:
    sink = ListSink()
    with advmon.Monitor("kinds", sinks=[sink]) as monitor, statistics_path(path):
        monitor.observe(rewards=torch.as_tensor(rewards), advantages=torch.as_tensor(advantages), mask=mask,
                        groups=keys, **kwargs)
    return sink.records[-1]


@pytest.mark.parametrize("path", ["cpu", "torch", "triton"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_kinds_ratio_equals_the_reference_on_every_path(kind, path):
    rewards, keys = binary_batch(1, scale=20.0)
    rewards[8:16] = np.linspace(0.0, 20.0, 8)  # a graded group
    rewards[16:24] = 7.0  # a zero-std group
    lengths = np.random.default_rng(2).integers(2, 12, rewards.size)
    mask = prefix_mask(lengths, 12)
    advantages = (torch.from_numpy(dr_grpo(rewards, 8))[:, None] * 1.7 + 0.05 * torch.randn(rewards.size, 12,
                  generator=torch.Generator().manual_seed(3), dtype=torch.float64)) * mask
    record = observe(advantages, rewards, keys, mask, path, normalization=kind)
    expected = bound_ratio(kind, rewards, keys, advantages.numpy(), mask.numpy())
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9), kind
    assert (record.normalization, record.normalization_source) == (kind, "declared")
    # Each exemplar's ratio is its group's, under the same kind (group_loo_std: as its call computed it).
    by_group = dict(zip(range(16), group_bound_ratios(kind if kind in ("group_std", "group_mean", "gpg", "group_loo_std")
                                                      else "group_std", rewards, keys, advantages.numpy(), mask.numpy())))
    for entry in record.exemplars:
        if kind in ("batch", "none"):  # the step's base: sqrt(N - 1) for N valid values, or the reward scale
            base = math.sqrt(mask.sum().item() - 1) if kind == "batch" else np.abs(rewards).max()
            assert entry["advantage_bound_ratio"] == pytest.approx(entry["advantage_abs_max"] / base, rel=1e-9)
        else:
            assert entry["advantage_bound_ratio"] == pytest.approx(by_group[int(entry["group"])], rel=1e-9,
                                                                   nan_ok=True)


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_ratios_of_any_batch_match_the_reference(data):
    sizes = data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=8))
    count = sum(sizes)
    special = st.sampled_from([math.nan, math.inf, 0.0, 1.0, 0.3])
    # Rewards whose squares do not underflow (a std of 1e-189 rewards is 0 in any float arithmetic).
    magnitude = st.one_of(st.floats(1e-6, 50), st.floats(-50, -1e-6))
    reward_values = data.draw(st.lists(st.one_of(magnitude, special), min_size=count, max_size=count))
    advantage_values = data.draw(st.lists(st.one_of(st.floats(-100, 100), st.sampled_from([0.0, math.nan])),
                                          min_size=count * 2, max_size=count * 2))
    valid = data.draw(st.lists(st.booleans(), min_size=count * 2, max_size=count * 2))
    kind = data.draw(st.sampled_from(KINDS))
    path = data.draw(st.sampled_from(["cpu", "torch"]))
    keys = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
    rewards = np.array(reward_values)
    advantages = torch.tensor(advantage_values, dtype=torch.float64).view(count, 2)
    mask = torch.tensor(valid).view(count, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an all-invalid mask warns; the ratio still comes
        record = observe(advantages, rewards, keys, mask, path, normalization=kind)
    expected = bound_ratio(kind, rewards, keys, advantages.numpy(), mask.numpy())
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9, nan_ok=True), kind


@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_what_each_estimator_looks_like_is_inferred_and_ambiguity_says_unknown(path):
    rewards, keys = binary_batch(4, scale=20.0)
    whitened = (rewards - rewards.mean()) / rewards.std()
    cases = {
        "group_std": grpo(rewards, 8),  # binary groups of different pass rates: |A| does not follow the spread
        "group_mean": dr_grpo(rewards, 8),  # at scale 20 |A| reaches 17.5, but never the group's spread
        "batch": whitened,
        "unknown": dr_grpo(rewards / 20.0, 8),  # scale 1: within both group bounds, so either could be
    }
    for expected, advantages in cases.items():
        r = rewards / 20.0 if expected == "unknown" else rewards
        record = observe(advantages, r, keys, path=path)
        assert (record.normalization, record.normalization_source, record.normalization_observed) == (
            expected, "inferred", expected)
        reference = bound_ratio(expected, r, keys, advantages)
        assert record.metrics["advantages/bound_ratio"] == pytest.approx(reference, rel=1e-9)
        assert record.metrics["advantages/bound_ratio"] <= 1.0 + 1e-6  # healthy: within its bound


def test_an_unknown_step_takes_the_loosest_bound_and_none_without_a_reward_scale():
    rewards, keys = binary_batch(5)
    advantages = dr_grpo(rewards, 8) * 5.0  # fits no kind exactly
    record = observe(advantages, rewards, keys)
    assert record.normalization == "unknown"
    ratios = [bound_ratio(k, rewards, keys, advantages) for k in ("group_std", "group_mean", "batch", "none")]
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(min(ratios), rel=1e-9)
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(bound_ratio("unknown", rewards, keys, advantages))
    # Without rewards there is no reward scale: advantages could be in any unit, so nothing judges them.
    sink = ListSink()
    with advmon.Monitor("no-rewards", sinks=[sink]) as monitor:
        monitor.observe(advantages=torch.from_numpy(advantages * 1000), groups=keys)
    assert math.isnan(sink.records[-1].metrics["advantages/bound_ratio"])


def test_a_x100_bug_is_beyond_every_kinds_bound_and_unknowns_too():
    rewards, keys = binary_batch(6, scale=5.0)
    healthy = {"group_std": grpo(rewards, 8), "group_mean": dr_grpo(rewards, 8),
               "batch": (rewards - rewards.mean()) / rewards.std()}
    for kind, advantages in healthy.items():
        for declared in (kind, None):
            assert observe(advantages, rewards, keys, normalization=declared).metrics["advantages/bound_ratio"] <= 1.001
            broken = observe(advantages * 100, rewards, keys, normalization=declared)
            assert broken.metrics["advantages/bound_ratio"] > 10 * 3, (kind, declared, broken.normalization)


def test_nemo_rls_leave_one_out_std_leaves_a_lone_pass_undivided_and_stays_within_its_bound():
    """A lone pass at reward scale 20: its peers' std is 0, so NeMo-RL leaves |A| = 20 (the spread)."""
    from .estimators import loo_baseline_and_std

    rewards = np.zeros(64)
    rewards[[0, 9, 10, 20, 21, 22]] = 20.0  # groups of 8: one lone pass, one pair, one triple
    prompts = torch.arange(8).repeat_interleave(8)
    r = torch.from_numpy(rewards).float()
    baseline, std = loo_baseline_and_std(prompts, r)
    advantages = torch.where(std > 0, (r - baseline) / (std + 1e-6), r - baseline).double()
    assert advantages.abs().max() == pytest.approx(20.0)
    keys = prompts.tolist()
    for path in ("cpu", "torch"):
        record = observe(advantages, rewards, keys, path=path, normalization="group_loo_std")
        expected = bound_ratio("group_loo_std", rewards, keys, advantages.numpy())
        assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-6) and expected <= 1.0
        assert bound_ratio("group_std", rewards, keys, advantages.numpy()) > 3  # group_std would page
        assert observe(advantages * 100, rewards, keys, path=path,
                       normalization="group_loo_std").metrics["advantages/bound_ratio"] > 30


def test_gpgs_batch_factor_is_its_bound():
    rewards, keys = binary_batch(8, scale=20.0, p=0.15)
    alpha = rewards.size / np.count_nonzero(rewards)
    advantages = dr_grpo(rewards, 8) * alpha
    assert observe(advantages, rewards, keys, normalization="group_mean").metrics["advantages/bound_ratio"] > 3
    record = observe(advantages, rewards, keys, normalization="gpg")
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(bound_ratio("gpg", rewards, keys, advantages))
    assert record.metrics["advantages/bound_ratio"] <= 1.0


def test_a_steps_calls_of_different_kinds_make_it_mixed_judged_by_the_loosest_bound():
    rewards, keys = binary_batch(9, scale=20.0)
    sink = ListSink()
    with advmon.Monitor("mixed", sinks=[sink]) as monitor, monitor.step(0):
        monitor.observe(rewards=torch.from_numpy(rewards), advantages=torch.from_numpy(grpo(rewards, 8)), groups=keys,
                        normalization="group_std")
        monitor.observe(rewards=torch.from_numpy(rewards), advantages=torch.from_numpy(dr_grpo(rewards, 8)),
                        groups=keys, normalization="group_mean")
    record = sink.records[-1]
    assert (record.normalization, record.normalization_source) == ("mixed", "declared")
    both = np.concatenate([grpo(rewards, 8), dr_grpo(rewards, 8)])
    twice = np.concatenate([rewards, rewards])
    ratios = [bound_ratio(k, twice, keys + keys, both) for k in ("group_std", "group_mean", "batch", "none")]
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(min(ratios), rel=1e-9)


def test_a_records_normalization_travels_through_json():
    rewards, keys = binary_batch(10)
    record = observe(grpo(rewards, 8), rewards, keys, normalization="group_std")
    again = advmon.Record.from_json(record.to_json())
    assert (again.normalization, again.normalization_source, again.normalization_observed) == (
        "group_std", "declared", record.normalization_observed)
    bare = advmon.Record("r", 0, 0.0, "e", None, {})
    assert "normalization" not in bare.to_dict() and advmon.Record.from_json(bare.to_json()).normalization is None


def test_an_unknown_normalization_is_refused_when_the_estimator_is_wrapped():
    monitor = advmon.Monitor("refuse", sinks=[])
    with pytest.raises(advmon.AdvmonConfigError, match="unknown normalization 'grpo'; expected one of group_std"):
        monitor.watch(normalization="grpo")
    with pytest.raises(advmon.AdvmonConfigError, match="unknown normalization"):
        advmon.instrument(object(), monitor, normalization="whitened")
    with pytest.raises(advmon.AdvmonConfigError, match="unknown normalization"):
        monitor.observe(rewards=torch.ones(2), advantages=torch.zeros(2), normalization="std")
    with pytest.raises(advmon.AdvmonConfigError, match="takes a kind, not a function"):
        monitor.observe(rewards=torch.ones(2), advantages=torch.zeros(2), normalization=lambda arguments: "batch")
    monitor.close()


def test_a_normalization_function_reads_the_calls_arguments_and_its_failures_never_reach_training():
    rewards, keys = binary_batch(11, scale=20.0)
    sink = ListSink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdvmonWarning)
        with advmon.Monitor("function", sinks=[sink]) as monitor:

            def kind(arguments):
                return {"std": "group_std", "mean": "group_mean", "broken": "whitened"}[arguments["scale"]]

            @monitor.watch(groups="uids", normalization=kind)
            def estimator(rewards, uids, scale):
                return torch.from_numpy(grpo(rewards.numpy(), 8) if scale == "std" else dr_grpo(rewards.numpy(), 8))

            for step, scale in enumerate(("std", "mean", "broken", "missing")):
                with monitor.step(step):
                    result = estimator(torch.from_numpy(rewards), keys, scale)
                assert torch.is_tensor(result)  # the estimator's result, whatever advmon made of its kind
    kinds = [(r.normalization, r.normalization_source) for r in sink.records]
    assert kinds == [("group_std", "declared"), ("group_mean", "declared"), ("group_mean", "inferred"),
                     ("group_mean", "inferred")]
    problems = [str(w.message) for w in caught if "normalization function" in str(w.message)]
    assert len(problems) == 1 and "returned 'whitened'" in problems[0]  # said once; KeyError counted too
    assert sink.records[-1].metrics["advmon/internal_errors"] == 2.0


def test_the_device_paths_judge_without_reading_back():
    rewards, keys = binary_batch(12, scale=20.0)
    mask = prefix_mask(np.random.default_rng(13).integers(1, 10, rewards.size), 10)
    advantages = torch.from_numpy(dr_grpo(rewards, 8))[:, None].expand(mask.shape)
    sink = ListSink()
    for kind in ("group_loo_std", "gpg", None):
        with advmon.Monitor("device", sinks=[sink]) as monitor, statistics_path("torch"):
            with Dispatched() as seen:
                monitor.observe(rewards=torch.from_numpy(rewards), advantages=advantages, mask=mask, groups=keys,
                                normalization=kind)
        assert seen.syncs == [], kind
        assert sink.records[-1].metrics["advantages/bound_ratio"] == pytest.approx(
            bound_ratio(kind or "group_mean", rewards, keys, advantages.numpy(), mask.numpy()), rel=1e-9)

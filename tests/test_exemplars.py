"""Worst-group exemplars: every field against a NumPy reference, on the CPU and device paths, through a record."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import advmon
from advmon.stats import statistics_path
from advmon.stats import row_keys

from .conftest import ListSink
from .dispatch import Dispatched
from .reference import exemplar_badness, worst_groups
from .sketches import prefix_mask

NUMBERS = ("reward_finite_count", "reward_nan_count", "reward_inf_count", "reward_function_nonfinite_count",
           "reward_min", "reward_max",
           "advantage_abs_max", "advantage_nonfinite_samples", "advantage_bound_ratio", "size")


def assert_same_worst(got: list[dict], expected: list[dict], k: int, name_of) -> None:
    """advmon's exemplars are the reference's k worst (ties may be cut either way), each field equal."""
    assert len(got) == min(k, len(expected)), (got, expected)
    by_name = {name_of(entry): entry for entry in expected}
    for entry in got:
        want = by_name[entry["group"]]
        assert entry["reason"] == want["reason"], (entry, want)
        for field in NUMBERS:
            have, ref = entry[field], want[field]
            assert (math.isnan(have) and math.isnan(ref)) or have == pytest.approx(ref, rel=1e-12, abs=0), (field, entry, want)
        assert entry["reward_mean"] == pytest.approx(want["reward_mean"], rel=1e-12, abs=1e-15, nan_ok=True)
    assert [exemplar_badness(e) for e in got] == [exemplar_badness(e) for e in expected[: len(got)]]


def batch(seed: int, groups: int = 12, size: int = 4, width: int = 16):
    """A GRPO-shaped batch with one NaN reward, one Inf reward, one singleton-sized outlier and ties to break."""
    rng = np.random.default_rng(seed)
    rewards = rng.random(groups * size)
    rewards[size * 2 + 1] = math.nan
    rewards[size * 5] = math.inf
    rewards[size * 7 : size * 8] = 0.25  # a zero-std group
    lengths = rng.integers(1, width + 1, groups * size)
    return torch.from_numpy(rewards), prefix_mask(lengths, width)


def grpo(rewards: torch.Tensor, mask: torch.Tensor, size: int) -> torch.Tensor:
    grouped = rewards.view(-1, size)
    return ((grouped - grouped.nanmean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)


@pytest.mark.parametrize("path", ["cpu", "torch", "triton"])
@pytest.mark.parametrize("layout", ["expand-view", "dense-prefix", "dense-random-mask", "per-sequence"])
@pytest.mark.parametrize("keys", ["uids", "uid-array", "prompt-rows", "id-tensor", "group-size"])
def test_exemplars_match_numpy(path, layout, keys, sink):
    size, groups, width = 4, 12, 16
    rewards, mask = batch(3, groups, size, width)
    rng = np.random.default_rng(4)
    per_sequence = grpo(rewards, mask, size)
    if layout == "expand-view":
        advantages = per_sequence.float().expand(mask.shape)
    elif layout == "per-sequence":
        advantages = per_sequence[:, 0].float()
    else:
        if layout == "dense-random-mask":
            mask = torch.from_numpy((rng.random(mask.shape) < 0.5).astype(np.float32))
        advantages = (per_sequence + torch.from_numpy(rng.normal(0, 0.3, mask.shape))).float()
        advantages[9, 0] = math.nan  # inside the mask (every row's first position is valid in a prefix mask)
        advantages[13, width - 1] = math.inf
        advantages[20, 3] = 40.0  # beyond 3 x the bound of a group of 4 (2.31)
    ids = np.arange(groups * size) // size
    prompts = torch.from_numpy(np.random.default_rng(5).integers(0, 50, (groups, 6))).repeat_interleave(size, 0)
    grouping = {
        "uids": dict(groups=[f"uid-{i}" for i in ids]),
        "uid-array": dict(groups=np.array([f"uid-{i}" for i in ids], dtype=object)),
        "prompt-rows": dict(groups=prompts),
        "id-tensor": dict(groups=torch.from_numpy(ids * 10 + 7)),
        "group-size": dict(group_size=size),
    }[keys]
    names = {
        "uids": lambda e: f"uid-{e['key']}", "uid-array": lambda e: f"uid-{e['key']}",
        "prompt-rows": lambda e: f"prompt-{int(row_keys(prompts[e['first']][None])[0]):012x}",
        "id-tensor": lambda e: str(e["key"] * 10 + 7),
        "group-size": lambda e: f"samples {e['first']}-{e['first'] + size - 1}",
    }[keys]
    with advmon.Monitor("exemplars", sinks=[sink], exemplars=5) as monitor, statistics_path(path):
        monitor.observe(rewards=rewards, advantages=advantages, mask=mask, normalization="group_std", **grouping)
    record = sink.records[-1]
    expected = worst_groups(rewards.numpy(), list(ids), advantages.numpy(), mask.numpy())
    assert_same_worst(record.exemplars, expected, 5, names)
    assert record.exemplars[0]["reason"] == "nonfinite_rewards"
    again = advmon.Record.from_json(record.to_json())
    assert json.loads(record.to_json())["exemplars"][0]["group"] == record.exemplars[0]["group"]
    assert len(again.exemplars) == len(record.exemplars)


def test_zero_turns_them_off_and_the_record_has_no_key(sink):
    rewards, mask = batch(6)
    with advmon.Monitor("off", sinks=[sink], exemplars=0) as monitor:
        monitor.observe(rewards=rewards, advantages=grpo(rewards, mask, 4), group_size=4)
    assert sink.records[-1].exemplars == [] and "exemplars" not in json.loads(sink.records[-1].to_json())
    with pytest.raises(advmon.AdvmonConfigError, match="exemplars must be an int >= 0"):
        advmon.Monitor("bad", sinks=[], exemplars=-2)


def test_a_steps_calls_are_merged_and_cut_to_k(sink):
    rewards, mask = batch(7)
    second = rewards.clone()
    second[0] = -math.inf  # a second call's worst group
    with advmon.Monitor("merged", sinks=[sink], exemplars=3) as monitor, monitor.step(1):
        for r, prefix in ((rewards, "a"), (second, "b")):
            monitor.observe(rewards=r, advantages=grpo(r, mask, 4), groups=[f"{prefix}{i // 4}" for i in range(48)],
                            normalization="group_std")
    got = sink.records[-1].exemplars
    keys = [f"a{i // 4}" for i in range(48)] + [f"b{i // 4}" for i in range(48)]
    both = torch.cat([rewards, second])
    advantages = torch.cat([grpo(rewards, mask, 4), grpo(second, mask, 4)])
    assert_same_worst(got, worst_groups(both.numpy(), keys, advantages.numpy()), 3, lambda e: e["key"])


@pytest.mark.parametrize("path", ["cpu", "torch"])  # during the call; on the host after the transfer
@pytest.mark.parametrize("where", ["reward_segments", "worst_groups"])  # before and after the estimator runs
def test_a_failure_in_the_exemplars_keeps_the_statistics(where, path, sink, monkeypatch):
    import advmon.observation

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(advmon.observation, where, broken)
    rewards, mask = batch(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with advmon.Monitor("broken", sinks=[sink]) as monitor, statistics_path(path):
            monitor.observe(rewards=rewards, advantages=grpo(rewards, mask, 4), group_size=4)
    record = sink.records[-1]
    assert record.exemplars == [] and record.metrics["rewards/nan_count"] == 1.0
    assert record.metrics["advmon/internal_errors"] == 1.0
    assert any("worst groups and slices skipped: RuntimeError: boom" in str(w.message) for w in caught)


def test_exemplars_on_the_device_path_read_nothing_back(sink):
    rewards, mask = batch(9)
    prompts = torch.randint(0, 50, (12, 6)).repeat_interleave(4, 0)
    dense = (grpo(rewards, mask, 4) + 0.1 * torch.randn(mask.shape)).float()
    with advmon.Monitor("device", sinks=[sink]) as monitor, statistics_path("torch"):
        with Dispatched() as seen:
            monitor.observe(rewards=rewards, advantages=dense, mask=mask, groups=prompts)
    assert seen.syncs == [] and sink.records[-1].exemplars


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_exemplars_of_any_batch_match_numpy(data):
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=8))
    count = sum(sizes)
    special = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.0, 1e300])
    reward_values = data.draw(st.lists(st.one_of(st.floats(-10, 10), special), min_size=count, max_size=count))
    advantage_values = data.draw(st.lists(st.one_of(st.floats(-100, 100), special), min_size=count * 3, max_size=count * 3))
    valid = data.draw(st.lists(st.booleans(), min_size=count * 3, max_size=count * 3))
    k = data.draw(st.integers(1, 6))
    path = data.draw(st.sampled_from(["cpu", "torch"]))
    keys = [f"g{g}" for g, n in enumerate(sizes) for _ in range(n)]
    rewards = torch.tensor(reward_values, dtype=torch.float64)
    advantages = torch.tensor(advantage_values, dtype=torch.float64).view(count, 3)
    mask = torch.tensor(valid).view(count, 3)

    sink = ListSink()  # not the fixture: hypothesis runs many examples in one test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an all-invalid mask warns; the exemplars still come
        with advmon.Monitor("any", sinks=[sink], exemplars=k) as monitor, statistics_path(path):
            monitor.observe(rewards=rewards, advantages=advantages, mask=mask, groups=keys, normalization="group_std")
    expected = worst_groups(rewards.numpy(), keys, advantages.numpy(), mask.numpy())
    assert_same_worst(sink.records[-1].exemplars, expected, k, lambda e: e["key"])


@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_a_reward_function_that_returned_none_names_its_groups(path, sink):
    """The summed reward stays finite (TRL's nansum), the function's NaN still ranks its groups first."""
    rng = np.random.default_rng(12)
    correctness = rng.integers(0, 2, 32).astype(float)
    graded = rng.random(32)
    graded[[9, 10, 11, 20]] = math.nan  # returned None for these samples
    rewards = torch.from_numpy(np.nan_to_num(graded) + correctness)
    keys = [f"uid-{i // 4}" for i in range(32)]
    advantages = grpo(rewards, torch.ones(32, 4), 4).float()
    with advmon.Monitor("functions", sinks=[sink], exemplars=3) as monitor, statistics_path(path):
        monitor.observe(rewards=rewards, advantages=advantages, groups=keys, normalization="group_std",
                        reward_functions={"correctness": correctness, "graded": graded},
                        slices=["beta" if i < 16 else "alpha" for i in range(32)])
    record = sink.records[-1]
    expected = worst_groups(rewards.numpy(), keys, advantages.numpy(), functions=[correctness, graded])
    assert_same_worst(record.exemplars, expected, 3, lambda e: e["key"])
    assert [(e["group"], e["reason"], e["slice"]) for e in record.exemplars[:2]] == [
        ("uid-2", "nonfinite_reward_functions", "beta"), ("uid-5", "nonfinite_reward_functions", "alpha")]
    assert record.metrics["slices/beta/rewards/function_nonfinite_count"] == 3.0
    assert record.metrics["rewards/graded/nan_count"] == 4.0 and record.metrics["rewards/nan_count"] == 0.0


@pytest.mark.parametrize("layout", ["dense-prefix", "dense-random-mask", "no-mask"])
def test_exemplars_from_the_sketchs_own_pass_match_numpy(layout, sink, monkeypatch):
    """Large dense tensors on the CPU: the prefix sketch takes the rows' extremes as it copies them."""
    from advmon.stats import parts

    monkeypatch.setattr(parts, "EXACT_LIMIT", 0)  # every tensor sketched, as a large one is
    rewards, mask = batch(21, groups=12, size=4, width=40)
    rng = np.random.default_rng(22)
    if layout == "dense-random-mask":
        mask = torch.from_numpy((rng.random(mask.shape) < 0.5).astype(np.float32))
    advantages = (grpo(rewards, mask, 4).nan_to_num(0.0) + torch.from_numpy(rng.normal(0, 0.3, mask.shape))).float()
    advantages[9, 0] = math.nan  # valid in every layout
    advantages[14, 39] = math.inf  # padding in the prefix layout for most rows
    advantages[30, 2] = 60.0
    if layout == "no-mask":
        mask = None
    keys = [f"uid-{i // 4}" for i in range(48)]
    import advmon.observation

    taken = []
    original = advmon.observation._from_extremes
    monkeypatch.setattr(advmon.observation, "_from_extremes", lambda *a: taken.append(1) or original(*a))
    with advmon.Monitor("sketched", sinks=[sink], exemplars=12) as monitor:
        monitor.observe(rewards=rewards, advantages=advantages, mask=mask, groups=keys, normalization="group_std",
                        slices=["a" if i < 24 else "b" for i in range(48)])
    record = sink.records[-1]
    assert taken == ([] if layout == "dense-random-mask" else [1])  # a random mask takes the general sketch
    reference_mask = None if mask is None else mask.numpy()
    expected = worst_groups(rewards.numpy(), keys, advantages.numpy(), reference_mask)
    assert_same_worst(record.exemplars, expected, 12, lambda e: e["key"])
    from .reference import slice_stats

    for label, values in slice_stats(["a" if i < 24 else "b" for i in range(48)], rewards.numpy(), keys,
                                     advantages.numpy(), reference_mask).items():
        for key, want in values.items():
            assert record.metrics[f"slices/{label}/{key}"] == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True), key

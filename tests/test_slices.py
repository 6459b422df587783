"""Per-slice statistics: every key against a NumPy reference, bounded cardinality, through watch and observe."""

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

from .conftest import ListSink
from .dispatch import Dispatched
from .reference import slice_stats, value_stats
from .sketches import prefix_mask


def assert_slices_close(metrics: dict, expected: dict[str, dict[str, float]]) -> None:
    seen = {key.split("/")[1] for key in metrics if key.startswith("slices/") and key != "slices/folded_labels"}
    assert seen == set(expected), (seen, set(expected))
    for label, values in expected.items():
        for key, want in values.items():
            have = metrics[f"slices/{label}/{key}"]
            assert have == pytest.approx(want, rel=1e-12, abs=1e-15, nan_ok=True), (label, key, have, want)


def batch(seed: int, groups: int = 12, size: int = 4, width: int = 16):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, groups * size) / 2.0  # ties: some zero-std groups
    rewards[size + 1] = math.nan
    rewards[size * 6 + 2] = -math.inf
    lengths = rng.integers(1, width + 1, groups * size)
    sources = np.array(["gsm8k", "math", "code"], dtype=object)[rng.integers(0, 3, groups)].repeat(size)
    return torch.from_numpy(rewards), prefix_mask(lengths, width), sources


def grpo(rewards: torch.Tensor, size: int) -> torch.Tensor:
    grouped = rewards.view(-1, size)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)


@pytest.mark.parametrize("path", ["cpu", "torch", "triton"])
@pytest.mark.parametrize("layout", ["expand-view", "dense-prefix", "dense-random-mask", "per-sequence"])
def test_slices_match_numpy(path, layout, sink):
    rewards, mask, sources = batch(1)
    rng = np.random.default_rng(2)
    per_sequence = grpo(rewards, 4)
    if layout == "expand-view":
        advantages = per_sequence.float().expand(mask.shape)
    elif layout == "per-sequence":
        advantages = per_sequence[:, 0].float()
    else:
        if layout == "dense-random-mask":
            mask = torch.from_numpy((rng.random(mask.shape) < 0.5).astype(np.float32))
        advantages = (torch.nan_to_num(per_sequence, nan=0.0) + torch.from_numpy(rng.normal(0, 0.3, mask.shape))).float()
        advantages[9, 0] = math.nan
        advantages[13, 15] = math.inf
    keys = [i // 4 for i in range(48)]
    with advmon.Monitor("slices", sinks=[sink]) as monitor, statistics_path(path):
        monitor.observe(rewards=rewards, advantages=advantages, mask=mask, group_size=4, slices=sources)
    metrics = sink.records[-1].metrics
    assert_slices_close(metrics, slice_stats(list(sources), rewards.numpy(), keys, advantages.numpy(), mask.numpy()))
    assert metrics["slices/folded_labels"] == 0.0
    for entry in sink.records[-1].exemplars:
        first = int(entry["group"].split()[1].split("-")[0])
        assert entry["slice"] == sources[first]


def test_watch_reads_the_labels_from_the_named_parameter(sink):
    rewards, mask, sources = batch(3)
    monitor = advmon.Monitor("watched", sinks=[sink])

    @monitor.watch(groups=None, group_size=4, slices="data_source")
    def compute_advantage(rewards, mask, data_source):
        return grpo(rewards, 4).expand(mask.shape)

    advantages = compute_advantage(rewards, mask, data_source=list(sources))
    monitor.close()
    keys = [i // 4 for i in range(48)]
    assert_slices_close(sink.records[-1].metrics,
                        slice_stats(list(sources), rewards.numpy(), keys, advantages.numpy(), mask.numpy()))


def test_labels_beyond_max_slices_fold_into_other_for_the_whole_run(sink):
    with advmon.Monitor("folded", sinks=[sink], max_slices=2) as monitor:
        for step, labels in enumerate([["a", "b", "a", "b"], ["c", "a", "d", "c"], ["b", "e", "e", "a"]]):
            rewards = torch.arange(4.0) + step
            with monitor.step(step):
                monitor.observe(rewards=rewards, advantages=rewards - rewards.mean(), slices=labels)
            folded = ["other" if label not in ("a", "b") else label for label in labels]
            metrics = sink.records[-1].metrics
            assert_slices_close(metrics, slice_stats(folded, rewards.numpy(), None, (rewards - rewards.mean()).numpy()))
        assert [r.metrics["slices/folded_labels"] for r in sink.records] == [0.0, 2.0, 3.0]


def test_a_steps_calls_are_merged(sink):
    rewards, mask, sources = batch(4)
    halves = (slice(0, 24), slice(24, 48))
    advantages = grpo(rewards, 4).expand(mask.shape)
    with advmon.Monitor("merged", sinks=[sink]) as monitor, monitor.step(0):
        for half in halves:
            monitor.observe(rewards=rewards[half], advantages=advantages[half], mask=mask[half], group_size=4,
                            slices=sources[half])
    keys = [i // 4 for i in range(48)]
    assert_slices_close(sink.records[-1].metrics,
                        slice_stats(list(sources), rewards.numpy(), keys, advantages.numpy(), mask.numpy()))


def test_labels_that_do_not_fit_are_reported_and_the_rest_is_recorded(sink):
    rewards, mask, sources = batch(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with advmon.Monitor("bad-labels", sinks=[sink]) as monitor:
            monitor.observe(rewards=rewards, advantages=grpo(rewards, 4), group_size=4, slices=list(sources)[:-1])
    metrics = sink.records[-1].metrics
    assert not any(key.startswith("slices/") for key in metrics) and metrics["rewards/count"] == 48
    assert any("47 slice labels for 48 samples" in str(w.message) for w in caught)


def test_slices_on_the_device_path_read_nothing_back(sink):
    rewards, mask, sources = batch(6)
    dense = (grpo(rewards, 4) + 0.1 * torch.randn(mask.shape)).float()
    prompts = torch.randint(0, 50, (12, 6)).repeat_interleave(4, 0)
    with advmon.Monitor("device", sinks=[sink]) as monitor, statistics_path("torch"):
        with Dispatched() as seen:
            monitor.observe(rewards=rewards, advantages=dense, mask=mask, groups=prompts, slices=sources)
    assert seen.syncs == [] and "slices/gsm8k/rewards/mean" in sink.records[-1].metrics


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_slices_of_any_batch_match_numpy(data):
    sizes = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=8))
    count = sum(sizes)
    special = st.sampled_from([math.nan, math.inf, -math.inf, 0.0, 1.0])
    rewards = torch.tensor(data.draw(st.lists(st.one_of(st.floats(-10, 10), special), min_size=count, max_size=count)),
                           dtype=torch.float64)
    advantages = torch.tensor(data.draw(st.lists(st.one_of(st.floats(-100, 100), special), min_size=count * 3,
                                                 max_size=count * 3)), dtype=torch.float64).view(count, 3)
    mask = torch.tensor(data.draw(st.lists(st.booleans(), min_size=count * 3, max_size=count * 3))).view(count, 3)
    group_labels = data.draw(st.lists(st.sampled_from(["x", "y", "z/w"]), min_size=len(sizes), max_size=len(sizes)))
    labels = [label for label, n in zip(group_labels, sizes) for _ in range(n)]
    keys = [g for g, n in enumerate(sizes) for _ in range(n)]
    path = data.draw(st.sampled_from(["cpu", "torch"]))

    sink = ListSink()  # not the fixture: hypothesis runs many examples in one test
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an all-invalid mask warns
        with advmon.Monitor("any", sinks=[sink]) as monitor, statistics_path(path):
            monitor.observe(rewards=rewards, advantages=advantages, mask=mask, groups=keys, slices=labels)
    named = [label.replace("/", "_") for label in labels]
    assert_slices_close(sink.records[-1].metrics,
                        slice_stats(named, rewards.numpy(), keys, advantages.numpy(), mask.numpy()))


def test_nemo_rl_estimators_slice_by_the_batchs_task_name(sink):
    """NeMo-RL passes ``repeated_batch`` (its collate function fills ``task_name`` per sample) to every estimator."""
    import types

    import advmon.integrations.nemo_rl as advmon_nemo

    from .estimators import GRPOLikeEstimator

    class GRPOAdvantageEstimator(GRPOLikeEstimator):
        pass

    module = types.SimpleNamespace(GRPOAdvantageEstimator=GRPOAdvantageEstimator)
    monitor = advmon.Monitor("nemo", sinks=[sink])
    advmon_nemo.instrument(monitor, module=module)
    rewards, mask, sources = batch(8)
    prompts = torch.arange(12).repeat_interleave(4)
    tasks = [f"task_{s}" for s in sources]
    estimator = GRPOAdvantageEstimator()
    advantages = estimator.compute_advantage(prompts, rewards, mask, repeated_batch={"task_name": tasks})
    estimator.compute_advantage(prompts, rewards, mask, repeated_batch={"message_log": []})  # no task_name: no slices
    monitor.close()
    first, second = sink.records[-2:]
    keys = prompts.tolist()
    assert_slices_close(first.metrics, slice_stats(tasks, rewards.numpy(), keys, advantages.numpy(), mask.numpy()))
    assert not any(key.startswith("slices/") for key in second.metrics)


# --------------------------------------------------------------------------- per reward function


def test_each_reward_function_gets_the_rewards_statistics(sink):
    rng = np.random.default_rng(9)
    correctness = rng.integers(0, 2, 24).astype(float)
    correctness[[3, 7, 8]] = math.nan  # the function returned None
    formatting = rng.random(24)
    formatting[5] = math.inf
    with advmon.Monitor("functions", sinks=[sink]) as monitor:
        monitor.observe(rewards=torch.from_numpy(np.nan_to_num(correctness) + formatting),
                        reward_functions={"correctness": torch.from_numpy(correctness), "format/v2": list(formatting)},
                        group_size=4)
    metrics = sink.records[-1].metrics
    for name, values in (("correctness", correctness), ("format_v2", formatting)):
        expected = value_stats(values)
        for key in ("mean", "std", "min", "max", "count", "nan_count", "inf_count"):
            assert metrics[f"rewards/{name}/{key}"] == pytest.approx(expected[key], rel=1e-12, nan_ok=True), (name, key)
    assert not any(key.startswith("advantages/rewards") for key in metrics)


def test_nemo_rl_gdpo_reward_components_are_its_reward_keys(sink):
    import types

    import advmon.integrations.nemo_rl as advmon_nemo

    from .estimators import GDPOLikeEstimator

    class GDPOAdvantageEstimator(GDPOLikeEstimator):
        pass

    monitor = advmon.Monitor("gdpo", sinks=[sink])
    advmon_nemo.instrument(monitor, module=types.SimpleNamespace(GDPOAdvantageEstimator=GDPOAdvantageEstimator))
    rng = np.random.default_rng(10)
    correctness = torch.from_numpy(rng.integers(0, 2, 16).astype(np.float32))
    correctness[2] = math.nan
    style = torch.from_numpy(rng.random(16).astype(np.float32))
    prompts = torch.arange(4).repeat_interleave(4)
    batch_dict = {"reward/correctness": correctness, "reward/style": style, "task_name": ["math"] * 16}
    GDPOAdvantageEstimator().compute_advantage(prompts, None, torch.ones(16, 3), batch_dict)
    monitor.close()
    metrics = sink.records[-1].metrics
    assert metrics["rewards/correctness/nan_count"] == 1.0
    assert metrics["rewards/correctness/mean"] == pytest.approx(value_stats(correctness.numpy())["mean"], rel=1e-12)
    assert metrics["rewards/style/max"] == pytest.approx(float(style.max()), rel=1e-12)
    assert metrics["slices/math/rewards/count"] == 16


def test_advmon_instrument_entries_take_slices_and_reward_functions():
    """Workers configured by environment (Ray, NeMo-RL's controller) name them as ``watch`` does."""
    from advmon.config.environment import parse_targets

    (target,) = parse_targets("my_rl.estimators:GDPO(slices=repeated_batch.task_name,reward_functions=repeated_batch:reward/)")
    assert target.names.slices == "repeated_batch.task_name" and target.names.reward_functions == "repeated_batch:reward/"
    assert parse_targets(target.spec) == [target]
    with pytest.raises(advmon.AdvmonConfigError, match="slices=, reward_functions= or normalization="):
        parse_targets("my_rl.estimators:GDPO(labels=x)")


@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_slices_of_finite_rewards_match_numpy(path, sink):
    """The CPU's shortcut for a batch without NaN or Inf rewards gives the same table as the general sums."""
    rewards, mask, sources = batch(6)
    rewards = torch.nan_to_num(rewards, nan=0.5, neginf=-1.0)
    advantages = grpo(rewards, 4).float().expand(mask.shape)
    with advmon.Monitor("finite", sinks=[sink]) as monitor, statistics_path(path):
        for step in range(2):  # the second step's labels are all known: looked up without naming them again
            with monitor.step(step):
                monitor.observe(rewards=rewards, advantages=advantages, mask=mask, group_size=4, slices=list(sources))
            keys = [i // 4 for i in range(48)]
            assert_slices_close(sink.records[-1].metrics,
                                slice_stats(list(sources), rewards.numpy(), keys, advantages.numpy(), mask.numpy()))


@pytest.mark.parametrize("max_slices", [2, 300])
def test_slice_ids_of_known_and_new_labels(max_slices):
    """Known text labels are looked up at once (slots as bytes, when they fit in one); others are named one by one."""
    from advmon.stats import SliceIndex

    index = SliceIndex(max_slices=max_slices)
    assert index.ids(["a"]).tolist() == [0]
    assert index.ids(["a"]).tolist() == [0]  # one known label
    assert index.ids(np.array(["b", "a", "b"])).tolist() == [1, 0, 1]
    assert index.ids(["a", "b", "a"]).tolist() == [0, 1, 0]  # all known
    third = min(max_slices, 2)  # folded into "other" when there is no room
    assert index.ids(["c", 3, "a", b"c"]).tolist() == [third, 3 if max_slices > 3 else third, 0, third]
    assert index.ids([]).tolist() == []
    # 1.0, True and 1 are equal keys with different names ("1.0", "True", "1"): only text is remembered, so
    # each takes a slot of its own (slots 4, 5, 6 after a, b, c and 3) instead of the first one's.
    separately = [index.ids([label]).tolist() for label in (1.0, True, 1)]
    assert separately == [[min(slot, max_slices)] for slot in (4, 5, 6)]
    assert index.names[4:7] == (["1.0", "True", "1"] if max_slices > 6 else [])


@pytest.mark.parametrize("path", ["cpu", "torch"])
def test_slices_see_the_rewards_as_they_were_before_the_estimator_changed_them(path, sink):
    """An estimator that centres its float64 rewards in place: the record's per-slice rewards are the inputs'."""
    rewards, mask, sources = batch(3)
    given = rewards.clone()

    def centring(rewards, mask, sources):
        rewards -= torch.nanmean(rewards)  # in place, on the caller's float64 tensor
        return rewards.unsqueeze(1).expand(mask.shape)

    with advmon.Monitor("in-place", sinks=[sink]) as monitor, statistics_path(path):
        monitor.watch(centring, slices="sources", group_size=4)(rewards, mask, sources)
    assert not torch.equal(rewards.nan_to_num(), given.nan_to_num())  # the estimator did change them
    metrics = sink.records[-1].metrics
    for label, values in slice_stats(list(sources), given.numpy()).items():
        assert metrics[f"slices/{label}/rewards/mean"] == pytest.approx(values["rewards/mean"], rel=1e-12, nan_ok=True)

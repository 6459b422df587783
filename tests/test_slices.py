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
from advmon.devices import statistics_path

from .dispatch import Dispatched
from .reference import slice_stats
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

    class Kept(advmon.Sink):
        name, synchronous = "kept", True

        def __init__(self):
            self.records = []

        def write(self, record):
            self.records.append(record)

    sink = Kept()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an all-invalid mask warns
        with advmon.Monitor("any", sinks=[sink]) as monitor, statistics_path(path):
            monitor.observe(rewards=rewards, advantages=advantages, mask=mask, groups=keys, slices=labels)
    named = [label.replace("/", "_") for label in labels]
    assert_slices_close(sink.records[-1].metrics,
                        slice_stats(named, rewards.numpy(), keys, advantages.numpy(), mask.numpy()))

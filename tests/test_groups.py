"""Group ids and group counts against Python loops, on random and adversarial groupings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from advmon.stats import statistics_path
from advmon.stats import (
    GROUP_COUNT_FIELDS,
    GroupsError,
    derived_pre_norm,
    group_counts,
    group_ids,
    group_ids_and_row_keys,
    group_statistics,
    row_keys,
)

from .reference import derived_pre_norm as reference_pre_norm
from .reference import group_stats

rewards_values = st.sampled_from([0.0, 1.0, 0.3, -2.5, math.nan, math.inf, 1e30])


#: The CPU's own grouping, and a device's (a tensor reduced to [B] there, numbered on the host; here on CPU
#: tensors). Group values and counts are the host's NumPy on both.
PATHS = [None, "torch"]


@pytest.mark.parametrize("path", PATHS, ids=["cpu", "device"])
@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    data=st.data(),
    as_rows=st.booleans(),
)
def test_group_counts_match_python(path, keys, data, as_rows):
    rewards = np.array(data.draw(st.lists(rewards_values, min_size=len(keys), max_size=len(keys))))
    groups = torch.tensor([[k, k * 7] for k in keys]) if as_rows else torch.tensor(keys)
    with statistics_path(path):
        ids = group_ids(groups, len(keys))
        assert sorted(set(ids.tolist())) == list(range(len(set(keys))))  # dense
        counts = group_counts(torch.from_numpy(rewards), ids, (0.0, 1.0))
        pre_norm = derived_pre_norm(torch.from_numpy(rewards), ids)
        both = group_statistics(torch.from_numpy(rewards), ids, (0.0, 1.0))
    assert torch.equal(both[0], counts) and torch.equal(both[1].isnan(), pre_norm.isnan())
    assert torch.equal(both[1].nan_to_num(), pre_norm.nan_to_num())
    counts = dict(zip(GROUP_COUNT_FIELDS, counts.tolist()))
    expected = group_stats(rewards, keys, (0.0, 1.0))
    assert counts["groups"] == expected["groups/count"]
    assert counts["singletons"] == expected["groups/singleton_count"]
    assert counts["zero_std"] == expected["groups/zero_std_count"]
    assert counts["nonfinite"] == expected["groups/nonfinite_count"]
    assert counts["max_size"] == expected["groups/max_size"]
    if counts["with_two_finite"]:
        assert counts["zero_std"] / counts["with_two_finite"] == pytest.approx(expected["groups/zero_std_fraction"])
        assert counts["all_low"] / counts["with_two_finite"] == pytest.approx(expected["groups/all_low_fraction"])
        assert counts["all_high"] / counts["with_two_finite"] == pytest.approx(expected["groups/all_high_fraction"])
    # Within the rounding of a sum of the group's rewards (NumPy's own mean of [1e30] * 3 is off by 1.4e14).
    magnitude = np.where(np.isfinite(rewards), np.abs(rewards), 0.0)
    scale = np.array([magnitude[np.array(keys) == k].max() for k in keys])
    expected = reference_pre_norm(rewards, keys)
    got = pre_norm.numpy()
    assert np.array_equal(np.isnan(got), np.isnan(expected)) and np.array_equal(np.isinf(got), np.isinf(expected))
    assert np.array_equal(got[np.isinf(got)], expected[np.isinf(expected)])
    finite = np.isfinite(expected)
    assert np.all(np.abs(got[finite] - expected[finite]) <= 1e-14 * scale[finite] + 1e-15)


def test_ids_are_dense_and_shared_by_equal_keys():
    uids = np.array(["b", "a", "b", "c", "a"], dtype=object)
    ids = group_ids(uids, 5).tolist()
    assert ids[0] == ids[2] and ids[1] == ids[4] and len(set(ids)) == 3 and max(ids) == 2
    assert group_ids(None, 5, group_size=2).tolist() == [0, 0, 1, 1, 2]
    assert group_ids(np.array([3.0, 1.0, 3.0]), 3).tolist() == [1, 0, 1]
    assert group_ids(None, 4) is None


@pytest.mark.parametrize(
    ("groups", "kwargs", "message"),
    [
        (torch.arange(3), {}, "shape"),
        (torch.zeros(4, 2, 2), {}, "shape"),
        (["a", "b"], {}, "expected 4"),
        ([["unhashable"]] * 4, {}, "hashable"),
        (None, {"group_size": 0}, "positive"),
        (3.5, {}, "sequence"),
    ],
)
def test_bad_groups_are_reported(groups, kwargs, message):
    with pytest.raises(GroupsError, match=message):
        group_ids(groups, 4, **kwargs)


def test_counts_without_rewards_or_groups():
    ids = group_ids(None, 6, group_size=4)
    counts = group_counts(None, ids, None).tolist()
    assert counts[:2] == [2.0, 0.0] and all(math.isnan(c) for c in counts[2:-1])
    assert counts[-1] == 4.0  # max_size needs no rewards
    assert group_counts(torch.ones(3), None, None).tolist() == [0.0] * len(GROUP_COUNT_FIELDS)


@pytest.mark.parametrize("path", PATHS, ids=["cpu", "device"])
def test_group_means_stay_exact_in_a_large_batch(path):
    """The device path's means are differences of one running sum: its rounding must stay out of them."""
    rng = np.random.default_rng(11)
    keys = rng.permutation(np.repeat(np.arange(8192), 8))  # 65536 samples, groups scattered
    rewards = rng.standard_normal(keys.size) * 3 + 100.0
    rewards[keys < 50] = 0.1  # zero-std groups
    with statistics_path(path):
        pre_norm = derived_pre_norm(torch.from_numpy(rewards), group_ids(torch.from_numpy(keys), keys.size)).numpy()
    expected = reference_pre_norm(rewards, keys.tolist())
    np.testing.assert_allclose(pre_norm, expected, rtol=0, atol=1e-12)
    assert np.abs(pre_norm[keys < 50]).max() <= 1e-15


@pytest.mark.parametrize("path", PATHS, ids=["cpu", "device"])
def test_prompt_rows_group_wherever_they_are(path):
    rng = np.random.default_rng(12)
    prompts = rng.integers(0, 50, (40, 6))
    rows = torch.from_numpy(prompts[rng.integers(0, 40, 300)])  # repeats, not contiguous
    with statistics_path(path):
        ids = group_ids(rows, 300).numpy()
        floats = group_ids(rows.to(torch.float32) * -1.0 + 0.0, 300).numpy()
    keys = [tuple(r) for r in rows.tolist()]
    for i in range(300):
        same = np.array([keys[j] == keys[i] for j in range(300)])
        assert np.array_equal(ids == ids[i], same)
        assert np.array_equal(floats == floats[i], same)


def test_signed_zeros_are_one_group_on_the_device_path():
    rows = torch.tensor([[0.0, 1.0], [-0.0, 1.0], [0.0, 2.0]])
    with statistics_path("torch"):
        ids = group_ids(rows, 3).tolist()
    assert ids[0] == ids[1] != ids[2]


def test_contiguous_prompt_rows_are_numbered_in_order_of_appearance():
    """The CPU's runs of identical rows are the groups when every run differs: ids rise along the batch."""
    rng = np.random.default_rng(3)
    prompts = torch.from_numpy(rng.integers(0, 50, (30, 5))).repeat_interleave(4, dim=0)
    ids = group_ids(prompts, 120)
    assert ids.tolist() == [i // 4 for i in range(120)]
    split = torch.cat([prompts[:8], prompts[40:44], prompts[:4]])  # the first prompt again, apart: one group
    ids = group_ids(split, 16).tolist()
    assert ids[:4] == ids[12:] == [ids[0]] * 4 and len(set(ids)) == 3


@pytest.mark.parametrize("rows", [
    torch.randint(-2**62, 2**62, (50, 7), generator=torch.Generator().manual_seed(0)),
    torch.randint(0, 32000, (5, 64), generator=torch.Generator().manual_seed(1)).int(),
    torch.randn(6, 9, generator=torch.Generator().manual_seed(2)),
    torch.tensor([[0.0, -0.0, 1e300], [math.nan, math.inf, -1.0]], dtype=torch.float64),
    torch.randint(0, 255, (4, 3), generator=torch.Generator().manual_seed(3)).to(torch.uint8),
    torch.randn(3, 4, generator=torch.Generator().manual_seed(4)).half(),
    torch.tensor([[True, False], [False, False]]),
], ids=["int64", "int32", "float32", "float64-special", "uint8", "float16", "bool"])
def test_row_keys_are_the_same_on_the_cpu_and_device_paths(rows):
    """The CPU names a group with NumPy's int64 arithmetic, other devices with torch's: one key either way."""
    host = row_keys(rows)
    with statistics_path("torch"):
        device = row_keys(rows)
    assert torch.equal(host, device)
    assert bool((host >= 0).all() and (host < 2**48).all())


@pytest.mark.parametrize("path", ["cpu", "torch"])
@pytest.mark.parametrize("arrangement", ["runs", "scattered"])
def test_the_groupings_row_keys_are_row_keys(path, arrangement):
    """Keys read from the hashes the grouping took equal row_keys of the rows, on both grouping paths."""
    prompts = torch.randint(0, 32000, (9, 16), generator=torch.Generator().manual_seed(6))
    rows = prompts.repeat_interleave(4, dim=0)
    if arrangement == "scattered":  # identical rows apart: the CPU groups with torch.unique
        rows = rows[torch.randperm(rows.shape[0], generator=torch.Generator().manual_seed(7))]
        rows[5] = rows[30]
    with statistics_path(path):
        ids, keys, rising = group_ids_and_row_keys(rows, rows.shape[0])
        assert torch.equal(ids, group_ids(rows, rows.shape[0]))
    assert rising == (arrangement == "runs")  # runs of rows that all differ are numbered as they appear, on both
    if rising:
        assert bool((ids[1:] >= ids[:-1]).all())
    samples = torch.arange(rows.shape[0]).flip(0)
    assert torch.equal(keys.of(samples), row_keys(rows[samples]))


def test_only_numberings_that_cannot_fall_are_said_to_rise():
    blocks = group_ids_and_row_keys(None, 10, group_size=3)
    assert blocks.rising and blocks.ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    uids = group_ids_and_row_keys(["b", "a", "b"], 3)  # numbered by appearance, but may fall
    assert not uids.rising and uids.ids.tolist() == [0, 1, 0]


@pytest.mark.parametrize("path", PATHS, ids=["cpu", "device"])
@pytest.mark.parametrize("rising", [True, False], ids=["blocks", "scattered"])
def test_a_group_of_equal_rewards_has_a_pre_norm_of_exactly_zero(path, rising):
    """Its mean is its value exactly (sums of reward - group minimum), whatever 3 * 0.1 rounds to."""
    values = [0.1, 0.1, 0.1, 0.7, 0.7, 0.7, 1e-3, 2.5]
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2] if rising else [0, 1, 0, 1, 0, 1, 2, 2])
    rewards = torch.tensor(values if rising else [0.1, 0.7, 0.1, 0.7, 0.1, 0.7, 1e-3, 2.5], dtype=torch.float64)
    with statistics_path(path):
        pre_norm = derived_pre_norm(rewards, ids)
    assert pre_norm[:6].tolist() == [0.0] * 6  # exactly: a zero-std group carries no signal
    assert pre_norm[6:].tolist() == pytest.approx([1e-3 - (1e-3 + 2.5) / 2, 2.5 - (1e-3 + 2.5) / 2], rel=1e-15)

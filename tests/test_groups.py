"""Group ids and group counts against Python loops, on random and adversarial groupings."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from advmon.groups import GROUP_COUNT_FIELDS, GroupsError, derived_pre_norm, group_counts, group_ids

from .reference import derived_pre_norm as reference_pre_norm
from .reference import group_stats

rewards_values = st.sampled_from([0.0, 1.0, 0.3, -2.5, math.nan, math.inf, 1e30])


@settings(max_examples=200, deadline=None)
@given(
    keys=st.lists(st.integers(0, 5), min_size=1, max_size=40),
    data=st.data(),
    as_rows=st.booleans(),
)
def test_group_counts_match_python(keys, data, as_rows):
    rewards = np.array(data.draw(st.lists(rewards_values, min_size=len(keys), max_size=len(keys))))
    groups = torch.tensor([[k, k * 7] for k in keys]) if as_rows else torch.tensor(keys)
    ids = group_ids(groups, len(keys))
    counts = dict(zip(GROUP_COUNT_FIELDS, group_counts(torch.from_numpy(rewards), ids, (0.0, 1.0)).tolist()))
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
    np.testing.assert_allclose(
        derived_pre_norm(torch.from_numpy(rewards), ids).numpy(), reference_pre_norm(rewards, keys), rtol=1e-12, atol=1e-15
    )


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

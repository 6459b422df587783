"""Percentiles right at any range (issue 36): within 0.8% of the rank-exact value, relatively, on every path.

Each recorded percentile of a sketched tensor must lie between the two order statistics NumPy interpolates
for it, each widened by 0.8% of its own magnitude (:func:`tests.reference.percentile_bounds`), for the
distributions a run that goes bad produces: one exploding advantage, heavy tails, values over many decades,
mixtures of scales, far modes, tiny values, near-constant values and GRPO's discrete group-normalized values,
under any mask. Below 65,536 entries they stay exact. The CPU's general and prefix-mask sketches, the
pure-torch device path and the Triton kernels (in their interpreter here) write the same buckets; parts of
one step merge into the sketch of the concatenated batch. The range-based sketch this replaced fails them.
A discrete set of values (GRPO's group-normalized advantages, binary or clipped rewards) gives those values,
bit for bit, on every path: a sketch keeps each bucket's value of largest magnitude where few buckets hold values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from advmon import stats
from advmon.observation import tensor_part
from advmon.stats import cpu_sketch, statistics_path, summarize, summarize_with_histogram
from advmon.stats.prefix_sketch import prefix_lengths, prefix_part
from advmon.stats.sketch_format import HIST_LEN, REPRESENTATIVES, TABLE_LEN, HostPart, Part

from .reference import PERCENTILES, assert_stats_close, percentile_bounds, value_stats
from .sketches import assert_same_sketch, general_part, kept_representatives, prefix_mask

#: Just above the exact limit: every tensor here is sketched (a [257, 257] tensor).
SIDE = 257
#: Where the device paths run: a GPU where there is one (``make bench-gpu``), else the CPU (Triton interpreted).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _on_device(path):
    """``path`` run on DEVICE's copies of its inputs, its part brought back to the CPU."""

    def run(values, mask):
        part = path(values.to(DEVICE), None if mask is None else mask.to(DEVICE))
        return Part(part.kind, tuple(t.cpu() for t in part.tensors))

    return run


def _family(name: str, rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` values of one of the distributions the bound must hold for."""
    if name == "outlier-1e4":
        values = rng.standard_normal(size)
        values[rng.integers(size)] = 1e4
    elif name == "outlier-1e6":
        values = rng.standard_normal(size)
        values[rng.integers(size)] = -1e6
    elif name == "student-t2":
        values = rng.standard_t(2, size)
    elif name == "lognormal-8-decades":
        values = rng.lognormal(0.0, 4.5, size)  # +-2 sigma already spans 8 decades
    elif name == "mixture-of-scales":
        values = np.where(rng.random(size) < 0.99, 0.01 * rng.standard_normal(size), 100 * rng.standard_normal(size))
    elif name == "two-far-modes":
        values = np.where(rng.random(size) < 0.5, rng.normal(-1e3, 1.0, size), rng.normal(1e5, 10.0, size))
    elif name == "around-1e-6":
        values = rng.normal(1e-6, 1e-7, size)
    elif name == "near-constant":
        values = 3.0 + 1e-6 * rng.standard_normal(size)
    elif name == "grpo-discrete":
        rewards = rng.integers(0, 2, (size // 8 + 1, 8)).astype(np.float64)
        centered = rewards - rewards.mean(1, keepdims=True)
        values = (centered / (rewards.std(1, keepdims=True, ddof=1) + 1e-6)).reshape(-1)[:size]
    else:
        raise ValueError(name)
    return values


FAMILIES = ["outlier-1e4", "outlier-1e6", "student-t2", "lognormal-8-decades", "mixture-of-scales", "two-far-modes",
            "around-1e-6", "near-constant", "grpo-discrete"]


def _masks(kind: str, rng: np.random.Generator, shape: tuple[int, int]) -> torch.Tensor | None:
    if kind == "none":
        return None
    if kind == "prefix":
        return prefix_mask(rng.integers(0, shape[1] + 1, shape[0]), shape[1])
    return torch.from_numpy((rng.random(shape) < 0.7).astype(np.float32))


def _paths():
    yield "cpu", lambda values, mask: tensor_part(values, mask)
    yield "cpu-general", lambda values, mask: cpu_sketch._sketch_two_passes(values, mask)

    def torch_path(values, mask):
        with statistics_path("torch"):
            return tensor_part(values, mask)

    yield "torch", _on_device(torch_path)

    def triton_path(values, mask):
        from advmon.stats.triton_sketch import triton_part

        return triton_part(values, mask)

    yield "triton", _on_device(triton_path)


PATHS = dict(_paths())


def _check(values: torch.Tensor, mask: torch.Tensor | None, path: str = "cpu") -> Part:
    part = PATHS[path](values, mask)
    assert part.kind == "sketch"
    expected = value_stats(values.to(torch.float64).numpy(), None if mask is None else mask.to(torch.float64).numpy())
    assert_stats_close(summarize([part]), expected, exact_percentiles=False)
    return part


@settings(max_examples=40, deadline=None)
@given(family=st.sampled_from(FAMILIES), seed=st.integers(0, 2**31), mask=st.sampled_from(["none", "prefix", "random"]),
       dtype=st.sampled_from([torch.float32, torch.float64]), path=st.sampled_from(list(PATHS)))
def test_every_family_within_the_bound_on_every_path(family, seed, mask, dtype, path):
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(_family(family, rng, SIDE * SIDE).reshape(SIDE, SIDE)).to(dtype)
    chosen = _masks(mask, rng, (SIDE, SIDE))
    part = _check(values, chosen, path)
    if path != "cpu-general":  # every path writes the general sketch's buckets
        assert_same_sketch(part, general_part(values, torch.ones(SIDE, SIDE) if chosen is None else chosen))


@pytest.mark.parametrize("family", FAMILIES)
def test_below_the_exact_limit_percentiles_stay_exact(family):
    values = torch.from_numpy(_family(family, np.random.default_rng(3), 200 * 300).reshape(200, 300))
    assert values.numel() <= stats.EXACT_LIMIT
    got = summarize([tensor_part(values, None)])
    assert_stats_close(got, value_stats(values.numpy()))  # exact percentiles: to 1e-12 of the data's magnitude


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_stride_expand_views_over_many_rows(family):
    """An expand view of more rows than the exact limit is sketched with weights (its rows' valid tokens)."""
    rng = np.random.default_rng(4)
    per_row = torch.from_numpy(_family(family, rng, stats.EXACT_LIMIT + 3000))
    mask = prefix_mask(rng.integers(0, 5, per_row.numel()), 4)
    view = per_row.unsqueeze(-1).expand(-1, 4)
    expected = value_stats(view.numpy(), mask.numpy())
    for path in ("cpu", "torch"):
        with statistics_path(path):
            on = DEVICE if path == "torch" else "cpu"
            got = summarize([tensor_part(view.to(on), mask.to(on))])
        assert_stats_close(got, expected, exact_percentiles=False)


def _merged(parts: list[Part]) -> dict[str, float]:
    return summarize([HostPart(p.kind, tuple(t.numpy() for t in p.tensors)) for p in parts])


@pytest.mark.parametrize("family", FAMILIES)
def test_chunks_and_ranks_merge_into_the_sketch_of_the_whole(family):
    """Several calls of one step (or ranks' shards) with different tops merge bucket for bucket."""
    rng = np.random.default_rng(5)
    values = torch.from_numpy(_family(family, rng, 4 * SIDE * SIDE).reshape(4 * SIDE, SIDE))
    values[:SIDE] *= 1e-3  # the first chunk's window sits ten octaves lower
    mask = _masks("prefix", rng, tuple(values.shape))
    whole = summarize([cpu_sketch._sketch_two_passes(values, mask)])
    chunks = [PATHS[path](values[i * SIDE : (i + 1) * SIDE], mask[i * SIDE : (i + 1) * SIDE])
              for i, path in enumerate(["cpu", "torch", "triton", "cpu-general"])]
    merged = _merged(chunks)
    for key in ("count", "nan_count", "inf_count", "min", "max", *PERCENTILES):
        assert merged[key] == whole[key] or (math.isnan(merged[key]) and math.isnan(whole[key])), key
    assert_stats_close(merged, value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)


def _range_based_percentiles(values: np.ndarray) -> dict[str, float]:
    """The sketch before issue 36: bins ``(max - min) / 512`` wide (a power of two), read by rank inside a bin."""
    low, high = values.min(), values.max()
    width = 2.0 ** math.floor(math.log2((high - low) / 512))
    first = math.floor(low / width)
    counts = np.bincount((np.floor(values / width) - first).astype(np.int64))
    cumulative = np.cumsum(counts)
    result = {}
    for name, q in PERCENTILES.items():
        rank = (values.size - 1) * q
        b = int(np.searchsorted(cumulative, math.floor(rank), side="right"))
        before = cumulative[b - 1] if b else 0
        result[name] = (first + b + (math.floor(rank) - before + 0.5) / counts[b]) * width
    return result


@pytest.mark.parametrize("family", ["outlier-1e4", "outlier-1e6", "student-t2", "lognormal-8-decades",
                                    "grpo-discrete"])
def test_the_range_based_sketch_fails_the_bound_and_the_relative_one_holds(family):
    values = _family(family, np.random.default_rng(6), SIDE * SIDE)
    expected = value_stats(values)
    old = _range_based_percentiles(values)
    outside = [name for name in PERCENTILES
               if not percentile_bounds(expected, name)[0] <= old[name] <= percentile_bounds(expected, name)[1]]
    assert outside, old  # the old sketch is caught on every one of these families
    _check(torch.from_numpy(values).reshape(SIDE, SIDE), None)


# --------------------------------------------------------------------------- where the bound is tight


def test_values_on_bucket_edges_and_just_below_them():
    """1.0 and 1.0078125 start buckets; a float64 value a hair below one rounds up to it in float32."""
    edges = np.array([1.0, 1.0078125, 2.0, 0.5, -1.0, -1.0078125])
    below = np.nextafter(edges, 0.0)
    values = np.repeat(np.concatenate([edges, below]), 6000)
    np.random.default_rng(7).shuffle(values)
    for dtype in (torch.float64, torch.float32):
        tensor = torch.from_numpy(values).reshape(-1, 1000).to(dtype)
        for path in PATHS:
            _check(tensor, None, path)


def test_zero_is_exactly_zero_next_to_tiny_values():
    rng = np.random.default_rng(8)
    values = np.zeros((SIDE, SIDE))
    values.reshape(-1)[rng.integers(0, values.size, 20_000)] = rng.choice([1e-30, -1e-30, 3e-31], 20_000)
    for path in PATHS:
        part = _check(torch.from_numpy(values), None, path)
        got = summarize([part])
        assert got["p50"] == 0.0 and got["p10"] == 0.0  # most values are exactly zero
    values.reshape(-1)[:200] = 1.0  # tiny values now 2**-100 below the largest: the tiny buckets, 0 exactly
    got = summarize([tensor_part(torch.from_numpy(values), None)])
    assert got["p50"] == 0.0


def test_subnormals_alone_and_beside_zeros():
    rng = np.random.default_rng(9)
    subnormal = rng.integers(1, 2**23, (SIDE, SIDE)).astype(np.uint32).view(np.float32)  # float32's subnormals
    signed = subnormal * rng.choice(np.array([-1, 1], dtype=np.float32), (SIDE, SIDE))
    for values in (subnormal, signed, np.where(rng.random((SIDE, SIDE)) < 0.5, signed, 0).astype(np.float32)):
        for path in PATHS:
            _check(torch.from_numpy(values), None, path)


def test_infinities_next_to_finite_values_are_counted_not_binned():
    rng = np.random.default_rng(10)
    values = rng.standard_normal((SIDE, SIDE))
    values[rng.random(values.shape) < 0.01] = math.inf
    values[rng.random(values.shape) < 0.01] = -math.inf
    values[0, :3] = [3e38, -3e38, 1e-40]
    for path in PATHS:
        part = _check(torch.from_numpy(values).float(), None, path)
        assert summarize([part])["inf_count"] == float(np.isinf(values.astype(np.float32)).sum())


def test_bfloat16_inputs():
    """bfloat16 keeps 7 mantissa bits: each of its values is a bucket's edge, a bucket holds one value."""
    values = torch.from_numpy(_family("student-t2", np.random.default_rng(11), SIDE * SIDE)).reshape(SIDE, SIDE)
    values = values.to(torch.bfloat16)
    mask = _masks("prefix", np.random.default_rng(11), (SIDE, SIDE))
    parts = [_check(values, chosen, path) for path in ("cpu", "torch", "triton") for chosen in (None, mask)]
    for part, other in zip(parts[::2], parts[2::2]):
        assert_same_sketch(other, part)


def test_a_sketch_weighs_at_most_64_kib_and_its_histogram_views_still_work():
    values = torch.from_numpy(_family("outlier-1e6", np.random.default_rng(12), SIDE * SIDE)).reshape(SIDE, SIDE)
    for path in PATHS:
        scalars, histogram, table = PATHS[path](values.float(), None).tensors
        assert histogram.numel() == HIST_LEN and table.numel() == TABLE_LEN
        # What crosses: 12 float64 scalars, int32 counts and the table's int32 bits (packed two to a float64).
        weight = scalars.numel() * 8 + HIST_LEN * 4 + TABLE_LEN * 4
        assert weight == 65_536 and weight <= 64 * 1024
    summary, shown = summarize_with_histogram([tensor_part(values, None)])
    assert shown.total == values.numel() and len(shown.counts) <= stats.MAX_BINS
    edges = np.array(shown.edges)
    assert edges[0] <= -1e6 and np.all(np.diff(edges) > 0)


# --------------------------------------------------------------------------- a discrete set gives its values


def _discrete_set(kind: str, rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` draws from a small set of float32 values, each in a bucket of its own."""
    if kind.startswith("grpo-"):  # group-normalized binary rewards (std with ddof=1, as TRL and verl)
        group = int(kind.split("-")[1])
        rewards = rng.integers(0, 2, (size // group + 1, group)).astype(np.float32)
        centered = rewards - rewards.mean(1, keepdims=True)
        values = (centered / (rewards.std(1, keepdims=True, ddof=1) + np.float32(1e-6))).reshape(-1)[:size]
    elif kind == "clipped":  # a continuous body clipped at +-5: two masses at the clip values
        values = np.clip(rng.standard_t(1, size), -5, 5).round(0)
    elif kind == "rewards-0-1":
        values = rng.choice([0.0, 1.0], size, p=[0.7, 0.3])
    else:  # a dozen arbitrary values over decades, with unequal weights
        points = rng.choice([-1.0, 1.0], 12) * 10.0 ** rng.uniform(-6, 6, 12)
        values = rng.choice(points, size, p=rng.dirichlet(np.ones(12)))
    return values.astype(np.float32)


DISCRETE = ["grpo-4", "grpo-8", "grpo-16", "grpo-64", "clipped", "rewards-0-1", "spread"]


def _assert_discrete_percentiles(got: dict, values: np.ndarray) -> None:
    """Each percentile is NumPy's: where both order statistics are one value, that value, bit for bit."""
    expected = value_stats(values)
    for name in PERCENTILES:
        low, high = expected.order_bounds[name]
        if low == high:
            assert got[name] == low, (name, got[name], low)
        else:  # interpolated between two of the values, as NumPy does
            assert got[name] == pytest.approx(expected[name], rel=1e-12, abs=1e-300), name


@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(DISCRETE), seed=st.integers(0, 2**31), mask=st.sampled_from(["none", "prefix", "random"]),
       path=st.sampled_from(list(PATHS)))
def test_a_discrete_set_of_values_gives_those_values_on_every_path(kind, seed, mask, path):
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(_discrete_set(kind, rng, SIDE * SIDE).reshape(SIDE, SIDE))
    chosen = _masks(mask, rng, (SIDE, SIDE))
    part = PATHS[path](values, chosen)
    kept = values.numpy().astype(np.float64)
    if chosen is not None:
        kept = kept[chosen.numpy() > 0]
    assert part.kind == "sketch" and kept_representatives(part) is not None
    _assert_discrete_percentiles(summarize([part]), kept)


def test_discrete_values_merge_from_chunks_and_ranks_of_any_path():
    rng = np.random.default_rng(31)
    values = torch.from_numpy(_discrete_set("spread", rng, 4 * SIDE * SIDE).reshape(4 * SIDE, SIDE))
    mask = _masks("random", rng, tuple(values.shape))
    chunks = [PATHS[path](values[i * SIDE : (i + 1) * SIDE], mask[i * SIDE : (i + 1) * SIDE])
              for i, path in enumerate(["cpu", "torch", "triton", "cpu-general"])]
    whole = summarize([cpu_sketch._sketch_two_passes(values, mask)])
    merged = _merged(chunks)
    assert {key: merged[key] for key in PERCENTILES} == {key: whole[key] for key in PERCENTILES}
    _assert_discrete_percentiles(merged, values.numpy()[mask.numpy() > 0].astype(np.float64))


def test_a_float64_discrete_set_gives_its_values_to_float32_rounding():
    """The buckets and representatives are read from float32: a float64 value comes back within 2**-24 of itself."""
    rng = np.random.default_rng(32)
    points = np.array([-0.1, 1 / 3, 2 / 3, np.pi, -np.e * 1e3])
    values = rng.choice(points, (SIDE, SIDE))
    expected = value_stats(values)
    for path in PATHS:
        got = summarize([PATHS[path](torch.from_numpy(values), None)])
        for name in PERCENTILES:
            low, high = expected.order_bounds[name]
            if low == high:
                assert got[name] == pytest.approx(low, rel=2.0**-24), (path, name)


def test_more_buckets_than_the_table_holds_fall_back_to_interpolation():
    """With REPRESENTATIVES + 1 buckets holding values no path keeps any: the percentiles are the bound's."""
    rng = np.random.default_rng(33)
    points = 2.0 ** (np.arange(REPRESENTATIVES + 1) / 64)  # one value every other bucket from 1.0 (1.1% apart)
    for count, kept in ((REPRESENTATIVES, True), (REPRESENTATIVES + 1, False)):
        values = torch.from_numpy(rng.choice(points[:count], (SIDE, SIDE)).astype(np.float32))
        for path in PATHS:
            part = _check(values, None, path)
            assert (kept_representatives(part) is not None) == kept, (path, count)
            if kept:
                _assert_discrete_percentiles(summarize([part]), values.numpy().astype(np.float64))


def test_values_below_the_final_window_do_not_cost_the_table():
    """The CPU stops keeping maxima when the first rows hold many positions; when the largest value, met later,
    sends those rows below the window, the few buckets left are kept after all (a second pass), as on a device."""
    rng = np.random.default_rng(34)
    values = np.repeat(rng.choice(np.float32([1e10, 3.0, -2.0, 0.5]), SIDE)[:, None], SIDE, axis=1)
    values[: SIDE // 4] = rng.uniform(1e-12, 2e-12, (SIDE // 4, SIDE))  # 2**-63 below 1e10: the tiny bucket
    values[-1, -1] = 1e10
    tensor = torch.from_numpy(values.astype(np.float32))
    mask = _masks("prefix", rng, (SIDE, SIDE))
    for chosen in (None, mask):
        parts = {path: PATHS[path](tensor, chosen) for path in PATHS}
        kept = {path: kept_representatives(part) for path, part in parts.items()}
        assert len(set(map(tuple, kept.values()))) == 1 and len(kept["cpu"]) <= 4, kept


def test_two_values_in_one_bucket_stay_within_the_bound():
    """Two values closer than a bucket's width (1/128) share it: its representative is the larger magnitude, and a
    percentile on the other is within the bucket of it (the one case a discrete set is not given exactly)."""
    values = torch.from_numpy(np.random.default_rng(35).choice(np.float32([1.0, 1.001, -3.0]), (SIDE, SIDE)))
    for path in PATHS:
        _check(values, None, path)

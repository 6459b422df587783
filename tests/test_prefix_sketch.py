"""The prefix-mask fast path against NumPy and against the general sketch, bin for bin."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from advmon import stats
from advmon.stats import cpu_sketch, prefix_sketch
from advmon.stats.prefix_sketch import prefix_lengths, prefix_part
from advmon.stats import dense_part, summarize

from .reference import assert_stats_close, value_stats
from .sketches import assert_same_sketch, general_part, prefix_mask

FINITE_ADVERSARIAL = [0.0, -0.0, 1.0, -1.0, 1e-30, -1e-30, 1e30, -1e30, 3.4e38, -3.4e38, 1e-45, -1e-45, 0.3]


@st.composite
def prefix_cases(draw):
    rows = draw(st.integers(1, 40))
    cols = draw(st.integers(1, 40))
    lengths = draw(st.lists(st.integers(0, cols), min_size=rows, max_size=rows))
    element = st.one_of(st.floats(width=32, allow_nan=False, allow_infinity=False), st.sampled_from(FINITE_ADVERSARIAL))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    x = np.array(draw(st.lists(element, min_size=rows * cols, max_size=rows * cols)), dtype=dtype).reshape(rows, cols)
    kind = draw(st.sampled_from(["float", "bool", "int", "weights"]))
    padding = draw(st.sampled_from([None, math.nan, math.inf, 7.0]))
    spoilt = draw(st.lists(st.tuples(st.integers(0, rows * cols - 1), st.sampled_from([math.nan, math.inf, -math.inf])),
                           max_size=4))
    for position, value in spoilt:  # NaN and Inf anywhere, the valid entries included
        x.flat[position] = value
    return x, lengths, kind, padding


@settings(max_examples=200, deadline=None)
@given(case=prefix_cases())
def test_prefix_path_matches_numpy_and_the_general_sketch(case):
    x, lengths, kind, padding = case
    values = torch.from_numpy(x.copy())
    mask = prefix_mask(lengths, x.shape[1], kind)
    if padding is not None:
        values[~(mask > 0)] = padding  # whatever the padding holds is never read
    found = prefix_lengths(mask)
    assert found is not None and found.tolist() == list(lengths)
    fast = prefix_part(values, found)
    reference = value_stats(values.numpy(), (mask > 0).numpy())
    if sum(lengths) == 0:
        assert fast is None  # nothing valid: the general sketch reports the counts
        return
    if fast is None:  # every valid value NaN or Inf: the general sketch counts them
        assert math.isnan(reference["min"])
        return
    assert_stats_close(summarize([fast]), reference, exact_percentiles=False)
    assert_same_sketch(fast, general_part(values, mask))


def test_values_beyond_float32s_normal_range_are_counted_again_scaled(monkeypatch):
    """Buckets need no range, so one pass counts them, unless the values must be scaled into float32 first."""
    calls = []
    real = prefix_sketch._scaled_counts
    monkeypatch.setattr(prefix_sketch, "_scaled_counts", lambda *a: calls.append(a[1]) or real(*a))
    values = torch.zeros(300, 300, dtype=torch.float64)
    values[:, 1] = torch.linspace(-1, 1, 300, dtype=torch.float64)  # a range no sample of a row would see
    values[7, 5] = 1e6
    mask = torch.ones(300, 300)
    assert_same_sketch(prefix_part(values, prefix_lengths(mask)), general_part(values, mask))
    assert calls == []
    for factor in (1e-100, 1e100):  # below float32's normal range; beyond float32
        part = prefix_part(values * factor, prefix_lengths(mask))
        assert_same_sketch(part, general_part(values * factor, mask))
        assert_stats_close(summarize([part]), value_stats(values.numpy() * factor, mask.numpy()),
                           exact_percentiles=False)
    assert len(calls) == 2 and calls[0] > 0 > calls[1]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_valid_values_are_counted_and_the_rest_agree_bin_for_bin(bad):
    values = torch.randn(300, 300)
    values[100, 3] = bad
    values[250, :150] = bad  # a whole row's worth, in another block
    values[7, 290] = bad  # in the padding: never read
    mask = prefix_mask(torch.full((300,), 200), 300)
    part = prefix_part(values, prefix_lengths(mask))
    assert part is not None
    got = summarize([part])
    assert got["nan_count" if math.isnan(bad) else "inf_count"] == 151.0
    assert_stats_close(got, value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)
    assert_same_sketch(part, general_part(values, mask))


def test_one_finite_value_among_nan_and_every_value_nan():
    values = torch.full((300, 300), math.nan)
    values[5, 7] = 1.0
    mask = torch.ones(300, 300)
    part = prefix_part(values, prefix_lengths(mask))
    assert_same_sketch(part, general_part(values, mask))
    assert_stats_close(summarize([part]), value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)
    values[5, 7] = math.nan
    assert prefix_part(values, prefix_lengths(mask)) is None  # nothing finite: the general sketch counts them
    got = summarize([dense_part(values, mask)])
    assert_stats_close(got, value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)


@pytest.mark.parametrize(
    "spoil",
    [
        lambda m: m.__setitem__((3, 0), 0.0),  # a hole at the start
        lambda m: m.__setitem__((3, 250), 1.0),  # a one after the zeros
        lambda m: m.__setitem__((5, slice(None)), torch.arange(300) % 2),  # alternating
        lambda m: m.__setitem__((6, 10), math.nan),  # NaN is not > 0: a hole
    ],
    ids=["hole", "late-one", "alternating", "nan"],
)
def test_masks_that_are_not_prefixes_are_refused_and_still_exact(spoil):
    mask = prefix_mask(torch.full((300,), 200), 300)
    spoil(mask)
    assert prefix_lengths(mask) is None
    values = torch.randn(300, 300)
    got = summarize([dense_part(values, mask)])
    assert_stats_close(got, value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)


def test_long_rows_are_proven_in_float64():
    cols = 6000  # c (c - 1) passes 2**24: float32 sums would not be exact
    lengths = torch.tensor([cols, cols - 1, 4097, 0, 1])
    assert prefix_lengths(prefix_mask(lengths, cols)).tolist() == lengths.tolist()
    mask = prefix_mask(lengths, cols)
    mask[0, 5999], mask[0, 0] = 0.0, 1.0
    mask[1, 0], mask[1, 5999] = 0.0, 1.0  # same count, same index sum in float32 only by rounding
    assert prefix_lengths(mask) is None


def test_without_a_mask_every_row_is_full():
    values = torch.randn(400, 300)
    part = dense_part(values, None)
    assert_stats_close(summarize([part]), value_stats(values.numpy()), exact_percentiles=False)
    assert_same_sketch(part, cpu_sketch._sketch_two_passes(values, None))


def test_long_rows_keep_the_ragged_rest_within_one_block():
    generator = torch.Generator().manual_seed(2)
    rows, cols = 40, 20000  # long rows: fewer rows per group, so indices stay block-sized
    values = torch.randn(rows, cols, generator=generator)
    lengths = torch.randint(0, cols + 1, (rows,), generator=generator)
    layout = prefix_sketch._Layout(values, lengths)
    assert layout.group_rows == max(1, min(prefix_sketch.BLOCK_ELEMENTS // cols, rows // 32))
    ragged = 0 if layout.ragged is None else layout.ragged.numel()
    assert ragged <= layout.group_rows * cols
    mask = prefix_mask(lengths, cols)
    part = prefix_part(values, prefix_lengths(mask))
    assert_same_sketch(part, general_part(values, mask))


def test_views_into_a_larger_tensor_are_read_where_they_lie():
    generator = torch.Generator().manual_seed(4)
    base = torch.randn(900, 400, generator=generator)
    base[:, 300:] = float("nan")  # outside the view: reading it would show
    values = base[100:800, 20:300]  # rows longer than the view, and an offset into storage
    lengths = torch.randint(0, 281, (700,), generator=generator)
    mask = prefix_mask(lengths, 280)
    part = prefix_part(values, prefix_lengths(mask))
    assert part is not None
    assert_stats_close(summarize([part]), value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)
    assert_same_sketch(part, general_part(values, mask))


@st.composite
def many_block_cases(draw):
    rows = draw(st.integers(1, 120))
    cols = draw(st.integers(1, 90))
    shape = draw(st.sampled_from(["uniform", "full", "bimodal", "equal"]))
    if shape == "uniform":
        lengths = draw(st.lists(st.integers(0, cols), min_size=rows, max_size=rows))
    elif shape == "full":
        lengths = [cols] * rows
    elif shape == "bimodal":
        lengths = draw(st.lists(st.sampled_from([0, 1, cols - 1, cols]), min_size=rows, max_size=rows))
    else:
        lengths = [draw(st.integers(0, cols))] * rows
    seed = draw(st.integers(0, 2**31 - 1))
    scale = draw(st.sampled_from([1e-30, 1e-3, 1.0, 1e4, 1e30]))
    offset = draw(st.sampled_from([0.0, 1000.0, -5.0, 1e8, -1e12]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    spoilt = draw(st.lists(st.tuples(st.integers(0, rows * cols - 1), st.sampled_from([math.nan, math.inf, -math.inf])),
                           max_size=3))
    return rows, cols, [max(0, min(cols, n)) for n in lengths], seed, scale, offset, dtype, spoilt


@settings(max_examples=100, deadline=None)
@given(case=many_block_cases())
def test_many_small_blocks_and_groups_agree_bin_for_bin(case):
    rows, cols, lengths, seed, scale, offset, dtype, spoilt = case
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(rows, cols, generator=generator, dtype=dtype) * scale + offset
    for position, value in spoilt:
        values.view(-1)[position] = value
    mask = prefix_mask(lengths, cols)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(prefix_sketch, "BLOCK_ELEMENTS", 256)  # many blocks, groups of a few rows, ragged rests
        patch.setattr(prefix_sketch, "GROUP_ROWS", 4)
        patch.setattr(prefix_sketch, "_PENDING_BINS", 600)  # bins counted every two or three blocks
        part = prefix_part(values, prefix_lengths(mask))
        # With the rows' sums the slices take, which give blocks their sums.
        with_rows = prefix_part(values, prefix_lengths(mask), prefix_sketch.RowExtremes(rows, dtype, sums=True))
    valid_values = values.numpy()[(mask > 0).numpy()]
    if not np.isfinite(valid_values).any():  # nothing valid, or nothing finite: the general sketch's
        assert part is None and with_rows is None
        return
    assert part is not None
    expected = value_stats(values.numpy(), mask.numpy())
    assert_stats_close(summarize([part]), expected, exact_percentiles=False)
    assert_stats_close(summarize([with_rows]), expected, exact_percentiles=False)
    assert_same_sketch(part, general_part(values, mask))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_extremes_taken_on_the_way_match_numpy(dtype):
    """Rows' extremes and float64 sums, over several blocks (their rectangles' offsets) and a block with a NaN."""
    rng = np.random.default_rng(5)
    rows, cols = 600, 1000  # about 300k valid values: several blocks of prefix_sketch.BLOCK_ELEMENTS
    lengths = rng.integers(0, cols + 1, rows)
    x = rng.normal(3.0, 2.0, (rows, cols)) * 10.0 ** rng.integers(-3, 4, (rows, 1))
    nan_row = int(np.flatnonzero(lengths > 10)[0])
    x[nan_row, 5] = math.nan
    values = torch.from_numpy(x).to(dtype)
    extremes = prefix_sketch.RowExtremes(rows, dtype, sums=True)
    part = prefix_part(values, torch.from_numpy(lengths), extremes)
    assert part is not None and extremes.complete
    # The blocks' sums came from their rows' (the NaN's block from its own finite values): the same statistics.
    assert_stats_close(summarize([part]), value_stats(values.numpy(), prefix_mask(lengths, cols).numpy()),
                       exact_percentiles=False)
    assert_same_sketch(part, prefix_part(values, torch.from_numpy(lengths)))
    seen = values.double().numpy()
    for row in range(rows):
        valid = seen[row, : lengths[row]]
        if row == nan_row:
            assert math.isnan(float(extremes.total[row])) or math.isnan(float(extremes.high[row]))
        elif valid.size:
            assert float(extremes.high[row]) == valid.max() and float(extremes.low[row]) == valid.min()
            assert float(extremes.total[row]) == pytest.approx(math.fsum(valid), rel=1e-12, abs=1e-300)
        else:
            assert float(extremes.total[row]) == 0.0


@pytest.mark.parametrize("offset", [1e8, 1e12])
def test_the_rows_sums_taken_for_slices_keep_the_std_on_its_own_scale(offset):
    """Found by issue 31's check on the statistic's scale: a block's centred sum taken from its rows' float64
    sums kept their rounding at the data's magnitude, 4e-8 of the std at 1e8 with a spread of 1e-3."""
    rng = np.random.default_rng(7)
    rows, cols = 300, 257
    lengths = rng.integers(0, cols + 1, rows)
    x = rng.standard_normal((rows, cols)) * 1e-3 + offset
    extremes = prefix_sketch.RowExtremes(rows, torch.float64, sums=True)
    part = prefix_part(torch.from_numpy(x), torch.from_numpy(lengths), extremes)
    assert part is not None and extremes.complete  # the rows' sums were taken on the way
    assert_stats_close(summarize([part]), value_stats(x, prefix_mask(lengths, cols).numpy()), exact_percentiles=False)

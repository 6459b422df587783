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
    if fast is None:  # every sampled value non-finite, or 2**-level would leave float64's range
        guess = _guess(values, lengths)
        assert guess is None or not -1000 < stats.host_level(*guess) < 1000 or not (
            -1000 < stats.host_level(reference["min"], reference["max"]) < 1000
        )
        return
    assert_stats_close(summarize([fast]), reference, exact_percentiles=False)
    assert_same_sketch(fast, general_part(values, mask))


def _guess(values, lengths):
    picks = [values[r, j].item() for r, c in enumerate(lengths) if c for j in (0, (c - 1) // 2, c - 1)]
    picks = [p for p in picks if math.isfinite(p)]
    return (min(picks), max(picks)) if picks else None


@pytest.mark.parametrize("kind", ["float", "bool", "int", "weights"])
def test_large_prefix_masks_take_the_fast_path_and_agree_bin_for_bin(kind, monkeypatch):
    generator = torch.Generator().manual_seed(3)
    rows, cols = 700, 300
    lengths = torch.randint(0, cols + 1, (rows,), generator=generator)
    lengths[:40] = cols  # full rows
    lengths[40:60] = 0  # rows with nothing valid
    values = torch.randn(rows, cols, generator=generator) * 3 + 0.5
    mask = prefix_mask(lengths, cols, kind)
    taken = []
    real = cpu_sketch.prefix_part
    monkeypatch.setattr(cpu_sketch, "prefix_part", lambda *a: taken.append(real(*a)) or taken[-1])
    part = dense_part(values, mask)
    assert taken and taken[0] is part  # dense_part went through the fast path
    assert_stats_close(summarize([part]), value_stats(values.numpy(), (mask > 0).numpy()), exact_percentiles=False)
    assert_same_sketch(part, general_part(values, mask))


@pytest.mark.parametrize(
    "make",
    [
        lambda g: torch.randn(500, 257, generator=g) * 1e-3 + 1000.0,  # first bin too large for float32
        lambda g: torch.randn(500, 257, generator=g) * 1e4,  # coarse level: bins in float64
        lambda g: torch.rand(500, 257, generator=g).pow(-3),  # heavy tail: the guessed range misses
        lambda g: torch.randint(0, 2, (500, 257), generator=g).float(),  # two values only
        lambda g: torch.full((500, 257), -2.5),  # constant
        lambda g: torch.randn(500, 257, generator=g, dtype=torch.float64) * 1e-200,  # float64 values
    ],
    ids=["offset", "coarse", "heavy-tail", "binary", "constant", "float64-tiny"],
)
def test_hard_ranges_agree_with_the_general_sketch(make):
    generator = torch.Generator().manual_seed(11)
    values = make(generator)
    lengths = torch.randint(0, values.shape[1] + 1, (values.shape[0],), generator=generator)
    mask = prefix_mask(lengths, values.shape[1])
    part = prefix_part(values, prefix_lengths(mask))
    assert part is not None
    assert_stats_close(summarize([part]), value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)
    assert_same_sketch(part, general_part(values, mask))


def test_a_sample_of_zeros_beside_a_tiny_value_makes_the_histogram_again():
    # Found by hypothesis: 0 alone gets coarser bins than 1e-30 beside it.
    values = torch.tensor([[0.0, 1e-30, 0.0, 0.0, 0.0]])
    mask = torch.ones(1, 5)
    part = prefix_part(values, prefix_lengths(mask))
    assert_stats_close(summarize([part]), value_stats(values.numpy(), mask.numpy()), exact_percentiles=False)
    assert_same_sketch(part, general_part(values, mask))


def test_the_guessed_range_missing_a_value_makes_the_histogram_again(monkeypatch):
    values = torch.zeros(300, 300)
    values[:, 1] = torch.linspace(-1, 1, 300)  # the sample never sees column 1 of a 300-long row
    values[7, 5] = 1e6
    mask = torch.ones(300, 300)
    calls = []
    real = prefix_sketch._histogram_pass
    monkeypatch.setattr(prefix_sketch, "_histogram_pass", lambda *a: calls.append(1) or real(*a))
    part = prefix_part(values, prefix_lengths(mask))
    assert calls == [1]
    assert_same_sketch(part, general_part(values, mask))


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


def test_every_sampled_value_non_finite_leaves_it_to_the_general_sketch():
    values = torch.full((300, 300), math.nan)
    values[5, 7] = 1.0  # not a first, middle or last value of its row
    mask = torch.ones(300, 300)
    assert prefix_part(values, prefix_lengths(mask)) is None
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


def test_a_range_wider_than_the_guess_but_inside_the_window_is_coarsened_exactly(monkeypatch):
    generator = torch.Generator().manual_seed(5)
    values = torch.rand(400, 301, generator=generator) * 6 - 3  # [-3, 3]
    values[:, [0, 150, 300]] /= 3  # the sampled first, middle and last values span [-1, 1]
    mask = torch.ones(400, 301)
    shifts = []
    real = prefix_sketch._Window.coarsened

    def spy(window, histogram, level, first):
        shifts.append(level - window.level)
        return real(window, histogram, level, first)

    monkeypatch.setattr(prefix_sketch._Window, "coarsened", spy)
    part = prefix_part(values, prefix_lengths(mask))
    assert shifts and shifts[0] >= 1
    assert_same_sketch(part, general_part(values, mask))


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
    if sum(lengths) == 0 or _guess(values, lengths) is None:
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

"""Records' advantage histograms (issue 19, item 2): every bin against NumPy, on every path and layout."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import advmon
from advmon.stats import statistics_path
from advmon.stats import MAX_BINS, coarsened, dense_part, summarize_with_histogram

from .conftest import ListSink
from .sketches import prefix_mask


def assert_histogram_matches(histogram, values: np.ndarray, weights: np.ndarray | None = None) -> None:
    """The bins hold exactly the finite values (counted by their weights), with increasing edges."""
    weights = np.ones(values.shape) if weights is None else weights
    keep = np.isfinite(values) & (weights > 0)
    values, weights = values[keep], weights[keep]
    assert 1 <= len(histogram.counts) <= MAX_BINS and len(histogram.edges) == len(histogram.counts) + 1
    edges = np.array(histogram.edges)
    assert np.all(np.diff(edges) > 0)
    assert edges[0] <= values.min() < edges[1] and edges[-2] <= values.max() < edges[-1]
    expected, _ = np.histogram(values, bins=edges, weights=weights)  # [a, b) bins; no value on the last edge
    assert np.array_equal(np.array(histogram.counts), expected), (histogram.counts, expected)
    assert histogram.counts[0] > 0 and histogram.counts[-1] > 0  # empty ends are dropped


def grpo_like(seed: int, rows: int = 96, cols: int = 700):
    rng = np.random.default_rng(seed)
    rewards = torch.from_numpy(rng.integers(0, 3, rows) / 2.0)
    grouped = rewards.view(-1, 8)
    per_row = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
    lengths = rng.integers(1, cols + 1, rows)
    return rewards, per_row, prefix_mask(lengths, cols), rng


@pytest.mark.parametrize("path", ["cpu", "torch", "triton"])
@pytest.mark.parametrize("layout", ["expand-view", "dense-prefix", "dense-random-mask", "per-sequence"])
@pytest.mark.parametrize("sketched", [False, True], ids=["exact", "sketched"])
def test_histograms_match_numpy(path, layout, sketched, monkeypatch):
    from advmon.stats import parts

    if sketched:
        monkeypatch.setattr(parts, "EXACT_LIMIT", 0)  # every tensor sketched, as a large one is
    rewards, per_row, mask, rng = grpo_like(1)
    if layout == "expand-view":
        advantages = per_row.float().expand(mask.shape)
    elif layout == "per-sequence":
        advantages, mask = per_row[:, 0].float(), None
    else:
        if layout == "dense-random-mask":
            mask = torch.from_numpy((rng.random(mask.shape) < 0.5).astype(np.float32))
        advantages = (per_row + torch.from_numpy(rng.normal(0, 0.3, mask.shape))).float()
        advantages[3, 0] = math.nan  # valid in every layout: counted apart, not binned
        advantages[7, 1] = math.inf
        advantages[11, 2] = 1e4  # an outlier stretches the range: wider bins, still exact counts
    sink = ListSink()
    with advmon.Monitor("histograms", sinks=[sink], histograms=True) as monitor, statistics_path(path):
        monitor.observe(rewards=rewards, advantages=advantages, mask=mask, group_size=8)
    record = sink.records[-1]
    values = advantages.double().numpy()
    weights = None if mask is None else (mask.numpy() > 0).astype(np.float64)
    assert_histogram_matches(record.histograms["post_norm"], values.reshape(-1),
                             None if weights is None else weights.reshape(-1))
    assert record.histograms["post_norm"].total == record.metrics["advantages/post_norm/count"] - (
        record.metrics["advantages/post_norm/nan_count"] + record.metrics["advantages/post_norm/inf_count"])
    grouped = rewards.view(-1, 8)
    pre_norm = (grouped - grouped.mean(1, keepdim=True)).reshape(-1).numpy()
    assert_histogram_matches(record.histograms["pre_norm"], pre_norm)


def uniform_edges(level: int, first: int, bins: int) -> list[float]:
    """Edges of ``bins`` fine bins of width ``2**level`` from bin ``first`` (the old sketch's bins)."""
    return [math.ldexp(first + k, level) for k in range(bins + 1)]


def test_a_bulk_beside_an_exploding_advantage_keeps_its_resolution_in_relative_buckets():
    """The sketch's own buckets (relative, 128 per octave): one value at 1e6 leaves the bulk's bins fine."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.standard_normal(300_000), [1e6]])
    summary, histogram = summarize_with_histogram([dense_part(torch.from_numpy(values).unsqueeze(0), None)])
    assert histogram.total == values.size and len(histogram.counts) <= MAX_BINS
    edges = np.array(histogram.edges)
    bulk = (edges[:-1] >= -5) & (edges[1:] <= 5)
    assert np.array(histogram.counts)[bulk].sum() >= 0.999 * 300_000 and bulk.sum() >= 20
    assert edges[-2] <= 1e6 < edges[-1]
    assert_histogram_matches(histogram, values)


def sparse_counts():
    """Fine histograms as the sketch leaves them: a bulk, empty stretches, a few far outliers."""
    return st.lists(st.one_of(st.just(0), st.just(0), st.integers(1, 9), st.integers(0, 1000)), min_size=1,
                    max_size=1100)


@settings(max_examples=200, deadline=None)
@given(counts=sparse_counts(), first=st.integers(-3000, 3000), level=st.integers(-40, 40), max_bins=st.integers(1, 64))
def test_coarsened_bins_are_fine_bins_merged_and_keep_every_count(counts, first, level, max_bins):
    histogram = coarsened(uniform_edges(level, first, len(counts)), counts, max_bins)
    if not any(counts):
        assert histogram is None
        return
    assert 1 <= len(histogram.counts) <= max_bins and histogram.total == sum(counts)
    assert histogram.counts[0] > 0 and histogram.counts[-1] > 0
    fine = [math.ldexp(first + k, level) for k in range(len(counts) + 1)]
    assert set(histogram.edges) <= set(fine)  # every edge is a fine edge: exact counts, exact floats
    expected = [sum(c for k, c in enumerate(counts) if left <= fine[k] < right)
                for left, right in zip(histogram.edges, histogram.edges[1:])]
    assert list(histogram.counts) == expected
    occupied = [k for k, c in enumerate(counts) if c]
    if occupied[-1] - occupied[0] + 1 <= max_bins:  # they fit: the fine bins, as they are
        assert list(histogram.edges) == fine[occupied[0] : occupied[-1] + 2]


def test_the_bulk_keeps_its_resolution_beside_far_outliers():
    """tp2's shape: unit-scale advantages and a few at thousands. The bins go where the values are."""
    rng = np.random.default_rng(4)
    values = np.concatenate([rng.normal(0, 1, 100_000), [7428.4, -3184.0, 6000.0]])
    level, first = -3, math.floor(values.min() * 8)  # 1/8-wide fine bins, as a sketch of this range has at most
    counts = np.bincount(np.floor(values * 8).astype(np.int64) - first)
    histogram = coarsened(uniform_edges(level, first, len(counts)), counts)
    edges = np.array(histogram.edges)
    bulk = (edges[:-1] >= -5) & (edges[1:] <= 5)
    assert np.array(histogram.counts)[bulk].sum() >= 0.999 * 100_000 and bulk.sum() >= 30  # most bins on the bulk
    assert np.diff(edges)[bulk].max() <= 0.5
    uniform = 64 * 0.125 * 2 ** math.ceil(math.log2((values.max() - values.min()) / 8 / 64))
    assert np.diff(edges)[bulk].max() < uniform / 100  # 64 equal bins would be hundreds of times wider


def test_jsonl_keeps_them_compactly_and_reads_them_back(tmp_path):
    rewards, per_row, mask, _ = grpo_like(2)
    with advmon.Monitor("compact", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl")]) as monitor:
        monitor.observe(rewards=rewards, advantages=per_row.float().expand(mask.shape), mask=mask, group_size=8)
    line = json.loads((tmp_path / "r.jsonl").read_text())
    post = line["histograms"]["post_norm"]
    assert set(post) == {"edges", "counts"} and all(type(c) is int for c in post["counts"])
    assert len(post["edges"]) == len(post["counts"]) + 1 <= 65
    record = advmon.read_jsonl(tmp_path / "r.jsonl")[0]
    assert record.histograms["post_norm"].total == record.metrics["advantages/post_norm/count"]


def test_on_by_default_only_where_a_sink_takes_them(tmp_path, monkeypatch):
    from advmon.config.environment import monitor_settings
    from advmon.errors import AdvmonConfigError

    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0])
    cases = {"list": ([ListSink()], None, False), "jsonl": ([advmon.JsonlSink(tmp_path / "a.jsonl")], None, True),
             "off": ([advmon.JsonlSink(tmp_path / "b.jsonl")], False, False), "forced": ([ListSink()], True, True)}
    for name, (sinks, asked, expected) in cases.items():
        with advmon.Monitor(name, sinks=sinks, histograms=asked) as monitor:
            monitor.observe(rewards=rewards, advantages=rewards - 0.5, group_size=2)
        assert monitor.histograms is expected, name
        if isinstance(sinks[0], ListSink):
            assert bool(sinks[0].records[-1].histograms) is expected, name
    assert monitor_settings({"ADVMON_HISTOGRAMS": "0"})["histograms"] is False
    with pytest.raises(AdvmonConfigError, match="ADVMON_HISTOGRAMS"):
        monitor_settings({"ADVMON_HISTOGRAMS": "yes"})
    with pytest.raises(AdvmonConfigError, match="histograms must be"):
        advmon.Monitor("bad", sinks=[], histograms="yes")


def test_one_bin_for_a_stretch_across_zero():
    """No power-of-two bin aligned to its size holds [-1, 1): a single bin must still come out (it used to loop)."""
    histogram = coarsened(uniform_edges(0, -2, 4), [1, 0, 0, 1], max_bins=1)
    assert histogram.edges == (-2.0, 2.0) and histogram.counts == (2.0,)
    histogram = coarsened(uniform_edges(0, -290, 580), [1] * 40 + [0] * 500 + [1] * 40, max_bins=4)
    assert histogram.total == 80 and len(histogram.counts) <= 4

"""The device statistics paths (pure torch; Triton in test_triton_sketch.py) on CPU tensors.

What a GPU user gets is checked here on any machine: every statistic against
NumPy, every bin against the CPU's general sketch, a number of dispatched ops
that does not grow with the data, and nothing that would make the host wait
for the device.
"""

from __future__ import annotations

import math
import warnings
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import advmon
from advmon import stats
from advmon.stats import device_sketch, parts
from advmon.stats.device_sketch import device_part
from advmon.stats import path_for, statistics_path
from advmon.observation import tensor_part
from advmon.stats import summarize, value_part
from tests import zygote

from .dispatch import Dispatched, largest_allocation
from .reference import assert_stats_close, value_stats
from .sketches import assert_same_sketch, general_part, kept_representatives, prefix_mask
from .sketches import float_arrays as float_arrays_of
from .test_stats import offset_arrays



def _cases():
    """(values, mask) pairs for every case a device must get right, each > EXACT_LIMIT entries."""
    rng = np.random.default_rng(17)
    shape = (300, 257)
    normal = torch.from_numpy(rng.standard_normal(shape))
    lengths = rng.integers(0, shape[1] + 1, shape[0])
    spoiled = normal.clone()
    spoiled[rng.random(shape) < 0.01] = math.nan
    spoiled[rng.random(shape) < 0.01] = math.inf
    spoiled[rng.random(shape) < 0.01] = -math.inf
    yield "float32-prefix", normal.float(), prefix_mask(lengths, shape[1])
    yield "bfloat16-prefix", normal.bfloat16(), prefix_mask(lengths, shape[1])
    yield "float64-prefix", normal * 1e3 + 7.0, prefix_mask(lengths, shape[1])
    yield "random-mask", normal.float(), torch.from_numpy((rng.random(shape) < 0.6).astype(np.float32))
    yield "bool-mask", normal.float(), torch.from_numpy(rng.random(shape) < 0.3)
    yield "nonfinite-in-and-out", spoiled.float(), torch.from_numpy((rng.random(shape) < 0.5).astype(np.float32))
    yield "lognormal-tail", torch.from_numpy(rng.lognormal(0.0, 3.0, shape)).float(), prefix_mask(lengths, shape[1])
    yield "no-mask", normal.float(), None
    yield "int-mask-weights", normal.float(), prefix_mask(lengths, shape[1], "weights")


CASES = list(_cases())


@pytest.mark.parametrize(("name", "values", "mask"), CASES, ids=[c[0] for c in CASES])
def test_the_torch_path_matches_numpy_and_the_cpu_sketch_bin_for_bin(name, values, mask):
    with statistics_path("torch"):
        part = tensor_part(values, mask)
    assert part.kind == "sketch"
    expected = value_stats(values.to(torch.float64).numpy(), None if mask is None else mask.to(torch.float64).numpy())
    assert_stats_close(summarize([part]), expected, exact_percentiles=False)  # percentiles: the 0.8% promise
    reference_mask = mask if mask is not None else torch.ones(values.shape)
    assert_same_sketch(part, general_part(values.float() if values.dtype == torch.bfloat16 else values,
                                          reference_mask))


@pytest.mark.parametrize("masked", [True, False])
def test_expand_views_and_per_sequence_values_on_the_torch_path(masked):
    rng = np.random.default_rng(18)
    per_row = torch.from_numpy(rng.standard_normal(4096)).float()
    per_row[7] = math.nan
    mask = prefix_mask(rng.integers(0, 65, 4096), 64) if masked else None
    view = per_row.unsqueeze(-1).expand(4096, 64)
    with statistics_path("torch"):
        expand = summarize([tensor_part(view, mask)])
        sequence = summarize([tensor_part(per_row, None)])
    expected = value_stats(view.numpy(), None if mask is None else mask.numpy())
    assert_stats_close(expand, expected)  # exact: B weighted values
    assert_stats_close(sequence, value_stats(per_row.numpy()))


@pytest.mark.parametrize("mask_dtype", [torch.float32, torch.bfloat16, torch.bool, torch.int64])
def test_an_expand_view_makes_no_temporary_wider_than_a_byte_an_entry(mask_dtype):
    """Its work is its mask's row counts: an H200 showed 2.25x the tensor when they were a float64 sum."""
    rng = np.random.default_rng(20)
    rows, cols = 512, 1000  # not a multiple of 255: the counts' tail is used
    lengths = rng.integers(0, cols + 1, rows)
    mask = prefix_mask(lengths, cols).to(mask_dtype)
    view = torch.from_numpy(rng.standard_normal(rows)).float().unsqueeze(-1).expand(rows, cols)
    with statistics_path("torch"):
        part = tensor_part(view, mask)
        largest = largest_allocation(lambda: tensor_part(view, mask))
    assert largest <= rows * cols, largest  # the `> 0` bool, one byte an entry
    assert_stats_close(summarize([part]), value_stats(view.numpy(), mask.to(torch.float64).numpy()))


def test_large_weighted_sets_are_sketched_with_weights_on_the_device():
    """An expand view of more rows than EXACT_LIMIT: no repeat_interleave (its size lives on the device)."""
    rng = np.random.default_rng(19)
    values = torch.from_numpy(rng.standard_normal(stats.EXACT_LIMIT + 10))
    values[3] = math.inf
    weights = torch.from_numpy(rng.integers(0, 3, values.numel()).astype(float))
    with statistics_path("torch"), Dispatched() as seen:
        part = value_part(values, weights)
    assert part.kind == "sketch" and not seen.syncs
    expected = value_stats(np.repeat(values.numpy(), weights.numpy().astype(int)))
    assert_stats_close(summarize([part]), expected, exact_percentiles=False)
    assert_same_sketch(part, general_part(values.repeat_interleave(weights.long()).unsqueeze(0), None))


float_arrays = float_arrays_of(max_side=30)


@settings(max_examples=150, deadline=None)
@given(x=float_arrays, data=st.data())
def test_device_parts_of_any_data_agree_with_numpy_and_the_cpu_sketch(x, data):
    valid = data.draw(hnp.arrays(np.bool_, x.shape))
    values, mask = torch.from_numpy(x), torch.from_numpy(valid)
    for chosen in (mask, None):
        part = device_part(values, chosen)
        assert_stats_close(summarize([part]), value_stats(x, None if chosen is None else valid), exact_percentiles=False)
        assert_same_sketch(part, general_part(values, chosen if chosen is not None else torch.ones(x.shape)))


@settings(max_examples=100, deadline=None)
@given(case=offset_arrays())
def test_device_moments_hold_on_their_own_scale_whatever_the_offset(case):
    """Large offsets, small spreads, mixed row scales, NaN and Inf: the std within rounding of itself."""
    x, valid = case
    expected = value_stats(x, valid)
    for weights in (None, torch.from_numpy(valid.astype(np.float64))):  # a mask, or the expand view's weights
        part = device_part(torch.from_numpy(x), torch.from_numpy(valid), weights)
        assert_stats_close(summarize([part]), expected, exact_percentiles=False)


def test_chunks_merge_into_one_part(monkeypatch):
    """Beyond CHUNK_ELEMENTS values the passes go chunk by chunk; the part is the same."""
    rng = np.random.default_rng(20)
    values = torch.from_numpy(rng.standard_normal((90, 70))).float()
    values[4, 4] = math.nan
    mask = torch.from_numpy(rng.random((90, 70)) < 0.7)
    whole = device_part(values, mask)
    monkeypatch.setattr(device_sketch, "CHUNK_ELEMENTS", 700)  # 10 rows per chunk
    chunked = device_part(values, mask)
    assert_same_sketch(chunked, whole)


def test_rows_longer_than_a_chunk_are_counted_exactly(monkeypatch):
    """A row of more values than histc counts exactly in float32 is still one chunk: its bins are sorted instead.
    The chunks share the part's maxima: each of a few values comes back exactly."""
    from advmon.stats import device_sketch as module

    values = torch.from_numpy(np.random.default_rng(22).standard_normal((2, 300)))
    values[:, :40] = 1.0  # a bin holding more values than the (lowered) float32 limit
    monkeypatch.setattr(module, "CHUNK_ELEMENTS", 100)
    monkeypatch.setattr(module, "_HISTC_EXACT", 30)
    with Dispatched() as seen:
        part = device_part(values)
    assert "histc" not in seen.ops and seen.ops.count("sort") == 2  # two chunks of one row each
    assert seen.ops.count("scatter_reduce_") == 2
    assert_same_sketch(part, general_part(values, torch.ones(values.shape)))
    few = values.clone()
    few[0, 40:], few[1, 40:] = 2.5, -0.375  # three values: each comes back exactly
    assert kept_representatives(device_part(few)) == [-0.375, 1.0, 2.5]


def test_deterministic_mode_counts_bins_by_sorting():
    """torch.histc has no deterministic CUDA kernel: under use_deterministic_algorithms the bins are sorted."""
    rng = np.random.default_rng(21)
    values = torch.from_numpy(rng.standard_normal((200, 400))).float()
    mask = torch.from_numpy(rng.random((200, 400)) < 0.5)
    usual = device_part(values, mask)
    with deterministic_algorithms(), Dispatched() as seen:
        sorted_bins = device_part(values, mask)
    assert "histc" not in seen.ops and "sort" in seen.ops
    assert torch.equal(usual.tensors[1], sorted_bins.tensors[1])


def test_a_whole_call_uses_no_op_that_deterministic_mode_refuses_on_cuda(sink):
    """CUDA refuses histc and a floating-point cumsum under use_deterministic_algorithms (the CPU allows both)."""
    refused = []

    class Refusals(Dispatched):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.__name__.split(".")[0]
            if name == "histc" or (name == "cumsum" and (args[0].is_floating_point() or
                                                         (kwargs or {}).get("dtype") in (torch.float32, torch.float64))):
                refused.append(name)
            return super().__torch_dispatch__(func, types, args, kwargs)

    prompts, rewards, mask = grpo_inputs(40, 8, 600)
    dense = rewards.unsqueeze(-1) * mask + 0.01 * torch.randn(mask.shape)
    with advmon.Monitor("deterministic", sinks=[sink]) as monitor, statistics_path("torch"), deterministic_algorithms():
        with Refusals():
            monitor.observe(rewards=rewards, advantages=dense, mask=mask, groups=prompts)
        assert monitor.internal_errors == 0
    assert refused == []
    assert_stats_close(sink.records[-1].metrics, value_stats(dense.numpy(), mask.numpy()), "advantages/post_norm/",
                       exact_percentiles=False)


@contextmanager
def deterministic_algorithms():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


# --------------------------------------------------------------------------- ops and syncs


def _dense_case(rows: int, cols: int):
    g = torch.Generator().manual_seed(rows)
    values = torch.randn(rows, cols, generator=g)
    values[0, 1] = math.nan
    mask = prefix_mask(torch.randint(0, cols + 1, (rows,), generator=g), cols)
    return values, mask


def test_the_torch_path_dispatches_the_same_ops_at_any_size():
    seen = []
    with statistics_path("torch"):
        tensor_part(*_dense_case(128, 1024))  # the sketch's fold patterns are made once a process: not counted
    for rows, cols in ((128, 1024), (512, 4096)):  # 16x apart, both > EXACT_LIMIT
        values, mask = _dense_case(rows, cols)
        with statistics_path("torch"), Dispatched() as dispatched:
            tensor_part(values, mask)
        assert not dispatched.syncs, dispatched.syncs
        seen.append(dispatched)
    assert seen[0].ops == seen[1].ops
    assert len(seen[0].kernels) <= 60, seen[0].kernels  # the bound for the pure-torch path


def grpo_inputs(groups: int, size: int, tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 1000, (groups, 9), generator=g).repeat_interleave(size, dim=0)
    rewards = torch.randint(0, 2, (groups * size,), generator=g).float()
    rewards[:size] = 1.0
    rewards[size + 1] = math.nan
    mask = prefix_mask(torch.randint(1, tokens + 1, (groups * size,), generator=g), tokens)
    return prompts, rewards, mask


#: Ops a whole observed call dispatches on the pure-torch path (the issue's goal: at most 60 for the defaults).
#: The device reduces only what is [B, T] or [B, S]; groups, exemplars, slices and the derived pre_norm are the
#: host's NumPy after the one transfer. Both: the rewards' float64 copy (1), the prompt rows' hash (6: multiply,
#: shift, mask, xor, multiply, row sum), the record's packing (1 cat). The expand view: the mask's row counts (5)
#: and the post_norm's weighted exact part (1: a float64 copy of the rows' values; the counts are its weights),
#: which the host summarises per row too. Dense: the sketch (58, test_the_torch_path_dispatches_the_same_ops_at_
#: any_size) and the rows' peaks for the exemplars (22).
WHOLE_CALL_KERNELS = {"expand-view": 1 + 6 + 1 + 5 + 1, "dense": 1 + 6 + 1 + 58 + 22}


@pytest.mark.parametrize("dense", [False, True], ids=["expand-view", "dense"])
def test_a_whole_observed_call_dispatches_the_same_ops_at_any_size_and_never_syncs(dense, sink):
    """Groups from prompt rows, the derived pre_norm, post_norm: the same op list for 16x the batch."""
    counts = []
    with advmon.Monitor("device-ops", sinks=[sink]) as monitor:
        with statistics_path("torch"):
            prompts, rewards, _ = grpo_inputs(2, 8, 16)
            monitor.observe(rewards=rewards, groups=prompts)  # makes the row hash's column weights
            # and, above 65,536 values, the sketch's fold patterns (made once a process and device): run first in
            # its process, the test counted their making in the first size's ops
            prompts, rewards, mask = grpo_inputs(16, 8, 1024)
            monitor.observe(rewards=rewards, advantages=rewards.unsqueeze(-1).expand(mask.shape) + 0.01, mask=mask)
        for groups, tokens in ((16, 1024), (64, 4096)):  # 16x apart
            prompts, rewards, mask = grpo_inputs(groups, 8, tokens)
            advantages = rewards.unsqueeze(-1).expand(mask.shape)
            if dense:
                advantages = advantages + 0.01 * torch.randn(mask.shape)
            with statistics_path("torch"), Dispatched() as seen:
                with monitor.step(len(counts)):
                    monitor.observe(rewards=rewards, advantages=advantages, mask=mask, groups=prompts)
            assert not seen.syncs, seen.syncs
            assert len(seen.kernels) <= WHOLE_CALL_KERNELS["dense" if dense else "expand-view"], seen.kernels
            counts.append(seen.ops)
            expected = value_stats(advantages.numpy(), mask.numpy())
            assert_stats_close(sink.records[-1].metrics, expected, "advantages/post_norm/", exact_percentiles=not dense)
        assert counts[0] == counts[1]
        assert monitor.internal_errors == 0


def test_the_path_follows_the_device_and_can_be_chosen(monkeypatch):
    assert path_for(torch.device("cpu")) == "cpu"
    assert path_for(torch.device("meta")) == "torch"
    with statistics_path("torch"):
        assert path_for(torch.device("cpu")) == "torch"
    monkeypatch.setenv("ADVMON_STATISTICS_PATH", "torch")
    assert path_for(torch.device("cpu")) == "torch"
    with pytest.raises(ValueError, match="statistics path"):
        with statistics_path("gpu"):  # type: ignore[arg-type]
            pass


def smoke_run(script: str, tmp_path) -> str:
    """A benchmark's ``--smoke`` run on the CPU; its output, once it exited cleanly (a fork of tests/zygote.py in
    make test: the script as it runs, without loading torch again)."""
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([*zygote.command(), str(root / "benchmarks" / script), "--smoke"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_gpu_benchmark_runs(tmp_path):
    """benchmarks/bench_gpu.py --smoke: the GPU check's code on the CPU, so a lent GPU's minutes find it working."""
    out = smoke_run("bench_gpu.py", tmp_path)
    for figure in ("triton dense", "torch  expand view", "triton GRPO expand view", "torch  dense"):
        assert figure in out, out


def test_the_gpu_profile_runs(tmp_path):
    """benchmarks/profile_gpu.py --smoke: where a call's time goes, ready for the next lent GPU."""
    out = smoke_run("profile_gpu.py", tmp_path)
    for heading in ("=== triton dense 256 x 512", "=== torch expand view", "=== watched GRPO call", "tottime"):
        assert heading in out, out[-3000:]


def test_tensors_on_a_device_without_float64_are_summarised_on_the_host(monkeypatch):
    """MPS has no float64: its tensors cross to the host once each and take the CPU's path."""
    from advmon.stats import devices
    from advmon.observation import as_tensor

    moved = []

    class OnMPS(torch.Tensor):
        @property
        def device(self):
            return torch.device("mps")

        def cpu(self, *args, **kwargs):
            moved.append(self.shape)
            return torch.Tensor.as_subclass(self, torch.Tensor)

    assert "mps" in devices.NO_FLOAT64
    rewards = torch.tensor([1.0, 0.0, 1.0]).as_subclass(OnMPS)
    host = as_tensor(rewards, "rewards")
    assert moved == [torch.Size([3])] and type(host) is torch.Tensor and host.device.type == "cpu"
    assert as_tensor(torch.ones(2), "mask").device.type == "cpu" and len(moved) == 1


# --------------------------------------------------------------------------- the host half of a device call


def _observed(path: str | None, **call) -> tuple[dict, list, float]:
    """One observed call's record (metrics, exemplars) and advmon's problem count, on ``path``."""
    from .conftest import ListSink

    sink = ListSink()
    with advmon.Monitor("host-half", sinks=[sink], exemplars=6, histograms=True, reward_range=(0.0, 1.0)) as monitor:
        with statistics_path(path):
            monitor.observe(**call)
        errors = monitor.internal_errors
    record = sink.records[-1]
    return record.metrics, record.exemplars, errors


def _host_half_cases():
    """Calls whose [B]-sized work a device leaves to the host: every grouping, slices, reward functions, taps."""
    prompts, rewards, mask = grpo_inputs(6, 4, 12, seed=3)
    rng = np.random.default_rng(3)
    expand = (rewards - 0.5).unsqueeze(-1).expand(mask.shape)
    dense = expand + torch.from_numpy(rng.normal(0, 0.2, mask.shape)).float()
    dense[5, 0] = math.inf
    labels = ["gsm8k" if i % 3 else "math" for i in range(24)]
    functions = {"format": rng.random(24), "judge": np.where(rng.random(24) < 0.2, np.nan, 1.0)}
    ids = torch.arange(24) // 4
    yield "prompt-rows", dict(rewards=rewards, advantages=dense, mask=mask, groups=prompts)
    yield "id-tensor", dict(rewards=rewards, advantages=expand, mask=mask, groups=ids * 10 + 7)
    yield "float-ids", dict(rewards=rewards, advantages=expand[:, 0], groups=(ids * 0.5).float())
    yield "uids-slices-functions", dict(rewards=rewards, advantages=dense, mask=mask, groups=[f"u{i}" for i in ids],
                                        slices=labels, reward_functions=functions, normalization="group_loo_std")
    yield "blocks-tapped-pre-norm", dict(rewards=rewards, advantages=expand, mask=mask, group_size=4,
                                         pre_norm=rewards - 0.25, slices=labels, normalization="gpg")
    yield "no-rewards", dict(advantages=dense, mask=mask, groups=prompts, slices=labels)
    yield "no-groups", dict(rewards=rewards, advantages=expand, mask=mask, slices=labels)


HOST_HALF = list(_host_half_cases())


@pytest.mark.parametrize(("name", "call"), HOST_HALF, ids=[case[0] for case in HOST_HALF])
def test_a_device_calls_record_is_the_cpus(name, call):
    """Its groups, pre_norm, bounds, exemplars and slices are the CPU path's NumPy on the vectors that crossed."""
    on_cpu = _observed(None, **call)
    for path in ("torch", "triton"):
        on_device = _observed(path, **call)
        assert on_device[2] == on_cpu[2] == 0
        assert on_device[0].keys() == on_cpu[0].keys()
        for key, value in on_cpu[0].items():
            assert on_device[0][key] == value or (math.isnan(value) and math.isnan(on_device[0][key])), (path, key)
        assert json_equal(on_device[1], on_cpu[1]), path


def json_equal(a, b) -> bool:
    """Equal, NaN equal to NaN (as a record's JSON reads)."""
    import json

    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_integer_ids_cross_exactly_whatever_their_size():
    """Ids cross as their int64 bits: 2**60 and 2**60 + 1, one float64 apart from nothing, stay two groups."""
    from advmon.stats import group_ids

    big = torch.tensor([2**60, 2**60 + 1, 2**60, -(2**62), 2**60 + 1])
    with statistics_path("torch"):
        ids = group_ids(big, 5).tolist()
    assert ids == group_ids(big, 5).tolist() == [1, 2, 1, 0, 2]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.0])
    metrics, _, _ = _observed("torch", rewards=rewards, groups=big)
    assert metrics["groups/count"] == 3 and metrics["groups/zero_std_count"] == 2


def test_a_failing_host_half_is_one_problem_and_the_record_keeps_its_statistics(monkeypatch):
    import advmon.observation

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(advmon.observation, "_host_groups", broken)
    prompts, rewards, mask = grpo_inputs(6, 4, 12)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics, exemplars, errors = _observed("torch", rewards=rewards, advantages=rewards[:, None], groups=prompts)
    assert errors == 1 and exemplars == [] and metrics["rewards/count"] == 24.0
    assert metrics["advantages/post_norm/count"] == 24.0
    assert any("lost: RuntimeError: boom" in str(w.message) for w in caught)


def test_reward_functions_and_slices_cost_a_device_one_copy_per_function(sink):
    """Their statistics, non-finite counts and the slices' sums are the host's: a float64 copy of each crosses."""
    prompts, rewards, mask = grpo_inputs(16, 8, 64)
    advantages = rewards.unsqueeze(-1).expand(mask.shape)
    functions = {"format": np.random.default_rng(1).random(128), "judge": torch.rand(128, dtype=torch.float64)}
    call = dict(rewards=rewards, advantages=advantages, mask=mask, groups=prompts, reward_functions=functions,
                slices=["gsm8k" if i % 3 else "math" for i in range(128)])
    with advmon.Monitor("functions", sinks=[sink]) as monitor, statistics_path("torch"):
        monitor.observe(**call)  # the row hash's column weights, once per shape
        with Dispatched() as seen:
            monitor.observe(**call)
        assert monitor.internal_errors == 0
    assert not seen.syncs, seen.syncs
    assert len(seen.kernels) == WHOLE_CALL_KERNELS["expand-view"] + len(functions), seen.kernels
    assert sink.records[-1].metrics["slices/math/rewards/count"] == 43.0


@pytest.mark.parametrize("layout", ["expand-view", "unmasked-expand-view", "per-sequence"])
def test_one_value_a_row_without_an_exact_part_crosses_as_its_values(layout, monkeypatch):
    """A batch too large for an exact post_norm part: its rows' values (and row counts) cross for the host's
    row summaries, which make the same exemplars and slices as the CPU's."""
    import advmon.observation

    monkeypatch.setattr(advmon.observation, "EXACT_LIMIT", 0)  # every part sketched, as a large batch's
    monkeypatch.setattr(parts, "EXACT_LIMIT", 0)
    prompts, rewards, mask = grpo_inputs(6, 4, 12, seed=5)
    per_row = (rewards - 0.5) * torch.arange(24.0)
    advantages = {"expand-view": per_row.unsqueeze(-1).expand(mask.shape),
                  "unmasked-expand-view": per_row.unsqueeze(-1).expand(mask.shape), "per-sequence": per_row}[layout]
    call = dict(rewards=rewards, advantages=advantages, mask=None if layout == "unmasked-expand-view" else mask,
                groups=prompts, slices=["a" if i % 2 else "b" for i in range(24)])
    metrics, exemplars, errors = _observed(None, **call)
    on_device = _observed("torch", **call)
    assert errors == on_device[2] == 0
    assert json_equal(on_device[1], exemplars) and exemplars
    for key, value in metrics.items():
        if key.startswith(("slices/", "groups/")):
            assert on_device[0][key] == value or (math.isnan(value) and math.isnan(on_device[0][key])), key
    with advmon.Monitor("rows", sinks=[]) as monitor, statistics_path("torch"):
        with monitor.step(0):
            with Dispatched() as seen:  # the call alone: the host half's CPU sketches read host values
                monitor.observe(**call)
    assert not seen.syncs, seen.syncs

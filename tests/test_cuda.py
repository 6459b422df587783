"""advmon on a CUDA device: exact statistics on both device paths, no sync on the training thread, few kernels.

Skipped without CUDA (CPU tensors cover the same paths in test_device_paths.py and,
through Triton's interpreter, test_triton_kernels.py); ``make bench-gpu`` runs this
file on a lent GPU.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings

import advmon
from advmon import stats
from advmon.stats import parts, transfer
from advmon.stats import statistics_path
from advmon.observation import tensor_part
from advmon.stats import summarize

from .estimators import (
    GAELikeEstimator,
    GDPOLikeEstimator,
    GRPOLikeEstimator,
    OPDLikeEstimator,
    RawRewardLikeEstimator,
    ReinforcePPLikeEstimator,
)
from .reference import assert_stats_close, group_keys, value_stats
from .sketches import assert_same_sketch, general_part
from .test_device_paths import CASES, grpo_inputs
from .test_monitor import check_record, grpo_batch
from .test_stats import LARGE_INPUTS, large_input, offset_arrays

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
PATHS = ["triton", "torch"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("name", "values", "mask"), CASES, ids=[c[0] for c in CASES])
def test_every_case_is_exact_on_cuda(path, name, values, mask):
    with statistics_path(path):
        part = tensor_part(values.cuda(), None if mask is None else mask.cuda())
    part = stats.Part(part.kind, tuple(t.cpu() for t in part.tensors))
    expected = value_stats(values.double().numpy(), None if mask is None else mask.double().numpy())
    assert_stats_close(summarize([part]), expected, exact_percentiles=False)
    reference = values.float() if values.dtype == torch.bfloat16 else values
    assert_same_sketch(part, general_part(reference, mask if mask is not None else torch.ones(values.shape)))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", LARGE_INPUTS)
def test_large_inputs_hold_the_documented_tolerances_on_cuda(path, name):
    """test_stats' large inputs (an offset of 1000 with a spread of 1e-3, outliers, a heavy tail) with the GPU's
    reductions: the std within rounding of itself, percentiles within the 0.8% promise."""
    x, valid = large_input(name)
    with statistics_path(path):
        part = tensor_part(torch.from_numpy(x).cuda(), torch.from_numpy(valid).cuda())
    part = stats.Part(part.kind, tuple(t.cpu() for t in part.tensors))
    assert_stats_close(summarize([part]), value_stats(x, valid), exact_percentiles=False)


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=40, deadline=None)
@given(case=offset_arrays())
def test_sketched_moments_hold_on_their_own_scale_on_cuda_whatever_the_offset(path, case):
    x, valid = case
    with pytest.MonkeyPatch.context() as patch, statistics_path(path):
        patch.setattr(parts, "EXACT_LIMIT", 0)  # the device's sketch, at any size
        part = stats.dense_part(torch.from_numpy(x).cuda(), torch.from_numpy(valid).cuda())
    part = stats.Part(part.kind, tuple(t.cpu() for t in part.tensors))
    assert part.kind == "sketch"
    assert_stats_close(summarize([part]), value_stats(x, valid), exact_percentiles=False)


class TransferCounter:
    """Makes every synchronizing CUDA call an error and counts the records' transfers started (none may sync)."""

    def __init__(self, monkeypatch):
        self.transfers = 0
        original = transfer.start_transfer

        def counted(tensors):
            self.transfers += any(t.device.type == "cuda" for t in tensors)
            return original(tensors)

        monkeypatch.setattr(transfer, "start_transfer", counted)
        monkeypatch.setattr(advmon.assembly, "start_transfer", counted)

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(0)


def sync_free_grpo(prompt_ids, rewards, mask):
    """A GRPO estimator without syncs of its own (contiguous groups of 8): the test measures advmon's."""
    grouped = rewards.view(-1, 8)
    advantages = (grouped - grouped.mean(-1, keepdim=True)) / (grouped.std(-1, keepdim=True) + 1e-6)
    return advantages.reshape(-1, 1).expand(mask.shape)


def sync_free_dense(prompt_ids, rewards, mask):
    advantages = rewards.unsqueeze(-1) * mask + 0.01 * torch.randn(mask.shape, device=mask.device)
    mean = (advantages * mask).sum() / mask.sum()
    return (advantages - mean) * mask


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("estimator", [sync_free_grpo, sync_free_dense], ids=["grpo-expand-view", "dense"])
def test_a_watched_call_never_syncs_the_training_thread_and_a_step_crosses_once(path, estimator, sink, monkeypatch):
    """The record's one copy is non_blocking into pinned memory; the host half waits for its event, off the
    training thread (sync debug mode "error" around the calls: any sync on the training thread raises)."""
    prompts, rewards, mask = (t.cuda() for t in grpo_inputs(64, 8, 512))
    with advmon.Monitor("syncs", sinks=[sink]) as monitor, statistics_path(path):
        watched = monitor.watch(estimator)
        watched(prompts, rewards, mask)  # compiles the kernels, outside the count
        monitor.wait()
        with TransferCounter(monkeypatch) as counter:
            advantages = watched(prompts, rewards, mask)
        assert counter.transfers == 1
        with TransferCounter(monkeypatch) as counter:
            with monitor.step(10):
                watched(prompts[:256], rewards[:256], mask[:256])
                watched(prompts[256:], rewards[256:], mask[256:])
        assert counter.transfers == 1
        assert monitor.internal_errors == 0
    assert [r.step for r in sink.records][-2:] == [1, 10]
    check_record(sink.records[-2].metrics, rewards=rewards.cpu(), advantages=advantages.cpu(), mask=mask.cpu(),
                 keys=group_keys(prompts.cpu().numpy()))


def _extras(estimator, rewards: torch.Tensor, mask: torch.Tensor) -> dict:
    g = torch.Generator().manual_seed(3)
    noise = lambda: torch.randn(mask.shape, generator=g).cuda()  # noqa: E731
    return {
        GDPOLikeEstimator: lambda: {"repeated_batch": {"reward_a": rewards.cuda(), "reward_b": (1 - rewards).cuda()}},
        ReinforcePPLikeEstimator: lambda: {"logprobs_policy": noise(), "logprobs_reference": noise()},
        GAELikeEstimator: lambda: {"values": noise()},
        OPDLikeEstimator: lambda: {"teacher_logprobs": noise(), "prev_logprobs": noise()},
    }.get(estimator, dict)()


@pytest.mark.parametrize(
    "estimator", [GRPOLikeEstimator, GDPOLikeEstimator, ReinforcePPLikeEstimator, RawRewardLikeEstimator,
                  GAELikeEstimator, OPDLikeEstimator],
)
def test_the_estimators_on_cuda(estimator, sink):
    prompts, rewards, mask = grpo_batch(seed=13)
    with advmon.Monitor("estimators", sinks=[sink]) as monitor:
        result = advmon.instrument(estimator(), monitor).compute_advantage(
            prompts.cuda(), rewards.cuda(), mask.cuda(), **_extras(estimator, rewards, mask)
        )
        assert monitor.internal_errors == 0
    advantages = (result[0] if isinstance(result, tuple) else result).cpu()
    check_record(sink.records[-1].metrics, rewards=rewards, advantages=advantages, mask=mask,
                 keys=group_keys(prompts.numpy()))


# The ceilings follow from what each path asks of the device. The torch path dispatches at most
# TORCH_PATH_OPS kernel ops (tests/test_device_paths.py's bound, counted on the CPU), and kernels are not
# ops: a reduction over a large tensor, histc or cuBLAS's dot may launch two, so two per op are allowed
# (an H200 with torch 2.11 launched 79 for its 58 ops, 2026-12-04).
TORCH_PATH_OPS, KERNELS_PER_OP = 60, 2


def most_kernels(path: str) -> int:
    """The torch path's ceiling; the Triton path runs no torch op and launches each kernel of
    advmon.stats.triton_sketch once (the range, its reduction, moments and bins, theirs)."""
    if path == "torch":
        return TORCH_PATH_OPS * KERNELS_PER_OP
    from advmon.stats import triton_sketch  # imports triton: only where this test runs

    return sum(name.endswith("_kernel") for name in vars(triton_sketch))


@pytest.mark.parametrize("path", PATHS)
def test_kernels_per_statistics_call_do_not_grow_with_the_data(path):
    most = most_kernels(path)
    launched = []
    for rows, cols in ((1024, 1024), (4096, 4096)):
        values = torch.randn(rows, cols, device="cuda")
        values[0, 0] = math.nan
        mask = (torch.arange(cols, device="cuda") < torch.randint(0, cols + 1, (rows, 1), device="cuda")).float()
        with statistics_path(path):
            tensor_part(values, mask)  # compiles
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                tensor_part(values, mask)
                torch.cuda.synchronize()
        launched.append(len([e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA]))
    assert launched[0] == launched[1] <= most, launched


@pytest.mark.parametrize("path", PATHS)
def test_deterministic_algorithms_are_no_obstacle(path, sink):
    """Training runs under torch.use_deterministic_algorithms(True) keep their statistics."""
    prompts, rewards, mask = (t.cuda() for t in grpo_inputs(64, 8, 512))
    dense = rewards.unsqueeze(-1) * mask + 0.01 * torch.randn(mask.shape, device="cuda")
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with advmon.Monitor("deterministic", sinks=[sink]) as monitor, statistics_path(path):
            monitor.observe(rewards=rewards, advantages=dense, mask=mask, groups=prompts)
            assert monitor.internal_errors == 0
    finally:
        torch.use_deterministic_algorithms(previous)
    assert_stats_close(sink.records[-1].metrics, value_stats(dense.cpu().numpy(), mask.cpu().numpy()),
                       "advantages/post_norm/", exact_percentiles=False)


@pytest.mark.parametrize("path", PATHS)
def test_a_record_copied_under_a_busy_side_stream_is_read_after_its_copy(path, sink):
    """Issue 40: the event must mark the stream the copy ran on. A side stream kept busy before the call makes a
    copy queued there end long after the default stream's work: an event on the default stream would let the host
    read the pinned buffer first (uninitialised memory, or the previous record's bytes)."""
    prompts, rewards, mask = (t.cuda() for t in grpo_inputs(64, 8, 512))
    side = torch.cuda.Stream()
    with advmon.Monitor("side-stream", sinks=[sink]) as monitor, statistics_path(path):
        watched = monitor.watch(sync_free_dense)
        for step in range(3):
            with torch.cuda.stream(side):
                torch.cuda._sleep(200_000_000)  # ~0.1 s of one warp spinning, queued before the call's work
                with monitor.step(step):
                    advantages = watched(prompts, rewards, mask)
            side.synchronize()
        monitor.wait()
        assert monitor.internal_errors == 0
    assert [r.step for r in sink.records] == [0, 1, 2]
    assert_stats_close(sink.records[-1].metrics, value_stats(advantages.cpu().numpy(), mask.cpu().numpy()),
                       "advantages/post_norm/", exact_percentiles=False)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_on_another_device_than_the_current_one_cross_on_their_own_stream(sink):
    """A trainer that moves tensors with .to(f"cuda:{rank}") and never calls set_device: cuda:1's tensors while
    cuda:0 is current. The record's copy runs on cuda:1's stream, and so must its event."""
    prompts, rewards, mask = (t.to("cuda:1") for t in grpo_inputs(64, 8, 512))
    torch.cuda.set_device(0)
    with advmon.Monitor("other-device", sinks=[sink]) as monitor:
        watched = monitor.watch(sync_free_dense)
        with torch.cuda.device(1):
            torch.cuda._sleep(200_000_000)  # cuda:1's stream busy: its copy ends late
        advantages = watched(prompts, rewards, mask)
        monitor.wait()
        assert monitor.internal_errors == 0
    assert_stats_close(sink.records[-1].metrics, value_stats(advantages.cpu().numpy(), mask.cpu().numpy()),
                       "advantages/post_norm/", exact_percentiles=False)

"""Records: exact keys, every value against NumPy, steps, problems and the host-transfer budget."""

from __future__ import annotations

import math
import sys
import warnings

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

import advmon
from advmon.stats import cpu_sketch, parts, transfer

from .estimators import (
    GAELikeEstimator,
    GDPOLikeEstimator,
    GRPOLikeEstimator,
    OPDLikeEstimator,
    RawRewardLikeEstimator,
    ReinforcePPLikeEstimator,
    compute_grpo_outcome_advantage,
    uid_index,
)
from .reference import (
    REWARD_KEYS,
    VALUE_KEYS,
    assert_stats_close,
    derived_pre_norm,
    group_keys,
    group_stats,
    value_stats,
)

GROUP_KEYS = ("count", "singleton_count", "comparable_count", "zero_std_count", "zero_std_fraction", "nonfinite_count", "max_size",
              "bound_size")


def grpo_batch(groups=6, size=8, tokens=20, seed=0, nan_rewards=0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 1000, (groups, 5), generator=g).repeat_interleave(size, dim=0)
    rewards = torch.randint(0, 2, (groups * size,), generator=g).float()
    rewards[: size * 2] = 1.0  # some zero-std groups
    rewards[size * 2 : size * 3] = torch.tensor([0.0] + [0.3] * (size - 1))  # float32 cancellation
    if nan_rewards:
        rewards[torch.randperm(groups * size, generator=g)[:nan_rewards]] = math.nan
    lengths = torch.randint(1, tokens + 1, (groups * size,), generator=g)
    mask = (torch.arange(tokens) < lengths.unsqueeze(-1)).float()
    return prompts, rewards, mask


def run_grpo_steps(monitor, steps, nan_at=()):
    """A GRPO-like estimator watched by ``monitor`` over ``steps``, with NaN rewards at ``nan_at``."""
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    for step in steps:
        prompts, rewards, mask = grpo_batch(seed=step, nan_rewards=2 if step in nan_at else 0)
        with monitor.step(step):
            estimator.compute_advantage(prompts, rewards, mask)


def check_record(metrics, *, rewards, advantages, mask, keys, reward_range=None, per_sequence=False):
    """Every key of a record against an independent NumPy computation."""
    r = rewards.numpy().astype(np.float64)
    assert_stats_close(metrics, {k: v for k, v in value_stats(r).items() if k in REWARD_KEYS}, "rewards/")
    valid = None if per_sequence or mask is None else mask.numpy()
    assert_stats_close(metrics, value_stats(advantages.numpy(), valid), "advantages/post_norm/")
    assert_stats_close(metrics, value_stats(derived_pre_norm(r, keys)), "advantages/pre_norm/")
    expected_groups = group_stats(r, keys, reward_range) if keys is not None else {}
    for key, value in expected_groups.items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key


def test_record_has_exactly_the_documented_keys(monitor, sink):
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    estimator.compute_advantage(*grpo_batch())
    record = sink.records[-1]
    expected = (
        {f"rewards/{k}" for k in REWARD_KEYS}
        | {f"advantages/{stage}/{k}" for stage in ("pre_norm", "post_norm") for k in VALUE_KEYS}
        | {f"groups/{k}" for k in GROUP_KEYS}
        | {"advantages/bound_ratio", "advmon/internal_errors", "advmon/sink_errors/list", "advmon/dropped_records/list"}
    )
    assert set(record.metrics) == expected
    assert (record.run, record.step, record.pre_norm_source) == ("test-run", 0, "derived")
    assert record.estimator == "tests.estimators.GRPOLikeEstimator.compute_advantage"
    assert monitor.last_metrics == record.metrics


@pytest.mark.parametrize("nan_rewards", [0, 3])
def test_grpo_record_matches_numpy(monitor, sink, nan_rewards):
    prompts, rewards, mask = grpo_batch(nan_rewards=nan_rewards)
    advantages = advmon.instrument(GRPOLikeEstimator(), monitor).compute_advantage(prompts, rewards, mask)
    metrics = sink.records[-1].metrics
    check_record(metrics, rewards=rewards, advantages=advantages, mask=mask, keys=group_keys(prompts.numpy()))
    if nan_rewards:
        assert metrics["rewards/nan_count"] == nan_rewards
        assert metrics["groups/nonfinite_count"] >= 1
        assert metrics["advantages/post_norm/nan_count"] > 0
    assert metrics["advantages/post_norm/min"] < -1000  # the cancellation outlier is seen


def test_reward_range_adds_all_low_and_all_high(sink):
    prompts, rewards, mask = grpo_batch()
    rewards[8:16] = 0.0
    with advmon.Monitor("ranged", sinks=[sink], reward_range=(0.0, 1.0)) as monitor:
        advmon.instrument(GRPOLikeEstimator(), monitor).compute_advantage(prompts, rewards, mask)
    metrics = sink.records[-1].metrics
    expected = group_stats(rewards.numpy(), group_keys(prompts.numpy()), (0.0, 1.0))
    assert metrics["groups/all_low_fraction"] == pytest.approx(expected["groups/all_low_fraction"])
    assert metrics["groups/all_high_fraction"] == pytest.approx(expected["groups/all_high_fraction"])
    assert metrics["groups/all_low_fraction"] > 0 and metrics["groups/all_high_fraction"] > 0


def test_groups_of_two_with_leave_one_out(monitor, sink):
    prompts, rewards, mask = grpo_batch(groups=10, size=2, seed=2)
    advantages = advmon.instrument(GRPOLikeEstimator(), monitor).compute_advantage(prompts, rewards, mask)
    # LOO with two samples: std is always 0, nothing is normalized.
    assert torch.equal(advantages[:, 0], rewards - rewards.view(-1, 2).flip(1).reshape(-1))
    check_record(sink.records[-1].metrics, rewards=rewards, advantages=advantages, mask=mask, keys=group_keys(prompts.numpy()))


@pytest.mark.parametrize(
    ("groups_of", "options"),
    [
        (lambda p: p, {}),  # 2-D prompt ids
        (lambda p: torch.arange(len(p)) // 4, {}),  # 1-D tensor
        (lambda p: uid_index(len(p), 4), {}),  # numpy uid strings
        (lambda p: [f"u{i // 4}" for i in range(len(p))], {}),  # list of hashables
        (lambda p: None, {"group_size": 4}),
    ],
    ids=["2d-prompt-ids", "1d-ids", "uid-strings", "list", "group-size"],
)
def test_every_kind_of_group_information(groups_of, options, monitor, sink):
    prompts, rewards, mask = grpo_batch(groups=8, size=4, seed=5, nan_rewards=2)
    groups = groups_of(prompts)

    @monitor.watch(**options)
    def estimator(prompt_ids, rewards, mask):
        return (rewards - rewards.nanmean()).unsqueeze(-1).expand(mask.shape)

    advantages = estimator(groups, rewards, mask)
    keys = [i // 4 for i in range(len(rewards))]
    check_record(sink.records[-1].metrics, rewards=rewards, advantages=advantages, mask=mask, keys=keys)


def test_identical_rows_anywhere_form_one_group(monitor, sink):
    prompts = torch.tensor([[1, 2], [3, 4], [1, 2], [3, 4], [5, 6]])
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.2])
    monitor.observe(rewards=rewards, advantages=rewards, groups=prompts)
    metrics = sink.records[-1].metrics
    assert metrics["groups/count"] == 3 and metrics["groups/singleton_count"] == 1
    assert metrics["groups/zero_std_count"] == 1 and metrics["groups/zero_std_fraction"] == 0.5


def test_no_groups_means_the_batch_is_the_baseline(monitor, sink):
    rewards = torch.tensor([1.0, 2.0, math.nan, 6.0])
    monitor.observe(rewards=rewards, advantages=rewards)
    metrics = sink.records[-1].metrics
    assert metrics["groups/count"] == 0 and math.isnan(metrics["groups/zero_std_fraction"])
    assert metrics["advantages/pre_norm/max"] == 3.0 and metrics["advantages/pre_norm/nan_count"] == 1


def test_verl_function_with_argument_names_and_uid_index(monitor, sink):
    watched = monitor.watch(rewards="token_level_rewards", mask="response_mask", groups="index")(
        compute_grpo_outcome_advantage
    )
    _, rewards, mask = grpo_batch(groups=5, size=4, seed=7)
    token_rewards = torch.zeros(mask.shape)
    token_rewards[torch.arange(len(rewards)), mask.sum(1).long() - 1] = rewards
    index = uid_index(len(rewards), 4)
    advantages, returns = watched(token_rewards, mask, index)
    assert returns is advantages
    check_record(
        sink.records[-1].metrics, rewards=rewards, advantages=advantages, mask=mask, keys=group_keys(index)
    )


@pytest.mark.parametrize(
    ("estimator", "extra"),
    [
        (ReinforcePPLikeEstimator(), lambda m: {"logprobs_policy": torch.randn(m.shape), "logprobs_reference": torch.randn(m.shape)}),
        (RawRewardLikeEstimator(), lambda m: {}),
        (GAELikeEstimator(), lambda m: {"values": torch.randn(m.shape)}),
        (OPDLikeEstimator(), lambda m: {"teacher_logprobs": torch.randn(m.shape), "prev_logprobs": torch.randn(m.shape)}),
    ],
    ids=["reinforce++", "raw-reward", "gae", "opd"],
)
def test_other_estimators_match_numpy(estimator, extra, monitor, sink):
    prompts, rewards, mask = grpo_batch(seed=11)
    instrumented = advmon.instrument(estimator, monitor)
    result = instrumented.compute_advantage(prompts, rewards, mask, **extra(mask))
    advantages = result[0] if isinstance(result, tuple) else result
    check_record(sink.records[-1].metrics, rewards=rewards, advantages=advantages, mask=mask, keys=group_keys(prompts.numpy()))
    assert monitor.internal_errors == 0


def test_gdpo_called_positionally_with_rewards_none(monitor, sink):
    prompts, rewards, mask = grpo_batch(seed=12)
    batch = {"reward1": rewards, "reward2": torch.rand(len(rewards))}
    estimator = advmon.instrument(GDPOLikeEstimator(), monitor)
    with pytest.warns(advmon.AdvmonWarning, match="no rewards"):
        advantages = estimator.compute_advantage(prompts, None, mask, batch)
    metrics = sink.records[-1].metrics
    assert_stats_close(metrics, value_stats(advantages.numpy(), mask.numpy()), "advantages/post_norm/")
    assert math.isnan(metrics["rewards/mean"]) and sink.records[-1].pre_norm_source is None
    assert metrics["groups/count"] == 6 and math.isnan(metrics["groups/zero_std_fraction"])
    assert metrics["advmon/internal_errors"] == 1
    # Saying the estimator has no rewards input makes it a normal call.
    quiet = advmon.instrument(GDPOLikeEstimator(), monitor, rewards=None)
    quiet.compute_advantage(prompts, None, mask, batch)
    assert sink.records[-1].metrics["advmon/internal_errors"] == 1


def test_chunked_step_equals_one_call_on_the_whole_batch(sink):
    prompts, rewards, mask = grpo_batch(groups=12, size=8, seed=21, nan_rewards=2)
    whole_sink, chunk_sink = [], []
    for target, chunks in ((whole_sink, [slice(None)]), (chunk_sink, [slice(0, 40), slice(40, 72), slice(72, None)])):
        class Collect(advmon.Sink):
            synchronous = True

            def write(self, record, target=target):
                target.append(record)

        with advmon.Monitor("chunks", sinks=[Collect()]) as monitor:
            estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
            with monitor.step(7):
                for chunk in chunks:
                    estimator.compute_advantage(prompts[chunk], rewards[chunk], mask[chunk])
    (whole,), (chunked,) = whole_sink, chunk_sink
    assert chunked.step == 7
    for key, value in whole.metrics.items():
        assert chunked.metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12, nan_ok=True), key


def test_chunked_sketched_step_equals_one_call(monkeypatch):
    monkeypatch.setattr(parts, "EXACT_LIMIT", 0)
    rng = np.random.default_rng(1)
    adv = torch.from_numpy(rng.standard_normal((64, 50)).astype(np.float32))
    mask = torch.from_numpy((rng.random((64, 50)) < 0.8).astype(np.float32))
    records = []
    for splits in ([64], [10, 30, 24]):
        monitor = advmon.Monitor("s", sinks=[])
        with monitor.step(0):
            start = 0
            for size in splits:
                monitor.observe(advantages=adv[start : start + size], mask=mask[start : start + size])
                start += size
        records.append(monitor.last_metrics)
    for key in ("p01", "p10", "p50", "p90", "p99", "min", "max", "count"):
        assert records[0][f"advantages/post_norm/{key}"] == records[1][f"advantages/post_norm/{key}"]


def test_steps_auto_increment_and_explicit_steps(monitor, sink):
    rewards = torch.ones(4)
    monitor.observe(rewards=rewards)
    monitor.observe(rewards=rewards)
    with monitor.step(10):
        pass  # no call: no record
    with monitor.step(20):
        monitor.observe(rewards=rewards)
        monitor.observe(rewards=rewards)
    monitor.observe(rewards=rewards)
    assert [r.step for r in sink.records] == [0, 1, 20, 21]
    assert sink.records[2].metrics["rewards/count"] == 8


def test_step_misuse_is_a_clear_error(monitor):
    with pytest.raises(advmon.AdvmonConfigError, match="non-negative int"):
        with monitor.step(-1):
            pass
    with pytest.raises(advmon.AdvmonError, match="do not nest"):
        with monitor.step(1):
            with monitor.step(2):
                pass


def test_a_failing_chunk_keeps_the_steps_other_calls(monitor, sink):
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    prompts, rewards, mask = grpo_batch()
    with pytest.raises(ZeroDivisionError):
        with monitor.step(3):
            estimator.compute_advantage(prompts, rewards, mask)
            raise ZeroDivisionError
    assert [r.step for r in sink.records] == [3]


BAD_INPUTS = {
    "length-mismatch": (lambda r, m: r[:-1], "length_mismatch"),
    "non-tensor-output": (lambda r, m: "advantages", "output"),
    "mask-of-another-shape": (lambda r, m: r.unsqueeze(-1).expand(m.shape[0], m.shape[1] + 1), "mask_shape"),
    "empty-batch": (None, "empty_batch"),
    "all-zero-mask": (None, "empty_mask"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_inputs_warn_once_count_and_record_what_they_can(case, sink):
    make_output, kind = BAD_INPUTS[case]
    prompts, rewards, mask = grpo_batch(groups=3, size=4)
    if case == "empty-batch":
        prompts, rewards, mask = prompts[:0], rewards[:0], mask[:0]
    if case == "all-zero-mask":
        mask = torch.zeros_like(mask)
    monitor = advmon.Monitor("bad", sinks=[sink])

    @monitor.watch
    def estimator(prompt_ids, rewards, mask):
        return make_output(rewards, mask) if make_output else rewards.unsqueeze(-1).expand(mask.shape)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            estimator(prompts, rewards, mask)
        monitor.wait()  # what the host half found is said on this thread, at its next call or wait
    ours = [w for w in caught if issubclass(w.category, advmon.AdvmonWarning)]
    assert len(ours) == 1 and kind in str(ours[0].message)
    assert monitor.internal_errors == 3
    assert sink.records[-1].metrics["advmon/internal_errors"] == 3
    assert sink.records[-1].metrics["rewards/count"] == len(rewards)  # what could be recorded was

    strict = advmon.Monitor("strict", sinks=[], strict=True)
    with pytest.raises(advmon.AdvmonError):
        strict.watch(estimator.__wrapped__)(prompts, rewards, mask)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.float64])
def test_low_precision_and_integer_inputs_are_summarised_exactly(dtype, monitor, sink):
    prompts, rewards, mask = grpo_batch(seed=9)
    rewards = (rewards * 3).to(dtype)
    mask_typed = mask.to(torch.int32)

    @monitor.watch
    def estimator(prompt_ids, rewards, mask):
        return (rewards - 1).unsqueeze(-1).expand(mask.shape)

    advantages = estimator(prompts, rewards, mask_typed)
    check_record(
        sink.records[-1].metrics,
        rewards=rewards.to(torch.float64),
        advantages=advantages.to(torch.float64),
        mask=mask,
        keys=group_keys(prompts.numpy()),
    )
    assert monitor.internal_errors == 0


def test_numpy_inputs(monitor, sink):
    prompts, rewards, mask = grpo_batch(seed=10)
    monitor.observe(
        rewards=rewards.numpy(), advantages=rewards.unsqueeze(-1).expand(mask.shape).numpy(), mask=mask.numpy().astype(bool)
    )
    expected = value_stats(rewards.unsqueeze(-1).expand(mask.shape).numpy(), mask.numpy())
    assert_stats_close(sink.records[-1].metrics, expected, "advantages/post_norm/")
    assert monitor.internal_errors == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_tensors(monitor, sink):
    prompts, rewards, mask = grpo_batch(seed=13)
    advantages = advmon.instrument(GRPOLikeEstimator(), monitor).compute_advantage(
        prompts.cuda(), rewards.cuda(), mask.cuda()
    )
    check_record(sink.records[-1].metrics, rewards=rewards, advantages=advantages.cpu(), mask=mask, keys=group_keys(prompts.numpy()))


class HostTransfers(TorchFunctionMode):
    """Counts the calls that move tensor data to Python/NumPy.

    The drill-down's CPU-only helpers (``_host_*`` in advmon.stats.exemplars, advmon.stats.slices, advmon.stats.rows
    and advmon.stats.groups, and the ``host_*`` functions they call, which run only where the tensors are on the
    host already) view those tensors as NumPy arrays in place: not a transfer, so not counted.
    """

    NAMES = {"item", "tolist", "cpu", "numpy"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES and not sys._getframe(1).f_code.co_name.startswith(("_host_", "host_")):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", ["exact", "cpu-sketch", "device-sketch"])
def test_one_watched_call_crosses_to_the_host_once(path, monitor, sink, monkeypatch):
    if path != "exact":
        monkeypatch.setattr(parts, "EXACT_LIMIT", 0)
    if path == "cpu-sketch":
        # The prefix-mask fast path runs on CPU tensors only and reads a few of their
        # values to choose its blocks (no transfer: they are on the host already).
        monkeypatch.setattr(cpu_sketch, "_sketch_prefix", lambda values, valid, extremes=None: None)
    if path == "device-sketch":  # what any device runs (test_device_paths.py checks it never syncs)
        monkeypatch.setenv("ADVMON_STATISTICS_PATH", "torch")
    # The record's one crossing is started on the training thread and read where the host half runs.
    reads = []
    read = transfer.Transfer.arrays
    monkeypatch.setattr(transfer.Transfer, "arrays", lambda self: reads.append(1) or read(self))
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    prompts, rewards, mask = grpo_batch(nan_rewards=1)
    unwatched = GRPOLikeEstimator()
    with HostTransfers() as baseline:
        unwatched.compute_advantage(prompts, rewards, mask)
    with HostTransfers() as watched:
        estimator.compute_advantage(prompts, rewards, mask)
    assert len(watched.calls) == len(baseline.calls), watched.calls  # none on the training thread
    with HostTransfers() as chunked:
        with monitor.step(5):
            estimator.compute_advantage(prompts[:24], rewards[:24], mask[:24])
            estimator.compute_advantage(prompts[24:], rewards[24:], mask[24:])
    assert len(chunked.calls) == 2 * len(baseline.calls), chunked.calls
    assert len(sink.records) == 2
    assert len(reads) == 2  # one crossing per record, the two chunks of step 5 in one


@pytest.mark.parametrize("synchronous", [True, False])
def test_a_failing_sink_warns_once_and_training_goes_on(sink, synchronous):
    class Broken(advmon.Sink):
        name = "broken"

        def write(self, record):
            raise ConnectionError("backend down")

    Broken.synchronous = synchronous
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = advmon.Monitor("sinks", sinks=[Broken(), sink], retries=1)
        for _ in range(3):
            monitor.observe(rewards=torch.ones(3))
        monitor.flush()
        monitor.observe(rewards=torch.ones(3))
        monitor.close()
    ours = [str(w.message) for w in caught if issubclass(w.category, advmon.AdvmonWarning)]
    assert len([m for m in ours if "backend down" in m]) == 1
    assert len(sink.records) == 4
    assert sink.records[-1].metrics["advmon/sink_errors/broken"] == 3
    assert sink.records[-1].metrics["advmon/sink_errors/list"] == 0
    assert sink.records[-1].metrics["advmon/internal_errors"] == 0  # a sink failure is not advmon's


def test_closed_monitor_lets_calls_through(sink):
    monitor = advmon.Monitor("closed", sinks=[sink])
    watched = monitor.watch(lambda prompt_ids, rewards, mask: rewards)
    monitor.close()
    monitor.close()
    assert sink.closed
    with pytest.warns(advmon.AdvmonWarning, match="closed"):
        assert watched(None, torch.ones(2), None).tolist() == [1.0, 1.0]
    assert sink.records == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"run": ""}, "non-empty"),
        ({"run": "a/b"}, "path separators"),
        ({"reward_range": (1, 0)}, "lo < hi"),
        ({"reward_range": "x"}, "reward_range"),
        ({"sinks": [object()]}, "no write"),
        ({"sinks": "jsonl"}, "list of sink"),
    ],
)
def test_bad_configuration_is_a_clear_error(kwargs, message):
    with pytest.raises(advmon.AdvmonConfigError, match=message):
        advmon.Monitor(**kwargs)


def test_default_sink_writes_advmon_runs_jsonl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with advmon.Monitor() as monitor:
        monitor.observe(rewards=torch.tensor([1.0, math.nan]))
    (path,) = (tmp_path / "advmon-runs").iterdir()
    assert path.name == f"{monitor.run}.jsonl" and monitor.run.startswith("run-")
    (record,) = advmon.read_jsonl(path)
    assert record.metrics["rewards/nan_count"] == 1 and math.isnan(record.metrics["rewards/std"]) is False
    assert '"rewards/min": 1.0' in path.read_text() and "NaN" not in path.read_text()


def test_step_source_aggregates_calls_of_one_training_step(sink):
    class Controller:  # like NeMo-RL's single controller: chunks arrive one call at a time
        train_steps = 0

    controller = Controller()
    prompts, rewards, mask = grpo_batch(groups=4, size=4)
    monitor = advmon.Monitor("sc", sinks=[sink], step_source=lambda: controller.train_steps)
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    for step in range(3):
        controller.train_steps = step
        estimator.compute_advantage(prompts[:8], rewards[:8], mask[:8])
        estimator.compute_advantage(prompts[8:], rewards[8:], mask[8:])
    assert [r.step for r in sink.records] == [0, 1]  # step 2 is still collecting
    monitor.close()
    assert [r.step for r in sink.records] == [0, 1, 2]
    assert all(r.metrics["rewards/count"] == 16 for r in sink.records)
    with pytest.raises(advmon.AdvmonConfigError, match="callable"):
        advmon.Monitor("x", sinks=[], step_source=3)


def test_observe_records_the_rest_when_pre_norm_is_unusable(monitor, sink):
    with pytest.warns(advmon.AdvmonWarning, match="mask of shape"):
        monitor.observe(rewards=torch.ones(4), pre_norm=torch.ones(4, 3), mask=torch.ones(4, 2))
    metrics = sink.records[-1].metrics
    assert metrics["rewards/count"] == 4 and monitor.internal_errors == 1

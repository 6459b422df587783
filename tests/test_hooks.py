"""The decorator and instrumentation layer: wrap any estimator without changing it."""

from __future__ import annotations

import gc
import inspect
import weakref

import numpy as np
import pytest
import torch

import advmon

from .estimators import GRPOLikeEstimator, OPDLikeEstimator, ResultEstimator
from .reference import value_stats


def make_batch(groups=4, size=4, tokens=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, 100, (groups, 3), generator=g).repeat_interleave(size, dim=0)
    rewards = torch.randint(0, 2, (groups * size,), generator=g).float()
    lengths = torch.randint(1, tokens + 1, (groups * size,), generator=g)
    mask = (torch.arange(tokens) < lengths.unsqueeze(-1)).float()
    return prompts, rewards, mask


def centered(prompt_ids, rewards, mask):
    """A tiny estimator: batch-centered rewards, expanded."""
    return (rewards - rewards.mean()).unsqueeze(-1).expand(mask.shape)


def test_decorator_keeps_name_doc_and_signature(monitor):
    watched = monitor.watch(centered)
    assert watched.__name__ == "centered"
    assert watched.__doc__ == centered.__doc__
    assert inspect.signature(watched) == inspect.signature(centered)
    assert watched.__wrapped__ is centered


def test_bare_and_configured_decorator_forms(monitor, sink):
    @monitor.watch
    def bare(prompt_ids, rewards, mask):
        return rewards

    @monitor.watch(rewards="r", mask="m", groups="g")
    def configured(g, r, m):
        return r

    _, rewards, mask = make_batch()
    bare(None, rewards, mask)
    configured(None, rewards, mask)
    assert [r.metrics["rewards/count"] for r in sink.records] == [16.0, 16.0]


def test_positional_and_keyword_calls_give_the_same_record(monitor, sink):
    watched = monitor.watch(centered)
    prompts, rewards, mask = make_batch()
    watched(prompts, rewards, mask)
    watched(mask=mask, rewards=rewards, prompt_ids=prompts)
    watched(prompts, mask=mask, rewards=rewards)
    first, *others = [r.metrics for r in sink.records]
    for other in others:
        assert same_metrics(first, other)


def same_metrics(a, b):
    return a.keys() == b.keys() and all((np.isnan(a[k]) and np.isnan(b[k])) or a[k] == b[k] for k in a)


def test_returned_object_is_the_same_and_inputs_are_unchanged(monitor):
    prompts, rewards, mask = make_batch()
    before = (prompts.clone(), rewards.clone(), mask.clone())
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    unwatched = GRPOLikeEstimator().compute_advantage(prompts, rewards, mask)
    result = estimator.compute_advantage(prompts, rewards, mask)
    assert result.stride(1) == 0  # still the estimator's zero-stride expand view
    assert torch.equal(result, unwatched)
    for tensor, copy in zip((prompts, rewards, mask), before):
        assert torch.equal(tensor, copy)
    sentinel = object()

    @monitor.watch
    def returns_sentinel(prompt_ids, rewards, mask):
        return sentinel

    with pytest.warns(advmon.AdvmonWarning, match="expected a tensor"):
        assert returns_sentinel(prompts, rewards, mask) is sentinel


def test_exceptions_propagate_unchanged_and_record_nothing(monitor, sink):
    class EstimatorFailure(RuntimeError):
        pass

    error = EstimatorFailure("boom")

    @monitor.watch
    def failing(prompt_ids, rewards, mask):
        advmon.tap("pre_norm", rewards)
        raise error

    prompts, rewards, mask = make_batch()
    with pytest.raises(EstimatorFailure) as caught:
        failing(prompts, rewards, mask)
    assert caught.value is error
    with pytest.raises(TypeError):  # a bad call fails as it would unwatched
        failing(prompts)
    assert sink.records == [] and monitor.internal_errors == 0


def test_instrument_instance_class_and_twice(monitor, sink):
    prompts, rewards, mask = make_batch()
    estimator = GRPOLikeEstimator()
    assert advmon.instrument(estimator, monitor) is estimator
    wrapped = estimator.compute_advantage
    advmon.instrument(estimator, monitor)
    assert estimator.compute_advantage is wrapped
    estimator.compute_advantage(prompts, rewards, mask)
    assert len(sink.records) == 1

    class Local(GRPOLikeEstimator):
        pass

    advmon.instrument(Local, monitor)
    advmon.instrument(Local, monitor)
    instance = advmon.instrument(Local(), monitor)  # already wrapped through the class
    instance.compute_advantage(prompt_ids=prompts, rewards=rewards, mask=mask)
    assert len(sink.records) == 2
    assert sink.records[-1].estimator.endswith("GRPOLikeEstimator.compute_advantage")


def test_instrument_static_and_class_methods(monitor, sink):
    class Static:
        @staticmethod
        def compute_advantage(prompt_ids, rewards, mask):
            return rewards

        @classmethod
        def estimate(cls, prompt_ids, rewards, mask):
            return rewards

    advmon.instrument(Static, monitor)
    advmon.instrument(Static, monitor, method="estimate")
    _, rewards, mask = make_batch()
    Static.compute_advantage(None, rewards, mask)
    Static().estimate(None, rewards, mask)
    assert len(sink.records) == 2


def test_instrument_rejects_missing_method(monitor):
    with pytest.raises(advmon.AdvmonConfigError, match="no method 'compute'"):
        advmon.instrument(GRPOLikeEstimator(), monitor, method="compute")
    with pytest.raises(advmon.AdvmonConfigError, match="group_size"):
        advmon.instrument(GRPOLikeEstimator(), monitor, group_size=0)


def test_nested_watched_calls_record_once(monitor, sink):
    inner = monitor.watch(centered)

    @monitor.watch
    def outer(prompt_ids, rewards, mask):
        return inner(prompt_ids, rewards, mask)

    outer(*make_batch())
    assert len(sink.records) == 1


def test_tap_records_pre_norm_taken_before_in_place_changes(monitor, sink):
    @monitor.watch
    def normalizing(prompt_ids, rewards, mask):
        advantages = rewards - rewards.mean()
        advmon.tap("pre_norm", advantages)
        advantages /= advantages.std() + 1e-6  # in place, after the tap
        return advantages

    _, rewards, mask = make_batch(seed=3)
    normalizing(None, rewards, mask)
    record = sink.records[-1]
    assert record.pre_norm_source == "tap"
    expected = value_stats((rewards - rewards.mean()).numpy())
    assert record.metrics["advantages/pre_norm/max"] == pytest.approx(expected["max"], rel=1e-6)
    assert record.metrics["advantages/pre_norm/std"] == pytest.approx(expected["std"], rel=1e-6)


def test_tap_uses_the_calls_mask_and_other_stages(monitor, sink):
    @monitor.watch
    def estimator(prompt_ids, rewards, mask):
        token = rewards.unsqueeze(-1) * torch.ones_like(mask)
        advmon.tap("pre_norm", token)
        advmon.tap("clipped", token.clamp(max=0.5))
        return token

    _, rewards, mask = make_batch(seed=4)
    estimator(None, rewards, mask)
    metrics = sink.records[-1].metrics
    assert metrics["advantages/pre_norm/count"] == mask.sum().item()
    assert metrics["advantages/clipped/max"] <= 0.5


def test_tap_outside_a_watched_call_is_a_no_op(sink, monitor):
    tensor = torch.ones(3)
    assert advmon.tap("pre_norm", tensor) is tensor
    assert sink.records == []


@pytest.mark.parametrize(
    "estimator",
    [
        lambda r, m: r.unsqueeze(-1).expand(m.shape),
        lambda r, m: (r.unsqueeze(-1).expand(m.shape), None),
        lambda r, m: [r.unsqueeze(-1).expand(m.shape)],
        lambda r, m: {"advantages": r.unsqueeze(-1).expand(m.shape), "returns": None},
        lambda r, m: r.unsqueeze(-1).expand(m.shape).numpy(),
    ],
    ids=["tensor", "tuple", "list", "mapping", "numpy"],
)
def test_every_return_shape_is_understood(estimator, monitor, sink):
    _, rewards, mask = make_batch(seed=5)
    watched = monitor.watch(lambda prompt_ids, rewards, mask: estimator(rewards, mask))
    watched(None, rewards, mask)
    expected = value_stats(rewards.unsqueeze(-1).expand(mask.shape).numpy(), mask.numpy())
    assert sink.records[-1].metrics["advantages/post_norm/mean"] == pytest.approx(expected["mean"], rel=1e-12)
    assert monitor.internal_errors == 0


def test_estimator_metrics_are_forwarded(monitor, sink):
    prompts, rewards, mask = make_batch()
    advmon.instrument(ResultEstimator(), monitor).compute_advantage(prompts, rewards, mask)
    metrics = sink.records[-1].metrics
    assert metrics["estimator/baseline"] == pytest.approx(rewards.mean().item())
    assert metrics["estimator/clip_fraction"] == 0.25
    opd = advmon.instrument(OPDLikeEstimator(), monitor)
    teacher, student = torch.randn(mask.shape), torch.randn(mask.shape)
    opd.compute_advantage(prompts, rewards, mask, teacher_logprobs=teacher, prev_logprobs=student)
    metrics = sink.records[-1].metrics
    assert metrics["estimator/on_policy_distillation/adv_mean"] == opd.last_metrics["on_policy_distillation/adv_mean"]


def test_no_reference_to_the_batch_survives_the_call(monitor):
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    prompts, rewards, mask = make_batch()
    refs = [weakref.ref(t) for t in (prompts, rewards, mask)]
    result_ref = weakref.ref(estimator.compute_advantage(prompts, rewards, mask))
    with monitor.step(1):
        estimator.compute_advantage(prompts, rewards, mask)
        del prompts, rewards, mask
        gc.collect()
        assert all(ref() is None for ref in refs), "a pending step must not hold the batch"
    gc.collect()
    assert result_ref() is None


def test_requires_grad_inputs_keep_their_graph(monitor):
    rewards = torch.rand(8, requires_grad=True)
    mask = torch.ones(8, 3)

    @monitor.watch
    def differentiable(prompt_ids, rewards, mask):
        return (rewards * 2).unsqueeze(-1).expand(mask.shape)

    out = differentiable(None, rewards, mask)
    out.sum().backward()
    assert torch.equal(rewards.grad, torch.full((8,), 6.0))
    assert monitor.internal_errors == 0


def test_default_monitor_is_looked_up_at_call_time(sink):
    @advmon.watch
    def estimator(prompt_ids, rewards, mask):
        return rewards

    replacement = advmon.Monitor("replacement", sinks=[sink])
    previous = advmon.set_monitor(replacement)
    try:
        estimator(None, torch.ones(4), None)
        assert advmon.get_monitor() is replacement
        assert sink.records[-1].run == "replacement"
    finally:
        advmon.set_monitor(previous)


def test_an_instance_can_report_to_another_monitor_than_its_class(sink):
    class Local(GRPOLikeEstimator):
        pass

    class_sink, instance_sink = [], []

    class Collect(advmon.Sink):
        synchronous = True

        def __init__(self, target):
            self.target = target

        def write(self, record):
            self.target.append(record)

    class_monitor = advmon.Monitor("class", sinks=[Collect(class_sink)])
    instance_monitor = advmon.Monitor("instance", sinks=[Collect(instance_sink)])
    advmon.instrument(Local, class_monitor)
    special = advmon.instrument(Local(), instance_monitor)
    special.compute_advantage(*make_batch())
    Local().compute_advantage(*make_batch())
    class_monitor.wait(), instance_monitor.wait()  # records are finished off the calling thread
    assert (len(class_sink), len(instance_sink)) == (1, 1)
    with pytest.raises(advmon.AdvmonConfigError, match="unknown argument name"):
        advmon.instrument(Local(), class_monitor, reward="r")

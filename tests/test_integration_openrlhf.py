"""advmon inside the real OpenRLHF 0.11.2: ``RemoteExperienceMaker.compute_advantages_and_returns`` for every
estimator it knows, with real deepspeed on the CPU and stand-ins only for flash-attn and vLLM (GPU-only, imported
at load time, never called: tests/openrlhf_standins.py)."""

from __future__ import annotations

import argparse
import functools
import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import advmon
from tests import openrlhf_standins
from tests.conftest import ListSink
from tests.reference import assert_stats_close, bound_ratio, derived_pre_norm, group_stats, value_stats
from tests.services import require_module

import advmon.integrations.openrlhf as advmon_openrlhf  # its table of kinds: no OpenRLHF needed


def import_openrlhf() -> None:
    """OpenRLHF's names in this module, imported when a test first needs them, not when pytest collects the
    module: with deepspeed and transformers the import costs 5 s of CPU, which every test process collecting the
    suite paid, whether or not it ran one of these tests (tests/test_edges_frameworks.py borrows ``maker`` and
    ``experiences``, which call this first)."""
    global Experience, RemoteExperienceMaker, FixedKLController, hierarchize, STAND_INS
    if "hierarchize" in globals():
        return
    require_module("openrlhf")  # in CI a missing OpenRLHF fails, never skips
    require_module("deepspeed")
    with openrlhf_standins.importing() as STAND_INS:  # gone from sys.modules after: TRL looks for a real vLLM
        from openrlhf.trainer.ppo_utils.experience import Experience
        from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
        from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
        from openrlhf.utils.config import hierarchize


@pytest.fixture(scope="module", autouse=True)
def _openrlhf() -> None:
    import_openrlhf()


GROUP = 4
PROMPTS = 5
ESTIMATORS = ["gae", "reinforce", "reinforce_baseline", "rloo", "dr_grpo", "group_norm", "flash_reinforce"]
#: (estimator, KL coefficient): every estimator with OpenRLHF's default KL penalty in the rewards, and the
#: group-mean ones without it.
CASES = [(name, 0.01) for name in ESTIMATORS] + [("rloo", 0.0), ("dr_grpo", 0.0)]
KINDS = advmon_openrlhf.NORMALIZATION
RANGE = (0.0, 1.25)


def maker(estimator: str, per_prompt: int = GROUP, kl: float = 0.01, **changes) -> RemoteExperienceMaker:
    """OpenRLHF's experience maker as its PPOTrainer builds it, with train_ppo_ray's defaults for what the
    advantage step reads (its args are argparse's, made hierarchical by OpenRLHF's own ``hierarchize``)."""
    import_openrlhf()
    flat = {"rollout.n_samples_per_prompt": per_prompt, "algo.advantage.estimator": estimator,
            "algo.advantage.gamma": 1.0, "algo.advantage.lambd": 1.0, "algo.advantage.no_std_norm": False,
            "algo.kl.init_coef": kl, "reward.clip_range": (-10, 10), "reward.overlong_buffer_len": None,
            "reward.overlong_penalty_factor": 1, "reward.stop_properly_penalty_coef": None, **changes}
    args = hierarchize(argparse.Namespace(**flat))
    # The Ray actor groups are only used to run models: the advantage step never touches them.
    return RemoteExperienceMaker(None, None, None, None, FixedKLController(args.algo.kl.init_coef),
                                 SimpleNamespace(args=args), tokenizer=None)


def experiences(seed: int = 0, per_prompt: int = GROUP) -> list[Experience]:
    """A step's micro-batches as make_experience leaves them: samples shuffled across micro-batches of different
    widths (``index``: each sample's place in prompt order), rewards, action masks, KL and a critic's values."""
    import_openrlhf()
    rng = np.random.default_rng(seed)
    size = PROMPTS * per_prompt
    order = rng.permutation(size)
    rewards = (rng.random(size) < 0.5) + 0.25 * rng.random(size)
    rewards[:per_prompt] = 1.0  # one zero-std group (in prompt order)
    out = []
    for k, chunk in enumerate(np.array_split(order, 4)):
        width = 6 + 2 * k
        lengths = rng.integers(1, width + 1, chunk.size)
        mask = np.arange(width)[None, :] < lengths[:, None]
        out.append(Experience(
            action_mask=torch.from_numpy(mask),
            rewards=torch.from_numpy(rewards[chunk].astype(np.float32)),
            kl=torch.from_numpy((0.05 * rng.normal(size=mask.shape) * mask).astype(np.float32)),
            values=torch.from_numpy(rng.normal(0.5, 0.2, mask.shape).astype(np.float32)),
            index=chunk.tolist(), info={}))
    return out


def padded(per_experience: list[np.ndarray], width: int) -> np.ndarray:
    rows = [np.pad(np.asarray(x, dtype=np.float64), ((0, 0), (0, width - x.shape[1]))) for x in per_experience]
    return np.concatenate(rows)


@pytest.fixture
def sink():
    sink = ListSink()
    sink.monitor = advmon.Monitor("openrlhf", sinks=[sink], reward_range=RANGE)
    yield sink
    advmon_openrlhf.uninstrument()
    sink.monitor.close()


@pytest.fixture
def whitened_inputs(monkeypatch):
    """What OpenRLHF's GAE and cumulative-return helpers hand back, per micro-batch (spies on its own methods)."""
    seen = []
    for name in ("get_advantages_and_returns", "get_cumulative_returns"):
        original = RemoteExperienceMaker.__dict__[name]

        @functools.wraps(original)  # advmon reads the action mask by the method's own names
        def spy(self, *args, _original=original, **kwargs):
            result = _original(self, *args, **kwargs)
            seen.append((result[0] if isinstance(result, tuple) else result).clone())
            return result

        monkeypatch.setattr(RemoteExperienceMaker, name, spy)
    return seen


@pytest.mark.parametrize("estimator,kl", CASES)
def test_outputs_unchanged_one_record_per_call_statistics_equal_numpy(estimator, kl, sink, whitened_inputs):
    plain = maker(estimator, kl=kl).compute_advantages_and_returns(experiences())
    whitened_inputs.clear()
    advmon_openrlhf.instrument(sink.monitor)
    given = experiences()
    rewards = torch.cat([e.rewards for e in given]).numpy().astype(np.float64)  # as they came in
    watched = maker(estimator, kl=kl).compute_advantages_and_returns(given)
    assert watched is given  # the very list OpenRLHF returns, the very experiences
    for have, want in zip(watched, plain):
        for key in ("advantages", "returns", "rewards"):
            assert torch.equal(getattr(have, key), getattr(want, key)), key
        assert have.info.keys() == want.info.keys()
    (record,) = sink.records
    assert record.estimator == advmon_openrlhf.ESTIMATOR
    keys = [i // GROUP for e in given for i in e.index]
    width = max(e.action_mask.shape[1] for e in given)
    mask = padded([e.action_mask.numpy() for e in given], width)
    advantages = padded([e.advantages.numpy() for e in watched], width)
    valid = np.concatenate([e.advantages.numpy()[e.action_mask.numpy()] for e in watched])
    assert_stats_close(record.metrics, value_stats(valid), "advantages/post_norm/")
    assert_stats_close(record.metrics, {k: v for k, v in value_stats(rewards).items()
                                        if k in ("mean", "std", "min", "max", "count")}, "rewards/")
    for key, value in group_stats(rewards, keys, RANGE).items():
        assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
    if estimator in advmon_openrlhf.WHITENED:  # what OpenRLHF whitens, micro-batch by micro-batch
        assert record.pre_norm_source == "tap"
        raw = np.concatenate([x.numpy()[e.action_mask.numpy()] for x, e in zip(whitened_inputs, given)])
        assert_stats_close(record.metrics, value_stats(raw), "advantages/pre_norm/")
    else:
        assert record.pre_norm_source == "derived"
        assert_stats_close(record.metrics, value_stats(derived_pre_norm(rewards, keys)), "advantages/pre_norm/")
    if KINDS[estimator] == "group_mean" and kl > 0:  # KL returns beyond the spread: no kind declared
        assert record.normalization_source == "inferred"
        kind = record.normalization
    else:
        kind = KINDS[estimator]
        assert (record.normalization, record.normalization_source) == (kind, "declared")
    expected = bound_ratio(kind, rewards, keys, advantages, mask, reward_range=RANGE)
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9)
    assert record.metrics["advantages/bound_ratio"] <= 1.1  # healthy: within its bound (KL terms add a little)


@pytest.mark.parametrize("estimator", ["gae", "group_norm"])
def test_records_equal_observing_the_same_step_by_hand(estimator, sink, whitened_inputs):
    advmon_openrlhf.instrument(sink.monitor)
    given = experiences(1)
    rewards = torch.cat([e.rewards for e in given]).clone()
    out = maker(estimator).compute_advantages_and_returns(given)
    advmon_openrlhf.uninstrument()
    width = max(e.action_mask.shape[1] for e in given)
    mask = torch.from_numpy(padded([e.action_mask.numpy() for e in given], width))
    pre = torch.from_numpy(padded([x.numpy() for x in whitened_inputs], width)) if whitened_inputs else None
    by_hand = ListSink()
    with advmon.Monitor("by-hand", sinks=[by_hand], reward_range=RANGE) as monitor:
        monitor.observe(rewards=rewards, advantages=torch.from_numpy(padded([e.advantages.numpy() for e in out], width)),
                        mask=mask, groups=np.array([i // GROUP for e in given for i in e.index]),
                        pre_norm=pre if estimator in advmon_openrlhf.WHITENED else None, normalization=KINDS[estimator])
    (integrated,), (hand,) = sink.records, by_hand.records
    assert integrated.metrics.keys() == hand.metrics.keys()
    for key, value in hand.metrics.items():
        have = integrated.metrics[key]
        assert have == pytest.approx(value, rel=1e-9, abs=1e-12) or math.isnan(value) and math.isnan(have), key


def test_one_sample_per_prompt_has_no_groups(sink):
    advmon_openrlhf.instrument(sink.monitor)
    maker("flash_reinforce", per_prompt=1).compute_advantages_and_returns(experiences(2, per_prompt=1))
    (record,) = sink.records
    assert record.metrics.get("groups/count", 0.0) in (0.0,) or math.isnan(record.metrics["groups/count"])
    assert record.normalization == "none"


def test_no_std_norm_only_centres_and_is_inferred(sink):
    advmon_openrlhf.instrument(sink.monitor)
    maker("reinforce", **{"algo.advantage.no_std_norm": True}).compute_advantages_and_returns(experiences(3))
    (record,) = sink.records
    assert record.normalization_source == "inferred"


def test_applying_twice_is_harmless_and_undo_restores_openrlhf(sink):
    names = ("compute_advantages_and_returns", "get_advantages_and_returns", "get_cumulative_returns")
    originals = {name: RemoteExperienceMaker.__dict__[name] for name in names}
    assert advmon_openrlhf.instrument(sink.monitor) is sink.monitor
    assert advmon_openrlhf.instrument(sink.monitor) is sink.monitor
    maker("gae").compute_advantages_and_returns(experiences())
    assert len(sink.records) == 1
    advmon_openrlhf.uninstrument()
    advmon_openrlhf.uninstrument()
    assert {name: RemoteExperienceMaker.__dict__[name] for name in names} == originals
    maker("gae").compute_advantages_and_returns(experiences())
    assert len(sink.records) == 1 and not advmon_openrlhf.is_instrumented()


def test_only_the_gpu_only_packages_are_stand_ins():
    import deepspeed
    import openrlhf.models.ring_attn_utils as ring

    assert set(STAND_INS) <= set(openrlhf_standins.NAMES)
    assert not set(STAND_INS) & set(sys.modules)  # used only while OpenRLHF's modules were imported
    assert not getattr(deepspeed, "__spec__", None) is None and deepspeed.__file__  # the real deepspeed
    if "flash_attn" in STAND_INS:  # never called by the advantage step: each stand-in raises when used
        with pytest.raises(openrlhf_standins.GPUOnly):
            ring.pad_input()

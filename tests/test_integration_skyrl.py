"""advmon inside the real SkyRL 0.3.0: every estimator of its registry, called as SkyRL's trainer calls them."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

import advmon
from tests.conftest import ListSink
from tests.reference import assert_stats_close, bound_ratio, derived_pre_norm, group_stats, value_stats
from tests.services import require_module

require_module("skyrl")  # in CI a missing SkyRL fails, never skips
import advmon.integrations.skyrl as advmon_skyrl  # noqa: E402
from advmon.hooks import is_watched  # noqa: E402

ppo_utils = advmon_skyrl.load_ppo_utils()
Registry = ppo_utils.AdvantageEstimatorRegistry
GROUP = 4
#: (registry name, grpo_norm_by_std): every estimator SkyRL 0.3.0 registers, GRPO both ways.
CASES = [("grpo", True), ("grpo", False), ("rloo", True), ("reinforce++", True), ("gae", True), ("maxrl", True)]
KINDS = {("grpo", True): "group_std", ("grpo", False): "group_mean", ("rloo", True): "group_mean",
         ("reinforce++", True): "batch", ("gae", True): "batch", ("maxrl", True): "unknown"}


def batch(seed: int = 0, prompts: int = 6, length: int = 12) -> dict:
    """What SkyRL's trainer passes: token-level rewards (the outcome on the last token), the response mask,
    the uids (a list of strings, ``data.metadata["uids"]``) and a critic's values."""
    rng = np.random.default_rng(seed)
    size = prompts * GROUP
    lengths = rng.integers(3, length + 1, size)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    scores = (rng.random(size) < 0.5).astype(np.float32) + 0.25 * rng.random(size).astype(np.float32)
    scores[:GROUP] = 1.0  # one zero-std group
    rewards = np.zeros((size, length), np.float32)
    rewards[np.arange(size), lengths - 1] = scores
    return {"token_level_rewards": torch.from_numpy(rewards), "response_mask": torch.from_numpy(mask),
            "index": [f"prompt-{i // GROUP}" for i in range(size)],
            "values": torch.from_numpy(rng.normal(size=(size, length)).astype(np.float32))}


def run(name: str, norm_by_std: bool = True, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """SkyRL's own entry point, with the trainer's keywords."""
    data = batch(seed)
    return ppo_utils.compute_advantages_and_returns(
        token_level_rewards=data["token_level_rewards"], response_mask=data["response_mask"], index=data["index"],
        adv_estimator=name, config=None, values=data["values"], gamma=1.0, lambd=1.0, grpo_norm_by_std=norm_by_std)


@pytest.fixture
def sink():
    sink = ListSink()
    sink.monitor = advmon.Monitor("skyrl", sinks=[sink], reward_range=(0.0, 1.25))
    yield sink
    advmon_skyrl.uninstrument()
    sink.monitor.close()


def raw_whitened_input(name: str, data: dict) -> np.ndarray:
    """What GAE or REINFORCE++ hands masked_whiten: SkyRL's own loop with the whitening left out."""
    whiten = ppo_utils.masked_whiten
    ppo_utils.masked_whiten = lambda values, mask, *args, **kwargs: values
    try:
        raw, _ = Registry._functions[name](token_level_rewards=data["token_level_rewards"], values=data["values"],
                                            response_mask=data["response_mask"], gamma=1.0, lambd=1.0)
    finally:
        ppo_utils.masked_whiten = whiten
    return raw.numpy().astype(np.float64)


@pytest.mark.parametrize("name,norm_by_std", CASES)
def test_outputs_unchanged_one_record_per_call_statistics_equal_numpy(name, norm_by_std, sink):
    plain = run(name, norm_by_std)
    advmon_skyrl.instrument(sink.monitor)
    watched = run(name, norm_by_std)
    for have, want in zip(watched, plain):
        assert torch.equal(have, want)
    assert (watched[0] is watched[1]) == (plain[0] is plain[1])  # GRPO returns one tensor twice: still one
    assert len(sink.records) == 1
    record = sink.records[0]
    assert record.estimator.startswith(advmon_skyrl.PPO_UTILS)
    data = batch(0)
    rewards = data["token_level_rewards"].sum(-1).numpy().astype(np.float64)
    mask = data["response_mask"].numpy()
    advantages = watched[0].numpy()
    keys = data["index"]
    assert_stats_close(record.metrics, value_stats(advantages, mask), "advantages/post_norm/")
    assert_stats_close(record.metrics, {k: v for k, v in value_stats(rewards).items()
                                        if k in ("mean", "std", "min", "max", "count")}, "rewards/")
    for key, value in group_stats(rewards, keys, (0.0, 1.25)).items():  # every estimator gets the uids
        assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
    assert record.metrics["groups/zero_std_count"] >= 1
    if name in ("gae", "reinforce++"):  # what they whiten over the batch is their pre_norm
        assert record.pre_norm_source == "tap"
        assert_stats_close(record.metrics, value_stats(raw_whitened_input(name, data), mask), "advantages/pre_norm/")
    else:
        assert record.pre_norm_source == "derived"
        assert_stats_close(record.metrics, value_stats(derived_pre_norm(rewards, keys)), "advantages/pre_norm/")
    kind = KINDS[(name, norm_by_std)]
    assert record.normalization == kind
    assert record.normalization_source == ("inferred" if kind == "unknown" else "declared")
    expected = bound_ratio(kind, rewards, keys, advantages, mask, reward_range=(0.0, 1.25))
    assert record.metrics["advantages/bound_ratio"] == pytest.approx(expected, rel=1e-9)
    assert record.metrics["advantages/bound_ratio"] <= 1.0 + 1e-6  # a healthy call is within its own bound


@pytest.mark.parametrize("name,norm_by_std", CASES)
def test_records_equal_a_hand_wrapped_estimator(name, norm_by_std, sink):
    """instrument() records what @monitor.watch on the same SkyRL function, with SkyRL's names, records."""
    advmon_skyrl.instrument(sink.monitor)
    run(name, norm_by_std)
    advmon_skyrl.uninstrument()
    by_hand = ListSink()
    with advmon.Monitor("by-hand", sinks=[by_hand], reward_range=(0.0, 1.25)) as monitor:
        watched = monitor.watch(Registry.get(name), rewards="token_level_rewards", mask="response_mask",
                                groups="index", normalization=advmon_skyrl.NORMALIZATION[name])
        whiten = ppo_utils.masked_whiten
        if name in ("gae", "reinforce++"):  # the tap the integration adds, by hand
            ppo_utils.masked_whiten = lambda values, mask, *args, **kwargs: whiten(advmon.tap("pre_norm", values, mask),
                                                                                  mask, *args, **kwargs)
        try:
            data = batch(0)
            watched(token_level_rewards=data["token_level_rewards"], response_mask=data["response_mask"],
                    index=data["index"], values=data["values"], grpo_norm_by_std=norm_by_std, gamma=1.0, lambd=1.0,
                    config=None)
        finally:
            ppo_utils.masked_whiten = whiten
    (integrated,), (hand,) = sink.records, by_hand.records
    assert integrated.metrics.keys() == hand.metrics.keys()
    for key, value in hand.metrics.items():
        assert integrated.metrics[key] == value or math.isnan(value) and math.isnan(integrated.metrics[key]), key
    assert (integrated.normalization, integrated.pre_norm_source) == (hand.normalization, hand.pre_norm_source)


def test_the_very_objects_skyrl_returns_come_back(sink, monkeypatch):
    returned = []
    original = Registry._functions["grpo"]

    def spy(*args, **kwargs):
        returned.append(original(*args, **kwargs))
        return returned[-1]

    monkeypatch.setitem(Registry._functions, "grpo", spy)
    advmon_skyrl.instrument(sink.monitor)
    result = run("grpo")
    assert result is returned[0] and len(sink.records) == 1


def test_the_entry_point_is_watched_applying_twice_is_harmless_and_undo_restores_skyrl(sink):
    originals = {name: Registry.get(name) for name in Registry.list_available()}
    whiten, entry = ppo_utils.masked_whiten, ppo_utils.compute_advantages_and_returns
    attribute = ppo_utils.compute_grpo_outcome_advantage
    assert advmon_skyrl.instrument(sink.monitor) is sink.monitor
    assert advmon_skyrl.instrument(sink.monitor) is sink.monitor  # again: nothing wrapped twice
    # SkyRL's lookups give back what was registered, the very objects (tests/test_edges_frameworks.py for more).
    assert {name: Registry.get(name) for name in Registry.list_available()} == originals
    assert all(Registry.get(name) is fn and not is_watched(fn) for name, fn in originals.items())
    assert ppo_utils.compute_grpo_outcome_advantage is attribute and "get" not in Registry.__dict__
    assert ppo_utils.compute_advantages_and_returns is not entry
    run("grpo")
    assert len(sink.records) == 1
    advmon_skyrl.uninstrument()
    advmon_skyrl.uninstrument()  # again: harmless
    assert ppo_utils.masked_whiten is whiten and ppo_utils.compute_advantages_and_returns is entry
    run("grpo")
    assert len(sink.records) == 1 and not advmon_skyrl.is_instrumented()


def test_an_estimator_registered_later_is_recorded_under_its_name(sink):
    @ppo_utils.register_advantage_estimator("advmon_test_centered")
    def centered(token_level_rewards, response_mask, index=None, **kwargs):
        scores = token_level_rewards.sum(-1)
        advantages = (scores - scores.mean()).unsqueeze(-1) * response_mask
        return advantages, advantages

    try:
        advmon_skyrl.instrument(sink.monitor)
        run("advmon_test_centered")
        (record,) = sink.records
        assert record.estimator.endswith("centered") and record.normalization_source == "inferred"
        assert record.metrics["groups/count"] == 6
    finally:
        Registry.unregister("advmon_test_centered")


def test_calls_inside_one_step_make_one_record(sink):
    advmon_skyrl.instrument(sink.monitor)
    with sink.monitor.step(7):
        run("grpo", seed=1)
        run("grpo", seed=2)
    (record,) = sink.records
    assert record.step == 7 and record.metrics["rewards/count"] == 2 * 6 * GROUP


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the import workaround is for Python 3.11 only")
def test_the_python_311_import_workaround_is_needed_and_runs_skyrls_own_code(tmp_path):
    """On 3.11 SkyRL's own import fails in skyrl/backends/__init__.py; load_ppo_utils skips only that file."""
    plain = subprocess.run([sys.executable, "-c", f"import {advmon_skyrl.PPO_UTILS}"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert plain.returncode != 0 and "TypedDict" in plain.stderr, plain.stderr[-2000:]
    import skyrl

    backends = sys.modules["skyrl.backends"]
    assert list(backends.__path__) == [str(next(iter(skyrl.__path__))) + "/backends"]
    assert not hasattr(backends, "AbstractBackend")  # the one name its __init__ would have added
    # The estimators are SkyRL's own functions, from SkyRL's own file.
    for name in Registry.list_available():
        code = getattr(Registry.get(name), "__wrapped__", Registry.get(name)).__code__
        assert code.co_filename == ppo_utils.__file__, name

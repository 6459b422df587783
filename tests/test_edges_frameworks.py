"""At the edges real deployments reach first (issue 38): frameworks' lookups unchanged, a second monitor,
AReaL's own attributes, group sizes that disagree or do not divide, missing rewards.

Every statistic is checked against NumPy (tests/reference.py); every advmon warning a test causes is expected.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import advmon
from tests.conftest import ListSink
from tests.reference import assert_stats_close, group_stats, value_stats
from tests.services import require_module


@pytest.fixture
def sink():
    sink = ListSink()
    sink.monitor = advmon.Monitor("edges", sinks=[sink], reward_range=(0.0, 1.0))
    yield sink
    sink.monitor.close()


# --------------------------------------------------------------- missing rewards (item 13)


def test_a_none_reward_is_a_missing_reward_and_the_others_statistics_stay_right(sink):
    """Regression: observe(rewards=[1.0, None, 0.0, 1.0]) warned "expected rewards as a tensor or numeric array,
    got list" and every reward statistic, nan_count included, was NaN."""
    rewards = [1.0, None, 0.0, 1.0]
    advantages = torch.tensor([0.5, 0.0, -0.5, 0.5])
    with pytest.warns(advmon.AdvmonWarning, match=r"1 of 4 rewards was None.*missing reward"):
        sink.monitor.observe(rewards=rewards, advantages=advantages, group_size=2)
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    as_nan = np.array([math.nan if r is None else r for r in rewards])
    expected = value_stats(as_nan)
    assert expected["nan_count"] == 1.0
    assert_stats_close(metrics, {k: v for k, v in expected.items()
                                 if k in ("mean", "std", "min", "max", "count", "nan_count", "inf_count")}, "rewards/")
    for key, value in group_stats(as_nan, [0, 0, 1, 1], (0.0, 1.0)).items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key
    assert metrics["advmon/internal_errors"] == 1.0
    # Said once: the next call with a None is counted, not warned again (the suite turns warnings into errors).
    sink.monitor.observe(rewards=[None, 1.0], advantages=torch.zeros(2))
    sink.monitor.flush()
    assert sink.records[-1].metrics["rewards/nan_count"] == 1.0
    assert sink.records[-1].metrics["advmon/internal_errors"] == 2.0


def test_none_in_a_reward_functions_scores_is_missing_too(sink):
    scores = {"graded": [1.0, None, None, 0.0]}
    with pytest.warns(advmon.AdvmonWarning, match=r"2 of 4 reward function 'graded' were None"):
        sink.monitor.observe(rewards=[1.0, 0.5, 0.5, 0.0], advantages=torch.zeros(4), reward_functions=scores)
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    expected = value_stats(np.array([1.0, math.nan, math.nan, 0.0]))
    assert_stats_close(metrics, {k: v for k, v in expected.items() if k in ("mean", "std", "min", "max", "count", "nan_count")},
                       "rewards/graded/")
    assert metrics["rewards/nan_count"] == 0.0


def test_strings_among_rewards_stay_a_type_problem(sink):
    with pytest.warns(advmon.AdvmonWarning, match="expected rewards as a tensor or numeric array"):
        sink.monitor.observe(rewards=[1.0, None, "0.5"], advantages=torch.zeros(3))


# --------------------------------------------------------------- group_size (item 7)


def grpo(prompt_ids, rewards, mask):
    groups = rewards.view(-1, 4)
    advantages = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-6)
    return advantages.reshape(-1, 1) * mask


@pytest.mark.parametrize("path", [None, "torch"], ids=["cpu", "device"])
@pytest.mark.parametrize("rows", [False, True], ids=["ids", "prompt-rows"])
def test_group_size_never_overrides_the_groups_the_estimator_was_given(sink, path, rows):
    """Regression: @watch(group_size=8) on est(prompt_ids, rewards, mask) with 4 real groups of 4 recorded
    groups/count 2 and zero_std_fraction 0.0 (true: 4 and 0.5)."""
    from advmon.stats import statistics_path

    estimator = sink.monitor.watch(group_size=8)(grpo)
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1])
    prompt_ids = torch.arange(4).repeat_interleave(4)
    given = torch.stack([prompt_ids, 10 + prompt_ids], 1) if rows else prompt_ids
    with pytest.warns(advmon.AdvmonWarning, match="group_size=8 disagrees with the 4 groups"):
        with statistics_path(path):
            estimator(given, rewards, torch.ones(16, 3))
        sink.monitor.flush()
    metrics = sink.records[-1].metrics
    expected = group_stats(rewards.numpy(), prompt_ids.tolist(), (0.0, 1.0))
    assert expected["groups/count"] == 4 and expected["groups/zero_std_fraction"] == 0.5
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key
    assert metrics["advmon/internal_errors"] == 1.0


def test_a_group_size_that_agrees_with_the_groups_is_silent(sink):
    estimator = sink.monitor.watch(group_size=4)(grpo)
    rewards = torch.tensor([1.0, 0, 1, 1, 0, 0, 0, 0])
    estimator(torch.tensor([7, 7, 7, 7, 3, 3, 3, 3]), rewards, torch.ones(8, 2))
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    for key, value in group_stats(rewards.numpy(), [0] * 4 + [1] * 4, (0.0, 1.0)).items():
        assert metrics[key] == pytest.approx(value, nan_ok=True), key
    assert metrics["advmon/internal_errors"] == 0.0


def test_a_group_size_that_does_not_divide_the_batch_makes_no_groups(sink):
    """Regression: observe(group_size=3) with 16 rewards made 6 groups (the last of 1) without a word."""
    rewards = np.random.default_rng(0).random(16)
    with pytest.warns(advmon.AdvmonWarning, match="group_size=3 does not divide the batch of 16"):
        sink.monitor.observe(rewards=torch.from_numpy(rewards), advantages=torch.zeros(16), group_size=3)
    sink.monitor.flush()
    metrics = sink.records[-1].metrics
    assert metrics["groups/count"] == 0.0 and math.isnan(metrics["groups/zero_std_fraction"])
    expected = value_stats(rewards)
    assert_stats_close(metrics, {k: expected[k] for k in ("mean", "std", "min", "max", "count")}, "rewards/")
    assert metrics["advmon/internal_errors"] == 1.0
    # One that divides the next batch is used as before.
    sink.monitor.observe(rewards=torch.from_numpy(rewards[:15]), advantages=torch.zeros(15), group_size=3)
    sink.monitor.flush()
    for key, value in group_stats(rewards[:15], [i // 3 for i in range(15)], (0.0, 1.0)).items():
        assert sink.records[-1].metrics[key] == pytest.approx(value, nan_ok=True), key


# --------------------------------------------------------------- AReaL's own attributes (item 3)


def test_areal_reads_what_its_step_reads_not_a_config_without_kl_ctl(sink):
    """Regression: an actor whose ``config`` lacks ``kl_ctl`` (a config object the actor does not read) warned and
    inferred the kind at every call, and lost its groups: the step reads the actor's own attributes."""
    from types import SimpleNamespace

    require_module("areal")
    import advmon.integrations.areal as advmon_areal
    from areal.api.cli_args import NormConfig, PPOActorConfig
    from areal.trainer.ppo.actor import PPOActor
    from tests.test_integration_areal import GROUP, batch

    settings = PPOActorConfig(experiment_name="advmon", trial_name="edges", kl_ctl=0.0, reward_scaling=1.0,
                              reward_bias=0.0, reward_norm=NormConfig(mean_level="group", std_level="group",
                                                                      group_size=GROUP))
    actor = PPOActor(settings, engine=None)
    # What the step reads of self.config: nothing about normalization, KL, discount or groups.
    actor.config = SimpleNamespace(overlong_reward_penalty=False, use_decoupled_loss=False, recompute_logprob=False)
    advmon_areal.instrument(sink.monitor)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            given = batch(0)
            rewards = given["rewards"].numpy().astype(np.float64)
            for _ in range(2):
                actor._compute_advantages({key: value.clone() for key, value in given.items()})
            sink.monitor.flush()
    finally:
        advmon_areal.uninstrument()
    assert [str(w.message) for w in caught if "advmon" in str(w.message)] == []
    assert len(sink.records) == 2 and sink.monitor.internal_errors == 0
    for record in sink.records:
        assert (record.normalization, record.normalization_source) == ("group_std", "declared")
        for key, value in group_stats(rewards, list(np.arange(rewards.size) // GROUP), (0.0, 1.0)).items():
            assert record.metrics[key] == pytest.approx(value, nan_ok=True), key


# --------------------------------------------------------------- frameworks' lookups unchanged (item 1)


def test_skyrls_registry_gives_back_what_was_registered_when_instrumented(sink):
    """Regression: with advmon on, SkyRL's own registry tests failed (test_ppo_utils.py at skyrl-v0.3.0):
    ``reg.register("mine", f); reg.get("mine") == f`` was False, ``get`` returning advmon's wrapper. Here what
    those tests assert of the registry, with SkyRL instrumented, and a call through the trainer's entry point
    still recorded."""
    import inspect
    import pickle

    require_module("skyrl")
    import advmon.integrations.skyrl as advmon_skyrl
    from tests.test_integration_skyrl import batch

    ppo_utils = advmon_skyrl.load_ppo_utils()
    registry = ppo_utils.AdvantageEstimatorRegistry
    entry_signature = inspect.signature(ppo_utils.compute_advantages_and_returns)
    builtin = {"grpo": ppo_utils.compute_grpo_outcome_advantage, "gae": ppo_utils.compute_gae_advantage_return,
               "rloo": ppo_utils.compute_rloo_outcome_advantage,
               "reinforce++": ppo_utils.compute_reinforce_plus_plus_outcome_advantage,
               "maxrl": ppo_utils.compute_maxrl_advantage}

    def dummy_function(token_level_rewards, response_mask, index=None, **kwargs):
        scores = token_level_rewards.sum(-1)
        advantages = (scores - scores.mean()).unsqueeze(-1) * response_mask
        return advantages, advantages

    advmon_skyrl.instrument(sink.monitor)
    try:
        registry.register("advmon_dummy", dummy_function)
        got = registry.get("advmon_dummy")
        assert got == dummy_function and got is dummy_function and hash(got) == hash(dummy_function)
        assert "advmon_dummy" in registry.list_available()
        for name, function in builtin.items():  # the registry, the module and SkyRL's enum agree
            assert registry.get(name) is function and registry.get(ppo_utils.AdvantageEstimator(name)) is function
            assert pickle.loads(pickle.dumps(registry.get(name))) is function
        with pytest.raises(ValueError, match="already registered"):
            registry.register("grpo", builtin["grpo"])  # SkyRL's own check, unchanged
        assert inspect.signature(ppo_utils.compute_advantages_and_returns) == entry_signature
        assert ppo_utils.compute_advantages_and_returns.__name__ == "compute_advantages_and_returns"
        # What the trainer calls is recorded, under the estimator's name, statistics equal to NumPy's.
        data = batch(0)
        advantages, _ = ppo_utils.compute_advantages_and_returns(
            token_level_rewards=data["token_level_rewards"], response_mask=data["response_mask"],
            index=data["index"], adv_estimator="advmon_dummy", config=None)
        sink.monitor.flush()
        (record,) = sink.records
        assert record.estimator.endswith("dummy_function")
        assert_stats_close(record.metrics, value_stats(advantages.numpy(), data["response_mask"].numpy()),
                           "advantages/post_norm/")
        # SkyRL's reset and repopulate (its tests' fixtures) register SkyRL's functions, never advmon's.
        registry.unregister("advmon_dummy")
        registry.reset()
        registry.repopulate_registry()
        assert {name: registry.get(name) for name in builtin} == builtin
        assert all(registry.get(name) is function for name, function in builtin.items())
    finally:
        advmon_skyrl.uninstrument()
        if "advmon_dummy" in registry._functions:
            registry.unregister("advmon_dummy")


def test_verls_lookups_give_back_functions_equal_to_what_was_registered(sink):
    """Regression: verl's registry held advmon's wrappers: ``get_adv_estimator_fn("grpo") == f`` was False, and
    re-registering verl's own function (``register_adv_est("grpo")(f)``, a reloaded module) raised "already
    registered" in verl's own check (``registry[name] != fn``)."""
    import functools
    import inspect
    import pickle

    require_module("verl")
    import advmon.integrations.verl as advmon_verl
    from advmon.hooks import is_watched
    from tests.test_integration_verl import batch
    from verl.trainer.ppo import core_algos

    registered = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    grpo = registered["grpo"]
    advmon_verl.instrument(sink.monitor)
    try:
        assert core_algos.ADV_ESTIMATOR_REGISTRY == registered  # the registry keeps what was registered
        for name, function in registered.items():
            looked_up = core_algos.get_adv_estimator_fn(name)
            assert is_watched(looked_up) and looked_up == function and function == looked_up
            assert hash(looked_up) == hash(function) and {function: name}[looked_up] == name
            assert (looked_up.__name__, looked_up.__qualname__, looked_up.__module__) == (
                function.__name__, function.__qualname__, function.__module__)
            assert inspect.signature(looked_up) == inspect.signature(function)
        assert core_algos.register_adv_est("grpo")(grpo) is grpo  # verl's own check passes
        attribute = core_algos.compute_grpo_outcome_advantage
        assert attribute == grpo and pickle.loads(pickle.dumps(attribute)) is attribute
        # A partial of what the lookup gives back records once, statistics equal to NumPy's.
        data = batch(0)
        partial = functools.partial(core_algos.get_adv_estimator_fn("grpo"), index=data.non_tensor_batch["uid"])
        advantages, _ = partial(token_level_rewards=data.batch["token_level_rewards"],
                                response_mask=data.batch["response_mask"])
        sink.monitor.flush()
        (record,) = sink.records
        rewards = data.batch["token_level_rewards"].sum(-1).numpy().astype(np.float64)
        for key, value in group_stats(rewards, list(data.non_tensor_batch["uid"]), (0.0, 1.0)).items():
            assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
        assert_stats_close(record.metrics, value_stats(advantages.numpy(), data.batch["response_mask"].numpy()),
                           "advantages/post_norm/")
    finally:
        advmon_verl.uninstrument()
    assert core_algos.ADV_ESTIMATOR_REGISTRY == registered
    assert all(core_algos.ADV_ESTIMATOR_REGISTRY[name] is fn for name, fn in registered.items())


def test_a_function_target_activated_in_a_worker_stays_equal_to_itself(sink, monkeypatch):
    """ADVMON_INSTRUMENT's function targets replace a module attribute: what stood there is still equal, hashes
    alike and pickles by reference."""
    import pickle
    import sys
    import types

    from advmon.config.environment import parse_targets
    from advmon.hooks import is_watched
    from advmon.integrations.activation import watch_target

    module = types.ModuleType("advmon_edges_estimators")
    exec("def centered(rewards):\n    return rewards - rewards.mean()\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    original = module.centered
    registry = {original: "centered"}  # a framework's table keyed by the function
    (target,) = parse_targets(f"{module.__name__}:centered(groups=None)")
    watch_target(target, module)
    assert is_watched(module.centered) and module.centered == original and registry[module.centered] == "centered"
    assert pickle.loads(pickle.dumps(module.centered)) is module.centered
    advmon.set_monitor(sink.monitor)
    try:
        rewards = torch.tensor([1.0, 0.0, 0.5, 0.5])
        module.centered(rewards)
        sink.monitor.flush()
    finally:
        advmon.set_monitor(None)
    assert_stats_close(sink.records[-1].metrics, {k: v for k, v in value_stats(rewards.numpy()).items()
                                                  if k in ("mean", "std", "min", "max", "count")}, "rewards/")


# --------------------------------------------------------------- instrumenting again for another monitor (item 2)


def second_monitor(name: str) -> tuple[advmon.Monitor, ListSink]:
    sink = ListSink()
    return advmon.Monitor(name, sinks=[sink], reward_range=(0.0, 1.25)), sink


def instrument_twice(first: advmon.Monitor, instrument, call) -> ListSink:
    """instrument(first); instrument(second): one warning naming the switch; calls record to the second only;
    instrumenting again with the second, or with no monitor, changes nothing and says nothing."""
    second, second_sink = second_monitor("edges-second")
    try:
        instrument(first)
        with pytest.warns(advmon.AdvmonWarning, match=r"again, for another monitor \(run 'edges-second'\)"):
            instrument(second)
        with warnings.catch_warnings():
            warnings.simplefilter("error", advmon.AdvmonWarning)
            instrument(second)
            instrument(None)
            call()
        first.flush(), second.flush()
    finally:
        second.close()
    return second_sink


def test_verl_instrumented_again_for_another_monitor_moves_there(sink):
    """Regression: instrument(m1); instrument(m2) kept recording into m1, and m2 wrote nothing."""
    require_module("verl")
    import advmon.integrations.verl as advmon_verl
    from tests.test_integration_verl import run_estimator

    try:
        second = instrument_twice(sink.monitor, advmon_verl.instrument, lambda: run_estimator("grpo"))
    finally:
        advmon_verl.uninstrument()
    assert (len(sink.records), len(second.records)) == (0, 1)


def test_skyrl_instrumented_again_for_another_monitor_moves_there(sink):
    require_module("skyrl")
    import advmon.integrations.skyrl as advmon_skyrl
    from tests.test_integration_skyrl import run

    try:
        second = instrument_twice(sink.monitor, advmon_skyrl.instrument, lambda: run("grpo"))
    finally:
        advmon_skyrl.uninstrument()
    assert (len(sink.records), len(second.records)) == (0, 1)


def test_areal_instrumented_again_for_another_monitor_moves_there(sink):
    require_module("areal")
    import advmon.integrations.areal as advmon_areal
    from tests.test_integration_areal import step

    try:
        second = instrument_twice(sink.monitor, advmon_areal.instrument, lambda: step("grpo"))
    finally:
        advmon_areal.uninstrument()
    assert (len(sink.records), len(second.records)) == (0, 1)


def test_openrlhf_instrumented_again_for_another_monitor_moves_there(sink):
    require_module("openrlhf")
    import advmon.integrations.openrlhf as advmon_openrlhf
    from tests.test_integration_openrlhf import experiences, import_openrlhf, maker

    import_openrlhf()  # with its stand-ins for flash-attn and vLLM, before advmon's instrument imports OpenRLHF
    try:
        second = instrument_twice(sink.monitor, advmon_openrlhf.instrument,
                                  lambda: maker("group_norm").compute_advantages_and_returns(experiences(0)))
    finally:
        advmon_openrlhf.uninstrument()
    assert (len(sink.records), len(second.records)) == (0, 1)


def test_nemo_rl_classes_and_instances_instrumented_again_move_to_the_new_monitor(sink):
    import types

    import advmon.integrations.nemo_rl as advmon_nemo
    from tests.nemo_like import AdvEstimatorConfig, GRPOAdvantageEstimator

    class Estimator(GRPOAdvantageEstimator):  # a class of this test's own: instrumenting it changes no other test
        pass

    module = types.SimpleNamespace(GRPOAdvantageEstimator=Estimator)
    prompt_ids = torch.arange(4).repeat_interleave(4)
    rewards = torch.tensor([1.0, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1])

    def call() -> None:
        Estimator(AdvEstimatorConfig(), {}).compute_advantage(prompt_ids, rewards, torch.ones(16, 3))

    second = instrument_twice(sink.monitor, lambda monitor: advmon_nemo.instrument(monitor, module=module), call)
    assert (len(sink.records), len(second.records)) == (0, 1)
    for key, value in group_stats(rewards.numpy(), prompt_ids.tolist(), (0.0, 1.25)).items():
        assert second.records[0].metrics[key] == pytest.approx(value, nan_ok=True), key
    # An instance: the same.
    estimator = Estimator(AdvEstimatorConfig(), {})
    second = instrument_twice(sink.monitor, lambda monitor: advmon.instrument(estimator, monitor),
                              lambda: estimator.compute_advantage(prompt_ids, rewards, torch.ones(16, 3)))
    assert (len(sink.records), len(second.records)) == (0, 1)


def test_an_areal_group_size_that_does_not_divide_the_batch_makes_no_groups(sink):
    require_module("areal")
    import advmon.integrations.areal as advmon_areal
    from tests.test_integration_areal import batch, config
    from areal.trainer.ppo.actor import PPOActor

    given = {key: value[:18] for key, value in batch(0).items()}  # 18 rows, groups of 4 given: 4.5 groups
    advmon_areal.instrument(sink.monitor, group_size=4)
    try:
        with pytest.warns(advmon.AdvmonWarning, match="group size 4 does not divide the batch of 18 rows"):
            PPOActor(config("reinforce"), engine=None)._compute_advantages(given)
            sink.monitor.flush()
    finally:
        advmon_areal.uninstrument()
    (record,) = sink.records
    assert record.metrics["groups/count"] == 0.0 and record.metrics["advmon/internal_errors"] == 1.0
    expected = value_stats(given["rewards"].numpy().astype(np.float64))
    assert_stats_close(record.metrics, {k: expected[k] for k in ("mean", "std", "min", "max", "count")}, "rewards/")


def test_patched_methods_keep_their_names_docstrings_and_signatures(sink):
    """AReaL's, OpenRLHF's and NeMo-RL's estimators are methods advmon replaces on their class: what a framework
    or a tool reads of them (name, module, qualified name, docstring, signature) is the method's own."""
    import inspect

    require_module("areal")
    require_module("openrlhf")
    import advmon.integrations.areal as advmon_areal
    import advmon.integrations.openrlhf as advmon_openrlhf
    from areal.trainer.ppo.actor import PPOActor
    from tests.nemo_like import GRPOAdvantageEstimator
    from tests import test_integration_openrlhf

    test_integration_openrlhf.import_openrlhf()
    RemoteExperienceMaker = test_integration_openrlhf.RemoteExperienceMaker

    class Estimator(GRPOAdvantageEstimator):
        def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
            """NeMo-RL's GRPO."""
            return super().compute_advantage(prompt_ids, rewards, mask, **kwargs)

    methods = [(PPOActor, "_compute_advantages"), (RemoteExperienceMaker, "compute_advantages_and_returns"),
               (Estimator, "compute_advantage")]
    attributes = ("__name__", "__qualname__", "__module__", "__doc__")

    def described() -> list[tuple]:
        return [(*(getattr(getattr(cls, name), a) for a in attributes), inspect.signature(getattr(cls, name)))
                for cls, name in methods]

    before = described()
    advmon_areal.instrument(sink.monitor)
    advmon_openrlhf.instrument(sink.monitor)
    advmon.instrument(Estimator, sink.monitor)
    try:
        assert described() == before
    finally:
        advmon_areal.uninstrument()
        advmon_openrlhf.uninstrument()


def test_instrumenting_again_after_the_earlier_monitor_closed_moves_without_a_word(tmp_path):
    """The zoo's pattern (and a script's next run): the class was instrumented for a run now finished. Moving to
    the new monitor loses nothing of the closed one, so nothing is said; the new monitor records."""
    import warnings

    class Estimator:
        def compute_advantage(self, prompt_ids, rewards, mask):
            return (rewards - rewards.mean()).unsqueeze(-1) * mask

    first, second = ListSink(), ListSink()
    with advmon.Monitor("closed-first", sinks=[first]) as m1:
        advmon.instrument(Estimator, m1)
        Estimator().compute_advantage(torch.arange(4), torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.ones(4, 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with advmon.Monitor("open-second", sinks=[second]) as m2:
            advmon.instrument(Estimator, m2)
            Estimator().compute_advantage(torch.arange(4), torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.ones(4, 2))
    assert [str(w.message) for w in caught if "advmon" in str(w.message)] == []
    assert len(first.records) == 1 and len(second.records) == 1


def test_a_subclass_method_wrapping_an_instrumented_base_keeps_its_own_code_when_instrumented():
    """The zoo's broken estimator: ``functools.wraps(Base.method)`` copies advmon's marks onto the subclass's method;
    instrumenting the subclass for another monitor must wrap that method, not the base's function it names."""
    import functools

    class Base:
        def compute_advantage(self, prompt_ids, rewards, mask):
            return (rewards - rewards.mean()).unsqueeze(-1) * mask

    with advmon.Monitor("base-run", sinks=[ListSink()]) as first:
        advmon.instrument(Base, first)

    class Scaled(Base):
        @functools.wraps(Base.compute_advantage)
        def compute_advantage(self, *args, **kwargs):
            return Base.compute_advantage(self, *args, **kwargs) * 100

    sink = ListSink()
    with advmon.Monitor("scaled-run", sinks=[sink]) as second:
        advmon.instrument(Scaled, second)
        out = Scaled().compute_advantage(torch.arange(4), torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.ones(4, 2))
    assert float(out.max()) == 50.0
    assert sink.records[-1].metrics["advantages/post_norm/max"] == 50.0

"""advmon across processes: pickled instrumentation, ADVMON_* activation, and real Ray actors.

The Ray tests start a local Ray cluster (2 CPUs) whose workers are activated by
``advmon.integrations.ray.runtime_env``: verl's own ``ray_trainer.compute_advantage``
runs inside an actor, the step comes from verl's counter in that actor, and the
records are read back from the actor's JSONL file and checked against NumPy.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch

import advmon
import advmon.lifecycle as lifecycle
from advmon.errors import AdvmonConfigError
from advmon.hooks import is_watched
from advmon.integrations.ray import SETUP_HOOK, runtime_env
from tests.conftest import ListSink
from tests.reference import assert_stats_close, group_stats, value_stats
from tests.remote_estimators import OtherGRPO, PlainGRPO, watched_grpo
from tests.services import require_module

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
MASK = torch.ones(8, 3)


REWARD_KEYS = ("count", "nan_count", "inf_count", "mean", "std", "min", "max")


def reward_stats(rewards) -> dict:
    return {k: v for k, v in value_stats(np.asarray(rewards, np.float64)).items() if k in REWARD_KEYS}


def check_record(metrics: dict, rewards: torch.Tensor, prompts, advantages: torch.Tensor) -> None:
    assert_stats_close(metrics, reward_stats(rewards.numpy()), "rewards/")
    assert_stats_close(metrics, value_stats(advantages.numpy().astype(np.float64)), "advantages/post_norm/")
    expected_groups = group_stats(rewards.numpy().astype(np.float64), [int(p) for p in prompts], (0.0, 1.0))
    assert_stats_close(metrics, expected_groups, "")


# --------------------------------------------------------------------------- pickling


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_instrumented_instances_and_watched_functions_pickle_without_their_monitor(dumps):
    sink = ListSink()
    monitor = advmon.Monitor("pickled-run", sinks=[sink], reward_range=(0, 1))
    estimator = advmon.instrument(PlainGRPO(), monitor)
    copy = pickle.loads(dumps(estimator))
    assert is_watched(copy.compute_advantage, monitor)  # found again by its run name
    advantages = copy.compute_advantage(PROMPTS, REWARDS, MASK)
    assert torch.equal(advantages, PlainGRPO().compute_advantage(PROMPTS, REWARDS, MASK))
    function = pickle.loads(dumps(watched_grpo))
    assert function is watched_grpo or is_watched(function)
    monitor.close()
    assert len(sink.records) == 1
    check_record(sink.records[0].metrics, REWARDS, PROMPTS, advantages)
    assert "_thread" not in repr(dumps(estimator))  # no lock, no monitor inside


def test_a_class_instrumented_in_main_travels_by_value_with_cloudpickle():
    code = textwrap.dedent(
        """
        import sys, cloudpickle, torch, advmon
        class Local:
            def compute_advantage(self, prompt_ids, rewards, mask):
                return (rewards - rewards.mean()).unsqueeze(-1) * mask
        monitor = advmon.Monitor("main-run", sinks=[])
        advmon.instrument(Local, monitor)
        sys.stdout.buffer.write(cloudpickle.dumps(Local()))
        """
    )
    payload = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=ROOT).stdout
    sink = ListSink()
    monitor = advmon.Monitor("main-run", sinks=[sink])
    estimator = cloudpickle.loads(payload)
    estimator.compute_advantage(PROMPTS, REWARDS, MASK)
    monitor.close()
    assert [r.metrics["rewards/count"] for r in sink.records] == [8]


def test_a_pickled_estimator_records_in_a_fresh_process_from_advmon_variables(tmp_path):
    monitor = advmon.Monitor("sent-run", sinks=[])
    payload = cloudpickle.dumps(advmon.instrument(PlainGRPO(), monitor))
    monitor.close()
    code = textwrap.dedent(
        """
        import sys, pickle, torch, advmon.lifecycle as lifecycle
        estimator = pickle.loads(sys.stdin.buffer.read())
        assert lifecycle.current_default() is None  # nothing made before a call is recorded
        prompts = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
        torch.save(estimator.compute_advantage(prompts, rewards, torch.ones(8, 3)), sys.argv[1])
        """
    )
    environment = {**os.environ, "ADVMON_DIR": str(tmp_path / "runs"), "ADVMON_REWARD_RANGE": "0,1",
                   "PYTHONPATH": str(ROOT)}
    environment.pop("ADVMON_RUN", None)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "adv.pt")], input=payload, check=True, cwd=tmp_path,
                   env=environment)
    [record] = advmon.read_jsonl(tmp_path / "runs" / "sent-run.jsonl")  # named after the sender's run
    check_record(record.metrics, REWARDS, PROMPTS, torch.load(tmp_path / "adv.pt"))


def test_activation_creates_nothing_until_a_call_and_patches_targets_on_import(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys, torch
        import advmon.integrations.activation as activation, advmon.lifecycle as lifecycle
        activation.activate()
        assert "tests.remote_estimators" not in sys.modules
        assert lifecycle.current_default() is None and not os.path.exists(os.environ["ADVMON_DIR"])
        from tests.remote_estimators import PlainGRPO
        from advmon.hooks import is_watched
        assert is_watched(PlainGRPO.compute_advantage)
        assert lifecycle.current_default() is None and not os.path.exists(os.environ["ADVMON_DIR"])
        prompts = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
        torch.save(PlainGRPO().compute_advantage(prompts, rewards, torch.ones(8, 3)), sys.argv[1])
        print(lifecycle.current_default().run)
        """
    )
    environment = {**os.environ, "ADVMON_DIR": str(tmp_path / "runs"), "ADVMON_RUN": "activated",
                   "ADVMON_PER_PROCESS": "1", "ADVMON_REWARD_RANGE": "0,1",
                   "ADVMON_INSTRUMENT": "tests.remote_estimators:PlainGRPO", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "adv.pt")], check=True, cwd=tmp_path,
                            env=environment, capture_output=True, text=True)
    assert result.stdout.strip() == "activated"
    [path] = (tmp_path / "runs").iterdir()
    assert path.name.startswith("activated.") and path.name.endswith(".jsonl")  # <run>.<host>-<pid>.jsonl
    [record] = advmon.read_jsonl(path)
    check_record(record.metrics, REWARDS, PROMPTS, torch.load(tmp_path / "adv.pt"))


def test_bad_variables_are_named_in_the_error():
    from advmon.config.environment import monitor_settings, parse_targets

    with pytest.raises(AdvmonConfigError, match="ADVMON_REWARD_RANGE"):
        monitor_settings({"ADVMON_REWARD_RANGE": "0"})
    with pytest.raises(AdvmonConfigError, match="ADVMON_INSTRUMENT entry 'not a target'"):
        parse_targets("not a target")
    with pytest.raises(AdvmonConfigError, match="cannot import 'no_such_module_here'"):
        monitor_settings({"ADVMON_STEP_SOURCE": "no_such_module_here:step"})
    with pytest.raises(AdvmonConfigError, match="group_size must be an int"):
        parse_targets("m:C(group_size=four)")


def test_runtime_env_merges_with_the_users_and_carries_instrumented_classes():
    monitor = advmon.Monitor("carrying", sinks=[])
    advmon.instrument(OtherGRPO, monitor, groups="prompt_ids")
    previous = advmon.set_monitor(monitor)  # the run every worker records by default
    try:
        env = runtime_env(
            {"env_vars": {"HF_HOME": "/data"}, "pip": ["x"], "worker_process_setup_hook": "my_pkg.setup"},
            sinks=["ray-metrics"], instrument=["my_pkg.est:Estimator(rewards=scores)"],
        )
    finally:
        advmon.set_monitor(previous)
        monitor.close()
    variables = env["env_vars"]
    assert env["pip"] == ["x"] and variables["HF_HOME"] == "/data"
    assert env["worker_process_setup_hook"] == SETUP_HOOK and variables["ADVMON_NEXT_SETUP_HOOK"] == "my_pkg.setup"
    assert variables["ADVMON_RUN"] == "carrying"
    assert "my_pkg.est:Estimator(rewards=scores)" in variables["ADVMON_INSTRUMENT"].split(";")
    assert "tests.remote_estimators:OtherGRPO" in variables["ADVMON_INSTRUMENT"].split(";")
    assert variables["ADVMON_SINKS"] == "ray-metrics"
    # Ray may end a worker before its exit handlers are done: its records are finished before a call returns.
    assert variables["ADVMON_FINISH_ON_CALLER"] == "1"
    assert runtime_env(run="r", finish_on_caller=False)["env_vars"]["ADVMON_FINISH_ON_CALLER"] == "0"
    with pytest.raises(AdvmonConfigError):
        runtime_env(sinks=["nonsense:1"])


def test_a_ray_actor_class_is_refused_with_the_way_out():
    ray = require_module("ray")
    actor_class = ray.remote(PlainGRPO)
    with pytest.raises(AdvmonConfigError, match="runtime_env"):
        advmon.instrument(actor_class)


def test_advmon_flush_emits_the_step_a_step_source_holds():
    sink = ListSink()
    step = {"value": 7}
    monitor = advmon.Monitor("held", sinks=[sink], step_source=lambda: step["value"])
    advmon.instrument(PlainGRPO(), monitor).compute_advantage(PROMPTS, REWARDS, MASK)
    assert sink.records == []  # step 7 may get more calls
    advmon.flush()
    assert [r.step for r in sink.records] == [7]
    monitor.close()


def test_sigterm_flushes_the_held_step_then_terminates_as_before(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys, time, torch, advmon
        from advmon.integrations.activation import install_sigterm_flush
        from tests.remote_estimators import PlainGRPO
        monitor = advmon.Monitor("sigterm", sinks=[advmon.JsonlSink(sys.argv[1])], step_source=lambda: 4)
        install_sigterm_flush()
        advmon.instrument(PlainGRPO(), monitor).compute_advantage(
            torch.tensor([0, 0, 1, 1]), torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.ones(4, 2))
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "r.jsonl")], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert process.stdout.readline().strip() == "ready"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == -signal.SIGTERM  # still terminated by the signal
    assert [r.step for r in advmon.read_jsonl(tmp_path / "r.jsonl")] == [4]


# --------------------------------------------------------------------------- a real Ray cluster


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = require_module("ray")
    require_module("verl")
    directory = tmp_path_factory.mktemp("ray-runs")
    monitor = advmon.Monitor("ray-driver", sinks=[])
    advmon.instrument(OtherGRPO, monitor)  # instrumented in the driver: carried by runtime_env
    env = runtime_env(
        {"env_vars": {"PYTHONPATH": str(ROOT), "RAY_DEDUP_LOGS": "0"}},
        run="ray-e2e", verl=True, directory=directory, reward_range=(0, 1),
    )
    ray.init(num_cpus=2, runtime_env=env, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield ray, directory
    ray.shutdown()
    monitor.close()


def verl_batch(seed: int):
    from verl import DataProto

    rng = np.random.default_rng(seed)
    size, length = 8, 6
    lengths = rng.integers(2, length + 1, size)
    mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.float32)
    scores = (rng.random(size) < 0.5).astype(np.float32)
    rewards = np.zeros((size, length), np.float32)
    rewards[np.arange(size), lengths - 1] = scores
    uid = np.array([f"p{i // 4}" for i in range(size)], dtype=object)
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": torch.from_numpy(rewards), "response_mask": torch.from_numpy(mask)},
        non_tensors={"uid": uid},
    )
    return batch, scores, uid, mask


class VerlTrainer:
    """What verl's TaskRunner does each step, inside an actor: set the step, compute advantages."""

    def step(self, step: int, seed: int):
        from verl.trainer.config import AlgoConfig
        from verl.trainer.ppo import ray_trainer
        from verl.utils.skip.skip_manager import SkipManager

        SkipManager.set_step(step)
        batch, *_ = verl_batch(seed)
        result = ray_trainer.compute_advantage(batch, adv_estimator="grpo", config=AlgoConfig(adv_estimator="grpo"))
        return os.getpid(), result.batch["advantages"]

    def run(self, estimator, name: str):
        from verl.utils.skip.skip_manager import SkipManager

        SkipManager.set_step(100)
        return os.getpid(), getattr(estimator, name)(PROMPTS, REWARDS, MASK)

    def carried(self):
        from tests.remote_estimators import OtherGRPO

        SkipManager = __import__("verl.utils.skip.skip_manager", fromlist=["SkipManager"]).SkipManager
        SkipManager.set_step(200)
        return os.getpid(), OtherGRPO().compute_advantage(PROMPTS, REWARDS, MASK), is_watched(OtherGRPO.compute_advantage)

    def pid(self):
        return os.getpid()


def records_of(directory: Path, pid: int, timeout: float = 30.0) -> list:
    paths = list(directory.glob(f"ray-e2e.*-{pid}.jsonl"))
    deadline = time.monotonic() + timeout
    while not paths and time.monotonic() < deadline:
        time.sleep(0.2)
        paths = list(directory.glob(f"ray-e2e.*-{pid}.jsonl"))
    return advmon.read_jsonl(paths[0]) if paths else []


def wait_for_exit(pid: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)


def test_verl_in_a_ray_actor_records_every_step_at_verls_step_even_the_last(ray_cluster):
    ray, directory = ray_cluster
    trainer = ray.remote(VerlTrainer).remote()
    idle = ray.remote(VerlTrainer).remote()
    results = [ray.get(trainer.step.remote(step, seed=step)) for step in (1, 2, 3)]
    pid = results[0][0]
    idle_pid = ray.get(idle.pid.remote())
    assert ray.get(trainer.pid.remote()) == pid
    trainer.__ray_terminate__.remote()  # graceful actor exit: the held step 3 is emitted
    wait_for_exit(pid)
    records = records_of(directory, pid)
    assert [r.step for r in records] == [1, 2, 3]
    for record, (step, (_, advantages)) in zip(records, zip((1, 2, 3), results)):
        _, scores, uid, mask = verl_batch(step)
        metrics = record.metrics
        assert_stats_close(metrics, reward_stats(scores), "rewards/")
        assert_stats_close(metrics, value_stats(advantages.numpy().astype(np.float64), mask.astype(bool)),
                           "advantages/post_norm/")
        assert_stats_close(metrics, group_stats(scores.astype(np.float64), list(uid), (0.0, 1.0)), "")
    assert not list(directory.glob(f"*-{idle_pid}.jsonl"))  # a worker that records nothing writes nothing


def test_an_instrumented_instance_and_a_carried_class_record_inside_the_actor(ray_cluster):
    ray, directory = ray_cluster
    monitor = advmon.Monitor("driver-side", sinks=[])
    estimator = advmon.instrument(PlainGRPO(), monitor)
    actor = ray.remote(VerlTrainer).remote()
    pid, advantages = ray.get(actor.run.remote(estimator, "compute_advantage"))
    _, carried, watched = ray.get(actor.carried.remote())
    assert watched
    actor.__ray_terminate__.remote()
    wait_for_exit(pid)
    monitor.close()
    records = records_of(directory, pid)
    assert [r.step for r in records] == [100, 200]
    check_record(records[0].metrics, REWARDS, PROMPTS, advantages)
    check_record(records[1].metrics, REWARDS, PROMPTS, carried)


def test_sigterm_to_an_actor_keeps_its_held_step(ray_cluster):
    ray, directory = ray_cluster
    actor = ray.remote(VerlTrainer).remote()
    pid, _ = ray.get(actor.step.remote(5, seed=5))
    os.kill(pid, signal.SIGTERM)
    wait_for_exit(pid)
    assert [r.step for r in records_of(directory, pid)] == [5]


class MetricsRecorder:
    """An actor whose records go to Ray's metrics agent (``ADVMON_SINKS=ray-metrics``)."""

    def record(self, rewards: torch.Tensor):
        import advmon as advmon_in_actor
        from tests.remote_estimators import PlainGRPO as Estimator

        advantages = advmon_in_actor.instrument(Estimator()).compute_advantage(PROMPTS, rewards, MASK)
        advmon_in_actor.flush(10)  # the step source (verl's counter) holds the step until it changes
        return advantages


def test_ray_metrics_reach_prometheus_where_the_generated_rules_and_boards_read_them(ray_cluster, tmp_path):
    from advmon.rules import CATALOG, PromContext, Thresholds
    from tests.services import start_prometheus, wait_for
    from tests.test_prometheus import query

    ray, _ = ray_cluster
    port = ray._private.worker.global_worker.node.metrics_export_port
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # every group zero-std
    actor = ray.remote(MetricsRecorder).options(
        runtime_env={"env_vars": {"ADVMON_SINKS": "ray-metrics", "ADVMON_RUN": "ray-metrics-run"}}
    ).remote()
    ray.get(actor.record.remote(rewards))
    prometheus, url = start_prometheus(tmp_path, {"ray": f"127.0.0.1:{port}"})
    try:
        selector = PromContext(selector='run="ray-metrics-run"')
        # Ray's agent exports every ~10 s; Prometheus scrapes every second.
        [sample] = wait_for(lambda: query(url, selector.metric("advmon_reward_mean")), 60, "ray_advmon_reward_mean")
        assert sample["metric"]["__name__"] == "ray_advmon_reward_mean"
        assert float(sample["value"][1]) == pytest.approx(float(np.mean(rewards.numpy())), rel=1e-12)
        zero_std = next(rule for rule in CATALOG if rule.name == "AdvmonZeroStdGroupsHigh")
        firing = query(url, zero_std.promql(Thresholds.with_overrides(), selector))
        assert [s["metric"]["run"] for s in firing] == ["ray-metrics-run"]
        board = query(url, f'max({selector.metric("advmon_zero_std_group_ratio")})')
        assert float(board[0]["value"][1]) == 1.0
    finally:
        prometheus.stop()


def test_an_instance_of_a_class_instrumented_here_arrives_instrumented_in_a_fresh_process(tmp_path):
    """NeMo-RL builds its estimator in the driver and pickles it into the controller's actor."""
    code = textwrap.dedent(
        """
        import sys, pickle, torch
        from tests.remote_estimators import PlainGRPO
        from advmon.hooks import is_watched
        assert not is_watched(PlainGRPO.compute_advantage)  # the plain class, as imported here
        estimator = pickle.loads(sys.stdin.buffer.read())
        assert is_watched(PlainGRPO.compute_advantage)      # instrumented on arrival
        assert estimator.settings == {"epsilon": 1e-6}
        prompts = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
        rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
        torch.save(estimator.compute_advantage(prompts, rewards, torch.ones(8, 3)), sys.argv[1])
        """
    )
    payload = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(
            """
            import sys, pickle, advmon
            from tests.remote_estimators import PlainGRPO
            monitor = advmon.Monitor("class-run", sinks=[])
            advmon.instrument(PlainGRPO, monitor)      # the class, before the loop builds its estimator
            estimator = PlainGRPO()
            estimator.settings = {"epsilon": 1e-6}     # the instance's own state travels as before
            sys.stdout.buffer.write(pickle.dumps(estimator))
            """)],
        capture_output=True, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    ).stdout
    environment = {**os.environ, "ADVMON_DIR": str(tmp_path / "runs"), "ADVMON_REWARD_RANGE": "0,1",
                   "PYTHONPATH": str(ROOT)}
    environment.pop("ADVMON_RUN", None)
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "adv.pt")], input=payload, check=True, cwd=ROOT,
                   env=environment)
    [record] = advmon.read_jsonl(tmp_path / "runs" / "class-run.jsonl")
    check_record(record.metrics, REWARDS, PROMPTS, torch.load(tmp_path / "adv.pt"))


def test_nemo_rl_single_controller_records_in_its_actor_at_the_step_it_logs(ray_cluster):
    """The estimator is built and instrumented in the driver, sent in the actor's args, and
    called there once per chunk; the step is the controller's ``_train_steps + 1``."""
    import advmon.integrations.nemo_rl as advmon_nemo
    from tests import remote_estimators

    ray, directory = ray_cluster
    monitor = advmon.Monitor("nemo-driver", sinks=[])
    advmon_nemo.instrument(monitor, module=remote_estimators)
    estimator = remote_estimators.GRPOAdvantageEstimator({}, {})
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(3):
        rewards = torch.from_numpy((rng.random(16) < 0.5).astype(np.float32))
        prompt_ids = torch.arange(4).repeat_interleave(4).unsqueeze(-1)
        batches.append([(prompt_ids[:8], rewards[:8], MASK), (prompt_ids[8:], rewards[8:], MASK)])
    controller = ray.remote(remote_estimators.SingleControllerActor).options(
        runtime_env={"env_vars": {"ADVMON_STEP_SOURCE": advmon_nemo.STEP_SOURCE, "ADVMON_RUN": "nemo-sc"}}
    ).remote({}, {"advantage_estimator": estimator, "current_step": 0}, {})
    advantages = ray.get(controller.run.remote(batches))
    pid = ray.get(controller.pid.remote())
    controller.__ray_terminate__.remote()
    wait_for_exit(pid)
    monitor.close()
    [path] = directory.glob(f"nemo-sc.*-{pid}.jsonl")
    records = advmon.read_jsonl(path)
    assert [r.step for r in records] == [1, 2, 3]  # NeMo-RL logs step k after computing its advantages
    for index, record in enumerate(records):
        rewards = torch.cat([batches[index][0][1], batches[index][1][1]])
        prompts = torch.cat([batches[index][0][0], batches[index][1][0]])[:, 0]
        check_record(record.metrics, rewards, prompts, torch.cat(advantages[2 * index: 2 * index + 2]))


def test_the_setup_hook_never_raises_and_runs_the_users_own_hook_after(monkeypatch, recwarn):
    import advmon.integrations.activation as activation
    from advmon.integrations.ray import setup_worker
    from tests import remote_estimators

    monkeypatch.setenv("ADVMON_INSTRUMENT", "this is not a target")
    monkeypatch.setenv("ADVMON_NEXT_SETUP_HOOK", "tests.remote_estimators.users_own_setup_hook")
    before = len(remote_estimators.HOOK_CALLS)
    try:  # whatever fails, the next test starts without this one's activation
        setup_worker()  # a bad variable: one warning, the worker starts unrecorded
        assert len(remote_estimators.HOOK_CALLS) == before + 1
        assert any("not recording in this worker" in str(w.message) for w in recwarn)
        calls = []
        setup_worker(then=lambda: calls.append("mine"))  # a callable hook of the user's, chained by runtime_env
        assert calls == ["mine"]
    finally:
        activation.deactivate()


def test_bad_advmon_variables_never_reach_the_training_loop(monkeypatch, recwarn):
    """The process-wide monitor is built on the first call: a bad variable costs a warning, not the call."""
    previous = advmon.set_monitor(None)
    monkeypatch.setenv("ADVMON_REWARD_RANGE", "zero to one")
    try:
        watched = advmon.watch(lambda prompt_ids, rewards, mask: rewards * 2)
        for _ in range(3):
            assert torch.equal(watched(PROMPTS, REWARDS, MASK), REWARDS * 2)
    finally:
        advmon.set_monitor(previous)
    messages = [str(w.message) for w in recwarn if "run unrecorded" in str(w.message)]
    assert len(messages) == 1 and "ADVMON_REWARD_RANGE" in messages[0]


def test_locally_defined_watched_functions_and_methods_travel_by_value_with_cloudpickle():
    sink = ListSink()
    monitor = advmon.Monitor("local-run", sinks=[sink])

    @monitor.watch
    def compute_advantage(prompt_ids, rewards, mask):
        return (rewards - rewards.mean()).unsqueeze(-1) * mask

    class Estimator:
        @monitor.watch
        def compute_advantage(self, prompt_ids, rewards, mask):
            return (rewards - rewards.mean()).unsqueeze(-1) * mask

    function = cloudpickle.loads(cloudpickle.dumps(compute_advantage))
    estimator = cloudpickle.loads(cloudpickle.dumps(Estimator()))
    assert torch.equal(function(PROMPTS, REWARDS, MASK), compute_advantage(PROMPTS, REWARDS, MASK))
    estimator.compute_advantage(PROMPTS, REWARDS, MASK)
    monitor.close()
    assert len(sink.records) == 3  # the copies found the monitor of their run
    with pytest.raises(TypeError, match="does not pickle.*ADVMON_"):
        pickle.dumps(monitor)


def test_a_nested_class_target_round_trips_and_is_watched_on_import(tmp_path):
    from advmon.config.environment import Target, parse_targets
    from advmon.hooks import ArgumentNames

    nested = Target("tests.remote_estimators", "Holder.Nested", "compute_advantage", ArgumentNames())
    assert parse_targets(nested.spec) == [nested]
    code = textwrap.dedent(
        """
        import advmon.integrations.activation as activation
        activation.activate()
        from tests.remote_estimators import Holder
        from advmon.hooks import is_watched
        assert is_watched(Holder.Nested.compute_advantage)
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(ROOT), "ADVMON_INSTRUMENT": nested.spec})

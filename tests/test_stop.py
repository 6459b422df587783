"""Stopping a run on an alert (Monitor(stop_on=...)): off by default, the record and the alert first, then the flag."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import advmon
from advmon.errors import AdvmonConfigError

from .services import free_port

GROUP = 8


def grpo(monitor: advmon.Monitor):
    """A float64 GRPO estimator (groups of 8 in a row): healthy batches raise no alert, NaN rewards do."""

    @monitor.watch(groups=None, group_size=GROUP, normalization="group_std")
    def compute_advantage(rewards, mask):
        grouped = rewards.double().view(-1, GROUP)
        advantages = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
        return advantages.reshape(-1, 1).expand(mask.shape)

    return compute_advantage


def batch(step: int, nan: bool = False, groups: int = 4):
    generator = torch.Generator().manual_seed(step)
    rewards = (torch.rand(groups * GROUP, generator=generator) < 0.5).float()
    rewards[::GROUP] = 1.0  # no group is all-equal...
    rewards[1::GROUP] = 0.0  # ...so no zero-std alert either
    if nan:
        rewards[3] = math.nan
    return rewards, torch.ones(groups * GROUP, 6)


def train(monitor: advmon.Monitor, steps: int, nan_from: int | None, after_step=lambda step: None) -> int:
    """The plain loop the docs show: a step, then ``if monitor.should_stop: break``; the last step run."""
    estimator = grpo(monitor)
    for step in range(steps):
        with monitor.step(step):
            estimator(*batch(step, nan=nan_from is not None and step >= nan_from))
        after_step(step)
        if monitor.should_stop:
            break
    return step


class SlowNotifier:
    """A notifier that takes its time (a slow Slack): what it was given, and what it finished sending, in
    ``events`` too (a list the test may add its own events to, to see what happened first)."""

    name = "slow"

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.given: list = []
        self.sent: list = []
        self.events: list[str] = []  # lists and events: the monitor may hold a copy of the notifier
        self.release = threading.Event()

    def send(self, message) -> None:
        self.given.append(message)
        self.events.append(f"given {message.alert}")
        self.release.wait(self.seconds)
        self.sent.append(message)
        self.events.append(f"sent {message.alert}")


def test_off_by_default_a_critical_alert_changes_nothing(tmp_path):
    monitor = advmon.Monitor("never", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl")])
    assert train(monitor, 5, nan_from=1) == 4  # every step ran
    monitor.close()
    assert monitor.should_stop is False and monitor.stop_reason is None and monitor.stop_on == ()
    assert sum(r.metrics["rewards/nan_count"] > 0 for r in advmon.read_jsonl(tmp_path / "r.jsonl")) == 4


def test_a_plain_loop_stops_at_the_step_the_critical_alert_fires(tmp_path, caplog):
    jsonl = tmp_path / "r.jsonl"
    monitor = advmon.Monitor("stops", sinks=[advmon.JsonlSink(jsonl)], stop_on="critical")
    assert "AdvmonNonFiniteRewards" in monitor.stop_on and "AdvmonZeroStdGroupsHigh" not in monitor.stop_on
    with caplog.at_level(logging.WARNING, logger="advmon"):
        assert train(monitor, 10, nan_from=4) == 4
    reason = monitor.stop_reason
    assert (reason.alert, reason.severity, reason.step, reason.value) == ("AdvmonNonFiniteRewards", "critical", 4, 1.0)
    records = advmon.read_jsonl(jsonl)  # before close: the file already holds the step that stopped the run
    assert [r.step for r in records] == [0, 1, 2, 3, 4] and records[-1].metrics["rewards/nan_count"] == 1
    said = [r.getMessage() for r in caplog.records if r.name == "advmon"]
    assert len(said) == 1 and "run stops asks the training loop to stop: AdvmonNonFiniteRewards" in said[0]
    assert "at step 4" in said[0]
    monitor.close()
    assert monitor.should_stop  # it stays true


def test_a_list_of_alert_names_stops_on_those_alone(tmp_path):
    monitor = advmon.Monitor("zero-std", sinks=[], stop_on=["AdvmonZeroStdGroupsHigh"])
    estimator = grpo(monitor)
    stopped = None
    for step in range(8):
        rewards, mask = batch(step, nan=step == 1)  # a NaN reward is critical, but not named: no stop
        if step >= 3:
            rewards[:] = 1.0  # every group all-equal from step 3: the rule fires on its third record, step 5
        with monitor.step(step):
            estimator(rewards, mask)
        if monitor.should_stop:
            stopped = step
            break
    monitor.close()
    assert stopped == 5 and monitor.stop_reason.alert == "AdvmonZeroStdGroupsHigh"


def test_whoever_sees_should_stop_finds_the_record_written_and_the_alert_sent(tmp_path):
    """The flag turns true last: a thread watching it never sees it before the JSONL line and the notifier."""
    jsonl = tmp_path / "r.jsonl"
    slow = SlowNotifier(0.5)
    monitor = advmon.Monitor("ordered", sinks=[advmon.JsonlSink(jsonl)], alerts=[slow], stop_on="critical")
    seen = {}

    def watch() -> None:
        while not monitor.should_stop:
            time.sleep(0.0005)
        seen["steps"] = [r.step for r in advmon.read_jsonl(jsonl)]
        seen["sent"] = [(m.status, m.alert, m.step) for m in slow.sent]

    watcher = threading.Thread(target=watch)
    watcher.start()
    assert train(monitor, 10, nan_from=2) == 2
    sent_when_the_loop_stopped = [(m.status, m.alert, m.step) for m in slow.sent]
    watcher.join(10)
    monitor.close()
    assert seen["steps"] == [0, 1, 2]
    # The NaN reward makes NaN advantages too: both alerts of the step were sent before the flag turned.
    assert seen["sent"] == [("firing", "AdvmonNonFiniteRewards", 2), ("firing", "AdvmonNonFiniteAdvantages", 2)]
    # The step that fired waited for the notifier (the loop saw the flag only after both were sent), once.
    assert sent_when_the_loop_stopped == seen["sent"] and len(slow.given) == 2


def test_a_notifier_that_hangs_delays_the_stop_by_close_timeout_at_most(tmp_path):
    """Was ``1 <= elapsed < 5`` seconds. What it stood for: the step that fired hands the alert to the notifier
    before the loop sees the flag; the wait for it is bounded (the loop stops while the notifier still hangs, which
    it would do for an hour); the bound is ``close_timeout``, and the warning says so; ``close()`` then delivers
    what the notifier had not sent."""
    hung = SlowNotifier(3600)
    monitor = advmon.Monitor("hung", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl")], alerts=[hung],
                             stop_on="critical", close_timeout=1)
    stopped_at: list[int] = []

    def run_the_loop() -> None:
        stopped_at.append(train(monitor, 10, nan_from=1))
        hung.events.append("loop stopped")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loop = threading.Thread(target=run_the_loop)
        loop.start()
        loop.join(120)  # a hang guard: a wait without a bound would hold the loop for the notifier's hour
        assert not loop.is_alive(), "the loop waited for the hung notifier without a bound"
    assert stopped_at == [1] and monitor.should_stop
    # Handed over first; the loop stopped while the notifier still hung.
    assert hung.events == ["given AdvmonNonFiniteRewards", "loop stopped"] and not hung.release.is_set()
    said = [str(w.message) for w in caught if issubclass(w.category, advmon.AdvmonWarning)]
    assert any("had not reached its notifiers within 1s (close_timeout); stopping anyway" in m for m in said), said
    hung.release.set()
    monitor.close()
    assert [m.alert for m in hung.sent][:1] == ["AdvmonNonFiniteRewards"]  # close delivered it


@pytest.mark.parametrize(
    ("stop_on", "expected"),
    [
        ("warning", "stop_on must be None, 'critical' or a list of alert names, got 'warning'"),
        ("AdvmonNonFiniteRewards", "(one alert: stop_on=['AdvmonNonFiniteRewards'])"),
        (True, "stop_on must be None, 'critical' or a list of alert names, got True"),
        ([], "stop_on is an empty list"),
        (["AdvmonNanRewards"], "stop_on: unknown alert 'AdvmonNanRewards'; known: AdvmonNonFiniteRewards"),
        (["AdvmonRunHung"], "AdvmonRunHung is evaluated by Prometheus only"),
    ],
)
def test_stop_on_is_checked_when_the_monitor_is_made(stop_on, expected):
    with pytest.raises(AdvmonConfigError) as error:
        advmon.Monitor("bad", sinks=[], stop_on=stop_on)
    assert expected in str(error.value)


# --------------------------------------------------------------------------- reduce="ranks"


def _ranks_worker(rank: int, world: int, port: int, workdir: str) -> None:
    os.chdir(workdir)
    # A rank that did not learn rank 0's decision would wait in the next step's gather: fail instead of hanging.
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        monitor = advmon.Monitor("ranks-stop", reduce="ranks", stop_on="critical")
        estimator = grpo(monitor)
        for step in range(8):
            rewards, mask = batch(step, nan=rank == 1 and step == 3)  # only rank 1's shard is broken
            with monitor.step(step):
                estimator(rewards, mask)
            if monitor.should_stop:
                break
        reason = monitor.stop_reason
        (open(f"rank{rank}.txt", "w")).write(f"{step} {reason.alert} {reason.step}")
        monitor.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_every_rank_stops_at_the_step_rank_0_saw_the_alert(tmp_path):
    mp.spawn(_ranks_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["3 AdvmonNonFiniteRewards 3"] * 2
    records = advmon.read_jsonl(tmp_path / "advmon-runs" / "ranks-stop.jsonl")
    assert [r.step for r in records] == [0, 1, 2, 3] and records[-1].metrics["rewards/nan_count"] == 1


# --------------------------------------------------------------------------- TRL


def test_a_trl_grpo_trainer_stops_at_the_step_whose_rewards_turn_nan(tmp_path, monkeypatch):
    """A real GRPOTrainer on a tiny Llama: the reward function returns NaN from its third call (step 3)."""
    from .services import FakeSlack, require_module

    require_module("trl")
    from . import trl_run

    calls = []

    def breaks_at_three(completions, **_):
        calls.append(1)
        return [math.nan if len(calls) >= 3 else float(len(c) % 2) for c in completions]

    slack = FakeSlack()
    monkeypatch.setenv("ADVMON_TEST_SLACK", slack.url)
    jsonl = tmp_path / "run.jsonl"
    try:
        monitor = advmon.Monitor("trl-stop", sinks=[advmon.JsonlSink(jsonl)], alerts=["slack:ADVMON_TEST_SLACK"],
                                 stop_on="critical")
        trainer = trl_run.trainer(tmp_path, monitor, reward_funcs=[breaks_at_three], max_steps=8)
        trainer.train()
        posted = [post["json"]["attachments"][0]["title"] for post in slack.posts]  # before close: sent already
        monitor.close()
    finally:
        slack.stop()
    assert trainer.state.global_step == 3 and len(calls) == 3  # no generation after the step that fired
    records = advmon.read_jsonl(jsonl)
    assert [r.step for r in records] == [1, 2, 3]
    assert records[-1].metrics["rewards/nan_count"] == records[-1].metrics["rewards/count"] == 8
    assert monitor.stop_reason.alert == "AdvmonNonFiniteRewards" and monitor.stop_reason.step == 3
    assert any("[FIRING] AdvmonNonFiniteRewards" in title for title in posted)
    assert [h["step"] for h in trainer.state.log_history if "reward" in h] == [1, 2, 3]  # TRL logged step 3, then stopped


DDP_SCRIPT = """
import json, math, sys
from pathlib import Path

import advmon
from tests import trl_run

out = Path(sys.argv[1])
calls = []


def breaks_at_three(completions, **_):
    calls.append(1)
    return [math.nan if len(calls) >= 3 else float(len(c) % 2) for c in completions]


monitor = advmon.Monitor("trl-ddp-stop", sinks=[advmon.JsonlSink(out / "trl-ddp-stop.jsonl")], stop_on="critical")
trainer = trl_run.trainer(out / "trainer", monitor, reward_funcs=[breaks_at_three], per_device_train_batch_size=4,
                          max_steps=8)
trainer.train()
monitor.close()
rank = trainer.accelerator.process_index
(out / f"rank{rank}.json").write_text(json.dumps({"global_step": trainer.state.global_step, "calls": len(calls)}))
"""


def test_two_trl_processes_stop_together_at_the_step_the_main_process_decided(tmp_path):
    """Only the main process records; the other learns the decision at the same step (or it would wait forever)."""
    import json
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from .services import require_module

    require_module("trl")
    root = Path(__file__).resolve().parents[1]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun comes with torch"
    script = tmp_path / "ddp_stop.py"
    script.write_text(DDP_SCRIPT)
    environment = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    done = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), str(script),
                           str(tmp_path)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"global_step": 3, "calls": 3}] * 2
    assert [r.step for r in advmon.read_jsonl(tmp_path / "trl-ddp-stop.jsonl")] == [1, 2, 3]


# --------------------------------------------------------------------------- a framework's own loop


def test_a_loop_over_the_trainers_dataloader_ends_after_the_step_that_fired(tmp_path):
    """verl's fit and SkyRL's train take one batch a step from a torchdata StatefulDataLoader, inside epochs."""
    from .services import require_module

    require_module("torchdata")
    from torchdata.stateful_dataloader import StatefulDataLoader

    from advmon.stopping import until_stop

    loader = StatefulDataLoader(list(range(12)), batch_size=2)  # 6 batches an epoch
    steps: list[int] = []
    # verl's monitor follows verl's step counter: a step's record is due when the next step's call comes.
    monitor = advmon.Monitor("loader-stop", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl")], stop_on="critical",
                             step_source=lambda: len(steps))
    estimator = grpo(monitor)
    wrapped = until_stop(loader, monitor)
    assert len(wrapped) == 6 and wrapped.batch_size == 2  # what the trainer asks of its loader
    for epoch in range(3):  # the frameworks' shape: for epoch in range(total_epochs): for batch in loader:
        for _ in wrapped:
            step = len(steps)
            estimator(*batch(step, nan=step == 8))
            steps.append(step)
    monitor.close()
    assert steps == list(range(9))  # the step that fired ran to its end, no batch after it was taken
    assert wrapped.state_dict() == loader.state_dict() and loader.state_dict()["_num_yielded"] == 3  # 6 + 3
    assert [r.step for r in advmon.read_jsonl(tmp_path / "r.jsonl")][-1] == 8

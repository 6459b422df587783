"""Delivery off the training thread: slow and dead sinks never slow or break training."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch

import advmon
from advmon.sinks.delivery import DeliveryPolicy, SinkWorker

from .services import wait_for


class SlowSink(advmon.Sink):
    name = "slow"

    def __init__(self, delay: float, gate: threading.Event | None = None):
        self.delay = delay
        self.gate = gate
        self.entered = threading.Event()
        self.steps: list[int] = []

    def write(self, record):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(60)  # 60 s: a hang guard; the tests open the gate
        time.sleep(self.delay)
        self.steps.append(record.step)


def quiet_monitor(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", advmon.AdvmonWarning)  # no JSONL on purpose
        return advmon.Monitor(*args, **kwargs)


def test_a_watched_call_does_not_wait_for_a_slow_sink(sink):
    gate = threading.Event()  # opened only after the calls returned
    slow = SlowSink(0.0, gate)
    monitor = quiet_monitor("slow", sinks=[slow, sink])
    for _ in range(5):
        monitor.observe(rewards=torch.ones(8))
    assert slow.entered.wait(60)  # the slow sink holds record 0 at the closed gate...
    assert slow.steps == []  # ...so the five calls returned before it finished any record
    assert len(sink.records) == 5  # the synchronous sink has them already
    gate.set()
    monitor.close()
    assert slow.steps == [0, 1, 2, 3, 4]


def test_a_full_queue_drops_the_oldest_for_the_slow_sink_only(sink):
    gate = threading.Event()
    slow = SlowSink(0.0, gate)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = advmon.Monitor("drops", sinks=[slow, sink], queue_size=3)
        monitor.observe(rewards=torch.ones(2))
        assert slow.entered.wait(60)  # the worker holds record 0 at the closed gate
        for _ in range(9):
            monitor.observe(rewards=torch.ones(2))
        monitor.wait()  # all nine handed to the queues (off this thread) while the gate holds record 0
        gate.set()
        monitor.flush(timeout=60)
        monitor.observe(rewards=torch.ones(2))
        monitor.close()
    assert len(sink.records) == 11  # the other sink is unaffected
    # The first record was taken by the worker before the gate; of the nine
    # queued behind it only the newest three survive.
    assert slow.steps[:1] == [0] and slow.steps[1:4] == [7, 8, 9]
    assert sink.records[-1].metrics["advmon/dropped_records/slow"] == 6
    # Regression (off by one): each record counts the drop its own arrival caused.
    counts = [r.metrics["advmon/dropped_records/slow"] for r in sink.records[1:10]]
    assert counts == [0, 0, 0, 1, 2, 3, 4, 5, 6]
    messages = [str(w.message) for w in caught if issubclass(w.category, advmon.AdvmonWarning)]
    assert sum("too slow" in m for m in messages) == 1


def test_close_waits_then_reports_what_it_could_not_deliver(sink):
    gate = threading.Event()  # set only after close returned: the sink hangs through it
    hanging = SlowSink(0.0, gate)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = advmon.Monitor("hang", sinks=[hanging, sink], close_timeout=0.3)
        for _ in range(4):
            monitor.observe(rewards=torch.ones(2))
        assert hanging.entered.wait(60)
        started = time.monotonic()
        monitor.close()  # returns although the sink never finished a record
        waited = time.monotonic() - started
    assert hanging.steps == [] and not gate.is_set()
    assert waited >= 0.3  # it did wait its close_timeout first (a lower bound: a busy machine only adds)
    assert any("4 record(s) of run hang could not be delivered to sink slow" in str(w.message) for w in caught)
    gate.set()


def test_retries_with_backoff_then_counts_an_error():
    attempts = []

    class Flaky(advmon.Sink):
        def write(self, record):
            attempts.append(time.monotonic())
            if len(attempts) < 3:
                raise TimeoutError("slow backend")

    failures = []
    worker = SinkWorker(Flaky(), "flaky", DeliveryPolicy(retries=3, backoff_seconds=0.05), lambda k, m: failures.append(k))
    worker.put(advmon.Record("r", 0, 0.0, "e", None, {}))
    assert worker.drain(60) == 0
    assert len(attempts) == 3 and worker.delivered == 1 and worker.errors == 0 and failures == []
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert gaps[0] >= 0.05 and gaps[1] >= 0.1  # exponential backoff
    worker.stop(1)


def test_sink_specs_and_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVMON_SINKS", f"jsonl:{tmp_path / 'extra.jsonl'}, prometheus:127.0.0.1:0")
    with advmon.Monitor("env") as monitor:
        names = [type(s).__name__ for s in monitor.sinks]
        assert names == ["JsonlSink", "JsonlSink", "PrometheusSink"]
        monitor.observe(rewards=torch.ones(2))
    assert (tmp_path / "advmon-runs" / "env.jsonl").exists() and (tmp_path / "extra.jsonl").exists()
    for bad, message in (("kafka:x", "unknown sink"), ("pushgateway", "needs a URL"), ("prometheus:abc", "number")):
        monkeypatch.setenv("ADVMON_SINKS", bad)
        with pytest.raises(advmon.AdvmonConfigError, match=message) as info:
            advmon.Monitor("bad")
        assert "jsonl[:PATH]" in str(info.value) or message == "number"
    monkeypatch.delenv("ADVMON_SINKS")
    with pytest.raises(advmon.AdvmonConfigError, match="valid forms"):
        advmon.Monitor("bad", sinks=["wandb", "nope"])


def test_only_rank_zero_records_unless_told_otherwise(monkeypatch, tmp_path, sink):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "3")
    monitor = advmon.Monitor("ranks", sinks=[sink])
    watched = monitor.watch(lambda prompt_ids, rewards, mask: rewards)
    assert watched(None, torch.ones(2), None).tolist() == [1.0, 1.0]
    monitor.observe(rewards=torch.ones(2))
    monitor.close()
    assert not monitor.enabled and sink.records == [] and monitor.sinks == []
    with advmon.Monitor("ranks") as everywhere_default:
        pass
    assert everywhere_default.sinks == []
    with advmon.Monitor("ranks", all_ranks=True) as everywhere:
        everywhere.observe(rewards=torch.ones(2))
    assert (tmp_path / "advmon-runs" / "ranks.rank3.jsonl").exists()


def test_process_exit_delivers_what_is_queued(tmp_path):
    import subprocess
    import sys
    import textwrap

    out = tmp_path / "delivered.txt"
    script = textwrap.dedent(
        f"""
        import time, torch, advmon

        class SlowFileSink(advmon.Sink):
            name = "slowfile"
            def write(self, record):
                time.sleep(0.2)
                with open({str(out)!r}, "a") as f:
                    f.write(f"{{record.step}}\\n")

        monitor = advmon.Monitor("exit", sinks=[advmon.JsonlSink({str(tmp_path / 'r.jsonl')!r}), SlowFileSink()])
        for _ in range(4):
            monitor.observe(rewards=torch.ones(2))
        # no close(): the interpreter's exit must deliver the queue
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert out.read_text().split() == ["0", "1", "2", "3"]


def test_a_sink_with_a_delivery_interval_gets_bursts_and_flush_delivers_at_once():
    """W&B's run.log is heavy Python: its records go in bursts, not one GIL fight per record."""

    class BurstSink(SlowSink):
        delivery_interval = 3600.0  # far longer than the test: only a drain or a full batch delivers

    burst = BurstSink(0.0)
    monitor = quiet_monitor("burst", sinks=[burst])
    for _ in range(3):
        monitor.observe(rewards=torch.ones(8))
    time.sleep(0.3)
    assert burst.steps == []  # held for the burst
    monitor.flush(timeout=60)  # 60 s: a hang guard, and still far short of the interval
    assert burst.steps == [0, 1, 2]  # a drain does not wait for the interval
    from advmon.sinks.delivery import MAX_BATCH

    for _ in range(MAX_BATCH):
        monitor.observe(rewards=torch.ones(8))
    # A full batch is a burst of its own: delivered without a drain, long before the interval.
    wait_for(lambda: len(burst.steps) == 3 + MAX_BATCH, 60, "the full batch's burst")
    assert burst.steps == list(range(3 + MAX_BATCH))
    monitor.observe(rewards=torch.ones(8))
    monitor.close()
    assert burst.steps[-1] == 3 + MAX_BATCH  # close delivers the held rest

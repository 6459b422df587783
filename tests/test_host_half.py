"""A record's host half runs off the training thread (issue 26): what it must keep holding.

Each watched call returns once its record's one transfer has started; the record is
finished, and its JSONL line written, on the monitor's own thread (advmon.host_half).
These tests hold the promises that made that safe: the training thread never waits
for it nor sees its failures, records reach the sinks in step order, nothing is lost
at close, across threads, at fork or at SIGTERM, and the host half never starts a
second OpenMP team.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch

import advmon
import advmon.assembly
from advmon.host_half import HostHalf

from .conftest import ListSink

HANG_GUARD = 60.0  # seconds; a hang guard, not a timing assert


class GatedSink(advmon.Sink):
    """A synchronous sink whose write waits at a gate, so the host half is held at a known record."""

    name = "gated"
    synchronous = True

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.steps: list[int] = []
        self.threads: set[str] = set()

    def write(self, record):
        self.entered.set()
        self.threads.add(threading.current_thread().name)
        assert self.gate.wait(HANG_GUARD)
        self.steps.append(record.step)


def test_watched_calls_return_while_the_host_half_holds_a_record():
    gated = GatedSink()
    monitor = advmon.Monitor("held", sinks=[gated])
    for n in range(5):
        monitor.observe(rewards=torch.arange(float(n + 2)))
    assert gated.entered.wait(HANG_GUARD)
    assert gated.steps == []  # five calls returned while record 0 waited in the sink
    gated.gate.set()
    assert monitor.wait(HANG_GUARD)
    assert gated.steps == [0, 1, 2, 3, 4]
    assert gated.threads == {"advmon-host-held"} and threading.current_thread().name not in gated.threads
    monitor.close()


@pytest.mark.parametrize("groups", ["prompt rows", "uids", "ids"])
def test_a_cpu_calls_groups_exemplars_and_slices_are_made_on_the_host_half(groups, monkeypatch):
    """On the CPU too, the call's [B]-sized work (group values and counts, the derived pre_norm, bounds, worst
    groups, slices, numbering verl's uids) runs on the monitor's thread; only what reads [B, S] or [B, T] (the
    prompt rows' numbering, the sketch, row summaries) is done during the call."""
    import advmon.observation
    import advmon.stats.groups

    threads: dict[str, set[str]] = {}

    def spied(module, name):
        original = getattr(module, name)

        def spy(*args, **kwargs):
            threads.setdefault(name, set()).add(threading.current_thread().name)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    for name in ("reward_segments", "group_statistics", "call_bounds", "worst_groups", "slice_table"):
        spied(advmon.observation, name)
    spied(advmon.stats.groups, "_hashable_group_ids")
    rng = np.random.default_rng(0)
    prompts = torch.from_numpy(rng.integers(0, 50, (8, 5))).repeat_interleave(4, dim=0)
    by_kind = {"prompt rows": prompts, "uids": np.array([f"u{i // 4}" for i in range(32)], dtype=object),
               "ids": torch.arange(32) // 4}
    rewards = torch.from_numpy(rng.integers(0, 2, 32)).float()
    sink = ListSink()
    with advmon.Monitor("cpu-host", sinks=[sink], exemplars=3) as monitor:
        monitor.observe(rewards=rewards, advantages=torch.from_numpy(rng.normal(size=(32, 6))).float(),
                        mask=torch.ones(32, 6), groups=by_kind[groups], slices=["a", "b"] * 16)
    expected = {"reward_segments", "group_statistics", "call_bounds", "worst_groups", "slice_table"}
    if groups == "uids":
        expected.add("_hashable_group_ids")
    assert set(threads) == expected
    assert all(names == {"advmon-host-cpu-host"} for names in threads.values()), threads
    record = sink.records[-1]
    assert record.metrics["groups/count"] == 8.0 and len(record.exemplars) == 3
    assert record.metrics["slices/a/rewards/count"] == 16.0


@pytest.mark.parametrize("from_environment", [False, True])
def test_finish_on_caller_writes_the_jsonl_line_before_the_call_returns(from_environment, tmp_path, monkeypatch):
    """For processes that can end without exit handlers (Ray workers): no record waits on the monitor's thread."""
    from advmon.config.environment import monitor_settings

    path = tmp_path / "caller.jsonl"
    gated = GatedSink()
    gated.gate.set()
    if from_environment:
        monkeypatch.setenv("ADVMON_FINISH_ON_CALLER", "1")
        assert monitor_settings()["finish_on_caller"] is True
    monitor = advmon.Monitor("caller", sinks=[advmon.JsonlSink(path), gated],
                             finish_on_caller=monitor_settings()["finish_on_caller"] if from_environment else True)
    for n in range(3):
        monitor.observe(rewards=torch.arange(float(n + 2)), groups=[0] * (n + 2))
        assert len(path.read_text().splitlines()) == n + 1  # no wait: written during the call
    assert gated.threads == {threading.current_thread().name}
    monitor.close()
    monkeypatch.setenv("ADVMON_FINISH_ON_CALLER", "maybe")
    with pytest.raises(advmon.AdvmonConfigError, match="ADVMON_FINISH_ON_CALLER"):
        monitor_settings()


def test_records_reach_the_sinks_in_step_order_whatever_each_costs():
    sink = ListSink()
    monitor = advmon.Monitor("order", sinks=[sink])
    sizes = [20_000 if step % 2 == 0 else 3 for step in range(12)]  # large and small records, alternating
    for size in sizes:
        monitor.observe(rewards=torch.linspace(0, 1, size), advantages=torch.linspace(-1, 1, size))
    monitor.close()
    assert [r.step for r in sink.written] == list(range(12))
    assert [r.metrics["rewards/count"] for r in sink.written] == [float(size) for size in sizes]


def test_last_metrics_waits_for_the_record_being_finished():
    gated = GatedSink()
    monitor = advmon.Monitor("waits", sinks=[gated])
    monitor.observe(rewards=torch.tensor([0.0, 1.0, 3.0]))
    threading.Timer(0.05, gated.gate.set).start()  # opens while last_metrics waits
    assert monitor.last_metrics["rewards/mean"] == pytest.approx(np.mean([0.0, 1.0, 3.0]))
    monitor.close()


def test_a_failing_host_half_costs_a_warning_and_a_counter_and_keeps_what_was_known(monkeypatch):
    """A device call whose groups cannot be finished on the host: the record is still written with its statistics."""
    monkeypatch.setenv("ADVMON_STATISTICS_PATH", "torch")  # a device path: groups are finished on the host

    def broken(*args, **kwargs):
        raise FloatingPointError("a NumPy error in the host half")

    monkeypatch.setattr(advmon.assembly, "finish_on_host", broken)
    sink = ListSink()
    monitor = advmon.Monitor("broken-host", sinks=[sink])
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.5, 0.25])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor.observe(rewards=rewards, advantages=rewards - rewards.mean(), group_size=2)  # never raises
        assert monitor.wait(HANG_GUARD)
    messages = [str(w.message) for w in caught]
    assert any("NumPy error in the host half" in m for m in messages), messages
    assert monitor.internal_errors == 1
    (record,) = sink.written
    assert record.metrics["advantages/post_norm/count"] == 6
    assert record.metrics["advantages/post_norm/mean"] == pytest.approx(0.0, abs=1e-7)
    assert record.metrics["advmon/internal_errors"] == 1
    monitor.close()


def test_a_record_the_host_half_cannot_make_is_counted_and_the_next_one_is_made(monkeypatch):
    real = advmon.assembly.summaries_of
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("no room for this record's summaries")
        return real(*args, **kwargs)

    monkeypatch.setattr(advmon.assembly, "summaries_of", fails_once)
    sink = ListSink()
    monitor = advmon.Monitor("lost-one", sinks=[sink])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor.observe(rewards=torch.tensor([1.0, 2.0]))
        monitor.observe(rewards=torch.tensor([1.0, 2.0, 3.0]))
        monitor.close()
    assert any("no room for this record" in str(w.message) for w in caught)
    assert [r.step for r in sink.written] == [1]
    assert sink.written[0].metrics["advmon/internal_errors"] == 1


def test_close_finishes_every_record_handed_over():
    class Slow(advmon.Sink):
        name = "slow"
        synchronous = True

        def __init__(self):
            self.steps = []

        def write(self, record):
            threading.Event().wait(0.01)
            self.steps.append(record.step)

    slow = Slow()
    monitor = advmon.Monitor("slow-close", sinks=[slow], close_timeout=HANG_GUARD)
    for _ in range(30):
        monitor.observe(rewards=torch.ones(4))
    monitor.close()
    assert slow.steps == list(range(30))


def test_four_threads_under_one_monitor_lose_and_mix_no_record(tmp_path):
    path = tmp_path / "threads.jsonl"
    monitor = advmon.Monitor("threads", sinks=[advmon.JsonlSink(path)])
    calls = 25

    def train(thread: int) -> None:
        for call in range(calls):
            size = 2 + thread * calls + call  # every call's size is its own: a mixed record would show
            monitor.observe(rewards=torch.full((size,), float(thread)), advantages=torch.arange(float(size)))

    workers = [threading.Thread(target=train, args=(t,)) for t in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(HANG_GUARD)
    monitor.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(4 * calls))  # numbered and written in one order
    seen = set()
    for r in records:
        size = int(r["metrics"]["rewards/count"])
        thread, call = divmod(size - 2, calls)
        assert r["metrics"]["rewards/mean"] == thread
        assert r["metrics"]["advantages/post_norm/max"] == size - 1
        seen.add((thread, call))
    assert len(seen) == 4 * calls


def _mkl_threads() -> Callable[[], int]:
    """MKL's team size for the calling thread (torch's CPU build links MKL and exports it)."""
    for library in sorted({line.split()[-1] for line in open("/proc/self/maps") if "libtorch_cpu" in line}):
        getter = ctypes.CDLL(library).mkl_get_max_threads_
        getter.restype = ctypes.c_int
        return getter
    raise AssertionError("torch's CPU library is not loaded")


def test_the_host_half_runs_one_openmp_thread_and_leaves_the_trainers_alone():
    """Its OpenMP team and its BLAS calls' (MKL) team are one thread, after the trainer set torch's thread count
    (which sets MKL's process-wide count: the host half's dot products would start a team of that size, and
    their sums would differ from the training thread's one-thread statistics)."""
    mkl_threads = _mkl_threads()

    class Threads(advmon.Sink):
        name = "threads"
        synchronous = True
        seen: list[tuple[str, int, int]] = []

        def write(self, record):
            self.seen.append((threading.current_thread().name, torch.get_num_threads(), mkl_threads()))

    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert mkl_threads() == 2
        sink = Threads()
        monitor = advmon.Monitor("omp", sinks=[sink])
        monitor.observe(rewards=torch.rand(50_000), advantages=torch.rand(50_000))
        monitor.close()
        assert sink.seen == [("advmon-host-omp", 1, 1)]
        assert torch.get_num_threads() == 2 and mkl_threads() == 2  # the training thread's teams are its own
    finally:
        torch.set_num_threads(previous)


def test_host_half_work_that_raises_is_reported_and_the_next_work_runs():
    reported, done = [], []
    half = HostHalf("raises", report=reported.append)
    half.submit(lambda: 1 / 0)
    half.submit(lambda: done.append("next"))
    assert half.wait(HANG_GUARD)
    assert [type(e) for e in reported] == [ZeroDivisionError] and done == ["next"]
    assert half.stop(HANG_GUARD)


def test_a_full_backlog_makes_the_caller_wait_for_room_and_loses_nothing():
    gate, done = threading.Event(), []
    half = HostHalf("backlog", report=print, capacity=2)
    half.submit(lambda: gate.wait(HANG_GUARD))
    half.submit(lambda: done.append(1))
    half.submit(lambda: done.append(2))  # the first is running: two wait, the backlog is full
    third = threading.Thread(target=half.submit, args=(lambda: done.append(3),))
    third.start()
    third.join(0.2)
    assert third.is_alive()  # waits for room rather than growing without bound
    gate.set()
    third.join(HANG_GUARD)
    assert half.wait(HANG_GUARD) and done == [1, 2, 3]
    half.stop(HANG_GUARD)


# --------------------------------------------------------------------------- processes

ESTIMATOR = """
import os, sys, signal, threading, json
import torch
import advmon

class Slow(advmon.Sink):
    # after the JSONL line: keeps the host half a few records behind the training thread
    name = "slow"
    synchronous = True
    def write(self, record):
        threading.Event().wait(0.01)

monitor = advmon.Monitor("proc", sinks=[advmon.JsonlSink(sys.argv[1]), Slow()])

@monitor.watch(groups=None, group_size=4, mask=None)
def compute_advantage(rewards):
    return rewards - rewards.mean()

def call(n):
    compute_advantage(torch.arange(float(n % 7 + 4)))
"""


def run_script(tmp_path, body: str, before_monitor: str = "") -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the estimator script with ``body`` after it (and ``before_monitor`` before its monitor is made)."""
    script = tmp_path / "script.py"
    prelude = ESTIMATOR.replace("monitor = advmon.Monitor", textwrap.dedent(before_monitor) + "monitor = advmon.Monitor")
    script.write_text(prelude + textwrap.dedent(body))
    path = tmp_path / "proc.jsonl"
    done = subprocess.run([sys.executable, str(script), str(path)], capture_output=True, text=True,
                          timeout=HANG_GUARD, cwd=tmp_path)
    lines = path.read_text().splitlines() if path.exists() else []
    return done, [json.loads(line) for line in lines]  # a torn line fails here


def test_sigterm_right_after_the_50th_call_leaves_50_records(tmp_path):
    done, records = run_script(tmp_path, """
        for n in range(50):
            call(n)
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(60)
    """)
    assert done.returncode == -signal.SIGTERM, done.stderr  # still terminated by the signal
    assert [r["step"] for r in records] == list(range(50))
    assert [r["metrics"]["rewards/count"] for r in records] == [n % 7 + 4 for n in range(50)]


def test_sigterm_chains_to_the_handler_a_framework_set_first(tmp_path):
    # The framework's handler is in place before advmon's first record, and is called after the records are out.
    done, _ = run_script(tmp_path, """
        for n in range(20):
            call(n)
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(60)
    """, before_monitor="""
        def framework(signum, frame):
            print("framework handler saw", len(open(sys.argv[1]).read().splitlines()), "records", flush=True)
            os._exit(3)
        signal.signal(signal.SIGTERM, framework)
    """)
    assert done.returncode == 3, done.stderr
    assert "framework handler saw 20 records" in done.stdout


def test_a_handler_a_framework_sets_later_is_never_replaced(tmp_path):
    done, records = run_script(tmp_path, """
        call(0)
        def framework(signum, frame):
            os._exit(4)
        signal.signal(signal.SIGTERM, framework)
        for n in range(1, 5):
            call(n)
        assert signal.getsignal(signal.SIGTERM) is framework
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(60)
    """)
    assert done.returncode == 4, done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_forked_children_tear_no_line_of_the_parents_file(tmp_path):
    done, records = run_script(tmp_path, """
        for n in range(40):
            call(n)
            child = os.fork()  # while the host half is writing the parent's earlier records
            if child == 0:
                os._exit(0)  # a DataLoader worker: gone without atexit
            os.waitpid(child, 0)
        child = os.fork()
        if child == 0:  # a child that records on its own and exits normally (atexit closes its monitor)
            for n in range(3):
                compute_advantage(torch.ones(100))
            sys.exit(0)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        monitor.close()
    """)
    assert done.returncode == 0, done.stderr
    parents = [r for r in records if r["metrics"]["rewards/count"] != 100]
    assert [r["step"] for r in parents] == list(range(40))
    assert [r["metrics"]["rewards/count"] for r in parents] == [n % 7 + 4 for n in range(40)]
    # The recording child writes a file of its own, named for its process (issue 38, item 4), never the parent's.
    [own] = [p for p in tmp_path.glob("proc.*.jsonl")]
    childs = [json.loads(line) for line in own.read_text().splitlines()]
    assert len(childs) == 3 and all(r["metrics"]["rewards/count"] == 100 for r in childs)


def test_the_host_half_reads_its_own_copies_not_the_callers_inputs(monkeypatch):
    """A trainer may refill its tensors and lists once the call returned; the record is of what the call saw."""
    monkeypatch.setenv("ADVMON_STATISTICS_PATH", "torch")  # a device path: groups are finished on the host
    gated = GatedSink()
    sink = ListSink()
    monitor = advmon.Monitor("copies", sinks=[gated, sink], exemplars=2)
    uids = [f"prompt-{i // 4}" for i in range(12)]
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, float("nan"), 1.0, 0.0, 0.0, 0.0, 1.0])
    advantages = torch.linspace(-1.0, 1.0, 12)
    monitor.observe(rewards=torch.ones(3))  # record 0: the host half holds it in the gated sink...
    assert gated.entered.wait(HANG_GUARD)
    monitor.observe(rewards=rewards, advantages=advantages, groups=uids)  # ...so record 1 waits to be made
    uids[:] = ["refilled"] * 12  # while the trainer refills its inputs
    rewards.fill_(7.0)
    advantages.fill_(7.0)
    gated.gate.set()
    monitor.close()
    assert gated.steps == [0, 1]
    record = sink.written[1]
    finite = [1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert record.metrics["rewards/mean"] == pytest.approx(np.mean(finite))
    assert record.metrics["advantages/post_norm/max"] == pytest.approx(1.0)
    assert record.exemplars[0]["group"] == "prompt-1" and record.exemplars[0]["reason"] == "nonfinite_rewards"

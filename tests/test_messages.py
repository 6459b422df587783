"""advmon's messages point at the user's line and say what a user can do (issue 39, "Messages").

Each warning below is caused from this file, the way a training script causes it, and must name this file
(was: ``hooks.py:395 ... return run_watched(state, args, kwargs)``, ``jsonl.py:77``).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

import advmon
from advmon.cli import FINDING, OK, main
from advmon.record import Record
from advmon.sinks.jsonl import JsonlSink, one_history
from tests.services import free_port


@contextmanager
def said_here() -> Iterator[list[warnings.WarningMessage]]:
    """The advmon warnings the block causes; each must name this file as where it happened."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        said: list[warnings.WarningMessage] = []
        yield said
    said.extend(w for w in caught if issubclass(w.category, advmon.AdvmonWarning))
    assert said, "the block warned nothing"
    for w in said:
        assert w.filename == __file__, f"{w.message} points at {w.filename}:{w.lineno}"


def messages(said: list[warnings.WarningMessage]) -> str:
    return "\n".join(str(w.message) for w in said)


def test_a_watched_function_that_returns_no_tensor():
    monitor = advmon.Monitor("messages-watch", sinks=[])

    @monitor.watch
    def compute_advantage(prompt_ids, rewards, mask):
        return object()

    with said_here() as said:
        compute_advantage(torch.arange(2), torch.ones(2), None)
    assert "expected a tensor" in messages(said)
    monitor.close()


def test_an_instrumented_estimator_called_without_rewards():
    class Estimator:
        def compute_advantage(self, prompt_ids, rewards, mask):
            return torch.zeros(2, 3)

    monitor = advmon.Monitor("messages-instrument", sinks=[])
    estimator = advmon.instrument(Estimator(), monitor)
    with said_here() as said:
        estimator.compute_advantage(torch.arange(2), None, torch.ones(2, 3))
    assert "no rewards" in messages(said)
    monitor.close()


def test_a_problem_found_at_the_end_of_a_step():
    """The record of ``with monitor.step(...)`` is made where the block ends, through contextlib's frames."""
    monitor = advmon.Monitor("messages-step", sinks=[])
    with said_here() as said:
        with monitor.step(0):
            monitor.observe(rewards=torch.zeros(0), advantages=torch.zeros(0, 5), mask=torch.zeros(0, 5))
        monitor.close()
    assert "the batch is empty" in messages(said)


def test_a_call_on_a_closed_monitor():
    monitor = advmon.Monitor("messages-closed", sinks=[])
    watched = monitor.watch(lambda prompt_ids, rewards, mask: rewards)
    monitor.close()
    with said_here() as said:
        watched(None, torch.ones(2), None)
    assert "closed" in messages(said)


def test_a_sink_that_fails_on_its_own_thread_is_said_at_the_users_next_call():
    """A queued sink fails on a worker thread, where no line is the user's: the warning waits for the training
    thread's next call (here ``close``), and names that line."""
    failed = threading.Event()

    class Broken(advmon.Sink):
        def write(self, record):
            failed.set()
            raise ConnectionError("backend down")

    monitor = advmon.Monitor("messages-sink", sinks=[Broken()], retries=0)
    with said_here() as said:
        monitor.observe(rewards=torch.ones(2))
        assert failed.wait(60)
        monitor.close()
    text = messages(said)
    assert "backend down" in text and "lost 1 record(s)" in text


def test_a_second_monitor_of_one_run(tmp_path):
    first = advmon.Monitor("messages-twice", sinks=[])
    with said_here() as said:
        second = advmon.Monitor("messages-twice", sinks=[])
    assert "already had an open Monitor" in messages(said) and first.closed
    second.close()


def test_an_earlier_runs_file_moved_aside(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(Record("r", 0, 0.0, "e", None, {"x": 1.0}).to_json() + "\n")
    with said_here() as said:
        JsonlSink(path).write(Record("r", 0, 1.0, "e", None, {"x": 2.0}))
    assert "held the records of an earlier run" in messages(said)


def test_an_earlier_runs_file_moved_aside_by_a_monitor(tmp_path):
    """The same warning, found on the monitor's own thread at the first record, said at the user's next call."""
    path = tmp_path / "run.jsonl"
    path.write_text(Record("r", 0, 0.0, "e", None, {"x": 1.0}).to_json() + "\n")
    with said_here() as said:
        monitor = advmon.Monitor("r", sinks=[JsonlSink(path)])
        monitor.observe(rewards=torch.ones(2))
        monitor.close()
    assert "held the records of an earlier run" in messages(said)


def test_damaged_lines_and_a_run_that_starts_again(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = [Record("r", step, 0.0, "e", None, {"x": 1.0}).to_json() for step in (0, 1, 2, 1)]
    path.write_text("\n".join(lines[:2]) + '\n{"cut short\n' + "\n".join(lines[2:]) + "\n")
    with said_here() as said:
        advmon.read_jsonl(path)
    assert "skipped 1 damaged line(s): 3" in messages(said)
    from advmon.runs import read_run

    with said_here() as said:
        read_run(path)
    assert "starts again at step 1" in messages(said)


def test_an_empty_file_skipped_in_a_directory(tmp_path):
    from advmon.runs import read_runs

    JsonlSink(tmp_path / "a.jsonl").write(Record("a", 0, 0.0, "e", None, {"x": 1.0}))
    (tmp_path / "b.jsonl").write_text("")
    with said_here() as said:
        read_runs(tmp_path)
    assert "no advmon records in it (the file is empty); skipped" in messages(said)


def test_instrumenting_again_for_another_monitor():
    class Estimator:
        def compute_advantage(self, prompt_ids, rewards, mask):
            return rewards

    first, second = advmon.Monitor("messages-first", sinks=[]), advmon.Monitor("messages-second", sinks=[])
    advmon.instrument(Estimator, first)
    with said_here() as said:
        advmon.instrument(Estimator, second)
    assert "again, for another monitor" in messages(said)
    first.close()
    second.close()


def test_no_monitor_for_watched_calls(monkeypatch):
    from advmon import hooks

    monkeypatch.setattr(hooks, "_unresolved_warned", set())
    monkeypatch.setenv("ADVMON_SINKS", "nosuchsink:x")
    previous = advmon.set_monitor(None)
    try:
        watched = advmon.watch(lambda prompt_ids, rewards, mask: rewards)
        with said_here() as said:
            watched(None, torch.ones(2), None)
        assert "no monitor for watched calls" in messages(said)
    finally:
        advmon.set_monitor(previous)


# ------------------------------------------------------------------ what the messages say


def write_records(path: Path, run: str, steps: list[int]) -> Path:
    sink = JsonlSink(path, resume=True)
    for step in steps:
        sink.write(Record(run, step, float(step), "e", None, {"rewards/mean": 0.5}))
    sink.close()
    return path


def test_a_run_that_restarted_twice_says_where_each_time():
    """Was: "starts again at step 5 (2 times)" for a run that restarted once at 5 and once at 3."""
    records = [Record("r", step, 0.0, "e", None, {}) for step in [0, 1, 2, 3, 4, 5, 6, 5, 6, 7, 3, 4]]
    with said_here() as said:
        kept = one_history(records, "run.jsonl")
    assert messages(said) == ("advmon: run.jsonl: run r starts again 2 times, at step 5 then at step 3, so 4 of its "
                              "records repeat a step recorded before; the latest record of each step is used")
    assert [r.step for r in kept] == [0, 1, 2, 5, 6, 7, 3, 4]  # ordered as written; each step's latest record
    with said_here() as said:
        one_history(records[:9], "run.jsonl")
    assert messages(said) == ("advmon: run.jsonl: run r starts again at step 5, so 2 of its steps were recorded "
                              "twice; the later record of each is used")


def test_replay_to_a_dead_pushgateway_says_one_line_with_a_count(tmp_path, capsys):
    """Was: one identical warning per record (40 lines)."""
    run = write_records(tmp_path / "run.jsonl", "r", list(range(40)))
    dead = free_port()  # nothing listens there
    assert main(["replay", str(run), "--to", f"pushgateway:http://127.0.0.1:{dead}", "--retries", "0"]) == FINDING
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert err[0].startswith(f"advmon: warning: 40 of 40 record(s) of run r (steps 0-39) not sent to "
                             f"pushgateway:http://127.0.0.1:{dead}: URLError: ")
    assert err[1] == f"advmon: error: 40 record(s) could not be sent; they stay in {run}: run the replay again"


def test_replay_into_an_existing_jsonl_gives_the_command_line_way_to_append(tmp_path, capsys):
    """Was: "Monitor(resume=True) (ADVMON_RESUME=1) continues a run in its file instead", to a CLI user."""
    source = write_records(tmp_path / "source.jsonl", "r", [2, 3])
    target = write_records(tmp_path / "target.jsonl", "r", [0, 1])
    assert main(["replay", str(source), "--to", f"jsonl:{target}"]) == OK
    err = capsys.readouterr().err
    follow = f"'advmon replay {source} --to jsonl:{target} --resume' continues a run in its file instead"
    assert err.startswith(f"advmon: warning: {target} held the records of an earlier run") and follow in err, err
    assert "Monitor(" not in err
    assert [r.step for r in advmon.read_jsonl(target)] == [2, 3]  # the earlier file was moved aside
    # Following the advice appends instead, and says nothing.
    assert main(["replay", str(source), "--to", f"jsonl:{target}", "--since-step", "3", "--resume"]) == OK
    assert capsys.readouterr().err == ""
    assert [r.step for r in advmon.read_jsonl(target)] == [2, 3, 3]


def test_a_monitor_still_names_its_own_way_to_resume(tmp_path):
    path = write_records(tmp_path / "run.jsonl", "r", [0])
    with said_here() as said:
        JsonlSink(path).write(Record("r", 0, 1.0, "e", None, {}))
    assert "Monitor(resume=True) (ADVMON_RESUME=1) continues a run in its file instead" in messages(said)


def test_a_forked_process_writing_a_file_of_its_own(tmp_path):
    """What a child of ``os.fork`` is told at its first record (its JSONL sink is put in the child's state here,
    as the fork handler does, so the warning is seen in this process)."""
    sink = JsonlSink(tmp_path / "run.jsonl")
    sink.write(Record("r", 0, 0.0, "e", None, {}))
    sink._forked()
    with said_here() as said:
        sink.write(Record("r", 1, 1.0, "e", None, {}))
    assert "is a fork of process" in messages(said)
    sink.close()


def test_a_queue_too_slow_for_its_sink():
    gate = threading.Event()
    entered = threading.Event()

    class Held(advmon.Sink):
        def write(self, record):
            entered.set()
            gate.wait(60)  # a hang guard; the test opens the gate

    monitor = advmon.Monitor("messages-slow", sinks=[Held()], queue_size=1)
    with said_here() as said:
        monitor.observe(rewards=torch.ones(2))
        assert entered.wait(60)
        for _ in range(3):
            monitor.observe(rewards=torch.ones(2))
        monitor.wait()
        gate.set()
        monitor.close()
    assert "is too slow" in messages(said)


def test_a_stopping_alert_its_notifier_did_not_take_in_time():
    release = threading.Event()

    class Hung:
        name = "hung"

        def send(self, message):
            release.wait(60)  # a hang guard; the test releases it

    monitor = advmon.Monitor("messages-stop", sinks=[], alerts=[Hung()], stop_on="critical", close_timeout=0.2)
    with said_here() as said:
        monitor.observe(rewards=torch.tensor([1.0, float("nan")]))
        assert monitor.should_stop
    release.set()
    monitor.close()
    assert "had not reached its notifiers" in messages(said)

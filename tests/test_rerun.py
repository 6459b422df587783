"""Issue 30, item 3: a script run again starts a run of its own, never silently appended to the last one."""

from __future__ import annotations

import warnings

import pytest
import torch

import advmon
from advmon.errors import AdvmonWarning
from advmon.runs import read_run


def run_script(steps: int = 3, **settings) -> list[str]:
    """The quickstart, as a script would run it: the default JSONL sink in ./advmon-runs; what advmon said."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", AdvmonWarning)
        with advmon.Monitor("quickstart", **settings) as monitor:
            watched = monitor.watch(lambda prompt_ids, rewards, mask: rewards - rewards.mean())
            for step in range(steps):
                with monitor.step(step):
                    watched(torch.arange(4) // 2, torch.tensor([1.0, 0.0, 1.0, 1.0]) * (step + 1), None)
    return [str(w.message) for w in said if issubclass(w.category, AdvmonWarning)]


def test_a_script_run_again_moves_the_earlier_run_aside_and_says_so_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_script() == []
    said = run_script(steps=2)
    assert len(said) == 1 and "held the records of an earlier run" in said[0] and "resume=True" in said[0]
    files = sorted(p.name for p in (tmp_path / "advmon-runs").iterdir())
    assert len(files) == 2 and "quickstart.jsonl" in files
    [aside] = [f for f in files if f != "quickstart.jsonl"]
    assert [r.step for r in advmon.read_jsonl(tmp_path / "advmon-runs" / "quickstart.jsonl")] == [0, 1]
    assert [r.step for r in advmon.read_jsonl(tmp_path / "advmon-runs" / aside)] == [0, 1, 2]
    # A third run keeps both earlier ones.
    run_script(steps=1)
    assert len(list((tmp_path / "advmon-runs").iterdir())) == 3


def test_resume_continues_the_run_and_readers_keep_one_history(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_script(steps=3)
    assert run_script(steps=2, resume=True) == []  # continued from a checkpoint at step 0: steps 0-1 again
    path = tmp_path / "advmon-runs" / "quickstart.jsonl"
    assert [r.step for r in advmon.read_jsonl(path)] == [0, 1, 2, 0, 1]  # the file keeps everything
    with pytest.warns(AdvmonWarning, match="run quickstart starts again at step 0, so 2 of its steps were recorded "
                                           "twice; the later record of each is used"):
        run = read_run(path)
    assert [r.step for r in run.records] == [0, 1, 2]
    # The later session's records win (its rewards were scaled 1x, 2x: the first session's step 1 had 2x too,
    # so compare the order instead): step 2 is the first session's, 0 and 1 the second's.
    times = [r.time for r in run.records]
    assert times[0] > times[2] and times[1] > times[2]
    from advmon.cli import main

    assert main(["alerts", "check", str(path)]) == 0
    assert "starts again at step 0" in capsys.readouterr().err


def test_advmon_resume_reaches_the_process_wide_monitor(tmp_path, monkeypatch):
    from advmon.monitor import monitor_from_environment

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVMON_RESUME", "1")
    monitor = monitor_from_environment("resumed")
    assert all(sink.resume for sink in monitor.sinks if isinstance(sink, advmon.JsonlSink))
    monitor.close()


def test_a_second_live_monitor_of_one_run_takes_it_over_and_never_shares_its_file(tmp_path):
    # Issue 38, item 6 (was: two live monitors of one run share its file, which mixed steps 0, 1, 0 in it).
    path = tmp_path / "shared.jsonl"
    first = advmon.Monitor("shared", sinks=[advmon.JsonlSink(path)])
    first.observe(rewards=torch.ones(2), advantages=torch.zeros(2))
    first.wait()
    with pytest.warns(AdvmonWarning) as said:
        second = advmon.Monitor("shared", sinks=[advmon.JsonlSink(path)])
        second.observe(rewards=torch.ones(2), advantages=torch.zeros(2))
        second.close()
    assert "already had an open Monitor" in str(said[0].message) and first.closed
    assert [r.step for r in advmon.read_jsonl(path)] == [0]
    assert len(list(tmp_path.iterdir())) == 2  # the first run's file, moved aside

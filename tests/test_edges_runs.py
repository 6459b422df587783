"""Issue 38 at the edges of a run: never moved, mixed or doubled; no page for a run that never was; verdicts
and counters that are true.

Each test is named after what broke, and fails on the main it was written against (ea1020f).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import advmon
from advmon.alerts import AlertmanagerSettings, AlertSettings, generate
from advmon.cli import main
from advmon.errors import AdvmonConfigError, AdvmonWarning
from advmon.monitor import monitor_from_environment
from advmon.record import Record
from advmon.reports.compare import compare_runs, within_rounding
from advmon.rules import Thresholds
from advmon.runs import Run, read_run
from advmon.sinks.prometheus import PrometheusSink, PushgatewaySink
from tests.services import free_port, http_get, start_prometheus, wait_for

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- item 12: one selector parser


@pytest.mark.parametrize("selector", ["job=grpo", 'job="grpo",', "job=~grpo", 'job="a"b"'])
def test_dashboards_generate_refuses_the_selector_alerts_generate_refuses(tmp_path, capsys, selector):
    said = []
    for command in ("alerts", "dashboards"):
        out = tmp_path / command
        assert main([command, "generate", "--out", str(out), "--selector", selector]) == 2
        said.append(capsys.readouterr().err)
        assert not out.exists()  # nothing written: no file of invalid queries
    assert said[0] == said[1] and said[0].count("\n") == 1 and 'label="value" matchers' in said[0]


# --------------------------------------------------------------------------- item 8: run names readers read back

#: Names advmon accepts that look like something else to a reader: a space, a colon, another
#: source form's prefix, a .wandb ending, non-ASCII letters.
ODD_BUT_READABLE = ["run 1", "grpo:tp2", "lr-1e-6_", "tb+x", "mlflow+y", "trackio+z", "x.wandb", "実験-é", "a%b=c"]


def test_every_run_name_advmon_accepts_is_read_back_by_summary_and_alerts_check(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ODD_BUT_READABLE:
        with advmon.Monitor(name) as monitor:  # the default sink: advmon-runs/<run>.jsonl
            monitor.observe(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2)
    folder = tmp_path / "advmon-runs"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{name}.jsonl" for name in ODD_BUT_READABLE)
    capsys.readouterr()
    for name in ODD_BUT_READABLE:
        assert main(["summary", str(folder / f"{name}.jsonl")]) == 0, capsys.readouterr().err
        assert name in capsys.readouterr().out
    assert main(["alerts", "check", "advmon-runs"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert all(f"run {name} (" in out for name in ODD_BUT_READABLE), out
    monkeypatch.chdir(folder)  # read from inside: the directory lists "tb+x.jsonl" with no folder before it
    assert main(["alerts", "check", "."]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert all(f"run {name} (" in out for name in ODD_BUT_READABLE), out
    for name in ODD_BUT_READABLE:
        assert main(["summary", f"{name}.jsonl"]) == 0, capsys.readouterr().err
        assert name in capsys.readouterr().out


@pytest.mark.parametrize(("name", "why"), [
    ("run#1", "contains '#'"),
    ("two\nlines", "unprintable character '\\n'"),
    ("tab\there", "unprintable character '\\t'"),
    (".hidden", "starts with '.'"),
    ("-lr1e-6", "starts with '-'"),
    ("para\u2029graph", "unprintable character"),
])
def test_a_run_name_a_reader_cannot_read_back_is_refused_at_monitor_with_the_rule(tmp_path, monkeypatch, name, why):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(AdvmonConfigError) as refused:
        advmon.Monitor(name)
    message = str(refused.value)
    assert why in message and "read back by every reader" in message and "without '/', '\\' or '#'" in message
    assert not (tmp_path / "advmon-runs").exists()
    monkeypatch.setenv("ADVMON_RUN", name)  # the process-wide monitor's name is checked by the same rule
    with pytest.raises(AdvmonConfigError, match="read back by every reader"):
        monitor_from_environment()


# --------------------------------------------------------------------------- item 5: one file, one sink


def _quiet_steps(monitor: advmon.Monitor, steps: int) -> None:
    _quiet_steps_from(monitor, 0, steps)


def _quiet_steps_from(monitor: advmon.Monitor, first: int, steps: int) -> None:
    for step in range(first, first + steps):
        with monitor.step(step):
            monitor.observe(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2)


@pytest.mark.parametrize("how", ["ADVMON_SINKS=jsonl", "sinks=['jsonl', 'jsonl']", "process-wide ADVMON_SINKS=jsonl",
                                 "the same JsonlSink twice"])
def test_two_sinks_writing_one_file_write_each_record_once(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "advmon-runs" / "doubled.jsonl"
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", AdvmonWarning)
        if how == "ADVMON_SINKS=jsonl":
            monkeypatch.setenv("ADVMON_SINKS", "jsonl")
            monitor = advmon.Monitor("doubled")
        elif how == "process-wide ADVMON_SINKS=jsonl":
            monkeypatch.setenv("ADVMON_SINKS", "jsonl")
            monitor = monitor_from_environment("doubled")
        elif how == "the same JsonlSink twice":
            sink = advmon.JsonlSink(path)
            monitor = advmon.Monitor("doubled", sinks=[sink, sink, "jsonl"])
        else:
            monitor = advmon.Monitor("doubled", sinks=["jsonl", "jsonl"])
        _quiet_steps(monitor, 3)
        monitor.close()
        assert [type(s).__name__ for s in monitor.sinks] == ["JsonlSink"]
        assert [r.step for r in advmon.read_jsonl(path)] == [0, 1, 2]
        assert [r.step for r in read_run(path).records] == [0, 1, 2]  # no restart to explain away
    assert [str(w.message) for w in said] == []
    assert "advmon/sink_errors/jsonl-2" not in monitor.last_metrics


# --------------------------------------------------------------------------- item 9: no ghost run


def _query(url: str, promql: str) -> list[dict]:
    data = json.loads(http_get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10))
    assert data["status"] == "success", data
    return data["data"]["result"]


@pytest.mark.integration
def test_a_prometheus_sink_made_before_its_monitor_pages_no_ghost_run_on_a_real_prometheus(tmp_path):
    """docs/sinks.md's pattern: the sink first, then its Monitor. Nothing may be served without a run's name: a
    series with run="" vanishes unfinished when the monitor takes the sink over, and pages AdvmonRunCrashed."""
    thresholds = Thresholds.with_overrides({"silent_seconds": 2, "crash_memory_seconds": 600})
    generate(tmp_path / "alerts", AlertSettings(thresholds=thresholds, interval_seconds=1.0), AlertmanagerSettings())
    sink = PrometheusSink(port=0, finish_timeout=10)
    endpoint = f"127.0.0.1:{sink.port}"
    assert b"advmon_" not in http_get(f"http://{endpoint}/metrics")  # not a run's yet: nothing to say
    prometheus, url = start_prometheus(tmp_path, {"trainer": endpoint},
                                       rule_files=[tmp_path / "alerts" / "advmon-rules.yml"])
    monitor = None
    try:
        # A hang guard of 60 s: Prometheus scrapes a new target within a few seconds, then every second.
        wait_for(lambda: _query(url, 'count_over_time(up{job="trainer"}[1m]) >= 3'), 60, "three scrapes of the sink")
        assert _query(url, '{__name__=~"advmon_.+", run=""}') == []  # no series without a run, none with run=""
        monitor = advmon.Monitor("owned", sinks=[advmon.JsonlSink(tmp_path / "owned.jsonl"), sink])
        monitor.observe(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]), group_size=2)
        monitor.wait()
        wait_for(lambda: _query(url, 'advmon_run_finished{run="owned"} == 0'), 60, "the run to be scraped")
        time.sleep(2 + 3)  # silent_seconds, and three evaluations after it: when the ghost would have fired
        assert _query(url, 'ALERTS{alertname="AdvmonRunCrashed"}') == []
        assert _query(url, '{__name__=~"advmon_.+", run=""}') == []
        assert {s["metric"]["run"] for s in _query(url, '{__name__=~"advmon_.+"}')} == {"owned"}
        monitor.close()  # finished: waits for a scrape to read it (about a second here)
        monitor = None
        assert _query(url, 'last_over_time(advmon_run_finished{run="owned"}[1m]) == 1')
    finally:
        if monitor is not None:
            monitor.close()
        prometheus.stop()


# --------------------------------------------------------------------------- item 10: rounding is not a divergence


def _healthy_records(run: str, pre_norm_mean, seed: int = 0) -> list[Record]:
    rng = np.random.default_rng(seed)
    records = []
    for step, mean in enumerate(pre_norm_mean):
        noise = rng.normal(0, 0.01)
        metrics = {"advantages/pre_norm/mean": float(mean), "advantages/pre_norm/std": 0.45 + noise,
                   "advantages/pre_norm/min": -1.0, "advantages/pre_norm/max": 1.0,
                   "advantages/post_norm/mean": float(mean), "advantages/post_norm/std": 1.0 + noise,
                   "advantages/post_norm/min": -2.0, "advantages/post_norm/max": 2.0,
                   "rewards/mean": 0.5 + noise, "rewards/min": 0.0, "rewards/max": 1.0,
                   "groups/zero_std_fraction": 0.25}
        records.append(Record(run, step, float(step), "grpo", None, metrics))
    return records


def test_compare_calls_rounding_noise_the_same_not_a_divergence(tmp_path, capsys):
    """A healthy run against itself with NaN injected: one side's centred mean is exactly 0, the other's float64
    sum leaves 1e-18..1.6e-17. That is the statistic's own rounding, not a difference between the runs."""
    steps = 60
    noise = np.random.default_rng(1).uniform(1e-18, 1.6e-17, steps)  # as the issue found it: above 0 at every step
    a = Run("healthy", "a.jsonl", _healthy_records("healthy", np.zeros(steps)))
    b = Run("injected", "b.jsonl", _healthy_records("injected", noise))
    comparison = compare_runs(a, b)
    verdicts = {s.key: s for s in comparison.statistics}
    assert not verdicts["advantages/pre_norm/mean"].diverged
    assert not verdicts["advantages/post_norm/mean"].diverged
    assert not comparison.diverged, comparison.to_text()
    # Through the command line, from the files the runs were written to: exit 0, "same".
    paths = []
    for run in (a, b):
        path = tmp_path / f"{run.name}.jsonl"
        path.write_text("".join(r.to_json() + "\n" for r in run.records))
        paths.append(str(path))
    assert main(["compare", *paths]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if "advantages/pre_norm/mean" in l)
    assert " same " in line and "DIVERGED" not in line


def test_compare_still_sees_a_difference_just_above_rounding():
    """The bar is the rounding (64 float64 units of the largest |value| behind the statistic), not a tolerance of
    convenience: a mean of 1e-12 against 0, in advantages of magnitude 1, is a real difference."""
    steps = 60
    a = Run("a", "a.jsonl", _healthy_records("a", np.zeros(steps)))
    b = Run("b", "b.jsonl", _healthy_records("b", np.full(steps, 1e-12)))
    verdicts = {s.key: s for s in compare_runs(a, b).statistics}
    assert verdicts["advantages/pre_norm/mean"].diverged
    assert within_rounding(np.zeros(2), np.array([1.4e-14, 1.5e-14]), np.ones(2)).tolist() == [0.0, 1.5e-14]


# --------------------------------------------------------------------------- item 11: counters that are current


def test_sink_error_counters_count_every_failure_after_flush_and_close_says_what_was_lost(tmp_path):
    """Against a dead Pushgateway every record of a 5-step run said advmon/sink_errors/pushgateway 0.0: each record
    is made before its push fails. Read after flush() or close(), the latest record counts them all."""
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    gateway = PushgatewaySink(dead, timeout=1.0, heartbeat_seconds=0)
    with pytest.warns(AdvmonWarning) as said:
        monitor = advmon.Monitor("dead-gateway", sinks=[advmon.JsonlSink(tmp_path / "run.jsonl"), gateway], retries=0)
        _quiet_steps(monitor, 5)
        monitor.flush()
        assert monitor.last_metrics["advmon/sink_errors/pushgateway"] == 5.0
        assert monitor.last_metrics["advmon/sink_errors/jsonl"] == 0.0
        _quiet_steps_from(monitor, 5, 3)
        monitor.close()
    assert monitor.last_metrics["advmon/sink_errors/pushgateway"] == 8.0
    lost = [str(w.message) for w in said if "lost" in str(w.message)]
    assert len(lost) == 1 and "sink pushgateway lost 8 record(s) of run dead-gateway" in lost[0], lost
    assert f"advmon replay {tmp_path / 'run.jsonl'} --to SPEC" in lost[0]
    assert len(advmon.read_jsonl(tmp_path / "run.jsonl")) == 8  # the file keeps them for the replay


# --------------------------------------------------------------------------- item 6: one run, one monitor


def test_a_notebook_cell_run_again_without_close_never_mixes_two_monitors_in_one_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = advmon.Monitor("notebook")  # the cell's first run: the default sink, advmon-runs/notebook.jsonl
    _quiet_steps(first, 2)
    first.wait()
    with pytest.warns(AdvmonWarning) as said:
        second = advmon.Monitor("notebook")  # the cell again: `first` is still open, its name rebound
        _quiet_steps(second, 1)
        second.close()
    messages = [str(w.message) for w in said]
    assert any("run 'notebook' already had an open Monitor in this process" in m and "closed now" in m
               for m in messages), messages
    assert first.closed and said[0].filename == __file__  # said where the user made the second monitor
    folder = tmp_path / "advmon-runs"
    assert [r.step for r in advmon.read_jsonl(folder / "notebook.jsonl")] == [0]  # the second run, alone
    [aside] = [p for p in folder.iterdir() if p.name != "notebook.jsonl"]
    assert [r.step for r in advmon.read_jsonl(aside)] == [0, 1]  # the first, whole and finished
    first.observe(rewards=torch.ones(2))  # the old cell's functions still hold `first`: recorded nowhere, no error


def test_the_process_wide_monitor_of_a_run_is_its_open_monitor(tmp_path, monkeypatch):
    """ADVMON_RUN names a run the user opened too: advmon.watch records into the user's monitor, and never opens a
    second one of that run (which would now close the user's)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVMON_RUN", "shared")
    previous = advmon.set_monitor(None)
    try:
        with advmon.Monitor("shared") as mine:
            assert advmon.get_monitor() is mine
            watched = advmon.watch(lambda prompt_ids, rewards, mask: rewards - rewards.mean())
            watched(torch.arange(4) // 2, torch.tensor([1.0, 0.0, 1.0, 1.0]), None)
            assert not mine.closed and mine.last_metrics["rewards/count"] == 4.0
        advmon.set_monitor(None)
        default = advmon.get_monitor()  # made from the variables first: a Monitor made later takes the run over
        with pytest.warns(AdvmonWarning, match="already had an open Monitor"):
            taking = advmon.Monitor("shared", sinks=[])
        assert default.closed and advmon.get_monitor() is taking
        taking.close()
    finally:
        advmon.set_monitor(previous)


# --------------------------------------------------------------------------- item 4: a fork never moves a run

FORKING = r"""
import os, sys, torch, advmon
folder, when = sys.argv[1], sys.argv[2]
monitor = advmon.Monitor("forked", sinks=[advmon.JsonlSink(os.path.join(folder, "forked.jsonl"))])

def record(first, steps, size):
    for n in range(first, first + steps):
        with monitor.step(n):
            monitor.observe(rewards=torch.ones(size))
    monitor.wait()

if when == "after":  # the parent's file is open when the worker forks
    record(0, 5, 4)
child = os.fork()
if child == 0:  # a DataLoader worker that records, then ends without exit handlers
    record(5, 5, 100)
    os._exit(0)
os.waitpid(child, 0)
record(5, 5, 4) if when == "after" else record(0, 2, 4)
monitor.close()
print(child)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
@pytest.mark.parametrize("when", ["after", "before"])
def test_a_forked_worker_never_moves_or_writes_its_parents_run(tmp_path, when):
    """The child's records go to a file named for its process, said once; the parent's file holds the parent's
    records, one per step, whichever process writes first. ("before": the parent forks before its first record,
    beside an earlier run's file, which only the parent moves aside.)"""
    earlier = Record("forked", 0, 0.0, "earlier", None, {"rewards/count": 7.0})
    if when == "before":
        (tmp_path / "forked.jsonl").write_text(earlier.to_json() + "\n")
    script = tmp_path / "forking.py"
    script.write_text(FORKING)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), when], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    child = int(done.stdout.split()[-1])
    theirs = tmp_path / f"forked.{socket.gethostname()}-{child}.jsonl"
    parent = advmon.read_jsonl(tmp_path / "forked.jsonl")
    steps = list(range(10)) if when == "after" else [0, 1]
    assert [r.step for r in parent] == steps and {r.metrics["rewards/count"] for r in parent} == {4.0}
    assert [(r.step, r.metrics["rewards/count"]) for r in advmon.read_jsonl(theirs)] == [(n, 100.0) for n in range(5, 10)]
    others = sorted(p.name for p in tmp_path.glob("forked*.jsonl") if p not in (theirs, tmp_path / "forked.jsonl"))
    if when == "before":  # the earlier run, moved aside once, by the parent
        [aside] = others
        assert [r.estimator for r in advmon.read_jsonl(tmp_path / aside)] == ["earlier"]
        assert done.stderr.count("held the records of an earlier run") == 1
    else:
        assert others == []
    assert done.stderr.count(f"process {child} is a fork of process") == 1 and str(theirs) in done.stderr


def test_advmon_sinks_jsonl_names_the_default_file_wherever_the_rank_puts_it(tmp_path, monkeypatch):
    """On rank 3 with all_ranks the default file is <run>.rank3.jsonl: a bare 'jsonl' in ADVMON_SINKS must not add
    rank 0's file, <run>.jsonl, as a second sink (two ranks would then write one file)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ADVMON_SINKS", "jsonl")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("ADVMON_ALL_RANKS", "1")
    for make in (lambda: advmon.Monitor("ranked", all_ranks=True), lambda: monitor_from_environment("ranked")):
        monitor = make()
        _quiet_steps(monitor, 2)
        monitor.close()
        assert [s.path.name for s in monitor.sinks] == ["ranked.rank3.jsonl"]
        assert sorted(p.name for p in (tmp_path / "advmon-runs").iterdir()) == ["ranked.rank3.jsonl"]
        (tmp_path / "advmon-runs" / "ranked.rank3.jsonl").unlink()

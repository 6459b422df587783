"""The trackio sink on a real trackio and its real local store, read back by trackio and by advmon's reader."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import advmon
from advmon.cli import main as cli
from advmon.record import Record
from advmon.runs import RunSourceError, read_run
from advmon.sinks.trackio import TrackioSink

from .services import require_module

trackio = require_module("trackio")
from trackio import context_vars  # noqa: E402
from trackio.sqlite_storage import SQLiteStorage  # noqa: E402

PROJECT = "advmon-test"


@pytest.fixture
def store(tmp_path, monkeypatch):
    """trackio's store in ``tmp_path``, never the user's home.

    trackio reads ``TRACKIO_DIR`` once, when it is first imported, and its modules keep the
    paths derived from it: each is pointed here (as trackio's own tests do), and the variable
    is set for the processes a test starts. After the test, the default store is as it was.
    """
    home = Path(trackio.utils.TRACKIO_DIR)
    before = sorted(home.iterdir()) if home.is_dir() else []
    directory = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(directory))
    for name, module in list(sys.modules.items()):
        if name == "trackio" or name.startswith("trackio."):
            for attribute, path in (("TRACKIO_DIR", directory), ("MEDIA_DIR", directory / "media"),
                                    ("ARTIFACTS_DIR", directory / "artifacts")):
                if isinstance(getattr(module, attribute, None), Path):
                    monkeypatch.setattr(module, attribute, path)
    yield directory
    current = context_vars.current_run.get()
    if current is not None:
        current.finish()
    context_vars.current_run.set(None)
    context_vars.current_project.set(None)
    assert (sorted(home.iterdir()) if home.is_dir() else []) == before, f"trackio wrote to {home}"


def grpo_steps(monitor: advmon.Monitor, steps: range, all_nan_at: int | None = None) -> None:
    """Groups of 4; at ``all_nan_at`` every reward is NaN, so the record's reward statistics are NaN."""
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        rewards = (torch.rand(16, generator=generator) < 0.5).float()
        if step == all_nan_at:
            rewards[:] = math.nan
        grouped = rewards.view(-1, 4)
        advantages = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).reshape(-1)
        with monitor.step(step):
            monitor.observe(rewards=rewards, advantages=advantages, group_size=4)


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_same_records(expected: list[Record], back: list[Record]) -> None:
    assert [r.step for r in back] == [r.step for r in expected]
    for record, read in zip(expected, back):
        assert read.metrics.keys() == record.metrics.keys(), record.step
        assert all(same(v, read.metrics[k]) for k, v in record.metrics.items()), record.step
        assert read.histograms == record.histograms


def test_every_value_reaches_trackios_store_nan_included_and_reads_back(store):
    jsonl = store.parent / "r.jsonl"
    monitor = advmon.Monitor("tk-values", sinks=[advmon.JsonlSink(jsonl), TrackioSink(project=PROJECT)])
    grpo_steps(monitor, range(3, 7), all_nan_at=5)
    monitor.close()
    records = advmon.read_jsonl(jsonl)
    assert any(math.isnan(v) for v in records[2].metrics.values())  # the NaN step has NaN statistics
    # trackio's own reader: one row per record, at advmon's step, every value (NaN as NaN).
    rows = SQLiteStorage.get_logs(PROJECT, "tk-values")
    assert [row["step"] for row in rows] == [3, 4, 5, 6]
    for record, row in zip(records, rows):
        assert all(same(value, row[key]) for key, value in record.metrics.items()), record.step
        for stage, histogram in record.histograms.items():  # (the all-NaN step has none)
            assert row[f"histograms/advantages/{stage}"]["values"] == list(histogram.counts)
    # advmon's reader, by project name (trackio's store) and by the project's file, for report and compare.
    assert (store / f"{PROJECT}.db").is_file()
    for source in (f"trackio+{PROJECT}#tk-values", f"trackio+{store / PROJECT}.db#tk-values"):
        run = read_run(source)
        assert run.name == "tk-values" and run.source == source
        assert_same_records(records, run.records)


def test_inf_and_minus_inf_come_back_as_they_went(store):
    sink = TrackioSink(project=PROJECT)
    sink.attach("tk-inf", ["trackio"])
    sink.write(Record("tk-inf", 0, 0.0, "e", None, {"rewards/max": math.inf, "rewards/min": -math.inf,
                                                     "rewards/mean": math.nan, "rewards/count": 2.0}))
    sink.close()
    [record] = read_run(f"trackio+{PROJECT}#tk-inf").records
    assert record.metrics["rewards/max"] == math.inf and record.metrics["rewards/min"] == -math.inf
    assert math.isnan(record.metrics["rewards/mean"]) and record.metrics["rewards/count"] == 2.0


def test_into_the_trainers_run_at_advmons_own_steps(store):
    trainer_run = trackio.init(project=PROJECT, name="trainer", embed=False, auto_log_cpu=False, auto_log_gpu=False)
    monitor = advmon.Monitor("tk-shared", sinks=[TrackioSink(run=trainer_run)])
    for step in range(3):
        trackio.log({"loss": 1.0 / (step + 1)}, step=step)
        monitor.observe(rewards=torch.tensor([1.0, 0.0, float(step)]))
        monitor.flush()
    monitor.close()
    assert context_vars.current_run.get() is trainer_run  # advmon neither replaced nor finished it
    trackio.log({"loss": 0.0}, step=3)  # the trainer carries on logging into it
    trackio.finish()
    rows = SQLiteStorage.get_logs(PROJECT, "trainer")
    assert sorted(row["step"] for row in rows if "loss" in row) == [0, 1, 2, 3]
    assert sorted(row["step"] for row in rows if "rewards/max" in row) == [0, 1, 2]
    run = read_run(f"trackio+{PROJECT}#trainer")  # the trainer's rows are skipped, advmon's read
    assert run.steps == [0, 1, 2] and [r.metrics["rewards/max"] for r in run.records] == [1.0, 1.0, 2.0]
    assert not any(k == "loss" for r in run.records for k in r.metrics)


def test_advmons_run_never_takes_the_place_of_the_callers_run(store):
    """``advmon replay`` writes on the caller's thread: trackio.init there would finish the caller's run."""
    mine = trackio.init(project=PROJECT, name="mine", embed=False, auto_log_cpu=False, auto_log_gpu=False)
    sink = TrackioSink(project=PROJECT)
    sink.attach("tk-beside", ["trackio"])
    sink.write(Record("tk-beside", 0, 0.0, "e", None, {"rewards/mean": 0.5}))
    assert context_vars.current_run.get() is mine
    trackio.log({"loss": 2.0}, step=0)  # still goes to the caller's run
    sink.close()
    trackio.finish()
    assert [row["loss"] for row in SQLiteStorage.get_logs(PROJECT, "mine")] == [2.0]
    assert read_run(f"trackio+{PROJECT}#tk-beside").records[0].metrics == {"rewards/mean": 0.5}


def test_a_trackio_that_refuses_the_run_never_stops_training(store):
    jsonl = store.parent / "r.jsonl"
    # trackio reserves project names that start with "registry-": its init raises ValueError.
    monitor = advmon.Monitor("tk-refused", sinks=[advmon.JsonlSink(jsonl), TrackioSink(project="registry-x")],
                             retries=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grpo_steps(monitor, range(3))  # training carries on
        monitor.flush()  # trackio's failures happened on the delivery thread, after the records were built:
        grpo_steps(monitor, range(3, 4))  # the next record carries them
        errors = monitor.last_metrics
        monitor.close()
    failures = [str(w.message) for w in caught if "sink trackio failed" in str(w.message)]
    assert len(failures) == 1 and "reserved for trackio registries" in failures[0]  # said once
    assert [r.step for r in advmon.read_jsonl(jsonl)] == [0, 1, 2, 3]  # the JSONL kept every record for replay
    assert errors["advmon/sink_errors/trackio"] >= 3


def test_a_server_url_token_is_never_printed():
    sink = TrackioSink(project=PROJECT, server_url="http://127.0.0.1:1/?write_token=s3cr3t-token-4567",
                       webhook_url="https://hooks.slack.com/services/T0/B0/webhook-secret-9876")
    from advmon.redact import scrub

    assert "s3cr3t" not in repr(sink) and "webhook-secret" not in repr(sink)
    message = scrub("trackio failed: http://127.0.0.1:1/?write_token=s3cr3t-token-4567 and "
                    "https://hooks.slack.com/services/T0/B0/webhook-secret-9876")
    assert "s3cr3t-token-4567" not in message and "webhook-secret-9876" not in message


def test_without_trackio_installed_the_error_says_what_to_install(monkeypatch):
    for name in [m for m in sys.modules if m == "trackio" or m.startswith("trackio.")]:
        monkeypatch.setitem(sys.modules, name, None)  # as if advmon[trackio] were not installed
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'advmon\[trackio\]'"):
        TrackioSink()
    with pytest.raises(RunSourceError, match=r"pip install 'advmon\[trackio\]'.*trackio\+PATH/PROJECT.db#RUN"):
        read_run("trackio+some-project#run")


def test_from_a_spec_at_exit_then_report_compare_and_summary_read_it(store, tmp_path, capsys):
    """The user's way: ``TRACKIO_DIR`` and ``ADVMON_SINKS=trackio:PROJECT`` in a script that never closes its monitor."""
    jsonl = tmp_path / "tk-cli.jsonl"
    script = textwrap.dedent(
        f"""
        import math, torch, advmon
        monitor = advmon.Monitor("tk-cli", sinks=[advmon.JsonlSink({str(jsonl)!r}), "trackio:{PROJECT}"])
        for step in range(24):  # compare reads windows of 20 steps
            rewards = torch.tensor([1.0, 0.0, float(step % 3), math.nan if step == 2 else 1.0])
            monitor.observe(rewards=rewards, advantages=rewards - 0.5, group_size=2)
        # no close(): advmon's exit hook delivers the queue and finishes the trackio run
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    source = f"trackio+{PROJECT}#tk-cli"
    assert_same_records(advmon.read_jsonl(jsonl), read_run(source).records)
    page = tmp_path / "report.html"
    assert cli(["report", source, "--out", str(page)]) == 0 and "tk-cli" in page.read_text()
    assert cli(["compare", str(jsonl), source]) == 0  # the same run, whichever sink kept it
    assert cli(["summary", source]) == 0
    # advmon replay writes on this thread: into a run of its own, as the monitor's delivery thread does.
    assert cli(["replay", str(jsonl), "--to", "trackio:advmon-replay"]) == 0
    assert_same_records(advmon.read_jsonl(jsonl), read_run("trackio+advmon-replay#tk-cli").records)
    capsys.readouterr()


def test_a_source_that_is_not_there_is_one_clear_line(store, tmp_path, capsys):
    assert cli(["summary", "trackio+nowhere#run"]) == 2
    assert "nowhere.db: no trackio project file there" in capsys.readouterr().err
    sink = TrackioSink(project=PROJECT)
    sink.attach("tk-present", ["trackio"])
    sink.write(Record("tk-present", 0, 0.0, "e", None, {"rewards/mean": 0.5}))
    sink.close()
    assert cli(["report", f"trackio+{PROJECT}#absent"]) == 2
    assert f"{PROJECT}.db has no run named 'absent'" in capsys.readouterr().err
    not_sqlite = tmp_path / "x.db"
    not_sqlite.write_text("not a database")
    assert cli(["summary", f"trackio+{not_sqlite}#run"]) == 2
    assert "not a trackio project file" in capsys.readouterr().err
    assert cli(["summary", "trackio+#run"]) == 2
    assert "expected trackio+PROJECT#RUN" in capsys.readouterr().err

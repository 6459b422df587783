"""The JSONL sink and reader, the CLI, and ``make demo``'s job end to end."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

import advmon
import advmon.cli
from advmon.cli import main
from advmon.demo import DemoConfig, run_demo
from advmon.record import Record
from tests import zygote


def test_jsonl_lines_append_flush_and_read_back(tmp_path):
    path = tmp_path / "deep" / "run.jsonl"
    sink = advmon.JsonlSink(path)
    first = Record("r", 0, 1.5, "est", "derived", {"a": 1.0, "b": math.nan, "c": math.inf})
    sink.write(first)
    line = path.read_text()  # flushed without close
    assert json.loads(line) == {
        "run": "r", "step": 0, "time": 1.5, "estimator": "est", "pre_norm_source": "derived",
        "metrics": {"a": 1.0, "b": None, "c": None},
    }
    sink.close()
    advmon.JsonlSink(path, resume=True).write(Record("r", 1, 2.0, "est", None, {"a": 2.0}))  # the run goes on
    records = advmon.read_jsonl(path)
    assert [r.step for r in records] == [0, 1]
    assert records[0].metrics["a"] == 1.0 and math.isnan(records[0].metrics["b"])
    # A new sink that does not resume is a new run: the earlier one's file is kept beside it, said once.
    with pytest.warns(advmon.AdvmonWarning, match="held the records of an earlier run"):
        advmon.JsonlSink(path).write(Record("r", 0, 3.0, "est", None, {"a": 3.0}))
    assert [r.step for r in advmon.read_jsonl(path)] == [0]
    [aside] = [p for p in path.parent.iterdir() if p != path]
    assert [r.step for r in advmon.read_jsonl(aside)] == [0, 1]


def test_reader_skips_damaged_lines_with_one_warning_naming_them(tmp_path):
    path = tmp_path / "run.jsonl"
    good = Record("r", 0, 0.0, "e", None, {"x": 1.0}).to_json()
    path.write_text(good + "\n" + good[:20])
    with pytest.warns(advmon.AdvmonWarning, match=r"run.jsonl: skipped 1 damaged line\(s\): 2"):
        assert len(advmon.read_jsonl(path)) == 1
    path.write_text("not json\n" + good + "\n" + good[:30] + "\n" + good + "\n")
    with pytest.warns(advmon.AdvmonWarning, match=r"skipped 2 damaged line\(s\): 1, 3"):
        assert len(advmon.read_jsonl(path)) == 2
    path.write_text("not json\n{}\n")
    with pytest.raises(advmon.AdvmonConfigError, match="run.jsonl:1"):
        advmon.read_jsonl(path)
    with pytest.raises(advmon.AdvmonConfigError, match="missing.jsonl: no such file or directory"):
        advmon.read_jsonl(tmp_path / "missing.jsonl")


def test_a_run_resumed_after_a_kill_mid_write_stays_readable(tmp_path):
    """Regression: appending after a truncated last line made the whole file unreadable."""
    import warnings

    path = tmp_path / "run.jsonl"
    sink = advmon.JsonlSink(path)
    for step in range(3):
        sink.write(Record("r", step, 0.0, "e", None, {"x": float(step)}))
    sink.close()
    path.write_bytes(path.read_bytes()[:-25])  # SIGKILL in the middle of the last line
    resumed = advmon.JsonlSink(path, resume=True)
    for step in range(3, 5):
        resumed.write(Record("r", step, 0.0, "e", None, {"x": float(step)}))
    resumed.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps = [r.step for r in advmon.read_jsonl(path)]
    assert steps == [0, 1, 3, 4]
    assert len(caught) == 1 and "skipped 1 damaged line(s): 3" in str(caught[0].message)
    assert advmon.cli.main(["summary", str(path)]) == 0


def test_demo_shows_the_unstable_run_and_not_the_stable_one(tmp_path):
    text = run_demo(DemoConfig(steps=40, seed=1, out=tmp_path))
    tp1, tp2 = (advmon.read_jsonl(tmp_path / f"{run}.jsonl") for run in ("tp1", "tp2"))
    assert [r.step for r in tp1] == list(range(40)) == [r.step for r in tp2]
    stable, unstable = text.split("run tp2")
    assert "instability signs: none (no alert of the catalog fired)" in stable
    assert "alerts" not in stable.split("instability signs: none")[1]  # said once, not again as "alerts: none"
    signs = unstable[unstable.index("instability signs"):unstable.index("alerts over the run")]
    for alert in ("AdvmonNonFiniteRewards", "AdvmonAdvantageBeyondBound", "AdvmonZeroStdGroupsHigh"):
        assert alert in signs  # one verdict: the summary's signs are the catalog's alerts
    alerts = unstable[unstable.index("alerts over the run"):unstable.index("Alerts: the catalog")]
    fired = {line.split()[3].rstrip(":") for line in signs.splitlines()[1:] if line.strip()}
    assert fired <= set(alerts.replace("(", " ").split())
    for alert in fired:  # issue 39: the alerts section does not repeat the signs; each alert is one line there
        assert len([line for line in alerts.splitlines() if line.strip().startswith(alert)]) == 1, alert
    assert max(r.metrics["groups/zero_std_fraction"] for r in tp2) > 0.5
    assert max(r.metrics["groups/zero_std_fraction"] for r in tp1) < 0.5
    assert min(r.metrics["advantages/post_norm/min"] for r in tp2) < -1000
    # Rerunning starts the files afresh instead of appending a second run.
    run_demo(DemoConfig(steps=5, seed=1, out=tmp_path))
    assert len(advmon.read_jsonl(tmp_path / "tp1.jsonl")) == 5


def test_the_demo_says_its_header_before_any_work_and_each_section_when_ready(tmp_path):
    """Issue 39, Demo: the header came after the report's progress lines (all of it was printed at the end)."""
    said = []

    def say(section: str) -> None:
        said.append((section, (tmp_path / "tp1.jsonl").exists(), (tmp_path / "report-tp2.html").exists()))

    text = run_demo(DemoConfig(steps=22, seed=1, out=tmp_path), say=say)
    assert said[0][0].startswith("advmon demo:") and not said[0][1]  # before the first run was simulated
    assert said[1][0].startswith("run tp1") and not said[1][2]  # the runs' summaries before the report's work
    assert "\n\n".join(section for section, _, _ in said) == text


def test_cli_demo_and_summary(tmp_path, capsys):
    assert main(["demo", "--steps", "6", "--out", str(tmp_path)]) == 0
    assert "run tp1" in capsys.readouterr().out
    assert main(["summary", str(tmp_path / "tp2.jsonl")]) == 0
    assert "run tp2 (6 records" in capsys.readouterr().out


def test_cli_errors_are_one_clear_line(tmp_path, capsys):
    assert main(["summary", str(tmp_path / "missing.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err == f"advmon: error: {tmp_path / 'missing.jsonl'}: no such file or directory\n"
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--steps", "0"])
    assert exit_info.value.code == 2
    assert "positive integer" in capsys.readouterr().err


def test_console_script_runs(tmp_path):
    done = subprocess.run(  # python -m advmon, forked from tests/zygote.py in make test (torch loaded already)
        [*zygote.command(), "-m", "advmon", "demo", "--steps", "3", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "advmon demo" in done.stdout

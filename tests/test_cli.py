"""One CLI: the same exit codes and the same one-line messages from every command.

0 all is well, 1 a finding (a critical alert fired, runs diverge, records not delivered),
2 input advmon cannot use; errors are ``advmon: error: ...``, warnings ``advmon: warning: ...``,
each one line, never a traceback and never the prefix twice.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from advmon.cli import BAD_INPUT, FINDING, OK, main
from advmon.simulation import RunSpec, simulate
from advmon.sinks.jsonl import JsonlSink
from tests.services import free_port


def write_run(path: Path, kind: str, steps: int = 40, seed: int = 0) -> Path:
    sink = JsonlSink(path)
    for record in simulate(RunSpec(kind, seed=seed, steps=steps, onset=steps // 2, prompts=8, group_size=4)):
        sink.write(record)
    sink.close()
    return path


@pytest.fixture
def runs(tmp_path):
    """A directory holding a healthy and a broken run, and an empty file beside it."""
    directory = tmp_path / "advmon-runs"
    directory.mkdir()
    write_run(directory / "healthy.jsonl", "grpo_binary")
    write_run(directory / "broken.jsonl", "nan_rewards")
    (tmp_path / "empty.jsonl").write_text("")
    return directory


def one_error_line(err: str) -> str:
    """The single ``advmon: error:`` line a failing command prints; anything else fails the test."""
    assert err.count("\n") == 1 and err.startswith("advmon: error: "), err
    assert "Traceback" not in err and "advmon: " not in err[len("advmon: error: "):], err
    return err[len("advmon: error: "):].strip()


# Every command that reads a recorded run, with the argument list around that run.
READERS = {
    "summary": lambda run: ["summary", run],
    "alerts check": lambda run: ["alerts", "check", run],
    "report": lambda run: ["report", run, "--out", "unused.html"],
    "compare (first)": lambda run: ["compare", run, "{healthy}"],
    "compare (second)": lambda run: ["compare", "{healthy}", run],
    "replay": lambda run: ["replay", run, "--to", "jsonl:unused.jsonl"],
}


def command(name: str, run: str, directory: Path) -> list[str]:
    return [part.format(healthy=directory / "healthy.jsonl") for part in READERS[name](run)]


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_missing_file_is_bad_input_in_the_same_words_everywhere(name, runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nope.jsonl"
    assert main(command(name, str(missing), runs)) == BAD_INPUT
    assert one_error_line(capsys.readouterr().err) == f"{missing}: no such file or directory"


@pytest.mark.parametrize("name", sorted(READERS))
def test_an_empty_file_is_bad_input_in_the_same_words_everywhere(name, runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    empty = tmp_path / "empty.jsonl"
    assert main(command(name, str(empty), runs)) == BAD_INPUT
    assert one_error_line(capsys.readouterr().err) == f"{empty}: no advmon records in it (the file is empty)"
    assert not (tmp_path / "unused.html").exists() and not (tmp_path / "unused.jsonl").exists()


@pytest.mark.parametrize("argv", [
    ["alerts", "generate", "--out", "{out}", "--threshold", "nope=1"],
    ["alerts", "check", "{run}", "--threshold", "nope=1"],
    ["report", "{run}", "--out", "{out}/r.html", "--threshold", "nope=1"],
    ["dashboards", "generate", "--out", "{out}", "--threshold", "nope=1"],
], ids=lambda argv: " ".join(argv[:2]))
def test_an_unknown_threshold_is_bad_input_everywhere(argv, runs, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [a.format(out=out, run=runs / "broken.jsonl") for a in argv]
    assert main(argv) == BAD_INPUT
    assert one_error_line(capsys.readouterr().err).startswith("unknown threshold 'nope'; known: bound_factor")
    assert not out.exists()  # nothing half-written


def test_a_directory_of_runs_is_read_by_summary_and_alerts_check(runs, tmp_path, capsys):
    (runs / "crashed.jsonl").write_text("")  # a run that died before its first record
    assert main(["summary", str(runs)]) == OK
    captured = capsys.readouterr()
    assert re.findall(r"^run (\S+) \(", captured.out, re.M) == ["nan_rewards-s0", "grpo_binary-s0"]  # file order
    assert captured.err == f"advmon: warning: {runs / 'crashed.jsonl'}: no advmon records in it (the file is empty); skipped\n"
    assert main(["alerts", "check", str(runs)]) == FINDING  # the broken run's NaN rewards are critical
    out = capsys.readouterr().out
    assert f"run nan_rewards-s0 ({runs / 'broken.jsonl'}): " in out and "AdvmonNonFiniteRewards" in out
    assert f"run grpo_binary-s0 ({runs / 'healthy.jsonl'}): no alerts" in out


@pytest.mark.parametrize("name", ["report", "compare (first)", "compare (second)", "replay"])
def test_a_directory_where_one_run_is_expected_is_refused_naming_a_file_to_pass(name, runs, tmp_path, capsys,
                                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(command(name, str(runs), runs)) == BAD_INPUT
    message = one_error_line(capsys.readouterr().err)
    assert str(runs) in message and f"e.g. {runs / 'broken.jsonl'}" in message, message


def test_a_directory_without_runs_says_what_to_pass(tmp_path, capsys):
    (tmp_path / "events.out.tfevents.1.host").write_bytes(b"")
    assert main(["report", str(tmp_path)]) == BAD_INPUT
    assert one_error_line(capsys.readouterr().err).endswith(f"pass tb+{tmp_path}")
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    assert main(["summary", str(nothing)]) == BAD_INPUT
    message = one_error_line(capsys.readouterr().err)
    assert all(form in message for form in ("FILE.jsonl", "mlflow+", "W&B", "tb+DIR")), message


def test_findings_exit_1_and_all_well_exits_0(runs, capsys):
    healthy, broken = runs / "healthy.jsonl", runs / "broken.jsonl"
    assert main(["alerts", "check", str(healthy)]) == OK
    assert main(["alerts", "check", str(broken)]) == FINDING
    assert main(["compare", str(healthy), str(healthy)]) == OK
    assert main(["compare", str(healthy), str(broken)]) == FINDING
    assert main(["summary", str(broken)]) == OK  # a summary shows; `alerts check` is the gate
    dead = free_port()  # nothing listens there: no record can be delivered
    capsys.readouterr()
    assert main(["replay", str(healthy), "--to", f"pushgateway:http://127.0.0.1:{dead}", "--retries", "0"]) == FINDING
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("advmon: error: 40 record(s) could not be sent; they stay in")
    assert len(lines) == 2 and lines[0].startswith("advmon: warning: 40 of 40 record(s) of run grpo_binary-s0")


def test_warnings_are_one_line_each_with_one_prefix(runs, capsys):
    damaged = runs / "healthy.jsonl"
    damaged.write_text(damaged.read_text() + '{"cut short\n')
    assert main(["summary", str(damaged)]) == OK
    err = capsys.readouterr().err
    assert err == f"advmon: warning: {damaged}: skipped 1 damaged line(s): 41\n"


def test_a_missing_optional_package_names_the_extra_to_install(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if advmon[dashboards] were not installed
    assert main(["report", str(runs / "broken.jsonl"), "--format", "png", "--out", str(tmp_path / "r.png")]) == BAD_INPUT
    assert one_error_line(capsys.readouterr().err) == "matplotlib is not installed: pip install 'advmon[dashboards]'"


def test_usage_errors_exit_2_as_argparse_does(capsys):
    for argv in (["frobnicate"], ["report"], ["compare", "a"], ["demo", "--steps", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == BAD_INPUT, argv
        assert "usage: advmon" in capsys.readouterr().err




@pytest.mark.parametrize("argv", [["report"], ["compare"], ["summary"], ["alerts", "check"]], ids=" ".join)
def test_help_lists_every_source_form(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for form in ("FILE.jsonl#RUN", "mlflow+TRACKING_URI#RUN", "W&B offline run directory", "tb+DIR",
                 "trackio+PROJECT#RUN", "trackio+PATH/PROJECT.db#RUN"):
        assert form in text, (argv, form)
    if argv[-1] in ("summary", "check"):
        assert "directory of JSONL files" in text


def test_report_is_written_beside_the_run_like_the_demo_writes_it(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(runs / "broken.jsonl")]) == OK
    written = runs / "report-nan_rewards-s0.html"
    assert written.is_file() and not list(tmp_path.glob("report-*"))
    assert capsys.readouterr().out == f"wrote {written}: open it in a browser\n"

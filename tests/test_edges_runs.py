"""Issue 38 at the edges of a run: never moved, mixed or doubled; no page for a run that never was; verdicts
and counters that are true.

Each test is named after what broke, and fails on the main it was written against (ea1020f).
"""

from __future__ import annotations

import pytest
import torch

import advmon
from advmon.cli import main
from advmon.errors import AdvmonConfigError
from advmon.monitor import monitor_from_environment


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

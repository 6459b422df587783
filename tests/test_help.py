"""The help teaches what the error messages know (issue 39, "Help").

Every subcommand says in one line what it does, every option says what it is for, and the help itself starts
without the libraries the commands need (checked on a fresh interpreter's ``sys.modules``, never on a clock).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from advmon.cli import BAD_INPUT, OK, _parser, main
from advmon.rules import THRESHOLDS
from advmon.simulation import RunSpec, simulate
from advmon.sinks.jsonl import JsonlSink

ROOT = Path(__file__).resolve().parent.parent


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """Every parser of the tree: (its words after ``advmon``, the parser, the help its parent lists it with)."""
    yield path, parser, None
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                for words, child, line in commands(sub, (*path, name)):
                    yield words, child, line if words != (*path, name) else listed.get(name)


ALL = list(commands(_parser()))
SUBCOMMANDS = [(words, parser, line) for words, parser, line in ALL if words]


def test_the_tree_is_walked():
    """The walk reaches every command and verb, so the checks below cover them all."""
    assert {" ".join(words) for words, _, _ in SUBCOMMANDS} == {
        "demo", "summary", "replay", "report", "compare", "alerts", "alerts generate", "alerts check",
        "dashboards", "dashboards generate", "dashboards preview"}


def named(value: object) -> str:
    """A test id: the command's words (``advmon`` for the program itself)."""
    return " ".join(value) or "advmon" if isinstance(value, (tuple, list)) else ""


@pytest.mark.parametrize(("words", "parser", "line"), SUBCOMMANDS, ids=named)
def test_each_subcommand_has_a_one_line_description(words, parser, line):
    assert line and "\n" not in line, f"advmon {' '.join(words)} is listed without a line"
    assert parser.description and "\n" not in parser.description, f"advmon {' '.join(words)} --help: no description"
    text = parser.format_help()
    assert parser.description in " ".join(text.split()) or parser.description.split()[0] in text


@pytest.mark.parametrize(("words", "parser", "line"), ALL, ids=named)
def test_every_option_has_help_text(words, parser, line):
    missing = [action.option_strings[0] if action.option_strings else action.dest for action in parser._actions
               if not action.help or action.help == argparse.SUPPRESS]
    assert missing == [], f"advmon {' '.join(words)}: no help for {missing}"


@pytest.mark.parametrize("words", [words for words, parser, _ in ALL
                                   if any("--threshold" in a.option_strings for a in parser._actions)], ids=" ".join)
def test_threshold_lists_the_names_it_accepts(words):
    parser = dict((w, p) for w, p, _ in ALL)[words]
    text = " ".join(parser.format_help().split())
    names = [t.name for t in THRESHOLDS]
    assert all(name in text for name in names), (words, [n for n in names if n not in text])


def test_threshold_is_taken_by_every_command_that_judges_a_run():
    taking = {" ".join(w) for w, parser, _ in ALL if any("--threshold" in a.option_strings for a in parser._actions)}
    assert {"summary", "alerts check", "report", "alerts generate", "dashboards generate"} <= taking


def write_run(path: Path, kind: str) -> Path:
    sink = JsonlSink(path)
    for record in simulate(RunSpec(kind, seed=0, steps=40, onset=20, prompts=8, group_size=4)):
        sink.write(record)
    sink.close()
    return path


def test_summary_takes_format_json_and_threshold_like_alerts_check(tmp_path, capsys):
    run = write_run(tmp_path / "zero.jsonl", "zero_std_collapse")
    assert main(["summary", str(run), "--format", "json"]) == OK
    [summary] = json.loads(capsys.readouterr().out)
    assert summary["run"] == "zero_std_collapse-s0" and summary["source"] == str(run) and summary["records"] == 40
    assert summary["metrics"]["groups/zero_std_fraction"]["worst"] == "highest"
    fired = {a["alert"] for a in summary["alerts"]}
    assert "AdvmonZeroStdGroupsHigh" in fired
    # The same threshold moves the summary's verdict as it moves alerts check's.
    assert main(["summary", str(run), "--format", "json", "--threshold", "zero_std_ratio=1"]) == OK
    [raised] = json.loads(capsys.readouterr().out)
    assert "AdvmonZeroStdGroupsHigh" not in {a["alert"] for a in raised["alerts"]}
    main(["alerts", "check", str(run), "--format", "json", "--threshold", "zero_std_ratio=1"])
    checked = json.loads(capsys.readouterr().out)["alerts"]
    assert {a["alert"] for a in checked} == {a["alert"] for a in raised["alerts"]}
    assert main(["summary", str(run), "--threshold", "zero_std_ratio=1"]) == OK
    assert "AdvmonZeroStdGroupsHigh" not in capsys.readouterr().out
    assert main(["summary", str(run), "--threshold", "nope=1"]) == BAD_INPUT
    assert capsys.readouterr().err.startswith("advmon: error: unknown threshold 'nope'")


def test_alerts_check_json_on_a_healthy_run_says_which_runs_it_checked(tmp_path, capsys):
    run = write_run(tmp_path / "healthy.jsonl", "grpo_binary")
    assert main(["alerts", "check", str(run), "--format", "json"]) == OK
    assert json.loads(capsys.readouterr().out) == {
        "checked": [{"run": "grpo_binary-s0", "source": str(run), "records": 40, "alerts": 0}], "alerts": []}


def test_dashboards_preview_offers_the_fleet_board(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from advmon.dashboards import preview

    preview_parser = dict((w, p) for w, p, _ in ALL)[("dashboards", "preview")]
    board = next(a for a in preview_parser._actions if "--board" in a.option_strings)
    assert set(board.choices) == {"health", "compare", "fleet"}
    asked = []

    def empty_answer(prometheus, path, what, timeout):  # a Prometheus that holds no series: every answer is empty
        asked.append(what)
        return {"status": "success", "data": [] if "/label/" in path or "exemplars" in path
                else {"resultType": "matrix", "result": []}}

    monkeypatch.setattr(preview, "_get", empty_answer)
    out = tmp_path / "fleet.png"
    assert main(["dashboards", "preview", "--prometheus", "http://prometheus.invalid", "--board", "fleet",
                 "--out", str(out)]) == OK  # the fleet shows every run: no --run needed
    assert out.stat().st_size > 0 and capsys.readouterr().out == f"wrote {out}\n"
    assert any("advmon_run_info" in expr or "ALERTS" in expr for expr in asked), asked[:3]
    assert all("$" not in expr for expr in asked), [e for e in asked if "$" in e][:3]
    # The boards of chosen runs say what is missing in one line.
    assert main(["dashboards", "preview", "--prometheus", "http://prometheus.invalid"]) == BAD_INPUT
    assert capsys.readouterr().err == "advmon: error: the health board shows chosen runs: pass --run RUN\n"


def fresh(code: str) -> dict:
    """Run ``code`` in a fresh interpreter on this checkout; it prints one JSON object last, which is returned."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


#: What the help must not start: each takes a large part of a second (torch alone was most of the 1.4 s).
HEAVY = ("torch", "numpy", "matplotlib", "grafanalib", "prometheus_client", "yaml", "mlflow", "wandb", "tensorboard",
         "trackio", "advmon.stats", "advmon.monitor", "advmon.alerts", "advmon.dashboards", "advmon.reports")


@pytest.mark.parametrize("words", [[]] + [list(words) for words, _, _ in SUBCOMMANDS], ids=named)
def test_help_starts_without_the_heavy_modules(words):
    loaded = fresh(f"""
import json, sys
from advmon.cli import entry_point
sys.argv = ["advmon", *{words!r}, "--help"]
try:
    entry_point()
except SystemExit as exit:
    code = exit.code
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
""")
    assert loaded["code"] == 0
    heavy = [m for m in loaded["modules"] if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]
    assert heavy == [], f"advmon {' '.join(words)} --help imports {heavy[:8]}"


def test_the_check_sees_heavy_modules_where_they_are_imported():
    """The check above can fail: a command that does its work loads them."""
    loaded = fresh("import json, sys\nimport advmon.monitor\nprint(json.dumps({'modules': sorted(sys.modules)}))")
    assert "torch" in loaded["modules"] and "advmon.stats" in loaded["modules"]


def pyproject_version() -> str:
    """The version pyproject.toml gives the package: its own ``version``, or the attribute it reads it from."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    if "version" in project["project"]:
        return project["project"]["version"]
    attribute = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attribute.rpartition(".")
    source = (ROOT / (module.replace(".", "/") + "/__init__.py")).read_text()
    return re.search(rf'^{name}\s*=\s*"([^"]+)"', source, re.M).group(1)


def test_version_prints_the_packages_version():
    done = subprocess.run([sys.executable, "-m", "advmon", "--version"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0 and done.stdout == f"advmon {pyproject_version()}\n"

"""Every code block in README.md and docs/ is what it says it is.

A ```python block runs as a file of its own: a process of its own in an empty directory,
nothing from the page's other blocks (in make test, forked from tests/zygote.py, which has
loaded torch and the frameworks but never advmon). ```yaml and ```json blocks parse. Every ``advmon``
command line of a ```sh block parses with the CLI's own parser. A block preceded by
``<!-- not run: REASON -->`` is an illustration that cannot run anywhere the tests do;
the page says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from advmon import cli
from tests import zygote
from tests.doc_blocks import PAGES, ROOT, Block, advmon_commands, blocks

CHECKED = {"python", "sh", "yaml", "json", "text"}
PYTHON_BLOCKS = [block for page in PAGES for block in blocks(page, "python")]
DATA_PAGES = [page for page in PAGES if any(b.language in {"yaml", "json"} for b in blocks(page))]
SHELL_PAGES = [page for page in PAGES if any(advmon_commands(b) for b in blocks(page, "sh"))]


def _param(block: Block):
    marks = [pytest.mark.skip(reason=f"not run: {block.not_run}")] if block.not_run else []
    return pytest.param(block, id=block.name, marks=marks)


#: OpenRLHF's module imports flash-attn and vLLM at load time, which do not install here: its snippets run
#: after tests/openrlhf_standins.py has put stand-ins for those names (each raises if called) in place.
OPENRLHF_BLOCKS = blocks(ROOT / "docs" / "integrations.md", "python", section="OpenRLHF")
OPENRLHF_PRELUDE = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests import openrlhf_standins; openrlhf_standins.install()\n"


@pytest.mark.parametrize("block", [_param(b) for b in PYTHON_BLOCKS])
def test_python_block_runs_on_its_own(block: Block, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text((OPENRLHF_PRELUDE if block in OPENRLHF_BLOCKS else "") + block.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADVMON_")}
    done = subprocess.run(
        [*zygote.command(), script.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    output = f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}"
    assert done.returncode == 0, f"{block.name} exited with {done.returncode}\n{output}"
    # The suite treats advmon's warnings as errors: a snippet that draws one shows a mistake.
    assert "AdvmonWarning" not in done.stderr, f"{block.name} warned\n{output}"
    checked = check_printed_values(block, done.stdout)
    claim = claim_of(block)
    if claim is not None:
        claim(tmp_path, done.stdout + done.stderr)
    assert checked or claim is not None or re.search(r"^\s*assert ", block.text, re.M), (
        f"{block.name} runs but checks nothing: give a print its value as a comment (print(x)  # 4.0), "
        "assert in the snippet, or say in CLAIMS what it promises")


#: ``print(...)  # VALUE`` or ``print(...)  # VALUE: why``: the page shows what the line prints.
PRINTED = re.compile(r"^\s*print\(.*\)\s*#\s*(?P<value>[^:]+?)\s*(?::.*)?$")


def check_printed_values(block: Block, stdout: str) -> int:
    """Each value a page shows beside a ``print`` is a line of what the snippet printed, in order; how many."""
    expected = [m["value"] for m in map(PRINTED.match, block.text.splitlines()) if m]
    printed = iter(stdout.splitlines())
    for value in expected:
        assert any(line.strip() == value for line in printed), (
            f"{block.name}: the page says a print shows {value!r}; it printed:\n{stdout}")
    return len(expected)


def _records(path: Path) -> list:
    from advmon import read_jsonl

    return read_jsonl(path)


def _readme_quickstart(tmp_path: Path, output: str) -> None:
    records = _records(tmp_path / "advmon-runs" / "grpo-math-tp2.jsonl")  # where the comment says
    assert [r.step for r in records] == [0, 1, 2]  # chunks of one step -> one record
    last = records[-1].metrics
    assert output.split()[:2] == [str(last["groups/zero_std_fraction"]), str(last["advantages/post_norm/max"])]
    assert last["groups/count"] == 8 and last["rewards/count"] == 32  # both chunks in the record
    _readme_on_call_runs_on_the_quickstarts_run(tmp_path)


def _readme_on_call_runs_on_the_quickstarts_run(tmp_path: Path) -> None:
    """README's "On call" block, run as written in the directory the quickstart ran in: every command does
    what its comment says there (issue 39: it once compared a run the quickstart never made)."""
    [on_call] = [b for b in blocks(ROOT / "README.md", "sh") if "advmon summary" in b.text]
    commands = advmon_commands(on_call)
    assert [c[:2] for c in commands] == [["summary", "advmon-runs/grpo-math-tp2.jsonl"],
                                         ["alerts", "check"], ["report", "advmon-runs/grpo-math-tp2.jsonl"],
                                         ["alerts", "generate"], ["dashboards", "generate"]]
    codes = {}
    with contextlib.chdir(tmp_path):
        for argv in commands:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                codes[argv[0] + " " + argv[1]] = cli.main(argv)
            if argv[0] == "alerts" and argv[1] == "check":
                with contextlib.redirect_stdout(verdict := io.StringIO()):
                    cli.main([*argv, "--format", "json"])
                fired = [a for a in json.loads(verdict.getvalue())["alerts"] if a.get("severity") == "critical"]
                assert codes["alerts check"] == (1 if fired else 0), verdict.getvalue()
    assert {k: v for k, v in codes.items() if k != "alerts check"} == dict.fromkeys(
        ["summary advmon-runs/grpo-math-tp2.jsonl", "report advmon-runs/grpo-math-tp2.jsonl", "alerts generate",
         "dashboards generate"], 0)
    assert (tmp_path / "advmon-runs" / "report-grpo-math-tp2.html").is_file()  # beside the run, as it says
    assert list((tmp_path / "alerts").glob("*.yml")) and list((tmp_path / "dashboards").glob("*.json"))


def _secret_stays_secret(tmp_path: Path, output: str) -> None:
    assert "127.0.0.1:9/hook" not in output  # a webhook URL is never printed
    assert not list(tmp_path.rglob("*.jsonl")) or all(
        "127.0.0.1:9/hook" not in p.read_text() for p in tmp_path.rglob("*.jsonl"))


def _nemo_grpo(tmp_path: Path, output: str) -> None:
    (record,) = _records(tmp_path / "advmon-runs" / "nemo-grpo.jsonl")
    assert record.step == 1 and output.split() == [str(record.metrics["groups/zero_std_fraction"])]
    assert record.metrics["groups/count"] == 8 and record.metrics["advantages/post_norm/count"] == 32 * 16


def _nothing_recorded_before_a_call(tmp_path: Path, output: str) -> None:
    assert not (tmp_path / "advmon-runs").exists() or not list((tmp_path / "advmon-runs").iterdir())


def _spec_sinks(tmp_path: Path, output: str) -> None:
    (record,) = _records(tmp_path / "advmon-runs" / "grpo-tp2.jsonl")  # the JSONL spec's path
    assert record.run == "grpo-tp2" and record.metrics["rewards/mean"] == 0.75


def _one_record(tmp_path: Path, output: str) -> None:
    (record,) = _records(tmp_path / "advmon-runs" / "my-run.jsonl")
    assert record.metrics["rewards/mean"] == pytest.approx(2 / 3, rel=1e-12) and record.metrics["rewards/count"] == 3


def _made_lazily(tmp_path: Path, output: str) -> None:
    assert list(tmp_path.iterdir()) == [tmp_path / "snippet.py"]  # a sink writes nothing before its first record


def _scrape_port(tmp_path: Path, output: str) -> None:
    match = re.fullmatch(r"scrape http://127\.0\.0\.1:(\d+)/metrics\s*", output.strip() + "\n")
    assert match and int(match[1]) > 0, output  # a free port, bound on 127.0.0.1


#: What a snippet that neither asserts nor prints a value promises, checked after it ran in ``tmp_path``:
#: (page, a line of the snippet) -> check(tmp_path, its output).
CLAIMS = {
    ("README.md", "estimator = advmon.instrument(GRPOAdvantageEstimator(), monitor)"): _readme_quickstart,
    ("alerts.md", 'alerts=["slack:SLACK_WEBHOOK_URL"]'): _secret_stays_secret,
    ("integrations.md", "advmon_nemo.instrument(monitor, module=nemo_estimators)"): _nemo_grpo,
    ("integrations.md", "advmon_nemo.instrument(module=nemo_estimators)"): _nothing_recorded_before_a_call,
    ("sinks.md", '"prometheus:127.0.0.1:0"'): _spec_sinks,
    ("sinks.md", 'advmon.JsonlSink("advmon-runs/my-run.jsonl")'): _one_record,
    ("sinks.md", 'WandbSink(project="grpo-math")'): _made_lazily,
    ("sinks.md", 'MlflowSink("sqlite:///mlflow.db")'): _made_lazily,
    ("sinks.md", 'TensorBoardSink("runs/")'): _made_lazily,
    ("sinks.md", 'TrackioSink(project="grpo-math")'): _made_lazily,
    ("sinks.md", "scrape = PrometheusSink(port=0)"): _scrape_port,
}


def claim_of(block: Block):
    found = [check for (page, line), check in CLAIMS.items() if page == block.page.name and line in block.text]
    assert len(found) <= 1, f"{block.name}: more than one claim matches"
    return found[0] if found else None


def test_every_claim_names_a_snippet():
    for page, line in CLAIMS:
        assert any(b.page.name == page and line in b.text for b in PYTHON_BLOCKS), (page, line)


@pytest.mark.parametrize("page", DATA_PAGES, ids=[p.name for p in DATA_PAGES])
def test_yaml_and_json_blocks_parse(page: Path):
    for block in blocks(page):
        try:
            if block.language == "yaml":
                yaml.safe_load(block.text)
            elif block.language == "json":
                json.loads(block.text)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            pytest.fail(f"{page.name}: {block.language} block {block.number} does not parse: {exc}")


@pytest.mark.parametrize("page", SHELL_PAGES, ids=[p.name for p in SHELL_PAGES])
def test_advmon_commands_parse(page: Path):
    failures = []
    for block in blocks(page, "sh"):
        for argv in advmon_commands(block):
            usage = io.StringIO()
            try:
                with contextlib.redirect_stderr(usage), contextlib.redirect_stdout(io.StringIO()):
                    cli._parser().parse_args(argv)
            except SystemExit:
                failures.append(f"sh block {block.number}: advmon {shlex.join(argv)}\n{usage.getvalue()}")
    assert not failures, f"{page.name}: commands the CLI refuses:\n" + "\n".join(failures)


def test_every_block_is_of_a_checked_kind():
    unchecked = [f"{b.page.name}: ```{b.language or '(none)'} block" for p in PAGES for b in blocks(p)
                 if b.language not in CHECKED]
    assert not unchecked, f"blocks of a language no test checks (use one of {sorted(CHECKED)}): {unchecked}"


def test_there_are_blocks_to_check():
    assert {b.page.name for b in PYTHON_BLOCKS} >= {"README.md", "quickstart.md", "integrations.md", "sinks.md"}
    assert {p.name for p in SHELL_PAGES} >= {"README.md", "alerts.md", "dashboards.md"}
    assert {p.name for p in DATA_PAGES} >= {"integrations.md", "compare.md", "distributions.md"}
    assert len([b for b in PYTHON_BLOCKS if b.not_run]) <= 2, "illustrations that never run: at most two"


def test_shell_lines_are_split_into_advmon_commands():
    block = Block(Path("x.md"), "sh", 1, (
        "advmon alerts generate --out alerts/ \\\n    --selector 'job=\"grpo\"'   # rules\n"
        "promtool check rules a.yml && advmon alerts check run.jsonl\n"
        "make demo\n"
    ), None)
    assert advmon_commands(block) == [
        ["alerts", "generate", "--out", "alerts/", "--selector", 'job="grpo"'],
        ["alerts", "check", "run.jsonl"],
    ]


def test_a_printed_value_the_page_gets_wrong_fails():
    block = Block(Path("x.md"), "python", 1, 'print(1 + 1)  # 2\nprint("a b")  # a c: why\n', None)
    with pytest.raises(AssertionError, match="a print shows 'a c'"):
        check_printed_values(block, "2\na b\n")
    assert check_printed_values(Block(Path("x.md"), "python", 1, 'print(2)  # 2: two\n', None), "2\n") == 1

"""Every code block in README.md and docs/ is what it says it is.

A ```python block runs as a file of its own: a fresh interpreter in an empty directory,
nothing from the page's other blocks. ```yaml and ```json blocks parse. Every ``advmon``
command line of a ```sh block parses with the CLI's own parser. A block preceded by
``<!-- not run: REASON -->`` is an illustration that cannot run anywhere the tests do;
the page says why.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from advmon import cli
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
        [sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    output = f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}"
    assert done.returncode == 0, f"{block.name} exited with {done.returncode}\n{output}"
    # The suite treats advmon's warnings as errors: a snippet that draws one shows a mistake.
    assert "AdvmonWarning" not in done.stderr, f"{block.name} warned\n{output}"


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

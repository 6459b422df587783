"""The install the docs describe works, in a fresh environment; and the demo says what it lacks.

The integration tests copy the repository into a temporary directory (the source tree gets
no ``build/`` or ``.egg-info``) and install from the copy, as a user's checkout would. pip
takes this machine's configuration (local wheel directories); every install pins
``torch==2.13.0``, the CPU build on local disk (any other torch request downloads a
multi-GB CUDA build).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_blocks import ROOT, blocks
from tests.services import http_get, require_binary, wait_for

TORCH_PIN = "torch==2.13.0"
NOT_COPIED = (".venv", ".git", "advmon-runs", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
              ".hypothesis", "mlruns", "mlflow.db", "wandb")


def checkout(tmp_path: Path) -> Path:
    """A copy of the repository as a fresh clone has it."""
    copy = tmp_path / "advmon"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*NOT_COPIED))
    return copy


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """This process's environment as a user's shell has it (no virtualenv, advmon settings or outer make); ``venv``
    first on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
           and not k.startswith("ADVMON_")}
    path = [p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != ROOT / ".venv" / "bin"]
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        path.insert(0, str(venv / "bin"))
    env["PATH"] = os.pathsep.join(path)
    return env


def run(args, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def explained(done: subprocess.CompletedProcess) -> str:
    return (f"{done.args} exited with {done.returncode}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")


@pytest.mark.integration
def test_the_quickstart_install_works_in_a_fresh_venv(tmp_path):
    page = ROOT / "docs" / "quickstart.md"
    [install] = blocks(page, "sh", section="Install")
    pip_lines = [line for line in install.text.splitlines() if line.startswith("pip install")]
    assert pip_lines, f"no pip install command in the quickstart's install block:\n{install.text}"
    assert all(TORCH_PIN in line for line in pip_lines), f"every install pins {TORCH_PIN}:\n{install.text}"
    assert "checkout" in page.read_text().split("## Install", 1)[1].split("```", 1)[0]

    repo, venv = checkout(tmp_path), tmp_path / "venv"
    done = run([sys.executable, "-m", "venv", str(venv)], tmp_path, clean_env())
    assert done.returncode == 0, explained(done)
    env = clean_env(venv)
    # As written, in the checkout. pip skips byte-compiling what it installs (Python compiles a module when it
    # is first imported): compiling all of torch is two thirds of pip's time and checks nothing about the install.
    done = run(["bash", "-euo", "pipefail", "-c", install.text], repo, {**env, "PIP_NO_COMPILE": "1"}, timeout=900)
    assert done.returncode == 0, explained(done)

    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    python = str(venv / "bin" / "python")
    done = run([python, "-c", "import advmon, prometheus_client, torch; print(advmon.__file__, torch.__version__)"],
               elsewhere, env)
    assert done.returncode == 0, explained(done)
    where, torch_version = done.stdout.split()
    assert Path(where).is_relative_to(venv) and torch_version.startswith("2.13.0")  # installed, not the checkout
    done = run([str(venv / "bin" / "advmon"), "--help"], elsewhere, env)
    assert done.returncode == 0 and "demo" in done.stdout, explained(done)
    [watch] = blocks(page, "python", section="Watch an estimator")
    (elsewhere / "quickstart.py").write_text(watch.text)
    done = run([python, "quickstart.py"], elsewhere, env)
    assert done.returncode == 0, explained(done)
    assert done.stdout.splitlines()[0] == "0.5"  # two of four groups teach nothing
    assert (elsewhere / "advmon-runs" / "quickstart.jsonl").is_file()


@pytest.mark.integration
def test_what_the_docs_say_to_run_after_make_demo_works_after_make_demo(tmp_path):
    """What README, the demo's own output and docs/dashboards.md say to run next: alerts check, report, compare,
    demo --serve."""
    make = require_binary("make")
    repo = checkout(tmp_path)
    env = clean_env()
    done = run([make, "demo"], repo, env, timeout=900)
    assert done.returncode == 0, explained(done)
    assert "advmon compare advmon-runs/tp1.jsonl advmon-runs/tp2.jsonl" in done.stdout
    advmon = str(repo / ".venv" / "bin" / "advmon")

    for args, code in [
        (["alerts", "check", "advmon-runs/tp1.jsonl", "advmon-runs/tp2.jsonl"], 1),  # tp2 fires criticals
        (["report", "advmon-runs/tp2.jsonl"], 0),
        (["compare", "advmon-runs/tp1.jsonl", "advmon-runs/tp2.jsonl"], 1),  # they diverge
    ]:
        done = run([advmon, *args], repo, env)
        assert done.returncode == code, explained(done)

    # Ctrl-C as a terminal sends it, whatever this process inherited: a shell's background job (cmd &) ignores
    # SIGINT, its children too, and Python then installs no KeyboardInterrupt handler.
    serve = subprocess.Popen([advmon, "demo", "--serve", "--port", "0", "--step-seconds", "0.2"], cwd=repo,
                             env={**env, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        ready, _, _ = select.select([serve.stdout], [], [], 60)
        first = serve.stdout.readline() if ready else ""
        address = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", first)
        assert address, f"no endpoint in {first!r}; stderr: {serve.stderr.read() if serve.poll() is not None else ''}"
        url = f"http://{address[1]}/metrics"
        wait_for(lambda: 'advmon_updates_total{run="tp2"}' in http_get(url).decode(), 30, f"tp2's series at {url}")
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C, as the demo says
        _, stderr = serve.communicate(timeout=30)
    assert serve.returncode == 0, stderr
    assert "unclosed" not in stderr, stderr  # the endpoint's socket is closed, not left to the garbage collector


def test_demo_serve_without_prometheus_client_says_what_to_install(tmp_path):
    hidden = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # as if it were not installed\n"
        "from advmon.cli import main\n"
        "sys.exit(main(['demo', '--serve', '--port', '0', '--out', 'runs']))\n"
    )
    done = run([sys.executable, "-c", hidden], tmp_path, clean_env(), timeout=60)
    assert done.returncode == 2, explained(done)  # bad input: the CLI's one convention
    assert done.stderr == (
        "advmon: error: advmon demo --serve needs prometheus_client, which is not installed: "
        "pip install 'advmon[prometheus]'\n"
    )
    assert done.stdout == ""

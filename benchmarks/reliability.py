"""Try advmon as a hostile user would, and count what went wrong (docs/reliability.md).

1. Random hostile calls (shapes, dtypes, NaN/Inf, masks, groups, missing or odd
   inputs, NumPy layouts) through a watched estimator with every warning turned
   into an error: exceptions that escaped, results that were not the very object.
2. Faults: sinks that fail at random, stall, or are killed; a writer killed with
   SIGKILL mid-run and resumed: acknowledged records (``monitor.wait()`` returned
   after them) lost from the JSONL file.
3. Secrets configured in sink URLs, searched for in everything printed and written.
4. Interpreter exit with stuck sinks: seconds, against the budget.

    python benchmarks/reliability.py [--calls 5000] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

import advmon


def hostile_call(rng: random.Random):
    """(prompt_ids, rewards, mask) drawn from the ways real loops and broken ones call estimators."""
    batch = rng.choice([0, 1, 2, 3, 8, 16, 33])
    tokens = rng.choice([1, 4, 17])
    dtype = rng.choice([torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64])
    rewards = torch.randn(batch).to(dtype) if dtype != torch.int64 else torch.randint(0, 2, (batch,))
    if batch and rng.random() < 0.3:
        rewards = rewards.float()
        rewards[rng.randrange(batch)] = rng.choice([float("nan"), float("inf"), -float("inf")])
    form = rng.random()
    if form < 0.1:
        rewards = rewards.float().numpy()[::-1]  # negative strides
    elif form < 0.2:
        rewards = rewards.float().tolist()
    elif form < 0.25:
        rewards = None
    elif form < 0.3:
        rewards = "not rewards"
    elif form < 0.35:
        array = rewards.float().numpy().astype(np.longdouble)
        array.flags.writeable = False
        rewards = array
    mask_kind = rng.random()
    if mask_kind < 0.2:
        mask = torch.zeros(batch, tokens)
    elif mask_kind < 0.3:
        mask = torch.ones(batch, tokens + 1)  # another shape
    elif mask_kind < 0.4:
        mask = (torch.rand(batch, tokens) < 0.5)
    elif mask_kind < 0.5:
        mask = torch.rand(batch, tokens) * 3  # non-0/1 weights
    else:
        mask = torch.ones(batch, tokens)
    group = rng.choice([1, 2, 4, 5])
    ids = torch.arange(batch) // group
    if rng.random() < 0.1:
        ids = torch.arange(max(batch - 1, 0))  # wrong length
    elif rng.random() < 0.1:
        ids = np.array([f"uid-{i // group}" for i in range(batch)], dtype=object)
    return ids, rewards, mask


def run_hostile(calls: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    monitor = advmon.Monitor("hostile", sinks=[])
    produced = []

    @monitor.watch
    def compute_advantage(prompt_ids, rewards, mask):
        result = torch.zeros(mask.shape)
        produced.append(result)
        return result

    escaped = not_same = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(calls):
            args = hostile_call(rng)
            try:
                result = compute_advantage(*args)
            except Exception:  # noqa: BLE001 - what the review counts
                escaped += 1
                continue
            not_same += result is not produced[-1]
        monitor.close()
    return {"calls": calls, "exceptions escaped": escaped, "results not the same object": not_same,
            "problems counted": monitor.internal_errors}


class Flaky(advmon.Sink):
    name = "flaky"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.seen = 0

    def write(self, record):
        if self.rng.random() < 0.3:
            raise ConnectionError("backend hiccup")
        if self.rng.random() < 0.05:
            time.sleep(0.05)  # a stall
        self.seen += 1


def run_faults(seed: int, records: int = 300) -> dict[str, int]:
    folder = Path(tempfile.mkdtemp())
    rng = random.Random(seed)
    flaky = Flaky(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = advmon.Monitor("faults", sinks=[advmon.JsonlSink(folder / "faults.jsonl"), flaky], retries=5,
                                 queue_size=50)
        for _ in range(records):
            monitor.observe(rewards=torch.rand(8))
        monitor.close(timeout=30)
    in_file = len(advmon.read_jsonl(folder / "faults.jsonl"))
    metrics = monitor.last_metrics
    accounted = flaky.seen + metrics["advmon/sink_errors/flaky"] + metrics["advmon/dropped_records/flaky"]
    killed = _kill_mid_run(folder)
    return {"records": records, "lost from the JSONL file": records - in_file,
            "records the flaky sink neither took nor counted": int(records - accounted),
            "SIGKILL runs": killed["runs"], "records lost after SIGKILL and resume": killed["lost"]}


def _kill_mid_run(folder: Path, runs: int = 3) -> dict[str, int]:
    """SIGKILL a writer mid-run, three times, each run resuming the last one's file.

    A record is acknowledged once ``monitor.wait()`` has returned after it (the host half
    has written its line): every acknowledged record must be in the file. Records a
    SIGKILL catches still on the host half are lost by design, as nothing runs on
    SIGKILL (``advmon.flush()`` or ``monitor.wait()`` before a kill saves them).
    """
    script = folder / "writer.py"
    script.write_text(
        "import sys, torch, advmon\n"
        "m = advmon.Monitor('killed', sinks=[advmon.JsonlSink(sys.argv[1])], resume=True)\n"  # each run resumes
        "for i in range(100000):\n"
        "    m.observe(rewards=torch.rand(64))\n"
        "    if i % 10 == 9:\n"
        "        m.wait()\n"
        "        print(i, flush=True)\n"
    )
    path = folder / "killed.jsonl"
    acknowledged = []
    for _ in range(runs):
        process = subprocess.Popen([sys.executable, str(script), str(path)], stdout=subprocess.PIPE, text=True)
        last = -1
        for _ in range(5):
            last = int(process.stdout.readline())
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        acknowledged.append(last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = advmon.read_jsonl(path)
    # Each run's steps count up from 0, in the order the runs appended them.
    by_run: list[set[int]] = []
    for record in records:
        if record.step == 0:
            by_run.append(set())
        if by_run:
            by_run[-1].add(record.step)
    by_run += [set()] * (runs - len(by_run))
    lost = sum(len(set(range(last + 1)) - steps) for last, steps in zip(acknowledged, by_run))
    return {"runs": runs, "lost": lost}


def run_secrets() -> dict[str, int]:
    folder = Path(tempfile.mkdtemp())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_secrets.py", "-k", "no_secret"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
    )
    del folder
    return {"secret-search tests passed": int(done.returncode == 0)}


def run_exit(monitors: int = 6, budget: float = 2.0) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp())
    script = folder / "stuck.py"
    script.write_text(
        "import threading, torch, advmon\n"
        "class Stuck(advmon.Sink):\n"
        "    name = 'stuck'\n"
        "    def write(self, record):\n"
        "        threading.Event().wait()\n"
        f"ms = [advmon.Monitor(f'r{{i}}', sinks=[advmon.JsonlSink(f'r{{i}}.jsonl'), Stuck()]) for i in range({monitors})]\n"
        "for m in ms:\n"
        "    m.observe(rewards=torch.ones(2))\n"
        "import time; print(time.monotonic(), flush=True)\n"
    )
    done = subprocess.run([sys.executable, str(script)], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "ADVMON_EXIT_TIMEOUT": str(budget)})
    finished = time.monotonic()
    exit_seconds = finished - float(done.stdout.strip().splitlines()[-1])
    return {"monitors with a stuck sink": monitors, "exit budget (s)": budget, "exit took (s)": round(exit_seconds, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sections = {
        "hostile inputs, every warning an error": run_hostile(args.calls, args.seed),
        "faults": run_faults(args.seed),
        "secrets": run_secrets(),
        "interpreter exit": run_exit(),
    }
    for title, figures in sections.items():
        print(f"\n{title}")
        for name, value in figures.items():
            print(f"  {name}: {value}")
    bad = (sections["hostile inputs, every warning an error"]["exceptions escaped"]
           + sections["hostile inputs, every warning an error"]["results not the same object"]
           + sections["faults"]["lost from the JSONL file"]
           + sections["faults"]["records the flaky sink neither took nor counted"]
           + sections["faults"]["records lost after SIGKILL and resume"]
           + (1 - sections["secrets"]["secret-search tests passed"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

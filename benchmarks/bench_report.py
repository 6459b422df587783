"""How long `advmon report`, `advmon compare` and `advmon alerts check` take on a long run.

Writes a 100k-step JSONL run (records of a simulated GRPO run, repeated) and times
each phase: reading, evaluating the alert catalog, the report, the comparison.
Prints medians of ``--repeat`` runs (these machines are noisy).

    python benchmarks/bench_report.py [--steps 100000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from advmon.alerts.evaluator import evaluate_records
from advmon.reports.compare import compare_runs
from advmon.reports.html_page import write_report
from advmon.runs import read_run
from advmon.simulation import RunSpec, simulate


def write_long_run(path: Path, steps: int) -> None:
    base = simulate(RunSpec("grpo_binary", steps=150))
    with path.open("w") as f:
        for step in range(steps):
            record = base[step % len(base)]
            metrics = {k: (v if math.isfinite(v) else None) for k, v in record.metrics.items()}
            f.write(json.dumps({"run": "long", "step": step, "time": float(step), "estimator": "e",
                                "pre_norm_source": "derived", "metrics": metrics}) + "\n")


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp())
    path = folder / "long.jsonl"
    write_long_run(path, args.steps)
    phases: dict[str, list[float]] = {"read": [], "alerts": [], "report (whole)": [], "compare (read excluded)": []}
    for _ in range(args.repeat):
        seconds, run = timed(read_run, path)
        phases["read"].append(seconds)
        phases["alerts"].append(timed(evaluate_records, run.records)[0])
        phases["report (whole)"].append(timed(lambda: write_report(read_run(path), folder / "long.html"))[0])
        phases["compare (read excluded)"].append(timed(compare_runs, run, run)[0])
    size = path.stat().st_size / 1e6
    print(f"{args.steps} steps, {size:.0f} MB of JSONL, median of {args.repeat} runs:")
    print("| phase | seconds (median) | min | max |\n|---|---|---|---|")
    for phase, values in phases.items():
        print(f"| {phase} | {statistics.median(values):.1f} | {min(values):.1f} | {max(values):.1f} |")
    print(f"report page: {(folder / 'long.html').stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

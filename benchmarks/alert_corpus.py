"""Score the alert catalog on simulated healthy and failing runs (docs/alerts.md).

For every failure kind (known onset step) it reports whether its intended rule
caught it and how many steps after onset; for every rule, the false alarms it
raised on healthy runs and before onset on failing ones.

    python benchmarks/alert_corpus.py [--seeds 3] [--steps 150] [--onset 60] [--threshold NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict

from advmon.alerts.evaluator import evaluate_records
from advmon.rules import CATALOG, Thresholds
from advmon.simulation import FAILURES, corpus, simulate


def score(seeds: int, steps: int, onset: int, thresholds: Thresholds) -> str:
    started = time.perf_counter()
    specs = corpus(seeds=seeds, steps=steps, onset=onset)
    caught: dict[str, list[int | None]] = defaultdict(list)
    false_alarms: dict[str, list[str]] = defaultdict(list)
    other_catches: dict[str, set[str]] = defaultdict(set)
    healthy_runs = 0
    margins: dict[str, list[float]] = defaultdict(list)
    for spec in specs:
        records = simulate(spec)
        occurrences = evaluate_records(records, thresholds)
        if not spec.failing:
            healthy_runs += 1
            for name, value in healthy_margins(records, thresholds).items():
                margins[name].append(value)
            for o in occurrences:
                false_alarms[o.alert].append(f"{spec.name}@{o.fired_step}")
            continue
        target = FAILURES[spec.kind]
        delays = [o.fired_step - spec.onset for o in occurrences if o.alert == target and o.fired_step >= spec.onset]
        caught[spec.kind].append(min(delays) if delays else None)
        for o in occurrences:
            if o.fired_step < spec.onset:
                false_alarms[o.alert].append(f"{spec.name}@{o.fired_step} (before onset)")
            elif o.alert != target:
                other_catches[spec.kind].add(o.alert)
    lines = [
        f"{len(specs)} runs ({healthy_runs} healthy, {len(specs) - healthy_runs} failing), {steps} steps each, "
        f"onset at step {onset}; {time.perf_counter() - started:.0f} s",
        "",
        "| failure | intended rule | caught | steps after onset (median, max) | also fired |",
        "|---|---|---|---|---|",
    ]
    for kind, target in FAILURES.items():
        delays = caught[kind]
        hits = [d for d in delays if d is not None]
        spread = f"{statistics.median(hits):g}, {max(hits)}" if hits else "-"
        also = ", ".join(sorted(other_catches[kind])) or "-"
        lines.append(f"| {kind} | {target} | {len(hits)}/{len(delays)} | {spread} | {also} |")
    lines += ["", "| rule | severity | false alarms (healthy runs, and failing runs before onset) |", "|---|---|---|"]
    for rule in CATALOG:
        alarms = false_alarms.get(rule.name, [])
        where = "in-process n/a (Prometheus only)" if rule.evaluate is None else (", ".join(alarms) or "0")
        lines.append(f"| {rule.name} | {rule.severity} | {where if not alarms else f'{len(alarms)}: {where}'} |")
    lines += ["", "How close healthy runs came to each threshold (worst value over all healthy runs):", ""]
    lines += ["| signal | worst on healthy runs | threshold |", "|---|---|---|"]
    for name, (pick, threshold) in _MARGINS.items():
        values = [v for v in margins[name] if v == v]
        worst = (max if pick == "max" else min)(values) if values else float("nan")
        lines.append(f"| {name} | {worst:.3g} | {threshold(thresholds)} |")
    return "\n".join(lines)


_MARGINS = {
    "zero-std ratio, 3-record minimum": ("max", lambda t: f"> {t['zero_std_ratio']:g}"),
    "|A| / its bound (advantages/bound_ratio)": ("max", lambda t: f"> {t['bound_factor']:g}"),
    "pre-norm std / trailing median (low)": ("min", lambda t: f"< {t['scale_collapse_ratio']:g}"),
    "pre-norm std / trailing median (high)": ("max", lambda t: f"> {t['scale_spike_ratio']:g}"),
    "|post-norm mean - trailing median| / trailing std": ("max", lambda t: f"> {t['mean_drift']:g}"),
    "reward drop / trailing reward std": ("max", lambda t: f"> {t['reward_drop_stds']:g}"),
}


def healthy_margins(records, thresholds: Thresholds) -> dict[str, float]:
    """The worst value each signal reached on one healthy run."""
    from advmon.rules import _go_quantile

    window = thresholds.records("trailing_records")
    history = thresholds.records("min_history_records")
    out: dict[str, list[float]] = defaultdict(list)
    zero = [r.metrics.get("groups/zero_std_fraction", float("nan")) for r in records]
    out["zero-std ratio, 3-record minimum"] = [min(zero[i - 2 : i + 1]) for i in range(2, len(zero))]
    for i, record in enumerate(records):
        m = record.metrics
        out["|A| / its bound (advantages/bound_ratio)"].append(m["advantages/bound_ratio"])
        recent = records[max(0, i - window + 1) : i + 1]
        if len(recent) < history:
            continue

        def median(key: str) -> float:
            return _go_quantile(0.5, [r.metrics[key] for r in recent])

        ratio = m["advantages/pre_norm/std"] / median("advantages/pre_norm/std")
        out["pre-norm std / trailing median (low)"].append(ratio)
        out["pre-norm std / trailing median (high)"].append(ratio)
        out["|post-norm mean - trailing median| / trailing std"].append(
            abs(m["advantages/post_norm/mean"] - median("advantages/post_norm/mean")) / median("advantages/post_norm/std"))
        out["reward drop / trailing reward std"].append((median("rewards/mean") - m["rewards/mean"]) / median("rewards/std"))
    return {name: ((max if _MARGINS[name][0] == "max" else min)(v) if v else float("nan")) for name, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--onset", type=int, default=60)
    parser.add_argument("--threshold", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)
    print(score(args.seeds, args.steps, args.onset, Thresholds.parse(args.threshold)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

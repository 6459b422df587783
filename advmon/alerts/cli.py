"""``advmon alerts generate`` and ``advmon alerts check``: the command-line face of the alerts."""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

from advmon.alerts import generate as write_files
from advmon.alerts.alertmanager import AlertmanagerSettings
from advmon.alerts.evaluator import Occurrence, evaluate_records
from advmon.alerts.prometheus_rules import AlertSettings
from advmon.errors import AdvmonConfigError, AdvmonError
from advmon.rules import Thresholds, parse_duration

__all__ = ["check", "format_occurrences", "generate"]

#: Exit codes of ``advmon alerts check``.
OK, CRITICAL, BAD_INPUT = 0, 1, 2


def generate(args: argparse.Namespace) -> int:
    interval = parse_duration(args.interval)
    if interval <= 0:
        raise AdvmonConfigError(f"--interval must be longer than 0, got {args.interval!r}")
    settings = AlertSettings(
        thresholds=Thresholds.parse(args.threshold),
        interval_seconds=interval,
        for_seconds=parse_duration(args.for_) if args.for_ else None,
        selector=args.selector,
        runbook_base=args.runbook_base,
        dashboard_url=args.dashboard_url,
    )
    webhook = {"webhook_file": args.slack_webhook_file} if args.slack_webhook_file else {}
    routing = AlertmanagerSettings(dashboard_url=args.dashboard_url, channel=args.slack_channel, **webhook)
    for path in write_files(args.out, settings, routing):
        print(f"wrote {path}")
    return OK


def check(files: list[Path], output: str, assignments: list[str]) -> int:
    """Evaluate the catalog over recorded runs; 1 if a critical alert fired, 2 on bad input."""
    from advmon.sinks.jsonl import one_history, read_jsonl

    try:
        thresholds = Thresholds.parse(assignments)
        records = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for path in files:
                records.extend(one_history(read_jsonl(path), str(path)))
        for warning in caught:
            print(f"advmon: warning: {warning.message}", file=sys.stderr)
    except AdvmonError as exc:
        print(f"advmon: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    if not records:
        print(f"advmon: error: no records in {', '.join(map(str, files))}", file=sys.stderr)
        return BAD_INPUT
    occurrences = evaluate_records(records, thresholds)
    if output == "json":
        print(json.dumps([o.to_dict() for o in occurrences], indent=2))
    else:
        print(format_occurrences(occurrences, sorted({r.run for r in records})))
    return CRITICAL if any(o.severity == "critical" for o in occurrences) else OK


def format_occurrences(occurrences: list[Occurrence], runs: list[str]) -> str:
    """When each alert fired and resolved, run by run."""
    lines = []
    for run in runs:
        mine = [o for o in occurrences if o.run == run]
        lines.append(f"run {run}: {len(mine)} alert(s)" if mine else f"run {run}: no alerts")
        for o in mine:
            resolved = f"resolved at step {o.resolved_step}" if o.resolved_step is not None else "still firing"
            value = "-" if not math.isfinite(o.value) else f"{o.value:.4g}"
            labels = "".join(f" {key}={label}" for key, label in o.labels)
            lines.append(f"  {o.severity:<8} {o.alert:<34} fired at step {o.fired_step:<5} {resolved:<22} value {value}"
                         f"{labels}")
            if o.where:
                lines.append(f"           where: {o.where}")
    return "\n".join(lines)

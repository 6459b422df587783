"""``advmon alerts generate`` and ``advmon alerts check``: the command-line face of the alerts."""

from __future__ import annotations

import argparse
import json
import math
from typing import TYPE_CHECKING

from advmon.alerts import generate as write_files
from advmon.alerts.alertmanager import AlertmanagerSettings
from advmon.alerts.evaluator import Occurrence, evaluate_records
from advmon.alerts.prometheus_rules import AlertSettings
from advmon.errors import AdvmonConfigError
from advmon.rules import Thresholds, parse_duration

if TYPE_CHECKING:
    from advmon.runs import Run  # advmon.runs imports torch: ``alerts generate`` does not need it

__all__ = ["check", "format_occurrences", "generate", "occurrences_data"]

#: Exit codes of ``advmon alerts check`` (the CLI's convention: a critical alert is a finding).
OK, CRITICAL = 0, 1


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


def check(sources: list[str], output: str, assignments: list[str]) -> int:
    """Evaluate the catalog over recorded runs: 1 if a critical alert fired, else 0.

    Raises:
        AdvmonError: a source cannot be read or a threshold is unknown (the CLI's exit code 2).
    """
    from advmon.runs import read_runs

    thresholds = Thresholds.parse(assignments)
    runs = [run for source in sources for run in read_runs(source)]
    found = [(run, evaluate_records(run.records, thresholds)) for run in runs]
    if output == "json":
        print(json.dumps(occurrences_data(found), indent=2))
    else:
        print(format_occurrences(found))
    critical = any(o.severity == "critical" for _, occurrences in found for o in occurrences)
    return CRITICAL if critical else OK


def occurrences_data(found: list[tuple[Run, list[Occurrence]]]) -> dict[str, list[dict]]:
    """``alerts check --format json``: the runs checked (so a healthy run is seen to be checked) and the alerts.

    Example:
        >>> occurrences_data([])
        {'checked': [], 'alerts': []}
    """
    return {
        "checked": [{"run": run.name, "source": run.source, "records": len(run.records), "alerts": len(mine)}
                    for run, mine in found],
        "alerts": [{**o.to_dict(), "source": run.source} for run, mine in found for o in mine],
    }


def format_occurrences(found: list[tuple[Run, list[Occurrence]]]) -> str:
    """When each alert fired and resolved, run by run (each named with the file it came from)."""
    lines = []
    for run, mine in found:
        lines.append(f"run {run.name} ({run.source}): " + (f"{len(mine)} alert(s)" if mine else "no alerts"))
        for o in mine:
            resolved = f"resolved at step {o.resolved_step}" if o.resolved_step is not None else "still firing"
            value = "-" if not math.isfinite(o.value) else f"{o.value:.4g}"
            labels = "".join(f" {key}={label}" for key, label in o.labels)
            lines.append(f"  {o.severity:<8} {o.alert:<34} fired at step {o.fired_step:<5} {resolved:<22} value {value}"
                         f"{labels}")
            if o.where:
                lines.append(f"           where: {o.where}")
    return "\n".join(lines)

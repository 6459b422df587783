"""A terminal summary of a run's records: last and worst values, and the catalog's verdict.

The instability signs are the alert catalog's (:mod:`advmon.rules`): the first step
each of its alerts fired over the run, as ``advmon alerts check`` and the generated
Prometheus rules judge it, so a summary and the alerts never give two verdicts.

Example:
    >>> from advmon.record import Record
    >>> records = [Record("r", s, 0.0, "e", "derived", {"rewards/nan_count": float(s > 1)}) for s in range(3)]
    >>> [(sign.step, sign.name) for sign in first_signs(records)]
    [(2, 'AdvmonNonFiniteRewards')]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from advmon.record import Record
from advmon.rules import Thresholds

__all__ = ["TABLE", "WORST_END", "Sign", "first_signs", "format_summary", "summary_data", "worst_step_text",
           "worst_value"]


@dataclass(frozen=True)
class Sign:
    """The first step at which a catalog alert fired, its severity and what it said."""

    name: str
    step: int
    detail: str
    severity: str = ""


def _value(record: Record, key: str) -> float:
    return record.metrics.get(key, math.nan)


#: The summary's statistics and which end of each is the worse one ("min": the lowest value, "max": the highest):
#: a low reward mean or pre-norm std, a high NaN count, zero-std share, post-norm std, p99 or max, a low min.
TABLE: tuple[tuple[str, str], ...] = (
    ("rewards/mean", "min"),
    ("rewards/nan_count", "max"),
    ("groups/zero_std_fraction", "max"),
    ("advantages/pre_norm/std", "min"),
    ("advantages/post_norm/std", "max"),
    ("advantages/post_norm/min", "min"),
    ("advantages/post_norm/max", "max"),
    ("advantages/post_norm/p99", "max"),
    ("advantages/post_norm/nan_count", "max"),
)


#: How the summary names each end.
WORST_END = {"min": "lowest", "max": "highest"}


def first_signs(records: Sequence[Record], thresholds: Thresholds | None = None) -> list[Sign]:
    """The first step each alert of the catalog fired, in order of appearance (``advmon alerts check``'s verdict)."""
    from advmon.alerts.evaluator import evaluate_records

    found: dict[str, Sign] = {}
    for occurrence in evaluate_records(sorted(records, key=lambda r: r.step), thresholds):
        if occurrence.alert not in found:
            found[occurrence.alert] = Sign(occurrence.alert, occurrence.fired_step, occurrence.description,
                                           occurrence.severity)
    return sorted(found.values(), key=lambda s: s.step)


def worst_value(records: Sequence[Record], key: str, end: str) -> tuple[float, int] | None:
    """The worst finite value of ``key`` (``end`` = "min" or "max") and its step."""
    values = [(_value(r, key), r.step) for r in records if math.isfinite(_value(r, key))]
    if not values:
        return None
    pick = min if end == "min" else max
    return pick(values, key=lambda v: v[0])


def worst_step_text(records: Sequence[Record], key: str, step: int | str) -> str:
    """The worst value's step, or ``every step`` where ``key`` has one value throughout (its first step says nothing).

    Example:
        >>> records = [Record("r", s, 0.0, "e", None, {"n": 0.0, "m": float(s % 2)}) for s in range(3)]
        >>> worst_step_text(records, "n", 0), worst_step_text(records, "m", 1)
        ('every step', '1')
    """
    values = {_value(r, key) for r in records if math.isfinite(_value(r, key))}
    return "every step" if len(values) == 1 and len(records) > 1 else str(step)


def format_summary(run: str, records: Sequence[Record], source: str = "", thresholds: Thresholds | None = None) -> str:
    """Human-readable summary of one run (what ``advmon demo`` and ``advmon summary`` print); the instability signs
    are the catalog's alerts at ``thresholds`` (default the catalog's)."""
    records = sorted(records, key=lambda r: r.step)
    where = f", {source}" if source else ""
    lines = [f"run {run} ({len(records)} records{where})"]
    if not records:
        return "\n".join(lines + ["  no records"])
    last = records[-1]
    lines.append(f"  {'metric':34} {'last':>12}   worst: the lowest or highest value over the run, and its step")
    for key, end in TABLE:
        worst = worst_value(records, key, end)
        if worst:
            where = worst_step_text(records, key, worst[1])
            at = "at" if where == "every step" else "at step"
            worst_text = f"{WORST_END[end]:<8}{_fmt(worst[0]):>12} {at} {where}"
        else:
            worst_text = f"{WORST_END[end]:<8}{'-':>12}"
        lines.append(f"  {key:34} {_fmt(_value(last, key)):>12}   {worst_text}")
    signs = first_signs(records, thresholds)
    if not signs:
        lines.append("  instability signs: none (no alert of the catalog fired)")
    else:
        lines.append("  instability signs (the first step each catalog alert fired):")
        lines.extend(f"    step {s.step:>4}  {s.severity:<8} {s.name}: {s.detail}" for s in signs)
    return "\n".join(lines)


def summary_data(run: str, records: Sequence[Record], source: str = "",
                 thresholds: Thresholds | None = None) -> dict[str, Any]:
    """The summary as plain data (``advmon summary --format json``): the same statistics, worst values and signs as
    :func:`format_summary`, with ``null`` for a value the run never had.

    Example:
        >>> records = [Record("r", s, 0.0, "e", None, {"rewards/nan_count": float(s > 1)}) for s in range(3)]
        >>> data = summary_data("r", records)
        >>> data["metrics"]["rewards/nan_count"], [(a["alert"], a["step"]) for a in data["alerts"]]
        ({'last': 1.0, 'worst': 'highest', 'worst_value': 1.0, 'worst_step': 2}, [('AdvmonNonFiniteRewards', 2)])
    """
    records = sorted(records, key=lambda r: r.step)
    metrics: dict[str, dict[str, Any]] = {}
    for key, end in TABLE:
        worst = worst_value(records, key, end)
        metrics[key] = {"last": _number(_value(records[-1], key)) if records else None, "worst": WORST_END[end],
                        "worst_value": worst[0] if worst else None, "worst_step": worst[1] if worst else None}
    return {
        "run": run, "source": source, "records": len(records),
        "steps": [records[0].step, records[-1].step] if records else None,
        "metrics": metrics,
        "alerts": [{"alert": s.name, "severity": s.severity, "step": s.step, "detail": s.detail}
                   for s in first_signs(records, thresholds)],
    }


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.5g}"

"""A terminal summary of a run's records: last and worst values, first signs of trouble.

The signs are the instability signatures RL teams look for first; the generated
Prometheus alerts encode the same thresholds for on-call.

Example:
    >>> from advmon.record import Record
    >>> records = [Record("r", s, 0.0, "e", "derived", {"rewards/nan_count": float(s > 1)}) for s in range(3)]
    >>> [(sign.step, sign.name) for sign in first_signs(records)]
    [(2, 'NaN/Inf rewards')]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from advmon.record import Record

__all__ = ["ADVANTAGE_OUTLIER", "SIGNS", "TABLE", "Sign", "first_signs", "format_summary", "worst_value"]

#: |advantage| beyond which a value is an outlier. Sample-std normalization bounds
#: |A| by (G-1)/sqrt(G) (2.47 for G=8), but a leave-one-out std over graded rewards
#: legitimately reaches the tens; hundreds and more mean a std that should have
#: been 0 (float32 cancellation, an epsilon instead of a zero-std guard).
ADVANTAGE_OUTLIER = 50.0
#: Zero-std group fraction from which most of the batch carries no learning signal.
ZERO_STD_MAJORITY = 0.5


@dataclass(frozen=True)
class Sign:
    """The first step at which an instability sign appeared, and what was seen."""

    name: str
    step: int
    detail: str


def _value(record: Record, key: str) -> float:
    return record.metrics.get(key, math.nan)


def _nonfinite(record: Record, prefix: str) -> float:
    counts = (_value(record, f"{prefix}/{kind}_count") for kind in ("nan", "inf"))
    return sum(c for c in counts if not math.isnan(c))


def _outlier(record: Record) -> float:
    extremes = [abs(_value(record, f"advantages/post_norm/{k}")) for k in ("min", "max")]
    finite = [e for e in extremes if math.isfinite(e)]
    return max(finite, default=0.0)


# name, test on a record, description of what was seen
SIGNS: tuple[tuple[str, Callable[[Record], bool], Callable[[Record], str]], ...] = (
    (
        "NaN/Inf rewards",
        lambda r: _nonfinite(r, "rewards") > 0,
        lambda r: f"{_value(r, 'rewards/nan_count'):g} NaN, {_value(r, 'rewards/inf_count'):g} Inf rewards",
    ),
    (
        "NaN/Inf advantages",
        lambda r: _nonfinite(r, "advantages/post_norm") + _nonfinite(r, "advantages/pre_norm") > 0,
        lambda r: f"{_nonfinite(r, 'advantages/post_norm'):g} non-finite post-norm values",
    ),
    (
        f"advantage outliers (|A| > {ADVANTAGE_OUTLIER:g})",
        lambda r: _outlier(r) > ADVANTAGE_OUTLIER,
        lambda r: f"min {_value(r, 'advantages/post_norm/min'):.6g}, max {_value(r, 'advantages/post_norm/max'):.6g}",
    ),
    (
        f"zero-std groups >= {ZERO_STD_MAJORITY:.0%}",
        lambda r: _value(r, "groups/zero_std_fraction") >= ZERO_STD_MAJORITY,
        lambda r: f"zero_std_fraction {_value(r, 'groups/zero_std_fraction'):.2f}",
    ),
)

# key, label, which end is worse
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


def first_signs(records: Sequence[Record]) -> list[Sign]:
    """The first step each instability sign appeared, in order of appearance."""
    found: dict[str, Sign] = {}
    for record in sorted(records, key=lambda r: r.step):
        for name, test, detail in SIGNS:
            if name not in found and test(record):
                found[name] = Sign(name, record.step, detail(record))
    return sorted(found.values(), key=lambda s: s.step)


def worst_value(records: Sequence[Record], key: str, end: str) -> tuple[float, int] | None:
    """The worst finite value of ``key`` (``end`` = "min" or "max") and its step."""
    values = [(_value(r, key), r.step) for r in records if math.isfinite(_value(r, key))]
    if not values:
        return None
    pick = min if end == "min" else max
    return pick(values, key=lambda v: v[0])


def format_summary(run: str, records: Sequence[Record], source: str = "") -> str:
    """Human-readable summary of one run (what ``advmon demo`` and ``advmon summary`` print)."""
    records = sorted(records, key=lambda r: r.step)
    where = f", {source}" if source else ""
    lines = [f"run {run} ({len(records)} records{where})"]
    if not records:
        return "\n".join(lines + ["  no records"])
    last = records[-1]
    lines.append(f"  {'metric':34} {'last':>12}   {'worst':>12} (step)")
    for key, end in TABLE:
        worst = worst_value(records, key, end)
        worst_text = f"{worst[0]:>12.5g} ({worst[1]})" if worst else f"{'-':>12}"
        lines.append(f"  {key:34} {_fmt(_value(last, key)):>12}   {worst_text}")
    signs = first_signs(records)
    if not signs:
        lines.append("  instability signs: none")
    else:
        lines.append("  instability signs (first step seen):")
        lines.extend(f"    step {s.step:>4}  {s.name}: {s.detail}" for s in signs)
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.5g}"

"""The alert catalog: every rule advmon knows, declared once.

Each :class:`Rule` says what it means (name, severity, summary, description,
runbook anchor), how long a condition must hold (``for_records``) and which
:class:`Threshold` values it uses, and carries its condition twice, side by side:

* ``promql``: a PromQL expression over the metrics of :mod:`advmon.sinks.prometheus`,
  for the generated Prometheus rules (:mod:`advmon.alerts.prometheus_rules`);
* ``evaluate``: the same condition over a run's recent records, for the
  in-process evaluator (:mod:`advmon.alerts.evaluator`) and ``advmon alerts check``.

The two are proven to agree record by record by running promtool over recorded
runs (``tests/test_alerts_agreement.py``). Prometheus sees one sample per
*interval*; the in-process evaluator sees one record per step. They agree step for
step when one record arrives per interval; ``for_records=k`` becomes
``for: (k-1) x interval`` and a trailing window of ``n`` records becomes a range of
``n x interval - interval/2`` (exactly ``n`` samples).

This module is plain Python: no torch, no sinks, so generators and the CLI stay light.

Example:
    >>> thresholds = Thresholds.with_overrides({"zero_std_ratio": 0.9})
    >>> thresholds["zero_std_ratio"], thresholds["bound_factor"]
    (0.9, 3.0)
    >>> [rule.name for rule in CATALOG if rule.severity == "critical"]
    ['AdvmonNonFiniteRewards', 'AdvmonNonFiniteAdvantages', 'AdvmonAdvantageBeyondBound', 'AdvmonRewardFunctionNonFinite', 'AdvmonRunCrashed']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from advmon.errors import AdvmonConfigError

__all__ = [
    "CATALOG",
    "THRESHOLDS",
    "Finding",
    "PromContext",
    "Window",
    "abs_limit",
    "abs_max_of",
    "unless_finished",
    "dashboard_link",
    "format_number",
    "Rule",
    "Severity",
    "Threshold",
    "Thresholds",
    "group_bound",
    "parse_selector",
    "rule_named",
    "runbook_link",
    "where",
]

Severity = Literal["critical", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("critical", "warning", "info")


# --------------------------------------------------------------------------- thresholds


@dataclass(frozen=True)
class Threshold:
    """A tunable number of the catalog, with where its default comes from."""

    name: str
    default: float
    meaning: str
    source: str
    integer: bool = False


THRESHOLDS: tuple[Threshold, ...] = (
    Threshold(
        "bound_factor",
        3.0,
        "multiple of its normalization's bound above which |A| is impossible (advantages/bound_ratio)",
        "each kind's bound is what a healthy step reaches at most (advmon/normalization.py): G/sqrt(G-1) for a "
        "group-std normalization, the group's reward spread for a group-mean baseline, the z-score its own rewards "
        "give for NeMo-RL's leave-one-out std, a std of 1 and sqrt(N-1) for batch whitening, the reward scale in "
        "reward units; healthy runs of every estimator of verl, TRL and NeMo-RL at reward scales 0.01-100 stay "
        "at or below 1 (2.1 for NeMo-RL's unwhitened GAE), float32 cancellation gives >= 300x, an x100 bug 100x. "
        "Use 1.0 to catch subtler faults of an estimator whose kind is declared.",
    ),
    Threshold(
        "zero_std_ratio",
        0.8,
        "share of groups with all-equal rewards (no learning signal)",
        "healthy GRPO on binary math rewards has 25-45% zero-std groups, growing as the model "
        "improves (research.md); in the healthy corpus of docs/alerts.md it never stays above 0.5 for "
        "3 steps (a batch of 64 sequences touches 0.88 once); DAPO resamples to avoid the rest",
    ),
    Threshold(
        "scale_collapse_ratio",
        0.25,
        "pre-norm advantage std below this fraction of its trailing median",
        "a collapsing reward model shrinks the pre-norm spread while post-norm looks normal; healthy "
        "runs in docs/alerts.md never fall below 0.35 of their trailing median (64 sequences a step)",
    ),
    Threshold(
        "scale_spike_ratio",
        10.0,
        "pre-norm advantage std above this multiple of its trailing median",
        "Megatron-Bridge's spiky-loss check flags a value above 10x its running average",
    ),
    Threshold(
        "mean_drift",
        0.5,
        "post-norm mean this far from its trailing median, in trailing post-norm stds",
        "in units of the run's own post-norm spread, so it holds for unit-scale (std-normalized, whitened) and "
        "reward-unit (group-mean, ReMax) advantages alike; a healthy token-weighted mean stays within 0.16 "
        "stds of its trailing median even at 64 sequences a step (docs/alerts.md)",
    ),
    Threshold(
        "reward_drop_stds",
        0.75,
        "drop of the reward mean below its trailing median, in reward stds",
        "learning moves the mean up; on healthy runs of docs/alerts.md it dips at most 0.64 reward "
        "stds below its trailing median (64 sequences a step, prompts of mixed difficulty), never for "
        "3 steps in a row",
    ),
    Threshold(
        "trailing_records",
        30.0,
        "records in the trailing window that gives a run's own recent level",
        "30 steps: long enough for a robust median, short enough to follow a learning run",
        integer=True,
    ),
    Threshold(
        "min_history_records",
        10.0,
        "records a run needs in its window before relative rules apply",
        "a median of fewer than 10 steps is dominated by warm-up",
        integer=True,
    ),
    Threshold(
        "stale_seconds",
        900.0,
        "seconds without a record before a live run counts as hung (Prometheus only)",
        "15 minutes: longer than a slow step of a large recipe, shorter than an on-call shift's patience",
    ),
    Threshold(
        "silent_seconds",
        180.0,
        "seconds without a sign of life (a scrape of its endpoint, a push) before an unfinished run counts as "
        "crashed (Prometheus only)",
        "three times the Pushgateway sink's 30 s heartbeat and a 60 s scrape interval: one missed scrape or push "
        "is not a crash",
    ),
    Threshold(
        "crash_memory_seconds",
        3600.0,
        "how far back Prometheus looks for a run that vanished (a crashed scrape target's alert resolves after it)",
        "an hour: long enough for on-call to see it, short enough to keep the lookback cheap",
    ),
)

_BY_NAME = {t.name: t for t in THRESHOLDS}


class Thresholds(Mapping[str, float]):
    """The catalog's thresholds: defaults, overridden by name, validated.

    Example:
        >>> Thresholds.with_overrides({"zero_std": 1})
        Traceback (most recent call last):
        ...
        advmon.errors.AdvmonConfigError: unknown threshold 'zero_std'; known: bound_factor, zero_std_ratio, scale_collapse_ratio, scale_spike_ratio, mean_drift, reward_drop_stds, trailing_records, min_history_records, stale_seconds, silent_seconds, crash_memory_seconds
    """

    def __init__(self, values: Mapping[str, float]) -> None:
        self._values = dict(values)

    @classmethod
    def with_overrides(cls, overrides: Mapping[str, Any] | None = None) -> Thresholds:
        values = {t.name: t.default for t in THRESHOLDS}
        for name, raw in (overrides or {}).items():
            values[name] = _checked_threshold(name, raw)
        return cls(values)

    @classmethod
    def parse(cls, assignments: Iterable[str]) -> Thresholds:
        """From ``NAME=VALUE`` strings (the CLI's ``--threshold``)."""
        overrides: dict[str, str] = {}
        for text in assignments:
            name, sep, value = text.partition("=")
            if not sep or not name.strip():
                raise AdvmonConfigError(f"expected --threshold NAME=VALUE, got {text!r}")
            overrides[name.strip()] = value.strip()
        return cls.with_overrides(overrides)

    def __getitem__(self, name: str) -> float:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def records(self, name: str) -> int:
        return int(self._values[name])

    def __repr__(self) -> str:
        changed = {k: v for k, v in self._values.items() if v != _BY_NAME[k].default}
        return f"Thresholds({changed})"


#: Thresholds that were replaced, and what replaced them.
_REPLACED = {
    "group_bound_factor": "bound_factor (the same multiple, now of every normalization kind's own bound)",
    "ungrouped_abs_max": "bound_factor (whitened advantages are judged against their own Gaussian tail "
                         "sqrt(2 ln N), docs/alerts.md)",
}


def _checked_threshold(name: str, raw: Any) -> float:
    if name in _REPLACED:
        raise AdvmonConfigError(f"threshold {name!r} was replaced by {_REPLACED[name]}")
    if name not in _BY_NAME:
        raise AdvmonConfigError(f"unknown threshold {name!r}; known: {', '.join(_BY_NAME)}")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise AdvmonConfigError(f"threshold {name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise AdvmonConfigError(f"threshold {name} must be a finite number >= 0, got {raw!r}")
    if _BY_NAME[name].integer and (value != int(value) or value < 1):
        raise AdvmonConfigError(f"threshold {name} must be a positive whole number of records, got {raw!r}")
    return value


def group_bound(group_size: float, factor: float) -> float:
    """The largest |A| group normalization allows for groups of ``group_size``, times ``factor``.

    With population std |A| <= sqrt(G-1); with sample std (G-1)/sqrt(G); a
    leave-one-out baseline multiplies either by G/(G-1). The loosest, G/sqrt(G-1),
    is used. ``nan`` for G < 2 (no groups to normalize in).

    Example:
        >>> round(group_bound(8, 1.0), 4), round(8 ** 0.5 * 8 / 7 * 7 / 8, 4)
        (3.0237, 2.8284)
    """
    if not group_size >= 2:
        return math.nan
    return factor * group_size / math.sqrt(group_size - 1)


# --------------------------------------------------------------------------- records


class RecordLike(Protocol):
    run: str
    step: int
    metrics: Mapping[str, float]


@dataclass(frozen=True)
class Finding:
    """One series a rule looked at on one record: its labels, value and whether it holds."""

    active: bool
    value: float
    labels: tuple[tuple[str, str], ...] = ()


def _get(record: RecordLike, key: str) -> float:
    value = record.metrics.get(key, math.nan)
    return math.nan if value is None else float(value)


def _go_quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus's ``quantile``: NaN sorts first, linear interpolation, NaN propagates."""
    if not values:
        return math.nan
    total = sum(values)
    if total == total:  # no NaN (a NaN, or +Inf with -Inf, makes the sum NaN): a plain sort
        ordered = sorted(values)
    else:
        ordered = sorted(values, key=lambda v: (v == v, v))
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _div(a: float, b: float) -> float:
    """Float division with IEEE results (as PromQL), never ZeroDivisionError."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


class Window(list):
    """A run's recent records (oldest first), with the columns the trailing medians read.

    Several rules read the same median of the same record, and a long recorded
    run (100k steps) is evaluated record by record: ``columns`` (kept by the
    evaluator across records) holds each key's recent values, so a median costs
    one sort of ``trailing_records`` numbers.
    """

    def __init__(self, records: Sequence[RecordLike], columns: dict[str, Any] | None = None) -> None:
        super().__init__(records)
        self.columns = columns if columns is not None else {}
        self._medians: dict[tuple[str, int], tuple[float, int]] = {}

    def keys_with(self, prefix: str) -> list[str]:
        """The newest record's keys that start with ``prefix`` (cached while the key set keeps its size)."""
        metrics = self[-1].metrics
        cache_key = ("keys", prefix, len(metrics))
        keys = self.columns.get(cache_key)
        if keys is None or any(k not in metrics for k in keys):
            keys = self.columns[cache_key] = [k for k in metrics if k.startswith(prefix)]
        return keys

    def trailing(self, key: str, records: int) -> tuple[float, int]:
        cached = self._medians.get((key, records))
        if cached is None:
            column = self.columns.get(key)
            if column is None or len(column) != len(self):
                from collections import deque

                column = self.columns[key] = deque((_get(r, key) for r in self), maxlen=max(len(self), records))
            recent = list(column)[-records:]
            cached = self._medians[(key, records)] = (_go_quantile(0.5, recent), len(recent))
        return cached


def _trailing(window: Window, key: str, thresholds: Thresholds) -> tuple[float, int]:
    """Median of ``key`` over the trailing window (current record included) and its sample count."""
    return window.trailing(key, thresholds.records("trailing_records"))


def _nonfinite(record: RecordLike, prefix: str) -> float:
    counts = [_get(record, f"{prefix}/{kind}_count") for kind in ("nan", "inf")]
    return sum(c for c in counts if not math.isnan(c))


def abs_max_of(metrics: Mapping[str, float | None], stage: str = "post_norm") -> float:
    """``max(|min|, |max|)`` of a stage (``nan`` if neither is known): ``advmon_advantage_abs_max``.

    (:func:`advmon.record.abs_max` is the exporter's twin; this module stays free of torch.)
    """
    ends = [metrics.get(f"advantages/{stage}/{end}") for end in ("min", "max")]
    finite = [abs(e) for e in ends if e is not None and not math.isnan(e)]
    return max(finite) if finite else math.nan


def _counter_increase(window: Window, prefix: str) -> list[Finding]:
    """Per-sink increase of a cumulative ``prefix/<sink>`` counter since the previous record."""
    current = window[-1]
    previous = window[-2] if len(window) > 1 else None
    findings = []
    for key in window.keys_with(prefix):
        value = current.metrics[key]
        if value is None or math.isnan(value):
            continue
        before = _get(previous, key) if previous is not None else 0.0
        increase = value - (0.0 if math.isnan(before) else before)
        findings.append(Finding(increase > 0, increase, (("sink", key[len(prefix) :]),)))
    return findings


# --------------------------------------------------------------------------- PromQL


#: What ``--selector`` takes, for ``alerts generate`` and ``dashboards generate`` alike.
SELECTOR_FORM = 'label="value" matchers separated by commas, such as \'job="grpo",team="rl"\''


def parse_selector(selector: str) -> dict[str, str]:
    """The ``label="value"`` matchers of a selector (``job="grpo",team="rl"``, braces optional), checked.

    The one parser of the selector that ``advmon alerts generate`` and ``advmon dashboards generate`` add to
    every query: anything else would be written into every query as invalid PromQL.

    Example:
        >>> parse_selector('{job="grpo", team="rl"}')
        {'job': 'grpo', 'team': 'rl'}
        >>> parse_selector("job=grpo")
        Traceback (most recent call last):
        ...
        advmon.errors.AdvmonConfigError: --selector takes label="value" matchers separated by commas, such as 'job="grpo",team="rl"'; got 'job=grpo'
    """
    import re

    if not isinstance(selector, str):
        raise AdvmonConfigError(f"--selector takes {SELECTOR_FORM}; got {selector!r}")
    text = selector.strip()
    text = text[1:-1].strip() if text.startswith("{") and text.endswith("}") else text
    labels: dict[str, str] = {}
    for matcher in (m.strip() for m in text.split(",")):
        if not matcher and text:
            raise AdvmonConfigError(f"--selector takes {SELECTOR_FORM}; got an empty matcher in {selector!r}")
        if not matcher:
            continue
        found = re.fullmatch(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"\\]*)"', matcher)
        if found is None:
            raise AdvmonConfigError(f"--selector takes {SELECTOR_FORM}; got {matcher!r}")
        labels[found.group(1)] = found.group(2)
    return labels


@dataclass(frozen=True)
class PromContext:
    """What a PromQL expression needs besides thresholds: the selector and the interval.

    ``selector`` is extra label matchers (``job="grpo"``) added to every metric;
    ``interval_seconds`` is the time between two records as Prometheus sees them.
    """

    selector: str = ""
    interval_seconds: float = 60.0
    #: Also match ``ray_<name>``: Ray's metrics agent prefixes what ``ray-metrics`` exports.
    ray_prefix: bool = True

    def metric(self, name: str, **labels: str) -> str:
        """A selector of ``name`` (or ``ray_<name>``) with the context's and these labels.

        Example:
            >>> PromContext(selector='job="grpo"').metric("advmon_step")
            '{__name__=~"(?:ray_)?advmon_step",job="grpo"}'
            >>> PromContext(ray_prefix=False).metric("advmon_step", stage="post_norm")
            'advmon_step{stage="post_norm"}'
        """
        matchers = [m for m in (self.selector.strip().strip("{}").strip(),) if m]
        matchers += [f'{key}="{value}"' for key, value in labels.items()]
        if self.ray_prefix:
            return "{" + ",".join([f'__name__=~"(?:ray_)?{name}"', *matchers]) + "}"
        return f"{name}{{{','.join(matchers)}}}" if matchers else name

    def stage_metric(self, name: str, stage: str) -> str:
        """A per-stage gauge with its ``stage`` label dropped, so alerts carry only run labels."""
        return f"max without (stage) ({self.metric(name, stage=stage)})"

    def duration(self, seconds: float) -> str:
        return format_duration(seconds)

    def window(self, records: int) -> str:
        """A range holding exactly ``records`` samples one interval apart."""
        return format_duration(records * self.interval_seconds - self.interval_seconds / 2)

    @property
    def step_back(self) -> str:
        return format_duration(self.interval_seconds)


def format_duration(seconds: float) -> str:
    """Prometheus duration text: ``90`` -> ``1m30s``, ``0.5`` -> ``500ms``.

    Example:
        >>> format_duration(1770), format_duration(0.5), format_duration(3600)
        ('29m30s', '500ms', '1h')
    """
    millis = round(seconds * 1000)
    if millis <= 0:
        return "0s"
    parts = []
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration (``1m30s``, ``500ms``, ``2h``).

    Example:
        >>> parse_duration("1m30s"), parse_duration("500ms")
        (90.0, 0.5)
    """
    import re

    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    pieces = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)", text.strip())
    if not pieces or "".join(n + u for n, u in pieces) != text.strip():
        raise AdvmonConfigError(f"expected a duration such as 15s, 1m or 1m30s, got {text!r}")
    return sum(float(number) * units[unit] for number, unit in pieces)


def _counter_step(ctx: PromContext, name: str, **labels: str) -> str:
    """The increase of a counter since the previous sample (a series that just appeared counts whole)."""
    series = ctx.metric(name, **labels)
    back = ctx.step_back
    return f"(({series} - {series} offset {back}) or ({series} unless {series} offset {back}))"


# --------------------------------------------------------------------------- rules


Evaluate = Callable[[Window, Thresholds], list[Finding]]
PromQL = Callable[[Thresholds, PromContext], str]


@dataclass(frozen=True)
class Rule:
    """One alert: what it means, when it fires, in PromQL and over records.

    ``description`` is a template over ``{run}``, ``{value}``, ``{step}``, the
    series' extra labels (``{sink}``) and any threshold name.
    """

    name: str
    severity: Severity
    summary: str
    description: str
    for_records: int
    thresholds: tuple[str, ...]
    promql: PromQL
    evaluate: Evaluate | None  # None: Prometheus only
    extra_labels: tuple[str, ...] = ()
    recording: tuple[str, ...] = field(default=())  # recording rules the expression reads
    #: A threshold (seconds) to look back for the run's last step: a rule about a run that vanished.
    step_lookback: str = ""

    @property
    def runbook_anchor(self) -> str:
        return self.name.lower()

    def render_description(self, run: str, value: float, step: int, labels: Mapping[str, str], thresholds: Thresholds) -> str:
        """The description as the in-process notifiers send it."""
        numbers = {name: format_number(v) for name, v in thresholds.items()}
        return self.description.format(run=run, value=_format_value(value), step=step, **dict(labels), **numbers)


def _format_value(value: float) -> str:
    """``%.4g`` as Go's printf writes it, so both evaluators word a value alike."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:.4g}"


def _single(active: bool, value: float) -> list[Finding]:
    return [Finding(active, value)]


def _eval_nonfinite_rewards(window: Window, t: Thresholds) -> list[Finding]:
    count = _nonfinite(window[-1], "rewards")
    return _single(count > 0, count)


def _prom_nonfinite(stage: str) -> PromQL:
    def promql(t: Thresholds, ctx: PromContext) -> str:
        return f"sum without (kind, stage) ({_counter_step(ctx, 'advmon_nonfinite_values_total', stage=stage)}) > 0"

    return promql


def _eval_nonfinite_advantages(window: Window, t: Thresholds) -> list[Finding]:
    count = _nonfinite(window[-1], "advantages/post_norm")
    return _single(count > 0, count)


def abs_limit(metrics: Mapping[str, Any], t: Thresholds) -> float:
    """The |A| at which the bound alert fires at a record: ``bound_factor`` x |A| / ``advantages/bound_ratio``
    (for a group-mean step, the bound of its worst group); ``nan`` without one.

    Example:
        >>> t = Thresholds.with_overrides(None)
        >>> abs_limit({"advantages/bound_ratio": 0.875, "advantages/post_norm/max": 17.5}, t)
        60.0
    """
    ratio, peak = metrics.get("advantages/bound_ratio"), abs_max_of(metrics)
    if ratio is None or not 0 < ratio < math.inf or math.isnan(peak):
        return math.nan
    return t["bound_factor"] * peak / ratio


def _eval_bound(window: Window, t: Thresholds) -> list[Finding]:
    ratio = _get(window[-1], "advantages/bound_ratio")
    return _single(ratio > t["bound_factor"], ratio)


def _prom_bound(t: Thresholds, ctx: PromContext) -> str:
    return f"{ctx.metric('advmon_advantage_bound_ratio')} > {format_number(t['bound_factor'])}"


def _labelled_values(record: RecordLike, family: str, key: str, window: Window) -> list[tuple[str, float]]:
    """``(label, value)`` of every ``<family>/<label>/<key>`` of the record."""
    suffix = "/" + key
    found = []
    for name in window.keys_with(family + "/"):
        if name.endswith(suffix):
            label = name[len(family) + 1 : -len(suffix)]
            if label and "/" not in label:
                found.append((label, _get(record, name)))
    return found


def _eval_slice_zero_std(window: Window, t: Thresholds) -> list[Finding]:
    """A slice above the zero-std line while the whole run is at or below it (NaN: not below)."""
    record = window[-1]
    limit = t["zero_std_ratio"]
    run_below = _get(record, "groups/zero_std_fraction") <= limit
    return [
        Finding(run_below and value > limit, value, (("slice", label),))
        for label, value in _labelled_values(record, "slices", "groups/zero_std_fraction", window)
        if not math.isnan(value)
    ]


def _prom_slice_zero_std(t: Thresholds, ctx: PromContext) -> str:
    limit = format_number(t["zero_std_ratio"])
    return (
        f"{ctx.metric('advmon_slice_zero_std_group_ratio')} > {limit} "
        f"and on (job, instance, run) ({ctx.metric('advmon_zero_std_group_ratio')} <= {limit})"
    )


def _eval_function_nonfinite(window: Window, t: Thresholds) -> list[Finding]:
    """A reward function's NaN/Inf scores while the summed reward has none (TRL sums with nansum)."""
    record = window[-1]
    run_clean = _nonfinite(record, "rewards") == 0
    counts: dict[str, float] = {}
    for kind in ("nan", "inf"):
        for label, value in _labelled_values(record, "rewards", f"{kind}_count", window):
            if not math.isnan(value):
                counts[label] = counts.get(label, 0.0) + value
    return [Finding(run_clean and count > 0, count, (("function", label),)) for label, count in counts.items()]


def _prom_function_nonfinite(t: Thresholds, ctx: PromContext) -> str:
    # ">= 0" drops NaN counts before the sum, as the in-process evaluator skips them.
    functions = f"sum without (kind) ({ctx.metric('advmon_reward_function_nonfinite')} >= 0)"
    run = f"sum without (kind, stage) ({_counter_step(ctx, 'advmon_nonfinite_values_total', stage='reward')})"
    return f"{functions} > 0 unless on (job, instance, run) ({run} > 0)"


def _eval_zero_std(window: Window, t: Thresholds) -> list[Finding]:
    ratio = _get(window[-1], "groups/zero_std_fraction")
    return _single(ratio > t["zero_std_ratio"], ratio)


def _prom_zero_std(t: Thresholds, ctx: PromContext) -> str:
    return f"{ctx.metric('advmon_zero_std_group_ratio')} > {format_number(t['zero_std_ratio'])}"


def _relative(key: str, compare: Callable[[float, Thresholds], bool]) -> Evaluate:
    """Current value over its trailing median, once the run has enough history."""

    def evaluate(window: Window, t: Thresholds) -> list[Finding]:
        median, count = _trailing(window, key, t)
        ratio = _div(_get(window[-1], key), median)
        return _single(count >= t.records("min_history_records") and compare(ratio, t), ratio)

    return evaluate


# Recording rules: a run's own recent level, computed once per evaluation for all runs.
PRE_STD_MEDIAN = "advmon:advantage_std_pre_norm:trailing_median"
POST_MEAN_MEDIAN = "advmon:advantage_mean_post_norm:trailing_median"
POST_STD_MEDIAN = "advmon:advantage_std_post_norm:trailing_median"
REWARD_MEAN_MEDIAN = "advmon:reward_mean:trailing_median"
REWARD_STD_MEDIAN = "advmon:reward_std:trailing_median"
TRAILING_COUNT = "advmon:records:trailing_count"


def recording_rules(t: Thresholds, ctx: PromContext) -> list[tuple[str, str]]:
    """``(record, expr)`` pairs the relative rules read."""
    window = ctx.window(t.records("trailing_records"))

    def median(name: str, **labels: str) -> str:
        return f"max without (stage) (quantile_over_time(0.5, {ctx.metric(name, **labels)}[{window}]))"

    return [
        (TRAILING_COUNT, f"count_over_time({ctx.metric('advmon_step')}[{window}])"),
        (PRE_STD_MEDIAN, median("advmon_advantage_std", stage="pre_norm")),
        (POST_MEAN_MEDIAN, median("advmon_advantage_mean", stage="post_norm")),
        (POST_STD_MEDIAN, median("advmon_advantage_std", stage="post_norm")),
        (REWARD_MEAN_MEDIAN, median("advmon_reward_mean")),
        (REWARD_STD_MEDIAN, median("advmon_reward_std")),
    ]


#: Fleet recording rules (``level:metric:operations``): a run's figure over its ranks (``run:``, the ranks'
#: series differ by ``instance``) and a job's over its live runs (``job:``, every label but ``instance`` and
#: ``run`` kept, so a ``team`` label stays). A ratio is a sum of counts over a sum of counts, never a mean
#: of ratios: a run of 10 groups weighs a tenth of one of 100.
RUN_STEP = "run:advmon_step:max"
RUN_LAST_UPDATE = "run:advmon_last_update_timestamp_seconds:max"
RUN_ABS_MAX = "run:advmon_advantage_abs_max:max"
RUN_BOUND_RATIO = "run:advmon_advantage_bound_ratio:max"
RUN_ZERO_STD = "run:advmon_zero_std_groups:ratio"
RUN_NONFINITE = "run:advmon_nonfinite_values:increase1h"
JOB_ZERO_STD = "job:advmon_zero_std_groups:ratio"
JOB_ALL_FAIL = "job:advmon_group_all_fail:ratio"
JOB_ALL_PASS = "job:advmon_group_all_pass:ratio"
JOB_NONFINITE = "job:advmon_nonfinite_values:increase1h"
JOB_LIVE_RUNS = "job:advmon_live_runs:count"


def fleet_recording_rules(t: Thresholds, ctx: PromContext) -> list[tuple[str, str]]:
    """``(record, expr)`` pairs of the fleet board and of alerts that aggregate a run's ranks.

    Example:
        >>> rules = dict(fleet_recording_rules(Thresholds.with_overrides(), PromContext(ray_prefix=False)))
        >>> rules["job:advmon_zero_std_groups:ratio"].split(" / ")[0]
        'sum without (instance, run) (advmon_zero_std_groups >= 0 and on (job, instance, run) (time() - advmon_heartbeat_timestamp_seconds <= 180))'
    """
    metric = ctx.metric
    live = f"on (job, instance, run) (time() - {metric('advmon_heartbeat_timestamp_seconds')} <= " \
           f"{format_number(t['silent_seconds'])})"
    zero, comparable = metric("advmon_zero_std_groups"), metric("advmon_comparable_groups")
    nonfinite = f"increase({metric('advmon_nonfinite_values_total')}[1h])"

    def job_ratio(fraction: str) -> str:
        """A fraction's numerator is fraction x denominator, exactly (the record divides the same counts)."""
        numerator = f"sum without (instance, run) (({fraction} >= 0) * {comparable} and {live})"
        denominator = f"sum without (instance, run) ({comparable} > 0 and ({fraction} >= 0) and {live})"
        return f"{numerator} / {denominator}"

    return [
        (RUN_STEP, f"max without (instance) ({metric('advmon_step')})"),
        (RUN_LAST_UPDATE, f"max without (instance) ({metric('advmon_last_update_timestamp_seconds')})"),
        (RUN_ABS_MAX, f"max without (instance) ({metric('advmon_advantage_abs_max')})"),
        (RUN_BOUND_RATIO, f"max without (instance) ({metric('advmon_advantage_bound_ratio')})"),
        (RUN_ZERO_STD, f"sum without (instance) ({zero} >= 0) / sum without (instance) ({comparable} > 0)"),
        (RUN_NONFINITE, f"sum without (instance, kind) ({nonfinite})"),
        (JOB_ZERO_STD, f"sum without (instance, run) ({zero} >= 0 and {live})"
                       f" / sum without (instance, run) ({comparable} > 0 and {live})"),
        (JOB_ALL_FAIL, job_ratio(metric("advmon_group_all_fail_ratio"))),
        (JOB_ALL_PASS, job_ratio(metric("advmon_group_all_pass_ratio"))),
        (JOB_NONFINITE, f"sum without (instance, run, kind) ({nonfinite} and {live})"),
        (JOB_LIVE_RUNS, f"count without (instance, run) (max without (instance) ("
                        f"time() - {metric('advmon_heartbeat_timestamp_seconds')} <= {format_number(t['silent_seconds'])}))"),
    ]


def unless_finished(expr: str, ctx: PromContext) -> str:
    """``expr`` for runs that did not finish: a finished run's Pushgateway group keeps its last values, which
    must not keep an alert firing (the rules over records; the run-state rules say it themselves).

    Example:
        >>> unless_finished("advmon_zero_std_group_ratio > 0.8", PromContext(ray_prefix=False))
        '(advmon_zero_std_group_ratio > 0.8) unless on (job, instance, run) advmon_run_finished == 1'
    """
    return f"({expr}) unless on (job, instance, run) {ctx.metric('advmon_run_finished')} == 1"


def _enough_history(t: Thresholds) -> str:
    return f" and {TRAILING_COUNT} >= {t.records('min_history_records')}"


def _prom_scale(compare: str, threshold: str) -> PromQL:
    def promql(t: Thresholds, ctx: PromContext) -> str:
        ratio = f"({ctx.stage_metric('advmon_advantage_std', 'pre_norm')} / {PRE_STD_MEDIAN})"
        return f"{ratio} {compare} {format_number(t[threshold])}{_enough_history(t)}"

    return promql


def _eval_mean_drift(window: Window, t: Thresholds) -> list[Finding]:
    """The post-norm mean's move from its trailing median, in trailing post-norm stds (scale-free)."""
    key = "advantages/post_norm/mean"
    median, count = _trailing(window, key, t)
    spread, _ = _trailing(window, "advantages/post_norm/std", t)
    drift = _div(_get(window[-1], key) - median, spread)
    limit = t["mean_drift"]
    return _single(count >= t.records("min_history_records") and (drift > limit or drift < -limit), drift)


def _prom_mean_drift(t: Thresholds, ctx: PromContext) -> str:
    drift = f"(({ctx.stage_metric('advmon_advantage_mean', 'post_norm')} - {POST_MEAN_MEDIAN}) / {POST_STD_MEDIAN})"
    limit = format_number(t["mean_drift"])
    return f"({drift} > {limit} or {drift} < -{limit}){_enough_history(t)}"


def _eval_reward_collapse(window: Window, t: Thresholds) -> list[Finding]:
    mean_median, count = _trailing(window, "rewards/mean", t)
    std_median, _ = _trailing(window, "rewards/std", t)
    drop = _div(mean_median - _get(window[-1], "rewards/mean"), std_median)
    holds = count >= t.records("min_history_records") and std_median > 0 and drop > t["reward_drop_stds"]
    return _single(holds, drop)


def _prom_reward_collapse(t: Thresholds, ctx: PromContext) -> str:
    drop = f"(({REWARD_MEAN_MEDIAN} - {ctx.metric('advmon_reward_mean')}) / {REWARD_STD_MEDIAN})"
    return (
        f"{drop} > {format_number(t['reward_drop_stds'])} and {REWARD_STD_MEDIAN} > 0"
        f"{_enough_history(t)}"
    )


def _prom_crashed(t: Thresholds, ctx: PromContext) -> str:
    """Last seen alive more than ``silent_seconds`` ago, and not finished; its value: seconds since then.

    The heartbeat is the time of the last scrape of the run's endpoint (gone with the process) or of the
    Pushgateway sink's last push (kept by the gateway, frozen when the process dies). Not crashed: a run
    last seen finished; a run alive again now (resumed, on another node); a run whose Pushgateway group was
    deleted (``delete_on_close``: the gateway's own ``push_time_seconds`` vanished with it).
    """
    memory, silent = ctx.duration(t["crash_memory_seconds"]), format_number(t["silent_seconds"])
    heartbeat, finished = ctx.metric("advmon_heartbeat_timestamp_seconds"), ctx.metric("advmon_run_finished")
    pushed = ctx.metric("push_time_seconds")
    return (
        f"time() - last_over_time({heartbeat}[{memory}]) > {silent}"
        f" unless on (job, instance, run) last_over_time({finished}[{memory}]) == 1"
        f" unless on (run) (time() - {heartbeat} <= {silent})"
        f" unless on (run) (last_over_time({pushed}[{memory}]) unless on (run) {pushed})"
    )


def _prom_hung(t: Thresholds, ctx: PromContext) -> str:
    """No record for ``stale_seconds`` while alive (a heartbeat within ``silent_seconds``) and not finished."""
    heartbeat, finished = ctx.metric("advmon_heartbeat_timestamp_seconds"), ctx.metric("advmon_run_finished")
    return (
        f"time() - {ctx.metric('advmon_last_update_timestamp_seconds')} > {format_number(t['stale_seconds'])}"
        f" and on (job, instance, run) (time() - {heartbeat} <= {format_number(t['silent_seconds'])})"
        f" unless on (job, instance, run) {finished} == 1"
    )


def _prom_counter(name: str) -> PromQL:
    def promql(t: Thresholds, ctx: PromContext) -> str:
        return f"{_counter_step(ctx, name)} > 0"

    return promql


def _eval_internal_errors(window: Window, t: Thresholds) -> list[Finding]:
    current = _get(window[-1], "advmon/internal_errors")
    before = _get(window[-2], "advmon/internal_errors") if len(window) > 1 else 0.0
    increase = current - (0.0 if math.isnan(before) else before)
    return _single(increase > 0, increase)


def format_number(value: float) -> str:
    """A threshold as rules and messages print it: ``3`` for 3.0, ``0.8`` for 0.8."""
    return repr(int(value)) if value == int(value) else repr(value)


_STEP = "{step}"

CATALOG: tuple[Rule, ...] = (
    Rule(
        name="AdvmonNonFiniteRewards",
        severity="critical",
        summary="NaN or Inf rewards: the reward function is failing",
        description="Run {run}: {value} NaN/Inf rewards at step " + _STEP + ".",
        for_records=1,
        thresholds=(),
        promql=_prom_nonfinite("reward"),
        evaluate=_eval_nonfinite_rewards,
    ),
    Rule(
        name="AdvmonNonFiniteAdvantages",
        severity="critical",
        summary="NaN or Inf advantages reach the loss",
        description="Run {run}: {value} NaN/Inf post-norm advantages at step " + _STEP + ".",
        for_records=1,
        thresholds=(),
        promql=_prom_nonfinite("post_norm"),
        evaluate=_eval_nonfinite_advantages,
    ),
    Rule(
        name="AdvmonAdvantageBeyondBound",
        severity="critical",
        summary="Advantages beyond what the estimator's normalization allows: the grouping, the std or the scale is wrong",
        description=(
            "Run {run}: |advantage| reached {value}x what its normalization allows at step " + _STEP + " "
            "(threshold {bound_factor}x; advantages/bound_ratio, the record says which normalization)."
        ),
        for_records=1,
        thresholds=("bound_factor",),
        promql=_prom_bound,
        evaluate=_eval_bound,
    ),
    Rule(
        name="AdvmonZeroStdGroupsHigh",
        severity="warning",
        summary="Most groups have all-equal rewards: little or no learning signal",
        description="Run {run}: {value} of the groups are zero-std at step " + _STEP + " (threshold {zero_std_ratio}).",
        for_records=3,
        thresholds=("zero_std_ratio",),
        promql=_prom_zero_std,
        evaluate=_eval_zero_std,
    ),
    Rule(
        name="AdvmonSliceZeroStdHigh",
        severity="warning",
        summary="One slice's groups have all-equal rewards while the run as a whole looks fine",
        description=(
            "Run {run}: {value} of slice {slice}'s groups are zero-std at step " + _STEP + " "
            "(threshold {zero_std_ratio}; the whole run is below it)."
        ),
        for_records=3,
        thresholds=("zero_std_ratio",),
        promql=_prom_slice_zero_std,
        evaluate=_eval_slice_zero_std,
        extra_labels=("slice",),
    ),
    Rule(
        name="AdvmonRewardFunctionNonFinite",
        severity="critical",
        summary="A reward function returns None (NaN) for some samples while the summed reward hides it",
        description=(
            "Run {run}: reward function {function} gave {value} NaN/Inf score(s) at step " + _STEP + "; "
            "the summed reward stayed finite."
        ),
        for_records=1,
        thresholds=(),
        promql=_prom_function_nonfinite,
        evaluate=_eval_function_nonfinite,
        extra_labels=("function",),
    ),
    Rule(
        name="AdvmonAdvantageScaleCollapse",
        severity="warning",
        summary="Pre-norm advantage spread collapsed relative to the run's recent level",
        description=(
            "Run {run}: pre-norm advantage std is {value} x its trailing median at step " + _STEP + " "
            "(threshold {scale_collapse_ratio})."
        ),
        for_records=3,
        thresholds=("scale_collapse_ratio", "trailing_records", "min_history_records"),
        promql=_prom_scale("<", "scale_collapse_ratio"),
        evaluate=_relative("advantages/pre_norm/std", lambda ratio, t: ratio < t["scale_collapse_ratio"]),
        recording=(PRE_STD_MEDIAN, TRAILING_COUNT),
    ),
    Rule(
        name="AdvmonAdvantageScaleSpike",
        severity="warning",
        summary="Pre-norm advantage spread spiked relative to the run's recent level",
        description=(
            "Run {run}: pre-norm advantage std is {value} x its trailing median at step " + _STEP + " "
            "(threshold {scale_spike_ratio})."
        ),
        for_records=2,
        thresholds=("scale_spike_ratio", "trailing_records", "min_history_records"),
        promql=_prom_scale(">", "scale_spike_ratio"),
        evaluate=_relative("advantages/pre_norm/std", lambda ratio, t: ratio > t["scale_spike_ratio"]),
        recording=(PRE_STD_MEDIAN, TRAILING_COUNT),
    ),
    Rule(
        name="AdvmonPostNormMeanDrift",
        severity="warning",
        summary="Post-norm advantage mean drifted from the run's recent level",
        description=(
            "Run {run}: post-norm mean moved {value} trailing stds from its trailing median at step " + _STEP + " "
            "(threshold {mean_drift})."
        ),
        for_records=3,
        thresholds=("mean_drift", "trailing_records", "min_history_records"),
        promql=_prom_mean_drift,
        evaluate=_eval_mean_drift,
        recording=(POST_MEAN_MEDIAN, POST_STD_MEDIAN, TRAILING_COUNT),
    ),
    Rule(
        name="AdvmonRewardCollapse",
        severity="warning",
        summary="Reward mean fell sharply below the run's recent level",
        description=(
            "Run {run}: reward mean is {value} reward stds below its trailing median at step " + _STEP + " "
            "(threshold {reward_drop_stds})."
        ),
        for_records=3,
        thresholds=("reward_drop_stds", "trailing_records", "min_history_records"),
        promql=_prom_reward_collapse,
        evaluate=_eval_reward_collapse,
        recording=(REWARD_MEAN_MEDIAN, REWARD_STD_MEDIAN, TRAILING_COUNT),
    ),
    Rule(
        name="AdvmonRunCrashed",
        severity="critical",
        summary="A run is gone without finishing: its process died, was killed, or its node was lost",
        description="Run {run}: last seen alive {value} seconds ago and it did not finish (last step " + _STEP + ").",
        for_records=1,
        thresholds=("silent_seconds", "crash_memory_seconds"),
        promql=_prom_crashed,
        evaluate=None,
        step_lookback="crash_memory_seconds",
    ),
    Rule(
        name="AdvmonRunHung",
        severity="warning",
        summary="A run is alive but sends no advmon records",
        description="Run {run}: no record for {value} seconds while its process is alive; the last was step "
                    + _STEP + ".",
        for_records=1,
        thresholds=("stale_seconds", "silent_seconds"),
        promql=_prom_hung,
        evaluate=None,
    ),
    Rule(
        name="AdvmonDroppedRecords",
        severity="warning",
        summary="advmon dropped records: a sink's queue overflowed",
        description="Run {run}: sink {sink} dropped {value} record(s) by step " + _STEP + "; replay them from the JSONL file.",
        for_records=1,
        thresholds=(),
        promql=_prom_counter("advmon_dropped_records_total"),
        evaluate=lambda window, t: _counter_increase(window, "advmon/dropped_records/"),
        extra_labels=("sink",),
    ),
    Rule(
        name="AdvmonSinkErrors",
        severity="info",
        summary="An advmon sink failed to deliver records",
        description="Run {run}: sink {sink} failed {value} record(s) by step " + _STEP + ".",
        for_records=1,
        thresholds=(),
        promql=_prom_counter("advmon_sink_errors_total"),
        evaluate=lambda window, t: _counter_increase(window, "advmon/sink_errors/"),
        extra_labels=("sink",),
    ),
    Rule(
        name="AdvmonInternalErrors",
        severity="info",
        summary="advmon could not record part of a call",
        description="Run {run}: {value} new advmon problem(s) at step " + _STEP + " (see the training log's AdvmonWarning).",
        for_records=1,
        thresholds=(),
        promql=_prom_counter("advmon_internal_errors_total"),
        evaluate=_eval_internal_errors,
    ),
)


# --------------------------------------------------------------------------- where


def where(alert: str, record: Any, labels: Mapping[str, str] | None = None) -> str:
    """Which groups and slices the firing step points at, from the record's drill-down.

    Read from ``record.exemplars`` (the step's worst groups) and its
    ``slices/<label>/...`` keys; ``""`` when the record has nothing to say for
    this alert. Kept out of the description, which Prometheus words alike.

    Example:
        >>> class R:
        ...     metrics = {"rewards/nan_count": 7.0, "rewards/inf_count": 0.0, "groups/nonfinite_count": 2.0,
        ...                "slices/gsm8k/rewards/nan_count": 4.0, "slices/math/rewards/nan_count": 3.0}
        ...     exemplars = [{"group": "uid-123", "reason": "nonfinite_rewards", "slice": "gsm8k", "size": 8,
        ...                   "reward_nan_count": 4, "reward_inf_count": 0}]
        >>> where("AdvmonNonFiniteRewards", R())
        'NaN/Inf rewards: 7 in 2 groups, worst group uid-123 (slice gsm8k, 4 of 8 NaN/Inf); by slice: gsm8k 4, math 3'
    """
    labels = dict(labels or {})
    metrics = getattr(record, "metrics", {})
    exemplars = list(getattr(record, "exemplars", None) or [])
    parts: list[str] = []
    if alert == "AdvmonNonFiniteRewards":
        count = _nonfinite(record, "rewards")
        groups = _get(record, "groups/nonfinite_count")
        lead = f"NaN/Inf rewards: {format_number(count)}"
        if groups > 0:
            lead += f" in {format_number(groups)} group{'s' if groups != 1 else ''}"
        worst = _first(exemplars, lambda e: _number(e, "reward_nan_count") + _number(e, "reward_inf_count") > 0)
        if worst is not None:
            bad = _number(worst, "reward_nan_count") + _number(worst, "reward_inf_count")
            size = _number(worst, "size")
            lead += ", worst group " + _named(worst, f"{format_number(bad)} of {format_number(size)} NaN/Inf")
        parts.append(lead)
        parts.append(_by_slice(metrics, ("rewards/nan_count", "rewards/inf_count")))
    elif alert == "AdvmonRewardFunctionNonFinite":
        chosen = [e for e in exemplars if e.get("reason") == "nonfinite_reward_functions"]
        if chosen:
            parts.append("worst groups: " + ", ".join(
                _named(e, f"{format_number(_number(e, 'reward_function_nonfinite_count'))} NaN/Inf scores")
                for e in chosen))
        parts.append(_by_slice(metrics, ("rewards/function_nonfinite_count",)))
    elif alert == "AdvmonNonFiniteAdvantages":
        chosen = [e for e in exemplars if _number(e, "advantage_nonfinite_samples") > 0]
        if chosen:
            parts.append("worst groups: " + ", ".join(
                _named(e, f"{format_number(_number(e, 'advantage_nonfinite_samples'))} of "
                          f"{format_number(_number(e, 'size'))} samples NaN/Inf") for e in chosen))
    elif alert == "AdvmonAdvantageBeyondBound":
        kind, source = getattr(record, "normalization", None), getattr(record, "normalization_source", None)
        if kind:
            parts.append(f"normalization {kind}" + (f" ({source})" if source else ""))
        beyond = [e for e in exemplars if e.get("reason") == "beyond_bound"]
        chosen = beyond or [e for e in exemplars if e.get("reason") == "largest_abs_advantage"][:3]
        if chosen:
            parts.append(("worst groups: " if beyond else "largest |A|: ") + ", ".join(
                _named(e, f"|A| {_format_value(_number(e, 'advantage_abs_max'))} = "
                          f"{_format_value(_number(e, 'advantage_bound_ratio'))}x its bound") for e in chosen))
    elif alert in ("AdvmonZeroStdGroupsHigh", "AdvmonSliceZeroStdHigh"):
        ratios = _slice_values(metrics, "groups/zero_std_fraction")
        if labels.get("slice") in ratios:
            mean = metrics.get(f"slices/{labels['slice']}/rewards/mean")
            if mean is not None and not math.isnan(mean):
                parts.append(f"slice {labels['slice']} reward mean {_format_value(mean)}")
        if ratios:
            ordered = sorted(ratios.items(), key=lambda item: -item[1])
            parts.append("zero-std by slice: " + ", ".join(f"{name} {value:.0%}" for name, value in ordered))
    return "; ".join(p for p in parts if p)


def _number(entry: Mapping[str, Any], key: str) -> float:
    value = entry.get(key)
    return float(value) if isinstance(value, (int, float)) and value == value else 0.0


def _first(entries: Sequence[Mapping[str, Any]], test: Callable[[Mapping[str, Any]], bool]) -> Mapping[str, Any] | None:
    return next((entry for entry in entries if test(entry)), None)


def _named(entry: Mapping[str, Any], detail: str) -> str:
    inside = ([f"slice {entry['slice']}"] if entry.get("slice") else []) + [detail]
    return f"{entry.get('group')} ({', '.join(inside)})"


def _slice_values(metrics: Mapping[str, Any], key: str) -> dict[str, float]:
    suffix = "/" + key
    found = {}
    for name, value in metrics.items():
        if name.startswith("slices/") and name.endswith(suffix) and value is not None and not math.isnan(value):
            label = name[len("slices/") : -len(suffix)]
            if "/" not in label:
                found[label] = float(value)
    return found


def _by_slice(metrics: Mapping[str, Any], keys: Sequence[str]) -> str:
    totals: dict[str, float] = {}
    for key in keys:
        for label, value in _slice_values(metrics, key).items():
            totals[label] = totals.get(label, 0.0) + value
    hit = sorted(((v, k) for k, v in totals.items() if v > 0), key=lambda item: (-item[0], item[1]))
    return "by slice: " + ", ".join(f"{label} {format_number(value)}" for value, label in hit) if hit else ""


#: The time a dashboard link shows around an alert's start (Grafana's ``time`` and ``time.window``).
LINK_WINDOW_SECONDS = 3600


def dashboard_link(base: str, run: str, started: str) -> str:
    """The on-call board on ``run``, centred on ``started`` (Unix milliseconds, or a template giving them).

    Grafana reads ``time`` and ``time.window`` as the range ``time ± window / 2``, so the
    link opens on the moment the alert started rather than on "the last 6 hours".

    Example:
        >>> dashboard_link("https://grafana.example/d/advmon-health", "tp2", "1764870000000")
        'https://grafana.example/d/advmon-health?var-run=tp2&time=1764870000000&time.window=3600000'
    """
    return f"{base}?var-run={run}&time={started}&time.window={LINK_WINDOW_SECONDS * 1000}"


def runbook_link(base: str, alert: str) -> str:
    """The alert's section of the runbooks page hosted at ``base`` (``""`` without one: the text travels instead).

    Example:
        >>> runbook_link("https://wiki.example/advmon", "AdvmonNonFiniteRewards"), runbook_link("", "AdvmonNonFiniteRewards")
        ('https://wiki.example/advmon#advmonnonfiniterewards', '')
    """
    return f"{base}#{alert.lower()}" if base else ""


def rule_named(name: str) -> Rule:
    """The catalog's rule of that name."""
    for rule in CATALOG:
        if rule.name == name:
            return rule
    raise AdvmonConfigError(f"unknown alert {name!r}; known: {', '.join(r.name for r in CATALOG)}")

"""Prometheus alerting and recording rules, and their promtool unit tests, from the catalog.

Everything here is deterministic text built from :data:`advmon.rules.CATALOG` and
:class:`AlertSettings`: the same settings always give the same bytes, so the
committed ``alerts/`` files can be checked against a fresh generation.

Example:
    >>> settings = AlertSettings(interval_seconds=15)
    >>> rules = prometheus_rules(settings)["groups"][0]["rules"]
    >>> [r["alert"] for r in rules if "alert" in r][:2]
    ['AdvmonNonFiniteRewards', 'AdvmonNonFiniteAdvantages']
    >>> next(r for r in rules if r.get("alert") == "AdvmonZeroStdGroupsHigh")["for"]
    '30s'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from advmon.rules import (
    CATALOG,
    PromContext,
    Rule,
    Thresholds,
    abs_max_of,
    format_duration,
    format_number,
    group_bound,
    fleet_recording_rules,
    parse_selector,
    recording_rules,
    runbook_link,
    unless_finished,
)
from advmon.alerts.runbooks import check_first

__all__ = ["AlertSettings", "dump_yaml", "prometheus_rules", "promtool_tests", "series_from_records"]

RULES_FILE = "advmon-rules.yml"
TESTS_FILE = "tests/advmon-rules-test.yml"


@dataclass(frozen=True)
class AlertSettings:
    """What a team chooses when it generates its alert files.

    Args:
        thresholds: the catalog's thresholds.
        interval_seconds: time between two records as Prometheus sees them (the
            scrape interval when steps are faster, else one step's time); it turns
            record counts into ``for:`` durations and windows.
        for_seconds: if set, the ``for:`` of every rule that waits, instead of
            ``(for_records - 1) x interval``.
        selector: label matchers added to every metric (``job="grpo"``).
        runbook_base: URL where the runbooks page is hosted; each alert then links ``#<alertname lowercased>``
            (``runbook_url``). Without one, each alert carries its runbook's "Check first" (``check_first``).
        dashboard_url: URL of the on-call dashboard (added to annotations and Slack).
    """

    thresholds: Thresholds = field(default_factory=Thresholds.with_overrides)
    interval_seconds: float = 60.0
    for_seconds: float | None = None
    selector: str = ""
    runbook_base: str = ""
    dashboard_url: str = ""

    def __post_init__(self) -> None:
        parse_selector(self.selector)  # a bad selector is refused here, not written into every rule

    @property
    def selector_labels(self) -> dict[str, str]:
        """The selector's ``label="value"`` matchers (what the promtool tests' series must carry)."""
        return parse_selector(self.selector)

    @property
    def context(self) -> PromContext:
        return PromContext(selector=self.selector, interval_seconds=self.interval_seconds)

    def pending(self, rule: Rule) -> float:
        """Seconds a condition must hold before the rule fires."""
        if rule.for_records <= 1:
            return 0.0
        return self.for_seconds if self.for_seconds is not None else (rule.for_records - 1) * self.interval_seconds

    def rules(self) -> tuple[Rule, ...]:
        """The catalog as these settings run it: ``for_seconds`` turned back into records."""
        if self.for_seconds is None:
            return CATALOG
        records = math.ceil(self.for_seconds / self.interval_seconds - 1e-9) + 1
        return tuple(replace(rule, for_records=records) if rule.for_records > 1 else rule for rule in CATALOG)

    def step_query(self, lookback: str = "") -> str:
        """Go template text giving the run's current step (its ``advmon_step``), or its last one within the
        ``lookback`` threshold's seconds (a run that vanished)."""
        selector = self.context.metric("advmon_step", run="%q").replace('"%q"', "%q")
        if lookback:
            selector = f"last_over_time({selector}[{format_duration(self.thresholds[lookback])}])"
        return f'{{{{ with printf `{selector}` $labels.run | query }}}}{{{{ . | first | value | printf "%.0f" }}}}{{{{ end }}}}'

    def annotations(self, rule: Rule) -> dict[str, str]:
        numbers = {name: format_number(value) for name, value in self.thresholds.items()}
        labels = {label: f"{{{{ $labels.{label} }}}}" for label in rule.extra_labels}
        description = rule.description.format(
            run="{{ $labels.run }}", value='{{ $value | printf "%.4g" }}', step=self.step_query(rule.step_lookback),
            **labels, **numbers
        )
        annotations = {
            "summary": rule.summary,
            "description": description,
            "check_first": check_first(rule.name),
        }
        if self.runbook_base:
            annotations["runbook_url"] = runbook_link(self.runbook_base, rule.name)
        if self.dashboard_url:
            annotations["dashboard_url"] = self.dashboard_url
        return annotations


def prometheus_rules(settings: AlertSettings) -> dict[str, Any]:
    """The rule file as data: the alerts' group (its recording rules first, read by the alerts at the same
    evaluation), then the fleet's recording rules (:func:`advmon.rules.fleet_recording_rules`)."""
    ctx, t = settings.context, settings.thresholds
    entries: list[dict[str, Any]] = [{"record": name, "expr": expr} for name, expr in recording_rules(t, ctx)]
    for rule in CATALOG:
        expr = rule.promql(t, ctx) if rule.evaluate is None else unless_finished(rule.promql(t, ctx), ctx)
        entry: dict[str, Any] = {"alert": rule.name, "expr": expr}
        pending = settings.pending(rule)
        if pending > 0:
            entry["for"] = format_duration(pending)
        entry["labels"] = {"severity": rule.severity}
        entry["annotations"] = settings.annotations(rule)
        entries.append(entry)
    group = {"name": "advmon", "interval": format_duration(settings.interval_seconds), "rules": entries}
    fleet = {"name": "advmon-fleet", "interval": format_duration(settings.interval_seconds),
             "rules": [{"record": name, "expr": expr} for name, expr in fleet_recording_rules(t, ctx)]}
    return {"groups": [group, fleet]}


def dump_yaml(data: Any, header: str = "") -> str:
    """Deterministic YAML: keys in insertion order, long lines kept whole."""
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=10_000, allow_unicode=True)
    return header + body


GENERATED_HEADER = "# Generated by `advmon alerts generate`; edit the catalog (advmon/rules.py), not this file.\n"


# --------------------------------------------------------------------------- series


# (record key, metric name, labels): the gauges advmon's Prometheus exporter sets
# from the latest record (advmon/sinks/prometheus.py; a test holds the two equal).
def _gauges() -> list[tuple[str, str, dict[str, str]]]:
    gauges = []
    for stat in ("mean", "std", "min", "max", "abs_mean"):
        for stage in ("pre_norm", "post_norm"):
            gauges.append((f"advantages/{stage}/{stat}", f"advmon_advantage_{stat}", {"stage": stage}))
    for stat in ("mean", "std", "min", "max"):
        gauges.append((f"rewards/{stat}", f"advmon_reward_{stat}", {}))
    gauges += [
        ("groups/zero_std_fraction", "advmon_zero_std_group_ratio", {}),
        ("groups/count", "advmon_groups", {}),
        ("groups/comparable_count", "advmon_comparable_groups", {}),
        ("groups/zero_std_count", "advmon_zero_std_groups", {}),
        ("groups/max_size", "advmon_group_max_size", {}),
        ("groups/bound_size", "advmon_group_bound_size", {}),
        ("advantages/bound_ratio", "advmon_advantage_bound_ratio", {}),
    ]
    return gauges


_COUNTER_STAGES = (("reward", "rewards"), ("pre_norm", "advantages/pre_norm"), ("post_norm", "advantages/post_norm"))
#: The exporter's per-slice gauges: (record key under slices/<label>/, metric name, extra labels).
_SLICE_GAUGES = (
    ("rewards/count", "advmon_slice_rewards", {}),
    ("rewards/mean", "advmon_slice_reward_mean", {}),
    ("groups/zero_std_fraction", "advmon_slice_zero_std_group_ratio", {}),
    ("advantages/post_norm/mean", "advmon_slice_advantage_mean", {}),
    ("advantages/post_norm/abs_max", "advmon_slice_advantage_abs_max", {}),
    ("rewards/nan_count", "advmon_slice_reward_nonfinite", {"kind": "nan"}),
    ("rewards/inf_count", "advmon_slice_reward_nonfinite", {"kind": "inf"}),
)
#: The exporter's per-reward-function gauges: (record key under rewards/<function>/, metric name, extra labels).
_FUNCTION_GAUGES = (
    ("mean", "advmon_reward_function_mean", {}),
    ("nan_count", "advmon_reward_function_nonfinite", {"kind": "nan"}),
    ("inf_count", "advmon_reward_function_nonfinite", {"kind": "inf"}),
)


def _labelled_gauges(metrics: dict[str, float]) -> list[tuple[str, dict[str, str], float]]:
    """The slice and reward-function series the exporter sets from one record: ``(name, labels, value)``."""
    found: list[tuple[str, dict[str, str], float]] = []
    for family, label_name, gauges in (("slices", "slice", _SLICE_GAUGES), ("rewards", "function", _FUNCTION_GAUGES)):
        labels = []
        for key in metrics:
            if key.startswith(family + "/"):
                label, _, rest = key[len(family) + 1 :].partition("/")
                if rest in {g[0] for g in gauges} and label not in labels:
                    labels.append(label)
        for label in labels:
            for key, name, extra in gauges:
                found.append((name, {label_name: label, **extra}, metrics.get(f"{family}/{label}/{key}", math.nan)))
    return found


def series_from_records(
    records: Sequence[Any], run: str, labels: dict[str, str] | None = None
) -> dict[str, list[float | None]]:
    """What Prometheus would scrape from advmon's exporter, one sample per record.

    Sample 0 is the scrape before the first record (counters at 0, no gauges);
    sample ``i + 1`` follows record ``i``. Returns ``{series text: values}``,
    ``None`` where a series has no sample.
    """
    n = len(records) + 1
    series: dict[str, list[float | None]] = {}

    common = {"run": run, **(labels or {})}

    def put(name: str, labels: dict[str, str], index: int, value: float) -> None:
        text = _series_text(name, {**common, **labels})
        series.setdefault(text, [None] * n)[index] = value

    totals: dict[tuple[str, str], float] = {(stage, kind): 0.0 for stage, _ in _COUNTER_STAGES for kind in ("nan", "inf")}
    sinks: list[str] = []
    for record in records:
        for key in record.metrics:
            for family in ("advmon/sink_errors/", "advmon/dropped_records/"):
                if key.startswith(family) and key[len(family) :] not in sinks:
                    sinks.append(key[len(family) :])
    updates = 0.0

    def counters(index: int, metrics: dict[str, float]) -> None:
        for (stage, kind), value in totals.items():
            put("advmon_nonfinite_values_total", {"stage": stage, "kind": kind}, index, value)
        put("advmon_updates_total", {}, index, updates)
        put("advmon_internal_errors_total", {}, index, _finite_or(metrics.get("advmon/internal_errors"), 0.0))
        for sink in sinks:
            put("advmon_sink_errors_total", {"sink": sink}, index, _finite_or(metrics.get(f"advmon/sink_errors/{sink}"), 0.0))
            put("advmon_dropped_records_total", {"sink": sink}, index, _finite_or(metrics.get(f"advmon/dropped_records/{sink}"), 0.0))

    counters(0, {})
    for i, record in enumerate(records, start=1):
        metrics = {k: (math.nan if v is None else float(v)) for k, v in record.metrics.items()}
        updates += 1
        for (stage, kind), value in totals.items():
            prefix = dict(_COUNTER_STAGES)[stage]
            count = metrics.get(f"{prefix}/{kind}_count", math.nan)
            if math.isfinite(count):
                totals[(stage, kind)] = value + count
        counters(i, metrics)
        for key, name, labels in _gauges():
            put(name, labels, i, metrics.get(key, math.nan))
        for stage in ("pre_norm", "post_norm"):
            put("advmon_advantage_abs_max", {"stage": stage}, i, abs_max_of(metrics, stage))
        for name, labels, value in _labelled_gauges(metrics):
            put(name, labels, i, value)
        put("advmon_step", {}, i, float(record.step))
        put("advmon_last_update_timestamp_seconds", {}, i, float(getattr(record, "time", 0.0)))
    return series


def _finite_or(value: float | None, default: float) -> float:
    return default if value is None or not math.isfinite(value) else float(value)


def _series_text(name: str, labels: dict[str, str]) -> str:
    inside = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inside}}}"


def promtool_values(values: Sequence[float | None]) -> str:
    """promtool's expanding notation, one value per sample (``_`` for none, ``NaN``, ``Inf``)."""

    def one(value: float | None) -> str:
        if value is None:
            return "_"
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Inf" if value > 0 else "-Inf"
        return repr(float(value)) if value != int(value) else str(int(value))

    return " ".join(one(v) for v in values)


# --------------------------------------------------------------------------- promtool tests


@dataclass(frozen=True)
class _Sample:
    """A minimal record for synthetic scenarios."""

    run: str
    step: int
    metrics: dict[str, float]
    time: float = 0.0


def _healthy(step: int) -> dict[str, float]:
    """A steady GRPO step (binary rewards, groups of 8) with a small deterministic wiggle."""
    wiggle = 0.02 * math.sin(step)
    return {
        "rewards/mean": 0.5 + wiggle,
        "rewards/std": 0.45,
        "rewards/nan_count": 0.0,
        "rewards/inf_count": 0.0,
        "advantages/pre_norm/std": 0.35 + wiggle,
        "advantages/pre_norm/mean": 0.0,
        "advantages/post_norm/mean": -0.1 + wiggle,
        "advantages/post_norm/std": 0.9,
        "advantages/post_norm/min": -2.0,
        "advantages/post_norm/max": 2.2 + wiggle,
        "advantages/post_norm/nan_count": 0.0,
        "advantages/post_norm/inf_count": 0.0,
        "groups/zero_std_fraction": 0.35 + wiggle,
        "groups/count": 64.0,
        "groups/max_size": 8.0,
        "groups/bound_size": 8.0,
        "advantages/bound_ratio": (2.2 + wiggle) / group_bound(8, 1.0),
        "advmon/internal_errors": 0.0,
        "advmon/sink_errors/mlflow": 0.0,
        "advmon/dropped_records/mlflow": 0.0,
        # Two slices and two reward functions, as a drill-down run records them.
        "slices/gsm8k/rewards/count": 256.0,
        "slices/gsm8k/rewards/mean": 0.55 + wiggle,
        "slices/gsm8k/rewards/nan_count": 0.0,
        "slices/gsm8k/groups/zero_std_fraction": 0.3 + wiggle,
        "slices/math/rewards/count": 256.0,
        "slices/math/rewards/mean": 0.45 + wiggle,
        "slices/math/rewards/nan_count": 0.0,
        "slices/math/groups/zero_std_fraction": 0.4 + wiggle,
        "rewards/correctness/mean": 0.5 + wiggle,
        "rewards/correctness/nan_count": 0.0,
        "rewards/correctness/inf_count": 0.0,
        "rewards/format/mean": 0.9,
        "rewards/format/nan_count": 0.0,
        "rewards/format/inf_count": 0.0,
    }


def _faults(t: Thresholds) -> dict[str, Callable[[dict[str, float], int], None]]:
    """For each rule, how a step goes wrong enough to break its (possibly tuned) threshold."""

    def set_(key: str, value: Callable[[dict[str, float], int], float]) -> Callable[[dict[str, float], int], None]:
        def apply(metrics: dict[str, float], n: int) -> None:
            metrics[key] = value(metrics, n)

        return apply

    return {
        "AdvmonNonFiniteRewards": set_("rewards/nan_count", lambda m, n: 3.0),
        "AdvmonNonFiniteAdvantages": set_("advantages/post_norm/nan_count", lambda m, n: 24.0),
        "AdvmonAdvantageBeyondBound": set_("advantages/bound_ratio", lambda m, n: 2 * t["bound_factor"] + 100),
        "AdvmonZeroStdGroupsHigh": set_("groups/zero_std_fraction", lambda m, n: min(1.0, (1 + t["zero_std_ratio"]) / 2)),
        "AdvmonAdvantageScaleCollapse": set_(
            "advantages/pre_norm/std", lambda m, n: m["advantages/pre_norm/std"] * t["scale_collapse_ratio"] / 4
        ),
        "AdvmonAdvantageScaleSpike": set_(
            "advantages/pre_norm/std", lambda m, n: m["advantages/pre_norm/std"] * (t["scale_spike_ratio"] * 4 + 1)
        ),
        "AdvmonPostNormMeanDrift": set_(
            "advantages/post_norm/mean", lambda m, n: m["advantages/post_norm/mean"] + 2 * t["mean_drift"] + 0.5
        ),
        "AdvmonRewardCollapse": set_(
            "rewards/mean", lambda m, n: m["rewards/mean"] - (2 * t["reward_drop_stds"] + 0.5) * m["rewards/std"]
        ),
        "AdvmonSliceZeroStdHigh": set_(
            "slices/math/groups/zero_std_fraction", lambda m, n: min(1.0, (1 + t["zero_std_ratio"]) / 2)
        ),
        "AdvmonRewardFunctionNonFinite": set_("rewards/format/nan_count", lambda m, n: 4.0),
        "AdvmonDroppedRecords": set_("advmon/dropped_records/mlflow", lambda m, n: 5.0 * n),
        "AdvmonSinkErrors": set_("advmon/sink_errors/mlflow", lambda m, n: 2.0 * n),
        "AdvmonInternalErrors": set_("advmon/internal_errors", lambda m, n: 1.0 * n),
    }


def scenario(rule: Rule | None, t: Thresholds, run: str, interval_seconds: float) -> list[_Sample]:
    """A run that is healthy throughout (``rule=None``) or breaks ``rule`` from a known step on."""
    onset = t.records("min_history_records") + 5
    length = onset + 8
    fault = _faults(t).get(rule.name) if rule is not None else None
    samples = []
    for step in range(length):
        metrics = _healthy(step)
        if fault is not None and step >= onset:
            fault(metrics, step - onset + 1)
        samples.append(_Sample(run, step, metrics, time=(step + 1) * interval_seconds))
    return samples


def promtool_tests(settings: AlertSettings, rules_path: str = f"../{RULES_FILE}") -> dict[str, Any]:
    """promtool unit tests: for every rule, a run that must fire (after its ``for``) and a healthy one that must not.

    The expected alerts, their steps and their annotations are what the in-process
    evaluator gives on the same records, so these tests also prove the two agree.
    """
    from advmon.alerts.evaluator import firing_by_step

    t = settings.thresholds
    interval = settings.interval_seconds
    tests = []
    rules = settings.rules()
    state_rules = [rule for rule in rules if rule.evaluate is None]
    if state_rules:
        tests.append(_run_state_test(state_rules, settings))
    for rule in rules:
        if rule.evaluate is None:
            continue
        run = f"{rule.name.removeprefix('Advmon').lower()}-run"
        broken = scenario(rule, t, run, interval)
        healthy = scenario(None, t, "healthy-run", interval)
        states = firing_by_step(broken, t, rules)
        fired_at = next(i for i, active in enumerate(states) if any(name == rule.name for name, _ in active))
        extra = settings.selector_labels
        series = {**series_from_records(broken, run, extra), **series_from_records(healthy, "healthy-run", extra)}
        expected_alerts = _expected_alerts(settings, rule, run, broken[: fired_at + 1], states[fired_at])
        # Sample i + 1 follows record i: evaluation times are whole intervals.
        fire_time = format_duration((fired_at + 1) * interval)
        before = format_duration(fired_at * interval)
        end = format_duration(len(healthy) * interval)
        tests.append(
            {
                "name": f"{rule.name} fires after its for, and not on a healthy run",
                "interval": format_duration(interval),
                "input_series": [{"series": text, "values": promtool_values(v)} for text, v in series.items()],
                "alert_rule_test": [
                    {"eval_time": before, "alertname": rule.name, "exp_alerts": []},
                    {"eval_time": fire_time, "alertname": rule.name, "exp_alerts": expected_alerts},
                ],
                "promql_expr_test": [
                    {
                        "expr": f'ALERTS{{alertname="{rule.name}",run="healthy-run"}}',
                        "eval_time": end,
                        "exp_samples": [],
                    }
                ],
            }
        )
    tests.append(_fleet_test(settings))
    kinds = _normalization_kinds_test(settings)
    if kinds is not None:
        tests.append(kinds)
    return {
        "rule_files": [rules_path],
        "evaluation_interval": format_duration(interval),
        "tests": tests,
    }


#: A healthy step of each normalization kind at reward scale 20: (kind, its largest |A|, |A| over its bound).
#: |A| alone says nothing across kinds (17.5 is healthy for Dr. GRPO, impossible for GRPO); the ratio does.
_KIND_STEPS = (
    ("group_std", 2.47, 0.82),  # GRPO, one pass in eight, sample std: (G-1)/sqrt(G) of G/sqrt(G-1)
    ("group_loo_std", 20.0, 1.0),  # NeMo-RL's lone pass, left undivided: the group's spread
    ("group_mean", 17.5, 0.875),  # Dr. GRPO: 20 - 20/8
    ("gpg", 58.3, 0.875),  # GPG's batch factor 3.33 (30% of rewards non-zero) x 17.5
    ("batch", 6.1, 1.0),  # whitened tokens: the Gaussian tail of 1e8 values
    ("none", 20.0, 1.0),  # ReMax: a pass against a failed greedy baseline
)


def _normalization_kinds_test(settings: AlertSettings) -> dict[str, Any] | None:
    """Each normalization kind is judged by its own bound: a healthy step of each stays quiet whatever its |A|,
    and the same step with advantages 100x too large fires (``None`` when the rule is not generated)."""
    from advmon.alerts.evaluator import firing_by_step

    rule = next((r for r in settings.rules() if r.name == "AdvmonAdvantageBeyondBound"), None)
    if rule is None or rule.evaluate is None:
        return None
    t, interval, extra = settings.thresholds, settings.interval_seconds, settings.selector_labels
    runs = {}
    for kind, peak, ratio in _KIND_STEPS:
        for scale, suffix in ((1.0, "healthy"), (100.0, "x100")):
            runs[f"{kind.replace('_', '-')}-{suffix}"] = [
                _Sample(f"{kind.replace('_', '-')}-{suffix}", step,
                        {**_healthy(step), "advantages/post_norm/max": peak * scale,
                         "advantages/post_norm/min": -peak * scale / 7, "advantages/bound_ratio": ratio * scale},
                        time=(step + 1) * interval)
                for step in range(3)
            ]
    expected = []
    for run, samples in runs.items():
        last = firing_by_step(samples, t, [rule])[-1]
        if bool(last) != run.endswith("x100"):  # pragma: no cover - the evaluator decides as documented
            raise AssertionError(f"{run}: the bound should fire on the x100 runs only: {last}")
        expected += _expected_alerts(settings, rule, run, samples, last)
    series = {name: values for run, samples in runs.items()
              for name, values in series_from_records(samples, run, extra).items()}
    return {
        "name": f"{rule.name} judges every normalization kind by its own bound, not by |A|",
        "interval": format_duration(interval),
        "input_series": [{"series": text, "values": promtool_values(v)} for text, v in series.items()],
        "alert_rule_test": [{"eval_time": format_duration(3 * interval), "alertname": rule.name,
                             "exp_alerts": sorted(expected, key=lambda a: a["exp_labels"]["run"])}],
    }


def _expected_alerts(
    settings: AlertSettings, rule: Rule, run: str, samples: Sequence[_Sample], active: set[tuple[str, tuple]]
) -> list[dict[str, Any]]:
    """promtool's expected alerts of ``rule`` after the last of ``samples``: labels and annotations as the
    in-process evaluator renders them (``active``: what it has firing then)."""
    expected = []
    for name, labels in sorted(active):
        if name != rule.name:
            continue
        value = _fired_value(samples, settings.thresholds, rule, labels)
        annotations = settings.annotations(rule)
        annotations["description"] = rule.render_description(
            run, value, samples[-1].step, dict(labels), settings.thresholds)
        expected.append({"exp_labels": {"severity": rule.severity, "run": run, **settings.selector_labels,
                                        **dict(labels)},
                         "exp_annotations": annotations})
    return expected


def _fired_value(samples: Sequence[_Sample], t: Thresholds, rule: Rule, labels: tuple) -> float:
    from advmon.alerts.evaluator import AlertEvaluator

    evaluator = AlertEvaluator(t, [rule])
    for sample in samples:
        for event in evaluator.observe(sample):
            if event.kind == "firing" and event.labels == labels:
                return event.value
    raise AssertionError(f"{rule.name} never fired")  # pragma: no cover - scenario() guarantees it


#: The runs of the run-state test, each on one delivery path (its heartbeat is then the scrape's or the push's
#: time): ``(run, what its series do after the change at sample CHANGE)``.
_STATE_RUNS = (
    ("running", "scrape: keeps recording"),
    ("finished-scraped", "scrape: closes cleanly, scraped once finished, then its endpoint is gone"),
    ("crashed-scraped", "scrape: killed, its endpoint is gone"),
    ("hung-scraped", "scrape: alive, scraped, no record after the change"),
    ("finished-pushed", "push: closes cleanly, its group stays marked finished"),
    ("finished-late-pushed", "push: no record after the change, closes cleanly just before it would count as hung"),
    ("crashed-pushed", "push: killed, its group stays with the last heartbeat"),
    ("deleted-pushed", "push: closes cleanly with delete_on_close, its group is gone"),
    ("hung-pushed", "push: alive, the heartbeat goes on, no record after the change"),
)
_CHANGE = 2  # the sample at which each run does what its name says


def _state_series(run: str, samples: int, interval: float, late: int) -> dict[str, str]:
    """promtool values of one run's state series: ``{metric: values}`` (``stale``: the series ended there);
    ``late``: the sample at which the late run closes."""
    change, rest = _CHANGE, samples - _CHANGE - 1
    live = f"0+{format_number(interval)}x{samples - 1}"  # the sample's own time: a scrape, or a push
    until_change = f"0+{format_number(interval)}x{change}"  # samples 0..CHANGE
    frozen = f"{until_change} {format_number(change * interval)}x{rest - 1}"
    gone = f"{until_change} stale"
    step = f"0+1x{change} {change}x{rest - 1}"
    if run == "running":
        return {"run_finished": f"0x{samples - 1}", "heartbeat": live, "last_update": live, "step": f"0+1x{samples - 1}"}
    if run == "finished-scraped":
        return {"run_finished": f"0x{change} 1 stale", "heartbeat": f"0+{format_number(interval)}x{change + 1} stale",
                "last_update": f"{until_change} {format_number(change * interval)} stale", "step": f"0+1x{change} {change} stale"}
    if run == "crashed-scraped":
        return {"run_finished": f"0x{change} stale", "heartbeat": gone, "last_update": gone, "step": f"0+1x{change} stale"}
    if run in ("hung-scraped", "hung-pushed"):
        return {"run_finished": f"0x{samples - 1}", "heartbeat": live, "last_update": frozen, "step": step}
    if run == "finished-pushed":
        return {"run_finished": f"0x{change} 1x{rest - 1}", "heartbeat": frozen, "last_update": frozen, "step": step,
                "push_time": frozen}
    if run == "finished-late-pushed":
        pushed = f"0+{format_number(interval)}x{late} {format_number(late * interval)}x{samples - late - 2}"
        return {"run_finished": f"0x{late - 1} 1x{samples - late - 1}", "heartbeat": pushed, "last_update": frozen,
                "step": step, "push_time": pushed}
    if run == "crashed-pushed":
        return {"run_finished": f"0x{samples - 1}", "heartbeat": frozen, "last_update": frozen, "step": step,
                "push_time": frozen}
    return {"run_finished": f"0x{change} stale", "heartbeat": gone, "last_update": gone, "step": f"0+1x{change} stale",
            "push_time": gone}  # deleted-pushed


def _run_state_test(rules: Sequence[Rule], settings: AlertSettings) -> dict[str, Any]:
    """Eight runs, four states on two delivery paths: only the crashed ones fire AdvmonRunCrashed (from
    ``silent_seconds`` after they were last seen, a scrape target until ``crash_memory_seconds``), only the hung
    ones AdvmonRunHung (from ``stale_seconds`` after their last record); running and finished runs never fire."""
    t, interval, extra = settings.thresholds, settings.interval_seconds, settings.selector_labels
    seen = _CHANGE * interval  # when the crashed runs were last seen, and the hung ones last recorded
    crash_at = (math.floor(t["silent_seconds"] / interval) + 1) * interval + seen
    hung_at = (math.floor(t["stale_seconds"] / interval) + 1) * interval + seen
    forgotten = (math.floor(t["crash_memory_seconds"] / interval) + 1) * interval + seen
    samples = int(max(crash_at, hung_at, forgotten) / interval) + 2
    names = {"run_finished": "advmon_run_finished", "heartbeat": "advmon_heartbeat_timestamp_seconds",
             "last_update": "advmon_last_update_timestamp_seconds", "step": "advmon_step", "push_time": "push_time_seconds"}
    series = []
    for run, _ in _STATE_RUNS:
        for key, values in _state_series(run, samples, interval, round(hung_at / interval) - 1).items():
            labels = {"run": run, **extra}
            if key == "push_time":
                labels["job"] = labels.get("job", "advmon")
            series.append({"series": _series_text(names[key], labels), "values": values})
    by_name = {rule.name: rule for rule in rules}
    expectations: list[tuple[float, str, list[str]]] = []  # (time, alert, firing runs)
    if "AdvmonRunCrashed" in by_name:
        expectations += [(crash_at - interval, "AdvmonRunCrashed", []),
                         (crash_at, "AdvmonRunCrashed", ["crashed-pushed", "crashed-scraped"]),
                         (forgotten, "AdvmonRunCrashed", ["crashed-pushed"])]
    if "AdvmonRunHung" in by_name:
        expectations += [(hung_at - interval, "AdvmonRunHung", []),
                         (hung_at, "AdvmonRunHung", ["hung-pushed", "hung-scraped"])]
    checks = []
    for moment, alert, runs in sorted(expectations):
        rule = by_name[alert]
        labels = [{"alertname": alert, "alertstate": "firing", "run": run, "severity": rule.severity, **extra}
                  for run in runs]
        samples_expected = [{"labels": _series_text("ALERTS", one), "value": 1} for one in labels]
        checks.append({"expr": f'ALERTS{{alertname="{alert}",alertstate="firing"}}', "eval_time": format_duration(moment),
                       "exp_samples": samples_expected})
    alert_tests = []
    for alert, run, moment, value, step in (("AdvmonRunCrashed", "crashed-scraped", crash_at, crash_at - seen, _CHANGE),
                                            ("AdvmonRunHung", "hung-scraped", hung_at, hung_at - seen, _CHANGE)):
        if alert not in by_name:
            continue
        rule = by_name[alert]
        annotations = settings.annotations(rule)
        annotations["description"] = rule.render_description(run, value, step, {}, t)
        others = "crashed-pushed" if alert == "AdvmonRunCrashed" else "hung-pushed"
        expected = [{"exp_labels": {"severity": rule.severity, "run": name, **extra}, "exp_annotations": {
            **annotations, "description": rule.render_description(name, value, step, {}, t)}} for name in (run, others)]
        alert_tests.append({"eval_time": format_duration(moment), "alertname": alert,
                            "exp_alerts": sorted(expected, key=lambda a: a["exp_labels"]["run"])})
    return {
        "name": "Run state: only crashed runs fire AdvmonRunCrashed, only hung ones AdvmonRunHung, finished ones "
                "never (" + "; ".join(f"{run}: {what}" for run, what in _STATE_RUNS) + ")",
        "interval": format_duration(interval),
        "input_series": series,
        "alert_rule_test": alert_tests,
        "promql_expr_test": checks,
    }


#: The fleet test's series: (run, instance, comparable groups, zero-std groups, all-fail ratio, all-pass ratio,
#: post-norm |A| max, step, alive). "ranks" is one run on two ranks; "gone" crashed long ago (its heartbeat froze).
_FLEET_SERIES = (
    ("big", "node-1:9464", 100, 90, 0.5, 0.1, 2.5, 10, True),
    ("small", "node-2:9464", 10, 0, 0.1, 0.9, 1.0, 12, True),
    ("ranks", "node-3:9464", 30, 30, 0.2, 0.0, 1.5, 7, True),
    ("ranks", "node-4:9464", 10, 0, 0.6, 0.3, 4.0, 8, True),
    ("gone", "node-5:9464", 1000, 0, 0.0, 0.0, 9.0, 3, False),
)


def _fleet_test(settings: AlertSettings) -> dict[str, Any]:
    """The fleet's ratios are sums of counts over sums of counts over the live runs (0.8 here, where a mean of
    the runs' ratios gives 0.55), a run's are over its ranks (0.75, not 0.5), its |A| and step the ranks' max."""
    from fractions import Fraction

    t, interval, extra = settings.thresholds, settings.interval_seconds, settings.selector_labels
    at = (math.floor(t["silent_seconds"] / interval) + 2) * interval  # "gone"'s heartbeat, frozen at 0, is stale
    samples = round(at / interval) + 1
    job = {"job": extra.get("job", "grpo")}
    series = []
    for run, instance, comparable, zero, fail, passed, peak, step, alive in _FLEET_SERIES:
        labels = {**extra, **job, "instance": instance, "run": run}
        heartbeat = f"0+{format_number(interval)}x{samples - 1}" if alive else f"0x{samples - 1}"
        for name, values in (("advmon_comparable_groups", f"{comparable}x{samples - 1}"),
                             ("advmon_zero_std_groups", f"{zero}x{samples - 1}"),
                             # The per-run ratio is there too, so that a mean of ratios would have its numbers.
                             ("advmon_zero_std_group_ratio", f"{format_number(zero / comparable)}x{samples - 1}"),
                             ("advmon_group_all_fail_ratio", f"{format_number(fail)}x{samples - 1}"),
                             ("advmon_group_all_pass_ratio", f"{format_number(passed)}x{samples - 1}"),
                             ("advmon_step", f"{step}x{samples - 1}"),
                             ("advmon_heartbeat_timestamp_seconds", heartbeat)):
            series.append({"series": _series_text(name, labels), "values": values})
        series.append({"series": _series_text("advmon_advantage_abs_max", {**labels, "stage": "post_norm"}),
                       "values": f"{format_number(peak)}x{samples - 1}"})
    live = [row for row in _FLEET_SERIES if row[-1]]

    def over(rows: Sequence[tuple], numerator: Callable[[tuple], Fraction]) -> float:
        return float(sum((numerator(r) for r in rows), Fraction(0)) / sum(Fraction(r[2]) for r in rows))

    ranks = [row for row in _FLEET_SERIES if row[0] == "ranks"]
    job_labels, ranks_labels = {**extra, **job}, {**extra, **job, "run": "ranks"}

    def check(record: str, labels: dict[str, str], value: float) -> dict[str, Any]:
        run = f'{{run="{labels["run"]}"}}' if "run" in labels else ""
        return {"expr": record + run, "eval_time": format_duration(at),
                "exp_samples": [{"labels": _series_text(record, labels), "value": value}]}

    checks = [
        check("job:advmon_zero_std_groups:ratio", job_labels, over(live, lambda r: Fraction(r[3]))),
        check("job:advmon_group_all_fail:ratio", job_labels,
              over(live, lambda r: Fraction(str(r[4])) * r[2])),
        check("job:advmon_group_all_pass:ratio", job_labels,
              over(live, lambda r: Fraction(str(r[5])) * r[2])),
        check("job:advmon_live_runs:count", job_labels, float(len({r[0] for r in live}))),
        check("run:advmon_zero_std_groups:ratio", ranks_labels, over(ranks, lambda r: Fraction(r[3]))),
        check("run:advmon_advantage_abs_max:max", {**ranks_labels, "stage": "post_norm"}, max(r[6] for r in ranks)),
        check("run:advmon_step:max", ranks_labels, float(max(r[7] for r in ranks))),
    ]
    return {
        "name": "Fleet recording rules: sums of counts over sums of counts, over live runs and over a run's ranks",
        "interval": format_duration(interval),
        "input_series": series,
        "promql_expr_test": checks,
    }

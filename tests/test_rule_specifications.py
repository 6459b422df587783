"""Every alert rule against a case written by hand from its definition (docs/alerts.md), not by an evaluator.

The promtool tests advmon ships are generated from the in-process evaluator, and
``test_alerts_agreement.py`` checks the two evaluators against each other: a rule that is
wrong in both would pass them. Here each case is a short run written out step by step,
with the steps at which its alert must be firing worked out from the rule's definition
(threshold, strict or not, records it waits, history it needs) in the comment beside it.
Both evaluators must fire exactly there: the in-process one over the records, Prometheus
(promtool, with the generated rules) over the series advmon's exporter exposes for them
(``series_from_records``, itself checked against the real exporter in
``test_alerts_agreement.py``). A case must fire somewhere, so none can pass by silence.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from advmon.alerts import AlertmanagerSettings, AlertSettings, generated_files
from advmon.alerts.evaluator import firing_by_step
from advmon.alerts.prometheus_rules import dump_yaml, promtool_values, series_from_records
from advmon.record import Record
from advmon.rules import CATALOG, Thresholds, format_duration, rule_named
from tests.services import require_binary

RUN = "spec-run"
INTERVAL = 60  # seconds between two records, as Prometheus sees them

#: A healthy step: no non-finite value, |A| at half its bound, 30% zero-std groups, steady levels. Levels and
#: the cases' values are binary fractions, so a ratio that sits on a threshold is exactly on it.
HEALTHY = {
    "rewards/nan_count": 0.0, "rewards/inf_count": 0.0, "rewards/mean": 0.5, "rewards/std": 0.25,
    "advantages/pre_norm/nan_count": 0.0, "advantages/pre_norm/inf_count": 0.0, "advantages/pre_norm/std": 0.5,
    "advantages/post_norm/nan_count": 0.0, "advantages/post_norm/inf_count": 0.0,
    "advantages/post_norm/mean": 0.0, "advantages/post_norm/std": 1.0,
    "advantages/post_norm/min": -1.5, "advantages/post_norm/max": 1.5, "advantages/bound_ratio": 0.5,
    "groups/zero_std_fraction": 0.3, "advmon/internal_errors": 0.0,
}


@dataclass
class Case:
    """A run of ``steps`` records: HEALTHY with ``changes[step]`` applied; ``firing``: the steps the alert fires at."""

    alert: str
    steps: int
    changes: dict[int, dict[str, float]]
    firing: set[int]
    labels: tuple[tuple[str, str], ...] = ()
    extra: dict[str, float] = field(default_factory=dict)  # keys every record carries besides HEALTHY
    also: frozenset[str] = frozenset()  # other alerts the case trips on purpose

    def records(self) -> list[Record]:
        return [Record(RUN, step, float(step * INTERVAL), "spec", None,
                       {**HEALTHY, **self.extra, **self.changes.get(step, {})}) for step in range(self.steps)]


def at(steps, **values: float) -> dict[int, dict[str, float]]:
    """The same change at each of ``steps`` (keys with ``__`` for ``/``)."""
    change = {key.replace("__", "/"): value for key, value in values.items()}
    return {step: dict(change) for step in steps}


def merged(*parts: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for part in parts:
        for step, change in part.items():
            out.setdefault(step, {}).update(change)
    return out


CASES = {
    # Any NaN/Inf reward fires at once (1 record) and resolves with the first clean record.
    "nonfinite rewards": Case("AdvmonNonFiniteRewards", 10, merged(at([3], rewards__nan_count=2),
                                                                  at([7, 8], rewards__inf_count=1)), {3, 7, 8}),
    # Post-norm NaN/Inf fires at once; pre-norm ones alone do not (they may be masked padding).
    "nonfinite advantages": Case("AdvmonNonFiniteAdvantages", 10, merged(
        at([2], advantages__pre_norm__nan_count=5), at([5], advantages__post_norm__inf_count=1)), {5}),
    # bound_ratio > bound_factor (3), strictly: 3.0 is allowed, 3.01 fires, at once.
    "beyond bound": Case("AdvmonAdvantageBeyondBound", 10, merged(at([2], advantages__bound_ratio=3.0),
                                                                 at([6], advantages__bound_ratio=3.01)), {6}),
    # zero_std_fraction > 0.8 for 3 records: exactly 0.8 never; 0.9 twice then 0.5 never; 0.81 at 10-13 fires
    # at 12 (its third record) and 13.
    "zero-std groups": Case("AdvmonZeroStdGroupsHigh", 16, merged(
        at([1, 2, 3, 4], groups__zero_std_fraction=0.8), at([6, 7], groups__zero_std_fraction=0.9),
        at([10, 11, 12, 13], groups__zero_std_fraction=0.81)), {12, 13}),
    # One slice above 0.8 for 3 records while the run is at or below 0.8; not while the run is above too.
    "slice zero-std": Case("AdvmonSliceZeroStdHigh", 14, merged(
        at([2, 3, 4, 5], groups__zero_std_fraction=0.85, **{"slices__math__groups__zero_std_fraction": 0.9}),
        at([8, 9, 10, 11], **{"slices__math__groups__zero_std_fraction": 0.95})),
        {10, 11}, labels=(("slice", "math"),), also=frozenset({"AdvmonZeroStdGroupsHigh"}),
        extra={"slices/math/groups/zero_std_fraction": 0.4, "slices/gsm8k/groups/zero_std_fraction": 0.2}),
    # A reward function's NaN while the summed reward is finite fires at once; with the sum NaN too, the
    # non-finite rewards alert speaks instead.
    "reward function": Case("AdvmonRewardFunctionNonFinite", 10, merged(
        at([3], **{"rewards__format__nan_count": 2.0}),
        at([6], **{"rewards__format__nan_count": 1.0, "rewards__nan_count": 1.0})),
        {3}, labels=(("function", "format"),), also=frozenset({"AdvmonNonFiniteRewards"}),
        extra={"rewards/format/nan_count": 0.0, "rewards/format/inf_count": 0.0}),
    # pre-norm std / its trailing median (30 records, current included) < 0.25 for 3 records, once 10 records
    # are in the window. Steps 0-2 collapse with too little history; 0.125 at 20-22 is a ratio of exactly 0.25
    # (never); 0.1 at 30-33 (ratio 0.2: the windows, steps 1-30 to 4-33, hold at most 7 low values of 30, so
    # the median stays 0.5) fires at 32 and 33.
    "scale collapse": Case("AdvmonAdvantageScaleCollapse", 36, merged(
        at([0, 1, 2], advantages__pre_norm__std=0.01), at([20, 21, 22], advantages__pre_norm__std=0.125),
        at([30, 31, 32, 33], advantages__pre_norm__std=0.1)), {32, 33}),
    # ratio > 10 for 2 records: 5.0 (ratio 10) never; 5.5 (11) at 14-15 fires at 15.
    "scale spike": Case("AdvmonAdvantageScaleSpike", 20, merged(
        at([11, 12], advantages__pre_norm__std=5.0), at([14, 15], advantages__pre_norm__std=5.5)), {15}),
    # |post mean - its trailing median| / trailing median of post std > 0.5 for 3 records: 0.5 never, -0.6
    # at 14-16 fires at 16 (both signs count).
    "mean drift": Case("AdvmonPostNormMeanDrift", 20, merged(
        at([10, 11, 12], advantages__post_norm__mean=0.5), at([14, 15, 16], advantages__post_norm__mean=-0.6)), {16}),
    # (trailing median of reward mean - mean) / trailing median of reward std (0.25) > 0.75 for 3 records:
    # 0.3125 is a drop of exactly 0.75 (never), 0.25 of 1.0 at 15-18 fires at 17 and 18 (the median stays 0.5).
    "reward collapse": Case("AdvmonRewardCollapse", 22, merged(
        at([10, 11, 12], rewards__mean=0.3125), at([15, 16, 17, 18], rewards__mean=0.25)), {17, 18}),
    # A counter's increase since the previous record fires at once and resolves when it stops growing.
    "dropped records": Case("AdvmonDroppedRecords", 8, at([4, 5, 6, 7], advmon__dropped_records__mlflow=3.0),
                            {4}, labels=(("sink", "mlflow"),), extra={"advmon/dropped_records/mlflow": 0.0}),
    "sink errors": Case("AdvmonSinkErrors", 8, merged(at([2], advmon__sink_errors__wandb=1.0),
                                                      at([3, 4, 5, 6, 7], advmon__sink_errors__wandb=4.0)),
                        {2, 3}, labels=(("sink", "wandb"),), extra={"advmon/sink_errors/wandb": 0.0}),
    "internal errors": Case("AdvmonInternalErrors", 8, at([5, 6, 7], advmon__internal_errors=1.0), {5}),
}


def test_every_rule_over_records_has_a_hand_written_case():
    over_records = {rule.name for rule in CATALOG if rule.evaluate is not None}
    assert {case.alert for case in CASES.values()} == over_records


@pytest.mark.parametrize("name", sorted(CASES))
def test_in_process_evaluator_fires_where_the_definition_says(name):
    case = CASES[name]
    states = firing_by_step(case.records(), Thresholds.with_overrides())
    fired = {step for step, state in enumerate(states) if (case.alert, case.labels) in state}
    others = {alert for state in states for alert, _ in state} - {case.alert}
    assert fired == case.firing, (name, sorted(fired))
    assert others == case.also, others  # the case is about its rule


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CASES))
def test_prometheus_fires_where_the_definition_says(name, tmp_path):
    case = CASES[name]
    series = series_from_records(case.records(), RUN)
    checks = [promql_check(case.alert, (step + 1) * INTERVAL, case.labels if step in case.firing else None)
              for step in range(case.steps)]  # record i is scraped at sample i + 1
    run_promtool(tmp_path, {s: promtool_values(v) for s, v in series.items()}, checks)


def minutes(*values: float | str) -> str:
    """promtool values written out, one per minute: numbers, ``_`` (no sample) or ``stale`` (the series ended)."""
    return " ".join(str(v) for v in values)


def alerts_at(alert: str, seconds: int, runs: list[str]) -> dict:
    """At ``seconds``, ``alert`` fires for exactly ``runs`` (each labelled by its run alone)."""
    severity = rule_named(alert).severity
    samples = [{"labels": f'ALERTS{{alertname="{alert}",alertstate="firing",run="{run}",severity="{severity}"}}',
                "value": 1} for run in sorted(runs)]
    return {"expr": f'ALERTS{{alertname="{alert}",alertstate="firing"}}', "eval_time": format_duration(seconds),
            "exp_samples": samples}


@pytest.mark.integration
def test_prometheus_fires_for_a_hung_run_after_stale_seconds_and_not_for_one_that_reports_finished_or_crashed(
        tmp_path):
    """AdvmonRunHung (Prometheus only): time() - last record > stale_seconds (900 s) while a heartbeat is at
    most silent_seconds (180 s) old and the run did not finish.

    spec-run (scraped: its heartbeat is each scrape's time) records until t = 300 s: 1200 s is exactly 900 s
    later (not yet), 1260 s, the next evaluation, fires. alive records every minute. closed-late (pushed)
    records until 300 s, pushes heartbeats until it closes at 1140 s (finished, heartbeat frozen): at 1260 s its
    record is 960 s old and its heartbeat 120 s, yet it finished. crashed (pushed) froze at 300 s: its heartbeat
    is 240 s old by the time its record is 900 s old, so it is crashed, not hung.
    """
    samples = 30
    every = [i * INTERVAL for i in range(samples)]
    until_300 = [min(t, 300) for t in every]
    series = {
        f'advmon_last_update_timestamp_seconds{{run="{RUN}"}}': minutes(*until_300),
        f'advmon_heartbeat_timestamp_seconds{{run="{RUN}"}}': minutes(*every),
        f'advmon_run_finished{{run="{RUN}"}}': minutes(*[0] * samples),
        f'advmon_step{{run="{RUN}"}}': minutes(*[t // INTERVAL for t in until_300]),
        'advmon_last_update_timestamp_seconds{run="alive"}': minutes(*every),
        'advmon_heartbeat_timestamp_seconds{run="alive"}': minutes(*every),
        'advmon_run_finished{run="alive"}': minutes(*[0] * samples),
        'advmon_last_update_timestamp_seconds{run="closed-late"}': minutes(*until_300),
        'advmon_heartbeat_timestamp_seconds{run="closed-late"}': minutes(*[min(t, 1140) for t in every]),
        'advmon_run_finished{run="closed-late"}': minutes(*[int(t >= 1140) for t in every]),
        'advmon_last_update_timestamp_seconds{run="crashed"}': minutes(*until_300),
        'advmon_heartbeat_timestamp_seconds{run="crashed"}': minutes(*until_300),
        'advmon_run_finished{run="crashed"}': minutes(*[0] * samples),
    }
    checks = [alerts_at("AdvmonRunHung", t, [RUN] if t >= 1260 else []) for t in range(60, 1741, 60)]
    run_promtool(tmp_path, series, checks)


@pytest.mark.integration
def test_prometheus_fires_for_a_crashed_run_and_never_for_a_finished_resumed_or_deleted_one(tmp_path):
    """AdvmonRunCrashed (Prometheus only): the last heartbeat within crash_memory_seconds (3600 s) is more than
    silent_seconds (180 s) old, the run was not last seen finished, no heartbeat of the run is fresh now, and
    it is not a Pushgateway group that was deleted.

    Every run below is last seen alive at t = 300 s, unless said otherwise.
    spec-run (scraped) is killed: its series end at 360 s. 480 s is exactly 180 s later (not yet), 540 s fires;
    its last heartbeat leaves the one-hour range at 3900 s + one evaluation (3840 s still fires, 3960 s no longer;
    3900 s itself is left out: Prometheus 2 includes a range's start, Prometheus 3 does not).
    pushed-crash (its Pushgateway group stays, heartbeat frozen) fires from 540 s on, for good.
    finished (scraped) was scraped once with advmon_run_finished 1 before its endpoint went away; pushed-finished
    stays on the gateway marked finished; deleted (pushed, delete_on_close) vanished with its group's
    push_time_seconds; resumed vanished from instance a at 360 s and reports from instance b from 420 s; flaky
    missed the scrape at 360 s and came back at 420 s (an absence of 120 s, under 180 s). None of them fires.
    """
    samples = 70  # 0 .. 4140 s
    every = [i * INTERVAL for i in range(samples)]
    alive_until_300 = [t if t <= 300 else ("stale" if t == 360 else "_") for t in every]
    frozen = [min(t, 300) for t in every]
    zeros = [0] * samples
    series = {
        f'advmon_heartbeat_timestamp_seconds{{run="{RUN}"}}': minutes(*alive_until_300),
        f'advmon_run_finished{{run="{RUN}"}}': minutes(*[0 if t <= 300 else v for t, v in zip(every, alive_until_300)]),
        f'advmon_step{{run="{RUN}"}}': minutes(*[t // INTERVAL if t <= 300 else v for t, v in zip(every, alive_until_300)]),
        'advmon_heartbeat_timestamp_seconds{run="pushed-crash"}': minutes(*frozen),
        'advmon_run_finished{run="pushed-crash"}': minutes(*zeros),
        'push_time_seconds{job="advmon",run="pushed-crash"}': minutes(*frozen),
        'advmon_heartbeat_timestamp_seconds{run="finished"}': minutes(*alive_until_300),
        'advmon_run_finished{run="finished"}': minutes(*[(1 if t == 300 else 0) if t <= 300 else v
                                                         for t, v in zip(every, alive_until_300)]),
        'advmon_heartbeat_timestamp_seconds{run="pushed-finished"}': minutes(*frozen),
        'advmon_run_finished{run="pushed-finished"}': minutes(*[int(t >= 300) for t in every]),
        'push_time_seconds{job="advmon",run="pushed-finished"}': minutes(*frozen),
        'advmon_heartbeat_timestamp_seconds{run="deleted"}': minutes(*alive_until_300),
        'advmon_run_finished{run="deleted"}': minutes(*[0 if t <= 300 else v for t, v in zip(every, alive_until_300)]),
        'push_time_seconds{job="advmon",run="deleted"}': minutes(*alive_until_300),
        'advmon_heartbeat_timestamp_seconds{instance="a",run="resumed"}': minutes(*alive_until_300),
        'advmon_run_finished{instance="a",run="resumed"}': minutes(*[0 if t <= 300 else v
                                                                    for t, v in zip(every, alive_until_300)]),
        'advmon_heartbeat_timestamp_seconds{instance="b",run="resumed"}': minutes(*[t if t >= 420 else "_"
                                                                                   for t in every]),
        'advmon_run_finished{instance="b",run="resumed"}': minutes(*[0 if t >= 420 else "_" for t in every]),
        'advmon_heartbeat_timestamp_seconds{run="flaky"}': minutes(*["stale" if t == 360 else t for t in every]),
        'advmon_run_finished{run="flaky"}': minutes(*["stale" if t == 360 else 0 for t in every]),
    }
    checks = []
    for t in range(60, samples * INTERVAL - INTERVAL + 1, 60):
        if t == 3900:
            continue
        firing = (["pushed-crash"] if t >= 540 else []) + ([RUN] if 540 <= t <= 3840 else [])
        checks.append(alerts_at("AdvmonRunCrashed", t, firing))
    run_promtool(tmp_path, series, checks)


def promql_check(alert: str, seconds: int, labels: tuple | None) -> dict:
    """At ``seconds``, ``alert`` fires for the run with ``labels`` (``None``: it does not fire at all)."""
    samples = []
    if labels is not None:
        every = {"alertname": alert, "alertstate": "firing", "run": RUN, "severity": rule_named(alert).severity,
                 **dict(labels)}
        samples = [{"labels": "ALERTS{" + ",".join(f'{k}="{v}"' for k, v in sorted(every.items())) + "}",
                    "value": 1}]
    return {"expr": f'ALERTS{{alertname="{alert}",alertstate="firing"}}', "eval_time": format_duration(seconds),
            "exp_samples": samples}


def run_promtool(tmp_path: Path, series: dict[str, str], checks: list[dict]) -> None:
    settings = AlertSettings(thresholds=Thresholds.with_overrides(), interval_seconds=INTERVAL)
    (tmp_path / "advmon-rules.yml").write_text(generated_files(settings, AlertmanagerSettings())["advmon-rules.yml"])
    test = {"rule_files": ["advmon-rules.yml"], "evaluation_interval": format_duration(INTERVAL),
            "tests": [{"interval": format_duration(INTERVAL),
                       "input_series": [{"series": s, "values": v} for s, v in series.items()],
                       "promql_expr_test": checks}]}
    (tmp_path / "spec-test.yml").write_text(dump_yaml(test))
    done = subprocess.run([require_binary("promtool"), "test", "rules", "spec-test.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


@pytest.mark.integration
def test_fleet_ratios_are_sums_of_counts_over_sums_of_counts(tmp_path):
    """job:advmon_zero_std_groups:ratio over live runs and run:advmon_zero_std_groups:ratio over a run's ranks.

    a: 90 zero-std of 100 comparable groups (0.9); b: 0 of 10 (0.0); c on two ranks: 30 of 30 and 0 of 10.
    The job: (90 + 0 + 30 + 0) / (100 + 10 + 30 + 10) = 120 / 150 = 0.8 (a mean of the runs' ratios would give
    (0.9 + 0 + 0.75) / 3 = 0.55, of the series' (0.9 + 0 + 1 + 0) / 4 = 0.475). Run c: 30 / 40 = 0.75, not 0.5.
    d (5 of 1000) stopped pushing at t = 0: at 300 s its heartbeat is 300 s old (> silent_seconds 180), not live.
    """
    rows = (("a", "n1", 100, 90, True), ("b", "n2", 10, 0, True), ("c", "n3", 30, 30, True), ("c", "n4", 10, 0, True),
            ("d", "n5", 1000, 5, False))
    series = {}
    for run, instance, comparable, zero, alive in rows:
        labels = f'instance="{instance}",job="grpo",run="{run}"'
        series[f"advmon_comparable_groups{{{labels}}}"] = f"{comparable}x5"
        series[f"advmon_zero_std_groups{{{labels}}}"] = f"{zero}x5"
        series[f"advmon_zero_std_group_ratio{{{labels}}}"] = f"{zero / comparable}x5"
        series[f"advmon_heartbeat_timestamp_seconds{{{labels}}}"] = "0+60x5" if alive else "0x5"
    checks = [
        {"expr": "job:advmon_zero_std_groups:ratio", "eval_time": "5m",
         "exp_samples": [{"labels": 'job:advmon_zero_std_groups:ratio{job="grpo"}', "value": 0.8}]},
        {"expr": 'run:advmon_zero_std_groups:ratio{run="c"}', "eval_time": "5m",
         "exp_samples": [{"labels": 'run:advmon_zero_std_groups:ratio{job="grpo",run="c"}', "value": 0.75}]},
        {"expr": "job:advmon_live_runs:count", "eval_time": "5m",
         "exp_samples": [{"labels": 'job:advmon_live_runs:count{job="grpo"}', "value": 3}]},
    ]
    run_promtool(tmp_path, series, checks)


@pytest.mark.integration
def test_a_finished_runs_last_values_fire_nothing(tmp_path):
    """A Pushgateway keeps a finished run's last values. A zero-std ratio of 0.9 and a bound ratio of 10 held
    from t = 0 fire AdvmonAdvantageBeyondBound at once and AdvmonZeroStdGroupsHigh once held 2 minutes (3
    records) for a run that did not finish; for one marked finished (advmon_run_finished 1) nothing fires.
    """
    series = {}
    for run, finished in ((RUN, 0), ("finished", 1)):
        series[f'advmon_zero_std_group_ratio{{run="{run}"}}'] = "0.9x10"
        series[f'advmon_advantage_bound_ratio{{run="{run}"}}'] = "10x10"
        series[f'advmon_run_finished{{run="{run}"}}'] = f"{finished}x10"
    checks = [alerts_at("AdvmonAdvantageBeyondBound", 60, [RUN]), alerts_at("AdvmonZeroStdGroupsHigh", 60, []),
              alerts_at("AdvmonZeroStdGroupsHigh", 180, [RUN]), alerts_at("AdvmonAdvantageBeyondBound", 540, [RUN])]
    run_promtool(tmp_path, series, checks)

"""Both evaluators agree: promtool, given what the exporter would expose for a
recorded run, fires exactly the alerts the in-process evaluator fires, record by record."""

from __future__ import annotations

import math
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from advmon.alerts import AlertSettings, generated_files
from advmon.alerts.evaluator import firing_by_step
from advmon.alerts.prometheus_rules import dump_yaml, promtool_values, series_from_records
from advmon.record import Record
from advmon.rules import Thresholds, _go_quantile, format_duration
from advmon.simulation import RunSpec, simulate
from tests.services import require_binary


def promtool_agreement(records: list[Record], tmp_path: Path, thresholds: Thresholds) -> None:
    run = records[0].run
    settings = AlertSettings(thresholds=thresholds, interval_seconds=60)
    (tmp_path / "advmon-rules.yml").write_text(generated_files(settings, _routing())["advmon-rules.yml"])
    states = firing_by_step(records, thresholds)
    series = series_from_records(records, run)
    checks = []
    for index, active in enumerate(states):
        samples = [
            {"labels": _alert_labels(name, run, dict(labels)), "value": 1}
            for name, labels in sorted(active)
        ]
        checks.append(
            {
                "expr": 'ALERTS{alertstate="firing"}',
                "eval_time": format_duration((index + 1) * 60),
                "exp_samples": samples,
            }
        )
    test = {
        "rule_files": ["advmon-rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": promtool_values(v)} for s, v in series.items()],
                "promql_expr_test": checks,
            }
        ],
    }
    (tmp_path / "agreement-test.yml").write_text(dump_yaml(test))
    result = subprocess.run(
        [require_binary("promtool"), "test", "rules", "agreement-test.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    return states


def _routing():
    from advmon.alerts import AlertmanagerSettings

    return AlertmanagerSettings()


def _alert_labels(name: str, run: str, labels: dict[str, str]) -> str:
    from advmon.rules import rule_named

    every = {"alertname": name, "alertstate": "firing", "run": run, "severity": rule_named(name).severity, **labels}
    return "ALERTS{" + ",".join(f'{k}="{v}"' for k, v in sorted(every.items())) + "}"


@pytest.mark.integration
@pytest.mark.parametrize(
    "kind",
    ["nan_rewards", "loo_float32_cancellation", "zero_std_collapse", "reward_model_collapse",
     "reward_scale_spike", "post_norm_mean_drift", "reward_collapse", "grpo_graded_loo",
     "slice_zero_std", "reward_function_none"],
)
def test_promtool_and_in_process_fire_the_same_alerts_at_the_same_steps(kind, tmp_path):
    records = simulate(RunSpec(kind, seed=5, steps=70, onset=35))
    states = promtool_agreement(records, tmp_path, Thresholds.with_overrides())
    if kind != "grpo_graded_loo":
        assert any(states), "the failure raised no alert: the comparison would prove little"


@pytest.mark.integration
@pytest.mark.parametrize("estimator", ["verl/grpo", "nemo/GRPO", "verl/rloo", "verl/gpg", "verl/gae", "verl/remax"])
def test_promtool_and_in_process_agree_on_every_normalization_kind(estimator, tmp_path):
    """Records of real estimators of each kind (tests/zoo.py) at reward scale 20, healthy then x100 from step 25."""
    from tests.services import require_module
    from tests.zoo import ESTIMATORS, Case, run_case

    require_module(ESTIMATORS[estimator].framework if ESTIMATORS[estimator].framework != "nemo" else "torch")
    outcome = run_case(Case(estimator, "binary", 20.0, steps=30, fault="x100", onset=20))
    assert {r.normalization for r in outcome.records} == {ESTIMATORS[estimator].kind}
    states = promtool_agreement(outcome.records, tmp_path, Thresholds.with_overrides())
    fired = [index for index, state in enumerate(states) if any(n == "AdvmonAdvantageBeyondBound" for n, _ in state)]
    assert fired and fired[0] == 20, fired  # quiet while healthy, at once when broken


@pytest.mark.integration
def test_agreement_with_sink_errors_and_tuned_thresholds(tmp_path):
    records = simulate(RunSpec("zero_std_collapse", seed=2, steps=40, onset=20))
    for i, record in enumerate(records):  # a sink that starts failing at step 25
        record.metrics["advmon/sink_errors/mlflow"] = float(max(0, i - 24))
        record.metrics["advmon/dropped_records/mlflow"] = 0.0
    states = promtool_agreement(records, tmp_path, Thresholds.with_overrides({"zero_std_ratio": 0.6, "trailing_records": 12}))
    assert any(name == "AdvmonSinkErrors" for state in states for name, _ in state)


def test_series_are_what_the_real_exporter_exposes():
    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client import generate_latest

    from advmon.sinks.prometheus import AdvmonCollector

    records = simulate(RunSpec("nan_rewards", seed=1, steps=6, onset=3))
    records += simulate(RunSpec("reward_function_none", seed=1, steps=6, onset=3))  # slices and reward functions
    records = [replace(r, run=records[0].run) for r in records]
    for record in records:
        record.metrics["advmon/sink_errors/mlflow"] = 1.0
        record.metrics["advmon/dropped_records/mlflow"] = 0.0
    ours = series_from_records(records, records[0].run)
    collector = AdvmonCollector(records[0].run, sink_names=["keep", "mlflow"])  # the monitor attaches every sink
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    for index, record in enumerate([None, *records]):
        if record is not None:
            collector.update(record)
        exposed = {}
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                text = sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}"
                exposed[text] = sample.value
        expected = {s: v[index] for s, v in ours.items() if v[index] is not None}
        relevant = {s: v for s, v in exposed.items() if s.split("{")[0] in {k.split("{")[0] for k in ours}}
        assert set(expected) <= set(relevant)
        for text, value in expected.items():
            assert (math.isnan(value) and math.isnan(relevant[text])) or relevant[text] == value, text


def test_trailing_median_is_prometheus_quantile():
    rng = np.random.default_rng(0)
    for n in range(1, 40):
        values = list(rng.normal(size=n))
        assert _go_quantile(0.5, values) == pytest.approx(float(np.quantile(values, 0.5)), rel=1e-12, abs=1e-15)
    # NaN sorts first and takes part in the interpolation, as in Prometheus's Go code.
    assert _go_quantile(0.5, [1.0, math.nan, 2.0]) == 1.0
    assert math.isnan(_go_quantile(0.5, [math.nan, math.nan, 1.0, 2.0]))


def test_thresholds_name_every_rules_number():
    from advmon.rules import CATALOG, THRESHOLDS

    used = {name for rule in CATALOG for name in rule.thresholds}
    assert used <= {t.name for t in THRESHOLDS}
    assert all(t.source for t in THRESHOLDS)

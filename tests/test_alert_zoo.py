"""The estimator zoo (issue 25): every real estimator of verl, TRL, SkyRL, AReaL and OpenRLHF, and NeMo-RL's,
quiet when healthy at every reward scale, and flagged within 10 steps of each fault (tests/zoo.py; the table:
benchmarks/alert_zoo.py)."""

from __future__ import annotations

import pytest

from tests.services import require_module
from tests.zoo import ESTIMATORS, WITHIN, quick_cases, run_case


def _framework(name: str) -> None:
    framework = ESTIMATORS[name].framework
    if framework in ("verl", "trl", "skyrl", "areal", "openrlhf"):
        require_module(framework)  # in CI a missing framework fails, never skips


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_healthy_runs_raise_no_alert_at_any_reward_scale(estimator):
    _framework(estimator)
    healthy, _ = quick_cases(estimator)
    for case in healthy:
        outcome = run_case(case)
        assert len(outcome.records) == case.steps, case.name
        # Judged by what the estimator is, every step: the integration declares it (or says it cannot).
        if ESTIMATORS[estimator].kind is None:
            assert {r.normalization_source for r in outcome.records} == {"inferred"}, case.name
        else:
            assert outcome.kinds == {ESTIMATORS[estimator].kind}, (case.name, outcome.kinds)
            assert {r.normalization_source for r in outcome.records} == {"declared"}, case.name
        alarms = [(a.alert, a.fired_step, a.value) for a in outcome.false_alarms()]
        assert alarms == [], (case.name, alarms)
        assert outcome.warnings == [], (case.name, outcome.warnings)
        assert outcome.worst_ratio() <= 2.5, (case.name, outcome.worst_ratio())  # clear of bound_factor (3)


@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
def test_every_fault_is_flagged_within_ten_steps_of_its_onset(estimator):
    _framework(estimator)
    _, faulty = quick_cases(estimator)
    assert {case.fault for case in faulty} == set(ESTIMATORS[estimator].faults)
    for case in faulty:
        outcome = run_case(case)
        assert outcome.false_alarms() == [], (case.name, outcome.false_alarms())  # nothing before the onset
        delay = outcome.caught_after()
        fired = [(a.alert, a.severity, a.fired_step) for a in outcome.alerts]
        assert delay is not None and delay <= WITHIN, (case.name, fired)

"""The catalog in-process: what it catches on simulated runs, `advmon alerts check`, the alert sink."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from advmon.alerts.evaluator import AlertEvaluator, evaluate_records
from advmon.alerts.sink import AlertSink
from advmon.cli import main
from advmon.record import Record
from advmon.rules import CATALOG, Thresholds, group_bound
from advmon.simulation import FAILURES, HEALTHY, RunSpec, corpus, simulate
from advmon.sinks.jsonl import JsonlSink
from tests.services import require_module


@pytest.mark.parametrize("kind", sorted(FAILURES))
def test_each_failure_is_caught_by_its_rule_soon_after_onset(kind):
    onset = 40
    records = simulate(RunSpec(kind, seed=7, steps=80, onset=onset))
    occurrences = evaluate_records(records)
    mine = [o for o in occurrences if o.alert == FAILURES[kind]]
    assert mine, f"{FAILURES[kind]} never fired on {kind}: {[(o.alert, o.fired_step) for o in occurrences]}"
    assert onset <= mine[0].fired_step <= onset + 15
    assert all(o.fired_step >= onset for o in occurrences), "an alarm before the failure began"


@pytest.mark.parametrize("spec", [s for s in corpus(seeds=1, steps=100) if s.kind in HEALTHY], ids=lambda s: s.kind)
def test_healthy_runs_raise_no_alert(spec):
    assert evaluate_records(simulate(spec)) == []


def test_group_bound_holds_for_every_group_normalization():
    """Brute force: the largest |A| over many groups stays under G/sqrt(G-1) for each normalization."""
    rng = np.random.default_rng(0)
    for g in (2, 3, 4, 8, 16):
        worst = 0.0
        for _ in range(3000):
            r = rng.choice([0.0, 1.0, 0.3, rng.normal()], size=g)
            r[rng.integers(g)] = rng.normal() * 5
            for ddof in (0, 1):
                std = r.std(ddof=ddof)
                if std == 0:
                    continue
                mean_adv = (r - r.mean()) / std
                loo_adv = (r - (r.sum() - r) / (g - 1)) / std
                worst = max(worst, np.abs(mean_adv).max(), np.abs(loo_adv).max())
        assert worst <= group_bound(g, 1.0) * (1 + 1e-9)
        assert worst > 0.9 * group_bound(g, 1.0)  # and the bound is tight


def test_for_records_and_resolution():
    rule = next(r for r in CATALOG if r.name == "AdvmonZeroStdGroupsHigh")
    evaluator = AlertEvaluator(rules=[rule])
    ratios = [0.1, 0.9, 0.9, 0.9, 0.9, 0.1, 0.9]
    events = []
    for step, ratio in enumerate(ratios):
        events += evaluator.observe(Record("r", step, 0.0, "e", None, {"groups/zero_std_fraction": ratio}))
    assert [(e.kind, e.step) for e in events] == [("firing", 3), ("resolved", 5)]
    assert events[0].description == "Run r: 0.9 of the groups are zero-std at step 3 (threshold 0.8)."


def write_run(path, kind: str, **spec) -> None:
    sink = JsonlSink(path)
    for record in simulate(RunSpec(kind, **spec)):
        sink.write(record)
    sink.close()


def test_check_cli_json_and_exit_codes(tmp_path, capsys):
    healthy, broken = tmp_path / "healthy.jsonl", tmp_path / "broken.jsonl"
    write_run(healthy, "grpo_binary", seed=1, steps=40)
    write_run(broken, "nan_rewards", seed=1, steps=40, onset=20)
    assert main(["alerts", "check", str(healthy), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["alerts"] == []
    assert main(["alerts", "check", str(healthy), str(broken), "--format", "json"]) == 1
    found = json.loads(capsys.readouterr().out)["alerts"]
    keys = {"run", "source", "alert", "severity", "fired_step", "resolved_step", "value", "labels", "where"}
    assert found and all(set(o) == keys for o in found)
    first = next(o for o in found if o["alert"] == "AdvmonNonFiniteRewards")
    assert first["run"] == "nan_rewards-s1" and first["fired_step"] == 20 and first["severity"] == "critical"
    assert first["source"] == str(broken)  # which file: two files may hold runs of one name
    assert isinstance(first["value"], float) and first["value"] >= 1
    # Text output names the alert and its step; a critical alert still means exit 1.
    assert main(["alerts", "check", str(broken), "--threshold", "zero_std_ratio=0.5"]) == 1
    text = capsys.readouterr().out
    assert "AdvmonNonFiniteRewards" in text and "fired at step 20" in text


@pytest.mark.parametrize("content", [None, "", "not json\n{}\n"])
def test_check_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, content):
    path = tmp_path / "run.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["alerts", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("advmon: error:") and "Traceback" not in captured.err


class Collect:
    name = "collect"

    def __init__(self, failures: int = 0) -> None:
        self.messages = []
        self.failures = failures

    def send(self, message) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("webhook down")
        self.messages.append(message)


def nan_record(step: int, nan: float) -> Record:
    return Record("r", step, 0.0, "e", None, {"rewards/nan_count": nan})


def test_alert_sink_rate_limits_per_rule_and_run_and_pairs_resolutions():
    now = [0.0]
    notifier = Collect()
    sink = AlertSink([notifier], min_interval=100.0, clock=lambda: now[0])
    for step, nan in enumerate([1, 0, 1, 0]):  # flapping inside the rate limit
        now[0] = step * 10.0
        sink.write(nan_record(step, nan))
    assert [(m.status, m.step) for m in notifier.messages] == [("firing", 0), ("resolved", 1)]
    assert sink.suppressed == 1
    now[0] = 500.0
    sink.write(nan_record(4, 2))
    assert [(m.status, m.step) for m in notifier.messages][-1] == ("firing", 4)
    # No runbooks page hosted: no link, the runbook's advice in the message itself.
    assert notifier.messages[-1].runbook_url == "" and "runbook:" not in notifier.messages[-1].text
    assert "Check first: `rewards/nan_count`" in notifier.messages[-1].text
    hosted = AlertSink([notifier], runbook_base="https://wiki.example.test/rb")
    hosted.write(nan_record(0, 3))
    assert notifier.messages[-1].runbook_url == "https://wiki.example.test/rb#advmonnonfiniterewards"
    assert "runbook: https://wiki.example.test/rb#advmonnonfiniterewards" in notifier.messages[-1].text


def test_alert_sink_keeps_messages_when_a_notifier_fails_and_never_evaluates_twice():
    notifier = Collect(failures=2)
    sink = AlertSink([notifier])
    record = nan_record(0, 1)
    for _ in range(2):  # the delivery retries the same record
        with pytest.raises(ConnectionError):
            sink.write(record)
    sink.write(record)
    assert [(m.status, m.step) for m in notifier.messages] == [("firing", 0)]
    sink.write(nan_record(1, 0))
    assert [(m.status, m.step) for m in notifier.messages] == [("firing", 0), ("resolved", 1)]


def test_thresholds_reach_the_in_process_rules():
    records = [Record("r", s, 0.0, "e", None, {"groups/zero_std_fraction": 0.7}) for s in range(5)]
    assert evaluate_records(records) == []
    tuned = evaluate_records(records, Thresholds.with_overrides({"zero_std_ratio": 0.6}))
    assert [(o.alert, o.fired_step, o.resolved_step) for o in tuned] == [("AdvmonZeroStdGroupsHigh", 2, None)]
    assert not math.isnan(tuned[0].value)


def test_wandb_alert_lands_in_the_offline_run_file(tmp_path, monkeypatch):
    from tests.test_wandb import run_file
    from advmon.runs.wandb_file import read_records

    wandb = require_module("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="advmon-alerts", dir=str(tmp_path))
    try:
        with advmon_monitor("wandb-alerts", alerts=["wandb-alert"]) as monitor:
            for step, nan in enumerate([0, 3, 0]):
                monitor.observe(rewards=rewards_with_nan(nan), group_size=4)
    finally:
        run.finish()
    alerts = [r.alert for r in read_records(run_file(tmp_path)) if r.WhichOneof("record_type") == "alert"]
    assert [a.title for a in alerts] == [
        "[FIRING] AdvmonNonFiniteRewards on run wandb-alerts",
        "[RESOLVED] AdvmonNonFiniteRewards on run wandb-alerts",
    ]
    assert "Run wandb-alerts: 3 NaN/Inf rewards at step 1." in alerts[0].text
    assert alerts[0].level == "ERROR"


def advmon_monitor(run: str, **kwargs):
    import advmon

    return advmon.Monitor(run, sinks=[], **kwargs)


def rewards_with_nan(nan: int):
    import torch

    rewards = torch.tensor([0.0, 1.0, 1.0, 0.0] * 2)
    rewards[:nan] = float("nan")
    return rewards


def test_a_dead_webhook_warns_without_the_secret(tmp_path, monkeypatch, capfd):
    import warnings

    from tests.services import free_port

    secret_url = f"http://127.0.0.1:{free_port()}/services/T0/B0/very-secret-token"
    webhook_file = tmp_path / "webhook"
    webhook_file.write_text(secret_url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = advmon_monitor("dead-hook", alerts=[f"slack:{webhook_file}"], retries=1)
        monitor.observe(rewards=rewards_with_nan(2), group_size=4)
        monitor.close()
        text = repr(monitor) + repr(monitor.sinks) + "".join(str(w.message) for w in caught)
    out, err = capfd.readouterr()
    assert "very-secret-token" not in text + out + err
    # Read after close(), the record counts every failure so far (issue 38, item 11; it said 0 until a next record).
    assert monitor.last_metrics["advmon/sink_errors/alerts-slack"] == 1
    assert any("alerts-slack" in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_slack_spec_refuses_a_url_and_a_missing_source(monkeypatch):
    from advmon.errors import AdvmonConfigError

    with pytest.raises(AdvmonConfigError, match="not the URL itself"):
        advmon_monitor("x", alerts=["slack:https://hooks.slack.com/services/T/B/secret"])
    monkeypatch.delenv("NO_SUCH_WEBHOOK_VAR", raising=False)
    with pytest.raises(AdvmonConfigError, match="neither a file nor a set environment variable"):
        advmon_monitor("x", alerts=["slack:NO_SUCH_WEBHOOK_VAR"])


def test_in_process_dashboard_links_open_on_the_firing_record():
    """Issue 19: the link centres the board on the moment the alert fired, not on the last hours."""
    from advmon.alerts.notifiers import SlackNotifier

    notifier = Collect()
    sink = AlertSink([notifier], dashboard_url="https://grafana.example.test/d/advmon-health")
    for step, nan in enumerate([0, 0, 3]):
        sink.write(Record("run-a", step, 1_764_870_000.0 + 60 * step, "e", None, {"rewards/nan_count": float(nan)}))
    (message,) = [m for m in notifier.messages if m.status == "firing"]
    fired_ms = int((1_764_870_000.0 + 120) * 1000)
    expected = f"https://grafana.example.test/d/advmon-health?var-run=run-a&time={fired_ms}&time.window=3600000"
    assert message.dashboard_link == expected and f"Dashboard: {expected}" in message.text
    payload = SlackNotifier.__new__(SlackNotifier).payload(message)
    assert payload["attachments"][0]["title_link"] == expected


@pytest.mark.parametrize("declared", ["batch", None, "group_std"])
def test_batch_whitened_groups_are_recorded_and_judged_by_the_declared_kind(declared):
    """REINFORCE++-style whitening over the batch with groups of 2: one |A| of about 8 is a Gaussian tail,
    not a broken normalization (the bound 3 x 2/sqrt(1) = 6 is for advantages normalized within groups).
    Declared ``batch`` or inferred, it is quiet; declared ``group_std`` it fires, and the monitor says once
    that the data look whitened over the batch."""
    import warnings

    import advmon
    import torch

    from advmon.errors import AdvmonWarning

    from .conftest import ListSink
    from .reference import group_stats

    rng = np.random.default_rng(7)
    rewards = rng.normal(0.0, 1.0, 512)
    rewards[:64] = 0.5  # 32 groups of two equal rewards: zero-std groups, recorded either way
    rewards[300] = 9.0  # whitened: about 8 standard deviations
    advantages = torch.from_numpy((rewards - rewards.mean()) / rewards.std())
    assert 6.5 < float(advantages.abs().max()) < 10
    keys = [i // 2 for i in range(512)]
    sink = ListSink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AdvmonWarning)
        with advmon.Monitor(f"declared-{declared}", sinks=[sink]) as monitor:

            @monitor.watch(groups=None, group_size=2, normalization=declared)
            def compute_advantage(rewards, mask=None):
                return advantages

            for step in range(3):
                with monitor.step(step):
                    compute_advantage(torch.from_numpy(rewards))
    record = sink.records[-1]
    for key, value in group_stats(rewards, keys).items():  # the groups are there all the same
        assert record.metrics[key] == pytest.approx(value, nan_ok=True), key
    normalized = declared == "group_std"
    assert (record.normalization, record.normalization_observed) == (declared or "batch", "batch")
    assert record.normalization_source == ("declared" if declared else "inferred")
    assert record.metrics["groups/bound_size"] == (2.0 if normalized else 0.0)
    reasons = {entry["reason"] for entry in record.exemplars}
    assert ("beyond_bound" in reasons) == normalized
    fired = {o.alert for o in evaluate_records(sink.records)}
    assert ("AdvmonAdvantageBeyondBound" in fired) == normalized, fired
    contradictions = [str(w.message) for w in caught if "declares normalization" in str(w.message)]
    assert len(contradictions) == (1 if normalized else 0), contradictions  # said once, not every step
    if normalized:
        assert "'group_std'" in contradictions[0] and "look 'batch'" in contradictions[0]


def test_normalization_is_read_from_advmon_instrument():
    from advmon.config.environment import parse_targets
    from advmon.errors import AdvmonConfigError

    target, raw, plain = parse_targets(
        "my.module:Reinforce(normalization=batch); my.module:ReMax(normalization=none); my.module:GRPO")
    assert (target.names.normalization, raw.names.normalization, plain.names.normalization) == ("batch", "none", None)
    assert parse_targets(target.spec) == [target]  # how a Ray worker receives it
    with pytest.raises(AdvmonConfigError, match="unknown normalization 'maybe'; expected one of group_std"):
        parse_targets("my.module:Reinforce(normalization=maybe)")
    with pytest.raises(AdvmonConfigError, match="expected .* or normalization=, got 'group_normalized=false'"):
        parse_targets("my.module:Reinforce(group_normalized=false)")
    # A function of the call's arguments travels as module:function (how a Ray worker gets NeMo-RL's classes).
    from advmon.config.environment import Target
    from advmon.hooks import ArgumentNames
    from advmon.integrations.nemo_rl import ESTIMATORS, grpo_normalization

    carried = Target("nemo_rl.algorithms.advantage_estimator", "GRPOAdvantageEstimator", "compute_advantage",
                     ESTIMATORS["GRPOAdvantageEstimator"])
    assert "normalization=advmon.integrations.nemo_rl:grpo_normalization" in carried.spec
    [back] = parse_targets(carried.spec)
    assert back.names.normalization is grpo_normalization
    with pytest.raises(AdvmonConfigError, match="cannot reach other processes"):
        Target("m", "C", "compute_advantage", ArgumentNames(normalization=lambda arguments: "batch")).spec


def test_nemo_rl_reinforce_plus_plus_records_its_groups_without_the_group_bound():
    """NeMo-RL's Reinforce++ subtracts a per-prompt mean, then normalizes globally across valid tokens."""
    import types

    import advmon
    import torch

    import advmon.integrations.nemo_rl as advmon_nemo

    from .conftest import ListSink

    class ReinforcePlusPlusAdvantageEstimator:
        def compute_advantage(self, prompt_ids, rewards, mask, **kwargs):
            means = torch.stack([rewards[prompt_ids == p].mean() for p in prompt_ids])
            advantages = (rewards - means).unsqueeze(-1) * mask
            valid = advantages[mask > 0]
            return (advantages - valid.mean()) / valid.std() * mask

    sink = ListSink()
    monitor = advmon.Monitor("nemo-reinforce", sinks=[sink])
    advmon_nemo.instrument(monitor, module=types.SimpleNamespace(
        ReinforcePlusPlusAdvantageEstimator=ReinforcePlusPlusAdvantageEstimator))
    prompts = torch.arange(16).repeat_interleave(4)
    rewards = torch.from_numpy(np.random.default_rng(3).integers(0, 2, 64).astype(np.float32))
    ReinforcePlusPlusAdvantageEstimator().compute_advantage(prompts, rewards, torch.ones(64, 5))
    monitor.close()
    metrics = sink.records[-1].metrics
    assert metrics["groups/count"] == 16 and metrics["groups/max_size"] == 4
    assert metrics["groups/bound_size"] == 0.0

"""End to end: advmon exporters -> real Prometheus with the generated rules -> real
Alertmanager with the generated config -> a local stand-in for Slack.

And the in-process path (no Prometheus) against the same stand-in.
"""

from __future__ import annotations

import math
import re
import time

import numpy as np
import pytest
import torch

import advmon
from advmon.alerts import AlertmanagerSettings, AlertSettings, generate
from advmon.sinks.prometheus import PrometheusSink
from tests.services import FakeSlack, start_alertmanager, start_prometheus, wait_for

pytestmark = pytest.mark.integration

GROUP = 8
RUNBOOKS = "https://runbooks.example.test/advmon.md"
DASHBOARD = "http://127.0.0.1:3000/d/advmon-health"


def grpo_step(monitor: advmon.Monitor, rng: np.random.Generator, nan_rewards: int = 0) -> None:
    """One GRPO step observed by the monitor: binary rewards, group-normalized advantages."""
    rewards = (rng.random(64) < 0.5).astype(np.float32)
    rewards[:nan_rewards] = np.nan
    groups = rewards.reshape(-1, GROUP)
    std = np.nanstd(groups, axis=1, ddof=1, keepdims=True)
    advantages = (groups - np.nanmean(groups, axis=1, keepdims=True)) / (std + 1e-6)
    mask = torch.ones(64, 16)
    adv = torch.from_numpy(advantages.reshape(-1, 1).astype(np.float32)).expand(64, 16)
    monitor.observe(rewards=torch.from_numpy(rewards), advantages=adv, mask=mask, group_size=GROUP)


def slack_alerts(slack: FakeSlack) -> list[dict]:
    return [post["json"] for post in slack.posts]


def test_unstable_run_reaches_slack_and_resolves_stable_run_stays_quiet(tmp_path):
    slack = FakeSlack()
    webhook_file = tmp_path / "slack-webhook-url"
    webhook_file.write_text(slack.url + "\n")
    settings = AlertSettings(interval_seconds=1.0, runbook_base=RUNBOOKS, dashboard_url=DASHBOARD)
    routing = AlertmanagerSettings(
        webhook_file=str(webhook_file), dashboard_url=DASHBOARD, group_wait=1, group_interval=1, repeat_interval=3600
    )
    generate(tmp_path / "alerts", settings, routing)
    assert slack.url not in "".join(p.read_text() for p in (tmp_path / "alerts").rglob("*.yml"))

    stable = advmon.Monitor("stable-run", sinks=[PrometheusSink(port=0)])
    unstable = advmon.Monitor("unstable-run", sinks=[PrometheusSink(port=0)])
    targets = {f"grpo-{m.run}": f"127.0.0.1:{m.sinks[0].port}" for m in (stable, unstable)}
    alertmanager, am_url = start_alertmanager(tmp_path, tmp_path / "alerts" / "alertmanager.yml")
    prometheus, prometheus_url = start_prometheus(
        tmp_path, targets, rule_files=[tmp_path / "alerts" / "advmon-rules.yml"], alertmanager=am_url.removeprefix("http://")
    )
    rng = np.random.default_rng(0)
    wall_started = time.time()
    failing_steps = []  # the steps the test gave NaN rewards
    hang_guard = 60  # steps, each at least one scrape (1 s) apart; the test needs a handful
    try:
        step = 0

        def tick(nan_rewards: int = 0) -> None:
            """One step of both runs; the next waits until Prometheus has scraped it (each scrape sees one new step)."""
            nonlocal step
            with stable.step(step):
                grpo_step(stable, rng)
            with unstable.step(step):
                grpo_step(unstable, rng, nan_rewards)
            if nan_rewards:
                failing_steps.append(step)
            wanted = {m.run: float(step) for m in (stable, unstable)}
            wait_for(lambda: scraped_steps(prometheus_url) == wanted, 30, f"Prometheus to scrape step {step}")
            step += 1

        # Counters are scraped at 0 before anything happens (Prometheus needs a few seconds).
        wait_for(lambda: prometheus_has_targets(prometheus, targets), 20, "the first scrapes")
        for _ in range(3):
            tick()

        def firing() -> bool:
            return any("[FIRING] AdvmonNonFiniteRewards" in a["attachments"][0]["title"] for a in slack_alerts(slack))

        while not firing():  # the reward function fails until the alert reaches Slack ...
            assert len(failing_steps) < hang_guard, f"no firing message: {slack_alerts(slack)}"
            tick(nan_rewards=3)

        def resolved() -> bool:
            return any(
                "[RESOLVED] AdvmonNonFiniteRewards" in a["attachments"][0]["title"] for a in slack_alerts(slack)
            )

        for _ in range(hang_guard):
            if resolved():
                break
            tick()  # ... and recovers (each alert resolves on its own; wait for this one)
        assert resolved(), f"no resolved message: {slack_alerts(slack)}"
    finally:
        prometheus.stop()
        alertmanager.stop()
        stable.close()
        unstable.close()
        slack.stop()

    messages = slack_alerts(slack)
    assert all("on run stable-run" not in m["attachments"][0]["title"] for m in messages), messages
    nonfinite = [m for m in messages if "AdvmonNonFiniteRewards" in m["attachments"][0]["title"]]
    assert any("[FIRING]" in m["attachments"][0]["title"] for m in nonfinite)
    assert any("[RESOLVED]" in m["attachments"][0]["title"] for m in nonfinite)
    first = nonfinite[0]
    assert first["username"] == "advmon"
    attachment = first["attachments"][0]
    assert "[FIRING]" in attachment["title"] and "unstable-run" in attachment["title"]
    # The link opens the board on the alert's start (Alertmanager's .StartsAt), an hour around it.
    link = re.fullmatch(re.escape(f"{DASHBOARD}?var-run=unstable-run&time=") + r"(\d+)&time\.window=3600000",
                        attachment["title_link"])
    assert link and wall_started * 1000 <= int(link.group(1)) <= time.time() * 1000, attachment["title_link"]
    assert attachment["title_link"] in attachment["text"]  # the same link under the alert's text
    assert "NaN or Inf rewards: the reward function is failing" in attachment["text"]
    assert f"{RUNBOOKS}#advmonnonfiniterewards" in attachment["text"]
    # The description names the run, the value and the step of the scrape that fired it. The rule fires
    # where a scrape's counter rose over the one before, and no scrape saw two new steps: so the step is
    # one the test failed, not one before the first failing step was written nor one after the last step
    # written by the time the message arrived (the test failed every step until then); the value is
    # what failing steps of 3 NaN each add up to.
    found = re.search(r"Run unstable-run: (\d+) NaN/Inf rewards at step (\d+)\.", attachment["text"])
    assert found, attachment["text"]
    value, fired_step = int(found.group(1)), int(found.group(2))
    assert fired_step in failing_steps, (fired_step, failing_steps)
    assert value >= 3 and value % 3 == 0, value


def scraped_steps(url: str) -> dict[str, float]:
    """Each run's ``advmon_step`` in Prometheus's latest scrape."""
    import json

    from tests.services import http_get

    data = json.loads(http_get(f"{url}/api/v1/query?query=advmon_step"))
    return {series["metric"]["run"]: float(series["value"][1]) for series in data["data"]["result"]}


def prometheus_has_targets(prometheus, targets) -> bool:
    import json
    import re

    from tests.services import http_get

    log = prometheus.log_path.read_text()
    url = re.search(r"127\.0\.0\.1:\d+", " ".join(prometheus.process.args)).group(0)
    data = json.loads(http_get(f"http://{url}/api/v1/query?query=advmon_updates_total"))
    return len(data["data"]["result"]) == len(targets) and "error" not in log.lower()[-200:]


def test_in_process_slack_alerts_fire_resolve_and_rate_limit(tmp_path, monkeypatch):
    slack = FakeSlack()
    monkeypatch.setenv("ADVMON_TEST_SLACK", slack.url)
    rng = np.random.default_rng(1)
    try:
        with advmon.Monitor("inproc-run", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl")], alerts=["slack:ADVMON_TEST_SLACK"]) as monitor:
            assert slack.url not in repr(monitor.sinks) and "ADVMON_TEST_SLACK" in repr(monitor.sinks)
            pattern = [0, 0, 2, 2, 0, 0, 2, 0]  # fires, resolves, fires again inside the rate limit
            for step, nan in enumerate(pattern):
                with monitor.step(step):
                    grpo_step(monitor, rng, nan)
        messages = slack_alerts(slack)
    finally:
        slack.stop()
    titles = [m["attachments"][0]["title"] for m in messages if "AdvmonNonFiniteRewards" in m["attachments"][0]["title"]]
    assert len(titles) == 2, titles  # one firing, one resolved; the second firing is rate-limited
    assert "[FIRING] AdvmonNonFiniteRewards on run inproc-run" in titles[0]
    assert "[RESOLVED]" in titles[1]
    text = messages[0]["attachments"][0]["text"]
    assert "Run inproc-run: 2 NaN/Inf rewards at step 2." in text
    assert "Check first: `rewards/nan_count`" in text and "runbook:" not in text  # advice arrives without a link
    # Same steps as the recorded run evaluated offline.
    from advmon.alerts.evaluator import evaluate_records

    offline = [o for o in evaluate_records(advmon.read_jsonl(tmp_path / "r.jsonl")) if o.alert == "AdvmonNonFiniteRewards"]
    assert [(o.fired_step, o.resolved_step) for o in offline] == [(2, 4), (6, 7)]
    assert not math.isnan(offline[0].value)

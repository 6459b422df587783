"""Many nodes, end to end: advmon endpoints on 4 node processes -> a Prometheus agent per node -> remote write ->
a central Prometheus with the generated rules -> Alertmanager with the generated routing -> a stand-in for Slack.

The agents' and the central's configurations are docs/fleet.md's YAML blocks and command lines, read from the
page; the test changes only addresses, file paths and intervals (``adapted`` says which, and fails when the page
no longer has one of them), so the page cannot drift from what runs here.

20 runs: 19 on one node each, and run-19 over 4 ranks, one per node (each rank records, ``all_ranks=True``, under
the same ``run``; the agents tell them apart by ``instance`` and ``node``). run-07's reward function fails: one
firing message, naming run-07; then all 4 ranks of run-19 fail at once: one firing message that lists 4 alerts.
No other run ever raises an alert, pending or firing, on the central Prometheus.
"""

from __future__ import annotations

import copy
import json
import os
import re
import select
import shlex
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from advmon.alerts import AlertmanagerSettings, AlertSettings, generate
from tests.doc_blocks import ROOT, blocks
from tests.services import (
    FakeSlack,
    http_get,
    require_binary,
    start_alertmanager,
    start_prometheus_with,
    wait_for,
)

pytestmark = pytest.mark.integration

FLEET_DOC = ROOT / "docs" / "fleet.md"
NODES = 4
RUNS = [f"run-{i:02d}" for i in range(20)]
WIDE = "run-19"  # over NODES ranks, one per node
FAULTY = "run-07"
#: Rule interval: scrapes and the agents' sends are 1 s apart, so a rise arrives well inside it (docs/fleet.md).
RULE_INTERVAL = 5.0
HANG_GUARD = 120  # seconds: a node imports torch, a busy machine takes its time; the test needs far less


def doc_yaml(name: str) -> dict:
    """The YAML block of docs/fleet.md whose first line is ``# <name>``."""
    found = [b for b in blocks(FLEET_DOC, "yaml") if b.text.startswith(f"# {name}\n")]
    assert len(found) == 1, f"docs/fleet.md has {len(found)} yaml blocks headed '# {name}'"
    return yaml.safe_load(found[0].text)


def doc_flags(config_file: str) -> list[str]:
    """The flags of the page's ``prometheus --config.file=<config_file> ...`` line, less those naming a path or
    an address (the test gives its own)."""
    lines = [line for b in blocks(FLEET_DOC, "sh") for line in re.sub(r"\\\n", " ", b.text).splitlines()]
    (line,) = [line for line in lines if line.startswith("prometheus ") and f"--config.file={config_file}" in line]
    own = ("--config.file=", "--storage.tsdb.path=", "--storage.agent.path=", "--web.listen-address=")
    return [flag for flag in shlex.split(line)[1:] if not flag.startswith(own)]


def adapted(config: dict, changes: dict[str, object]) -> dict:
    """``config`` with the values at dotted paths (``remote_write.0.url``) replaced; each path must exist."""
    config = copy.deepcopy(config)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = config
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        key = int(last) if isinstance(node, list) else last
        assert isinstance(node, list) or key in node, f"docs/fleet.md's config has no {path}"
        node[key] = value
    return config


class Node:
    """A node process (tests/fleet_node.py) running some runs' trainers, each with its scrape endpoint."""

    def __init__(self, name: str, runs: list[str], workdir: Path) -> None:
        self.name = name
        workdir.mkdir()
        self._log = open(workdir / "node.log", "w")
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.fleet_node", *runs], cwd=workdir, env=environment, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
        )
        self.log_path = workdir / "node.log"
        self.ports: dict[str, int] = {}

    def started(self) -> dict[str, int]:
        self.ports = json.loads(self._line())
        return self.ports

    def _line(self) -> str:
        ready, _, _ = select.select([self.process.stdout], [], [], HANG_GUARD)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"{self.name} answered nothing:\n{self.log_path.read_text()[-3000:]}"
        return line

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        assert self._line().strip() == "ok", command

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.send("quit")
                self.process.wait(30)
            except (AssertionError, OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def query(url: str, promql: str) -> list[dict]:
    data = json.loads(http_get(f"{url}/api/v1/query?query={urllib.parse.quote(promql)}"))
    assert data["status"] == "success", data
    return data["data"]["result"]


def titles(slack: FakeSlack, status: str, run: str | None = None) -> list[str]:
    """The titles of the Slack messages of a status (FIRING, RESOLVED), of one run or all."""
    found = [post["json"]["attachments"][0]["title"] for post in list(slack.posts)]
    return [t for t in found if f"[{status}]" in t and (run is None or t.endswith(f" on run {run}"))]


def at_alertmanager(url: str, run: str) -> list[dict]:
    """The active alerts Alertmanager holds for a run."""
    matcher = urllib.parse.quote(f'run="{run}"')
    return json.loads(http_get(f"{url}/api/v2/alerts?filter={matcher}&active=true"))


def wide_steps(url: str) -> list[float]:
    """The step each rank of the wide run last reported, as the central Prometheus has it."""
    return [float(found["value"][1]) for found in query(url, f'advmon_step{{run="{WIDE}"}}')]


def test_one_faulty_run_of_twenty_pages_once_and_a_run_over_four_ranks_pages_once(tmp_path):
    require_binary("prometheus")
    slack = FakeSlack()
    webhook = tmp_path / "slack-webhook-url"
    webhook.write_text(slack.url + "\n")
    # The generated routing as shipped (group by alertname and run, group_wait 10 s), but for group_interval:
    # 5 s, so that the resolved message the test waits for comes soon.
    generate(tmp_path / "alerts", AlertSettings(interval_seconds=RULE_INTERVAL),
             AlertmanagerSettings(webhook_file=str(webhook), group_interval=5, repeat_interval=3600))
    placement = {f"node-{k + 1:02d}": [run for i, run in enumerate(RUNS[:-1]) if i % NODES == k] + [WIDE]
                 for k in range(NODES)}
    services, nodes = [], [Node(name, runs, tmp_path / name) for name, runs in placement.items()]
    try:
        for node in nodes:
            node.started()
        alertmanager, am_url = start_alertmanager(tmp_path, tmp_path / "alerts" / "alertmanager.yml")
        services.append(alertmanager)
        central_config = tmp_path / "central.yml"
        central_config.write_text(yaml.safe_dump(adapted(doc_yaml("central.yml"), {
            "rule_files": [str(tmp_path / "alerts" / "advmon-rules.yml")],
            "alerting.alertmanagers.0.static_configs.0.targets": [am_url.removeprefix("http://")],
        })))
        central_flags = doc_flags("central.yml")
        assert "--web.enable-remote-write-receiver" in central_flags
        central, central_url = start_prometheus_with(tmp_path, central_config, "central", central_flags)
        services.append(central)
        agent_doc, agent_flags = doc_yaml("agent.yml"), doc_flags("agent.yml")
        assert "--enable-feature=agent" in agent_flags
        write_path = urllib.parse.urlsplit(agent_doc["remote_write"][0]["url"]).path
        assert write_path == "/api/v1/write"  # the receiver's path: the page must not drift from it
        for node in nodes:
            config = tmp_path / f"agent-{node.name}.yml"
            config.write_text(yaml.safe_dump(adapted(agent_doc, {
                "global.scrape_interval": "1s",
                "scrape_configs.0.static_configs.0.targets": [f"127.0.0.1:{port}" for port in node.ports.values()],
                "scrape_configs.0.static_configs.0.labels.node": node.name,
                "remote_write.0.url": central_url + write_path,
                "remote_write.0.queue_config.batch_send_deadline": "1s",
            })))
            agent, _ = start_prometheus_with(tmp_path, config, f"agent-{node.name}", agent_flags)
            services.append(agent)

        def every_endpoint_arrived() -> bool:
            steps = query(central_url, "advmon_step")
            return len(steps) == len(RUNS) - 1 + NODES and {s["metric"]["run"] for s in steps} == set(RUNS)

        wait_for(every_endpoint_arrived, HANG_GUARD, "every run's series on the central Prometheus")
        ranks = query(central_url, f'advmon_step{{run="{WIDE}"}}')
        assert sorted(s["metric"]["node"] for s in ranks) == sorted(placement)  # one rank per node

        # One run's reward function fails, until its page is out; then it recovers and the page resolves.
        (home,) = [node for node in nodes if FAULTY in node.ports]
        home.send(f"fault {FAULTY}")
        wait_for(lambda: titles(slack, "FIRING", FAULTY), HANG_GUARD, f"a firing message for {FAULTY}")
        home.send(f"heal {FAULTY}")
        wait_for(lambda: titles(slack, "RESOLVED", FAULTY), HANG_GUARD, f"a resolved message for {FAULTY}")

        # Every rank of the wide run fails at once and goes on failing: its alerts, one per rank, go out as one
        # message, and no other follows while they fire. (Its ranks would recover at different scrapes, each
        # recovery an update of the group's message: docs/fleet.md says so; the test does not heal them.)
        for node in nodes:
            node.send(f"fault {WIDE}")
        wait_for(lambda: titles(slack, "FIRING", WIDE), HANG_GUARD, f"a firing message for {WIDE}")
        first = at_alertmanager(am_url, WIDE)
        # 15 more failing steps, a second at least each: 3 of the route's group intervals (5 s), 3 rule evaluations.
        paged_at = max(wide_steps(central_url))
        wait_for(lambda: min(wide_steps(central_url)) >= paged_at + 15, HANG_GUARD, "15 more steps of the wide run")
        alertmanager_now = {a["fingerprint"]: a["startsAt"] for a in at_alertmanager(am_url, WIDE)}
        alerted = query(central_url, "count by (alertname, run) (count_over_time(ALERTS[1h]))")
        # What Slack holds now: stopping the nodes below ends the wide run's ranks one by one, and each end
        # is an update of its group (docs/fleet.md), which is not what this test is about.
        posts = [post["json"]["attachments"][0] for post in list(slack.posts)]
    finally:
        for node in nodes:
            node.stop()
        for service in reversed(services):
            service.stop()
        slack.stop()

    firing = [post for post in posts if "[FIRING]" in post["title"]]
    resolved = [post for post in posts if "[RESOLVED]" in post["title"]]
    assert [a["title"].split("] ", 1)[1] for a in firing] == [
        f"AdvmonNonFiniteRewards on run {FAULTY}", f"AdvmonNonFiniteRewards on run {WIDE}"], firing
    faulty, wide = firing
    assert faulty["text"].count("Run: `") == faulty["text"].count(f"Run: `{FAULTY}`") == 1, faulty["text"]
    # One message for the run, listing the alert of each of its ranks: the route groups by alertname and run.
    assert wide["text"].count(f"Run: `{WIDE}`") == NODES, wide["text"]
    assert sorted(a["labels"]["node"] for a in first) == sorted(placement), first
    assert len({a["labels"]["instance"] for a in first}) == NODES
    assert {a["labels"]["alertname"] for a in first} == {"AdvmonNonFiniteRewards"}
    # 15 steps later, the same 4 alerts still active, and no second message above: nothing new was paged.
    assert alertmanager_now == {a["fingerprint"]: a["startsAt"] for a in first}
    assert [a["title"] for a in resolved] == [f":white_check_mark: [RESOLVED] AdvmonNonFiniteRewards on run {FAULTY}"]
    # The other 18 runs raised nothing, not even a pending alert, on the central Prometheus.
    assert {(a["metric"]["alertname"], a["metric"]["run"]) for a in alerted} == {
        ("AdvmonNonFiniteRewards", FAULTY), ("AdvmonNonFiniteRewards", WIDE)}, alerted

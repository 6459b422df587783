"""A run's state on a real Prometheus, on both delivery paths: running, finished, crashed and hung.

Real trainer processes (each with two monitors: one scraped, one pushing to a real
Pushgateway) are closed, SIGKILLed, left alive without records, or die of an uncaught
exception; a real Prometheus evaluates the generated rules. Each run must end in its own
state, and a finished or running run must never have fired anything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from advmon.alerts import AlertmanagerSettings, AlertSettings, generate
from advmon.rules import Thresholds
from tests.services import http_get, start_prometheus, start_pushgateway, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

#: A trainer: a scraped and a pushed monitor, a step every 0.2 s until told "stop" on stdin; then what its
#: behaviour says. It prints its endpoint's port first.
TRAINER = r'''
import sys, threading, time
import torch
import advmon
from advmon.sinks.prometheus import PrometheusSink, PushgatewaySink

name, behaviour, gateway, folder = sys.argv[1:5]
scraped = advmon.Monitor(f"{name}-scraped", sinks=[advmon.JsonlSink(f"{folder}/{name}-scraped.jsonl"),
                                                   PrometheusSink(port=0, finish_timeout=60)])
pushed = advmon.Monitor(f"{name}-pushed", sinks=[advmon.JsonlSink(f"{folder}/{name}-pushed.jsonl"),
                                                 PushgatewaySink(gateway, heartbeat_seconds=1)])
print(scraped.sinks[1].port, flush=True)
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
step = 0
while not stop.is_set() or behaviour == "running":
    for monitor in (scraped, pushed):
        with monitor.step(step):
            monitor.observe(rewards=torch.tensor([1.0, 0.0, 0.5, 0.25]), group_size=2)
    step += 1
    time.sleep(0.2)
if behaviour == "finishes":
    scraped.close()
    pushed.close()
    print("closed", flush=True)
elif behaviour == "hangs":
    print("hanging", flush=True)
    time.sleep(600)  # a hang guard: the test kills it
elif behaviour == "raises":
    raise RuntimeError("CUDA error: an illegal memory access was encountered")  # no close: exit closes them
elif behaviour == "unwinds":  # the loop's own error closes both monitors; the process itself ends cleanly
    try:
        with scraped, pushed:
            raise FloatingPointError("loss is NaN")
    except FloatingPointError:
        print("unwound", flush=True)
'''

BEHAVIOURS = ("running", "finishes", "killed", "hangs", "raises", "unwinds")
EXPECTED = {  # run prefix -> (state, the alert it must fire or None)
    "running": ("running", None),
    "finishes": ("finished", None),
    "killed": ("crashed", "AdvmonRunCrashed"),
    "hangs": ("hung", "AdvmonRunHung"),
    "raises": ("crashed", "AdvmonRunCrashed"),
    # Closed by an exception, not finished: the Pushgateway sink closes on a thread of its own, so the monitor
    # tells it (run_failed) what it saw on the closing thread.
    "unwinds": ("crashed", "AdvmonRunCrashed"),
}


def query(url: str, promql: str) -> list[dict]:
    data = json.loads(http_get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10))
    assert data["status"] == "success", data
    return data["data"]["result"]


def runs_of(url: str, promql: str) -> set[str]:
    return {series["metric"]["run"] for series in query(url, promql)}


def test_four_states_on_both_paths_on_a_real_prometheus(tmp_path):
    thresholds = Thresholds.with_overrides({"stale_seconds": 4, "silent_seconds": 4, "crash_memory_seconds": 600})
    generate(tmp_path / "alerts", AlertSettings(thresholds=thresholds, interval_seconds=1.0), AlertmanagerSettings())
    gateway, gateway_url = start_pushgateway(tmp_path)
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ADVMON_")}, "PYTHONPATH": str(ROOT)}
    trainers: dict[str, subprocess.Popen] = {}
    prometheus = None
    try:
        for behaviour in BEHAVIOURS:
            trainers[behaviour] = subprocess.Popen(
                [sys.executable, str(script), behaviour, behaviour, gateway_url, str(tmp_path)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        ports = {behaviour: int(process.stdout.readline()) for behaviour, process in trainers.items()}
        targets = {f"trainer-{b}": f"127.0.0.1:{port}" for b, port in ports.items()}
        targets["pushgateway"] = gateway_url.removeprefix("http://")
        prometheus, url = start_prometheus(tmp_path, targets, honor_labels=True,
                                           rule_files=[tmp_path / "alerts" / "advmon-rules.yml"])
        every_run = {f"{b}-{path}" for b in BEHAVIOURS for path in ("scraped", "pushed")}
        # A hang guard of 90 s: Prometheus scrapes new targets within ~5 s.
        wait_for(lambda: runs_of(url, "advmon_run_finished == 0 and on (job, instance, run) advmon_step") == every_run,
                 90, "every run to be scraped while running")
        for behaviour, process in trainers.items():
            if behaviour == "killed":
                process.send_signal(signal.SIGKILL)
            elif behaviour != "running":
                process.stdin.write("stop\n")
                process.stdin.flush()
        assert trainers["finishes"].stdout.readline().strip() == "closed"
        assert trainers["finishes"].wait(60) == 0  # a hang guard: it waits for one scrape, ~1 s here
        assert trainers["raises"].wait(60) != 0
        assert "illegal memory access" in trainers["raises"].stderr.read()
        assert trainers["unwinds"].stdout.readline().strip() == "unwound"
        assert trainers["unwinds"].wait(60) == 0
        assert trainers["hangs"].stdout.readline().strip() == "hanging"

        def fired(alert: str) -> set[str]:
            return runs_of(url, f'ALERTS{{alertname="{alert}",alertstate="firing"}}')

        want = {alert: {f"{b}-{path}" for b, (_, a) in EXPECTED.items() if a == alert for path in ("scraped", "pushed")}
                for alert in ("AdvmonRunCrashed", "AdvmonRunHung")}
        # A hang guard of 90 s: each alert needs its 4 s threshold and a few 1 s evaluations.
        wait_for(lambda: all(fired(alert) == runs for alert, runs in want.items()), 90,
                 f"the crashed and hung runs to fire: {want}")
        finished = runs_of(url, "last_over_time(advmon_run_finished[10m]) == 1")
        assert finished == {"finishes-scraped", "finishes-pushed"}
        # The finished Pushgateway group stays, marked; the finished endpoint is gone.
        assert runs_of(url, "advmon_run_finished") >= {"finishes-pushed"}
        assert "finishes-scraped" not in runs_of(url, "advmon_run_finished")
        running = runs_of(url, "advmon_run_finished == 0 and on (job, instance, run) "
                               "(time() - advmon_last_update_timestamp_seconds < 4)")
        assert running == {"running-scraped", "running-pushed"}
        # Nothing ever fired (nor was pending) for a finished or a running run, on either path.
        assert query(url, 'count_over_time(ALERTS{run=~"(finishes|running)-.*"}[10m])') == []
        assert fired("AdvmonRunCrashed") & fired("AdvmonRunHung") == set()
    finally:
        for process in trainers.values():
            if process.poll() is None:
                process.kill()
            process.wait(10)
            for stream in (process.stdin, process.stdout, process.stderr):
                stream.close()
        if prometheus is not None:
            prometheus.stop()
        gateway.stop()

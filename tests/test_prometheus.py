"""The Prometheus sinks against prometheus-client, promtool, a real Prometheus and Pushgateway."""

from __future__ import annotations

import json
import math
import subprocess
import urllib.parse

import pytest
import torch

import advmon
from advmon.sinks.prometheus import PrometheusSink, PushgatewaySink

from .estimators import GRPOLikeEstimator
from .services import free_port, http_get, require_binary, start_prometheus, start_pushgateway, wait_for
from .test_monitor import grpo_batch

pytestmark = pytest.mark.integration


def run_steps(monitor, steps=3, nan_rewards=2):
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    for step in range(steps):
        prompts, rewards, mask = grpo_batch(seed=step, nan_rewards=nan_rewards)
        with monitor.step(step):
            estimator.compute_advantage(prompts, rewards, mask)
    return monitor.last_record


def expected_series(record, totals):
    """What each PromQL query should return for the last record."""
    m = record.metrics
    series = {
        'advmon_advantage_mean{stage="post_norm"}': m["advantages/post_norm/mean"],
        'advmon_advantage_std{stage="pre_norm"}': m["advantages/pre_norm/std"],
        'advmon_advantage_min{stage="post_norm"}': m["advantages/post_norm/min"],
        'advmon_advantage_max{stage="post_norm"}': m["advantages/post_norm/max"],
        'advmon_advantage_abs_mean{stage="post_norm"}': m["advantages/post_norm/abs_mean"],
        'advmon_advantage_percentile{stage="post_norm",percentile="99"}': m["advantages/post_norm/p99"],
        'advmon_advantage_percentile{stage="pre_norm",percentile="1"}': m["advantages/pre_norm/p01"],
        "advmon_reward_mean": m["rewards/mean"],
        "advmon_reward_std": m["rewards/std"],
        "advmon_zero_std_group_ratio": m["groups/zero_std_fraction"],
        "advmon_groups": m["groups/count"],
        "advmon_comparable_groups": m["groups/comparable_count"],
        "advmon_zero_std_groups": m["groups/zero_std_count"],
        "advmon_step": float(record.step),
        "advmon_last_update_timestamp_seconds": record.time,
        "advmon_updates_total": totals["updates"],
        'advmon_nonfinite_values_total{stage="reward",kind="nan"}': totals["reward_nan"],
        'advmon_nonfinite_values_total{stage="post_norm",kind="inf"}': 0.0,
        'advmon_sink_errors_total{sink="jsonl"}': 0.0,
        'advmon_dropped_records_total{sink="prometheus"}': 0.0,
    }
    return series


def parse_exposition(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
    return values


def test_exposition_counters_start_at_zero_and_pass_promtool(tmp_path):
    promtool = require_binary("promtool")
    monitor = advmon.Monitor("expo", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), PrometheusSink(port=0)])
    sink = monitor.sinks[1]
    before = http_get(f"http://127.0.0.1:{sink.port}/metrics").decode()
    assert 'advmon_updates_total{run="expo"} 0.0' in before
    assert 'advmon_nonfinite_values_total{kind="nan",run="expo",stage="reward"} 0.0' in parse_exposition_lines(before)
    assert 'advmon_sink_errors_total{run="expo",sink="jsonl"} 0.0' in before
    assert "advmon_advantage_mean" not in before  # no record yet, no gauge
    record = run_steps(monitor)
    text = http_get(f"http://127.0.0.1:{sink.port}/metrics").decode()
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    values = parse_exposition(text)
    nan_total = sum(r.metrics["rewards/nan_count"] for r in advmon.read_jsonl(tmp_path / "r.jsonl"))
    assert values['advmon_nonfinite_values_total{kind="nan",run="expo",stage="reward"}'] == nan_total
    assert values['advmon_advantage_mean{run="expo",stage="post_norm"}'] == record.metrics["advantages/post_norm/mean"]
    assert values['advmon_advantage_percentile{percentile="50",run="expo",stage="pre_norm"}'] == record.metrics[
        "advantages/pre_norm/p50"
    ]
    assert 'quantile="' not in text
    monitor.close()


def parse_exposition_lines(text: str) -> str:
    """Exposition text with each sample's labels sorted, for stable substring checks."""
    lines = []
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            lines.append(line)
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("}", 1)
        lines.append(f"{name}{{{','.join(sorted(labels.split(',')))}}}{value}")
    return "\n".join(lines)


def query(url: str, promql: str) -> list[dict]:
    body = http_get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    data = json.loads(body)
    assert data["status"] == "success", data
    return data["data"]["result"]


def assert_prometheus_has(url: str, run: str, expected: dict[str, float]) -> None:
    def matches(promql: str, want: float) -> bool:
        selector = promql.replace("{", f'{{run="{run}",', 1) if "{" in promql else f'{promql}{{run="{run}"}}'
        result = query(url, selector)
        if len(result) != 1:
            return False
        have = float(result[0]["value"][1])
        return (math.isnan(want) and math.isnan(have)) or have == pytest.approx(want, rel=1e-9, abs=1e-12)

    for promql, want in expected.items():
        wait_for(lambda: matches(promql, want), 40, f"Prometheus to report {promql} = {want}")


def test_a_real_prometheus_scrapes_the_last_record(tmp_path):
    sink = PrometheusSink(port=0)
    prometheus, url = start_prometheus(tmp_path, {"advmon": f"127.0.0.1:{sink.port}"})
    try:
        with advmon.Monitor("scraped", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), sink]) as monitor:
            record = run_steps(monitor)
            records = advmon.read_jsonl(tmp_path / "r.jsonl")
            totals = {"updates": float(len(records)), "reward_nan": sum(r.metrics["rewards/nan_count"] for r in records)}
            assert_prometheus_has(url, "scraped", expected_series(record, totals))
    finally:
        prometheus.stop()


def test_the_same_through_a_real_pushgateway(tmp_path):
    gateway, gateway_url = start_pushgateway(tmp_path)
    prometheus, url = start_prometheus(tmp_path, {"pushgateway": gateway_url.removeprefix("http://")}, honor_labels=True)
    try:
        push = PushgatewaySink(gateway_url, delete_on_close=True)
        monitor = advmon.Monitor("pushed", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), push])
        record = run_steps(monitor)
        monitor.flush()
        records = advmon.read_jsonl(tmp_path / "r.jsonl")
        totals = {"updates": float(len(records)), "reward_nan": sum(r.metrics["rewards/nan_count"] for r in records)}
        expected = expected_series(record, totals)
        expected['advmon_dropped_records_total{sink="pushgateway"}'] = 0.0
        del expected['advmon_dropped_records_total{sink="prometheus"}']
        assert_prometheus_has(url, "pushed", expected)
        groups = json.loads(http_get(f"{gateway_url}/api/v1/metrics"))["data"]
        assert [g["labels"]["run"] for g in groups] == ["pushed"]
        monitor.close()  # delete_on_close removes the run's group
        assert json.loads(http_get(f"{gateway_url}/api/v1/metrics"))["data"] == []
    finally:
        prometheus.stop()
        gateway.stop()


def test_scrape_mode_beside_the_trainers_own_exporter():
    from prometheus_client import REGISTRY, CollectorRegistry, Gauge, start_http_server

    trainer_registry = CollectorRegistry()
    Gauge("trainer_loss", "the trainer's own metric", registry=trainer_registry).set(0.5)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=trainer_registry)
    try:
        own_port = PrometheusSink(port=0)  # advmon's own endpoint and registry
        shared = PrometheusSink(registry=trainer_registry)  # advmon inside the trainer's exporter
        assert shared.port is None
        monitor = advmon.Monitor("beside", sinks=[own_port, shared])
        monitor.observe(rewards=torch.tensor([1.0, 0.0]))
        monitor.wait()  # the record is finished off this thread
        trainer_text = http_get(f"http://127.0.0.1:{server.server_port}/metrics").decode()
        advmon_text = http_get(f"http://127.0.0.1:{own_port.port}/metrics").decode()
        assert "trainer_loss 0.5" in trainer_text and 'advmon_reward_mean{run="beside"} 0.5' in trainer_text
        assert "trainer_loss" not in advmon_text and 'advmon_reward_mean{run="beside"} 0.5' in advmon_text
        assert "advmon_" not in "\n".join(
            line for line in __import__("prometheus_client").generate_latest(REGISTRY).decode().splitlines()
            if not line.startswith("#")
        )
        monitor.close()
        with pytest.raises(OSError):  # the endpoint is closed
            http_get(f"http://127.0.0.1:{own_port.port}/metrics", timeout=0.5)
    finally:
        server.shutdown()
        server.server_close()


def test_the_endpoint_binds_loopback_by_default():
    sink = PrometheusSink(port=free_port())
    try:
        assert sink._exporter.server.server_address[0] == "127.0.0.1"
    finally:
        sink.close()


def test_a_free_port_is_logged_for_the_scrape_configuration(caplog):
    import logging

    from advmon.sinks.prometheus import PrometheusSink

    with caplog.at_level(logging.INFO, logger="advmon"):
        sink = PrometheusSink(port=0)
    try:
        assert f"http://127.0.0.1:{sink.port}/metrics" in caplog.text
    finally:
        sink.close()


def test_slices_and_reward_functions_as_gauges_and_the_worst_group_as_an_exemplar(tmp_path):
    """Read back from a real Prometheus with exemplar storage (/api/v1/query_exemplars)."""
    import time

    sink = PrometheusSink(port=0)
    prometheus, url = start_prometheus(tmp_path, {"advmon": f"127.0.0.1:{sink.port}"}, features=("exemplar-storage",))
    try:
        with advmon.Monitor("sliced", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), sink], max_slices=2) as monitor:
            rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, math.nan, 0.5, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
            labels = ["gsm8k"] * 4 + ["math"] * 4 + ["code"] * 2 + ["poems"] * 2
            started = time.time()
            monitor.observe(rewards=rewards, advantages=rewards - 0.5, group_size=4, slices=labels,
                            reward_functions={"correctness": rewards, "format": torch.ones(12)})
            record = monitor.last_record
            m = record.metrics
            expected = {
                'advmon_slice_reward_mean{slice="gsm8k"}': m["slices/gsm8k/rewards/mean"],
                'advmon_slice_reward_nonfinite{slice="math",kind="nan"}': 1.0,
                'advmon_slice_zero_std_group_ratio{slice="other"}': m["slices/other/groups/zero_std_fraction"],
                'advmon_slice_rewards{slice="other"}': 4.0,
                'advmon_slice_advantage_abs_max{slice="math"}': m["slices/math/advantages/post_norm/abs_max"],
                'advmon_reward_function_nonfinite{function="correctness",kind="nan"}': 1.0,
                'advmon_reward_function_mean{function="format"}': 1.0,
            }
            assert_prometheus_has(url, "sliced", expected)
            # Bounded: gsm8k and math kept their names, code and poems are 'other'.
            assert {r["metric"]["slice"] for r in query(url, 'advmon_slice_rewards{run="sliced"}')} == {"gsm8k", "math", "other"}

            def exemplars():
                params = urllib.parse.urlencode({"query": 'advmon_nonfinite_values_total{run="sliced",stage="reward",kind="nan"}',
                                                 "start": started - 60, "end": time.time() + 60})
                found = json.loads(http_get(f"{url}/api/v1/query_exemplars?{params}"))["data"]
                return [e for series in found for e in series["exemplars"]]

            wait_for(lambda: exemplars(), 40, "Prometheus to store the exemplar")
            (exemplar,) = exemplars()[:1]
            worst = record.exemplars[0]
            assert exemplar["labels"] == {"group": worst["group"], "slice": "math"} and worst["group"] == "samples 4-7"
            assert float(exemplar["value"]) == 1.0
    finally:
        prometheus.stop()


def test_two_monitors_of_one_process_share_one_address(tmp_path, monkeypatch):
    """Issue 19: a train and an eval monitor on one port; the second used to raise OSError into training."""
    port = free_port()
    monkeypatch.chdir(tmp_path)  # the default JSONL files land here
    monkeypatch.setenv("ADVMON_SINKS", f"jsonl,prometheus:127.0.0.1:{port}")
    train = advmon.Monitor("train-run")
    evaluation = advmon.Monitor("train-run-eval")  # no OSError: the endpoint is shared
    try:
        train.observe(rewards=torch.tensor([1.0, 0.0]))
        evaluation.observe(rewards=torch.tensor([0.25, 0.75]))
        train.wait(), evaluation.wait()  # the records are finished off this thread
        text = http_get(f"http://127.0.0.1:{port}/metrics").decode()
        # One family per name, both runs' series in it: Prometheus refuses a second TYPE line.
        assert text.count("# TYPE advmon_updates_total counter") == 1
        checked = subprocess.run([require_binary("promtool"), "check", "metrics"], input=text, capture_output=True,
                                 text=True, timeout=60)
        assert "error" not in (checked.stdout + checked.stderr).lower(), checked.stdout + checked.stderr
        exposed = parse_exposition(text)
        assert exposed['advmon_reward_mean{run="train-run"}'] == 0.5
        assert exposed['advmon_reward_mean{run="train-run-eval"}'] == 0.5
        assert exposed['advmon_updates_total{run="train-run"}'] == 1.0
        train.close()  # the other monitor still serves there
        exposed = parse_exposition(http_get(f"http://127.0.0.1:{port}/metrics").decode())
        assert 'advmon_updates_total{run="train-run-eval"}' in exposed
        assert not any('run="train-run"' in key for key in exposed)
    finally:
        train.close()
        evaluation.close()
    with pytest.raises(OSError):  # the last close freed the port
        http_get(f"http://127.0.0.1:{port}/metrics")


def test_a_port_another_process_holds_warns_once_and_training_goes_on(tmp_path):
    import sys
    import warnings

    port = free_port()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('bound', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "bound"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            monitor = advmon.Monitor("held", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"),
                                                    f"prometheus:127.0.0.1:{port}"])
            for step in range(3):
                with monitor.step(step):
                    monitor.observe(rewards=torch.tensor([1.0, 0.0]))
            monitor.close()
        messages = [str(w.message) for w in caught if "could not serve Prometheus metrics" in str(w.message)]
        assert len(messages) == 1 and f"127.0.0.1:{port}" in messages[0]
        records = advmon.read_jsonl(tmp_path / "r.jsonl")
        assert [r.step for r in records] == [0, 1, 2]  # training went on, and recorded
        # A record carries the failures before its own delivery: the third shows the first two.
        assert [r.metrics["advmon/sink_errors/prometheus"] for r in records] == [0.0, 1.0, 2.0]
    finally:
        holder.kill()
        holder.wait(timeout=10)


def scrape(port: int) -> str:
    """GET /metrics as Prometheus does (its scrape-timeout header marks a scraper)."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                     headers={"X-Prometheus-Scrape-Timeout-Seconds": "10"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read().decode()


def test_a_closing_endpoint_serves_the_finished_mark_to_a_scraper_before_it_goes():
    import threading

    sink = PrometheusSink(port=0)
    sink.attach("closing", ["prometheus"])
    assert 'advmon_run_finished{run="closing"} 0.0' in scrape(sink.port)
    assert 'advmon_run_finished{run="closing"} 0.0' in scrape(sink.port)
    closer = threading.Thread(target=sink.close)
    closer.start()
    seen = wait_for(lambda: 'advmon_run_finished{run="closing"} 1.0' in scrape(sink.port), 60,
                    "a scrape of the finished mark")  # a hang guard: the close waits for this scrape
    assert seen
    closer.join(60)  # a hang guard
    assert not closer.is_alive()
    with pytest.raises(OSError):  # then the endpoint is gone
        http_get(f"http://127.0.0.1:{sink.port}/metrics", timeout=0.5)


def test_an_endpoint_no_scraper_read_closes_at_once_and_a_browser_is_no_scraper():
    sink = PrometheusSink(port=0)
    sink.attach("unscraped", ["prometheus"])
    assert b'advmon_run_finished{run="unscraped"} 0.0' in http_get(f"http://127.0.0.1:{sink.port}/metrics")
    sink.close()  # nothing to wait for: no request carried the scrape header
    with pytest.raises(OSError):
        http_get(f"http://127.0.0.1:{sink.port}/metrics", timeout=0.5)
    registry_sink = PrometheusSink(registry=__import__("prometheus_client").CollectorRegistry(auto_describe=False))
    registry_sink.attach("in-a-trainers-registry", ["prometheus"])
    registry_sink.close()  # the trainer's exporter goes on serving it: finished
    text = __import__("prometheus_client").generate_latest(registry_sink.registry).decode()
    assert 'advmon_run_finished{run="in-a-trainers-registry"} 1.0' in text

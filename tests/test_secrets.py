"""Secrets configured in sink URLs and the environment never show up in anything advmon writes or prints."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch

import advmon
from advmon.cli import main
from advmon.sinks.prometheus import PushgatewaySink
from tests.services import Service, free_port, http_get, require_binary, require_module, wait_for

PASSWORD = "s3cr3t-pw-XYZ"
TOKEN = "tok-98765-abc"


def test_no_secret_in_reprs_warnings_logs_output_or_files(tmp_path, monkeypatch, capfd, caplog):
    require_module("mlflow")
    from advmon.sinks.mlflow import MlflowSink

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("ADVMON_PUSHGATEWAY_TOKEN", TOKEN)
    dead = free_port()
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = advmon.Monitor(
            "secrets",
            sinks=[
                advmon.JsonlSink(tmp_path / "r.jsonl"),
                MlflowSink(tracking_uri=f"http://advmon:{PASSWORD}@127.0.0.1:{dead}?token={TOKEN}"),
                PushgatewaySink(f"http://advmon:{PASSWORD}@127.0.0.1:{dead}"),
            ],
            retries=0,
        )
        shown = repr(monitor) + repr(monitor.sinks)
        for _ in range(3):
            monitor.observe(rewards=torch.tensor([1.0, 0.0]))
        monitor.close(timeout=10)
        code = main(["replay", str(tmp_path / "r.jsonl"), "--to", f"pushgateway:http://advmon:{PASSWORD}@127.0.0.1:{dead}",
                     "--retries", "0"])
    assert code == 1  # the gateway is down: the replay says so
    out, err = capfd.readouterr()
    everything = "\n".join([shown, out, err, caplog.text, *(str(w.message) for w in caught)])
    everything += "".join(p.read_text(errors="replace") for p in Path(tmp_path).rglob("*") if p.is_file())
    assert "advmon" in everything and "127.0.0.1" in everything  # what was said is there ...
    assert PASSWORD not in everything and TOKEN not in everything  # ... but no secret
    assert any("sink" in str(w.message) for w in caught)


@pytest.fixture
def pushgateway_with_basic_auth(tmp_path):
    import bcrypt

    binary = require_binary("prometheus-pushgateway")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  advmon: '{hashed}'\n")
    port = free_port()
    service = Service("pushgateway", [binary, f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={config}",
                                      f"--persistence.file={tmp_path / 'pushgateway.data'}"], tmp_path, None)
    url = f"http://127.0.0.1:{port}"
    import urllib.error

    def answers() -> bool:
        try:
            http_get(f"{url}/-/ready")
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # up, and asking for credentials
        return True

    wait_for(answers, 20, "the pushgateway")
    yield url
    service.stop()


@pytest.mark.integration
def test_pushgateway_basic_auth_from_the_url_or_the_environment(pushgateway_with_basic_auth, monkeypatch):
    import base64
    import urllib.request

    url = pushgateway_with_basic_auth
    host = url.removeprefix("http://")
    for sink in (PushgatewaySink(f"http://advmon:{PASSWORD}@{host}", run="from-url"),
                 _env_sink(monkeypatch, url, "from-env")):
        assert PASSWORD not in repr(sink)
        with advmon.Monitor(sink.collector.run, sinks=[sink], retries=0) as monitor:
            monitor.observe(rewards=torch.tensor([1.0, 0.0]))
    request = urllib.request.Request(f"{url}/metrics")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"advmon:{PASSWORD}".encode()).decode())
    exposed = urllib.request.urlopen(request, timeout=5).read().decode()
    assert 'advmon_updates_total{instance="",job="advmon",run="from-url"} 1' in exposed
    assert 'run="from-env"' in exposed
    # Without credentials the push fails, is counted, and training carries on.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with advmon.Monitor("no-auth", sinks=[PushgatewaySink(url)], retries=0) as monitor:
            monitor.observe(rewards=torch.tensor([1.0]))
            monitor.flush()
            monitor.observe(rewards=torch.tensor([1.0]))
    assert monitor.last_metrics["advmon/sink_errors/pushgateway"] >= 1
    assert any("401" in str(w.message) or "Unauthorized" in str(w.message) for w in caught)


def _env_sink(monkeypatch, url: str, run: str) -> PushgatewaySink:
    monkeypatch.setenv("ADVMON_PUSHGATEWAY_USERNAME", "advmon")
    monkeypatch.setenv("ADVMON_PUSHGATEWAY_PASSWORD", PASSWORD)
    sink = PushgatewaySink(url, run=run)
    monkeypatch.delenv("ADVMON_PUSHGATEWAY_USERNAME")
    monkeypatch.delenv("ADVMON_PUSHGATEWAY_PASSWORD")
    return sink

"""The MLflow sink on a real sqlite store and a real ``mlflow server``, outage and replay included."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import advmon
from advmon.cli import main as cli
from advmon.sinks.mlflow import RUN_TAG, MlflowSink, mlflow_key

from .services import Unanswering, mlflow_sqlite_store, require_module, start_mlflow_server, wait_for
from .test_monitor import grpo_batch, run_grpo_steps

pytestmark = pytest.mark.integration
mlflow = require_module("mlflow")


def histories(uri: str, run_name: str) -> tuple[str, dict[str, dict[int, float]]]:
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs(["0"], filter_string=f"tags.`{RUN_TAG}` = '{run_name}'")
    keys = run.data.metrics.keys()
    return run.info.run_id, {
        key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)} for key in keys
    }


def assert_logged(records, logged: dict[str, dict[int, float]]) -> None:
    for record in records:
        for key, value in record.metrics.items():
            if math.isfinite(value):
                assert logged[mlflow_key(key)][record.step] == value, (key, record.step)
            else:
                assert record.step not in logged.get(mlflow_key(key), {}), key


def test_sqlite_store_gets_every_value_in_one_batch_per_record(tmp_path, monkeypatch):
    uri = mlflow_sqlite_store(tmp_path)
    calls = []
    real_log_batch = mlflow.tracking.MlflowClient.log_batch

    def counting_log_batch(self, run_id, metrics=(), **kwargs):
        calls.append(len(metrics))
        return real_log_batch(self, run_id, metrics=metrics, **kwargs)

    monkeypatch.setattr(mlflow.tracking.MlflowClient, "log_batch", counting_log_batch)
    with advmon.Monitor("ml-sqlite", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), MlflowSink(uri)]) as monitor:
        run_grpo_steps(monitor, range(3), nan_at={2})
    records = advmon.read_jsonl(tmp_path / "r.jsonl")
    # At most one request per record (queued records share one), never one per metric.
    assert 1 <= len(calls) <= 3
    assert sum(calls) == sum(sum(1 for v in r.metrics.values() if v == v and abs(v) != float("inf")) for r in records)
    _, logged = histories(uri, "ml-sqlite")
    assert_logged(records, logged)
    assert "advantages/post_norm/p99" in logged  # slashes kept


def test_logs_into_the_active_run(tmp_path):
    uri = mlflow_sqlite_store(tmp_path)
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run() as active:
            with advmon.Monitor("ml-active", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), MlflowSink()]) as monitor:
                monitor.observe(rewards=torch.tensor([1.0, 3.0]))
                monitor.flush()
            history = mlflow.tracking.MlflowClient().get_metric_history(active.info.run_id, "rewards/mean")
            assert [m.value for m in history] == [2.0]
            assert mlflow.active_run().info.run_id == active.info.run_id  # not ended by advmon
    finally:
        mlflow.set_tracking_uri(None)


def test_a_dead_server_never_stops_training_and_replay_backfills(tmp_path, monkeypatch):
    # No MLflow retries; a request waits for an answer until the test lets it fail (120 s: a hang guard).
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    store = tmp_path / "server.db"
    server, url = start_mlflow_server(tmp_path, store)
    jsonl = tmp_path / "r.jsonl"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            monitor = advmon.Monitor(
                "ml-outage", sinks=[advmon.JsonlSink(jsonl), MlflowSink(url)], retries=1, close_timeout=20
            )
            run_grpo_steps(monitor, range(0, 3))
            monitor.flush(timeout=30)
            assert monitor.last_metrics["advmon/sink_errors/mlflow"] == 0
            server.stop()  # the tracking server dies mid-run, and what takes its port never answers
            with Unanswering(int(url.rsplit(":", 1)[1])) as hung:
                run_grpo_steps(monitor, range(3, 6), nan_at={4})  # training carries on...
                wait_for(lambda: hung.held, 60, "MLflow's request to the server that never answers")
                # ...while the sink's request hangs: nothing of steps 3-5 has been delivered or failed yet,
                # and nothing can be before the server lets go (if training waited, step 3 would hang here).
                assert monitor.last_metrics["advmon/sink_errors/mlflow"] == 0
            monitor.close()  # the server is gone now: each record fails at once
        assert any("sink mlflow failed" in str(w.message) for w in caught)
        records = advmon.read_jsonl(jsonl)
        assert [r.step for r in records] == list(range(6))  # the JSONL kept everything

        server, url = start_mlflow_server(tmp_path, store)  # back up, same store
        _, before = histories(url, "ml-outage")
        assert sorted(before["rewards/mean"]) == [0, 1, 2]
        assert cli(["replay", str(jsonl), "--to", f"mlflow:{url}", "--since-step", "3"]) == 0
        run_id, after = histories(url, "ml-outage")  # the same MLflow run, backfilled
        assert sorted(after["rewards/mean"]) == list(range(6))
        assert_logged(records, after)
    finally:
        server.stop()


def test_replay_reports_what_it_could_not_send(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    jsonl = tmp_path / "r.jsonl"
    with advmon.Monitor("ml-replay", sinks=[advmon.JsonlSink(jsonl)]) as monitor:
        monitor.observe(rewards=torch.ones(2))
    from .services import free_port

    assert cli(["replay", str(jsonl), "--to", f"mlflow:http://127.0.0.1:{free_port()}", "--retries", "0"]) == 1
    assert "1 record(s) could not be sent" in capsys.readouterr().err
    assert cli(["replay", str(jsonl), "--to", "kafka:x"]) == 2  # input it cannot use (docs/cli.md)
    assert "valid forms" in capsys.readouterr().err


def test_exemplars_go_to_json_artifacts_at_troubled_steps_and_every_n(tmp_path):
    import json

    from advmon.sinks.mlflow import exemplar_artifact

    server, url = start_mlflow_server(tmp_path, tmp_path / "server.db")
    try:
        jsonl = tmp_path / "r.jsonl"
        monitor = advmon.Monitor("ml-exemplars", sinks=[advmon.JsonlSink(jsonl), MlflowSink(url, exemplars_every=4)],
                                 exemplars=2)

        @monitor.watch(groups=None, group_size=8)
        def compute_advantage(rewards, mask):  # float64 GRPO: quiet steps stay quiet
            grouped = rewards.double().view(-1, 8)
            advantages = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
            return advantages.reshape(-1, 1).expand(mask.shape)

        for step in range(6):
            _, rewards, mask = grpo_batch(seed=step, nan_rewards=2 if step == 1 else 0)
            with monitor.step(step):
                compute_advantage(rewards, mask)
        monitor.close()
        records = {r.step: r for r in advmon.read_jsonl(jsonl)}
        client = mlflow.tracking.MlflowClient(tracking_uri=url)
        run_id, _ = histories(url, "ml-exemplars")
        stored = sorted(a.path for a in client.list_artifacts(run_id, "advmon/exemplars"))
        assert stored == [exemplar_artifact(step) for step in (0, 1, 4)]  # first, the NaN step, four on
        for step in (0, 1, 4):
            payload = json.loads(open(client.download_artifacts(run_id, exemplar_artifact(step), str(tmp_path))).read())
            assert payload["step"] == step and payload["run"] == "ml-exemplars"
            assert payload["exemplars"] == records[step].to_dict()["exemplars"]
        assert payload and json.loads(open(client.download_artifacts(run_id, exemplar_artifact(1), str(tmp_path))).read(
        ))["exemplars"][0]["reason"] == "nonfinite_rewards"
    finally:
        server.stop()

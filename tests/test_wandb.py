"""The W&B sink in offline mode, read back from the written .wandb file."""

from __future__ import annotations

import math

import pytest
import torch

import advmon
from advmon.sinks.wandb import WandbSink

from .estimators import GRPOLikeEstimator
from .services import require_module
from .test_monitor import grpo_batch
from advmon.runs.wandb_file import history_rows, metric_definitions, summaries

pytestmark = pytest.mark.integration

#: Seconds close, flush and exit may wait for W&B, a hang guard: they return once it has the records, but
#: W&B starts a service process at the first record, which a busy machine can take far longer than
#: advmon's defaults (10 s for close, 5 s for exit) to do.
WANDB_WAIT = 120


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    wandb = require_module("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    yield wandb
    if wandb.run is not None:
        wandb.run.finish()


def run_file(tmp_path):
    """The one offline run file under ``tmp_path``, once W&B has finished writing it.

    ``run.finish()`` can return before W&B's writer (a separate process) has
    flushed the file, so wait for its closing ``exit`` record.
    """
    (path,) = finished_run_files(tmp_path, 1)
    return path


def finished_run_files(tmp_path, count: int) -> list:
    from .services import wait_for

    def finished():
        files = sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
        return len(files) == count and all(_has_exit_record(f) for f in files)

    wait_for(finished, WANDB_WAIT, f"{count} finished W&B run file(s)")
    return sorted(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))


def _has_exit_record(path) -> bool:
    from advmon.runs.wandb_file import read_records

    return any(r.WhichOneof("record_type") == "exit" for r in read_records(path))


def test_every_value_reaches_the_wandb_file(tmp_path, offline_wandb):
    monitor = advmon.Monitor("wb-own", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"),
                                              WandbSink(project="advmon-test", dir=str(tmp_path))],
                             close_timeout=WANDB_WAIT)
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    for step in (3, 4, 5):
        prompts, rewards, mask = grpo_batch(seed=step, nan_rewards=1 if step == 5 else 0)
        with monitor.step(step):
            estimator.compute_advantage(prompts, rewards, mask)
    monitor.close()
    records = advmon.read_jsonl(tmp_path / "r.jsonl")
    rows = history_rows(run_file(tmp_path))
    assert [row["advmon/step"] for row in rows] == [3, 4, 5]
    for record, row in zip(records, rows):
        for key, value in record.metrics.items():
            if math.isfinite(value):
                assert row[key] == value, key  # JSON round-trips doubles exactly
            else:
                assert key not in row, key  # unavailable values are not logged
    definitions = {d.glob_name or d.name: d for d in metric_definitions(run_file(tmp_path))}
    assert definitions["advantages/*"].step_metric == "advmon/step"
    assert definitions["rewards/*"].step_metric == "advmon/step"
    summary = summaries(run_file(tmp_path))["advantages/post_norm/max"]
    values = [r.metrics["advantages/post_norm/max"] for r in records]
    assert summary == {"min": min(values), "max": max(values), "last": values[-1]}


def test_logging_into_the_trainers_run_never_moves_its_step(tmp_path, offline_wandb):
    trainer_run = offline_wandb.init(project="advmon-test", name="trainer", dir=str(tmp_path))
    monitor = advmon.Monitor("wb-shared", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), WandbSink()],
                             close_timeout=WANDB_WAIT)
    for step in range(5):
        trainer_run.log({"loss": 1.0 / (step + 1)}, step=step)
        trainer_run.log({"lr": 0.1}, step=step)  # trainers log several times per step
        monitor.observe(rewards=torch.tensor([1.0, 0.0, float(step)]))
        monitor.flush()  # the record joins the row the trainer is filling
    trainer_run.log({"loss": 0.0}, step=5)
    monitor.close()
    assert offline_wandb.run is trainer_run  # advmon did not finish the trainer's run
    trainer_run.finish()
    rows = history_rows(run_file(tmp_path))
    assert [row["_step"] for row in rows] == list(range(6))  # no trainer step dropped or added
    assert all(row["lr"] == 0.1 for row in rows[:5])
    assert [row.get("advmon/step") for row in rows] == [0, 1, 2, 3, 4, None]
    assert [row.get("rewards/max") for row in rows[:5]] == [1.0, 1.0, 2.0, 3.0, 4.0]


def test_a_run_of_its_own_beside_the_trainers(tmp_path, offline_wandb):
    trainer_run = offline_wandb.init(project="advmon-test", name="trainer", dir=str(tmp_path))
    sink = WandbSink(project="advmon-test", join_active_run=False, dir=str(tmp_path))
    monitor = advmon.Monitor("wb-own-beside", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), sink],
                             close_timeout=WANDB_WAIT)
    for step in range(3):
        trainer_run.log({"loss": 1.0}, step=step)
        monitor.observe(rewards=torch.tensor([float(step), 0.0]))
    monitor.close()
    trainer_run.finish()
    files = finished_run_files(tmp_path, 2)
    by_keys = {("loss" in history_rows(f)[0]): history_rows(f) for f in files}
    assert [row["advmon/step"] for row in by_keys[False]] == [0, 1, 2]
    assert [row["_step"] for row in by_keys[True]] == [0, 1, 2]


def test_without_wandb_installed_the_error_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    monkeypatch.delitem(__import__("sys").modules, "wandb", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'advmon\[wandb\]'"):
        WandbSink()


def test_records_queued_at_exit_reach_wandb_before_it_finishes(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        import os, torch, advmon
        from advmon.sinks.wandb import WandbSink
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
        monitor = advmon.Monitor("wb-exit", sinks=[advmon.JsonlSink({str(tmp_path / 'r.jsonl')!r}),
                                                   WandbSink(project="advmon-test", dir={str(tmp_path)!r})])
        for step in range(5):
            monitor.observe(rewards=torch.tensor([float(step), 1.0]))
        # no close(): exit hooks deliver the queue before W&B finishes the run
        """
    )
    environment = {**__import__("os").environ, "ADVMON_EXIT_TIMEOUT": str(WANDB_WAIT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=3 * WANDB_WAIT,
                          env=environment)
    assert done.returncode == 0, done.stderr
    assert [row["advmon/step"] for row in history_rows(run_file(tmp_path))] == [0, 1, 2, 3, 4]


def test_exemplars_go_to_a_table_at_troubled_steps_and_every_n(tmp_path, offline_wandb):
    import json

    sink = WandbSink(project="advmon-test", dir=str(tmp_path), exemplars_every=10)
    monitor = advmon.Monitor("wb-exemplars", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), sink], exemplars=3,
                             close_timeout=WANDB_WAIT)

    @monitor.watch(groups=None, group_size=8)
    def compute_advantage(rewards, mask):  # float64 GRPO: no cancellation outliers, so quiet steps are quiet
        grouped = rewards.double().view(-1, 8)
        advantages = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)
        return advantages.reshape(-1, 1).expand(mask.shape)

    for step in range(0, 13):
        _, rewards, mask = grpo_batch(seed=step, nan_rewards=1 if step == 5 else 0)
        with monitor.step(step):
            compute_advantage(rewards, mask)
    monitor.close()
    records = {r.step: r for r in advmon.read_jsonl(tmp_path / "r.jsonl")}
    path = run_file(tmp_path)
    tables = {row["advmon/step"]: row["advmon/exemplars/path"] for row in history_rows(path)
              if "advmon/exemplars/path" in row}
    assert sorted(tables) == [0, 5, 10]  # the first, the NaN step, then ten steps on
    for step, reference in tables.items():
        table = json.loads((path.parent / "files" / reference).read_text())
        assert table["columns"][:4] == ["step", "group", "reason", "slice"]
        expected = records[step].exemplars
        assert [row[1] for row in table["data"]] == [e["group"] for e in expected]
        assert [row[2] for row in table["data"]] == [e["reason"] for e in expected]
        peak = table["data"][0][table["columns"].index("advantage_abs_max")]
        assert peak == pytest.approx(expected[0]["advantage_abs_max"], rel=1e-12) or (
            peak is None and math.isnan(expected[0]["advantage_abs_max"]))
    # advmon's W&B reader brings them back with the metrics (for advmon report wandb+DIR).
    from advmon.runs.wandb import read_wandb_run

    back = {r.step: r for r in read_wandb_run(path).records}
    for step in tables:
        assert [e["group"] for e in back[step].exemplars] == [e["group"] for e in records[step].exemplars]
        assert back[step].exemplars[0]["reward_nan_count"] == records[step].exemplars[0]["reward_nan_count"]
    assert back[1].exemplars == [] and not any(k.startswith("advmon/exemplars") for k in back[5].metrics)
    assert json.loads((path.parent / "files" / tables[5]).read_text())["data"][0][2] == "nonfinite_rewards"


def test_histograms_land_in_the_wandb_file_as_wandb_histograms(tmp_path, offline_wandb):
    monitor = advmon.Monitor("wb-hist", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"),
                                               WandbSink(project="advmon-test", dir=str(tmp_path))],
                             close_timeout=WANDB_WAIT)
    estimator = advmon.instrument(GRPOLikeEstimator(), monitor)
    for step in (1, 2):
        with monitor.step(step):
            estimator.compute_advantage(*grpo_batch(seed=step))
    monitor.close()
    records = advmon.read_jsonl(tmp_path / "r.jsonl")
    rows = history_rows(run_file(tmp_path))
    assert [row["advmon/step"] for row in rows] == [1, 2]
    for record, row in zip(records, rows):
        for stage in ("pre_norm", "post_norm"):
            key, histogram = f"histograms/advantages/{stage}", record.histograms[stage]  # W&B nests its fields
            assert row[f"{key}/_type"] == "histogram"
            assert row[f"{key}/bins"] == list(histogram.edges) and row[f"{key}/values"] == list(histogram.counts)
    definitions = {d.glob_name or d.name: d for d in metric_definitions(run_file(tmp_path))}
    assert definitions["histograms/*"].step_metric == "advmon/step"
    from advmon.runs import read_run

    back = read_run(run_file(tmp_path))
    assert [r.histograms for r in back.records] == [r.histograms for r in records]  # the report draws them from here

"""advmon inside a real TRL GRPOTrainer (trl 1.16 on CPU): records equal what TRL itself logs."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import advmon
from tests.conftest import ListSink
from tests.reference import assert_stats_close, value_stats
from tests.services import require_module

trl = require_module("trl")
from transformers import TrainerCallback  # noqa: E402

from tests import trl_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class KeepAdvantages(TrainerCallback):
    """TRL keeps the gathered advantages of its latest generation batch in ``_logs``: copy them each step."""

    def __init__(self) -> None:
        self.trainer = None
        self.by_step: dict[int, np.ndarray] = {}

    def on_step_end(self, args, state, control, **kwargs):
        self.by_step[state.global_step] = np.array(list(self.trainer._logs["advantages"]), dtype=np.float64)


def train(tmp_path: Path, monitor, **overrides):
    keep = KeepAdvantages()
    trainer = trl_run.trainer(tmp_path, monitor, **overrides)
    keep.trainer = trainer
    trainer.add_callback(keep)
    trainer.train()
    return trainer, keep.by_step


def logged(trainer, prefix: str = "") -> dict[int, dict]:
    """TRL's own logs by step, where it logged reward metrics."""
    return {h["step"]: h for h in trainer.state.log_history if h.get(f"{prefix}reward") is not None}


def assert_matches_trl(metrics: dict, log: dict, prefix: str = "") -> None:
    finite = metrics["rewards/count"] - metrics["rewards/nan_count"]
    assert metrics["rewards/mean"] == pytest.approx(log[f"{prefix}reward"], rel=1e-6, abs=1e-7)
    # TRL's reward_std is the sample std (ddof=1); advmon's is the population std (ddof=0).
    assert metrics["rewards/std"] * math.sqrt(finite / (finite - 1)) == pytest.approx(log[f"{prefix}reward_std"], rel=1e-5, abs=1e-7)
    # TRL: groups whose nanstd isclose 0, over all groups; advmon: groups whose finite rewards
    # are all equal, over groups with at least two finite rewards. Over all groups they agree
    # here (binary rewards, so isclose is exact equality).
    assert metrics["groups/zero_std_count"] / metrics["groups/count"] == pytest.approx(
        log[f"{prefix}frac_reward_zero_std"], abs=1e-7)


def test_records_equal_trls_logged_reward_std_and_zero_std_at_trls_steps(tmp_path):
    sink = ListSink()
    monitor = advmon.Monitor("trl", sinks=[sink], reward_range=(0, 1))
    trainer, advantages = train(tmp_path, monitor, max_steps=4)
    monitor.close()
    logs = logged(trainer)
    assert [r.step for r in sink.records] == sorted(logs) == [1, 2, 3, 4]
    for record in sink.records:
        metrics = record.metrics
        assert metrics["rewards/count"] == 8 and metrics["groups/count"] == 2 and metrics["groups/max_size"] == 4
        assert_matches_trl(metrics, logs[record.step])
        assert_stats_close(metrics, value_stats(advantages[record.step]), "advantages/post_norm/")
    # The reward sometimes returns None: those rows are NaN, as in TRL's own reward metric.
    assert sum(r.metrics["rewards/nan_count"] for r in sink.records) > 0


def test_num_iterations_two_records_each_generation_once_at_its_logged_step(tmp_path):
    sink = ListSink()
    monitor = advmon.Monitor("trl-iterations", sinks=[sink])
    trainer, advantages = train(tmp_path, monitor, max_steps=4, num_iterations=2)
    monitor.close()
    logs = logged(trainer)
    assert [r.step for r in sink.records] == sorted(logs) == [1, 3]
    for record in sink.records:
        assert_matches_trl(record.metrics, logs[record.step])
        assert_stats_close(record.metrics, value_stats(advantages[record.step]), "advantages/post_norm/")


def test_evaluation_goes_to_its_own_monitor_with_num_generations_eval(tmp_path):
    sink, eval_sink = ListSink(), ListSink()
    monitor = advmon.Monitor("trl-train", sinks=[sink])
    evaluation = advmon.Monitor("trl-eval", sinks=[eval_sink], step_source=lambda: trainer_state["step"])
    trainer_state = {"step": 0}
    trainer = trl_run.trainer(tmp_path, monitor, eval_monitor=evaluation, eval_dataset=trl_run.prompts(4),
                              max_steps=2, eval_strategy="steps", eval_steps=2, num_generations_eval=2,
                              per_device_eval_batch_size=8)

    class Follow(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            trainer_state["step"] = state.global_step

    trainer.add_callback(Follow())
    trainer.train()
    monitor.close()
    evaluation.close()
    assert [r.step for r in sink.records] == [1, 2]  # the training sequence has no evaluation in it
    [record] = eval_sink.records
    eval_logs = logged(trainer, "eval_")
    assert record.step == 2 and list(eval_logs) == [2]
    assert record.metrics["rewards/count"] == 8 and record.metrics["groups/count"] == 4  # 4 prompts x 2
    assert record.metrics["groups/max_size"] == 2
    assert_matches_trl(record.metrics, eval_logs[2], "eval_")


def test_the_default_evaluation_monitor_is_a_run_of_its_own(tmp_path, monkeypatch):
    sink = ListSink()
    monitor = advmon.Monitor("trl-main", sinks=[sink])
    trainer = trl_run.trainer(tmp_path, monitor, eval_dataset=trl_run.prompts(4), max_steps=1, eval_strategy="steps",
                              eval_steps=1, num_generations_eval=2, per_device_eval_batch_size=8)
    monkeypatch.chdir(tmp_path)  # the default monitor writes advmon-runs/<run>.jsonl here
    trainer.train()
    monitor.close()
    trainer.advmon_eval_monitor.close()
    assert trainer.advmon_eval_monitor.run == "trl-main-eval"
    [record] = advmon.read_jsonl(tmp_path / "advmon-runs" / "trl-main-eval.jsonl")
    assert record.step == 1 and record.metrics["groups/max_size"] == 2
    assert [r.step for r in sink.records] == [1]


def test_two_processes_gather_every_processs_advantages_and_only_rank_0_emits(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun, "torchrun comes with torch"
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(
        [torchrun, "--nproc_per_node", "2", "--master_port", str(_free_port()), str(ROOT / "tests" / "trl_run.py"),
         str(tmp_path)],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    records = advmon.read_jsonl(tmp_path / "trl-ddp.jsonl")
    logs = {h["step"]: h for h in json.loads((tmp_path / "log_history.json").read_text()) if h.get("reward") is not None}
    assert [r.step for r in records] == sorted(logs) == [1, 2, 3]
    for record in records:
        assert record.metrics["rewards/count"] == 8  # 4 per process, gathered
        assert_matches_trl(record.metrics, logs[record.step])
    last = np.array(json.loads((tmp_path / "advantages.json").read_text()), dtype=np.float64)
    assert_stats_close(records[-1].metrics, value_stats(last), "advantages/post_norm/")
    assert sorted(p.name for p in tmp_path.glob("*.jsonl")) == ["trl-ddp.jsonl"]
    assert not (tmp_path / "advmon-runs").exists()  # rank 1 made no file of its own


def _free_port() -> int:
    from tests.services import free_port

    return free_port()


def test_a_ranks_reducing_monitor_is_refused_at_once(tmp_path):
    monitor = advmon.Monitor("trl-reduce", sinks=[], reduce="ranks")
    with pytest.raises(advmon.AdvmonConfigError, match="reduce='none'"):
        trl_run.trainer(tmp_path, monitor)
    monitor.close()


def test_two_reward_functions_and_two_sources(tmp_path):
    """A function that stops scoring one source's prompts from its second call shows per function and per source."""
    calls = []

    def graded(completions, data_source, **_):
        calls.append(len(completions))
        late = len(calls) >= 2
        return [None if late and source == "beta" else float(len(c) % 2) for c, source in zip(completions, data_source)]

    sink = ListSink()
    monitor = advmon.Monitor("trl-sources", sinks=[sink], reward_range=(0, 1))
    keep = KeepAdvantages()
    trainer = trl_run.trainer(tmp_path, monitor, reward_funcs=[trl_run.length_reward, graded],
                              train_dataset=trl_run.sourced_prompts(), max_steps=3)
    keep.trainer = trainer
    trainer.add_callback(keep)
    trainer.train()
    monitor.close()
    logs = logged(trainer)
    assert [r.step for r in sink.records] == sorted(logs) == [1, 2, 3]
    assert any("slices/beta/rewards/count" in r.metrics for r in sink.records[1:])
    for record in sink.records:
        metrics, log = record.metrics, logs[record.step]
        for name in ("length_reward", "graded"):
            # TRL logs each function's nanmean: a function's None is NaN in both.
            assert metrics[f"rewards/{name}/mean"] == pytest.approx(log[f"rewards/{name}/mean"], rel=1e-6, nan_ok=True)
        beta = metrics.get("slices/beta/rewards/count", 0.0)  # a step's two prompts may share a source
        assert beta + metrics.get("slices/alpha/rewards/count", 0.0) == 8
        expected_nan = 0.0 if record.step == 1 else beta
        assert metrics["rewards/graded/nan_count"] == expected_nan and metrics["rewards/length_reward/nan_count"] == 0
        assert_stats_close(metrics, value_stats(keep.by_step[record.step]), "advantages/post_norm/")
        assert record.exemplars and {e["slice"] for e in record.exemplars} <= {"alpha", "beta"}


def test_a_reward_function_returning_none_for_one_source_is_named_everywhere(tmp_path, monkeypatch, capsys):
    """Issue 18's proof on a real GRPOTrainer: the record, the in-process Slack message and
    ``advmon alerts check`` name the function, the source and the groups."""
    from advmon.cli import main
    from tests.services import FakeSlack

    calls = []

    def graded(completions, data_source, **_):
        calls.append(1)
        return [None if len(calls) >= 2 and source == "beta" else 1.0 for c, source in zip(completions, data_source)]

    slack = FakeSlack()
    monkeypatch.setenv("ADVMON_TEST_SLACK", slack.url)
    jsonl = tmp_path / "run.jsonl"
    try:
        monitor = advmon.Monitor("trl-none", sinks=[advmon.JsonlSink(jsonl)], alerts=["slack:ADVMON_TEST_SLACK"])
        trainer = trl_run.trainer(tmp_path, monitor, reward_funcs=[trl_run.length_reward, graded],
                                  train_dataset=trl_run.sourced_prompts(), max_steps=4)
        trainer.train()
        monitor.close()
        posted = [post["json"]["attachments"][0] for post in slack.posts]
    finally:
        slack.stop()
    records = advmon.read_jsonl(jsonl)
    broken = [r for r in records if r.metrics.get("rewards/graded/nan_count", 0) > 0]
    assert broken and broken[0].step >= 2  # the function answered every prompt at the first generation
    first = broken[0]
    beta_groups = [e["group"] for e in first.exemplars if e["reason"] == "nonfinite_reward_functions"]
    assert beta_groups and all(e["slice"] == "beta" for e in first.exemplars if e["group"] in beta_groups)
    assert first.metrics["slices/beta/rewards/function_nonfinite_count"] == first.metrics["rewards/graded/nan_count"]
    assert first.metrics["rewards/nan_count"] == 0  # TRL's nansum hides it from the summed reward
    # The in-process Slack message.
    firing = next(a for a in posted if "[FIRING] AdvmonRewardFunctionNonFinite" in a["title"])
    assert "reward function graded" in firing["text"] and "slice beta" in firing["text"]
    assert beta_groups[0] in firing["text"] and f"at step {first.step}" in firing["text"]
    # advmon alerts check on the run's file.
    assert main(["alerts", "check", str(jsonl)]) == 1
    text = capsys.readouterr().out
    assert "AdvmonRewardFunctionNonFinite" in text and "function=graded" in text
    assert f"worst groups: {beta_groups[0]} (slice beta" in text and "by slice: beta" in text
    # The report's "where" section.
    page = tmp_path / "report.html"
    assert main(["report", str(jsonl), "--out", str(page)]) == 0
    html = page.read_text()
    where = html[html.index("<h2>Where</h2>"):]
    assert "AdvmonRewardFunctionNonFinite function=graded at step" in where
    assert f"<td class='id'>{beta_groups[0]}</td><td>nonfinite_reward_functions</td><td>beta</td>" in where
    assert "By reward function: NaN/Inf scores per step" in where and "By slice: reward mean" in where


def correctness_worth_ten(completions, **_):
    """The issue's healthy run: correctness worth 10 (about half the completions start with one of these)..."""
    return [10.0 if c[:1] in "abcdefghijklmnopqrst" else 0.0 for c in completions]


def format_worth_two(completions, **_):
    """...and a format bonus worth 2 (a completion with a digit)."""
    return [2.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


@pytest.mark.parametrize("scale_rewards", ["none", "group", "batch"])
def test_a_healthy_trl_run_with_two_reward_functions_raises_no_alert_whatever_it_scales(scale_rewards, tmp_path):
    """Issue 25: scale_rewards="none" (Dr. GRPO) paged 8 times in 40 healthy steps; each mode is judged by its bound."""
    from advmon.alerts.evaluator import evaluate_records

    sink = ListSink()
    monitor = advmon.Monitor(f"trl-{scale_rewards}", sinks=[sink])
    trainer = trl_run.trainer(tmp_path, monitor, reward_funcs=[correctness_worth_ten, format_worth_two],
                              max_steps=40, scale_rewards=scale_rewards, learning_rate=1e-4)
    trainer.train()
    monitor.close()
    assert len(sink.records) == 40
    kind = {"none": "group_mean", "group": "group_std", "batch": "batch"}[scale_rewards]
    assert {(r.normalization, r.normalization_source) for r in sink.records} == {(kind, "declared")}
    if scale_rewards == "none":  # |A| in reward units: beyond the std bound 3 x G/sqrt(G-1) the catalog used to page on
        assert max(r.metrics["advantages/post_norm/max"] for r in sink.records) > 3 * 4 / 3 ** 0.5
    fired = [(o.alert, o.fired_step, o.value) for o in evaluate_records(sink.records)]
    zero_std = [round(r.metrics["groups/zero_std_fraction"], 2) for r in sink.records]
    assert fired == [], (fired, zero_std)

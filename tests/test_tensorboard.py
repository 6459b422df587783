"""The TensorBoard sink, read back with TensorBoard's own EventAccumulator; replay included."""

from __future__ import annotations

import math

import numpy as np
import pytest

import advmon
from advmon.cli import main as cli

from .services import require_module
from .test_monitor import run_grpo_steps

require_module("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from advmon.sinks.tensorboard import TensorBoardSink  # noqa: E402


def scalars(directory) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of the event files under ``directory``, as TensorBoard reads them."""
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    accumulator.Reload()
    return {tag: {event.step: event.value for event in accumulator.Scalars(tag)}
            for tag in accumulator.Tags()["scalars"]}


def assert_same_scalars(records, read: dict[str, dict[int, float]]) -> None:
    for record in records:
        for key, value in record.metrics.items():
            if math.isfinite(value):
                assert read[key][record.step] == pytest.approx(float(np.float32(value)), rel=1e-7, abs=1e-30), key
            else:
                assert record.step not in read.get(key, {}), key  # unavailable values are not logged


def test_every_value_reaches_tensorboard_at_its_step(tmp_path):
    monitor = advmon.Monitor("tb-run", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), f"tensorboard:{tmp_path / 'tb'}"])
    run_grpo_steps(monitor, range(2, 6), nan_at={4})
    monitor.close()
    records = advmon.read_jsonl(tmp_path / "r.jsonl")
    read = scalars(tmp_path / "tb" / "tb-run")
    assert sorted(read["rewards/mean"]) == [2, 3, 4, 5]
    assert_same_scalars(records, read)
    assert records[-1].metrics["advmon/sink_errors/tensorboard"] == 0.0  # delivered off-thread, counted


def test_replay_backfills_tensorboard(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    monitor = advmon.Monitor("tb-replay", sinks=[advmon.JsonlSink(jsonl)])
    run_grpo_steps(monitor, range(4))
    monitor.close()
    assert cli(["replay", str(jsonl), "--to", f"tensorboard:{tmp_path / 'tb'}", "--since-step", "1"]) == 0
    read = scalars(tmp_path / "tb" / "tb-replay")
    records = [r for r in advmon.read_jsonl(jsonl) if r.step >= 1]
    assert sorted(read["advantages/post_norm/std"]) == [1, 2, 3]
    assert_same_scalars(records, read)


def test_a_failing_writer_is_counted_and_training_goes_on(tmp_path, monkeypatch):
    import warnings

    def broken(self, records):
        raise OSError("disk full")

    monkeypatch.setattr(TensorBoardSink, "write_batch", broken)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        monitor = advmon.Monitor("tb-broken", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"),
                                                     TensorBoardSink(tmp_path / "tb")], retries=0)
        run_grpo_steps(monitor, range(3))
        monitor.close()
    records = advmon.read_jsonl(tmp_path / "r.jsonl")
    assert [r.step for r in records] == [0, 1, 2]
    assert any("sink tensorboard failed" in str(w.message) and "disk full" in str(w.message) for w in caught)


def test_report_and_compare_read_tensorboard_runs_and_all_sinks_agree(tmp_path, capsys):
    """Issue 19 item 3: tb+DIR is a run source; one run written by all sinks reads back to the same scalars."""
    from advmon.runs import read_run

    from .test_report_compare import same_records

    monitor = advmon.Monitor("tb-read", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), TensorBoardSink(tmp_path / "tb")])
    run_grpo_steps(monitor, range(25), nan_at={7})
    monitor.close()
    from_jsonl = read_run(tmp_path / "r.jsonl")
    from_tb = read_run(f"tb+{tmp_path / 'tb' / 'tb-read'}")
    assert from_tb.name == "tb-read" and from_tb.steps == from_jsonl.steps == list(range(25))
    as_float32 = [advmon.Record(r.run, r.step, r.time, r.estimator, None,
                                {k: float(np.float32(v)) if math.isfinite(v) else math.nan for k, v in r.metrics.items()})
                  for r in from_jsonl.records]
    from advmon.runs import Run

    same_records(Run("tb-read", "jsonl as float32", as_float32), from_tb)
    assert cli(["report", f"tb+{tmp_path / 'tb' / 'tb-read'}", "--out", str(tmp_path / "r.html")]) == 0
    assert "AdvmonNonFiniteRewards" in (tmp_path / "r.html").read_text()
    # Compare TensorBoard runs with TensorBoard runs (against its float64 JSONL a constant statistic would
    # differ by float32 rounding): the same training again is equivalent, one that fails from step 12 is not.
    for name, nan_at in (("tb-again", {7}), ("tb-broken", {7, 12})):
        monitor = advmon.Monitor(name, sinks=[advmon.JsonlSink(tmp_path / f"{name}.jsonl"),
                                              TensorBoardSink(tmp_path / "tb")])
        run_grpo_steps(monitor, range(25), nan_at=nan_at)
        monitor.close()
    capsys.readouterr()
    assert cli(["compare", f"tb+{tmp_path / 'tb' / 'tb-read'}", f"tb+{tmp_path / 'tb' / 'tb-again'}"]) == 0
    assert cli(["compare", f"tb+{tmp_path / 'tb' / 'tb-read'}", f"tb+{tmp_path / 'tb' / 'tb-broken'}"]) == 1
    assert "first divergence at step 12 (rewards/nan_count" in capsys.readouterr().out
    assert cli(["report", f"tb+{tmp_path / 'missing'}"]) == 2


def test_histograms_are_tensorboards_raw_histograms(tmp_path):
    """Each record's advantage histograms, read back as TensorBoard's own histogram events."""
    monitor = advmon.Monitor("tb-hist", sinks=[advmon.JsonlSink(tmp_path / "r.jsonl"), f"tensorboard:{tmp_path / 'tb'}"])
    run_grpo_steps(monitor, range(3))
    monitor.close()
    records = advmon.read_jsonl(tmp_path / "r.jsonl")
    accumulator = EventAccumulator(str(tmp_path / "tb" / "tb-hist"), size_guidance={"histograms": 0})
    accumulator.Reload()
    assert set(accumulator.Tags()["histograms"]) == {"histograms/advantages/pre_norm", "histograms/advantages/post_norm"}
    for stage in ("pre_norm", "post_norm"):
        events = {event.step: event.histogram_value for event in accumulator.Histograms(f"histograms/advantages/{stage}")}
        assert sorted(events) == [r.step for r in records]
        for record in records:
            histogram, read = record.histograms[stage], events[record.step]
            assert list(read.bucket_limit) == list(histogram.edges)  # multiples of a power of two: exact
            assert list(read.bucket) == [0.0, *histogram.counts]  # a leading empty bucket ends at the first edge
            assert read.num == histogram.total
            assert read.min == record.metrics[f"advantages/{stage}/min"]
            assert read.max == record.metrics[f"advantages/{stage}/max"]
    from advmon.runs import read_run

    back = read_run(f"tb+{tmp_path / 'tb' / 'tb-hist'}")
    assert [r.histograms for r in back.records] == [r.histograms for r in records]  # the report draws them from here


def test_tb_source_on_the_log_dir_reads_its_one_run_and_lists_several(tmp_path, capsys):
    """Issue 28 item 6: tb+LOGDIR is what `tensorboard --logdir` takes, the directory given to the sink."""
    from advmon.runs import read_run

    log_dir = tmp_path / "tb"
    monitor = advmon.Monitor("tb-only", sinks=[advmon.JsonlSink(tmp_path / "only.jsonl"), TensorBoardSink(log_dir)])
    run_grpo_steps(monitor, range(4))
    monitor.close()
    from_parent, from_run = read_run(f"tb+{log_dir}"), read_run(f"tb+{log_dir / 'tb-only'}")
    assert from_parent.name == "tb-only" and from_parent.steps == [0, 1, 2, 3]
    assert [r.metrics for r in from_parent.records] == [r.metrics for r in from_run.records]
    assert cli(["report", f"tb+{log_dir}", "--out", str(tmp_path / "r.html")]) == 0

    monitor = advmon.Monitor("tb-second", sinks=[TensorBoardSink(log_dir)])
    run_grpo_steps(monitor, range(2))
    monitor.close()
    capsys.readouterr()
    assert cli(["report", f"tb+{log_dir}", "--out", str(tmp_path / "r2.html")]) == 2  # which one? said, not guessed
    err = capsys.readouterr().err
    assert "holds 2 runs" in err and f"tb+{log_dir / 'tb-only'}" in err and f"tb+{log_dir / 'tb-second'}" in err
    assert not (tmp_path / "r2.html").exists()
    assert read_run(f"tb+{log_dir / 'tb-second'}").steps == [0, 1]  # each still read by its own directory

"""Recorded runs from every source, `advmon report` seen through Chromium, `advmon compare` on pairs."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest

import advmon
from advmon.cli import main
from advmon.reports.compare import compare_runs
from advmon.runs import Run, read_run
from advmon.simulation import RunSpec, simulate
from advmon.sinks.jsonl import JsonlSink
from tests.services import mlflow_sqlite_store, require_binary, require_module


def write_jsonl(path: Path, records) -> Path:
    sink = JsonlSink(path)
    for record in records:
        sink.write(record)
    sink.close()
    return path


def same_records(a: Run, b: Run) -> None:
    assert a.steps == b.steps
    keys = set().union(*(r.metrics for r in a.records)) | set().union(*(r.metrics for r in b.records))
    for ra, rb in zip(a.records, b.records):
        for key in keys:
            va, vb = ra.metrics.get(key, math.nan), rb.metrics.get(key, math.nan)
            va = math.nan if not math.isfinite(va) else va  # W&B and MLflow store no NaN/Inf
            vb = math.nan if not math.isfinite(vb) else vb
            assert (math.isnan(va) and math.isnan(vb)) or va == vb, (ra.step, key, va, vb)


# --------------------------------------------------------------------------- sources


def test_jsonl_mlflow_and_wandb_give_the_same_records(tmp_path, monkeypatch):
    require_module("mlflow")
    wandb = require_module("wandb")
    from advmon.sinks.mlflow import MlflowSink
    from advmon.sinks.wandb import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    store = mlflow_sqlite_store(tmp_path)  # its artifacts stay in tmp_path, not ./mlruns
    sinks = [JsonlSink(tmp_path / "r.jsonl"), MlflowSink(tracking_uri=store),
             WandbSink(project="advmon-runs", join_active_run=False, dir=str(tmp_path))]
    with advmon.Monitor("three-ways", sinks=sinks, reward_range=(0.0, 1.0)) as monitor:
        for step, rewards in enumerate(([1.0, 0.0, 1.0, 1.0], [0.0, 0.0, float("nan"), 1.0], [1.0, 1.0, 1.0, 1.0])):
            import torch

            monitor.observe(rewards=torch.tensor(rewards), advantages=torch.tensor(rewards) - 0.5, group_size=2)
    assert wandb.run is None
    from_jsonl = read_run(tmp_path / "r.jsonl")
    from_mlflow = read_run(f"mlflow+{store}#three-ways")
    from tests.test_wandb import run_file

    wandb_dir = run_file(tmp_path).parent
    from_wandb = read_run(wandb_dir)
    assert from_jsonl.name == from_mlflow.name == from_wandb.name == "three-ways"
    assert from_jsonl.steps == [0, 1, 2]
    same_records(from_jsonl, from_mlflow)
    same_records(from_jsonl, from_wandb)
    assert from_jsonl.records[1].metrics["rewards/nan_count"] == 1.0
    # The MLflow run id works as well as advmon's tag.
    from mlflow.tracking import MlflowClient

    (found,) = MlflowClient(store).search_runs(["0"])
    same_records(from_jsonl, read_run(f"mlflow+{store}#{found.info.run_id}"))


def test_a_file_with_several_runs_needs_one_named(tmp_path):
    path = write_jsonl(tmp_path / "both.jsonl", simulate(RunSpec("grpo_binary", steps=3)) + simulate(RunSpec("ppo_whitened", steps=3)))
    with pytest.raises(advmon.AdvmonConfigError, match="name one as"):
        read_run(path)
    assert read_run(f"{path}#ppo_whitened-s0").name == "ppo_whitened-s0"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.jsonl", "no such file"),
        (lambda d: (d / "empty.jsonl").write_text("") and d / "empty.jsonl" or d / "empty.jsonl", "no advmon records"),
        (lambda d: (d / "bad.wandb").write_bytes(b"not a wandb file") and d / "bad.wandb", "not a W&B run file"),
        (lambda d: (d / "garbage.jsonl").write_text("{]\n{}\n") and d / "garbage.jsonl", "not an advmon record"),
    ],
    ids=["missing", "empty", "unreadable-wandb", "garbage"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, message):
    source = str(make(tmp_path))
    other = write_jsonl(tmp_path / "ok.jsonl", simulate(RunSpec("grpo_binary", steps=30)))
    for argv in (["report", source, "--out", str(tmp_path / "r.html")], ["compare", source, str(other)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_no_common_steps_is_bad_input(tmp_path, capsys):
    a = write_jsonl(tmp_path / "a.jsonl", simulate(RunSpec("grpo_binary", steps=30)))
    later = [r for r in simulate(RunSpec("grpo_binary", seed=1, steps=60)) if r.step >= 30]
    b = write_jsonl(tmp_path / "b.jsonl", later)
    assert main(["compare", str(a), str(b)]) == 2
    assert "no step in common" in capsys.readouterr().err


# --------------------------------------------------------------------------- report


PROBE = """
<script>
const found = [...document.querySelectorAll('figure.plot svg')].map(svg => {
  const box = svg.getBoundingClientRect();
  const style = getComputedStyle(svg);
  return {width: box.width, height: box.height, visible: style.visibility !== 'hidden' && style.display !== 'none',
          lines: svg.querySelectorAll('path').length, text: svg.textContent.slice(0, 60)};
});
const probe = document.createElement('pre'); probe.id = 'probe'; probe.textContent = JSON.stringify(found);
document.body.appendChild(probe);
</script>
"""


def chromium(*args: str) -> subprocess.CompletedProcess:
    binary = require_binary("chromium")
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


def rendered_plots(tmp_path, page: str) -> list[dict]:
    """Each plot of ``page`` as headless Chromium lays it out (PROBE's measurements)."""
    probed = tmp_path / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = chromium("--dump-dom", probed.as_uri()).stdout
    return json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1).replace("&quot;", '"'))


@pytest.mark.integration
def test_report_renders_in_chromium_with_visible_non_empty_plots(tmp_path):
    source = write_jsonl(tmp_path / "tp2.jsonl", simulate(RunSpec("nan_rewards", seed=3, steps=60, onset=30)))
    out = tmp_path / "report.html"
    assert main(["report", str(source), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<script" not in page and "http://" not in page.split("<body>")[0]  # self-contained: nothing to fetch
    assert "AdvmonNonFiniteRewards" in page and "href='#runbook-advmonnonfiniterewards'" in page
    assert "id='runbook-advmonnonfiniterewards'" in page  # the runbook is in the page, the link cannot break
    # The header says how the run's advantages were normalized (the simulated NeMo-RL estimator: inferred).
    kinds = {f"{r.normalization} ({r.normalization_source})" for r in advmon.read_jsonl(source)}
    assert re.search(r"normalization <code>[^<]*" + re.escape(sorted(kinds)[0]), page), kinds
    plots = rendered_plots(tmp_path, page)
    assert len(plots) == 6
    for plot in plots:
        assert plot["visible"] and plot["width"] > 300 and plot["height"] > 120, plot
        assert plot["lines"] > 20, plot  # axes, ticks and data lines drawn
    shot = tmp_path / "shot.png"
    chromium("--window-size=1400,2400", f"--screenshot={shot}", out.as_uri())
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[0] >= 2000 and (pixels < 0.9).mean() > 0.02, "the page is (nearly) blank"


def test_report_png_is_one_overview_image(tmp_path):
    source = write_jsonl(tmp_path / "r.jsonl", simulate(RunSpec("zero_std_collapse", steps=50, onset=20)))
    out = tmp_path / "r.png"
    assert main(["report", str(source), "--format", "png", "--out", str(out)]) == 0
    import matplotlib.image

    pixels = matplotlib.image.imread(out)
    assert pixels.shape[1] > 1000 and pixels[..., :3].std() > 0.05


def test_a_long_run_reports_with_a_progress_bar(tmp_path, capfd):
    base = simulate(RunSpec("grpo_binary", steps=50))
    path = tmp_path / "long.jsonl"
    with path.open("w") as f:
        for step in range(100_000):
            record = base[step % len(base)]
            f.write(json.dumps({"run": "long", "step": step, "time": float(step), "estimator": "e",
                                "pre_norm_source": "derived",
                                "metrics": {k: (v if math.isfinite(v) else None) for k, v in record.metrics.items()}}) + "\n")
    assert main(["report", str(path), "--out", str(tmp_path / "long.html")]) == 0
    err = capfd.readouterr().err
    assert "report long: taking a while" in err and "done in" in err  # since it took more than a second
    assert (tmp_path / "long.html").stat().st_size < 3_000_000  # long runs are drawn reduced, not point by point


# --------------------------------------------------------------------------- compare


@pytest.mark.parametrize("kind", ["grpo_binary", "grpo_graded_loo", "grpo_small_batch", "ppo_whitened"])
def test_two_seeds_of_a_stable_recipe_are_equivalent(kind):
    a = Run("a", "sim", simulate(RunSpec(kind, seed=11, steps=150)))
    b = Run("b", "sim", simulate(RunSpec(kind, seed=12, steps=150)))
    comparison = compare_runs(a, b)
    assert not comparison.diverged, comparison.to_text()


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_a_zero_std_drift_from_step_60_is_flagged_within_40_steps(seed):
    a = Run("a", "sim", simulate(RunSpec("grpo_binary", seed=seed, steps=150)))
    b = Run("b", "sim", simulate(RunSpec("zero_std_collapse", seed=seed + 20, steps=150, onset=60)))
    comparison = compare_runs(a, b)
    assert comparison.diverged
    assert 60 <= comparison.first_divergence <= 100, comparison.to_text()


def test_demo_runs_diverge_text_json_and_html(tmp_path, capsys):
    from advmon.demo import DemoConfig, simulate_run

    config = DemoConfig(steps=60, out=tmp_path)
    tp1, tp2 = simulate_run("tp1", config, False), simulate_run("tp2", config, True)
    assert main(["compare", str(tp1), str(tp2), "--html", str(tmp_path / "cmp.html")]) == 1
    text = capsys.readouterr().out
    assert re.search(r"first divergence at step \d+", text)
    assert main(["compare", str(tp1), str(tp2), "--format", "json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["verdict"] == "diverged" and isinstance(verdict["first_divergence_step"], int)
    assert verdict["first_statistics"] and all(
        {"statistic", "diverged", "first_step", "max_abs_z"} <= set(s) for s in verdict["statistics"]
    )
    # Another seed of the same healthy recipe (not the file itself): equivalent, exit 0.
    other_tp1 = simulate_run("tp1", DemoConfig(steps=60, seed=1, out=tmp_path / "seed1"), False)
    assert main(["compare", str(tp1), str(other_tp1)]) == 0
    assert "equivalent" in capsys.readouterr().out
    assert (tmp_path / "cmp.html").read_text().count("<svg") >= 10
    # The terminal table: one column start per field on every row (however long the slice keys), no float noise.
    rows = [line for line in text.splitlines() if re.match(r"  (?!slices/)\S+ +(DIVERGED|same) ", line)]
    assert len(rows) >= 10
    assert len({re.search(r" (DIVERGED|same) ", row).start() for row in rows}) == 1
    slice_rows = [line for line in text.splitlines() if line.startswith("  slices/")]
    assert slice_rows and len({row.index(" DIVERGED at step") for row in slice_rows}) == 1
    assert not re.search(r"e-(1[3-9]|[2-9]\d)\b", text), text  # a mean of -2e-20 is 0


def _demo_runs(tmp_path):
    from advmon.demo import DemoConfig, simulate_run

    config = DemoConfig(steps=60, out=tmp_path)
    return simulate_run("tp1", config, False), simulate_run("tp2", config, True)


def test_tp1_and_tp2_differ_where_a_person_sees_it(tmp_path, capsys):
    """The seeds' use case: tp2's |A| is 7,428 at step 0 and its NaN appear at step 51; ranks alone saw neither."""
    tp1, tp2 = _demo_runs(tmp_path)
    assert main(["compare", str(tp1), str(tp2), "--format", "json"]) == 1
    verdict = json.loads(capsys.readouterr().out)
    by_key = {s["statistic"]: s for s in verdict["statistics"]}
    assert verdict["first_divergence_step"] == 0
    assert by_key["advantages/post_norm/max"]["diverged"] and by_key["advantages/post_norm/max"]["first_step"] == 0
    assert by_key["advantages/post_norm/max"]["reason"] == "magnitude"
    first_nan = min(r.step for r in advmon.read_jsonl(tp2) if r.metrics["rewards/nan_count"] > 0)
    for key in ("advantages/post_norm/nan_count", "rewards/nan_count"):
        assert (by_key[key]["diverged"], by_key[key]["first_step"], by_key[key]["reason"]) == (True, first_nan,
                                                                                                "non_finite"), key


def test_a_copy_of_a_run_broken_from_step_52_diverges_at_52_not_equivalent(tmp_path, capsys):
    """A copy of tp1 with 4,000 NaN advantages and 6 NaN rewards at every step from 52: alerts check sees two
    criticals, and compare must not call it equivalent."""
    from dataclasses import replace

    tp1, _ = _demo_runs(tmp_path)
    records = advmon.read_jsonl(tp1)
    broken = []
    for record in records:
        metrics = dict(record.metrics)
        if record.step >= 52:
            metrics.update({"advantages/post_norm/nan_count": 4000.0, "rewards/nan_count": 6.0})
        broken.append(replace(record, run="tp1-broken", metrics=metrics))
    copy = write_jsonl(tmp_path / "tp1-broken.jsonl", broken)
    assert main(["compare", str(tp1), str(copy)]) == 1
    text = capsys.readouterr().out
    assert "first divergence at step 52" in text and "NaN/Inf in one run only" in text
    assert main(["alerts", "check", str(copy)]) == 1  # the two agree that the copy is broken


@pytest.mark.parametrize("shift", [0.3, -0.3])
def test_a_level_shift_present_from_step_0_differs_from_the_start(shift):
    """Not 'first divergence at step 19': a window that needs history does not hide a difference from the start."""
    from dataclasses import replace

    a = simulate(RunSpec("grpo_binary", seed=11, steps=60))
    b = [replace(r, metrics={**r.metrics, "rewards/mean": r.metrics["rewards/mean"] + shift})
         for r in simulate(RunSpec("grpo_binary", seed=12, steps=60))]
    comparison = compare_runs(Run("a", "sim", a), Run("b", "sim", b))
    [reward] = [s for s in comparison.statistics if s.key == "rewards/mean"]
    assert (reward.diverged, reward.first_step, reward.reason) == (True, 0, "from_start"), comparison.to_text()
    assert "different from the start" in comparison.to_text()


def test_compare_names_the_slice_that_diverges_first():
    """One source's reward parser breaks at step 40 (simulated): that slice diverges before the run-wide statistics."""
    from advmon.reports.compare import compare_runs
    from advmon.runs import Run
    from advmon.simulation import RunSpec, simulate

    before = simulate(RunSpec("reward_function_none", seed=1, steps=80, onset=10_000))  # same sources, never breaks
    after = simulate(RunSpec("slice_zero_std", seed=1, steps=80, onset=40))
    comparison = compare_runs(Run("baseline", "sim", before), Run("broken", "sim", after))
    label, step, keys = comparison.first_slice
    assert label == "math" and 40 <= step <= 60 and keys
    assert not any(s.diverged for s in comparison.slices if s.key.startswith("slices/gsm8k/"))
    run_wide = comparison.first_divergence
    assert run_wide is None or step <= run_wide
    assert f"slices: math diverges first, at step {step}" in comparison.to_text()
    data = comparison.to_dict()
    assert data["first_slice"]["slice"] == "math" and data["verdict"] == "diverged"
    # The same two healthy halves do not diverge in any slice.
    same = compare_runs(Run("a", "sim", before[:40]), Run("b", "sim", after[:40]))
    assert same.first_slice is None and "none diverged" in same.to_text()


@pytest.mark.integration
def test_the_where_section_renders_in_chromium(tmp_path):
    """A drill-down run: the slice and reward-function plots are drawn and the worst groups' table is on the page."""
    source = write_jsonl(tmp_path / "r.jsonl", simulate(RunSpec("reward_function_none", seed=2, steps=40, onset=20)))
    out = tmp_path / "report.html"
    assert main(["report", str(source), "--out", str(out)]) == 0
    page = out.read_text()
    where = page[page.index("<h2>Where</h2>"):]
    assert "AdvmonRewardFunctionNonFinite function=format at step 20" in where
    assert "<td>nonfinite_reward_functions</td><td>math</td>" in where
    plots = rendered_plots(tmp_path, page)
    assert len(plots) == 6 + 6  # the run's panels, then 4 per-slice and 2 per-function ones
    for plot in plots:
        assert plot["visible"] and plot["width"] > 300 and plot["height"] > 120, plot
        assert plot["lines"] > 20, plot


@pytest.mark.integration
def test_the_demo_tp2_report_shows_its_outliers_in_the_distribution(tmp_path):
    """The report's distribution picture: post-norm histograms per step with the bound, pre-norm beside it;
    tp2's cancellation outliers sit beyond the bound in the very steps they happen (issue 19, item 2)."""
    import numpy as np

    from advmon.demo import DemoConfig, simulate_run
    from advmon.reports.plots import distribution
    from advmon.rules import Thresholds, abs_limit
    from advmon.runs import read_run

    run = read_run(simulate_run("tp2", DemoConfig(steps=40, out=tmp_path), True))
    limits = [abs_limit(r.metrics, Thresholds.with_overrides(None)) for r in run.records]
    beyond = [i for i, (r, limit) in enumerate(zip(run.records, limits))
              if max(abs(r.metrics["advantages/post_norm/min"]), abs(r.metrics["advantages/post_norm/max"])) > limit]
    assert beyond, "the demo's tp2 run has outliers"
    picture = distribution(run.records)
    assert picture.linthresh is not None  # thousands beside unit scale: a symmetric-log axis
    low_edges, high_edges = picture.value_edges[:-1], picture.value_edges[1:]
    for column, (record, limit) in enumerate(zip(run.records, limits)):
        histogram = record.histograms["post_norm"]
        if column in beyond:  # the outliers' bins lie beyond the bound, at least in part: they show there
            assert np.nansum(picture.share[column][(high_edges > limit) | (low_edges < -limit)]) > 0, record.step
        else:  # nothing beyond the bins that hold the bound (a bin's values are spread inside it only)
            top = min((e for e in histogram.edges if e >= limit), default=np.inf)
            bottom = max((e for e in histogram.edges if e <= -limit), default=-np.inf)
            assert np.nansum(picture.share[column][(low_edges >= top) | (high_edges <= bottom)]) == 0, record.step
        assert histogram.total == record.metrics["advantages/post_norm/count"] - record.metrics[
            "advantages/post_norm/nan_count"] - record.metrics["advantages/post_norm/inf_count"]
    out = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "tp2.jsonl"), "--out", str(out)]) == 0
    page = out.read_text()
    section = page[page.index("<h2>Distribution</h2>"):page.index("<h2>Where</h2>")]
    assert section.count("<svg") == 2 and "|A| bound" in section
    plots = rendered_plots(tmp_path, page)
    assert len(plots) == 6 + 2 + 6  # the run's panels, the two distributions, per-slice and per-function ones
    for plot in plots:
        assert plot["visible"] and plot["width"] > 300 and plot["height"] > 120, plot

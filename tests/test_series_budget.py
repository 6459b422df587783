"""The series budget of docs/fleet.md: what one run costs a Prometheus, measured on a real one.

The formula is worked out from the collector (``advmon/sinks/prometheus.py``) and written here once; a real
Prometheus scrapes three runs (the defaults; slices folded by ``max_slices`` with two reward functions and two
sinks; a few slices with three reward functions) and its own count of each run's series must equal it, as must
a count of the exposition's sample lines. The page must state the same formula and the default's figure.
Labels: only names from a fixed set, values from fixed sets or bounded in number and length, whatever the
trainer feeds (prompts as slice labels, group ids, long function names). And promtool's linter passes.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse

import numpy as np
import pytest
import torch

import advmon
from advmon.normalization import KINDS
from advmon.sinks.prometheus import PrometheusSink
from tests.doc_blocks import ROOT
from tests.services import http_get, require_binary, require_module, start_prometheus, wait_for

FLEET_DOC = ROOT / "docs" / "fleet.md"
#: series per run = BASE + PER_SINK x sinks + PER_SLICE x slices + PER_FUNCTION x reward functions
BASE, PER_SINK, PER_SLICE, PER_FUNCTION = 48, 2, 7, 3
GROUP = 8


def expected_series(sinks: int, slices: int, functions: int) -> int:
    return BASE + PER_SINK * sinks + PER_SLICE * slices + PER_FUNCTION * functions


def documented_default() -> int:
    """The series a run with the defaults exports, as docs/fleet.md states it."""
    return int(re.search(r"one sink,\s+\*\*(\d+) series\*\*", FLEET_DOC.read_text()).group(1))


def record_steps(monitor: advmon.Monitor, steps: int, labels: list[str] | None = None, functions: list[str] = (),
                 groups: list[str] | None = None) -> None:
    """GRPO steps: binary rewards over 64 samples, group-normalized advantages, the labels and functions given."""
    rng = np.random.default_rng(0)
    for step in range(steps):
        rewards = torch.from_numpy((rng.random(64) < 0.5).astype(np.float32))
        by_group = rewards.view(-1, GROUP)
        advantages = ((by_group - by_group.mean(1, keepdim=True)) / (by_group.std(1, keepdim=True) + 1e-6)).reshape(-1, 1)
        extra = {}
        if labels:
            extra["slices"] = [labels[i % len(labels)] for i in range(64)]
        if functions:
            extra["reward_functions"] = {name: rewards.clone() for name in functions}
        if groups:
            extra["groups"] = groups
        with monitor.step(step):
            monitor.observe(rewards=rewards, advantages=advantages.expand(64, 4), mask=torch.ones(64, 4),
                            group_size=None if groups else GROUP, **extra)


def sample_lines(exposition: str) -> list[str]:
    return [line for line in exposition.splitlines() if line and not line.startswith("#")]


#: (run, max_slices, distinct labels fed, reward functions, with a JSONL sink) -> slices exported
CONFIGURATIONS = {
    "defaults": dict(max_slices=16, labels=0, functions=0, jsonl=False, slices=0),
    "folded": dict(max_slices=4, labels=10, functions=2, jsonl=True, slices=5),  # 4 named + other
    "functions": dict(max_slices=16, labels=3, functions=3, jsonl=False, slices=3),
}


PER_RUN = urllib.parse.quote('count by (run) ({run!=""})')


@pytest.mark.integration
def test_each_run_costs_the_documented_series_on_a_real_prometheus(tmp_path):
    require_module("prometheus_client")
    monitors = {}
    try:
        for run, c in CONFIGURATIONS.items():
            sinks = [PrometheusSink(port=0)] + ([advmon.JsonlSink(tmp_path / f"{run}.jsonl")] if c["jsonl"] else [])
            monitors[run] = advmon.Monitor(run, sinks=sinks, max_slices=c["max_slices"])
            record_steps(monitors[run], 3, [f"source-{i}" for i in range(c["labels"])],
                         [f"function_{i}" for i in range(c["functions"])])
        prometheus, url = start_prometheus(tmp_path, {run: f"127.0.0.1:{m.sinks[0].port}" for run, m in monitors.items()})
        try:
            def counted() -> dict[str, int] | None:
                data = json.loads(http_get(f"{url}/api/v1/query?query={PER_RUN}"))
                steps = json.loads(http_get(f"{url}/api/v1/query?query=advmon_step"))["data"]["result"]
                if len(steps) < len(monitors):  # each record's series arrive in one scrape: wait for the last run's
                    return None
                return {found["metric"]["run"]: int(found["value"][1]) for found in data["data"]["result"]}

            series = wait_for(counted, 60, "every run's series in Prometheus")
            exposed = {run: len(sample_lines(http_get(f"http://127.0.0.1:{m.sinks[0].port}/metrics").decode()))
                       for run, m in monitors.items()}
            # Closed while Prometheus still scrapes: a close waits for the scrape that reads its run finished, a
            # second away. With Prometheus gone after one scrape, each waited out finish_timeout (60 s).
            for monitor in monitors.values():
                monitor.close()
        finally:
            prometheus.stop()
    finally:
        for monitor in monitors.values():
            monitor.close()
    formula = {run: expected_series(1 + c["jsonl"], c["slices"], c["functions"]) for run, c in CONFIGURATIONS.items()}
    assert formula == {"defaults": 50, "folded": 93, "functions": 80}
    assert series == formula == exposed
    assert series["defaults"] <= documented_default()


def test_the_page_states_the_formula_and_the_default_figure():
    text = FLEET_DOC.read_text()
    assert (f"**series per run = {BASE} + {PER_SINK} × sinks + {PER_SLICE} × slices + {PER_FUNCTION} × reward functions**"
            in text)
    assert expected_series(1, 0, 0) == documented_default() == 50
    assert f"{PER_SLICE} × 17 = {PER_SLICE * 17}" in text  # the most slices a run has by default: 16 and other


#: Every label name advmon's exposition may carry, and what its values may be.
ALLOWED = {
    "run": None,  # checked against the run
    "stage": {"reward", "pre_norm", "post_norm"},
    "kind": {"nan", "inf", *KINDS, "unknown"},
    "percentile": {"1", "10", "50", "90", "99"},
    "source": {"declared", "inferred", ""},
    "observed": {*KINDS, "unknown", ""},
    "sink": None,  # the monitor's sink names
    "slice": None,  # at most max_slices + 1, at most 64 characters
    "function": None,  # the trainer's reward functions, at most 64 characters
}


def rich_exposition(tmp_path, openmetrics: bool = False) -> tuple[str, dict]:
    """A run fed prompts as slice labels, group ids, long reward-function names and NaN rewards."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    prompts = [f"Solve for x: {i} * x + {i + 1} = {2 * i + 7}. Show your reasoning step by step." * 2 for i in range(64)]
    groups = [f"prompt-{i // GROUP:08x}-{'c0ffee' * 6}" for i in range(64)]
    functions = ["correctness", "format_" + "really_long_reward_function_name_" * 4]
    registry = CollectorRegistry(auto_describe=False)
    sinks = [PrometheusSink(registry=registry), advmon.JsonlSink(tmp_path / "rich.jsonl")]
    with advmon.Monitor("rich", sinks=sinks) as monitor:
        record_steps(monitor, 2, prompts, functions, groups)
        with monitor.step(2):
            rewards = torch.full((64,), 1.0)
            rewards[:3] = float("nan")
            monitor.observe(rewards=rewards, advantages=torch.zeros(64, 4), mask=torch.ones(64, 4), groups=groups,
                            slices=prompts, reward_functions={name: rewards.clone() for name in functions})
        monitor.flush()  # the step's record is finished off this thread: scrape once the sink has it
        text = (generate_openmetrics if openmetrics else generate_latest)(registry).decode()
    return text, {"prompts": prompts, "groups": groups, "functions": functions, "sinks": ["prometheus", "jsonl"]}


def test_labels_carry_no_ids_prompts_or_free_text(tmp_path):
    require_module("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families

    text, fed = rich_exposition(tmp_path)
    values: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert set(sample.labels) <= set(ALLOWED), (sample.name, sample.labels)
            for name, value in sample.labels.items():
                values.setdefault(name, set()).add(value)
    for name, allowed in ALLOWED.items():
        if allowed is not None:
            assert values.get(name, set()) <= allowed, (name, values.get(name))
    assert values["run"] == {"rich"}
    assert values["sink"] == set(fed["sinks"])
    assert len(values["slice"]) == 16 + 1 and "other" in values["slice"]  # 64 prompts: max_slices and other
    assert len(values["function"]) == 2
    for value in values["slice"] | values["function"]:
        assert len(value) <= 64, value
    everything = set().union(*values.values())
    # No prompt, no group id, anywhere in a label (a prompt's start survives only as a cut slice name).
    assert not everything & set(fed["prompts"]) and not any(group in value for group in fed["groups"] for value in everything)
    assert fed["functions"][1] not in values["function"]  # too long: cut to its start and a hash
    # Group ids travel as exemplars (OpenMetrics), which are no series.
    openmetrics, _ = rich_exposition(tmp_path, openmetrics=True)
    exemplars = [line for line in openmetrics.splitlines() if " # {" in line]
    assert exemplars and all(line.startswith("advmon_nonfinite_values_total{") for line in exemplars)


def test_the_exposition_passes_promtool_check_metrics(tmp_path):
    promtool = require_binary("promtool")
    require_module("prometheus_client")
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    with advmon.Monitor("plain", sinks=[PrometheusSink(registry=registry)]) as monitor:
        record_steps(monitor, 2)
    for text in (generate_latest(registry).decode(), rich_exposition(tmp_path)[0]):
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr

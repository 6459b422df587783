"""Grafana boards: lint rules, committed = fresh, and every query proven against a real Prometheus."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
import warnings
from pathlib import Path

import pytest

from advmon.alerts import AlertSettings, generate as generate_alerts
from advmon.cli import main
from advmon.dashboards import DashboardSettings, boards, generated_files
from advmon.dashboards.lint import lint
from advmon.dashboards.queries import board_queries, substitute, variable_queries
from advmon.rules import Thresholds
from tests.services import free_port, http_get, start_prometheus, start_pushgateway, wait_for

ROOT = Path(__file__).resolve().parent.parent


def board_data(settings: DashboardSettings | None = None) -> dict[str, dict]:
    settings = settings or DashboardSettings()
    return {name: board.to_json_data(settings.context) for name, board in boards(settings).items()}


def test_committed_dashboards_equal_a_fresh_generation():
    for relative, text in generated_files(DashboardSettings()).items():
        assert (ROOT / "dashboards" / relative).read_text() == text, f"dashboards/{relative} is stale"


@pytest.mark.parametrize("name", ["advmon-health.json", "advmon-compare.json"])
def test_boards_pass_the_linter_rules(name):
    data = json.loads((ROOT / "dashboards" / name).read_text())
    assert lint(data) == []
    assert data["schemaVersion"] >= 39 and data["uid"] == name.removesuffix(".json")
    assert [p for p in data["panels"] if p["type"] == "row"], "panels are grouped in rows"
    names = [v["name"] for v in data["templating"]["list"]]
    assert names[0] == "datasource" and "job" in names


def test_the_linter_catches_what_it_claims():
    data = board_data()["advmon-health.json"]
    panel = data["panels"][1]
    panel["description"] = ""
    panel["fieldConfig"]["defaults"]["unit"] = "bananas"
    panel["datasource"] = None
    panel["gridPos"]["x"] = 22
    panel["targets"][0]["expr"] = "rate(x[5m])"
    data["panels"][2]["id"] = panel["id"]
    problems = "\n".join(lint(data))
    for expected in ("no description", "bananas", "does not use the datasource variable", "not inside 24 columns",
                     "not unique", "[5m] instead of [$__rate_interval]"):
        assert expected in problems, (expected, problems)


def test_health_board_has_the_on_call_panels_and_catalog_thresholds():
    settings = DashboardSettings(thresholds=Thresholds.with_overrides({"zero_std_ratio": 0.7}))
    data = board_data(settings)["advmon-health.json"]
    titles = [p["title"] for p in data["panels"]]
    for title in ("Firing advmon alerts", "NaN/Inf values, last hour", "Zero-std group ratio", "Post-norm |A| max vs bound",
                  "Seconds since the last record", "Current step", "Post-norm mean ± std", "Post-norm percentiles",
                  "Zero-std, all-fail and all-pass groups", "Rewards: mean, min, max", "NaN/Inf values",
                  "Sink errors and dropped records"):
        assert title in titles
    zero_std = next(p for p in data["panels"] if p["title"] == "Zero-std group ratio")
    assert zero_std["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.7  # from the catalog
    assert not zero_std["links"]  # no runbooks page hosted: no dead link (the description says what red means)
    hosted = board_data(DashboardSettings(runbook_base="https://wiki.example.test/rb"))["advmon-health.json"]
    zero_std = next(p for p in hosted["panels"] if p["title"] == "Zero-std group ratio")
    assert [link["url"] for link in zero_std["links"]] == ["https://wiki.example.test/rb#advmonzerostdgroupshigh"]
    assert data["annotations"]["list"][1]["expr"].startswith("ALERTS{")
    run = next(v for v in data["templating"]["list"] if v["name"] == "run")
    assert run["multi"] and run["query"].startswith("label_values(")


def test_health_board_repeats_a_panel_per_slice_and_shows_exemplars():
    data = board_data()["advmon-health.json"]
    sliced = next(p for p in data["panels"] if p["title"] == "Slice $slice")
    assert sliced["repeat"] == "slice" and sliced["repeatDirection"] == "h"
    assert all('slice=~"$slice"' in target["expr"] for target in sliced["targets"])
    variable = next(v for v in data["templating"]["list"] if v["name"] == "slice")
    assert variable["multi"] and variable["includeAll"] and "advmon_slice_rewards" in variable["query"]
    nonfinite = next(p for p in data["panels"] if p["title"] == "NaN/Inf values")
    # One query: the per-interval counts with their exemplars (issue 39: a second target for the exemplars drew
    # the counters' running totals, thousands, over the counts).
    assert [t.get("exemplar", False) for t in nonfinite["targets"]] == [True]
    assert any(p["title"] == "Reward functions: mean and NaN/Inf scores" for p in data["panels"])


def test_selector_and_title_reach_every_query(tmp_path):
    assert main(["dashboards", "generate", "--out", str(tmp_path), "--selector", 'team="rl"', "--title", "RL / ",
                 "--datasource-uid", "prom-main"]) == 0
    data = json.loads((tmp_path / "advmon-health.json").read_text())
    assert data["title"].startswith("RL / ")
    for query in board_queries(data):
        for selector in re.findall(r"\b(advmon_\w+|ALERTS)\{([^}]*)\}", query.expr):
            assert 'team="rl"' in selector[1], query.expr
    assert "uid: prom-main" in (tmp_path / "provisioning/datasources/advmon-prometheus.yml").read_text()


# --------------------------------------------------------------------------- real Prometheus


@pytest.fixture(scope="module")
def scraped_runs(tmp_path_factory):
    """A stable and an unstable demo run exposed to a real Prometheus with advmon's rules loaded, which scrapes a
    real Pushgateway too (the health board shows whether it is up)."""
    from prometheus_client import CollectorRegistry, start_http_server

    import advmon
    from advmon.demo import DemoConfig, run_steps
    from advmon.sinks.prometheus import PrometheusSink

    workdir = tmp_path_factory.mktemp("dashboards")
    generate_alerts(workdir / "alerts", AlertSettings(interval_seconds=1.0))
    registry = CollectorRegistry(auto_describe=False)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    gateway, gateway_url = start_pushgateway(workdir)
    monitors = [advmon.Monitor(run, sinks=[PrometheusSink(registry=registry)], reward_range=(0.0, 1.0))
                for run in ("stable-run", "unstable-run")]
    prometheus, url = start_prometheus(
        workdir, {"advmon-demo": f"127.0.0.1:{server.server_port}", "pushgateway": gateway_url.removeprefix("http://")},
        rule_files=[workdir / "alerts" / "advmon-rules.yml"],
    )
    try:
        config = DemoConfig(steps=16)
        runs = [run_steps(m, config, unstable) for m, unstable in zip(monitors, (False, True))]
        wait_for(lambda: instant(url, "advmon_updates_total"), 20, "the first scrape")
        for _ in zip(*runs):
            time.sleep(0.7)
        wait_for(lambda: instant(url, 'ALERTS{alertstate="firing"}'), 20, "a firing alert")
        time.sleep(2)
        yield url, workdir
    finally:
        prometheus.stop()
        gateway.stop()
        for monitor in monitors:
            monitor.close()
        server.shutdown()


def instant(url: str, expr: str) -> list:
    data = json.loads(http_get(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"))
    assert data["status"] == "success", data
    return data["data"]["result"]


VALUES = {"job": ["advmon-demo"], "run": ["stable-run", "unstable-run"], "run_a": "stable-run", "run_b": "unstable-run",
          "shift_a": "", "slice": ["gsm8k", "competition_math"]}


@pytest.mark.integration
@pytest.mark.parametrize("name", ["advmon-health.json", "advmon-compare.json"])
def test_every_query_returns_data_from_a_real_prometheus(scraped_runs, name):
    url, _ = scraped_runs
    data = json.loads((ROOT / "dashboards" / name).read_text())
    end = time.time()
    empty = []
    for query in board_queries(data):
        expr = substitute(query.expr, VALUES, rate_interval="4s", range_="1h")
        params = urllib.parse.urlencode({"query": expr, "start": end - 60, "end": end, "step": 1})
        result = json.loads(http_get(f"{url}/api/v1/query_range?{params}"))
        assert result["status"] == "success", (query.panel, expr, result)
        if not any(series["values"] for series in result["data"]["result"]):
            empty.append(f"{query.panel}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["advmon-health.json", "advmon-compare.json"])
def test_variable_queries_return_the_runs(scraped_runs, name):
    url, _ = scraped_runs
    data = json.loads((ROOT / "dashboards" / name).read_text())
    for variable, query in variable_queries(data).items():
        match = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
        assert match, query
        selector, label = substitute(match.group(1), VALUES), match.group(2)
        params = urllib.parse.urlencode({"match[]": selector})
        values = json.loads(http_get(f"{url}/api/v1/label/{label}/values?{params}"))["data"]
        expected = {"job": {"advmon-demo"}, "slice": {"gsm8k", "competition_math"}}.get(label, {"stable-run", "unstable-run"})
        assert expected <= set(values), (variable, values)


@pytest.mark.integration
def test_a_pushgateway_that_is_down_shows_on_the_health_board_and_costs_training_nothing(tmp_path):
    """Issue 28: the delivery panel reads 1 while Prometheus reaches the gateway and 0 once it is down; the
    run's own calls go on, its failures counted, every record in its JSONL file."""
    import torch

    import advmon
    from advmon.sinks.prometheus import PushgatewaySink

    data = json.loads((ROOT / "dashboards" / "advmon-health.json").read_text())
    (expr,) = [q.expr for q in board_queries(data) if q.expr.startswith("up and on (job, instance) last_over_time("
                                                                      "pushgateway_build_info")]
    gateway, gateway_url = start_pushgateway(tmp_path)
    prometheus, url = start_prometheus(tmp_path, {"pushgateway": gateway_url.removeprefix("http://")},
                                       honor_labels=True)
    monitor = advmon.Monitor("pushed", sinks=[advmon.JsonlSink(tmp_path / "pushed.jsonl"),
                                              PushgatewaySink(gateway_url, timeout=1.0)], retries=0)
    try:
        def panel() -> list[float]:
            return [float(series["value"][1]) for series in instant(url, expr)]

        with warnings.catch_warnings(record=True):  # the failing sink is said once (on its own thread)
            warnings.simplefilter("always")
            monitor.observe(rewards=torch.tensor([1.0, 0.0]))
            wait_for(lambda: panel() == [1.0], 60, "the gateway to show as up")  # a hang guard
            gateway.stop()
            wait_for(lambda: panel() == [0.0], 60, "the gateway to show as down")  # a hang guard
            for _ in range(3):
                monitor.observe(rewards=torch.tensor([1.0, 0.0]))  # never raises
            monitor.flush()
            monitor.observe(rewards=torch.tensor([1.0, 0.0]))  # its record counts the failures before it
            assert monitor.last_metrics["advmon/sink_errors/pushgateway"] >= 3
            monitor.close()
    finally:
        monitor.close()
        prometheus.stop()
        gateway.stop()
    assert len(advmon.read_jsonl(tmp_path / "pushed.jsonl")) == 5


@pytest.mark.integration
def test_preview_draws_each_board(scraped_runs, tmp_path):
    url, _ = scraped_runs
    out = tmp_path / "health.png"
    assert main(["dashboards", "preview", "--prometheus", url, "--run", "unstable-run", "--range", "2m",
                 "--out", str(out)]) == 0
    compare = tmp_path / "compare.png"
    assert main(["dashboards", "preview", "--prometheus", url, "--board", "compare", "--run", "stable-run",
                 "--run-b", "unstable-run", "--range", "2m", "--out", str(compare)]) == 0
    import matplotlib.image

    for path in (out, compare):
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[0] > 500 and pixels.shape[1] > 1000
        assert pixels[..., :3].std() > 0.05, "the picture is blank"
    images = ROOT / "docs" / "images"
    if images.is_dir() and __import__("os").environ.get("ADVMON_WRITE_DOC_IMAGES"):
        (images / "advmon-health.png").write_bytes(out.read_bytes())
        (images / "advmon-compare.png").write_bytes(compare.read_bytes())


def test_preview_says_when_prometheus_is_unreachable(tmp_path, capsys):
    port = free_port()
    code = main(["dashboards", "preview", "--prometheus", f"http://127.0.0.1:{port}", "--run", "x",
                 "--out", str(tmp_path / "x.png")])
    assert code == 2
    assert "cannot query Prometheus" in capsys.readouterr().err


def test_demo_serve_exposes_both_runs_on_loopback():
    import threading

    from advmon.demo import DemoConfig, serve_demo

    said, stop = [], threading.Event()
    thread = threading.Thread(
        target=serve_demo, args=(DemoConfig(steps=3),), kwargs=dict(port=0, step_seconds=0.05, announce=said.append, stop=stop),
    )
    thread.start()
    try:
        wait_for(lambda: any("all steps done" in s for s in said), 30, "the demo's steps")
        endpoint = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", said[0]).group(1)
        assert f"targets: ['{endpoint}']" in said[0] and "rule_files:" in said[0]
        exposed = http_get(f"http://{endpoint}/metrics").decode()
        assert 'advmon_step{run="tp1"} 2.0' in exposed and 'advmon_step{run="tp2"} 2.0' in exposed
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


# --------------------------------------------------------------------------- the fleet board

#: A crashed trainer: one scraped monitor, a step every 0.2 s; the test SIGKILLs it.
CRASHING_TRAINER = r'''
import sys, time
import torch
import advmon
from advmon.sinks.prometheus import PrometheusSink

monitor = advmon.Monitor("fleet-crashed", sinks=[advmon.JsonlSink(sys.argv[1]), PrometheusSink(port=0)])
print(monitor.sinks[1].port, flush=True)
for step in range(10 ** 6):
    with monitor.step(step):
        monitor.observe(rewards=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]), group_size=4)
    time.sleep(0.2)
'''

FAILING = {"fleet-nan": "AdvmonNonFiniteRewards", "fleet-bound": "AdvmonAdvantageBeyondBound",
           "fleet-zero-std": "AdvmonZeroStdGroupsHigh"}


def fleet_step(monitor, rng, failure: str = "") -> None:
    """One GRPO step of 64 sequences in groups of 8, healthy or failing as ``failure`` says."""
    import numpy as np
    import torch

    rewards = (rng.random(64) < 0.5).astype(np.float32)
    if failure == "fleet-zero-std":
        rewards[:] = 1.0
    if failure == "fleet-nan":
        rewards[:3] = np.nan
    groups = rewards.reshape(-1, 8)
    std = np.nanstd(groups, axis=1, ddof=1, keepdims=True)
    advantages = (groups - np.nanmean(groups, axis=1, keepdims=True)) / (std + 1e-6)
    if failure == "fleet-bound":
        advantages = advantages * 100
    monitor.observe(rewards=torch.from_numpy(rewards), advantages=torch.from_numpy(advantages.reshape(-1).astype(np.float32)),
                    group_size=8)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """20 runs on a real Prometheus with advmon's rules: 15 healthy, 3 failing differently, 1 finished, 1 crashed."""
    import os
    import signal
    import subprocess
    import sys

    import numpy as np
    from prometheus_client import CollectorRegistry, start_http_server

    import advmon
    from advmon.sinks.prometheus import PrometheusSink

    workdir = tmp_path_factory.mktemp("fleet")
    thresholds = Thresholds.with_overrides({"silent_seconds": 4, "crash_memory_seconds": 600})
    generate_alerts(workdir / "alerts", AlertSettings(thresholds=thresholds, interval_seconds=1.0))
    registry = CollectorRegistry(auto_describe=False)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    names = [f"fleet-healthy-{i:02d}" for i in range(15)] + list(FAILING) + ["fleet-finished"]
    monitors = {name: advmon.Monitor(name, sinks=[PrometheusSink(registry=registry)], reward_range=(0.0, 1.0))
                for name in names}
    script = workdir / "crashing.py"
    script.write_text(CRASHING_TRAINER)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ADVMON_")}, "PYTHONPATH": str(ROOT)}
    crashing = subprocess.Popen([sys.executable, str(script), str(workdir / "crashed.jsonl")], stdout=subprocess.PIPE,
                                text=True, env=env)
    prometheus = None
    try:
        port = int(crashing.stdout.readline())
        prometheus, url = start_prometheus(
            workdir, {"fleet": f"127.0.0.1:{server.server_port}", "fleet-crashed": f"127.0.0.1:{port}"},
            rule_files=[workdir / "alerts" / "advmon-rules.yml"])
        rng = np.random.default_rng(7)
        wait_for(lambda: len(instant(url, "advmon_run_finished")) == 20, 60, "the 20 runs' first scrape")  # hang guard
        step = 0

        def tick(only: tuple[str, ...] = ()) -> None:
            nonlocal step
            for name, monitor in monitors.items():
                if not monitor.closed and (not only or name in only):
                    with monitor.step(step):
                        fleet_step(monitor, rng, name if name in FAILING else "")
            step += 1
            time.sleep(0.5)

        for _ in range(4):
            tick()
        monitors["fleet-finished"].close()
        crashing.send_signal(signal.SIGKILL)
        crashing.wait(30)

        def settled() -> bool:
            fired = {(a["metric"]["run"], a["metric"]["alertname"]) for a in instant(url, 'ALERTS{alertstate="firing"}')}
            return set(FAILING.items()) | {("fleet-crashed", "AdvmonRunCrashed")} <= fired

        for _ in range(120):  # a hang guard: the zero-std alert needs 3 records, the crash 4 s of silence
            if settled():
                break
            tick()
        assert settled(), instant(url, 'ALERTS{alertstate="firing"}')
        tick()
        # The NaN alert fires while the counter rises: fleet-nan goes on failing, on its own thread, while the
        # tests read the board (the other runs stand still, so their last records are what Prometheus holds).
        import threading

        stop = threading.Event()

        def keep_failing() -> None:
            while not stop.is_set():
                tick(only=("fleet-nan",))

        ticker = threading.Thread(target=keep_failing, daemon=True)
        ticker.start()
        time.sleep(2)
        yield url, monitors, step
        stop.set()
        ticker.join(30)
    finally:
        if crashing.poll() is None:
            crashing.kill()
        crashing.stdout.close()
        if prometheus is not None:
            prometheus.stop()
        for monitor in monitors.values():
            monitor.close()
        server.shutdown()


def fleet_values(job: str = "fleet") -> dict:
    return {"job": [job], "__data": ""}


def by_run(url: str, expr: str) -> dict[str, dict]:
    return {series["metric"]["run"]: series for series in instant(url, expr)}


@pytest.mark.integration
def test_every_fleet_query_is_valid_and_returns_data_on_a_real_prometheus(fleet):
    url, _, _ = fleet
    data = json.loads((ROOT / "dashboards" / "advmon-fleet.json").read_text())
    assert lint(data) == []
    empty = []
    for query in board_queries(data):
        expr = substitute(query.expr, fleet_values())
        if not instant(url, expr):
            empty.append(f"{query.panel}: {expr}")
    assert not empty, "queries without data:\n" + "\n".join(empty)
    (variable,) = variable_queries(data).values()
    selector = re.fullmatch(r"label_values\((.*), job\)", variable).group(1)
    values = json.loads(http_get(f"{url}/api/v1/label/job/values?{urllib.parse.urlencode({'match[]': selector})}"))
    assert {"fleet", "fleet-crashed"} <= set(values["data"])


@pytest.mark.integration
def test_the_fleet_table_tells_each_run_its_state_and_worst_alert_worst_first(fleet):
    url, monitors, _ = fleet
    data = json.loads((ROOT / "dashboards" / "advmon-fleet.json").read_text())
    table = next(p for p in data["panels"] if p["type"] == "table")
    queries = {target["refId"]: substitute(target["expr"], {"job": ["fleet|fleet-crashed"]}) for target in table["targets"]}
    state = {run: float(s["value"][1]) for run, s in by_run(url, queries["A"]).items()}
    assert len(state) == 20
    mappings = next(o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "State")["properties"]
    codes = {entry["text"]: int(key) for mapping in next(p for p in mappings if p["id"] == "mappings")["value"]
             for key, entry in mapping["options"].items()}
    expected = {run: codes["running"] for run in monitors}
    expected.update({"fleet-finished": codes["finished"], "fleet-crashed": codes["crashed"]})
    assert state == expected
    worst = {run: s["metric"]["alertname"] for run, s in by_run(url, queries["B"]).items()}
    # The worst: of the run's firing alerts, one of the highest severity (NaN rewards also make NaN advantages,
    # both critical), read from ALERTS by hand.
    rank = {"critical": 3, "warning": 2, "info": 1}
    firing: dict[str, dict[str, int]] = {}
    for alert in instant(url, 'ALERTS{alertstate="firing"}'):
        firing.setdefault(alert["metric"]["run"], {})[alert["metric"]["alertname"]] = rank[alert["metric"]["severity"]]
    assert set(worst) == set(firing) == {*FAILING, "fleet-crashed"}
    for run, name in worst.items():
        assert firing[run][name] == max(firing[run].values()), (run, name, firing[run])
    assert {**FAILING, "fleet-crashed": "AdvmonRunCrashed"}.items() <= {(r, a) for r in firing for a in firing[r]}
    severity = {run: float(s["value"][1]) for run, s in by_run(url, queries["C"]).items()}
    ordered = sorted(severity, key=lambda run: -severity[run])
    assert set(ordered[:3]) == {"fleet-nan", "fleet-bound", "fleet-crashed"}  # critical first
    assert ordered[3] == "fleet-zero-std" and ordered[-1] == "fleet-finished"  # then the warning; finished last
    # The statistics against the records themselves (the scraped monitors' last ones).
    steps = {run: float(s["value"][1]) for run, s in by_run(url, queries["D"]).items()}
    zero_std = {run: float(s["value"][1]) for run, s in by_run(url, queries["F"]).items()}
    abs_max = {run: float(s["value"][1]) for run, s in by_run(url, queries["G"]).items()}
    for run, monitor in monitors.items():
        if run == "fleet-nan":
            continue  # still recording
        record = monitor.last_record
        assert steps[run] == record.step, run
        assert zero_std[run] == pytest.approx(record.metrics["groups/zero_std_count"] / record.metrics["groups/comparable_count"])
        assert abs_max[run] == pytest.approx(max(abs(record.metrics["advantages/post_norm/min"]),
                                                 abs(record.metrics["advantages/post_norm/max"])))
    nonfinite = {run: float(s["value"][1]) for run, s in by_run(url, queries["I"]).items()}
    assert nonfinite["fleet-nan"] >= 3 and all(value == 0 for run, value in nonfinite.items() if run != "fleet-nan")
    link = next(o for o in table["fieldConfig"]["overrides"] if o["matcher"]["options"] == "run")["properties"]
    url_template = next(p for p in link if p["id"] == "links")["value"][0]["url"]
    assert url_template == ("/d/advmon-health?var-job=${__data.fields.job}&var-run=${__data.fields.run}"
                            "&time=${__data.fields.last_record_ms}&time.window=3600000")
    last_ms = {run: float(s["value"][1]) for run, s in by_run(url, queries["J"]).items()}
    assert last_ms["fleet-finished"] == pytest.approx(monitors["fleet-finished"].last_record.time * 1000)


@pytest.mark.integration
def test_a_fleet_selection_that_matches_nothing_says_so(fleet):
    url, _, _ = fleet
    data = json.loads((ROOT / "dashboards" / "advmon-fleet.json").read_text())
    runs = next(p for p in data["panels"] if p["title"] == "Runs")
    (value,) = instant(url, substitute(runs["targets"][0]["expr"], fleet_values("no-such-job")))
    shown = runs["fieldConfig"]["defaults"]["mappings"][0]["options"][str(int(float(value["value"][1])))]["text"]
    assert shown.startswith("No advmon run matches this selection")
    (value,) = instant(url, substitute(runs["targets"][0]["expr"], fleet_values()))
    assert float(value["value"][1]) == 19  # the crashed run is in job fleet-crashed
    table = next(p for p in data["panels"] if p["type"] == "table")
    assert table["fieldConfig"]["defaults"]["noValue"] == shown

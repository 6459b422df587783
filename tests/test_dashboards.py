"""Grafana boards: lint rules, committed = fresh, and every query proven against a real Prometheus."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path

import pytest

from advmon.alerts import AlertSettings, generate as generate_alerts
from advmon.cli import main
from advmon.dashboards import DashboardSettings, boards, generated_files
from advmon.dashboards.lint import lint
from advmon.dashboards.queries import board_queries, substitute, variable_queries
from advmon.rules import Thresholds
from tests.services import free_port, http_get, start_prometheus, wait_for

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
    assert [t.get("exemplar", False) for t in nonfinite["targets"]] == [False, True]
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
    """A stable and an unstable demo run exposed to a real Prometheus with advmon's rules loaded."""
    from prometheus_client import CollectorRegistry, start_http_server

    import advmon
    from advmon.demo import DemoConfig, run_steps
    from advmon.sinks.prometheus import PrometheusSink

    workdir = tmp_path_factory.mktemp("dashboards")
    generate_alerts(workdir / "alerts", AlertSettings(interval_seconds=1.0))
    registry = CollectorRegistry(auto_describe=False)
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    monitors = [advmon.Monitor(run, sinks=[PrometheusSink(registry=registry)], reward_range=(0.0, 1.0))
                for run in ("stable-run", "unstable-run")]
    prometheus, url = start_prometheus(
        workdir, {"advmon-demo": f"127.0.0.1:{server.server_port}"},
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

"""Issue 39: each board of ``advmon dashboards preview`` looked at as a person would, on the demo's runs.

One ``advmon demo --serve`` (``tp1`` stable, ``tp2`` unstable, two slices) scraped by a real Prometheus with
advmon's rules loaded; the three boards drawn once, as the CLI draws them. The checks read what the preview drew
(its layout and the texts it wrote) against what Prometheus holds:

* the ``Slice $slice`` panel is repeated once per slice of the demo, each copy titled and filled by its slice;
* no title or drawing leaves its panel's cell (titles used to cover the tick labels of the panel above);
* every stat shows the value Prometheus returns, in the panel's unit (``percentunit``: a fraction x 100).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.parse
from pathlib import Path

import pytest

from advmon.alerts import AlertSettings, generate as generate_alerts
from advmon.cli import main
from tests.services import http_get, start_prometheus, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("tests/test_preview_looks.py")]

ROOT = Path(__file__).resolve().parent.parent
RUNS = ("tp1", "tp2")


def instant(url: str, expr: str, at: float | None = None) -> list:
    params = {"query": expr, **({"time": at} if at is not None else {})}
    data = json.loads(http_get(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}"))
    assert data["status"] == "success", data
    return data["data"]["result"]


def board_json(name: str) -> dict:
    return json.loads((ROOT / "dashboards" / f"advmon-{name}.json").read_text())


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo's two runs, served and scraped until its 60 steps are done; the three boards drawn from them."""
    import matplotlib.pyplot as plt

    from advmon.demo import DemoConfig, serve_demo
    from advmon.dashboards.preview import draw_board

    workdir = tmp_path_factory.mktemp("preview_looks")
    generate_alerts(workdir / "alerts", AlertSettings(interval_seconds=1.0))
    said, stop = [], threading.Event()
    thread = threading.Thread(target=serve_demo, args=(DemoConfig(steps=60),),
                              kwargs=dict(port=0, step_seconds=0.2, announce=said.append, stop=stop))
    thread.start()
    prometheus = None
    try:
        wait_for(lambda: said, 30, "the demo's endpoint")  # a hang guard
        endpoint = re.search(r"http://(127\.0\.0\.1:\d+)/metrics", said[0]).group(1)
        prometheus, url = start_prometheus(workdir, {"advmon-demo": endpoint},
                                           rule_files=[workdir / "alerts" / "advmon-rules.yml"],
                                           features=("exemplar-storage",))
        wait_for(lambda: any("all steps done" in s for s in said), 60, "the demo's 60 steps")  # a hang guard
        wait_for(lambda: instant(url, 'advmon_step{run="tp2"} == 59'), 20, "the last step's scrape")
        wait_for(lambda: instant(url, "run:advmon_step:max == 59"), 20, "the recording rules")
        time.sleep(1.5)
        now = time.time()
        values = {"job": ".*", "run": list(RUNS), "run_a": "tp1", "run_b": "tp2", "shift_a": ""}
        drawn = {}
        for name in ("health", "compare", "fleet"):
            figure, panels = draw_board(board_json(name), url, values, range_seconds=120, now=now)
            out = workdir / f"{name}.png"
            figure.savefig(out, facecolor="white")
            drawn[name] = (panels, out, tuple(figure.bbox.size))
            plt.close(figure)
        yield url, now, drawn
    finally:
        stop.set()
        thread.join(10)
        if prometheus is not None:
            prometheus.stop()


def test_the_slice_panel_is_repeated_once_per_slice_of_the_demo_with_its_data(demo):
    url, now, drawn = demo
    panels, _, _ = drawn["health"]
    slices = sorted({s["metric"]["slice"] for s in instant(url, 'advmon_slice_rewards{run=~"tp1|tp2"}', now)})
    assert slices == ["competition_math", "gsm8k"]  # the demo's data mix
    copies = [p for p in panels if p.title.startswith("Slice ")]
    assert [p.title for p in copies] == [f"Slice {s}" for s in slices]  # never the raw "Slice $slice"
    for panel, name in zip(copies, slices):
        assert panel.values == {"slice": name}
        assert all(f'slice=~"{name}"' in expr for expr in panel.exprs), panel.exprs
        assert panel.series == 4 * len(RUNS), (panel.title, panel.series)  # 4 statistics of each run: data
        assert panel.grid[2] == 12  # two copies side by side fill the row, as Grafana places them
        assert panel.right_series == len(RUNS)  # max |A| (thousands in tp2) on its own axis, beside the shares
    assert copies[0].grid[1] == copies[1].grid[1] and copies[0].grid[0] + 12 == copies[1].grid[0]


def test_no_panel_draws_outside_its_cell_and_no_title_covers_another_panel(demo):
    _, _, drawn = demo
    for name, (panels, out, size) in drawn.items():
        import matplotlib.image

        assert matplotlib.image.imread(out).shape[:2] == (round(size[1]), round(size[0]))  # the layout's pixels
        for panel in panels:
            x0, y0, x1, y1 = panel.box
            for what, (a0, b0, a1, b1) in (("title", panel.title_box), ("drawing", panel.content_box)):
                assert x0 - 1 <= a0 and a1 <= x1 + 1 and y0 - 1 <= b0 and b1 <= y1 + 1, \
                    f"{name}: the {what} of {panel.title!r} leaves its cell: {(a0, b0, a1, b1)} not in {panel.box}"
            assert panel.title_box[1] >= panel.content_box[3] - 1 or panel.kind == "row", \
                f"{name}: the title of {panel.title!r} overlaps its own drawing"
        for i, a in enumerate(panels):
            for b in panels[i + 1:]:
                assert not _overlap(a.box, b.box), f"{name}: {a.title!r} and {b.title!r} share pixels"
                for one, other in ((a, b), (b, a)):
                    for box in (other.title_box, other.content_box):
                        assert not _overlap(one.title_box, box), \
                            f"{name}: the title of {one.title!r} covers {other.title!r}"


def test_the_nonfinite_panel_draws_counts_per_interval_with_their_exemplars_not_running_totals(demo):
    """The exemplars came with a second target, the raw counter, which drew each series' running total (26000
    for tp2) over the per-interval counts; Prometheus returns the exemplars of the counter inside the count's
    query itself."""
    url, _, drawn = demo
    (panel,) = [p for p in drawn["health"][0] if p.title == "NaN/Inf values"]
    assert panel.exprs and all(expr.startswith("sum by (run, stage, kind) (increase(") for expr in panel.exprs)
    assert panel.exemplars, "no exemplar dots"
    assert {series["run"] for series, _, _, _ in panel.exemplars} == {"tp2"}  # its reward model returns NaN
    assert all({"group", "slice"} <= set(labels) for _, labels, _, _ in panel.exemplars)


def _overlap(a, b) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > 1 and min(a[3], b[3]) - max(a[1], b[1]) > 1


def _shown_number(text: str, unit: str) -> float:
    """The number a stat's text says, in the panel's unit (Grafana's: percentunit 0.25 reads 25%)."""
    if unit in ("percentunit", "percent"):
        assert text.endswith("%"), text
        number = float(text[:-1])
        return number / 100 if unit == "percentunit" else number
    if unit == "s":
        number, scale = text.split(" ")
        return float(number) * {"ms": 0.001, "s": 1, "min": 60, "hour": 3600, "day": 86400}[scale]
    return float(text)


def test_every_stat_shows_what_prometheus_returns_in_its_unit(demo):
    url, now, drawn = demo
    checked = 0
    for name, (panels, _, _) in drawn.items():
        for panel in (p for p in panels if p.kind == "stat"):
            results = [s for expr in panel.exprs for s in instant(url, expr, now)]
            assert panel.shown, f"{name}: {panel.title} shows {panel.text!r}"
            expected = sorted(float(s["value"][1]) for s in results)
            assert sorted(value for _, value, _ in panel.shown) == pytest.approx(expected), (name, panel.title)
            for _, value, text in panel.shown:
                assert "e+" not in text and "e-" not in text, (panel.title, text)  # no exponents on a board
                if re.fullmatch(r"[-0-9.]+(%| ms| s| min| hour| day)?", text) is None:
                    continue  # a value mapped to words (the fleet's "Runs" at 0)
                shown = _shown_number(text, panel.unit)
                assert shown == pytest.approx(value, rel=0.02, abs=0.5 if panel.unit in ("none", "s") else 0.005), \
                    (name, panel.title, panel.unit, value, text)
                if panel.unit == "percentunit":
                    assert 0 <= value <= 1, (panel.title, value)  # a share, never a multiple shown in percent
            checked += 1
    assert checked >= 12  # the health board's six and the fleet's six


def test_the_health_stats_of_the_demo_read_as_a_person_expects(demo):
    url, now, drawn = demo
    panels = {p.title: p for p in drawn["health"][0]}
    ratio = max(float(s["value"][1]) for s in instant(url, 'advmon_zero_std_group_ratio{run=~"tp1|tp2"}', now))
    assert panels["Zero-std group ratio"].text == f"{100 * ratio:.{_decimals(100 * ratio)}f}%"
    step = panels["Current step"].text
    assert step == "59"
    nonfinite = panels["NaN/Inf values, last hour"].text
    assert re.fullmatch(r"\d+", nonfinite) and int(nonfinite) > 0  # tp2's reward model returns NaN late


def test_the_bound_stat_reads_the_multiple_the_alert_gives_when_the_std_cancels(demo):
    """The stat read 280768% while tp2's |A| was 8423x its bound: a multiple divided by bound_factor (3) and
    shown in percent. It now shows the alert's own number, red from bound_factor as the alert fires."""
    from advmon.dashboards.preview import draw_board
    from advmon.rules import Thresholds

    import matplotlib.pyplot as plt

    url, now, _ = demo
    ratios = json.loads(http_get(f"{url}/api/v1/query_range?" + urllib.parse.urlencode(
        {"query": 'advmon_advantage_bound_ratio{run="tp2"}', "start": now - 120, "end": now, "step": 1})))
    (series,) = ratios["data"]["result"]
    at, peak = max(((float(t), float(v)) for t, v in series["values"]), key=lambda point: point[1])
    assert peak > 1000  # tp2's one-pass float32 std: advantages in the thousands
    figure, panels = draw_board(board_json("health"), url, {"job": ".*", "run": list(RUNS)}, range_seconds=60, now=at)
    plt.close(figure)
    stat = next(p for p in panels if p.title == "Post-norm |A| max vs bound")
    ((_, value, text),) = stat.shown
    assert value == pytest.approx(peak) and stat.unit == "none"
    assert text == f"{peak:.0f}" and "%" not in text  # 8423, as "reached 8423x what its normalization allows"
    panel = next(p for p in board_json("health")["panels"] if p["title"] == stat.title)
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1] == {"color": "red", "value": Thresholds.with_overrides()["bound_factor"]}
    fleet = next(p for p in board_json("fleet")["panels"] if p["type"] == "table")
    column = next(o for o in fleet["fieldConfig"]["overrides"] if o["matcher"]["options"] == "|A| / bound")
    assert {"id": "unit", "value": "none"} in column["properties"]  # the fleet's column: the same multiple


def _decimals(value: float) -> int:
    if value % 1 == 0:
        return 0
    decimals = -math.floor(math.log10(abs(value))) + 1
    return max(0, decimals + (abs(value) * 10 ** decimals > 2.25))


def test_the_fleet_table_has_a_row_per_demo_run(demo):
    _, _, drawn = demo
    panels = {p.title: p for p in drawn["fleet"][0]}
    table = panels["Runs, worst first"]
    assert sorted(row["run"] for row in table.rows) == list(RUNS)
    assert list(table.rows[0]) == ["run", "job", "State", "Worst alert", "Severity", "Step", "Since last record",
                                   "Zero-std ratio", "|A| max", "|A| / bound", "NaN/Inf, last hour"]
    assert table.rows[0]["run"] == "tp2"  # the worst first: its alerts are critical
    assert {row["State"] for row in table.rows} == {"running"} and {row["Step"] for row in table.rows} == {"59"}
    (runs,) = [p for p in drawn["fleet"][0] if p.title == "Runs" and p.kind == "stat"]
    assert runs.text == "2"


def test_the_cli_preview_draws_the_slices(demo, tmp_path):
    url, _, _ = demo
    out = tmp_path / "health.png"
    assert main(["dashboards", "preview", "--prometheus", url, "--run", "tp1", "--run", "tp2", "--range", "2m",
                 "--out", str(out)]) == 0
    assert out.stat().st_size > 10_000

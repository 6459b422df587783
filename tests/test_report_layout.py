"""What a person sees on the report and comparison pages, the PNG overview and the terminal (issue 30, item 8).

The pages are laid out by headless Chromium and measured in its DOM: the plots' text
(tick labels, titles, axis labels, legends) as drawn on screen, each plot's size. The
plots themselves are checked where matplotlib knows what they hold (every band and
shaded span is named in the legend).
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import advmon
from advmon.cli import main
from advmon.progress import Progress
from advmon.reports.terminal import TABLE
from advmon.simulation import RunSpec, simulate
from tests.test_report_compare import chromium, write_jsonl

# Each plot's text boxes, in screen pixels, per axes: its data area, its title and axis labels, the tick labels of
# each axis, its legend. Matplotlib's SVG names its groups axes_N, patch_N (the first: the data area),
# matplotlib.axis_N (xtick_N/ytick_N, each with a text_N label), legend_N.
LAYOUT_PROBE = """
<script>
const box = el => { const b = el.getBoundingClientRect(); return [b.left, b.top, b.width, b.height]; };
const plots = [...document.querySelectorAll('figure.plot svg')].map(svg => ({
  size: box(svg),
  axes: [...svg.querySelectorAll('g[id^="axes_"]')].map(axes => ({
    area: box(axes.querySelector(':scope > g[id^="patch_"]')),
    texts: [...axes.querySelectorAll(':scope > g[id^="text_"]')].map(box),
    axis: [...axes.querySelectorAll(':scope > g[id^="matplotlib.axis_"]')].map(axis => ({
      ticks: [...axis.querySelectorAll(':scope > g[id*="tick_"] > g[id^="text_"]')].map(box),
      label: [...axis.querySelectorAll(':scope > g[id^="text_"]')].map(box),
    })),
    legend: [...axes.querySelectorAll(':scope > g[id^="legend_"]')].map(box),
  })),
}));
const first = [...document.body.children].find(el => el.getBoundingClientRect().height > 0);
const probe = document.createElement('pre'); probe.id = 'probe';
probe.textContent = JSON.stringify({plots, first: first.tagName, first_top: box(first)[1],
  cells: [...document.querySelectorAll('td.num')].map(td => td.textContent)});
document.body.appendChild(probe);
</script>
"""


def rendered_layout(tmp_path: Path, page: str) -> dict:
    probed = tmp_path / "layout.html"
    probed.write_text(page.replace("</body>", LAYOUT_PROBE + "</body>"))
    dom = chromium("--window-size=1400,3000", "--dump-dom", probed.as_uri()).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def overlap(a: list[float], b: list[float], slack: float = 0.5) -> bool:
    """Whether two boxes ``[left, top, width, height]`` share more than a hair."""
    return (a[0] < b[0] + b[2] - slack and b[0] < a[0] + a[2] - slack
            and a[1] < b[1] + b[3] - slack and b[1] < a[1] + a[3] - slack)


def assert_readable(layout: dict, page: str) -> None:
    """No two tick labels of an axis overlap; no legend covers the data or any text of its plot; every plot of the
    page is drawn at one size (a plot scaled down beside the others has smaller text)."""
    sizes = {tuple(round(v) for v in plot["size"][2:]) for plot in layout["plots"]}
    assert len(sizes) == 1, (page, sizes)
    for number, plot in enumerate(layout["plots"]):
        for axes in plot["axes"]:
            texts = axes["texts"] + [b for axis in axes["axis"] for b in axis["ticks"] + axis["label"]]
            for axis in axes["axis"]:
                ticks = [b for b in axis["ticks"] if b[2] > 0]
                for i, a in enumerate(ticks):
                    for b in ticks[i + 1:]:
                        assert not overlap(a, b), (page, number, "tick labels overlap", a, b)
            for legend in axes["legend"]:
                assert not overlap(legend, axes["area"]), (page, number, "the legend covers the data", legend)
                for text in texts:
                    assert not overlap(legend, text), (page, number, "the legend covers a label", legend, text)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from advmon.demo import DemoConfig, simulate_run

    out = tmp_path_factory.mktemp("demo")
    config = DemoConfig(steps=60, out=out)
    return simulate_run("tp1", config, False), simulate_run("tp2", config, True)


def report_page(tmp_path: Path, source: Path, *extra: str) -> str:
    out = tmp_path / f"{source.stem}.html"
    assert main(["report", str(source), "--out", str(out), *extra]) == 0
    return out.read_text()


# --------------------------------------------------------------------------- the pages in Chromium


@pytest.mark.integration
@pytest.mark.parametrize("run", ["tp1", "tp2"])
def test_report_text_never_overlaps_and_legends_leave_the_data_free(tmp_path, demo, run):
    """tp2 has the symmetric-log plots (|A| of 7,428 beside unit-scale values: the 10^0 and -10^0 labels of the
    distribution plot overlapped), the alert spans and the drill-down plots; tp1 the plain ones."""
    from advmon.reports.plots import PANELS, where_panels

    source = dict(zip(("tp1", "tp2"), demo))[run]
    page = report_page(tmp_path, source)
    layout = rendered_layout(tmp_path, page)
    records = advmon.read_jsonl(source)
    assert len(layout["plots"]) == len(PANELS) + 2 + len(where_panels(records))  # 2: the distributions
    assert_readable(layout, run)


@pytest.mark.integration
def test_the_distribution_plot_has_readable_symlog_ticks(tmp_path, demo):
    """The post-norm distribution of tp2: a symmetric-log axis from -3,184 to 7,428, ticks at 0 and powers of ten,
    at least four of them, none touching another."""
    page = report_page(tmp_path, demo[1])
    section = page[page.index("<h2>Distribution</h2>"):page.index("<h2>Where</h2>")]
    assert "Post-norm advantages: distribution per step" in _svg_comments(section.split("</figure>")[0])
    layout = rendered_layout(tmp_path, page)
    post_norm = layout["plots"][page[:page.index("<h2>Distribution</h2>")].count("<figure class='plot'>")]
    y_ticks = [b for b in post_norm["axes"][0]["axis"][1]["ticks"] if b[2] > 0]
    assert len(y_ticks) >= 4, y_ticks
    centers = sorted(b[1] + b[3] / 2 for b in y_ticks)
    heights = max(b[3] for b in y_ticks)
    assert min(np.diff(centers)) >= heights, (centers, heights)  # a label's height apart at least


@pytest.mark.integration
def test_a_report_without_some_statistics_says_so_and_stays_readable(tmp_path):
    """A run that recorded only post-norm advantages: the other plots say what is missing instead of staying
    empty, and their step axis is the run's."""
    records = [replace(r, metrics={k: v for k, v in r.metrics.items() if k.startswith("advantages/post_norm")},
                       histograms={})
               for r in simulate(RunSpec("ppo_advantage_explosion", seed=1, steps=60, onset=30))]
    page = report_page(tmp_path, write_jsonl(tmp_path / "sparse.jsonl", records))
    for missing in ("advantages/pre_norm/*", "groups/*", "rewards/*"):
        assert f"no data: this run recorded no {missing}".replace("*", "") in _svg_comments(page), missing
    assert_readable(rendered_layout(tmp_path, page), "sparse")


def _svg_comments(page: str) -> str:
    """The text of the plots (matplotlib draws text as paths and writes each string beside it as a comment)."""
    return " ".join(re.findall(r"<!-- (.*?) -->", page))


@pytest.mark.integration
def test_the_comparison_page_is_readable(tmp_path, demo):
    out = tmp_path / "compare.html"
    assert main(["compare", str(demo[0]), str(demo[1]), "--html", str(out)]) == 1
    page = out.read_text()
    assert "<script" not in page and "<pre>" not in page  # a table, not the terminal text in a box
    layout = rendered_layout(tmp_path, page)
    assert len(layout["plots"]) >= 10
    assert_readable(layout, "compare")
    # Statistics both runs hold constant and equal (no Inf anywhere) are named, not drawn as flat lines.
    assert re.search(r"Not drawn: .*rewards/inf_count.*0 in both runs at every step", page)
    assert page.count("<figure class='plot'>") == page.count("<svg")


@pytest.mark.integration
def test_tables_show_numbers_as_a_person_reads_them(tmp_path, demo):
    """At most 4 significant digits, thousands separated; no 0.99999 for 1 nor -1.96e-20 for 0."""
    cells = rendered_layout(tmp_path, report_page(tmp_path, demo[1]))["cells"]
    out = tmp_path / "compare.html"
    main(["compare", str(demo[0]), str(demo[1]), "--html", str(out)])
    cells += rendered_layout(tmp_path, out.read_text())["cells"]
    numbers = [c for c in cells if re.search(r"\d", c) and not c.endswith("x")]
    assert len(numbers) > 50
    for cell in numbers:
        assert re.fullmatch(r"-?(\d{1,3}(,\d{3})*|\d*\.\d+|\d(\.\d+)?e[+-]\d+)", cell), cell
        if "." in cell:
            assert len(cell.lstrip("-").split("e")[0].replace(".", "").lstrip("0")) <= 4, cell
        assert not re.search(r"e-(1[2-9]|[2-9]\d)", cell), cell  # float noise shown as a number


@pytest.mark.integration
def test_the_page_starts_at_the_top(tmp_path, demo):
    layout = rendered_layout(tmp_path, report_page(tmp_path, demo[1]))
    assert layout["first"] == "H1" and layout["first_top"] < 40


# --------------------------------------------------------------------------- the plots' legends


def _drawn_panels(records, spans):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from advmon.reports.plots import PANELS, draw_panel, where_panels

    for panel in (*PANELS, *where_panels(records)):
        figure, axes = plt.subplots()
        draw_panel(axes, panel, [("run", records)], spans)
        yield panel.title, axes
        plt.close(figure)


def test_every_band_and_shaded_span_is_in_its_legend(demo):
    """The percentile plot's p10-p90 band, the mean ± std bands and the alert spans: each fill a plot draws has a
    legend entry (matplotlib's polygons and rectangles drawn in the data area, against the legend's texts)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Polygon, Rectangle

    from advmon.alerts.evaluator import evaluate_records
    from advmon.reports.html_page import alert_spans
    from advmon.reports.plots import draw_distribution

    records = advmon.read_jsonl(demo[1])
    spans = alert_spans(evaluate_records(records))
    assert {severity for _, _, severity in spans} == {"critical", "warning"}
    checked = 0
    for title, axes in _drawn_panels(records, spans):
        legend = axes.get_legend()
        named = {text.get_text() for text in legend.get_texts()} if legend else set()
        fills = [a for a in axes.collections if isinstance(a, PolyCollection)]
        fills += [p for p in axes.patches if isinstance(p, (Polygon, Rectangle)) and p.get_visible()]
        for fill in fills:
            same = [f for f in fills if f.get_facecolor() is not None and np.allclose(
                np.asarray(f.get_facecolor()).ravel()[:4], np.asarray(fill.get_facecolor()).ravel()[:4])]
            assert any(f.get_label() in named for f in same), (title, fill.get_label(), named)
            checked += 1
    assert checked > 20
    steps = np.array([r.step for r in records], dtype=float)
    figure, axes = plt.subplots()
    assert draw_distribution(axes, records, (steps, np.full(len(steps), 2.0)), "post_norm", spans)
    named = {text.get_text() for text in axes.get_legend().get_texts()}
    assert {"|A| bound", "critical alert firing", "warning alert firing"} <= named
    plt.close(figure)


# --------------------------------------------------------------------------- the PNG overview


def test_the_png_overview_has_no_blank_band_under_its_title(tmp_path, demo):
    """The title's lines are followed by the plots: no band of blank rows (it was a tenth of the image)."""
    import matplotlib.image

    out = tmp_path / "tp2.png"
    assert main(["report", str(demo[1]), "--format", "png", "--out", str(out)]) == 0
    pixels = matplotlib.image.imread(out)[..., :3]
    blank = (pixels > 0.97).all(axis=(1, 2))
    first = int(np.argmax(~blank))
    longest = run = 0
    for row in blank[first : pixels.shape[0] // 3]:
        run = run + 1 if row else 0
        longest = max(longest, run)
    assert longest < 0.03 * pixels.shape[0], longest


# --------------------------------------------------------------------------- progress off a terminal


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("total, slow_from", [(14, 8), (19, 0), (100_000, 30_000), (8, 7)])
def test_progress_in_a_log_is_a_few_lines_and_never_starts_above_0(monkeypatch, total, slow_from):
    """A report of 14 plots that becomes slow at the 8th printed a line per plot, starting at 57%."""
    clock = Clock()
    monkeypatch.setattr("advmon.progress.time.monotonic", clock)
    log = io.StringIO()
    with Progress("report tp1", total=total, stream=log) as progress:
        for done in range(total):
            clock.now += 0.01 if done < slow_from else 2.0
            progress.advance()
    lines = log.getvalue().splitlines()
    assert 2 <= len(lines) <= 5, lines
    shown = [int(p) for p in re.findall(r"(\d+)%", lines[0])]
    assert all(p == 0 for p in shown), lines[0]
    assert lines[-1].startswith("report tp1") and "done in" in lines[-1]
    percents = [int(p) for line in lines for p in re.findall(r"(\d+)%", line)]
    assert percents == sorted(percents)


def test_quick_work_prints_nothing_and_a_terminal_bar_is_replaced_by_its_last_line(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("advmon.progress.time.monotonic", clock)
    quiet = io.StringIO()
    with Progress("quick", total=5, stream=quiet) as progress:
        for _ in range(5):
            progress.advance()
    assert quiet.getvalue() == ""
    terminal = Terminal()
    with Progress("report long", total=8, stream=terminal) as progress:
        for _ in range(8):
            clock.now += 1.0
            progress.advance()
    screen = terminal.getvalue().split("\r")[-1]  # what stays on the terminal's line
    assert screen.strip().startswith("report long: done in") and "%" not in screen and "#" not in screen, screen


def test_failed_work_does_not_say_done(monkeypatch):
    clock = Clock()
    monkeypatch.setattr("advmon.progress.time.monotonic", clock)
    log = io.StringIO()
    with pytest.raises(RuntimeError), Progress("report tp1", total=4, stream=log) as progress:
        clock.now += 2.0
        progress.advance()
        raise RuntimeError("broken")
    assert "done" not in log.getvalue() and "stopped after" in log.getvalue()


def test_the_cli_off_a_terminal_prints_few_progress_lines(tmp_path, capfd):
    """`advmon report` with stderr in a file: the slow part shows as a few lines, not one per plot."""
    base = simulate(RunSpec("grpo_binary", steps=50))
    path = tmp_path / "long.jsonl"
    with path.open("w") as f:
        for step in range(30_000):
            record = base[step % len(base)]
            f.write(json.dumps({"run": "long", "step": step, "time": float(step), "estimator": "e",
                                "metrics": {k: (v if math.isfinite(v) else None) for k, v in record.metrics.items()}})
                    + "\n")
    assert main(["report", str(path), "--out", str(tmp_path / "long.html")]) == 0
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("report long")]
    assert 2 <= len(lines) <= 5, lines
    assert not re.findall(r"[1-9]\d*%", lines[0]), lines


# --------------------------------------------------------------------------- summary


def test_the_summary_says_which_end_of_each_statistic_is_the_worst(demo, capsys):
    """Each line names the end ("lowest" or "highest") and its value is that end of the run's values."""
    assert main(["summary", str(demo[1])]) == 0
    text = capsys.readouterr().out
    records = advmon.read_jsonl(demo[1])
    for key, _ in TABLE:
        [line] = [line for line in text.splitlines() if line.split()[:1] == [key]]
        found = re.search(r"\b(lowest|highest)\s+(\S+) at (step (\d+)|every step)", line)
        assert found, line
        values = np.array([r.metrics[key] for r in records if math.isfinite(r.metrics.get(key, math.nan))])
        end = values.min() if found.group(1) == "lowest" else values.max()
        assert float(found.group(2)) == pytest.approx(end, rel=1e-4), line
        if found.group(4) is not None:
            by_step = {r.step: r for r in records}
            assert by_step[int(found.group(4))].metrics[key] == pytest.approx(end, rel=1e-4), line
        else:
            assert values.min() == values.max(), line
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "lowest" in lines["rewards/mean"] and "highest" in lines["rewards/nan_count"]
    assert "highest" in lines["advantages/post_norm/max"] and "lowest" in lines["advantages/post_norm/min"]


def test_a_two_step_run_has_whole_step_ticks_and_an_observed_run_says_so(tmp_path):
    """Issue 39, Report: a 2-step run's step axis read 0, 0.2, 0.4, ...; a run recorded through observe was headed
    "estimator observe"."""
    import torch

    from advmon.reports.plots import PANELS, draw_distribution, draw_panel, new_figure

    path = tmp_path / "two.jsonl"
    with advmon.Monitor("two-steps", sinks=[advmon.JsonlSink(path)]) as monitor:
        for step in range(2):
            rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
            monitor.observe(rewards=rewards, advantages=rewards - 0.5, group_size=4)
    records = advmon.read_jsonl(path)
    for draw in (lambda axes: draw_panel(axes, PANELS[0], [("two-steps", records)]),
                 lambda axes: draw_distribution(axes, records)):
        figure, axes = new_figure()
        draw(axes)
        figure.canvas.draw()
        low, high = axes.get_xlim()
        shown = [t for t in axes.get_xticks() if low <= t <= high]
        assert shown and all(float(t).is_integer() for t in shown), shown
    page = report_page(tmp_path, path)
    assert "recorded through <code>monitor.observe</code>" in page and "estimator <code>observe</code>" not in page


def test_an_alert_lists_only_the_groups_that_explain_it():
    """Issue 39, Report: the table under AdvmonZeroStdGroupsHigh listed the step's NaN groups (nonfinite_rewards)."""
    from types import SimpleNamespace

    from advmon.alerts.evaluator import Occurrence
    from advmon.reports import html_page

    exemplars = [{"group": "p7", "reason": "nonfinite_rewards", "size": 8},
                 {"group": "p3", "reason": "largest_abs_advantage", "size": 8}]
    run = SimpleNamespace(records=[SimpleNamespace(step=4, exemplars=exemplars)])

    def where(alert: str) -> str:
        occurrence = Occurrence(run="r", alert=alert, severity="warning", fired_step=4, resolved_step=None, value=1.0)
        return html_page._where_section(run, [occurrence], [])

    assert where("AdvmonZeroStdGroupsHigh") == ""  # nothing there explains equal rewards
    nan = where("AdvmonNonFiniteRewards")
    assert "p7" in nan and "p3" not in nan
    bound = where("AdvmonAdvantageBeyondBound")
    assert "p3" in bound and "p7" not in bound


def test_an_alert_firing_from_the_start_and_the_bound_line_stay_readable():
    """Issue 39, Report: an alert firing from step 0 shaded the whole run; the |A| bound was drawn as isolated boxes
    (steps without a bound between) or fell off the value axis without a word."""
    import torch

    from advmon.reports.plots import PANELS, draw_distribution, draw_panel, new_figure

    with advmon.Monitor("bound-and-span", sinks=[], histograms=True) as monitor:
        records = []
        for step in range(12):
            rewards = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
            monitor.observe(rewards=rewards, advantages=(rewards - 0.5) * (1 + step), group_size=4)
            monitor.wait()
            records.append(monitor.last_record)
    figure, axes = new_figure()
    draw_panel(axes, PANELS[0], [("run", records)], spans=[(0, None, "critical")])
    low, high = axes.get_xlim()
    for patch in axes.patches:  # what shades the data area is a span, drawn inside the axes' height
        (x0, y0), (x1, y1) = patch.get_window_extent().get_points()
        inside = axes.transAxes.inverted().transform([[x0, y0], [x1, y1]])
        assert not (inside[0][1] < 1.0 and inside[1][0] - inside[0][0] > 0.5), "a whole-run shade"
    labels = [line.get_label() for line in axes.get_lines()]
    assert "critical alert fired at step 0" in labels
    steps = np.arange(12.0)
    gappy = np.where(steps % 3 == 1, np.nan, 2.0 + steps / 10)
    for bound, above in ((gappy, False), (np.full(12, 1e6), True)):
        figure, axes = new_figure()
        draw_distribution(axes, records, bounds=(steps, bound))
        drawn = [line for line in axes.get_lines() if line.get_label().startswith("|A| bound")]
        assert len(drawn) == 1 and np.isfinite(drawn[0].get_ydata()).all()  # one line through the steps with one
        assert ("above the axis" in drawn[0].get_label()) is above
    from advmon.reports.plots import distribution

    for stage in ("pre_norm", "post_norm"):  # no 1e-16 share from a row edge an ulp inside a bin (colour scale)
        share = distribution(records, stage).share
        assert not ((share > 0) & (share < 1e-9)).any()

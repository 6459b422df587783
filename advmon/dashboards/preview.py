"""A picture of a board without Grafana: its queries run against Prometheus, drawn with matplotlib.

Each panel lands where its ``gridPos`` puts it on Grafana's 24-column grid: stat
panels as a big number coloured by their thresholds, time series as lines with
their legends. It is a preview, not Grafana: no tooltips, one colour scheme.

``advmon dashboards preview --prometheus http://127.0.0.1:9090 --run tp2 --out board.png``
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from advmon.dashboards.queries import PanelQuery, board_queries, substitute
from advmon.errors import AdvmonConfigError

__all__ = ["query_range", "render_board"]

Series = list[tuple[dict[str, str], list[tuple[float, float]]]]


def query_range(prometheus: str, expr: str, start: float, end: float, step: float, timeout: float = 10.0) -> Series:
    """``/api/v1/query_range``: ``[(labels, [(time, value)])]``."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = json.loads(response.read())
    except OSError as exc:
        raise AdvmonConfigError(f"cannot query Prometheus at {prometheus}: {getattr(exc, 'reason', exc)}") from None
    if data.get("status") != "success":
        raise AdvmonConfigError(f"Prometheus refused {expr!r}: {data.get('error')}")
    return [
        (item["metric"], [(float(t), float(v)) for t, v in item["values"]])
        for item in data["data"]["result"]
    ]


def _legend(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template) or "value"


def _format(value: float, unit: str) -> str:
    if math.isnan(value):
        return "NaN"
    if unit == "percentunit":
        return f"{value:.0%}"
    if unit == "s":
        return f"{value:.0f} s"
    return f"{value:.4g}"


def _threshold_color(panel: dict[str, Any], value: float) -> str:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    color = "green"
    for step in steps:
        if step["value"] is None or (not math.isnan(value) and value >= step["value"]):
            color = step["color"]
    return {"green": "#2ca02c", "red": "#d62728", "orange": "#ff7f0e"}.get(color, color)


def render_board(
    board: dict[str, Any],
    prometheus: str,
    values: Mapping[str, str | Sequence[str]],
    out: Path,
    range_seconds: float = 3600.0,
    now: float | None = None,
) -> Path:
    """Run every query of ``board`` over the last ``range_seconds`` and draw the board to ``out`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = time.time() if now is None else now
    start = end - range_seconds
    step = max(1.0, range_seconds / 240)
    rate_interval = f"{max(4 * int(step), 4)}s"  # Grafana's rule: at least 4 x the step
    queries = [q for q in board_queries(board) if q.kind != "annotation"]
    height = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    figure = plt.figure(figsize=(24 * 0.75, height * 0.45), dpi=80)
    grid = figure.add_gridspec(height, 24, hspace=0.6, wspace=0.6, top=0.97, bottom=0.02, left=0.03, right=0.99)
    figure.suptitle(board["title"], fontsize=16, x=0.03, ha="left", y=0.995)
    by_panel: dict[str, list[PanelQuery]] = {}
    for query in queries:
        by_panel.setdefault(query.panel, []).append(query)
    for panel in board["panels"]:
        x, y, w, h = (panel["gridPos"][k] for k in ("x", "y", "w", "h"))
        axes = figure.add_subplot(grid[y : y + h, x : x + w])
        if panel["type"] == "row":
            axes.axis("off")
            axes.text(0, 0.5, panel["title"], fontsize=13, fontweight="bold", va="center")
            continue
        results = [
            (q, query_range(prometheus, substitute(q.expr, values, rate_interval, f"{int(range_seconds)}s"), start, end, step))
            for q in by_panel.get(panel["title"], [])
        ]
        axes.set_title(panel["title"], fontsize=10, loc="left")
        if panel["type"] == "stat":
            _draw_stat(axes, panel, results)
        else:
            _draw_series(axes, results, end)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, bbox_inches="tight")
    plt.close(figure)
    return out


def _draw_stat(axes: Any, panel: dict[str, Any], results: list[tuple[PanelQuery, Series]]) -> None:
    axes.set_xticks([])
    axes.set_yticks([])
    last = [points[-1][1] for _, series in results for _, points in series if points]
    if not last:
        axes.text(0.5, 0.45, "No data", ha="center", va="center", fontsize=18, color="grey")
        return
    value = max(last)
    unit = results[0][0].unit
    axes.text(0.5, 0.45, _format(value, unit), ha="center", va="center", fontsize=26, color=_threshold_color(panel, value))


def _draw_series(axes: Any, results: list[tuple[PanelQuery, Series]], end: float) -> None:
    drawn = 0
    for query, series in results:
        for labels, points in series:
            if not points:
                continue
            times = [(t - end) / 60 for t, _ in points]
            style = "--" if query.legend.endswith(("std", "bound", "median")) else "-"
            axes.plot(times, [v for _, v in points], style, linewidth=1.2, label=_legend(query.legend, labels))
            drawn += 1
    axes.tick_params(labelsize=7)
    axes.set_xlabel("minutes before now", fontsize=7)
    if drawn:
        axes.legend(fontsize=6, loc="upper left", ncol=2, framealpha=0.6)
    else:
        axes.text(0.5, 0.5, "No data", ha="center", va="center", transform=axes.transAxes, color="grey")

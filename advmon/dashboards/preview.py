"""A picture of a board without Grafana: its queries run against Prometheus, drawn with matplotlib.

Each panel lands where its ``gridPos`` puts it on Grafana's 24-column grid, and everything a panel draws (its
title, axes, tick labels, legend) stays inside its own cell, as in Grafana: stat panels as a big value in the
panel's unit, coloured by their thresholds or value mappings; time series as lines with their legends; tables as
Grafana's merge and organize transformations make them (one row per run, the columns renamed, ordered, mapped,
coloured and sorted as the board says). A panel that repeats over a variable (``repeat``: the health board's
``Slice $slice``) is drawn once per value of the variable, as Grafana does: the values chosen, or all the values
the variable's ``label_values`` query finds. It is a preview, not Grafana: no tooltips, one colour scheme.

``advmon dashboards preview --prometheus http://127.0.0.1:9090 --run tp2 --out board.png``
"""

from __future__ import annotations

import json
import math
import re
import textwrap
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advmon.dashboards.queries import PanelQuery, board_queries, substitute, variable_queries
from advmon.errors import AdvmonConfigError

__all__ = ["DrawnPanel", "draw_board", "format_value", "query_exemplars", "query_instant", "query_range",
           "render_board", "variable_values"]

Series = list[tuple[dict[str, str], list[tuple[float, float]]]]
Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in figure pixels, y up

#: Drawing scale: figure pixels (at 80 dpi) of a grid column's share and of a grid row (Grafana: 30 px + margin).
DPI = 80
WIDTH_PX = 1440
ROW_PX = 36
HEADER_PX = 40
MARGIN_PX = 8
GAP_PX = 8
TITLE_PX = 20  # a panel's title band
COLORS = {"green": "#2ca02c", "red": "#d62728", "orange": "#ff7f0e", "blue": "#1f77b4", "yellow": "#d4b106",
          "text": "#333333", "grey": "#808080"}


@dataclass
class DrawnPanel:
    """What the preview drew for one panel (a repeated panel: one per copy), for a reader or a test.

    ``box`` is the panel's grid cell; ``title_box`` and ``content_box`` (the axes with their tick labels, legend
    and texts) are what was drawn, all in figure pixels (y up) of the picture written.
    """

    title: str
    kind: str
    grid: tuple[int, int, int, int]
    box: Box
    title_box: Box
    content_box: Box
    unit: str = "none"
    values: dict[str, Any] = field(default_factory=dict)  # the variables this copy's queries were given
    exprs: list[str] = field(default_factory=list)  # its queries as sent to Prometheus
    text: str = ""  # a stat's displayed value(s); the table's cells joined
    shown: list[tuple[str, float, str]] = field(default_factory=list)  # a stat's (series, value, text)
    series: int = 0  # lines drawn (time series), rows (table)
    right_series: int = 0  # of those lines, the ones on the panel's right axis
    #: Exemplars drawn as dots: ``(series labels, exemplar labels, time, value)``.
    exemplars: list[tuple[dict[str, str], dict[str, str], float, float]] = field(default_factory=list)
    rows: list[dict[str, str]] = field(default_factory=list)  # a table's displayed rows, by column title


def query_range(prometheus: str, expr: str, start: float, end: float, step: float, timeout: float = 10.0) -> Series:
    """``/api/v1/query_range``: ``[(labels, [(time, value)])]``."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    data = _get(prometheus, f"/api/v1/query_range?{params}", expr, timeout)
    return [
        (item["metric"], [(float(t), float(v)) for t, v in item["values"]])
        for item in data["data"]["result"]
    ]


def query_instant(prometheus: str, expr: str, at: float, timeout: float = 10.0) -> Series:
    """``/api/v1/query`` at ``at``: ``[(labels, [(time, value)])]`` (one point a series)."""
    params = urllib.parse.urlencode({"query": expr, "time": at})
    data = _get(prometheus, f"/api/v1/query?{params}", expr, timeout)
    result = data["data"]["result"]
    if data["data"].get("resultType") == "scalar":
        return [({}, [(float(result[0]), float(result[1]))])]
    return [(item["metric"], [(float(item["value"][0]), float(item["value"][1]))]) for item in result]


def _get(prometheus: str, path: str, what: str, timeout: float) -> dict[str, Any]:
    url = f"{prometheus.rstrip('/')}{path}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            data = json.loads(response.read())
    except OSError as exc:
        raise AdvmonConfigError(f"cannot query Prometheus at {prometheus}: {getattr(exc, 'reason', exc)}") from None
    if data.get("status") != "success":
        raise AdvmonConfigError(f"Prometheus refused {what!r}: {data.get('error')}")
    return data


def query_exemplars(prometheus: str, expr: str, start: float, end: float, timeout: float = 10.0) -> list[tuple[
        dict[str, str], dict[str, str], float, float]]:
    """``/api/v1/query_exemplars``: ``[(series labels, exemplar labels, time, value)]`` of the series inside
    ``expr`` (none where Prometheus stores no exemplars)."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end})
    data = _get(prometheus, f"/api/v1/query_exemplars?{params}", expr, timeout)
    return [(item["seriesLabels"], exemplar["labels"], float(exemplar["timestamp"]), float(exemplar["value"]))
            for item in data.get("data") or [] for exemplar in item["exemplars"]]


def variable_values(board: dict[str, Any], name: str, prometheus: str, values: Mapping[str, Any], start: float,
                    end: float) -> list[str]:
    """The values of the board's query variable ``name`` that Prometheus holds, as Grafana's ``All`` lists them
    (its ``label_values(selector, label)`` with the other variables substituted), sorted."""
    query = variable_queries(board).get(name, "")
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query)
    if match is None:
        return []
    selector = substitute(match.group(1), {k: v for k, v in values.items() if k != name})
    params = urllib.parse.urlencode({"match[]": selector, "start": start, "end": end})
    return sorted(_get(prometheus, f"/api/v1/label/{match.group(2)}/values?{params}", query, 10.0)["data"])


def _legend(template: str, labels: Mapping[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip() or "value"


# --------------------------------------------------------------------------- values as Grafana shows them


def _auto_decimals(value: float) -> int:
    """Grafana's ``getDecimalsForValue``: about two significant digits, none for a whole number."""
    if value == 0 or not math.isfinite(value):
        return 0
    if value % 1 == 0:
        return 0
    magnitude = math.floor(math.log10(abs(value)))
    decimals = -magnitude + 1
    if abs(value) / 10 ** (-decimals) > 2.25:
        decimals += 1
    return max(0, decimals)


def _fixed(value: float, decimals: int | None) -> str:
    text = f"{value:.{_auto_decimals(value) if decimals is None else decimals}f}"
    return "0" if text in ("-0", "-0.0") else text


def format_value(value: float, unit: str = "none", decimals: int | None = None) -> str:
    """``value`` as a Grafana panel of ``unit`` shows it.

    ``percentunit`` is a fraction (0.25 reads 25%), ``percent`` is already in percent (25 reads 25%), ``s``
    seconds scaled to ms, min, hour or day, anything else a plain number with automatic decimals (never the
    exponent notation Grafana never shows).

    Example:
        >>> format_value(0.917, "percentunit"), format_value(25, "percent"), format_value(26070, "none")
        ('91.7%', '25%', '26070')
        >>> format_value(4.0, "s"), format_value(5400, "s", 0)
        ('4 s', '2 hour')
    """
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if unit == "percentunit":
        return f"{_fixed(100 * value, decimals)}%"
    if unit == "percent":
        return f"{_fixed(value, decimals)}%"
    if unit in ("s", "ms"):
        seconds = value / 1000 if unit == "ms" else value
        for limit, scale, name in ((1, 0.001, "ms"), (60, 1, "s"), (3600, 60, "min"), (86400, 3600, "hour"),
                                   (math.inf, 86400, "day")):
            if abs(seconds) < limit:
                return f"{_fixed(seconds / scale, decimals)} {name}"
    return _fixed(value, decimals)


def _mapped(value: float, mappings: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The value mapping (text and colour) of ``value``, if any."""
    for mapping in mappings:
        if mapping.get("type") != "value" or math.isnan(value):
            continue
        for key, entry in mapping.get("options", {}).items():
            if float(key) == value:
                return entry
    return None


def _threshold_color(steps: Sequence[dict[str, Any]], value: float) -> str:
    color = "green"
    for step in steps:
        if step["value"] is None or (not math.isnan(value) and value >= step["value"]):
            color = step["color"]
    return COLORS.get(color, color)


def _last_not_null(points: Sequence[tuple[float, float]]) -> float | None:
    """Grafana's ``lastNotNull`` reduction: the last value that is a number."""
    for _, value in reversed(points):
        if not math.isnan(value):
            return value
    return None


# --------------------------------------------------------------------------- layout


def _expanded_panels(board: dict[str, Any], repeats: Mapping[str, list[str]]) -> list[tuple[dict[str, Any],
                                                                                            dict[str, int], dict]]:
    """``(panel, gridPos, own values)`` of every panel, a repeated one once per value of its variable, placed as
    Grafana places the copies (side by side, each ``max(24 / n, 24 / maxPerRow)`` wide, wrapping), and the
    panels below moved down by the lines the copies added."""
    placed: list[tuple[dict[str, Any], dict[str, int], dict]] = []
    shift = 0
    for panel in board["panels"]:
        grid = dict(panel["gridPos"])
        grid["y"] += shift
        variable = panel.get("repeat")
        if not variable or not repeats.get(variable):
            placed.append((panel, grid, {}))
            continue
        chosen = repeats[variable]
        per_row = panel.get("maxPerRow") or 4
        if panel.get("repeatDirection", "h") == "h":
            width = int(max(24 / len(chosen), 24 / per_row))
            x, y = 0, grid["y"]
            for value in chosen:
                if x + width > 24:
                    x, y = 0, y + grid["h"]
                placed.append((panel, {"x": x, "y": y, "w": width, "h": grid["h"]}, {variable: value}))
                x += width
            added = y - grid["y"]
        else:
            for i, value in enumerate(chosen):
                placed.append((panel, {**grid, "y": grid["y"] + i * grid["h"]}, {variable: value}))
            added = (len(chosen) - 1) * grid["h"]
        shift += added
    return placed


def _cell(grid: Mapping[str, int], figure_height: float) -> Box:
    column = (WIDTH_PX - 2 * MARGIN_PX) / 24
    x0 = MARGIN_PX + grid["x"] * column + GAP_PX / 2
    x1 = MARGIN_PX + (grid["x"] + grid["w"]) * column - GAP_PX / 2
    top = figure_height - HEADER_PX - grid["y"] * ROW_PX - GAP_PX / 2
    bottom = figure_height - HEADER_PX - (grid["y"] + grid["h"]) * ROW_PX + GAP_PX / 2
    return (x0, bottom, x1, top)


def _extent(bbox: Any) -> Box:
    return (float(bbox.x0), float(bbox.y0), float(bbox.x1), float(bbox.y1))


def _title_text(title: str, values: Mapping[str, Any]) -> str:
    """A title with its variables as Grafana writes them (several values joined by ``+``)."""
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            return match.group(0)
        chosen = values[name]
        return chosen if isinstance(chosen, str) else " + ".join(chosen)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, title)


def _all(chosen: Any) -> bool:
    return chosen is None or chosen in (".*", "$__all", "All") or (not isinstance(chosen, str) and
                                                                  list(chosen) in ([".*"], ["$__all"], []))


# --------------------------------------------------------------------------- drawing


def draw_board(
    board: dict[str, Any],
    prometheus: str,
    values: Mapping[str, str | Sequence[str]],
    range_seconds: float = 3600.0,
    now: float | None = None,
) -> tuple[Any, list[DrawnPanel]]:
    """Run every query of ``board`` over the last ``range_seconds`` and draw it: ``(figure, what was drawn)``.

    A repeated panel's variable missing from ``values`` (or ``.*``, Grafana's All) takes every value its query
    finds in Prometheus.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    end = time.time() if now is None else now
    start = end - range_seconds
    step = max(1.0, range_seconds / 240)
    rate_interval = f"{max(4 * int(step), 4)}s"  # Grafana's rule: at least 4 x the step
    range_ = f"{int(range_seconds)}s"
    values = dict(values)
    repeats = {}
    for variable in {p["repeat"] for p in board["panels"] if p.get("repeat")}:
        chosen = values.get(variable)
        if _all(chosen):
            chosen = variable_values(board, variable, prometheus, values, start, end)
            values[variable] = chosen or [".*"]
        repeats[variable] = [chosen] if isinstance(chosen, str) else list(chosen)
    placed = _expanded_panels(board, repeats)
    rows = max(grid["y"] + grid["h"] for _, grid, _ in placed)
    height = HEADER_PX + rows * ROW_PX + MARGIN_PX
    figure = plt.figure(figsize=(WIDTH_PX / DPI, height / DPI), dpi=DPI)
    figure.text(MARGIN_PX / WIDTH_PX, 1 - 8 / height, _title_text(board["title"], values), fontsize=16, ha="left",
                va="top")
    queries = [q for q in board_queries(board) if q.kind != "annotation"]
    by_panel: dict[tuple[str, tuple[int, ...]], list[PanelQuery]] = {}
    for query in queries:
        by_panel.setdefault((query.panel, query.grid), []).append(query)
    drawn: list[tuple[DrawnPanel, Any, Any]] = []
    twins: dict[int, Any] = {}  # a panel's right axis, by its axes
    for panel, grid, own in placed:
        box = _cell(grid, height)
        x0, y0, x1, y1 = box
        mine = {**values, **own}
        title = _title_text(panel["title"], mine)
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none")
        record = DrawnPanel(title, panel["type"], (grid["x"], grid["y"], grid["w"], grid["h"]), box, box, box, unit,
                            own)
        if panel["type"] == "row":
            artist = figure.text(x0 / WIDTH_PX, (y0 + y1) / 2 / height, title, fontsize=13, fontweight="bold",
                                 va="center", ha="left")
            drawn.append((record, artist, None))
            continue
        figure.add_artist(Rectangle((x0 / WIDTH_PX, y0 / height), (x1 - x0) / WIDTH_PX, (y1 - y0) / height,
                                    transform=figure.transFigure, fill=False, edgecolor="#d0d0d0", linewidth=0.8))
        artist = figure.text((x0 + 6) / WIDTH_PX, (y1 - 4) / height, _fit_title(title, x1 - x0 - 12), fontsize=10,
                             ha="left", va="top", fontweight="bold")
        left = 52 if panel["type"] == "timeseries" else 6
        bottom = 60 if panel["type"] == "timeseries" else 6  # the time axis and the legend below it
        axes = figure.add_axes(((x0 + left) / WIDTH_PX, (y0 + bottom) / height,
                                (x1 - x0 - left - 8) / WIDTH_PX, (y1 - y0 - TITLE_PX - 6 - bottom) / height))
        key = tuple(panel["gridPos"][k] for k in ("x", "y", "w", "h"))
        mine_queries = by_panel.get((panel["title"], key), [])
        record.exprs = [substitute(q.expr, mine, rate_interval, range_) for q in mine_queries]
        if panel["type"] == "table":
            _draw_table(axes, panel, [query_instant(prometheus, expr, end) for expr in record.exprs], record)
        else:
            results = [(q, query_range(prometheus, expr, start, end, step))
                       for q, expr in zip(mine_queries, record.exprs)]
            if panel["type"] == "stat":
                _draw_stat(axes, panel, results, record)
            else:
                record.exemplars = [found for q, expr in zip(mine_queries, record.exprs) if q.exemplar
                                    for found in query_exemplars(prometheus, expr, start, end)]
                twin = _draw_series(axes, results, end, unit, record, _right_axis(panel))
                if twin is not None:
                    twins[id(axes)] = twin
        drawn.append((record, artist, axes))
    _fit(figure, drawn, twins)
    return figure, [record for record, _, _ in drawn]


def render_board(
    board: dict[str, Any],
    prometheus: str,
    values: Mapping[str, str | Sequence[str]],
    out: Path,
    range_seconds: float = 3600.0,
    now: float | None = None,
) -> Path:
    """Run every query of ``board`` over the last ``range_seconds`` and draw the board to ``out`` (PNG)."""
    import matplotlib.pyplot as plt

    figure, _ = draw_board(board, prometheus, values, range_seconds, now)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, facecolor="white")  # the whole figure: the layout's pixels are the picture's
    plt.close(figure)
    return out


def _fit_title(title: str, width_px: float) -> str:
    """A title shortened with an ellipsis where it would be wider than its panel (about 6.5 px a character)."""
    room = max(4, int(width_px / 6.5))
    return title if len(title) <= room else title[: room - 1] + "…"


def _fit(figure: Any, drawn: list[tuple[DrawnPanel, Any, Any]], twins: Mapping[int, Any]) -> None:
    """Shrink each panel's axes (and its right axis) until what they draw (tick labels, legend, texts) stays
    inside its cell below its title, then record where everything landed."""
    from matplotlib.transforms import Bbox

    renderer = figure.canvas.get_renderer()

    def tight(axes: Any) -> Box:
        boxes = [axes.get_tightbbox(renderer)]
        if id(axes) in twins:
            boxes.append(twins[id(axes)].get_tightbbox(renderer))
        return _extent(Bbox.union(boxes))

    for _ in range(3):
        moved = False
        for record, artist, axes in drawn:
            if axes is None:
                continue
            x0, y0, x1, y1 = record.box
            allowed = (x0 + 2, y0 + 2, x1 - 2, y1 - TITLE_PX - 2)
            extent = tight(axes)
            position = axes.get_position()
            left, bottom = position.x0 * figure.bbox.width, position.y0 * figure.bbox.height
            right, top = position.x1 * figure.bbox.width, position.y1 * figure.bbox.height
            over = (max(0.0, allowed[0] - extent[0]), max(0.0, allowed[1] - extent[1]),
                    max(0.0, extent[2] - allowed[2]), max(0.0, extent[3] - allowed[3]))
            if any(o > 0.5 for o in over):
                left, bottom, right, top = left + over[0], bottom + over[1], right - over[2], top - over[3]
                if right - left > 10 and top - bottom > 10:
                    place = (left / figure.bbox.width, bottom / figure.bbox.height,
                             (right - left) / figure.bbox.width, (top - bottom) / figure.bbox.height)
                    axes.set_position(place)
                    if id(axes) in twins:
                        twins[id(axes)].set_position(place)
                    moved = True
        if not moved:
            break
        figure.canvas.draw()
    figure.canvas.draw()
    for record, artist, axes in drawn:
        record.title_box = _extent(artist.get_window_extent(renderer))
        record.content_box = tight(axes) if axes is not None else record.title_box


def _draw_stat(axes: Any, panel: dict[str, Any], results: list[tuple[PanelQuery, Series]], record: DrawnPanel) -> None:
    axes.set_xticks([])
    axes.set_yticks([])
    for spine in axes.spines.values():
        spine.set_visible(False)
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    steps = defaults.get("thresholds", {}).get("steps", [])
    mappings = defaults.get("mappings", [])
    shown = []
    for query, series in results:
        for labels, points in series:
            value = _last_not_null(points)
            if value is None:
                continue
            mapped = _mapped(value, mappings)
            text = mapped["text"] if mapped else format_value(value, record.unit, defaults.get("decimals"))
            color = COLORS.get(mapped.get("color", ""), mapped.get("color")) if mapped and mapped.get("color") \
                else _threshold_color(steps, value)
            shown.append((_legend(query.legend, labels), value, text, color))
    record.shown = [(name, value, text) for name, value, text, _ in shown]
    record.text = " | ".join(text for _, _, text, _ in shown)
    if not shown:
        no_value = defaults.get("noValue") or "No data"
        _fitted_text(axes, 0.5, 0.5, no_value, 18, "grey")
        record.text = no_value
        return
    if len(shown) == 1:
        _fitted_text(axes, 0.5, 0.5, shown[0][2], 26, shown[0][3])
        return
    for i, (name, _, text, color) in enumerate(shown[:4]):  # several series: value and name, one a line
        y = 1 - (i + 0.5) / min(len(shown), 4)
        _fitted_text(axes, 0.5, y, f"{name}: {text}", 14, color)


def _fitted_text(axes: Any, x: float, y: float, text: str, size: float, color: str) -> None:
    """Centred text, smaller and then wrapped until it fits the axes' width and height."""
    renderer = axes.figure.canvas.get_renderer()
    box = axes.get_window_extent(renderer)
    artist = axes.text(x, y, text, ha="center", va="center", fontsize=size, color=color, transform=axes.transAxes)
    wrapped = text
    while True:
        extent = artist.get_window_extent(renderer)
        if extent.width <= box.width * 0.95 and extent.height <= box.height * 0.95:
            return
        if size > 8:
            size = max(8, size * min(0.9, box.width * 0.95 / max(extent.width, 1)))
        elif len(wrapped.splitlines()) < 6:
            longest = max(len(line) for line in wrapped.splitlines())
            columns = max(8, int(longest * box.width * 0.9 / max(extent.width, 1)))
            rewrapped = "\n".join(textwrap.wrap(text, columns))
            if rewrapped == wrapped:
                return
            wrapped = rewrapped
        else:
            return
        artist.set_fontsize(size)
        artist.set_text(wrapped)


def _tick_decimals(step: float) -> int:
    """Decimals that tell ticks ``step`` apart, and no more (0.25 apart: 2; 20 apart: 0)."""
    if not step > 0 or not math.isfinite(step):
        return 0
    decimals = max(0, -math.floor(math.log10(step)))
    while decimals < 8 and abs(round(step * 10 ** decimals) - step * 10 ** decimals) > 1e-6 * 10 ** decimals * step:
        decimals += 1
    return decimals


def _unit_ticks(unit: str) -> Any:
    """A value axis in the panel's unit, with the decimals its tick spacing needs (Grafana's axes)."""
    from matplotlib.ticker import Formatter

    class UnitFormatter(Formatter):
        def __call__(self, value: float, pos: int | None = None) -> str:
            return format_value(value, unit)

        def format_ticks(self, values: Sequence[float]) -> list[str]:
            ticks = sorted(values)
            step = min((b - a for a, b in zip(ticks, ticks[1:])), default=0.0)
            decimals = _tick_decimals(step * (100 if unit == "percentunit" else 1)) if unit not in ("s", "ms") else None
            return [format_value(value, unit, decimals) for value in values]

    return UnitFormatter()


def _right_axis(panel: dict[str, Any]) -> tuple[str, str] | None:
    """``(legend regex, axis label)`` of the series the panel puts on a right axis of their own, if any."""
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        properties = {p["id"]: p["value"] for p in override.get("properties", [])}
        if override["matcher"]["id"] == "byRegexp" and properties.get("custom.axisPlacement") == "right":
            return override["matcher"]["options"], properties.get("custom.axisLabel", "")
    return None


def _draw_series(axes: Any, results: list[tuple[PanelQuery, Series]], end: float, unit: str,
                 record: DrawnPanel, right: tuple[str, str] | None = None) -> Any:
    """The lines of a time series panel; the right axis (a twin of ``axes``) where the panel has one."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator
    from matplotlib.transforms import offset_copy

    twin = None
    drawn = 0
    colors = iter(__import__("matplotlib").rcParams["axes.prop_cycle"].by_key()["color"] * 10)
    for query, series in results:
        for labels, points in series:
            if not points:
                continue
            times = [(t - end) / 60 for t, _ in points]
            style = "--" if query.legend.endswith(("std", "bound", "median")) else "-"
            label = _legend(query.legend, labels)
            target = axes
            if right is not None and re.search(right[0], label):
                if twin is None:
                    twin = axes.twinx()
                    twin.tick_params(labelsize=7)
                    twin.set_ylabel(right[1], fontsize=7)
                    twin.yaxis.set_major_formatter(_unit_ticks(unit))
                target, style = twin, ":"
                label = f"{label} (right)"
            target.plot(times, [v for _, v in points], style, linewidth=1.2, label=label, color=next(colors))
            drawn += 1
            record.right_series += target is twin
    if record.exemplars:  # Grafana's exemplar dots: each the worst group of a step that counted
        axes.scatter([(t - end) / 60 for _, _, t, _ in record.exemplars], [v for _, _, _, v in record.exemplars],
                     s=12, marker="D", color="#8c564b", zorder=5, label="exemplars (worst groups)")
        drawn += 1
    record.series = drawn
    axes.tick_params(labelsize=7)
    axes.yaxis.set_major_formatter(_unit_ticks(unit))
    width = axes.get_window_extent(axes.figure.canvas.get_renderer()).width
    axes.xaxis.set_major_locator(MaxNLocator(nbins=max(2, int(width // 80)), steps=[1, 2, 2.5, 5, 10]))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: "now" if abs(value) < 1e-9 else f"{value:g} min"))
    if drawn:
        # Below the time axis, as Grafana's legend: never over the lines. As many columns as the width takes.
        lines = list(axes.get_lines()) + list(axes.collections) + (list(twin.get_lines()) if twin is not None else [])
        labels = [line.get_label() for line in lines]
        columns = max(1, min(drawn, int(width // (40 + 4.2 * max(len(label) for label in labels)))))
        axes.legend(lines, labels, fontsize=6, loc="upper left", ncol=columns, frameon=False, borderaxespad=0,
                    handlelength=1.5, columnspacing=1.0, bbox_to_anchor=(0, 0),
                    bbox_transform=offset_copy(axes.transAxes, axes.figure, y=-14, units="dots"))
    else:
        axes.text(0.5, 0.5, "No data", ha="center", va="center", transform=axes.transAxes, color="grey")
    return twin


def _draw_table(axes: Any, panel: dict[str, Any], results: list[Series], record: DrawnPanel) -> None:
    """Grafana's table of ``format: table`` queries: merged into one row per value of their common labels,
    columns organized (order, names, hidden), each cell in its column's unit, mapping and colour, sorted."""
    axes.axis("off")
    organize = next((t["options"] for t in panel.get("transformations", []) if t["id"] == "organize"), {})
    order, rename = organize.get("indexByName", {}), organize.get("renameByName", {})
    overrides = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}
                 for o in panel.get("fieldConfig", {}).get("overrides", [])}
    labels = [name for name in order if not name.startswith("Value #")]
    present = [{label for labels_, _ in series for label in labels_} for series in results if series]
    common = [label for label in labels if present and all(label in found for found in present)]
    merged: dict[tuple[str, ...], dict[str, Any]] = {}
    for i, series in enumerate(results):
        for found, points in series:
            row = merged.setdefault(tuple(found.get(label, "") for label in common), {})
            row.update({label: found[label] for label in labels if label in found})
            row[f"Value #{chr(ord('A') + i)}"] = points[-1][1] if points else math.nan
    columns = sorted(order, key=order.get)
    titles = [rename.get(c, c) for c in columns]
    shown = [i for i, title in enumerate(titles) if not overrides.get(title, {}).get("custom.hidden")]
    sort = (panel.get("options", {}).get("sortBy") or [{}])[0]
    rows = list(merged.values())
    if sort.get("displayName") in titles:
        by = columns[titles.index(sort["displayName"])]
        def number(row: dict[str, Any]) -> tuple[bool, float]:
            value = row.get(by)
            known = isinstance(value, float) and not math.isnan(value)
            return (known, value if known else 0.0) if sort.get("desc", False) else (not known, value if known else 0.0)

        rows.sort(key=number, reverse=sort.get("desc", False))
    cells, colours, inks = [], [], []
    for row in rows:
        texts, backgrounds, colors = {}, [], []
        for i in shown:
            column, title = columns[i], titles[i]
            options = overrides.get(title, {})
            raw = row.get(column)
            background, ink = "white", "black"
            if isinstance(raw, float):
                mapped = _mapped(raw, options.get("mappings", []))
                texts[title] = mapped["text"] if mapped else format_value(raw, options.get("unit", "none"),
                                                                          options.get("decimals"))
                color = None
                if mapped and mapped.get("color"):
                    color = COLORS.get(mapped["color"], mapped["color"])
                elif "thresholds" in options and not math.isnan(raw):
                    color = _threshold_color(options["thresholds"]["steps"], raw)
                if color is not None:
                    if options.get("custom.cellOptions", {}).get("type") == "color-text":
                        ink = color
                    else:
                        background = _tint(color)
            else:
                texts[title] = raw or ""
            backgrounds.append(background)
            colors.append(ink)
        cells.append([texts[titles[i]] for i in shown])
        colours.append(backgrounds)
        inks.append(colors)
        record.rows.append(texts)
    record.series = len(rows)
    record.text = "\n".join(" | ".join(row) for row in cells)
    if not rows:
        no_value = panel.get("fieldConfig", {}).get("defaults", {}).get("noValue") or "No data"
        _fitted_text(axes, 0.5, 0.5, no_value, 14, "grey")
        record.text = no_value
        return
    headers = [titles[i] for i in shown]
    # Each column as wide as its longest text (Grafana sizes columns by their content).
    lengths = [max(len(headers[j]), *(len(row[j]) for row in cells)) + 2 for j in range(len(headers))]
    widths = [length / sum(lengths) for length in lengths]
    height = axes.get_window_extent(axes.figure.canvas.get_renderer()).height
    line = min(22.0, height / (len(rows) + 1))
    table = axes.table(cellText=cells, colLabels=headers, cellColours=colours, colWidths=widths, cellLoc="left",
                       loc="upper center",
                       bbox=(0, 1 - line * (len(rows) + 1) / height, 1, line * (len(rows) + 1) / height))
    table.auto_set_font_size(False)
    table.set_fontsize(max(5, min(9, line * 0.45)))
    for (r, c), cell in table.get_celld().items():
        cell.set_edgecolor("#d0d0d0")
        if r == 0:
            cell.set_text_props(fontweight="bold")
            cell.set_facecolor("#eeeeee")
        else:
            cell.get_text().set_color(inks[r - 1][c])


def _tint(color: str) -> str:
    """A cell background: the colour, lightened so that black text stays readable."""
    from matplotlib.colors import to_rgb

    red, green, blue = (0.55 + 0.45 * c for c in to_rgb(color))
    return f"#{int(red * 255):02x}{int(green * 255):02x}{int(blue * 255):02x}"

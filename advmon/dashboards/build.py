"""advmon's own small builder over grafanalib: panels declared as data, laid out in rows.

grafanalib 0.7 writes a few things Grafana 11/12 does not want (a panel
datasource as a bare string or null, ``"value": "null"`` for a threshold's base
step, ``schemaVersion`` 12), so boards are built with grafanalib and then
normalized here, in one place. The JSON is written with sorted keys and fixed
indentation: the same settings always give the same bytes.

Example:
    >>> board = Board("Demo", "advmon-demo", "demo board", rows=[Row("Top", [
    ...     PanelSpec("Up", "Whether the target is up.", "none", [Query("up", "{{instance}}")], kind="stat")])])
    >>> data = board.to_json_data(BoardContext())
    >>> data["schemaVersion"], data["panels"][1]["datasource"]
    (39, {'type': 'prometheus', 'uid': '${datasource}'})
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import grafanalib.core as g
from grafanalib._gen import DashboardEncoder

__all__ = ["Board", "BoardContext", "Column", "PanelSpec", "Query", "Row", "ThresholdStep", "ValueText", "Variable",
           "dumps"]

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24


@dataclass(frozen=True)
class BoardContext:
    """What a team chooses: the datasource uid for provisioning, extra label matchers, a title prefix."""

    datasource_uid: str = "prometheus"
    selector: str = ""
    title_prefix: str = ""


@dataclass(frozen=True)
class Query:
    """One PromQL target: the expression and its legend."""

    expr: str
    legend: str = ""
    instant: bool = False
    #: Ask Prometheus for the series' exemplars too (the worst group behind a non-finite count).
    exemplar: bool = False


@dataclass(frozen=True)
class ThresholdStep:
    """A colour from a value up (``value=None``: the base)."""

    color: str
    value: float | None = None


@dataclass(frozen=True)
class ValueText:
    """A value shown as words, in a colour (Grafana's value mapping)."""

    value: float
    text: str
    color: str


@dataclass(frozen=True)
class Column:
    """A table column: a label of the rows (``label``) or the value of the query at the same position."""

    title: str
    unit: str = "none"
    thresholds: Sequence[ThresholdStep] = ()
    texts: Sequence[ValueText] = ()
    link: tuple[str, str] | None = None  # (title, url), Grafana's ${__data.fields...} allowed
    label: str = ""
    hidden: bool = False
    decimals: int | None = None


@dataclass(frozen=True)
class PanelSpec:
    """One panel: what it shows, how to read it, its unit, its queries."""

    title: str
    description: str
    unit: str
    queries: Sequence[Query]
    kind: Literal["stat", "timeseries", "table"] = "timeseries"
    width: int = 12
    height: int = 8
    thresholds: Sequence[ThresholdStep] = ()
    links: Sequence[tuple[str, str]] = ()  # (title, url)
    reduce: str = "lastNotNull"
    fill_below_to: str | None = None  # legend of a series to shade down to (std bands)
    #: ``(legend regex, axis label)``: those series on a right axis of their own scale (a |A| in the thousands
    #: beside shares between 0 and 1). Grafana keys a scale by unit and axis label: the label gives it its own.
    right_axis: tuple[str, str] | None = None
    repeat: str | None = None  # a variable: one copy of the panel per selected value, side by side
    texts: Sequence[ValueText] = ()  # a stat's values shown as words
    #: A table: one row per value of the queries' common labels, the label columns first, then one column per
    #: query (instant, in order); ``sort_by`` the column title the rows are sorted by, descending.
    columns: Sequence[Column] = ()
    sort_by: str = ""
    no_data: str = ""  # what the panel says when its queries return nothing


@dataclass(frozen=True)
class Row:
    title: str
    panels: Sequence[PanelSpec]


@dataclass(frozen=True)
class Variable:
    """A template variable: ``query`` (label_values), ``custom`` or ``textbox``."""

    name: str
    label: str
    query: str = ""
    kind: Literal["query", "custom", "textbox"] = "query"
    multi: bool = False
    include_all: bool = False
    default: str = ""


@dataclass(frozen=True)
class Board:
    title: str
    uid: str
    description: str
    rows: Sequence[Row]
    variables: Sequence[Variable] = ()
    annotations: Sequence[dict[str, Any]] = ()
    links: Sequence[tuple[str, str]] = ()
    tags: Sequence[str] = ("advmon",)
    time_from: str = "now-6h"

    def panels(self) -> list[PanelSpec]:
        return [panel for row in self.rows for panel in row.panels]

    def to_json_data(self, context: BoardContext) -> dict[str, Any]:
        dashboard = g.Dashboard(
            title=f"{context.title_prefix}{self.title}",
            uid=self.uid,
            description=self.description,
            tags=list(self.tags),
            schemaVersion=SCHEMA_VERSION,
            time=g.Time(self.time_from, "now"),
            refresh="30s",
            timezone="browser",
            panels=_layout(self.rows),
            templating=g.Templating(list=[_datasource_variable(context), *(_variable(v) for v in self.variables)]),
            # A link without a URL (no hosted runbooks page) is left out.
            links=[g.DashboardLink(title=title, uri=url, type="link", targetBlank=True) for title, url in self.links if url],
        )
        data = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
        data["annotations"] = {"list": [_builtin_annotation(), *self.annotations]}
        for panel in data["panels"]:
            _normalize_panel(panel)
        for variable in data["templating"]["list"]:
            if variable["type"] == "query":
                variable["datasource"] = dict(DATASOURCE)
        data.pop("rows", None)
        return data


def _datasource_variable(context: BoardContext) -> g.Template:
    return g.Template(
        name="datasource", label="Data source", query="prometheus", type="datasource",
        default=context.datasource_uid,
    )


def _variable(variable: Variable) -> g.Template:
    if variable.kind == "textbox":
        return g.Template(
            name=variable.name, label=variable.label, query=variable.default, default=variable.default, type="textbox"
        )
    return g.Template(
        name=variable.name,
        label=variable.label,
        query=variable.query,
        dataSource="${datasource}",
        multi=variable.multi,
        includeAll=variable.include_all,
        allValue=".*" if variable.include_all else None,
        refresh=2,
        type=variable.kind,
        default=variable.default or None,
    )


def _builtin_annotation() -> dict[str, Any]:
    return {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }


def _layout(rows: Sequence[Row]) -> list[Any]:
    """Rows of panels, left to right, wrapping at 24 columns; ids in order."""
    panels: list[Any] = []
    y = 0
    next_id = 1
    for row in rows:
        panels.append(g.RowPanel(title=row.title, gridPos=g.GridPos(h=1, w=GRID_COLUMNS, x=0, y=y), id=next_id))
        next_id += 1
        y += 1
        x, row_height = 0, 0
        for spec in row.panels:
            if x + spec.width > GRID_COLUMNS:
                x, y = 0, y + row_height
                row_height = 0
            panels.append(_panel(spec, g.GridPos(h=spec.height, w=spec.width, x=x, y=y), next_id))
            next_id += 1
            x += spec.width
            row_height = max(row_height, spec.height)
        y += row_height
    return panels


def _panel(spec: PanelSpec, position: g.GridPos, panel_id: int) -> Any:
    targets = [
        g.Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), instant=q.instant)
        for i, q in enumerate(spec.queries)
    ]
    links = [{"title": title, "url": url, "targetBlank": True} for title, url in spec.links if url]
    common = dict(
        title=spec.title, description=spec.description, dataSource="${datasource}", targets=targets,
        gridPos=position, id=panel_id, links=links,
        extraJson={"_advmon": {"fill_below_to": spec.fill_below_to, "right_axis": spec.right_axis,
                               "thresholds": _steps(spec), "repeat": spec.repeat,
                               "exemplars": [q.exemplar for q in spec.queries],
                               "texts": [[t.value, t.text, t.color] for t in spec.texts], "no_data": spec.no_data}},
    )
    if spec.kind == "stat":
        return g.Stat(**common, format=spec.unit, reduceCalc=spec.reduce, graphMode="none", textMode="value_and_name")
    if spec.kind == "table":
        for target in targets:
            target.format, target.instant = "table", True
        common["extraJson"]["_advmon"]["_table"] = _table_options(spec)
        return g.Table(**common, unit=spec.unit)
    return g.TimeSeries(**common, unit=spec.unit, legendDisplayMode="table", legendCalcs=["lastNotNull", "max", "min"])


def _table_options(spec: PanelSpec) -> dict[str, Any]:
    """The merge of the queries' rows by their labels, the columns' names, order, units, colours and links."""
    values = [column for column in spec.columns if not column.label]
    if len(values) != len(spec.queries):
        raise ValueError(f"{spec.title}: {len(spec.queries)} queries but {len(values)} value columns")
    rename = {f"Value #{chr(ord('A') + i)}": column.title for i, column in enumerate(values)}
    rename.update({column.label: column.title for column in spec.columns if column.label})
    order = {("" if c.label else "Value #") + (c.label or chr(ord("A") + values.index(c))): i
             for i, c in enumerate(spec.columns)}
    overrides = []
    for column in spec.columns:
        properties: list[dict[str, Any]] = [{"id": "unit", "value": column.unit}]
        if column.decimals is not None:
            properties.append({"id": "decimals", "value": column.decimals})
        if column.thresholds:
            properties += [{"id": "thresholds", "value": {"mode": "absolute", "steps": [
                {"color": step.color, "value": step.value} for step in column.thresholds]}},
                           {"id": "custom.cellOptions", "value": {"type": "color-background"}}]
        if column.texts:
            properties.append({"id": "mappings", "value": _mappings(column.texts)})
            properties.append({"id": "custom.cellOptions", "value": {"type": "color-text"}})
        if column.link is not None:
            properties.append({"id": "links", "value": [{"title": column.link[0], "url": column.link[1]}]})
        overrides.append({"matcher": {"id": "byName", "options": column.title}, "properties": properties})
    hidden = {column.title: True for column in spec.columns if column.hidden}
    return {
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}, "indexByName": order,
                                           "renameByName": rename}},
        ],
        "overrides": overrides,
        "hidden": hidden,
        "sort_by": spec.sort_by,
    }


def _mappings(texts: Sequence[ValueText | Sequence[Any]]) -> list[dict[str, Any]]:
    found = [t if isinstance(t, ValueText) else ValueText(*t) for t in texts]
    return [{"type": "value", "options": {format_value(t.value): {"text": t.text, "color": t.color, "index": i}}}
            for i, t in enumerate(found)]


def format_value(value: float) -> str:
    """A mapped value as Grafana keys it: ``0``, ``1.5``."""
    return str(int(value)) if value == int(value) else repr(value)


def _steps(spec: PanelSpec) -> list[dict[str, Any]]:
    steps = spec.thresholds or (ThresholdStep("green"),)
    return [{"color": s.color, "value": s.value} for s in steps]


def _normalize_panel(panel: dict[str, Any]) -> None:
    """Make grafanalib's output what Grafana 11/12 expects."""
    extra = panel.pop("_advmon", None)
    if panel["type"] == "row":
        panel.pop("datasource", None)
        panel["panels"] = []
        return
    panel["datasource"] = dict(DATASOURCE)
    for target, exemplar in zip(panel.get("targets", []), extra["exemplars"]):
        target["datasource"] = dict(DATASOURCE)
        target.pop("query", None)
        if exemplar:
            target["exemplar"] = True
    if extra["repeat"]:
        panel.update(repeat=extra["repeat"], repeatDirection="h", maxPerRow=4)
    field_config = panel.setdefault("fieldConfig", {})
    field_config.setdefault("overrides", [])
    defaults = field_config.setdefault("defaults", {})
    # Thresholds and std bands travel through extraJson: grafanalib's own emit "null" strings.
    defaults["thresholds"] = {"mode": "absolute", "steps": extra["thresholds"]}
    if extra["fill_below_to"]:
        field_config["overrides"].append(_fill_between(extra["fill_below_to"]))
    if extra.get("right_axis"):
        regex, label = extra["right_axis"]
        field_config["overrides"].append({
            "matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": "custom.axisPlacement", "value": "right"},
                           {"id": "custom.axisLabel", "value": label}],
        })
    if panel["type"] == "timeseries" and len(extra["thresholds"]) > 1:
        defaults.setdefault("custom", {})["thresholdsStyle"] = {"mode": "dashed"}
    if panel["type"] == "stat" and len(extra["thresholds"]) > 1:
        defaults["color"] = {"mode": "thresholds"}
    defaults["unit"] = defaults.get("unit") or "none"
    if extra.get("texts"):
        defaults["mappings"] = _mappings(extra["texts"])
    if extra.get("no_data"):
        defaults["noValue"] = extra["no_data"]
    table = extra.get("_table")
    if table:
        panel["transformations"] = table["transformations"]
        field_config["overrides"] = table["overrides"] + [
            {"matcher": {"id": "byName", "options": title}, "properties": [{"id": "custom.hidden", "value": True}]}
            for title in sorted(table["hidden"])]
        panel["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False},
                            "sortBy": [{"displayName": table["sort_by"], "desc": True}] if table["sort_by"] else []}
        for key in ("columns", "styles", "fontSize", "mappings", "color"):
            panel.pop(key, None)


def _fill_between(legend_regex: str) -> dict[str, Any]:
    return {
        "matcher": {"id": "byRegexp", "options": legend_regex},
        "properties": [{"id": "custom.fillOpacity", "value": 15}, {"id": "custom.lineWidth", "value": 0}],
    }


def dumps(data: dict[str, Any]) -> str:
    """Deterministic JSON: sorted keys, two-space indent, newline at the end."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"

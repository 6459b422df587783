"""Structural checks on a board's JSON, after the dashboard-linter's rules.

What a Grafana server would catch on import, and what grafana/dashboard-linter
flags, checked without either: a ``datasource`` variable every panel and query
uses, a title, a description and a unit on every panel, unique panel ids, a grid
inside 24 columns without overlaps, a valid uid, ``schemaVersion`` >= 39, and
``$__rate_interval`` in every ``rate()``/``irate()`` (an ``increase()`` may take a
fixed window on purpose, as "NaN/Inf values, last hour" does).

Example:
    >>> lint({"uid": "x", "schemaVersion": 12, "panels": [], "templating": {"list": []}})[:2]
    ['schemaVersion is 12, expected >= 39', "no 'datasource' template variable of type datasource"]
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["lint"]

_UID = re.compile(r"^[a-zA-Z0-9_-]{1,40}$")
_RATE = re.compile(r"\b(i?rate)\s*\((?:[^()]|\([^()]*\))*?\[([^\]]+)\]")
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_UNITS = {"none", "percentunit", "s", "ms", "short", "percent"}


def lint(board: dict[str, Any]) -> list[str]:
    """Every problem found, as sentences (empty: the board passes)."""
    problems = []
    if board.get("schemaVersion", 0) < 39:
        problems.append(f"schemaVersion is {board.get('schemaVersion')}, expected >= 39")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    source = variables.get("datasource")
    if source is None or source.get("type") != "datasource" or source.get("query") != "prometheus":
        problems.append("no 'datasource' template variable of type datasource")
    if not _UID.match(str(board.get("uid") or "")):
        problems.append(f"uid {board.get('uid')!r} is not 1-40 letters, digits, '-' or '_'")
    for variable in variables.values():
        if variable.get("type") == "query" and variable.get("datasource") != _DATASOURCE:
            problems.append(f"variable {variable.get('name')} does not use the datasource variable")
    panels = board.get("panels", [])
    ids = [p.get("id") for p in panels]
    if len(set(ids)) != len(ids) or None in ids:
        problems.append(f"panel ids are not unique: {ids}")
    problems += _grid_problems(panels)
    for panel in panels:
        if panel.get("type") != "row":
            problems += _panel_problems(panel)
    return problems


def _panel_problems(panel: dict[str, Any]) -> list[str]:
    name = panel.get("title") or f"panel {panel.get('id')}"
    problems = []
    if not panel.get("title"):
        problems.append(f"panel {panel.get('id')} has no title")
    if not panel.get("description"):
        problems.append(f"{name}: no description")
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    if unit not in _UNITS:
        problems.append(f"{name}: unit {unit!r} is not one of {sorted(_UNITS)}")
    if panel.get("datasource") != _DATASOURCE:
        problems.append(f"{name}: does not use the datasource variable")
    if not panel.get("targets"):
        problems.append(f"{name}: no query")
    for target in panel.get("targets", []):
        if target.get("datasource") != _DATASOURCE:
            problems.append(f"{name}: query {target.get('refId')} does not use the datasource variable")
        for function, window in _RATE.findall(target.get("expr", "")):
            if window != "$__rate_interval":
                problems.append(f"{name}: {function}() over [{window}] instead of [$__rate_interval]")
    return problems


def _grid_problems(panels: list[dict[str, Any]]) -> list[str]:
    problems, taken = [], {}
    for panel in panels:
        grid = panel.get("gridPos") or {}
        x, y, w, h = (grid.get(k) for k in ("x", "y", "w", "h"))
        name = panel.get("title") or panel.get("id")
        if None in (x, y, w, h) or w < 1 or h < 1 or x < 0 or x + w > 24:
            problems.append(f"{name}: gridPos {grid} is not inside 24 columns")
            continue
        for cell in ((cx, cy) for cx in range(x, x + w) for cy in range(y, y + h)):
            if cell in taken:
                problems.append(f"{name}: overlaps {taken[cell]}")
                break
            taken[cell] = name
    return problems

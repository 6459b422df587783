"""Every PromQL query of a board, and Grafana's variables substituted as Grafana would.

Used by the tests (every query must return data from a real Prometheus) and by
``advmon dashboards preview``.

Example:
    >>> substitute('rate(x{run=~"$run"}[$__rate_interval])', {"run": ["a", "b"]})
    'rate(x{run=~"(a|b)"}[1m])'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PanelQuery", "board_queries", "substitute", "variable_queries"]


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    kind: str
    expr: str
    legend: str
    grid: tuple[int, int, int, int]  # x, y, w, h
    unit: str
    exemplar: bool = False  # Grafana asks Prometheus for the exemplars of the series inside the query too


def board_queries(board: dict[str, Any]) -> list[PanelQuery]:
    """Each panel's targets, in board order (annotations too, as kind ``annotation``)."""
    found = []
    for panel in board.get("panels", []):
        if panel.get("type") == "row":
            continue
        grid = panel["gridPos"]
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none")
        for target in panel.get("targets", []):
            found.append(PanelQuery(panel["title"], panel["type"], target["expr"], target.get("legendFormat", ""),
                                    (grid["x"], grid["y"], grid["w"], grid["h"]), unit, bool(target.get("exemplar"))))
    for annotation in board.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            found.append(PanelQuery(annotation["name"], "annotation", annotation["expr"], "", (0, 0, 0, 0), "none"))
    return found


def variable_queries(board: dict[str, Any]) -> dict[str, str]:
    """``{variable: label_values(...) query}`` of the board's query variables."""
    return {v["name"]: v["query"] for v in board["templating"]["list"] if v.get("type") == "query"}


def substitute(
    expr: str,
    values: Mapping[str, str | Sequence[str]],
    rate_interval: str = "1m",
    range_: str = "1h",
    interval: str = "15s",
) -> str:
    """Replace ``$var``/``${var}`` (several values become ``(a|b)``) and Grafana's built-ins."""
    builtins = {"__rate_interval": rate_interval, "__range": range_, "__interval": interval}

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        if name not in values:
            return match.group(0)
        chosen = values[name]
        if isinstance(chosen, str):
            return chosen
        return chosen[0] if len(chosen) == 1 else "(" + "|".join(chosen) + ")"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, expr)

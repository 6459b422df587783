"""An advmon run read back from a W&B offline run (what :class:`advmon.sinks.wandb.WandbSink` logged).

Metrics come from the history rows that carry ``advmon/step``; a step's worst
groups from the ``advmon/exemplars`` Table file the row points to.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from advmon.record import HISTOGRAM_STAGES, Record, histogram_key
from advmon.runs import ADVMON_PREFIXES, Run, RunSourceError
from advmon.record import Histogram

__all__ = ["read_wandb_run"]

STEP_KEY = "advmon/step"
EXEMPLARS_KEY = "advmon/exemplars"  # the sink's Table of a step's worst groups


def read_wandb_run(path: Path) -> Run:
    """Records of a W&B run directory or ``.wandb`` file: the rows that carry ``advmon/step``."""
    from advmon.runs.wandb_file import WandbFileError, read_records

    file = _run_file(Path(path))
    try:
        entries = read_records(file)
    except ModuleNotFoundError:
        raise RunSourceError("reading a W&B run needs wandb: pip install 'advmon[wandb]'") from None
    except (WandbFileError, OSError) as exc:
        raise RunSourceError(str(exc)) from None
    name = file.stem.removeprefix("run-")
    by_step: dict[int, tuple[float, dict[str, float]]] = {}
    exemplars: dict[int, list[dict]] = {}
    histograms: dict[int, dict[str, Histogram]] = {}
    for entry in entries:
        kind = entry.WhichOneof("record_type")
        if kind == "run" and entry.run.display_name:
            name = entry.run.display_name
        if kind != "history":
            continue
        row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in entry.history.item}
        if STEP_KEY not in row:
            continue  # a row of the trainer's alone
        metrics = {k: float(v) for k, v in row.items() if k.startswith(ADVMON_PREFIXES) and k != STEP_KEY
                   and not k.startswith(EXEMPLARS_KEY + "/") and isinstance(v, (int, float))}
        step = int(row[STEP_KEY])
        by_step[step] = (float(row.get("_timestamp", 0.0)), metrics)
        histograms[step] = _histograms(row)
        table = row.get(f"{EXEMPLARS_KEY}/path")
        if isinstance(table, str):
            exemplars[step] = _table_entries(file.parent / "files" / table)
    keys = sorted({k for _, metrics in by_step.values() for k in metrics})
    records = [
        Record(name, step, when, "", None, {k: metrics.get(k, math.nan) for k in keys}, exemplars.get(step, []),
               histograms.get(step, {}))
        for step, (when, metrics) in sorted(by_step.items())
    ]
    return Run(name, str(path), records)


def _histograms(row: dict) -> dict[str, Histogram]:
    """The advantages' histograms of a row (``wandb.Histogram`` keeps bins and values as given)."""
    found = {}
    for stage in HISTOGRAM_STAGES:
        key = histogram_key(stage)
        bins, values = row.get(f"{key}/bins"), row.get(f"{key}/values")
        if isinstance(bins, list) and isinstance(values, list) and len(bins) == len(values) + 1:
            found[stage] = Histogram(tuple(float(b) for b in bins), tuple(float(v) for v in values))
    return found


def _table_entries(path: Path) -> list[dict]:
    """A step's exemplars back from the W&B Table file the sink logged (none if the file is not there)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    columns = table.get("columns", [])
    entries = []
    for row in table.get("data", []):
        entry = {column: value for column, value in zip(columns, row) if column != "step"}
        entries.append({k: math.nan if v is None and k not in ("group", "reason", "slice") else v
                        for k, v in entry.items()})
    return entries


def _run_file(path: Path) -> Path:
    if path.is_file():
        return path
    files = sorted(path.glob("run-*.wandb")) or sorted(path.glob("*/run-*.wandb"))
    if len(files) != 1:
        found = "no .wandb file" if not files else f"{len(files)} .wandb files"
        raise RunSourceError(f"{path}: expected one W&B run (run-*.wandb), found {found}")
    return files[0]

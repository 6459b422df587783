"""An advmon run read back from trackio's local store (what :class:`advmon.sinks.trackio.TrackioSink` logged).

trackio keeps a project in one SQLite file, ``<TRACKIO_DIR>/<project>.db``, whose
``metrics`` table holds one row per ``log`` call: the run's name (and id), the step,
a timestamp and the row's values as JSON, NaN and Inf written ``"NaN"``,
``"Infinity"`` and ``"-Infinity"``. The file is opened read-only with Python's own
``sqlite3``: reading a file needs no trackio, finding a project's file by name asks
trackio where its store is. Of several runs of one name (a script run again), the
latest is read, as trackio's dashboard shows it; rows without advmon's keys (the
trainer's, in a shared run) are skipped.
"""

from __future__ import annotations

import json
import math
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from advmon.record import HISTOGRAM_STAGES, Record, histogram_key
from advmon.runs import ADVMON_PREFIXES, Run, RunSourceError
from advmon.record import Histogram

__all__ = ["read_trackio_run", "trackio_database"]

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def trackio_database(store: str) -> Path:
    """The SQLite file of ``store``: a path to a ``.db`` file, or a project name in trackio's own store."""
    if store.endswith(".db") or "/" in store or "\\" in store:
        return Path(store)
    try:
        from trackio.utils import TRACKIO_DIR, canonical_project_name
    except ModuleNotFoundError:
        raise RunSourceError(f"finding trackio project {store!r} needs trackio: pip install 'advmon[trackio]' "
                             "(or pass the project's file: trackio+PATH/PROJECT.db#RUN)") from None
    return Path(TRACKIO_DIR) / f"{canonical_project_name(store)}.db"


def read_trackio_run(store: str, run: str) -> Run:
    """Records of the trackio run named (or with id) ``run``, by step, from a project name or its ``.db`` file."""
    path = trackio_database(store)
    if not path.is_file():
        raise RunSourceError(f"{path}: no trackio project file there (trackio+PROJECT looks in trackio's store, "
                             "TRACKIO_DIR or ~/.cache/huggingface/trackio)")
    try:
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = _rows(connection, run)
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise RunSourceError(f"{path}: not a trackio project file ({exc})") from None
    if not rows:
        raise RunSourceError(f"{path} has no run named {run!r}")
    name = rows[0][0]
    by_step: dict[int, tuple[float, dict[str, float], dict[str, Histogram]]] = {}
    for _, step, timestamp, text in rows:
        try:
            values = json.loads(text)
        except ValueError:
            raise RunSourceError(f"{path}: run {run!r} has a row at step {step} that is not JSON") from None
        numbers = {k: _number(v) for k, v in values.items() if k.startswith(ADVMON_PREFIXES)}
        metrics = {k: v for k, v in numbers.items() if v is not None}
        if metrics:  # a later row of a step (logged again) wins, as in advmon's JSONL reader
            by_step[int(step)] = (_seconds(timestamp), metrics, _histograms(values))
    keys = sorted({k for _, metrics, _ in by_step.values() for k in metrics})
    records = [Record(name, step, when, "", None, {k: metrics.get(k, math.nan) for k in keys}, [], histograms)
               for step, (when, metrics, histograms) in sorted(by_step.items())]
    return Run(name, f"trackio+{store}#{run}", records)


def _rows(connection: sqlite3.Connection, run: str) -> list[tuple[Any, ...]]:
    """The run's ``(name, step, timestamp, metrics)`` rows in the order trackio wrote them (none: no such run)."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(metrics)")}
    if not columns:
        raise sqlite3.DatabaseError("it has no metrics table")
    select = "SELECT run_name, step, timestamp, metrics FROM metrics WHERE {} = ? ORDER BY timestamp, id"
    if "run_id" not in columns:  # a file from before trackio kept run ids
        return connection.execute(select.format("run_name"), (run,)).fetchall()
    latest = connection.execute(
        "SELECT run_id FROM metrics WHERE run_name = ? GROUP BY run_id ORDER BY MIN(timestamp) DESC LIMIT 1", (run,)
    ).fetchone()
    return connection.execute(select.format("run_id"), latest or (run,)).fetchall()


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return _NON_FINITE.get(value) if isinstance(value, str) else None


def _histograms(values: dict[str, Any]) -> dict[str, Histogram]:
    """The advantages' histograms of a row (``trackio.Histogram`` keeps the bins and counts as given)."""
    found = {}
    for stage in HISTOGRAM_STAGES:
        entry = values.get(histogram_key(stage))
        if isinstance(entry, dict) and len(entry.get("bins", [])) == len(entry.get("values", [])) + 1:
            found[stage] = Histogram(tuple(float(b) for b in entry["bins"]), tuple(float(v) for v in entry["values"]))
    return found


def _seconds(timestamp: Any) -> float:
    try:
        return datetime.fromisoformat(str(timestamp)).timestamp()
    except ValueError:
        return 0.0

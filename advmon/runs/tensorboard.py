"""An advmon run read back from TensorBoard event files (what :class:`advmon.sinks.tensorboard.TensorBoardSink` wrote).

``tb+DIR`` is the run's own directory (``runs/grpo-tp2``, where the sink writes
``<dir>/<run>/``); the run is named after it. TensorBoard keeps scalars as float32,
so values come back with 7 significant digits; keys and steps are advmon's. Compare
two runs read from the same kind of source: against its own float64 JSONL file, a
statistic that is constant over steps differs by float32 rounding alone, and the
rank test of ``advmon compare`` would call that a divergence. The advantages'
histograms come back whole (their edges and counts are exact in TensorBoard's doubles).
"""

from __future__ import annotations

import math
from pathlib import Path

from advmon.histograms import Histogram
from advmon.record import Record, histogram_key
from advmon.runs import ADVMON_PREFIXES, Run, RunSourceError

HISTOGRAM_PREFIX = histogram_key("")

__all__ = ["read_tensorboard_run"]


def read_tensorboard_run(directory: Path) -> Run:
    """Records of the event files in ``directory``, one per step, with TensorBoard's own reader."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ModuleNotFoundError:
        raise RunSourceError("reading a TensorBoard run needs tensorboard: pip install 'advmon[tensorboard]'") from None
    directory = Path(directory)
    if not directory.is_dir():
        raise RunSourceError(f"{directory}: no such directory (expected tb+DIR, the run's event-file directory)")
    accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0, "histograms": 0})
    try:
        accumulator.Reload()
    except Exception as exc:  # noqa: BLE001 - a damaged file: one line at the CLI, not a traceback
        raise RunSourceError(f"{directory}: cannot read its TensorBoard event files: {exc}") from None
    by_step: dict[int, dict[str, float]] = {}
    times: dict[int, float] = {}
    for tag in accumulator.Tags().get("scalars", []):
        if not tag.startswith(ADVMON_PREFIXES):
            continue  # the trainer's own scalars, in a shared directory
        for event in accumulator.Scalars(tag):
            by_step.setdefault(event.step, {})[tag] = float(event.value)
            times[event.step] = max(times.get(event.step, 0.0), float(event.wall_time))
    histograms: dict[int, dict[str, Histogram]] = {}
    for tag in accumulator.Tags().get("histograms", []):
        if tag.startswith(HISTOGRAM_PREFIX):
            for event in accumulator.Histograms(tag):
                value = event.histogram_value  # bucket 0 is empty, ending at the first bin's left edge
                histograms.setdefault(event.step, {})[tag.removeprefix(HISTOGRAM_PREFIX)] = Histogram(
                    tuple(value.bucket_limit), tuple(value.bucket[1:]))
    keys = sorted({key for metrics in by_step.values() for key in metrics})
    name = directory.name
    records = [
        Record(name, step, times[step], "", None, {key: by_step[step].get(key, math.nan) for key in keys},
               histograms=histograms.get(step, {}))
        for step in sorted(by_step)
    ]
    return Run(name, f"tb+{directory}", records)

"""An advmon run read back from TensorBoard event files (what :class:`advmon.sinks.tensorboard.TensorBoardSink` wrote).

``tb+DIR`` is the run's own directory (``runs/grpo-tp2``, where the sink writes
``<dir>/<run>/``); the run is named after it. TensorBoard's own convention works too:
the directory given to the sink (what ``tensorboard --logdir`` takes) is read as its
run when it holds one, and when it holds several the error lists them, each as the
``tb+`` source that reads it. TensorBoard keeps scalars as float32,
so values come back with 7 significant digits; keys and steps are advmon's. Compare
two runs read from the same kind of source: against its own float64 JSONL file, a
statistic that is constant over steps differs by float32 rounding alone, and the
rank test of ``advmon compare`` would call that a divergence. The advantages'
histograms come back whole (their edges and counts are exact in TensorBoard's doubles).
"""

from __future__ import annotations

import math
from pathlib import Path

from advmon.record import Record, histogram_key
from advmon.runs import ADVMON_PREFIXES, Run, RunSourceError
from advmon.record import Histogram

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
    run = _read_events(EventAccumulator, directory)
    if run.records:
        return run
    held = run_directories(directory)
    if len(held) == 1:
        return _read_events(EventAccumulator, held[0])
    if held:
        listed = "\n".join(f"  tb+{path}" for path in held)
        raise RunSourceError(f"{directory} holds {len(held)} runs; name one:\n{listed}")
    return run  # no advmon scalars anywhere: the caller says the run has no records


def run_directories(log_dir: Path) -> list[Path]:
    """The runs a log directory holds: its subdirectories with event files (where TensorBoardSink writes each run).

    Example:
        >>> run_directories(Path("/nonexistent"))
        []
    """
    if not log_dir.is_dir():
        return []
    return sorted(path for path in log_dir.iterdir() if path.is_dir() and _has_events(path))


def _has_events(directory: Path) -> bool:
    return any(path.name.startswith("events.out.tfevents") for path in directory.iterdir() if path.is_file())


def _read_events(accumulator_type: type, directory: Path) -> Run:
    """The advmon records of the event files directly in ``directory``."""
    accumulator = accumulator_type(str(directory), size_guidance={"scalars": 0, "histograms": 0})
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

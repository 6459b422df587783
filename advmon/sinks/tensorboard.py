"""TensorBoard: a record's metrics as scalars at the record's step, in an event file per run.

NeMo-RL and verl log to TensorBoard, and many teams read their runs there. Each
record becomes one event holding a scalar per metric key (the record's keys are
the tags: ``advantages/post_norm/std`` is plotted as TensorBoard's
``advantages/post_norm/std``), at the record's step and time. The files are
written by TensorBoard's own ``EventFileWriter`` (no TensorFlow, no torch) under
``<dir>/<run>/``, and read back by its ``EventAccumulator``. A record's histograms
(the pre- and post-norm advantages' distributions, :mod:`advmon.stats.histograms`) go in
the same event as raw histograms under ``histograms/advantages/<stage>``: the
bins' right edges, their counts, and the stage's min, max, count and sums.

TensorBoard stores a scalar as a float32 (``simple_value``): values keep 7
significant digits there; the JSONL file keeps every digit. Non-finite values
are not logged, as for W&B and MLflow ("unavailable" has no scalar).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from advmon.record import Record, histogram_key
from advmon.sinks.base import Sink, require
from advmon.stats import Histogram

__all__ = ["TensorBoardSink"]


class TensorBoardSink(Sink):
    """Write records as TensorBoard scalars under ``<log_dir>/<run>/``.

    Delivered off the training thread like the other remote sinks, its failures
    counted in ``advmon/sink_errors/tensorboard``, and ``advmon replay FILE --to
    tensorboard:DIR`` backfills it.

    Example:
        >>> import tempfile
        >>> sink = TensorBoardSink(tempfile.mkdtemp())
        >>> sink.attach("doc", ["tensorboard"])
        >>> sink.write(Record("doc", 3, 1700000000.0, "e", None, {"rewards/mean": 0.5}))
        >>> sink.close()
    """

    name = "tensorboard"
    #: Records carry their advantages' histograms for it (TensorBoard's raw histogram).
    histograms = True

    def __init__(self, log_dir: str | os.PathLike[str] = "advmon-runs/tensorboard") -> None:
        require("tensorboard", "tensorboard")
        self.log_dir = Path(log_dir)
        self.run = "advmon"
        self._writer: Any = None

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        self.run = run

    @property
    def directory(self) -> Path:
        """Where this run's event file is written."""
        return self.log_dir / self.run

    def write(self, record: Record) -> None:
        self.write_batch([record])

    def write_batch(self, records: Sequence[Record]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self._open()
        for record in records:
            values = [Summary.Value(tag=key, simple_value=value)
                      for key, value in record.metrics.items() if math.isfinite(value)]
            values += [Summary.Value(tag=histogram_key(stage), histo=_raw_histogram(record, stage, histogram))
                       for stage, histogram in record.histograms.items()]
            writer.add_event(Event(wall_time=record.time, step=record.step, summary=Summary(value=values)))
        writer.flush()

    def _open(self) -> Any:
        if self._writer is None:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = EventFileWriter(str(self.directory))
        return self._writer

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __repr__(self) -> str:
        return f"TensorBoardSink({str(self.log_dir)!r})"


def _raw_histogram(record: Record, stage: str, histogram: Histogram) -> Any:
    """TensorBoard's raw histogram: each bin's right edge and count, with the stage's own extrema and sums.

    A leading empty bucket ends at the first bin's left edge, which TensorBoard has no
    field for: the reader gets every edge back (``advmon report tb+DIR`` draws them).
    """
    from tensorboard.compat.proto.summary_pb2 import HistogramProto

    metrics = record.metrics
    n = histogram.total
    mean, std = metrics.get(f"advantages/{stage}/mean", math.nan), metrics.get(f"advantages/{stage}/std", math.nan)
    edges = list(histogram.edges)
    low, high = metrics.get(f"advantages/{stage}/min", math.nan), metrics.get(f"advantages/{stage}/max", math.nan)
    return HistogramProto(
        min=low if math.isfinite(low) else edges[0],
        max=high if math.isfinite(high) else edges[-1],
        num=n,
        sum=mean * n if math.isfinite(mean) else 0.0,
        sum_squares=(std * std + mean * mean) * n if math.isfinite(mean) and math.isfinite(std) else 0.0,
        bucket_limit=edges,
        bucket=[0.0, *histogram.counts],
    )

"""trackio (Hugging Face's local-first tracker): one ``run.log`` row per record.

Each record becomes one row at its own step, ``run.log(metrics, step=record.step)``.
trackio keeps every row as it comes (it has no row to commit and no step of its own
that advmon could move), so advmon logs at its own steps even into the trainer's run
(``TrackioSink(run=trainer_run)``). NaN and Inf are kept: trackio stores them as
``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` and its dashboard reads them back. The
advantages' histograms go as ``trackio.Histogram`` under ``histograms/advantages/<stage>``.

trackio stores a project in one SQLite file, ``<TRACKIO_DIR>/<project>.db``
(``TRACKIO_DIR`` is read when trackio is first imported; default
``~/.cache/huggingface/trackio``); ``advmon report trackio+PROJECT#RUN`` reads it back
(:mod:`advmon.runs.trackio`).

``run.log`` only queues: trackio's own thread writes the queue every half second and
never raises; a row it fails to store is trackio's warning, not one of advmon's sink
errors. Closing the sink finishes advmon's run, which waits for that thread.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from typing import Any

from advmon.record import Record, histogram_key
from advmon.redact import remember_secret, remember_secrets
from advmon.sinks.base import Sink, require

__all__ = ["TrackioSink"]


class TrackioSink(Sink):
    """Send records to trackio.

    Args:
        project: the trackio project of a run advmon starts itself (default ``"advmon"``).
        run: a trackio run to log into (what ``trackio.init`` returned, e.g. the
            trainer's); default: a run of advmon's own, named after the monitor's
            run id, started on the first record.
        init_kwargs: more ``trackio.init`` arguments for a run advmon starts
            (``space_id``, ``server_url``, ``group``, ``config``, ``resume``...).
            advmon's run logs no CPU or GPU metrics of its own unless asked
            (``auto_log_cpu``, ``auto_log_gpu``).
    """

    name = "trackio"
    #: Records carry their advantages' histograms for it (``trackio.Histogram``).
    histograms = True

    def __init__(self, project: str | None = None, run: Any = None, **init_kwargs: Any) -> None:
        self._trackio = require("trackio", "trackio")
        remember_secrets(init_kwargs.get("server_url"))  # ?write_token=... never printed
        remember_secret(init_kwargs.get("webhook_url"))  # a Slack or Discord webhook is a secret as a whole
        self.project = project
        self.init_kwargs = init_kwargs
        self.run_name = ""
        self._run = run
        self._owned = False

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        self.run_name = run

    @property
    def trackio_run(self) -> Any:
        """The trackio run records go to (advmon's own is started on the first record)."""
        if self._run is None:
            kwargs = {"project": self.project or "advmon", "name": self.run_name or None, "embed": False,
                      "auto_log_cpu": False, "auto_log_gpu": False, **self.init_kwargs}
            # trackio.init finishes the current run of the context it is called in and becomes
            # that context's current run: in a context of its own, it touches no one else's.
            self._run = contextvars.Context().run(self._trackio.init, **kwargs)
            self._owned = True
        return self._run

    def write(self, record: Record) -> None:
        data: dict[str, Any] = dict(record.metrics)
        for stage, histogram in record.histograms.items():
            data[histogram_key(stage)] = self._trackio.Histogram(np_histogram=(histogram.counts, histogram.edges))
        self.trackio_run.log(data, step=record.step)

    def close(self) -> None:
        if self._owned and self._run is not None:
            run, self._run = self._run, None
            run.finish()

    def __repr__(self) -> str:
        return f"TrackioSink(project={self.project!r})"

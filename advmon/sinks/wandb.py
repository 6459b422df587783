"""Weights & Biases: log into the trainer's active run, or a run of advmon's own.

advmon's keys are plotted against their own step axis, ``advmon/step``, declared
with ``define_metric``. In a run advmon started itself, each record is one row.

In the trainer's run advmon never passes ``step=`` and never commits a row
(``commit=False``): a record joins the row the trainer is filling and is
committed with it, so advmon can never move W&B's step (a trainer that logs
``step=N`` after W&B's step passed N loses that data). A row holds one value per
key: if advmon emits two records before the trainer starts a new row, the row
keeps the later one (the JSONL file keeps both). For one row per record whatever
the trainer does, give advmon a run of its own: ``WandbSink(join_active_run=False)``.
Advantage keys get min/max/last summaries. A record's worst groups go to a Table,
``advmon/exemplars``, at steps :class:`~advmon.record.ExemplarSchedule` picks.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from advmon.errors import AdvmonConfigError
from advmon.record import EXEMPLAR_COLUMNS, ExemplarSchedule, Record, exemplar_rows, histogram_key
from advmon.sinks.base import Sink, require

__all__ = ["WandbSink"]

STEP_KEY = "advmon/step"
#: The W&B Table of a record's worst groups.
EXEMPLARS_KEY = "advmon/exemplars"
_STEPPED = ("rewards/*", "groups/*", "estimator/*", "advmon/internal_errors", "advmon/sink_errors/*",
            "advmon/dropped_records/*", "histograms/*")


def _check_writable(directory: str | os.PathLike[str] | None) -> None:
    """W&B quietly writes elsewhere (a temporary directory) when it cannot write where asked: refuse early."""
    if directory is None:
        return
    path = Path(directory)
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent  # the nearest existing ancestor must let W&B create the rest
    if not os.access(probe, os.W_OK | os.X_OK) or (probe == path and not path.is_dir()):
        import tempfile

        raise AdvmonConfigError(
            f"W&B cannot write to {path} ({'not a directory' if probe == path and not path.is_dir() else 'no write permission'}); "
            f"it would silently write under {tempfile.gettempdir()} instead. Pass a writable dir= or set WANDB_DIR."
        )


class WandbSink(Sink):
    """Send records to W&B.

    Args:
        project: project for a run advmon starts itself (default ``"advmon"``).
        run: a ``wandb`` run object to log into; default: ``wandb.run`` if a run
            is active when the first record arrives (and ``join_active_run``),
            otherwise a new run named after the monitor's run id.
        join_active_run: log into the trainer's active run (default) or start a
            run of advmon's own beside it (``reinit="create_new"``).
        init_kwargs: extra ``wandb.init`` arguments for a run advmon starts
            (``entity``, ``mode``, ``dir``, ``config``...).
        exemplars_every: a record's worst groups go to a W&B Table
            (``advmon/exemplars``) at every step that names a troubled group
            (non-finite or beyond the bound), and at one step in this many.
    """

    name = "wandb"
    #: Records carry their advantages' histograms for it (``wandb.Histogram``, under ``histograms/advantages/<stage>``).
    histograms = True
    #: Delivered in bursts at most once a second: ``run.log`` is heavy Python, and one
    #: burst contends with the training thread for the GIL once, not at every record.
    delivery_interval = 1.0

    def __init__(
        self, project: str | None = None, run: Any = None, join_active_run: bool = True, exemplars_every: int = 100,
        **init_kwargs: Any,
    ) -> None:
        self._wandb = require("wandb", "wandb")
        self._exemplars = ExemplarSchedule(exemplars_every)
        _check_writable(init_kwargs.get("dir") or os.environ.get("WANDB_DIR"))
        self.project = project
        self.join_active_run = join_active_run
        self.init_kwargs = init_kwargs
        self.run_name = ""
        self._run = run
        self._owned = False
        self._declared = False

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        self.run_name = run

    @property
    def wandb_run(self) -> Any:
        """The W&B run records go to (started on the first record)."""
        if self._run is None:
            if self._wandb.run is not None and self.join_active_run:
                self._run = self._wandb.run
            else:
                kwargs = {"project": self.project or "advmon", "name": self.run_name or None, **self.init_kwargs}
                if self._wandb.run is not None:
                    kwargs.setdefault("reinit", "create_new")
                self._run = self._wandb.init(**kwargs)
                self._owned = True
                # W&B finishes its runs at exit; exit hooks run last-registered first,
                # so register advmon's drain again to deliver queued records before that.
                from advmon.lifecycle import close_all_again_at_exit

                close_all_again_at_exit()
        return self._run

    def write(self, record: Record) -> None:
        run = self.wandb_run
        if not self._declared:
            run.define_metric(STEP_KEY)
            run.define_metric("advantages/*", step_metric=STEP_KEY, summary="min,max,last")
            for pattern in _STEPPED:
                run.define_metric(pattern, step_metric=STEP_KEY)
            self._declared = True
        data: dict[str, Any] = {k: v for k, v in record.metrics.items() if math.isfinite(v)}
        data[STEP_KEY] = record.step
        for stage, histogram in record.histograms.items():
            bins = (list(histogram.counts), list(histogram.edges))
            data[histogram_key(stage)] = self._wandb.Histogram(np_histogram=bins)
        if self._exemplars.due(record):
            data[EXEMPLARS_KEY] = self._wandb.Table(columns=list(EXEMPLAR_COLUMNS), data=exemplar_rows(record))
        run.log(data, commit=self._owned)

    def close(self) -> None:
        if self._owned and self._run is not None:
            self._run.finish()
            self._run = None

    def __repr__(self) -> str:
        return f"WandbSink(project={self.project!r})"

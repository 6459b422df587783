"""MLflow: one batched ``log_batch`` call per record, into the active run or advmon's own.

Keys are kept as they are (MLflow allows ``/``); characters MLflow forbids become
``_``. A run advmon creates is tagged ``advmon.run=<run id>``, so a later
``advmon replay`` finds it and backfills the same MLflow run.

A record's worst groups go to a JSON artifact per step
(:func:`exemplar_artifact`) at steps :class:`~advmon.record.ExemplarSchedule` picks.

A dead tracking server makes MLflow's HTTP client retry for a long time
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``); that
happens on advmon's background thread, never on the training thread.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from advmon.record import ExemplarSchedule, Record
from advmon.redact import redact_url, remember_secrets
from advmon.sinks.base import Sink, require

__all__ = ["MlflowSink", "exemplar_artifact", "mlflow_key", "search_tagged_runs"]

RUN_TAG = "advmon.run"
_BATCH_LIMIT = 1000  # MLflow's maximum number of metrics per log_batch call
_FORBIDDEN = re.compile(r"[^\w\-. :/]")


def search_tagged_runs(client: Any, experiment_ids: list[str], value: str, max_results: int = 1) -> list[Any]:
    """Runs whose ``advmon.run`` tag equals ``value``, whatever quotes the name holds.

    MLflow's filter strings have no escape for a quote inside a quoted value, so
    the value is quoted with the kind of quote it lacks; a name with both kinds
    is searched by its longest quote-free piece and matched exactly here.
    """
    if "'" not in value:
        condition, exact = f"tags.`{RUN_TAG}` = '{value}'", True
    elif '"' not in value:
        condition, exact = f'tags.`{RUN_TAG}` = "{value}"', True
    else:
        piece = max(re.split(r"[\'\"%_]", value), key=len)
        condition, exact = f"tags.`{RUN_TAG}` LIKE '%{piece}%'", False
    found = client.search_runs(experiment_ids, filter_string=condition, max_results=max_results if exact else 50_000)
    if not exact:
        found = [run for run in found if run.data.tags.get(RUN_TAG) == value][:max_results]
    return list(found)


def exemplar_artifact(step: int) -> str:
    """Where a step's exemplars are stored in the run's artifacts.

    Example:
        >>> exemplar_artifact(42)
        'advmon/exemplars/step-00000042.json'
    """
    return f"advmon/exemplars/step-{step:08d}.json"


def mlflow_key(key: str) -> str:
    """``key`` with the characters MLflow rejects replaced by ``_``.

    Example:
        >>> mlflow_key("estimator/kl[k3]")
        'estimator/kl_k3_'
    """
    return _FORBIDDEN.sub("_", key)


class MlflowSink(Sink):
    """Send records to MLflow.

    Args:
        tracking_uri: where to log (default: MLflow's own default, e.g.
            ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``).
        experiment: experiment name for a run advmon creates (default: MLflow's default).
        run_id: log into this MLflow run. Otherwise the run active when the
            monitor is created (MLflow's active run is per thread, and records are
            written on advmon's own thread), else a run tagged with advmon's run
            id, found or created.
        exemplars_every: a record's worst groups go to a JSON artifact
            (``advmon/exemplars/step-<step>.json``) at every step that names a
            troubled group (non-finite or beyond the bound), and at one step in this many.
    """

    name = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None, run_id: str | None = None,
                 exemplars_every: int = 100) -> None:
        self._mlflow = require("mlflow", "mlflow")
        self._exemplars = ExemplarSchedule(exemplars_every)
        remember_secrets(tracking_uri)  # scrubbed from every message advmon emits
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_id = run_id
        self.run_name = ""
        self._client: Any = None
        self._owned = False

    def attach(self, run: str, sink_names: Sequence[str]) -> None:
        self.run_name = run
        active = self._mlflow.active_run()  # on the creating thread, where it is visible
        if self.run_id is None and active is not None and self.tracking_uri in (None, self._mlflow.get_tracking_uri()):
            self.run_id = active.info.run_id

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = self._mlflow.tracking.MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _resolve_run(self) -> str:
        if self.run_id is not None:
            return self.run_id
        experiment_id = self._experiment_id()
        name = self.run_name or "advmon"
        found = search_tagged_runs(self.client, [experiment_id], name)
        if found:
            self.run_id = found[0].info.run_id
        else:
            created = self.client.create_run(experiment_id, tags={RUN_TAG: name}, run_name=name)
            self.run_id = created.info.run_id
            self._owned = True
        return self.run_id

    def _experiment_id(self) -> str:
        if self.experiment is None:
            return "0"
        experiment = self.client.get_experiment_by_name(self.experiment)
        if experiment is not None:
            return experiment.experiment_id
        return self.client.create_experiment(self.experiment)

    def write(self, record: Record) -> None:
        self.write_batch([record])

    def write_batch(self, records: Sequence[Record]) -> None:
        """Log several records in as few ``log_batch`` calls as MLflow allows (1,000 metrics each)."""
        from mlflow.entities import Metric

        run_id = self._resolve_run()
        metrics = [
            Metric(mlflow_key(key), value, int(record.time * 1000), record.step)
            for record in records
            for key, value in record.metrics.items()
            if math.isfinite(value)
        ]
        for start in range(0, len(metrics), _BATCH_LIMIT):
            self.client.log_batch(run_id, metrics=metrics[start : start + _BATCH_LIMIT])
        for record in records:
            if self._exemplars.due(record):
                data = record.to_dict()
                payload = {key: data[key] for key in ("run", "step", "time", "exemplars")}
                self.client.log_text(run_id, json.dumps(payload, indent=1), exemplar_artifact(record.step))

    def close(self) -> None:
        if self._owned and self.run_id is not None:
            try:
                self.client.set_terminated(self.run_id)
            finally:
                self._owned = False

    def __repr__(self) -> str:
        return f"MlflowSink({redact_url(self.tracking_uri) if self.tracking_uri else None!r})"

"""An advmon run read back from MLflow (what :class:`advmon.sinks.mlflow.MlflowSink` logged)."""

from __future__ import annotations

import math

from advmon.record import Record
from advmon.runs import ADVMON_PREFIXES, Run, RunSourceError

__all__ = ["read_mlflow_run"]

RUN_TAG = "advmon.run"


def read_mlflow_run(tracking_uri: str, run: str) -> Run:
    """Records of the MLflow run with id ``run``, or tagged ``advmon.run=run``, by step."""
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
    except ModuleNotFoundError:
        raise RunSourceError("reading an MLflow run needs mlflow: pip install 'advmon[mlflow]'") from None
    client = MlflowClient(tracking_uri=tracking_uri)
    try:
        info = _find(client, run)
        by_step: dict[int, dict[str, float]] = {}
        times: dict[int, float] = {}
        for key in info.data.metrics:
            if not key.startswith(ADVMON_PREFIXES):
                continue
            for metric in client.get_metric_history(info.info.run_id, key):
                by_step.setdefault(metric.step, {})[key] = float(metric.value)
                times[metric.step] = max(times.get(metric.step, 0.0), metric.timestamp / 1000)
    except MlflowException as exc:
        raise RunSourceError(f"MLflow at {tracking_uri}: {exc.message}") from None
    keys = sorted({k for metrics in by_step.values() for k in metrics})
    name = info.data.tags.get(RUN_TAG) or info.info.run_name or info.info.run_id
    records = [
        Record(name, step, times[step], "", None, {k: by_step[step].get(k, math.nan) for k in keys})
        for step in sorted(by_step)
    ]
    return Run(name, f"mlflow+{tracking_uri}#{run}", records)


def _find(client, run: str):
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run)
    except MlflowException:
        pass  # not a run id: try advmon's tag
    from advmon.sinks.mlflow import search_tagged_runs

    experiments = [e.experiment_id for e in client.search_experiments()]
    found = search_tagged_runs(client, experiments, run)
    if not found:
        raise RunSourceError(f"no MLflow run with id or {RUN_TAG} tag {run!r}")
    return found[0]

"""Sinks from short strings, for configs, the CLI and ``ADVMON_SINKS``.

The sinks are :data:`SINK_SPECS` (``jsonl[:PATH]``, ``wandb[:PROJECT]``, ``mlflow[:TRACKING_URI]``,
``tensorboard[:DIR]``, ``trackio[:PROJECT]``, ``prometheus[:[HOST:]PORT]``, ``pushgateway:URL``, ``ray-metrics``);
the in-process alert notifiers of ``Monitor(alerts=...)`` are :data:`NOTIFIER_SPECS` (``slack:ENV_VAR_OR_FILE``, the
webhook URL's source, never the URL, and ``wandb-alert``). A notifier given among the sinks is still taken (as an
alert sink), but the forms a sink is asked for list sinks only. docs/sinks.md's spec table is held to
:data:`SINK_SPECS` by tests/test_contracts.py.

Example:
    >>> parse_spec("prometheus:127.0.0.1:9464")
    ('prometheus', '127.0.0.1:9464')
    >>> parse_spec("mlflow:http://127.0.0.1:5000")
    ('mlflow', 'http://127.0.0.1:5000')
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from advmon.errors import AdvmonConfigError
from advmon.sinks.base import SinkLike

__all__ = [
    "ENV_VAR",
    "NOTIFIER_FORMS",
    "NOTIFIER_SPECS",
    "SINK_SPECS",
    "SPEC_FORMS",
    "alert_sink_from_specs",
    "parse_spec",
    "sink_from_spec",
    "sinks_from_env",
    "specs_from_env",
]

ENV_VAR = "ADVMON_SINKS"
#: Every sink spec: its kind (the part before ``:``) -> its form. The one list of sinks; the error messages, the
#: CLI's help and docs/sinks.md's table follow it.
SINK_SPECS: dict[str, str] = {
    "jsonl": "jsonl[:PATH]",
    "wandb": "wandb[:PROJECT]",
    "mlflow": "mlflow[:TRACKING_URI]",
    "tensorboard": "tensorboard[:DIR]",
    "trackio": "trackio[:PROJECT]",
    "prometheus": "prometheus[:[HOST:]PORT]",
    "pushgateway": "pushgateway:URL",
    "ray-metrics": "ray-metrics",
}
#: The in-process alert notifiers (``Monitor(alerts=...)``): kind -> form. Not sinks.
NOTIFIER_SPECS: dict[str, str] = {
    "slack": "slack:ENV_VAR_OR_FILE",
    "wandb-alert": "wandb-alert",
}
SPEC_FORMS = ", ".join(SINK_SPECS.values())
NOTIFIER_FORMS = ", ".join(NOTIFIER_SPECS.values())
_KINDS = (*SINK_SPECS, *NOTIFIER_SPECS)


def parse_spec(spec: str) -> tuple[str, str]:
    """``(kind, argument)`` of a spec; the argument is ``""`` when absent."""
    if not isinstance(spec, str) or not spec.strip():
        raise AdvmonConfigError(f"empty sink spec; valid forms: {SPEC_FORMS}")
    kind, _, argument = spec.strip().partition(":")
    if kind not in _KINDS:
        raise AdvmonConfigError(f"unknown sink {spec!r}; valid forms: {SPEC_FORMS} "
                                f"(alert notifiers, for alerts=: {NOTIFIER_FORMS})")
    if kind == "pushgateway" and not argument:
        raise AdvmonConfigError(f"pushgateway needs a URL (pushgateway:http://HOST:PORT); valid forms: {SPEC_FORMS}")
    if kind == "slack" and (not argument or argument.startswith(("http://", "https://"))):
        # A URL here would end up in configs, logs and reprs: take its source instead.
        raise AdvmonConfigError(
            "slack needs the name of an environment variable or a file that holds the webhook URL "
            "(slack:SLACK_WEBHOOK_URL or slack:/run/secrets/slack), not the URL itself"
        )
    return kind, argument


def _host_port(argument: str) -> tuple[str, int]:
    host, _, port = argument.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise AdvmonConfigError(f"prometheus port must be a number, got {port!r}; valid forms: {SPEC_FORMS}") from None
    if not 0 <= number <= 65535:
        raise AdvmonConfigError(f"prometheus port must be 0-65535, got {number}")
    return host or "127.0.0.1", number


def sink_from_spec(spec: str, run: str) -> SinkLike:
    """Build the sink a spec names (optional backends are imported only here)."""
    kind, argument = parse_spec(spec)
    if kind == "jsonl":
        from advmon.sinks.jsonl import JsonlSink

        return JsonlSink(argument or Path("advmon-runs") / f"{run}.jsonl")
    if kind == "wandb":
        from advmon.sinks.wandb import WandbSink

        return WandbSink(project=argument or None)
    if kind == "mlflow":
        from advmon.sinks.mlflow import MlflowSink

        return MlflowSink(tracking_uri=argument or None)
    if kind == "tensorboard":
        from advmon.sinks.tensorboard import TensorBoardSink

        return TensorBoardSink(argument or Path("advmon-runs") / "tensorboard")
    if kind == "trackio":
        from advmon.sinks.trackio import TrackioSink

        return TrackioSink(project=argument or None)
    if kind == "prometheus":
        from advmon.sinks.prometheus import PrometheusSink

        host, port = _host_port(argument) if argument else ("127.0.0.1", 9464)
        return PrometheusSink(host=host, port=port)
    if kind == "ray-metrics":
        from advmon.sinks.ray_metrics import RayMetricsSink

        return RayMetricsSink(run)
    if kind in ("slack", "wandb-alert"):
        return alert_sink_from_specs([spec])
    from advmon.sinks.prometheus import PushgatewaySink

    return PushgatewaySink(argument)


def alert_sink_from_specs(specs: list[str], thresholds: Any = None) -> SinkLike:
    """One in-process alert sink notifying every ``slack:...``/``wandb-alert`` spec given."""
    from advmon.alerts.sink import AlertSink

    return AlertSink(notifiers_from_specs(specs), thresholds)


def notifiers_from_specs(specs: list[str]) -> list[Any]:
    """The notifiers ``slack:ENV_VAR_OR_FILE`` and ``wandb-alert`` specs name."""
    from advmon.alerts.notifiers import SlackNotifier, WandbAlertNotifier

    notifiers: list[Any] = []
    for spec in specs:
        kind, argument = parse_spec(spec)
        if kind == "slack":
            notifiers.append(SlackNotifier.from_source(argument))
        elif kind == "wandb-alert":
            notifiers.append(WandbAlertNotifier())
        else:
            raise AdvmonConfigError(f"{spec!r} is a sink, not an alert notifier ({NOTIFIER_FORMS})")
    return notifiers


def specs_from_env(environ: dict[str, str] | None = None) -> list[str]:
    """The specs named in ``ADVMON_SINKS`` (comma-separated), checked: the sinks besides the monitor's own JSONL
    file. A bare ``jsonl`` names that file (which every monitor made from the environment writes, wherever
    ``ADVMON_DIR``, the rank or ``ADVMON_PER_PROCESS`` puts it), so it adds no second sink.

    Example:
        >>> specs_from_env({"ADVMON_SINKS": "jsonl, mlflow:sqlite:///m.db, jsonl:all.jsonl"})
        ['mlflow:sqlite:///m.db', 'jsonl:all.jsonl']
    """
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    specs = [part.strip() for part in value.split(",") if part.strip()]
    for spec in specs:
        parse_spec(spec)  # all errors before any sink starts a server
    return [spec for spec in specs if spec not in ("jsonl", "jsonl:")]


def sinks_from_env(run: str, environ: dict[str, str] | None = None) -> list[SinkLike]:
    """Sinks named in ``ADVMON_SINKS`` (comma-separated specs)."""
    return [sink_from_spec(spec, run) for spec in specs_from_env(environ)]

"""Alerting: generated Prometheus rules and Alertmanager routing, and the same rules in-process.

* :mod:`advmon.alerts.prometheus_rules`: the rule file and its promtool tests;
* :mod:`advmon.alerts.alertmanager`: routing to Slack;
* :mod:`advmon.alerts.evaluator`: the catalog over a stream of records;
* :mod:`advmon.alerts.notifiers` and :mod:`advmon.alerts.sink`: Slack and W&B
  notifications from inside the training process, for teams without Prometheus.

Example:
    >>> import tempfile, pathlib
    >>> paths = generate(pathlib.Path(tempfile.mkdtemp()))
    >>> sorted(p.name for p in paths)
    ['advmon-rules-test.yml', 'advmon-rules.yml', 'alertmanager.yml']
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from advmon.alerts.alertmanager import AlertmanagerSettings, alertmanager_config
from advmon.alerts.prometheus_rules import (
    GENERATED_HEADER,
    RULES_FILE,
    TESTS_FILE,
    AlertSettings,
    dump_yaml,
    prometheus_rules,
    promtool_tests,
)

if TYPE_CHECKING:
    from advmon.alerts.sink import AlertSink

__all__ = ["AlertSettings", "AlertSink", "AlertmanagerSettings", "generate", "generated_files"]

ALERTMANAGER_FILE = "alertmanager.yml"


def generated_files(settings: AlertSettings, routing: AlertmanagerSettings) -> dict[str, str]:
    """``{relative path: text}`` of every file ``advmon alerts generate`` writes."""
    return {
        RULES_FILE: dump_yaml(prometheus_rules(settings), GENERATED_HEADER),
        ALERTMANAGER_FILE: dump_yaml(alertmanager_config(routing), GENERATED_HEADER),
        TESTS_FILE: dump_yaml(promtool_tests(settings), GENERATED_HEADER),
    }


def generate(out: Path, settings: AlertSettings | None = None, routing: AlertmanagerSettings | None = None) -> list[Path]:
    """Write the rule file, the Alertmanager configuration and the promtool tests under ``out``."""
    settings = settings if settings is not None else AlertSettings()
    if routing is None:
        routing = AlertmanagerSettings(dashboard_url=settings.dashboard_url)
    written = []
    for relative, text in generated_files(settings, routing).items():
        path = Path(out) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def __getattr__(name: str) -> Any:
    """``AlertSink`` loads on first use: it is a sink (advmon.sinks imports torch), and the generator must not."""
    if name == "AlertSink":
        from advmon.alerts.sink import AlertSink

        return AlertSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"AlertSink"})

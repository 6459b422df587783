"""An Alertmanager configuration that routes advmon's alerts to Slack.

The Slack webhook URL is a secret: the configuration names a *file* holding it
(``api_url_file``), never the URL. Alerts are grouped by alert name and run,
resolved messages are sent, and a critical alert of a run silences that run's
warnings and infos (its inhibition rule). Each severity has its own receiver, so
a team can point critical alerts at a paging channel.

Example:
    >>> config = alertmanager_config(AlertmanagerSettings(webhook_file="/run/secrets/slack"))
    >>> config["route"]["group_by"], [r["receiver"] for r in config["route"]["routes"]]
    (['alertname', 'run'], ['advmon-critical', 'advmon-warning', 'advmon-info'])
    >>> "hooks.slack.com" in str(config)
    False
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advmon.rules import SEVERITIES, dashboard_link, format_duration

__all__ = ["AlertmanagerSettings", "alertmanager_config", "receiver_for"]

DEFAULT_WEBHOOK_FILE = "/etc/alertmanager/secrets/slack-webhook-url"
_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}
_COLOR = {"critical": "danger", "warning": "warning", "info": "#439FE0"}


@dataclass(frozen=True)
class AlertmanagerSettings:
    """Args:
    webhook_file: path of the file holding the Slack incoming-webhook URL.
    channel: Slack channel override (``#rl-oncall``); empty keeps the webhook's own.
    dashboard_url: the on-call dashboard; messages link it with the run selected and the
        time range centred on the alert's start (``rules.dashboard_link``).
    group_wait, group_interval, repeat_interval: Alertmanager's timing, in seconds.
    """

    webhook_file: str = DEFAULT_WEBHOOK_FILE
    channel: str = ""
    dashboard_url: str = ""
    group_wait: float = 10.0
    group_interval: float = 60.0
    repeat_interval: float = 4 * 3600.0


def receiver_for(severity: str) -> str:
    """The receiver alerts of a severity are routed to."""
    return f"advmon-{severity}"


def _text(dashboard_url: str) -> str:
    lines = [
        "{{ range .Alerts }}",
        "*{{ .Annotations.summary }}*",
        "{{ .Annotations.description }}",
        "Run: `{{ .Labels.run }}` | severity: {{ .Labels.severity }}"
        "{{ if .Annotations.runbook_url }} | runbook: {{ .Annotations.runbook_url }}{{ end }}",
        "{{ if .Annotations.check_first }}Check first: {{ .Annotations.check_first }}{{ end }}",
    ]
    if dashboard_url:
        # The alert's own start, in Unix milliseconds: the board opens on that moment.
        lines.append("Dashboard: " + dashboard_link(dashboard_url, "{{ .Labels.run }}", "{{ .StartsAt.Unix }}000"))
    lines.append("{{ end }}")
    return "\n".join(lines)


def _slack(severity: str, settings: AlertmanagerSettings) -> dict[str, Any]:
    slack: dict[str, Any] = {
        "api_url_file": settings.webhook_file,
        "send_resolved": True,
        "username": "advmon",
        "color": '{{ if eq .Status "firing" }}' + _COLOR[severity] + "{{ else }}good{{ end }}",
        "title": (
            "{{ if eq .Status \"firing\" }}" + _EMOJI[severity] + "{{ else }}:white_check_mark:{{ end }} "
            "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} on run {{ .CommonLabels.run }}"
        ),
        "text": _text(settings.dashboard_url),
        "fallback": "[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }} on run {{ .CommonLabels.run }}",
    }
    if settings.dashboard_url:
        slack["title_link"] = dashboard_link(settings.dashboard_url, "{{ .CommonLabels.run }}",
                                             "{{ (index .Alerts 0).StartsAt.Unix }}000")
    if settings.channel:
        slack["channel"] = settings.channel
    return slack


def alertmanager_config(settings: AlertmanagerSettings) -> dict[str, Any]:
    """The configuration as data (see :func:`advmon.alerts.prometheus_rules.dump_yaml`)."""
    return {
        "route": {
            "receiver": receiver_for("warning"),
            "group_by": ["alertname", "run"],
            "group_wait": format_duration(settings.group_wait),
            "group_interval": format_duration(settings.group_interval),
            "repeat_interval": format_duration(settings.repeat_interval),
            "routes": [
                {"receiver": receiver_for(severity), "matchers": [f'severity="{severity}"']} for severity in SEVERITIES
            ],
        },
        "inhibit_rules": [
            {
                "source_matchers": ['severity="critical"'],
                "target_matchers": ['severity=~"warning|info"'],
                "equal": ["run"],
            }
        ],
        "receivers": [
            {"name": receiver_for(severity), "slack_configs": [_slack(severity, settings)]} for severity in SEVERITIES
        ],
    }

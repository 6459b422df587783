"""Where in-process alerts go: a Slack incoming webhook, or ``wandb.alert``.

A notifier has one method, ``send(message)``. The Slack webhook URL is a secret:
it is read from a file or an environment variable when a message is sent, and
never printed, logged or shown in a ``repr``.

Example:
    >>> import os
    >>> os.environ["DOC_SLACK_WEBHOOK"] = "http://127.0.0.1:9/secret-path"
    >>> notifier = SlackNotifier.from_source("DOC_SLACK_WEBHOOK")
    >>> notifier
    SlackNotifier(webhook from $DOC_SLACK_WEBHOOK)
    >>> "secret" in repr(notifier)
    False
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from advmon.errors import AdvmonConfigError
from advmon.rules import dashboard_link

__all__ = ["AlertMessage", "Notifier", "SlackNotifier", "WandbAlertNotifier"]

_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}
_COLOR = {"critical": "danger", "warning": "warning", "info": "#439FE0"}


@dataclass(frozen=True)
class AlertMessage:
    """What a notifier sends: an alert firing or resolved, already worded."""

    status: str  # "firing" | "resolved"
    alert: str
    severity: str
    run: str
    step: int
    value: float
    summary: str
    description: str
    runbook_url: str  #: ``""`` where no runbooks page is hosted (``check_first`` travels instead)
    dashboard_url: str = ""
    where: str = ""  #: the groups and slices the firing step points at
    time: float = 0.0  #: Unix time of the record the alert fired on (the dashboard link centres on it)
    check_first: str = ""  #: the alert's runbook's "Check first", shipped with advmon

    @property
    def dashboard_link(self) -> str:
        """The board on this run around the firing record's time (``""`` without a dashboard URL)."""
        if not self.dashboard_url:
            return ""
        return dashboard_link(self.dashboard_url, self.run, str(int(self.time * 1000)))

    @property
    def title(self) -> str:
        return f"[{self.status.upper()}] {self.alert} on run {self.run}"

    @property
    def text(self) -> str:
        lines = [
            f"*{self.summary}*",
            self.description if self.status == "firing" else f"Resolved at step {self.step}. {self.description}",
            *([f"Where: {self.where}"] if self.where and self.status == "firing" else []),
            f"Run: `{self.run}` | severity: {self.severity}" + (f" | runbook: {self.runbook_url}" if self.runbook_url else ""),
            *([f"Check first: {self.check_first}"] if self.check_first and self.status == "firing" else []),
        ]
        if self.dashboard_url:
            lines.append(f"Dashboard: {self.dashboard_link}")
        return "\n".join(lines)


class Notifier(Protocol):
    name: str

    def send(self, message: AlertMessage) -> None: ...


class SlackNotifier:
    """Post alerts to a Slack incoming webhook, in the shape Alertmanager's Slack messages have.

    Args:
        source: an environment variable name, or a path to a file, that holds the
            webhook URL. Read at each send, so a rotated secret is picked up.
        timeout: seconds for the HTTP request.
    """

    name = "slack"

    def __init__(self, source: str, timeout: float = 5.0) -> None:
        self._source = source
        self.timeout = timeout
        self._describe = f"file {source}" if _looks_like_path(source) else f"${source}"

    @classmethod
    def from_source(cls, source: str, timeout: float = 5.0) -> SlackNotifier:
        """Check that ``source`` names a readable file or a set variable (without reading the secret into a message)."""
        if not source:
            raise AdvmonConfigError("slack needs an environment variable or a file holding the webhook URL (slack:VAR_OR_FILE)")
        notifier = cls(source, timeout)
        notifier._webhook()  # fail early, at configuration time
        return notifier

    def _webhook(self) -> str:
        path = Path(self._source)
        if _looks_like_path(self._source) or path.is_file():
            try:
                url = path.read_text().strip()
            except OSError as exc:
                raise AdvmonConfigError(f"cannot read the Slack webhook file {self._source}: {exc.strerror}") from None
        else:
            url = os.environ.get(self._source, "").strip()
            if not url:
                raise AdvmonConfigError(
                    f"the Slack webhook source {self._source!r} is neither a file nor a set environment variable"
                )
        if not url.startswith(("http://", "https://")):
            raise AdvmonConfigError(f"the Slack webhook in {self._describe} is not an http(s) URL")
        return url

    def payload(self, message: AlertMessage) -> dict[str, Any]:
        firing = message.status == "firing"
        emoji = _EMOJI.get(message.severity, "") if firing else ":white_check_mark:"
        attachment = {
            "color": _COLOR.get(message.severity, "warning") if firing else "good",
            "title": f"{emoji} {message.title}",
            "text": message.text,
            "fallback": message.title,
        }
        if message.dashboard_url:
            attachment["title_link"] = message.dashboard_link
        return {"username": "advmon", "attachments": [attachment]}

    def send(self, message: AlertMessage) -> None:
        request = urllib.request.Request(
            self._webhook(),
            data=json.dumps(self.payload(message)).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except OSError as exc:
            # urllib's errors can quote the URL: say what failed without it.
            reason = getattr(exc, "code", None) or getattr(exc, "reason", None) or type(exc).__name__
            raise ConnectionError(f"Slack webhook ({self._describe}) failed: {reason}") from None

    def __repr__(self) -> str:
        return f"SlackNotifier(webhook from {self._describe})"


def _looks_like_path(source: str) -> bool:
    return os.sep in source or source.startswith(".")


class WandbAlertNotifier:
    """Send alerts with ``wandb.alert`` into the active W&B run (or ``run=``).

    W&B rate-limits alerts itself (``wait_duration``, 60 s at least); advmon's own
    per-rule limit applies first.
    """

    name = "wandb-alert"

    def __init__(self, run: Any = None) -> None:
        from advmon.sinks.base import require

        self._wandb = require("wandb", "wandb")
        self._run = run

    def send(self, message: AlertMessage) -> None:
        run = self._run if self._run is not None else self._wandb.run
        if run is None:
            raise RuntimeError("wandb.alert needs an active W&B run (wandb.init) or WandbAlertNotifier(run=...)")
        levels = {"critical": "ERROR", "warning": "WARN", "info": "INFO"}
        level = getattr(self._wandb.AlertLevel, levels.get(message.severity, "WARN"))
        run.alert(title=message.title, text=message.text, level=level)

    def __repr__(self) -> str:
        return "WandbAlertNotifier()"

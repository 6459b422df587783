"""The runbooks, shipped with advmon: what each alert means and what to check first, wherever it is read.

The text is ``advmon/alerts/runbooks.md`` (``docs/runbooks.md`` is the same text),
one ``## <alert>`` section each, with ``**Means**``, ``**Check first**``,
``**Known causes**`` and ``**Do**`` paragraphs. The HTML report carries the
sections of the alerts that fired, and Slack messages and Prometheus annotations
carry "Check first", so no link has to resolve for the advice to arrive.

Example:
    >>> check_first("AdvmonNonFiniteRewards").split(" (")[0]
    '`rewards/nan_count` and `rewards/inf_count` over steps'
"""

from __future__ import annotations

import functools
import html
import re
from importlib import resources

__all__ = ["check_first", "runbook_html", "runbook_markdown", "runbooks_text"]


def runbooks_text() -> str:
    """The whole runbooks page (Markdown)."""
    return resources.files("advmon.alerts").joinpath("runbooks.md").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _sections() -> dict[str, str]:
    found: dict[str, str] = {}
    for block in re.split(r"^## ", runbooks_text(), flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        found[name.strip()] = body.strip()
    return found


def runbook_markdown(alert: str) -> str:
    """An alert's runbook section (Markdown, without its heading); ``""`` for an alert without one."""
    return _sections().get(alert, "")


def check_first(alert: str) -> str:
    """An alert's "Check first" paragraph, as plain text on one line (links become their text)."""
    match = re.search(r"\*\*Check first\*\*:\s*(.*?)(?:\n\n|\Z)", runbook_markdown(alert), re.S)
    if match is None:
        return ""
    text = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", match.group(1))
    return " ".join(text.replace("**", "").split())


def runbook_html(alert: str) -> str:
    """An alert's runbook section as HTML: paragraphs, lists, bold and code (links become their text)."""
    parts = []
    for block in runbook_markdown(alert).split("\n\n"):
        lines = block.strip().splitlines()
        if not lines:
            continue
        if lines[0].startswith("- ") and all(line.startswith(("- ", "  ")) for line in lines):
            items: list[str] = []
            for line in lines:  # an item starts at "- "; an indented line continues it
                if line.startswith("- "):
                    items.append(line[2:].strip())
                else:
                    items[-1] += " " + line.strip()
            parts.append("<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in items) + "</ul>")
        else:
            parts.append(f"<p>{_inline(' '.join(line.strip() for line in lines))}</p>")
    return "\n".join(parts)


def _inline(text: str) -> str:
    text = html.escape(re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", text), quote=False)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)

"""The runbooks advmon ships, as the report shows them: every section, every list item whole."""

from __future__ import annotations

import re

import pytest

from advmon.alerts.runbooks import check_first, runbook_html, runbook_markdown
from advmon.rules import CATALOG


@pytest.mark.parametrize("alert", [rule.name for rule in CATALOG])
def test_every_alert_has_a_runbook_with_advice_and_its_lists_render_whole(alert):
    markdown = runbook_markdown(alert)
    assert "**Means**" in markdown and check_first(alert), alert
    page = runbook_html(alert)
    items = re.findall(r"(?m)^- ", markdown)
    assert page.count("<li>") == len(items), alert  # a " - " inside an item's text starts no new item
    code_spans = re.findall(r"`([^`]+)`", markdown)
    assert page.count("<code>") == len(code_spans), alert  # no code span cut in two


def test_an_item_with_a_dash_inside_stays_one_item():
    page = runbook_html("AdvmonAdvantageBeyondBound")
    assert "<code>E[x^2] - E[x]^2</code>" in page

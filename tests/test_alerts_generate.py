"""Generated alert files: committed = fresh, promtool and amtool accept them, routing reaches each receiver."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from advmon.alerts import AlertmanagerSettings, AlertSettings, generate, generated_files
from advmon.alerts.alertmanager import receiver_for
from advmon.alerts.runbooks import check_first, runbooks_text
from advmon.cli import main
from advmon.rules import CATALOG, SEVERITIES, Thresholds, parse_duration
from tests.services import require_binary

ROOT = Path(__file__).resolve().parent.parent


def test_committed_alert_files_equal_a_fresh_generation():
    for relative, text in generated_files(AlertSettings(), AlertmanagerSettings()).items():
        committed = ROOT / "alerts" / relative
        assert committed.read_text() == text, f"{committed} is stale: run `advmon alerts generate`"


def test_rule_names_labels_and_annotations():
    group = yaml.safe_load((ROOT / "alerts" / "advmon-rules.yml").read_text())["groups"][0]
    alerts = [r for r in group["rules"] if "alert" in r]
    assert [a["alert"] for a in alerts] == [rule.name for rule in CATALOG]
    for alert in alerts:
        assert alert["alert"].startswith("Advmon") and alert["alert"][0].isupper() and "_" not in alert["alert"]
        assert alert["labels"]["severity"] in SEVERITIES
        # No runbooks page is hosted by default: no dead link, the runbook's "Check first" travels instead.
        assert set(alert["annotations"]) == {"summary", "description", "check_first"}
        assert "{{" not in alert["annotations"]["summary"]  # a static sentence
        assert "$labels.run" in alert["annotations"]["description"] and "$value" in alert["annotations"]["description"]
        assert alert["annotations"]["check_first"] == check_first(alert["alert"]) and len(check_first(alert["alert"])) > 20
    shipped = runbooks_text()
    for alert in alerts:
        assert f"## {alert['alert']}\n" in shipped, f"no runbook section for {alert['alert']}"


def test_the_docs_runbooks_page_is_the_one_advmon_ships():
    assert (ROOT / "docs" / "runbooks.md").read_text() == runbooks_text()
    assert "alerts/runbooks.md" in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["advmon"]


def test_a_hosted_runbooks_page_is_linked_from_every_rule(tmp_path):
    assert main(["alerts", "generate", "--out", str(tmp_path), "--runbook-base", "https://wiki.example.test/rb"]) == 0
    group = yaml.safe_load((tmp_path / "advmon-rules.yml").read_text())["groups"][0]
    for alert in (r for r in group["rules"] if "alert" in r):
        assert alert["annotations"]["runbook_url"] == f"https://wiki.example.test/rb#{alert['alert'].lower()}"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    binary = require_binary("promtool")
    return subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_promtool_checks_and_unit_tests_pass_on_the_committed_files():
    result = promtool("check", "rules", "--lint=all", "advmon-rules.yml", cwd=ROOT / "alerts")
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("test", "rules", "tests/advmon-rules-test.yml", cwd=ROOT / "alerts")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.integration
def test_promtool_tests_pass_for_a_teams_own_settings_and_fail_when_a_rule_is_broken(tmp_path):
    interval, trailing_records = 15, 20
    code = main([
        "alerts", "generate", "--out", str(tmp_path), "--interval", f"{interval}s", "--for", "45s",
        "--threshold", "zero_std_ratio=0.9", "--threshold", "bound_factor=1",
        "--threshold", f"trailing_records={trailing_records}", "--selector", 'job="grpo"',
        "--runbook-base", "https://wiki.example.test/advmon", "--dashboard-url", "https://grafana.example.test/d/x",
        "--slack-webhook-file", "/run/secrets/slack",
    ])
    assert code == 0
    rules = (tmp_path / "advmon-rules.yml").read_text()
    assert '{__name__=~"(?:ray_)?advmon_zero_std_group_ratio",job="grpo"} > 0.9' in rules and "for: 45s" in rules
    # A trailing median's range holds exactly trailing_records samples one interval apart: they span 19
    # intervals, and half an interval more keeps the 20th in and the 21st out, (20 - 1/2) x 15 s = 292.5 s,
    # written 4m52s500ms.
    windows = re.findall(r"quantile_over_time\(0\.5, [^\[]*\[([^\]]+)\]\)", rules)
    assert windows and {parse_duration(w) for w in windows} == {(trailing_records - 0.5) * interval}, windows
    assert promtool("check", "rules", "advmon-rules.yml", cwd=tmp_path).returncode == 0
    result = promtool("test", "rules", "tests/advmon-rules-test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # The tests can fail: loosen one rule behind the generator's back.
    (tmp_path / "advmon-rules.yml").write_text(rules.replace("> 0.9", "> 0.999"))
    result = promtool("test", "rules", "tests/advmon-rules-test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "AdvmonZeroStdGroupsHigh" in result.stdout + result.stderr


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([require_binary("amtool"), *args], capture_output=True, text=True, timeout=60)


@pytest.mark.integration
def test_alertmanager_config_is_valid_and_routes_each_severity(tmp_path):
    config = ROOT / "alerts" / "alertmanager.yml"
    result = amtool("check-config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr
    data = yaml.safe_load(config.read_text())
    for receiver in data["receivers"]:
        (slack,) = receiver["slack_configs"]
        assert slack["send_resolved"] is True and "api_url" not in slack and slack["api_url_file"]
    assert data["route"]["group_by"] == ["alertname", "run"]
    assert data["inhibit_rules"][0]["equal"] == ["run"]
    for severity in SEVERITIES:
        for other in SEVERITIES:
            result = amtool(
                "config", "routes", "test", f"--config.file={config}", f"--verify.receivers={receiver_for(other)}",
                f"severity={severity}", "alertname=AdvmonX", "run=r",
            )
            assert (result.returncode == 0) == (other == severity), (severity, other, result.stdout)


def test_thresholds_are_validated_with_clear_messages(capsys):
    assert main(["alerts", "generate", "--out", "/tmp/x", "--threshold", "nope=1"]) == 2
    assert "unknown threshold 'nope'" in capsys.readouterr().err
    assert main(["alerts", "generate", "--out", "/tmp/x", "--threshold", "zero_std_ratio=abc"]) == 2
    assert "must be a number" in capsys.readouterr().err
    assert main(["alerts", "generate", "--out", "/tmp/x", "--interval", "soon"]) == 2
    assert "expected a duration" in capsys.readouterr().err
    with pytest.raises(Exception, match="positive whole number"):
        Thresholds.with_overrides({"trailing_records": 2.5})


def test_generation_is_deterministic(tmp_path):
    first = [p.read_bytes() for p in generate(tmp_path / "a")]
    second = [p.read_bytes() for p in generate(tmp_path / "b")]
    assert first == second

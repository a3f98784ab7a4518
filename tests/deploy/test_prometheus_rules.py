"""The Prometheus configuration and alert rules: promtool's checks and rule unit tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.conftest import REPO, tool

PROMETHEUS = REPO / "deploy" / "prometheus"
UNIT_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = tool("promtool", "Debian package prometheus")
    return subprocess.run([binary, *args], capture_output=True, text=True, check=False)


def test_config_and_rules_pass_promtool_check() -> None:
    result = promtool("check", "config", str(PROMETHEUS / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    result = promtool("check", "rules", str(PROMETHEUS / "alerts.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_rule_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no promtool unit tests in deploy/prometheus/tests"
    result = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_unit_tests_fail_when_an_alert_breaks(tmp_path: Path) -> None:
    """The unit tests watch the rules: a raised-alarm alert that misses short alarms fails."""
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for rule in rules["groups"][0]["rules"]:
        if rule["alert"] == "TwinwatchAlarmRaised":
            rule["expr"] = "twinwatch_alarm_active == 1"  # the gauge alone loses short alarms
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    (tmp_path / "tests").mkdir()
    for test in UNIT_TESTS:
        (tmp_path / "tests" / test.name).write_text(test.read_text())
    result = promtool("test", "rules", *(str(tmp_path / "tests" / t.name) for t in UNIT_TESTS))
    assert result.returncode != 0
    assert "TwinwatchAlarmRaised" in result.stdout + result.stderr


def test_every_alert_names_its_severity_and_explains_itself() -> None:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())["groups"][0]["rules"]
    names = {rule["alert"] for rule in rules}
    assert names >= {
        "TwinwatchAlarmActive",
        "TwinwatchAlarmRaised",
        "TwinwatchDown",
        "TwinwatchWorkerDown",
        "TwinwatchStreamStopped",
    }
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]

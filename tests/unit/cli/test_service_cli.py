"""`twinwatch db upgrade | current | downgrade` against the configured database."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli, main
from app.storage import migrations


@pytest.fixture
def database_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    for name in list(os.environ):
        if name.startswith("TWINWATCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TWINWATCH_DATA_DIR", str(tmp_path / "data"))
    return f"sqlite:///{tmp_path}/data/twinwatch.db"


def test_upgrade_current_downgrade(database_env: str) -> None:
    runner = CliRunner()
    head = migrations.head()

    current = runner.invoke(cli, ["db", "current"])
    assert current.exit_code == 0, current.output
    assert current.output.strip() == f"base (no schema) (head is {head})"

    upgraded = runner.invoke(cli, ["db", "upgrade"])
    assert upgraded.exit_code == 0, upgraded.output
    assert upgraded.output.strip() == f"database at {head}"
    assert migrations.current(database_env) == (head,)
    assert runner.invoke(cli, ["db", "current"]).output.strip() == f"{head} (up to date)"

    downgraded = runner.invoke(cli, ["db", "downgrade", "base"])
    assert downgraded.exit_code == 0, downgraded.output
    assert migrations.current(database_env) == ()


def run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """`twinwatch ARGS` in-process, as the console script runs it; its exit code."""
    monkeypatch.setattr(sys, "argv", ["twinwatch", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return int(exit_info.value.code or 0)


def test_bad_revision_is_a_one_line_error(
    database_env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_main(monkeypatch, "db", "upgrade", "nope") == 2
    err = capsys.readouterr().err
    assert "cannot upgrade to 'nope'" in err
    assert "Traceback" not in err


def test_bad_settings_are_a_one_line_error(
    database_env: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TWINWATCH_MAX_BATCH", "lots")
    assert run_main(monkeypatch, "db", "current") == 2
    err = capsys.readouterr().err
    assert "TWINWATCH_MAX_BATCH" in err
    assert "Traceback" not in err

"""`twinwatch serve` owns the process: its logging and its garbage collector, not the app's."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

import app.main
from app.cli import cli, service
from app.cli.service import GC_THRESHOLDS, tune_gc_for_serving
from app.settings import Settings


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_tune_gc_for_serving_freezes_what_is_loaded() -> None:
    tune_gc_for_serving()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_freeze_count() > 0


def test_serve_configures_logging_and_the_collector_then_runs_uvicorn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith("TWINWATCH_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TWINWATCH_LOG_FORMAT", "json")
    calls: dict[str, Any] = {}

    def create_app(settings: Settings, **kwargs: Any) -> str:
        calls["app"] = (settings, kwargs)
        return "the app"

    def run(served: str, **kwargs: Any) -> None:
        calls["run"] = (served, kwargs)

    monkeypatch.setattr(
        service, "configure_logging", lambda settings: calls.update(logging=settings)
    )
    monkeypatch.setattr(app.main, "create_app", create_app)
    monkeypatch.setattr("uvicorn.run", run)

    result = CliRunner().invoke(cli, ["serve", "--port", "8123"])

    assert result.exit_code == 0, result.output
    logged: Settings = calls["logging"]
    assert (logged.log_format, logged.port) == ("json", 8123)
    settings, kwargs = calls["app"]
    assert settings is logged and kwargs == {"after_startup": tune_gc_for_serving}
    served, options = calls["run"]
    assert served == "the app"
    assert options["log_config"] is None and options["workers"] == 1

"""Settings come from TWINWATCH_* variables, with defaults that need nothing else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.errors import AppError
from app.settings import Settings, load_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("TWINWATCH_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    settings = Settings()
    assert settings.database_url == "sqlite:///data/twinwatch.db"
    assert settings.models_dir is None and settings.shipped_models is True
    assert settings.default_model == "auto"
    assert settings.api_token is None
    assert settings.max_batch == 10_000
    assert settings.max_body_bytes == 8 * 1024 * 1024
    assert settings.migrate_on_start is True
    assert settings.log_format == "text"


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TWINWATCH_DATA_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("TWINWATCH_MAX_BATCH", "500")
    monkeypatch.setenv("TWINWATCH_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("TWINWATCH_API_TOKEN", "x" * 20)
    monkeypatch.setenv("TWINWATCH_MIGRATE_ON_START", "false")
    monkeypatch.setenv("TWINWATCH_LOG_FORMAT", "JSON")
    settings = Settings()
    assert settings.database_url == f"sqlite:///{tmp_path}/d/twinwatch.db"
    assert settings.max_batch == 500
    assert settings.log_level == "debug"
    assert settings.api_token is not None and settings.api_token.get_secret_value() == "x" * 20
    assert "x" * 20 not in repr(settings)  # the secret never shows in logs
    assert settings.migrate_on_start is False
    assert settings.log_format == "json"

    monkeypatch.setenv("TWINWATCH_DATABASE_URL", "postgresql+psycopg://u@h/db")
    assert Settings().database_url == "postgresql+psycopg://u@h/db"


def test_an_empty_token_means_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINWATCH_API_TOKEN", "")
    assert Settings().api_token is None


def test_weak_or_bad_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="at least 16 characters"):
        Settings(api_token="short")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Settings(max_batch=0)
    monkeypatch.setenv("TWINWATCH_PORT", "http")
    with pytest.raises(AppError, match="TWINWATCH_PORT"):
        load_settings()
    monkeypatch.delenv("TWINWATCH_PORT")
    monkeypatch.setenv("TWINWATCH_LOG_FORMAT", "logfmt")
    with pytest.raises(AppError, match="TWINWATCH_LOG_FORMAT"):
        load_settings()


def test_prepare_directories_creates_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "a" / "b")
    settings.prepare_directories()
    assert (tmp_path / "a" / "b").is_dir()


def test_an_mqtt_url_that_names_no_broker_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TWINWATCH_MQTT_URL", "http://broker:1883")
    with pytest.raises(AppError, match=r"TWINWATCH_MQTT_URL: .*give mqtt://host:1883"):
        load_settings()
    monkeypatch.setenv("TWINWATCH_MQTT_URL", "mqtt://broker:1883")
    assert load_settings().mqtt_url == "mqtt://broker:1883"

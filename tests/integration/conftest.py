"""Real databases for the integration tests: SQLite always, PostgreSQL when configured.

`TWINWATCH_TEST_DATABASE_URL` (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test) adds a
PostgreSQL run of every database test. Each run gets its own schema, created and migrated once
per session and dropped at the end, so parallel CI jobs and reruns never see each other; every
test starts from empty tables.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app.errors import ArtifactError
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive
from app.main import create_app
from app.registry import ArtifactLoader
from app.settings import Settings
from app.storage import migrations
from app.storage.db import Database
from app.storage.models import Alarm, Base, Stream
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import model_entries
from app.storage.repositories import streams as stream_repo

TEST_DATABASE_ENV = "TWINWATCH_TEST_DATABASE_URL"
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def postgres_url() -> str | None:
    return os.environ.get(TEST_DATABASE_ENV) or None


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    """A new PostgreSQL schema, and a URL whose connections use it; dropped afterwards."""
    name = f"tw_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE SCHEMA "{name}"'))
        url = make_url(base_url).update_query_dict({"options": f"-csearch_path={name}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
        admin.dispose()


@contextmanager
def empty_database(backend: str, directory: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{(directory / f'{uuid.uuid4().hex[:8]}.db').as_posix()}"
        return
    base = postgres_url()
    if base is None:
        pytest.skip(f"{TEST_DATABASE_ENV} is not set")
    with fresh_schema(base) as url:
        yield url


# PostgreSQL joins the parametrisation only when configured, so a laptop run is not a wall of
# skips; tests/integration/test_backends.py reports the missing backend once.
BACKENDS = ["sqlite"] + (
    [pytest.param("postgresql", marks=pytest.mark.postgres)] if postgres_url() else []
)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def database_url(backend: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A migrated database shared by the session's tests of one backend."""
    with empty_database(backend, tmp_path_factory.mktemp("db")) as url:
        migrations.upgrade(url)
        yield url


@pytest.fixture
def empty_database_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A database with no schema at all, for migration tests."""
    with empty_database(backend, tmp_path) as url:
        yield url


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database(database_url)
    try:
        yield db
    finally:
        with db.engine.begin() as connection:
            for table in reversed(Base.metadata.sorted_tables):
                connection.execute(table.delete())
        db.dispose()


@pytest.fixture
def session(database: Database) -> Iterator[Session]:
    """A session for repository tests; committed at the end like a request's."""
    with database.session() as session:
        yield session


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A developer's TWINWATCH_* variables must not change what the tests see."""
    for name in list(os.environ):
        if name.startswith("TWINWATCH_") and name != TEST_DATABASE_ENV:
            monkeypatch.delenv(name)


# --- fake model artifacts ----------------------------------------------------------------------


@dataclass(frozen=True)
class FakeArtifact:
    """What `app.forecasting.artifacts.load_model` returns, for a persistence forecaster."""

    forecaster: Forecaster
    manifest: dict[str, Any]
    directory: Path = field(default=Path("."))


def fake_loader(directory: Path) -> FakeArtifact:
    """Reads `fake.json` ({"window", "n_channels", "thresholds", ...} or {"error": ...})."""
    spec_file = directory / "fake.json"
    if not spec_file.is_file():
        raise ArtifactError(f"{directory}: no fake.json")
    spec = json.loads(spec_file.read_text())
    if "error" in spec:
        raise ArtifactError(f"{directory}: {spec['error']}")
    forecaster = Naive(window=spec.get("window", 8), n_channels=spec.get("n_channels", 1))
    manifest = {
        "config": forecaster.config(),
        "channels": spec.get("channels", ["value"]),
        "thresholds": spec.get("thresholds", {}),
        "metrics": spec.get("metrics", {}),
    }
    if "version" in spec:
        manifest["version"] = spec["version"]
    return FakeArtifact(forecaster=forecaster, manifest=manifest, directory=directory)


def write_fake_model(models_dir: Path, name: str, **spec: Any) -> Path:
    directory = models_dir / name
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "fake.json").write_text(json.dumps(spec))
    return directory


# A `MonitorConfig` as `twinwatch calibrate` stores it in a manifest.
LAB_LIKE_THRESHOLDS = {
    "detectors": [
        {"kind": "point", "threshold": 0.525},
        {"kind": "rolling_rms", "threshold": 0.195, "window": 50},
    ]
}


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """The default model, a two-channel model and an artifact that fails to load."""
    directory = tmp_path / "models"
    write_fake_model(
        directory,
        "lstm-seed0",
        thresholds=LAB_LIKE_THRESHOLDS,
        metrics={"rmse": 0.133},
    )
    write_fake_model(
        directory,
        "naive-2ch",
        n_channels=2,
        channels=["value", "load"],
        version="v2",
        thresholds={"detectors": [{"kind": "point", "threshold": 1.0}]},
    )
    write_fake_model(directory, "broken", error="weights truncated")
    return directory


# --- the app -----------------------------------------------------------------------------------

AppFactory = Callable[..., TestClient]


@pytest.fixture
def make_client(database: Database, models_dir: Path, tmp_path: Path) -> Iterator[AppFactory]:
    """Build (and start) an app on the test database; other keyword arguments than
    `create_app`'s override settings."""
    clients: list[TestClient] = []

    def make(
        *,
        artifact_loader: ArtifactLoader = fake_loader,
        after_startup: Callable[[], None] | None = None,
        restored: bool = True,
        **overrides: Any,
    ) -> TestClient:
        values: dict[str, Any] = {
            "database_url": database.url,
            "models_dir": models_dir,
            "default_model": "lstm-seed0",
            "data_dir": tmp_path / "data",
            "migrate_on_start": False,
            "shipped_models": False,  # the fake artifacts only
            "stale_periods": 0,  # no stale timer unless a test asks (tests pause at will)
            **overrides,
        }
        app = create_app(
            Settings(**values), artifact_loader=artifact_loader, after_startup=after_startup
        )
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        if restored:  # (the restore runs behind the open port: a test starts after it)
            restoring = client.app_state["twinwatch"].restoring
            deadline = time.monotonic() + 120
            while not restoring.finished:
                assert time.monotonic() < deadline, "the streams were not restored in 2 min"
                time.sleep(0.005)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    return make_client()


# --- factories for rows the engine would write ------------------------------------------------


def make_stream(
    session: Session,
    stream_id: str = "pump-1",
    *,
    model: str = "lstm-seed0",
    detector_overrides: dict[str, Any] | None = None,
) -> Stream:
    if model_entries.get(session, model) is None:
        model_entries.upsert(
            session,
            name=model,
            version="test",
            kind="naive",
            manifest_sha256="0" * 64,
            config={"kind": "naive", "window": 8, "horizon": 1, "n_channels": 1},
            metrics={},
            thresholds={},
            loaded_at=T0,
        )
    return stream_repo.create(
        session,
        stream_repo.NewStream(
            stream_id=stream_id,
            model_name=model,
            channels=["value"],
            sample_period_s=0.1,
            has_reference=False,
            detector_overrides=detector_overrides or {},
        ),
        now=T0,
    )


def make_alarm(
    session: Session,
    stream_id: str = "pump-1",
    *,
    detector: str = "point",
    sample: int = 100,
    closed_after: int | None = 5,
    peak: float = 1.0,
) -> Alarm:
    """An alarm opened at `sample` (0.1 s per sample after T0), closed `closed_after` later."""
    alarm = alarm_repo.create(
        session,
        stream_id=stream_id,
        detector=detector,
        opened_at=T0 + timedelta(seconds=sample / 10),
        opened_sample=sample,
        peak=peak,
        threshold=0.5,
        model_name="lstm-seed0",
        model_version="test",
    )
    if closed_after is not None:
        end = sample + closed_after
        alarm_repo.close(
            session, alarm, closed_at=T0 + timedelta(seconds=end / 10), closed_sample=end
        )
    return alarm

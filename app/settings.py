"""The service's configuration: one pydantic-settings class read from `TWINWATCH_*` variables.

Nothing reads the environment at import time: `Settings()` is built by whoever starts the
service (`twinwatch serve`, `twinwatch db ...`, a test), so several apps with different settings
can live in one process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.errors import AppError

MIN_TOKEN_LENGTH = 16


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TWINWATCH_", extra="ignore", frozen=True)

    data_dir: Path = Field(Path("data"), description="Where the default SQLite database lives.")
    database_url: str = Field(
        "",
        description="SQLAlchemy URL; empty means a SQLite file `twinwatch.db` under data_dir.",
    )
    models_dir: Path | None = Field(
        None,
        description="Your model artifacts, one sub-directory each, served beside the shipped "
        "ones; a name in both is yours. Unset: the shipped models only.",
    )
    artifacts_dir: Path | None = Field(
        None,
        description="Where every model version's artifact is kept, by content hash (the "
        "models directories' are copied in at start-up). Unset: `artifacts` under data_dir.",
    )
    shipped_models: bool = Field(
        True, description="Serve the models shipped with twinwatch (app/shipped_models/)."
    )
    default_model: str = Field(
        "auto",
        description='Model of streams that name none: "auto" (each learns its own from its '
        "first readings) or a loaded model's name (app/shipped_models/README.md).",
    )
    learning_lstm: bool = Field(
        False,
        description="Learning streams of one channel with at least 10,000 learning readings "
        "also train a stateful LSTM (needs torch: the train extra) and use it when it "
        "forecasts clearly better. Off by default: see the README on what it costs.",
    )
    relearning: bool = Field(
        True,
        description="Learned streams learn again on their stored history (after a day and a "
        "week of readings, then weekly, unless a stream says otherwise), and a candidate takes "
        "over only once it has proved better on the readings that follow.",
    )
    relearning_lstm: bool = Field(
        True,
        description="A relearning of a stream of one channel with at least 10,000 readings "
        "of history also trains the stateful LSTM (in the job's own process, when torch is "
        "installed) and keeps it if it forecasts clearly better.",
    )
    retired_versions_kept: int = Field(
        10,
        ge=0,
        description="Versions of a stream's learned models kept once they no longer run "
        "(threshold revisions, relearnings), the newest first; older ones and their artifacts "
        "are removed (a rollback's target is always kept).",
    )
    api_token: SecretStr | None = Field(
        None, description="When set, write endpoints require `Authorization: Bearer <token>`."
    )
    read_token: SecretStr | None = Field(
        None,
        description="When set, reads (the API's GETs, /metrics, /docs) need `Authorization: "
        "Bearer <token>` with this token or the API token; /healthz and /readyz stay open.",
    )
    protect_reads: bool = Field(
        False,
        description="Reads need the API token (one token for everything); needs api_token.",
    )
    bus_url: str | None = Field(
        None,
        description="nats://host:4222 of a NATS server with JetStream: readings go to "
        "partitions there and `twinwatch worker` processes consume them (docs/scaling.md). "
        "Empty: one process does everything.",
    )
    bus_partitions: int = Field(
        64,
        ge=1,
        le=1024,
        description="Partitions the readings are spread over on the bus; fixed when the bus is "
        "first set up (a different number is refused then).",
    )
    bus_lease_s: float = Field(
        5.0,
        ge=2,
        le=300,
        description="How long a worker holds its partitions without a heartbeat; another takes "
        "them over after it.",
    )
    bus_replicas: int = Field(
        1,
        ge=1,
        le=5,
        description="Copies JetStream keeps of the readings and leases when the bus is first "
        "set up: 3 on a NATS cluster of three servers survives the loss of one.",
    )
    bus_wait_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="How long a POST of readings waits for the committing worker's answer on "
        "the bus before it answers 503 (the batch stays stored: safe to re-send).",
    )
    mqtt_url: str | None = Field(
        None,
        description="mqtt://[user:password@]host:1883 of an MQTT broker: the service subscribes "
        "to TWINWATCH_MQTT_TOPICS and takes the readings published there (README: MQTT). "
        "Empty: no MQTT.",
    )
    mqtt_topics: list[Annotated[str, StringConstraints(min_length=1, max_length=1024)]] = Field(
        ["twinwatch/#", "spBv1.0/#"],
        min_length=1,
        description="Topic filters subscribed to (QoS 1), as a JSON list: plain JSON readings "
        "under any topic, Sparkplug B under spBv1.0/.",
    )
    mqtt_client_id: str = Field(
        "twinwatch",
        min_length=1,
        max_length=64,
        description="The service's MQTT client id: the broker keeps its session (its "
        "subscription, and what arrives while the service is away) under it. Two services on "
        "one broker need two ids.",
    )
    mqtt_create_streams: bool = Field(
        True,
        description="A Sparkplug B birth (NBIRTH, DBIRTH) of a device no stream names yet creates "
        "its stream, one that learns its own model (model auto), its numeric metrics as channels. "
        "false: streams are configured over the API only, and a birth of an unknown one is "
        "refused as any message for an unknown stream.",
    )
    max_batch: int = Field(
        10_000,
        ge=1,
        le=50_000,
        description="Most readings accepted in one request (a stream named without readings "
        "counts as one). At most 50,000: a request must stay within one database statement's "
        "parameters.",
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Largest request body.")
    max_future_s: float = Field(
        86_400.0,
        gt=0,
        description="Readings stamped further ahead of the server clock are refused: one "
        "accepted by mistake would make every later, correct reading 'older' (409).",
    )
    stale_periods: float = Field(
        10.0,
        ge=0,
        description="A stream from which no reading has arrived for this many sample periods, "
        "and for at least TWINWATCH_STALE_MIN_S seconds, gets a stale alarm (raised by a "
        "timer); 0 switches the timer off.",
    )
    stale_min_s: float = Field(
        30.0,
        ge=0,
        description="The shortest silence that makes a stream stale, whatever its period: a "
        "gateway that uploads a fast stream every few seconds (or a person typing the next "
        "request) is not a silent sensor.",
    )
    readings_retention_days: float | None = Field(
        None,
        gt=0,
        description="Readings older than this many days (by the stream's own clock: its last "
        "reading's time) are removed at the stream's checkpoints; never those a restart "
        "replays, nor a learning stream's. Unset: readings are kept for ever.",
    )
    checkpoint_every: int = Field(
        1000,
        ge=1,
        description="Readings between two checkpoints of a stream's state. A restart replays "
        "at most this many readings per stream; fewer costs more writes while ingesting.",
    )
    metrics_per_stream: Literal["none", "alarms", "all"] = Field(
        "alarms",
        description="Per-stream series on /metrics besides the aggregates: none; alarms (open "
        "alarms, alarm and incident counts once non-zero, stale streams); all (also residuals, "
        "detector statistics and thresholds, readings: for a few thousand streams at most).",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="critical, error, warning, info or debug."
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="`json`: one JSON object a line (time, level, logger, message, request_id) "
        "for a log collector; uvicorn's lines too.",
    )
    host: str = Field(
        "127.0.0.1", description="The interface to listen on (0.0.0.0: every interface)."
    )
    port: int = Field(8000, ge=0, le=65535, description="The port to listen on.")
    migrate_on_start: bool = Field(
        True, description="Apply Alembic migrations when the app starts (first run needs nothing)."
    )

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower_case(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("api_token", "read_token", "bus_url", "mqtt_url", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("mqtt_url")
    @classmethod
    def _mqtt_broker(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("mqtt", "tcp") or not parts.hostname:
                raise ValueError(f"{value!r} is not an MQTT broker: give mqtt://host:1883")
        return value

    @field_validator("api_token", "read_token")
    @classmethod
    def _refuse_weak_token(cls, value: SecretStr | None) -> SecretStr | None:
        # A short shared secret is guessable over the network; refuse it rather than warn.
        if value is not None and len(value.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"a token must have at least {MIN_TOKEN_LENGTH} characters")
        return value

    @model_validator(mode="after")
    def _protected_reads_need_a_token(self) -> Settings:
        if self.protect_reads and self.api_token is None:
            raise ValueError("protect_reads needs api_token (the token reads will need)")
        return self

    def read_tokens(self) -> list[str] | None:
        """The tokens a read may present; None: reads are open."""
        if self.read_token is None and not self.protect_reads:
            return None
        tokens = [t.get_secret_value() for t in (self.read_token, self.api_token) if t]
        return tokens

    def write_tokens(self) -> list[str] | None:
        """The tokens a write may present; None: writes are open."""
        return None if self.api_token is None else [self.api_token.get_secret_value()]

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url:
            url = f"sqlite:///{(self.data_dir / 'twinwatch.db').as_posix()}"
            object.__setattr__(self, "database_url", url)
        return self

    @property
    def artifacts_root(self) -> Path:
        return self.artifacts_dir if self.artifacts_dir is not None else self.data_dir / "artifacts"

    def prepare_directories(self) -> None:
        """Create the data directory (holding the default SQLite file) if it is missing."""
        self.data_dir.mkdir(parents=True, exist_ok=True)


def load_settings() -> Settings:
    """`Settings()` from the environment, with a one-line error naming the bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = "; ".join(
            f"TWINWATCH_{'_'.join(str(part) for part in error['loc']).upper()}: {error['msg']}"
            for error in exc.errors()
        )
        raise AppError(f"invalid settings: {problems}") from None


def settings_help() -> str:
    """Every setting as `twinwatch serve --help` lists it: its variable, default and meaning."""
    lines = ["Settings, from the environment (default in brackets):", ""]
    for name, field in Settings.model_fields.items():
        default = field.default
        shown = (
            "unset"
            if default in (None, "")
            else str(default).lower()
            if default
            in (
                True,
                False,
            )
            else str(default)
        )
        lines.append(f"- **TWINWATCH_{name.upper()}** [{shown}]: {field.description or ''}")
    return "\n".join(lines)

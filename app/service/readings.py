"""A request's readings through the service, whatever carried them (HTTP, the bus): checked
for size, made the arrays ingest takes, run through ingest (app/streams/ingest.py), and the
answer made plain data. No transport here: the adapters map their wire format to
`ReadingIn`s and this module's errors (app/errors.py) to their own answers."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.errors import AppError, NotFoundError, PayloadTooLargeError
from app.metrics import Metrics
from app.schemas import AlarmOut, ReadingIn
from app.settings import Settings
from app.storage.db import Database
from app.storage.repositories import readings as reading_repo
from app.streams.ingest import VALUE, IngestOutcome, NewReadings, ingest
from app.streams.live import LiveStreams


def json_number(value: float) -> float | None:
    """A number as the answers give it: NaN (none) is null, as JSON has no NaN."""
    return None if math.isnan(value) else float(value)


def new_readings(items: list[tuple[str, list[ReadingIn]]]) -> NewReadings:
    """A request's readings as the arrays ingest takes."""
    flat = [reading for _, readings in items for reading in readings]
    named: dict[str, None] = {}
    for reading in flat:
        if reading.values is not None:
            named.update(dict.fromkeys(reading.values))
    columns: tuple[str | None, ...] = (VALUE, *named)
    if named:
        values = np.full((len(flat), len(columns)), np.nan)
        for row, reading in enumerate(flat):
            if reading.values is None:
                values[row, 0] = math.nan if reading.value is None else reading.value
                continue
            for column, name in enumerate(columns[1:], start=1):
                number = reading.values.get(name)  # type: ignore[arg-type]
                if number is not None:
                    values[row, column] = number
    else:  # numpy makes None NaN
        values = np.array([reading.value for reading in flat], dtype=np.float64).reshape(-1, 1)
    references = [reading.reference for reading in flat]
    return NewReadings(
        streams=[stream_id for stream_id, _ in items],
        counts=np.array([len(readings) for _, readings in items], dtype=np.int64),
        times=reading_repo.micros([reading.t for reading in flat]),
        values=values,
        columns=columns,
        references=None
        if references.count(None) == len(references)
        else np.array(references, dtype=np.float64),
    )


def answer_of(outcome: IngestOutcome, with_results: bool, **extra: Any) -> dict[str, Any]:
    """The answer as plain data, in the response model's field order (`ReadingsOut`, then
    `extra`), serialised once by pydantic-core: byte for byte what the model gives (the API
    tests check it), without the cost of building a model per reading."""
    results: list[dict[str, Any]] = []
    result = outcome.result
    if result is not None and with_results:
        names = list(result.statistics)
        columns = [result.statistics[name].tolist() for name in names]
        times = [reading_repo.datetime_at(t) for t in outcome.times.tolist()]
        forecast = result.forecast.tolist()
        residual = result.residual.tolist()
        imputed = result.imputed.tolist()
        for index, t in enumerate(times):
            results.append(
                {
                    "t": t,
                    "forecast": json_number(forecast[index]),
                    "residual": json_number(residual[index]),
                    "imputed": imputed[index],
                    "statistics": {
                        name: json_number(column[index])
                        for name, column in zip(names, columns, strict=True)
                    },
                }
            )
    return {
        "accepted": outcome.accepted,
        "duplicates": outcome.duplicates,
        "results": results,
        "opened": [AlarmOut.of(alarm).model_dump() for alarm in outcome.opened],
        "closed": [AlarmOut.of(alarm).model_dump() for alarm in outcome.closed],
        **extra,
    }


def ingest_request(
    settings: Settings,
    streams: LiveStreams,
    metrics: Metrics,
    session: Session,
    items: list[tuple[str, list[ReadingIn]]],
    *,
    count_refused: bool = True,
) -> list[IngestOutcome]:
    """Run a request's readings through ingest (an API process's, or a bus worker's for the
    batches it consumes); count refused readings per stream (unless `count_refused` is False:
    a worker's attempt of many batches, which it tries again one by one if one is refused)."""
    try:
        check_size(settings, items)
        return ingest(
            session, streams, metrics, new_readings(items), max_future_s=settings.max_future_s
        )
    except NotFoundError:
        raise
    except AppError as exc:
        reason = exc.extra.get("reason")
        if isinstance(reason, str) and count_refused:
            blamed = exc.extra.get("stream")
            for stream_id, readings in items:
                if blamed is None or stream_id == blamed:
                    metrics.reject(stream_id, reason, len(readings))
        raise


def commit_readings(
    settings: Settings,
    database: Database,
    streams: LiveStreams,
    metrics: Metrics,
    items: list[tuple[str, list[ReadingIn]]],
    count_refused: bool = True,
) -> list[IngestOutcome]:
    """A request's readings ingested and committed in a transaction of their own (a
    transport with no request session: MQTT)."""
    with database.session() as session:
        return ingest_request(
            settings, streams, metrics, session, items, count_refused=count_refused
        )


def request_size(items: list[tuple[str, list[ReadingIn]]]) -> int:
    """Readings as `TWINWATCH_MAX_BATCH` counts them: a stream with no reading costs a lookup
    all the same, so it counts as one."""
    return sum(max(1, len(readings)) for _, readings in items)


def check_size(settings: Settings, items: list[tuple[str, list[ReadingIn]]]) -> None:
    count = request_size(items)
    if count > settings.max_batch:
        raise PayloadTooLargeError(
            f"{count} readings in one request (a stream without readings counts as one); "
            f"at most {settings.max_batch}",
            reason="too_large",
        )

"""Readings in, forecasts out: `POST /v1/streams/{id}/readings`, `GET /v1/streams/{id}/forecast`.

Handlers are plain `def`: FastAPI runs them in its thread pool, so the forecaster's work never
blocks the event loop. The request's session is the transaction: a 2xx answer means committed.
"""

from __future__ import annotations

import json
import time
from functools import partial
from typing import Any

import anyio.from_thread
import numpy as np
from fastapi import APIRouter, Query, Response
from pydantic_core import to_json
from sqlalchemy.orm import Session

from app.api.bodies import ManyReadingsBody, ReadingsBody, json_body_openapi
from app.api.deps import AppState, ReadAccess, SessionDep, SingleQueryValues, StateDep, WriteAccess
from app.api.queries import TakenSinceQuery, TakenUntilQuery
from app.api.streams import StreamIdPath
from app.bus.publisher import BusAwayError, NotAnsweredError, batches_of, store_all, submit_all
from app.errors import (
    ConflictError,
    DataError,
    ForwardedError,
    UnavailableError,
)
from app.schemas import (
    ForecastOut,
    ManyReadingsIn,
    ManyReadingsOut,
    ReadingIn,
    ReadingsHistory,
    ReadingsIn,
    ReadingsOut,
    Spread,
    problem_responses,
)
from app.service.readings import answer_of, check_size, ingest_request, json_number
from app.storage.repositories import readings as reading_repo
from app.storage.repositories import streams as stream_repo
from app.streams.history import bucketed
from app.streams.ingest import IngestOutcome
from app.streams.recomputed import MOST_RECOMPUTED, history

router = APIRouter(prefix="/v1", tags=["readings"], dependencies=[ReadAccess, SingleQueryValues])


WaitQuery = Query(
    True,
    description="On the bus (TWINWATCH_BUS_URL): wait for the committing worker's answer "
    "(the default); false answers 202 as soon as the bus has stored the batch. Without the "
    "bus the answer always waits for the commit.",
)

ResultsQuery = Query(
    True,
    description="Answer with one result per reading (forecast, residual, statistics). A "
    "gateway that only needs the acknowledgement and the alarms sends false.",
)


def on_the_bus(
    state: AppState,
    items: list[tuple[str, list[ReadingIn]]],
    with_results: bool,
    wait: bool,
    started: float,
    *,
    many: bool = False,
) -> Response:
    """A request's readings published to the bus, a message for each partition they fall in,
    and (`wait`) the answers of the workers that commit them, as the embedded service would
    have answered."""
    assert state.bus is not None
    check_size(state.settings, items)
    batches = batches_of(items)
    try:
        if not wait:
            anyio.from_thread.run(store_all, state.bus, batches)
            return Response(to_json({"stored": len(batches)}), 202, media_type="application/json")
        answers = anyio.from_thread.run(
            partial(
                submit_all,
                state.bus,
                batches,
                with_results=with_results,
                wait_s=state.settings.bus_wait_s,
            )
        )
    except BusAwayError as exc:
        raise UnavailableError(
            f"the bus (NATS) did not confirm it stored the readings ({exc}): send them again "
            "(a copy it did store is committed once)"
        ) from None
    except NotAnsweredError:
        raise UnavailableError(
            f"no worker committed the readings within {state.settings.bus_wait_s:g} s; they "
            "are stored on the bus and will be committed once: sending them again is safe"
        ) from None
    failed = next((answer for answer in answers if answer.status != 200), None)
    headers = {RESULTS_OMITTED: "1"} if any(a.results_omitted for a in answers) else None
    if failed is not None:  # on the bus the other streams' batches may be committed
        raise ForwardedError(failed.status, json.loads(failed.body))
    if not many:
        body = answers[0].body
    else:
        # Each answer is `answer_of`'s JSON object; a stream's in the many-streams answer is
        # the same with `stream` last (as `answer_of(..., stream=...)` writes it).
        body = (
            b'{"streams":['
            + b",".join(
                a.body[:-1] + b',"stream":' + to_json(stream_id) + b"}"
                for a, (stream_id, _) in zip(answers, items, strict=True)
            )
            + b"]}"
        )
    state.metrics.ingest_duration.observe(time.perf_counter() - started)
    return Response(body, headers=headers, media_type="application/json")


RESULTS_OMITTED = "Twinwatch-Results-Omitted"
"""Set on an answer from the bus whose results would not fit in a message there: the readings
are committed, and GET .../readings has their forecasts and statistics."""


def _ingest(
    state: AppState, session: Session, items: list[tuple[str, list[ReadingIn]]]
) -> list[IngestOutcome]:
    return ingest_request(state.settings, state.streams, state.metrics, session, items)


def _respond(state: AppState, answer: dict[str, Any], started: float) -> Response:
    # Serialised here, once: returned as data, FastAPI would validate the answer against
    # `response_model` (which stays for the OpenAPI schema) and encode it again.
    body_bytes = to_json(answer)
    state.metrics.ingest_duration.observe(time.perf_counter() - started)
    return Response(content=body_bytes, media_type="application/json")


@router.post(
    "/streams/{stream_id}/readings",
    response_model=ReadingsOut,
    responses=problem_responses(400, 401, 404, 409, 413, 422, 503),
    dependencies=[WriteAccess],
    summary="Ingest a batch of readings",
    operation_id="postReadings",
    openapi_extra=json_body_openapi(ReadingsIn),
)
def post_readings(
    stream_id: StreamIdPath,
    state: StateDep,
    session: SessionDep,
    body: ReadingsBody,
    results: bool = ResultsQuery,
    wait: bool = WaitQuery,
) -> Response:
    """Process the readings in time order and commit them with the alarms they open or close.

    All or nothing. A re-sent reading (same time, same value) is counted in `duplicates` and not
    processed again, so retrying a batch is safe; an older reading that was never accepted, or a
    changed value for an accepted time, is refused with 409 and changes nothing.
    """
    started = time.perf_counter()
    if state.bus is not None:
        return on_the_bus(state, [(stream_id, body.readings)], results, wait, started)
    outcomes = _ingest(state, session, [(stream_id, body.readings)])
    session.commit()  # here, in the handler's thread (see `SessionDep`)
    return _respond(state, answer_of(outcomes[0], results), started)


@router.post(
    "/readings",
    response_model=ManyReadingsOut,
    responses=problem_responses(400, 401, 404, 409, 413, 422, 503),
    dependencies=[WriteAccess],
    summary="Ingest readings of many streams at once",
    operation_id="postManyReadings",
    openapi_extra=json_body_openapi(ManyReadingsIn),
)
def post_many_readings(
    state: StateDep,
    session: SessionDep,
    body: ManyReadingsBody,
    results: bool = ResultsQuery,
    wait: bool = WaitQuery,
) -> Response:
    """What a gateway sends each tick: a batch for each of many streams, in one transaction
    (all or nothing, each stream with the rules of its own endpoint). Streams of one model with
    one reading each are forecast together in one batched call. A problem names the stream it
    is about in `stream`. (On the bus, each stream's batch commits on its own.)
    """
    started = time.perf_counter()
    if state.bus is not None:
        items = [(item.stream, item.readings) for item in body.streams]
        return on_the_bus(state, items, results, wait, started, many=True)
    outcomes = _ingest(state, session, [(item.stream, item.readings) for item in body.streams])
    session.commit()  # here, in the handler's thread (see `SessionDep`)
    answer = {
        "streams": [
            answer_of(outcome, results, stream=item.stream)
            for item, outcome in zip(body.streams, outcomes, strict=True)
        ]
    }
    return _respond(state, answer, started)


@router.get(
    "/streams/{stream_id}/forecast",
    response_model=ForecastOut,
    responses=problem_responses(404, 409, 422),
    summary="Direct multi-step forecast from the stream's current window",
    operation_id="getForecast",
)
def get_forecast(
    stream_id: StreamIdPath,
    state: StateDep,
    session: SessionDep,
    horizon: int = Query(1, ge=1, description="Steps ahead, 1 to the model's horizon."),
) -> ForecastOut:
    stream = stream_repo.require(session, stream_id)
    live = state.streams.read(session, stream)
    if live.learning is not None:
        raise ConflictError(
            f"stream {stream_id!r} is still learning: it forecasts once it has learned",
            stream=stream_id,
        )
    forecast = live.recurrence.forecast_ahead(live.state, horizon)
    last = live.state.last_time
    return ForecastOut(
        stream=stream_id,
        model=stream.model_name,
        after_t=None if last is None else reading_repo.datetime_at(last),
        sample_period_s=live.sample_period_s,
        horizon=horizon,
        forecast=[float(x) for x in forecast],
    )


@router.get(
    "/streams/{stream_id}/readings",
    response_model=ReadingsHistory,
    responses=problem_responses(404, 422),
    summary="Stored readings with their forecasts, residuals and statistics, for a chart",
    operation_id="getReadings",
)
def get_readings(
    stream_id: StreamIdPath,
    state: StateDep,
    session: SessionDep,
    since: TakenSinceQuery = None,
    until: TakenUntilQuery = None,
    step_s: float | None = Query(
        None,
        gt=0,
        le=86_400 * 366,
        description="Bucket width in seconds: each bucket's least, greatest and mean instead "
        "of every reading (a week of 10 Hz readings at step_s=60 is 10,080 buckets).",
    ),
) -> ReadingsHistory:
    """The stream's stored readings taken in [since, until) (by default all of them), with the
    forecasts, residuals and detector statistics of the model and thresholds it runs now,
    recomputed from the stored readings: the model is warmed on up to 2,000 readings before
    `since` as it was live, so a model and detectors that look back a bounded window give the
    values the stream gave (a stateful model's, nearly). At most 1,000,000 readings a call."""
    if since is not None and until is not None and until <= since:
        raise DataError("until must be after since")
    stream = stream_repo.require(session, stream_id)
    running = state.streams.model_of(session, stream)
    recomputed = history(session, stream, running, since, until, most=MOST_RECOMPUTED)
    monitor = recomputed.recurrence.monitor
    times = recomputed.times
    result = recomputed.result
    nan = np.full(times.shape[0], np.nan)
    columns: dict[str, np.ndarray] = {
        "value": nan
        if recomputed.readings is None
        else recomputed.column(recomputed.readings.values[:, 0]),
        "forecast": nan if result is None else recomputed.column(result.forecast),
        "residual": nan if result is None else recomputed.column(result.residual),
    }
    statistics = (
        {}
        if result is None
        else {kind: recomputed.column(column) for kind, column in result.statistics.items()}
    )
    common = {
        "stream": stream_id,
        "model": state.streams.name_of(stream),
        "model_version": recomputed.version,
        "thresholds": monitor.thresholds,
    }
    if step_s is None:
        return ReadingsHistory(
            **common,
            step_s=None,
            t=(times / 1e6).tolist(),
            value=_column(columns["value"]),
            forecast=_column(columns["forecast"]),
            residual=_column(columns["residual"]),
            statistics={kind: _column(column) for kind, column in statistics.items()},
            count=None,
            buckets=None,
        )
    step = max(1, round(step_s * 1e6))
    cut = bucketed(times, {**columns, **statistics}, step)
    return ReadingsHistory(
        **common,
        step_s=step_s,
        t=(cut.starts / 1e6).tolist(),
        value=None,
        forecast=None,
        residual=None,
        statistics=None,
        count=cut.counts.tolist(),
        buckets={
            name: Spread(
                min=_column(cut.least[name]),
                max=_column(cut.greatest[name]),
                mean=_column(cut.mean[name]),
            )
            for name in cut.least
        },
    )


def _column(values: np.ndarray) -> list[float | None]:
    return [json_number(x) for x in values.tolist()]

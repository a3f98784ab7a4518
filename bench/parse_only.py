"""The parse-only ceiling: what the readings endpoint costs before the engine does anything.

By default this is the REAL service app (`app.main.create_app` with its settings, lifespan,
problem handlers and body-size middleware, built and served exactly as `twinwatch serve` does:
uvicorn, one worker, the same logging set-up and garbage-collector tuning) plus two routes of
its own, each with the real endpoint's body model (`ReadingsIn`), path validation, `WriteAccess`
dependency and a plain `def` handler (run in the thread pool, like the real one):

- `POST /v1/parse-only/{id}/readings` validates and answers `{"accepted": n}`: HTTP + JSON +
  pydantic inside the real app, the floor under any ingest;
- `POST /v1/echo/{id}/readings` also builds and serialises a `ReadingsOut` of the real answer's
  size (one result with five detector statistics per reading), the way the real endpoint
  serialises its answer (`model_construct`, one `model_dump_json`), to price the response.

Being the real app, it needs what the service needs: `TWINWATCH_*` settings (a database it
migrates, a models directory it loads), as bench/harness.py's `parse_only_server` sets them.

`--bare` serves the previous stand-alone FastAPI app instead (no lifespan, no problem handlers,
no models): the same two routes, and the parse-only one also at the real path
`/v1/streams/{id}/readings` (and no `WriteAccess`: the bare app has no state to check).

Run: `python bench/parse_only.py --port 8001 [--bare]`.
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import APIRouter, FastAPI, Response

from app.api.deps import WriteAccess
from app.api.problems import BodySizeLimitMiddleware
from app.api.readings import ReadingsBody
from app.api.streams import StreamIdPath
from app.logs import configure_logging
from app.schemas import ReadingResult, ReadingsOut
from app.settings import Settings, load_settings

DETECTORS = ("point", "rolling_rms", "variance_floor", "cusum", "level")
PARSE_ONLY_PATH = "/v1/parse-only/{stream_id}/readings"
ECHO_PATH = "/v1/echo/{stream_id}/readings"


def parse_only(stream_id: StreamIdPath, body: ReadingsBody) -> Response:
    """A ready-made `Response`, like the real handler's: returning a dict would add FastAPI's
    response-model validation and `jsonable_encoder`, which the real endpoint no longer pays.
    The body is parsed as the real endpoint parses it (`ReadingsBody`: from its bytes)."""
    return Response(b'{"accepted":%d}' % len(body.readings), media_type="application/json")


def parse_and_answer(stream_id: StreamIdPath, body: ReadingsBody) -> Response:
    results = [
        ReadingResult.model_construct(
            t=reading.t,
            forecast=reading.value,
            residual=0.0,
            imputed=False,
            statistics=dict.fromkeys(DETECTORS, 0.0),
        )
        for reading in body.readings
    ]
    answer = ReadingsOut(accepted=len(results), duplicates=0, results=results, opened=[], closed=[])
    return Response(content=answer.model_dump_json().encode(), media_type="application/json")


def ceiling_router(*, bare: bool = False) -> APIRouter:
    """The two ceiling routes; for the bare app (which has no app state for `WriteAccess`)
    without the dependency and with the parse-only route also at the real path."""
    router = APIRouter(tags=["bench"], dependencies=[] if bare else [WriteAccess])
    router.add_api_route(PARSE_ONLY_PATH, parse_only, methods=["POST"])
    router.add_api_route(ECHO_PATH, parse_and_answer, methods=["POST"], response_model=ReadingsOut)
    if bare:
        router.add_api_route("/v1/streams/{stream_id}/readings", parse_only, methods=["POST"])
    return router


def create_real_app(settings: Settings) -> FastAPI:
    """The service's own app (lifespan, middleware, handlers) with the ceiling routes added."""
    from app.cli.service import tune_gc_for_serving
    from app.main import create_app

    app = create_app(settings, after_startup=tune_gc_for_serving)
    app.include_router(ceiling_router())
    return app


def create_bare_app(settings: Settings) -> FastAPI:
    """The previous ceiling: a bare FastAPI app with only the body-size middleware."""
    app = FastAPI(title="twinwatch parse-only ceiling (bare)")
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    app.include_router(ceiling_router(bare=True))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--bare", action="store_true", help="The stand-alone app, not the real.")
    args = parser.parse_args()
    settings = load_settings().model_copy(
        update={"host": args.host, "port": args.port, "log_level": args.log_level}
    )
    # As `twinwatch serve` (app/cli/service.py) sets up logging and uvicorn.
    configure_logging(settings)
    app = create_bare_app(settings) if args.bare else create_real_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, workers=1)


if __name__ == "__main__":
    main()

"""The parse-only ceiling: what the readings endpoint costs before the engine does anything.

Two routes with the real endpoint's path, body model (`ReadingsIn`), body-size middleware and a
plain `def` handler (run in the thread pool, like the real one), served by uvicorn exactly as
`twinwatch serve` serves the app (one worker, same defaults):

- `POST /v1/streams/{id}/readings` validates and answers `{"accepted": n}`: HTTP + JSON +
  pydantic, the floor under any ingest;
- `POST /v1/echo/{id}/readings` also builds and serialises a `ReadingsOut` of the real answer's
  size (one result with five detector statistics per reading), to price the response.

Run: `python bench/parse_only.py --port 8001`.
"""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

from app.api.problems import BodySizeLimitMiddleware
from app.api.streams import StreamIdPath
from app.schemas import ReadingResult, ReadingsIn, ReadingsOut
from app.settings import Settings

DETECTORS = ("point", "rolling_rms", "variance_floor", "cusum", "level")


def create_app() -> FastAPI:
    app = FastAPI(title="twinwatch parse-only ceiling")
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=Settings().max_body_bytes)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/streams/{stream_id}/readings")
    def parse_only(stream_id: StreamIdPath, body: ReadingsIn) -> dict[str, int]:
        return {"accepted": len(body.readings)}

    @app.post("/v1/echo/{stream_id}/readings", response_model=ReadingsOut)
    def parse_and_answer(stream_id: StreamIdPath, body: ReadingsIn) -> ReadingsOut:
        results = [
            ReadingResult(
                t=reading.t,
                forecast=reading.value,
                residual=0.0,
                imputed=False,
                statistics=dict.fromkeys(DETECTORS, 0.0),
            )
            for reading in body.readings
        ]
        return ReadingsOut(
            accepted=len(results), duplicates=0, results=results, opened=[], closed=[]
        )

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level=args.log_level, workers=1)


if __name__ == "__main__":
    main()

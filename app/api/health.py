"""Liveness, readiness and the Prometheus scrape endpoint."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from fastapi import APIRouter, Response

from app.api.deps import ReadAccess, StateDep
from app.errors import AppError
from app.registry import AUTO
from app.schemas import Health, Ready, problem_responses
from app.storage.db import DatabaseError

router = APIRouter(tags=["operations"])

# Probes answer on the event loop, the database ping on a thread of its own: not in the thread
# pool that request handlers share, which requests waiting long (on the bus, for a worker's
# answer) can fill, and a liveness probe that waits behind them gets a live process restarted.
# A ping that has not answered within PING_LIMIT_S makes the process not ready.
_PINGS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinwatch-readiness")
PING_LIMIT_S = 5.0


class NotReadyError(AppError):
    status = 503
    title = "Not ready"
    type_slug = "not-ready"


@router.get(
    "/healthz", response_model=Health, summary="The process is alive", operation_id="getHealth"
)
async def healthz() -> Health:
    return Health()


@router.get(
    "/readyz",
    response_model=Ready,
    responses=problem_responses(503),
    summary="The database answers and the default model is loaded",
    operation_id="getReadiness",
)
async def readyz(state: StateDep) -> Ready:
    checks: dict[str, str] = {}
    failing: list[str] = []
    try:
        ping = asyncio.get_running_loop().run_in_executor(_PINGS, state.database.ping)
        await asyncio.wait_for(ping, timeout=PING_LIMIT_S)
        checks["database"] = "ok"
    except DatabaseError as exc:
        checks["database"] = exc.detail
        failing.append(f"database: {exc.detail}")
    except TimeoutError:
        checks["database"] = f"no answer within {PING_LIMIT_S:g} s"
        failing.append(f"database: {checks['database']}")
    if state.bus is None:  # (serving already: a stream asked for is restored first)
        checks["streams"] = state.restoring.describe()
    default = state.settings.default_model
    if default in state.registry or default == AUTO:
        checks["models"] = f"{len(state.registry)} loaded"
    else:
        reason = state.registry.errors.get(default, "no such artifact directory")
        checks["models"] = f"default model {default!r} not loaded: {reason}"
        failing.append(f"models: {checks['models']}")
    if failing:
        raise NotReadyError("; ".join(failing), checks=checks)
    return Ready(checks=checks)


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus text exposition",
    operation_id="getMetrics",
    dependencies=[ReadAccess],
    responses={200: {"content": {"text/plain": {}}}},
)
def metrics(state: StateDep) -> Response:
    body, content_type = state.metrics.render()
    return Response(body, media_type=content_type)

"""The operator's pages, served by the service itself: server-rendered HTML (Jinja2 templates
beside this file) readable without a script, a stylesheet of our own and, for the chart, uPlot
(`static/vendor/`); nothing is fetched from elsewhere.

- `/` the streams, a page at a time (the query of `GET /v1/streams`);
- `/streams/{id}` one stream: its live chart (drawn by `static/stream.js` from
  `GET /v1/streams/{id}/readings` and `GET /v1/alarms`), settings, model, detectors and alarms;
  `/streams/{id}/shadow` the comparison with a shadowing candidate (replayed on demand);
  `/streams/{id}/new-normal` and `/streams/{id}/run` an operator's confirmation that a
  learned stream's process has a new normal (a retrain job from then on), and running the
  version it made;
- `/alarms` alarms across streams, filtered, each acknowledged with a name;
- `/incidents` incidents (the alarms of one fault together), open and recent, each with its
  alarms, its moment on the chart, acknowledged with a name, and the way to a new normal;
- `/sign-in` when reads are protected (`access.py` says how the token is kept).

Each list of pages has its module (`streams.py`, `alarms.py`, `incidents.py`), over
`rendering.py` (templates, filters) and `acting.py` (what a change needs); this one has the
sign-in and puts them all on the app."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, FastAPI, Form, Query, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.api.deps import (
    SettingsDep,
    SingleQueryValues,
    token_accepted,
)
from app.web import alarms, incidents, streams
from app.web.access import (
    ForeignFormError,
    SameSite,
    SignInRequiredError,
    forget,
    local,
    reader_tokens,
    remember_token,
)
from app.web.rendering import render, static

router = APIRouter(include_in_schema=False, dependencies=[SingleQueryValues])


@router.get("/sign-in", response_class=HTMLResponse)
def sign_in_page(request: Request, back: Annotated[str, Query(max_length=2000)] = "/") -> Response:
    return render(request, "sign_in.html", {"back": local(back), "problem": None})


@router.post("/sign-in", response_class=HTMLResponse, dependencies=[SameSite])
def sign_in(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    back: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    accepted = reader_tokens(settings)
    target = local(back)
    given = token.strip()
    if accepted is not None and not (given and token_accepted(given, accepted)):
        problem = "Enter this service's token." if not given else "That token is not accepted."
        return render(request, "sign_in.html", {"back": target, "problem": problem}, 401)
    response = RedirectResponse(target, status_code=status.HTTP_303_SEE_OTHER)
    if given:
        remember_token(request, response, given)
    return response


@router.post("/sign-out", response_class=HTMLResponse, dependencies=[SameSite])
def sign_out() -> Response:
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    forget(response)
    return response


async def _sign_in_required(request: Request, exc: Exception) -> Response:
    back = exc.back if isinstance(exc, SignInRequiredError) else "/"
    return render(request, "sign_in.html", {"back": local(back), "problem": None}, 401)


async def _foreign_form(request: Request, exc: Exception) -> Response:
    message = "This form was sent from another site: refused. Use the page on this service."
    return render(request, "missing.html", {"what": message}, 403)


def install(app: FastAPI) -> None:
    """The pages, their static files and their answers to a reader not signed in."""
    for pages in (streams.router, alarms.router, incidents.router, router):
        app.include_router(pages)
    app.mount("/static", static, name="static")
    app.add_exception_handler(SignInRequiredError, _sign_in_required)
    app.add_exception_handler(ForeignFormError, _foreign_form)

"""What every page that changes something shares: the API token a change needs, the name it is
made in, and the page an acknowledgement returns to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit

from fastapi import Request, status
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError

from app.api.deps import (
    token_accepted,
)
from app.schemas import (
    AcknowledgeIn,
)
from app.settings import Settings
from app.web.access import (
    NAME_COOKIE,
    holds,
    remember,
    remember_token,
)


@dataclass(frozen=True)
class Refusal:
    """Why the page did not acknowledge an alarm or an incident (`subject`: "Alarm 12"), shown
    above the list (with the name the form gave, to try again)."""

    status: int
    subject: str
    message: str
    name: str


def acknowledged(request: Request, back: str, number: int, who: str, given: str) -> Response:
    """Back to the list, saying what was acknowledged; the name (and a token given) kept."""
    response = RedirectResponse(
        with_acknowledged(back, number), status_code=status.HTTP_303_SEE_OTHER
    )
    if given:
        remember_token(request, response, given)
    remember(request, response, NAME_COOKIE, who)
    return response


def with_acknowledged(back: str, alarm_id: int) -> str:
    """The page to return to, saying which alarm was just acknowledged (in place of the one
    it said before)."""
    parts = urlsplit(back)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key != "acknowledged"]
    return f"{parts.path}?{urlencode([*query, ('acknowledged', str(alarm_id))])}"


def who_acts(
    request: Request,
    settings: Settings,
    subject: str,
    exists: Callable[[], bool],
    by: str,
    given: str,
) -> str | Refusal:
    """Who acknowledges `subject`, or why not (the token first: whether it exists is for those
    who may acknowledge it)."""
    refusal = token_refusal(request, settings, given, "Acknowledging")
    if refusal is not None:
        return Refusal(401, subject, refusal, by)
    if not exists():
        return Refusal(404, subject, f"There is no {subject[0].lower()}{subject[1:]}.", by)
    try:
        return AcknowledgeIn(by=by).by
    except ValidationError:
        message = "Give a name of 1 to 128 characters (yours or a system's) to acknowledge."
        return Refusal(422, subject, message, by[:128])


def token_refusal(request: Request, settings: Settings, given: str, doing: str) -> str | None:
    """Why a page's change is refused for want of the API token the service requires (`doing`:
    what the change is), or None."""
    needed = settings.write_tokens()
    if needed is None:
        return None
    if given and not token_accepted(given, needed):
        return "That is not this service's API token: nothing was changed."
    if not given and not holds(request, needed):
        return (
            f"{doing} needs this service's API token (TWINWATCH_API_TOKEN): enter it in the "
            "form. It is kept for this browser session only."
        )
    return None

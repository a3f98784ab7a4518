"""Who may see and act through the operator's pages. A browser cannot send a bearer header on
a plain link, so a token given once (to sign in when reads are protected, or to acknowledge when
writes are) is kept in an HttpOnly, SameSite=Lax session cookie: never in a URL, gone when the
browser session ends, sent when a link from elsewhere (a chat, Grafana) is followed but not with
another site's form. A page's form is also refused when the browser says it comes from another
site, and no other site may frame a page (`SECURITY_HEADERS`)."""

from __future__ import annotations

from urllib.parse import quote, unquote, urlsplit

from fastapi import Depends, Request, Response

from app.api.deps import SESSION_COOKIE, SettingsDep, presented_token, token_accepted
from app.settings import Settings

NAME_COOKIE = "twinwatch_name"
"""Who acknowledged last from this browser, to fill the next form in."""


class SignInRequiredError(Exception):
    """A page was asked for, reads are protected and the session holds no read token: the
    sign-in page answers (401), then sends the reader back to `back`."""

    def __init__(self, back: str) -> None:
        super().__init__(back)
        self.back = back


class ForeignFormError(Exception):
    """A page's form posted from another site (the browser's Origin header says so)."""


def reader_tokens(settings: Settings) -> list[str] | None:
    """The tokens that let a browser in: those reads need, or when reads are open the API token
    (signing in with it saves being asked when acknowledging). None: nothing to sign in with."""
    readers = settings.read_tokens()
    if readers is not None:
        return readers
    return settings.write_tokens()


def holds(request: Request, accepted: list[str] | None) -> bool:
    """Whether this request (its session cookie, or a bearer header from a script) may do what
    `accepted` guards (None: anyone may)."""
    if accepted is None:
        return True
    token = presented_token(request.headers)
    return token is not None and token_accepted(token, accepted)


def signed_in(request: Request) -> bool:
    """Whether the browser session holds a token (the pages then offer to sign out)."""
    return bool(request.cookies.get(SESSION_COOKIE))


SECURITY_HEADERS = {
    # Everything a page uses is served here; no other site may frame it (its forms act).
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",  # a page shows what a token guards
    "Referrer-Policy": "same-origin",
}


def here(request: Request) -> str:
    """The page asked for, as a local path with its query (where to come back to)."""
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def local(back: str | None, default: str = "/") -> str:
    """`back` if it is a path on this service, else `default`: a form's return address must not
    send anyone elsewhere."""
    if not back or not back.startswith("/") or back.startswith("//") or "\\" in back:
        return default
    parts = urlsplit(back)
    if parts.scheme or parts.netloc:
        return default
    return back


async def require_page_reader(request: Request, settings: SettingsDep) -> None:
    if not holds(request, settings.read_tokens()):
        raise SignInRequiredError(here(request) if request.method == "GET" else "/")


PageReader = Depends(require_page_reader)
"""On every page: with reads protected, the session must hold a read token."""


async def require_same_site(request: Request) -> None:
    """Browsers send Origin with every form POST; one naming another host is refused. A request
    without it comes from no browser page (curl, a script) and cannot ride on a session."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    host = request.headers.get("host", "")
    if origin == "null" or urlsplit(origin).netloc != host:
        raise ForeignFormError()


SameSite = Depends(require_same_site)
"""On every page form's POST."""


def remember(request: Request, response: Response, name: str, value: str) -> None:
    """Keep `value` for the browser session: HttpOnly, SameSite=Lax, Secure over HTTPS."""
    response.set_cookie(
        name,
        quote(value, safe=""),
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def remember_token(request: Request, response: Response, token: str) -> None:
    remember(request, response, SESSION_COOKIE, token)


def forget(response: Response) -> None:
    for name in (SESSION_COOKIE, NAME_COOKIE):
        response.delete_cookie(name, httponly=True, samesite="lax")


def remembered_name(request: Request) -> str:
    return unquote(request.cookies.get(NAME_COOKIE, ""))[:128]

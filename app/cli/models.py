"""`twinwatch models list | show | promote | rollback`: a running service's model versions,
and switching a stream between them, over its HTTP API (`--url`; the token from
TWINWATCH_API_TOKEN, or TWINWATCH_READ_TOKEN for reads)."""

from __future__ import annotations

import os
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.table import Table

from app.errors import AppError

UrlOption = Annotated[
    str,
    typer.Option(envvar="TWINWATCH_URL", help="The service's base URL."),
]
DEFAULT_URL = "http://127.0.0.1:8000"


def _client(url: str) -> httpx.Client:
    token = os.environ.get("TWINWATCH_API_TOKEN") or os.environ.get("TWINWATCH_READ_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=url, headers=headers, timeout=60)


def call(
    url: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
) -> Any:
    """The answer's JSON; a problem answer or an unreachable service is a one-line error.
    `path` is made of quoted parts (`part`)."""
    try:
        with _client(url) as client:
            answer = client.request(method, path, json=body, params=params)
    except httpx.HTTPError as exc:
        raise AppError(f"cannot reach the service at {url}: {exc}") from exc
    if answer.is_error:
        try:
            detail = answer.json().get("detail") or answer.reason_phrase
        except ValueError:
            detail = answer.text.strip() or answer.reason_phrase
        raise AppError(f"{answer.status_code}: {detail}")
    return answer.json()


def part(text: str) -> str:
    """One path segment, quoted."""
    return quote(text, safe="")


def list_command(url: UrlOption = DEFAULT_URL) -> None:
    """The loaded models, each with the version its streams run by default."""
    table = Table("model", "active version", "kind", "window", "channels")
    for model in call(url, "GET", "/v1/models")["items"]:
        table.add_row(
            model["name"],
            model["version"],
            model["kind"],
            str(model["window"]),
            str(model["n_channels"]),
        )
    Console().print(table)


def show_command(
    name: Annotated[
        str, typer.Argument(help="The model's name (a stream's learned ones: auto.<stream id>).")
    ],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Every version of a model: status, where it came from, when."""
    model = call(url, "GET", f"/v1/models/{part(name)}")
    table = Table("version", "status", "kind", "created by", "created at", "source")
    for version in model["versions"]:
        source = ", ".join(f"{key}={value}" for key, value in version["source"].items())
        table.add_row(
            str(version["version"]),
            version["status"],
            version["kind"],
            version["created_by"],
            version["created_at"],
            source,
        )
    Console().print(f"{name}: active version {model['active_version']}")
    Console().print(table)


def _switch(url: str, stream: str, name: str, version: int) -> None:
    answer = call(
        url, "POST", f"/v1/streams/{part(stream)}/model", {"name": name, "version": version}
    )
    before = answer["previous_model"]
    typer.echo(
        f"stream {stream} runs {name} version {version} from its next reading on"
        + (f" (before: {before['name']} version {before['version']})" if before else "")
    )


def promote_command(
    stream: Annotated[str, typer.Argument(help="The stream.")],
    name: Annotated[
        str, typer.Argument(help="The model (a stream's learned ones: auto.<stream id>).")
    ],
    version: Annotated[int, typer.Argument(min=1, help="Its version.")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Run a model version on a stream from its next reading on (warmed on its stored
    readings; the old version's open alarms close)."""
    _switch(url, stream, name, version)


def rollback_command(
    stream: Annotated[str, typer.Argument(help="The stream.")],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Switch a stream back to the version it ran before its last switch."""
    previous = call(url, "GET", f"/v1/streams/{part(stream)}")["previous_model"]
    if previous is None:
        raise AppError(f"stream {stream!r} never switched models: there is nothing to roll back")
    _switch(url, stream, previous["name"], previous["version"])

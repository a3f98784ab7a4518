"""`twinwatch send | streams | alarms | incidents`: what a user does with a running service from
the command line, over its HTTP API (`--url`, or TWINWATCH_URL; the token from
TWINWATCH_API_TOKEN, or TWINWATCH_READ_TOKEN for reads): feed a CSV of a sensor's readings to a
stream, list streams, alarms and incidents, acknowledge them."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from app.cli.models import DEFAULT_URL, UrlOption, call, part
from app.errors import AppError, DataError
from app.schemas import EARLIEST_READING_S, LATEST_EPOCH_S, MAX_STREAMS_A_REQUEST

console = Console()
LABEL_COLUMNS = frozenset({"anomaly", "changepoint"})
"""Columns a labelled data set carries beside its sensors: never sent as readings."""
BATCH = 1000


# --- send ---------------------------------------------------------------------------------------


def send_command(
    stream: Annotated[str, typer.Argument(help="The stream the readings go to.")],
    source: Annotated[
        str,
        typer.Argument(
            help="A CSV file, or '-' for standard input: a header row, the time first (epoch "
            "seconds, or ISO 8601: UTC without an offset), then one column per channel; an "
            "empty cell is a missing reading."
        ),
    ],
    create: Annotated[
        bool,
        typer.Option(
            "--create",
            help="Create the stream if it does not exist, as a stream that learns its own "
            "model (model auto) with the CSV's columns as its channels.",
        ),
    ] = False,
    learn: Annotated[
        int | None,
        typer.Option(
            min=100,
            help="With --create: the readings it learns from before it monitors (default 1,000).",
        ),
    ] = None,
    reference: Annotated[
        str | None,
        typer.Option(help="A column that is a redundant sensor of the first channel."),
    ] = None,
    batch: Annotated[int, typer.Option(min=1, max=10_000, help="Readings a request.")] = BATCH,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Send a CSV of readings to a stream, in order, a batch a request. Resumable: the readings
    up to the stream's last stored one are skipped (a re-send sends nothing new), and a batch
    the service already has is answered as duplicates."""
    header, rows = _read(source)
    time_column, columns = header[0], [name for name in header[1:] if name not in LABEL_COLUMNS]
    if reference is not None:
        if reference not in columns:
            raise DataError(f"no column {reference!r} for the reference: the CSV has {columns}")
        columns.remove(reference)
    if not columns:
        raise DataError(f"the CSV has no sensor column after its time column {time_column!r}")
    existing = _stream(url, stream)
    if existing is None and not create:
        raise AppError(f"stream {stream!r} does not exist: pass --create to create it")
    channels = columns if existing is None else list(existing["channels"])
    single = len(channels) == 1 and len(columns) == 1
    if not single and sorted(columns) != sorted(channels):
        raise DataError(
            f"the CSV's columns {columns} are not stream {stream!r}'s channels {channels}"
        )
    last = None if existing is None else existing.get("last_t")
    after = None if last is None else _seconds(last)
    index = {name: header.index(name) for name in [*columns, *([reference] if reference else [])]}
    parsed = [  # every row checked before anything is sent
        _reading(row, line, index, columns, reference, single)
        for line, row in enumerate(rows, start=2)
    ]
    readings = [r for r in parsed if after is None or r["t"] > after]
    if existing is None:
        body: dict[str, Any] = {"model": "auto", "channels": columns}
        if learn is not None:
            body["learning"] = {"readings": learn}
        if reference is not None:
            body["has_reference"] = True
        call(url, "PUT", f"/v1/streams/{part(stream)}", body)
        console.print(f"created stream {stream} (model auto, channels {', '.join(columns)})")
    skipped = len(rows) - len(readings)
    totals = {"accepted": 0, "duplicates": 0, "opened": 0, "closed": 0}
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task(f"sending to {stream}", total=len(readings))
        for start in range(0, len(readings), batch):
            chunk = readings[start : start + batch]
            answer = call(
                url,
                "POST",
                f"/v1/streams/{part(stream)}/readings",
                {"readings": chunk},
                params={"results": "false"},
            )
            for key in ("accepted", "duplicates"):
                totals[key] += int(answer[key])
            totals["opened"] += len(answer["opened"])
            totals["closed"] += len(answer["closed"])
            progress.advance(task, len(chunk))
    console.print(
        f"{totals['accepted']:,} readings accepted, {totals['duplicates']:,} already there, "
        f"{skipped:,} skipped (up to the stream's last reading); alarms opened "
        f"{totals['opened']}, closed {totals['closed']}"
    )


def _read(source: str) -> tuple[list[str], list[list[str]]]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise DataError(f"cannot read {source}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{source} is not UTF-8 text: {exc.reason} at byte {exc.start}") from exc
    try:
        table = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise DataError(f"{source} is not a CSV file: {exc}") from exc
    if not table or not table[0]:
        raise DataError(f"{source} is empty: a header row comes first")
    return [name.strip() for name in table[0]], [row for row in table[1:] if row]


def _reading(
    row: list[str],
    line: int,
    index: dict[str, int],
    columns: list[str],
    reference: str | None,
    single: bool,
) -> dict[str, Any]:
    if len(row) <= max(index.values()):
        raise DataError(f"line {line}: {len(row)} cells, fewer than the header's")
    moment = row[0].strip()
    if not moment:
        raise DataError(f"line {line}: no time")
    stamp = _seconds(moment, line)
    values = {name: _number(row[index[name]], line, name) for name in columns}
    reading: dict[str, Any] = {"t": stamp}
    if single:
        reading["value"] = values[columns[0]]
    else:
        reading["values"] = values
    if reference is not None:
        reading["reference"] = _number(row[index[reference]], line, reference)
    return reading


def _number(cell: str, line: int, column: str) -> float | None:
    text = cell.strip()
    if not text or text.lower() in ("nan", "null", "none"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"line {line}, column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"line {line}, column {column!r}: {text!r} is not a finite number")
    return value


def _seconds(moment: str, line: int | None = None) -> float:
    """Epoch seconds of a time as a CSV or the service gives it: seconds since the epoch, or an
    ISO 8601 time (without an offset: UTC). Checked as the service checks it, so a file is
    refused before anything of it is sent."""
    where = "" if line is None else f"line {line}: "
    try:
        seconds = float(moment)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(moment.strip().replace("Z", "+00:00"))
        except ValueError:
            raise DataError(
                f"{where}{moment!r} is not a time (epoch seconds or ISO 8601)"
            ) from None
        seconds = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    if not (math.isfinite(seconds) and 0 <= seconds < LATEST_EPOCH_S):
        raise DataError(
            f"{where}{moment!r} is not a time: seconds since the epoch run from 0 to "
            f"{LATEST_EPOCH_S:.0e} (milliseconds? divide by 1,000)"
        )
    if seconds < EARLIEST_READING_S:
        raise DataError(
            f"{where}{moment!r} is before 1990: times since a recording started? give them "
            "as epoch seconds or ISO 8601 times"
        )
    return seconds


def _stream(url: str, stream: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = call(url, "GET", f"/v1/streams/{part(stream)}")
    except AppError as exc:
        if exc.detail.startswith("404"):
            return None
        raise
    return found


# --- listing ------------------------------------------------------------------------------------


def _pages(url: str, path: str, params: dict[str, str], limit: int) -> Iterator[dict[str, Any]]:
    """Items of a paged list, newest first, at most `limit` of them."""
    cursor = None
    shown = 0
    while shown < limit:
        query = {**params, "limit": str(min(500, limit - shown))}
        if cursor:
            query["cursor"] = cursor
        page = call(url, "GET", path, params=query)
        for item in page["items"]:
            shown += 1
            yield item
        cursor = page.get("next_cursor")
        if not cursor or not page["items"]:
            return


def _when(text: str | None) -> str:
    return "" if text is None else text.replace("T", " ").replace("Z", "")[:19]


LimitOption = Annotated[int, typer.Option(min=1, help="Show at most this many.")]


def streams_list_command(url: UrlOption = DEFAULT_URL, limit: LimitOption = 1000) -> None:
    """The streams: model, phase, readings, last reading, open alarms."""
    table = Table("stream", "model", "phase", "readings", "last reading", "open alarms")
    for stream in _pages(url, "/v1/streams", {}, limit):
        version = stream.get("model_version")
        table.add_row(
            stream["id"],
            stream["model"] + ("" if version is None else f" v{version}"),
            stream.get("phase") or "monitoring",
            f"{stream['samples_seen']:,}",
            _when(stream.get("last_t")),
            ", ".join(alarm["detector"] for alarm in stream.get("open_alarms", [])) or "-",
        )
    console.print(table)


def streams_apply_command(
    source: Annotated[
        str,
        typer.Argument(
            help='A JSON file of streams (a list, or {"streams": [...]}, each an "id" and '
            "what its PUT takes), a CSV with an id column (and model, channels separated by "
            "spaces, sample_period_s, has_reference), or - for standard input (JSON)."
        ),
    ],
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Create or update many streams at once (a fleet's onboarding): each checked as its own
    PUT checks it, all or nothing, in one request."""
    text = sys.stdin.read() if source == "-" else _text(Path(source))
    streams = _fleet_csv(text) if source.lower().endswith(".csv") else _fleet_json(text)
    if not streams:
        raise DataError(f"{source}: no streams")
    if len(streams) > MAX_STREAMS_A_REQUEST:
        raise DataError(
            f"{source}: {len(streams):,} streams; at most {MAX_STREAMS_A_REQUEST:,} at once "
            "(split the file)"
        )
    done = call(url, "PUT", "/v1/streams", {"streams": streams})
    console.print(f"{len(done['created']):,} created, {len(done['updated']):,} updated")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from None


def _fleet_json(text: str) -> list[dict[str, Any]]:
    try:
        loaded = json.loads(text)
    except ValueError as exc:
        raise DataError(f"not JSON: {exc}") from None
    streams = loaded.get("streams") if isinstance(loaded, dict) else loaded
    if not isinstance(streams, list) or not all(isinstance(s, dict) for s in streams):
        raise DataError('give a list of streams, or {"streams": [...]}, each a JSON object')
    return streams


def _fleet_csv(text: str) -> list[dict[str, Any]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    columns = {"id", "model", "channels", "sample_period_s", "has_reference"}
    unknown = sorted(set(rows[0]) - columns) if rows else []
    if rows and ("id" not in rows[0] or unknown):
        raise DataError(
            f"a fleet's CSV has an id column and may have {', '.join(sorted(columns - {'id'}))}"
            + (f"; not {', '.join(unknown)}" if unknown else "")
        )
    streams = []
    for line, row in enumerate(rows, start=2):
        stream: dict[str, Any] = {"id": row["id"]}
        if row.get("model"):
            stream["model"] = row["model"]
        if row.get("channels"):
            stream["channels"] = row["channels"].split()
        if row.get("sample_period_s"):
            stream["sample_period_s"] = _number(row["sample_period_s"], line, "sample_period_s")
        if row.get("has_reference"):
            flag = row["has_reference"].strip().lower()
            if flag not in ("true", "false"):
                raise DataError(f"line {line}: has_reference is true or false, not {flag!r}")
            stream["has_reference"] = flag == "true"
        streams.append(stream)
    return streams


StreamFilter = Annotated[str | None, typer.Option(help="Only this stream's.")]
StateFilter = Annotated[str | None, typer.Option(help="open or closed.")]


def alarms_list_command(
    stream: StreamFilter = None,
    state: StateFilter = None,
    detector: Annotated[str | None, typer.Option(help="Only this detector's.")] = None,
    url: UrlOption = DEFAULT_URL,
    limit: LimitOption = 50,
) -> None:
    """Alarms, newest first."""
    params = {
        k: v for k, v in {"stream": stream, "state": state, "detector": detector}.items() if v
    }
    table = Table("id", "stream", "detector", "opened", "closed", "peak / threshold", "incident")
    for alarm in _pages(url, "/v1/alarms", params, limit):
        table.add_row(
            str(alarm["id"]),
            alarm["stream"],
            alarm["detector"],
            _when(alarm["opened_at"]),
            _when(alarm["closed_at"]) or "open",
            f"{alarm['peak']:.3g} / {alarm['threshold']:.3g}",
            str(alarm.get("incident") or ""),
        )
    console.print(table)


def incidents_list_command(
    stream: StreamFilter = None,
    state: StateFilter = None,
    url: UrlOption = DEFAULT_URL,
    limit: LimitOption = 50,
) -> None:
    """Incidents (the alarms of one fault together), newest first."""
    params = {k: v for k, v in {"stream": stream, "state": state}.items() if v}
    table = Table("id", "stream", "opened", "closed", "detectors", "acknowledged")
    for incident in _pages(url, "/v1/incidents", params, limit):
        table.add_row(
            str(incident["id"]),
            incident["stream"],
            _when(incident["opened_at"]),
            _when(incident["closed_at"]) or "open",
            ", ".join(incident["detectors"]),
            incident["acknowledged_by"] or "",
        )
    console.print(table)


ByOption = Annotated[str, typer.Option(help="Who acknowledges (a person or a system).")]


def alarms_ack_command(
    alarm: Annotated[int, typer.Argument(help="The alarm's id.")],
    by: ByOption,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Acknowledge an alarm."""
    _acknowledge(url, "alarm", alarm, by)


def incidents_ack_command(
    incident: Annotated[int, typer.Argument(help="The incident's id.")],
    by: ByOption,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Acknowledge an incident and its alarms."""
    _acknowledge(url, "incident", incident, by)


def _acknowledge(url: str, kind: str, number: int, by: str) -> None:
    done = call(url, "POST", f"/v1/{kind}s/{number}/acknowledge", {"by": by})
    console.print(f"{kind} {done['id']} acknowledged by {done['acknowledged_by']}")

"""What an MQTT message means: its topic and payload mapped to a request's readings (stream
id, readings), by the rule the README states. No network here.

- **Plain JSON** (any topic but Sparkplug's): the service's own reading formats. A payload
  `{"streams": [...]}` names its streams (`POST /v1/readings`); `{"readings": [...]}` (`POST
  /v1/streams/{id}/readings`) and a single reading `{"t": ..., "value": ...}` belong to the
  stream the topic's last level names (`plant/line-1/pump-7` is stream `pump-7`).
- **Sparkplug B** (`spBv1.0/...`): a device is a stream named `<group>.<edge node>.<device>`
  (a node's own metrics: `<group>.<edge node>`), its metrics are the stream's channels (a
  metric's name with `/` made `.` and any other character a channel name cannot hold made
  `_`). A birth (`NBIRTH`, `DBIRTH`) names the metrics that data messages (`NDATA`, `DDATA`)
  give by alias; the metrics of one timestamp are one reading. Only numbers are readings
  (integers, floats, doubles; a null metric is a missing value); booleans and strings are
  left out. A birth of a device no stream names makes its stream (the subscriber's
  `announce`). `NDEATH` and `DDEATH` mean the sender is gone: its streams are stale (a node's:
  every stream named `<group>.<edge node>` or under it).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError
from pydantic import ValidationError
from pydantic_core import from_json

from app.errors import DataError
from app.mqtt import sparkplug
from app.schemas import CHANNEL_PATTERN, STREAM_ID_PATTERN, ManyReadingsIn, ReadingIn, ReadingsIn

Items = list[tuple[str, list[ReadingIn]]]
"""A request's readings: (stream id, its readings in time order) for each stream."""

BIRTHS = frozenset({"NBIRTH", "DBIRTH"})
DATA = frozenset({"NDATA", "DDATA"})
DEATHS = frozenset({"NDEATH", "DDEATH"})


class PayloadError(DataError):
    """A message that holds no readings the service can take; `reason` names the cause (the
    label it is counted under, and logged once)."""

    def __init__(self, detail: str, reason: str) -> None:
        super().__init__(detail, reason=reason)
        self.reason = reason


def plain_json(topic: str, payload: bytes) -> Items:
    """A plain JSON message's readings."""
    try:
        shape = from_json(payload, allow_partial=False)
    except ValueError as exc:
        raise PayloadError(f"not JSON ({exc})", "malformed") from None
    try:
        if isinstance(shape, dict) and "streams" in shape:
            many = ManyReadingsIn.model_validate_json(payload)
            return [(item.stream, item.readings) for item in many.streams]
        if isinstance(shape, dict) and "readings" in shape:
            readings = ReadingsIn.model_validate_json(payload).readings
        else:
            readings = [ReadingIn.model_validate_json(payload)]
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        raise PayloadError(f"not readings: {where}: {error['msg']}", "malformed") from None
    stream_id = topic.rsplit("/", 1)[-1]
    if not re.match(STREAM_ID_PATTERN, stream_id):
        raise PayloadError(
            f"the topic's last level {stream_id!r} is not a stream id", "not_a_stream_id"
        )
    return [(stream_id, readings)]


def channel_name(metric: str) -> str:
    """A Sparkplug metric's name as a channel name."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", metric.replace("/", "."))
    if not name or not (name[0].isalpha() or name[0] == "_"):
        name = "_" + name
    return name[:64]


def stream_of(topic: sparkplug.Topic) -> str:
    parts = [topic.group, topic.node] + ([topic.device] if topic.device else [])
    stream_id = ".".join(parts)
    if not re.match(STREAM_ID_PATTERN, stream_id):
        raise PayloadError(
            f"{stream_id!r} (group.node.device) is not a stream id", "not_a_stream_id"
        )
    return stream_id


@dataclass
class Sparkplug:
    """What births have said: each sender's metrics (name and data type) by alias, and the data
    types by name. A data message with an alias no birth named (the service started after the
    birth) is refused with the reason `no_birth`: the subscriber asks the node to be born
    again."""

    births: dict[tuple[str, str, str | None], dict[int, tuple[str, int]]] = field(
        default_factory=dict
    )
    types: dict[tuple[str, str, str | None], dict[str, int]] = field(default_factory=dict)

    def read(self, topic: sparkplug.Topic, payload: bytes) -> Items:
        """The readings of a Sparkplug B message: a data message's, and a birth's (the values
        it was born with); none for a command."""
        try:
            message = sparkplug.Payload.FromString(payload)
        except DecodeError as exc:
            raise PayloadError(f"not a Sparkplug B payload ({exc})", "malformed") from None
        if topic.kind in BIRTHS:
            self._born(topic, message)
        elif topic.kind not in DATA:
            return []
        stream_id = stream_of(topic)
        return self._readings(topic, message, stream_id)

    def _born(self, topic: sparkplug.Topic, message: Any) -> None:
        if topic.kind == "NBIRTH":  # a node born again: its devices will be too
            for source in [s for s in self.births if s[:2] == (topic.group, topic.node)]:
                del self.births[source]
                self.types.pop(source, None)
        aliases = self.births.setdefault(topic.source, {})
        types = self.types.setdefault(topic.source, {})
        for metric in message.metrics:
            if metric.name:
                types[metric.name] = metric.datatype
                if metric.HasField("alias"):
                    aliases[metric.alias] = (metric.name, metric.datatype)

    def _readings(self, topic: sparkplug.Topic, message: Any, stream_id: str) -> Items:
        aliases = self.births.get(topic.source, {})
        types = self.types.get(topic.source, {})
        by_time: dict[int, dict[str, float | None]] = {}
        for metric in message.metrics:
            if metric.name:
                name, datatype = metric.name, metric.datatype or types.get(metric.name, 0)
            elif metric.HasField("alias") and metric.alias in aliases:
                name, datatype = aliases[metric.alias]
            else:
                raise PayloadError(
                    f"metric alias {metric.alias} of {stream_id}: no birth named it", "no_birth"
                )
            if name.startswith(("Node Control/", "Properties/")):
                continue  # the node's controls, not its readings
            value = sparkplug.number_of(metric, datatype)
            if value is None and not metric.is_null:
                continue  # not a number: no channel
            channel = channel_name(name)
            if not re.match(CHANNEL_PATTERN, channel):
                continue
            when = metric.timestamp if metric.HasField("timestamp") else message.timestamp
            finite = value is not None and math.isfinite(value)
            by_time.setdefault(when, {})[channel] = value if finite else None
        try:
            readings = [
                ReadingIn.model_validate({"t": when / 1000.0, "values": values})
                for when, values in sorted(by_time.items())
            ]
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            raise PayloadError(f"{stream_id}: {error['msg']}", "malformed") from None
        return [(stream_id, readings)] if readings else []

    @staticmethod
    def gone(topic: sparkplug.Topic) -> Callable[[str], bool]:
        """Which streams a death concerns: a device's own, or every stream of a node (its own
        and its devices')."""
        node = f"{topic.group}.{topic.node}"
        if topic.device is not None:
            device = f"{node}.{topic.device}"
            return lambda stream_id: stream_id == device
        return lambda stream_id: stream_id == node or stream_id.startswith(f"{node}.")

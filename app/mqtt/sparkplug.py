"""Sparkplug B payloads: the part of Eclipse Tahu's `sparkplug_b.proto` (Payload and Metric)
the service reads, built as protobuf classes at import from a descriptor written here (no
generated code to keep in step with the protobuf runtime). Fields the service does not read
(properties, data sets, templates) are skipped by protobuf as unknown fields.

Topics: `spBv1.0/<group>/<NBIRTH|NDATA|NDEATH|DBIRTH|DDATA|DDEATH|NCMD|DCMD|STATE>/<edge node>
[/<device>]`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

NAMESPACE = "spBv1.0"

# Sparkplug B data types (the specification's table 6.4.16) that are numbers.
SIGNED = {1: 8, 2: 16, 3: 32, 4: 64}  # Int8 .. Int64: bits (sent as unsigned two's complement)
UNSIGNED = {5, 6, 7, 8}  # UInt8 .. UInt64
FLOAT, DOUBLE, BOOLEAN = 9, 10, 11
INT64 = 4


def _payload_classes() -> tuple[Any, Any]:
    fields = descriptor_pb2.FieldDescriptorProto
    optional, repeated = fields.LABEL_OPTIONAL, fields.LABEL_REPEATED
    file = descriptor_pb2.FileDescriptorProto(
        name="twinwatch_sparkplug_b.proto",
        package="org.eclipse.tahu.protobuf",
        syntax="proto2",
    )
    payload = file.message_type.add(name="Payload")
    metric = payload.nested_type.add(name="Metric")
    for name, number, kind in (
        ("name", 1, fields.TYPE_STRING),
        ("alias", 2, fields.TYPE_UINT64),
        ("timestamp", 3, fields.TYPE_UINT64),
        ("datatype", 4, fields.TYPE_UINT32),
        ("is_historical", 5, fields.TYPE_BOOL),
        ("is_transient", 6, fields.TYPE_BOOL),
        ("is_null", 7, fields.TYPE_BOOL),
        ("int_value", 10, fields.TYPE_UINT32),
        ("long_value", 11, fields.TYPE_UINT64),
        ("float_value", 12, fields.TYPE_FLOAT),
        ("double_value", 13, fields.TYPE_DOUBLE),
        ("boolean_value", 14, fields.TYPE_BOOL),
        ("string_value", 15, fields.TYPE_STRING),
    ):
        metric.field.add(name=name, number=number, type=kind, label=optional)
    payload.field.add(name="timestamp", number=1, type=fields.TYPE_UINT64, label=optional)
    payload.field.add(
        name="metrics",
        number=2,
        type=fields.TYPE_MESSAGE,
        label=repeated,
        type_name=".org.eclipse.tahu.protobuf.Payload.Metric",
    )
    payload.field.add(name="seq", number=3, type=fields.TYPE_UINT64, label=optional)
    payload.field.add(name="uuid", number=4, type=fields.TYPE_STRING, label=optional)
    payload.field.add(name="body", number=5, type=fields.TYPE_BYTES, label=optional)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    described = pool.FindMessageTypeByName("org.eclipse.tahu.protobuf.Payload")
    outer = message_factory.GetMessageClass(described)
    return outer, message_factory.GetMessageClass(described.nested_types_by_name["Metric"])


Payload, Metric = _payload_classes()


@dataclass(frozen=True)
class Topic:
    """A Sparkplug B topic: its group, message type, edge node and (device messages) device."""

    group: str
    kind: str
    node: str
    device: str | None

    @classmethod
    def parse(cls, topic: str) -> Topic | None:
        """The topic's parts, or None if it is not a Sparkplug B node or device topic."""
        parts = topic.split("/")
        if parts[0] != NAMESPACE or len(parts) not in (4, 5) or not all(parts):
            return None
        return cls(parts[1], parts[2], parts[3], parts[4] if len(parts) == 5 else None)

    @property
    def source(self) -> tuple[str, str, str | None]:
        """What sends under this topic: an edge node, or one of its devices."""
        return (self.group, self.node, self.device)


def number_of(metric: Any, datatype: int = 0) -> float | None:
    """A metric's value as a number if its data type is a number (`datatype`: its birth's,
    for data messages that leave it out); None otherwise (booleans, strings, data sets: not a
    sensor's reading) and for a null value. With no type known, the field that holds a value
    says it."""
    datatype = metric.datatype or datatype
    if metric.is_null:
        return None
    if not datatype:
        for name, kind in (("double_value", DOUBLE), ("float_value", FLOAT)):
            if metric.HasField(name):
                datatype = kind
        if metric.HasField("long_value"):
            datatype = 8
        elif metric.HasField("int_value"):
            datatype = 7
    if datatype in SIGNED:
        bits = SIGNED[datatype]
        raw = metric.long_value if datatype == INT64 else metric.int_value
        raw &= (1 << bits) - 1
        return float(raw - (1 << bits) if raw >> (bits - 1) else raw)
    if datatype in UNSIGNED:
        return float(metric.long_value if datatype == 8 else metric.int_value)
    if datatype == FLOAT:
        return float(metric.float_value)
    if datatype == DOUBLE:
        return float(metric.double_value)
    return None


def encode(
    timestamp_ms: int, metrics: dict[str, float], *, seq: int = 0, birth: bool = False
) -> bytes:
    """A payload of Double metrics by name (births) or by alias (data: each name's position
    in `metrics`, as its birth gave it), for publishers such as `twinwatch twin --mqtt`."""
    payload = Payload(timestamp=timestamp_ms, seq=seq % 256)
    for alias, (name, value) in enumerate(metrics.items()):
        metric = payload.metrics.add(alias=alias, datatype=DOUBLE, timestamp=timestamp_ms)
        if birth:
            metric.name = name
        if math.isnan(value):
            metric.is_null = True
        else:
            metric.double_value = value
    return bytes(payload.SerializeToString())


def rebirth_command(timestamp_ms: int) -> bytes:
    """An NCMD payload asking an edge node to publish its births again."""
    payload = Payload(timestamp=timestamp_ms)
    payload.metrics.add(name="Node Control/Rebirth", datatype=BOOLEAN, boolean_value=True)
    return bytes(payload.SerializeToString())

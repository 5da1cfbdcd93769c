"""Requests of every served API and version, built from kafka-python's copy of Kafka's JSON
specs, their mutations, and an independent reading of what a decoded request may contain.

One generator serves three masters: the unit tests (a deterministic sample with every field
filled, or one field nulled), the property tests (hypothesis drives the `random.Random`, so
examples shrink), and bench.fuzz (a seeded Random, a million frames). Values come from a small
vocabulary (the fuzz topics, a group, partitions 0..2, real record batches) so that requests
reach deep into the handlers instead of stopping at "unknown topic".
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Iterator
from typing import Any

from crc32c import crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from protocol.registry import APIS, ApiSpec

SERVED: list[tuple[ApiSpec, int]] = [
    (spec, v) for spec in APIS.values() for v in range(spec.min_version, spec.max_version + 1)
]


def served_strategy() -> Any:
    """A served (API, version), each API equally likely whatever its number of versions."""
    from hypothesis import strategies as st  # here: bench.fuzz imports this module without it

    return st.sampled_from(list(APIS.values())).flatmap(
        lambda spec: st.tuples(st.just(spec),
                               st.integers(spec.min_version, spec.max_version)))


TOPICS = ["fuzz-a", "fuzz-b", "fuzz-new"]  # fuzz-a and fuzz-b exist on the fuzzed broker
GROUP = "fuzz-group"
CLIENT_ID = b"fuzz"

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}
_DECODES_AS_NONE = frozenset({"string", "bytes", "records"})


def _batch(codec: int, n: int, transactional: bool = False, pid: int = -1) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=transactional, producer_id=pid,
        producer_epoch=0 if pid >= 0 else -1, base_sequence=0 if pid >= 0 else -1,
        batch_size=1 << 20,
    )
    for i in range(n):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v" * 20,
                       headers=[("h", b"x")])
    return bytes(builder.build())


# Plain, every codec, idempotent, transactional: the paths a produce can take.
BATCHES = [_batch(0, 1), _batch(0, 3), _batch(1, 2), _batch(2, 2), _batch(3, 2), _batch(4, 2),
           _batch(0, 2, pid=7), _batch(0, 1, transactional=True, pid=8)]
_CRC_AT, _CRC_FROM, _LENGTH_AT = 17, 21, 8


def mutate_batch(batch: bytes, rnd: random.Random) -> bytes:
    """A batch edited after its CRC field, then given a correct CRC (and mostly a correct
    length): it passes the checksum, so what lies behind it (codec bits, counts, records,
    compressed payloads) gets parsed."""
    head, tail = batch[:_CRC_FROM], mutate(batch[_CRC_FROM:], rnd)
    data = bytearray(head + tail)
    if rnd.random() < .8:
        struct.pack_into(">i", data, _LENGTH_AT, len(data) - 12)
    struct.pack_into(">I", data, _CRC_AT, crc32c(bytes(data[_CRC_FROM:])))
    return bytes(data)


class Builder:
    """Fills a request from its schema. With `rnd` None: a deterministic sample, every field
    present (tagged ones too), one element per array, nulls only where `null_rate` is 1;
    `overrides` then replaces the value at a path such as ("topic_data", "[]", "name")."""

    def __init__(self, rnd: random.Random | None = None, null_rate: float = 0.05,
                 overrides: dict[tuple[str, ...], Any] | None = None) -> None:
        self.rnd = rnd
        self.null_rate = null_rate
        self.overrides = overrides or {}

    def _null(self) -> bool:
        if self.rnd is None:
            return self.null_rate >= 1
        return self.rnd.random() < self.null_rate

    def message(self, cls: Any, version: int) -> Any:
        return cls(version=version, **self._fields(cls._struct.fields.values(), version, ()))

    def _fields(self, fields: Any, version: int, path: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in fields:
            if not field.for_version_q(version):
                continue
            here = (*path, field.name)
            if here in self.overrides:
                out[field.name] = self.overrides[here]
            elif field.tagged_field_q(version) and self.rnd is not None and self.rnd.random() < .5:
                continue  # an absent tagged field
            else:
                out[field.name] = self._value(field, version, here)
        return out

    def _value(self, field: Any, version: int, path: tuple[str, ...]) -> Any:
        if field.nullable_for_version_q(version) and self._null():
            return None
        if field.is_struct_array():
            return [field.data_class(**self._fields(field.fields.values(), version, (*path, "[]")))
                    for _ in range(self._count())]
        if field.is_array():
            elem = field.array_of.type_str
            return [self._scalar(elem, field.name) for _ in range(self._count())]
        if field.is_struct():
            return field.data_class(**self._fields(field.fields.values(), version, path))
        return self._scalar(field.type_str, field.name)

    def _count(self) -> int:
        return 1 if self.rnd is None else self.rnd.choice((0, 1, 1, 1, 2, 3))

    def _scalar(self, type_str: str, name: str) -> Any:
        rnd = self.rnd
        if type_str in _INT_RANGES:
            lo, hi = _INT_RANGES[type_str]
            if rnd is None:
                return 0
            pick = rnd.random()
            if pick < .6:
                return rnd.choice((0, 0, 1, 2, -1)) if lo < 0 else rnd.choice((0, 1, 2))
            if pick < .8:
                return rnd.choice([x for x in (lo, hi, 100, 1000, 30000) if x <= hi])
            return rnd.randint(lo, hi)
        if type_str == "bool":
            return False if rnd is None else rnd.random() < .5
        if type_str == "float64":
            return 0.0 if rnd is None else rnd.random()
        if type_str == "uuid":
            if rnd is None:
                return uuid.UUID(int=1)
            # The zero UUID is Kafka's "no id" and decodes as None (drawn above already).
            return rnd.choice((None, uuid.UUID(int=rnd.getrandbits(128) or 1)))
        if type_str == "string":
            return self._string(name)
        if type_str == "records":
            if rnd is None:
                return BATCHES[0]
            pick = rnd.random()
            if pick < .7:
                return rnd.choice(BATCHES)
            if pick < .9:
                return mutate_batch(rnd.choice(BATCHES), rnd)
            if pick < .95:
                return rnd.choice(BATCHES) + rnd.choice(BATCHES)
            return rnd.randbytes(rnd.randint(0, 80))
        if type_str == "bytes":
            return b"\x00\x01" if rnd is None else rnd.randbytes(rnd.randint(0, 24))
        raise ValueError(f"no generator for {type_str} ({name})")

    def _string(self, name: str) -> str:
        rnd = self.rnd
        if "topic" in name or name in ("name", "resource_name", "coordinator_keys"):
            vocab = TOPICS
        elif "group" in name or name == "key":
            vocab = [GROUP]
        elif "member" in name or "instance" in name:
            vocab = ["", "member-1"]
        else:
            vocab = ["", "range", "consumer", "cleanup.policy", "retention.ms", "fuzz"]
        if rnd is None:
            return vocab[0]
        if rnd.random() < .9:
            return rnd.choice(vocab)
        return "".join(rnd.choice("abcxyz-._é") for _ in range(rnd.randint(0, 12)))


# -- mutations -----------------------------------------------------------------------------------

_LENGTHS16 = [-1, -2, -32768, 0, 1, 0x7FFF]
_LENGTHS32 = [-1, -2, -(1 << 31), 0, 1, 0x7FFFFFFF, 1 << 20]


def mutate(body: bytes, rnd: random.Random, rounds: int | None = None) -> bytes:
    """A few edits of an encoded body, leaning towards the ones decoders get wrong: length
    fields set to -1 or other negatives (int16, int32, a compact 0), then bytes, bits, cuts."""
    data = bytearray(body)
    for _ in range(rounds if rounds is not None else rnd.choice((1, 1, 1, 2, 3))):
        n = len(data)
        kind = rnd.random()
        at = rnd.randrange(n) if n else 0
        if kind < .25 and n >= 2:
            at = min(at, n - 2)
            struct.pack_into(">h", data, at, rnd.choice(_LENGTHS16))
        elif kind < .45 and n >= 4:
            at = min(at, n - 4)
            struct.pack_into(">i", data, at, rnd.choice(_LENGTHS32))
        elif kind < .55 and n:
            data[at] = rnd.choice((0, 0xFF, 0x80, 1))  # compact null, varint continuation
        elif kind < .7 and n:
            data[at] = rnd.randrange(256)
        elif kind < .8 and n:
            data[at] ^= 1 << rnd.randrange(8)
        elif kind < .85:
            del data[at:]
        elif kind < .9:
            data[at:at] = rnd.randbytes(rnd.randint(1, 6))
        elif kind < .95:
            del data[at:at + rnd.randint(1, 6)]
        else:
            data += rnd.randbytes(rnd.randint(1, 16))
    return bytes(data)


MAX_PARTITIONS = 16
_CREATE_TOPICS, _CREATE_PARTITIONS = 19, 37


def floods_partitions(spec: ApiSpec, version: int, body: bytes) -> bool:
    """A CreateTopics or CreatePartitions asking for more than MAX_PARTITIONS partitions: the
    broker creates every one of them on its event loop, so fuzzers leave these out."""
    if spec.key not in (_CREATE_TOPICS, _CREATE_PARTITIONS):
        return False
    try:
        message = spec.request.decode(body, version=version)
        counts = [t.num_partitions if spec.key == _CREATE_TOPICS else t.count
                  for t in message.topics or ()]
    except Exception:  # noqa: BLE001 - the broker refuses what does not decode
        return False
    return any(c > MAX_PARTITIONS for c in counts)


def request_frame(spec: ApiSpec, version: int, body: bytes, correlation_id: int) -> bytes:
    """Size prefix, request header v1 (v2 when flexible) and the body."""
    header = struct.pack(">hhih", spec.key, version, correlation_id, len(CLIENT_ID)) + CLIENT_ID
    if spec.flexible(version):
        header += b"\x00"
    return struct.pack(">i", len(header) + len(body)) + header + body


# -- an independent reading of a decoded request -------------------------------------------------


def null_paths(cls: Any, version: int) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every place where a null breaks the schema at `version`: (path, "field" | "element").
    Paths go through the first element of arrays, as the deterministic sample has one."""
    yield from _null_paths(cls._struct.fields.values(), version, ())


def _null_paths(fields: Any, version: int, path: tuple[str, ...]
                ) -> Iterator[tuple[tuple[str, ...], str]]:
    for field in fields:
        if not field.for_version_q(version):
            continue
        here = (*path, field.name)
        nullable = field.nullable_for_version_q(version) or (
            field.tagged_field_q(version) and field.default is None)
        if field.is_struct_array():
            if not nullable:
                yield here, "field"
            yield from _null_paths(field.fields.values(), version, (*here, "[]"))
        elif field.is_array():
            if not nullable:
                yield here, "field"
            if field.array_of.type_str in _DECODES_AS_NONE:
                yield here, "element"
        elif field.is_struct():
            yield from _null_paths(field.fields.values(), version, here)
        elif field.type_str in _DECODES_AS_NONE and not nullable:
            yield here, "field"


# Records may come back as a view into the request's frame (Produce's own decoder: no copy).
_TYPES: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(_INT_RANGES, int), "bool": bool, "float64": float, "string": str,
    "bytes": bytes, "records": (bytes, memoryview), "uuid": uuid.UUID,
}


def problems(message: Any, version: int) -> list[tuple[str, str]]:
    """What a handler could trip on in a decoded message: ("null", path) where the schema says
    never null, ("type", path) where a value is not what its type promises, ("version", path)
    where a field outside `version` holds a value. Walks everything, plans nothing."""
    out: list[tuple[str, str]] = []
    _walk(message, message._struct.fields.values(), version, "", out)
    return out


def _walk(obj: Any, fields: Any, version: int, path: str, out: list[tuple[str, str]]) -> None:
    for field in fields:
        name = path + field.name
        if not field.for_version_q(version):
            try:
                object.__getattribute__(obj, field.name)
            except AttributeError:
                continue
            out.append(("version", name))
            continue
        value = getattr(obj, field.name)
        if value is None:
            if not (field.nullable_for_version_q(version) or field.type_str == "uuid"
                    or (field.tagged_field_q(version) and field.default is None)):
                out.append(("null", name))
            continue
        if field.is_struct_array():
            if not isinstance(value, list):
                out.append(("type", name))
                continue
            for item in value:
                _walk(item, field.fields.values(), version, name + "[].", out)
        elif field.is_array():
            if not isinstance(value, list):
                out.append(("type", name))
                continue
            expected = _TYPES[field.array_of.type_str]
            for item in value:
                if item is None:
                    out.append(("null", name + "[]"))
                elif not isinstance(item, expected):
                    out.append(("type", name + "[]"))
        elif field.is_struct():
            _walk(value, field.fields.values(), version, name + ".", out)
        else:
            expected = _TYPES[field.type_str]
            if not isinstance(value, expected):
                out.append(("type", name))
            elif field.type_str in _INT_RANGES:
                lo, hi = _INT_RANGES[field.type_str]
                if not lo <= value <= hi:
                    out.append(("type", name))


def as_tree(message: Any, version: int) -> dict[str, Any]:
    """The in-version fields of a message as plain dicts and lists, to compare two messages."""
    return _tree(message, message._struct.fields.values(), version)


def _tree(obj: Any, fields: Any, version: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in fields:
        if not field.for_version_q(version):
            continue
        value = getattr(obj, field.name)
        if value is not None and field.is_struct_array():
            value = [_tree(item, field.fields.values(), version) for item in value]
        elif value is not None and field.is_struct():
            value = _tree(value, field.fields.values(), version)
        out[field.name] = value
    return out

"""Produce's request decoder, written out by hand for the versions the broker serves (3-11).

Every produce goes through here, so it earns its own decoder: kafka-python's generic one copies
each partition's records into new bytes, and Log.append then assigns offsets in the copy. Here
``records`` is a memoryview into the request's frame (writable when the frame is an owned
bytearray), so offsets can be assigned in place with no copy at all.

The result is kafka-python's own ProduceRequest, field for field what its decoder builds (same
classes, same None for a negative length, the same leniency on lengths past the end), so the
schema checks of protocol/validate.py and every handler see exactly what they saw before. A
request carrying tagged fields (none are defined for Produce up to v11) is handed to kafka-python's
decoder whole, which keeps them as it always did.
"""

from __future__ import annotations

import struct
from typing import Any

from kafka.protocol.producer import ProduceRequest

_TopicData = ProduceRequest.TopicProduceData
_PartitionData = _TopicData.PartitionProduceData
_FIRST_FLEXIBLE = 9
MIN_VERSION, MAX_VERSION = 3, 11  # what the hand-written layouts cover

_new = object.__new__
_INT16 = struct.Struct(">h").unpack_from
_INT32 = struct.Struct(">i").unpack_from
_ACKS_TIMEOUT_COUNT = struct.Struct(">hii").unpack_from
_ACKS_TIMEOUT = struct.Struct(">hi").unpack_from
_INDEX_LENGTH = struct.Struct(">ii").unpack_from


class _TaggedFields(Exception):
    """The request carries tagged fields: kafka-python's decoder keeps them."""


def decode_produce(data: memoryview, version: int) -> Any:
    """The ProduceRequest in ``data`` (the body after the header) at ``version``."""
    if version >= _FIRST_FLEXIBLE:
        try:
            return _decode_flexible(data, version)
        except _TaggedFields:
            return ProduceRequest.decode(data, version=version)
    return _decode_classic(data, version)


def _message(cls: type, version: int) -> Any:
    obj = _new(cls)
    obj._version = version
    obj.tags = None
    obj.unknown_tags = None
    return obj


def _decode_classic(data: memoryview, version: int) -> Any:
    (n,) = _INT16(data, 0)
    pos = 2
    if n < 0:
        tid = None
    else:
        tid = str(data[pos:pos + n], "utf-8")
        pos += n
    acks, timeout_ms, count = _ACKS_TIMEOUT_COUNT(data, pos)
    pos += 10
    request = _message(ProduceRequest, version)
    request.transactional_id = tid
    request.acks = acks
    request.timeout_ms = timeout_ms
    if count == -1:
        request.topic_data = None
        return request
    topics = []
    for _ in range(count):
        topic = _message(_TopicData, version)
        (n,) = _INT16(data, pos)
        pos += 2
        if n < 0:
            topic.name = None
        else:
            topic.name = str(data[pos:pos + n], "utf-8")
            pos += n
        (pcount,) = _INT32(data, pos)
        pos += 4
        if pcount == -1:
            topic.partition_data = None
        else:
            partitions = []
            for _ in range(pcount):
                p = _message(_PartitionData, version)
                p.index, n = _INDEX_LENGTH(data, pos)
                pos += 8
                if n < 0:
                    p.records = None
                else:
                    p.records = data[pos:pos + n]
                    pos += n
                partitions.append(p)
            topic.partition_data = partitions
        topics.append(topic)
    request.topic_data = topics
    return request


def _uvarint(data: memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint (as kafka-python reads it: no limit on its length)."""
    b = data[pos]
    pos += 1
    if not b & 0x80:
        return b, pos
    value = b & 0x7F
    shift = 7
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _no_tags(data: memoryview, pos: int) -> int:
    if data[pos] != 0:
        raise _TaggedFields
    return pos + 1


def _decode_flexible(data: memoryview, version: int) -> Any:
    n, pos = _uvarint(data, 0)
    n -= 1
    if n < 0:
        tid = None
    else:
        tid = str(data[pos:pos + n], "utf-8")
        pos += n
    acks, timeout_ms = _ACKS_TIMEOUT(data, pos)
    count, pos = _uvarint(data, pos + 6)
    count -= 1
    request = _message(ProduceRequest, version)
    request.transactional_id = tid
    request.acks = acks
    request.timeout_ms = timeout_ms
    if count == -1:
        request.topic_data = None
    else:
        topics = []
        for _ in range(count):
            topic = _message(_TopicData, version)
            n, pos = _uvarint(data, pos)
            n -= 1
            if n < 0:
                topic.name = None
            else:
                topic.name = str(data[pos:pos + n], "utf-8")
                pos += n
            pcount, pos = _uvarint(data, pos)
            pcount -= 1
            if pcount == -1:
                topic.partition_data = None
            else:
                partitions = []
                for _ in range(pcount):
                    p = _message(_PartitionData, version)
                    (p.index,) = _INT32(data, pos)
                    n, pos = _uvarint(data, pos + 4)
                    n -= 1
                    if n < 0:
                        p.records = None
                    else:
                        p.records = data[pos:pos + n]
                        pos += n
                    pos = _no_tags(data, pos)
                    partitions.append(p)
                topic.partition_data = partitions
            pos = _no_tags(data, pos)
            topics.append(topic)
        request.topic_data = topics
    _no_tags(data, pos)
    return request


class ProduceRequestCodec(ProduceRequest, init=False):
    """kafka-python's ProduceRequest with the hand-written decoder for the served versions;
    building and encoding requests (tests, tools) are kafka-python's, unchanged."""

    _VERSIONS: dict[int, type] = {}  # its own versioned classes, not ProduceRequest's

    @classmethod
    def decode(cls, data: Any, version: int | None = None, **kwargs: Any) -> Any:
        if kwargs or version is None or not MIN_VERSION <= version <= MAX_VERSION:
            return ProduceRequest.decode(data, version=version, **kwargs)
        return decode_produce(data if isinstance(data, memoryview) else memoryview(data),
                              version)

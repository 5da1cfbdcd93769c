"""Responses encoded from a fixed layout instead of through kafka-python's generic encoder.

The common Produce answer (one topic, one partition, no record errors, no message) has the same
bytes every time except the topic name and five numbers: it is packed with one struct call
after the topic's encoded name (cached). The bytes are those kafka-python encodes for the same
response, at every served version (tests/unit/test_templates.py compares them). The object
still reads as a ProduceResponse (``responses``, ``to_message``) for tests and tools.
"""

from __future__ import annotations

import struct
from typing import Any

from kafka.protocol.producer import ProduceResponse

_TopicResponse = ProduceResponse.TopicProduceResponse
_PartitionResponse = _TopicResponse.PartitionProduceResponse
_FIRST_FLEXIBLE = 9
_MAX_NAMES = 4096  # encoded topic names kept per layout; cleared when full

# After the topic name: partition count 1, the partition, then the rest, per version range.
# (Record errors: an empty array; error message: null; tagged fields: none; throttle: 0.)
_CLASSIC_V3 = struct.Struct(">iihqqi")  # 1, index, error, base, append time | throttle
_CLASSIC_V5 = struct.Struct(">iihqqqi")  # ... log start offset | throttle
_CLASSIC_V8 = struct.Struct(">iihqqqihi")  # ... record errors 0, message -1 | throttle
_FLEXIBLE = struct.Struct(">BihqqqBBBBiB")  # compact counts, null message, tags 0 | throttle


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_heads: dict[bool, dict[str, bytes]] = {False: {}, True: {}}


def _head(topic: str, flexible: bool) -> bytes:
    """Topic count 1 and the topic's name, encoded for the layout."""
    names = _heads[flexible]
    head = names.get(topic)
    if head is None:
        raw = topic.encode("utf-8")
        if flexible:
            head = b"\x02" + _uvarint(len(raw) + 1) + raw
        else:
            head = b"\x00\x00\x00\x01" + struct.pack(">h", len(raw)) + raw
        if len(names) >= _MAX_NAMES:
            names.clear()
        names[topic] = head
    return head


class SinglePartitionProduceResponse:
    """A Produce response for one partition of one topic, with no record errors or message."""

    __slots__ = ("topic", "index", "error_code", "base_offset", "log_append_time_ms",
                 "log_start_offset")
    throttle_time_ms = 0

    def __init__(self, topic: str, index: int, error_code: int, base_offset: int,
                 log_append_time_ms: int, log_start_offset: int) -> None:
        self.topic = topic
        self.index = index
        self.error_code = error_code
        self.base_offset = base_offset
        self.log_append_time_ms = log_append_time_ms
        self.log_start_offset = log_start_offset

    def encode(self, version: int) -> bytes:
        if version >= _FIRST_FLEXIBLE:
            return _head(self.topic, True) + _FLEXIBLE.pack(
                2, self.index, self.error_code, self.base_offset, self.log_append_time_ms,
                self.log_start_offset, 1, 0, 0, 0, 0, 0)
        head = _head(self.topic, False)
        if version >= 8:
            return head + _CLASSIC_V8.pack(
                1, self.index, self.error_code, self.base_offset, self.log_append_time_ms,
                self.log_start_offset, 0, -1, 0)
        if version >= 5:
            return head + _CLASSIC_V5.pack(
                1, self.index, self.error_code, self.base_offset, self.log_append_time_ms,
                self.log_start_offset, 0)
        return head + _CLASSIC_V3.pack(
            1, self.index, self.error_code, self.base_offset, self.log_append_time_ms, 0)

    def to_message(self) -> ProduceResponse:
        """The same response as kafka-python's message."""
        partition = _PartitionResponse(
            index=self.index, error_code=self.error_code, base_offset=self.base_offset,
            log_append_time_ms=self.log_append_time_ms, log_start_offset=self.log_start_offset,
            record_errors=[], error_message=None)
        return ProduceResponse(
            responses=[_TopicResponse(name=self.topic, partition_responses=[partition])],
            throttle_time_ms=0)

    @property
    def responses(self) -> Any:
        return self.to_message().responses

    @staticmethod
    def decode(data: Any, version: int) -> ProduceResponse:
        """What a client reads from these bytes: kafka-python's ProduceResponse."""
        return ProduceResponse.decode(data, version=version)


# Responses whose encode() is their own (the request channel encodes any of these as it
# encodes an ApiMessage).
TEMPLATES = (SinglePartitionProduceResponse,)

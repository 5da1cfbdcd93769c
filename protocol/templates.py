"""Responses encoded from a fixed layout instead of through kafka-python's generic encoder.

The common Produce answer (one topic, one partition, no record errors, no message) has the same
bytes every time except the topic name and five numbers: it is packed with one struct call
after the topic's encoded name (cached). The bytes are those kafka-python encodes for the same
response, at every served version (tests/unit/test_templates.py compares them). The object
still reads as a ProduceResponse (``responses``, ``to_message``) for tests and tools.
"""

from __future__ import annotations

import array
import struct
import sys
from typing import Any

from kafka.protocol.consumer import FetchResponse
from kafka.protocol.metadata import MetadataResponse
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


# -- Fetch -----------------------------------------------------------------------------------------

_FETCH_FIRST_FLEXIBLE = 12
_FETCH_FIRST_TOPIC_ID = 13
_INT32 = struct.Struct(">i")
_ABORTED_CLASSIC = struct.Struct(">qq")
_ABORTED_FLEXIBLE = struct.Struct(">qqB")  # producer id, first offset, no tagged fields
_ZERO_TOPIC_ID = b"\x00" * 16
_FetchTopicResponse = FetchResponse.FetchableTopicResponse
_FetchPartitionData = _FetchTopicResponse.PartitionData
_AbortedTransaction = _FetchPartitionData.AbortedTransaction

#: One partition of a Fetch answer: index, error, high watermark, last stable offset, log start
#: offset, aborted transactions ((producer id, first offset) pairs, or None), records.
FetchPartition = tuple[int, int, int, int, int, "list[tuple[int, int]] | None",
                       "bytes | memoryview | None"]


class _FetchLayout:
    """The fixed parts of one Fetch version: the response's head and each partition's fields
    up to its aborted transactions (and, when those are null, up to its records' length)."""

    __slots__ = ("flexible", "topic_ids", "head", "log_start", "partition",
                 "partition_null_aborted", "null_aborted_tail", "preferred", "names")

    def __init__(self, version: int) -> None:
        self.flexible = version >= _FETCH_FIRST_FLEXIBLE
        self.topic_ids = version >= _FETCH_FIRST_TOPIC_ID
        self.head = struct.Struct(">ihi" if version >= 7 else ">i")  # throttle[, error, session]
        self.log_start = version >= 5
        fixed = ">ihqq" + ("q" if self.log_start else "")  # index, error, hw, lso[, log start]
        self.preferred = version >= 11
        self.partition = struct.Struct(fixed)
        # The same, then a null aborted list and the preferred read replica (-1).
        self.partition_null_aborted = struct.Struct(
            fixed + ("B" if self.flexible else "i") + ("i" if self.preferred else ""))
        self.null_aborted_tail = ((0 if self.flexible else -1),) + ((-1,) if self.preferred else ())
        self.names: dict[Any, bytes] = {}  # a topic's encoded name or id

    def topic(self, key: Any) -> bytes:
        """The topic's name (or id from v13), encoded; cached."""
        head = self.names.get(key)
        if head is None:
            if self.topic_ids:
                head = _ZERO_TOPIC_ID if key is None else key.bytes
            elif key is None:
                head = b"\x00" if self.flexible else b"\xff\xff"
            else:
                raw = key.encode("utf-8")
                head = (_uvarint(len(raw) + 1) if self.flexible
                        else struct.pack(">h", len(raw))) + raw
            if len(self.names) >= _MAX_NAMES:
                self.names.clear()
            self.names[key] = head
        return head


_fetch_layouts: dict[int, _FetchLayout] = {}


def _fetch_layout(version: int) -> _FetchLayout:
    layout = _fetch_layouts.get(version)
    if layout is None:
        layout = _fetch_layouts[version] = _FetchLayout(version)
    return layout


class PackedFetchResponse:
    """A Fetch response packed from its version's fixed layout: no tagged fields, no diverging
    epoch, no preferred read replica (-1), which is every answer this broker gives.

    ``encode`` gives bytes when no partition has records (the long poll's expiry: the common
    idle answer), else a gather list: the fixed parts, and each partition's records as they
    were read (never copied into an encode buffer). The bytes are those kafka-python encodes
    for ``to_message()`` (tests/unit/test_templates.py compares them at every served version).
    Reading ``responses`` turns it into that message for good (so code that edits the answer's
    entries edits what is sent).
    """

    __slots__ = ("error_code", "session_id", "topics", "by_id", "_message")
    throttle_time_ms = 0

    def __init__(self, error_code: int, session_id: int,
                 topics: list[tuple[Any, list[FetchPartition]]], *, by_id: bool) -> None:
        self.error_code = error_code
        self.session_id = session_id
        self.topics = topics  # (topic name, or id when by_id; its partitions), in answer order
        self.by_id = by_id  # v13 and later name topics by id
        self._message: FetchResponse | None = None

    def encode(self, version: int) -> bytes | list[bytes | memoryview]:
        if self._message is not None:
            return self._message.encode(version=version)
        layout = _fetch_layout(version)
        flexible = layout.flexible
        parts: list[bytes | memoryview] = []
        out = bytearray(layout.head.pack(0, self.error_code, self.session_id)
                        if version >= 7 else layout.head.pack(0))
        topics = self.topics
        out += _uvarint(len(topics) + 1) if flexible else _INT32.pack(len(topics))
        for key, partitions in topics:
            out += layout.topic(key)
            out += _uvarint(len(partitions) + 1) if flexible else _INT32.pack(len(partitions))
            for index, error, hw, lso, log_start, aborted, records in partitions:
                fields = ((index, error, hw, lso, log_start) if layout.log_start
                          else (index, error, hw, lso))
                if aborted is None:
                    out += layout.partition_null_aborted.pack(*fields, *layout.null_aborted_tail)
                else:
                    out += layout.partition.pack(*fields)
                    _pack_aborted(out, aborted, flexible)
                    if layout.preferred:
                        out += b"\xff\xff\xff\xff"
                if records is None:
                    out += b"\x00" if flexible else b"\xff\xff\xff\xff"
                else:
                    n = len(records)
                    out += _uvarint(n + 1) if flexible else _INT32.pack(n)
                    if n:
                        parts.append(bytes(out))
                        parts.append(records)
                        out = bytearray()
                if flexible:
                    out += b"\x00"  # the partition's tagged fields
            if flexible:
                out += b"\x00"  # the topic's tagged fields
        if flexible:
            out += b"\x00"  # the response's tagged fields
        if not parts:
            return bytes(out)
        if out:
            parts.append(bytes(out))
        return parts

    def to_message(self) -> FetchResponse:
        """The same response as kafka-python's message."""
        responses = []
        for key, partitions in self.topics:
            data = [_FetchPartitionData(
                partition_index=index, error_code=error, high_watermark=hw,
                last_stable_offset=lso, log_start_offset=log_start,
                aborted_transactions=None if aborted is None else [
                    _AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in aborted],
                preferred_read_replica=-1, records=records)
                for index, error, hw, lso, log_start, aborted, records in partitions]
            if self.by_id:
                responses.append(_FetchTopicResponse(topic_id=key, partitions=data))
            else:
                responses.append(_FetchTopicResponse(topic=key, partitions=data))
        return FetchResponse(throttle_time_ms=0, error_code=self.error_code,
                             session_id=self.session_id, responses=responses)

    @property
    def materialized(self) -> bool:
        """Whether the answer is kafka-python's message now (its entries may have changed)."""
        return self._message is not None

    @property
    def message(self) -> FetchResponse:
        """kafka-python's message, kept: from now on it is what ``encode`` sends."""
        if self._message is None:
            self._message = self.to_message()
        return self._message

    @property
    def responses(self) -> Any:
        return self.message.responses

    @staticmethod
    def decode(data: Any, version: int) -> FetchResponse:
        """What a client reads from these bytes (or parts): kafka-python's FetchResponse."""
        if type(data) is list:
            data = b"".join(data)
        return FetchResponse.decode(data, version=version)


def _pack_aborted(out: bytearray, aborted: list[tuple[int, int]], flexible: bool) -> None:
    if flexible:
        out += _uvarint(len(aborted) + 1)
        for pid, first in aborted:
            out += _ABORTED_FLEXIBLE.pack(pid, first, 0)
    else:
        out += _INT32.pack(len(aborted))
        for pid, first in aborted:
            out += _ABORTED_CLASSIC.pack(pid, first)


# -- Metadata ------------------------------------------------------------------------------------

_METADATA_FIRST_FLEXIBLE = 9
_MetadataTopic = MetadataResponse.MetadataResponseTopic
_METADATA_TOPIC_STRUCT = MetadataResponse._struct.fields["topics"].array_of
_MAX_METADATA_FRAMES = 64


def metadata_topic_bytes(topic: Any, version: int) -> bytes:
    """One topic of a Metadata answer at ``version``: the bytes kafka-python encodes for it as
    an element of the answer's topics array (an array is its count, then its elements)."""
    flexible = version >= _METADATA_FIRST_FLEXIBLE
    return _METADATA_TOPIC_STRUCT.encode(topic, version=version, compact=flexible,
                                         tagged=flexible)


_METADATA_PARTITION_STRUCT = _METADATA_TOPIC_STRUCT.fields["partitions"].array_of


def _split_at(struct: Any, item: Any, array: str, version: int) -> tuple[bytes, bytes]:
    """``item`` (whose ``array`` field is empty) encoded, split around that empty array."""
    flexible = version >= _METADATA_FIRST_FLEXIBLE
    encoded = struct.encode(item, version=version, compact=flexible, tagged=flexible)
    head = 0
    for f in struct.untagged_fields(version):
        if f.name == array:
            break
        head += len(f.encode(getattr(item, f.name), version=version, compact=flexible,
                             tagged=flexible))
    return encoded[:head], encoded[head + (1 if flexible else 4):]


def metadata_topic_of_like_partitions(topic: Any, around: tuple[bytes, bytes], count: int,
                                      version: int) -> bytes:
    """A topic whose ``count`` partitions differ only in their index (0 .. count-1), as every
    partition led by a single broker does: ``topic`` without partitions, ``around`` the bytes
    of each partition before and after its index (metadata_partition_around). The bytes of
    metadata_topic_bytes for the topic with all of them; the indexes are written into the
    repeated partition as big-endian int32 columns, in C, not one partition at a time."""
    head, tail = _split_at(_METADATA_TOPIC_STRUCT, topic, "partitions", version)
    flexible = version >= _METADATA_FIRST_FLEXIBLE
    before, after = around
    width = len(before) + 4 + len(after)
    body = bytearray((before + b"\x00\x00\x00\x00" + after) * count)
    indexes = array.array("i", range(count))
    if indexes.itemsize == 4:
        if sys.byteorder == "little":
            indexes.byteswap()
        raw = indexes.tobytes()
        for k in range(4):
            body[len(before) + k::width] = raw[k::4]
    else:  # no 4-byte C int: one index at a time
        for i in range(count):
            _INT32.pack_into(body, i * width + len(before), i)
    count_bytes = _uvarint(count + 1) if flexible else _INT32.pack(count)
    return b"".join((head, count_bytes, body, tail))


def metadata_partition_around(partition: Any, version: int) -> tuple[bytes, bytes]:
    """A partition's bytes before and after its index (the int32 after the int16 error)."""
    one = metadata_partition_bytes(partition, version)
    return one[:2], one[6:]


def metadata_partition_bytes(partition: Any, version: int) -> bytes:
    flexible = version >= _METADATA_FIRST_FLEXIBLE
    return _METADATA_PARTITION_STRUCT.encode(partition, version=version, compact=flexible,
                                             tagged=flexible)


class MetadataTopics:
    """Topics of a Metadata answer, encoded: one topic, or a run of topics encoded together.

    Subclasses keep their bytes per version (a topic's piece changes only when the topic
    does); this one encodes kafka-python's messages each time, for the answers that are not
    worth keeping (errors, authorized operations asked)."""

    __slots__ = ("topics",)

    def __init__(self, topics: list[Any]) -> None:
        self.topics = topics

    @property
    def count(self) -> int:
        """How many topics of the answer these are."""
        return len(self.topics)

    def encoded(self, version: int) -> bytes:
        return b"".join(metadata_topic_bytes(t, version) for t in self.topics)

    def messages(self) -> list[Any]:
        """The topics as kafka-python's MetadataResponseTopic messages (new ones each time)."""
        return self.topics

    def count_errors(self, errors: dict[int, int]) -> None:
        """Add each error code of these topics (and their partitions) to ``errors``."""
        for t in self.topics:
            code = t.error_code
            if code:
                errors[code] = errors.get(code, 0) + 1
            for p in t.partitions or ():
                code = p.error_code
                if code:
                    errors[code] = errors.get(code, 0) + 1


_metadata_frames: dict[tuple[Any, ...], tuple[bytes, bytes]] = {}


def _metadata_frame(fields: dict[str, Any], version: int) -> tuple[bytes, bytes]:
    """The answer's bytes before its topics array and after it, as kafka-python encodes an
    answer with these fields (kept: a broker answers with few different ones)."""
    key = (version, *((k, repr(v)) for k, v in sorted(fields.items())))
    frame = _metadata_frames.get(key)
    if frame is None:
        flexible = version >= _METADATA_FIRST_FLEXIBLE
        empty = MetadataResponse(**fields, topics=[]).encode(version=version)
        head = 0
        for f in MetadataResponse._struct.untagged_fields(version):
            if f.name == "topics":
                break
            head += len(f.encode(fields[f.name], version=version, compact=flexible,
                                 tagged=flexible))
        count = 1 if flexible else 4  # the empty array's count
        frame = (empty[:head], empty[head + count:])
        if len(_metadata_frames) >= _MAX_METADATA_FRAMES:
            _metadata_frames.clear()
        _metadata_frames[key] = frame
    return frame


class PackedMetadataResponse:
    """A Metadata response assembled from topics already encoded (MetadataTopics pieces, kept
    by the broker per topic and version) between the answer's own head and tail.

    ``encode`` gives a gather list: the head with the topics' count, each piece as kept (never
    copied into an encode buffer), the tail. The bytes are those kafka-python encodes for
    ``to_message()`` (tests/unit/test_templates.py compares them at every served version).
    ``fields`` are the answer's fields but its topics (brokers, cluster id, controller ...).
    """

    __slots__ = ("fields", "pieces", "_message")
    throttle_time_ms = 0
    message_type = MetadataResponse

    def __init__(self, fields: dict[str, Any], pieces: list[MetadataTopics]) -> None:
        self.fields = fields
        self.pieces = pieces
        self._message: MetadataResponse | None = None

    def encode(self, version: int) -> bytes | list[bytes]:
        if self._message is not None:
            return self._message.encode(version=version)
        head, tail = _metadata_frame(self.fields, version)
        n = sum(piece.count for piece in self.pieces)
        count = (_uvarint(n + 1) if version >= _METADATA_FIRST_FLEXIBLE else _INT32.pack(n))
        parts = [head + count]
        parts.extend(piece.encoded(version) for piece in self.pieces)
        parts.append(tail)
        return parts

    def to_message(self) -> MetadataResponse:
        """The same response as kafka-python's message."""
        return MetadataResponse(**self.fields, topics=[
            t for piece in self.pieces for t in piece.messages()])

    def count_errors(self, errors: dict[int, int]) -> None:
        """The metrics' error count, without building the message."""
        if self._message is not None:
            MetadataTopics(self._message.topics).count_errors(errors)
            return
        for piece in self.pieces:
            piece.count_errors(errors)

    @property
    def message(self) -> MetadataResponse:
        """kafka-python's message, kept: from now on it is what ``encode`` sends."""
        if self._message is None:
            self._message = self.to_message()
        return self._message

    @property
    def topics(self) -> Any:
        return self.message.topics

    @property
    def brokers(self) -> Any:
        return self.fields["brokers"]

    @staticmethod
    def decode(data: Any, version: int) -> MetadataResponse:
        """What a client reads from these bytes (or parts): kafka-python's MetadataResponse."""
        if type(data) is list:
            data = b"".join(data)
        return MetadataResponse.decode(data, version=version)


# Responses whose encode() is their own (the request channel encodes any of these as it
# encodes an ApiMessage).
TEMPLATES = (SinglePartitionProduceResponse, PackedFetchResponse, PackedMetadataResponse)

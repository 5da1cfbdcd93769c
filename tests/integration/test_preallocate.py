"""preallocate and log.preallocate on a real broker: the active segment's file is
segment.bytes long, a rolled or cleanly closed one is cut to its data, and a SIGKILLed broker
with a preallocated (zero-filled) tail comes back with every acknowledged record and nothing
more, then appends right after them."""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import Any

from tests.integration.test_restart import _produce_until_killed
from tests.support.broker import BrokerProcess
from tests.support.clients import (
    assert_roundtrip,
    confluent_consume,
    confluent_produce,
    create_topic,
    numbered,
    segment_files,
    unique_topic,
    watermarks,
)

SEGMENT = 65536


def _data_ends(b: BrokerProcess, topic: str) -> dict[str, int]:
    """Each segment's end of data: its batches walked by their headers up to the file's end
    or an all-zero header (a preallocated tail)."""
    ends: dict[str, int] = {}
    for seg in segment_files(b.data_dir / "logs", topic):
        data = seg.read_bytes()
        pos = 0
        while pos + 12 <= len(data):
            length = struct.unpack_from(">i", data, pos + 8)[0]
            if length == 0:
                assert not any(data[pos:]), f"{seg.name}: bytes after the zeros at {pos}"
                break
            pos += 12 + length
        assert pos <= len(data)
        ends[seg.name] = pos
    return ends


def test_broker_default_preallocates_and_trims_at_roll_and_stop(broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory({"log.preallocate": "true",
                                       "log.segment.bytes": str(SEGMENT)})
    topic = unique_topic("prealloc")
    create_topic(b.bootstrap, topic)
    first = numbered(50, "a")
    assert confluent_produce(b.bootstrap, topic, first) == list(range(50))
    [active] = segment_files(b.data_dir / "logs", topic)
    assert active.stat().st_size == SEGMENT, "the active segment is preallocated"
    big = [replace(r, value=(r.value or b"") * 400) for r in numbered(40, "big")]  # ~2.4 KB each
    confluent_produce(b.bootstrap, topic, big, one_batch_each=True)
    files = segment_files(b.data_dir / "logs", topic)
    assert len(files) > 1, "expected a roll"
    ends = _data_ends(b, topic)
    for rolled in files[:-1]:
        assert rolled.stat().st_size == ends[rolled.name] < SEGMENT, rolled.name
    assert files[-1].stat().st_size == SEGMENT

    assert b.stop() == 0
    ends = _data_ends(b, topic)
    assert {f.name: f.stat().st_size for f in segment_files(b.data_dir / "logs", topic)} \
        == ends, "a clean stop cuts the active segment to its data"
    b.start()
    assert watermarks(b.bootstrap, topic) == (0, 90)
    assert_roundtrip(confluent_consume(b.bootstrap, topic, 90), first + big)


def test_sigkill_with_a_preallocated_segment_keeps_every_acked_record(
        broker_factory: Any) -> None:
    b: BrokerProcess = broker_factory({"log.flush.interval.messages": "1"})
    topic = unique_topic("prealloc-kill")
    create_topic(b.bootstrap, topic, config={"preallocate": "true",
                                             "segment.bytes": str(SEGMENT)})
    sent = numbered(400, "stream")
    acked = _produce_until_killed(b, topic, sent, kill_after=150)
    assert sorted(acked) == list(range(len(acked)))
    active = segment_files(b.data_dir / "logs", topic)[-1]
    assert active.stat().st_size == SEGMENT, "killed with the zero-filled tail in place"

    b.start()
    low, high = watermarks(b.bootstrap, topic)
    assert low == 0 and high >= len(acked)
    # Every acknowledged record at its offset, and past them only records that were sent
    # (written, their answer lost with the broker): nothing read out of the zeros.
    assert_roundtrip(confluent_consume(b.bootstrap, topic, high), sent[:high])
    for offset, rec in acked.items():
        assert sent[offset] == rec
    assert active.stat().st_size == _data_ends(b, topic)[active.name] < SEGMENT
    more = numbered(10, "after")
    assert confluent_produce(b.bootstrap, topic, more) == list(range(high, high + 10))
    assert_roundtrip(confluent_consume(b.bootstrap, topic, 10, start=high), more, high)

"""Segments roll on size and retention deletes whole old segments, moving the log start offset;
a consumer starting at the new log start reads exactly the records kept from there."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from broker.testing import EmbeddedBroker
from tests.support.clients import (
    Rec,
    assert_roundtrip,
    confluent_consume,
    create_topic,
    disk_batches,
    numbered,
    segment_files,
    unique_topic,
    wait_until,
    watermarks,
)

SEGMENT_BYTES = 2048
RETENTION_BYTES = 6144


def test_size_retention_moves_log_start(mini_broker_factory: Callable[..., Any]) -> None:
    with mini_broker_factory(**{
        "log.segment.bytes": str(SEGMENT_BYTES),
        "log.retention.bytes": str(RETENTION_BYTES),
        "log.retention.ms": "-1",  # size alone decides here
        "log.retention.check.interval.ms": "300",
    }) as b:
        _size_retention_moves_log_start(b)


def _size_retention_moves_log_start(b: EmbeddedBroker) -> None:
    logs = b.data_dir / "logs"
    topic = unique_topic("retention")
    # Deleted segments are renamed .deleted and removed after file.delete.delay.ms.
    create_topic(b.bootstrap_servers, topic, config={"file.delete.delay.ms": "500"})

    # ~160-byte batches, one per produce: about 12 per segment, about 20 segments in all.
    sent = [Rec(r.key, r.value + b"." * 60, r.headers, r.timestamp)
            for r in numbered(260, "ret")]
    errors: list = []
    producer = Producer({"bootstrap.servers": b.bootstrap_servers, "acks": "all", "linger.ms": 0,
                         "enable.idempotence": False, "error_cb": errors.append})
    offsets: list[int] = []
    seen: set[str] = set()  # every segment that ever existed (each is active for ~12 records)
    peak = 0
    deadline = time.monotonic() + 60
    for r in sent:
        producer.produce(topic, key=r.key, value=r.value, headers=list(r.headers), partition=0,
                         timestamp=r.timestamp,
                         on_delivery=lambda err, msg: offsets.append(-1 if err else msg.offset()))
        assert producer.flush(max(0.1, deadline - time.monotonic())) == 0
        names = [p.name for p in segment_files(logs, topic)]
        seen.update(names)
        peak = max(peak, len(names))
    assert not errors
    assert offsets == list(range(len(sent)))
    assert len(seen) >= 15, f"segments did not roll at {SEGMENT_BYTES} bytes: {sorted(seen)}"

    def settled():
        # A retention pass moves the log start and renames its segments at once on the
        # broker's loop: the same files on both sides of the watermark read mean that read
        # saw the files' state, not one from before a pass that ran in between.
        files = segment_files(logs, topic)
        low, high = watermarks(b.bootstrap_servers, topic)
        if segment_files(logs, topic) != files:
            return None
        size = sum(p.stat().st_size for p in files)
        # Kafka's rule: delete the oldest while the rest still holds log.retention.bytes.
        if low > 0 and size - files[0].stat().st_size < RETENTION_BYTES:
            return low, high, files
        return None

    low, high, files = wait_until(settled, timeout=20, interval=0.2, what="retention")
    assert high == len(sent)
    assert len(files) < peak <= len(seen), f"no shrink: {len(files)} now, peak {peak}"
    assert {p.name for p in files} == set(sorted(seen)[-len(files):]), "oldest go first"
    assert sum(p.stat().st_size for p in files) >= RETENTION_BYTES, "deleted too much"
    def leftovers() -> list[str]:
        return [p.name for name in seen - {p.name for p in files}
                for p in (logs / f"{topic}-0").glob(f"{name.removesuffix('.log')}.*")]

    wait_until(lambda: not leftovers(), timeout=10, interval=0.2,
               what="deleted segments' files to go after file.delete.delay.ms")

    # The log start offset is the base offset of the oldest segment still on disk.
    batches = disk_batches(logs, topic)
    assert int(files[0].name.removesuffix(".log")) == batches[0].base_offset == low
    assert batches[-1].last_offset == high - 1

    got = confluent_consume(b.bootstrap_servers, topic, high - low, start=low)
    assert_roundtrip(got, sent[low:], first_offset=low)

    # Records deleted by retention are gone: asking for offset 0 lands at the log start.
    got = confluent_consume(b.bootstrap_servers, topic, 1, start=0)
    assert got[0].offset == low

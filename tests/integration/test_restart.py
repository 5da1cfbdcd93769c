"""Durability across restarts: every acknowledged record comes back at its offset.

A clean stop (SIGTERM) leaves the `.kafka_cleanshutdown` marker, so the next start trusts the
segments as they are; a SIGKILL leaves none, so the next start recovers (validates the tail,
truncates what is torn). Either way, acknowledged records keep their offsets and bytes, and new
records continue right after them.
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    Rec,
    assert_roundtrip,
    confluent_consume,
    confluent_produce,
    create_topic,
    numbered,
    sample_records,
    segment_files,
    unique_topic,
    watermarks,
)

MARKER = ".kafka_cleanshutdown"


def _markers(b: BrokerProcess) -> list[Path]:
    return list((b.data_dir / "logs").rglob(MARKER))


def _start_and_read_log(b: BrokerProcess) -> str:
    """Start again on the same port; return what the broker logged while starting."""
    before = b.log_path.stat().st_size
    b.start()
    time.sleep(0.2)  # let anything logged right after "broker started" land too
    return b.log_path.read_bytes()[before:].decode(errors="replace")


def _mentions_recovery(text: str) -> bool:
    """Any line about recovering, but the effective configuration's listing of the keys (it
    names num.recovery.threads.per.data.dir, whatever the start did)."""
    return any(re.search(r"recover", line, re.IGNORECASE) is not None
               for line in text.splitlines() if '"effective configuration"' not in line)


def _partition_lines(text: str, topic: str, word: str) -> list[str]:
    """Log lines naming this partition's directory and containing `word` (any case)."""
    return [ln for ln in text.splitlines()
            if f"{topic}-0" in ln and word.lower() in ln.lower()]


def _segment_bytes(b: BrokerProcess, topic: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in segment_files(b.data_dir / "logs", topic)}


def test_clean_restart(broker_factory) -> None:
    b: BrokerProcess = broker_factory({"log.segment.bytes": "51200"})  # 48 KB record fits
    topic = unique_topic("clean")
    create_topic(b.bootstrap, topic)
    first = sample_records(30, seed=1) + numbered(30, "plain")  # ~62 KB uncompressed
    offsets = confluent_produce(b.bootstrap, topic, first[:30], one_batch_each=True)
    offsets += confluent_produce(b.bootstrap, topic, first[30:], compression="zstd")
    assert offsets == list(range(60))
    assert len(segment_files(b.data_dir / "logs", topic)) > 1, "expected several segments"

    assert b.stop() == 0
    assert _markers(b), "a clean stop must leave the clean-shutdown marker"
    on_disk = _segment_bytes(b, topic)

    started = _start_and_read_log(b)
    assert not _mentions_recovery(started), f"clean restart ran recovery:\n{started}"
    assert not _markers(b), "the marker must be removed once the broker runs again"
    assert _segment_bytes(b, topic) == on_disk, "a clean restart must not touch the segments"

    assert watermarks(b.bootstrap, topic) == (0, 60)
    assert_roundtrip(confluent_consume(b.bootstrap, topic, 60), first)

    more = numbered(10, "after")
    assert confluent_produce(b.bootstrap, topic, more) == list(range(60, 70))
    assert_roundtrip(confluent_consume(b.bootstrap, topic, 70), first + more)


def _produce_until_killed(b: BrokerProcess, topic: str, records: list[Rec], kill_after: int):
    """Stream records (one batch each, several in flight) and SIGKILL the broker mid-stream.

    Returns {offset: record} for every record the broker acknowledged before it died.
    """
    acked: dict[int, Rec] = {}
    producer = Producer({
        "bootstrap.servers": b.bootstrap, "acks": "all", "enable.idempotence": False,
        "linger.ms": 0, "max.in.flight.requests.per.connection": 5,
        "message.send.max.retries": 0, "message.timeout.ms": 20000,
    })

    def on_delivery(rec: Rec):
        def cb(err, msg) -> None:
            if err is None:
                acked[msg.offset()] = rec
        return cb

    deadline = time.monotonic() + 30
    killed = False
    for r in records:
        producer.produce(topic, value=r.value, key=r.key, partition=0, timestamp=r.timestamp,
                         headers=list(r.headers), on_delivery=on_delivery(r))
        producer.poll(0)
        while not killed and len(acked) < kill_after and len(producer) > 20:
            producer.poll(0.01)
            assert time.monotonic() < deadline, "produce stalled before the kill"
        if not killed and len(acked) >= kill_after:
            b.kill()
            killed = True
            break
    assert killed, f"only {len(acked)} acknowledged"
    producer.purge()
    producer.flush(2)
    return acked


def test_sigkill_restart(broker_factory) -> None:
    b: BrokerProcess = broker_factory(
        {"log.flush.interval.messages": "1", "log.segment.bytes": "16384"}
    )
    topic = unique_topic("kill")
    create_topic(b.bootstrap, topic)
    sent = numbered(400, "stream")
    acked = _produce_until_killed(b, topic, sent, kill_after=150)
    assert sorted(acked) == list(range(len(acked))), "acks must cover a prefix of offsets"
    assert not _markers(b), "SIGKILL cannot leave a clean-shutdown marker"

    started = _start_and_read_log(b)
    assert _partition_lines(started, topic, "recover"), f"no recovery after SIGKILL:\n{started}"
    low, high = watermarks(b.bootstrap, topic)
    assert low == 0 and high >= len(acked)
    # Nothing was retried, so whatever survived is exactly the stream's prefix.
    assert_roundtrip(confluent_consume(b.bootstrap, topic, high), sent[:high])
    for offset, rec in acked.items():
        assert sent[offset] == rec

    # Continue after the recovered end, then crash again with a torn batch at the tail.
    more = numbered(20, "second")
    assert confluent_produce(b.bootstrap, topic, more) == list(range(high, high + 20))
    b.kill()
    active = segment_files(b.data_dir / "logs", topic)[-1]
    good_size = active.stat().st_size
    torn = struct.pack(">qi", high + 20, 400) + b"\x00" * 30  # header says 400 bytes; 30 follow
    with open(active, "ab") as f:
        f.write(torn)

    started = _start_and_read_log(b)
    assert _partition_lines(started, topic, "truncat"), f"torn tail not reported:\n{started}"
    assert active.stat().st_size == good_size, "the torn tail must be truncated away"
    assert watermarks(b.bootstrap, topic) == (0, high + 20)
    assert_roundtrip(confluent_consume(b.bootstrap, topic, high + 20), sent[:high] + more)
    last = numbered(5, "third")
    assert confluent_produce(b.bootstrap, topic, last) == list(range(high + 20, high + 25))


def test_sigkill_after_a_clean_start_recovers_only_what_was_used(
        broker_factory: Callable[..., BrokerProcess]) -> None:
    """A log not used since the last clean start is as that shutdown left it: after a SIGKILL
    it opens on first use, not at start, and serves every acknowledged record; a log used
    since is recovered at start, keeping its acknowledged records too."""
    b: BrokerProcess = broker_factory({"log.flush.interval.messages": "1"})
    topic = unique_topic("lazy")
    create_topic(b.bootstrap, topic, partitions=3)
    sent = {p: numbered(20, f"p{p}") for p in range(3)}
    for p in range(3):
        assert confluent_produce(b.bootstrap, topic, sent[p], partition=p) == list(range(20))
    assert b.stop() == 0

    _start_and_read_log(b)
    later = numbered(10, "after-clean-start")
    assert confluent_produce(b.bootstrap, topic, later, partition=0) == list(range(20, 30))
    b.kill()

    started = _start_and_read_log(b)
    assert _partition_lines(started, topic, "recover"), f"used log not recovered:\n{started}"
    for p in (1, 2):
        assert not [ln for ln in started.splitlines() if f"{topic}-{p}" in ln], (
            f"{topic}-{p}, untouched since the clean start, was read at start:\n{started}")
    assert_roundtrip(confluent_consume(b.bootstrap, topic, 30, partition=0), sent[0] + later)
    for p in (1, 2):  # first touched after the restart
        assert watermarks(b.bootstrap, topic, p) == (0, 20)
        assert_roundtrip(confluent_consume(b.bootstrap, topic, 20, partition=p), sent[p])
    assert confluent_produce(b.bootstrap, topic, later, partition=1) == list(range(20, 30))

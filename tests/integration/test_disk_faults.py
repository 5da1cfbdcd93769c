"""A real full disk: the second of two log dirs is a 4 MiB tmpfs that fills up under a producer.

As Kafka does on a log dir failure, the broker takes that dir offline: the producer (librdkafka,
acks=all) is answered KAFKA_STORAGE_ERROR instead of hanging, the partition of the first dir
keeps accepting and serving, and every acknowledged record is on disk byte for byte. After a
restart with space freed, recovery brings the dir back with every acknowledged record at its
offset, and the partition accepts writes again.

Needs root (mount); skipped, with the reason, where mounting is not permitted.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.protocol.metadata import ApiVersionsResponse

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    Rec,
    confluent_consume,
    confluent_produce,
    create_topic,
    segment_files,
)
from tests.support.requests import (
    api_versions_request,
    fetch_request,
    fetch_response,
    fetched_values,
    produce_request,
    produce_response,
    record_batch,
)
from tests.support.wire import Wire

pytestmark = pytest.mark.timeout(120)

TOPIC = "disk-faults"
TMPFS_SIZE = "4m"
ROOM = 512 * 1024  # what the filler leaves free on the tmpfs for the log
VALUE_SIZE = 16 * 1024
KAFKA_STORAGE_ERROR = 56


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A mounted tmpfs of TMPFS_SIZE, unmounted at the end (skip if mounting is refused)."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        reason = "mounting a tmpfs needs root"
        print(reason)
        pytest.skip(reason)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs",
                           str(mount_point)], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        reason = f"mount -t tmpfs not permitted here: {done.stderr.strip() or done.returncode}"
        print(reason)
        pytest.skip(reason)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, timeout=10)


def value(i: int) -> bytes:
    return f"record {i:06d} ".encode() * (VALUE_SIZE // 14)


def on_disk(log_dir: Path, partition: int) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in the partition's segment files, read directly."""
    out: list[tuple[int, bytes | None]] = []
    for segment in segment_files(log_dir, TOPIC, partition):
        out += fetched_values(segment.read_bytes())
    return out


def produce_until_refused(bootstrap: str, partition: int) -> tuple[list[tuple[int, bytes]], int]:
    """One acks=all batch at a time, no retries, until a batch is refused: the acknowledged
    (offset, value) pairs and the error code of the refusal. Bounded: a hang fails."""
    from confluent_kafka import Producer

    producer = Producer({
        "bootstrap.servers": bootstrap, "broker.address.family": "v4", "acks": "all",
        "enable.idempotence": False, "retries": 0, "linger.ms": 0,
        "message.timeout.ms": 10_000, "socket.timeout.ms": 10_000,
    })
    acked: list[tuple[int, bytes]] = []
    reports: list = []
    for i in range(4 * (ROOM // VALUE_SIZE) + 16):  # the room fills well before this
        producer.produce(TOPIC, value=value(i), partition=partition,
                         on_delivery=lambda err, msg: reports.append((err, msg)))
        # Bounded by message.timeout.ms: a batch the broker never answers ends in a local
        # timeout error, which the caller's KAFKA_STORAGE_ERROR check refuses.
        assert producer.flush(15) == 0, "the produce was neither acknowledged nor refused"
        [(err, msg)] = reports
        reports.clear()
        if err is not None:
            return acked, err.code()
        acked.append((msg.offset(), value(i)))
    raise AssertionError(f"{len(acked)} records of {VALUE_SIZE} bytes fit a {ROOM} byte room")


def test_a_full_log_dir_goes_offline_and_comes_back_after_a_restart(
        tmp_path: Path, small_disk: Path) -> None:
    first_dir = tmp_path / "first-dir"
    broker = BrokerProcess(tmp_path / "broker", {
        "log.dirs": f"{first_dir},{small_disk}", "offsets.topic.num.partitions": "1"})
    try:
        broker.start()
        # The LogManager puts a new log in the dir holding the fewest logs, so the two
        # partitions land one in each dir; which one where depends on __consumer_offsets.
        create_topic(broker.bootstrap, TOPIC, partitions=2)
        [on_small] = [p for p in (0, 1) if (small_disk / f"{TOPIC}-{p}").is_dir()]
        [on_first] = [p for p in (0, 1) if (first_dir / f"{TOPIC}-{p}").is_dir()]
        st = os.statvfs(small_disk)
        filler = small_disk / "filler"
        filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - ROOM))

        acked, refusal = produce_until_refused(broker.bootstrap, on_small)
        assert refusal == KAFKA_STORAGE_ERROR, f"refused with {refusal}, not KAFKA_STORAGE_ERROR"
        assert len(acked) >= 8, f"only {len(acked)} records before the disk was full"
        assert [o for o, _ in acked] == list(range(len(acked)))
        # Every acknowledged record is on the full disk byte for byte, and nothing of the
        # refused batch is.
        assert on_disk(small_disk, on_small) == acked

        # The offline partition answers Produce and Fetch with the error; the connection stays.
        wire = Wire(broker.port)
        try:
            wire.send(produce_request(TOPIC, record_batch([b"refused"]), acks=-1,
                                      partition=on_small))
            assert produce_response(wire.read_frame()) == (KAFKA_STORAGE_ERROR, -1)
            wire.send(fetch_request([(TOPIC, on_small, 0)], max_wait_ms=0))
            [topic] = fetch_response(wire.read_frame()).responses
            [part] = topic.partitions
            assert (part.error_code, part.high_watermark) == (KAFKA_STORAGE_ERROR, -1)
            assert not part.records
            versions = wire.request(api_versions_request(), ApiVersionsResponse)
            assert versions.error_code == 0, "the connection did not go on after the errors"
        finally:
            wire.close()

        # The partition of the first dir keeps accepting and serving.
        records = [Rec(None, f"first dir {i}".encode()) for i in range(5)]
        assert confluent_produce(broker.bootstrap, TOPIC, records, partition=on_first,
                                 timeout=15) == list(range(5))
        got = confluent_consume(broker.bootstrap, TOPIC, 5, partition=on_first, timeout=15)
        assert [g.rec.value for g in got] == [r.value for r in records]

        errors = [line for line in broker.new_log_lines() if line.get("level") == "error"]
        assert len(errors) == 1, errors
        assert errors[0]["log_dir"] == str(small_disk)
        assert "No space left on device" in errors[0]["error"]
        exposition = urllib.request.urlopen(
            f"http://127.0.0.1:{broker.metrics_port}/metrics", timeout=5).read().decode()
        assert "minibroker_log_dirs_offline 1.0" in exposition
        assert "minibroker_partitions_offline 1.0" in exposition

        assert broker.stop() == 0
        assert not (small_disk / ".kafka_cleanshutdown").exists()
        filler.unlink()
        broker.start()

        got = confluent_consume(broker.bootstrap, TOPIC, len(acked), partition=on_small,
                                timeout=30)
        assert [(g.offset, g.rec.value) for g in got] == acked
        again = [Rec(None, b"after the restart")]
        assert confluent_produce(broker.bootstrap, TOPIC, again, partition=on_small,
                                 timeout=15) == [len(acked)]
        assert not [line for line in broker.new_log_lines() if line.get("level") == "error"]
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill()

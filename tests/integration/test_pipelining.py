"""Pipelined request processing with real clients and raw sockets (issue 4).

One connection may have many requests in flight: they are handled in arrival order, so offsets
follow send order, and responses leave strictly in request order even when a later request
(ApiVersions) finishes before an earlier one (a produce waiting for its fsync). With
log.flush.interval.messages=1 an acks=all produce is answered only after the fsync that covers
its batch, and a consumer never sees a high watermark that is not yet durable.

fsyncs are observed from outside the broker: a `sitecustomize` put on the broker's PYTHONPATH
wraps `os.fsync` to log, for each call, when it started and finished (CLOCK_MONOTONIC, shared by
every process on the machine) and how long the file was when it started (what the call
covers). It can also make each fsync of a segment slower, to widen the window in which a broker
that answered early would be caught. No broker code is changed.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from tests.support.broker import BrokerProcess
from tests.support.clients import (
    BASE_TS,
    Rec,
    aiokafka_consume,
    aiokafka_produce,
    assert_idempotent_batches,
    assert_roundtrip,
    confluent_consume,
    confluent_produce,
    create_topic,
    disk_batches,
    numbered,
    unique_topic,
    wait_until,
    watermarks,
)
from tests.support.wire import CLIENT_ID, Wire  # noqa: F401  (shared with other tests)

# -- raw wire helpers (shared with test_longpoll and test_fetch_sessions) --------------------


def correlation_id_of(frame: bytes) -> int:
    return struct.unpack_from(">i", frame)[0]


def record_batch(values: list[bytes], keys: list[bytes] | None = None) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=16 << 20)
    for i, value in enumerate(values):
        key = keys[i] if keys else None
        assert builder.append(BASE_TS + i, key, value, []) is not None
    builder.close()
    return bytes(builder.buffer())


def produce_request(topic: str, records: bytes, *, acks: int = 1, partition: int = 0,
                    timeout_ms: int = 15000, version: int = 9):
    return ProduceRequest[version](
        transactional_id=None, acks=acks, timeout_ms=timeout_ms,
        topic_data=[ProduceRequest.TopicProduceData(
            name=topic,
            partition_data=[ProduceRequest.TopicProduceData.PartitionProduceData(
                index=partition, records=records)],
        )],
    )


def produce_response(frame: bytes, version: int = 9):
    """(error code, base offset) of the single partition of a produce response."""
    resp = ProduceResponse.decode(frame, version=version, header=True)
    [topic] = resp.responses
    [part] = topic.partition_responses
    return part.error_code, part.base_offset


def fetch_request(partitions: list[tuple[str, int, int]], *, max_wait_ms: int,
                  min_bytes: int = 1, max_bytes: int = 50 << 20,
                  partition_max_bytes: int = 10 << 20, session_id: int = 0,
                  session_epoch: int = -1,
                  forgotten: list[tuple[str, list[int]]] | None = None):
    """FetchRequest v12 (topic names, flexible); session_epoch -1 means sessionless."""
    by_topic: dict[str, list] = {}
    for topic, index, offset in partitions:
        by_topic.setdefault(topic, []).append(FetchRequest.FetchTopic.FetchPartition(
            partition=index, current_leader_epoch=-1, fetch_offset=offset,
            last_fetched_epoch=-1, log_start_offset=-1, partition_max_bytes=partition_max_bytes,
        ))
    return FetchRequest[12](
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes,
        isolation_level=0, session_id=session_id, session_epoch=session_epoch,
        topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
        forgotten_topics_data=[
            FetchRequest.ForgottenTopic(topic=t, partitions=ps) for t, ps in (forgotten or [])
        ],
        rack_id="",
    )


def fetch_response(frame: bytes):
    return FetchResponse.decode(frame, version=12, header=True)


def fetched_values(records: bytes | None) -> list[tuple[int, bytes | None]]:
    """(offset, value) of every record in a fetched partition's record set."""
    out: list[tuple[int, bytes | None]] = []
    mr = MemoryRecords(bytes(records or b""))
    while mr.has_next():
        batch = mr.next_batch()
        if batch is None:
            break
        out.extend((r.offset, r.value) for r in batch)
    return out


def list_offsets_latest(wire: Wire, topic: str, correlation_id: int) -> int:
    req = ListOffsetsRequest[7](
        replica_id=-1, isolation_level=0,
        topics=[ListOffsetsRequest.ListOffsetsTopic(
            name=topic,
            partitions=[ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                partition_index=0, current_leader_epoch=-1, timestamp=-1)],
        )],
    )
    wire.send(req, correlation_id)
    resp = ListOffsetsResponse.decode(wire.read_frame(), version=7, header=True)
    assert resp.header.correlation_id == correlation_id
    [part] = resp.topics[0].partitions
    assert part.error_code == 0, part
    return part.offset


def api_versions_request():
    return ApiVersionsRequest[3](client_software_name=CLIENT_ID, client_software_version="1")


# -- fsync tracing (a sitecustomize for the broker process only) -----------------------------

_SITECUSTOMIZE = '''
import os
import time

_trace = os.environ.get("ISSUE4_FSYNC_TRACE")
if _trace:
    _delay = float(os.environ.get("ISSUE4_FSYNC_DELAY_MS", "0")) / 1000
    _real_fsync = os.fsync
    _out = os.open(_trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def fsync(fd):
        try:
            path = os.readlink("/proc/self/fd/%d" % fd)
            size = os.fstat(fd).st_size
        except OSError:
            path, size = "?", -1
        start = time.monotonic()
        _real_fsync(fd)
        if _delay and path.endswith(".log"):
            time.sleep(_delay)
        done = time.monotonic()
        os.write(_out, ("%.6f %.6f %d %s\\n" % (start, done, size, path)).encode())

    os.fsync = fsync
'''


@dataclass(frozen=True)
class Fsync:
    start: float
    done: float
    size: int  # file length when the call began: the bytes it certainly made durable
    path: str


def trace_fsyncs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, delay_ms: int) -> Path:
    """Make brokers started from now on in this test log every fsync to the returned file."""
    site = tmp_path / "fsync-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    trace = tmp_path / "fsync.trace"
    old = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{old}" if old else str(site))
    monkeypatch.setenv("ISSUE4_FSYNC_TRACE", str(trace))
    monkeypatch.setenv("ISSUE4_FSYNC_DELAY_MS", str(delay_ms))
    return trace


def segment_fsyncs(trace: Path, topic: str, partition: int = 0) -> list[Fsync]:
    out = []
    for line in trace.read_text().splitlines():
        start, done, size, path = line.split(" ", 3)
        if Path(path).parent.name == f"{topic}-{partition}" and path.endswith(".log"):
            out.append(Fsync(float(start), float(done), int(size), path))
    return out


def first_durable(fsyncs: list[Fsync], end_position: int) -> float:
    """When the first fsync that certainly covered bytes [0, end_position) finished."""
    covering = [f.done for f in fsyncs if f.size >= end_position]
    return min(covering) if covering else float("inf")


# -- raw pipelined burst ---------------------------------------------------------------------


@dataclass
class Burst:
    topic: str
    produce_ids: list[int]  # correlation ids of the produce requests, in send order
    counts: list[int]  # records in each produce request
    offsets: dict[int, int]  # correlation id -> base offset answered
    order: list[int]  # correlation ids in the order responses arrived
    ack_time: dict[int, float]  # correlation id -> when its response was read

    def expected_values(self) -> list[bytes]:
        return [b"req%d-rec%d" % (cid, j) for cid, n in zip(self.produce_ids, self.counts,
                                                             strict=True) for j in range(n)]


def pipelined_burst(port: int, topic: str, *, requests: int = 50, acks: int = 1,
                    every_api_versions: int = 5, waves: int = 1,
                    wave_gap_s: float = 0.0) -> Burst:
    """Send `requests` produce requests (and an ApiVersions after every few) without reading,
    in `waves` writes `wave_gap_s` apart, then read every response."""
    wire = Wire(port)
    payload = bytearray()
    wave_ends: list[int] = []
    produce_ids: list[int] = []
    counts: list[int] = []
    expected_order: list[int] = []
    for i in range(requests):
        cid = 1000 + 2 * i
        n = 1 + i % 4
        batch = record_batch([b"req%d-rec%d" % (cid, j) for j in range(n)])
        payload += Wire.encode(produce_request(topic, batch, acks=acks), cid)
        produce_ids.append(cid)
        counts.append(n)
        expected_order.append(cid)
        if every_api_versions and i % every_api_versions == 0:
            payload += Wire.encode(api_versions_request(), cid + 1)
            expected_order.append(cid + 1)
        if (i + 1) % -(-requests // waves) == 0 or i == requests - 1:
            wave_ends.append(len(payload))
    start = 0
    for end in wave_ends:
        if start:
            time.sleep(wave_gap_s)
        wire.send_raw(bytes(payload[start:end]))
        start = end
    offsets: dict[int, int] = {}
    order: list[int] = []
    ack_time: dict[int, float] = {}
    try:
        for _ in expected_order:
            frame = wire.read_frame()
            now = time.monotonic()
            cid = correlation_id_of(frame)
            order.append(cid)
            ack_time[cid] = now
            if cid % 2 == 0:
                error, base = produce_response(frame)
                assert error == 0, f"produce {cid}: error {error}"
                offsets[cid] = base
            else:
                assert ApiVersionsResponse.decode(frame[4:], version=3).error_code == 0
    finally:
        wire.close()
    assert order == expected_order, f"responses out of request order: {order}"
    return Burst(topic, produce_ids, counts, offsets, order, ack_time)


def check_offsets_follow_send_order(burst: Burst) -> None:
    expected, next_offset = {}, 0
    for cid, n in zip(burst.produce_ids, burst.counts, strict=True):
        expected[cid] = next_offset
        next_offset += n
    assert burst.offsets == expected


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [{}, {"log.flush.interval.messages": "1"}],
    ids=["lazy-flush", "fsync-each-batch"],
)
def test_raw_pipelined_produces_answer_in_order(broker_factory, overrides) -> None:
    """50 produce requests (plus ApiVersions requests that finish at once) written back to back
    on one socket: responses come back in request order, offsets follow send order."""
    b: BrokerProcess = broker_factory(overrides)
    topic = unique_topic("pipe")
    create_topic(b.bootstrap, topic)
    burst = pipelined_burst(b.port, topic, requests=50)
    check_offsets_follow_send_order(burst)
    sent = burst.expected_values()
    got = confluent_consume(b.bootstrap, topic, len(sent))
    assert [g.rec.value for g in got] == sent
    assert [g.offset for g in got] == list(range(len(sent)))


def _stats_max(stats: list[str], field: str) -> int:
    import json

    best = 0
    for raw in stats:
        for broker in json.loads(raw).get("brokers", {}).values():
            if broker.get("nodeid", -1) >= 0:
                best = max(best, int(broker.get(field, 0)))
    return best


def test_confluent_many_in_flight_keeps_send_order(broker_factory, tmp_path, monkeypatch) -> None:
    """librdkafka with five requests in flight on one connection: offsets follow send order.
    Each fsync is slowed so that requests really overlap (librdkafka's own statistics must show
    more than one request awaiting a response at some point)."""
    trace_fsyncs(tmp_path, monkeypatch, delay_ms=5)
    b: BrokerProcess = broker_factory({"log.flush.interval.messages": "1"})
    topic = unique_topic("inflight")
    create_topic(b.bootstrap, topic)
    sent = numbered(4000, "if")
    stats: list[str] = []
    offsets = confluent_produce(
        b.bootstrap, topic, sent,
        extra={"acks": "1", "linger.ms": 0, "max.in.flight.requests.per.connection": 5,
               "batch.num.messages": 20, "statistics.interval.ms": 50, "stats_cb": stats.append},
    )
    assert offsets == list(range(len(sent))), "offsets do not follow send order"
    assert _stats_max(stats, "waitresp_cnt") >= 2, "never more than one request in flight"
    assert_roundtrip(confluent_consume(b.bootstrap, topic, len(sent)), sent)


def served_api_keys(port: int) -> set[int]:
    wire = Wire(port)
    try:
        wire.send(api_versions_request(), 1)
        resp = ApiVersionsResponse.decode(wire.read_frame()[4:], version=3)
    finally:
        wire.close()
    assert resp.error_code == 0
    return {k.api_key for k in resp.api_keys}


INIT_PRODUCER_ID = 22


def test_idempotent_producer_no_sequence_errors(broker_factory, tmp_path, monkeypatch) -> None:
    """enable.idempotence with max.in.flight 5: every record delivered once, in order, without
    OUT_OF_ORDER_SEQUENCE_NUMBER or any other error.

    Before InitProducerId is served librdkafka cannot start an idempotent producer at all (a
    fatal "Idempotent producer not supported"), so the test xfails while the broker does not
    advertise API key 22, and becomes a real test the moment it does.

    librdkafka caps an idempotent partition at five *messages* in flight (rktp_msgs_inflight
    against RD_KAFKA_IDEMP_MAX_INFLIGHT, rdkafka_broker.c), so batches of one message are what
    lets five requests overlap."""
    trace_fsyncs(tmp_path, monkeypatch, delay_ms=5)  # so that requests overlap
    broker: BrokerProcess = broker_factory({"log.flush.interval.messages": "1"})
    if INIT_PRODUCER_ID not in served_api_keys(broker.port):
        pytest.xfail("InitProducerId lands with issue 5")
    topic = unique_topic("idem")
    create_topic(broker.bootstrap, topic)
    stats: list[str] = []
    sent = numbered(300, "idem")
    # Any producer error (a sequence error included) raises in confluent_produce.
    offsets = confluent_produce(broker.bootstrap, topic, sent, timeout=12, extra={
        "enable.idempotence": True, "linger.ms": 0,
        "max.in.flight.requests.per.connection": 5, "batch.num.messages": 1,
        "statistics.interval.ms": 50, "stats_cb": stats.append,
    })
    assert offsets == list(range(len(sent)))
    assert _stats_max(stats, "waitresp_cnt") >= 2, "never more than one request in flight"
    assert_roundtrip(confluent_consume(broker.bootstrap, topic, len(sent)), sent)
    # Stored as sent: one producer id, sequences consecutive from 0 across the batches.
    assert_idempotent_batches(broker.data_dir / "logs", topic, 0, len(sent))


def test_acks_all_answered_after_covering_fsync(broker_factory, tmp_path, monkeypatch) -> None:
    """log.flush.interval.messages=1: each acks=all response leaves only after an fsync that
    covered its batch had finished; a ListOffsets(latest) polled meanwhile on another connection
    never shows a high watermark that is not durable yet; one fsync covers many batches (group
    commit); after SIGKILL and restart every acknowledged record is there.

    The SIGKILL part alone cannot tell an fsync from none (the page cache outlives the process,
    and the broker writes with pwrite, nothing buffered in user space); the fsync trace can."""
    trace = trace_fsyncs(tmp_path, monkeypatch, delay_ms=15)
    b: BrokerProcess = broker_factory({"log.flush.interval.messages": "1"})
    topic = unique_topic("durable")
    create_topic(b.bootstrap, topic)

    samples: list[tuple[float, int]] = []  # (response read at, high watermark)
    stop = threading.Event()
    failure: list[BaseException] = []

    def probe() -> None:
        try:
            wire = Wire(b.port)
            cid = 0
            while not stop.is_set():
                cid += 1
                hw = list_offsets_latest(wire, topic, cid)
                samples.append((time.monotonic(), hw))
            wire.close()
        except BaseException as exc:  # surfaced below
            failure.append(exc)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        # Five waves 6 ms apart, while each fsync takes 15 ms more than it should: later
        # batches are appended while an fsync runs, and are covered by the next one.
        burst = pipelined_burst(b.port, topic, requests=40, acks=-1, every_api_versions=0,
                                waves=5, wave_gap_s=0.006)
    finally:
        stop.set()
        prober.join(10)
    assert not failure, failure
    check_offsets_follow_send_order(burst)
    total = sum(burst.counts)

    batches = {d.base_offset: d for d in disk_batches(b.data_dir / "logs", topic)}
    log_end = max(d.position + 12 + d.length for d in batches.values())
    # A broker that answered early may still be fsyncing: wait for the whole log to be covered,
    # so that the comparison below reports how early it answered.
    fsyncs = wait_until(
        lambda: (fs := segment_fsyncs(trace, topic)) and first_durable(fs, log_end) < 1e300
        and fs, timeout=10, interval=0.05, what="an fsync covering the whole segment")

    def end_position_of(offset: int) -> int:
        batch = max((d for d in batches.values() if d.base_offset <= offset),
                    key=lambda d: d.base_offset)
        assert batch.last_offset >= offset
        return batch.position + 12 + batch.length

    early = []
    for cid in burst.produce_ids:
        durable_at = first_durable(fsyncs, end_position_of(burst.offsets[cid]))
        if not durable_at < burst.ack_time[cid]:
            early.append((cid, burst.offsets[cid], round(durable_at - burst.ack_time[cid], 4)))
    assert not early, f"acks=all answered before the covering fsync finished: {early[:5]}"

    ahead = [(hw, t) for t, hw in samples if hw > 0 and not first_durable(
        fsyncs, end_position_of(hw - 1)) < t]
    assert not ahead, f"ListOffsets showed a high watermark that was not durable: {ahead[:5]}"
    assert any(hw > 0 for _, hw in samples), "the prober never saw the high watermark move"
    assert max(hw for _, hw in samples) <= total

    covering = [f for f in fsyncs if f.done <= max(burst.ack_time.values())]
    print(f"\n{len(burst.produce_ids)} acks=all requests answered after {len(covering)} fsyncs; "
          f"{len(samples)} ListOffsets samples, none ahead of the durable offset")
    assert len(covering) < len(burst.produce_ids), (
        f"{len(covering)} fsyncs for {len(burst.produce_ids)} requests: no group commit")

    b.kill()
    b.start()
    assert watermarks(b.bootstrap, topic) == (0, total)
    got = confluent_consume(b.bootstrap, topic, total)
    assert [g.rec.value for g in got] == burst.expected_values()


def test_serial_mode_round_trips_and_ordering(broker_factory, tmp_path, monkeypatch) -> None:
    """request.processing.mode=serial: confluent-kafka and aiokafka round trips still pass, a
    raw pipelined burst still gets every response in order, and each produce request waits for
    the previous response (one fsync per request: no two requests were ever in progress)."""
    trace = trace_fsyncs(tmp_path, monkeypatch, delay_ms=3)
    b: BrokerProcess = broker_factory({"request.processing.mode": "serial",
                                       "log.flush.interval.messages": "1"})
    for produce, consume in ((confluent_produce, confluent_consume),
                             (aiokafka_produce, aiokafka_consume)):
        topic = unique_topic(f"serial-{produce.__name__[:5]}")
        create_topic(b.bootstrap, topic)
        sent: list[Rec] = numbered(300, "s")
        assert produce(b.bootstrap, topic, sent) == list(range(len(sent)))
        assert_roundtrip(consume(b.bootstrap, topic, len(sent)), sent)

    topic = unique_topic("serial-raw")
    create_topic(b.bootstrap, topic)
    burst = pipelined_burst(b.port, topic, requests=30, acks=-1)
    check_offsets_follow_send_order(burst)
    assert len(segment_fsyncs(trace, topic)) >= len(burst.produce_ids), (
        "fewer fsyncs than requests: serial mode let requests overlap")
    got = confluent_consume(b.bootstrap, topic, sum(burst.counts))
    assert [g.rec.value for g in got] == burst.expected_values()

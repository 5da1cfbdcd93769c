"""Pipelined request processing with real clients and raw sockets.

One connection may have many requests in flight: they are handled in arrival order, so offsets
follow send order, and responses leave strictly in request order even when a later request
(ApiVersions) finishes before an earlier one (a produce waiting for its fsync). With
log.flush.interval.messages=1 an acks=all produce is answered only after the fsync that covers
its batch, and a consumer never sees a high watermark that is not yet durable.

fsyncs are observed from outside the broker (tests/support/fsync_trace.py): every fsync is
logged with when it started and finished and how much of the file it covered, and each fsync of
a segment can be made slower, to widen the window in which a broker that answered early would be
caught. No broker code is changed.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
from kafka.protocol.metadata import ApiVersionsResponse

from tests.support.broker import BrokerProcess
from tests.support.clients import (
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
from tests.support.fsync_trace import first_durable, segment_fsyncs, trace_fsyncs
from tests.support.requests import (
    api_versions_request,
    correlation_id_of,
    list_offsets_latest,
    produce_request,
    produce_response,
    record_batch,
)
from tests.support.wire import Wire

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
        pytest.xfail("InitProducerId is not served yet")
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

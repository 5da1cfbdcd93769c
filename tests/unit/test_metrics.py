"""The metrics collector and the counters it reads, without sockets: purgatory and timer
counters on a ManualClock, error codes read from responses, and the exposition of a broker
state built by hand."""

from __future__ import annotations

from types import SimpleNamespace

from kafka.protocol.consumer import FetchResponse
from kafka.protocol.producer import ProduceResponse
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics.collector import BrokerMetrics
from broker.metrics.instruments import Histogram, RequestStats
from protocol.errors import ErrorCode
from protocol.registry import APIS
from protocol.templates import PackedFetchResponse
from purgatory import DelayedOperation, ManualClock, Purgatory, Timer


class Op(DelayedOperation):
    def __init__(self, delay_ms: int) -> None:
        super().__init__(delay_ms)
        self.ready = False

    def try_complete(self) -> bool:
        return self.force_complete() if self.ready else False

    def on_complete(self) -> None:
        pass

    def on_expiration(self) -> None:
        pass


def test_histogram_buckets_are_cumulative_with_inf() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.1, 0.5, 2.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 2), ("1.0", 3), ("+Inf", 4)]
    assert h.count == 4 and abs(h.sum - 2.65) < 1e-9


def test_purgatory_counts_immediate_event_expiration_and_purges() -> None:
    clock = ManualClock()
    timer = Timer(clock)
    purgatory: Purgatory[Op] = Purgatory("fetch", timer, purge_interval=0)
    now = Op(100)
    now.ready = True
    assert purgatory.try_complete_else_watch(now, ["a"])
    by_event, expiring, far = Op(100), Op(50), Op(1000)
    for op, key in ((by_event, "a"), (expiring, "b"), (far, "c")):
        assert not purgatory.try_complete_else_watch(op, [key])
    assert purgatory.delayed == 3 and purgatory.parked == 3
    by_event.ready = True
    assert purgatory.check_and_complete("a") == 1
    clock.advance(60)
    assert expiring.is_completed
    assert (purgatory.completed_immediately, purgatory.completed_by_event,
            purgatory.expired) == (1, 1, 1)
    # The 1000 ms operation sat in an overflow wheel: reaching its deadline cascades it down.
    clock.advance(1000)
    assert far.is_completed and purgatory.expired == 2
    assert timer.reinsertions >= 1
    assert sum(timer.lateness_counts) == 2 and timer.lateness_sum_ms < 2
    # Completed-but-watched entries are what purges remove.
    stale = Op(10_000)
    purgatory.try_complete_else_watch(stale, ["x", "y"])
    stale.force_complete()
    assert purgatory.purge_completed() == 2 and purgatory.purged_entries >= 2


def _request(api_key: int, version: int, received: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(spec=APIS[api_key], version=version, body=object(),
                           received=received, dequeued=received + 0.001, local_done=0.0)


def _metrics() -> BrokerMetrics:
    return BrokerMetrics(node_id=1)


def test_stats_are_bound_once_per_api_and_version() -> None:
    m = _metrics()
    a = m.stats_for(_request(0, 9))  # type: ignore[arg-type]
    assert m.stats_for(_request(0, 9)) is a  # type: ignore[arg-type]
    b = m.stats_for(_request(0, 8))  # type: ignore[arg-type]
    assert b is not a and b.timings is a.timings  # histograms per API, counters per version


def test_produce_error_codes_counted_per_partition() -> None:
    m = _metrics()
    req = _request(0, 9)
    stats: RequestStats = m.stats_for(req)  # type: ignore[arg-type]
    P = ProduceResponse.TopicProduceResponse.PartitionProduceResponse
    resp = ProduceResponse(responses=[ProduceResponse.TopicProduceResponse(
        name="t", partition_responses=[
            P(index=0, error_code=0, base_offset=0, log_append_time_ms=-1, log_start_offset=0,
              record_errors=[], error_message=None),
            P(index=1, error_code=ErrorCode.CORRUPT_MESSAGE, base_offset=-1,
              log_append_time_ms=-1, log_start_offset=0, record_errors=[], error_message="x"),
        ])], throttle_time_ms=0)
    stats.completed(req, resp, now=1.004)  # type: ignore[arg-type]
    assert stats.requests == 1 and stats.errors == {ErrorCode.CORRUPT_MESSAGE: 1}
    t = stats.timings
    assert t.request_queue.count == t.local.count == t.remote.count == 1
    assert t.remote.sum == 0.0 and abs(t.local.sum - 0.003) < 1e-9


def test_parked_request_splits_local_and_remote_time() -> None:
    m = _metrics()
    req = _request(1, 12)
    req.local_done = 1.002
    stats = m.stats_for(req)  # type: ignore[arg-type]
    stats.completed(req, None, now=1.502)  # type: ignore[arg-type]
    stats.sent(req.received, 1.502, 1.503, 1.504)
    t = stats.timings
    assert abs(t.local.sum - 0.001) < 1e-9 and abs(t.remote.sum - 0.5) < 1e-9
    assert abs(t.response_queue.sum - 0.001) < 1e-9 and abs(t.total.sum - 0.504) < 1e-9


def test_fetch_counts_bytes_out_by_topic_and_errors() -> None:
    m = _metrics()
    req = _request(1, 12)
    stats = m.stats_for(req)  # type: ignore[arg-type]
    T = FetchResponse.FetchableTopicResponse
    PD = T.PartitionData
    resp = FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[
        T(topic="a", partitions=[
            PD(partition_index=0, error_code=0, high_watermark=5, records=b"x" * 100),
            PD(partition_index=1, error_code=ErrorCode.OFFSET_OUT_OF_RANGE, high_watermark=0,
               records=b""),
        ])])
    stats.completed(req, resp, now=1.01)  # type: ignore[arg-type]
    assert m.topic_bytes_out == {"a": 100}
    assert stats.errors == {ErrorCode.OFFSET_OUT_OF_RANGE: 1}


def test_a_packed_fetch_answer_counts_the_same() -> None:
    m = _metrics()
    req = _request(1, 12)
    stats = m.stats_for(req)  # type: ignore[arg-type]
    resp = PackedFetchResponse(0, 0, [("a", [
        (0, 0, 5, 5, 0, None, b"x" * 100),
        (1, ErrorCode.OFFSET_OUT_OF_RANGE, 0, 0, 0, None, b""),
    ])], by_id=False)
    stats.completed(req, resp, now=1.01)  # type: ignore[arg-type]
    assert not resp.materialized, "counted from the packed entries, no message built"
    resp.responses[0].partitions[0].error_code = ErrorCode.NOT_LEADER_OR_FOLLOWER
    stats.completed(req, resp, now=1.02)  # type: ignore[arg-type]
    assert m.topic_bytes_out == {"a": 200}
    assert stats.errors == {ErrorCode.OFFSET_OUT_OF_RANGE: 2,
                            ErrorCode.NOT_LEADER_OR_FOLLOWER: 1}


def test_exposition_of_a_broker_state() -> None:
    clock = ManualClock()
    timer = Timer(clock)
    produce, fetch = Purgatory("produce", timer), Purgatory("fetch", timer)
    delete_records: Purgatory[Op] = Purgatory("delete_records", timer)
    fetch.try_complete_else_watch(Op(500), [("t", 0)])
    rm = SimpleNamespace(produce_purgatory=produce, fetch_purgatory=fetch,
                         delete_records_purgatory=delete_records, timer=timer,
                         partitions={}, opened_at={}, flush_time=Histogram(), markers_written=0,
                         isr_shrinks=0, isr_expands=0)
    m = BrokerMetrics(node_id=1)
    m.replica_manager = rm  # type: ignore[assignment]  # only what the collector reads
    req = _request(0, 9)
    m.stats_for(req).completed(req, None, now=1.01)  # type: ignore[arg-type]
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(m.registry).decode())}
    delayed = {s.labels["purgatory"]: s.value
               for s in families["minibroker_purgatory_delayed_operations"].samples}
    assert delayed == {"produce": 0, "fetch": 1, "delete_records": 0}
    [requests] = families["minibroker_requests"].samples
    assert requests.labels == {"api": "Produce", "version": "9"} and requests.value == 1
    assert families["minibroker_timer_tasks"].samples[0].value == 1
    assert "process_cpu_seconds" in families  # the process collector is registered too


async def test_exposition_of_an_open_transaction(tmp_path) -> None:
    """A transactional producer's open transaction on a real ReplicaManager and transaction
    coordinator: ids by Kafka's state names, the LSO lag it holds, markers once it commits."""
    import asyncio

    from kafka.record.default_records import DefaultRecordBatchBuilder

    from tests.support.components import build

    c = build(tmp_path / "logs", {"offsets.topic.num.partitions": "1",
                                  "transaction.state.log.num.partitions": "1"})
    try:
        c.topics.create_topic("orders", 1, {})
        txn = c.transactions

        async def done(result):  # noqa: ANN001, ANN202 - a Completion, done now or later
            return await asyncio.wait_for(asyncio.ensure_future(result), 10)

        init = await done(txn.init_producer_id("t1", 60_000))
        pid, epoch = init.producer_id, init.producer_epoch
        assert await done(txn.add_partitions("t1", pid, epoch, [("orders", 0)])) == 0
        builder = DefaultRecordBatchBuilder(2, 0, True, pid, epoch, 0, 1 << 20)
        for i in range(3):
            builder.append(i, 1_700_000_000_000 + i, None, b"v", [])
        appended = c.replica_manager.append_records(
            [(("orders", 0), bytes(builder.build()))], 9, 1, 1000, transactional_id="t1")
        assert appended.result()[("orders", 0)].error == ErrorCode.NONE

        m = BrokerMetrics(node_id=1)
        m.observe(None, c.replica_manager, c.coordinator, c.metadata,  # type: ignore[arg-type]
                  c.log_manager, txn)

        def samples() -> dict[tuple[str, tuple], float]:
            text = generate_latest(m.registry).decode()
            return {(s.name, tuple(sorted(s.labels.items()))): s.value
                    for f in text_string_to_metric_families(text) for s in f.samples}

        lag_key = ("minibroker_log_last_stable_offset_lag",
                   (("partition", "0"), ("topic", "orders")))
        before = samples()
        assert before[("minibroker_transactions", (("state", "Ongoing"),))] == 1
        assert before[("minibroker_transactions", (("state", "CompleteCommit"),))] == 0
        assert before[lag_key] == 3
        assert before[("minibroker_txn_markers_written_total", ())] == 0

        assert await done(txn.end_txn("t1", pid, epoch, True)) == 0
        for _ in range(100):  # the markers are written after the answer
            if c.transactions.transactions["t1"].state.kafka_name == "CompleteCommit":
                break
            await asyncio.sleep(0.01)
        after = samples()
        assert after[("minibroker_transactions", (("state", "CompleteCommit"),))] == 1
        assert after[lag_key] == 0
        assert after[("minibroker_txn_markers_written_total", ())] == 1
    finally:
        await c.close()

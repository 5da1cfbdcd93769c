"""Prometheus metrics read at scrape time: the broker's registry and its collector.

Three kinds of numbers, three costs:
- per request: ``RequestStats`` (broker/metrics/instruments.py), plain ints on the hot path;
- counters kept by the code that already counts (purgatory, timer, channel, coordinator,
  flusher), also plain ints;
- gauges (purgatory sizes, log offsets, sizes, groups, lag, queue depths): computed by
  ``BrokerCollector`` from broker state when Prometheus scrapes, never updated per request.

The collector runs on the broker's loop (broker/metrics/http.py serves it there): it reads
dicts that only the loop mutates (partitions, watcher lists, groups), and reading them from
another thread could catch one mid-change (``dict changed size during iteration``) or see a
torn view.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from broker.metrics.instruments import (
    UNSUPPORTED,
    ApiTimings,
    Histogram,
    RequestStats,
    float_text,
    request_stats,
)
from protocol.errors import ErrorCode
from protocol.registry import APIS

if TYPE_CHECKING:
    from broker.group.coordinator import GroupCoordinator
    from broker.group.registry import Group
    from broker.log.cleaner import LogCleaner
    from broker.log.manager import LogManager
    from broker.metadata.file_store import MetadataStore
    from broker.network.request import Request
    from broker.network.request_channel import RequestChannel
    from broker.replica.replica_manager import ReplicaManager

logger = structlog.get_logger("broker.metrics")

PREFIX = "minibroker"


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


# -- the registry --------------------------------------------------------------------------------

class BrokerMetrics:
    """The broker's registry (its own, not prometheus_client's global one) and the per-request
    stats the network layer records into."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        # What the collector reads at scrape time, handed over by the composition root.
        self.channel: RequestChannel | None = None
        self.replica_manager: ReplicaManager | None = None
        self.coordinator: GroupCoordinator | None = None
        self.metadata: MetadataStore | None = None
        self.log_manager: LogManager | None = None
        self.transactions: Any = None  # the TransactionCoordinator, when wired
        # Security counters, each owned where it is counted (sasl.py, authorizer.py, server.py).
        self.auth_stats: Any = None  # AuthenticationStats: SASL successes and failures
        self.authorizer: Any = None  # the Authorizer: denials by operation and resource type
        self.tls_failures: dict[str, int] | None = None  # TLS handshakes failed, by listener
        self.telemetry: Any = None  # ClientTelemetry: client metric pushes by result
        self.stats: dict[int, RequestStats] = {}  # (api key << 16 | version) -> stats
        self.timings: dict[str, ApiTimings] = {}
        self.topic_bytes_out: dict[Any, int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(BrokerCollector(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def observe(self, channel: RequestChannel, replica_manager: ReplicaManager,
                coordinator: GroupCoordinator, metadata: MetadataStore,
                log_manager: LogManager, transactions: Any = None) -> None:
        self.channel, self.replica_manager = channel, replica_manager
        self.coordinator, self.metadata = coordinator, metadata
        self.log_manager, self.transactions = log_manager, transactions

    def observe_security(self, auth_stats: Any, authorizer: Any,
                         tls_failures: dict[str, int]) -> None:
        self.auth_stats, self.authorizer, self.tls_failures = (auth_stats, authorizer,
                                                               tls_failures)

    def stats_for(self, request: Request) -> RequestStats:
        version = request.version if request.body is not None else UNSUPPORTED
        key = request.spec.key << 16 | (version & 0xFFFF)
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = self._new_stats(request.spec.key, version)
        return stats

    def _new_stats(self, api_key: int, version: int) -> RequestStats:
        name = APIS[api_key].name
        timings = self.timings.get(name)
        if timings is None:
            timings = self.timings[name] = ApiTimings()
        return request_stats(api_key, version, timings, self.topic_bytes_out)

    def exposition(self, accept: str = "") -> tuple[bytes, str]:
        # Imported at the first scrape: prometheus_client's exposition module brings its HTTP,
        # WSGI and push-gateway clients (a few MB) that a broker nobody scrapes never needs.
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        return encoder(self.registry), content_type


def _version() -> str:
    # importlib.metadata (and the email and zip parsers under it) loads at the first scrape.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mini-broker")
    except PackageNotFoundError:
        return "unknown"


class BrokerCollector(Collector):
    """Reads the broker's state when Prometheus scrapes; runs on the event loop."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics
        self.version: str | None = None  # read at the first scrape

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        if self.version is None:
            self.version = _version()
        info = GaugeMetricFamily(f"{PREFIX}_build_info", "mini-broker version (always 1).",
                                 labels=["version", "node_id"])
        info.add_metric([self.version, str(m.node_id)], 1)
        yield info
        yield from self._requests()
        if m.channel is not None:
            yield from self._network(m.channel)
        if m.replica_manager is not None:
            yield from self._purgatories(m.replica_manager, m.coordinator)
            yield from self._logs(m.replica_manager)
            yield from self._replication(m.replica_manager)
            if m.coordinator is not None:
                yield from self._groups(m.coordinator, m.replica_manager)
            yield from self._transactions(m.transactions, m.replica_manager)
        cleaner = m.log_manager.cleaner if m.log_manager is not None else None
        if cleaner is not None:
            yield from self._cleaner(cleaner)
        yield from self._security(m)
        if m.telemetry is not None:
            yield from self._telemetry(m.telemetry)

    # -- requests ------------------------------------------------------------------------------
    def _requests(self) -> Iterator[Metric]:
        stats = sorted(self.metrics.stats.values(), key=lambda s: (s.api, s.version))
        requests = CounterMetricFamily(
            f"{PREFIX}_requests", "Requests answered, by API and version (counted when the "
            "response is built, as Kafka's RequestsPerSec).", labels=["api", "version"])
        errors = CounterMetricFamily(
            f"{PREFIX}_request_errors", "Error codes other than NONE in responses, by API, "
            "version and error (one per partition or entry carrying it, as Kafka's "
            "ErrorsPerSec).", labels=["api", "version", "error"])
        for s in stats:
            v = "unsupported" if s.version == UNSUPPORTED else str(s.version)
            requests.add_metric([s.api, v], s.requests)
            for code, n in sorted(s.errors.items()):
                errors.add_metric([s.api, v, _error_name(code)], n)
        yield requests
        yield errors
        phases = (
            ("request_queue", "request_queue_time",
             "From the request parsed off the socket to a handler picking it up."),
            ("local", "request_local_time",
             "The handler's own work (validate, append, read, build the response)."),
            ("remote", "request_remote_time",
             "Parked in a purgatory (or waiting for an fsync) until completed; 0 if never."),
            ("response_queue", "response_queue_time",
             "Response ready until written: waiting behind earlier responses on its "
             "connection (the sequencer)."),
            ("response_send", "response_send_time",
             "The transport.write call (the hand-over to the transport), or, when its "
             "buffer passed the high-water mark, until it drained."),
            ("total", "request_total_time", "Parsed off the socket until sent."),
        )
        timings = sorted(self.metrics.timings.items())
        for attr, name, doc in phases:
            fam = HistogramMetricFamily(f"{PREFIX}_{name}_seconds", doc, labels=["api"])
            for api, t in timings:
                h: Histogram = getattr(t, attr)
                fam.add_metric([api], h.cumulative(), h.sum)
            yield fam

    # -- network -------------------------------------------------------------------------------
    def _network(self, channel: RequestChannel) -> Iterator[Metric]:
        from broker.network.mute import MuteReason

        conns = list(channel.connections)
        yield GaugeMetricFamily(f"{PREFIX}_connections", "Open client connections.",
                                value=len(conns))
        yield CounterMetricFamily(f"{PREFIX}_connections_opened", "Connections accepted.",
                                  value=channel.connections_opened)
        muted = GaugeMetricFamily(
            f"{PREFIX}_connections_muted", "Connections not being read, by mute reason (one "
            "connection can have several).", labels=["reason"])
        mutes = CounterMetricFamily(
            f"{PREFIX}_connection_mutes", "Times a mute reason was set on a connection.",
            labels=["reason"])
        for reason in MuteReason:
            name = (reason.name or str(int(reason))).lower()
            muted.add_metric([name], sum(1 for c in conns if c.mute & reason))
            mutes.add_metric([name], channel.mute_events.get(reason, 0))
        yield muted
        yield mutes
        yield GaugeMetricFamily(f"{PREFIX}_handler_queue_depth",
                                "Requests waiting for a handler (all connections).",
                                value=channel.waiting_requests())
        yield GaugeMetricFamily(
            f"{PREFIX}_inflight_request_bytes", "Bytes of requests received and not yet "
            "answered, and of responses not yet taken by the socket (the budget "
            "queued.max.request.bytes bounds).", value=channel.queued_bytes)
        refused = CounterMetricFamily(
            f"{PREFIX}_connections_refused", "Connections closed at accept for a limit.",
            labels=["limit"])
        for limit, n in sorted(channel.quotas.refused.items()):
            refused.add_metric([limit], n)
        yield refused
        yield CounterMetricFamily(
            f"{PREFIX}_connections_idle_closed",
            "Connections closed after connections.max.idle.ms without traffic.",
            value=channel.quotas.idle_closed)
        yield GaugeMetricFamily(
            f"{PREFIX}_inflight_requests", "Requests received and not yet answered.",
            value=sum(c.inflight for c in conns))

    # -- purgatories and the timer ---------------------------------------------------------------
    def _purgatories(self, rm: ReplicaManager, coordinator: GroupCoordinator | None
                     ) -> Iterator[Metric]:
        purgatories = [rm.produce_purgatory, rm.fetch_purgatory, rm.delete_records_purgatory]
        if coordinator is not None:
            purgatories.append(coordinator.join_purgatory)
        label = ["purgatory"]
        watched = GaugeMetricFamily(
            f"{PREFIX}_purgatory_watched", "Entries in the watcher lists (Kafka's "
            "PurgatorySize): an operation counts once per key, completed ones until purged.",
            labels=label)
        delayed = GaugeMetricFamily(
            f"{PREFIX}_purgatory_delayed_operations", "Operations waiting in the timer (Kafka's "
            "NumDelayedOperations): exactly the pending ones.", labels=label)
        keys = GaugeMetricFamily(f"{PREFIX}_purgatory_watched_keys",
                                 "Keys with a watcher list.", labels=label)
        parked = CounterMetricFamily(f"{PREFIX}_purgatory_parked_operations",
                                     "Operations that had to wait (went into the timer).",
                                     labels=label)
        completed = CounterMetricFamily(
            f"{PREFIX}_purgatory_completed_operations", "Operations completed, by how: "
            "immediate (at the first check, never waited), event (a check after an event), "
            "expiration (the timer: their deadline came first).", labels=["purgatory", "by"])
        purges = CounterMetricFamily(f"{PREFIX}_purgatory_purges",
                                     "Purge cycles of the watcher lists.", labels=label)
        purged = CounterMetricFamily(f"{PREFIX}_purgatory_purged_entries",
                                     "Completed entries the purges removed from watcher lists.",
                                     labels=label)
        for p in purgatories:
            name = [p.name]
            watched.add_metric(name, p.watched)
            delayed.add_metric(name, p.delayed)
            keys.add_metric(name, p.watched_keys)
            parked.add_metric(name, p.parked)
            completed.add_metric([p.name, "immediate"], p.completed_immediately)
            completed.add_metric([p.name, "event"], p.completed_by_event)
            completed.add_metric([p.name, "expiration"], p.expired)
            purges.add_metric(name, p.purges)
            purged.add_metric(name, p.purged_entries)
        yield from (watched, delayed, keys, parked, completed, purges, purged)

        from purgatory.timer import LATENESS_BOUNDS_MS

        timer = rm.timer
        yield GaugeMetricFamily(f"{PREFIX}_timer_tasks", "Tasks in the timing wheel.",
                                value=timer.size)
        yield GaugeMetricFamily(
            f"{PREFIX}_timer_active_buckets", "Non-empty buckets, each with one loop "
            "callback scheduled (0 when idle).", value=timer.live_callbacks())
        yield GaugeMetricFamily(f"{PREFIX}_timer_wheel_levels",
                                "Levels of the hierarchical wheel (overflow wheels created).",
                                value=len(timer.wheel.levels()))
        yield CounterMetricFamily(
            f"{PREFIX}_timer_reinsertions", "Tasks moved down to a finer wheel when their "
            "coarse bucket came due (cascades).", value=timer.reinsertions)
        yield CounterMetricFamily(f"{PREFIX}_timer_wakeups",
                                  "Loop callbacks the timer ran (bucket flushes).",
                                  value=timer.callbacks_fired)
        lateness = HistogramMetricFamily(
            f"{PREFIX}_timer_expiration_lateness_seconds",
            "How late expired tasks ran after their deadline.")
        counts = list(timer.lateness_counts)
        buckets = []
        total = 0
        for bound, n in zip(LATENESS_BOUNDS_MS, counts, strict=False):
            total += n
            buckets.append((float_text(bound / 1000), total))
        buckets.append(("+Inf", total + counts[-1]))
        lateness.add_metric([], buckets, timer.lateness_sum_ms / 1000)
        yield lateness

    # -- logs ----------------------------------------------------------------------------------
    def _logs(self, rm: ReplicaManager) -> Iterator[Metric]:
        labels = ["topic", "partition"]
        leo = GaugeMetricFamily(f"{PREFIX}_log_end_offset", "Next offset to be assigned.",
                                labels=labels)
        hw = GaugeMetricFamily(f"{PREFIX}_log_high_watermark",
                               "Offset up to which data is committed (readable).", labels=labels)
        lso = GaugeMetricFamily(f"{PREFIX}_log_start_offset", "First offset still in the log.",
                                labels=labels)
        size = GaugeMetricFamily(f"{PREFIX}_log_size_bytes", "Bytes of all segments.",
                                 labels=labels)
        segments = GaugeMetricFamily(f"{PREFIX}_log_segments", "Segments of the log.",
                                     labels=labels)
        lso_lag = GaugeMetricFamily(
            f"{PREFIX}_log_last_stable_offset_lag", "High watermark minus last stable offset "
            "(Kafka's LastStableOffsetLag): records held back from read_committed consumers "
            "by open transactions.", labels=labels)
        bytes_in: dict[str, int] = {}
        messages_in: dict[str, int] = {}
        for (topic, index), p in sorted(rm.partitions.items()):
            lab = [topic, str(index)]
            plog = p.log
            end = plog.log_end_offset
            leo.add_metric(lab, end)
            hw.add_metric(lab, p.high_watermark)
            lso.add_metric(lab, plog.log_start_offset)
            size.add_metric(lab, plog.size_in_bytes)
            segments.add_metric(lab, plog.num_segments)
            if not p.offline:
                lso_lag.add_metric(lab, p.high_watermark - p.last_stable_offset)
            bytes_in[topic] = bytes_in.get(topic, 0) + p.appended_bytes
            # Offsets are assigned contiguously, so messages appended since the partition was
            # opened are the log end offset's growth: no per-append counter needed.
            messages_in[topic] = messages_in.get(topic, 0) + end - rm.opened_at.get(
                (topic, index), end)
        yield from (leo, hw, lso, size, segments, lso_lag)
        tin = CounterMetricFamily(f"{PREFIX}_topic_bytes_in",
                                  "Record batch bytes appended (since start).", labels=["topic"])
        min_ = CounterMetricFamily(f"{PREFIX}_topic_messages_in",
                                   "Records appended (since start).", labels=["topic"])
        for topic in sorted(bytes_in):
            tin.add_metric([topic], bytes_in[topic])
            min_.add_metric([topic], messages_in[topic])
        yield tin
        yield min_
        by_id = self.metrics.metadata.by_id if self.metrics.metadata is not None else {}
        out: dict[str, int] = {}
        for key, n in list(self.metrics.topic_bytes_out.items()):
            if isinstance(key, str):
                name = key
            else:
                info = by_id.get(key)
                name = info.name if info is not None else str(key)
            out[name] = out.get(name, 0) + n
        tout = CounterMetricFamily(f"{PREFIX}_topic_bytes_out",
                                   "Record bytes returned by Fetch responses (since start).",
                                   labels=["topic"])
        for topic in sorted(out):
            tout.add_metric([topic], out[topic])
        yield tout
        offline = GaugeMetricFamily(
            f"{PREFIX}_log_dirs_offline", "Log dirs taken offline by a disk error (Kafka's "
            "OfflineLogDirectoryCount); their partitions answer KAFKA_STORAGE_ERROR.",
            value=self.metrics.log_manager.offline_dirs if self.metrics.log_manager else 0)
        yield offline
        yield GaugeMetricFamily(
            f"{PREFIX}_partitions_offline", "Partitions on an offline log dir (Kafka's "
            "OfflineReplicaCount).", value=sum(1 for p in rm.partitions.values() if p.offline))
        flush = HistogramMetricFamily(
            f"{PREFIX}_log_flush_time_seconds",
            "fsyncs of a partition log (count: fsyncs that made data durable) and their time.")
        h = rm.flush_time
        flush.add_metric([], h.cumulative(), h.sum)
        yield flush

    # -- replication (the leader's side) -------------------------------------------------------
    def _replication(self, rm: ReplicaManager) -> Iterator[Metric]:
        """Kafka's ReplicaManager gauges and ISR meters over the partitions led here (online
        ones: an offline partition is counted by partitions_offline), and each follower's
        lag behind its leader."""
        labels = ["topic", "partition", "replica"]
        lag_records = GaugeMetricFamily(
            f"{PREFIX}_follower_lag_records", "Leader's log end offset minus the follower's "
            "(as its last fetch told), per follower of a partition led here.", labels=labels)
        lag_seconds = GaugeMetricFamily(
            f"{PREFIX}_follower_lag_seconds", "Time since the follower last had everything "
            "the leader had (0 while at its log end); past replica.lag.time.max.ms it leaves "
            "the ISR.", labels=labels)
        led = under_replicated = under_min_isr = at_min_isr = 0
        for (topic, index), p in sorted(rm.partitions.items()):
            if p.offline:
                continue
            led += 1
            isr = len(p.isr)
            replication = p.replication
            under_replicated += isr < (1 if replication is None
                                       else 1 + len(replication.followers))
            min_isr = p.effective_min_isr
            under_min_isr += isr < min_isr
            at_min_isr += isr == min_isr
            if replication is None:
                continue
            end = p.log_end_offset
            now = replication.clock_ms()
            for f in replication.followers.values():
                lab = [topic, str(index), str(f.broker_id)]
                lag_records.add_metric(lab, max(end - max(f.log_end_offset, 0), 0))
                behind_ms = 0 if f.log_end_offset >= end else now - f.last_caught_up_time_ms
                lag_seconds.add_metric(lab, max(behind_ms, 0) / 1000)
        yield GaugeMetricFamily(f"{PREFIX}_leader_partitions",
                                "Partitions led here (Kafka's LeaderCount).", value=led)
        yield GaugeMetricFamily(
            f"{PREFIX}_under_replicated_partitions", "Partitions led here whose ISR is smaller "
            "than their replicas (Kafka's UnderReplicatedPartitions).", value=under_replicated)
        yield GaugeMetricFamily(
            f"{PREFIX}_under_min_isr_partitions", "Partitions led here whose ISR is below "
            "min.insync.replicas: acks=all is refused (Kafka's UnderMinIsrPartitionCount).",
            value=under_min_isr)
        yield GaugeMetricFamily(
            f"{PREFIX}_at_min_isr_partitions", "Partitions led here whose ISR is exactly "
            "min.insync.replicas: one more loss refuses acks=all (Kafka's "
            "AtMinIsrPartitionCount).", value=at_min_isr)
        yield CounterMetricFamily(
            f"{PREFIX}_isr_shrinks", "ISR changes committed that removed replicas (Kafka's "
            "IsrShrinksPerSec).", value=rm.isr_shrinks)
        yield CounterMetricFamily(
            f"{PREFIX}_isr_expands", "ISR changes committed that added replicas (Kafka's "
            "IsrExpandsPerSec).", value=rm.isr_expands)
        yield lag_records
        yield lag_seconds

    # -- groups --------------------------------------------------------------------------------
    def _groups(self, coordinator: GroupCoordinator, rm: ReplicaManager) -> Iterator[Metric]:
        from broker.group.classic_group import GroupState
        from broker.group.consumer_group import ConsumerGroupState

        classic = sorted(coordinator.groups.classic_groups(), key=lambda g: g.group_id)
        consumer = coordinator.consumer
        modern = sorted(coordinator.groups.consumer_groups(), key=lambda g: g.group_id)
        by_state = GaugeMetricFamily(f"{PREFIX}_groups",
                                     "Groups, by protocol (classic, consumer) and state.",
                                     labels=["protocol", "state"])
        for state in GroupState:
            by_state.add_metric(["classic", state.value],
                                sum(1 for g in classic if g.state is state))
        for cstate in ConsumerGroupState:
            by_state.add_metric(["consumer", cstate.value],
                                sum(1 for g in modern if g.state is cstate))
        yield by_state
        members = GaugeMetricFamily(f"{PREFIX}_group_members", "Members of a group.",
                                    labels=["group"])
        generation = GaugeMetricFamily(f"{PREFIX}_group_generation",
                                       "Generation of a classic group (one per completed join).",
                                       labels=["group"])
        epoch = GaugeMetricFamily(f"{PREFIX}_consumer_group_epoch",
                                  "Group epoch of a consumer-protocol group.", labels=["group"])
        rebalances = CounterMetricFamily(f"{PREFIX}_group_rebalances",
                                         "Rebalances started (since start): classic join phases, "
                                         "consumer-protocol group epoch bumps.",
                                         labels=["group"])
        committed = GaugeMetricFamily(f"{PREFIX}_group_committed_offset",
                                      "Committed offset of a group on a partition.",
                                      labels=["group", "topic", "partition"])
        lag = GaugeMetricFamily(f"{PREFIX}_group_lag",
                                "High watermark minus committed offset (records not yet "
                                "consumed by the group).", labels=["group", "topic", "partition"])
        partitions = rm.partitions
        every: list[Group] = [*classic, *modern]
        for g in every:
            members.add_metric([g.group_id], len(g.members))
            for (topic, index), om in sorted(coordinator.offsets.committed(g.group_id).items()):
                lab = [g.group_id, topic, str(index)]
                committed.add_metric(lab, om.offset)
                p = partitions.get((topic, index))
                if p is not None:
                    lag.add_metric(lab, max(p.high_watermark - om.offset, 0))
        for g in classic:
            generation.add_metric([g.group_id], g.generation_id)
        for cg in modern:
            epoch.add_metric([cg.group_id], cg.group_epoch)
        for gid, n in sorted([*coordinator.rebalances.items(), *consumer.rebalances.items()]):
            rebalances.add_metric([gid], n)
        heartbeats = CounterMetricFamily(f"{PREFIX}_consumer_group_heartbeats",
                                         "ConsumerGroupHeartbeat requests handled (since start).",
                                         value=consumer.heartbeats)
        yield from (members, generation, epoch, rebalances, committed, lag, heartbeats)

    # -- transactions ----------------------------------------------------------------------------
    def _transactions(self, transactions: Any, rm: ReplicaManager) -> Iterator[Metric]:
        yield CounterMetricFamily(
            f"{PREFIX}_txn_markers_written", "Transaction markers (COMMIT or ABORT control "
            "batches) appended to partitions (since start).", value=rm.markers_written)
        if transactions is None:
            return
        by_state = GaugeMetricFamily(f"{PREFIX}_transactions",
                                     "Transactional ids known to the coordinator, by state.",
                                     labels=["state"])
        from broker.txn import TransactionState

        counts = dict.fromkeys(TransactionState, 0)
        for txn in list(transactions.transactions.values()):
            counts[txn.state] += 1
        for state, n in counts.items():
            by_state.add_metric([state.kafka_name], n)
        yield by_state
        yield CounterMetricFamily(
            f"{PREFIX}_txn_timed_out", "Transactions aborted by the coordinator at their "
            "transaction.timeout.ms (since start).", value=transactions.timed_out)
        yield CounterMetricFamily(
            f"{PREFIX}_txn_ids_expired", "Transactional ids forgotten after "
            "transactional.id.expiration.ms (since start).", value=transactions.expired_ids)
        yield GaugeMetricFamily(
            f"{PREFIX}_txn_pending_markers", "Transactions whose markers are being written.",
            value=transactions.pending_markers)

    # -- the log cleaner -------------------------------------------------------------------------
    def _cleaner(self, cleaner: LogCleaner) -> Iterator[Metric]:
        """Kafka's LogCleaner and LogCleanerManager metrics, as counters since start."""
        st = cleaner.stats
        for name, doc, value in (
            ("runs", "Cleanings of a log done (one dirty range each).", st.runs),
            ("bytes_read", "Bytes of segments read by the cleaner.", st.bytes_read),
            ("bytes_written", "Bytes of cleaned segments written.", st.bytes_written),
            ("bytes_removed", "Bytes compaction removed (read minus written).",
             max(st.bytes_read - st.bytes_written, 0)),
            ("records_read", "Records the cleaner read.", st.records_read),
            ("records_removed", "Records compaction removed: superseded keys, expired "
             "tombstones, aborted transactional data.", st.records_removed),
            ("clean_seconds", "Time spent cleaning.", st.clean_seconds_total),
        ):
            yield CounterMetricFamily(f"{PREFIX}_log_cleaner_{name}", doc, value=value)
        yield GaugeMetricFamily(f"{PREFIX}_log_cleaner_last_clean_seconds",
                                "Duration of the last cleaning.", value=st.last_clean_seconds)
        yield GaugeMetricFamily(f"{PREFIX}_log_cleaner_max_clean_seconds",
                                "Longest cleaning since start (Kafka's max-clean-time-secs).",
                                value=st.max_clean_seconds)
        yield GaugeMetricFamily(
            f"{PREFIX}_log_cleaner_uncleanable_partitions", "Compacted partitions the cleaner "
            "gave up on after an error (Kafka's uncleanable-partitions-count).",
            value=len(st.uncleanable_partitions))
        ratio = GaugeMetricFamily(
            f"{PREFIX}_log_cleaner_dirty_ratio", "Dirty bytes over cleanable bytes of each "
            "compacted log: it is cleaned once this passes min.cleanable.dirty.ratio.",
            labels=["topic", "partition"])
        for (topic, index), value in sorted(cleaner.dirty_ratios().items()):
            ratio.add_metric([topic, str(index)], value)
        yield ratio

    # -- security --------------------------------------------------------------------------------
    def _security(self, m: BrokerMetrics) -> Iterator[Metric]:
        """Kafka's successful/failed-authentication-total per listener and mechanism (TLS
        handshakes count under mechanism "SSL"), and authorization denials."""
        auth = CounterMetricFamily(
            f"{PREFIX}_authentications", "Authentications by listener, mechanism and result.",
            labels=["listener", "mechanism", "result"])
        if m.auth_stats is not None:
            for result, counts in (("success", m.auth_stats.successes),
                                   ("failure", m.auth_stats.failures)):
                for (listener, mechanism), n in sorted(counts.items()):
                    auth.add_metric([listener, mechanism, result], n)
        for listener, n in sorted((m.tls_failures or {}).items()):
            auth.add_metric([listener, "SSL", "failure"], n)
        yield auth
        reauth = CounterMetricFamily(
            f"{PREFIX}_reauthentications", "Re-authentications on an authenticated connection "
            "(connections.max.reauth.ms), by listener, mechanism and result.",
            labels=["listener", "mechanism", "result"])
        if m.auth_stats is not None:
            for result, counts in (("success", m.auth_stats.reauth_successes),
                                   ("failure", m.auth_stats.reauth_failures)):
                for (listener, mechanism), n in sorted(counts.items()):
                    reauth.add_metric([listener, mechanism, result], n)
        yield reauth
        denied = CounterMetricFamily(
            f"{PREFIX}_authorization_denials", "Requests or parts of requests the authorizer "
            "denied, by operation and resource type.", labels=["operation", "resource_type"])
        if m.authorizer is not None:
            for (operation, resource_type), n in sorted(m.authorizer.denials.items()):
                denied.add_metric([operation, resource_type], n)
        yield denied

    # -- client telemetry ------------------------------------------------------------------------
    def _telemetry(self, telemetry: Any) -> Iterator[Metric]:
        pushes = CounterMetricFamily(
            f"{PREFIX}_client_telemetry_pushes", "PushTelemetry requests by result (accepted, "
            "or Kafka's error name).", labels=["result"])
        for result, n in sorted(telemetry.pushes.items()):
            pushes.add_metric(["accepted" if result == "NONE" else result], n)
        yield pushes
        pushed = CounterMetricFamily(f"{PREFIX}_client_telemetry_bytes",
                                     "Bytes of client metrics accepted by PushTelemetry.")
        pushed.add_metric([], telemetry.pushed_bytes)
        yield pushed


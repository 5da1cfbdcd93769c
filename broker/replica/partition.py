"""Replica state of one partition on this broker: its log, high watermark and leader epoch.

The high watermark is the offset up to which data counts as committed. With one replica that is
the offset made durable as the flush policy defines it: every append once written when the
policy does not fsync per message, and the last fsynced offset when it does
(log.flush.interval.messages=1).
Replication will move it later; nothing else here assumes a single replica.

A partition whose log dir failed is offline (Kafka's HostedPartition.Offline): it stays known
to the broker, so requests for it are answered KAFKA_STORAGE_ERROR rather than as unknown, and
its high watermark stays where the last good write (or fsync) put it.

The leader epoch is Kafka's: 0 on a single broker, set by ``make_leader`` when the cluster
elects this replica leader in a new epoch. Every batch appended is stamped with it, and the
start of each epoch goes into the log's epoch cache; requests that carry a client's idea of
the epoch are checked against it (``check_leader_epoch``, Kafka's checkCurrentLeaderEpoch).
"""

from __future__ import annotations

from collections import deque

from broker.log.log import AppendInfo, AppendOrigin, Log, OffsetOutOfRangeError
from protocol.errors import ErrorCode, KafkaError

#: a request's current leader epoch meaning "do not check" (Kafka's NO_PARTITION_LEADER_EPOCH).
NO_LEADER_EPOCH = -1

#: DeleteRecords' offset meaning "up to the high watermark" (Kafka's DeleteRecordsRequest).
HIGH_WATERMARK = -1


class Partition:
    __slots__ = (
        "topic", "index", "key", "log", "high_watermark", "leader_epoch", "hw_gated_by_flush",
        "appended_bytes", "hw_bytes", "flush_pending", "flush_again", "_unwritten",
        "leader_epoch_start_offset",
    )

    #: bumped whenever any partition's leader epoch changes: answers that hold leader epochs
    #: (the Metadata cache) compare it to know they are stale.
    leader_epoch_changes = 0

    def __init__(self, topic: str, index: int, log: Log, hw_gated_by_flush: bool) -> None:
        self.topic = topic
        self.index = index
        # (topic, index), made once: every dict keyed by partition shares this one tuple.
        self.key: tuple[str, int] = (topic, index)
        self.log = log
        self.high_watermark = log.log_end_offset  # recovered data is durable
        log.on_high_watermark_updated(self.high_watermark)
        # A single broker leads in the latest epoch its log knows (0 for a new log); the
        # cluster moves it on with make_leader.
        epoch = max(log.latest_epoch or 0, 0)
        self.leader_epoch = epoch
        #: the log end offset when this replica became leader in its epoch (Kafka's
        #: leaderEpochStartOffsetOpt).
        self.leader_epoch_start_offset = log.log_end_offset
        if not log.offline:
            log.maybe_assign_epoch_start_offset(epoch, log.log_end_offset)
        self.hw_gated_by_flush = hw_gated_by_flush
        # Bytes appended since start, and that count at the high watermark: a DelayedFetch
        # estimates what became readable from their difference without reading the log.
        self.appended_bytes = 0
        self.hw_bytes = 0
        self.flush_pending = False
        self.flush_again = False
        # (end offset, appended bytes) of each append still queued for the log dir's writer;
        # made on the first such append (an empty deque is 600 bytes, times every partition).
        self._unwritten: deque[tuple[int, int]] | None = None

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def offline(self) -> bool:
        """Whether its log dir failed; it stays offline until the broker restarts."""
        return self.log.offline

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: below it every transaction is decided; read_committed reads stop here."""
        first_unstable = self.log.first_unstable_offset
        hw = self.high_watermark
        return hw if first_unstable is None or first_unstable >= hw else first_unstable

    @property
    def low_watermark(self) -> int:
        """Kafka's lowWatermarkIfLeader: the least log start offset of the replicas, so the
        offset below which no replica still holds data; with no other replica, this log's."""
        return self.log.log_start_offset

    def make_leader(self, leader_epoch: int) -> bool:
        """Lead in ``leader_epoch`` (Kafka's makeLeader): a newer epoch starts at the log end
        offset, in the epoch cache too; the current one changes nothing; an older one is
        refused (ValueError: the cluster never goes back). Whether the epoch is new."""
        if leader_epoch < self.leader_epoch:
            raise ValueError(f"leader epoch {leader_epoch} of {self.topic}-{self.index} is "
                             f"older than the current {self.leader_epoch}")
        if leader_epoch == self.leader_epoch:
            return False
        Partition.leader_epoch_changes += 1
        self.leader_epoch = leader_epoch
        log = self.log
        self.leader_epoch_start_offset = log.log_end_offset
        if not log.offline:
            log.maybe_assign_epoch_start_offset(leader_epoch, log.log_end_offset)
        return True

    def check_leader_epoch(self, current_leader_epoch: int) -> ErrorCode:
        """Kafka's checkCurrentLeaderEpoch: a client whose epoch is older than ours is
        fenced, a newer one knows of an epoch we do not yet; -1 is not checked."""
        if current_leader_epoch == NO_LEADER_EPOCH:
            return ErrorCode.NONE
        if current_leader_epoch < self.leader_epoch:
            return ErrorCode.FENCED_LEADER_EPOCH
        if current_leader_epoch > self.leader_epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH
        return ErrorCode.NONE

    def last_offset_for_leader_epoch(self, current_leader_epoch: int, leader_epoch: int
                                     ) -> tuple[ErrorCode, int, int]:
        """OffsetForLeaderEpoch for this partition (Kafka's lastOffsetForLeaderEpoch):
        ``(error, epoch, end offset)``, -1 and -1 when the epoch cache has no answer."""
        error = self.check_leader_epoch(current_leader_epoch)
        if error != ErrorCode.NONE:
            return error, -1, -1
        found = self.log.end_offset_for_epoch(leader_epoch)
        if found is None:
            return ErrorCode.NONE, -1, -1
        return ErrorCode.NONE, found[0], found[1]

    def delete_records(self, offset: int) -> int:
        """Kafka's deleteRecordsOnLeader: move the log start offset up to ``offset``
        (HIGH_WATERMARK: the high watermark) and answer the low watermark.

        Refused with POLICY_VIOLATION when the cleanup policy lacks ``delete`` (a compacted
        log keeps its latest values), and OFFSET_OUT_OF_RANGE below 0 or past the high
        watermark: records not yet committed can not be deleted. An offset at or below the
        current start changes nothing.
        """
        log = self.log
        if not log.config.delete:
            raise KafkaError(ErrorCode.POLICY_VIOLATION,
                             f"records of partition {self.topic}-{self.index} can not be "
                             "deleted due to the configured policy")
        hw = self.high_watermark
        target = hw if offset == HIGH_WATERMARK else offset
        if target < 0:
            raise OffsetOutOfRangeError(
                f"the offset {target} for partition {self.topic}-{self.index} is not valid")
        if target > hw:
            raise OffsetOutOfRangeError(
                f"can not move the log start offset of {self.topic}-{self.index} to {target}: "
                f"past the high watermark {hw}")
        log.maybe_increment_log_start_offset(target, "client record deletion")
        return self.low_watermark

    def append(self, records: bytearray | memoryview | bytes, now_ms: int,
               origin: AppendOrigin = AppendOrigin.CLIENT) -> tuple[AppendInfo, bool]:
        """Append as leader; returns the append info and whether the high watermark moved."""
        return self._appended(self.log.append(records, now_ms, leader_epoch=self.leader_epoch,
                                              origin=origin))

    def append_end_txn_marker(self, producer_id: int, producer_epoch: int,
                              coordinator_epoch: int, commit: bool, now_ms: int
                              ) -> tuple[AppendInfo, bool]:
        """Append a COMMIT or ABORT marker as the transaction coordinator asks."""
        return self._appended(self.log.append_end_txn_marker(
            producer_id, producer_epoch, coordinator_epoch, commit, now_ms,
            leader_epoch=self.leader_epoch))

    def _appended(self, info: AppendInfo) -> tuple[AppendInfo, bool]:
        self.appended_bytes += info.size
        if self.hw_gated_by_flush:
            if info.size and self.log.writes_on_writer:
                if self._unwritten is None:
                    self._unwritten = deque()
                self._unwritten.append((self.log.log_end_offset, self.appended_bytes))
            return info, False
        return info, self.advance_high_watermark(self.log.log_end_offset, self.appended_bytes)

    def on_durable(self, end_offset: int) -> bool:
        """The log dir's writer wrote and fsynced everything below ``end_offset``: the high
        watermark follows while gated by the flush. Whether it moved."""
        unwritten = self._unwritten
        if unwritten is None:
            return False
        at_bytes = -1
        while unwritten and unwritten[0][0] <= end_offset:
            at_bytes = unwritten.popleft()[1]
        if at_bytes < 0 or not self.hw_gated_by_flush:
            return False
        return self.advance_high_watermark(end_offset, at_bytes)

    def advance_high_watermark(self, offset: int, at_bytes: int) -> bool:
        if offset <= self.high_watermark:
            return False
        self.high_watermark = offset
        self.hw_bytes = at_bytes
        self.log.on_high_watermark_updated(offset)
        return True

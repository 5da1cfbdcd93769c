"""DescribeLogDirs (key 35): each of ``log.dirs`` with the partitions it holds and their sizes.

As Kafka's ReplicaManager.describeLogDirs: every configured dir is answered, by absolute path,
in ``log.dirs`` order; an offline one with KAFKA_STORAGE_ERROR and nothing else. A partition's
size is its segments' bytes; its offset lag is how far its high watermark is ahead of its log
end (never, on the leader: 0). v4 adds the volume's total and usable bytes (usable: what this
process may still write, as Java's FileStore.getUsableSpace). A null topic list asks for
every partition; named partitions this broker does not hold are left out. Needs DESCRIBE on
the cluster: without it no dir is answered and the error (v3+) is CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
from kafka.protocol.admin import DescribeLogDirsResponse

from broker.apis.authorize import cluster_allowed
from broker.log.log import Log
from broker.replica.replica_manager import ReplicaManager, TopicPartition
from broker.security.acl import AclOperation
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 35  # DescribeLogDirs
VERSIONS = range(1, 5)

logger = structlog.get_logger("broker.apis")

Result = DescribeLogDirsResponse.DescribeLogDirsResult
TopicEntry = Result.DescribeLogDirsTopic
PartitionEntry = TopicEntry.DescribeLogDirsPartition

#: Kafka's INVALID_OFFSET_LAG: the partition has no replica here to measure.
INVALID_OFFSET_LAG = -1


def handle(ctx: ApiContext, request: Request) -> DescribeLogDirsResponse:
    req = request.body
    if not cluster_allowed(ctx, request, AclOperation.DESCRIBE):
        return DescribeLogDirsResponse(throttle_time_ms=0,
                                       error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                       results=[])
    log_manager = ctx.topics.log_manager
    wanted: set[TopicPartition] | None = None
    if req.topics is not None:
        wanted = {(t.topic, p) for t in req.topics for p in t.partitions}
    logs_by_dir: dict[Path, list[Log]] = {}
    for tp, plog in sorted(log_manager.logs.items()):
        log_dir = log_manager.log_dir_of(tp)
        if log_dir is not None and (wanted is None or tp in wanted):
            logs_by_dir.setdefault(log_dir, []).append(plog)
    results = []
    for log_dir in log_manager.log_dirs:
        path = str(log_dir.absolute())
        if not log_manager.is_log_dir_online(log_dir):
            results.append(Result(error_code=ErrorCode.KAFKA_STORAGE_ERROR, log_dir=path,
                                  topics=[]))
            continue
        try:
            usage = shutil.disk_usage(log_dir)
        except OSError:
            logger.exception("describing a log dir failed", log_dir=path)
            results.append(Result(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, log_dir=path,
                                  topics=[]))
            continue
        results.append(Result(
            error_code=ErrorCode.NONE, log_dir=path,
            topics=_topics(ctx.replica_manager, logs_by_dir.get(log_dir, [])),
            total_bytes=usage.total, usable_bytes=usage.free))
    return DescribeLogDirsResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                                   results=results)


def _topics(rm: ReplicaManager, logs: Iterable[Log]) -> list[TopicEntry]:
    by_topic: dict[str, list[PartitionEntry]] = {}
    for plog in logs:
        by_topic.setdefault(plog.topic, []).append(PartitionEntry(
            partition_index=plog.partition, partition_size=plog.size_in_bytes,
            offset_lag=_offset_lag(rm, plog), is_future_key=False))
    return [TopicEntry(name=name, partitions=parts) for name, parts in by_topic.items()]


def _offset_lag(rm: ReplicaManager, plog: Log) -> int:
    partition = rm.partitions.get((plog.topic, plog.partition))
    if partition is None or partition.log is not plog or partition.offline:
        return INVALID_OFFSET_LAG
    return max(partition.high_watermark - plog.log_end_offset, 0)

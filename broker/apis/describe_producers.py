"""DescribeProducers (key 61): the producers a partition's state knows, as the admin tools
list them (kafka-transactions.sh describe-producers, Admin.describeProducers).

Each active producer's epoch, last sequence and timestamp, the coordinator epoch of its last
marker and the first offset of its open transaction (-1 when none), read from the partition's
producer state; an unknown or offline partition answers Kafka's error for it. Each topic needs
READ (every partition TOPIC_AUTHORIZATION_FAILED), checked after the name's validity and
before its existence, as Kafka checks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeProducersResponse

from broker.apis.authorize import MESSAGES, allowed
from broker.metadata.file_store import validate_topic_name
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 61  # DescribeProducers
VERSIONS = range(0, 1)

TopicResponse = DescribeProducersResponse.TopicResponse
PartitionResponse = TopicResponse.PartitionResponse
ProducerState = PartitionResponse.ProducerState


def handle(ctx: ApiContext, request: Request) -> DescribeProducersResponse:
    topics = []
    for t in request.body.topics:
        partitions = []
        if ctx.authorizer.enabled and _valid(t.name) and not allowed(
                ctx, request, AclOperation.READ, ResourceType.TOPIC, t.name):
            denied = ErrorCode.TOPIC_AUTHORIZATION_FAILED
            topics.append(TopicResponse(name=t.name, partitions=[
                PartitionResponse(partition_index=index, error_code=denied,
                                  error_message=MESSAGES[denied], active_producers=[])
                for index in t.partition_indexes]))
            continue
        for index in t.partition_indexes:
            partition, error = ctx.replica_manager.partition_or_error((t.name, index))
            if partition is None:
                partitions.append(PartitionResponse(partition_index=index, error_code=error,
                                                    error_message=None, active_producers=[]))
                continue
            producers = [
                ProducerState(producer_id=e.producer_id, producer_epoch=e.producer_epoch,
                              last_sequence=e.last_seq, last_timestamp=e.last_timestamp,
                              coordinator_epoch=e.coordinator_epoch,
                              current_txn_start_offset=e.current_txn_first_offset)
                for e in partition.log.producer_state.active_producers()
            ]
            partitions.append(PartitionResponse(partition_index=index, error_code=0,
                                                error_message=None, active_producers=producers))
        topics.append(TopicResponse(name=t.name, partitions=partitions))
    return DescribeProducersResponse(throttle_time_ms=0, topics=topics)


def _valid(name: str) -> bool:
    """A legal topic name: an illegal one is answered its own error, not a refusal."""
    try:
        validate_topic_name(name)
    except KafkaError:
        return False
    return True

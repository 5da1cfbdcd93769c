"""ElectLeaders (key 43): preferred (v0+) and unclean (v1+, KIP-460) leader elections, as
kafka-leader-election and AdminClient.electLeaders ask for them.

Needs ALTER on the cluster: without it every partition named (none when the request names
none) and, from v1, the top-level error are CLUSTER_AUTHORIZATION_FAILED. In cluster mode the
controller decides each partition (Kafka's processReplicaLeaderElection): elected (NONE), or
ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE, ELIGIBLE_LEADERS_NOT_AVAILABLE,
UNKNOWN_TOPIC_OR_PARTITION; it answers once this broker's metadata shows the new leaders, or
REQUEST_TIMED_OUT for those not seen within the request's timeout (Kafka's DelayedElectLeader).
A broker that is not the controller answers NOT_CONTROLLER for each partition named, as
Kafka's ZooKeeper-era brokers did (clients send it to the controller). ``topic_partitions``
null means every partition, and then partitions that needed no election are left out of the
answer. A single broker leads every partition of its own (one replica each, its preferred
one): ELECTION_NOT_NEEDED for every known partition, UNKNOWN_TOPIC_OR_PARTITION otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import ElectLeadersResponse

from broker.apis.authorize import cluster_allowed
from broker.cluster.broker_node import ClusterNode
from broker.cluster.store import StoreError
from broker.cluster.topic_controller import (
    ELECTION_NOT_NEEDED_MESSAGE,
    UNKNOWN_PARTITION_MESSAGE,
    ElectionResult,
    ElectionType,
    TopicController,
)
from broker.security.acl import AclOperation
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 43  # ElectLeaders
VERSIONS = range(0, 3)

TopicResult = ElectLeadersResponse.ReplicaElectionResult
PartitionResult = TopicResult.PartitionResult
TopicPartition = tuple[str, int]
#: How often the answer checks this broker's metadata for the elected leaders.
LEADER_SEEN_POLL_S = 0.02


def response(results: Mapping[TopicPartition, ElectionResult], every: bool,
             error: ErrorCode = ErrorCode.NONE) -> ElectLeadersResponse:
    """Kafka's answer: results grouped by topic; for an every-partition request, those that
    needed no election left out."""
    by_topic: dict[str, list[Any]] = {}
    for (topic, p), r in sorted(results.items()):
        if every and r.error_code is ErrorCode.ELECTION_NOT_NEEDED:
            continue
        by_topic.setdefault(topic, []).append(PartitionResult(
            partition_id=p, error_code=r.error_code, error_message=r.message))
    return ElectLeadersResponse(throttle_time_ms=0, error_code=error, replica_election_results=[
        TopicResult(topic=t, partition_result=ps) for t, ps in by_topic.items()])


def handle(ctx: ApiContext, request: Request) -> Any:
    req = request.body
    named = (None if req.topic_partitions is None else
             sorted({(t.topic, p) for t in req.topic_partitions for p in t.partitions}))
    every = named is None
    if not cluster_allowed(ctx, request, AclOperation.ALTER):
        denied = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return response({tp: ElectionResult(denied) for tp in named or ()}, every, denied)
    try:
        election = ElectionType(getattr(req, "election_type", ElectionType.PREFERRED))
    except ValueError:  # Kafka's ElectionType.valueOf refuses it: the request is invalid
        invalid = ErrorCode.INVALID_REQUEST
        return response({tp: ElectionResult(invalid) for tp in named or ()}, every, invalid)
    if ctx.cluster is None:
        return response(_single_broker(ctx, named), every)
    return _on_controller(ctx.cluster, named, election, req.timeout_ms)


def _single_broker(ctx: ApiContext, named: list[TopicPartition] | None
                   ) -> dict[TopicPartition, ElectionResult]:
    """This broker leads every partition, each its only (so preferred) replica."""
    topics = ctx.topics.metadata.topics
    if named is None:
        named = [(name, p) for name, info in topics.items() for p in range(info.partitions)]
    out = {}
    for topic, p in named:
        info = topics.get(topic)
        out[(topic, p)] = (
            ElectionResult(ErrorCode.ELECTION_NOT_NEEDED, ELECTION_NOT_NEEDED_MESSAGE)
            if info is not None and 0 <= p < info.partitions
            else ElectionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_PARTITION_MESSAGE))
    return out


def _on_controller(cluster: ClusterNode, named: list[TopicPartition] | None,
                   election: ElectionType, timeout_ms: int) -> Any:
    every = named is None

    def not_controller() -> ElectLeadersResponse:
        return response({tp: ElectionResult(ErrorCode.NOT_CONTROLLER) for tp in named or ()},
                        every)

    async def work(controller: TopicController) -> ElectLeadersResponse:
        try:
            results = await controller.elect(named, election)
        except StoreError as e:
            timed_out = ElectionResult(ErrorCode.REQUEST_TIMED_OUT,
                                       f"The cluster metadata could not be written: {e}")
            return response({tp: timed_out for tp in named or ()}, every)
        return response(await _seen(cluster, results, timeout_ms / 1000), every)

    done = cluster.on_controller(work, not_controller)
    return not_controller() if done is None else done


async def _seen(cluster: ClusterNode, results: dict[TopicPartition, ElectionResult],
                timeout_s: float) -> dict[TopicPartition, ElectionResult]:
    """The results once this broker's metadata names every elected leader; those it does not
    name within ``timeout_s`` become REQUEST_TIMED_OUT (Kafka's DelayedElectLeader)."""
    waiting = {tp for tp, r in results.items() if r.state is not None}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(timeout_s, 0.0)
    while waiting:
        waiting = {tp for tp in waiting if not _shows(cluster, tp, results[tp])}
        if not waiting or loop.time() >= deadline:
            break
        await asyncio.sleep(LEADER_SEEN_POLL_S)
    out = dict(results)
    for tp in waiting:
        out[tp] = ElectionResult(ErrorCode.REQUEST_TIMED_OUT)
    return out


def _shows(cluster: ClusterNode, tp: TopicPartition, result: ElectionResult) -> bool:
    topic = cluster.cache.topic(tp[0])
    partition = topic.partitions.get(tp[1]) if topic is not None else None
    state = result.state
    return (partition is not None and state is not None
            and partition.leader_epoch >= state.leader_epoch)

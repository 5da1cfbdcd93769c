"""The current leader of a partition a Produce or Fetch was refused on (KIP-951): Kafka's
``KafkaApis.getCurrentLeader``, which fills the CurrentLeader tagged field of a partition
answered NOT_LEADER_OR_FOLLOWER (Produce v10+; Fetch v16+, also FENCED_LEADER_EPOCH) and
lists the leaders' endpoints in the response's NodeEndpoints, so the client can move to the
new leader without waiting for a metadata refresh.

As Kafka: a partition this broker serves answers with its own id and leader epoch; any other
is read from the metadata (in cluster mode the cluster's cache: the leader the controller
wrote, -1 when offline; -1/-1 when the partition is unknown). An endpoint is given only for a
leader that is live and has the request's listener.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

TopicPartition = tuple[str, int]

#: The errors Kafka names the current leader for.
PRODUCE_LEADER_ERRORS = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER})
FETCH_LEADER_ERRORS = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER,
                                 ErrorCode.FENCED_LEADER_EPOCH})
PRODUCE_CURRENT_LEADER_VERSION = 10
FETCH_CURRENT_LEADER_VERSION = 16  # KafkaApis fills it from v16, though the field is v12+


@dataclass(frozen=True, slots=True)
class LeaderEndpoint:
    """A leader as NodeEndpoints lists it."""

    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass(frozen=True, slots=True)
class CurrentLeaders:
    """Per partition (leader id, leader epoch); the endpoints of the leaders that have one."""

    leaders: dict[TopicPartition, tuple[int, int]]
    endpoints: list[LeaderEndpoint]


def current_leaders(ctx: ApiContext, request: Request, tps: Iterable[TopicPartition]
                    ) -> CurrentLeaders:
    listener = request.connection.session.listener
    cluster = ctx.cluster
    served = ctx.replica_manager.partitions
    own = ctx.node.node_id
    leaders: dict[TopicPartition, tuple[int, int]] = {}
    endpoints: dict[int, LeaderEndpoint] = {}
    for tp in tps:
        partition = served.get(tp)
        if partition is not None:
            leaders[tp] = (own, partition.leader_epoch)
        elif cluster is not None:
            topic = cluster.cache.topic(tp[0])
            p = topic.partitions.get(tp[1]) if topic is not None else None
            leaders[tp] = (p.leader, p.leader_epoch) if p is not None else (-1, -1)
        else:
            leaders[tp] = (-1, -1)
        leader = leaders[tp][0]
        if leader < 0 or leader in endpoints:
            continue
        endpoint = _endpoint(ctx, listener, leader)
        if endpoint is not None:
            endpoints[leader] = endpoint
    return CurrentLeaders(leaders, list(endpoints.values()))


def _endpoint(ctx: ApiContext, listener: str, node_id: int) -> LeaderEndpoint | None:
    """The live broker's advertised endpoint on ``listener`` (Kafka's getAliveBrokerNode)."""
    cluster = ctx.cluster
    if cluster is None:
        if node_id != ctx.node.node_id:
            return None
        host, port = ctx.node.address(listener)
        return LeaderEndpoint(node_id, host, port, None)
    broker = cluster.cache.broker(node_id)
    if broker is None:
        return None
    address = broker.endpoints.get(listener)
    if address is None:
        return None
    return LeaderEndpoint(node_id, address[0], address[1], broker.rack)

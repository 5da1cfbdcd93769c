"""DescribeCluster (key 60): this broker is the whole cluster and its controller; in cluster
mode, every live broker and the controller this broker knows of.

The broker answered is this listener's advertised endpoint. The cluster's authorized
operations, when asked, are the principal's, or none at all (0) without DESCRIBE on the
cluster, as Kafka's AuthHelper answers them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeClusterResponse

from broker.apis.authorize import cluster_ops

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 60  # DescribeCluster
VERSIONS = range(0, 2)


Broker = DescribeClusterResponse.DescribeClusterBroker


def handle(ctx: ApiContext, request: Request) -> DescribeClusterResponse:
    listener = request.connection.session.listener
    cluster = ctx.cluster
    if cluster is not None:
        # Cluster mode: every live broker with its endpoint on this listener.
        brokers = [Broker(broker_id=b.node_id, host=b.host, port=b.port, rack=b.rack,
                          is_fenced=False) for b in cluster.cache.live_brokers(listener)]
        cluster_id, controller_id = cluster.cluster_id, cluster.controller_id
    else:
        host, port = ctx.node.address(listener)
        brokers = [Broker(broker_id=ctx.node.node_id, host=host, port=port, rack=None,
                          is_fenced=False)]
        cluster_id, controller_id = ctx.topics.metadata.cluster_id, ctx.node.node_id
    return DescribeClusterResponse(
        throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1,
        cluster_id=cluster_id, controller_id=controller_id, brokers=brokers,
        authorized_operations=cluster_ops(
            ctx, request, request.body.include_cluster_authorized_operations),
    )

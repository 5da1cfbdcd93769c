"""DescribeCluster (key 60): this broker is the whole cluster and its controller."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeClusterResponse

if TYPE_CHECKING:
    from broker.network.request import Request
    from broker.server import Broker


def handle(broker: Broker, request: Request) -> DescribeClusterResponse:
    host, port = broker.advertised
    node = DescribeClusterResponse.DescribeClusterBroker(broker_id=broker.node_id, host=host,
                                                         port=port, rack=None, is_fenced=False)
    return DescribeClusterResponse(
        throttle_time_ms=0, error_code=0, error_message=None, endpoint_type=1,
        cluster_id=broker.metadata.cluster_id, controller_id=broker.node_id, brokers=[node],
        authorized_operations=None,
    )

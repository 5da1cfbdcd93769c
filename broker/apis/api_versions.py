"""ApiVersions (key 18): the versions we serve, straight from the registry.

A version we do not know is answered with UNSUPPORTED_VERSION and the full list in v0 form, so a
newer client can retry with a version we share (KIP-511). Without ``consumer`` in
group.coordinator.rebalance.protocols the consumer group APIs are not advertised, as Kafka
leaves them out, so clients fall back to the classic protocol. The client telemetry APIs are
advertised only when client metrics are asked for (``minibroker.client.telemetry.metrics``), as
Kafka lists them only when a telemetry receiver is configured: a client that does not see them
never asks, and librdkafka prints no telemetry notice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import ApiVersionsResponse

from protocol.errors import ErrorCode
from protocol.messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
    GetTelemetrySubscriptionsRequest,
    PushTelemetryRequest,
)
from protocol.registry import APIS

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 18  # ApiVersions
VERSIONS = range(0, 5)

CONSUMER_GROUP_KEYS = frozenset((ConsumerGroupHeartbeatRequest.API_KEY,
                                 ConsumerGroupDescribeRequest.API_KEY))
_KEYS = [
    ApiVersionsResponse.ApiVersion(api_key=s.key, min_version=s.advertised_min,
                                   max_version=s.max_version)
    for s in sorted(APIS.values(), key=lambda s: s.key)
]
TELEMETRY_KEYS = frozenset((GetTelemetrySubscriptionsRequest.API_KEY,
                            PushTelemetryRequest.API_KEY))
# (consumer group protocol served, telemetry advertised) -> the list answered.
_LISTS = {
    (consumer, telemetry): [
        k for k in _KEYS
        if (consumer or k.api_key not in CONSUMER_GROUP_KEYS)
        and (telemetry or k.api_key not in TELEMETRY_KEYS)
    ]
    for consumer in (False, True) for telemetry in (False, True)
}


def handle(ctx: ApiContext, request: Request) -> ApiVersionsResponse:
    error = ErrorCode.NONE if request.body is not None else ErrorCode.UNSUPPORTED_VERSION
    consumer = "consumer" in ctx.config["group.coordinator.rebalance.protocols"]
    return ApiVersionsResponse(
        error_code=error, api_keys=_LISTS[(consumer, ctx.telemetry.advertised)],
        throttle_time_ms=0,
        supported_features=[], finalized_features_epoch=-1, finalized_features=[],
        zk_migration_ready=False,
    )

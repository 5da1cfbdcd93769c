"""PushTelemetry (key 72): a client's metrics, checked as Kafka checks them and counted.

UNKNOWN_SUBSCRIPTION_ID for an instance or subscription the broker does not know (the client
then asks for its subscription again), TELEMETRY_TOO_LARGE over ``telemetry.max.bytes``,
UNSUPPORTED_COMPRESSION_TYPE for a codec not offered, INVALID_REQUEST for a zero instance id or
a push after the instance said it was terminating.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.apis.get_telemetry_subscriptions import ZERO_UUID
from protocol.messages import PushTelemetryResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 72  # PushTelemetry
VERSIONS = range(0, 1)


def handle(ctx: ApiContext, request: Request) -> PushTelemetryResponse:
    req = request.body
    error = ctx.telemetry.push(req.client_instance_id or ZERO_UUID, req.subscription_id,
                               req.terminating, req.compression_type, req.metrics or b"")
    return PushTelemetryResponse(throttle_time_ms=0, error_code=error)

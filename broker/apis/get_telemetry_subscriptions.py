"""GetTelemetrySubscriptions (key 71): which client metrics to push, and how often (KIP-714).

A client sending a zero instance id is given a new one, and a known one is answered its own
(as Kafka's ClientMetricsManager answers, whatever the spec's wording); the subscription asks
for the metric prefixes of ``minibroker.client.telemetry.metrics``, none by default.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from broker.client_telemetry import ACCEPTED_COMPRESSION
from protocol.messages import GetTelemetrySubscriptionsResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 71  # GetTelemetrySubscriptions
VERSIONS = range(0, 1)

ZERO_UUID = uuid.UUID(int=0)


def handle(ctx: ApiContext, request: Request) -> GetTelemetrySubscriptionsResponse:
    asked = request.body.client_instance_id or ZERO_UUID  # the codec reads zero as None
    instance_id, sub = ctx.telemetry.subscribe(asked)
    return GetTelemetrySubscriptionsResponse(
        throttle_time_ms=0, error_code=0,
        client_instance_id=instance_id,
        subscription_id=sub.subscription_id, accepted_compression_types=list(ACCEPTED_COMPRESSION),
        push_interval_ms=sub.push_interval_ms, telemetry_max_bytes=ctx.telemetry.max_bytes,
        delta_temporality=True, requested_metrics=sub.requested_metrics)

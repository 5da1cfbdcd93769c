"""FindCoordinator (key 10): no group or transaction coordinator runs yet (issue 5).

It is served anyway, answering COORDINATOR_NOT_AVAILABLE (what Kafka answers while its offsets
topic is not ready; clients retry), because librdkafka only enables LZ4 for brokers that
advertise this API, and consumers configured with a group.id ask for it at start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import FindCoordinatorResponse

from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.network.request_channel import Request
    from broker.server import Broker

_NOT_AVAILABLE = ErrorCode.COORDINATOR_NOT_AVAILABLE
_MESSAGE = "no group coordinator on this broker yet"


def handle(broker: Broker, request: Request) -> FindCoordinatorResponse:
    req = request.body
    if request.version >= 4:
        coordinators = [
            FindCoordinatorResponse.Coordinator(key=key, node_id=-1, host="", port=-1,
                                                error_code=_NOT_AVAILABLE, error_message=_MESSAGE)
            for key in req.coordinator_keys
        ]
        return FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)
    return FindCoordinatorResponse(throttle_time_ms=0, error_code=_NOT_AVAILABLE,
                                   error_message=_MESSAGE, node_id=-1, host="", port=-1)

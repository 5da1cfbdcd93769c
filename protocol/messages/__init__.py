"""Codecs for the APIs the pinned kafka-python has no classes for.

Each JSON file here describes one message the way Kafka's message specs do (same field
names, types, versions and defaults, our own descriptions); kafka-python's ApiMessage builds
the encoder and decoder from it, exactly as it does from the specs it ships, so these classes
behave like the rest of the registry's.
"""

from kafka.protocol.api_message import ApiMessage

_HERE = __name__


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_HERE):
    pass


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_HERE):
    pass


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_HERE):
    pass


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_HERE):
    pass


class GetTelemetrySubscriptionsRequest(ApiMessage, load_json=_HERE):
    pass


class GetTelemetrySubscriptionsResponse(ApiMessage, load_json=_HERE):
    pass


class PushTelemetryRequest(ApiMessage, load_json=_HERE):
    pass


class PushTelemetryResponse(ApiMessage, load_json=_HERE):
    pass


class ControlledShutdownRequest(ApiMessage, load_json=_HERE):  # type: ignore[call-arg]
    pass


class ControlledShutdownResponse(ApiMessage, load_json=_HERE):  # type: ignore[call-arg]
    pass

"""Client telemetry (KIP-714): the subscriptions clients ask for and the pushes they send.

Clients that see GetTelemetrySubscriptions advertised ask which metrics to push. ApiVersions
lists the two APIs only when ``minibroker.client.telemetry.metrics`` asks for some, as Kafka
lists them only when a telemetry receiver (a ClientTelemetry metrics reporter) is configured;
a client that asks anyway is answered, as Kafka answers it. Pushes are checked as Kafka's
ClientMetricsManager checks them (instance id, subscription id, codec, size) and counted; their
contents are not kept.

Client instances are bounded (the oldest is forgotten first), so clients inventing instance ids
cannot grow the broker's memory.
"""

from __future__ import annotations

import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from broker.config import BrokerConfig
from protocol.errors import ErrorCode

MAX_INSTANCES = 16384
# Codecs a push may use, Kafka's preference order: zstd, lz4, gzip, snappy.
ACCEPTED_COMPRESSION = (4, 3, 1, 2)
NO_COMPRESSION = 0


@dataclass(slots=True)
class TelemetrySubscription:
    subscription_id: int
    requested_metrics: list[str]
    push_interval_ms: int


@dataclass(slots=True)
class _ClientInstance:
    subscription_id: int
    terminating: bool = False


class ClientTelemetry:
    @classmethod
    def of(cls, cfg: BrokerConfig) -> ClientTelemetry:
        return cls(cfg["minibroker.client.telemetry.metrics"],
                   cfg["minibroker.client.telemetry.push.interval.ms"], cfg["telemetry.max.bytes"])

    def __init__(self, metrics: list[str], push_interval_ms: int, max_bytes: int) -> None:
        self.requested_metrics = [m for m in metrics if m]
        self.push_interval_ms = push_interval_ms
        self.max_bytes = max_bytes
        self._instances: OrderedDict[uuid.UUID, _ClientInstance] = OrderedDict()
        self.pushes: dict[str, int] = {}  # result (error name or "accepted") -> count
        self.pushed_bytes = 0

    @property
    def advertised(self) -> bool:
        """Whether ApiVersions lists GetTelemetrySubscriptions and PushTelemetry: only when
        metrics are asked for, so by default clients neither ask nor push nor warn."""
        return bool(self.requested_metrics)

    def subscribe(self, instance_id: uuid.UUID) -> tuple[uuid.UUID, TelemetrySubscription]:
        """The instance id (a new one for a client that sent zero) and its subscription."""
        if instance_id.int == 0:
            instance_id = uuid.uuid4()
        sid = self._subscription_id(instance_id)
        self._remember(instance_id, _ClientInstance(sid))
        return instance_id, TelemetrySubscription(sid, list(self.requested_metrics),
                                                  self.push_interval_ms)

    def push(self, instance_id: uuid.UUID, subscription_id: int, terminating: bool,
             compression: int, payload: bytes) -> ErrorCode:
        error = self._check_push(instance_id, subscription_id, compression, payload)
        if error is ErrorCode.NONE:
            self.pushed_bytes += len(payload)
            self._instances[instance_id].terminating = terminating
        self.pushes[error.name] = self.pushes.get(error.name, 0) + 1
        return error

    def _check_push(self, instance_id: uuid.UUID, subscription_id: int, compression: int,
                    payload: bytes) -> ErrorCode:
        if instance_id.int == 0:
            return ErrorCode.INVALID_REQUEST
        instance = self._instances.get(instance_id)
        if instance is None or instance.subscription_id != subscription_id:
            return ErrorCode.UNKNOWN_SUBSCRIPTION_ID
        if instance.terminating:
            return ErrorCode.INVALID_REQUEST
        if compression != NO_COMPRESSION and compression not in ACCEPTED_COMPRESSION:
            return ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        if len(payload) > self.max_bytes:
            return ErrorCode.TELEMETRY_TOO_LARGE
        return ErrorCode.NONE

    def _subscription_id(self, instance_id: uuid.UUID) -> int:
        """Stable for one instance and one configuration, as Kafka derives it from both."""
        text = f"{instance_id}|{','.join(self.requested_metrics)}|{self.push_interval_ms}"
        return zlib.crc32(text.encode()) - (1 << 31)

    def _remember(self, instance_id: uuid.UUID, instance: _ClientInstance) -> None:
        self._instances[instance_id] = instance
        self._instances.move_to_end(instance_id)
        while len(self._instances) > MAX_INSTANCES:
            self._instances.popitem(last=False)

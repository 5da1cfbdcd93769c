"""The replication keys of server.properties reach the replica manager, and a single broker
answers a replication factor above 1 as a cluster of one live broker does
(INVALID_REPLICATION_FACTOR in Kafka's words), default.replication.factor standing in for -1."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from kafka.protocol.admin import CreateTopicsRequest

from broker.apis import create_topics
from broker.config import BrokerConfig
from protocol.errors import ErrorCode
from tests.support.components import build, parse


def test_the_keys_and_their_kafka_defaults() -> None:
    cfg = BrokerConfig.from_dict({})
    assert (cfg["min.insync.replicas"], cfg["replica.lag.time.max.ms"],
            cfg["replica.high.watermark.checkpoint.interval.ms"],
            cfg["default.replication.factor"]) == (1, 30_000, 5000, 1)
    assert BrokerConfig.from_dict({"default.replication.factor": "3"})[
        "default.replication.factor"] == 3, "a cluster may default to more than one replica"


async def test_replica_lag_time_reaches_the_replica_manager(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"replica.lag.time.max.ms": "1234"}, offsets_topic=False)
    try:
        assert c.replica_manager.replica_lag_time_max_ms == 1234
        assert c.replica_manager.hw_checkpoints is not None
    finally:
        await c.close()


async def _create(c: Any, replication_factor: int) -> Any:
    topic = CreateTopicsRequest.CreatableTopic
    request = parse(CreateTopicsRequest[7](timeout_ms=5000, validate_only=False, topics=[
        topic(name="t", num_partitions=1, replication_factor=replication_factor,
              assignments=[], configs=[])]))
    out = create_topics.handle(c.context, request)
    if inspect.isawaitable(out):
        out = await out
    [result] = out.topics
    return result


async def test_a_single_broker_serves_one_replica(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"default.replication.factor": "3"}, offsets_topic=False)
    try:
        by_default = await _create(c, -1)
        assert (by_default.error_code, by_default.error_message) == (
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor: 3 larger than available brokers: 1.")
        two = await _create(c, 2)
        assert (two.error_code, two.error_message) == (
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor: 2 larger than available brokers: 1.")
        zero = await _create(c, 0)
        assert zero.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
        assert "t" not in c.metadata.topics
        one = await _create(c, 1)
        assert (one.error_code, one.replication_factor) == (0, 1)
    finally:
        await c.close()

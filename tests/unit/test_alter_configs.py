"""AlterConfigs, IncrementalAlterConfigs and DescribeConfigs through their handlers, parsed as a
client's bytes, on the broker's real parts: Kafka's error codes, the override set each call
leaves, its effect on the partitions' logs at once, the broker's dynamic layers (cluster
default and per broker) reaching topics without an override, persistence across a rebuild on
the same dir, and the source and synonyms DescribeConfigs shows for each value."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import (
    AlterConfigsRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)

from broker.apis import alter_configs, describe_configs, incremental_alter_configs
from broker.config import BrokerConfig
from broker.metadata.dynamic_config import CLEANER_KEYS, thread_count_check
from protocol import registry
from protocol.errors import ErrorCode
from tests.support.components import Components, build, parse, wire_roundtrip
from tests.support.log_batches import plain

E = ErrorCode
TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
# ConfigSource ids on the wire.
TOPIC_SRC, DYN_BROKER, DYN_DEFAULT, STATIC, DEFAULT = 1, 2, 3, 4, 5
SERVED = {AlterConfigsRequest: (0, 2), IncrementalAlterConfigsRequest: (0, 1)}
Alter = AlterConfigsRequest.AlterConfigsResource
Inc = IncrementalAlterConfigsRequest.AlterConfigsResource


@pytest.fixture(autouse=True)
def served(monkeypatch: pytest.MonkeyPatch) -> None:
    """The versions these handlers implement, as the registry must serve them (added for the
    parse when the registry does not list them yet)."""
    for req, (low, high) in SERVED.items():
        spec = registry.APIS.get(req.API_KEY)
        if spec is None:
            resp = alter_configs.AlterConfigsResponse if req is AlterConfigsRequest else \
                incremental_alter_configs.IncrementalAlterConfigsResponse
            monkeypatch.setitem(registry.APIS, req.API_KEY,
                                registry._spec(low, high, req, resp))
        else:
            assert (spec.min_version, spec.max_version) == (low, high), req.__name__


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"log.retention.ms": "600000"})
    c.topics.create_topic("plain", 2, {})
    c.topics.create_topic("own", 1, {"retention.ms": "1000", "cleanup.policy": "delete"})
    yield c
    await c.close()


async def call(c: Components, handle: Callable[..., Any], request: Any) -> Any:
    req = parse(request)
    return wire_roundtrip(req, handle(c.context, req))


async def legacy(c: Components, resources: list[tuple[int, str, dict[str, str | None]]],
                 validate_only: bool = False, version: int = 1) -> list[tuple[int, str]]:
    req = AlterConfigsRequest(resources=[
        Alter(resource_type=t, resource_name=n, configs=[
            Alter.AlterableConfig(name=k, value=v) for k, v in cfg.items()])
        for t, n, cfg in resources], validate_only=validate_only, version=version)
    resp = await call(c, alter_configs.handle, req)
    return [(r.error_code, r.error_message) for r in resp.responses]


async def incremental(c: Components, resources: list[tuple[int, str, list[tuple]]],
                      validate_only: bool = False, version: int = 1) -> list[int]:
    req = IncrementalAlterConfigsRequest(resources=[
        Inc(resource_type=t, resource_name=n, configs=[
            Inc.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])
        for t, n, ops in resources], validate_only=validate_only, version=version)
    resp = await call(c, incremental_alter_configs.handle, req)
    assert [(r.resource_type, r.resource_name) for r in resp.responses] == [
        (t, n) for t, n, _ in resources]
    return [r.error_code for r in resp.responses]


async def describe(c: Components, rtype: int, name: str, keys: list[str] | None = None,
                   synonyms: bool = True, version: int = 4) -> Any:
    req = DescribeConfigsRequest(resources=[DescribeConfigsRequest.DescribeConfigsResource(
        resource_type=rtype, resource_name=name, configuration_keys=keys)],
        include_synonyms=synonyms, include_documentation=False, version=version)
    [result] = (await call(c, describe_configs.handle, req)).results
    return result


def entries(result: Any) -> dict[str, Any]:
    assert result.error_code == E.NONE, result.error_message
    return {e.name: e for e in result.configs}


def logs(c: Components, topic: str) -> list[Any]:
    return [p.log for (t, _), p in c.replica_manager.partitions.items() if t == topic]


# -- topics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 1, 2])
async def test_alter_configs_replaces_the_whole_override_set_and_applies_it(
        parts: Components, version: int) -> None:
    assert await legacy(parts, [(TOPIC, "own", {"max.message.bytes": "2000"})],
                        version=version) == [(E.NONE, None)]
    assert parts.topics.topic_overrides("own") == {"max.message.bytes": "2000"}  # rest deleted
    [log] = logs(parts, "own")
    assert log.config.max_message_bytes == 2000
    assert log.config.retention_ms == 600000  # the broker's again, the override is gone


async def test_incremental_operations_on_a_topic(parts: Components) -> None:
    ops = [("retention.ms", SET, "5000"), ("cleanup.policy", APPEND, "compact"),
           ("min.cleanable.dirty.ratio", SET, "0.1")]
    assert await incremental(parts, [(TOPIC, "plain", ops)]) == [E.NONE]
    assert parts.topics.topic_overrides("plain") == {
        "retention.ms": "5000", "cleanup.policy": "delete,compact",
        "min.cleanable.dirty.ratio": "0.1"}
    for log in logs(parts, "plain"):
        assert (log.config.retention_ms, log.config.compact, log.config.delete) == (
            5000, True, True)
        assert log.config.min_cleanable_dirty_ratio == 0.1
    ops = [("retention.ms", DELETE, None), ("cleanup.policy", SUBTRACT, "delete")]
    assert await incremental(parts, [(TOPIC, "plain", ops)], version=0) == [E.NONE]
    assert parts.topics.topic_overrides("plain") == {
        "cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.1"}
    assert {(log.config.retention_ms, log.config.delete) for log in logs(parts, "plain")} == {
        (600000, False)}


async def test_append_starts_from_kafkas_topic_default_not_the_broker_setting(
        tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"log.cleanup.policy": "compact"})
    try:
        c.topics.create_topic("t", 1, {})
        assert await incremental(c, [(TOPIC, "t", [("cleanup.policy", APPEND, "compact")])]) \
            == [E.NONE]
        assert c.topics.topic_overrides("t") == {"cleanup.policy": "delete,compact"}
    finally:
        await c.close()


async def test_topic_errors_are_kafkas(parts: Components) -> None:
    cases: list[tuple[str, list[tuple], int]] = [
        ("missing", [("retention.ms", SET, "1")], E.UNKNOWN_TOPIC_OR_PARTITION),
        ("missing", [("retention.ms", SET, "soon")], E.INVALID_CONFIG),  # checked before
        ("plain", [("no.such.key", SET, "1")], E.INVALID_CONFIG),
        ("plain", [("min.cleanable.dirty.ratio", SET, "1.5")], E.INVALID_CONFIG),
        ("plain", [("retention.ms", APPEND, "1")], E.INVALID_CONFIG),  # not a LIST
        ("plain", [("no.such.key", SUBTRACT, "1")], E.INVALID_CONFIG),
        ("plain", [("retention.ms", 7, "1")], E.INVALID_REQUEST),  # no such operation
        ("plain", [("retention.ms", SET, None)], E.INVALID_REQUEST),  # null value
        ("plain", [("retention.ms", SET, "1"), ("retention.ms", DELETE, None)],
         E.INVALID_REQUEST),  # a key twice
        ("", [("retention.ms", SET, "1")], E.INVALID_REQUEST),  # the default topic
        ("bad/name", [("retention.ms", SET, "1")], E.INVALID_TOPIC_EXCEPTION),
        ("plain", [("min.compaction.lag.ms", SET, "10"), ("max.compaction.lag.ms", SET, "5")],
         E.INVALID_CONFIG),  # Kafka's cross-key check
    ]
    for name, ops, code in cases:
        assert await incremental(parts, [(TOPIC, name, ops)]) == [code], (name, ops)
    assert parts.topics.topic_overrides("plain") == {}
    assert await legacy(parts, [(TOPIC, "plain", {"retention.ms": None})]) == [
        (E.INVALID_REQUEST, "Null value not supported for : retention.ms")]
    assert (await legacy(parts, [(7, "x", {})]))[0][0] == E.INVALID_REQUEST


async def test_a_lag_override_is_checked_against_the_broker_default(tmp_path: Path) -> None:
    c = build(tmp_path / "logs", {"log.cleaner.max.compaction.lag.ms": "1000"})
    try:
        c.topics.create_topic("t", 1, {})
        assert await incremental(c, [(TOPIC, "t", [("min.compaction.lag.ms", SET, "2000")])]) \
            == [E.INVALID_CONFIG]
        assert await incremental(c, [(TOPIC, "t", [("min.compaction.lag.ms", SET, "1000")])]) \
            == [E.NONE]
    finally:
        await c.close()


async def test_each_resource_succeeds_or_fails_alone(parts: Components) -> None:
    codes = await incremental(parts, [
        (TOPIC, "plain", [("retention.ms", SET, "7")]),
        (TOPIC, "own", [("retention.ms", SET, "x")]),
        (TOPIC, "plain", [("segment.bytes", SET, "2048")]),  # "plain" twice: both refused
    ])
    assert codes == [E.INVALID_REQUEST, E.INVALID_CONFIG, E.INVALID_REQUEST]
    assert parts.topics.topic_overrides("plain") == {}
    assert await incremental(parts, [(TOPIC, "plain", [("retention.ms", SET, "7")]),
                                     (TOPIC, "own", [("retention.ms", SET, "x")])]) == [
        E.NONE, E.INVALID_CONFIG]
    assert parts.topics.topic_overrides("plain") == {"retention.ms": "7"}


async def test_validate_only_changes_nothing(parts: Components) -> None:
    assert await incremental(parts, [(TOPIC, "own", [("retention.ms", SET, "9")]),
                                     (BROKER, "", [("log.retention.ms", SET, "9")])],
                             validate_only=True) == [E.NONE, E.NONE]
    assert await legacy(parts, [(TOPIC, "own", {})], validate_only=True) == [(E.NONE, None)]
    assert parts.topics.topic_overrides("own")["retention.ms"] == "1000"
    assert parts.config["log.retention.ms"] == 600000
    assert {log.config.retention_ms for log in logs(parts, "plain")} == {600000}


async def test_flush_messages_one_gates_the_high_watermark_and_ungating_releases_it(
        parts: Components) -> None:
    assert await incremental(parts, [(TOPIC, "own", [("flush.messages", SET, "1")])]) == [
        E.NONE]
    [partition] = [p for (t, _), p in parts.replica_manager.partitions.items() if t == "own"]
    assert partition.hw_gated_by_flush
    partition.append(plain(2), 0)
    assert partition.high_watermark == 0  # waits for the fsync
    assert await incremental(parts, [(TOPIC, "own", [("flush.messages", DELETE, None)])]) == [
        E.NONE]
    assert not partition.hw_gated_by_flush and partition.high_watermark == 2


# -- broker dynamic configs ---------------------------------------------------------------------

async def test_a_cluster_default_reaches_topics_without_an_override(parts: Components) -> None:
    assert await incremental(parts, [(BROKER, "", [("log.retention.ms", SET, "42000"),
                                                   ("message.max.bytes", SET, "3000")])]) == [
        E.NONE]
    assert parts.config["log.retention.ms"] == 42000  # the one config object, in place
    assert {log.config.retention_ms for log in logs(parts, "plain")} == {42000}
    assert [log.config.retention_ms for log in logs(parts, "own")] == [1000]
    assert {log.config.max_message_bytes for log in logs(parts, "own")} == {3000}
    assert parts.log_manager.default_config.retention_ms == 42000
    # This broker's own override wins over the cluster default; deleting it falls back.
    assert await incremental(parts, [(BROKER, "1", [("log.retention.ms", SET, "7000")])]) == [
        E.NONE]
    assert {log.config.retention_ms for log in logs(parts, "plain")} == {7000}
    assert await legacy(parts, [(BROKER, "1", {})]) == [(E.NONE, None)]
    assert {log.config.retention_ms for log in logs(parts, "plain")} == {42000}
    # A topic created now starts from the new default.
    parts.topics.create_topic("later", 1, {})
    assert [log.config.retention_ms for log in logs(parts, "later")] == [42000]


async def test_dynamic_configs_survive_a_restart(tmp_path: Path) -> None:
    c = build(tmp_path / "logs")
    c.topics.create_topic("t", 1, {})
    assert await incremental(c, [(BROKER, "", [("log.retention.ms", SET, "5000")]),
                                 (BROKER, "1", [("log.segment.bytes", SET, "4096")]),
                                 (TOPIC, "t", [("retention.bytes", SET, "99999")])]) == [
        E.NONE] * 3
    await c.close()
    c = build(tmp_path / "logs")
    try:
        assert (c.config["log.retention.ms"], c.config["log.segment.bytes"]) == (5000, 4096)
        [log] = logs(c, "t")
        assert (log.config.retention_ms, log.config.segment_bytes,
                log.config.retention_bytes) == (5000, 4096, 99999)
        assert c.topics.dynamic.overrides("") == {"log.retention.ms": "5000"}
    finally:
        await c.close()


async def test_a_persisted_entry_no_longer_valid_is_ignored_at_start(tmp_path: Path) -> None:
    c = build(tmp_path / "logs")
    c.metadata.broker_configs = {"": {"log.retention.ms": "5000", "log.dirs": "/elsewhere",
                                      "log.segment.bytes": "tiny"}}
    c.metadata.save()
    await c.close()
    c = build(tmp_path / "logs")
    try:
        assert c.topics.dynamic.overrides("") == {"log.retention.ms": "5000"}
        assert c.config["log.retention.ms"] == 5000
        assert c.config["log.dirs"] == [str(tmp_path / "logs")]
    finally:
        await c.close()


async def test_broker_errors_are_kafkas(parts: Components) -> None:
    cases: list[tuple[str, list[tuple], int]] = [
        ("", [("log.dirs", SET, "/x")], E.INVALID_REQUEST),  # not dynamic in Kafka
        ("", [("no.such.key", SET, "1")], E.INVALID_REQUEST),
        ("", [("num.io.threads", SET, "9")], E.INVALID_REQUEST),  # nothing here applies it
        ("", [("log.retention.ms", SET, "soon")], E.INVALID_REQUEST),
        ("", [("log.retention.ms", SET, "-2")], E.INVALID_REQUEST),  # below Kafka's minimum
        ("", [("log.cleaner.min.cleanable.ratio", SET, "2")], E.INVALID_REQUEST),
        ("2", [("log.retention.ms", SET, "1")], E.INVALID_REQUEST),  # another broker
        ("one", [("log.retention.ms", SET, "1")], E.INVALID_REQUEST),
        ("", [("log.retention.ms", APPEND, "1")], E.INVALID_CONFIG),  # not a LIST
        ("", [("no.such.key", APPEND, "1")], E.INVALID_CONFIG),
        ("", [("log.retention.ms", 9, "1")], E.INVALID_REQUEST),
    ]
    for name, ops, code in cases:
        assert await incremental(parts, [(BROKER, name, ops)]) == [code], (name, ops)
    assert parts.topics.dynamic.overrides("") == {}
    assert parts.config["log.retention.ms"] == 600000


async def test_a_list_key_appends_at_the_broker(parts: Components) -> None:
    assert await incremental(parts, [(BROKER, "", [("log.cleanup.policy", APPEND,
                                                    "compact")])]) == [E.NONE]
    assert parts.config["log.cleanup.policy"] == ["delete", "compact"]
    assert {log.config.compact for log in logs(parts, "plain")} == {True}


async def test_reconfigurables_validate_then_apply(parts: Components) -> None:
    seen: list[int] = []
    parts.topics.dynamic.add_reconfigurable(
        CLEANER_KEYS, lambda cfg: seen.append(cfg["log.cleaner.threads"]),
        thread_count_check("log.cleaner.threads"))
    # Kafka's rule: at most double, at least half the current count, at least 1.
    assert await incremental(parts, [(BROKER, "", [("log.cleaner.threads", SET, "3")])]) == [
        E.INVALID_REQUEST]
    assert await incremental(parts, [(BROKER, "", [("log.cleaner.threads", SET, "0")])]) == [
        E.INVALID_REQUEST]
    assert seen == []
    assert await incremental(parts, [(BROKER, "", [("log.cleaner.threads", SET, "2")])]) == [
        E.NONE]
    assert seen == [2]
    # An unrelated change does not call it; message.max.bytes is the cleaner's too (Kafka's).
    assert await incremental(parts, [(BROKER, "", [("log.retention.ms", SET, "1")])]) == [
        E.NONE]
    assert seen == [2]
    assert await incremental(parts, [(BROKER, "1", [("message.max.bytes", SET, "5000")])]) == [
        E.NONE]
    assert seen == [2, 2]
    with pytest.raises(ValueError):
        parts.topics.dynamic.add_reconfigurable({"log.dirs"}, lambda cfg: None)


# -- DescribeConfigs ----------------------------------------------------------------------------

async def test_describe_topic_sources_synonyms_and_types(parts: Components) -> None:
    assert await incremental(parts, [(BROKER, "", [("log.segment.bytes", SET, "8192")])]) == [
        E.NONE]
    got = entries(await describe(parts, TOPIC, "own"))
    retention = got["retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == (
        "1000", TOPIC_SRC, False)
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("retention.ms", "1000", TOPIC_SRC), ("log.retention.ms", "600000", STATIC),
        ("log.retention.hours", "168", DEFAULT)]  # Kafka: log.retention.ms has no default
    segment = got["segment.bytes"]
    assert (segment.value, segment.config_source) == ("8192", DYN_DEFAULT)
    assert [(s.name, s.source) for s in segment.synonyms] == [
        ("log.segment.bytes", DYN_DEFAULT), ("log.segment.bytes", DEFAULT)]
    ratio = got["min.cleanable.dirty.ratio"]
    assert (ratio.value, ratio.config_type, ratio.config_source) == ("0.5", 6, DEFAULT)
    assert got["cleanup.policy"].config_type == 7 and got["retention.ms"].config_type == 5
    for key in ("delete.retention.ms", "min.compaction.lag.ms", "max.compaction.lag.ms"):
        assert got[key].config_type == 5 and got[key].config_source == DEFAULT
    assert got["max.compaction.lag.ms"].value == str(2**63 - 1)
    assert await incremental(parts, [(TOPIC, "own", [("min.cleanable.dirty.ratio", SET,
                                                      "1")])]) == [E.NONE]
    assert entries(await describe(parts, TOPIC, "own"))["min.cleanable.dirty.ratio"].value \
        == "1.0"  # as Kafka writes the double back
    plain = await describe(parts, TOPIC, "own", ["retention.ms"], synonyms=False, version=1)
    assert [(e.name, e.synonyms) for e in plain.configs] == [("retention.ms", [])]


async def test_describe_unknown_and_illegal_topics(parts: Components) -> None:
    missing = await describe(parts, TOPIC, "missing")
    assert (missing.error_code, missing.error_message, missing.configs) == (
        E.UNKNOWN_TOPIC_OR_PARTITION, None, [])
    assert (await describe(parts, TOPIC, "bad/name")).error_code == E.INVALID_TOPIC_EXCEPTION
    assert (await describe(parts, 9, "x")).error_code == E.INVALID_REQUEST


async def test_describe_broker_layers(parts: Components) -> None:
    assert await incremental(parts, [(BROKER, "", [("log.retention.ms", SET, "5000")]),
                                     (BROKER, "1", [("log.retention.ms", SET, "6000")])]) == [
        E.NONE, E.NONE]
    node = entries(await describe(parts, BROKER, "1"))
    retention = node["log.retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == (
        "6000", DYN_BROKER, False)
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [
        ("log.retention.ms", "6000", DYN_BROKER), ("log.retention.ms", "5000", DYN_DEFAULT),
        ("log.retention.ms", "600000", STATIC),
        ("log.retention.hours", "168", DEFAULT)]  # Kafka: log.retention.ms has no default
    assert node["log.dirs"].read_only and node["log.dirs"].config_source == STATIC
    assert node["num.partitions"].config_source == DEFAULT
    assert node["num.io.threads"].read_only  # Kafka's dynamic, but nothing here applies it
    factor = node["log.cleaner.io.max.bytes.per.second"]
    assert (factor.value, factor.config_type) == ("1.7976931348623157E308", 6)
    assert node["log.cleaner.dedupe.buffer.size"].config_type == 5
    cluster = entries(await describe(parts, BROKER, ""))
    assert list(cluster) == ["log.retention.ms"]  # only the cluster default's own keys
    assert [(s.value, s.source) for s in cluster["log.retention.ms"].synonyms] == [
        ("5000", DYN_DEFAULT)]
    assert cluster["log.retention.ms"].config_source == DYN_DEFAULT
    assert (await describe(parts, BROKER, "2")).error_code == E.INVALID_REQUEST


def test_the_static_text_is_kept_apart_from_dynamic_layers(tmp_path: Path) -> None:
    cfg = BrokerConfig.from_dict({"log.dirs": str(tmp_path), "log.retention.ms": "5"})
    layered = cfg.layered({"log.retention.ms": "7"}, {"log.segment.bytes": "2048"})
    assert (layered["log.retention.ms"], layered["log.segment.bytes"]) == (7, 2048)
    cfg.update_from(layered)
    assert cfg["log.retention.ms"] == 7 and cfg.static["log.retention.ms"] == "5"
    assert "log.segment.bytes" not in cfg.static

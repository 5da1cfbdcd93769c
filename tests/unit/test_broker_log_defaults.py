"""Broker keys that are the defaults of topic keys (Kafka's ServerTopicConfigSynonyms):
log.roll.jitter.ms (log.roll.jitter.hours), log.index.size.max.bytes,
log.segment.delete.delay.ms and log.preallocate reach every topic without its own value, at
start and when changed dynamically, as Kafka's DynamicLogConfig does; and DescribeConfigs lists
Kafka's other names with their synonyms as Kafka's ConfigHelper does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from tests.support.components import Components, build
from tests.unit.test_alter_configs import (
    BROKER,
    DEFAULT,
    DYN_BROKER,
    DYN_DEFAULT,
    SET,
    STATIC,
    TOPIC,
    TOPIC_SRC,
    describe,
    entries,
    incremental,
    logs,
    served,  # noqa: F401 - the handlers' versions, as test_alter_configs serves them
)

E_NONE, E_INVALID_CONFIG, E_INVALID_REQUEST = 0, 40, 42
HOUR = 3_600_000


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"log.roll.jitter.hours": "2",
                                  "log.index.size.max.bytes": "4096",
                                  "log.segment.delete.delay.ms": "7000",
                                  "log.preallocate": "true",
                                  "log.retention.hours": "24"})
    c.topics.create_topic("plain", 2, {})
    c.topics.create_topic("own", 1, {"segment.jitter.ms": "5", "segment.index.bytes": "8192",
                                     "file.delete.delay.ms": "0", "preallocate": "false"})
    yield c
    await c.close()


def _settings(c: Components, topic: str) -> set[tuple[int, int, int, bool]]:
    return {(log.config.roll_jitter_ms, log.config.max_index_size,
             log.config.file_delete_delay_ms, log.config.preallocate) for log in logs(c, topic)}


def test_jitter_ms_wins_over_hours_as_in_kafka() -> None:
    assert BrokerConfig.from_dict({"log.roll.jitter.hours": "1"})["log.roll.jitter.ms"] == HOUR
    both = {"log.roll.jitter.hours": "1", "log.roll.jitter.ms": "250"}
    assert BrokerConfig.from_dict(both)["log.roll.jitter.ms"] == 250
    assert BrokerConfig.from_dict({})["log.roll.jitter.ms"] == 0


async def test_broker_defaults_reach_topics_without_their_own(parts: Components) -> None:
    assert _settings(parts, "plain") == {(2 * HOUR, 4096, 7000, True)}
    assert _settings(parts, "own") == {(5, 8192, 0, False)}
    # the new segments of a preallocating topic are segment.bytes long on disk
    [log, _] = logs(parts, "plain")
    assert log.active_segment.log_path.stat().st_size == log.config.segment_bytes


async def test_dynamic_changes_reach_existing_logs(parts: Components) -> None:
    assert await incremental(parts, [(BROKER, "", [
        ("log.segment.delete.delay.ms", SET, "100"), ("log.roll.jitter.ms", SET, "9"),
        ("log.index.size.max.bytes", SET, "1024"), ("log.preallocate", SET, "false")])]) == [
        E_NONE]
    assert _settings(parts, "plain") == {(9, 1024, 100, False)}
    assert _settings(parts, "own") == {(5, 8192, 0, False)}  # its own values hold
    # Kafka's other name, dynamically too: the hours stand for the key when ms is not set.
    assert await incremental(parts, [(BROKER, "1", [("log.roll.jitter.ms", 1, None)])]) == [
        E_NONE]
    assert await incremental(parts, [(BROKER, "", [("log.roll.jitter.ms", 1, None),
                                                   ("log.roll.jitter.hours", SET, "3")])]) == [
        E_NONE]
    assert {c[0] for c in _settings(parts, "plain")} == {3 * HOUR}
    assert await incremental(parts, [(BROKER, "", [("log.roll.jitter.hours", SET, "-1")])]) \
        == [E_INVALID_REQUEST]
    assert await incremental(parts, [(BROKER, "", [("log.dir", SET, "/x")])]) == [
        E_INVALID_REQUEST]
    assert await incremental(parts, [(BROKER, "", [("log.roll.hours", 2, "1")])]) == [
        E_INVALID_CONFIG]  # APPEND: Kafka's hours are an INT, not a LIST


async def test_describe_lists_kafkas_other_names_with_their_synonyms(parts: Components) -> None:
    node = entries(await describe(parts, BROKER, "1"))
    hours = node["log.retention.hours"]
    assert (hours.value, hours.config_source, hours.config_type) == ("24", STATIC, 3)
    assert [(s.name, s.value, s.source) for s in hours.synonyms] == [
        ("log.retention.hours", "24", STATIC), ("log.retention.hours", "168", DEFAULT)]
    # Kafka's answer for the key given under another name: null, DEFAULT_CONFIG, and the
    # synonyms before its own name dropped.
    ms = node["log.retention.ms"]
    assert (ms.value, ms.config_source, list(ms.synonyms)) == (None, DEFAULT, [])
    jitter = node["log.roll.jitter.ms"]
    assert (jitter.value, jitter.config_source, jitter.read_only) == (None, DEFAULT, False)
    assert node["log.roll.jitter.hours"].value == "2"
    delay = node["log.segment.delete.delay.ms"]
    assert [(s.name, s.value, s.source) for s in delay.synonyms] == [
        ("log.segment.delete.delay.ms", "7000", STATIC),
        ("log.segment.delete.delay.ms", "60000", DEFAULT)]
    # The retention set in hours is what topics run with.
    topic = entries(await describe(parts, TOPIC, "plain"))
    assert topic["retention.ms"].value == str(24 * HOUR)
    # A dynamic ms over the static hours: listed first, the hours after it.
    assert await incremental(parts, [(BROKER, "1", [("log.retention.ms", SET, "5000")]),
                                     (BROKER, "", [("log.retention.minutes", SET, "3")])]) == [
        E_NONE, E_NONE]
    ms = entries(await describe(parts, BROKER, "1"))["log.retention.ms"]
    assert (ms.value, ms.config_source) == ("5000", DYN_BROKER)
    assert [(s.name, s.value, s.source) for s in ms.synonyms] == [
        ("log.retention.ms", "5000", DYN_BROKER), ("log.retention.minutes", "3", DYN_DEFAULT),
        ("log.retention.hours", "24", STATIC), ("log.retention.hours", "168", DEFAULT)]
    retention = entries(await describe(parts, TOPIC, "plain"))["retention.ms"]
    assert (retention.value, retention.config_source) == ("5000", DYN_BROKER)
    assert retention.synonyms[0].name == "log.retention.ms"
    own = entries(await describe(parts, TOPIC, "own"))
    assert (own["segment.jitter.ms"].value, own["segment.jitter.ms"].config_source) == (
        "5", TOPIC_SRC)
    # Kafka drops the broker's hours: they precede any log.roll.jitter.ms in its list.
    assert [s.name for s in own["segment.jitter.ms"].synonyms] == ["segment.jitter.ms"]

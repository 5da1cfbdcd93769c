"""Group configs (resource type GROUP, Kafka's GroupConfig): DescribeConfigs and
IncrementalAlterConfigs as the handlers answer them, persisted in the metadata file, and the
consumer group coordinator honouring a group's consumer.session.timeout.ms and
consumer.heartbeat.interval.ms at its next heartbeat. Time moves only through ``advance``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import DescribeConfigsRequest, IncrementalAlterConfigsRequest

from broker.apis import describe_configs, incremental_alter_configs
from broker.metadata.file_store import MetadataStore
from protocol.errors import ErrorCode
from tests.support.components import Components, build
from tests.unit.test_consumer_group import GROUP, INTERVAL_MS, OVERRIDES, SESSION_MS, group, hb
from tests.unit.test_handlers import call

GROUP_TYPE, GROUP_CONFIG, DEFAULT_CONFIG = 32, 8, 5
SET, DELETE = 0, 1


@pytest.fixture
async def parts(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", OVERRIDES)
    c.topics.create_topic("a", 4, {})
    yield c
    await c.close()


async def alter(c: Components, group_id: str, *ops: tuple[str, int, str | None]) -> Any:
    inc = IncrementalAlterConfigsRequest.AlterConfigsResource
    resp = await call(c, incremental_alter_configs.handle, IncrementalAlterConfigsRequest[1](
        resources=[inc(resource_type=GROUP_TYPE, resource_name=group_id, configs=[
            inc.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])],
        validate_only=False))
    [out] = resp.responses
    return out


async def describe(c: Components, group_id: str) -> dict[str, tuple[str, int]]:
    res = DescribeConfigsRequest.DescribeConfigsResource
    resp = await call(c, describe_configs.handle, DescribeConfigsRequest[4](
        resources=[res(resource_type=GROUP_TYPE, resource_name=group_id,
                       configuration_keys=None)],
        include_synonyms=True, include_documentation=False))
    [result] = resp.results
    assert result.error_code == 0, result.error_message
    return {e.name: (e.value, e.config_source) for e in result.configs}


async def test_defaults_then_the_groups_own_values_persisted(parts: Components,
                                                             tmp_path: Path) -> None:
    got = await describe(parts, "any-group")  # a group need not exist
    assert got == {
        "consumer.session.timeout.ms": (str(SESSION_MS), DEFAULT_CONFIG),
        "consumer.heartbeat.interval.ms": (str(INTERVAL_MS), DEFAULT_CONFIG),
        "share.session.timeout.ms": ("45000", DEFAULT_CONFIG),
        "share.heartbeat.interval.ms": ("5000", DEFAULT_CONFIG),
        "share.record.lock.duration.ms": ("30000", DEFAULT_CONFIG),
        "share.auto.offset.reset": ("latest", DEFAULT_CONFIG),
    }
    out = await alter(parts, GROUP, ("consumer.session.timeout.ms", SET, "9000"),
                      ("consumer.heartbeat.interval.ms", SET, "700"))
    assert out.error_code == 0, out.error_message
    got = await describe(parts, GROUP)
    assert got["consumer.session.timeout.ms"] == ("9000", GROUP_CONFIG)
    assert got["consumer.heartbeat.interval.ms"] == ("700", GROUP_CONFIG)
    assert (await describe(parts, "other"))["consumer.session.timeout.ms"] == (
        str(SESSION_MS), DEFAULT_CONFIG)
    reloaded = MetadataStore(parts.metadata.path.parent)
    reloaded.load()
    assert reloaded.group_configs == {GROUP: {"consumer.session.timeout.ms": "9000",
                                              "consumer.heartbeat.interval.ms": "700"}}
    out = await alter(parts, GROUP, ("consumer.heartbeat.interval.ms", DELETE, None))
    assert out.error_code == 0
    assert (await describe(parts, GROUP))["consumer.heartbeat.interval.ms"] == (
        str(INTERVAL_MS), DEFAULT_CONFIG)


@pytest.mark.parametrize("key, value, code", [
    ("consumer.session.timeout.ms", "500", ErrorCode.INVALID_CONFIG),  # under the broker's min
    ("consumer.session.timeout.ms", "70000", ErrorCode.INVALID_CONFIG),  # over its max (60000)
    ("consumer.heartbeat.interval.ms", "6000", ErrorCode.INVALID_CONFIG),  # not < the session
    ("consumer.heartbeat.interval.ms", "soon", ErrorCode.INVALID_CONFIG),
    ("share.auto.offset.reset", "never", ErrorCode.INVALID_CONFIG),
    ("no.such.group.key", "1", ErrorCode.INVALID_CONFIG),
])
async def test_bad_values_are_refused_with_kafkas_codes(parts: Components, key: str, value: str,
                                                       code: ErrorCode) -> None:
    out = await alter(parts, GROUP, (key, SET, value))
    assert out.error_code == code, out.error_message
    assert parts.metadata.group_configs.get(GROUP, {}) == {}
    out = await alter(parts, "", ("consumer.session.timeout.ms", SET, "9000"))
    assert out.error_code == ErrorCode.INVALID_REQUEST


async def test_the_coordinator_honours_the_groups_timeouts(parts: Components) -> None:
    """The broker's session is 6 s and interval 0.5 s; the group's own 9 s and 0.7 s are
    answered and enforced from the next heartbeat on, the other groups keep the broker's."""
    joined = hb(parts, "m1", 0)
    assert joined.heartbeat_interval_ms == INTERVAL_MS
    out = await alter(parts, GROUP, ("consumer.session.timeout.ms", SET, "9000"),
                      ("consumer.heartbeat.interval.ms", SET, "700"))
    assert out.error_code == 0
    m1 = group(parts).members["m1"]
    beat = hb(parts, "m1", m1.member_epoch)
    assert beat.error == ErrorCode.NONE and beat.heartbeat_interval_ms == 700
    assert hb(parts, "x1", 0, group="other").heartbeat_interval_ms == INTERVAL_MS
    await parts.advance(SESSION_MS + 1)  # past the broker's session, within the group's
    assert "m1" in group(parts).members
    assert "x1" not in group(parts, "other").members
    await parts.advance(9000 - SESSION_MS)
    assert "m1" not in group(parts).members

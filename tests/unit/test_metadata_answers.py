"""Metadata answers built from the cached topic pieces are byte for byte the answers built
message by message (as kafka-python encodes them), at every served version, and follow every
topic change."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker.apis import metadata
from broker.apis.authorize import authorized_ops
from broker.metadata.file_store import TopicInfo
from broker.security.acl import ResourceType
from protocol.registry import APIS
from protocol.templates import PackedMetadataResponse
from tests.support.components import Components, build, parse

Topic = MetadataResponse.MetadataResponseTopic
PartitionMeta = Topic.MetadataResponsePartition
SPEC = next(spec for spec in APIS.values() if spec.response is MetadataResponse)
VERSIONS = range(SPEC.min_version, SPEC.max_version + 1)


def _build(path: Path) -> Components:
    c = build(path)
    for name, count in (("orders", 3), ("__internal", 2), ("n." * 100, 1), ("wide", 130)):
        c.topics.create_topic(name, count, {})
    return c


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> Components:
    """One broker's parts for the tests that only read (building them takes seconds)."""
    return _build(tmp_path_factory.mktemp("logs"))


def _expected_topic(info: TopicInfo, node: int) -> Topic:
    """A described topic as the handler built it message by message."""
    parts = [PartitionMeta(error_code=0, partition_index=i, leader_id=node, leader_epoch=0,
                           replica_nodes=[node], isr_nodes=[node], offline_replicas=[])
             for i in range(info.partitions)]
    return Topic(error_code=0, name=info.name, topic_id=info.topic_id,
                 is_internal=info.name.startswith("__"), partitions=parts,
                 authorized_operations=None)


def _expected(c: Components, answer: PackedMetadataResponse, topics: list[Topic],
              version: int) -> bytes:
    return bytes(MetadataResponse(**answer.fields, topics=topics).encode(version=version))


def _encoded(answer: Any, version: int) -> bytes:
    data = answer.encode(version=version)
    return b"".join(data) if type(data) is list else bytes(data)


def _request(version: int, topics: list[Any] | None, **flags: Any) -> Any:
    args: dict[str, Any] = {"topics": topics}
    if version >= 4:
        args["allow_auto_topic_creation"] = False
    if version >= 8:
        args["include_topic_authorized_operations"] = flags.get("ops", False)
    if 8 <= version <= 10:
        args["include_cluster_authorized_operations"] = flags.get("ops", False)
    return MetadataRequest[version](**args)


def _every(version: int) -> Any:
    return _request(version, [] if version == 0 else None)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_every_topic_answer_is_the_message_encoded(parts: Components, version: int) -> None:
    node = parts.context.node.node_id
    answer = metadata.handle(parts.context, parse(_every(version)))
    expected = _expected(parts, answer, [_expected_topic(t, node)
                                         for t in parts.metadata.topics.values()], version)
    assert _encoded(answer, version) == expected
    assert _encoded(answer, version) == expected, "kept pieces give the same bytes again"
    assert bytes(answer.to_message().encode(version=version)) == expected
    decoded = PackedMetadataResponse.decode(answer.encode(version), version)
    assert [(t.name, len(t.partitions), t.is_internal) for t in decoded.topics] == [
        (t.name, t.partitions, version >= 1 and t.name.startswith("__"))
        for t in parts.metadata.topics.values()]
    assert {"orders", "__internal", "n." * 100, "wide"} <= {t.name for t in decoded.topics}


@pytest.mark.parametrize("version", VERSIONS)
def test_named_topics_are_the_messages_encoded(parts: Components, version: int) -> None:
    node = parts.context.node.node_id
    store = parts.metadata
    named = ["wide", "orders", "wide"]  # a topic named twice is answered once
    if version >= 4:
        named.append("missing")  # no auto-creation asked
    wanted = [MetadataRequest.MetadataRequestTopic(name=n, topic_id=None) for n in named]
    answer = metadata.handle(parts.context, parse(_request(version, wanted)))
    topics = [_expected_topic(store.topics["wide"], node),
              _expected_topic(store.topics["orders"], node)]
    if version >= 4:
        topics.append(Topic(error_code=3, name="missing", topic_id=None, is_internal=False,
                            partitions=[], authorized_operations=None))
    assert _encoded(answer, version) == _expected(parts, answer, topics, version)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 10])
def test_topics_by_id_are_the_messages_encoded(parts: Components, version: int) -> None:
    node = parts.context.node.node_id
    info = parts.metadata.topics["orders"]
    unknown = uuid.uuid4()
    wanted = [MetadataRequest.MetadataRequestTopic(name=None, topic_id=tid)
              for tid in (info.topic_id, unknown)]
    answer = metadata.handle(parts.context, parse(_request(version, wanted)))
    topics = [Topic(error_code=100, name=None, topic_id=unknown, is_internal=False,
                    partitions=[], authorized_operations=None),
              _expected_topic(info, node)]
    assert _encoded(answer, version) == _expected(parts, answer, topics, version)


@pytest.mark.parametrize("version", [v for v in VERSIONS if v >= 8])
def test_authorized_operations_are_the_messages_encoded(parts: Components,
                                                        version: int) -> None:
    node = parts.context.node.node_id
    request = parse(_request(version, None, ops=True))
    answer = metadata.handle(parts.context, request)
    topics = []
    for info in parts.metadata.topics.values():
        topic = _expected_topic(info, node)
        topic.authorized_operations = authorized_ops(parts.context, request,
                                                     ResourceType.TOPIC, info.name, True)
        topics.append(topic)
    assert _encoded(answer, version) == _expected(parts, answer, topics, version)
    # The principal's operations are never kept: the plain answer is unchanged after them.
    plain = metadata.handle(parts.context, parse(_every(version)))
    assert _encoded(plain, version) == _expected(
        parts, plain, [_expected_topic(t, node) for t in parts.metadata.topics.values()],
        version)


def test_the_answer_follows_every_topic_change(tmp_path: Path) -> None:
    parts = _build(tmp_path / "logs")
    version = SPEC.max_version
    node = parts.context.node.node_id

    def check() -> dict[str, int]:
        answer = metadata.handle(parts.context, parse(_every(version)))
        assert _encoded(answer, version) == _expected(
            parts, answer, [_expected_topic(t, node) for t in parts.metadata.topics.values()],
            version)
        counts = {t.name: len(t.partitions)
                  for t in PackedMetadataResponse.decode(answer.encode(version), version).topics}
        return {name: counts[name] for name in ("orders", "wide", "new") if name in counts}

    assert check() == {"orders": 3, "wide": 130}
    parts.topics.create_topic("new", 4, {})
    assert check() == {"orders": 3, "wide": 130, "new": 4}
    parts.topics.add_partitions("orders", 5)
    assert check() == {"orders": 5, "wide": 130, "new": 4}
    parts.topics.delete_topic("wide")
    assert check() == {"orders": 5, "new": 4}
    old_id = parts.metadata.topics["new"].topic_id
    parts.topics.delete_topic("new")
    parts.topics.create_topic("new", 2, {})  # the same name, a new topic id
    assert parts.metadata.topics["new"].topic_id != old_id
    assert check() == {"orders": 5, "new": 2}


def test_an_unchanged_topic_keeps_its_encoded_piece(tmp_path: Path) -> None:
    parts = _build(tmp_path / "logs")
    version = SPEC.max_version
    cache = metadata.metadata_cache(parts.metadata)
    metadata.handle(parts.context, parse(_every(version))).encode(version)
    every = cache.every_topic(parts.metadata, parts.context.node.node_id)
    wide = cache.led["wide"].encoded(version)
    whole = every.encoded(version)
    again = metadata.handle(parts.context, parse(_every(version)))
    assert any(part is whole for part in again.encode(version)), "the whole answer is kept"
    parts.topics.create_topic("new", 4, {})
    metadata.handle(parts.context, parse(_every(version))).encode(version)
    assert cache.led["wide"].encoded(version) is wide, "only the new topic is encoded"


def test_a_full_answer_for_20000_partitions_is_assembled_not_rebuilt(tmp_path: Path) -> None:
    """Topics recorded straight in the store (the answer reads nothing else): the first
    answer encodes each topic once; the next ones reuse the encoded topics whole (the same
    bytes object), however many partitions there are. How long either takes is a benchmark's
    question (`bench.partitions`, full Metadata), not a test's."""
    c = build(tmp_path / "logs")
    for i in range(200):
        c.metadata.add(f"scale-{i:03d}", 100, {})
    version = SPEC.max_version
    request = parse(_every(version))
    first = metadata.handle(c.context, request).encode(version)
    again = [metadata.handle(c.context, request).encode(version) for _ in range(3)]
    assert isinstance(first, list), "a full answer is sent as parts"
    topics = max(first, key=len)
    assert len(topics) > 20_000 * 20
    for parts_ in again:
        assert any(part is topics for part in parts_), "the topics were encoded again"
    decoded = PackedMetadataResponse.decode(again[-1], version)
    assert sum(len(t.partitions) for t in decoded.topics if t.name.startswith("scale-")) == 20_000

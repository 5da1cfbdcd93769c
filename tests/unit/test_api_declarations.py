"""Each broker/apis module declares its API key and versions; the package finds them, and what
they declare is what the codec registry decodes and ApiVersions advertises."""

from __future__ import annotations

import dataclasses
import re

from broker import apis
from broker.apis import HANDLERS, SERVED, disagreements
from protocol.registry import APIS

# What the broker serves: key -> (lowest handled, highest, lowest advertised). A change here is
# a change of what clients see in ApiVersions, so it is written out rather than derived.
SERVED_TODAY = {
    0: (3, 11, 0),  # Produce
    1: (4, 16, 4),  # Fetch
    2: (1, 8, 1),  # ListOffsets
    3: (0, 12, 0),  # Metadata
    7: (1, 3, 1),  # ControlledShutdown
    8: (2, 9, 2),  # OffsetCommit
    9: (1, 9, 1),  # OffsetFetch
    10: (0, 5, 0),  # FindCoordinator
    11: (0, 9, 0),  # JoinGroup
    12: (0, 4, 0),  # Heartbeat
    13: (0, 5, 0),  # LeaveGroup
    14: (0, 5, 0),  # SyncGroup
    15: (0, 5, 0),  # DescribeGroups
    16: (0, 5, 0),  # ListGroups
    17: (0, 1, 0),  # SaslHandshake
    18: (0, 4, 0),  # ApiVersions
    19: (2, 7, 2),  # CreateTopics
    20: (1, 6, 1),  # DeleteTopics
    21: (0, 2, 0),  # DeleteRecords
    22: (0, 5, 0),  # InitProducerId
    23: (2, 4, 2),  # OffsetForLeaderEpoch
    24: (0, 5, 0),  # AddPartitionsToTxn
    25: (0, 4, 0),  # AddOffsetsToTxn
    26: (0, 4, 0),  # EndTxn
    27: (0, 1, 0),  # WriteTxnMarkers
    28: (0, 4, 0),  # TxnOffsetCommit
    29: (0, 3, 0),  # DescribeAcls
    30: (0, 3, 0),  # CreateAcls
    31: (0, 3, 0),  # DeleteAcls
    32: (1, 4, 1),  # DescribeConfigs
    33: (0, 2, 0),  # AlterConfigs
    35: (1, 4, 1),  # DescribeLogDirs
    36: (0, 2, 0),  # SaslAuthenticate
    37: (0, 3, 0),  # CreatePartitions
    42: (0, 2, 0),  # DeleteGroups
    43: (0, 2, 0),  # ElectLeaders
    44: (0, 1, 0),  # IncrementalAlterConfigs
    47: (0, 0, 0),  # OffsetDelete
    50: (0, 0, 0),  # DescribeUserScramCredentials
    51: (0, 0, 0),  # AlterUserScramCredentials
    60: (0, 1, 0),  # DescribeCluster
    61: (0, 0, 0),  # DescribeProducers
    65: (0, 0, 0),  # DescribeTransactions
    66: (0, 1, 0),  # ListTransactions
    68: (0, 1, 0),  # ConsumerGroupHeartbeat
    69: (0, 0, 0),  # ConsumerGroupDescribe
    71: (0, 0, 0),  # GetTelemetrySubscriptions
    72: (0, 0, 0),  # PushTelemetry
    75: (0, 0, 0),  # DescribeTopicPartitions
}


def test_every_api_module_agrees_with_the_codec_registry() -> None:
    assert disagreements(SERVED) == []
    assert set(HANDLERS) == set(SERVED) == set(APIS)


def test_the_served_versions_are_unchanged() -> None:
    declared = {k: (a.versions.start, a.versions.stop - 1, a.advertised.start)
                for k, a in SERVED.items()}
    assert declared == SERVED_TODAY
    assert all(a.advertised.stop == a.versions.stop for a in SERVED.values())
    registry = {k: (s.min_version, s.max_version, s.advertised_min) for k, s in APIS.items()}
    assert registry == SERVED_TODAY


def test_each_module_is_named_after_its_api() -> None:
    for key, api in SERVED.items():
        snake = re.sub(r"(?<!^)(?=[A-Z])", "_", APIS[key].name).lower()
        assert api.module.__name__ == f"broker.apis.{snake}"
        assert HANDLERS[key] is api.module.handle


def test_a_disagreement_is_named() -> None:
    fetch = SERVED[1]
    narrower = {**SERVED, 1: dataclasses.replace(fetch, versions=range(4, 16),
                                                 advertised=range(4, 16))}
    [problem] = disagreements(narrower)
    assert "broker.apis.fetch" in problem and "range(4, 16)" in problem
    missing = {k: a for k, a in SERVED.items() if k != 75}
    assert disagreements(missing) == ["API key 75 has a codec but no API module"]
    extra = {**SERVED, 1000: dataclasses.replace(fetch, key=1000)}
    assert disagreements(extra) == ["API key 1000 has an API module but no codec"]


def test_helper_modules_declare_nothing() -> None:
    for name in ("authorize", "context"):
        module = getattr(apis, name)
        assert not hasattr(module, "API_KEY"), name

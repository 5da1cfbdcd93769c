"""The classic group protocol on the wire, case by case, against a real broker.

Each request is sent on a raw connection (tests/support/wire.py) so the exact error codes and
generations Kafka's clients depend on are checked, including the parts no client exercises
on demand: MEMBER_ID_REQUIRED, stale generations, session expiry, static-member fencing.
"""

from __future__ import annotations

import pytest
from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.metadata import FindCoordinatorRequest, FindCoordinatorResponse
from structlog.testing import capture_logs

from broker.testing import EmbeddedBroker
from tests.support.clients import create_topic
from tests.support.wire import Wire

NONE, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 0, 22, 25
REBALANCE_IN_PROGRESS, NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND = 27, 68, 69
MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID, INVALID_SESSION_TIMEOUT = 79, 82, 26

OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "500",
    "offsets.topic.num.partitions": "3",
}


@pytest.fixture
def gbroker(broker_factory):
    return broker_factory(OVERRIDES)


def join(group: str, member_id: str = "", session_ms: int = 10_000, instance: str | None = None,
         meta: bytes = b"m1") -> JoinGroupRequest:
    return JoinGroupRequest[9](
        group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=5000,
        member_id=member_id, group_instance_id=instance, protocol_type="consumer",
        protocols=[JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=meta)],
        reason=None)


def sync(group: str, generation: int, member_id: str,
         assignments: dict[str, bytes] | None = None) -> SyncGroupRequest:
    return SyncGroupRequest[5](
        group_id=group, generation_id=generation, member_id=member_id, group_instance_id=None,
        protocol_type="consumer", protocol_name="range",
        assignments=[SyncGroupRequest.SyncGroupRequestAssignment(member_id=m, assignment=a)
                     for m, a in (assignments or {}).items()])


def heartbeat(wire: Wire, group: str, generation: int, member_id: str,
              instance: str | None = None) -> int:
    req = HeartbeatRequest[4](group_id=group, generation_id=generation, member_id=member_id,
                              group_instance_id=instance)
    return wire.request(req, HeartbeatResponse).error_code


def describe(wire: Wire, group: str):
    resp = wire.request(DescribeGroupsRequest[5](groups=[group],
                                                 include_authorized_operations=False),
                        DescribeGroupsResponse)
    return resp.groups[0]


def join_two_steps(wire: Wire, group: str, **kw) -> JoinGroupResponse:
    """v4+: the first join hands out a member id (MEMBER_ID_REQUIRED); the second uses it."""
    first = wire.request(join(group, **kw), JoinGroupResponse)
    assert first.error_code == MEMBER_ID_REQUIRED and first.member_id
    return wire.request(join(group, member_id=first.member_id, **kw), JoinGroupResponse)


def test_find_coordinator_names_this_broker(gbroker):
    wire = Wire(gbroker.port)
    resp = wire.request(FindCoordinatorRequest[4](key_type=0, coordinator_keys=["g1", "g2"]),
                        FindCoordinatorResponse)
    assert [(c.key, c.error_code, c.node_id, c.port) for c in resp.coordinators] == [
        ("g1", 0, 1, gbroker.port), ("g2", 0, 1, gbroker.port)]


def test_single_member_join_sync_heartbeat_leave(gbroker):
    wire = Wire(gbroker.port)
    joined = join_two_steps(wire, "solo")
    assert joined.error_code == NONE and joined.generation_id == 1
    assert joined.leader == joined.member_id and joined.protocol_name == "range"
    assert [(m.member_id, bytes(m.metadata)) for m in joined.members] == [(joined.member_id,
                                                                          b"m1")]
    me = joined.member_id
    synced = wire.request(sync("solo", 1, me, {me: b"assignment-1"}), SyncGroupResponse)
    assert (synced.error_code, bytes(synced.assignment)) == (NONE, b"assignment-1")
    g = describe(wire, "solo")
    assert (g.group_state, g.protocol_data, len(g.members)) == ("Stable", "range", 1)
    assert bytes(g.members[0].member_assignment) == b"assignment-1"
    assert heartbeat(wire, "solo", 1, me) == NONE
    assert heartbeat(wire, "solo", 0, me) == ILLEGAL_GENERATION
    assert heartbeat(wire, "solo", 1, "nobody") == UNKNOWN_MEMBER_ID
    left = wire.request(LeaveGroupRequest[5](group_id="solo", members=[
        LeaveGroupRequest.MemberIdentity(member_id=me, group_instance_id=None, reason="bye")]),
        LeaveGroupResponse)
    assert left.error_code == NONE and [m.error_code for m in left.members] == [NONE]
    assert describe(wire, "solo").group_state == "Empty"
    assert describe(wire, "never-existed").group_state == "Dead"


def test_second_member_triggers_rebalance_and_both_join_next_generation(gbroker):
    a, b = Wire(gbroker.port), Wire(gbroker.port)
    ja = join_two_steps(a, "pair")
    ma = ja.member_id
    assert a.request(sync("pair", 1, ma, {ma: b"all"}), SyncGroupResponse).error_code == NONE
    # b joins: its JoinGroup parks until a rejoins (a learns of it from its heartbeat).
    first = b.request(join("pair"), JoinGroupResponse)
    b.send(join("pair", member_id=first.member_id))
    assert not b.readable(0.3), "the join must wait for the existing member"
    assert heartbeat(a, "pair", 1, ma) == REBALANCE_IN_PROGRESS
    ja2 = a.request(join("pair", member_id=ma), JoinGroupResponse)
    jb = JoinGroupResponse.decode(b.read_frame()[5:], version=9)
    assert ja2.error_code == jb.error_code == NONE
    assert ja2.generation_id == jb.generation_id == 2
    assert ja2.leader == ma and len(ja2.members) == 2 and jb.members == []
    # The follower's sync waits for the leader's; then both get their share.
    b.send(sync("pair", 2, jb.member_id))
    assert not b.readable(0.2)
    assignment = {ma: b"p0", jb.member_id: b"p1"}
    ra = a.request(sync("pair", 2, ma, assignment), SyncGroupResponse)
    rb = SyncGroupResponse.decode(b.read_frame()[5:], version=5)
    assert (bytes(ra.assignment), bytes(rb.assignment)) == (b"p0", b"p1")
    assert describe(a, "pair").group_state == "Stable"


def test_session_expiry_removes_the_member(tmp_path):
    """On the manual clock: the member stays to the last millisecond of its session timeout
    and is gone one millisecond after it."""
    with EmbeddedBroker(tmp_path, clock="manual", **OVERRIDES) as broker, \
            capture_logs() as logs:
        wire = Wire(broker.port)
        try:
            joined = join_two_steps(wire, "expiring", session_ms=600)
            me = joined.member_id
            wire.request(sync("expiring", 1, me, {me: b"x"}), SyncGroupResponse)
            broker.advance(599)
            assert describe(wire, "expiring").group_state == "Stable"  # not before its timeout
            broker.advance(2)
            assert describe(wire, "expiring").group_state == "Empty"
            assert heartbeat(wire, "expiring", 1, me) == UNKNOWN_MEMBER_ID
        finally:
            wire.close()
    assert [e for e in logs if e["event"] == "member removed"
            and e.get("reason") == "session timed out"], logs


def test_session_timeout_bounds(gbroker):
    wire = Wire(gbroker.port)
    resp = wire.request(join("bounds", session_ms=100), JoinGroupResponse)
    assert resp.error_code == INVALID_SESSION_TIMEOUT


def test_static_member_restart_fences_the_old_instance(gbroker):
    old, new = Wire(gbroker.port), Wire(gbroker.port)
    j1 = old.request(join("static", instance="host-1"), JoinGroupResponse)
    assert j1.error_code == NONE  # static members get their id at once
    old.request(sync("static", j1.generation_id, j1.member_id, {j1.member_id: b"a"}),
                SyncGroupResponse)
    new.send(join("static", instance="host-1"))
    j2 = JoinGroupResponse.decode(new.read_frame()[5:], version=9)
    assert j2.error_code == NONE and j2.member_id != j1.member_id
    # KIP-345: no rebalance; the new instance syncs and gets the stored assignment back.
    assert j2.generation_id == j1.generation_id
    synced = new.request(sync("static", j2.generation_id, j2.member_id), SyncGroupResponse)
    assert (synced.error_code, bytes(synced.assignment)) == (NONE, b"a")
    assert heartbeat(old, "static", j2.generation_id, j1.member_id, "host-1") == \
        FENCED_INSTANCE_ID
    assert heartbeat(new, "static", j2.generation_id, j2.member_id, "host-1") == NONE


def test_commits_survive_a_crash_and_delete_groups(gbroker):
    create_topic(gbroker.bootstrap, "committed", partitions=2)
    wire = Wire(gbroker.port)
    joined = join_two_steps(wire, "keeper")
    me = joined.member_id
    wire.request(sync("keeper", 1, me, {me: b"both"}), SyncGroupResponse)
    def commit(generation: int) -> OffsetCommitRequest:
        topic = OffsetCommitRequest.OffsetCommitRequestTopic
        return OffsetCommitRequest[9](
            group_id="keeper", generation_id_or_member_epoch=generation, member_id=me,
            group_instance_id=None, topics=[topic(name="committed", partitions=[
                topic.OffsetCommitRequestPartition(
                    partition_index=i, committed_offset=10 + i, committed_leader_epoch=0,
                    committed_metadata=f"meta{i}") for i in range(2)])])

    resp = wire.request(commit(1), OffsetCommitResponse)
    assert [p.error_code for p in resp.topics[0].partitions] == [NONE, NONE]
    resp = wire.request(commit(7), OffsetCommitResponse)
    assert [p.error_code for p in resp.topics[0].partitions] == [ILLEGAL_GENERATION] * 2

    gbroker.kill()
    gbroker.start()
    wire = Wire(gbroker.port)
    fetched = wire.request(OffsetFetchRequest[8](groups=[
        OffsetFetchRequest.OffsetFetchRequestGroup(group_id="keeper", topics=None)],
        require_stable=True), OffsetFetchResponse)
    got = {(t.name, p.partition_index): (p.committed_offset, p.metadata)
           for t in fetched.groups[0].topics for p in t.partitions}
    assert got == {("committed", 0): (10, "meta0"), ("committed", 1): (11, "meta1")}
    g = describe(wire, "keeper")
    assert g.group_state == "Stable" and [m.member_id for m in g.members] == [me]
    listed = wire.request(ListGroupsRequest[5](states_filter=[], types_filter=[]),
                          ListGroupsResponse)
    assert ("keeper", "consumer", "Stable") in {
        (x.group_id, x.protocol_type, x.group_state) for x in listed.groups}

    deleted = wire.request(DeleteGroupsRequest[2](groups_names=["keeper"]), DeleteGroupsResponse)
    assert deleted.results[0].error_code == NON_EMPTY_GROUP
    wire.request(LeaveGroupRequest[5](group_id="keeper", members=[
        LeaveGroupRequest.MemberIdentity(member_id=me, group_instance_id=None, reason=None)]),
        LeaveGroupResponse)
    for expected in (NONE, GROUP_ID_NOT_FOUND):
        deleted = wire.request(DeleteGroupsRequest[2](groups_names=["keeper"]),
                               DeleteGroupsResponse)
        assert deleted.results[0].error_code == expected
    gbroker.kill()
    gbroker.start()
    wire = Wire(gbroker.port)
    assert describe(wire, "keeper").group_state == "Dead"  # the tombstones were replayed

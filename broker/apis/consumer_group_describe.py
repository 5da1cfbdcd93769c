"""ConsumerGroupDescribe (key 69, v0): a consumer group as the consumer protocol sees it.

Group epoch, assignment epoch, assignor, and each member's epoch, subscription, current and
target assignment (topic ids with their names). A group that does not exist, or is a classic
group, answers GROUP_ID_NOT_FOUND: the admin client then falls back to DescribeGroups.

As Kafka's handler: UNSUPPORTED_VERSION unless the consumer protocol is enabled; each group
needs DESCRIBE (GROUP_AUTHORIZATION_FAILED, listed first); its authorized operations, when
asked, are the principal's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.apis.authorize import allowed, authorized_ops, bitfield
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode
from protocol.messages import ConsumerGroupDescribeResponse

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.group.consumer_group import ConsumerGroup
    from broker.group.consumer_member import ConsumerGroupMember, Partitions
    from broker.network.request import Request

API_KEY = 69  # ConsumerGroupDescribe
VERSIONS = range(0, 1)

Described = ConsumerGroupDescribeResponse.DescribedGroup
Member = Described.Member
Assignment = Member.Assignment
TopicPartitions = Assignment.TopicPartitions


def handle(ctx: ApiContext, request: Request) -> ConsumerGroupDescribeResponse:
    req = request.body
    asked = bool(req.include_authorized_operations)
    groups = []
    if not ctx.groups.consumer.config.enabled:
        groups = [_error(gid, ErrorCode.UNSUPPORTED_VERSION) for gid in req.group_ids]
        return ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=groups)
    wanted = []
    for gid in req.group_ids:
        if allowed(ctx, request, AclOperation.DESCRIBE, ResourceType.GROUP, gid):
            wanted.append(gid)
        else:
            groups.append(_error(gid, ErrorCode.GROUP_AUTHORIZATION_FAILED))
    for gid in wanted:
        if not gid:
            groups.append(_error(gid, ErrorCode.INVALID_GROUP_ID))
            continue
        if (moved := ctx.groups.coordinator_error(gid)) is not None:
            groups.append(_error(gid, moved))
            continue
        group = ctx.groups.groups.get_consumer(gid)
        if group is None:
            classic = gid in ctx.groups.groups
            groups.append(_error(gid, ErrorCode.GROUP_ID_NOT_FOUND,
                                 f"Group {gid} is not a consumer group." if classic
                                 else f"Group {gid} not found."))
            continue
        ops = authorized_ops(ctx, request, ResourceType.GROUP, gid, asked)
        groups.append(_described(ctx, group, bitfield(ops)))
    return ConsumerGroupDescribeResponse(throttle_time_ms=0, groups=groups)


def _error(gid: str, code: ErrorCode, message: str | None = None) -> Described:
    return Described(error_code=code, error_message=message, group_id=gid, group_state="",
                     group_epoch=-1, assignment_epoch=-1, assignor_name="", members=[])


def _described(ctx: ApiContext, group: ConsumerGroup, ops: int) -> Described:
    consumer = ctx.groups.consumer
    names = {info.topic_id: name for name, info in consumer.metadata.topics.items()}
    return Described(
        error_code=0, error_message=None, group_id=group.group_id,
        group_state=group.state.value, group_epoch=group.group_epoch,
        assignment_epoch=group.assignment_epoch,
        assignor_name=group.preferred_assignor(consumer.config.assignors[0]),
        members=[_member(m, group.target_assignment.get(m.member_id, {}), names)
                 for m in group.members.values()],
        authorized_operations=ops)


def _member(m: ConsumerGroupMember, target: Partitions, names: dict) -> Member:
    return Member(
        member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
        member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
        subscribed_topic_names=list(m.subscribed_topic_names),
        subscribed_topic_regex=m.subscribed_topic_regex,
        assignment=_assignment(m.assigned, names), target_assignment=_assignment(target, names))


def _assignment(partitions: Partitions, names: dict) -> Assignment:
    """Topics that no longer exist are left out, as Kafka leaves out ids it cannot name."""
    return Assignment(topic_partitions=[
        TopicPartitions(topic_id=topic_id, topic_name=names[topic_id], partitions=sorted(parts))
        for topic_id, parts in sorted(partitions.items(), key=lambda kv: str(kv[0]))
        if topic_id in names])

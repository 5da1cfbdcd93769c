"""SyncGroup (key 14): the leader hands in the assignment; every member gets its share.

Needs READ on the group (GROUP_AUTHORIZATION_FAILED, nothing assigned).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.consumer import SyncGroupResponse

from broker.apis.authorize import allowed
from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 14  # SyncGroup
VERSIONS = range(0, 6)


def handle(ctx: ApiContext, request: Request):  # type: ignore[no-untyped-def]
    req = request.body
    coordinator = ctx.groups
    if not allowed(ctx, request, AclOperation.READ, ResourceType.GROUP, req.group_id):
        return _response((ErrorCode.GROUP_AUTHORIZATION_FAILED, b""), (None, None))
    result = coordinator.sync_group(
        req.group_id, req.generation_id, req.member_id, getattr(req, "group_instance_id", None),
        getattr(req, "protocol_type", None), getattr(req, "protocol_name", None),
        {a.member_id: bytes(a.assignment) for a in req.assignments},
    )
    group = coordinator.groups.get_classic(req.group_id)
    names = (group.protocol_type, group.protocol_name) if group else (None, None)
    if coordinator.groups.get_consumer(req.group_id) is not None:
        # A classic member of a consumer group: Kafka echoes the request's protocol.
        names = (getattr(req, "protocol_type", None), getattr(req, "protocol_name", None))
    return result.then(lambda r: _response(r, names))


def _response(result: tuple[ErrorCode, bytes], names: tuple[str | None, str | None]
              ) -> SyncGroupResponse:
    error, assignment = result
    return SyncGroupResponse(throttle_time_ms=0, error_code=error, protocol_type=names[0],
                             protocol_name=names[1], assignment=assignment)

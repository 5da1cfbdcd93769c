"""DescribeAcls (key 29): DESCRIBE on the cluster, then the ACLs the filter matches, grouped by
resource pattern as Kafka groups them.

v0 has no pattern type field (it decodes as LITERAL, which Kafka also makes of ANY there), so a
v0 answer holds only LITERAL ACLs, as v0 can carry no other. A filter naming a code Kafka does
not know (UNKNOWN) makes the request unreadable to Kafka, which closes the connection; so does
this broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeAclsResponse

from broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from protocol.errors import ErrorCode, InvalidRequest

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 29  # DescribeAcls
VERSIONS = range(0, 4)

Resource = DescribeAclsResponse.DescribeAclsResource
Description = Resource.AclDescription


def handle(ctx: ApiContext, request: Request) -> DescribeAclsResponse:
    req = request.body
    acl_filter = AclBindingFilter(
        ResourceType(req.resource_type_filter), req.resource_name_filter,
        PatternType(req.pattern_type_filter), req.principal_filter, req.host_filter,
        AclOperation(req.operation), AclPermissionType(req.permission_type))
    if acl_filter.is_unknown():
        raise InvalidRequest(f"DescribeAcls: the filter contains unknown elements: {acl_filter}")
    if not ctx.authorizer.authorize(request.connection.session, AclOperation.DESCRIBE,
                                    ResourceType.CLUSTER, CLUSTER_NAME):
        return _error(ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                      "Request DescribeAcls is not authorized.")
    if not ctx.authorizer.enabled:
        return _error(ErrorCode.SECURITY_DISABLED, "No Authorizer is configured on the broker")
    return DescribeAclsResponse(throttle_time_ms=0, error_code=0, error_message=None,
                                resources=resources(ctx.authorizer.describe_acls(acl_filter)))


def resources(bindings: list[AclBinding]) -> list[Resource]:
    """One entry per resource pattern, its ACLs under it (bindings arrive sorted)."""
    grouped: dict[tuple[int, str, int], list[Description]] = {}
    for b in bindings:
        grouped.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            Description(principal=b.principal, host=b.host, operation=b.operation,
                        permission_type=b.permission_type))
    return [Resource(resource_type=rtype, resource_name=name, pattern_type=ptype, acls=acls)
            for (rtype, name, ptype), acls in grouped.items()]


def _error(code: int, message: str) -> DescribeAclsResponse:
    return DescribeAclsResponse(throttle_time_ms=0, error_code=code, error_message=message,
                                resources=[])

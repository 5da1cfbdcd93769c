"""DeleteAcls (key 31): ALTER on the cluster, then each filter removes the ACLs it matches
(Kafka's MATCH and ANY rules) and lists them.

v0 has no pattern type field (it decodes as LITERAL, which Kafka also makes of ANY there). A
filter naming a code Kafka does not know (UNKNOWN) makes the request unreadable to Kafka, which
closes the connection; so does this broker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from kafka.protocol.admin import DeleteAclsResponse

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

API_KEY = 31  # DeleteAcls
VERSIONS = range(0, 4)

FilterResult = DeleteAclsResponse.DeleteAclsFilterResult
MatchingAcl = FilterResult.DeleteAclsMatchingAcl

logger = structlog.get_logger("broker.security")


def handle(ctx: ApiContext, request: Request) -> Any:
    filters = [acl_filter(f) for f in request.body.filters]
    for f in filters:
        if f.is_unknown():
            raise InvalidRequest(f"DeleteAcls: filters contain unknown elements: {f}")
    if not ctx.authorizer.authorize(request.connection.session, AclOperation.ALTER,
                                    ResourceType.CLUSTER, CLUSTER_NAME):
        return _all(len(filters), ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "Request DeleteAcls is not authorized.")
    if not ctx.authorizer.enabled:
        return _all(len(filters), ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")
    try:
        deleted = ctx.authorizer.delete_acls(filters)
    except Exception:  # the metadata file could not be written: nothing was removed
        logger.exception("ACL deletions not saved", filters=len(filters))
        return _all(len(filters), ErrorCode.UNKNOWN_SERVER_ERROR,
                    "The server experienced an unexpected error when processing the request.")
    return ctx.authorizer.state.answer(DeleteAclsResponse(throttle_time_ms=0, filter_results=[
        FilterResult(error_code=0, error_message=None,
                     matching_acls=[_matching(b) for b in bindings]) for bindings in deleted]))


def acl_filter(f: Any) -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType(f.resource_type_filter), f.resource_name_filter,
        PatternType(f.pattern_type_filter), f.principal_filter, f.host_filter,
        AclOperation(f.operation), AclPermissionType(f.permission_type))


def _matching(b: AclBinding) -> MatchingAcl:
    return MatchingAcl(error_code=0, error_message=None, resource_type=b.resource_type,
                       resource_name=b.resource_name, pattern_type=b.pattern_type,
                       principal=b.principal, host=b.host, operation=b.operation,
                       permission_type=b.permission_type)


def _all(n: int, code: int, message: str) -> DeleteAclsResponse:
    return DeleteAclsResponse(throttle_time_ms=0, filter_results=[
        FilterResult(error_code=code, error_message=message, matching_acls=[])
        for _ in range(n)])

"""CreateAcls (key 30): ALTER on the cluster, then each ACL created or refused on its own.

v0 has no pattern type field (it decodes as LITERAL). A creation naming a code Kafka does not
know (UNKNOWN) makes the request unreadable to Kafka, which closes the connection; so does this
broker. A creation Kafka's AclControlManager refuses (ANY or MATCH types, an empty name, a
CLUSTER name other than kafka-cluster, a principal without a type) is answered INVALID_REQUEST
alone (Kafka's broker fails the whole request with UNKNOWN_SERVER_ERROR when the types are
ANY or MATCH; its Java Admin refuses those before sending, with INVALID_REQUEST).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import CreateAclsResponse

from broker.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from protocol.errors import ErrorCode, InvalidRequest

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 30  # CreateAcls
VERSIONS = range(0, 4)

Result = CreateAclsResponse.AclCreationResult


def handle(ctx: ApiContext, request: Request) -> Any:
    creations = request.body.creations
    bindings = [binding(c) for c in creations]
    for b in bindings:
        if unknown_element(b):
            raise InvalidRequest(f"CreateAcls: creations contain unknown elements: {b}")
    if not ctx.authorizer.authorize(request.connection.session, AclOperation.ALTER,
                                    ResourceType.CLUSTER, CLUSTER_NAME):
        return _all(len(bindings), ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    "Request CreateAcls is not authorized.")
    if not ctx.authorizer.enabled:
        return _all(len(bindings), ErrorCode.SECURITY_DISABLED, "No Authorizer is configured.")
    results = ctx.authorizer.create_acls(bindings)
    return ctx.authorizer.state.answer(CreateAclsResponse(throttle_time_ms=0, results=[
        Result(error_code=0, error_message=None) if error is None else
        Result(error_code=error.error_code, error_message=str(error)) for error in results]))


def binding(c: Any) -> AclBinding:
    return AclBinding(ResourceType(c.resource_type), c.resource_name,
                      PatternType(c.resource_pattern_type), c.principal, c.host,
                      AclOperation(c.operation), AclPermissionType(c.permission_type))


def unknown_element(b: AclBinding) -> bool:
    return (b.resource_type == ResourceType.UNKNOWN or b.pattern_type == PatternType.UNKNOWN
            or b.operation == AclOperation.UNKNOWN
            or b.permission_type == AclPermissionType.UNKNOWN)


def _all(n: int, code: int, message: str) -> CreateAclsResponse:
    return CreateAclsResponse(throttle_time_ms=0, results=[
        Result(error_code=code, error_message=message) for _ in range(n)])

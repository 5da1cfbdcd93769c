"""What the handlers ask the authorizer, in the shapes Kafka's AuthHelper gives them.

Who asks is ``request.connection.session``; every check is a LITERAL resource name, as
Kafka's broker checks. With the authorizer off each helper answers "allowed" after one
attribute test, so produce and fetch pay nothing when ACLs are not in use. A check is made
once per distinct name (``filter_allowed``), never per partition or per record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from broker.security.acl import CLUSTER_NAME, AclOperation, ResourceType, authorized_operations
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

#: The schema default of an authorized-operations int32 ("not asked", "not computed").
INT32_MIN = -(1 << 31)

#: Kafka's Errors default messages, which its ApiError(error) carries when no other is given.
MESSAGES: dict[ErrorCode, str] = {
    ErrorCode.TOPIC_AUTHORIZATION_FAILED: "Topic authorization failed.",
    ErrorCode.GROUP_AUTHORIZATION_FAILED: "Group authorization failed.",
    ErrorCode.CLUSTER_AUTHORIZATION_FAILED: "Cluster authorization failed.",
    ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "Transactional Id authorization failed.",
}


def enabled(ctx: ApiContext) -> bool:
    return bool(ctx.authorizer.enabled)


def allowed(ctx: ApiContext, request: Request, op: AclOperation, rtype: ResourceType,
            name: str, *, log_if_denied: bool = True) -> bool:
    """May the request's principal do ``op`` on the literal resource ``rtype:name``?
    ``log_if_denied=False`` where Kafka's check only chooses between answers (its
    logIfDenied=false): such a denial is neither logged nor counted."""
    authorizer = ctx.authorizer
    if not authorizer.enabled:
        return True
    return bool(authorizer.authorize(request.connection.session, op, rtype, name,
                                     log_if_denied=log_if_denied))


def cluster_allowed(ctx: ApiContext, request: Request, op: AclOperation, *,
                    log_if_denied: bool = True) -> bool:
    """``op`` on the cluster resource (Kafka's authorizeClusterOperation, without the throw)."""
    return allowed(ctx, request, op, ResourceType.CLUSTER, CLUSTER_NAME,
                   log_if_denied=log_if_denied)


def allowed_any(ctx: ApiContext, request: Request, op: AclOperation,
                rtype: ResourceType) -> bool:
    """Kafka's authorizeByResourceType: is ``op`` allowed on at least one resource of this
    type (an ALLOW ACL not cancelled by a DENY on the same or a wider pattern)?"""
    authorizer = ctx.authorizer
    if not authorizer.enabled:
        return True
    return bool(authorizer.authorize_any(request.connection.session, op, rtype))


def filter_allowed(ctx: ApiContext, request: Request, op: AclOperation, rtype: ResourceType,
                   names: Iterable[str | None], *, log_if_denied: bool = True) -> set[str]:
    """The distinct names among ``names`` the principal may do ``op`` on (Kafka's
    filterByAuthorized: one check per name however often it appears); None is never allowed."""
    distinct = {n for n in names if n is not None}
    authorizer = ctx.authorizer
    if not authorizer.enabled:
        return distinct
    session = request.connection.session
    return {n for n in distinct
            if authorizer.authorize(session, op, rtype, n, log_if_denied=log_if_denied)}


def authorized_ops(ctx: ApiContext, request: Request, rtype: ResourceType, name: str,
                   asked: bool) -> set[int] | None:
    """An authorized-operations field: None (INT32_MIN on the wire) unless asked; then the
    operations of the resource this principal may do (all of them with the authorizer off)."""
    if not asked:
        return None
    authorizer = ctx.authorizer
    if not authorizer.enabled:
        return authorized_operations(rtype, True)
    return {int(op) for op in
            authorizer.authorized_operations(request.connection.session, rtype, name)}


def cluster_ops(ctx: ApiContext, request: Request, asked: bool) -> set[int] | None:
    """The cluster's authorized operations as Metadata and DescribeCluster answer them: the
    set only when DESCRIBE on the cluster is allowed, else the empty set (0 on the wire)."""
    if not asked:
        return None
    if not cluster_allowed(ctx, request, AclOperation.DESCRIBE):
        return set()
    return authorized_ops(ctx, request, ResourceType.CLUSTER, CLUSTER_NAME, True)


def bitfield(ops: set[int] | None) -> int:
    """An operation set as a plain int32 field (DescribeTopicPartitions): INT32_MIN for None."""
    if ops is None:
        return INT32_MIN
    value = sum(1 << code for code in ops)
    return value - (1 << 32) if value >= 1 << 31 else value

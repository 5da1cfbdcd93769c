"""AlterUserScramCredentials (key 51): SCRAM users created, changed and removed.

The client sends the salted password (with its salt and iterations), never the password; the
store keeps the stored and server keys derived from it, durably, before this answers. ALTER on
the cluster is required (else CLUSTER_AUTHORIZATION_FAILED for every user named, sorted, as
Kafka's getErrorResponse); the per-user rules are ScramControlManager's (scram.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kafka.protocol.admin import AlterUserScramCredentialsResponse

from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 51  # AlterUserScramCredentials
VERSIONS = range(0, 1)

Result = AlterUserScramCredentialsResponse.AlterUserScramCredentialsResult
CLUSTER_NAME = "kafka-cluster"


def handle(ctx: ApiContext, request: Request) -> Any:
    body = request.body
    if not ctx.authorizer.authorize(request.connection.session, AclOperation.ALTER,
                                    ResourceType.CLUSTER, CLUSTER_NAME):
        users = sorted({d.name for d in body.deletions} | {u.name for u in body.upsertions})
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return AlterUserScramCredentialsResponse(
            throttle_time_ms=0,
            results=[Result(user=u, error_code=code, error_message=None) for u in users])
    results = ctx.scram.alter(body.deletions, body.upsertions)
    return ctx.scram.state.answer(AlterUserScramCredentialsResponse(
        throttle_time_ms=0,
        results=[Result(user=r.user, error_code=r.error_code, error_message=r.error_message)
                 for r in results]))

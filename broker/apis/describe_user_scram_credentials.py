"""DescribeUserScramCredentials (key 50): each user's SCRAM mechanisms and iterations, never a
key or salt. DESCRIBE on the cluster is required (else CLUSTER_AUTHORIZATION_FAILED for the
whole request, as KafkaApis); the per-user rules are ScramImage.describe's (scram.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeUserScramCredentialsResponse

from broker.security.acl import AclOperation, ResourceType
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 50  # DescribeUserScramCredentials
VERSIONS = range(0, 1)

Result = DescribeUserScramCredentialsResponse.DescribeUserScramCredentialsResult
Info = Result.CredentialInfo
CLUSTER_NAME = "kafka-cluster"


def handle(ctx: ApiContext, request: Request) -> DescribeUserScramCredentialsResponse:
    users = request.body.users
    if not ctx.authorizer.authorize(request.connection.session, AclOperation.DESCRIBE,
                                    ResourceType.CLUSTER, CLUSTER_NAME):
        # Kafka's getErrorResponse: one result per named user, its name left empty.
        code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        return DescribeUserScramCredentialsResponse(
            throttle_time_ms=0, error_code=code, error_message=None,
            results=[Result(user="", error_code=code, error_message=None, credential_infos=[])
                     for _ in users or ()])
    described = ctx.scram.describe([u.name for u in users] if users else None)
    return DescribeUserScramCredentialsResponse(
        throttle_time_ms=0, error_code=0, error_message=None,
        results=[Result(user=r.user, error_code=r.error_code, error_message=r.error_message,
                        credential_infos=[Info(mechanism=m, iterations=i)
                                          for m, i in r.credentials])
                 for r in described])

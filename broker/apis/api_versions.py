"""ApiVersions (key 18): the versions we serve, straight from the registry.

A version we do not know is answered with UNSUPPORTED_VERSION and the full list in v0 form, so a
newer client can retry with a version we share (KIP-511).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.metadata import ApiVersionsResponse

from protocol.errors import ErrorCode
from protocol.registry import APIS

if TYPE_CHECKING:
    from broker.context import ApiContext
    from broker.network.request import Request

_KEYS = [
    ApiVersionsResponse.ApiVersion(api_key=s.key, min_version=s.advertised_min,
                                   max_version=s.max_version)
    for s in sorted(APIS.values(), key=lambda s: s.key)
]


def handle(ctx: ApiContext, request: Request) -> ApiVersionsResponse:
    error = ErrorCode.NONE if request.body is not None else ErrorCode.UNSUPPORTED_VERSION
    return ApiVersionsResponse(
        error_code=error, api_keys=_KEYS, throttle_time_ms=0,
        supported_features=[], finalized_features_epoch=-1, finalized_features=[],
        zk_migration_ready=False,
    )

"""SaslHandshake (key 17): the client names its mechanism; v0 then bare tokens, v1 then
SaslAuthenticate requests (KIP-152).

On a SASL listener the connection's SaslAuthenticator answers (UNSUPPORTED_SASL_MECHANISM with
the enabled list, then the connection closes). Anywhere else, or on a connection already
authenticated that is not re-authenticating, Kafka's KafkaApis answers ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.sasl import SaslHandshakeResponse

from broker.security.sasl import ILLEGAL_SASL_STATE

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 17  # SaslHandshake
VERSIONS = range(0, 2)


def handle(ctx: ApiContext, request: Request) -> SaslHandshakeResponse:
    auth = request.connection.auth
    if auth is None or auth.ready:
        return SaslHandshakeResponse(error_code=ILLEGAL_SASL_STATE, mechanisms=[])
    error, mechanisms, close = auth.handshake(request.version, request.body.mechanism)
    request.close_after = close
    return SaslHandshakeResponse(error_code=error, mechanisms=mechanisms)

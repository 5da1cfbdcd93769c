"""SaslAuthenticate (key 36): one SASL token each way, after SaslHandshake v1.

The connection's SaslAuthenticator evaluates the token. A failure answers
SASL_AUTHENTICATION_FAILED with Kafka's message and the connection closes once that answer is
written; success on v1+ carries the session lifetime (connections.max.reauth.ms, KIP-368).
A SaslAuthenticate where no exchange is under way (a PLAINTEXT listener, or after
authentication) is answered ILLEGAL_SASL_STATE, as KafkaApis answers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kafka.protocol.sasl import SaslAuthenticateResponse

from broker.security.sasl import ILLEGAL_SASL_STATE

if TYPE_CHECKING:
    from broker.apis.context import ApiContext
    from broker.network.request import Request

API_KEY = 36  # SaslAuthenticate
VERSIONS = range(0, 3)

_AFTER_AUTHENTICATION = "SaslAuthenticate request received after successful authentication"


def handle(ctx: ApiContext, request: Request) -> SaslAuthenticateResponse:
    auth = request.connection.auth
    if auth is None or auth.ready:
        return SaslAuthenticateResponse(error_code=ILLEGAL_SASL_STATE,
                                        error_message=_AFTER_AUTHENTICATION, auth_bytes=b"",
                                        session_lifetime_ms=0)
    result = auth.authenticate(request.version, bytes(request.body.auth_bytes))
    request.close_after = result.close
    return SaslAuthenticateResponse(error_code=result.error_code,
                                    error_message=result.error_message,
                                    auth_bytes=result.auth_bytes,
                                    session_lifetime_ms=result.session_lifetime_ms)

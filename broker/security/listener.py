"""One listener's security, as the network layer needs it: built once at start per listener.

The server builds one ListenerSecurity for each entry of `listeners` (its name, its protocol
from `listener.security.protocol.map`, its TLS context and SASL settings) and hands it to every
Connection accepted on that listener.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.security.principal import ANONYMOUS, KafkaPrincipal

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def _anonymous(_ssl_object: ssl.SSLObject | None) -> KafkaPrincipal:
    return ANONYMOUS


@dataclass(frozen=True, slots=True)
class ListenerSecurity:
    name: str  # the listener's name as in `listeners` (PLAINTEXT, SASL_SSL, INTERNAL ...)
    security_protocol: str  # one of SECURITY_PROTOCOLS
    ssl_context: ssl.SSLContext | None = None  # SSL and SASL_SSL listeners
    # The principal of a new connection before any SASL exchange: from the TLS client
    # certificate (ssl.principal.mapping.rules) when there is one, else User:ANONYMOUS.
    principal_builder: Callable[[ssl.SSLObject | None], KafkaPrincipal] = _anonymous
    sasl: Any = None  # broker.security.sasl.SaslServerConfig on SASL listeners, else None

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")


PLAINTEXT_LISTENER = ListenerSecurity("PLAINTEXT", "PLAINTEXT")

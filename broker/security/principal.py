"""Who is asking: Kafka's KafkaPrincipal, and the Session of one connection.

A connection starts as User:ANONYMOUS (PLAINTEXT, or TLS without a client certificate); TLS with
a client certificate names the principal from its distinguished name; SASL replaces it with the
authenticated user. Handlers read ``request.connection.session`` and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

USER_TYPE = "User"


@dataclass(frozen=True, slots=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """"User:alice" -> KafkaPrincipal("User", "alice") (ValueError without a type)."""
        kind, sep, name = text.strip().partition(":")
        if not sep or not kind:
            raise ValueError(f"expected <type>:<name>, got {text!r}")
        return cls(kind, name)


ANONYMOUS = KafkaPrincipal(USER_TYPE, "ANONYMOUS")


@dataclass(slots=True)
class Session:
    """The identity of one connection, as the authorizer sees it."""

    principal: KafkaPrincipal = ANONYMOUS
    client_host: str = ""  # the peer's IP address, matched against ACL hosts
    listener: str = "PLAINTEXT"  # the listener's name, as in `listeners`
    security_protocol: str = "PLAINTEXT"
    mechanism: str | None = None  # the SASL mechanism once authenticated

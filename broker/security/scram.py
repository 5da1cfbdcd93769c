"""SCRAM credentials (RFC 5802, RFC 7677) kept durably, with the rules of Kafka's controller.

Only what a server needs is kept: salt, stored key, server key and iterations (Kafka's
UserScramCredentialRecord). The admin client sends the salted password, never the password, and
the salted password itself is not kept either: it would let anyone log in. Kept in the shared
state (broker/metadata/shared_state.py: a single broker's metadata file, or etcd in cluster
mode, where a user created through one broker logs in on any) as user -> mechanism name ->
{"salt", "stored_key", "server_key" (base64), "iterations"}; every change is durable before it
is answered.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from broker.metadata.file_store import MetadataStore
from broker.metadata.shared_state import SharedState, shared_state_of
from protocol.errors import ErrorCode

UNSUPPORTED_SASL_MECHANISM = ErrorCode.UNSUPPORTED_SASL_MECHANISM
RESOURCE_NOT_FOUND = ErrorCode.RESOURCE_NOT_FOUND
DUPLICATE_RESOURCE = ErrorCode.DUPLICATE_RESOURCE
UNACCEPTABLE_CREDENTIAL = ErrorCode.UNACCEPTABLE_CREDENTIAL


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    name: str
    type: int  # the code on the wire (AlterUserScramCredentials, DescribeUserScramCredentials)
    hash_name: str
    min_iterations: int = 4096
    max_iterations: int = 16384

    # hashlib and hmac (OpenSSL's digests, about 0.6 MB) are imported at the first SCRAM
    # exchange or credential change, not by every broker at start.
    def hmac(self, key: bytes, data: bytes) -> bytes:
        import hmac

        return hmac.digest(key, data, self.hash_name)

    def hash(self, data: bytes) -> bytes:
        import hashlib

        return hashlib.new(self.hash_name, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """Hi() of RFC 5802: what a client computes (tests; the broker never does at login)."""
        import hashlib

        return hashlib.pbkdf2_hmac(self.hash_name, password.encode(), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def stored_key(self, salted_password: bytes) -> bytes:
        return self.hash(self.client_key(salted_password))

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", 1, "sha256")
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", 2, "sha512")
MECHANISMS = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE = {m.type: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}

_DESCRIBE_DUPLICATE = ("Cannot describe SCRAM credentials for the same user twice in a single "
                       "request: ")
_DESCRIBE_MISSING = "Attempt to describe a user credential that does not exist: "
_TWICE = "A user credential cannot be altered twice in the same request"


@dataclass(frozen=True, slots=True)
class ScramCredential:
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys are as good as the password against this broker
        return "ScramCredential(salt=[hidden], stored_key=[hidden], server_key=[hidden])"

    def to_json(self) -> dict[str, object]:
        enc = base64.b64encode
        return {"salt": enc(self.salt).decode(), "stored_key": enc(self.stored_key).decode(),
                "server_key": enc(self.server_key).decode(), "iterations": self.iterations}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> ScramCredential:
        dec = base64.b64decode
        return cls(dec(str(doc["salt"])), dec(str(doc["stored_key"])),
                   dec(str(doc["server_key"])), int(doc["iterations"]))  # type: ignore[call-overload]


class Deletion(Protocol):
    name: str
    mechanism: int


class Upsertion(Protocol):
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes


@dataclass(frozen=True, slots=True)
class UserResult:
    """One user's line of a Describe or Alter answer."""

    user: str
    error_code: int = ErrorCode.NONE
    error_message: str | None = None
    credentials: tuple[tuple[int, int], ...] = ()  # (mechanism type, iterations), Describe only


class ScramCredentialStore:
    """The broker's SCRAM users; read at every SCRAM login, changed by AlterUserScramCredentials."""

    def __init__(self, state: SharedState | MetadataStore) -> None:
        self.state = shared_state_of(state)

    def get(self, user: str, mechanism: str) -> ScramCredential | None:
        doc = self.state.scram_credentials.get(user, {}).get(mechanism)
        return ScramCredential.from_json(doc) if doc is not None else None

    def describe(self, users: Sequence[str] | None) -> list[UserResult]:
        """Kafka's ScramImage.describe: every user when ``users`` is None or empty; a user
        named twice is DUPLICATE_RESOURCE, one without credentials RESOURCE_NOT_FOUND."""
        stored = self.state.scram_credentials
        seen: dict[str, bool] = {}
        if not users:
            seen = {user: False for user in sorted(stored)}
        else:
            for user in users:
                seen[user] = user in seen
        results = []
        for user, duplicate in seen.items():
            if duplicate:
                results.append(UserResult(user, DUPLICATE_RESOURCE, _DESCRIBE_DUPLICATE + user))
                continue
            creds = stored.get(user, {})
            infos = tuple((m.type, int(creds[m.name]["iterations"]))
                          for m in (SCRAM_SHA_256, SCRAM_SHA_512) if m.name in creds)
            if infos:
                results.append(UserResult(user, credentials=infos))
            else:
                results.append(UserResult(user, RESOURCE_NOT_FOUND, _DESCRIBE_MISSING + user))
        return results

    def alter(self, deletions: Iterable[Deletion],
              upsertions: Iterable[Upsertion]) -> list[UserResult]:
        """Kafka's ScramControlManager.alterCredentials: each user at most once per request
        (DUPLICATE_RESOURCE), known mechanisms only (UNSUPPORTED_SASL_MECHANISM), iterations in
        4096..16384 and a user name (UNACCEPTABLE_CREDENTIAL), deletions of what exists
        (RESOURCE_NOT_FOUND). What passes is applied and saved before the answer."""
        to_delete: dict[str, Deletion] = {}
        to_upsert: dict[str, Upsertion] = {}
        errors: dict[str, tuple[int, str | None]] = {}
        for d in deletions:
            if d.name in errors:
                continue
            if to_delete.pop(d.name, None) is not None:
                errors[d.name] = (DUPLICATE_RESOURCE, _TWICE)
            elif (problem := self._check_deletion(d)) is not None:
                errors[d.name] = problem
            else:
                to_delete[d.name] = d
        for u in upsertions:
            if u.name in errors:
                continue
            if to_delete.pop(u.name, None) is not None or to_upsert.pop(u.name, None) is not None:
                errors[u.name] = (DUPLICATE_RESOURCE, _TWICE)
            elif (problem := _check_upsertion(u)) is not None:
                errors[u.name] = problem
            else:
                to_upsert[u.name] = u
        results: list[UserResult] = []
        stored = self.state.scram_credentials
        changed: dict[str, dict[str, dict[str, object]]] = {}
        for d in to_delete.values():
            creds = changed[d.name] = dict(stored.get(d.name, {}))
            creds.pop(BY_TYPE[d.mechanism].name, None)
            results.append(UserResult(d.name))
        for u in to_upsert.values():
            if not u.salted_password:  # Kafka's HMAC refuses an empty key: an unknown error
                errors[u.name] = (ErrorCode.UNKNOWN_SERVER_ERROR, None)
                continue
            mech = BY_TYPE[u.mechanism]
            cred = ScramCredential(bytes(u.salt), mech.stored_key(bytes(u.salted_password)),
                                   mech.server_key(bytes(u.salted_password)), u.iterations)
            changed.setdefault(u.name, dict(stored.get(u.name, {})))[mech.name] = cred.to_json()
            results.append(UserResult(u.name))
        results.extend(UserResult(user, code, message) for user, (code, message) in errors.items())
        if changed:
            self.state.change_scram(changed)
        return results

    def _check_deletion(self, d: Deletion) -> tuple[int, str] | None:
        problem = _check_name_and_mechanism(d.name, d.mechanism)
        if problem is None and BY_TYPE[d.mechanism].name not in self.state.scram_credentials.get(
                d.name, {}):
            return RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"
        return problem


def _check_name_and_mechanism(name: str, mechanism: int) -> tuple[int, str] | None:
    if not name:
        return UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in BY_TYPE:
        return UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


def _check_upsertion(u: Upsertion) -> tuple[int, str] | None:
    problem = _check_name_and_mechanism(u.name, u.mechanism)
    if problem is not None:
        return problem
    mech = BY_TYPE[u.mechanism]
    if u.iterations < mech.min_iterations:
        return UNACCEPTABLE_CREDENTIAL, "Too few iterations"
    if u.iterations > mech.max_iterations:
        return UNACCEPTABLE_CREDENTIAL, "Too many iterations"
    return None

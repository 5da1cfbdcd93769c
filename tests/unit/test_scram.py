"""SCRAM credentials: Kafka's controller rules for AlterUserScramCredentials, ScramImage's for
DescribeUserScramCredentials, the salted-only durable store, and both handlers (wire round
trip, cluster authorization) on the real store, metadata file and authorizer."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kafka.protocol.admin import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)

from broker.apis import alter_user_scram_credentials, describe_user_scram_credentials
from broker.metadata.file_store import MetadataStore
from broker.security.authorizer import Authorizer
from broker.security.principal import KafkaPrincipal
from broker.security.scram import (
    DUPLICATE_RESOURCE,
    RESOURCE_NOT_FOUND,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    UNACCEPTABLE_CREDENTIAL,
    UNSUPPORTED_SASL_MECHANISM,
    ScramCredentialStore,
)
from protocol.errors import ErrorCode
from protocol.registry import APIS, ApiSpec
from tests.support.components import parse, wire_roundtrip

SALT = b"0123456789abcdef"


def up(name: str, mech=SCRAM_SHA_256, iterations: int = 4096, password: str = "pw",
       mechanism: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, mechanism=mech.type if mechanism is None else mechanism,
                           iterations=iterations, salt=SALT,
                           salted_password=mech.salted_password(password, SALT, 4096))


def delete(name: str, mech=SCRAM_SHA_256, mechanism: int | None = None) -> SimpleNamespace:
    return SimpleNamespace(name=name, mechanism=mech.type if mechanism is None else mechanism)


@pytest.fixture
def metadata(tmp_path) -> MetadataStore:
    m = MetadataStore(tmp_path)
    m.load()
    return m


@pytest.fixture
def store(metadata) -> ScramCredentialStore:
    return ScramCredentialStore(metadata)


def codes(results) -> dict[str, tuple[int, str | None]]:
    return {r.user: (r.error_code, r.error_message) for r in results}


def test_upsert_keeps_salted_keys_only_and_survives_a_reload(store, metadata, tmp_path):
    salted = SCRAM_SHA_512.salted_password("pw", SALT, 8192)
    u = SimpleNamespace(name="alice", mechanism=2, iterations=8192, salt=SALT,
                        salted_password=salted)
    assert codes(store.alter([], [u])) == {"alice": (0, None)}
    cred = store.get("alice", "SCRAM-SHA-512")
    assert cred.salt == SALT and cred.iterations == 8192
    assert cred.stored_key == SCRAM_SHA_512.stored_key(salted)
    assert cred.server_key == SCRAM_SHA_512.server_key(salted)
    text = metadata.path.read_text()
    assert salted.hex() not in text and "pw" not in json.loads(text)["scram_credentials"]
    assert "hidden" in repr(cred)
    reloaded = MetadataStore(tmp_path)
    reloaded.load()
    again = ScramCredentialStore(reloaded).get("alice", "SCRAM-SHA-512")
    assert again == cred
    assert store.get("alice", "SCRAM-SHA-256") is None and store.get("bob", "SCRAM-SHA-512") is None


def test_iteration_bounds_are_kafkas(store):
    results = store.alter([], [up("a", iterations=4095), up("b", iterations=4096),
                               up("c", iterations=16384), up("d", iterations=16385)])
    assert codes(results) == {
        "a": (UNACCEPTABLE_CREDENTIAL, "Too few iterations"), "b": (0, None),
        "c": (0, None), "d": (UNACCEPTABLE_CREDENTIAL, "Too many iterations")}


def test_unknown_mechanism_and_empty_name(store):
    results = store.alter([delete("x", mechanism=0)], [up("y", mechanism=3), up("")])
    assert codes(results) == {
        "x": (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        "y": (UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        "": (UNACCEPTABLE_CREDENTIAL, "Username must not be empty")}


def test_a_user_at_most_once_per_request(store):
    store.alter([], [up("a"), up("b")])
    twice = "A user credential cannot be altered twice in the same request"
    # twice in upsertions, even with two mechanisms; a deletion and an upsertion; two deletions
    results = store.alter([delete("b"), delete("b", SCRAM_SHA_512)],
                          [up("a", SCRAM_SHA_256), up("a", SCRAM_SHA_512), up("c"), up("b")])
    assert codes(results)["a"] == (DUPLICATE_RESOURCE, twice)
    assert codes(results)["c"] == (0, None)
    assert codes(results)["b"] == (DUPLICATE_RESOURCE, twice)  # deleted twice
    assert store.get("b", "SCRAM-SHA-256") is not None
    # a failed deletion keeps the user's upsertion out too (one error per user)
    results = store.alter([delete("b", SCRAM_SHA_512)], [up("b", SCRAM_SHA_512)])
    assert codes(results)["b"][0] == RESOURCE_NOT_FOUND
    assert store.get("b", "SCRAM-SHA-512") is None
    results = store.alter([delete("a")], [up("a", SCRAM_SHA_512)])
    assert codes(results) == {"a": (DUPLICATE_RESOURCE, twice)}
    assert store.get("a", "SCRAM-SHA-256") is not None  # nothing applied for that user


def test_delete_what_exists_or_resource_not_found(store, metadata):
    store.alter([], [up("a"), up("a2", SCRAM_SHA_512)])
    results = store.alter([delete("a"), delete("a2"), delete("nobody")], [])
    assert codes(results) == {
        "a": (0, None),
        "a2": (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        "nobody": (RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")}
    assert "a" not in metadata.scram_credentials  # no credential left: the user is gone
    assert store.get("a2", "SCRAM-SHA-512") is not None


def test_empty_salted_password_is_an_unknown_server_error(store, metadata):
    u = SimpleNamespace(name="a", mechanism=1, iterations=4096, salt=SALT, salted_password=b"")
    assert codes(store.alter([], [u])) == {"a": (ErrorCode.UNKNOWN_SERVER_ERROR, None)}
    assert metadata.scram_credentials == {}


def test_describe_all_named_duplicates_and_missing(store):
    store.alter([], [up("b", SCRAM_SHA_512, iterations=5000), up("a")])
    store.alter([], [up("b", SCRAM_SHA_256, iterations=6000)])
    everyone = store.describe(None)
    assert [(r.user, r.error_code, r.credentials) for r in everyone] == [
        ("a", 0, ((1, 4096),)), ("b", 0, ((1, 6000), (2, 5000)))]
    assert store.describe([]) == everyone
    named = codes(store.describe(["b", "zed", "a", "a"]))
    assert named["b"] == (0, None)
    assert named["zed"] == (RESOURCE_NOT_FOUND,
                            "Attempt to describe a user credential that does not exist: zed")
    assert named["a"] == (DUPLICATE_RESOURCE, "Cannot describe SCRAM credentials for the same "
                                              "user twice in a single request: a")


# -- the handlers ---------------------------------------------------------------------------------

_SPECS = {50: (DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse),
          51: (AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse)}


@pytest.fixture(autouse=True)
def scram_apis(monkeypatch):
    """Serve the two APIs even before the registry lists them."""
    for key, (req, resp) in _SPECS.items():
        if key not in APIS:
            monkeypatch.setitem(APIS, key, ApiSpec(key, req.name.removesuffix("Request"),
                                                   0, 0, req, resp, 0))


def ctx_for(store: ScramCredentialStore, metadata: MetadataStore, acls: bool) -> SimpleNamespace:
    authorizer = Authorizer(metadata, enabled=acls, super_users=frozenset({"User:admin"}))
    return SimpleNamespace(authorizer=authorizer, scram=store)


def alter_request(*upsertions, deletions=()) -> AlterUserScramCredentialsRequest:
    R = AlterUserScramCredentialsRequest[0]
    return R(deletions=[R.ScramCredentialDeletion(name=d.name, mechanism=d.mechanism)
                        for d in deletions],
             upsertions=[R.ScramCredentialUpsertion(
                 name=u.name, mechanism=u.mechanism, iterations=u.iterations, salt=u.salt,
                 salted_password=u.salted_password) for u in upsertions])


def describe_request(*names: str) -> DescribeUserScramCredentialsRequest:
    R = DescribeUserScramCredentialsRequest[0]
    return R(users=[R.UserName(name=n) for n in names])


def as_user(request, user: str):
    request.connection.session.principal = KafkaPrincipal("User", user)
    return request


def test_alter_and_describe_through_the_handlers(store, metadata):
    ctx = ctx_for(store, metadata, acls=False)
    req = parse(alter_request(up("alice", iterations=8192), up("bob", iterations=100)))
    resp = wire_roundtrip(req, alter_user_scram_credentials.handle(ctx, req))
    assert {r.user: r.error_code for r in resp.results} == {
        "alice": 0, "bob": UNACCEPTABLE_CREDENTIAL}
    req = parse(describe_request())
    resp = wire_roundtrip(req, describe_user_scram_credentials.handle(ctx, req))
    assert resp.error_code == 0
    [alice] = resp.results
    assert alice.user == "alice" and alice.error_code == 0
    assert [(c.mechanism, c.iterations) for c in alice.credential_infos] == [(1, 8192)]


def test_the_handlers_need_the_cluster_permission(store, metadata):
    ctx = ctx_for(store, metadata, acls=True)
    req = as_user(parse(alter_request(up("zed"), up("amy"), deletions=[delete("amy")])), "eve")
    resp = wire_roundtrip(req, alter_user_scram_credentials.handle(ctx, req))
    assert [(r.user, r.error_code) for r in resp.results] == [
        ("amy", ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
        ("zed", ErrorCode.CLUSTER_AUTHORIZATION_FAILED)]
    assert metadata.scram_credentials == {}
    req = as_user(parse(describe_request("zed", "amy")), "eve")
    resp = wire_roundtrip(req, describe_user_scram_credentials.handle(ctx, req))
    assert resp.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert [r.error_code for r in resp.results] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 2
    req = as_user(parse(alter_request(up("zed"))), "admin")  # the super user may
    resp = wire_roundtrip(req, alter_user_scram_credentials.handle(ctx, req))
    assert [(r.user, r.error_code) for r in resp.results] == [("zed", 0)]

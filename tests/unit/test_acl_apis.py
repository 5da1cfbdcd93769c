"""CreateAcls, DescribeAcls and DeleteAcls handlers, v0-3, on the broker's real parts.

Each request is a kafka-python request encoded as a client sends it and parsed by a
Connection's own parser; each response is encoded for the request's version and decoded again.
A request acts as a user by setting ``request.connection.session.principal`` on the parsed
request, as SASL or a client certificate would.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.protocol.admin import CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest

from broker.apis import create_acls, delete_acls, describe_acls
from broker.security.acl import AclOperation, AclPermissionType, PatternType, ResourceType
from broker.security.principal import KafkaPrincipal, Session
from protocol.errors import ErrorCode, InvalidRequest
from tests.support.components import CLIENT_PEER, Components, build, parse, wire_roundtrip

STANDARD = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SECURITY_DISABLED = 54
R, Op, P, A = ResourceType, AclOperation, PatternType, AclPermissionType
Creation = CreateAclsRequest.AclCreation
DeleteFilter = DeleteAclsRequest.DeleteAclsFilter


@pytest.fixture
async def acls_on(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs", {"authorizer.class.name": STANDARD, "super.users": "User:admin"})
    yield c
    await c.close()


@pytest.fixture
async def acls_off(tmp_path: Path) -> AsyncIterator[Components]:
    c = build(tmp_path / "logs")
    yield c
    await c.close()


def call(c: Components, handle: Callable[..., Any], request: Any,
         principal: str = "User:admin") -> Any:
    req = parse(request)
    req.connection.session.principal = KafkaPrincipal.parse(principal)
    out = handle(c.context, req)
    assert out is not None
    return wire_roundtrip(req, out)


def creation(rtype: ResourceType, name: str, principal: str, op: AclOperation,
             perm: AclPermissionType = A.ALLOW, ptype: PatternType = P.LITERAL,
             host: str = "*") -> Creation:
    return Creation(resource_type=rtype, resource_name=name, resource_pattern_type=ptype,
                    principal=principal, host=host, operation=op, permission_type=perm)


def describe(version: int, rtype: ResourceType = R.ANY, name: str | None = None,
             ptype: PatternType = P.ANY, principal: str | None = None) -> Any:
    return DescribeAclsRequest[version](
        resource_type_filter=rtype, resource_name_filter=name, pattern_type_filter=ptype,
        principal_filter=principal, host_filter=None, operation=Op.ANY,
        permission_type=A.ANY)


def delete_filter(rtype: ResourceType = R.ANY, name: str | None = None,
                  ptype: PatternType = P.ANY, principal: str | None = None) -> DeleteFilter:
    return DeleteFilter(resource_type_filter=rtype, resource_name_filter=name,
                        pattern_type_filter=ptype, principal_filter=principal, host_filter=None,
                        operation=Op.ANY, permission_type=A.ANY)


def described(resp: Any) -> set[tuple[int, str, int, str, str, int, int]]:
    return {(r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation,
             a.permission_type) for r in resp.resources for a in r.acls}


def grant(c: Components, *creations: Creation, version: int = 3) -> None:
    resp = call(c, create_acls.handle, CreateAclsRequest[version](creations=list(creations)))
    assert [(r.error_code, r.error_message) for r in resp.results] == [(0, None)] * len(creations)


# -- without an authorizer -----------------------------------------------------------------------

@pytest.mark.parametrize("version", [0, 1, 2, 3])
async def test_security_disabled_without_an_authorizer(acls_off: Components,
                                                       version: int) -> None:
    resp = call(acls_off, create_acls.handle, CreateAclsRequest[version](creations=[
        creation(R.TOPIC, "t", "User:alice", Op.READ)] * 2), principal="User:ANONYMOUS")
    assert [(r.error_code, r.error_message) for r in resp.results] == [
        (SECURITY_DISABLED, "No Authorizer is configured.")] * 2
    resp = call(acls_off, describe_acls.handle, describe(version, ptype=P.LITERAL))
    assert (resp.error_code, resp.error_message, resp.resources) == (
        SECURITY_DISABLED, "No Authorizer is configured on the broker", [])
    resp = call(acls_off, delete_acls.handle,
                DeleteAclsRequest[version](filters=[delete_filter(ptype=P.LITERAL)]))
    [result] = resp.filter_results
    assert (result.error_code, result.matching_acls) == (SECURITY_DISABLED, [])
    assert acls_off.metadata.acls == []


# -- create, describe, delete --------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2, 3])
async def test_create_describe_delete_round_trip(acls_on: Components, version: int) -> None:
    grant(acls_on, creation(R.TOPIC, "orders", "User:alice", Op.READ),
          creation(R.TOPIC, "orders", "User:alice", Op.WRITE, host="10.0.0.7"),
          creation(R.TOPIC, "ord", "User:bob", Op.ALL, A.DENY, P.PREFIXED),
          creation(R.GROUP, "*", "User:*", Op.READ), version=version)

    resp = call(acls_on, describe_acls.handle, describe(version))
    assert resp.error_code == 0 and resp.error_message is None
    # grouped by resource pattern, the ACLs of a pattern under it
    assert sorted((r.resource_type, r.resource_name, r.pattern_type, len(r.acls))
                  for r in resp.resources) == [
        (R.TOPIC, "ord", P.PREFIXED, 1), (R.TOPIC, "orders", P.LITERAL, 2),
        (R.GROUP, "*", P.LITERAL, 1)]
    resp = call(acls_on, describe_acls.handle, describe(version, R.TOPIC, "orders", P.MATCH))
    assert described(resp) == {
        (R.TOPIC, "orders", P.LITERAL, "User:alice", "*", Op.READ, A.ALLOW),
        (R.TOPIC, "orders", P.LITERAL, "User:alice", "10.0.0.7", Op.WRITE, A.ALLOW),
        (R.TOPIC, "ord", P.PREFIXED, "User:bob", "*", Op.ALL, A.DENY)}
    resp = call(acls_on, describe_acls.handle, describe(version, R.TOPIC, "orders", P.LITERAL))
    assert len(described(resp)) == 2

    resp = call(acls_on, delete_acls.handle, DeleteAclsRequest[version](filters=[
        delete_filter(R.TOPIC, "orders", P.MATCH, "User:bob"),
        delete_filter(principal="User:nobody")]))
    matched, nothing = resp.filter_results
    assert (matched.error_code, nothing.error_code, nothing.matching_acls) == (0, 0, [])
    [m] = matched.matching_acls
    assert (m.error_code, m.resource_type, m.resource_name, m.pattern_type, m.principal, m.host,
            m.operation, m.permission_type) == (0, R.TOPIC, "ord", P.PREFIXED, "User:bob", "*",
                                                Op.ALL, A.DENY)
    resp = call(acls_on, describe_acls.handle, describe(version, R.TOPIC))
    assert {row[1] for row in described(resp)} == {"orders"}
    # the store the authorizer decides from is the one the APIs changed
    authorizer = acls_on.context.authorizer
    bob = Session(KafkaPrincipal("User", "bob"), client_host=CLIENT_PEER[0])
    assert not authorizer.authorize(bob, Op.READ, R.TOPIC, "orders")
    assert authorizer.authorize(bob, Op.READ, R.GROUP, "any-group")


async def test_version_0_carries_literal_acls_only(acls_on: Components) -> None:
    grant(acls_on, creation(R.TOPIC, "logs", "User:alice", Op.READ), version=0)
    grant(acls_on, creation(R.TOPIC, "logs", "User:alice", Op.WRITE, ptype=P.PREFIXED))
    # v0 has no pattern type field: the filter reads as LITERAL, the answer has no prefixed ACL
    resp = call(acls_on, describe_acls.handle, describe(0, R.TOPIC, "logs"))
    assert described(resp) == {(R.TOPIC, "logs", P.LITERAL, "User:alice", "*", Op.READ, A.ALLOW)}
    resp = call(acls_on, delete_acls.handle,
                DeleteAclsRequest[0](filters=[delete_filter(R.TOPIC, "logs")]))
    assert [(m.resource_name, m.operation) for m in resp.filter_results[0].matching_acls] == [
        ("logs", Op.READ)]
    resp = call(acls_on, describe_acls.handle, describe(1, R.TOPIC))
    assert described(resp) == {
        (R.TOPIC, "logs", P.PREFIXED, "User:alice", "*", Op.WRITE, A.ALLOW)}


async def test_each_creation_is_judged_alone(acls_on: Components) -> None:
    resp = call(acls_on, create_acls.handle, CreateAclsRequest[3](creations=[
        creation(R.TOPIC, "ok", "User:alice", Op.READ),
        creation(R.CLUSTER, "my-cluster", "User:alice", Op.ALTER),
        creation(R.TOPIC, "", "User:alice", Op.READ),
        creation(R.TOPIC, "t", "User:alice", Op.READ, ptype=P.MATCH),
        creation(R.TOPIC, "t", "User:alice", Op.ANY),
        creation(R.TOPIC, "t", "alice", Op.READ),
        creation(R.TOPIC, "ok", "User:alice", Op.READ),  # a duplicate succeeds, kept once
    ]))
    assert [r.error_code for r in resp.results] == [0] + [ErrorCode.INVALID_REQUEST] * 5 + [0]
    assert resp.results[1].error_message == (
        "The only valid name for the CLUSTER resource is kafka-cluster")
    assert resp.results[2].error_message == "Invalid empty resource name"
    assert len(acls_on.metadata.acls) == 1


@pytest.mark.parametrize("handler", ["create", "describe", "delete"])
async def test_unknown_codes_close_the_connection(acls_on: Components, handler: str) -> None:
    """Kafka cannot read such a request and closes the connection; InvalidRequest does that
    here (the channel closes the connection as for bad input)."""
    if handler == "create":
        request: Any = CreateAclsRequest[3](creations=[
            creation(R.TOPIC, "t", "User:a", Op.READ), creation(R.TOPIC, "t", "User:a", Op(0))])
        handle = create_acls.handle
    elif handler == "describe":
        request = describe(3, R(0))
        handle = describe_acls.handle
    else:
        request = DeleteAclsRequest[3](filters=[delete_filter(ptype=P(0))])
        handle = delete_acls.handle
    with pytest.raises(InvalidRequest, match="unknown elements"):
        call(acls_on, handle, request)
    assert acls_on.metadata.acls == []


# -- who may change and read ACLs ----------------------------------------------------------------

async def test_acl_apis_need_alter_or_describe_on_the_cluster(acls_on: Components) -> None:
    create = CreateAclsRequest[3](creations=[creation(R.TOPIC, "t", "User:alice", Op.READ)])
    delete = DeleteAclsRequest[3](filters=[delete_filter(), delete_filter(R.TOPIC)])
    for who in ("User:alice", "User:ANONYMOUS"):
        resp = call(acls_on, create_acls.handle, create, principal=who)
        assert [(r.error_code, r.error_message) for r in resp.results] == [
            (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "Request CreateAcls is not authorized.")]
        resp = call(acls_on, describe_acls.handle, describe(3), principal=who)
        assert (resp.error_code, resp.resources) == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])
        resp = call(acls_on, delete_acls.handle, delete, principal=who)
        assert [r.error_code for r in resp.filter_results] == [
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED] * 2
    assert acls_on.metadata.acls == []
    assert acls_on.context.authorizer.denials == {("ALTER", "CLUSTER"): 4,
                                                  ("DESCRIBE", "CLUSTER"): 2}

    # DESCRIBE on the cluster lets carol read the ACLs, not change them
    grant(acls_on, creation(R.CLUSTER, "kafka-cluster", "User:carol", Op.DESCRIBE))
    resp = call(acls_on, describe_acls.handle, describe(3), principal="User:carol")
    assert resp.error_code == 0 and len(described(resp)) == 1
    resp = call(acls_on, create_acls.handle, create, principal="User:carol")
    assert resp.results[0].error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED

    # ALTER on the cluster (from alice's host only) lets alice change them and, by implication,
    # describe them
    host = CLIENT_PEER[0]
    grant(acls_on, creation(R.CLUSTER, "kafka-cluster", "User:alice", Op.ALTER, host=host))
    resp = call(acls_on, create_acls.handle, create, principal="User:alice")
    assert resp.results[0].error_code == 0
    resp = call(acls_on, describe_acls.handle, describe(3, R.TOPIC), principal="User:alice")
    assert described(resp) == {(R.TOPIC, "t", P.LITERAL, "User:alice", "*", Op.READ, A.ALLOW)}
    resp = call(acls_on, delete_acls.handle,
                DeleteAclsRequest[3](filters=[delete_filter(R.TOPIC)]), principal="User:alice")
    assert len(resp.filter_results[0].matching_acls) == 1


async def test_acls_made_through_the_apis_survive_a_restart(tmp_path: Path) -> None:
    overrides = {"authorizer.class.name": STANDARD, "super.users": "User:admin"}
    first = build(tmp_path / "logs", overrides)
    try:
        grant(first, creation(R.TOPIC, "kept", "User:alice", Op.READ, ptype=P.PREFIXED),
              creation(R.TOPIC, "gone", "User:alice", Op.READ))
        resp = call(first, delete_acls.handle,
                    DeleteAclsRequest[3](filters=[delete_filter(R.TOPIC, "gone")]))
        assert len(resp.filter_results[0].matching_acls) == 1
    finally:
        await first.close()
    second = build(tmp_path / "logs", overrides)
    try:
        resp = call(second, describe_acls.handle, describe(3))
        assert described(resp) == {
            (R.TOPIC, "kept", P.PREFIXED, "User:alice", "*", Op.READ, A.ALLOW)}
    finally:
        await second.close()

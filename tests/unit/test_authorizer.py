"""The ACL authorizer's decisions (Kafka's StandardAuthorizer rules), its ACL store, and the
binding filter's match rules, on a real MetadataStore in a tmp dir.

An ACL is written here as kafka-acls would list it, one line of seven words:
``<resource type> <name> <pattern type> <principal> <host> <operation> <permission>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from broker.config import ConfigError
from broker.metadata.file_store import MetadataStore
from broker.security.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from broker.security.authorizer import Authorizer, parse_super_users
from broker.security.principal import KafkaPrincipal, Session
from protocol.errors import ErrorCode
from tests.support.components import broker_config

R, Op, P, A = ResourceType, AclOperation, PatternType, AclPermissionType
TOPIC, GROUP, CLUSTER = R.TOPIC, R.GROUP, R.CLUSTER


def acl(line: str) -> AclBinding:
    rtype, name, ptype, principal, host, op, perm = line.split()
    return AclBinding(R.parse(rtype), name, P.parse(ptype), principal, host, Op.parse(op),
                      A.parse(perm))


def user(name: str, host: str = "10.0.0.1") -> Session:
    return Session(KafkaPrincipal("User", name), client_host=host)


def store(tmp_path: Path) -> MetadataStore:
    tmp_path.mkdir(parents=True, exist_ok=True)
    metadata = MetadataStore(tmp_path)
    metadata.load()
    return metadata


def authorizer(tmp_path: Path, *lines: str, super_users: str = "",
               allow_if_no_acl: bool = False) -> Authorizer:
    auth = Authorizer(store(tmp_path), enabled=True, super_users=parse_super_users(super_users),
                      allow_if_no_acl=allow_if_no_acl)
    assert auth.create_acls([acl(line) for line in lines]) == [None] * len(lines)
    return auth


def decisions(auth: Authorizer, session: Session,
              *actions: tuple[AclOperation, ResourceType, str]) -> list[bool]:
    return [auth.authorize(session, op, rtype, name) for op, rtype, name in actions]


# -- configuration -------------------------------------------------------------------------------

def test_of_turns_on_for_kafkas_authorizer_class_names_only(tmp_path: Path) -> None:
    metadata = store(tmp_path)
    off = Authorizer.of(broker_config(tmp_path), metadata)
    assert not off.enabled
    assert off.authorize(user("anyone"), Op.ALTER, CLUSTER, "kafka-cluster")
    for name in ("org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                 "kafka.security.authorizer.AclAuthorizer"):
        on = Authorizer.of(broker_config(tmp_path, {
            "authorizer.class.name": name, "super.users": " User:admin ; User:ops;",
            "allow.everyone.if.no.acl.found": "true"}), metadata)
        assert on.enabled and on.allow_if_no_acl
        assert on.super_users == {"User:admin", "User:ops"}
    with pytest.raises(ConfigError, match="authorizer.class.name"):
        Authorizer.of(broker_config(tmp_path, {"authorizer.class.name": "com.example.Mine"}),
                      metadata)
    with pytest.raises(ConfigError, match="super.users"):
        parse_super_users("User:admin;admin")


# -- matching ------------------------------------------------------------------------------------

def test_literal_acl_applies_to_its_own_name_only(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC orders LITERAL User:alice * READ ALLOW")
    assert decisions(auth, user("alice"), (Op.READ, TOPIC, "orders"), (Op.READ, TOPIC, "orders2"),
                     (Op.READ, TOPIC, "order"), (Op.READ, GROUP, "orders"),
                     (Op.WRITE, TOPIC, "orders")) == [True, False, False, False, False]
    assert decisions(auth, user("bob"), (Op.READ, TOPIC, "orders")) == [False]


def test_wildcard_resource_and_wildcard_principal(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC * LITERAL User:alice * WRITE ALLOW",
                      "GROUP app LITERAL User:* * READ ALLOW")
    assert decisions(auth, user("alice"), (Op.WRITE, TOPIC, "a"), (Op.WRITE, TOPIC, "*"),
                     (Op.WRITE, GROUP, "a")) == [True, True, False]
    assert decisions(auth, user("bob"), (Op.WRITE, TOPIC, "a"), (Op.READ, GROUP, "app"),
                     (Op.READ, GROUP, "app2")) == [False, True, False]
    # "User:*" matches users only by being the wildcard; another principal type is not a user
    other = Session(KafkaPrincipal("Group", "app-team"), client_host="10.0.0.1")
    assert decisions(auth, other, (Op.READ, GROUP, "app")) == [True]


def test_prefixed_acls(tmp_path: Path) -> None:
    # Kafka's own prefix case: a long prefix for alice, a literal and a one-letter prefix for bob.
    auth = authorizer(tmp_path, "TOPIC fooa PREFIXED User:alice * ALL ALLOW",
                      "TOPIC foobar LITERAL User:bob * ALL ALLOW",
                      "TOPIC f PREFIXED User:bob * ALL ALLOW")
    assert decisions(auth, user("bob"), (Op.WRITE, TOPIC, "foobarr"), (Op.READ, TOPIC, "goobar"),
                     (Op.READ, TOPIC, "fooa"), (Op.READ, TOPIC, "f")) == [True, False, True, True]
    assert decisions(auth, user("alice"), (Op.DESCRIBE, TOPIC, "fooa"),
                     (Op.DESCRIBE, TOPIC, "fooab"), (Op.WRITE, TOPIC, "foo"),
                     (Op.READ, TOPIC, "baz")) == [True, True, False, False]


def test_deny_beats_allow_whatever_the_pattern(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC foo LITERAL User:alice * ALL DENY",
                      "TOPIC foo PREFIXED User:alice * READ ALLOW",
                      "TOPIC foo LITERAL User:* * ALL DENY",
                      "TOPIC foo PREFIXED User:* * DESCRIBE ALLOW",
                      "TOPIC * LITERAL User:carol * ALL ALLOW",
                      "TOPIC secret LITERAL User:carol * READ DENY")
    assert decisions(auth, user("alice"), (Op.WRITE, TOPIC, "foo"), (Op.READ, TOPIC, "foo"),
                     (Op.DESCRIBE, TOPIC, "foo"), (Op.READ, TOPIC, "foobar")) == [
        False, False, False, True]
    assert decisions(auth, user("bob"), (Op.DESCRIBE, TOPIC, "foo"), (Op.DESCRIBE, TOPIC, "foobaz"),
                     (Op.READ, TOPIC, "foobaz")) == [False, True, False]
    # a DENY for one operation denies that operation only, even under an ALLOW of ALL on "*"
    assert decisions(auth, user("carol"), (Op.READ, TOPIC, "secret"),
                     (Op.WRITE, TOPIC, "secret"), (Op.DESCRIBE, TOPIC, "secret")) == [
        False, True, True]


def test_prefixed_deny_beats_literal_allow(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC payments LITERAL User:alice * READ ALLOW",
                      "TOPIC pay PREFIXED User:alice * READ DENY")
    assert decisions(auth, user("alice"), (Op.READ, TOPIC, "payments")) == [False]
    auth.delete_acls([AclBindingFilter(TOPIC, "pay", P.PREFIXED)])
    assert decisions(auth, user("alice"), (Op.READ, TOPIC, "payments")) == [True]


def test_host_must_match_exactly_or_be_the_wildcard(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC t LITERAL User:alice 192.168.1.7 READ ALLOW",
                      "TOPIC t LITERAL User:alice * WRITE ALLOW",
                      "TOPIC t LITERAL User:alice 10.9.9.9 WRITE DENY")
    assert decisions(auth, user("alice", "192.168.1.7"), (Op.READ, TOPIC, "t"),
                     (Op.WRITE, TOPIC, "t")) == [True, True]
    assert decisions(auth, user("alice", "192.168.1.70"), (Op.READ, TOPIC, "t"),
                     (Op.WRITE, TOPIC, "t")) == [False, True]
    assert decisions(auth, user("alice", "10.9.9.9"), (Op.WRITE, TOPIC, "t")) == [False]


def test_implied_operations_come_from_allow_acls_only(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC r LITERAL User:alice * READ ALLOW",
                      "TOPIC w LITERAL User:alice * WRITE ALLOW",
                      "TOPIC d LITERAL User:alice * DELETE ALLOW",
                      "TOPIC a LITERAL User:alice * ALTER ALLOW",
                      "TOPIC c LITERAL User:alice * CREATE ALLOW",
                      "TOPIC ac LITERAL User:alice * ALTER_CONFIGS ALLOW",
                      "TOPIC dc LITERAL User:alice * DESCRIBE_CONFIGS ALLOW",
                      "TOPIC x LITERAL User:alice * ALL ALLOW",
                      "TOPIC x LITERAL User:alice * READ DENY")
    alice = user("alice")
    describe = [auth.authorize(alice, Op.DESCRIBE, TOPIC, n)
                for n in ("r", "w", "d", "a", "c", "ac", "dc")]
    assert describe == [True, True, True, True, False, False, False]
    assert [auth.authorize(alice, Op.DESCRIBE_CONFIGS, TOPIC, n) for n in ("ac", "dc", "a")] == [
        True, True, False]
    # READ on "r" does not give WRITE; ALTER_CONFIGS does not give ALTER
    assert decisions(auth, alice, (Op.WRITE, TOPIC, "r"), (Op.ALTER, TOPIC, "ac")) == [False, False]
    # a DENY on READ does not deny DESCRIBE (no implication for DENY)
    assert decisions(auth, alice, (Op.READ, TOPIC, "x"), (Op.DESCRIBE, TOPIC, "x")) == [False, True]


def test_super_users_pass_every_check_even_against_deny(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "CLUSTER kafka-cluster LITERAL User:* * ALL DENY",
                      "TOPIC * LITERAL User:* * ALL DENY",
                      super_users="User:admin;User:ops")
    for name in ("admin", "ops"):
        assert decisions(auth, user(name), (Op.ALTER, CLUSTER, "kafka-cluster"),
                         (Op.WRITE, TOPIC, "any")) == [True, True]
    assert decisions(auth, user("alice"), (Op.ALTER, CLUSTER, "kafka-cluster")) == [False]
    # the match is on the whole principal: another type with the same name is not a super user
    other = Session(KafkaPrincipal("Service", "admin"), client_host="10.0.0.1")
    assert not auth.authorize(other, Op.WRITE, TOPIC, "any")


@pytest.mark.parametrize("allow_if_no_acl", [True, False])
def test_allow_everyone_if_no_acl_found(tmp_path: Path, allow_if_no_acl: bool) -> None:
    auth = authorizer(tmp_path, "TOPIC topic1 LITERAL User:alice * READ ALLOW",
                      "TOPIC pre PREFIXED User:alice * READ ALLOW",
                      allow_if_no_acl=allow_if_no_acl)
    bob = user("bob")
    # an ACL exists for these resources (naming someone else): the default does not apply
    assert decisions(auth, bob, (Op.READ, TOPIC, "topic1"), (Op.READ, TOPIC, "prefixed")) == [
        False, False]
    # no ACL at all applies: the configured default
    assert decisions(auth, bob, (Op.READ, TOPIC, "topic2"), (Op.ALTER, CLUSTER, "kafka-cluster"),
                     (Op.READ, GROUP, "g")) == [allow_if_no_acl] * 3


def test_off_allows_everything_and_reports_every_supported_operation(tmp_path: Path) -> None:
    auth = Authorizer(store(tmp_path))
    alice = user("alice")
    assert auth.authorize(alice, Op.WRITE, TOPIC, "t")
    assert auth.authorize_any(alice, Op.WRITE, TOPIC)
    assert auth.authorized_operations(alice, GROUP, "g") == {int(Op.READ), int(Op.DESCRIBE),
                                                             int(Op.DELETE)}
    assert auth.denials == {}


# -- authorize_any (Kafka's authorizeByResourceType) -----------------------------------------

def test_authorize_any_finds_an_allow_not_cancelled_by_a_deny(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC a LITERAL User:alice * WRITE ALLOW",
                      "TOPIC a LITERAL User:alice * WRITE DENY",
                      "TOPIC bc PREFIXED User:bob * WRITE ALLOW",
                      "TOPIC b PREFIXED User:bob * WRITE DENY",
                      "TOPIC carol-topic LITERAL User:carol * WRITE ALLOW",
                      "TOPIC carol PREFIXED User:carol * WRITE DENY",
                      "TOPIC x LITERAL User:dave * ALL ALLOW",
                      "TOPIC y LITERAL User:erin * READ ALLOW",
                      "TOPIC z PREFIXED User:frank 10.0.0.2 WRITE ALLOW",
                      "TOPIC * LITERAL User:gina * WRITE ALLOW",
                      "TOPIC q LITERAL User:hal * WRITE ALLOW",
                      "TOPIC * LITERAL User:hal * WRITE DENY")
    verdicts = {name: auth.authorize_any(user(name), Op.WRITE, TOPIC)
                for name in ("alice", "bob", "carol", "dave", "erin", "frank", "gina", "hal")}
    assert verdicts == {"alice": False, "bob": False, "carol": False, "dave": True,
                        "erin": False, "frank": False, "gina": True, "hal": False}
    assert auth.authorize_any(user("frank", "10.0.0.2"), Op.WRITE, TOPIC)
    assert auth.denials == {}  # a question, not a refused request
    with pytest.raises(ValueError):
        auth.authorize_any(user("alice"), Op.ANY, TOPIC)
    with pytest.raises(ValueError):
        auth.authorize_any(user("alice"), Op.WRITE, R.ANY)


def test_authorize_any_for_super_users_and_the_default(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC * LITERAL User:* * ALL DENY", super_users="User:admin")
    assert auth.authorize_any(user("admin"), Op.WRITE, TOPIC)
    assert not auth.authorize_any(user("alice"), Op.WRITE, TOPIC)
    open_auth = Authorizer(store(tmp_path / "open"), enabled=True, allow_if_no_acl=True)
    assert open_auth.authorize_any(user("alice"), Op.WRITE, TOPIC)


# -- authorized operations -----------------------------------------------------------------------

def test_authorized_operations_lists_what_the_principal_may_do(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC t LITERAL User:alice * READ ALLOW",
                      "TOPIC t LITERAL User:alice * ALTER_CONFIGS ALLOW",
                      "CLUSTER kafka-cluster LITERAL User:alice * ALL ALLOW",
                      "CLUSTER kafka-cluster LITERAL User:alice * ALTER DENY")
    alice = user("alice")
    assert auth.authorized_operations(alice, TOPIC, "t") == {
        int(Op.READ), int(Op.DESCRIBE), int(Op.ALTER_CONFIGS), int(Op.DESCRIBE_CONFIGS)}
    assert auth.authorized_operations(alice, CLUSTER, "kafka-cluster") == {
        int(Op.CREATE), int(Op.CLUSTER_ACTION), int(Op.DESCRIBE_CONFIGS), int(Op.ALTER_CONFIGS),
        int(Op.IDEMPOTENT_WRITE), int(Op.DESCRIBE)}
    assert auth.authorized_operations(user("bob"), TOPIC, "t") == set()
    assert auth.denials == {}  # reporting is not refusing


# -- denials: counted and logged -----------------------------------------------------------------

def test_denials_are_counted_and_logged_rate_limited(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, "TOPIC t LITERAL User:alice * READ ALLOW")
    bob = user("bob", "10.1.2.3")
    with capture_logs() as logs:
        for _ in range(1001):
            assert not auth.authorize(bob, Op.READ, TOPIC, "t")
        assert not auth.authorize(bob, Op.WRITE, TOPIC, "t")
        assert not auth.authorize(bob, Op.READ, TOPIC, "u", log_if_denied=False)
    assert auth.denials == {("READ", "TOPIC"): 1001, ("WRITE", "TOPIC"): 1}
    denied = [e for e in logs if e["event"] == "authorization denied"]
    assert [(e["operation"], e["denials"]) for e in denied] == [
        ("READ", 1), ("READ", 1001), ("WRITE", 1)]
    first = denied[0]
    assert (first["log_level"], first["principal"], first["host"], first["resource"]) == (
        "info", "User:bob", "10.1.2.3", "TOPIC:LITERAL:t")


# -- the ACL store -------------------------------------------------------------------------------

def test_create_refuses_what_kafka_refuses(tmp_path: Path) -> None:
    auth = authorizer(tmp_path)
    bindings = [acl("CLUSTER other LITERAL User:a * ALTER ALLOW"),
                AclBinding(TOPIC, "", P.LITERAL, "User:a", "*", Op.READ, A.ALLOW),
                acl("ANY t LITERAL User:a * READ ALLOW"),
                acl("TOPIC t MATCH User:a * READ ALLOW"),
                acl("TOPIC t ANY User:a * READ ALLOW"),
                acl("TOPIC t LITERAL User:a * ANY ALLOW"),
                acl("TOPIC t LITERAL User:a * READ ANY"),
                acl("TOPIC t LITERAL alice * READ ALLOW"),
                acl("TOPIC t LITERAL User:a * READ ALLOW")]
    results = auth.create_acls(bindings)
    assert [r.error_code if r else None for r in results] == (
        [ErrorCode.INVALID_REQUEST] * 8 + [None])
    assert [str(r) for r in results[:3]] == [
        "The only valid name for the CLUSTER resource is kafka-cluster",
        "Invalid empty resource name", "Invalid resourceType ANY"]
    assert auth.describe_acls(AclBindingFilter()) == [bindings[-1]]


def test_acls_survive_a_reload_and_duplicates_are_kept_once(tmp_path: Path) -> None:
    lines = ["TOPIC orders LITERAL User:alice * READ ALLOW",
             "TOPIC ord PREFIXED User:* 10.0.0.9 WRITE DENY",
             "GROUP * LITERAL User:alice * ALL ALLOW"]
    auth = authorizer(tmp_path, *lines)
    assert auth.create_acls([acl(lines[0])]) == [None]  # already there: a success, no copy
    assert auth.acl_count() == 3
    on_disk = json.loads((tmp_path / MetadataStore.FILE).read_text())["acls"]
    assert len(on_disk) == 3 and {"resource_type": "TOPIC", "resource_name": "ord",
                                  "pattern_type": "PREFIXED", "principal": "User:*",
                                  "host": "10.0.0.9", "operation": "WRITE",
                                  "permission_type": "DENY"} in on_disk

    again = Authorizer(store(tmp_path), enabled=True)  # a restart: a fresh store, loaded
    assert set(again.describe_acls(AclBindingFilter())) == {acl(line) for line in lines}
    alice = user("alice", "10.0.0.9")
    assert decisions(again, alice, (Op.READ, TOPIC, "orders"), (Op.WRITE, TOPIC, "orders"),
                     (Op.READ, GROUP, "g")) == [True, False, True]

    deleted = again.delete_acls([AclBindingFilter(R.ANY, None, P.ANY, principal="User:alice")])
    assert set(deleted[0]) == {acl(lines[0]), acl(lines[2])}
    third = Authorizer(store(tmp_path), enabled=True)
    assert third.describe_acls(AclBindingFilter()) == [acl(lines[1])]
    assert decisions(third, alice, (Op.READ, TOPIC, "orders")) == [False]


def test_a_failed_save_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    auth = authorizer(tmp_path, "TOPIC t LITERAL User:alice * READ ALLOW")

    def broken() -> None:
        raise OSError("disk full")

    monkeypatch.setattr(auth.state.metadata, "save", broken)  # type: ignore[attr-defined]
    [result] = auth.create_acls([acl("TOPIC u LITERAL User:alice * READ ALLOW")])
    assert result is not None and result.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
    with pytest.raises(OSError):
        auth.delete_acls([AclBindingFilter()])
    assert auth.describe_acls(AclBindingFilter()) == [
        acl("TOPIC t LITERAL User:alice * READ ALLOW")]
    assert decisions(auth, user("alice"), (Op.READ, TOPIC, "t"), (Op.READ, TOPIC, "u")) == [
        True, False]


# -- filters (Kafka's ResourcePatternFilter and AccessControlEntryFilter rules) ------------------

STORE = ["TOPIC foo LITERAL User:alice * READ ALLOW",
         "TOPIC * LITERAL User:bob * WRITE ALLOW",
         "TOPIC fo PREFIXED User:alice 10.0.0.1 READ DENY",
         "TOPIC foobar PREFIXED User:carol * DESCRIBE ALLOW",
         "GROUP foo LITERAL User:alice * READ ALLOW"]


@pytest.mark.parametrize(("filt", "expected"), [
    (AclBindingFilter(), [0, 1, 2, 3, 4]),
    (AclBindingFilter(TOPIC), [0, 1, 2, 3]),
    # ANY pattern type: the name compared exactly, whatever the pattern type
    (AclBindingFilter(TOPIC, "foo", P.ANY), [0]),
    (AclBindingFilter(TOPIC, "fo", P.ANY), [2]),
    (AclBindingFilter(R.ANY, "foo", P.ANY), [0, 4]),
    # a definite pattern type: that type and exactly that name
    (AclBindingFilter(TOPIC, "foo", P.LITERAL), [0]),
    (AclBindingFilter(TOPIC, "foo", P.PREFIXED), []),
    (AclBindingFilter(TOPIC, None, P.PREFIXED), [2, 3]),
    (AclBindingFilter(TOPIC, "*", P.LITERAL), [1]),
    # MATCH: every ACL that applies to a resource of that name
    (AclBindingFilter(TOPIC, "foo", P.MATCH), [0, 1, 2]),
    (AclBindingFilter(TOPIC, "foobarbaz", P.MATCH), [1, 2, 3]),
    (AclBindingFilter(TOPIC, "x", P.MATCH), [1]),
    (AclBindingFilter(R.ANY, None, P.MATCH), [0, 1, 2, 3, 4]),
    # the entry part
    (AclBindingFilter(principal="User:alice"), [0, 2, 4]),
    (AclBindingFilter(host="10.0.0.1"), [2]),
    (AclBindingFilter(operation=Op.WRITE), [1]),
    (AclBindingFilter(permission_type=A.DENY), [2]),
    (AclBindingFilter(TOPIC, "foo", P.MATCH, "User:alice", None, Op.READ, A.ALLOW), [0]),
])
def test_filters_match_as_kafkas(tmp_path: Path, filt: AclBindingFilter,
                                 expected: list[int]) -> None:
    auth = authorizer(tmp_path, *STORE)
    assert set(auth.describe_acls(filt)) == {acl(STORE[i]) for i in expected}
    assert all(filt.matches(acl(STORE[i])) for i in expected)


def test_delete_lists_an_acl_under_every_filter_that_matched_it(tmp_path: Path) -> None:
    auth = authorizer(tmp_path, *STORE)
    result = auth.delete_acls([AclBindingFilter(TOPIC, "foo", P.MATCH),
                               AclBindingFilter(principal="User:alice"),
                               AclBindingFilter(TOPIC, "nothing", P.LITERAL)])
    assert [set(r) for r in result] == [
        {acl(STORE[i]) for i in (0, 1, 2)}, {acl(STORE[i]) for i in (0, 2, 4)}, set()]
    assert auth.describe_acls(AclBindingFilter()) == [acl(STORE[3])]


def test_unknown_codes_read_as_unknown() -> None:
    assert R(99) == R.UNKNOWN and Op(-3) == Op.UNKNOWN and P(9) == P.UNKNOWN and A(7) == A.UNKNOWN
    assert AclBindingFilter(R(99)).is_unknown() and not AclBindingFilter().is_unknown()

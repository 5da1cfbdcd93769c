"""Kafka's ACL authorizer, with StandardAuthorizer's rules, and the ACLs kept durably.

Off (no ``authorizer.class.name``): every principal may do everything, and the ACL APIs answer
SECURITY_DISABLED. On, an action (principal, host, operation, resource) is decided so:

1. a super user (``super.users``) may do everything;
2. the ACLs that apply to the resource are its LITERAL ACLs, the LITERAL ACLs named "*" of its
   type, and the PREFIXED ACLs whose name the resource's name starts with;
3. of those, an ACL matches the action when its principal is the session's or "User:*", its
   host the client's address or "*", and its operation the action's or ALL; an ALLOW ACL for
   READ, WRITE, DELETE or ALTER also allows DESCRIBE, one for ALTER_CONFIGS also allows
   DESCRIBE_CONFIGS (a DENY ACL denies only its own operation);
4. any matching DENY denies; else any matching ALLOW allows; else, when no ACL at all applies
   to the resource (whoever it names), ``allow.everyone.if.no.acl.found`` decides; else denied.

The ACLs are indexed so one decision looks at only the ACLs of that resource: a dict by (type,
name) for LITERAL ones, and per type a dict by prefix with the set of prefix lengths in use, so
a name is looked up once per distinct prefix length rather than against every PREFIXED ACL.
The ACLs live in the shared state (broker/metadata/shared_state.py): a single broker's metadata
file, where creations and deletions are written before they are answered, as Kafka's controller
commits its ACL records before replying; in cluster mode etcd, whose changes made by other
brokers come back through ``reload`` (Kafka's ZooKeeper-era authorizer followed the ACL znodes
the same way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import structlog

from broker.config import BrokerConfig, ConfigError
from broker.metadata.file_store import MetadataStore
from broker.metadata.shared_state import SharedState, shared_state_of
from broker.security.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from broker.security.principal import KafkaPrincipal, Session
from protocol.errors import ErrorCode, KafkaError

logger = structlog.get_logger("broker.security")

# The class names under which Kafka ships an ACL authorizer; either turns this one on.
AUTHORIZER_CLASSES = frozenset({
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
})

_O = AclOperation
# Operations an ALLOW ACL for them also allows DESCRIBE / DESCRIBE_CONFIGS (ALLOW only).
IMPLIES_DESCRIBE = frozenset({_O.DESCRIBE, _O.READ, _O.WRITE, _O.DELETE, _O.ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({_O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS})

# Denials are logged the first time for each (operation, resource type) and then one in this
# many, so a client retrying a refused request cannot flood the log.
DENIAL_LOG_EVERY = 1000


def parse_super_users(text: str) -> frozenset[str]:
    """``super.users`` ("User:a;User:b") as principal texts; ConfigError for one without a type."""
    users = set()
    for part in text.split(";"):
        entry = part.strip()
        if not entry:
            continue
        try:
            KafkaPrincipal.parse(entry)
        except ValueError as exc:
            raise ConfigError(f"super.users: {exc}") from None
        users.add(entry)
    return frozenset(users)


class Authorizer:
    def __init__(self, state: SharedState | MetadataStore, *, enabled: bool = False,
                 super_users: frozenset[str] = frozenset(),
                 allow_if_no_acl: bool = False) -> None:
        self.state = shared_state_of(state)
        self.enabled = enabled
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        # (operation name, resource type name) -> denials of explicitly requested actions
        self.denials: dict[tuple[str, str], int] = {}
        self._acls: set[AclBinding] = set()
        self._literal: dict[tuple[ResourceType, str], set[AclBinding]] = {}
        self._prefixed: dict[ResourceType, dict[str, set[AclBinding]]] = {}
        self._prefix_lengths: dict[ResourceType, Counter[int]] = {}
        self._load()
        self.state.on_acls_changed(self.reload)

    @classmethod
    def of(cls, cfg: BrokerConfig, state: SharedState | MetadataStore) -> Authorizer:
        """From the broker's keys; ConfigError for an authorizer class this broker is not."""
        name = cfg["authorizer.class.name"]
        if name and name not in AUTHORIZER_CLASSES:
            raise ConfigError(f"authorizer.class.name={name!r}: only Kafka's ACL authorizers "
                              f"are served ({', '.join(sorted(AUTHORIZER_CLASSES))})")
        return cls(state, enabled=bool(name),
                   super_users=parse_super_users(cfg["super.users"]),
                   allow_if_no_acl=cfg["allow.everyone.if.no.acl.found"])

    # -- decisions -------------------------------------------------------------------------------

    def authorize(self, session: Session, op: AclOperation, rtype: ResourceType, name: str,
                  *, log_if_denied: bool = True) -> bool:
        """May ``session`` do ``op`` on the resource? ``log_if_denied=False`` for questions that
        only filter or report (Metadata's topic list, authorized operations), as Kafka's
        Action.logIfDenied: those denials are neither logged nor counted."""
        if not self.enabled:
            return True
        principal = str(session.principal)
        if principal in self.super_users:
            return True
        allowed = self._decide(principal, session.client_host, op, rtype, name)
        if not allowed and log_if_denied:
            self._denied(session, op, f"{rtype.name}:LITERAL:{name}", rtype)
        return allowed

    def _decide(self, principal: str, host: str, op: AclOperation, rtype: ResourceType,
                name: str) -> bool:
        found_acl = found_allow = False
        for acls in self._applicable(rtype, name):
            for acl in acls:
                found_acl = True
                result = _result(acl, principal, host, op)
                if result is AclPermissionType.DENY:
                    return False
                if result is AclPermissionType.ALLOW:
                    found_allow = True
        if found_allow:
            return True
        return self.allow_if_no_acl if not found_acl else False

    def _applicable(self, rtype: ResourceType, name: str) -> Iterable[set[AclBinding]]:
        """The ACL sets that apply to the resource: its literal ACLs, the "*" ones, and the
        prefixed ones that are a prefix of its name."""
        literal = self._literal.get((rtype, name))
        if literal:
            yield literal
        if name != WILDCARD_RESOURCE:
            wildcard = self._literal.get((rtype, WILDCARD_RESOURCE))
            if wildcard:
                yield wildcard
        prefixed = self._prefixed.get(rtype)
        if prefixed:
            for length in self._prefix_lengths[rtype]:
                if length <= len(name):
                    acls = prefixed.get(name[:length])
                    if acls:
                        yield acls

    def authorize_any(self, session: Session, op: AclOperation, rtype: ResourceType, *,
                      log_if_denied: bool = False) -> bool:
        """May ``session`` do ``op`` on at least one resource of ``rtype``? Kafka's
        authorizeByResourceType (used for idempotent produce: WRITE on any topic): some ALLOW
        for the principal and host whose literal name is not denied literally or by a prefix,
        or whose prefix is not denied by a shorter prefix; a DENY on "*" denies everything.
        Only the exact operation or ALL counts here, as in Kafka (no implied DESCRIBE)."""
        if op in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise ValueError(f"authorize_any needs a definite operation, not {op.name}")
        if rtype in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise ValueError(f"authorize_any needs a definite resource type, not {rtype.name}")
        if not self.enabled:
            return True
        # A super user, or a grant that reaches any name (e.g. "*" or the default), suffices.
        if self.authorize(session, op, rtype, "hardcode", log_if_denied=False):
            return True
        allowed = self._any_allowed(str(session.principal), session.client_host, op, rtype)
        if not allowed and log_if_denied:
            self._denied(session, op, f"{rtype.name}:ANY", rtype)
        return allowed

    def _any_allowed(self, principal: str, host: str, op: AclOperation,
                     rtype: ResourceType) -> bool:
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[AclBinding] = []
        for acl in self._of_type(rtype):
            if acl.host not in (host, WILDCARD_HOST):
                continue
            if acl.principal not in (principal, WILDCARD_PRINCIPAL):
                continue
            if acl.operation not in (op, AclOperation.ALL):
                continue
            if acl.permission_type == AclPermissionType.DENY:
                if acl.pattern_type == PatternType.LITERAL:
                    if acl.resource_name == WILDCARD_RESOURCE:
                        return False
                    deny_literal.add(acl.resource_name)
                elif acl.pattern_type == PatternType.PREFIXED:
                    deny_prefixed.add(acl.resource_name)
            elif acl.permission_type == AclPermissionType.ALLOW:
                if (acl.pattern_type == PatternType.LITERAL
                        and acl.resource_name == WILDCARD_RESOURCE):
                    return True
                allow.append(acl)
        for acl in allow:
            name = acl.resource_name
            if acl.pattern_type == PatternType.LITERAL and name in deny_literal:
                continue
            if any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                continue
            return True
        return False

    def authorized_operations(self, session: Session, rtype: ResourceType,
                              name: str) -> set[int]:
        """The operation codes ``session`` may perform on the resource, of those the resource
        supports (what Kafka fills the authorized-operations fields with)."""
        return {int(op) for op in SUPPORTED_OPERATIONS[rtype]
                if self.authorize(session, op, rtype, name, log_if_denied=False)}

    def _denied(self, session: Session, op: AclOperation, resource: str,
                rtype: ResourceType) -> None:
        key = (op.name, rtype.name)
        n = self.denials[key] = self.denials.get(key, 0) + 1
        if n % DENIAL_LOG_EVERY == 1:
            logger.info("authorization denied", principal=str(session.principal),
                     host=session.client_host, listener=session.listener, operation=op.name,
                     resource=resource, denials=n)

    # -- the ACL admin APIs ----------------------------------------------------------------------

    def create_acls(self, bindings: list[AclBinding]) -> list[KafkaError | None]:
        """One result per binding, in order: None when created (or already there, as Kafka
        answers a duplicate), else the error. Saved before returning."""
        results: list[KafkaError | None] = []
        added: list[AclBinding] = []
        for binding in bindings:
            problem = validate_new_acl(binding)
            if problem is not None:
                results.append(KafkaError(ErrorCode.INVALID_REQUEST, problem))
                continue
            if binding not in self._acls:
                self._add(binding)
                added.append(binding)
            results.append(None)
        if added:
            try:
                self._save(added, ())
            except Exception:
                for binding in added:
                    self._remove(binding)
                logger.exception("ACLs not saved", acls=len(added))
                failure = KafkaError(ErrorCode.UNKNOWN_SERVER_ERROR,
                                     "Unknown error while trying to create ACL")
                return [r if r is not None else failure for r in results]
            for binding in added:
                logger.info("ACL created", acl=str(binding))
        return results

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """Every ACL the filter matches (Kafka's MATCH/ANY rules), in a stable order."""
        return sorted((b for b in self._candidates(acl_filter) if acl_filter.matches(b)),
                      key=_order)

    def delete_acls(self, filters: list[AclBindingFilter]) -> list[list[AclBinding]]:
        """For each filter, the ACLs it removed (an ACL matched by several filters is listed
        under each, as Kafka lists it). Saved before returning; on a failed save nothing is
        removed and the error is raised."""
        removed: set[AclBinding] = set()
        results: list[list[AclBinding]] = []
        for acl_filter in filters:
            matched = [b for b in self._candidates(acl_filter) if acl_filter.matches(b)]
            results.append(sorted(matched, key=_order))
            removed.update(matched)
        if removed:
            for binding in removed:
                self._remove(binding)
            try:
                self._save((), removed)
            except Exception:
                for binding in removed:
                    self._add(binding)
                raise
            for binding in sorted(removed, key=_order):
                logger.info("ACL deleted", acl=str(binding))
        return results

    def acl_count(self) -> int:
        return len(self._acls)

    # -- the index and the durable copy ----------------------------------------------------------

    def _candidates(self, acl_filter: AclBindingFilter) -> Iterable[AclBinding]:
        if acl_filter.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            return list(self._acls)
        return list(self._of_type(acl_filter.resource_type))

    def _of_type(self, rtype: ResourceType) -> Iterable[AclBinding]:
        for (kind, _name), acls in self._literal.items():
            if kind == rtype:
                yield from acls
        for acls in self._prefixed.get(rtype, {}).values():
            yield from acls

    def _add(self, b: AclBinding) -> None:
        self._acls.add(b)
        if b.pattern_type == PatternType.PREFIXED:
            by_prefix = self._prefixed.setdefault(b.resource_type, {})
            acls = by_prefix.setdefault(b.resource_name, set())
            if not acls:
                self._prefix_lengths.setdefault(b.resource_type, Counter())[
                    len(b.resource_name)] += 1
            acls.add(b)
        else:
            self._literal.setdefault((b.resource_type, b.resource_name), set()).add(b)

    def _remove(self, b: AclBinding) -> None:
        self._acls.discard(b)
        if b.pattern_type == PatternType.PREFIXED:
            by_prefix = self._prefixed.get(b.resource_type, {})
            acls = by_prefix.get(b.resource_name)
            if acls is None:
                return
            acls.discard(b)
            if not acls:
                del by_prefix[b.resource_name]
                lengths = self._prefix_lengths[b.resource_type]
                lengths[len(b.resource_name)] -= 1
                if lengths[len(b.resource_name)] <= 0:
                    del lengths[len(b.resource_name)]
                if not by_prefix:
                    del self._prefixed[b.resource_type]
                    del self._prefix_lengths[b.resource_type]
        else:
            key = (b.resource_type, b.resource_name)
            acls = self._literal.get(key)
            if acls is not None:
                acls.discard(b)
                if not acls:
                    del self._literal[key]

    def _save(self, added: Iterable[AclBinding], removed: Iterable[AclBinding]) -> None:
        self.state.change_acls([b.to_json() for b in sorted(self._acls, key=_order)],
                               [b.to_json() for b in added], [b.to_json() for b in removed])

    def _load(self) -> None:
        for doc in self.state.acls:
            try:
                self._add(AclBinding.from_json(doc))
            except (KeyError, ValueError, TypeError):
                logger.error("unreadable ACL skipped", acl=doc)

    def reload(self) -> None:
        """The shared ACLs changed elsewhere (another broker): decide by them from now on."""
        self._acls.clear()
        self._literal.clear()
        self._prefixed.clear()
        self._prefix_lengths.clear()
        self._load()


def validate_new_acl(b: AclBinding) -> str | None:
    """Why Kafka refuses to create this ACL (INVALID_REQUEST), or None: the broker's checks
    (AclApis: the cluster's one name, a non-empty name) then the controller's
    (AclControlManager: definite types, ALLOW or DENY), and a principal of the form type:name
    (an ACL whose principal cannot be parsed could never match and would break decisions)."""
    if b.resource_type == ResourceType.CLUSTER and b.resource_name != CLUSTER_NAME:
        return f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}"
    if not b.resource_name:
        return "Invalid empty resource name"
    if b.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        return f"Invalid resourceType {b.resource_type.name}"
    if b.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"Invalid patternType {b.pattern_type.name}"
    if b.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        return f"Invalid operation {b.operation.name}"
    if b.permission_type not in (AclPermissionType.DENY, AclPermissionType.ALLOW):
        return f"Invalid permissionType {b.permission_type.name}"
    kind, sep, _name = b.principal.partition(":")
    if not sep or not kind:
        return ("expected a string in format principalType:principalName but got "
                f"{b.principal}")
    return None


def _result(acl: AclBinding, principal: str, host: str,
            op: AclOperation) -> AclPermissionType | None:
    """ALLOW or DENY when ``acl`` matches the action (its name already applies), else None."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD_HOST and acl.host != host:
        return None
    if acl.operation != AclOperation.ALL:
        if acl.permission_type == AclPermissionType.ALLOW:
            if op == AclOperation.DESCRIBE:
                if acl.operation not in IMPLIES_DESCRIBE:
                    return None
            elif op == AclOperation.DESCRIBE_CONFIGS:
                if acl.operation not in IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif acl.operation != op:
                return None
        elif acl.operation != op:
            return None
    return acl.permission_type


def _order(b: AclBinding) -> tuple[int, str, int, str, str, int, int]:
    return (b.resource_type, b.resource_name, b.pattern_type, b.principal, b.host,
            b.operation, b.permission_type)

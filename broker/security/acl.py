"""Kafka's ACL vocabulary: resource types, operations, pattern and permission types, which
operations each resource has, and the ACL binding and binding filter with Kafka's match rules.

Codes are Kafka's (ResourceType, AclOperation, PatternType, AclPermissionType), because clients
read them as numbers. A code this broker does not know reads as UNKNOWN (0), as Kafka's fromCode
does, so a request naming one can be refused instead of failing to decode. Without an authorizer
every principal may do everything, and Kafka answers an "authorized operations" question with
the full set supported on the resource (AclEntry.supportedOperations).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any


class _KafkaEnum(IntEnum):
    """An enum read from the wire: an unknown code is UNKNOWN, never a ValueError."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        return cls(0)

    @classmethod
    def parse(cls, text: str) -> Any:
        """By Kafka's name, case-insensitive (how the durable store and tools write them)."""
        return cls[text.strip().upper()]


class ResourceType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperation(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2  # in an ACL: every operation
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


_O = AclOperation
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE,
                                   _O.ALTER, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_O.READ, _O.DESCRIBE, _O.DELETE}),
    ResourceType.CLUSTER: frozenset({_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS,
                                     _O.ALTER_CONFIGS, _O.IDEMPOTENT_WRITE, _O.ALTER,
                                     _O.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_O.DESCRIBE, _O.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_O.DESCRIBE}),
    ResourceType.USER: frozenset({_O.CREATE_TOKENS, _O.DESCRIBE_TOKENS}),
}


def authorized_operations(resource: ResourceType, asked: bool) -> set[int] | None:
    """The bitfield's operation codes for a response field; None (Kafka's INT32_MIN, "not
    asked") unless the request asked for them."""
    if not asked:
        return None
    return {int(op) for op in SUPPORTED_OPERATIONS[resource]}


class PatternType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters: any pattern type, the name compared exactly
    MATCH = 2  # filters: every pattern that would match the name (literal, "*", prefixes)
    LITERAL = 3
    PREFIXED = 4


class AclPermissionType(_KafkaEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name
WILDCARD_RESOURCE = "*"  # a LITERAL ACL named "*" matches every resource of its type
WILDCARD_HOST = "*"
WILDCARD_PRINCIPAL = "User:*"


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry (Kafka's AclBinding, flattened).

    ``principal`` is kept as its text ("User:alice"), as Kafka keeps it, so a binding read back
    is exactly what was created.
    """

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def to_json(self) -> dict[str, str]:
        """The durable form: Kafka's names, so the metadata file reads as kafka-acls prints."""
        return {"resource_type": self.resource_type.name, "resource_name": self.resource_name,
                "pattern_type": self.pattern_type.name, "principal": self.principal,
                "host": self.host, "operation": self.operation.name,
                "permission_type": self.permission_type.name}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> AclBinding:
        return cls(ResourceType.parse(doc["resource_type"]), str(doc["resource_name"]),
                   PatternType.parse(doc["pattern_type"]), str(doc["principal"]),
                   str(doc["host"]), AclOperation.parse(doc["operation"]),
                   AclPermissionType.parse(doc["permission_type"]))

    def __str__(self) -> str:
        return (f"{self.resource_type.name}:{self.pattern_type.name}:{self.resource_name} "
                f"{self.permission_type.name} {self.principal} {self.operation.name} "
                f"from {self.host}")


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which ACLs a DescribeAcls or DeleteAcls means (Kafka's AclBindingFilter).

    None for a name, principal or host matches any; ANY for a type matches any. The pattern
    type decides how the name is compared: ANY or the binding's own type compares it exactly;
    MATCH also takes the LITERAL "*" ACLs and every PREFIXED ACL the name starts with, i.e.
    every ACL that would apply to a resource of that name.
    """

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def is_unknown(self) -> bool:
        return (self.resource_type == ResourceType.UNKNOWN
                or self.pattern_type == PatternType.UNKNOWN
                or self.operation == AclOperation.UNKNOWN
                or self.permission_type == AclPermissionType.UNKNOWN)

    def matches(self, b: AclBinding) -> bool:
        return self.matches_pattern(b) and self.matches_entry(b)

    def matches_pattern(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, b.pattern_type):
            return False
        name = self.resource_name
        if name is None:
            return True
        if self.pattern_type in (PatternType.ANY, b.pattern_type):
            return name == b.resource_name
        # MATCH against a binding of another pattern type
        if b.pattern_type == PatternType.LITERAL:
            return b.resource_name in (name, WILDCARD_RESOURCE)
        if b.pattern_type == PatternType.PREFIXED:
            return name.startswith(b.resource_name)
        return False

    def matches_entry(self, b: AclBinding) -> bool:
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != b.operation:
            return False
        return self.permission_type in (AclPermissionType.ANY, b.permission_type)


ANY_ACL = AclBindingFilter()

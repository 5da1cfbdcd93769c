"""Kafka's ACL vocabulary: resource types, operations, and which operations each resource has.

Codes are Kafka's (ResourceType, AclOperation), because clients read them as numbers. Without
an authorizer every principal may do everything, and Kafka answers an "authorized operations"
question with the full set supported on the resource (AclEntry.supportedOperations).
"""

from __future__ import annotations

from enum import IntEnum


class ResourceType(IntEnum):
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperation(IntEnum):
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

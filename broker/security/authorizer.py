"""Kafka's ACL authorizer (StandardAuthorizer semantics). SKELETON: filled in by its owner.

Off (no `authorizer.class.name`): every principal may do everything.
"""

from __future__ import annotations

from broker.acl import SUPPORTED_OPERATIONS, AclOperation, ResourceType
from broker.config import BrokerConfig
from broker.metadata import MetadataStore
from broker.security.principal import Session


class Authorizer:
    def __init__(self, metadata: MetadataStore, *, enabled: bool = False,
                 super_users: frozenset[str] = frozenset(),
                 allow_if_no_acl: bool = False) -> None:
        self.metadata = metadata
        self.enabled = enabled
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl

    @classmethod
    def of(cls, cfg: BrokerConfig, metadata: MetadataStore) -> Authorizer:
        return cls(metadata)

    def authorize(self, session: Session, op: AclOperation, rtype: ResourceType,
                  name: str) -> bool:
        return True

    def authorize_any(self, session: Session, op: AclOperation, rtype: ResourceType) -> bool:
        return True

    def authorized_operations(self, session: Session, rtype: ResourceType,
                              name: str) -> set[int]:
        return {int(op) for op in SUPPORTED_OPERATIONS[rtype]}

"""SCRAM credentials (RFC 5802/7677) kept durably. SKELETON: filled in by its owner."""

from __future__ import annotations

from broker.metadata import MetadataStore


class ScramCredentialStore:
    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

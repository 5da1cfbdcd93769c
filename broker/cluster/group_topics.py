"""The topics the consumer-group coordinator (KIP-848) sees in cluster mode: the cluster's,
from the metadata cache, in place of the single broker's topic file (Kafka's group
coordinator reads the broker's metadata image, which in a cluster is the whole cluster's).

Each group subscribes by name and is assigned partitions by topic id, so the ids are the
cluster's (the ones Metadata answers) and a topic created or grown on any broker reaches the
assignor at the group's next heartbeat. Group configs stay the broker's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.cluster.broker_node import topic_uuid
from broker.cluster.metadata_cache import ClusterMetadataCache
from broker.metadata.file_store import TopicInfo

if TYPE_CHECKING:
    from broker.metadata.file_store import MetadataStore


class ClusterTopicsImage:
    """``topics`` and ``group_configs`` as the consumer-group coordinator reads them."""

    def __init__(self, cache: ClusterMetadataCache, local: MetadataStore) -> None:
        self.cache = cache
        self.local = local
        self._version = -1
        self._topics: dict[str, TopicInfo] = {}

    @property
    def topics(self) -> dict[str, TopicInfo]:
        """By name, rebuilt only when the cache took an update in since the last read."""
        if self.cache.version != self._version:
            self._topics = {name: TopicInfo(name, topic_uuid(topic_id), count)
                            for name, (topic_id, count) in self.cache.partition_counts().items()}
            self._version = self.cache.version
        return self._topics

    @property
    def group_configs(self) -> dict[str, dict[str, str]]:
        return self.local.group_configs

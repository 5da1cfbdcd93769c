"""One module per API, dispatched by API key; each reads top to bottom: validate, act, answer."""

from broker.apis import (
    api_versions,
    create_partitions,
    create_topics,
    delete_topics,
    describe_cluster,
    describe_configs,
    fetch,
    find_coordinator,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
    produce,
)
from protocol.registry import APIS

HANDLERS = {
    0: produce.handle,
    1: fetch.handle,
    2: list_offsets.handle,
    10: find_coordinator.handle,
    3: metadata.handle,
    18: api_versions.handle,
    19: create_topics.handle,
    20: delete_topics.handle,
    23: offset_for_leader_epoch.handle,
    32: describe_configs.handle,
    37: create_partitions.handle,
    60: describe_cluster.handle,
}

assert set(HANDLERS) == set(APIS), "every served API needs a handler"

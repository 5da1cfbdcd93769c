"""The cluster id in etcd: made once, by whichever broker comes first (Kafka's
createOrGetClusterId on ``/cluster/id``).

Create-if-absent in one txn whose failure branch reads the id that won, so two brokers
starting together agree on one id in one round trip each, and a later broker never replaces it.
"""

from __future__ import annotations

import json

from broker.cluster.meta_properties import new_cluster_id
from broker.cluster.paths import CLUSTER_ID
from broker.cluster.store import Compare, Get, KeyValue, MetadataStore, Put, StoreError


def encode_cluster_id(cluster_id: str) -> bytes:
    return json.dumps({"version": "1", "id": cluster_id}).encode()


def decode_cluster_id(kv: KeyValue) -> str:
    try:
        doc = json.loads(kv.value)
        cluster_id = doc["id"]
    except (ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{kv.key} holds no cluster id ({e!r}): {kv.value[:100]!r}") from None
    if not isinstance(cluster_id, str) or not cluster_id:
        raise StoreError(f"{kv.key} holds no cluster id: {kv.value[:100]!r}")
    return cluster_id


async def get_or_create_cluster_id(store: MetadataStore, proposed: str | None = None) -> str:
    """The cluster's id: the one stored, else ``proposed`` (a new random one) stored now."""
    candidate = proposed or new_cluster_id()
    result = await store.txn(
        [Compare.absent(CLUSTER_ID)],
        [Put(CLUSTER_ID, encode_cluster_id(candidate))],
        [Get(CLUSTER_ID)],
    )
    if result.succeeded:
        return candidate
    existing = result.responses[0]
    assert isinstance(existing, list) and existing, "a failed create-if-absent reads the key"
    return decode_cluster_id(existing[0])

"""The keys of the cluster in etcd, under the store's root (``minibroker.etcd.prefix``).

Kafka's ZooKeeper paths (ZkData), so a reader of Kafka's ZooKeeper mode finds everything where
it was; docs/cluster.md has the whole layout and who writes what.
"""

from __future__ import annotations

CLUSTER_ID = "/cluster/id"
BROKER_IDS = "/brokers/ids/"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"


def broker_key(node_id: int) -> str:
    return f"{BROKER_IDS}{node_id}"


def broker_id_of(key: str) -> int | None:
    """The node id of a ``/brokers/ids/<id>`` key, None for any other key."""
    if not key.startswith(BROKER_IDS):
        return None
    tail = key[len(BROKER_IDS):]
    return int(tail) if tail.isdigit() else None

"""What a request handler may use: a narrow, typed view of the broker, built once at start.

Every handler has the same signature, ``handle(ctx: ApiContext, request: Request)``, and reaches
only these owners: the node's identity, topic administration, the ReplicaManager, the group
coordinator, the fetch-session cache, the producer-id manager, the transaction coordinator, the
authorizer and the SCRAM credential store. Who is asking is ``request.connection.session``.
Nothing here imports the server; the server builds this.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.config import BrokerConfig
from broker.fetch_session import FetchSessionCache
from broker.group.coordinator import GroupCoordinator
from broker.producer_ids import ProducerIdManager
from broker.replica_manager import ReplicaManager
from broker.security.authorizer import Authorizer
from broker.security.scram import ScramCredentialStore
from broker.topic_admin import TopicAdmin
from broker.txn import TransactionCoordinator


@dataclass(slots=True)
class Node:
    """This broker as clients see it; ``port`` is known once the listener is bound."""

    node_id: int
    host: str
    port: int
    cluster_id: str


@dataclass(frozen=True, slots=True)
class ApiContext:
    node: Node
    config: BrokerConfig
    topics: TopicAdmin
    replica_manager: ReplicaManager
    groups: GroupCoordinator
    fetch_sessions: FetchSessionCache
    producer_ids: ProducerIdManager
    transactions: TransactionCoordinator
    authorizer: Authorizer
    scram: ScramCredentialStore

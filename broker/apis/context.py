"""What a request handler may use: a narrow, typed view of the broker, built once at start.

Every handler has the same signature, ``handle(ctx: ApiContext, request: Request)``, and reaches
only these owners: the node's identity, topic administration, the ReplicaManager, the group
coordinator, the fetch-session cache, the producer-id manager, the transaction coordinator, the
authorizer, the SCRAM credential store, client telemetry and the broker's clock. Who is asking is
``request.connection.session``.
Nothing here imports the server; the server builds this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.client_telemetry import ClientTelemetry
from broker.cluster.broker_node import ClusterNode
from broker.config import BrokerConfig
from broker.group.coordinator import GroupCoordinator
from broker.metadata.producer_ids import ProducerIdManager
from broker.metadata.topic_admin import TopicAdmin
from broker.replica.fetch_session import FetchSessionCache
from broker.replica.replica_manager import ReplicaManager
from broker.security.authorizer import Authorizer
from broker.security.scram import ScramCredentialStore
from broker.txn import TransactionCoordinator
from purgatory import WallClock


@dataclass(slots=True)
class Node:
    """This broker as clients see it; ``port`` is known once the listener is bound.

    ``host``/``port`` are the first advertised listener's; ``endpoints`` maps each listener's
    name to its advertised (host, port), so Metadata, FindCoordinator and DescribeCluster
    advertise the listener a client connected to, as Kafka does.
    """

    node_id: int
    host: str
    port: int
    cluster_id: str
    endpoints: dict[str, tuple[str, int]] = field(default_factory=dict)

    def address(self, listener: str) -> tuple[str, int]:
        """The advertised (host, port) of ``listener``; the first listener's if unknown."""
        return self.endpoints.get(listener, (self.host, self.port))


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
    telemetry: ClientTelemetry
    clock: WallClock  # the broker's wall clock (commit timestamps)
    #: This broker's part of the cluster (cluster mode only); None: a single broker.
    cluster: ClusterNode | None = None

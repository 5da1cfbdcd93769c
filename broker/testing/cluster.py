"""EmbeddedCluster: etcd and N real brokers in cluster mode inside the test process, with
faults between them.

    with EmbeddedCluster(nodes=3) as cluster:
        cluster.bootstrap_servers            # "127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3"
        cluster.kill(2); cluster.heal()      # a crash, then the broker back on its port

etcd is a child process (``broker.cluster.etcd_process``: found on PATH or where
``MINI_BROKER_ETCD`` points). The brokers run in this process, each an ``EmbeddedBroker`` on
its own thread and event loop, for three reasons: a broker starts in milliseconds instead of a
new interpreter's second; a pause can stall exactly one broker's loop (its lease keeper
included) while the others run; and the faults between brokers are hooks on each broker's
inter-broker client and etcd client, which only the broker's own process can set. A kill is
still a crash: connections reset, nothing flushed or checkpointed, no clean-shutdown marker, no
deregistration (its etcd lease expires after ``broker.session.timeout.ms`` as a dead process's
would); the next start runs recovery.

Ports are chosen once, at the first start, and kept by every restart; each broker has its
own data dir. Faults never go through the OS: a cut link or an unreachable etcd is the
broker's own client refusing the request (``BrokerUnavailable``, ``StoreUnavailable``), a slow
link its client waiting before each request. Every fault that fires is logged (``fault
injected``) and counted in ``fault_counts``; ``heal()`` undoes all of them.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import shutil
import socket
import struct
import tempfile
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import structlog
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from broker.cluster.controller import decode_controller
from broker.cluster.etcd_process import EtcdProcess, free_port
from broker.cluster.paths import BROKER_IDS, CONTROLLER
from broker.cluster.store import KeyValue, StoreUnavailable
from broker.cluster.topic_state import PartitionState, TopicAssignment, state_key, topic_key
from broker.healthcheck import read_exactly
from broker.interbroker.client import BrokerUnavailable
from broker.server import Broker
from broker.testing.embedded import EmbeddedBroker, property_name
from broker.testing.faults import Fault

logger = structlog.get_logger("broker.testing")

#: Test defaults of a cluster, each overridable: a dead broker is noticed within 2 s.
CLUSTER_DEFAULTS = {
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    # The internal topics with one replica, as `make cluster` starts them: the coordinators'
    # failover over replicated internal topics is not proven yet. Pass Kafka's 3 to test it.
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
}
PREFIX = "/mini-broker"
READY_TIMEOUT_S = 30.0


class ClusterFaults:
    """The faults armed between the brokers of one cluster and the count of those that fired.
    Armed from the test's thread, read on every broker's loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cut: set[frozenset[int]] = set()  # links (pairs of node ids) that refuse requests
        self.isolated: set[int] = set()  # cut from every broker and from etcd
        self.slow: dict[int, float] = {}  # node -> ms added to each of its inter-broker requests
        self.counts: dict[tuple[str, str], int] = {}  # (kind, where) -> fired

    def link_fault(self, node: int) -> Callable[[int], Awaitable[None]]:
        """The inter-broker client's hook of ``node``: awaited before each request to a peer."""

        async def check(peer: int) -> None:
            with self._lock:
                cut = (frozenset((node, peer)) in self.cut or node in self.isolated
                       or peer in self.isolated)
                ms = self.slow.get(node, 0.0) + self.slow.get(peer, 0.0)
            if cut:
                self.fired("cut", "inter-broker", node=node, peer=peer)
                raise BrokerUnavailable(f"link {node}->{peer} cut by a test fault")
            if ms > 0:
                self.fired("slow", "inter-broker", node=node, peer=peer, ms=ms)
                await asyncio.sleep(ms / 1000)

        return check

    def store_fault(self, node: int) -> Callable[[], None]:
        """The etcd client's hook of ``node``: raises while the node is cut from etcd."""

        def check() -> None:
            if node in self.isolated:
                self.fired("cut", "etcd", node=node)
                raise StoreUnavailable(f"etcd cut from broker {node} by a test fault")

        return check

    def fired(self, kind: str, where: str, **fields: Any) -> None:
        with self._lock:
            self.counts[(kind, where)] = self.counts.get((kind, where), 0) + 1
        logger.warning("fault injected", kind=kind, where=where, **fields)

    def clear(self) -> None:
        with self._lock:
            self.cut.clear()
            self.isolated.clear()
            self.slow.clear()


class ClusterBroker:
    """One broker of an EmbeddedCluster: an EmbeddedBroker on a fixed port, joined to the
    cluster's etcd, with the cluster's fault hooks installed on each start."""

    def __init__(self, node_id: int, port: int, data_dir: Path, faults: ClusterFaults,
                 properties: dict[str, str], registered: Callable[[], list[int]]) -> None:
        self.node_id = node_id
        self.port = port
        self._faults = faults
        self._registered = registered
        self._crashed = False  # killed: its registration stays until the lease expires
        self._pause_over: threading.Event | None = None
        listener = f"PLAINTEXT://127.0.0.1:{port}"
        self.embedded = EmbeddedBroker(data_dir, **{
            **properties, "node.id": str(node_id), "listeners": listener,
            "advertised.listeners": listener})

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.embedded.running

    @property
    def recovered(self) -> bool:
        """The last start found data without a clean-shutdown marker (after a kill)."""
        return self.embedded.recovered

    @property
    def broker(self) -> Broker | None:
        """The running Broker itself, for a test that must look inside."""
        return self.embedded.broker

    def listed_brokers(self, timeout: float = 10.0) -> list[int]:
        """The node ids this broker lists in its own Metadata answer, asked on a connection to
        it alone: a client library may send a request to any broker it learnt of, and an
        isolated broker's view is only seen by asking that broker."""
        request = MetadataRequest[1](topics=[])
        request.with_header(correlation_id=1, client_id="embedded-cluster")
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            sock.sendall(bytes(request.encode(header=True, framed=True)))
            (size,) = struct.unpack(">i", read_exactly(sock, 4))
            frame = read_exactly(sock, size)
        answer = MetadataResponse[1].decode(frame[4:], version=1)  # after the correlation id
        return sorted(b.node_id for b in answer.brokers)

    def start(self) -> ClusterBroker:
        """Start on the broker's port. After a kill, first wait for the crashed broker's
        registration to expire (a start would find its node id taken, as Kafka's would)."""
        if not self.running:
            if self._crashed:
                deadline = time.monotonic() + READY_TIMEOUT_S
                while self.node_id in self._registered() and time.monotonic() < deadline:
                    time.sleep(0.05)
                self._crashed = False
            self.embedded.start()
            self._on_loop(self._install_hooks)
        return self

    def stop(self) -> None:
        """Clean shutdown: leadership given up, deregistered at once."""
        self.resume()
        self.embedded.stop()

    def kill(self) -> None:
        """A crash: nothing flushed, no deregistration (the lease expires), recovery next."""
        self.resume()
        if self.running:
            self.embedded._end(_crash)
            self._crashed = True

    def restart(self, clean: bool = True) -> ClusterBroker:
        """Stop (or kill) and start again on the same port."""
        self.stop() if clean else self.kill()
        return self.start()

    def pause(self, seconds: float) -> None:
        """Stall this broker's loop for ``seconds`` (or until ``resume``): nothing it runs,
        lease refreshes included, gets a turn. Returns once the stall has begun."""
        loop = self.embedded._loop
        if not self.running or loop is None:
            raise RuntimeError(f"broker {self.node_id} is not running")
        began, over = threading.Event(), threading.Event()
        self._pause_over = over

        def stall() -> None:
            began.set()
            over.wait(seconds)

        loop.call_soon_threadsafe(stall)
        began.wait(READY_TIMEOUT_S)

    def resume(self) -> None:
        """End a pause now."""
        if self._pause_over is not None:
            self._pause_over.set()
            self._pause_over = None

    # -- the single broker's faults, on this broker ---------------------------------------------
    def inject_errors(self, api: str | int, error: str | int, count: int | None = 1,
                      topic: str | None = None, partition: int | None = None) -> Fault:
        """EmbeddedBroker.inject_errors on this broker (its clients' requests)."""
        return self.embedded.inject_errors(api, error, count, topic, partition)

    def delay(self, api: str | int, ms: float, count: int | None = 1) -> Fault:
        return self.embedded.delay(api, ms, count)

    def drop_connections(self, after: int = 0) -> Fault:
        return self.embedded.drop_connections(after)

    def clear_faults(self) -> None:
        self.embedded.clear_faults()

    @property
    def fault_counts(self) -> dict[tuple[str, str], int]:
        """This broker's request faults fired, by (kind, API name)."""
        return self.embedded.fault_counts

    def drop_links(self, peers: Iterable[int]) -> None:
        """Close this broker's connections to ``peers`` (their requests in flight fail)."""
        wanted = list(peers)

        async def drop() -> None:
            cluster = self.broker.cluster if self.broker is not None else None
            if cluster is not None and cluster.client is not None:
                for peer in wanted:
                    cluster.client.disconnect(peer)

        if self.running:
            self._on_loop(drop)

    async def _install_hooks(self) -> None:
        cluster = self.broker.cluster if self.broker is not None else None
        if cluster is None:
            return
        store: Any = cluster.store
        if hasattr(store, "fault"):
            store.fault = self._faults.store_fault(self.node_id)
        fault = self._faults.link_fault(self.node_id)
        owners = self.broker.owners if self.broker is not None else None
        fetchers = owners.replica_fetchers if owners is not None else None
        if fetchers is not None:  # the fetchers have connections of their own
            fetchers.set_fault(fault)
        elif cluster.client is not None:
            cluster.client.set_fault(fault)

    def _on_loop(self, work: Callable[[], Awaitable[Any]]) -> Any:
        return self.embedded._call(work)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"ClusterBroker(node_id={self.node_id}, port={self.port}, {state})"


async def _crash(broker: Broker) -> None:
    """Broker.crash, and the broker's part of the cluster dropped as a dead process's is:
    its etcd client cut first, so nothing is resigned or deregistered on the way out."""
    cluster = broker.cluster
    if cluster is not None:
        store: Any = cluster.store
        store.fault = _unreachable
    await broker.crash()
    if cluster is not None:
        await cluster.stop()


async def _elect(broker: ClusterBroker, topic: str, partition: int, node: int) -> None:
    """On the controller's loop: its topic controller writes ``node`` as the leader."""
    cluster = broker.broker.cluster if broker.broker is not None else None
    controller = cluster.controller if cluster is not None else None
    if cluster is None or controller is None:
        raise RuntimeError(f"broker {broker.node_id} is no longer the controller: try again")
    kv = await cluster.store.get(state_key(topic, partition))
    if kv is None:
        raise ValueError(f"no partition {topic}-{partition}")
    epoch = controller.context.epoch

    def decide(state: PartitionState) -> PartitionState | None:
        if state.leader == node or node not in state.isr:
            return None
        return state.next(node, list(state.isr), epoch)

    await controller._cas(kv, decide)


def _unreachable() -> None:
    raise StoreUnavailable("the broker crashed")


class EmbeddedCluster:
    """etcd and ``nodes`` brokers for tests: ``EmbeddedCluster(nodes=3, **server_properties)``
    (see the module docstring). Keyword arguments are server.properties keys, as for
    EmbeddedBroker, applied to every broker."""

    def __init__(self, nodes: int = 3, data_dir: str | Path | None = None,
                 **server_properties: Any) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one broker")
        self.nodes = nodes
        self._own_dir = data_dir is None
        self.data_dir = (Path(tempfile.mkdtemp(prefix="mini-broker-cluster-"))
                         if data_dir is None else Path(data_dir))
        self.properties = {**CLUSTER_DEFAULTS,
                           **{property_name(k): v for k, v in server_properties.items()}}
        self.faults = ClusterFaults()
        self.etcd: EtcdProcess | None = None
        self.brokers: list[ClusterBroker] = []
        self.start_seconds = 0.0  # how long the last start took, etcd included

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> EmbeddedCluster:
        """etcd, then every broker (in parallel); returns once all are registered and a
        controller is elected."""
        started = time.perf_counter()
        if self.etcd is None:
            # etcd's own temp dir, on tmpfs where there is one: etcd 3.4 fsyncs every write.
            self.etcd = EtcdProcess()
        self.etcd.start()
        try:
            if not self.brokers:  # a bad property raises here, etcd stopped by close()
                common = {**self.properties, "minibroker.etcd.endpoints": self.etcd.endpoint,
                          "minibroker.etcd.prefix": PREFIX}
                self.brokers = [
                    ClusterBroker(i, free_port(), self.data_dir / f"broker-{i}", self.faults,
                                  common, self.registered)
                    for i in range(1, self.nodes + 1)]
            with concurrent.futures.ThreadPoolExecutor(self.nodes) as pool:
                for done in [pool.submit(b.start) for b in self.brokers]:
                    done.result()
            self._wait(lambda: len(self.registered()) == self.nodes
                       and self.controller() is not None, "the brokers to register")
        except BaseException:
            self.close()
            raise
        self.start_seconds = time.perf_counter() - started
        return self

    def stop(self) -> None:
        """Every broker cleanly, then etcd."""
        self.heal_links()
        for broker in self.brokers:
            broker.stop()
        if self.etcd is not None:
            self.etcd.stop()

    def close(self) -> None:
        """Stop everything; remove the data dirs when this cluster made them."""
        self.heal_links()
        for broker in self.brokers:
            try:
                broker.stop()
            except Exception:  # a broker that cannot stop cleanly is crashed instead
                broker.kill()
        if self.etcd is not None:
            self.etcd.close()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> EmbeddedCluster:
        """The brokers keep their own threads' loops (a pause must stall one broker, not the
        test's loop); only the waiting is moved off the caller's loop."""
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.close)

    # -- addresses and state ----------------------------------------------------------------
    @property
    def bootstrap_servers(self) -> str:
        if not self.brokers:
            raise RuntimeError("the cluster has not been started")
        return ",".join(b.bootstrap_servers for b in self.brokers)

    def broker(self, node_id: int) -> ClusterBroker:
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        raise KeyError(f"no broker {node_id} (nodes are 1..{self.nodes})")

    def registered(self) -> list[int]:
        """The node ids registered in etcd now (live brokers, as the controller sees them)."""
        return sorted(int(kv.key[len(BROKER_IDS):]) for kv in self._range(BROKER_IDS, True)
                      if kv.key[len(BROKER_IDS):].isdigit())

    def controller(self) -> int | None:
        """The active controller's node id, None when there is none."""
        kvs = self._range(CONTROLLER)
        return decode_controller(kvs[0]) if kvs else None

    def leader(self, topic: str, partition: int) -> int | None:
        """The partition's leader, None when it is offline (or unknown)."""
        state = self._state(topic, partition)
        return state.leader if state is not None and state.online else None

    def isr(self, topic: str, partition: int) -> list[int]:
        state = self._state(topic, partition)
        return list(state.isr) if state is not None else []

    def replicas(self, topic: str, partition: int) -> list[int]:
        kvs = self._range(topic_key(topic))
        if not kvs:
            return []
        return list(TopicAssignment.decode(topic, kvs[0].value).partitions.get(partition, []))

    def wait_for(self, check: Callable[[], Any], timeout: float = 30.0,
                 what: str = "the condition") -> Any:
        """``check()``'s first truthy value, polled until ``timeout`` (TimeoutError after)."""
        return self._wait(check, what, timeout)

    def wait_for_leader(self, topic: str, partition: int, node: int | None = None,
                        timeout: float = 30.0) -> int:
        """The partition's leader once it has one (``node`` when given)."""
        def led() -> int | None:
            leader = self.leader(topic, partition)
            return leader if leader is not None and node in (None, leader) else None
        return int(self._wait(led, f"a leader of {topic}-{partition}", timeout))

    def wait_for_isr(self, topic: str, partition: int, size: int,
                     timeout: float = 30.0) -> list[int]:
        """The partition's ISR once it has exactly ``size`` members."""
        return list(self._wait(lambda: (isr := self.isr(topic, partition)) and len(isr) == size
                               and isr, f"{topic}-{partition}'s ISR of {size}", timeout))

    def wait_for_controller(self, exclude: Iterable[int] = (), timeout: float = 30.0) -> int:
        """The controller once there is one that is not in ``exclude``."""
        banned = set(exclude)
        return int(self._wait(lambda: (c := self.controller()) is not None and c not in banned
                              and c, "a controller", timeout))

    # -- faults -------------------------------------------------------------------------------
    def kill(self, node: int) -> None:
        """Crash broker ``node`` (``heal`` or its ``restart`` brings it back, recovering)."""
        self.broker(node).kill()
        self.faults.fired("kill", "broker", node=node)

    def pause(self, node: int, seconds: float) -> None:
        """Stall broker ``node``'s loop for ``seconds`` (``heal`` ends it sooner); its lease
        expires when the pause outlasts broker.session.timeout.ms."""
        self.broker(node).pause(seconds)
        self.faults.fired("pause", "broker", node=node, seconds=seconds)

    def isolate(self, node: int) -> None:
        """Cut broker ``node`` from the other brokers and from etcd; Kafka clients still reach
        it (the zombie leader): its lease expires and the controller moves on without it."""
        with self.faults._lock:
            self.faults.isolated.add(node)
        self._drop_links([node], [b.node_id for b in self.brokers if b.node_id != node])
        logger.warning("fault armed", kind="isolate", node=node)

    def partition(self, group_a: Iterable[int], group_b: Iterable[int]) -> None:
        """Cut every link between a broker of ``group_a`` and one of ``group_b`` (etcd stays
        reachable to all)."""
        a, b = sorted(set(group_a)), sorted(set(group_b))
        if set(a) & set(b):
            raise ValueError("a broker cannot be on both sides of a partition")
        with self.faults._lock:
            self.faults.cut.update(frozenset((x, y)) for x in a for y in b)
        self._drop_links(a, b)
        logger.warning("fault armed", kind="partition", group_a=a, group_b=b)

    def slow(self, node: int, ms: float) -> None:
        """Delay each inter-broker request to or from broker ``node`` by ``ms``."""
        with self.faults._lock:
            self.faults.slow[node] = float(ms)
        logger.warning("fault armed", kind="slow", node=node, ms=ms)

    def move_leader(self, topic: str, partition: int, node: int,
                    timeout: float = 30.0) -> None:
        """Make ``node`` the partition's leader, as the controller elects one: a fenced
        compare-and-swap of the partition state by the active controller, the ISR kept.
        ``node`` must be in the ISR and live (Kafka's preferred-leader election refuses
        otherwise: ValueError here). Returns once etcd has the new leader."""
        controller_id = self.wait_for_controller(timeout=timeout)
        if node not in self.isr(topic, partition):
            raise ValueError(f"broker {node} is not in the ISR of {topic}-{partition}: "
                             f"{self.isr(topic, partition)}")
        if node not in self.registered():
            raise ValueError(f"broker {node} is not live")
        self.broker(controller_id)._on_loop(lambda: _elect(self.broker(controller_id), topic,
                                                           partition, node))
        self.faults.fired("move_leader", "controller", topic=topic, partition=partition,
                          node=node)
        self.wait_for_leader(topic, partition, node, timeout)

    def heal(self, timeout: float = 30.0) -> None:
        """Undo every fault: links and etcd reachable again, pauses over, each broker's request
        faults cleared, every broker that is not running (killed or stopped) started again on
        its port, a killed one recovering.
        Returns once every broker is registered again."""
        self.heal_links()
        for broker in self.brokers:
            broker.resume()
            broker.clear_faults()
        for broker in self.brokers:
            if not broker.running:
                broker.start()
        self._wait(lambda: len(self.registered()) == self.nodes, "every broker to register",
                   timeout)

    def heal_links(self) -> None:
        """Undo the cuts and delays only."""
        self.faults.clear()

    @property
    def fault_counts(self) -> dict[tuple[str, str], int]:
        """Faults fired so far, by (kind, where): ("cut", "inter-broker"), ("cut", "etcd"),
        ("slow", "inter-broker"), ("kill", "broker"), ("pause", "broker")."""
        with self.faults._lock:
            return dict(self.faults.counts)

    def _drop_links(self, side_a: list[int], side_b: list[int]) -> None:
        for broker in self.brokers:
            if broker.node_id in side_a:
                broker.drop_links(side_b)
            elif broker.node_id in side_b:
                broker.drop_links(side_a)

    # -- etcd, read directly (the truth, whatever a broker believes) ---------------------------
    def _range(self, key: str, prefix: bool = False) -> list[KeyValue]:
        if self.etcd is None:
            raise RuntimeError("the cluster has not been started")
        raw = (PREFIX + key).encode()
        body: dict[str, str] = {"key": base64.b64encode(raw).decode()}
        if prefix:
            end = bytearray(raw)
            end[-1] += 1
            body["range_end"] = base64.b64encode(bytes(end)).decode()
        request = urllib.request.Request(f"{self.etcd.client_url}/v3/kv/range",
                                          data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=5.0) as resp:
            doc = json.loads(resp.read())
        return [KeyValue(base64.b64decode(kv["key"]).decode()[len(PREFIX):],
                         base64.b64decode(kv.get("value", "")),
                         int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)),
                         int(kv.get("version", 0)), int(kv.get("lease", 0)))
                for kv in doc.get("kvs", [])]

    def _state(self, topic: str, partition: int) -> PartitionState | None:
        kvs = self._range(state_key(topic, partition))
        return PartitionState.from_kv(kvs[0]) if kvs else None

    def _wait(self, check: Callable[[], Any], what: str,
              timeout: float = READY_TIMEOUT_S) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}")
            time.sleep(0.05)

    def __repr__(self) -> str:
        return f"EmbeddedCluster(nodes={self.nodes}, brokers={self.brokers!r})"

"""The fault schedule and the brokers it acts on.

The schedule knows brokers only through ``FaultTarget``: a bootstrap address, node ids, the
fault kinds it can inject, ``inject(kind, node)`` and ``heal(kind, node)``. Every
``interval_s`` it injects the next kind of its list (round robin) on a node drawn from a
seeded random, holds it ``duration_s`` and heals it, ``count`` times or until stopped; each
fault becomes a ``FaultEvent``.

Targets here:

- ``ProcessTarget``: one ``python -m broker`` process. ``kill`` is SIGKILL (healed by starting
  it again on the same port), ``stop`` is SIGTERM (a clean shutdown, healed the same way),
  ``pause`` is SIGSTOP (healed by SIGCONT), ``power-loss`` is SIGKILL and then the unflushed
  tail of every partition's active segment cut off, as a power cut would lose the page cache.
- ``EmbeddedTarget``: an ``EmbeddedBroker`` in this process: ``kill``, ``stop``, ``power-loss``.
- ``ClusterTarget``: an ``EmbeddedCluster`` (etcd and N brokers in this process), its faults
  aimed at the workload's topic: ``kill``, ``stop``, ``pause``, ``isolate`` and ``partition``
  hit the leader of one of its partitions, ``move-leader`` elects a follower of its ISR,
  ``slow`` delays a leader's inter-broker requests; ``unclean-failover`` crashes a leader's
  followers until its ISR is itself alone, lets it commit records alone, crashes it and
  brings the followers back (an unclean election follows where it is enabled); each is
  healed by ``EmbeddedCluster.heal`` and a wait for the topic's ISRs to be whole again.
- ``BootstrapTarget``: any Kafka-compatible bootstrap address, no faults.

A cluster joins by being wrapped in a class with the same five members (see docs/testing.md,
"Checking consistency"). A target may also have ``choose_node(kind, rng)``: the schedule then
asks it which node the next fault hits instead of drawing one of ``node_ids``.
"""

from __future__ import annotations

import os
import random
import signal
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from broker.log.checkpoint import read_offset_checkpoint

if TYPE_CHECKING:
    from broker.testing import EmbeddedBroker, EmbeddedCluster
    from tests.support.broker import BrokerProcess

RECOVERY_POINTS = "recovery-point-offset-checkpoint"
BATCH_HEADER = struct.Struct(">qi")  # baseOffset, batchLength (bytes after this field)


class FaultTarget(Protocol):
    """What the fault schedule needs from the brokers under test."""

    @property
    def bootstrap_servers(self) -> str: ...

    @property
    def node_ids(self) -> Sequence[int]: ...

    @property
    def fault_kinds(self) -> frozenset[str]: ...

    def inject(self, kind: str, node: int) -> str:
        """Begin fault ``kind`` on ``node``; return what was done, for the report."""
        ...

    def heal(self, kind: str, node: int) -> None:
        """Undo what ``inject(kind, node)`` began."""
        ...


@dataclass
class FaultEvent:
    kind: str
    node: int
    start_s: float
    end_s: float | None = None
    detail: str = ""
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(self).items()}


class FaultSchedule(threading.Thread):
    """Injects and heals faults on a target until ``stop``; then heals what is still on."""

    def __init__(self, target: FaultTarget, kinds: Sequence[str], interval_s: float,
                 duration_s: float, origin: float, seed: int = 0,
                 count: int | None = None) -> None:
        super().__init__(name="consistency-faults", daemon=True)
        unknown = set(kinds) - target.fault_kinds
        if unknown:
            raise ValueError(f"this target cannot inject {sorted(unknown)}; it can: "
                             f"{sorted(target.fault_kinds) or 'no faults'}")
        if kinds and not target.node_ids:
            raise ValueError("faults need a target with nodes")
        self.target, self.kinds = target, list(kinds)
        self.interval_s, self.duration_s = interval_s, duration_s
        self.origin = origin
        self.rng = random.Random(seed)
        self.count = count  # None: until stopped
        self.events: list[FaultEvent] = []
        self.done = threading.Event()  # set once ``count`` faults were injected and healed
        self._stopping = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.done.set()

    def _run(self) -> None:
        turn = 0
        while (self.kinds and (self.count is None or turn < self.count)
               and not self._stopping.wait(self.interval_s)):
            kind = self.kinds[turn % len(self.kinds)]
            turn += 1
            event = FaultEvent(kind, 0, self.now())
            self.events.append(event)
            try:
                event.node = self._node_for(kind)
                event.detail = self.target.inject(kind, event.node)
            except Exception as e:  # a fault that failed to begin is reported, not raised
                event.error, event.end_s = f"inject: {e!r}", self.now()
                continue
            self._stopping.wait(self.duration_s)
            self._heal(event)

    def _node_for(self, kind: str) -> int:
        choose = getattr(self.target, "choose_node", None)
        if choose is not None:
            return int(choose(kind, self.rng))
        return self.rng.choice(list(self.target.node_ids))

    def _heal(self, event: FaultEvent) -> None:
        try:
            self.target.heal(event.kind, event.node)
        except Exception as e:
            event.error = f"heal: {e!r}"
        event.end_s = self.now()

    def stop(self) -> None:
        """Stop injecting, wait for the fault under way to be healed."""
        self._stopping.set()
        if self.is_alive():
            self.join(120)
        for event in self.events:
            if event.end_s is None:
                self._heal(event)


def cut_unflushed(log_dirs: Sequence[Path]) -> dict[str, int]:
    """What a power cut does to a log written without fsync: every partition's active segment
    loses what lies past the partition's checkpointed recovery point. Returns the bytes cut by
    partition directory."""
    cut: dict[str, int] = {}
    for log_dir in log_dirs:
        recovery = read_offset_checkpoint(log_dir / RECOVERY_POINTS)
        for part in sorted(p for p in log_dir.iterdir() if p.is_dir() and "-" in p.name):
            topic, _, number = part.name.rpartition("-")
            segments = sorted(part.glob("*.log"))
            if not number.isdigit() or not segments:
                continue
            active = segments[-1]
            keep = _position_of(active, recovery.get((topic, int(number)), 0))
            size = active.stat().st_size
            if keep < size:
                os.truncate(active, keep)
                cut[part.name] = size - keep
    return cut


def _position_of(segment: Path, offset: int) -> int:
    """The byte position of the first batch of ``segment`` at or past ``offset``."""
    position = 0
    with open(segment, "rb") as f:
        while True:
            header = f.read(BATCH_HEADER.size)
            if len(header) < BATCH_HEADER.size:
                return position
            base, length = BATCH_HEADER.unpack(header)
            if base >= offset or length <= 0:
                return position
            position += BATCH_HEADER.size + length
            f.seek(position)


class ProcessTarget:
    """One broker process (tests.support.broker.BrokerProcess), node id 0."""

    fault_kinds = frozenset({"kill", "stop", "pause", "power-loss"})
    node_ids: Sequence[int] = (0,)

    def __init__(self, broker: BrokerProcess) -> None:
        self.broker = broker

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap

    def inject(self, kind: str, node: int) -> str:
        proc = self.broker.proc
        assert proc is not None
        if kind == "pause":
            os.kill(proc.pid, signal.SIGSTOP)
            return f"SIGSTOP pid {proc.pid}"
        if kind == "stop":
            return f"SIGTERM pid {proc.pid}, exit {self.broker.stop()}"
        self.broker.kill()
        if kind == "power-loss":
            cut = cut_unflushed([Path(self.broker.overrides["log.dirs"])])
            return f"SIGKILL pid {proc.pid}, cut {sum(cut.values())} bytes: {cut}"
        return f"SIGKILL pid {proc.pid}"

    def heal(self, kind: str, node: int) -> None:
        proc = self.broker.proc
        assert proc is not None
        if kind == "pause":
            os.kill(proc.pid, signal.SIGCONT)
        else:
            self.broker.start()


class EmbeddedTarget:
    """An EmbeddedBroker on its own thread, node id 0."""

    fault_kinds = frozenset({"kill", "stop", "power-loss"})
    node_ids: Sequence[int] = (0,)

    def __init__(self, broker: EmbeddedBroker) -> None:
        self.broker = broker

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    def inject(self, kind: str, node: int) -> str:
        if kind == "stop":
            self.broker.stop()
            return "clean shutdown"
        self.broker.kill()
        if kind == "power-loss":
            dirs = [Path(d) for d in self.broker.properties["log.dirs"].split(",")]
            cut = cut_unflushed(dirs)
            return f"crash, cut {sum(cut.values())} bytes: {cut}"
        return "crash"

    def heal(self, kind: str, node: int) -> None:
        self.broker.start()


def fault_node(kind: str, states: Sequence[tuple[int | None, Sequence[int]]],
               nodes: Sequence[int], rng: random.Random) -> tuple[int, int | None]:
    """The node a cluster fault hits and the partition it is aimed at, from each partition's
    (leader, ISR): for ``move-leader`` a follower in the ISR (the new leader), for every other
    kind the leader. The partitions are tried from one drawn by ``rng``; when none has such a
    node, any node of ``nodes`` (partition None)."""
    start = rng.randrange(len(states)) if states else 0
    for i in range(len(states)):
        partition = (start + i) % len(states)
        leader, isr = states[partition]
        if kind == "move-leader":
            found = sorted(n for n in isr if n != leader and leader is not None)
        else:
            found = [leader] if leader is not None else []
        if found:
            return rng.choice(found), partition
    return rng.choice(sorted(nodes)), None


class ClusterTarget:
    """An EmbeddedCluster (broker.testing.cluster), its faults aimed at ``topic``'s
    ``partitions``: each fault hits the leader of one of them (``move-leader``: a follower
    of its ISR), so that a fault always reaches a broker the producers are writing to."""

    fault_kinds = frozenset({"kill", "stop", "pause", "isolate", "partition", "slow",
                             "move-leader", "unclean-failover"})
    SLOW_MS = 200.0  # added to each inter-broker request to or from the slow broker
    PAUSE_S = 300.0  # a pause's longest stall; the heal ends it sooner
    HEAL_TIMEOUT_S = 60.0
    ALONE_RECORDS = 10  # what an unclean failover waits for the lone leader to commit
    ALONE_WAIT_S = 10.0  # ... at most (under min.insync.replicas above 1 it commits none)
    OVERWRITE_WAIT_S = 60.0  # at most, for the new leader to reach the lone leader's end

    def __init__(self, cluster: EmbeddedCluster, topic: str, partitions: int) -> None:
        self.cluster, self.topic, self.partitions = cluster, topic, partitions
        self._aimed: dict[tuple[str, int], int | None] = {}  # (kind, node) -> partition

    @property
    def bootstrap_servers(self) -> str:
        return self.cluster.bootstrap_servers

    @property
    def node_ids(self) -> Sequence[int]:
        return [b.node_id for b in self.cluster.brokers]

    def states(self) -> list[tuple[int | None, list[int]]]:
        """Each partition's (leader, ISR), read from etcd."""
        return [(self.cluster.leader(self.topic, p), self.cluster.isr(self.topic, p))
                for p in range(self.partitions)]

    def choose_node(self, kind: str, rng: random.Random) -> int:
        node, partition = fault_node(kind, self.states(), self.node_ids, rng)
        self._aimed[(kind, node)] = partition
        return node

    def inject(self, kind: str, node: int) -> str:
        partition = self._aimed.pop((kind, node), None)
        aimed = f" (leader of {self.topic}-{partition})" if partition is not None else ""
        c = self.cluster
        others = [n for n in self.node_ids if n != node]
        if kind == "kill":
            c.kill(node)
            return f"crashed broker {node}{aimed}"
        if kind == "stop":
            c.broker(node).stop()
            return f"stopped broker {node}{aimed}"
        if kind == "pause":
            c.pause(node, self.PAUSE_S)
            return f"paused broker {node}{aimed}"
        if kind == "isolate":
            c.isolate(node)
            return f"isolated broker {node}{aimed} from the brokers and etcd"
        if kind == "partition":
            c.partition([node], others)
            return f"cut broker {node}{aimed} from {others}"
        if kind == "slow":
            c.slow(node, self.SLOW_MS)
            return f"slowed broker {node}{aimed} by {self.SLOW_MS:g} ms a request"
        if kind == "move-leader":
            if partition is None:
                raise ValueError(f"no ISR of {self.topic} has a follower to lead")
            before = c.leader(self.topic, partition)
            c.move_leader(self.topic, partition, node)
            return f"moved the leader of {self.topic}-{partition} from {before} to {node}"
        if kind == "unclean-failover":
            if partition is None:
                raise ValueError(f"no partition of {self.topic} has a leader")
            return self._unclean_failover(node, partition)
        raise ValueError(f"a cluster cannot inject {kind!r}")

    def heal(self, kind: str, node: int) -> None:
        """Every fault undone, every broker registered, then each partition's ISR whole."""
        self.cluster.heal(self.HEAL_TIMEOUT_S)
        for p in range(self.partitions):
            replicas = len(self.cluster.replicas(self.topic, p))
            self.cluster.wait_for_isr(self.topic, p, replicas, self.HEAL_TIMEOUT_S)

    def _unclean_failover(self, node: int, partition: int) -> str:
        """Kafka's unclean failover ("what if they all die?"), each step waiting for a state
        it can observe rather than for time: the followers of the leader ``node`` crash and
        its ISR shrinks to itself; it commits records alone, past every follower's log end
        (none under min.insync.replicas above 1: the wait ends when it is under it);
        it crashes and its registration expires; the followers come back, and the
        controller they elect replaces the gone leader: with
        unclean.leader.election.enable by a replica out of the ISR (what the lone leader
        committed is then lost), else by no leader until ``node`` is back. An unclean
        leader is then given time (``OVERWRITE_WAIT_S`` at most) to commit the producers'
        new records up to the lone leader's high watermark: the offsets lost are read again,
        holding other values, and the checker can tell lost from unseen records."""
        c, tp = self.cluster, (self.topic, partition)
        followers = [n for n in c.replicas(*tp) if n != node]
        for follower in followers:
            c.kill(follower)
        end = self._local(node, tp, "log_end_offset")  # no follower has more: crashed since
        c.wait_for(lambda: c.isr(*tp) == [node], self.HEAL_TIMEOUT_S,
                   f"{self.topic}-{partition}'s ISR to shrink to its leader {node}")
        self._wait_high_watermark(node, tp, end + self.ALONE_RECORDS, self.ALONE_WAIT_S)
        committed = self._local(node, tp, "high_watermark")
        c.kill(node)
        c.wait_for(lambda: node not in c.registered(), self.HEAL_TIMEOUT_S,
                   f"broker {node}'s registration to expire")
        for follower in followers:
            c.broker(follower).start()
        c.wait_for(lambda: c.leader(*tp) != node, self.HEAL_TIMEOUT_S,
                   f"the controller to replace the crashed leader of {self.topic}-{partition}")
        leader = c.leader(*tp)
        if leader is None:
            outcome = f"offline: no replica of the ISR {c.isr(*tp)} is live"
        else:
            reached = self._wait_high_watermark(leader, tp, committed, self.OVERWRITE_WAIT_S)
            outcome = (f"broker {leader} elected out of the ISR [{node}] (unclean), ISR "
                       f"{c.isr(*tp)}, its high watermark {reached} a while later")
        return (f"crashed {followers}, the followers of broker {node} (leader of "
                f"{self.topic}-{partition}), until its ISR was [{node}]; it committed "
                f"{max(committed - end, 0)} records alone past offset {end}; crashed it, "
                f"restarted {followers}: {outcome}")

    def _replica(self, node: int, tp: tuple[str, int]) -> Any:
        """Broker ``node``'s own replica of ``tp`` (a broker.replica Partition), or None."""
        broker = self.cluster.broker(node).broker
        replicas = broker.replica_manager if broker is not None else None
        return replicas.partitions.get(tp) if replicas is not None else None

    def _local(self, node: int, tp: tuple[str, int], name: str) -> int:
        """An offset of broker ``node``'s own replica of ``tp`` (-1 when it has none)."""
        replica = self._replica(node, tp)
        return int(getattr(replica, name)) if replica is not None else -1

    def _wait_high_watermark(self, node: int, tp: tuple[str, int], offset: int,
                             timeout_s: float) -> int:
        """Leader ``node``'s high watermark once it reached ``offset``, once the leader is
        alone in its ISR and under min.insync.replicas (acks=all refused: it commits nothing
        more), or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (hw := self._local(node, tp, "high_watermark")) < offset:
            replica = self._replica(node, tp)
            refusing = replica is not None and tuple(replica.isr) == (node,) \
                and replica.under_min_isr
            if refusing or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return hw


class BootstrapTarget:
    """Any Kafka-compatible bootstrap address: the workload without faults."""

    fault_kinds: frozenset[str] = frozenset()
    node_ids: Sequence[int] = ()

    def __init__(self, bootstrap_servers: str) -> None:
        self._bootstrap = bootstrap_servers

    @property
    def bootstrap_servers(self) -> str:
        return self._bootstrap

    def inject(self, kind: str, node: int) -> str:
        raise ValueError("a bootstrap address takes no faults")

    def heal(self, kind: str, node: int) -> None:
        raise ValueError("a bootstrap address takes no faults")

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
- ``BootstrapTarget``: any Kafka-compatible bootstrap address, no faults.

A cluster joins by being wrapped in a class with the same five members (see docs/testing.md,
"Checking consistency").
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
    from broker.testing import EmbeddedBroker
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
            event = FaultEvent(kind, self.rng.choice(list(self.target.node_ids)), self.now())
            self.events.append(event)
            try:
                event.detail = self.target.inject(kind, event.node)
            except Exception as e:  # a fault that failed to begin is reported, not raised
                event.error, event.end_s = f"inject: {e!r}", self.now()
                continue
            self._stopping.wait(self.duration_s)
            self._heal(event)

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

"""A development cluster in the foreground: one etcd and three brokers on 127.0.0.1.

    python -m tools.cluster_run                      # what `make cluster` runs
    python -m tools.cluster_run --base-port 19092 --etcd-port 0 --metrics-base-port 0

Brokers listen on base-port, base-port+1, ...; etcd on --etcd-port (its peer port the next
one; 0 picks free ports). Everything is kept under --data-dir (./data/cluster by default): the
etcd member's data in etcd/, each broker's logs in broker-<id>/, so a second run finds the
cluster it left. Every child's output is printed with its name in front.

Each child runs in a session of its own, so the terminal's Ctrl-C reaches only this launcher,
which stops them in order: the brokers first (each deregisters while etcd is still there), then
etcd; SIGKILL for any that is still running after the grace period. A child is also told to
stop (SIGTERM) by the kernel when this launcher dies, so none is left behind even then. Exit
code: 0 after a clean stop, non-zero when a child failed to start (its own code when it had
one) or did not stop cleanly.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from broker.cluster.etcd_process import EtcdNotFound, EtcdProcess, find_etcd, free_port

ROOT = Path(__file__).resolve().parent.parent
PR_SET_PDEATHSIG = 1
READY_LINE = "cluster ready"
BROKER_STARTED = "broker started"


_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only makes one call


def _child_setup() -> None:
    """In the child, before exec: SIGTERM from the kernel if the launcher dies (its own
    session, so the terminal's Ctrl-C is the launcher's to handle, is start_new_session)."""
    _LIBC.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


class Output:
    """One writer for every child's lines, each line whole and prefixed by its child's name."""

    def __init__(self, stream: IO[str], width: int) -> None:
        self._stream = stream
        self._width = width
        self._lock = threading.Lock()

    def line(self, name: str, text: str) -> None:
        with self._lock:
            self._stream.write(f"{name:<{self._width}} | {text}\n")
            self._stream.flush()


@dataclass
class Child:
    """A child process whose stdout and stderr are read line by line into ``Output``."""

    name: str
    args: list[str]
    ready_text: str | None = None  # a line containing it means started
    # Exit codes of a clean stop: etcd handles SIGINT and then dies of it (Go re-raises it).
    clean_codes: tuple[int, ...] = (0,)
    proc: subprocess.Popen[str] | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    _reader: threading.Thread | None = None

    def start(self, out: Output, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", bufsize=1, env=env, cwd=ROOT, start_new_session=True,
            preexec_fn=_child_setup)
        self._reader = threading.Thread(target=self._read, args=(out,), daemon=True)
        self._reader.start()

    def _read(self, out: Output) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            out.line(self.name, line)
            if self.ready_text is not None and self.ready_text in line:
                self.ready.set()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None when still running after ``timeout``."""
        if self.proc is None:
            return None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        if self._reader is not None:
            self._reader.join(2.0)  # the last lines
        return code


@dataclass(frozen=True)
class Plan:
    """Where everything listens and lives."""

    data_dir: Path
    broker_ports: list[int]
    metrics_ports: list[int]  # 0 = ephemeral
    etcd_client_port: int
    etcd_peer_port: int
    config: Path
    overrides: list[str]
    log_format: str

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.broker_ports)

    @property
    def etcd_endpoint(self) -> str:
        return f"127.0.0.1:{self.etcd_client_port}"


def make_plan(args: argparse.Namespace) -> Plan:
    if args.etcd_port == 0:
        client, peer = free_port(), free_port()
    else:
        client, peer = args.etcd_port, args.etcd_port + 1
    ids = range(1, args.brokers + 1)
    metrics = [0 if args.metrics_base_port == 0 else args.metrics_base_port + i - 1 for i in ids]
    fmt = args.log_format or ("console" if sys.stdout.isatty() else "json")
    return Plan(Path(args.data_dir).resolve(), [args.base_port + i - 1 for i in ids], metrics,
                client, peer, Path(args.config).resolve(), list(args.override), fmt)


def etcd_child(plan: Plan, binary: str) -> tuple[Child, EtcdProcess]:
    """etcd's command line as EtcdProcess builds it (one loopback member); the launcher runs
    it itself to read its output."""
    member = EtcdProcess(name="etcd", data_dir=plan.data_dir / "etcd", binary=binary,
                         client_port=plan.etcd_client_port, peer_port=plan.etcd_peer_port)
    return Child("etcd", member.args(), clean_codes=(0, -signal.SIGINT)), member


#: The internal topics on one replica each, as Kafka's own single-node quickstart sets them:
#: with Kafka's defaults (3 replicas, min ISR 2 for transactions) a coordinator's failover over
#: its replicated partition is not proven yet (docs/cluster.md).
INTERNAL_TOPICS_ONE_REPLICA = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
}


def broker_child(plan: Plan, node_id: int) -> Child:
    port = plan.broker_ports[node_id - 1]
    overrides = {
        "node.id": str(node_id),
        "listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "log.dirs": str(plan.data_dir / f"broker-{node_id}"),
        "minibroker.etcd.endpoints": plan.etcd_endpoint,
        "metrics.listener": f"http://127.0.0.1:{plan.metrics_ports[node_id - 1]}/metrics",
        "log.format": plan.log_format,
        **INTERNAL_TOPICS_ONE_REPLICA,
    }
    args = [sys.executable, "-m", "broker", str(plan.config)]
    for key, value in overrides.items():
        args += ["--override", f"{key}={value}"]
    for extra in plan.overrides:  # the caller's, last: they win
        args += ["--override", extra]
    return Child(f"broker-{node_id}", args, ready_text=BROKER_STARTED)


class Launcher:
    """Starts etcd, then the brokers; serves until told to stop; stops them in order."""

    def __init__(self, plan: Plan, binary: str, out: Output, start_timeout: float,
                 stop_timeout: float) -> None:
        self.plan = plan
        self.out = out
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.etcd, self.member = etcd_child(plan, binary)
        self.brokers = [broker_child(plan, i) for i in range(1, len(plan.broker_ports) + 1)]
        self.stop_requested = threading.Event()
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def say(self, text: str) -> None:
        self.out.line("cluster", text)

    def run(self) -> int:
        try:
            code = self._start()
            if code == 0:
                self.say(f"{READY_LINE}: bootstrap.servers={self.plan.bootstrap}, etcd "
                         f"{self.plan.etcd_endpoint}, data in {self.plan.data_dir} "
                         f"(Ctrl-C stops it)")
                self._serve()
        finally:
            clean = self._stop_all()
        return code if code != 0 else (0 if clean else 1)

    def _start(self) -> int:
        """0 when etcd and every broker started; else the failed child's code (1 if none)."""
        for sub in ("etcd", *(f"broker-{i}" for i in range(1, len(self.brokers) + 1))):
            (self.plan.data_dir / sub).mkdir(parents=True, exist_ok=True)
        self.etcd.start(self.out, self.env)
        if not self._wait_for([self.etcd], self.member.healthy, "etcd"):
            return self._failure([self.etcd])
        for broker in self.brokers:
            broker.start(self.out, self.env)
        if not self._wait_for(self.brokers, lambda: all(b.ready.is_set() for b in self.brokers),
                              "the brokers"):
            return self._failure([self.etcd, *self.brokers])
        return 0

    def _wait_for(self, children: Sequence[Child], done: Callable[[], bool], what: str) -> bool:
        deadline = time.monotonic() + self.start_timeout
        while not done():
            if self.stop_requested.is_set():
                self.say(f"stopped while waiting for {what}")
                return False
            if any(not c.running() for c in children):
                return False
            if time.monotonic() > deadline:
                self.say(f"{what} did not start within {self.start_timeout:g} s")
                return False
            time.sleep(0.05)
        return True

    def _failure(self, children: Sequence[Child]) -> int:
        for child in children:
            if child.proc is not None and not child.running():
                code = child.wait(1.0) or 1
                self.say(f"{child.name} exited with code {child.proc.returncode} while "
                         f"starting: stopping the others")
                return code
        return 1

    def _serve(self) -> None:
        """Until told to stop. A broker that exits is reported and the others serve on (a
        failover to watch); etcd exiting ends the run, as nothing can serve without it."""
        reported: set[str] = set()
        while not self.stop_requested.wait(0.2):
            for child in (self.etcd, *self.brokers):
                if not child.running() and child.name not in reported:
                    reported.add(child.name)
                    assert child.proc is not None
                    self.say(f"{child.name} exited with code {child.proc.returncode}")
            if "etcd" in reported:
                return

    def _stop_all(self) -> bool:
        """SIGINT to the brokers, wait; then to etcd, wait; SIGKILL what remains. True when
        every child that was running exited 0 on its own."""
        clean = True
        for group in (self.brokers, [self.etcd]):
            live = [c for c in group if c.running()]
            if not live:
                continue
            self.say(f"stopping {', '.join(c.name for c in live)}")
            for child in live:
                child.signal(signal.SIGINT)
            deadline = time.monotonic() + self.stop_timeout
            for child in live:
                code = child.wait(max(0.0, deadline - time.monotonic()))
                if code is None:
                    self.say(f"{child.name} still running after {self.stop_timeout:g} s: "
                             f"SIGKILL")
                    child.signal(signal.SIGKILL)
                    child.wait(10.0)
                    clean = False
                elif code not in child.clean_codes:
                    self.say(f"{child.name} exited with code {code}")
                    clean = False
        return clean


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.cluster_run",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base-port", type=int, default=9092,
                        help="the first broker's port; the others follow (default 9092)")
    parser.add_argument("--brokers", type=int, default=3, choices=range(1, 10),
                        metavar="N", help="how many brokers (default 3)")
    parser.add_argument("--etcd-port", type=int, default=2379,
                        help="etcd's client port, its peer port the next (default 2379; 0: "
                             "free ports)")
    parser.add_argument("--metrics-base-port", type=int, default=9404,
                        help="the first broker's metrics port (default 9404; 0: ephemeral)")
    parser.add_argument("--data-dir", default="data/cluster",
                        help="where etcd's and the brokers' data live (default data/cluster)")
    parser.add_argument("--config", default=str(ROOT / "config" / "server.properties"),
                        help="the brokers' server.properties (each broker's own keys override it)")
    parser.add_argument("--override", action="append", default=[], metavar="key=value",
                        help="a broker key for every broker (repeatable)")
    parser.add_argument("--log-format", choices=("json", "console"), default=None,
                        help="the brokers' log.format (default: console on a terminal)")
    parser.add_argument("--start-timeout", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument("--stop-timeout", type=float, default=30.0, metavar="SECONDS")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    plan = make_plan(args)
    out = Output(sys.stdout, width=max(len("cluster"), len(f"broker-{args.brokers}")))
    try:
        binary = find_etcd()
    except EtcdNotFound as e:
        print(f"cluster_run: {e}", file=sys.stderr)
        return 1
    launcher = Launcher(plan, binary, out, args.start_timeout, args.stop_timeout)

    def request_stop(signum: int, _frame: object) -> None:
        launcher.stop_requested.set()

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())

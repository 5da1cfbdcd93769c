"""An etcd server as a child process, for tests and the embedded cluster.

etcd is a Go binary and cannot run inside a Python process, so "embedded" means a subprocess on
ephemeral loopback ports with a private data dir (on tmpfs where there is one: etcd 3.4 has no
flag to skip fsync). ``stop`` and ``start`` again keep the ports and the data dir, which is
what a client reconnecting to "the same etcd" needs; the process is only ever signalled by its
own PID.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ETCD_ENV = "MINI_BROKER_ETCD"

# 1.5 election timeouts, rounded up to whole seconds, is etcd's floor for a lease TTL (the
# lessor's minimum): the defaults (100 ms heartbeat, 1000 ms election) give 2 s, these give 1 s.
# A single member never holds an election after it has started, so short timeouts cost nothing
# and make a (re)start quicker; a several-member cluster on a busy machine wants more.
FAST_HEARTBEAT_MS = 25
FAST_ELECTION_MS = 250


class EtcdNotFound(RuntimeError):
    """No etcd binary: neither MINI_BROKER_ETCD nor PATH names one."""


def find_etcd() -> str:
    """The etcd binary: $MINI_BROKER_ETCD when set, else ``etcd`` on PATH."""
    configured = os.environ.get(ETCD_ENV)
    if configured:
        if os.path.isfile(configured) and os.access(configured, os.X_OK):
            return configured
        raise EtcdNotFound(f"{ETCD_ENV}={configured} is not an executable file")
    found = shutil.which("etcd")
    if found is None:
        raise EtcdNotFound(
            f"etcd not found on PATH and {ETCD_ENV} is unset (`make etcd-deps` installs it)"
        )
    return found


def free_port() -> int:
    """A loopback port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scratch_root() -> str | None:
    """tmpfs when the machine has a writable one, else the system's temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return None


class EtcdProcess:
    """One etcd member on 127.0.0.1, started and stopped by PID.

    ``endpoint`` is ``host:port`` for clients. ``stop`` keeps the data dir and ports so
    ``start`` brings back the same member with its keys, revisions and leases; ``close`` stops
    it and removes the data dir it created.
    """

    def __init__(
        self,
        *,
        name: str = "n1",
        data_dir: Path | None = None,
        client_port: int | None = None,
        peer_port: int | None = None,
        heartbeat_ms: int = FAST_HEARTBEAT_MS,
        election_ms: int = FAST_ELECTION_MS,
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.binary = binary or find_etcd()
        self.name = name
        self._own_dir = data_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="mini-broker-etcd-", dir=_scratch_root()))
            if data_dir is None
            else Path(data_dir)
        )
        self.data_dir = self.base_dir / f"{name}.etcd"
        self.log_path = self.base_dir / f"{name}.log"
        # Ports the kernel picked may be taken by someone else before etcd binds them: then the
        # first start picks again. Ports given by the caller are kept.
        self._pick_ports = client_port is None and peer_port is None
        self._started = False
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def args(self) -> list[str]:
        """The command line: one member, loopback only, no v2 API."""
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", f"{self.name}={self.peer_url}",
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--logger", "zap",
            "--log-level", "warn",
            *self.extra_args,
        ]  # fmt: skip

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 15.0) -> EtcdProcess:
        """Start the member and wait until it has a leader and answers on its client URL."""
        if self.running():
            return self
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            self._spawn()
            try:
                self._wait_healthy(timeout)
                break
            except RuntimeError:
                port_taken = "address already in use" in self.log_tail()
                if attempt == 2 or self._started or not self._pick_ports or not port_taken:
                    raise
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.client_port, self.peer_port = free_port(), free_port()
        self._started = True
        return self

    def _spawn(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.args(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.02
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {self.proc.returncode} on start: {self.log_tail()}"
                )
            if self.healthy():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"etcd not healthy after {timeout} s: {self.log_tail()}")
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def healthy(self) -> bool:
        """GET /health: true once the member serves reads and writes (it has a leader)."""
        try:
            with urllib.request.urlopen(f"{self.client_url}/health", timeout=1.0) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, urllib.error.URLError, ValueError):
            return False

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a clean shutdown), SIGKILL when it does not exit in time."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: a crash; the data dir keeps what etcd had synced."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def _signal_and_wait(self, sig: signal.Signals, timeout: float) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            if sig != signal.SIGKILL:
                # A stopped process cannot handle SIGTERM.
                proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10.0)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: etcd holds its sockets but answers nothing (a hung server)."""
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.running():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGCONT)

    def restart(self, timeout: float = 15.0) -> None:
        """Stop and start the same member: same ports, same data dir."""
        self.stop()
        self.start(timeout)

    def close(self) -> None:
        """Stop the member and remove the data dir this object created."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> EtcdProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

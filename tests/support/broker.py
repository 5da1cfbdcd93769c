"""A real mini-broker process on loopback for integration tests: ephemeral port, temp data dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


class BrokerProcess:
    """Starts `python -m broker` with overrides; learns its port from the start log line."""

    def __init__(self, data_dir: Path, overrides: dict[str, str] | None = None,
                 properties: Path | None = None) -> None:
        self.data_dir = data_dir
        self.properties = properties  # a server.properties file the overrides apply to
        # Metrics on an ephemeral port by default, so brokers never collide on 9404.
        self.overrides = {"log.dirs": str(data_dir / "logs"),
                          "metrics.listener": "http://127.0.0.1:0/metrics", **(overrides or {})}
        self.port = 0  # the first listener's bound port
        # Bound port by listener name. Without a `listeners` override the broker listens on
        # PLAINTEXT://127.0.0.1; with one, that value is used (port 0 allowed). Either way an
        # ephemeral port is bound first and kept on a restart.
        self.ports: dict[str, int] = {}
        self.metrics_port: int | None = None  # None when metrics are off
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir / "broker.log"
        self._log_offset = 0
        #: run in the child before the broker starts (e.g. resource.setrlimit for a test)
        self.preexec_fn: Callable[[], None] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def bootstrap_for(self, listener: str) -> str:
        """127.0.0.1:<bound port> of one listener (by name, as in `listeners`)."""
        return f"127.0.0.1:{self.ports[listener.upper()]}"

    def start(self, timeout: float = 60.0) -> BrokerProcess:
        overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{self.port}", **self.overrides}
        overrides["listeners"] = ",".join(self._keep_port(e)
                                          for e in overrides["listeners"].split(","))
        args = [sys.executable, "-m", "broker"]
        if self.properties is not None:
            args.append(str(self.properties))
        for k, v in overrides.items():
            args += ["--override", f"{k}={v}"]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, env={**os.environ},
                                     preexec_fn=self.preexec_fn)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.new_log_lines():
                if line.get("event") == "broker started":
                    self.port = line["port"]
                    self.ports = dict(line.get("listeners") or {"PLAINTEXT": self.port})
                    self.metrics_port = line.get("metrics_port")
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_text()}")
            time.sleep(0.05)
        # Never left running behind the error: no fixture would stop a broker it never got.
        self.proc.kill()
        self.proc.wait(10)
        raise TimeoutError(f"broker did not start in {timeout} s:\n{self.log_text()}")

    def _keep_port(self, entry: str) -> str:
        """NAME://host:0 -> NAME://host:<the port bound before>, so a restart keeps it."""
        name, sep, rest = entry.strip().partition("://")
        host, _, port = rest.rpartition(":")
        bound = self.ports.get(name.upper())
        return f"{name}://{host}:{bound}" if sep and port == "0" and bound else entry.strip()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def new_log_lines(self) -> list[dict]:
        """JSON log lines written since this start."""
        text = self.log_path.read_bytes()[self._log_offset:].decode(errors="replace")
        out = []
        for raw in text.splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue
        return out

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait: the clean shutdown path."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # The failure is the test's to report; a broker left running would load every
            # test after it (and the machine after the run).
            self.proc.kill()
            self.proc.wait(10)
            raise

    def kill(self) -> None:
        """SIGKILL: the crash path."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def restart(self, clean: bool = True) -> BrokerProcess:
        self.stop() if clean else self.kill()
        return self.start()  # same port: clients keep their bootstrap address

"""A raw Kafka connection for tests that need exact control of requests on one socket."""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Any

CLIENT_ID = "wire-test"


class Wire:
    """One TCP connection: send kafka-python request objects, read whole response frames."""

    def __init__(self, port: int, timeout: float = 10) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        host, local_port = self.sock.getsockname()[:2]
        self.peer = f"{host}:{local_port}"  # how the broker names this connection in its log
        self._buf = bytearray()
        self._correlation = 0

    @staticmethod
    def encode(request: Any, correlation_id: int) -> bytes:
        request.with_header(correlation_id=correlation_id, client_id=CLIENT_ID)
        return bytes(request.encode(header=True, framed=True))

    def send(self, request: Any, correlation_id: int | None = None) -> int:
        if correlation_id is None:
            self._correlation += 1
            correlation_id = self._correlation
        self.sock.sendall(self.encode(request, correlation_id))
        return correlation_id

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, request: Any, response_cls: Any) -> Any:
        """Send one request and decode its response (same version as the request)."""
        version = request.API_VERSION
        correlation_id = self.send(request)
        frame = self.read_frame()
        assert struct.unpack_from(">i", frame)[0] == correlation_id
        header = 5 if request.flexible_version_q(version) and response_cls.API_KEY != 18 else 4
        return response_cls.decode(frame[header:], version=version)

    def readable(self, timeout: float) -> bool:
        """Whether a byte of a response is waiting (or arrives within `timeout` seconds)."""
        if self._buf:
            return True
        ready, _, _ = select.select([self.sock], [], [], timeout)
        return bool(ready)

    def read_frame(self) -> bytes:
        """One response frame without its size prefix (correlation id first)."""
        while True:
            if len(self._buf) >= 4:
                (size,) = struct.unpack_from(">i", self._buf)
                if len(self._buf) >= 4 + size:
                    frame = bytes(self._buf[4 : 4 + size])
                    del self._buf[: 4 + size]
                    return frame
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("broker closed the connection")
            self._buf += chunk

    def closed_by_broker(self, timeout: float = 5) -> tuple[bool, bytes]:
        """Whether the broker closes the connection within `timeout`, and what it sent first."""
        self.sock.settimeout(timeout)
        got = bytearray()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = self.sock.recv(65536)
            except (ConnectionResetError, BrokenPipeError):
                return True, bytes(got)
            except TimeoutError:
                return False, bytes(got)
            if not chunk:
                return True, bytes(got)
            got += chunk
        return False, bytes(got)

    def close(self) -> None:
        self.sock.close()

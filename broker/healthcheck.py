"""`python -m broker.healthcheck [host:port]`: exit 0 if a broker answers ApiVersions there.

For container health checks: it asks what a client asks first (ApiVersions v0, which every
broker answers whatever it supports), so a broker that is up but not serving fails it. The
address defaults to 127.0.0.1:9092; no dependency beyond the standard library.
"""

from __future__ import annotations

import socket
import struct
import sys

API_VERSIONS_KEY = 18
CORRELATION_ID = 0x4B1D
CLIENT_ID = b"healthcheck"


def request() -> bytes:
    """ApiVersions v0: header v1 (key, version, correlation id, client id), empty body."""
    body = struct.pack(">hhih", API_VERSIONS_KEY, 0, CORRELATION_ID, len(CLIENT_ID)) + CLIENT_ID
    return struct.pack(">i", len(body)) + body


def read_exactly(sock: socket.socket, n: int) -> bytes:
    """``n`` bytes from a blocking socket; ConnectionError if the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def check(host: str, port: int, timeout: float = 5.0) -> str | None:
    """None if healthy, else what went wrong."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(request())
            (size,) = struct.unpack(">i", read_exactly(sock, 4))
            if not 6 <= size <= 1 << 20:
                return f"unexpected response size {size}"
            frame = read_exactly(sock, size)
    except OSError as exc:
        return f"{host}:{port}: {exc}"
    correlation_id, error_code = struct.unpack_from(">ih", frame)
    if correlation_id != CORRELATION_ID:
        return f"correlation id {correlation_id}, expected {CORRELATION_ID}"
    if error_code != 0:
        return f"ApiVersions answered error code {error_code}"
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    address = args[0] if args else "127.0.0.1:9092"
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        print(f"healthcheck: expected host:port, got {address!r}", file=sys.stderr)
        return 2
    problem = check(host.strip("[]") or "127.0.0.1", int(port))
    if problem is not None:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The metrics endpoint: a minimal HTTP server on the broker's own loop.

Not prometheus_client's HTTP server thread: the collector reads loop-owned state, so a scrape
must run on the loop to see one consistent state; its cost (a few ms for thousands of series)
is paid once per scrape interval, on its own listener, off the Kafka port.
"""

from __future__ import annotations

import asyncio
import gzip
import time
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from broker.metrics.collector import BrokerMetrics

logger = structlog.get_logger("broker.metrics")


class MetricsServer:
    """A minimal HTTP/1.1 server on the broker's loop: GET (or HEAD) ``path`` answers the
    exposition (text or OpenMetrics as the Accept header asks, gzip if accepted); ``/`` points
    to it; anything else is 404. One request per connection."""

    def __init__(self, metrics: BrokerMetrics, host: str, port: int, path: str) -> None:
        self.metrics = metrics
        self.host = host
        self.port = port
        self.path = path
        self.server: asyncio.base_events.Server | None = None
        self.scrapes = 0

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{self.path}"

    async def start(self, *, serving: bool = True) -> None:
        """Bind (and answer at once, unless ``serving`` is false: then ``serve`` later)."""
        self.server = await asyncio.start_server(self._serve, self.host, self.port,
                                                 reuse_address=True, start_serving=serving)
        self.port = self.server.sockets[0].getsockname()[1]

    async def serve(self) -> None:
        assert self.server is not None
        await self.server.start_serving()

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                head = await reader.readuntil(b"\r\n\r\n")
            status, ctype, body, extra = self._answer(head)
            method = head.split(b" ", 1)[0]
            headers = [f"HTTP/1.1 {status}", f"Content-Type: {ctype}",
                       f"Content-Length: {len(body)}", "Connection: close", *extra]
            writer.write(("\r\n".join(headers) + "\r\n\r\n").encode())
            if method != b"HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError,
                ConnectionError):
            pass
        except Exception:
            logger.exception("metrics request failed")
        finally:
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, str, bytes, list[str]]:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n", []
        path = parts[1].split("?", 1)[0]
        if path == "/":
            return "200 OK", "text/html", (
                f'<a href="{self.path}">{self.path}</a>\n').encode(), []
        if path != self.path:
            return "404 Not Found", "text/plain", b"not found\n", []
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        started = time.monotonic()
        body, ctype = self.metrics.exposition(headers.get("accept", ""))
        self.scrapes += 1
        logger.debug("scrape", bytes=len(body), ms=round((time.monotonic() - started) * 1000, 2))
        from prometheus_client.exposition import gzip_accepted  # loaded by exposition() above

        if gzip_accepted(headers.get("accept-encoding", "")):
            return "200 OK", ctype, gzip.compress(body, compresslevel=1), [
                "Content-Encoding: gzip"]
        return "200 OK", ctype, body, []

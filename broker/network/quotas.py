"""Connection limits with Kafka's keys: max.connections, max.connections.per.ip, and the idle
timeout connections.max.idle.ms.

A connection over a limit is closed as soon as it is accepted (Kafka closes one over the
per-IP limit the same way; over max.connections Kafka stops accepting until a slot frees, which
an asyncio server cannot do per listener, so the new connection is closed instead). Refusals and
idle closes are counted for metrics and logged, the first of each kind and then one in a
thousand, so a flood of connections cannot flood the log.
"""

from __future__ import annotations

import structlog

logger = structlog.get_logger("broker.network")

MAX_CONNECTIONS = "max.connections"
MAX_PER_IP = "max.connections.per.ip"


class ConnectionQuotas:
    def __init__(self, max_connections: int, max_per_ip: int) -> None:
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip
        self.count = 0
        self.per_ip: dict[str, int] = {}
        self.refused: dict[str, int] = {MAX_CONNECTIONS: 0, MAX_PER_IP: 0}
        self.idle_closed = 0

    def set_limits(self, max_connections: int, max_per_ip: int) -> None:
        """New limits (a dynamic config change): as Kafka, they bind new connections only."""
        self.max_connections = max_connections
        self.max_per_ip = max_per_ip

    def admit(self, ip: str) -> bool:
        """Take a slot for a new connection from ``ip``; False (counted, logged) when over."""
        if self.count >= self.max_connections:
            return self._refuse(MAX_CONNECTIONS, ip, self.max_connections)
        if self.per_ip.get(ip, 0) >= self.max_per_ip:
            return self._refuse(MAX_PER_IP, ip, self.max_per_ip)
        self.count += 1
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1
        return True

    def release(self, ip: str) -> None:
        self.count -= 1
        left = self.per_ip.get(ip, 1) - 1
        if left:
            self.per_ip[ip] = left
        else:
            self.per_ip.pop(ip, None)

    def _refuse(self, key: str, ip: str, limit: int) -> bool:
        n = self.refused[key] = self.refused[key] + 1
        if n % 1000 == 1:
            logger.warning("connection refused", limit=key, value=limit, ip=ip, refused=n)
        return False

    def closed_idle(self, peer: str, idle_ms: float) -> None:
        self.idle_closed += 1
        if self.idle_closed % 1000 == 1:
            logger.debug("idle connection closed", peer=peer, idle_ms=round(idle_ms),
                      closed=self.idle_closed)

"""The cluster's configuration, read from the broker's keys and checked together.

Each key is parsed where every key is (broker/config.py); what only makes sense across keys
(the heartbeat shorter than the session, an endpoint that is host:port, a prefix that is an
absolute path) is checked here, once, with one ConfigError line naming the key. An empty
``minibroker.etcd.endpoints`` is single-node mode: nothing of the cluster runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from broker.config import BrokerConfig
from broker.config_error import ConfigError


@dataclass(frozen=True, slots=True)
class ClusterSettings:
    node_id: int
    endpoints: tuple[tuple[str, int], ...]
    prefix: str
    rack: str | None
    session_timeout_ms: int
    heartbeat_interval_ms: int

    @property
    def enabled(self) -> bool:
        """A cluster is configured (else: single-node mode, the default)."""
        return bool(self.endpoints)

    @property
    def lease_ttl_s(self) -> int:
        """The registration lease's TTL: etcd counts leases in whole seconds."""
        return max(1, math.ceil(self.session_timeout_ms / 1000))

    @property
    def endpoint(self) -> str:
        """The etcd endpoint the store connects to."""
        host, port = self.endpoints[0]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ClusterSettings:
        session = config["broker.session.timeout.ms"]
        heartbeat = config["broker.heartbeat.interval.ms"]
        if heartbeat >= session:
            raise ConfigError(f"broker.heartbeat.interval.ms={heartbeat} must be less than "
                              f"broker.session.timeout.ms={session}")
        endpoints = tuple(parse_etcd_endpoint(e) for e in config["minibroker.etcd.endpoints"])
        if len(endpoints) > 1:
            # EtcdStore keeps one channel to one member; failing over between members is not
            # built yet, and taking only the first would hide the others silently.
            raise ConfigError(
                f"minibroker.etcd.endpoints: {len(endpoints)} endpoints given, but a broker "
                f"connects to one etcd member yet: give one (e.g. {endpoints[0][0]}:"
                f"{endpoints[0][1]})")
        return cls(
            node_id=config["node.id"],
            endpoints=endpoints,
            prefix=parse_prefix(config["minibroker.etcd.prefix"]),
            rack=config["broker.rack"] or None,
            session_timeout_ms=session,
            heartbeat_interval_ms=heartbeat,
        )


def parse_etcd_endpoint(text: str) -> tuple[str, int]:
    """host:port (an IPv6 host in brackets); an http:// scheme is accepted, as etcd prints
    its client URLs that way."""
    raw = text.strip()
    for scheme in ("http://", "https://"):
        if raw.lower().startswith(scheme):
            if scheme == "https://":
                raise ConfigError(f"invalid value {text!r} in minibroker.etcd.endpoints: TLS "
                                  f"to etcd is not served yet (use http:// or host:port)")
            raw = raw[len(scheme):].rstrip("/")
    host, sep, port = raw.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ConfigError(f"invalid value {text!r} in minibroker.etcd.endpoints: expected "
                          f"host:port, e.g. 127.0.0.1:2379")
    return host, int(port)


def parse_prefix(text: str) -> str:
    """An absolute key path without a trailing slash ("" and "/" mean the etcd's root)."""
    prefix = text.strip().rstrip("/")
    if prefix and not prefix.startswith("/"):
        raise ConfigError(f"invalid value {text!r} for minibroker.etcd.prefix: expected an "
                          f"absolute path such as /mini-broker")
    return prefix

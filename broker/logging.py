"""structlog setup: JSON lines when not on a terminal, a readable console renderer on one.

``log.format`` (json | console; unset: by whether stderr is a terminal) and ``log.level`` come
from the broker's configuration. Standard-library loggers (the purgatory's timer, libraries)
go through the same renderer, so a JSON log stays one JSON object per line.

What is logged at which level: start, the effective configuration (its own event, one
``key = value`` line per key on a terminal), the ready line, shutdown, topic creation and
deletion, rebalances, recovery, retention and slow requests at info; connection open and
close, the GC policy applied and one line per request at debug. Never record payloads, and
never the values of Kafka's secret keys (``SECRET_KEYS``, see ``redact``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from broker.config import BrokerConfig

#: Kafka's broker keys of type PASSWORD (hidden by Kafka too): private keys, passwords, JAAS
#: texts, secrets. Also hidden per listener (listener.name.<l>.<key>) and per SASL mechanism
#: (<mechanism>.sasl.jaas.config).
SECRET_KEYS = frozenset({
    "ssl.keystore.password", "ssl.key.password", "ssl.keystore.key",
    "ssl.keystore.certificate.chain", "ssl.truststore.password", "ssl.truststore.certificates",
    "sasl.jaas.config", "delegation.token.secret.key", "delegation.token.master.key",
    "password.encoder.secret", "password.encoder.old.secret",
})
_debug = False
_console = False
logger = structlog.get_logger("broker.config")


def debug_enabled() -> bool:
    """Whether debug lines are emitted: hot paths check this once instead of building the
    keyword arguments of a call that would be filtered away."""
    return _debug


def is_secret(key: str) -> bool:
    """Whether ``key`` is one of SECRET_KEYS, plain or under a listener or mechanism prefix."""
    return key in SECRET_KEYS or any(key.endswith("." + secret) for secret in SECRET_KEYS)


def redact(values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a configuration with the values of secret keys hidden (an empty one shown:
    it says the secret is not set)."""
    return {k: ("[redacted]" if is_secret(k) and v not in ("", None) else v)
            for k, v in values.items()}


def render_config(config: BrokerConfig) -> str:
    """The effective configuration for the start-up log: one ``key = value`` line per key,
    sorted, secrets hidden, keys given at start marked with ``*``."""
    from broker.config import value_text

    values = redact({**dict(config.items()), **config.listener_overrides()})
    width = max(len(k) for k in values)
    return "\n".join(f"{'*' if k in config.static else ' '} {k.ljust(width)} = {value_text(v)}"
                     for k, v in sorted(values.items()))


def log_effective_config(config: BrokerConfig) -> None:
    """The effective configuration as its own event: a block of lines on a terminal, a
    ``config`` object (and the keys ``given``) in a JSON log."""
    if _console:
        logger.info("effective configuration (* given at start):\n" + render_config(config))
    else:
        logger.info("effective configuration", given=sorted(config.static),
                 config=redact({**dict(config.items()), **config.listener_overrides()}))


def log_unused_keys(config: BrokerConfig) -> None:
    """The one warning naming every Kafka key given that mini-broker does not use."""
    if config.unused_keys:
        logger.warning("Kafka's configuration keys given that mini-broker does not use",
                    keys=config.unused_keys)


def ready_message(listeners: Mapping[str, tuple[str, int]], metrics_url: str | None,
                  log_dirs: Sequence[str]) -> str:
    """The one line an operator waits for: ``listening on PLAINTEXT://127.0.0.1:9092, metrics
    http://127.0.0.1:9404/metrics, data ./data``; ``listeners`` are the bound (host, port) by
    listener name, host "" meaning every interface."""
    def url(name: str, host: str, port: int) -> str:
        host = host or "0.0.0.0"
        return f"{name}://[{host}]:{port}" if ":" in host else f"{name}://{host}:{port}"

    bound = " and ".join(url(name, host, port) for name, (host, port) in listeners.items())
    metrics = f"metrics {metrics_url}" if metrics_url else "metrics off"
    return f"listening on {bound}, {metrics}, data {', '.join(log_dirs)}"


def to_standard_logging() -> None:
    """Where the lines of a broker embedded in a host that left structlog unconfigured go: the
    standard logging module, under each logger's name and filtered by its levels, as a library
    logs (pytest then captures them, INFO out of a run's output by default). A host that
    configured structlog keeps its configuration."""
    if structlog.is_configured():
        return
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.stdlib.filter_by_level,
                    structlog.processors.format_exc_info,
                    structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.stdlib.BoundLogger,
        logger_factory=structlog.stdlib.LoggerFactory(),
    )


def configure(level: str = "INFO", fmt: str = "") -> None:
    global _debug, _console
    console = _console = fmt == "console" or (not fmt and sys.stderr.isatty())
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    _debug = numeric <= logging.DEBUG
    shared: list[Any] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    # The console renderer prints exceptions itself (and warns if they were formatted before).
    renderer: Any
    if console:
        renderer = structlog.dev.ConsoleRenderer()
        tail: list[Any] = [renderer]
    else:
        renderer = structlog.processors.JSONRenderer()
        tail = [structlog.processors.format_exc_info, renderer]
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, *shared, *tail],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *tail],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)

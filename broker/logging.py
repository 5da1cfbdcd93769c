"""structlog setup: JSON lines when not on a terminal, a readable console renderer on one.

``log.format`` (json | console; unset: by whether stderr is a terminal) and ``log.level`` come
from the broker's configuration. Standard-library loggers (the purgatory's timer, libraries)
go through the same renderer, so a JSON log stays one JSON object per line.

What is logged at which level: start (with the effective configuration), shutdown, connection
open and close, topic creation and deletion, rebalances, recovery, retention and slow requests
at info; one line per request at debug. Never record payloads, and never the values of keys
that look like secrets (see ``redact``).
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

_SECRET = re.compile(r"password|secret|token|credential|jaas|sasl|ssl\.key", re.IGNORECASE)
_debug = False


def debug_enabled() -> bool:
    """Whether debug lines are emitted: hot paths check this once instead of building the
    keyword arguments of a call that would be filtered away."""
    return _debug


def redact(values: dict[str, Any]) -> dict[str, Any]:
    """A copy of a configuration with the values of secret-looking keys hidden."""
    return {k: ("[redacted]" if _SECRET.search(k) and v not in ("", None) else v)
            for k, v in values.items()}


def configure(level: str = "INFO", fmt: str = "") -> None:
    global _debug
    console = fmt == "console" or (not fmt and sys.stderr.isatty())
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

"""Schema checks on a decoded request, before any handler sees it.

kafka-python's decoders accept some encodings that Kafka's own generated readers refuse (a null
where the schema says the field is not nullable, for one). Kafka closes the connection on such a
request, as on any frame it cannot parse; so does the broker, with the reason logged once.
"""

from __future__ import annotations

from typing import Any


def schema_violation(message: Any, version: int) -> str | None:
    """The first way `message` breaks its schema at `version`, or None when it keeps to it."""
    return None
